// sweep: what-if questions over one variable (GPUs, sequence length, top-k, NIC bandwidth, a plan key, ...).
// Each value is applied to a copy of the model, hardware, job or fixed plan; the row then re-plans with the
// search (best plan) or re-simulates the fixed plan. A value that leaves nothing to run is a row with a
// reason.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner/search.h"
#include "simulator/core/hardware.h"
#include "simulator/core/model_spec.h"
#include "simulator/core/plan.h"
#include "simulator/core/stack.h"
#include "simulator/core/status.h"
#include "simulator/cost/cost_model.h"
#include "simulator/predict/predict.h"

namespace moeplan::planner {

// A sweep key that is not a plan-file key, with its one-line meaning (for --help and README).
struct SweepKey {
  const char* name;
  const char* help;
};
const std::vector<SweepKey>& sweep_keys();

// Every key --vary accepts: sweep_keys() and the plan keys of plan_keys() except model, hardware and stack.
std::vector<std::string> vary_keys();

struct Vary {
  std::string key;
  std::vector<nlohmann::json> values;  // integers, scale factors (numbers), or a plan key's JSON value
};

// Parses "KEY=V1,V2,...". Errors, one line each: no '=' or no values, an unknown key (with a did-you-mean), a
// malformed value (not a positive integer / factor, or a value the plan-file reader rejects for that key),
// routing.capacity_factor without a fixed plan.
Result<Vary> parse_vary(const std::string& arg, bool fixed_plan);

// Everything one sweep row runs on.
struct SweepCase {
  ModelSpec model;
  HardwareProfile hw;
  StackProfile stack;
  // Re-planning (no fixed plan): the job, the search space with its --fix pins, and the routing distribution
  // ("uniform", "zipf:<s>" or a router-trace path relative to routing_base).
  Job job;
  SearchSpace space;
  std::string routing = "uniform";
  std::string routing_base;
  // A fixed plan (--plan): re-simulated with each value; its own routing.distribution is used.
  std::optional<Plan> plan;
};

// The case with `value` of `key` applied (a key and value that parse_vary accepted). An error is a reason
// for the row, not bad input: top_k above the routed experts, experts on a dense model.
Result<SweepCase> apply_vary(const SweepCase& base, const std::string& key, const nlohmann::json& value);

// The hardware with its NVLink (intra-node) or per-NIC (inter-node) bandwidth times `factor`: the scalar
// line-rate and achieved fields, and the bandwidth term of every collective curve and plateau of that scope.
// A measured curve keeps its fitted latency: each point's time t = alpha + rest becomes alpha + rest /
// factor.
HardwareProfile scale_nvlink_bandwidth(const HardwareProfile& hw, double factor);
HardwareProfile scale_nic_bandwidth(const HardwareProfile& hw, double factor);
// The hardware with `nics` NICs per node; inter-node curves and plateaus scale with the NIC count.
HardwareProfile with_nics_per_node(const HardwareProfile& hw, int64_t nics);

struct SweepRow {
  nlohmann::json value;
  std::optional<Plan> plan;  // the best plan (re-planning) or the fixed plan with the value applied
  // predict(plan) without its op graph, costs and timeline; meaningful when plan is set and has no
  // violations.
  Prediction prediction;
  std::string reason;  // non-empty: nothing fits, the fixed plan became illegal or does not fit, ...
  bool has_numbers() const { return plan.has_value() && prediction.violations.empty(); }
};

// Strong scaling over a GPU sweep (rows in the order swept, increasing GPU counts): each row's tokens/s per
// GPU relative to the first row with numbers, and the knee: the last GPU count before the per-GPU rate first
// falls below `threshold` of the first row's (the last row when it never does, `knee_in_range` false).
struct GpuScaling {
  std::vector<std::optional<double>> efficiency;  // per row; nullopt for a row without numbers
  std::optional<size_t> knee;                     // row index
  bool knee_in_range = false;                     // a later row fell below the threshold
  double threshold = 0.8;
};
GpuScaling gpu_scaling(const std::vector<SweepRow>& rows, double threshold = 0.8);

struct SweepOptions {
  SearchOptions search;                                     // top is forced to 1
  std::function<void(size_t done, size_t total)> progress;  // after each value, from the calling thread
};

// One value's row. `fit`: the cost model's fit of base.hw (CostModel::fit_hardware), shared by the rows of a
// fixed plan whose key leaves the hardware as it is; null: each prediction fits the profile itself.
SweepRow sweep_row(const SweepCase& base, const std::string& key, const nlohmann::json& value,
                   const SweepOptions& options,
                   const std::shared_ptr<const cost::CostModel::HardwareFit>& fit = nullptr);
std::vector<SweepRow> sweep(const SweepCase& base, const Vary& vary, const SweepOptions& options);

// A value as written on the command line and in tables: 2, 0.5, true, all_gather.
std::string vary_value_text(const nlohmann::json& value);

}  // namespace moeplan::planner
