// Sweep keys, their parsing and application to a model, hardware, job or fixed plan, and the rows of a sweep
// (see sweep.h).
#include "planner/sweep.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <utility>

#include <fmt/format.h>

#include "simulator/core/units.h"
#include "simulator/cost/collective.h"
#include "simulator/io/json_reader.h"
#include "simulator/io/plan_io.h"
#include "simulator/io/router_trace.h"

namespace moeplan::planner {
namespace {

enum class ValueKind { kInteger, kFactor };

struct KeyRule {
  ValueKind kind;
  int64_t max_integer;  // kInteger: values in [1, max_integer]
};

// The non-plan keys: how their values read.
std::optional<KeyRule> key_rule(const std::string& key) {
  if (key == "gpus") return KeyRule{ValueKind::kInteger, int64_t{1} << 20};
  if (key == "seq_len") return KeyRule{ValueKind::kInteger, int64_t{1} << 24};
  if (key == "global_batch") return KeyRule{ValueKind::kInteger, kMaxGlobalBatch};
  if (key == "top_k" || key == "experts") return KeyRule{ValueKind::kInteger, int64_t{1} << 16};
  if (key == "nics_per_node") return KeyRule{ValueKind::kInteger, 1024};
  if (key == "nvlink_bw" || key == "nic_bw") return KeyRule{ValueKind::kFactor, 0};
  return std::nullopt;
}

// Keys whose values change the hardware profile.
bool hardware_key(const std::string& key) {
  return key == "nvlink_bw" || key == "nic_bw" || key == "nics_per_node";
}

// Plan-file keys that name inputs rather than choices: swept by running the command once per input.
bool excluded_plan_key(const std::string& key) {
  return key == "model" || key == "hardware" || key == "stack";
}

std::string mark(const std::string& source, const std::string& what) {
  return source + " [" + what + " by moeplan sweep]";
}

// Divides the bandwidth part of each measured point's time by `factor` and keeps the curve's fitted latency
// (a faster link does not shorten the per-hop latency):
//   t = bytes * f / busbw,   t' = t - max(t - alpha, 0) * (1 - 1 / factor),   busbw' = bytes * f / t'
// with f the nccl-tests bus-bandwidth factor. A single-point curve has no fitted latency (the cost model adds
// NCCL's per-step constant), so its bandwidth scales as is.
void scale_curve(CollectiveCurve& c, double factor, const std::string& what) {
  const double f = cost::busbw_factor(c.collective, c.ranks);
  const double alpha =
      c.points.size() >= 2 ? cost::fit_alpha_beta(c.collective, c.ranks, c.points).alpha_s : 0.0;
  for (auto& [bytes, busbw] : c.points) {
    if (f <= 0 || alpha <= 0) {
      busbw *= factor;
      continue;
    }
    const double t = bytes * f / busbw;
    const double scaled = t - std::max(t - alpha, 0.0) * (1.0 - 1.0 / factor);
    busbw = bytes * f / scaled;
  }
  c.source = mark(c.source, what);
}

void scale_scope(HardwareProfile& hw, Scope scope, double factor, const std::string& what) {
  for (CollectiveCurve& c : hw.calibration.collectives) {
    if (c.scope == scope) scale_curve(c, factor, what);
  }
  for (CollectivePlateau& p : hw.calibration.plateaus) {
    if (p.scope != scope) continue;
    p.busbw_bytes_per_s *= factor;
    p.source = mark(p.source, what);
  }
}

std::string reasons_of(const std::vector<Violation>& vs) {
  std::string out;
  for (const Violation& v : vs) out += (out.empty() ? "" : "; ") + v.reason;
  return out;
}

// Why a search returned no plan: no plan matches the pins, or the most common rejection reasons.
std::string no_plan_reason(const SearchResult& r, const SearchSpace& space) {
  if (r.enumerated == 0) {
    std::string pins;
    for (const auto& [key, value] : space.fixed) {
      pins += (pins.empty() ? "" : ", ") + key + "=" + vary_value_text(value);
    }
    return pins.empty() ? "no plan in the search space" : "no plan in the search space has " + pins;
  }
  std::vector<std::pair<int64_t, std::string>> why;
  for (const auto& [reason, n] : r.rejected) why.emplace_back(n, reason);
  std::sort(why.begin(), why.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::string out = r.legal == 0 ? "no legal plan" : "no plan fits";
  for (size_t i = 0; i < why.size() && i < 3; ++i) {
    out += fmt::format("{} {} x{}", i == 0 ? " (rejected:" : ",", why[i].second, why[i].first);
  }
  return out + (why.empty() ? "" : ")");
}

Prediction without_trace(Prediction p) {
  release_simulated_run(p);
  return p;
}

}  // namespace

const std::vector<SweepKey>& sweep_keys() {
  static const std::vector<SweepKey> keys = {
      {"gpus", "GPUs of the job (with --plan: the plan's gpus)"},
      {"seq_len", "sequence length, tokens (with --plan: the plan's seq_len)"},
      {"global_batch", "global batch, sequences (with --plan: the plan's global_batch)"},
      {"top_k", "model: routed experts per token"},
      {"experts", "model: routed experts per MoE layer, each expert keeping its size"},
      {"nvlink_bw", "factor on NVLink bandwidth: line rate, achieved, intra-node curves and plateaus"},
      {"nic_bw", "factor on per-NIC bandwidth: line rate, achieved, inter-node curves and plateaus"},
      {"nics_per_node", "NICs per node; inter-node curves and plateaus scale with the count"},
  };
  return keys;
}

std::vector<std::string> vary_keys() {
  std::vector<std::string> out;
  for (const SweepKey& k : sweep_keys()) out.emplace_back(k.name);
  for (const std::string& k : plan_keys()) {
    if (!excluded_plan_key(k) && std::find(out.begin(), out.end(), k) == out.end()) out.push_back(k);
  }
  return out;
}

std::string vary_value_text(const nlohmann::json& value) {
  return value.is_string() ? value.get<std::string>() : value.dump();
}

Result<Vary> parse_vary(const std::string& arg, bool fixed_plan) {
  const size_t eq = arg.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == arg.size()) {
    return Error{fmt::format("--vary {}: expected KEY=V1,V2,...", arg)};
  }
  Vary v;
  v.key = arg.substr(0, eq);
  const std::vector<std::string> keys = vary_keys();
  if (std::find(keys.begin(), keys.end(), v.key) == keys.end()) {
    const std::string guess = io::closest_match(v.key, keys);
    return Error{fmt::format("--vary {}: unknown key '{}'{} (see moeplan sweep --help)", arg, v.key,
                             guess.empty() ? "" : fmt::format(" (did you mean '{}'?)", guess))};
  }
  if (v.key == "routing.capacity_factor" && !fixed_plan) {
    return Error{fmt::format("--vary {}: routing.capacity_factor needs a fixed plan (--plan FILE)", arg)};
  }
  const std::optional<KeyRule> rule = key_rule(v.key);
  const std::string list = arg.substr(eq + 1);
  size_t start = 0;
  while (start <= list.size()) {
    const size_t comma = std::min(list.find(',', start), list.size());
    const std::string text = list.substr(start, comma - start);
    start = comma + 1;
    if (text.empty()) return Error{fmt::format("--vary {}: an empty value", arg)};
    if (rule && rule->kind == ValueKind::kInteger) {
      int64_t n = 0;
      const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
      if (v.key == "global_batch" && ec == std::errc() && end == text.data() + text.size() &&
          n > kMaxGlobalBatch) {
        return Error{fmt::format("--vary {}: '{}': {}", arg, text, kGlobalBatchTooLarge)};
      }
      if (ec != std::errc() || end != text.data() + text.size() || n < 1 || n > rule->max_integer) {
        return Error{
            fmt::format("--vary {}: '{}' is not an integer in [1, {}]", arg, text, rule->max_integer)};
      }
      v.values.emplace_back(n);
    } else if (rule) {
      double x = 0;
      const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), x);
      if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(x) || x <= 0 || x > 1e3) {
        return Error{fmt::format("--vary {}: '{}' is not a factor in (0, 1000] (e.g. 0.5, 1, 2)", arg, text)};
      }
      v.values.emplace_back(x);
    } else {
      Result<nlohmann::json> value = plan_key_value(v.key, text, "--vary " + arg);
      if (!value) return value.error();
      v.values.push_back(std::move(value).value());
    }
  }
  return v;
}

HardwareProfile scale_nvlink_bandwidth(const HardwareProfile& hw, double factor) {
  HardwareProfile out = hw;
  const std::string what = fmt::format("NVLink bandwidth x{}", factor);
  for (Sourced<double>* f : {&out.node.nvlink_bw_uni_bytes_per_s, &out.node.nvlink_bw_achieved_bytes_per_s}) {
    f->value *= factor;
    f->source = mark(f->source, what);
  }
  scale_scope(out, Scope::kIntraNode, factor, what);
  return out;
}

HardwareProfile scale_nic_bandwidth(const HardwareProfile& hw, double factor) {
  HardwareProfile out = hw;
  const std::string what = fmt::format("NIC bandwidth x{}", factor);
  for (Sourced<double>* f : {&out.scale_out.nic_bw_bytes_per_s, &out.scale_out.nic_bw_achieved_bytes_per_s}) {
    f->value *= factor;
    f->source = mark(f->source, what);
  }
  scale_scope(out, Scope::kInterNode, factor, what);
  return out;
}

HardwareProfile with_nics_per_node(const HardwareProfile& hw, int64_t nics) {
  MOEPLAN_ASSERT(nics >= 1);
  HardwareProfile out = hw;
  const int64_t old = std::max<int64_t>(1, hw.scale_out.nics_per_node.value);
  const std::string what = fmt::format("{} NICs per node instead of {}", nics, old);
  out.scale_out.nics_per_node.value = nics;
  out.scale_out.nics_per_node.source = mark(out.scale_out.nics_per_node.source, what);
  if (nics != old) {
    scale_scope(out, Scope::kInterNode, static_cast<double>(nics) / static_cast<double>(old), what);
  }
  return out;
}

Result<SweepCase> apply_vary(const SweepCase& base, const std::string& key, const nlohmann::json& value) {
  SweepCase c = base;
  if (key == "gpus" || key == "seq_len" || key == "global_batch") {
    const auto n = value.get<int64_t>();
    if (c.plan) {
      (key == "gpus" ? c.plan->gpus : key == "seq_len" ? c.plan->seq_len : c.plan->global_batch) = n;
    } else {
      (key == "gpus" ? c.job.gpus : key == "seq_len" ? c.job.seq_len : c.job.global_batch) = n;
    }
  } else if (key == "top_k" || key == "experts") {
    const auto n = value.get<int64_t>();
    MoeSpec& moe = c.model.moe;
    if (!c.model.is_moe()) return Error{fmt::format("{} has no routed experts", c.model.name)};
    if (key == "top_k" && n > moe.num_experts) {
      return Error{fmt::format("top_k {} exceeds the {} routed experts", n, moe.num_experts)};
    }
    if (key == "experts" && n < moe.top_k) {
      return Error{fmt::format("{} routed experts are fewer than top_k {}", n, moe.top_k)};
    }
    (key == "top_k" ? moe.top_k : moe.num_experts) = n;
  } else if (key == "nvlink_bw") {  // hardware_key()
    c.hw = scale_nvlink_bandwidth(c.hw, value.get<double>());
  } else if (key == "nic_bw") {
    c.hw = scale_nic_bandwidth(c.hw, value.get<double>());
  } else if (key == "nics_per_node") {
    c.hw = with_nics_per_node(c.hw, value.get<int64_t>());
  } else if (c.plan) {
    nlohmann::json j = io::plan_to_json(*c.plan);
    set_plan_key(j, key, value);
    Result<Plan> p = io::plan_from_json(j, "--vary " + key);
    if (!p) return p.error();
    c.plan = std::move(p).value();
    if (key == "pipeline.pp" || key == "pipeline.vpp") {
      // The layer split and the schedule follow the new number of (virtual) stages: even when the layers
      // divide, else the search's uneven split; interleaved 1F1B exactly when there are virtual stages.
      Plan::Pipeline& pl = c.plan->pipeline;
      const int64_t chunks = pl.pp * pl.vpp, layers = c.model.num_layers();
      pl.layers_per_stage.clear();
      if (layers % chunks != 0 && chunks <= layers) pl.layers_per_stage = uneven_split(layers, chunks);
      if (pl.schedule != Schedule::kDualPipeV) {
        pl.schedule = pl.vpp > 1 ? Schedule::kInterleaved1F1B : Schedule::k1F1B;
      }
    }
  } else if (key == "routing.distribution") {
    c.routing = value.get<std::string>();
  } else {
    // Re-planning: the value pins the key, replacing a --fix of the same key.
    auto& fixed = c.space.fixed;
    fixed.erase(std::remove_if(fixed.begin(), fixed.end(), [&](const auto& kv) { return kv.first == key; }),
                fixed.end());
    fixed.emplace_back(key, value);
  }
  return c;
}

SweepRow sweep_row(const SweepCase& base, const std::string& key, const nlohmann::json& value,
                   const SweepOptions& options,
                   const std::shared_ptr<const cost::CostModel::HardwareFit>& fit) {
  SweepRow row;
  row.value = value;
  Result<SweepCase> applied = apply_vary(base, key, value);
  if (!applied) {
    row.reason = applied.error().message;
    return row;
  }
  const SweepCase& c = applied.value();
  const std::string& spec = c.plan ? c.plan->routing.distribution : c.routing;
  Result<workload::RoutingDistribution> routing =
      io::routing_distribution(spec, std::max<int64_t>(1, c.model.moe.num_experts), c.routing_base);
  if (!routing) {
    row.reason = routing.error().message;
    return row;
  }
  if (c.plan) {
    row.plan = *c.plan;
    // One plan per value, one after another: the search's threads run its periodic runs at once. A key that
    // leaves the hardware as it is prices on base.hw (c.hw is its copy), whose fit the rows may share.
    const bool same_hw = !hardware_key(key);
    row.prediction =
        without_trace(predict(c.model, *c.plan, same_hw ? base.hw : c.hw, c.stack, routing.value(),
                              {.threads = options.search.threads, .hardware_fit = same_hw ? fit : nullptr}));
    if (!row.prediction.violations.empty()) {
      row.reason = reasons_of(row.prediction.violations);
    } else if (!row.prediction.memory.fits()) {
      row.reason = fmt::format(
          "does not fit: {:.1f}-{:.1f} GiB per GPU of {:.1f} GiB", row.prediction.memory.total_low() / kGiB,
          row.prediction.memory.total_high() / kGiB, row.prediction.memory.capacity / kGiB);
    }
    return row;
  }
  SearchOptions so = options.search;
  so.top = 1;
  so.prefer_memory_margin = true;  // the plan `plan` ranks #1
  SearchResult r = search(c.model, c.hw, c.stack, routing.value(), c.job, c.space, so);
  if (r.plans.empty()) {
    row.reason = no_plan_reason(r, c.space);
    return row;
  }
  row.plan = std::move(r.plans.front().plan);
  row.plan->routing.distribution = spec;
  row.prediction = without_trace(std::move(r.plans.front().prediction));
  return row;
}

std::vector<SweepRow> sweep(const SweepCase& base, const Vary& vary, const SweepOptions& options) {
  // A fixed plan's rows on unchanged hardware share one fit of it (the search fits once per value itself).
  const auto fit = base.plan && !hardware_key(vary.key) ? cost::CostModel::fit_hardware(base.hw) : nullptr;
  std::vector<SweepRow> rows;
  for (const nlohmann::json& value : vary.values) {
    rows.push_back(sweep_row(base, vary.key, value, options, fit));
    if (options.progress) options.progress(rows.size(), vary.values.size());
  }
  return rows;
}

GpuScaling gpu_scaling(const std::vector<SweepRow>& rows, double threshold) {
  GpuScaling g;
  g.threshold = threshold;
  g.efficiency.resize(rows.size());
  std::optional<double> base;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (!rows[i].has_numbers() || rows[i].prediction.tokens_per_s_per_gpu <= 0) continue;
    if (!base) base = rows[i].prediction.tokens_per_s_per_gpu;
    const double e = rows[i].prediction.tokens_per_s_per_gpu / *base;
    g.efficiency[i] = e;
    if (g.knee_in_range) continue;
    if (e >= threshold) {
      g.knee = i;
    } else {
      g.knee_in_range = g.knee.has_value();
    }
  }
  return g;
}

}  // namespace moeplan::planner
