// Shared pieces of the `moeplan` subcommands that read inputs (see cli_common.h).
#include "planner/cli/cli_common.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include <fmt/format.h>

#include "simulator/core/units.h"
#include "simulator/io/hardware_loader.h"
#include "simulator/io/json_reader.h"
#include "simulator/io/router_trace.h"
#include "simulator/io/stack_loader.h"

namespace moeplan::cli {

Result<PlanInputs> load_plan_inputs(const std::string& plan_path, const std::string& stack_override,
                                    const std::string& hardware_override) {
  Result<io::LoadedPlan> loaded = io::load_plan(plan_path);
  if (!loaded) return loaded.error();
  PlanInputs in;
  in.loaded = std::move(loaded).value();
  if (!hardware_override.empty()) {
    Result<HardwareProfile> hw = io::load_hardware(hardware_override);
    if (!hw) return hw.error();
    in.loaded.hardware = std::move(hw).value();
  }
  in.dir = std::filesystem::path(in.loaded.path).parent_path().string();
  const Plan& plan = in.loaded.plan;
  const std::string stack_ref =
      !stack_override.empty() ? stack_override : (plan.stack.empty() ? kDefaultStack : plan.stack);
  Result<StackProfile> stack = io::load_stack(stack_ref, stack_override.empty() ? in.dir : "");
  if (!stack) return stack.error();
  in.stack = std::move(stack).value();
  Result<workload::RoutingDistribution> routing = io::routing_distribution(
      plan.routing.distribution, std::max<int64_t>(1, in.loaded.model.moe.num_experts), in.dir);
  if (!routing) return routing.error();
  in.routing = std::move(routing).value();
  return in;
}

Result<planner::SearchSpace> search_space(const std::string& precision, const std::vector<std::string>& fix) {
  planner::SearchSpace space;
  if (precision == "bf16") space.precisions = {Precision::kBf16};
  if (precision == "fp8") space.precisions = {Precision::kFp8};
  const std::vector<std::string> keys = planner::plan_keys();
  for (const std::string& f : fix) {
    const size_t eq = f.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == f.size()) {
      return Error{fmt::format("--fix {}: expected KEY=VALUE (moeplan plan --list-keys)", f)};
    }
    const std::string key = f.substr(0, eq), text = f.substr(eq + 1);
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) {
      const std::string guess = io::closest_match(key, keys);
      return Error{fmt::format("--fix {}: unknown plan key '{}'{} (moeplan plan --list-keys)", f, key,
                               guess.empty() ? "" : fmt::format(" (did you mean '{}'?)", guess))};
    }
    if (key == "model" || key == "hardware" || key == "stack" || key == "gpus" || key == "seq_len" ||
        key == "global_batch") {
      return Error{fmt::format("--fix {}: '{}' is the job, not a plan choice: use --{}", f, key,
                               key == "seq_len"        ? "seq-len"
                               : key == "global_batch" ? "global-batch"
                                                       : key)};
    }
    Result<nlohmann::json> value = planner::plan_key_value(key, text, "--fix " + f);
    if (!value) return value.error();
    // A value outside the lists the search enumerates is honoured: the list becomes that value.
    const nlohmann::json& v = value.value();
    if (key == "micro_batch") space.micro_batches = {v.get<int64_t>()};
    if (key == "pipeline.vpp") space.vpps = {v.get<int64_t>()};
    if (key == "data.zero") space.zero_stages = {v.get<int64_t>()};
    if (key == "precision") {
      if (precision != "any" && v.get<std::string>() != precision) {
        return Error{fmt::format("--fix {}: contradicts --precision {}", f, precision)};
      }
      space.precisions = {v.get<std::string>() == "fp8" ? Precision::kFp8 : Precision::kBf16};
    }
    space.fixed.emplace_back(key, v);
  }
  return space;
}

int does_not_fit(const cost::MemoryBreakdown& memory) {
  std::fprintf(stderr, "moeplan: the plan does not fit: %.1f GiB per GPU (%.1f-%.1f) of %.1f GiB\n",
               memory.total() / kGiB, memory.total_low() / kGiB, memory.total_high() / kGiB,
               memory.capacity / kGiB);
  return kExitInfeasible;
}

Result<TraceSelection> trace_selection(const OpGraph& graph, int64_t micro_batches, const std::string& stages,
                                       std::string* note) {
  Result<TraceSelection> sel =
      parse_trace_selection(std::max<int64_t>(0, micro_batches), stages, graph.num_stages);
  if (!sel || micro_batches >= 0) return sel;
  const int64_t fit = trace_micro_batches_within(graph, sel.value().stages, kMaxTraceEvents);
  if (fit > 0) {
    sel.value().micro_batches = fit;
    const TraceSelection all{.micro_batches = 0, .stages = sel.value().stages};
    *note = fmt::format(
        "the trace shows micro-batches 0..{} ({} of the step's {} ops; Perfetto loads files up to about "
        "100 MB): --trace-micro-batches 0 writes all, --trace-stages LIST picks stages",
        fit - 1, trace_events(graph, sel.value()), trace_events(graph, all));
  }
  return sel;
}

// A number in its stack file's unit ("25 us", "0.7").
std::string in_file_unit(double si, double unit) {
  return unit == 1.0 ? fmt::format("{:g}", si) : fmt::format("{:g} us", si / unit);
}

void print_hypothetical(const std::vector<const Prediction*>& predictions, const std::string& stack) {
  // The critical path's share priced by targets differs from prediction to prediction: one line with its
  // range, first, as each prediction lists it.
  std::vector<std::string> targets;
  double low = 1, high = 0;
  bool any_share = false;
  for (const Prediction* p : predictions) {
    const double share = p->provenance.target;
    const std::string own = target_share_line(share, share);
    for (const std::string& t : p->provenance.targets) {
      if (t == own) {
        any_share = true;
        low = std::min(low, share);
        high = std::max(high, share);
      } else if (std::find(targets.begin(), targets.end(), t) == targets.end()) {
        targets.push_back(t);
      }
    }
  }
  if (any_share) targets.insert(targets.begin(), target_share_line(low, high));
  if (targets.empty()) return;
  fmt::print("\nHYPOTHETICAL: these predictions credit capabilities the {} stack has not measured:\n", stack);
  for (const std::string& t : targets) fmt::print("  - {}\n", t);
}

void print_assumptions(const AssumptionRange& a, double tokens_per_step, int64_t gpus) {
  const double g = static_cast<double>(gpus);
  if (a.effects.empty()) {
    fmt::print("assumed numbers: neither the stack nor the hardware profile states a range for any number\n");
    return;
  }
  fmt::print(
      "over the stack's and the hardware's unmeasured numbers (each at either end of its stated range): step "
      "{:.3f}-{:.3f} s, "
      "{:.0f}-{:.0f} tokens/s/GPU; the step moves most with:\n",
      a.fastest_s, a.slowest_s, tokens_per_step / a.slowest_s / g, tokens_per_step / a.fastest_s / g);
  int shown = 0;
  for (const AssumptionEffect& e : a.effects) {
    if (shown == kAssumptionsListed || e.swing(a.step_time_s) <= kNegligibleSwing * a.step_time_s) break;
    ++shown;
    auto pct = [&](double s) { return fmt::format("{:+.1f}%", 100 * (s / a.step_time_s - 1)); };
    fmt::print("  {} = {} ({}, range {} to {}): step {} / {} at the ends\n", e.path,
               in_file_unit(e.value, e.unit), name_of(e.basis), in_file_unit(e.low, e.unit),
               in_file_unit(e.high, e.unit), pct(e.step_at_low), pct(e.step_at_high));
  }
  if (shown == 0) fmt::print("  (none moves the step by 0.1% or more)\n");
}

}  // namespace moeplan::cli
