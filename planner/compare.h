// compare: predicted against measured. Joins a moeplan step report (`moeplan simulate --json`) with a
// measured step report (moerun's report.json) op by op, or with a Chrome trace of a real run (PyTorch
// profiler / Kineto, Nsight Systems, moerun) by op category, and says what the step-time error is made of.
// `moeplan compare` parses options and prints what this unit computes.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "simulator/core/status.h"

namespace moeplan::planner {

// ---- Step reports
// ------------------------------------------------------------------------------------------

// One row of a report's `ops`: seconds per step of one (stage, op label, phase) on that stage's rank.
struct OpRow {
  std::string kind, group;  // op kind ("gemm", "collective", ...); group for communication ("ep", "dp_attn")
  int64_t count = 1;
  double total_s = 0;
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

struct ReportComparison {
  std::string predicted_path, measured_path;
  double predicted_step_s = 0, measured_step_s = 0;
  std::string predicted_step_rule, measured_step_rule;
  double end_to_end_error = 0;             // relative_error of the step times
  std::vector<CategoryTotals> categories;  // by name
  std::vector<JoinedOp> ops;               // largest |predicted - measured| first
  std::vector<std::pair<OpKey, OpRow>> only_predicted, only_measured;
  std::vector<Contributor> contributors;  // largest |delta_s| first; they add up to the step-time difference
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

}  // namespace moeplan::planner
