// predict(): one plan through the whole simulator, the way `moeplan simulate` and the planner run it:
// validate -> routing load -> lower -> cost every op -> event simulation -> memory, breakdown and
// uncertainty.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <optional>
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
#include "simulator/io/op_trace.h"
#include "simulator/predict/stream_index.h"
#include "simulator/workload/lower.h"
#include "simulator/workload/routing.h"

namespace moeplan {

// Seconds of one stage's step by what the rank was doing: compute by op kind, communication not hidden behind
// compute by group, idle (pipeline bubble and waits), and the optimizer. The parts sum to the step time.
struct StepBreakdown {
  std::map<std::string, double> compute;       // gemm, grouped_gemm, attention, memory_bound, fused_gemm_comm
  std::map<std::string, double> exposed_comm;  // tp, sp, cp, ep, etp, dp_attn, dp_expert, pp
  double bubble = 0;
  // Of the bubble: the idle time that ended when the host issued the next op (the device had run out of
  // issued work: host-bound stretches, the stall after a device-to-host sync). The stack's host issue times
  // price it.
  double host_wait = 0;
  double optimizer = 0;
  double total() const;  // host_wait is inside bubble
};

// Where the prediction's numbers come from: the critical path's time split by the basis of the stack numbers
// that priced each op, and what makes it hypothetical (a target on the critical path, or an overlap the plan
// uses that the stack has only as a target).
struct Provenance {
  double measured = 0, derived = 0, assumed = 0, target = 0;  // fractions of the critical path's time
  bool hypothetical = false;
  std::vector<std::string> targets;  // why it is hypothetical, one line each
};
// The line of `targets` for a critical path whose time is that share priced by targets ("52% of the critical
// path is priced by stack numbers that are targets"); for several predictions, their lowest and highest share
// ("52-61% of ..."; one number when both print the same).
std::string target_share_line(double low, double high);

// How the step was simulated. A pipeline step is fill, a steady phase that repeats every
// `period_micro_batches` micro-batches, and drain; with deterministic costs the steady phase is exactly
// periodic. predict() then runs the step at two small batch sizes m0 and m0 + d (d = the period) and checks
// op by op that the second is the first with one period inserted (inserted_period in periodic.h); every
// figure then grows by what that period added, and the remaining (m - m0) / d periods are added exactly.
// Where that check fails (`why_three_runs`), it also runs m0 + 2d and checks that every reported figure moves
// by the same amount from the first run to the second as from the second to the third (times to 1e-11 of a
// run's step, counts exactly); where a figure does not repeat it simulates more periods, and in the end
// falls back to the whole step; `why_full` says why a step was simulated whole.
struct StepSimulation {
  bool extrapolated = false;
  int64_t micro_batches = 0;            // of the step
  int64_t simulated_micro_batches = 0;  // of the run the graph and timeline hold (m0 when extrapolated)
  int64_t period_micro_batches = 0;     // d
  int64_t periods_added = 0;            // (m - m0) / d
  double period_s = 0;                  // the step time one period adds
  int runs = 0;                         // extrapolated from 2 (checked op by op) or 3 runs
  int64_t simulated_ops = 0;            // ops simulated in all runs together
  std::string why_three_runs;
  std::string why_full;
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
  // An encoder-decoder's decoder layers (their targets are fewer tokens); for other models equal to routing.
  workload::RoutingLoad decoder_routing;
  // How the routed all-to-alls that carry a hot factor above 1 were priced, one row per group shape: from
  // the hardware profile's measured all-to-all-v table with a hot receiver for that shape (`table_source`
  // names it), or, where the profile has none, as a uniform exchange of the busiest rank's bytes (empty).
  struct HotExchange {
    int64_t ranks = 0, nodes = 0;
    double hot_factor = 1;  // the largest over the shape's exchanges
    std::string table_source;
  };
  std::vector<HotExchange> hot_exchanges;
  StepBreakdown breakdown;  // of the busiest stage (most compute time), which sets the pace
  int64_t critical_stage = 0;
  std::vector<std::string> extrapolations;
  // The whole step's figures (also when the graph below holds fewer micro-batches).
  StepSimulation simulation;
  int64_t ops_in_step = 0;
  int64_t events = 0;                                   // op starts and completions of the whole step
  std::vector<double> stage_end;                        // when each stage's last op ends
  std::map<std::string, double> critical_path_seconds;  // by op kind, communication as comm_<group>
  int64_t critical_path_ops = 0;
  std::vector<OpSummaryRow> op_summary;  // per (stage, op, phase) over the whole step
  // The simulated run: the whole step, or the simulated_micro_batches of an extrapolated one (the trace and
  // the timeline chart show these; PredictOptions::whole_step asks for the whole step).
  OpGraph graph;
  std::vector<cost::OpCost> costs;
  engine::Timeline timeline;
  std::vector<int32_t> critical_path;  // in `graph`
};

// Frees the simulated run a prediction holds (graph, costs, timeline and the critical path's op ids into the
// graph), keeping every figure. For callers that keep many predictions (the search's finalists, sweeps).
// Emptying a vector with `v = {}` or `v.clear()` keeps its buffer: the search's 96 finalists of up to 115k
// ops had kept 8 MB of op costs each that way.
void release_simulated_run(Prediction& p);

// Keeps the memory of one prediction for the next: glibc would otherwise map each large op graph, cost and
// timeline array afresh and return it on free, and a 100k-op step then spends a third of its time in page
// faults. Arrays above glibc's largest mapping threshold (32 MB: a whole step of 200k ops) come from the
// heap too. Programs that predict many steps (plan, sweep, the benchmarks) call it once at start; a no-op
// outside glibc.
void retain_freed_memory();

// One run's op graph with each op's cost key (cost::cost_fields_hash) and, for the periodic steady state's
// check, its ops by stream: what the simulated step needs besides the stack's prices.
struct LoweredGraph {
  OpGraph graph;
  std::vector<uint64_t> cost_keys;  // by op id
  // The ids of its routed all-to-alls with a hot receiver (CommSpec::hot_routed), in id order, found in the
  // pass that hashes the keys; absent where that pass was the stream index's (every op is read again).
  std::optional<std::vector<int32_t>> hot_routed;

  // Built with the keys, in the same pass over the ops, where the lowering was asked for it; otherwise on
  // first use (safe from several threads).
  const StreamIndex& streams() const;
  void index_with_keys();

 private:
  mutable std::once_flag streams_once_;
  mutable std::optional<StreamIndex> streams_;
};

// Op graphs lowered by earlier predictions, handed to later ones of the same model and plan whose lowering is
// the same (the plan as the stack runs it and the lowering options, compared field by field). The ranges
// over a stack's unmeasured numbers predict one plan under a dozen settings, and most settings change only
// prices, not the graph. Safe to share between threads; it keeps every graph until it is destroyed.
class LoweringCache {
 public:
  // The graph of `run` (its micro-batches included) under `options`, lowered here on a miss. `model` is
  // compared by address: one cache serves one model object. `indexed`: the caller will check it op by op (on
  // a miss its stream index is built with its keys).
  std::shared_ptr<const LoweredGraph> get(const ModelSpec& model, const Plan& run,
                                          const LoweringOptions& options, bool indexed = false);
  int64_t lowered() const;  // misses so far
  int64_t reused() const;   // hits so far

 private:
  // The entry of (model, run, options), counted as reused; null if none. Under mutex_.
  std::shared_ptr<const LoweredGraph> find(const ModelSpec& model, const Plan& run,
                                           const LoweringOptions& options);
  struct Entry {
    const ModelSpec* model;
    Plan run;
    LoweringOptions options;
    std::shared_ptr<const LoweredGraph> graph;
  };
  mutable std::mutex mutex_;
  std::vector<Entry> entries_;
  int64_t lowered_ = 0, reused_ = 0;
};

struct PredictOptions {
  bool critical_path = true;  // the report's critical path and uncertainty range
  bool whole_step = false;    // simulate every micro-batch (for a trace of the step), never extrapolate
  bool op_summary = true;     // fill Prediction::op_summary
  // Threads for the periodic steady state's runs (lowered, timed and measured at once). The planner
  // keeps 1: it predicts its finalists on its own threads.
  int threads = 1;
  // The periodic steady state from two runs checked op by op where that check holds; false: always from
  // three runs checked by their figures (tests run both).
  bool op_by_op = true;
  // The cost model's fit of the hardware profile (cost::CostModel::fit_hardware of the same profile object),
  // shared by callers that predict many plans or stacks on one profile; null: predict() fits it (a few ms).
  std::shared_ptr<const cost::CostModel::HardwareFit> hardware_fit = nullptr;
  // Op graphs shared with other predictions of the same plan (see LoweringCache); null: lowered here. With
  // a cache, Prediction::graph, costs and timeline are left empty (the graph stays the cache's).
  std::shared_ptr<LoweringCache> lowerings = nullptr;
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
