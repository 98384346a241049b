// The measured report of `moerun run`: the keys of the predicted report (`moeplan simulate --json`) where
// they apply, filled from measurement, plus "measured": true and every step's time, so predicted and measured
// reports join op by op on (stage, op, phase).
#pragma once

#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "executor/runtime/run_inputs.h"
#include "simulator/io/op_trace.h"

namespace moeplan::executor {

// One row of the op summary (simulator/io/op_trace.h: an op label and phase on a stage, its time summed over
// the step) measured on every rank of its stage: the row's seconds per step, least, mean and most over those
// ranks, and the world ranks that took the least and the most (the lowest on ties).
struct OpRankSpread {
  double min_s = 0, mean_s = 0, max_s = 0;
  int fastest_rank = -1, slowest_rank = -1;
};

struct MeasuredRun {
  int warmup = 0;
  std::vector<double> step_times_s;  // each measured step (after warm-up): the slowest rank's time
  // By op id, seconds from the step's start, each stage's ops from its representative rank: the mean over
  // measured steps of start and end.
  std::vector<OpTiming> ops;
  std::vector<int> representative_ranks;  // by stage: the world rank whose op times the report shows
  // "cpu" (MPI + Eigen ranks) or "cuda" (one GPU per rank): says what ran and what the memory figure is.
  std::string backend = "cpu";
  // Max over ranks of the process's resident high-water mark (VmHWM) on the CPU backend, of the device
  // memory the CUDA replay allocated on the CUDA backend.
  double high_water_bytes = 0;
  int world_size = 1;
  // By world rank: the mean over measured steps of the rank's own step (world barrier to its last op); empty
  // when not gathered. The report's "ranks" shows the skew and the stragglers.
  std::vector<double> rank_step_s;
  // By op_summary(graph, ops) row: the row over every rank of its stage; empty when not gathered. The
  // report's ops carry it as "ranks", and "op_rank_skew" lists the rows whose ranks differ most.
  std::vector<OpRankSpread> op_ranks;
};

// Per-rank step times as the report shows them: each rank's mean step, the fastest and slowest ranks, the
// skew (slowest / fastest) and the stragglers: ranks whose step exceeds the median rank's by more than
// kStragglerMargin.
inline constexpr double kStragglerMargin = 0.05;
nlohmann::json rank_skew_json(const std::vector<double>& rank_step_s);

// The op summary rows whose slowest rank took the most seconds more than their fastest (rows with no
// difference left out), widest first, at most `top` of the compute rows ("compute") and of the communication
// rows ("communication": a collective's spread is mostly waiting for a rank slow before it): stage, op,
// phase, least and most seconds per step, the difference, the ratio, and the ranks. `spreads` is by row of
// `rows`.
nlohmann::json op_rank_skew_json(std::span<const OpSummaryRow> rows, std::span<const OpRankSpread> spreads,
                                 size_t top = 5);

// Seconds of `stage`'s step by what it was doing, as predict's breakdown: at each instant, compute ops
// running share it by kind; otherwise communication by group (exposed); otherwise idle. Optimizer apart.
nlohmann::json measured_breakdown_json(const OpGraph& graph, std::span<const OpTiming> ops, int stage,
                                       double step_time_s);

nlohmann::json measured_report_json(const RunInputs& in, const MeasuredRun& run);

// The resident high-water mark of this process in bytes (VmHWM of /proc/self/status; 0 if unreadable).
double process_high_water_bytes();

}  // namespace moeplan::executor
