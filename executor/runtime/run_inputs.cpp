// Loads and lowers a plan for execution (see run_inputs.h) with stack_lowering, as predict() does, so the
// measured graph is the predicted graph, op for op and shape for shape.
#include "executor/runtime/run_inputs.h"

#include <algorithm>
#include <filesystem>

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
  // The stack decides which overlaps and dispatcher steps the graph has, as it does for the prediction.
  Result<StackProfile> stack = io::load_stack(plan.stack.empty() ? "moerun" : plan.stack, dir);
  if (!stack) return stack.error();
  Result<workload::RoutingDistribution> routing =
      io::routing_distribution(plan.routing.distribution, std::max<int64_t>(1, model.moe.num_experts), dir);
  if (!routing) return routing.error();
  in.routing = routing.value();

  in.violations = validate(plan, model, in.loaded.hardware);
  if (!in.violations.empty()) return in;
  const StackLowering sl = stack_lowering(model, plan, in.loaded.hardware, stack.value(), routing.value());
  in.lowering = sl.options;
  in.graph = lower(model, sl.run, sl.options);
  return in;
}

}  // namespace moeplan::executor
