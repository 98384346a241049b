// explain(): what each technique of a plan contributes, as MegaScale-MoE's cumulative ablation (Table 5): a
// baseline of TP attention and TP experts without overlap, compression or selective recompute, then the
// plan's own choices added one technique per row. The last row is the plan itself.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "simulator/core/hardware.h"
#include "simulator/core/model_spec.h"
#include "simulator/core/plan.h"
#include "simulator/core/stack.h"
#include "simulator/predict/predict.h"
#include "simulator/workload/routing.h"

namespace moeplan::planner {

struct ExplainRow {
  std::string
      technique;        // "baseline: TP attention + TP experts, no overlap", "+ inter-operator overlap", ...
  bool in_plan = true;  // false: the plan does not use this technique; plan and values equal the previous row
  std::string note;     // where the row's plan departs from the rule above (e.g. the ETP split used)
  Plan plan;            // the plan this row simulates
  // predict(plan) without its op graph, costs and timeline (dropped to keep the rows small). Empty violations
  // and a memory that fits mean the row ran.
  Prediction prediction;
  std::string reason;                    // non-empty when the row's plan is illegal or does not fit
  double exposed_comm_s = 0;             // sum of prediction.breakdown.exposed_comm
  std::optional<double> comm_removed_s;  // previous row's exposed comm minus this row's; none for row 1 or
                                         // next to an illegal row
  bool valid() const { return prediction.violations.empty(); }
};

// Seconds of communication not hidden behind compute in a prediction (all groups).
double exposed_comm_seconds(const Prediction& p);

// The baseline of the ablation for `plan` (row 1), with a note on any split that had to depart from the rule
// "attention tp = tp*sp, experts ep = 1 and etp = ep*etp" to stay legal.
Plan explain_baseline(const ModelSpec& model, const Plan& plan, const HardwareProfile& hw, std::string* note);

// Six rows: baseline, + SP attention / EP experts, + inter-operator overlap, + intra-operator overlap,
// + compression, + selective recompute. When the plan overlaps across micro-batches (combined 1F1B, illegal
// under full recompute) and the baseline recomputes whole layers, the recompute row comes third, before the
// overlap rows, and carries a note saying why. Each row's plan differs from the previous one only in its
// technique's fields; the last row's plan is `plan`.
std::vector<ExplainRow> explain(const ModelSpec& model, const Plan& plan, const HardwareProfile& hw,
                                const StackProfile& stack, const workload::RoutingDistribution& routing);

}  // namespace moeplan::planner
