// The plan search: enumerate every legal plan for a model, cluster and job; prune by the validation rules and
// the memory model (counting each reason); screen the rest with a fast estimate built from the same op graph
// (one layer of each kind, one micro-batch, through the same cost model and engine, then the pipeline's
// closed form); re-score the finalists with the full event simulation; rank by tokens/s.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "simulator/core/hardware.h"
#include "simulator/core/model_spec.h"
#include "simulator/core/plan.h"
#include "simulator/core/stack.h"
#include "simulator/cost/imbalance.h"
#include "simulator/predict/predict.h"

namespace moeplan::planner {

struct Job {
  int64_t gpus = 0;
  int64_t seq_len = 0;
  int64_t global_batch = 0;
};

// Which values each dimension may take. Empty vectors mean "all that make sense" (filled by the search).
struct SearchSpace {
  std::vector<Precision> precisions{Precision::kBf16, Precision::kFp8};
  std::vector<int64_t> micro_batches{1, 2, 4};
  std::vector<int64_t> vpps{1, 2, 4};
  std::vector<int64_t> zero_stages{1, 2, 3};
  std::vector<Recompute> recomputes{Recompute::kNone, Recompute::kSelective, Recompute::kFull};
  // --fix key=value pins: a dotted key of the plan-file form and its JSON value.
  std::vector<std::pair<std::string, nlohmann::json>> fixed;
};

struct Candidate {
  Plan plan;
  double screen_step_s = 0;  // fast estimate
  double memory_bytes = 0;
};

struct RankedPlan {
  Plan plan;
  Prediction prediction;
};

struct SearchResult {
  std::vector<RankedPlan> plans;            // the top plans by full simulation, best first
  std::map<std::string, int64_t> rejected;  // reason -> count
  int64_t enumerated = 0;
  int64_t legal = 0;
  int64_t fitting = 0;
  int64_t screened = 0;
  int64_t simulated = 0;
  double elapsed_s = 0;
  std::vector<Candidate> screened_candidates;  // every screened plan with its estimate (for tests and sweeps)
};

struct SearchOptions {
  int64_t top = 5;
  int64_t finalists = 24;  // plans re-scored by the full simulation (at least `top`)
  int threads = 2;
  bool keep_screened = false;
  std::function<void(int64_t done, int64_t total)> progress;  // called from the calling thread
};

// Every plan of the space for the job (legal or not), in a deterministic order.
std::vector<Plan> enumerate_plans(const ModelSpec& model, const HardwareProfile& hw,
                                  const StackProfile& stack, const Job& job, const SearchSpace& space);

// The fast estimate of one legal plan's step time (seconds); see the file comment.
double screen_step_time(const ModelSpec& model, const Plan& plan, const HardwareProfile& hw,
                        const StackProfile& stack, const cost::RoutingDistribution& routing);

SearchResult search(const ModelSpec& model, const HardwareProfile& hw, const StackProfile& stack,
                    const cost::RoutingDistribution& routing, const Job& job, const SearchSpace& space,
                    const SearchOptions& options);

// A one-line description of a plan's layout: "tp2 sp1 cp1 | ep8 etp1 a2a | pp8 v1 | mb1 z1 | sel | inter |
// bf16".
std::string describe(const Plan& plan);

// Value of a dotted key ("experts.ep") in the plan-file form, or nullopt when the key does not exist.
std::optional<nlohmann::json> plan_value(const Plan& plan, const std::string& key);
// Every dotted key of the plan-file form (for --fix suggestions).
std::vector<std::string> plan_keys();

}  // namespace moeplan::planner
