// The screen's pipeline: a plan's schedule run task by task at the grain of one virtual stage and one
// micro-batch, in the lowering's own order of each stage (pipeline_order), so the screened step has
// the fill, steady state and drain the simulation has rather than a closed form of them.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "simulator/core/plan.h"
#include "simulator/workload/lower.h"

namespace moeplan::planner {

// Seconds one micro-batch spends in a virtual stage (virtual_stage(chunk, stage): chunk * stages + stage, or
// DualPipeV's V) on its stage's compute stream: forward and backward run alone, each side of a pair (combined
// 1F1B's or DualPipeV's: a forward beside another micro-batch's backward, layer by layer), and the share of
// the backward that is weight gradients (which DualPipeV's zero-bubble backwards hold back for a later
// weights task).
struct VirtualStageTimes {
  double forward = 0, backward = 0;
  double paired_forward = 0, paired_backward = 0;
  double weights = 0;
};

// A schedule to run: 1F1B, interleaved 1F1B (chunks > 1) or DualPipeV (chunks 2), combined 1F1B pairs with
// `combined`.
struct PipelineShape {
  int64_t stages = 1, chunks = 1, micro_batches = 1;
  Schedule schedule = Schedule::k1F1B;
  bool combined = false;
};

class PipelineSpan {
 public:
  // Each stage's end: when its compute stream finishes the last task of its order, from time 0. `times`
  // holds stages * chunks entries; `hop` is added between a task and the next virtual stage's task that
  // waits for it when the two lie on different stages (a pipeline send off the compute stream). Once the
  // steady state repeats exactly (every task of the last few periods of the schedule, one micro-batch or
  // `stages` of them when interleaved, on every stage, ends the same time after its counterpart a period
  // before, to 1e-12), the rest of the periods are added in closed form; otherwise (or with `whole`) every
  // micro-batch is run (always for DualPipeV). Up to 65,536 answers are kept, and dropped together when full
  // (plans that differ only in what the pipeline does not see, a ZeRO stage or a gradient sync, ask again).
  std::vector<double> stage_ends(const PipelineShape& shape, const std::vector<VirtualStageTimes>& times,
                                 double hop, bool whole = false);

  // Runs of the schedule the last stage_ends needed (one per probe, and one of the whole step where none
  // settled; none where an earlier call had the same shape and times), and of them how many micro-batches
  // it ran in all.
  int64_t last_runs() const { return runs_; }
  int64_t last_micro_batches_run() const { return micro_batches_run_; }

 private:
  struct KeyHash {
    size_t operator()(const std::vector<uint64_t>& k) const {
      uint64_t h = k.size();
      for (uint64_t x : k) h = (h ^ x) * 0x100000001b3ULL;
      return static_cast<size_t>(h);
    }
  };
  static constexpr size_t kMemoEntries = size_t{1} << 16;

  std::vector<double> settle(const PipelineShape& shape, const std::vector<VirtualStageTimes>& times,
                             double hop, bool whole);
  std::vector<double> run(const PipelineShape& shape, const std::vector<VirtualStageTimes>& times,
                          double hop);
  const std::vector<std::vector<PipelineTask>>& orders(const PipelineShape& shape);
  // The time one pattern of pairs adds, where the last run's last `window` patterns of pairs on every stage
  // each end that long after the pattern before them; nullopt where they do not.
  std::optional<double> repeat(const std::vector<std::vector<PipelineTask>>& order, int64_t window,
                               int64_t pattern) const;

  std::map<std::tuple<int64_t, int64_t, int64_t, bool, int>, std::vector<std::vector<PipelineTask>>> orders_;
  std::vector<double> forward_end_, backward_end_;  // scratch of run(), per (virtual stage, micro-batch)
  std::vector<std::vector<double>> task_end_;       // per stage, each task of its order
  std::vector<std::deque<double>> deferred_;        // per stage, the weights its backwards held back
  std::vector<size_t> next_;
  std::vector<double> free_;
  int64_t runs_ = 0, micro_batches_run_ = 0;
  std::vector<uint64_t> key_;  // of the call in hand: the shape, `whole` and the times' bits
  std::unordered_map<std::vector<uint64_t>, std::vector<double>, KeyHash> memo_;
};

}  // namespace moeplan::planner
