// How far a prediction rests on numbers nobody measured. Every stack number that states where it may lie
// (Stated::range: every assumed one, some derived ones) is set to each end of its range alone and the step
// predicted again; then all of them together at the ends that shortened the step alone, and at the ends that
// lengthened it. The result is the step time over the stack's assumptions, and the numbers it hangs on,
// largest swing first: what to measure before trusting the prediction.
#pragma once

#include <string>
#include <vector>

#include "simulator/core/hardware.h"
#include "simulator/core/model_spec.h"
#include "simulator/core/plan.h"
#include "simulator/core/stack.h"
#include "simulator/workload/routing.h"

namespace moeplan {

struct AssumptionEffect {
  std::string path;  // as the stack file names it, e.g. "host.issue_us_per_kernel"
  Basis basis = Basis::kAssumed;
  double unit = 1.0;                         // the file's unit in SI (1e-6 for "_us" numbers)
  double value = 0, low = 0, high = 0;       // SI
  double step_at_low = 0, step_at_high = 0;  // seconds: the step with this number alone at that end
  double swing(double step) const;           // the larger of the two ends' distances from `step`
};

struct AssumptionRange {
  double step_time_s = 0;  // the prediction's, every number at its value
  // Every ranged number at the end that made the step shorter alone (longer alone); numbers that did not
  // move it stay at their values.
  double fastest_s = 0, slowest_s = 0;
  std::vector<AssumptionEffect> effects;  // every ranged number, largest swing first
  int64_t predictions = 0;                // steps predicted beyond the first
};

// `step_time_s` is the plan's predicted step with the stack as given (predict() with the same model, plan,
// hardware, stack and routing); the variations run on up to `threads` threads. The plan must be legal.
AssumptionRange assumption_range(const ModelSpec& model, const Plan& plan, const HardwareProfile& hw,
                                 const StackProfile& stack, const workload::RoutingDistribution& routing,
                                 double step_time_s, int threads = 1);

}  // namespace moeplan
