// What one moerun rank needs from a plan file: the plan with its model and hardware (the simulator's
// loaders), the rules it breaks (the simulator's validate) and the op graph, lowered exactly as `moeplan
// simulate` does (stack_lowering: the plan's stack, moerun when it names none).
#pragma once

#include <string>
#include <vector>

#include "simulator/core/op_graph.h"
#include "simulator/core/plan.h"
#include "simulator/io/plan_io.h"
#include "simulator/workload/lower.h"
#include "simulator/workload/routing.h"

namespace moeplan::executor {

struct RunInputs {
  io::LoadedPlan loaded;
  std::vector<Violation> violations;  // non-empty: the plan cannot run and `graph` is empty
  OpGraph graph;
  // The stack's lowering facts (stack_lowering), as predict() uses them; expert_load_scale is the busiest EP
  // rank's routed rows over the mean, from the simulator's routing model.
  LoweringOptions lowering;
  // The plan's routing distribution (routing.distribution), from which the replay draws each step's routing.
  workload::RoutingDistribution routing;
};

// Errors are one line "FILE: field: what was expected" (a bad plan, model, hardware, stack or router trace).
Result<RunInputs> load_run_inputs(const std::string& plan_path);

}  // namespace moeplan::executor
