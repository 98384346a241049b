// `moeplan validate PLAN`: loads a plan with its model, hardware and stack and lists every rule it breaks,
// every feature its stack cannot run, and whether it fits in memory.
#include <fmt/format.h>

#include "planner/cli/cli_common.h"
#include "simulator/io/plan_io.h"
#include "simulator/predict/predict.h"

namespace moeplan::cli {

Runner add_validate(CLI::App& app) {
  struct Options {
    std::string plan, stack, hardware;
    bool json = false;
  };
  auto o = std::make_shared<Options>();
  app.add_option("plan", o->plan, "Plan file (JSON)")->required();
  app.add_option("--stack", o->stack,
                 "Stack profile (default: the plan's, else " + std::string(kDefaultStack) + ")");
  app.add_option(
      "--hardware", o->hardware,
      "Hardware profile (overrides the plan's), e.g. one `moeplan calibrate` fitted on the cluster");
  app.add_flag("--json", o->json, "Print one JSON object");
  return [o]() {
    Result<PlanInputs> in = load_plan_inputs(o->plan, o->stack, o->hardware);
    if (!in) return bad_input(in.error().message);
    const auto& [plan, model, hw, path] = in.value().loaded;
    const StackProfile& stack = in.value().stack;
    const std::vector<Violation> violations = validate(plan, model, hw);
    const std::vector<Violation> unsupported = validate_for_stack(plan, stack);
    const bool legal = violations.empty();
    std::optional<cost::MemoryBreakdown> mem;
    if (legal) mem = predict_memory(model, plan, hw, stack, in.value().routing);
    const bool fits = mem && mem->fits();
    const bool ok = legal && unsupported.empty() && fits;
    if (o->json) {
      auto list = [](const std::vector<Violation>& vs) {
        nlohmann::json v = nlohmann::json::array();
        for (const auto& x : vs) v.push_back({{"rule", x.rule}, {"reason", x.reason}});
        return v;
      };
      nlohmann::json memory = nullptr;
      if (mem) {
        memory = {{"per_gpu_bytes", mem->total()},
                  {"per_gpu_bytes_range", {mem->total_low(), mem->total_high()}},
                  {"capacity_bytes", mem->capacity},
                  {"fits", mem->fits()},
                  {"tight", mem->tight()}};
      }
      print_json({{"plan", path},
                  {"hardware", hw.name},
                  {"stack", stack.name},
                  {"valid", ok},
                  {"violations", list(violations)},
                  {"stack_cannot_run", list(unsupported)},
                  {"memory", memory},
                  {"dp", legal ? plan.dp() : 0},
                  {"expert_dp", legal ? plan.expert_dp() : 0},
                  {"micro_batches", legal ? plan.num_micro_batches() : 0}});
      return ok ? kExitOk : kExitInfeasible;
    }
    if (!legal) {
      fmt::print("{}: {} rule(s) broken:\n", path, violations.size());
      for (const auto& x : violations) fmt::print("  {}: {}\n", x.rule, x.reason);
    }
    if (!unsupported.empty()) {
      fmt::print("{}: the {} stack cannot run {} feature(s) of this plan:\n", path, stack.name,
                 unsupported.size());
      for (const auto& x : unsupported) fmt::print("  {}: {}\n", x.rule, x.reason);
    }
    if (mem && !mem->fits()) {
      fmt::print("{}: does not fit in memory: {} per GPU ({} - {}) of {} (stage {})\n", path,
                 human_bytes(mem->total()), human_bytes(mem->total_low()), human_bytes(mem->total_high()),
                 human_bytes(mem->capacity), mem->stage);
    }
    if (ok) {
      fmt::print(
          "{}: valid ({} on {} x {} GPUs, {} stack; dp {}, expert dp {}, {} micro-batches; {} per GPU of "
          "{}{})\n",
          path, model.name, plan.gpus, hw.name, stack.name, plan.dp(), plan.expert_dp(),
          plan.num_micro_batches(), human_bytes(mem->total()), human_bytes(mem->capacity),
          mem->tight() ? ", tight" : "");
    }
    return ok ? kExitOk : kExitInfeasible;
  };
}

}  // namespace moeplan::cli
