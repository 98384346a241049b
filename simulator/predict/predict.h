// predict(): one plan through the whole simulator, the way `moeplan simulate` and the planner run it:
// validate -> routing load -> lower -> cost every op -> event simulation -> memory, breakdown and
// uncertainty.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "simulator/core/hardware.h"
#include "simulator/core/model_spec.h"
#include "simulator/core/op_graph.h"
#include "simulator/core/plan.h"
#include "simulator/core/stack.h"
#include "simulator/cost/cost_model.h"
#include "simulator/cost/memory.h"
#include "simulator/engine/engine.h"
#include "simulator/workload/routing.h"

namespace moeplan {

// Seconds of one stage's step by what the rank was doing: compute by op kind, communication not hidden behind
// compute by group, idle (pipeline bubble and waits), and the optimizer. The parts sum to the step time.
struct StepBreakdown {
  std::map<std::string, double> compute;       // gemm, grouped_gemm, attention, memory_bound, fused_gemm_comm
  std::map<std::string, double> exposed_comm;  // tp, sp, cp, ep, etp, dp_attn, dp_expert, pp
  double bubble = 0;
  double optimizer = 0;
  double total() const;
};

// Where the predicted step time comes from: the share of the critical path priced by stack numbers of each
// basis (an op counts under the weakest basis among the numbers that priced it). `hypothetical` when any of
// it rests on a capability the stack has not built or measured yet (basis "target").
// Where the prediction's numbers come from: the critical path's time split by the basis of the stack numbers
// that priced each op, and what makes it hypothetical (a target on the critical path, or an overlap the plan
// uses that the stack has only as a target).
struct Provenance {
  double measured = 0, derived = 0, assumed = 0, target = 0;  // fractions of the critical path's time
  bool hypothetical = false;
  std::vector<std::string> targets;  // why it is hypothetical, one line each
};

struct Prediction {
  std::vector<Violation> violations;  // non-empty: the plan is illegal and nothing else is filled
  std::vector<std::string> notices;   // what the stack changed: overlaps asked for and not achieved
  Plan effective_plan;                // the plan as the stack runs it (overlaps it lacks switched off)
  Provenance provenance;
  double step_time_s = 0;
  double tokens_per_step = 0;
  double tokens_per_s = 0;
  double tokens_per_s_per_gpu = 0;
  double tokens_per_s_low = 0, tokens_per_s_high = 0;
  double model_flops_per_step =
      0;                // training FLOPs the model needs (no recompute): flops_per_token_train * tokens
  double mfu = 0;       // model FLOPs / (step time * GPUs * dense peak of `mfu_peak_dtype`)
  double mfu_bf16 = 0;  // model FLOPs / (step time * GPUs * dense BF16 peak)
  std::string mfu_peak_dtype = "bf16";  // the plan's compute precision ("fp8" for FP8 plans)
  cost::MemoryBreakdown memory;
  workload::RoutingLoad routing;
  StepBreakdown breakdown;  // of the busiest stage (most compute time), which sets the pace
  int64_t critical_stage = 0;
  std::vector<std::string> extrapolations;
  OpGraph graph;
  std::vector<cost::OpCost> costs;
  engine::Timeline timeline;
  std::vector<int32_t> critical_path;
};

// Keeps the memory of one prediction for the next: glibc would otherwise map each large op graph, cost and
// timeline array afresh and return it on free, and a 100k-op step then spends a third of its time in page
// faults. Programs that predict many steps (plan, sweep, the benchmarks) call it once at start; a no-op
// outside glibc.
void retain_freed_memory();

struct PredictOptions {
  bool critical_path = true;  // the report's critical path and uncertainty range
};

// The memory part of a prediction alone (no op graph, no simulation): the plan as the stack runs it, its
// in-flight micro-batches under its schedule and its routing's expert load, as predict() and the search's
// fit test count them. The plan must be legal.
cost::MemoryBreakdown predict_memory(const ModelSpec& model, const Plan& plan, const HardwareProfile& hw,
                                     const StackProfile& stack, const workload::RoutingDistribution& routing);

Prediction predict(const ModelSpec& model, const Plan& plan, const HardwareProfile& hw,
                   const StackProfile& stack, const workload::RoutingDistribution& routing,
                   const PredictOptions& options = {});

StepBreakdown stage_breakdown(const OpGraph& graph, const std::vector<cost::OpCost>& costs,
                              const engine::Timeline& timeline, int64_t stage);
StepBreakdown stage_breakdown(const OpGraph& graph, const std::vector<cost::OpCost>& costs,
                              const engine::Timeline& timeline, const std::vector<int32_t>& stage_ops);

}  // namespace moeplan
