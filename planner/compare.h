// compare: predicted against measured. Joins a moeplan step report (`moeplan simulate --json`) with a
// measured step report (moerun's report.json) op by op, or with a Chrome trace of a real run (PyTorch
// profiler / Kineto, Nsight Systems, moerun) by op category, and says what the step-time error is made of.
// `moeplan compare` parses options and prints what this unit computes.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "simulator/calibrate/stack/kernel_patterns.h"
#include "simulator/calibrate/stack/trace_reader.h"
#include "simulator/core/status.h"

namespace moeplan::planner {

// ---- Step reports
// ------------------------------------------------------------------------------------------

// One row of a report's `ops`: seconds per step of one (stage, op label, phase) on that stage's rank.
struct OpRow {
  std::string kind, group;  // op kind ("gemm", "collective", ...); group for communication ("ep", "dp_attn")
  int64_t count = 1;
  double total_s = 0;
  // A moerun report's row measured on every rank of its stage ("ranks"): the least and the most seconds per
  // step over them, and the rank that took the most; absent in predictions and single-rank reports.
  struct Ranks {
    double min_s = 0, max_s = 0;
    int slowest_rank = -1;
  };
  std::optional<Ranks> ranks;
};
using OpKey = std::tuple<int64_t, std::string, std::string>;  // (stage, op label, phase)

struct StepReport {
  std::string path;
  nlohmann::json j;
  double step_s = 0;      // median of step_times_s when present (a measured report), else step_time_s
  std::string step_rule;  // which of the two
  std::map<OpKey, OpRow> ops;
};

// Errors, one line each naming the file: not a report (a missing key, with what was expected), a report of
// an invalid plan, a non-positive step time, an op row without stage, op, phase or total_s.
Result<StepReport> step_report(const nlohmann::json& j, const std::string& path);
Result<StepReport> read_step_report(const std::string& path);

// The measured side, told apart by content: a moeplan report has step_time_s / ops / breakdown; a Chrome
// trace has traceEvents or is an array of events.
using MeasuredInput = std::variant<StepReport, calibrate::TraceFile>;
Result<MeasuredInput> read_measured(const std::string& path);

// (predicted - measured) / measured; +inf when only the measurement is zero.
double relative_error(double predicted, double measured);

// The category an op's time is judged in: its kind, or comm_<group> for communication.
std::string category_of(const OpRow& r);

// ---- Report against report: op by op ---------------------------------------------------------------------

struct Contributor {
  std::string name;  // "compute efficiency: gemm", "collective bandwidth: ep", ...
  double delta_s = 0;
  double share = 0;  // delta_s / measured step time
};

struct JoinedOp {
  OpKey key;
  OpRow predicted, measured;
};

struct CategoryTotals {
  std::string category;
  double predicted_s = 0, measured_s = 0;  // seconds per step of the joined ops, all stages
};

// Memory per GPU, where both reports state it: the prediction's busiest stage (its allocations and the
// stack's reserve) against the measured high-water mark (moerun's report: on GPUs the device memory the
// replay allocated, no CUDA context or library handles; on CPUs the resident set). The allocations compare
// with a GPU replay's high-water; the reserve is what a framework adds around them.
struct MemoryComparison {
  double predicted_bytes = 0, predicted_low = 0, predicted_high = 0;  // allocations + reserve, and range
  double predicted_allocated = 0;  // weights, gradients, optimizer, activations, communication buffers
  double measured_bytes = 0;
  std::string measured_source;
  double allocated_error() const;  // relative_error(predicted_allocated, measured_bytes)
};

struct ReportComparison {
  std::string predicted_path, measured_path;
  double predicted_step_s = 0, measured_step_s = 0;
  std::string predicted_step_rule, measured_step_rule;
  double end_to_end_error = 0;             // relative_error of the step times
  std::vector<CategoryTotals> categories;  // by name
  std::vector<JoinedOp> ops;               // largest |predicted - measured| first
  std::vector<std::pair<OpKey, OpRow>> only_predicted, only_measured;
  std::vector<Contributor> contributors;   // largest |delta_s| first; they add up to the step-time difference
  std::optional<MemoryComparison> memory;  // absent where a report states no memory
};

// The step-time difference split so that the parts add up to it exactly. With B a report's breakdown of its
// breakdown stage and T that stage's op seconds per category:
//   compute efficiency (kind k)     dT_k                         (op time of the kind)
//   collective bandwidth (group g)  dT_comm_g                    (time inside the group's collectives)
//   exposed overlap (group g)       d(B.exposed_g - T_comm_g)    (comm time not hidden behind compute)
//   bubble                          dB.bubble
//   imbalance                       d(step - sum B) + sum_k d(B.compute_k + [k = optimizer] B.optimizer -
//   T_k)
//     (time the stage's own op times do not explain: waits for the slowest rank, compute ops overlapping)
std::vector<Contributor> contributors(const StepReport& predicted, const StepReport& measured);

// Error (one line) when the two reports are of different plans (model, gpus, or a plan field other than
// hardware and stack).
Result<ReportComparison> compare_reports(const StepReport& predicted, const StepReport& measured);
nlohmann::json report_comparison_json(const ReportComparison& c);
std::string report_comparison_text(const ReportComparison& c, int top);

// ---- Report against a Chrome trace: by category ----------------------------------------------------------

struct TraceOptions {
  int64_t device = -1;  // the device whose kernels are measured; -1: the lowest device id in the trace
  int64_t steps = 1;    // steps the kernels' span holds, when the trace has no ProfilerStep ranges
};

// A kernel's category on the prediction's terms. Kineto / Nsight: by name (kernel_patterns.json): GEMM ->
// gemm, grouped -> grouped_gemm, attention -> attention, permute / norm / cast / elementwise -> memory_bound,
// NCCL / DeepEP -> comm (the group is not in a kernel name), anything else -> other. moerun: the op kind, and
// comm_<group> for communication.
std::string trace_category(const calibrate::KernelEvent& k, calibrate::TraceDialect dialect,
                           const calibrate::KernelPatterns& patterns);
inline bool is_comm_category(const std::string& category) {
  return category.rfind("comm", 0) == 0;
}

// What one device did per step. Measured window: with ProfilerStep#N ranges (CPU side, of the process with
// the most), from the start of the first to the end of the last, the partial first and last steps dropped
// when there are three or more; step time = the median of the kept steps. Without: the span of the device's
// kernels, holding TraceOptions::steps steps; step time = span / steps. Every figure below is a wall time
// within the window divided by the steps it holds.
struct TraceMeasurement {
  std::string path;
  calibrate::TraceDialect dialect = calibrate::TraceDialect::kKineto;
  int64_t device = 0;
  std::vector<int64_t> devices;  // every device with kernels in the trace
  double step_s = 0;
  std::string step_rule;  // "median of 3 ProfilerStep ranges (first and last of 5 dropped)", ...
  int64_t steps = 0;
  double window_start_s = 0, window_end_s = 0;
  std::map<std::string, double> busy_s;  // per category: |union of its kernels|, overlaps across streams once
  std::map<std::string, int64_t> kernels;  // per category: kernels that start in the window (all steps)
  double comm_s = 0;                       // |union of communication kernels|
  double exposed_comm_s = 0;               // |communication union \ union of every other kernel|
  double busy_all_s = 0;                   // |union of all kernels|
  double idle_share = 0;                   // 1 - busy_all_s / step time covered by the window
  bool comm_groups_known = false;          // moerun: comm_<group> categories; Kineto / Nsight: one "comm"
};

// Errors, one line naming the file: no kernels on the requested device (with the devices present), no kernel
// of the device within the ProfilerStep ranges, steps < 1.
Result<TraceMeasurement> measure_trace(const calibrate::TraceFile& trace,
                                       const calibrate::KernelPatterns& patterns,
                                       const TraceOptions& options);

// One row of the trace comparison; a side that cannot have the category is nullopt.
struct CategoryRow {
  std::string category;
  std::optional<double> predicted_s, measured_s;  // seconds per step
  std::optional<double> error() const;            // relative_error when both are known and measured > 0
};

struct TraceComparison {
  std::string predicted_path;
  double predicted_step_s = 0;
  std::string predicted_step_rule;
  int64_t stage = 0, stages = 1;    // the prediction's breakdown stage, which the rows describe, of `stages`
  double predicted_idle_share = 0;  // breakdown.bubble / step time: no op running on the stage
  TraceMeasurement measured;
  double end_to_end_error = 0;
  std::vector<CategoryRow> categories;                    // compute kinds, other, then communication
  CategoryRow exposed_comm;                               // predicted: sum of breakdown.exposed_comm
  std::map<std::string, double> predicted_comm_by_group;  // the stage's op seconds per group
  std::vector<std::string> notes;                         // what the join could not tell apart, and why
};

// Predicted per category: the op seconds per step of the breakdown stage (ops of one kind summed;
// communication summed over groups into "comm" when the trace cannot tell groups apart).
TraceComparison compare_with_trace(const StepReport& predicted, const TraceMeasurement& measured);
nlohmann::json trace_comparison_json(const TraceComparison& c);
std::string trace_comparison_text(const TraceComparison& c);

}  // namespace moeplan::planner
