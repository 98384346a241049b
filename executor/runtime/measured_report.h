// The measured report of `moerun run`: the keys of the predicted report (`moeplan simulate --json`) where
// they apply, filled from measurement, plus "measured": true and every step's time, so predicted and measured
// reports join op by op on (stage, op, phase).
#pragma once

#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "executor/runtime/run_inputs.h"

namespace moeplan::executor {

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
};

// Per-rank step times as the report shows them: each rank's mean step, the fastest and slowest ranks, the
// skew (slowest / fastest) and the stragglers: ranks whose step exceeds the median rank's by more than
// kStragglerMargin.
inline constexpr double kStragglerMargin = 0.05;
nlohmann::json rank_skew_json(const std::vector<double>& rank_step_s);

// Seconds of `stage`'s step by what it was doing, as predict's breakdown: at each instant, compute ops
// running share it by kind; otherwise communication by group (exposed); otherwise idle. Optimizer apart.
nlohmann::json measured_breakdown_json(const OpGraph& graph, std::span<const OpTiming> ops, int stage,
                                       double step_time_s);

nlohmann::json measured_report_json(const RunInputs& in, const MeasuredRun& run);

// The resident high-water mark of this process in bytes (VmHWM of /proc/self/status; 0 if unreadable).
double process_high_water_bytes();

}  // namespace moeplan::executor
