// How far a prediction rests on numbers nobody measured. Every stack number that states where it may lie
// (Stated::range: every assumed one, some derived ones), and every hardware number that does (the GPU's
// sustained tensor-core rates), is set to each end of its range alone and the step predicted again; then all
// of them together at the ends that shortened the step alone, and at the ends that lengthened it. The result
// is the step time over those assumptions, and the numbers it hangs on, largest swing first: what to measure
// before trusting the prediction.
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
  std::string path;  // as the stack (or hardware) file names it, e.g. "host.issue_us_per_kernel"
  Basis basis = Basis::kAssumed;
  double unit = 1.0;                         // the file's unit in SI (1e-6 for "_us" numbers)
  double value = 0, low = 0, high = 0;       // SI
  double step_at_low = 0, step_at_high = 0;  // seconds: the step with this number alone at that end
  double swing(double step) const;           // the larger of the two ends' distances from `step`
};

// Reports list at most this many numbers, largest swing first, and leave out those whose swing is below this
// share of the step.
constexpr int kAssumptionsListed = 4;
constexpr double kNegligibleSwing = 1e-3;

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

// Whether a ranking of plans of one job (same tokens per step) rests on the stack's unmeasured numbers: every
// plan predicted again with each ranged number alone at either end of its range, and where another plan's
// step is then shorter than the first's, that overtaking. A plan whose step is already shorter than the
// first's with the stack as given was ranked after it for another reason (the planner puts plans that do not
// fit, or whose memory range does not wholly fit, after tied ones that fit) and is not counted.
struct RankOvertake {
  std::string path;           // the number, as the stack file names it
  double at = 0, unit = 1.0;  // the end it was set to (SI) and the file's unit in SI
  size_t plan = 0;            // index into the plans: the fastest there
  double faster = 0;          // its step is this fraction shorter than the first plan's there
};
struct AssumptionRanking {
  int64_t ends = 0;                     // number ends tried
  int64_t predictions = 0;              // steps predicted (an end of a number a plan does not price: none)
  std::vector<RankOvertake> overtakes;  // one per end where the first plan is not the fastest
  std::vector<size_t> faster_as_given;  // indices of the plans not counted: already faster as given
};
// `steps[i]` is plans[i]'s predicted step with the stack as given; plans[0] is the ranking's first.
AssumptionRanking ranking_over_assumptions(const ModelSpec& model, const std::vector<Plan>& plans,
                                           const std::vector<double>& steps, const HardwareProfile& hw,
                                           const StackProfile& stack,
                                           const workload::RoutingDistribution& routing, int threads = 1);

}  // namespace moeplan
