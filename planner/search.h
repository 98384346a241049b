// The plan search: enumerate every legal plan for a model, cluster and job; prune by the validation rules and
// the memory model (counting each reason); screen the rest with a fast estimate built from the same op graph
// (one layer of each kind, one micro-batch, through the same cost model and engine, then the pipeline's
// schedule run pass by pass in the lowering's order: PipelineSpan); re-score the finalists with the full
// event simulation; rank by tokens/s.
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
#include "simulator/core/status.h"
#include "simulator/predict/predict.h"
#include "simulator/workload/routing.h"

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
  // Filtered by the stack's capabilities: Megatron's selective (its default module set) or MegaScale's SAR.
  std::vector<Recompute> recomputes{Recompute::kNone, Recompute::kSelective, Recompute::kSar,
                                    Recompute::kFull};
  // --fix key=value pins: a dotted key of the plan-file form and its JSON value.
  std::vector<std::pair<std::string, nlohmann::json>> fixed;
};

struct Candidate {
  Plan plan;
  double screen_step_s = 0;  // fast estimate
  double memory_bytes = 0;   // the fit test's value: the low end of the predicted range
  int64_t index = 0;         // position in the enumeration (for_each_plan)
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
  // Of the screened plans, those left at a lower bound of their estimate that already reached the slowest
  // estimate their thread kept (their data-parallel time was not worked out; they could not be kept).
  int64_t screened_to_bound = 0;
  int64_t simulated = 0;
  // Finalists the host held up (its issue time left the GPU idle) simulated again with per-layer CUDA graphs,
  // and of those, the ones the graphs made faster (their plan, with its cuda_graphs, replaces the first).
  int64_t graph_tried = 0, graph_kept = 0;
  // With SearchOptions::prefer_memory_margin: finalists faster than the listed #1 that were ranked after the
  // plans with memory margin and fell past `top` (tight ones, tied with it), the fastest of them and its
  // place in the whole ranking (1-based: `--top` that lists it).
  int64_t faster_tight_unlisted = 0;
  std::optional<RankedPlan> fastest_tight_unlisted;
  int64_t fastest_tight_rank = 0;
  double elapsed_s = 0;
  // Wall seconds of the phases: enumeration, pruning and the screen (one pass), the finalists' full
  // simulation.
  double prune_and_screen_s = 0, simulate_s = 0;
  // The legal plan that needs the least memory per GPU (the low end of its range, as the fit test reads it),
  // whether it fits or not: when nothing fits, how far the job is from fitting.
  std::optional<Plan> smallest_need_plan;
  double smallest_need_bytes = 0;
  double capacity_bytes = 0;                   // one GPU's HBM, as the memory model counts it
  std::vector<Candidate> screened_candidates;  // every screened plan with its estimate (for tests and sweeps)
};

struct SearchOptions {
  int64_t top = 5;
  // Finalists, re-scored by the full simulation: the plans whose estimate is within `finalist_window` of the
  // best estimate (the screen's disagreement with the full simulation stays below it; see the screening
  // tests), at most `finalists`, at least `top`.
  int64_t finalists = 96;
  double finalist_window = 0.15;
  // Keep the op graph, costs, timeline and per-op summary of the top plans (for traces and reports). Without
  // it only the numbers are kept: a large job's graph takes hundreds of MB.
  bool keep_graphs = false;
  int threads = 2;
  // A finalist whose GPU waits for the host longer than this share of its step, and whose step less that
  // wait would rank among the top, is simulated again with the per-layer CUDA graphs its stack captures
  // (graphed_variant); the faster of the two is kept. 0: never.
  double graph_host_share = 0.01;
  bool keep_screened = false;
  // Among the plans tied with #1, those whose memory range fits wholly first
  // (prefer_memory_margin_among_ties), over every finalist before the list is cut to `top`: a tied plan with
  // margin is listed even where `top` tight plans are faster. false: by step time alone.
  bool prefer_memory_margin = false;
  // Stop after enumeration and the memory test (no screen, no simulation): counts, rejections and the
  // smallest memory need only.
  bool fit_only = false;
  // Called from the calling thread now and then with the plans enumerated so far (a lower bound: the
  // threads share the enumeration).
  std::function<void(int64_t enumerated)> progress;
};

// The space: pp dividing the GPUs (at most one stage per layer) with vpp from the SearchSpace; the attention
// mesh tp x sp within a node, cp in {1, 2, 4, 8} from 16k tokens on (1 below); ep dividing the stage and the
// experts, etp within a node; dispatch all-to-all, all-gather (ep > 1) and node-deduplicated (when the
// expert mesh spans nodes and the stack has it); micro-batch, ZeRO stage, recompute and precision from the
// SearchSpace; the stack's overlaps, with and without fused intra-operator kernels (sp or ep > 1, when the
// stack has them); FP32 reduce-scatter or BF16 all-to-all gradient sync (the latter when some gradient is
// replicated); FP8 dispatch exactly for FP8 plans with ep > 1; an uneven layer split (smaller first and
// last chunks) when the layers do not divide.
//
// Calls `visit(index, plan)` for every plan of the space for the job (legal or not), in a deterministic
// order; with a stride, only for the plans of share `offset` of `stride` shares (so threads can share the
// work without materialising the space): every plan of one mesh (tp, sp, cp, ep, etp) is in the same share,
// chosen by a hash of the mesh. Returns the size of the space.
using PlanVisitor = std::function<void(int64_t index, Plan&& plan)>;
int64_t for_each_plan(const ModelSpec& model, const HardwareProfile& hw, const StackProfile& stack,
                      const Job& job, const SearchSpace& space, const PlanVisitor& visit, int64_t stride = 1,
                      int64_t offset = 0);

// The plan with the per-layer CUDA graphs Megatron's recipes capture, where its stack captures them: attn,
// moe_router and moe_preprocess (Megatron-Bridge's performance configs), mamba and mlp where the model has
// such layers, dropping moe_preprocess, then moe_router, where a rule refuses them; nullopt where the stack
// captures none, the plan already has graphs, or no such plan is legal.
std::optional<Plan> graphed_variant(const Plan& plan, const ModelSpec& model, const HardwareProfile& hw,
                                    const StackProfile& stack);

// Every plan of the space for the job (legal or not), in for_each_plan's order.
std::vector<Plan> enumerate_plans(const ModelSpec& model, const HardwareProfile& hw,
                                  const StackProfile& stack, const Job& job, const SearchSpace& space);

// The fast estimate of one legal plan's step time (seconds); see the file comment.
double screen_step_time(const ModelSpec& model, const Plan& plan, const HardwareProfile& hw,
                        const StackProfile& stack, const workload::RoutingDistribution& routing);

// Why the --fix pins of `space` leave no plan to enumerate, as one line: the first pin whose value no plan of
// the space has (with the values it has), or that the pins match plans separately but not together.
std::string explain_unmatched_fix(const ModelSpec& model, const HardwareProfile& hw,
                                  const StackProfile& stack, const Job& job, const SearchSpace& space);

SearchResult search(const ModelSpec& model, const HardwareProfile& hw, const StackProfile& stack,
                    const workload::RoutingDistribution& routing, const Job& job, const SearchSpace& space,
                    const SearchOptions& options);

// Layers per virtual stage when they do not divide evenly (simulator/core/plan.h).
using ::moeplan::uneven_split;

// A one-line description of a plan's layout: "tp2 sp1 cp1 | ep8 etp1 a2a | pp8 v1 | dp8 mb1 z1 | sel | inter
// | bf16" (`layout_legend` explains each field).
std::string describe(const Plan& plan);
// Whether a plan's predicted range overlaps the best plan's: the model cannot say which of the two is faster.
bool tied_with_best(const Prediction& best, const Prediction& p);

// `ranked` sorted fitting plans first, fastest first: among the leading plans tied with #1 (plans the model
// cannot order), those whose memory range fits wholly move ahead of tight ones (the high end of their memory
// range does not fit), keeping their order otherwise. A user then starts from a plan with memory margin.
// search() applies it to all its finalists with SearchOptions::prefer_memory_margin (`plan` and `sweep` set
// it); otherwise it ranks by step time alone.
void prefer_memory_margin_among_ties(std::vector<RankedPlan>& ranked);

// What each field of `describe` means, a few lines for the end of a table.
std::string layout_legend();

// Value of a dotted key ("experts.ep") in the plan-file form, or nullopt when the key does not exist.
std::optional<nlohmann::json> plan_value(const Plan& plan, const std::string& key);
// Every dotted key of the plan-file form (for --fix suggestions).
std::vector<std::string> plan_keys();

// Sets a dotted plan-file key ("experts.ep") in the plan-file form.
void set_plan_key(nlohmann::json& plan, const std::string& key, const nlohmann::json& value);

// `text` read as the value of plan key `key` (JSON, or a bare word as a string), checked by the plan-file
// reader as a plan holding it would be, and returned as the plan file holds it (1 and 1.0 both read as the
// integer 1 where one is expected). Errors are one line that starts with `context`.
Result<nlohmann::json> plan_key_value(const std::string& key, const std::string& text,
                                      const std::string& context);

}  // namespace moeplan::planner
