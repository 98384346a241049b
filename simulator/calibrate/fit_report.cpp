// Fit quality of a hardware profile (see fit_report.h).
#include "simulator/calibrate/fit_report.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <map>
#include <optional>

#include <fmt/format.h>

#include "simulator/core/op_graph.h"

#include "simulator/core/units.h"
#include "simulator/cost/collective.h"
#include "simulator/cost/cost_model.h"
#include "simulator/cost/gemm_grid.h"

namespace moeplan::calibrate {
namespace {

double d(int64_t x) {
  return static_cast<double>(x);
}

ErrorStats stats(std::vector<double> errs) {
  ErrorStats s;
  s.points = static_cast<int64_t>(errs.size());
  if (errs.empty()) return s;
  std::sort(errs.begin(), errs.end());
  s.median =
      errs.size() % 2 ? errs[errs.size() / 2] : 0.5 * (errs[errs.size() / 2 - 1] + errs[errs.size() / 2]);
  s.max = errs.back();
  return s;
}

const char* algo_name(CollectiveAlgorithm a) {
  switch (a) {
    case CollectiveAlgorithm::kRing:
      return "ring";
    case CollectiveAlgorithm::kNvls:
      return "nvls";
    case CollectiveAlgorithm::kNvlsTree:
      return "nvls_tree";
    case CollectiveAlgorithm::kTree:
      return "tree";
    case CollectiveAlgorithm::kUnspecified:
      return "unspecified";
  }
  return "?";
}

std::string size_label(double bytes) {
  if (bytes >= kGiB) return fmt::format("{:g} GiB", bytes / kGiB);
  if (bytes >= kMiB) return fmt::format("{:g} MiB", bytes / kMiB);
  if (bytes >= 1024) return fmt::format("{:g} KiB", bytes / 1024);
  return fmt::format("{:g} B", bytes);
}

// Splits per-point errors into the two groups and fills the table's statistics.
void finish(TableFit* t, const std::vector<std::pair<double, bool>>& errs) {
  std::vector<double> large, small;
  for (const auto& [e, is_large] : errs) (is_large ? large : small).push_back(e);
  t->large = stats(large);
  t->small = stats(small);
}

TableFit collective_fit(const CollectiveCurve& c, const HardwareProfile& hw) {
  TableFit t;
  t.kind = "collective";
  t.label = fmt::format("{} {} {} ranks / {} node{}", name_of(c.collective), algo_name(c.algorithm), c.ranks,
                        c.nodes, c.nodes > 1 ? "s" : "");
  const cost::CurveModel m = cost::fit_curve(c.collective, c.ranks, c.points);
  const double f = cost::busbw_factor(c.collective, c.ranks);
  std::vector<std::pair<double, bool>> errs;
  if (c.points.size() == 1) {
    // The cost model's single-point rule: the measured bandwidth plus NCCL's per-step latency constant.
    const double lat =
        c.scope == Scope::kIntraNode ? hw.node.nvlink_latency_s.value : hw.scale_out.net_latency_s.value;
    const auto [bytes, busbw] = c.points.front();
    const double pred =
        bytes * f / cost::alpha_beta_seconds(c.collective, c.ranks, bytes, lat * d(c.ranks - 1), busbw);
    t.model =
        "one size, not scored (nothing to predict it from): its bandwidth, latency = NCCL per-step "
        "constant x (ranks - 1)";
    t.points.push_back({size_label(bytes), busbw / 1e9, pred / 1e9});
  } else if (m.loo_points > 0) {
    t.model = m.interpolated()
                  ? fmt::format(
                        "interpolated in log-log (beat alpha-beta leave-one-out); errors leave-one-out "
                        "over the {} interior sizes",
                        m.loo_points)
                  : fmt::format(
                        "alpha-beta (alpha {:.1f} us, busbw {:.1f} GB/s; beat interpolation leave-one-out); "
                        "errors leave-one-out over the {} interior sizes",
                        m.fit.alpha_s * 1e6, m.fit.busbw_bytes_per_s / 1e9, m.loo_points);
    for (size_t i = 0; i < m.loo_busbw.size(); ++i) {
      const auto [bytes, pred] = m.loo_busbw[i];
      const double busbw = c.points[i + 1].second;  // the interior sizes, in order
      t.points.push_back({size_label(bytes), busbw / 1e9, pred / 1e9});
      errs.emplace_back(std::abs(busbw / pred - 1.0), bytes >= kMiB);
    }
    if (m.interpolated()) {
      t.note = fmt::format(
          "one alpha-beta line over all sizes: alpha {:.1f} us, busbw {:.1f} GB/s, in-sample "
          "error {:.1f}% median / {:.1f}% max at >= 1 MiB",
          m.fit.alpha_s * 1e6, m.fit.busbw_bytes_per_s / 1e9, m.fit.rel_error_large * 100, [&] {
            double mx = 0;
            for (const auto& [b, bw] : c.points) {
              if (b < kMiB) continue;
              const double tp =
                  cost::alpha_beta_seconds(c.collective, c.ranks, b, m.fit.alpha_s, m.fit.busbw_bytes_per_s);
              mx = std::max(mx, std::abs(tp / (b * f / bw) - 1.0));
            }
            return mx * 100;
          }());
    }
  } else {
    t.model = fmt::format("alpha-beta (alpha {:.1f} us, busbw {:.1f} GB/s), in-sample", m.fit.alpha_s * 1e6,
                          m.fit.busbw_bytes_per_s / 1e9);
    for (const auto& [bytes, busbw] : c.points) {
      const double pred = bytes * f / cost::curve_seconds(m, c.collective, c.ranks, bytes);
      t.points.push_back({size_label(bytes), busbw / 1e9, pred / 1e9});
      errs.emplace_back(std::abs(busbw / pred - 1.0), bytes >= kMiB);
    }
  }
  finish(&t, errs);
  return t;
}

// A collective over `n` consecutive ranks of one group, as the facts and the all-to-all-v table price it.
CommSpec group_comm(Collective c, int64_t n, double bytes) {
  CommSpec s;
  s.collective = c;
  s.group = CommGroup::kEp;
  s.group_size = static_cast<int32_t>(n);
  s.stride = 1;
  s.bytes = bytes;
  return s;
}

// An all-to-all-v table with a hot receiver, priced as a routed exchange is priced where no such table holds
// its group: a uniform all-to-all of the busiest rank's bytes (hot_factor x bytes) on the profile's
// all-to-all curve for the group. Where the table holds the group the cost model prices from the table
// itself (cost::hot_receiver_slowdown), so this says how far that rule would be off. Shown as the busiest
// rank's bus bandwidth, hot_factor x bytes x (n - 1) / n over the time.
TableFit alltoall_skew_fit(const AllToAllSkewTable& a, const cost::CostModel& cm) {
  TableFit t;
  t.kind = "alltoall_skew";
  t.label =
      fmt::format("alltoall, hot receiver, {} ranks / {} node{}", a.ranks, a.nodes, a.nodes > 1 ? "s" : "");
  t.model =
      "a uniform all-to-all of the busiest rank's bytes (hot_factor x bytes) on the profile's all-to-all "
      "curve, the rule for routed exchanges of groups without such a table; not fitted to this table (the "
      "cost model prices this group's routed exchanges from the table itself)";
  t.source = a.source;
  const double f = cost::busbw_factor(Collective::kAllToAll, a.ranks);
  std::vector<std::pair<double, bool>> errs;
  std::map<double, std::pair<double, int>> log_ratio_by_hot;  // sum of log(measured / priced time), count
  for (const AllToAllSkewPoint& p : a.points) {
    const CommSpec s = group_comm(Collective::kAllToAll, a.ranks, d(p.bytes) * p.hot_factor);
    const double priced = cm.collective_seconds(s, nullptr, nullptr);
    const double busiest = s.bytes * f;
    t.points.push_back({fmt::format("{} x{:.3g}", size_label(d(p.bytes)), p.hot_factor),
                        busiest / p.seconds / 1e9, busiest / priced / 1e9});
    errs.emplace_back(std::abs(priced / p.seconds - 1.0), s.bytes >= kMiB);
    auto& [sum, n] = log_ratio_by_hot[std::round(p.hot_factor * 100) / 100];
    sum += std::log(p.seconds / priced);
    ++n;
  }
  for (const auto& [hot, acc] : log_ratio_by_hot) {
    t.note +=
        fmt::format("{}x{:g}: {:.2f}", t.note.empty() ? "measured / priced time (geometric mean) at " : ", ",
                    hot, std::exp(acc.first / acc.second));
  }
  finish(&t, errs);
  return t;
}

// Tiles of the cost model's GEMM tile (128 x 256) per group, times groups, against the SM count.
bool fills_gpu(int64_t rows, int64_t n, int64_t groups, int64_t sms) {
  return groups * ((rows + 127) / 128) * ((n + 255) / 256) >= sms;
}

DType dtype_of(const std::string& s) {
  return s == "fp8" ? DType::kFp8 : DType::kBf16;
}

// The citation's leading id ("hopper-hardware.md §3.2, S9", "G1"): what tells two tables of one kernel apart.
std::string source_tag(const std::string& source) {
  return source.substr(0, std::min(source.find(" ("), source.find(" \u2014")));
}

// The profile as its tables measured it: the tables time kernels in bursts, so they are scored against the
// model without the GPU's sustained rate that prices a training step.
HardwareProfile at_burst_rate(const HardwareProfile& profile) {
  HardwareProfile hw = profile;
  hw.gpu.sustained_rate.clear();
  return hw;
}

}  // namespace

// The cost model's grouped GEMM as the table's kernel class runs it (one grouped launch, or one dense GEMM
// per expert over the class's streams), at efficiency 1 and without launch gaps or a kernel floor, so
// measured / predicted is the efficiency a stack on this kernel needs. A "fwd+bwd" table is predicted as its
// forward, dgrad and wgrad GEMMs in sequence:
//   rate = parts x 2 m n k / sum over parts of grouped_gemm_seconds(part).
// Like every table, it is scored at the tables' burst rate (no sustained rate).
TableFit grouped_gemm_fit(const GroupedGemmTable& g, const HardwareProfile& profile,
                          const StackProfile& stack) {
  const HardwareProfile hw = at_burst_rate(profile);
  const GroupedGemmKernelClass* kc = find_grouped_gemm_kernel(g.kernel);
  assert(kc && "the hardware loader accepts only known kernel classes");
  StackProfile raw = stack;
  raw.grouped_gemm.impl = {kc->impl, kc->what, Basis::kMeasured};
  raw.grouped_gemm.streams = {kc->streams, kc->what, Basis::kMeasured};
  raw.grouped_gemm.efficiency =
      raw.grouped_gemm.wgrad_efficiency = {1.0, "raw shape model", Basis::kMeasured};
  raw.launch_s_per_kernel.value = 0;
  raw.min_kernel_s.value = 0;
  cost::CostModel cm(hw, raw);
  cm.record_extrapolations(false);
  std::vector<GemmPart> parts;
  if (g.part == "fwd" || g.part == "fwd+bwd") parts.push_back(GemmPart::kNone);
  if (g.part == "dgrad" || g.part == "fwd+bwd") parts.push_back(GemmPart::kDgrad);
  if (g.part == "wgrad" || g.part == "fwd+bwd") parts.push_back(GemmPart::kWgrad);

  TableFit t;
  t.kind = "grouped_gemm";
  t.kernel = g.kernel;
  t.dtype = g.dtype;
  t.part = g.part;
  t.source = source_tag(g.source);
  t.label = fmt::format("{} {} grouped {} ({})", g.kernel, g.dtype, g.part, t.source);
  t.model = fmt::format("dense GEMM model per expert as {} ({} stream{}), efficiency 1, no launch gaps",
                        name_of(kc->impl), kc->streams, kc->streams > 1 ? "s" : "");
  const int64_t sms = hw.gpu.sm_count.value;
  std::vector<std::pair<double, bool>> errs;
  std::vector<double> all;
  double log_sum = 0;
  for (const auto& p : g.points) {
    const GemmShape s{p.groups * p.m_per_group, p.n, p.k, p.groups};
    double pred_s = 0;
    for (GemmPart part : parts) pred_s += cm.grouped_gemm_seconds(s, dtype_of(g.dtype), nullptr, part);
    const double flops = static_cast<double>(parts.size()) * 2.0 * d(s.m) * d(p.n) * d(p.k);
    const double pred = flops / pred_s;
    t.points.push_back(
        {fmt::format("{}x({}x{}x{})", p.groups, p.m_per_group, p.n, p.k), p.flops_per_s / 1e12, pred / 1e12});
    const double e = std::abs(p.flops_per_s / pred - 1.0);
    errs.emplace_back(e, fills_gpu(p.m_per_group, p.n, p.groups, sms));
    all.push_back(e);
    log_sum += std::log(p.flops_per_s / pred);
  }
  finish(&t, errs);
  t.all = stats(all);
  if (!g.points.empty()) t.implied_efficiency = std::exp(log_sum / static_cast<double>(g.points.size()));
  t.note = fmt::format("{}: median {:.1f}% / max {:.1f}% over {} shape{}; implied efficiency {:.2f}",
                       g.kernel, t.all.median * 100, t.all.max * 100, t.all.points,
                       t.all.points == 1 ? "" : "s", t.implied_efficiency);
  return t;
}

FitReport fit_report(const HardwareProfile& profile, const StackProfile& stack) {
  const HardwareProfile hw = at_burst_rate(profile);
  FitReport r;
  r.profile = hw.name;
  cost::CostModel cm(hw, stack);
  cm.record_extrapolations(false);
  const int64_t sms = hw.gpu.sm_count.value;
  for (const auto& c : hw.calibration.collectives) r.tables.push_back(collective_fit(c, hw));

  std::vector<std::optional<cost::GemmGrid>> grid_of;  // by table
  for (const auto& g : hw.calibration.gemm) grid_of.push_back(cost::GemmGrid::from_table(g));
  for (size_t ti = 0; ti < hw.calibration.gemm.size(); ++ti) {
    const GemmTable& g = hw.calibration.gemm[ti];
    TableFit t;
    t.kind = "gemm";
    t.label = fmt::format("{} GEMM, {} shapes", g.dtype, g.points.size());
    std::vector<std::pair<double, bool>> errs;
    if (const auto& grid = grid_of[ti]) {
      // A sweep the model interpolates: each interior row count predicted from its neighbours without it.
      t.model = fmt::format(
          "a {}x{}x{} grid the model interpolates (log time in log m, n, k; the geometric mean of the "
          "dtype's "
          "grids); leave-one-out along m over the interior rows",
          grid->m().size(), grid->n().size(), grid->k().size());
      for (size_t i = 0; i < grid->m().size(); ++i) {
        for (size_t j = 0; j < grid->n().size(); ++j) {
          for (size_t l = 0; l < grid->k().size(); ++l) {
            const auto pred_s = grid->seconds_without(i, j, l);
            if (!pred_s) continue;
            const int64_t m = grid->m()[i], n = grid->n()[j], k = grid->k()[l];
            const double flops = 2.0 * d(m) * d(n) * d(k), meas_s = grid->measured_seconds(i, j, l);
            t.points.push_back(
                {fmt::format("{}x{}x{}", m, n, k), flops / meas_s / 1e12, flops / *pred_s / 1e12});
            errs.emplace_back(std::abs(*pred_s / meas_s - 1.0), fills_gpu(m, n, 1, sms));
          }
        }
      }
      finish(&t, errs);
      r.tables.push_back(std::move(t));
      continue;
    }
    size_t in_grid = 0;
    for (const auto& p : g.points) {
      const bool covered =
          std::any_of(grid_of.begin(), grid_of.end(), [&](const std::optional<cost::GemmGrid>& grid) {
            return grid && grid->dtype() == g.dtype && grid->seconds(p.m, p.n, p.k).has_value();
          });
      in_grid += covered ? 1 : 0;
      const double pred_s = cm.gemm_seconds(GemmShape{p.m, p.n, p.k, 1}, dtype_of(g.dtype), nullptr);
      const double flops = 2.0 * d(p.m) * d(p.n) * d(p.k);
      t.points.push_back(
          {fmt::format("{}x{}x{}", p.m, p.n, p.k), p.flops_per_s / 1e12, flops / pred_s / 1e12});
      errs.emplace_back(std::abs(p.flops_per_s * pred_s / flops - 1.0), fills_gpu(p.m, p.n, 1, sms));
    }
    t.model =
        in_grid == 0
            ? "efficiency x wave quantisation x K / (K + k0), both fitted per dtype (K0 on a grid) on the "
              "tables that are not grids, roofline with HBM; in-sample"
        : in_grid == g.points.size()
            ? "every shape inside the measured grids, priced by them (out of sample)"
            : fmt::format(
                  "{} of its {} shapes inside the measured grids, priced by them (out of sample); the "
                  "rest by the fitted efficiency x wave x K / (K + k0) model (in-sample)",
                  in_grid, g.points.size());
    finish(&t, errs);
    r.tables.push_back(std::move(t));
  }

  for (const auto& g : hw.calibration.grouped_gemm) r.tables.push_back(grouped_gemm_fit(g, hw, stack));

  // Attention: the model interpolates one table per (direction, mask, head dim), FA3's when there is one.
  // That table is scored leave-one-out; the other implementations are scored against the model's prediction,
  // which shows how far they are from the kernel the model assumes.
  for (size_t ti = 0; ti < hw.calibration.attention.size(); ++ti) {
    const AttentionTable& a = hw.calibration.attention[ti];
    const AttentionTable* used = nullptr;
    for (const auto& o : hw.calibration.attention) {
      if (o.direction != a.direction || o.causal != a.causal || o.head_dim != a.head_dim || o.dtype != "bf16")
        continue;
      if (!used || (o.impl == "fa3" && used->impl != "fa3")) used = &o;
    }
    const bool is_used = used == &a;
    TableFit t;
    t.kind = "attention";
    t.label = fmt::format("{} {} {} hd{} {}", a.impl, a.dtype, a.direction, a.head_dim,
                          a.causal ? "causal" : "full");
    t.model = is_used ? "the table the model interpolates (log seq); leave-one-out over interior lengths"
                      : fmt::format("not modelled: the model's prediction from the {} table",
                                    used ? used->impl : "?");
    auto predict = [&](const cost::CostModel& model, int64_t seq) {
      Op op;
      op.kind = OpKind::kAttention;
      op.phase = a.direction == "bwd" ? Phase::kBackward : Phase::kForward;
      op.attn.seq_q = op.attn.seq_kv = static_cast<int32_t>(seq);
      op.attn.qk_dim = op.attn.v_dim = static_cast<int32_t>(a.head_dim);
      op.attn.causal = a.causal;
      op.flops = 1e12;
      return 1.0 / model.attention_seconds(op, nullptr);  // TFLOP/s
    };
    std::vector<std::pair<double, bool>> errs;
    for (size_t i = 0; i < a.points.size(); ++i) {
      const auto [seq, rate] = a.points[i];
      double pred = 0;
      if (is_used) {
        if (i == 0 || i + 1 == a.points.size()) continue;  // an end point is not predictable without itself
        HardwareProfile without = hw;
        auto& pts = without.calibration.attention[ti].points;
        pts.erase(pts.begin() + static_cast<long>(i));
        cost::CostModel m2(without, stack);
        m2.record_extrapolations(false);
        pred = predict(m2, seq);
      } else {
        if (!used) continue;
        pred = predict(cm, seq);
      }
      t.points.push_back({fmt::format("seq {}", seq), rate / 1e12, pred});
      errs.emplace_back(std::abs(rate / 1e12 / pred - 1.0), seq >= 1024);
    }
    if (!is_used) t.kind = "attention_other";
    finish(&t, errs);
    r.tables.push_back(std::move(t));
  }

  if (!hw.calibration.hbm.empty()) {
    TableFit t;
    t.kind = "hbm";
    t.label = "STREAM kernels";
    t.model = fmt::format("one achieved HBM bandwidth, {:.0f} GB/s (gpu.hbm_bw_achieved_GBps)",
                          hw.gpu.hbm_bw_achieved_bytes_per_s.value / 1e9);
    std::vector<std::pair<double, bool>> errs;
    for (const auto& h : hw.calibration.hbm) {
      const double pred = hw.gpu.hbm_bw_achieved_bytes_per_s.value;
      t.points.push_back({h.kernel, h.bytes_per_s / 1e9, pred / 1e9});
      errs.emplace_back(std::abs(h.bytes_per_s / pred - 1.0), true);
    }
    finish(&t, errs);
    r.tables.push_back(std::move(t));
  }

  for (const AllToAllSkewTable& a : hw.calibration.alltoall_skew)
    r.tables.push_back(alltoall_skew_fit(a, cm));

  // Facts the sources state (hopper-hardware.md §1.2, §2.2, §2.4, §2.7).
  const auto comm = group_comm;
  const int64_t gpn = hw.node.gpus_per_node.value;
  const double nvlink = hw.node.nvlink_bw_achieved_bytes_per_s.value;
  bool has_nvls8 = false;
  for (const auto& c : hw.calibration.collectives) {
    has_nvls8 |= c.collective == Collective::kAllReduce && c.algorithm == CollectiveAlgorithm::kNvls &&
                 c.ranks == gpn && c.points.size() > 1;
  }
  if (hw.node.nvls.value && has_nvls8) {
    const double bytes = 1.0 * kGiB;
    const double t = cm.collective_seconds(comm(Collective::kAllReduce, gpn, bytes), nullptr, nullptr);
    const double busbw = bytes * cost::busbw_factor(Collective::kAllReduce, gpn) / t;
    r.facts.push_back({fmt::format("NVLS all-reduce exceeds the ring rate on {} GPUs", gpn), busbw > nvlink,
                       fmt::format("predicted busbw at 1 GiB {:.0f} GB/s vs ring ceiling {:.0f} GB/s",
                                   busbw / 1e9, nvlink / 1e9)});
  }
  {
    const double nic = cm.nic_bytes_per_s_per_gpu();
    bool holds = true;
    std::string detail;
    for (int64_t n : {2 * gpn, 4 * gpn, 8 * gpn, 16 * gpn}) {
      const double bytes = 256.0 * kMiB;
      const double t = cm.collective_seconds(comm(Collective::kAllToAll, n, bytes), nullptr, nullptr);
      const double off_node_rate = bytes * d(n - gpn) / d(n) / t;  // per GPU, through its NIC
      holds &= off_node_rate <= nic * (1 + 1e-9);
      detail += fmt::format("{}{} GPUs: {:.1f} GB/s", detail.empty() ? "" : "; ", n, off_node_rate / 1e9);
    }
    r.facts.push_back({"all-to-all across nodes is capped by one NIC per GPU", holds,
                       fmt::format("off-node bytes per GPU per second at 256 MiB vs NIC {:.1f} GB/s: {}",
                                   nic / 1e9, detail)});
  }
  if (hw.name.rfind("h800", 0) == 0) {
    const double bytes = 1.0 * kGiB;
    const double t = cm.collective_seconds(comm(Collective::kAllGather, gpn, bytes), nullptr, nullptr);
    const double busbw = bytes * cost::busbw_factor(Collective::kAllGather, gpn) / t;
    const bool holds = std::abs(busbw / 160e9 - 1.0) <= 0.05;
    r.facts.push_back(
        {"H800 NVLink achieves about 160 GB/s per direction", holds,
         fmt::format("predicted all-gather busbw over {} GPUs at 1 GiB: {:.1f} GB/s", gpn, busbw / 1e9)});
  }
  return r;
}

nlohmann::json fit_report_json(const FitReport& r) {
  nlohmann::json j;
  j["profile"] = r.profile;
  auto st = [](const ErrorStats& s) {
    return nlohmann::json{{"points", s.points}, {"median", s.median}, {"max", s.max}};
  };
  j["tables"] = nlohmann::json::array();
  for (const auto& t : r.tables) {
    nlohmann::json pts = nlohmann::json::array();
    for (const auto& p : t.points)
      pts.push_back({{"at", p.at}, {"measured", p.measured}, {"predicted", p.predicted}});
    nlohmann::json e = {{"kind", t.kind},       {"label", t.label},     {"model", t.model},
                        {"large", st(t.large)}, {"small", st(t.small)}, {"points", pts}};
    if (!t.note.empty()) e["note"] = t.note;
    if (t.kind == "grouped_gemm") {
      e["kernel"] = t.kernel;
      e["dtype"] = t.dtype;
      e["part"] = t.part;
      e["source"] = t.source;
      e["all"] = st(t.all);
      e["implied_efficiency"] = t.implied_efficiency;
    }
    j["tables"].push_back(std::move(e));
  }
  j["facts"] = nlohmann::json::array();
  for (const auto& f : r.facts)
    j["facts"].push_back({{"statement", f.statement}, {"holds", f.holds}, {"detail", f.detail}});
  return j;
}

std::string fit_report_text(const FitReport& r) {
  std::string out = fmt::format(
      "Fit of {}: |predicted / measured - 1| per table (large = messages >= 1 MiB, GEMMs "
      "with a full wave of tiles, attention >= 1024 keys)\n\n",
      r.profile);
  auto cell = [](const ErrorStats& s) {
    return s.points ? fmt::format("{:5.1f}% {:6.1f}% {:3}", s.median * 100, s.max * 100, s.points)
                    : std::string("     -       -    0");
  };
  out +=
      fmt::format("{:<44} {:>19} {:>19}  {}\n", "table", "large: med  max  n", "small: med  max  n", "model");
  for (const auto& t : r.tables) {
    out += fmt::format("{:<44} {:>19} {:>19}  {}\n", t.label.substr(0, 44), cell(t.large), cell(t.small),
                       t.model);
    if (!t.note.empty()) out += fmt::format("{:<44} {}\n", "", t.note);
  }
  bool grouped = false;
  for (const auto& t : r.tables) grouped |= t.kind == "grouped_gemm";
  if (grouped) {
    out += "\nGrouped GEMM per table, against the raw shape model (its kernel class's implementation at\n";
    out +=
        "efficiency 1, no launch gaps); implied = geometric mean of measured / predicted, the efficiency\n";
    out += "a stack running that kernel should declare:\n";
    out += fmt::format("  {:<20} {:<5} {:<8} {:>3} {:>7} {:>7} {:>8}  {}\n", "kernel", "dtype", "part", "n",
                       "median", "max", "implied", "source");
    for (const auto& t : r.tables) {
      if (t.kind != "grouped_gemm") continue;
      out += fmt::format("  {:<20} {:<5} {:<8} {:>3} {:>6.1f}% {:>6.1f}% {:>8.2f}  {}\n", t.kernel, t.dtype,
                         t.part, t.all.points, t.all.median * 100, t.all.max * 100, t.implied_efficiency,
                         t.source);
    }
  }
  out += "\nFacts the sources state:\n";
  for (const auto& f : r.facts) {
    out += fmt::format("  [{}] {}: {}\n", f.holds ? "holds" : "FAILS", f.statement, f.detail);
  }
  return out;
}

}  // namespace moeplan::calibrate
