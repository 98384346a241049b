// `moeplan validate PLAN`: loads a plan with its model and hardware and lists every rule it breaks.
#include <fmt/format.h>

#include "planner/cli/cli_common.h"
#include "simulator/io/plan_io.h"

namespace moeplan::cli {

Runner add_validate(CLI::App& app) {
  struct Options {
    std::string plan;
    bool json = false;
  };
  auto o = std::make_shared<Options>();
  app.add_option("plan", o->plan, "Plan file (JSON)")->required();
  app.add_flag("--json", o->json, "Print one JSON object");
  return [o]() {
    Result<io::LoadedPlan> loaded = io::load_plan(o->plan);
    if (!loaded) return bad_input(loaded.error().message);
    const auto& [plan, model, hw, path] = loaded.value();
    const std::vector<Violation> violations = validate(plan, model, hw);
    if (o->json) {
      nlohmann::json v = nlohmann::json::array();
      for (const auto& x : violations) v.push_back({{"rule", x.rule}, {"reason", x.reason}});
      print_json({{"plan", path},
                  {"valid", violations.empty()},
                  {"violations", v},
                  {"dp", violations.empty() ? plan.dp() : 0},
                  {"expert_dp", violations.empty() ? plan.expert_dp() : 0},
                  {"micro_batches", violations.empty() ? plan.num_micro_batches() : 0}});
    } else if (violations.empty()) {
      fmt::print("{}: valid ({} on {} x {} GPUs; dp {}, expert dp {}, {} micro-batches)\n", path, model.name,
                 plan.gpus, hw.name, plan.dp(), plan.expert_dp(), plan.num_micro_batches());
    } else {
      fmt::print("{}: {} rule(s) broken:\n", path, violations.size());
      for (const auto& x : violations) fmt::print("  {}: {}\n", x.rule, x.reason);
    }
    return violations.empty() ? kExitOk : kExitInfeasible;
  };
}

}  // namespace moeplan::cli
