// The stack fit: per-kernel samples from the traces -> robust statistics (medians, binned medians, one least
// squares) -> a moeplan-stack-v1 file and a report that says, per parameter, fitted or kept and why.
#include "simulator/calibrate/stack/stack_fit.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <tuple>

#include <fmt/format.h>
#include <Eigen/Dense>

#include "simulator/cost/cost_model.h"
#include "simulator/io/stack_loader.h"

namespace moeplan::calibrate {
namespace {

using ordered_json = nlohmann::ordered_json;

constexpr double kUs = 1e-6;

double d(int64_t x) {
  return static_cast<double>(x);
}

// Linear-interpolated percentile, p in [0, 1]; the samples are copied and sorted.
double percentile(std::vector<double> v, double p) {
  MOEPLAN_ASSERT(!v.empty());
  std::sort(v.begin(), v.end());
  const double at = p * d(static_cast<int64_t>(v.size()) - 1);
  const auto i = static_cast<size_t>(std::floor(at));
  const size_t j = std::min(i + 1, v.size() - 1);
  return v[i] + (v[j] - v[i]) * (at - std::floor(at));
}
double median(const std::vector<double>& v) {
  return percentile(v, 0.5);
}

double round_to(double x, double step) {
  return std::round(x / step) * step;
}

// The stack that loses nothing: GEMM times then come from the hardware profile alone (a grouped-GEMM
// implementation at the dense model's rate, no launch or host costs). A kernel trace's grouped GEMM is one
// grouped kernel (its name says so); a moerun op runs what the base stack describes (moerun's CUDA replay one
// grouped kernel, its CPU replay one GEMM per expert in a loop), so the fitted efficiency is the kernels'
// rate and not the gap between two implementations.
StackProfile neutral_stack(GroupedGemmImpl impl, int64_t streams) {
  StackProfile s;
  s.memory_bound_efficiency.value = 1.0;
  s.grouped_gemm.impl.value = impl;
  s.grouped_gemm.streams.value = streams;
  s.grouped_gemm.efficiency.value = 1.0;
  s.grouped_gemm.wgrad_efficiency.value = 1.0;
  s.dispatcher.nic_efficiency.value = 1.0;
  s.dispatcher.nvlink_efficiency.value = 1.0;
  return s;
}

DType dtype_of(const std::string& t) {
  if (t.find("Float8") != std::string::npos || t.find("fp8") != std::string::npos) return DType::kFp8;
  return DType::kBf16;
}

// Bytes per element of a Kineto "Input type"; 0 when unknown (the tensor is then not counted).
double element_bytes(const std::string& t) {
  if (t.find("Float8") != std::string::npos) return 1;
  if (t.find("BFloat16") != std::string::npos || t.find("Half") != std::string::npos) return 2;
  if (t == "float" || t == "c10::Float" || t == "int") return 4;
  if (t == "double" || t == "long int" || t == "long") return 8;
  if (t == "bool" || t == "unsigned char" || t == "signed char") return 1;
  return 0;
}

double numel(const std::vector<int64_t>& dims) {
  if (dims.empty()) return 0;
  double n = 1;
  for (int64_t x : dims) n *= d(x);
  return n;
}

struct Grouped {
  GemmShape shape;
  DType dtype = DType::kBf16;
  GemmPart part = GemmPart::kNone;  // moerun labels say dgrad / wgrad; Kineto kernels are taken as forward
};

// Kineto: the launching op's inputs are [rows, K] (all experts' rows) and the expert weights [G, K, N] or
// [G, N, K] (torch._grouped_mm, DeepGEMM m-grouped "nt"); whichever weight dim equals K is K.
std::optional<Grouped> kineto_grouped(const KernelEvent& k) {
  if (k.input_dims.size() < 2 || k.input_dims[0].size() < 2 || k.input_dims[1].size() != 3)
    return std::nullopt;
  const auto& a = k.input_dims[0];
  const auto& w = k.input_dims[1];
  const int64_t kk = a.back();
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < a.size(); ++i) rows *= a[i];
  Grouped g;
  g.shape.m = rows;
  g.shape.k = kk;
  g.shape.groups = w[0];
  g.shape.n = w[1] == kk ? w[2] : w[1];
  if (w[1] != kk && w[2] != kk) return std::nullopt;
  if (g.shape.m <= 0 || g.shape.n <= 0 || g.shape.k <= 0 || g.shape.groups <= 0) return std::nullopt;
  g.dtype = k.input_types.empty() ? DType::kBf16 : dtype_of(k.input_types[0]);
  return g;
}

std::string base_name(const std::string& label) {
  if (label.size() > 1 && label[0] == 'L') {
    const size_t dot = label.find('.');
    if (dot != std::string::npos) return label.substr(dot + 1);
  }
  return label;
}

int64_t layer_of_label(const std::string& label) {
  if (label.size() < 2 || label[0] != 'L') return -1;
  const size_t dot = label.find('.');
  if (dot == std::string::npos) return -1;
  try {
    return std::stoll(label.substr(1, dot - 1));
  } catch (...) {
    return -1;
  }
}

// moerun: rows from flops = 2 m n k with the expert GEMM's (n, k) in forward orientation.
std::optional<Grouped> moerun_grouped(const KernelEvent& k, const StackFitOptions& o) {
  const auto& e = o.moerun_experts;
  if (e.local_experts <= 0 || e.hidden <= 0 || e.ffn_hidden <= 0 || k.flops <= 0) return std::nullopt;
  const std::string base = base_name(k.name);
  Grouped g;
  g.dtype = o.moerun_dtype;
  g.shape.groups = e.local_experts;
  if (base.find("fc13") != std::string::npos) {
    g.shape.n = 2 * e.ffn_hidden;
    g.shape.k = e.hidden;
  } else if (base.find("fc2") != std::string::npos) {
    g.shape.n = e.hidden;
    g.shape.k = e.ffn_hidden;
  } else {
    return std::nullopt;
  }
  g.shape.m = static_cast<int64_t>(std::llround(k.flops / (2.0 * d(g.shape.n) * d(g.shape.k))));
  if (g.shape.m <= 0) return std::nullopt;
  if (k.name.find(".wgrad") != std::string::npos) g.part = GemmPart::kWgrad;
  if (k.name.find(".dgrad") != std::string::npos) g.part = GemmPart::kDgrad;
  return g;
}

// Kineto: reads are every tensor input, the write is one tensor like the first input (permute, norm and cast
// write what they read; a cast's narrower output is within the spread this accepts).
double kineto_bytes(const KernelEvent& k) {
  if (k.input_dims.empty() || k.input_types.size() < k.input_dims.size()) return -1;
  double bytes = 0;
  for (size_t i = 0; i < k.input_dims.size(); ++i)
    bytes += numel(k.input_dims[i]) * element_bytes(k.input_types[i]);
  bytes += numel(k.input_dims[0]) * element_bytes(k.input_types[0]);
  return bytes > 0 ? bytes : -1;
}

// Sum of |[a, b) ∩ union| for a sorted, merged union of intervals.
double overlap_with(const std::vector<std::pair<double, double>>& merged, double a, double b) {
  double total = 0;
  auto it = std::lower_bound(merged.begin(), merged.end(), std::make_pair(a, a),
                             [](const auto& x, const auto& y) { return x.second < y.first; });
  for (; it != merged.end() && it->first < b; ++it)
    total += std::max(0.0, std::min(b, it->second) - std::max(a, it->first));
  return total;
}

std::vector<std::pair<double, double>> merge(std::vector<std::pair<double, double>> v) {
  std::sort(v.begin(), v.end());
  std::vector<std::pair<double, double>> out;
  for (const auto& x : v) {
    if (!out.empty() && x.first <= out.back().second) {
      out.back().second = std::max(out.back().second, x.second);
    } else {
      out.push_back(x);
    }
  }
  return out;
}

// Index of the range in `rs` (sorted by start, not nested) that contains t, -1 when none.
int64_t containing(const std::vector<const TraceRange*>& rs, double t) {
  auto it =
      std::upper_bound(rs.begin(), rs.end(), t, [](double x, const TraceRange* r) { return x < r->start_s; });
  if (it == rs.begin()) return -1;
  --it;
  return t <= (*it)->end_s ? static_cast<int64_t>(it - rs.begin()) : -1;
}

bool is_ep_comm(const KernelEvent& k, TraceDialect dialect) {
  if (dialect == TraceDialect::kMoerun)
    return k.group == "ep" || k.group == "etp" || k.group == "tp" || k.group == "sp" || k.group == "cp";
  return k.name.find("AllToAll") != std::string::npos || k.name.find("SendRecv") != std::string::npos ||
         k.name.find("deep_ep") != std::string::npos || k.name.find("hybrid_ep") != std::string::npos;
}

struct Spread {
  int64_t n = 0;
  double lo = 0, hi = 0;
};
Spread spread_of(const std::vector<double>& v) {
  if (v.empty()) return {};
  return {static_cast<int64_t>(v.size()), percentile(v, 0.1), percentile(v, 0.9)};
}

// Everything collected from the traces before any statistic is taken.
struct Samples {
  std::vector<std::pair<double, double>> grouped;  // (rows per expert, efficiency), forward and dgrad
  std::vector<double> grouped_wgrad;               // efficiencies of weight-gradient grouped GEMMs
  std::vector<double> mem_eff;
  double mem_bytes = 0, mem_seconds = 0;
  std::vector<double> layer_gaps;  // gaps between kernels of one layer instance (s)
  std::vector<double> plain_gaps;  // every gap that is neither excluded nor a micro-batch boundary (s)
  std::vector<double> boundary_gaps;
  struct MoeLayer {
    double gap_sum = 0;
    int64_t gaps = 0;
    double expert_launches = 0;  // Σ local experts over the layer's grouped GEMMs
  };
  std::vector<MoeLayer> moe_layers;
  int64_t segments = 0, micro_batches = 0;
  int64_t excluded_gaps = 0;
  double comm_s = 0, comm_overlap_s = 0, ep_comm_s = 0, ep_overlap_s = 0;
  std::vector<double> comm_sm;  // grid blocks / SMs of communication kernels that overlap compute
  int64_t grouped_without_shape = 0, mem_without_bytes = 0;
};

void collect(const TraceFile& t, const HardwareProfile& hw, const cost::CostModel& kernel_neutral,
             const cost::CostModel& base_neutral, const StackFitOptions& o, Samples& s) {
  const bool moerun = t.dialect == TraceDialect::kMoerun;
  const cost::CostModel& neutral = moerun ? base_neutral : kernel_neutral;
  const std::regex mb_re(o.micro_batch_regex), fwd_re(o.forward_regex), moe_re(o.moe_layer_regex);
  std::vector<const TraceRange*> mb_ranges, layer_ranges, steps;
  for (const auto& r : t.ranges) {
    if (r.name.rfind("ProfilerStep#", 0) == 0)
      steps.push_back(&r);
    else if (std::regex_search(r.name, mb_re))
      mb_ranges.push_back(&r);
    else if (std::regex_search(r.name, moe_re))
      layer_ranges.push_back(&r);
  }
  std::vector<KernelKind> kinds(t.kernels.size());
  for (size_t i = 0; i < t.kernels.size(); ++i) kinds[i] = o.patterns.classify(t.kernels[i], t.dialect);

  std::set<int64_t> devices;
  for (const auto& k : t.kernels) devices.insert(k.device);
  for (int64_t dev : devices) {
    // Compute streams: given, moerun's compute stream (0), or the stream with the most GEMM/attention time.
    std::set<int64_t> compute(o.compute_streams.begin(), o.compute_streams.end());
    if (compute.empty() && moerun) compute.insert(0);
    if (compute.empty()) {
      std::map<int64_t, double> busy;
      for (size_t i = 0; i < t.kernels.size(); ++i) {
        const KernelKind kk = kinds[i];
        if (t.kernels[i].device == dev &&
            (kk == KernelKind::kGemm || kk == KernelKind::kGroupedGemm || kk == KernelKind::kAttention))
          busy[t.kernels[i].stream] += t.kernels[i].dur_s;
      }
      if (!busy.empty())
        compute.insert(std::max_element(busy.begin(), busy.end(), [](auto& a, auto& b) {
                         return a.second < b.second;
                       })->first);
    }
    std::vector<std::pair<double, double>> comp_iv;
    std::vector<size_t> comm_idx;
    std::vector<double> comm_ends;
    for (size_t i = 0; i < t.kernels.size(); ++i) {
      const auto& k = t.kernels[i];
      if (k.device != dev) continue;
      if (kinds[i] == KernelKind::kNccl) {
        comm_idx.push_back(i);
        comm_ends.push_back(k.start_s + k.dur_s);
      } else if (kinds[i] != KernelKind::kOther || !moerun) {
        comp_iv.emplace_back(k.start_s, k.start_s + k.dur_s);
      }
    }
    std::sort(comm_ends.begin(), comm_ends.end());
    const auto merged = merge(comp_iv);
    for (size_t i : comm_idx) {
      const auto& k = t.kernels[i];
      const double ov = overlap_with(merged, k.start_s, k.start_s + k.dur_s);
      s.comm_s += k.dur_s;
      s.comm_overlap_s += ov;
      if (is_ep_comm(k, t.dialect)) {
        s.ep_comm_s += k.dur_s;
        s.ep_overlap_s += ov;
      }
      if (k.grid_blocks > 0 && ov > 0) s.comm_sm.push_back(d(k.grid_blocks) / d(hw.gpu.sm_count.value));
    }

    // Per-kernel samples (efficiencies) over every stream of the device.
    for (size_t i = 0; i < t.kernels.size(); ++i) {
      const auto& k = t.kernels[i];
      if (k.device != dev || k.dur_s <= 0) continue;
      if (kinds[i] == KernelKind::kGroupedGemm) {
        const auto g = moerun ? moerun_grouped(k, o) : kineto_grouped(k);
        if (!g) {
          ++s.grouped_without_shape;
          continue;
        }
        // The grouped-kernel model at the dense rate (the neutral stack) over the measured time.
        const double model = neutral.grouped_gemm_seconds(g->shape, g->dtype, nullptr, g->part);
        if (g->part == GemmPart::kWgrad) {
          s.grouped_wgrad.push_back(model / k.dur_s);
        } else {
          s.grouped.emplace_back(d(g->shape.m) / d(g->shape.groups), model / k.dur_s);
        }
      } else if (kinds[i] == KernelKind::kPermute || kinds[i] == KernelKind::kNorm ||
                 kinds[i] == KernelKind::kCast) {
        const double bytes = moerun ? k.hbm_bytes : kineto_bytes(k);
        if (bytes <= 0) {
          ++s.mem_without_bytes;
          continue;
        }
        if (bytes < o.min_memory_bound_bytes) continue;
        // The cost model prices such a kernel as the stack's fixed kernel time plus its bytes at the
        // memory-bound rate, so the rate is fitted on the time beyond that fixed part.
        const double busy = std::max(k.dur_s - o.base.min_kernel_s.value, 0.5 * k.dur_s);
        s.mem_bytes += bytes;
        s.mem_seconds += busy;
        s.mem_eff.push_back(bytes / busy / hw.gpu.hbm_bw_achieved_bytes_per_s.value);
      }
    }

    // Gaps on each compute stream. Keys: segment (micro-batch part), layer instance, profiler step.
    for (int64_t stream : compute) {
      struct Row {
        size_t i;
        int64_t segment, layer, step;
      };
      std::vector<Row> rows;
      std::map<std::tuple<int64_t, int64_t, int64_t>, int64_t> seg_ids, layer_ids;
      std::set<int64_t> mbs, fwd_segments, segs_seen;
      for (size_t i = 0; i < t.kernels.size(); ++i) {
        const auto& k = t.kernels[i];
        if (k.device != dev || k.stream != stream || kinds[i] == KernelKind::kNccl) continue;
        Row r{i, -1, -1, -1};
        if (moerun) {
          if (k.micro_batch >= 0 && k.phase != "optimizer") {
            const int64_t ph = k.phase == "fwd" ? 0 : k.phase == "bwd" ? 1 : 2;
            r.segment =
                seg_ids.try_emplace({k.micro_batch, ph, k.chunk}, static_cast<int64_t>(seg_ids.size()))
                    .first->second;
            mbs.insert(k.micro_batch);
            const int64_t layer = layer_of_label(k.name);
            if (layer >= 0)
              r.layer = layer_ids.try_emplace({layer, r.segment, 0}, static_cast<int64_t>(layer_ids.size()))
                            .first->second;
          }
        } else {
          const double at = k.launch_s >= 0 ? k.launch_s : k.start_s;
          r.segment = containing(mb_ranges, at);
          r.layer = containing(layer_ranges, at);
          r.step = containing(steps, at);
          if (r.segment >= 0) {
            segs_seen.insert(r.segment);
            if (std::regex_search(mb_ranges[static_cast<size_t>(r.segment)]->name, fwd_re))
              fwd_segments.insert(r.segment);
          }
        }
        rows.push_back(r);
      }
      if (moerun) {
        s.segments += static_cast<int64_t>(seg_ids.size());
        s.micro_batches += static_cast<int64_t>(mbs.size());
      } else {
        s.segments += static_cast<int64_t>(segs_seen.size());
        s.micro_batches +=
            static_cast<int64_t>(fwd_segments.empty() ? segs_seen.size() : fwd_segments.size());
      }
      const bool have_segments = moerun || !mb_ranges.empty();
      std::map<int64_t, Samples::MoeLayer> layers;
      std::map<int64_t, bool> layer_is_moe;
      for (const Row& r : rows) {
        if (r.layer < 0 || kinds[r.i] != KernelKind::kGroupedGemm) continue;
        const auto& k = t.kernels[r.i];
        const auto g = moerun ? moerun_grouped(k, o) : kineto_grouped(k);
        if (!g) continue;
        layers[r.layer].expert_launches += d(g->shape.groups);
        layer_is_moe[r.layer] = true;
      }
      for (size_t j = 0; j + 1 < rows.size(); ++j) {
        const Row &a = rows[j], &b = rows[j + 1];
        const auto &ka = t.kernels[a.i], &kb = t.kernels[b.i];
        const double end = ka.start_s + ka.dur_s;
        const double gap = std::max(0.0, kb.start_s - end);
        // A communication kernel that ends inside the gap is what the stream waited for: not host time.
        const auto c = std::lower_bound(comm_ends.begin(), comm_ends.end(), end);
        const bool waited = c != comm_ends.end() && *c <= kb.start_s;
        const bool outside = (have_segments && (a.segment < 0 || b.segment < 0)) || a.step != b.step;
        if (waited || outside) {
          ++s.excluded_gaps;
          continue;
        }
        if (a.segment != b.segment) {
          s.boundary_gaps.push_back(gap);
          continue;
        }
        // The gap before a grouped GEMM also carries the per-expert host cost: not a per-kernel sample.
        const bool before_grouped = kinds[b.i] == KernelKind::kGroupedGemm;
        if (!before_grouped) s.plain_gaps.push_back(gap);
        if (a.layer >= 0 && a.layer == b.layer) {
          if (!before_grouped) s.layer_gaps.push_back(gap);
          if (layer_is_moe.count(a.layer)) {
            layers[a.layer].gap_sum += gap;
            ++layers[a.layer].gaps;
          }
        }
      }
      for (const auto& [id, l] : layers) {
        if (l.gaps > 0 && l.expert_launches > 0) s.moe_layers.push_back(l);
      }
    }
  }
}

std::string traces_cited(const std::vector<TraceFile>& traces) {
  std::string out;
  for (const auto& t : traces) out += fmt::format("{}{}", out.empty() ? "" : ", ", t.label);
  return out;
}

}  // namespace

Result<StackFit> fit_stack(const std::vector<TraceFile>& traces, const HardwareProfile& hw,
                           const StackFitOptions& o) {
  if (traces.empty()) return Error{"stack fit: no trace given"};
  if (o.patterns.patterns.empty()) return Error{"stack fit: no kernel patterns (load_kernel_patterns)"};
  for (const auto* re : {&o.micro_batch_regex, &o.forward_regex, &o.moe_layer_regex}) {
    try {
      (void)std::regex(*re);
    } catch (const std::regex_error&) {
      return Error{fmt::format("stack fit: range pattern '{}' is not a valid ECMAScript regex", *re)};
    }
  }
  const StackProfile neutral = neutral_stack(GroupedGemmImpl::kGroupedKernel, 1);
  const StackProfile base_neutral =
      neutral_stack(o.base.grouped_gemm.impl.value, o.base.grouped_gemm.streams.value);
  const cost::CostModel model(hw, neutral), base_model(hw, base_neutral);
  Samples s;
  StackFit fit;
  for (const auto& t : traces) {
    collect(t, hw, model, base_model, o, s);
    fit.traces.push_back(fmt::format("{} ({}, {} kernels)", t.label, name_of(t.dialect), t.kernels.size()));
  }
  const std::string from = traces_cited(traces);
  const std::string kept_prefix =
      fmt::format("kept from {} (the traces do not determine it): ", o.base_label);
  StackProfile& st = fit.stack;
  st = o.base;
  st.name = o.name;
  st.calibrated = true;
  st.description = !o.description.empty() ? o.description
                                          : fmt::format("Calibrated from per-op traces: {}. Base stack: {}.",
                                                        from, o.base_label);
  auto keep = [&](const std::string& key, double value, std::string& source, const std::string& why) {
    fit.params.push_back({key, false, value, 0, 0, 0, fmt::format("{}; old source: {}", why, source)});
    source = kept_prefix + why + ". " + source;
  };

  // Host cost per kernel: median of the gaps inside layer instances (all plain gaps when no layer is known).
  const bool by_layer = !s.layer_gaps.empty();
  const auto& kernel_gaps = by_layer ? s.layer_gaps : s.plain_gaps;
  double per_kernel_s = o.base.launch_s_per_kernel.value;
  if (!kernel_gaps.empty()) {
    per_kernel_s = round_to(std::min(median(kernel_gaps), 1e3 * kUs), 1e-3 * kUs);
    const Spread sp = spread_of(kernel_gaps);
    const std::string how = fmt::format(
        "median of {} idle gaps between consecutive kernels on the compute stream {} (gaps before a grouped "
        "GEMM, which also carry the per-expert cost, left out)",
        sp.n, by_layer ? "inside a layer" : "(no layer ranges: all gaps)");
    fit.params.push_back(
        {"host.launch_us_per_kernel", true, per_kernel_s / kUs, sp.n, sp.lo / kUs, sp.hi / kUs, how});
    st.launch_s_per_kernel = {
        per_kernel_s,
        fmt::format("[FITTED] {} in {}; p10-p90 {:.2f}-{:.2f} us; {} gaps excluded "
                    "(a communication kernel ended inside, or outside micro-batches/steps)",
                    how, from, sp.lo / kUs, sp.hi / kUs, s.excluded_gaps),
        Basis::kMeasured};
  } else {
    keep("host.launch_us_per_kernel", st.launch_s_per_kernel.value / kUs, st.launch_s_per_kernel.source,
         "no usable gap between compute kernels");
  }

  // Host cost per local expert: least squares of a MoE layer's gap excess against its expert launches.
  if (!s.moe_layers.empty()) {
    const auto n = static_cast<Eigen::Index>(s.moe_layers.size());
    Eigen::VectorXd y(n), x(n);
    std::vector<double> ratios;
    std::set<double> distinct;
    for (Eigen::Index i = 0; i < n; ++i) {
      const auto& l = s.moe_layers[static_cast<size_t>(i)];
      y(i) = l.gap_sum - d(l.gaps) * per_kernel_s;
      x(i) = l.expert_launches;
      ratios.push_back(y(i) / x(i));
      distinct.insert(x(i));
    }
    double slope = 0, intercept = 0;
    if (distinct.size() >= 2) {
      Eigen::MatrixXd a(n, 2);
      a.col(0) = x;
      a.col(1).setOnes();
      const Eigen::VectorXd beta = a.colPivHouseholderQr().solve(y);
      slope = beta(0);
      intercept = beta(1);
    } else {
      slope = x.dot(y) / x.dot(x);  // one expert count only: through the origin
    }
    const Spread sp = spread_of(ratios);
    const std::string how = fmt::format(
        "least squares over {} MoE layer instances of (layer gap sum - gaps x per-kernel gap) against Σ "
        "local "
        "experts over the layer's grouped GEMMs{}",
        sp.n,
        distinct.size() >= 2 ? fmt::format(", intercept {:.2f} us", intercept / kUs)
                             : " (one expert count only: line through the origin)");
    if (slope < 0)
      fit.notes.push_back(
          fmt::format("per-local-expert slope {:.3f} us was negative; set to 0", slope / kUs));
    slope = round_to(std::clamp(slope, 0.0, 1e3 * kUs), 1e-3 * kUs);
    fit.params.push_back(
        {"host.us_per_local_expert", true, slope / kUs, sp.n, sp.lo / kUs, sp.hi / kUs, how});
    st.host_s_per_local_expert = {slope,
                                  fmt::format("[FITTED] {} in {}; per-layer ratios p10-p90 {:.2f}-{:.2f} us",
                                              how, from, sp.lo / kUs, sp.hi / kUs),
                                  Basis::kMeasured};
  } else {
    keep("host.us_per_local_expert", st.host_s_per_local_expert.value / kUs,
         st.host_s_per_local_expert.source,
         "no MoE layer instance with grouped GEMM shapes and gaps (moerun: set the expert shape; Kineto: MoE "
         "layer "
         "ranges and grouped GEMM Input Dims)");
  }

  // Host cost per micro-batch: the extra gap at micro-batch boundaries, times boundaries per micro-batch.
  if (!s.boundary_gaps.empty() && s.micro_batches > 0) {
    std::vector<double> extra;
    for (double g : s.boundary_gaps) extra.push_back(g - per_kernel_s);
    const double per_boundary = median(extra);
    const double boundaries_per_mb = d(s.segments) / d(s.micro_batches);
    const double v = round_to(std::clamp(per_boundary * boundaries_per_mb, 0.0, 1e6 * kUs), 1e-3 * kUs);
    const Spread sp = spread_of(extra);
    const std::string how = fmt::format(
        "median extra gap at {} micro-batch boundaries (boundary gap - per-kernel gap) x {:.2f} boundaries "
        "per "
        "micro-batch ({} segments, {} micro-batches)",
        sp.n, boundaries_per_mb, s.segments, s.micro_batches);
    fit.params.push_back({"host.us_per_micro_batch", true, v / kUs, sp.n, sp.lo * boundaries_per_mb / kUs,
                          sp.hi * boundaries_per_mb / kUs, how});
    st.host_s_per_micro_batch = {v, fmt::format("[FITTED] {} in {}", how, from), Basis::kMeasured};
  } else {
    keep("host.us_per_micro_batch", st.host_s_per_micro_batch.value / kUs, st.host_s_per_micro_batch.source,
         "no micro-batch boundary on the compute stream without a communication wait (Kineto: annotate "
         "micro-batches, e.g. forward_step/backward_step ranges)");
  }

  // Grouped-GEMM efficiency: medians in half-octave bins of rows per expert.
  // The grouped-GEMM model the efficiencies are fitted against (see neutral_stack).
  bool moerun_only = true;
  for (const auto& t : traces) moerun_only = moerun_only && t.dialect == TraceDialect::kMoerun;
  const std::string grouped_model =
      !moerun_only || o.base.grouped_gemm.impl.value == GroupedGemmImpl::kGroupedKernel
          ? std::string(
                "one grouped kernel: the per-expert shape, rows padded to the tile, waves over all experts")
          : fmt::format("one GEMM per expert of its own shape on {} stream(s), as the base stack runs them",
                        o.base.grouped_gemm.streams.value);
  if (!s.grouped.empty()) {
    std::map<int64_t, std::vector<std::pair<double, double>>> bins;
    for (const auto& p : s.grouped) bins[std::lround(2.0 * std::log2(std::max(1.0, p.first)))].push_back(p);
    for (const auto& [bin, pts] : bins) {
      std::vector<double> rows, eff;
      for (const auto& p : pts) {
        rows.push_back(p.first);
        eff.push_back(p.second);
      }
      CurvePoint c{std::round(median(rows)), round_to(std::clamp(median(eff), 1e-4, 1.0), 1e-4),
                   static_cast<int64_t>(pts.size()), percentile(eff, 0.1), percentile(eff, 0.9)};
      if (!fit.curve.empty() && c.rows_per_expert <= fit.curve.back().rows_per_expert) continue;
      if (median(eff) > 1.0)
        fit.notes.push_back(
            fmt::format("grouped GEMM at {:.0f} rows per expert ran faster than the hardware profile's "
                        "dense GEMM (efficiency {:.3f}); capped at 1",
                        c.rows_per_expert, median(eff)));
      fit.curve.push_back(c);
    }
    std::vector<double> all;
    for (const auto& p : s.grouped) all.push_back(p.second);
    const Spread sp = spread_of(all);
    const double v = round_to(std::clamp(median(all), 1e-4, 1.0), 1e-4);
    const std::string how = fmt::format(
        "per kernel: the cost model's time at the hardware profile's dense rate ({}; neutral stack) / "
        "measured kernel time; median of {} forward and dgrad kernels, {:.0f} to {:.0f} rows per expert (the "
        "report's curve shows the ratio by rows)",
        grouped_model, sp.n, fit.curve.front().rows_per_expert, fit.curve.back().rows_per_expert);
    fit.params.push_back({"grouped_gemm.efficiency", true, v, sp.n, sp.lo, sp.hi, how});
    st.grouped_gemm.efficiency = {v, fmt::format("[FITTED] {} in {}", how, from), Basis::kMeasured};
  } else {
    keep("grouped_gemm.efficiency", st.grouped_gemm.efficiency.value, st.grouped_gemm.efficiency.source,
         fmt::format("no grouped GEMM kernel with a known shape ({} without)", s.grouped_without_shape));
  }
  if (!s.grouped_wgrad.empty()) {
    const Spread sp = spread_of(s.grouped_wgrad);
    const double v = round_to(std::clamp(median(s.grouped_wgrad), 1e-4, 1.0), 1e-4);
    const std::string how = fmt::format(
        "median over {} weight-gradient grouped GEMM kernels of the model time ({}; the reduction over the "
        "rows per expert) / measured time",
        sp.n, grouped_model);
    fit.params.push_back({"grouped_gemm.wgrad_efficiency", true, v, sp.n, sp.lo, sp.hi, how});
    st.grouped_gemm.wgrad_efficiency = {v, fmt::format("[FITTED] {} in {}", how, from), Basis::kMeasured};
  } else {
    keep("grouped_gemm.wgrad_efficiency", st.grouped_gemm.wgrad_efficiency.value,
         st.grouped_gemm.wgrad_efficiency.source, "no weight-gradient grouped GEMM told apart in the traces");
  }

  // Memory-bound efficiency: total bytes / total time of permute, norm and cast kernels / achieved HBM.
  if (!s.mem_eff.empty()) {
    const double raw = s.mem_bytes / s.mem_seconds / hw.gpu.hbm_bw_achieved_bytes_per_s.value;
    if (raw > 1.0)
      fit.notes.push_back(fmt::format(
          "memory-bound kernels beat the profile's achieved HBM bandwidth ({:.3f}); capped at 1", raw));
    const double v = round_to(std::clamp(raw, 1e-4, 1.0), 1e-4);
    const Spread sp = spread_of(s.mem_eff);
    const std::string how = fmt::format(
        "Σ bytes / Σ time beyond the fixed kernel time of {} permute, norm and cast kernels of at least "
        "{:.0f} "
        "KiB, over the hardware "
        "profile's "
        "achieved HBM bandwidth {:.0f} GB/s",
        sp.n, o.min_memory_bound_bytes / 1024.0, hw.gpu.hbm_bw_achieved_bytes_per_s.value / kGB);
    fit.params.push_back({"memory_bound_efficiency", true, v, sp.n, sp.lo, sp.hi, how});
    st.memory_bound_efficiency = {
        v, fmt::format("[FITTED] {} in {}; per kernel p10-p90 {:.3f}-{:.3f}", how, from, sp.lo, sp.hi),
        Basis::kMeasured};
  } else {
    keep("memory_bound_efficiency", st.memory_bound_efficiency.value, st.memory_bound_efficiency.source,
         fmt::format("no permute, norm or cast kernel with known bytes ({} without)", s.mem_without_bytes));
  }

  keep("dispatcher.nic_efficiency", st.dispatcher.nic_efficiency.value, st.dispatcher.nic_efficiency.source,
       "kernel times do not show the bytes per destination");

  // SMs of communication kernels: grid blocks (one CTA per NCCL channel, each on its own SM) / SMs.
  if (!s.comm_sm.empty()) {
    const double v = round_to(std::clamp(median(s.comm_sm), 0.0, 0.99), 1e-4);
    const Spread sp = spread_of(s.comm_sm);
    const std::string how = fmt::format(
        "median over {} communication kernels that overlapped compute of grid blocks / {} SMs (one CTA per "
        "SM)",
        sp.n, hw.gpu.sm_count.value);
    fit.params.push_back({"comm_sm_fraction", true, v, sp.n, sp.lo, sp.hi, how});
    st.comm_sm_fraction = {v, fmt::format("[FITTED] {} in {}", how, from), Basis::kMeasured};
  } else {
    keep("comm_sm_fraction", st.comm_sm_fraction.value, st.comm_sm_fraction.source,
         "no overlapping communication kernel with a grid in the traces");
  }

  // Overlap achieved: share of communication time that ran while any compute kernel ran on the same GPU.
  if (s.comm_s > 0) fit.comm_overlap_fraction = s.comm_overlap_s / s.comm_s;
  if (s.ep_comm_s > 0) fit.comm_overlap_fraction_ep = s.ep_overlap_s / s.ep_comm_s;
  const double frac =
      fit.comm_overlap_fraction_ep >= 0 ? fit.comm_overlap_fraction_ep : fit.comm_overlap_fraction;
  if (frac >= 0) {
    const bool on = frac >= kInterOpOverlapThreshold;
    const std::string how = fmt::format(
        "{:.3f} of {} communication time ran concurrently with compute kernels (all communication: {:.3f}); "
        "true at "
        "or above {:.2f}",
        frac, fit.comm_overlap_fraction_ep >= 0 ? "EP/TP-type (all-to-all, send/recv)" : "all",
        fit.comm_overlap_fraction, kInterOpOverlapThreshold);
    fit.params.push_back({"overlaps.inter_op", true, on ? 1.0 : 0.0, 1, frac, frac, how});
    st.overlaps.inter_op = {on, fmt::format("[FITTED] {} in {}", how, from), Basis::kMeasured};
  } else {
    keep("overlaps.inter_op", st.overlaps.inter_op.value ? 1 : 0, st.overlaps.inter_op.source,
         "no communication kernel in the traces");
  }
  keep("overlaps.intra_op", st.overlaps.intra_op.value ? 1 : 0, st.overlaps.intra_op.source,
       "fused GEMM+communication kernels are not told apart in kernel traces");
  keep("overlaps.dp_comm", st.overlaps.dp_comm.value ? 1 : 0, st.overlaps.dp_comm.source,
       "the reported overlap does not separate DP collectives from TP collectives");
  keep("overlaps.pp_comm", st.overlaps.pp_comm.value ? 1 : 0, st.overlaps.pp_comm.source,
       "pipeline send/recv is not separated from EP send/recv in kernel traces");

  if (s.grouped_without_shape > 0)
    fit.notes.push_back(
        fmt::format("{} grouped GEMM kernels without a shape were not fitted", s.grouped_without_shape));
  if (s.mem_without_bytes > 0)
    fit.notes.push_back(
        fmt::format("{} permute/norm/cast kernels without byte counts were not fitted", s.mem_without_bytes));
  fit.notes.push_back(
      fmt::format("{} gaps excluded: a communication kernel ended inside (a dependency wait), or the "
                  "gap left a micro-batch or profiler step",
                  s.excluded_gaps));

  // Sources: the base's citations that the kept sources still name, and the traces themselves.
  const std::vector<const std::string*> all_sources = st.number_sources();
  std::map<std::string, std::string> used;
  for (const auto& [id, citation] : o.base.sources) {
    const std::regex word("(^|[^A-Za-z0-9])" + id + "([^A-Za-z0-9]|$)");
    for (const auto* src : all_sources) {
      if (std::regex_search(*src, word)) {
        used[id] = citation;
        break;
      }
    }
  }
  std::string listing;
  for (const auto& t : fit.traces) listing += (listing.empty() ? "" : "; ") + t;
  used["TRACES"] = fmt::format("per-op traces fitted by moeplan calibrate: {}", listing);
  st.sources = used;
  return fit;
}

std::string stack_json(const StackFit& fit) {
  return io::stack_to_json(fit.stack).dump(2) + "\n";
}

nlohmann::json fit_report_json(const StackFit& fit) {
  nlohmann::json j;
  j["traces"] = fit.traces;
  j["comm_overlap_fraction"] = fit.comm_overlap_fraction;
  j["comm_overlap_fraction_ep"] = fit.comm_overlap_fraction_ep;
  j["params"] = nlohmann::json::array();
  for (const auto& p : fit.params) {
    j["params"].push_back({{"key", p.key},
                           {"fitted", p.fitted},
                           {"value", p.value},
                           {"samples", p.samples},
                           {"p10", p.lo},
                           {"p90", p.hi},
                           {"how", p.how}});
  }
  j["curve"] = nlohmann::json::array();
  for (const auto& c : fit.curve) {
    j["curve"].push_back({{"rows_per_expert", c.rows_per_expert},
                          {"efficiency", c.efficiency},
                          {"samples", c.samples},
                          {"p10", c.lo},
                          {"p90", c.hi}});
  }
  j["notes"] = fit.notes;
  return j;
}

std::string fit_report_text(const StackFit& fit) {
  std::string out;
  for (const auto& t : fit.traces) out += fmt::format("trace  {}\n", t);
  out += fmt::format("{:<28} {:>10} {:>8} {:>21}  {}\n", "parameter", "value", "samples", "spread p10-p90",
                     "fitted / kept");
  for (const auto& p : fit.params) {
    out += fmt::format("{:<28} {:>10.4g} {:>8} {:>21}  {}: {}\n", p.key, p.value, p.samples,
                       p.fitted ? fmt::format("{:.4g}-{:.4g}", p.lo, p.hi) : "-",
                       p.fitted ? "fitted" : "kept", p.how);
  }
  for (const auto& c : fit.curve) {
    out += fmt::format(
        "  grouped GEMM {:>7.0f} rows/expert: efficiency {:.4f} ({} kernels, p10-p90 {:.4f}-{:.4f})\n",
        c.rows_per_expert, c.efficiency, c.samples, c.lo, c.hi);
  }
  for (const auto& n : fit.notes) out += fmt::format("note  {}\n", n);
  return out;
}

}  // namespace moeplan::calibrate
