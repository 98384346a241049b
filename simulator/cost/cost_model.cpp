// The cost of each op kind from the hardware profile's measurements and the stack profile (see cost_model.h).
#include "simulator/cost/cost_model.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "simulator/core/attention_calls.h"
#include "simulator/core/fused_kernels.h"
#include "simulator/core/fused_ops.h"
#include "simulator/core/status.h"
#include "simulator/core/units.h"

namespace moeplan::cost {
namespace {

double d(int64_t x) {
  return static_cast<double>(x);
}

// Tile of the GEMM kernels the efficiency tables were measured with (CUTLASS / cuBLAS Hopper default).
constexpr int64_t kTileM = 128, kTileN = 256;
// A narrow Hopper BF16 CTA tile of cuBLAS, 64 x 128: one warpgroup's wgmma rows (PTX's wgmma shapes are m64)
// by 128 columns (cuBLAS's SM90 kernels carry their tile in their names, e.g. tilesize64x128x64, seen in
// public Nsight reports; that cuBLAS has no narrower one for these GEMMs is assumed). Whether one expert's
// GEMM can leave SMs idle for the next one on another stream is counted in these tiles: the library picks
// them for small GEMMs, so 128 x 256 tiles would count idle SMs it does not leave.
constexpr int64_t kNarrowTileM = 64, kNarrowTileN = 128;

double interpolate(const std::vector<std::pair<double, double>>& pts, double x, bool log_x) {
  if (pts.empty()) return 0;
  if (x <= pts.front().first) return pts.front().second;
  if (x >= pts.back().first) return pts.back().second;
  auto hi = std::upper_bound(pts.begin(), pts.end(), x, [](double v, const auto& p) { return v < p.first; });
  auto lo = hi - 1;
  const double x0 = log_x ? std::log(lo->first) : lo->first, x1 = log_x ? std::log(hi->first) : hi->first;
  const double xx = log_x ? std::log(x) : x;
  return lo->second + (hi->second - lo->second) * (xx - x0) / (x1 - x0);
}

const char* dtype_key(DType t) {
  return t == DType::kFp8 ? "fp8" : "bf16";
}

// The relative error of a GEMM priced from a dtype's grids: where two grids measured the same shapes, the
// median disagreement between them (two runs of the same library on two machines); with one grid, the median
// error of its interpolation with each interior row count left out.
double grid_error(const std::vector<GemmGrid>& grids, const std::string& dtype) {
  std::vector<const GemmGrid*> mine;
  for (const auto& g : grids) {
    if (g.dtype() == dtype) mine.push_back(&g);
  }
  if (mine.empty()) return kAssumedRelError;
  std::vector<double> errs;
  const GemmGrid& a = *mine.front();
  for (size_t i = 0; i < a.m().size(); ++i) {
    for (size_t j = 0; j < a.n().size(); ++j) {
      for (size_t l = 0; l < a.k().size(); ++l) {
        const double t = a.measured_seconds(i, j, l);
        if (mine.size() > 1) {
          if (auto o = mine[1]->seconds(a.m()[i], a.n()[j], a.k()[l])) errs.push_back(std::abs(t / *o - 1.0));
        } else if (auto o = a.seconds_without(i, j, l)) {
          errs.push_back(std::abs(*o / t - 1.0));
        }
      }
    }
  }
  if (errs.empty()) return kAssumedRelError;
  std::nth_element(errs.begin(), errs.begin() + static_cast<long>(errs.size() / 2), errs.end());
  return errs[errs.size() / 2];
}

// The sizes of a profile's calibration tables, in a fixed order: what a fit is checked against.
std::vector<size_t> fingerprint(const HardwareProfile& hw) {
  const Calibration& c = hw.calibration;
  std::vector<size_t> out{c.collectives.size(),  c.plateaus.size(),  c.gemm.size(),
                          c.grouped_gemm.size(), c.attention.size(), c.hbm.size()};
  for (const auto& t : c.collectives) out.push_back(t.points.size());
  for (const auto& t : c.gemm) out.push_back(t.points.size());
  return out;
}

}  // namespace

struct CostModel::HardwareFit {
  // What it was fitted from: the profile's name and its calibration tables' sizes. A copy of the profile that
  // differs in a number the fit does not read (a sustained rate, when the step is predicted again at the
  // ends of that number's range) shares the fit.
  std::string name;
  std::vector<size_t> tables;
  std::map<std::string, GemmModel> gemm;     // by dtype
  std::vector<GemmGrid> grids;               // the GEMM tables that are full (m, n, k) sweeps
  std::vector<bool> table_is_grid;           // by index in hw.calibration.gemm
  std::map<std::string, double> grid_error;  // by dtype: the relative error of a grid-priced GEMM
  std::vector<Curve> curves;
};

std::shared_ptr<const CostModel::HardwareFit> CostModel::fit_hardware(const HardwareProfile& hw) {
  static const StackProfile kNoStack;  // the fit reads the hardware only
  return CostModel(hw, kNoStack).fit_;
}

CostModel::CostModel(const HardwareProfile& hw, const StackProfile& stack,
                     std::shared_ptr<const HardwareFit> fit)
    : hw_(hw), stack_(stack), fit_(std::move(fit)) {
  if (fit_) {
    MOEPLAN_ASSERT(fit_->name == hw.name && fit_->tables == fingerprint(hw));
    return;
  }
  auto f = std::make_shared<HardwareFit>();
  fit_ = f;  // fit_gemm below reads the tables that are grids through it
  f->name = hw.name;
  f->tables = fingerprint(hw);
  // A table that sweeps the full product of its m, n and k values prices the shapes inside it by itself;
  // the fitted model below learns from the other tables and prices everything else.
  for (const auto& t : hw.calibration.gemm) {
    auto g = GemmGrid::from_table(t);
    f->table_is_grid.push_back(g.has_value());
    if (g) f->grids.push_back(std::move(*g));
  }
  for (const char* dtype : {"bf16", "fp8"}) f->grid_error[dtype] = grid_error(f->grids, dtype);
  for (const char* dtype : {"bf16", "fp8"}) f->gemm[dtype] = fit_gemm(dtype);
  // A dtype with too few shapes to fit the depth term takes it from the other (same tiles, same pipeline).
  for (auto& [dtype, g] : f->gemm) {
    if (g.points >= 3) continue;
    for (const auto& [other, o] : f->gemm) {
      if (other != dtype && o.points >= 3) g = fit_gemm(dtype, o.k0);
    }
  }
  for (const auto& c : hw.calibration.collectives) {
    Curve k{c.collective,          c.algorithm,         c.scope, c.ranks, c.nodes, {}, c.points.front().first,
            c.points.back().first, c.points.size() == 1};
    k.model = fit_curve(c.collective, c.ranks, c.points);
    if (k.single_point) {
      // One large-message point fixes the bandwidth; the latency is NCCL's per-step constant (ring steps).
      const double lat =
          c.scope == Scope::kIntraNode ? hw.node.nvlink_latency_s.value : hw.scale_out.net_latency_s.value;
      k.model.fit.alpha_s = lat * d(c.ranks - 1);
      k.model.rel_error_large = k.model.rel_error_small = kAssumedRelError;
    }
    f->curves.push_back(k);
  }
}

void CostModel::add_note(std::string what) const {
  std::lock_guard<std::mutex> lock(mu_);
  extrapolations_.insert(std::move(what));
}

std::vector<std::string> CostModel::extrapolations() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {extrapolations_.begin(), extrapolations_.end()};
}

double CostModel::nic_bytes_per_s_per_gpu() const {
  return hw_.scale_out.nic_bw_achieved_bytes_per_s.value * d(hw_.scale_out.nics_per_node.value) /
         d(hw_.node.gpus_per_node.value);
}

// Fraction of the SMs busy in the last wave: tiles / (waves * SMs), tiles counted per group.
double CostModel::wave_efficiency(int64_t rows_per_group, int64_t n, int64_t groups) const {
  const int64_t sms = hw_.gpu.sm_count.value;
  const int64_t tiles =
      groups * ((std::max<int64_t>(1, rows_per_group) + kTileM - 1) / kTileM) * ((n + kTileN - 1) / kTileN);
  const int64_t waves = (tiles + sms - 1) / sms;
  return d(tiles) / d(waves * sms);
}

// Efficiency of the dense GEMMs of a dtype. Each output tile pays a fixed cost (pipeline fill, prologue and
// epilogue) worth k0 of reduction depth, so a tile of depth K runs at K / (K + k0) of the steady rate:
//   t = max(flops / (peak x efficiency x wave_efficiency x K / (K + k0)), bytes / HBM achieved).
// For a given k0 the efficiency is the geometric mean over the compute-bound shapes of
// measured / (peak x wave x K / (K + k0)); k0 is the value on a 32-step grid from 0 to 2048 whose model has
// the lowest median relative error over all the dtype's shapes, which is also the error reported (the term is
// what makes DeepGEMM's K = 512 shapes 40% slower than its K = 7168 ones at the same M and N).
CostModel::GemmModel CostModel::fit_gemm(const std::string& dtype, double k0) const {
  GemmModel g;
  g.k0 = k0;
  const auto peak_it = hw_.gpu.peak_flops_per_s.find(dtype);
  if (peak_it == hw_.gpu.peak_flops_per_s.end()) return g;
  const double peak = peak_it->second.value;
  const double bw = hw_.gpu.hbm_bw_achieved_bytes_per_s.value;
  const double bytes_per = dtype == "fp8" ? 1.0 : 2.0;
  std::vector<GemmPoint> pts;
  for (size_t i = 0; i < hw_.calibration.gemm.size(); ++i) {
    const auto& t = hw_.calibration.gemm[i];
    if (t.dtype == dtype && !fit_->table_is_grid[i]) pts.insert(pts.end(), t.points.begin(), t.points.end());
  }
  g.points = pts.size();
  if (pts.empty()) return g;
  double log_sum = 0;
  int used = 0;
  g.min_dim = std::numeric_limits<int64_t>::max();
  auto depth = [&](int64_t k) { return d(k) / (d(k) + k0); };
  for (const auto& p : pts) {
    g.min_dim = std::min({g.min_dim, p.m, p.n, p.k});
    g.max_dim = std::max({g.max_dim, p.m, p.n, p.k});
    const double flops = 2.0 * d(p.m) * d(p.n) * d(p.k);
    const double bytes = (d(p.m) * d(p.k) + d(p.k) * d(p.n) + d(p.m) * d(p.n)) * bytes_per;
    if (flops / peak < bytes / bw) continue;  // memory-bound: says nothing about compute efficiency
    log_sum += std::log(p.flops_per_s / (peak * wave_efficiency(p.m, p.n, 1) * depth(p.k)));
    ++used;
  }
  if (used == 0) return g;
  g.efficiency = std::min(1.0, std::exp(log_sum / used));
  std::vector<double> errs;
  for (const auto& p : pts) {
    const double flops = 2.0 * d(p.m) * d(p.n) * d(p.k);
    const double bytes = (d(p.m) * d(p.k) + d(p.k) * d(p.n) + d(p.m) * d(p.n)) * bytes_per;
    const double t =
        std::max(flops / (peak * g.efficiency * wave_efficiency(p.m, p.n, 1) * depth(p.k)), bytes / bw);
    errs.push_back(std::abs(flops / t / p.flops_per_s - 1.0));
  }
  std::nth_element(errs.begin(), errs.begin() + static_cast<long>(errs.size() / 2), errs.end());
  g.rel_error = pts.size() >= 3 ? errs[errs.size() / 2] : kAssumedRelError;
  return g;
}

CostModel::GemmModel CostModel::fit_gemm(const std::string& dtype) const {
  GemmModel best = fit_gemm(dtype, 0.0);
  if (best.points < 3) return best;  // too few shapes to tell depth from efficiency
  for (double k0 = 32; k0 <= 2048; k0 += 32) {
    GemmModel g = fit_gemm(dtype, k0);
    if (g.efficiency > 0 && g.rel_error < best.rel_error) best = g;
  }
  return best;
}

// The shape a GEMM part runs: forward [m x k]·[k x n]; dgrad [m x n]·[n x k]; wgrad [k x m]·[m x n], whose
// reduction is over the m rows (per group for grouped GEMMs).
namespace {
struct PartShape {
  int64_t rows = 0, n = 0, k = 0;  // per group: output rows, output columns, reduction depth
};
PartShape part_shape(const GemmShape& s, GemmPart part) {
  const int64_t groups = std::max<int64_t>(1, s.groups);
  const int64_t rows = (s.m + groups - 1) / groups;
  switch (part) {
    case GemmPart::kDgrad:
      return {rows, s.k, s.n};
    case GemmPart::kWgrad:
      return {s.k, s.n, rows};
    case GemmPart::kNone:
      break;
  }
  return {rows, s.n, s.k};
}
}  // namespace

double CostModel::tiled_seconds(int64_t rows, int64_t n, int64_t k, int64_t groups, const GemmModel& g,
                                double peak, double efficiency, bool pad_rows) const {
  const int64_t m = pad_rows ? (std::max<int64_t>(1, rows) + kTileM - 1) / kTileM * kTileM : rows;
  const double flops = 2.0 * d(groups) * d(m) * d(n) * d(k);
  const double depth = d(k) / (d(k) + g.k0);
  return flops / (peak * g.efficiency * efficiency * wave_efficiency(rows, n, groups) * depth);
}

const CostModel::GemmModel& CostModel::fitted(const char* dtype) const {
  const GemmModel& g = fit_->gemm.at(dtype);
  return g.efficiency > 0 ? g : fit_->gemm.at("bf16");
}

const Stated<double>* CostModel::sustained_rate(const char* dtype) const {
  const auto& rates = hw_.gpu.sustained_rate;
  const auto it = rates.find(dtype);
  return it == rates.end() ? nullptr : &it->second;
}

double CostModel::sustained(const char* dtype) const {
  const Stated<double>* rate = sustained_rate(dtype);
  return rate ? rate->value : 1.0;
}

double CostModel::peak_flops(const char* dtype) const {
  const auto& peaks = hw_.gpu.peak_flops_per_s;
  return peaks.contains(dtype) ? peaks.at(dtype).value : peaks.at("bf16").value;
}

std::optional<double> CostModel::grid_seconds(const char* dtype, int64_t m, int64_t n, int64_t k) const {
  double log_sum = 0;
  int used = 0;
  for (const auto& g : fit_->grids) {
    if (g.dtype() != dtype) continue;
    if (auto t = g.seconds(m, n, k)) {
      log_sum += std::log(*t);
      ++used;
    }
  }
  if (used == 0) return std::nullopt;
  return std::exp(log_sum / used);
}

double CostModel::gemm_seconds(const GemmShape& s, DType dtype, double* rel_error, GemmPart part) const {
  const char* key = dtype_key(dtype);
  const PartShape ps = part_shape(s, part);
  // One GEMM of a shape a grid measured: the measurement, interpolated between its neighbours.
  const std::optional<double> measured = grid_seconds(key, ps.rows, ps.n, ps.k);
  if (measured && s.groups <= 1) {
    if (rel_error) *rel_error = fit_->grid_error.at(key);
    return *measured / sustained(key);
  }
  GemmModel g = fit_->gemm.at(key);
  if (g.efficiency <= 0) {
    // No table for this dtype (e.g. FP8 on a profile without FP8 GEMMs): fall back to BF16's efficiency.
    g = fit_->gemm.at("bf16");
    note("{} GEMM: no {} GEMM measurements in the profile; BF16 efficiency used", key, key);
  }
  const int64_t lo = std::min({ps.rows, ps.n, ps.k}), hi = std::max({ps.rows, ps.n, ps.k});
  if (measured) {
    // A grouped launch of shapes a grid measured one at a time: inside the measured data.
  } else if (g.points < 3) {
    note(
        "{} GEMM efficiency from {} measured shape(s) only ({}-{} per dim); every other shape relies on "
        "the wave-quantisation model",
        key, g.points, g.min_dim, g.max_dim);
  } else if (lo < g.min_dim || hi > g.max_dim) {
    note("{} GEMM dims outside the measured range [{}, {}] (e.g. {}x{}x{})", key, g.min_dim, g.max_dim,
         ps.rows, ps.n, ps.k);
  }
  const double peak = peak_flops(key);
  const double groups = d(std::max<int64_t>(1, s.groups));
  // Each group reads its own weights: [k x n] per group; activations and outputs once over all rows.
  const double bytes = (d(s.m) * d(s.k) + groups * d(s.k) * d(s.n) + d(s.m) * d(s.n)) * bytes_of(dtype);
  if (rel_error) *rel_error = g.rel_error;
  return std::max(tiled_seconds(ps.rows, ps.n, ps.k, s.groups, g, peak, 1.0, false) / sustained(key),
                  bytes / hw_.gpu.hbm_bw_achieved_bytes_per_s.value);
}

// The grouped GEMM of a layer's local experts, priced from the per-expert shape on the dense model, as the
// stack runs it:
//   grouped kernel (CUTLASS grouped, DeepGEMM, cuBLASLt grouped): one launch; every expert's rows padded to
//     the 128-row tile, waves quantised over all experts' tiles together, at the stack's efficiency over
//     the dense rate;
//   per-expert launches on S streams (TE GroupedLinear on Hopper): each expert a dense GEMM of its own
//     shape; when one expert fills fewer than all SMs, up to S of them run at once (conc = min(S, SMs /
//     its tiles)), so the layer takes ceil(G / conc) expert times, plus one device-side launch gap per
//     round.
// Both: at least the HBM time of reading every expert's weights once. The fit error is the dense model's,
// widened to the assumed error when the stack's efficiency is not measured.
double CostModel::grouped_gemm_seconds(const GemmShape& s, DType dtype, double* rel_error,
                                       GemmPart part) const {
  const auto& gg = stack_.grouped_gemm;
  const int64_t groups = std::max<int64_t>(1, s.groups);
  const PartShape ps = part_shape(s, part);
  const double eff = part == GemmPart::kWgrad ? gg.wgrad_efficiency.value : gg.efficiency.value;
  double t = 0;
  if (gg.impl.value == GroupedGemmImpl::kGroupedKernel) {
    const char* key = dtype_key(dtype);
    const GemmModel& g = fitted(key);
    const double peak = peak_flops(key);
    double err = 0;
    gemm_seconds(s, dtype, &err, part);  // notes and the fit error of the dense model
    if (rel_error) *rel_error = err;
    const double bytes = (d(s.m) * d(s.k) + d(groups) * d(s.k) * d(s.n) + d(s.m) * d(s.n)) * bytes_of(dtype);
    t = std::max(
        tiled_seconds(ps.rows, ps.n, ps.k, groups, g, peak, eff, part != GemmPart::kWgrad) / sustained(key),
        bytes / hw_.gpu.hbm_bw_achieved_bytes_per_s.value);
  } else {
    const GemmShape one{ps.rows, ps.n, ps.k, 1};
    const double t_one =
        std::max(gemm_seconds(one, dtype, rel_error, GemmPart::kNone) / eff, stack_.min_kernel_s.value);
    const int64_t sms = hw_.gpu.sm_count.value;
    const int64_t streams = std::max<int64_t>(1, gg.streams.value);
    const int64_t tiles =
        ((ps.rows + kNarrowTileM - 1) / kNarrowTileM) * ((ps.n + kNarrowTileN - 1) / kNarrowTileN);
    const int64_t conc = std::clamp<int64_t>(sms / std::max<int64_t>(1, tiles), 1, streams);
    const int64_t rounds = (groups + conc - 1) / conc;
    // Experts side by side share one GPU: together they run no faster than a GEMM that fills it at this
    // depth (a measured single expert may already fill it with the library's smaller tiles).
    const char* key = dtype_key(dtype);
    const GemmModel& g = fitted(key);
    const double peak = peak_flops(key);
    const double full = 2.0 * d(ps.rows) * d(ps.n) * d(ps.k) /
                        (peak * g.efficiency * eff * d(ps.k) / (d(ps.k) + g.k0) * sustained(key));
    // On one stream each expert's GEMM waits for the launch gap after the one before; on several, the next
    // expert's GEMM is already queued on its own stream and starts as the SMs free up, so only the first
    // gap shows. TE's benchmark of its multi-stream grouped GEMM on H100 (TransformerEngine PR #2045, BF16
    // (8 x 4096) x 768 x 2048 and (16 x 2048) x 768 x 2048, 627.9 and 553.9 TFLOP/s with TE 2.7) runs
    // each expert at its lone cuBLAS rate and no slower (fit_report_test, table G9 of the H100 profile).
    t = std::max(d(rounds) * t_one, d(groups) * full) +
        d(streams > 1 ? 1 : rounds) * stack_.launch_s_per_kernel.value;
  }
  if (rel_error && gg.efficiency.basis != Basis::kMeasured)
    *rel_error = std::max(*rel_error, kAssumedRelError);
  return t;
}

// Attention time = FLOPs / rate, the rate interpolated from the profile's flash-attention tables in log(seq)
// and linearly in head dim. The rate comes from one kernel's tables: the stack's own kernel where the profile
// measured it, else FA3, else any other, in that order, so a table that exists for one kernel only does not
// price another. Within a kernel, a causal backward without its own table at the op's head dim (none, or
// only at other head dims) scales the non-causal backward by the forward's causal / non-causal ratio at the
// same length; the nearest head dim's causal-backward table is used only where that derivation is impossible.
double CostModel::attention_seconds(const Op& op, double* rel_error) const {
  const bool fwd = op.phase != Phase::kBackward;
  const auto& a = op.attn;
  const std::string want = name_of(stack_.attention_kernel.value);
  std::vector<std::string> kernels = {want};
  if (want != "fa3") kernels.emplace_back("fa3");
  for (const auto& t : hw_.calibration.attention) {
    if (std::find(kernels.begin(), kernels.end(), t.impl) == kernels.end()) kernels.push_back(t.impl);
  }
  auto table = [&](const std::string& impl, const char* dir, bool causal,
                   int64_t hd) -> const AttentionTable* {
    for (const auto& t : hw_.calibration.attention) {
      if (t.impl == impl && t.direction == dir && t.causal == causal && t.head_dim == hd && t.dtype == "bf16")
        return &t;
    }
    return nullptr;
  };
  auto rate = [&](const AttentionTable& t, double seq) -> double {
    std::vector<std::pair<double, double>> pts;
    for (const auto& [s, r] : t.points) pts.emplace_back(d(s), r);
    if (seq < pts.front().first || seq > pts.back().first) {
      note("attention at {:.0f} keys outside the measured {:.0f}-{:.0f}", seq, pts.front().first,
           pts.back().first);
    }
    return interpolate(pts, seq, true);
  };
  // One kernel's rate at the op's head dim, interpolated between the head dims it was measured at (0: no
  // table for this direction and mask); `inside`: the head dim lies within them (else the nearest is used).
  auto rate_hd = [&](const std::string& impl, const char* dir, bool causal, double seq,
                     bool* inside) -> double {
    std::vector<int64_t> dims;
    for (const auto& t : hw_.calibration.attention) {
      if (t.impl == impl && t.direction == dir && t.causal == causal && t.dtype == "bf16")
        dims.push_back(t.head_dim);
    }
    if (dims.empty()) return 0;
    std::sort(dims.begin(), dims.end());
    dims.erase(std::unique(dims.begin(), dims.end()), dims.end());
    const int64_t hd = a.qk_dim;
    if (inside) *inside = hd >= dims.front() && hd <= dims.back();
    if (hd <= dims.front()) return rate(*table(impl, dir, causal, dims.front()), seq);
    if (hd >= dims.back()) return rate(*table(impl, dir, causal, dims.back()), seq);
    auto hi = std::lower_bound(dims.begin(), dims.end(), hd);
    if (*hi == hd) return rate(*table(impl, dir, causal, hd), seq);
    auto lo = hi - 1;
    const double w = d(hd - *lo) / d(*hi - *lo);
    return rate(*table(impl, dir, causal, *lo), seq) * (1 - w) +
           rate(*table(impl, dir, causal, *hi), seq) * w;
  };
  // The rate of a call with `keys` keys per query (a window caps them).
  auto rate_of = [&](bool causal, double keys) -> double {
    const char* dir = fwd ? "fwd" : "bwd";
    for (const std::string& impl : kernels) {
      bool inside = false;
      double r = rate_hd(impl, dir, causal, keys, &inside);
      if ((r <= 0 || !inside) && !fwd && causal) {
        const double nc = rate_hd(impl, "bwd", false, keys, nullptr),
                     cf = rate_hd(impl, "fwd", true, keys, nullptr),
                     nf = rate_hd(impl, "fwd", false, keys, nullptr);
        if (nc > 0 && cf > 0 && nf > 0) r = nc * cf / nf;
      }
      if (r <= 0) continue;
      if (impl != want) {
        note("attention {} {}causal hd{}: no {} measurement in the profile; {} used", dir,
             causal ? "" : "non-", a.qk_dim, want, impl);
      }
      return r;
    }
    note("attention: no flash-attention table in the profile; 50% of the BF16 peak assumed");
    return hw_.gpu.peak_flops_per_s.at("bf16").value * 0.5;
  };
  auto keys_of = [](int64_t seq_kv, int64_t window) {
    return d(window > 0 ? std::min(window, seq_kv) : seq_kv);
  };
  if (a.qk_dim < 64 || a.qk_dim > 256) note("attention head dim {} outside 64-256", a.qk_dim);
  if (rel_error) *rel_error = 0.05;  // FA tables are read off published figures (±5-10 units on ~500)
  // The op's work as the kernels that do it run it (attention_calls: context parallelism's local part as a
  // causal square of the rank's queries, the rest as full blocks of a chunk's keys), each at its mask's rate
  // for its key count; the op's FLOPs shared among them as the calls' own.
  // The tables are BF16 kernels timed in bursts: under a step's sustained load, at the GPU's sustained rate.
  const double sustain = sustained("bf16");
  const std::vector<AttentionCall> calls = attention_calls(op);
  if (calls.empty()) return op.flops / (rate_of(a.causal, keys_of(a.seq_kv, a.window)) * sustain);
  double flops = 0, seconds_per_flop = 0;
  for (const AttentionCall& c : calls) {
    const double f = c.forward_flops();
    flops += f;
    seconds_per_flop += f / rate_of(c.causal, keys_of(c.seq_kv, c.window));
  }
  return flops > 0 ? op.flops * seconds_per_flop / (flops * sustain) : 0;
}

double CostModel::memory_bound_seconds(double bytes) const {  // NOLINT: used by the memory model
  return bytes / (hw_.gpu.hbm_bw_achieved_bytes_per_s.value * stack_.memory_bound_efficiency.value);
}

Placement CostModel::placement(const CommSpec& c) const {
  return place_group(c.group_size, c.stride, hw_.node.gpus_per_node.value);
}

const CollectivePlateau* CostModel::plateau(Collective c, Scope s) const {
  for (const auto& p : hw_.calibration.plateaus) {
    if (p.collective == c && p.scope == s) return &p;
  }
  return nullptr;
}

// Inside a node: the fastest fitted curve of this collective (NCCL picks the fastest algorithm), preferring
// the measured rank count; without a curve, a plateau; without that, NVLink's achieved bandwidth. A curve of
// one large message says nothing of smaller ones: where a sweep over sizes exists at that rank count, the
// single point prices only messages at least its size.
double CostModel::intra_node_seconds(Collective c, int64_t n, double bytes, double* rel_error) const {
  double best = -1;
  int64_t best_ranks = 0;
  const Curve* used = nullptr;
  int64_t nearest = 0;
  for (const auto& k : fit_->curves) {
    if (k.collective != c || k.scope != Scope::kIntraNode) continue;
    if (!nearest || std::abs(std::log(d(k.ranks) / d(n))) < std::abs(std::log(d(nearest) / d(n))))
      nearest = k.ranks;
  }
  const bool swept = std::any_of(fit_->curves.begin(), fit_->curves.end(), [&](const Curve& k) {
    return k.collective == c && k.scope == Scope::kIntraNode && k.ranks == nearest && !k.single_point;
  });
  for (const auto& k : fit_->curves) {
    if (k.collective != c || k.scope != Scope::kIntraNode || k.ranks != nearest) continue;
    if (swept && k.single_point && bytes < k.min_bytes) continue;
    const double t = curve_seconds(k.model, c, n, bytes);
    if (best < 0 || t < best) best = t, best_ranks = k.ranks, used = &k;
  }
  if (used) {
    if (best_ranks != n) note("{} over {} ranks in a node: measured at {} ranks", name_of(c), n, best_ranks);
    if (bytes > used->max_bytes * 1.0001 || bytes < used->min_bytes * 0.9999) {
      if (!used->single_point) {
        note("{} of {:.3g} B in a node outside the measured {:.3g}-{:.3g} B", name_of(c), bytes,
             used->min_bytes, used->max_bytes);
      }
    }
    if (rel_error)
      *rel_error = bytes >= kMiB ? used->model.rel_error_large
                                 : std::max(used->model.rel_error_small, used->model.rel_error_large);
    return best;
  }
  const double alpha = hw_.node.nvlink_latency_s.value * d(n - 1);
  if (const CollectivePlateau* p = plateau(c, Scope::kIntraNode)) {
    if (p->ranks != n)
      note("{} over {} ranks in a node: plateau measured at {} ranks", name_of(c), n, p->ranks);
    if (rel_error) *rel_error = kAssumedRelError;
    return alpha_beta_seconds(c, n, bytes, alpha, p->busbw_bytes_per_s);
  }
  note("{} in a node: no measurement; NVLink achieved bandwidth assumed", name_of(c));
  if (rel_error) *rel_error = kAssumedRelError;
  return alpha_beta_seconds(c, n, bytes, alpha, hw_.node.nvlink_bw_achieved_bytes_per_s.value);
}

// Across nodes. Ring-style collectives (all-gather, reduce-scatter, all-reduce) run hierarchically: the
// per-GPU NIC carries busbw * (k-1)/(n-1) for n ranks on k nodes (hopper-hardware.md §2.5, S2), so
//   busbw = min(intra-node busbw, NIC per GPU * (n-1)/(k-1)).
// All-to-all: the (n - g)/n of each rank's message that leaves its node crosses one NIC per GPU, at the
// efficiency the profile's inter-node all-to-all plateau implies; the rest moves over NVLink at the same
// time.
double CostModel::inter_node_seconds(const CommSpec& c, const Placement& p, double* rel_error) const {
  const int64_t n = p.ranks, k = p.nodes, g = p.per_node;
  const double nic = nic_bytes_per_s_per_gpu();
  const double net_lat = hw_.scale_out.net_latency_s.value, nv_lat = hw_.node.nvlink_latency_s.value;
  if (c.collective == Collective::kAllToAll) {
    double eff = 1.0;
    double err = kAssumedRelError;
    if (const CollectivePlateau* pl = plateau(Collective::kAllToAll, Scope::kInterNode)) {
      const double algbw = pl->busbw_bytes_per_s * d(pl->ranks) / d(pl->ranks - 1);
      const int64_t g0 = pl->ranks / pl->nodes;
      eff = std::min(1.0, algbw * d(pl->ranks - g0) / (d(pl->ranks) * nic));
      if (pl->ranks != n || pl->nodes != k) {
        note("all_to_all over {} ranks on {} nodes: plateau measured at {} ranks on {} nodes", n, k,
             pl->ranks, pl->nodes);
      }
    } else {
      note("all_to_all across nodes: no measurement; NIC achieved bandwidth assumed");
    }
    const double off_node = c.bytes * d(n - g) / d(n) * c.nic_bytes_scale;
    const double on_node = c.bytes * d(g - 1) / d(n);
    double intra_err = 0;
    const double t_nvlink =
        g > 1 ? intra_node_seconds(Collective::kAllToAll, g, on_node * d(g) / d(g - 1), &intra_err) : 0;
    if (rel_error) *rel_error = std::max(err, intra_err);
    return net_lat * d(k - 1) + std::max(off_node / (nic * eff), t_nvlink);
  }
  // Measured inter-node curve of this collective (nearest rank count in log) with as many ranks per node as
  // the group (a curve over whole nodes says nothing of a group with one rank per node, whose ranks each have
  // their own NIC only), else the hierarchical model.
  const Curve* best = nullptr;
  for (const auto& cv : fit_->curves) {
    if (cv.collective != c.collective || cv.scope != Scope::kInterNode) continue;
    if (cv.nodes <= 0 || cv.ranks != cv.nodes * g) continue;
    if (!best || std::abs(std::log(d(cv.ranks) / d(n))) < std::abs(std::log(d(best->ranks) / d(n))))
      best = &cv;
  }
  if (best) {
    if (best->ranks != n) {
      note("{} over {} ranks across nodes: measured at {} ranks", name_of(c.collective), n, best->ranks);
    }
    if (rel_error) *rel_error = c.bytes >= kMiB ? best->model.rel_error_large : best->model.rel_error_small;
    return curve_seconds(best->model, c.collective, n, c.bytes);
  }
  double intra_err = kAssumedRelError;
  double intra_busbw = hw_.node.nvlink_bw_achieved_bytes_per_s.value;
  if (g > 1) {
    // The intra-node busbw of this collective at g ranks, read from its curve at this message size.
    const double t = intra_node_seconds(c.collective, g, c.bytes, &intra_err);
    intra_busbw = c.bytes * busbw_factor(c.collective, g) / std::max(t, 1e-12);
  }
  const double busbw = std::min(intra_busbw, nic * d(n - 1) / d(k - 1));
  const double steps = c.collective == Collective::kAllReduce ? 2.0 : 1.0;
  const double alpha = steps * (nv_lat * d(g - 1) + net_lat * d(k - 1));
  if (rel_error) *rel_error = std::max(intra_err, kAssumedRelError);
  return alpha_beta_seconds(c.collective, n, c.bytes, alpha, busbw);
}

double CostModel::collective_seconds(const CommSpec& c, double* rel_error, Resource* resource) const {
  if (c.collective == Collective::kSendRecv) {
    const bool cross = c.stride >= hw_.node.gpus_per_node.value;
    if (resource) *resource = cross ? Resource::kNic : Resource::kNvlink;
    if (rel_error) *rel_error = kAssumedRelError;
    return cross ? hw_.scale_out.net_latency_s.value + c.bytes / nic_bytes_per_s_per_gpu()
                 : hw_.node.nvlink_latency_s.value + c.bytes / hw_.node.nvlink_bw_achieved_bytes_per_s.value;
  }
  const Placement p = placement(c);
  if (p.ranks <= 1) {
    if (resource) *resource = Resource::kNvlink;
    if (rel_error) *rel_error = 0;
    return 0;
  }
  if (c.hot_routed()) {
    // A routed exchange under skewed routing: the uniform exchange of the mean rank's bytes, slowed as the
    // profile's all-to-all-v table with a hot receiver measured it for this group shape. The combine's
    // busiest rank sends rather than receives; the table prices it alike (assumed: not measured apart).
    if (const AllToAllSkewTable* t = skew_table(hw_.calibration.alltoall_skew, p.ranks, p.nodes)) {
      CommSpec mean = c;
      mean.bytes = c.bytes / c.hot_factor;
      mean.hot_factor = 1.0;
      if (const std::optional<HotReceiverSlowdown> s = hot_receiver_slowdown(*t, mean.bytes, c.hot_factor)) {
        if (s->extrapolated) {
          note("all-to-all-v with a hot receiver on {} ranks / {} node(s): beyond the measured table",
               t->ranks, t->nodes);
        }
        return collective_seconds(mean, rel_error, resource) * s->factor;
      }
    }
  }
  if (p.nodes == 1) {
    if (resource) *resource = Resource::kNvlink;
    return intra_node_seconds(c.collective, p.ranks, c.bytes, rel_error);
  }
  if (resource) *resource = Resource::kNic;
  return inter_node_seconds(c, p, rel_error);
}

StackProfile::Dispatcher::ByNodes CostModel::dispatcher_at(double nodes) const {
  const auto& t = stack_.dispatcher.by_nodes;
  if (t.empty()) return {nodes, stack_.dispatcher.nic_efficiency.value, 0.0, 0.0};
  if (nodes <= t.front().nodes) return t.front();
  if (nodes >= t.back().nodes) return t.back();
  auto hi = std::upper_bound(t.begin(), t.end(), nodes, [](double v, const auto& r) { return v < r.nodes; });
  auto lo = hi - 1;
  const double w = (nodes - lo->nodes) / (hi->nodes - lo->nodes);
  auto mix = [w](double a, double b) { return a + (b - a) * w; };
  return {nodes, mix(lo->nic_efficiency, hi->nic_efficiency), mix(lo->dispatch_setup_s, hi->dispatch_setup_s),
          mix(lo->combine_setup_s, hi->combine_setup_s)};
}

double CostModel::node_dedup_seconds(const CommSpec& c, Resource* resource) const {
  const Placement p = placement(c);
  const auto& disp = stack_.dispatcher;
  const double g = d(std::max<int64_t>(1, p.per_node));
  // NVLink: the rows a rank receives, less those from itself; RDMA: the rows leaving the node.
  const double nvl = c.bytes * (g - 1.0) / g;
  const double nic = c.bytes * c.nic_bytes_scale;
  const double t_nvl =
      nvl > 0 ? nvl / (hw_.node.nvlink_bw_achieved_bytes_per_s.value * disp.nvlink_efficiency.value) : 0.0;
  const double t_nic =
      p.nodes > 1 ? nic / (hw_.scale_out.nic_bw_bytes_per_s.value * dispatcher_at(d(p.nodes)).nic_efficiency *
                           d(hw_.scale_out.nics_per_node.value) / d(hw_.node.gpus_per_node.value))
                  : 0.0;
  if (resource) *resource = p.nodes > 1 ? Resource::kNic : Resource::kNvlink;
  const double lat =
      hw_.node.nvlink_latency_s.value + (p.nodes > 1 ? hw_.scale_out.net_latency_s.value : 0.0);
  return lat + std::max(t_nvl, t_nic);
}

namespace {
Basis weaker(Basis a, Basis b) {
  return static_cast<uint8_t>(a) > static_cast<uint8_t>(b) ? a : b;
}
}  // namespace

// A weight-gradient GEMM that accumulates into the main gradient buffer (Op::accum_bytes): the measured
// GEMM wrote its BF16 output [k x n] per group once; this one reads the buffer and writes it back, 2 x
// accum_bytes per element. At the stack's epilogue overlap h the extra bytes add (1 - h) of their HBM time,
// and the GEMM takes at least all its bytes (both inputs once, the buffer twice) at the HBM rate.
double CostModel::accumulating(const Op& op, double seconds) const {
  if (op.accum_bytes == 0 || op.part != GemmPart::kWgrad) return seconds;
  const GemmShape& s = op.gemm;
  const double out = d(std::max<int64_t>(1, s.groups)) * d(s.k) * d(s.n);
  const double buffer = 2.0 * d(op.accum_bytes) * out;
  const double extra = std::max(0.0, buffer - bytes_of(DType::kBf16) * out);
  const double inputs = (d(s.m) * d(s.k) + d(s.m) * d(s.n)) * bytes_of(op.dtype);
  const double hbm = hw_.gpu.hbm_bw_achieved_bytes_per_s.value;
  const double hidden = stack_.wgrad_accumulation.epilogue_overlap.value;  // in [0, 1] (stack_loader)
  return std::max(seconds + (1.0 - hidden) * extra / hbm, (inputs + buffer) / hbm);
}

// Transformer Engine's userbuffers with the defaults Megatron leaves them (TE v2.4 pytorch/module/base.py
// initialize_ub, get_default_config; Megatron passes no ub_cfgs unless --tp-comm-overlap-cfg is given):
//  - an all-gather before a GEMM (qkv and fc1 forward; proj and fc2 data gradient) is a ring exchange
//    (CommOverlapP2PBase::split_overlap_ag, common/comm_gemm_overlap/comm_gemm_overlap.cpp): tp steps, each
//    the GEMM of one rank's row chunk while the next chunk moves to the next rank by a copy-engine peer copy
//    (use_ce, num_sm 1, no SM margin: the GEMM keeps every SM);  T = (tp - 1) max(g, p) + g;
//  - a reduce-scatter after a GEMM (proj and fc2 forward) is pipelined (CommOverlapBase::split_overlap_rs):
//    num_splits 4 row chunks of the GEMM on the SMs less the 16 the reduce-scatter kernel holds
//    (set_sm_margin), each chunk's reduce-scatter after its GEMM on the communication stream;
//    T = g + 3 max(g, r) + r.
// A peer copy is priced as a point-to-point transfer over NVLink, a chunk's reduce-scatter as the profile's
// NCCL reduce-scatter of its bytes over the stack's userbuffers_rs_speed (TE's own kernel is not measured);
// the GEMM chunks beside the SM-based reduce-scatter run at the stack's overlap_compute_efficiency.
namespace {
constexpr int64_t kUbPipelineSplits = 4;
constexpr int64_t kUbCommSms = 16;

// The share of a rank's SMs a userbuffers collective beside a GEMM holds (the bulk overlaps of the
// backward: num_sm 16 in TE's defaults, above).
double userbuffers_sm_fraction(double sm_count) {
  return d(kUbCommSms) / sm_count;
}
}  // namespace

// An FP8 GEMM with block-scaled operands takes 1 / fp8_block_gemm_rate of the per-tensor scaled time the
// profile's FP8 tables give (1 where the stack does not state the rate, and for every other op).
double CostModel::block_scaling(const Op& op) const {
  return op.block_scaled ? 1.0 / stack_.fp8_block_gemm_rate.value : 1.0;
}

double CostModel::userbuffers_seconds(const Op& op, double* rel_error) const {
  const int64_t n = std::max<int32_t>(1, op.comm.group_size);
  double e1 = 0, e2 = 0;
  double seconds = 0;
  GemmShape chunk = op.gemm;
  if (op.comm.collective == Collective::kAllGather) {
    chunk.m = std::max<int64_t>(1, op.gemm.m / n);
    const double g = gemm_seconds(chunk, op.dtype, &e1, op.part) * block_scaling(op);
    CommSpec step = op.comm;
    step.collective = Collective::kSendRecv;
    step.stride = 1;
    step.bytes = op.comm.bytes / d(n);
    const double p = n > 1 ? collective_seconds(step, &e2, nullptr) : 0.0;
    seconds = d(n - 1) * std::max(g, p) + g;
  } else {
    const double sms = d(hw_.gpu.sm_count.value);
    chunk.m = std::max<int64_t>(1, op.gemm.m / kUbPipelineSplits);
    const double g = gemm_seconds(chunk, op.dtype, &e1, op.part) * block_scaling(op) * sms /
                     (sms - d(kUbCommSms)) / stack_.overlap_compute_efficiency.value;
    CommSpec part = op.comm;
    part.bytes = op.comm.bytes / d(kUbPipelineSplits);
    const double r = collective_seconds(part, &e2, nullptr) / stack_.userbuffers_rs_speed.value;
    seconds = g + d(kUbPipelineSplits - 1) * std::max(g, r) + r;
  }
  if (rel_error) *rel_error = std::max(e1, std::max(e2, kAssumedRelError));
  return seconds;
}

OpCost CostModel::cost(const Op& op) const {
  OpCost r;
  const double launch = stack_.launch_s_per_kernel.value * d(std::max<uint16_t>(1, op.kernels));
  double err = 0;
  r.host_seconds = stack_.host_s_per_kernel.value * d(op.kernels);
  // Basis: the hardware profile's rates are measurements; each stack number that prices the op weakens it to
  // its own basis. Host issue time is not part of the op's duration.
  r.basis = Basis::kMeasured;
  // Every kernel takes at least the stack's minimum on the device, however little it moves. A memory-bound
  // kernel takes that fixed time (ramp-up, tail) plus its bytes at the memory-bound rate: measured sweeps of
  // such kernels on H100 are a line with an intercept (hwprofiles/stacks: host.min_kernel_us), not the
  // larger of a floor and the bytes' time.
  const double min_kernel = stack_.min_kernel_s.value;
  const double floor = min_kernel * d(std::max<uint16_t>(1, op.kernels));
  // Memory-bound kernels the stack runs around the main kernel (FP8 amax, scale, quantise / transpose of its
  // operand), per group of a grouped GEMM: each its fixed time plus its bytes at the rate of the stack's cast
  // kernels (its memory-bound rate where it does not state theirs).
  const double aux_launches =
      d(op.aux_kernels) * (op.kind == OpKind::kGroupedGemm ? d(std::max<int64_t>(1, op.gemm.groups)) : 1.0);
  const Stated<double>& cast_eff = stack_.memory_bound_efficiency_of(MemOp::kCast, op.phase);
  const double aux = op.aux_bytes > 0
                         ? op.aux_bytes / (hw_.gpu.hbm_bw_achieved_bytes_per_s.value * cast_eff.value) +
                               min_kernel * aux_launches
                         : 0.0;
  if (op.aux_bytes > 0) r.basis = weaker(r.basis, cast_eff.basis);
  if (op.accum_bytes > 0) r.basis = weaker(r.basis, stack_.wgrad_accumulation.epilogue_overlap.basis);
  if (op.block_scaled && stack_.fp8_block_gemm_rate.source != kNotStated)
    r.basis = weaker(r.basis, stack_.fp8_block_gemm_rate.basis);
  // Tensor-core kernels run at the GPU's sustained rate where the hardware profile states one.
  const bool tensor_core = op.kind == OpKind::kGemm || op.kind == OpKind::kGroupedGemm ||
                           op.kind == OpKind::kAttention || op.kind == OpKind::kFusedGemmComm;
  if (tensor_core) {
    if (const Stated<double>* rate =
            sustained_rate(op.kind == OpKind::kAttention ? "bf16" : dtype_key(op.dtype)))
      r.basis = weaker(r.basis, rate->basis);
  }
  switch (op.kind) {
    case OpKind::kGemm:
      r.seconds =
          std::max(accumulating(op, gemm_seconds(op.gemm, op.dtype, &err, op.part) * block_scaling(op)),
                   min_kernel) +
          aux + launch;
      break;
    case OpKind::kGroupedGemm: {
      r.seconds =
          accumulating(op, grouped_gemm_seconds(op.gemm, op.dtype, &err, op.part) * block_scaling(op)) + aux +
          launch;
      const auto& gg = stack_.grouped_gemm;
      r.basis =
          weaker(r.basis, op.part == GemmPart::kWgrad ? gg.wgrad_efficiency.basis : gg.efficiency.basis);
      // Per-expert launches come from the framework's C++ loop, on the host: one GEMM per expert and, under
      // FP8, the quantisation kernels per expert of its input (forward) or incoming gradient (dgrad), each
      // counted as one launch. A grouped kernel pays its per-expert set-up on the device instead.
      const double groups = d(std::max<int64_t>(1, op.gemm.groups));
      if (gg.impl.value == GroupedGemmImpl::kPerExpertStreams) {
        const double per_expert = 1.0 + (op.aux_bytes > 0 ? d(op.aux_kernels) : 0.0);
        r.host_seconds += stack_.host_s_per_local_expert.value * groups * per_expert;
      } else {
        r.seconds += stack_.host_s_per_local_expert.value * groups;
      }
      break;
    }
    case OpKind::kAttention:
      r.seconds = std::max(attention_seconds(op, &err), floor) + launch;
      r.basis = weaker(r.basis, stack_.attention_kernel.basis);
      break;
    case OpKind::kMemoryBound:
    case OpKind::kOptimizer: {
      const Stated<double>& eff = stack_.memory_bound_efficiency_of(op.mem, op.phase);
      const double bytes_s = op.hbm_bytes / (hw_.gpu.hbm_bw_achieved_bytes_per_s.value * eff.value);
      r.seconds = bytes_s + floor + launch;
      // A recurrent scan whose lowering states its chains (FLA's chunked delta rule): each chain walks the
      // chunks one after another, so the scan takes at least its chunks times the stack's time per chunk, per
      // kernel that walks them and per wave of chains over the SMs; its bytes stream meanwhile.
      if (static_cast<OpName>(op.name) == OpName::kMixerScan && op.gemm.m > 0 && op.gemm.k > 0 &&
          stack_.recurrent_scan_chunk_s.source != kNotStated) {
        const double waves = std::ceil(d(std::max<int64_t>(1, op.gemm.n)) / d(hw_.gpu.sm_count.value));
        const double chain = d(op.gemm.k) * d(op.gemm.m) * waves * stack_.recurrent_scan_chunk_s.value;
        if (chain > bytes_s) {
          r.seconds = chain + floor + launch;
          r.basis = weaker(r.basis, stack_.recurrent_scan_chunk_s.basis);
        }
      }
      // HybridEP's dispatch set-up (routing-map all-gather, preprocessing, the wait for counts) as its
      // benchmark measures it beyond the dispatch kernel, per node count of the exchange.
      if (static_cast<OpName>(op.name) == OpName::kDispatchPreprocess &&
          !stack_.dispatcher.by_nodes.empty()) {
        r.seconds = std::max(r.seconds, dispatcher_at(d(placement(op.comm).nodes)).dispatch_setup_s);
        r.basis = weaker(r.basis, stack_.dispatcher.by_nodes_basis);
      }
      err = eff.basis == Basis::kMeasured ? 0.05 : kAssumedRelError;
      r.basis = weaker(r.basis, eff.basis);
      if (op.host_sync) {
        r.host_sync_seconds = stack_.host_sync_s.value;
        r.basis = weaker(r.basis, stack_.host_sync_s.basis);
      }
      break;
    }
    case OpKind::kCollective:
    case OpKind::kSendRecv: {
      if (op.comm.node_dedup) {
        r.seconds = node_dedup_seconds(op.comm, &r.resource) + launch;
        // The forward combine's fixed cost beyond its kernel (measured per node count where the stack has
        // it).
        if (op.phase == Phase::kForward && static_cast<OpName>(op.name) == OpName::kCombineA2a)
          r.seconds += dispatcher_at(d(placement(op.comm).nodes)).combine_setup_s;
        err = kAssumedRelError;
        r.sm_fraction = d(stack_.dispatcher.sms.value) / d(hw_.gpu.sm_count.value);
        r.rate_beside_compute = stack_.dispatcher.overlap_efficiency.value;
        r.basis = weaker(r.basis, weaker(stack_.dispatcher.nic_efficiency.basis,
                                         stack_.dispatcher.nvlink_efficiency.basis));
      } else {
        r.seconds = collective_seconds(op.comm, &err, &r.resource) + launch;
        r.sm_fraction = op.comm.userbuffers ? userbuffers_sm_fraction(d(hw_.gpu.sm_count.value))
                                            : stack_.comm_sm_fraction.value;
        if (op.comm.userbuffers) r.basis = weaker(r.basis, stack_.overlaps.tp_comm.basis);
      }
      if (op.kind == OpKind::kSendRecv) r.seconds += stack_.host_s_per_micro_batch.value / 2.0;
      r.link_bytes_per_s = r.seconds > 0 ? op.comm.bytes / r.seconds : 0;
      break;
    }
    case OpKind::kFusedGemmComm: {
      if (op.comm.userbuffers) {
        r.seconds = userbuffers_seconds(op, &err) + aux + launch;
        r.basis = weaker(r.basis, stack_.overlaps.tp_comm.basis);
        if (op.comm.collective == Collective::kReduceScatter &&
            stack_.userbuffers_rs_speed.source != kNotStated)
          r.basis = weaker(r.basis, stack_.userbuffers_rs_speed.basis);
        break;
      }
      // Tile pipeline: compute on the SMs left after the kernel's communication SMs and those it leaves to
      // other streams' collectives, communication of the first chunk exposed, then the slower of the two
      // streams, then the other's last chunk:  T = max(comp, comm) + min(comp, comm) / chunks. The kernel is
      // the one moerun runs for the op (fused_ops.h); its tiles compute at the stack's fused GEMM efficiency
      // of the library rate.
      const bool grouped = op.gemm.groups > 1;
      double e1 = 0, e2 = 0;
      Resource res;
      const FusedKernelParams& fp = fused_params(fused_kind(op));
      const double sms = d(hw_.gpu.sm_count.value);
      const double comp = (grouped ? grouped_gemm_seconds(op.gemm, op.dtype, &e1, op.part)
                                   : gemm_seconds(op.gemm, op.dtype, &e1, op.part)) *
                          block_scaling(op) * sms / (sms - d(fp.comm_sms + kFusedSmsLeftForCollectives)) /
                          stack_.fused_gemm_efficiency.value;
      const double comm = collective_seconds(op.comm, &e2, &res);
      const double chunks = d(fp.chunks_per_peer * std::max<int64_t>(1, op.comm.group_size));
      r.seconds = std::max(comp, comm) + std::min(comp, comm) / chunks + aux + launch;
      err = std::max(e1, e2);
      r.basis = weaker(r.basis, stack_.overlaps.intra_op.basis);
      if (stack_.fused_gemm_efficiency.source != kNotStated)
        r.basis = weaker(r.basis, stack_.fused_gemm_efficiency.basis);
      break;
    }
  }
  // Inside a CUDA graph the replay issues the op's kernels, not the host one by one. The first op of a
  // replay carries the host's two framework calls (the copy of the graph's inputs or incoming gradients
  // into its static buffers, and the replay; TE pytorch/graph.py Graphed.forward / backward) and that copy,
  // one memory-bound kernel.
  if (op.graphed) {
    r.host_seconds = 0;
    if (op.graph_copy_bytes > 0) {
      const Stated<double>& eff = stack_.memory_bound_efficiency_of(MemOp::kActivation, op.phase);
      r.host_seconds = 2.0 * stack_.host_s_per_kernel.value;
      r.seconds +=
          static_cast<double>(op.graph_copy_bytes) / (hw_.gpu.hbm_bw_achieved_bytes_per_s.value * eff.value) +
          min_kernel + stack_.launch_s_per_kernel.value;
      r.basis = weaker(r.basis, eff.basis);
    }
  }
  // Launch gaps and the kernel floor price the op only where they are most of it (small kernels).
  if (launch + floor >= 0.5 * r.seconds) {
    r.basis = weaker(r.basis, weaker(stack_.launch_s_per_kernel.basis, stack_.min_kernel_s.basis));
  }
  r.rel_error = err;
  return r;
}

}  // namespace moeplan::cost
