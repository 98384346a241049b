// Loads and lowers a plan for execution (see run_inputs.h). The lowering options mirror predict() so that the
// measured graph is the predicted graph, op for op and shape for shape.
#include "executor/runtime/run_inputs.h"

#include <algorithm>
#include <filesystem>

#include "simulator/cost/imbalance.h"
#include "simulator/io/router_trace.h"
#include "simulator/io/stack_loader.h"
#include "simulator/workload/lower.h"

namespace moeplan::executor {

Result<RunInputs> load_run_inputs(const std::string& plan_path) {
  Result<io::LoadedPlan> loaded = io::load_plan(plan_path);
  if (!loaded) return loaded.error();
  RunInputs in;
  in.loaded = std::move(loaded).value();
  const Plan& plan = in.loaded.plan;
  const ModelSpec& model = in.loaded.model;
  const std::string dir = std::filesystem::path(in.loaded.path).parent_path().string();
  // The stack is not needed to execute, but a plan naming an unreadable stack is a bad plan here as well.
  Result<StackProfile> stack = io::load_stack(plan.stack.empty() ? "moerun" : plan.stack, dir);
  if (!stack) return stack.error();
  Result<cost::RoutingDistribution> routing =
      io::routing_distribution(plan.routing.distribution, std::max<int64_t>(1, model.moe.num_experts), dir);
  if (!routing) return routing.error();

  in.violations = validate(plan, model, in.loaded.hardware);
  if (!in.violations.empty()) return in;
  const cost::PlanRouting pr = cost::plan_routing(model, plan, routing.value());
  LoweringOptions lo;
  lo.gpus_per_node = in.loaded.hardware.node.gpus_per_node.value;
  lo.expert_load_scale = pr.scale;
  lo.dropped_fraction = pr.load.dropped_fraction;
  in.expert_load_scale = pr.scale;
  in.graph = lower(model, plan, lo);
  return in;
}

}  // namespace moeplan::executor
