// diff: two plans or two prediction reports side by side: the plan fields that differ, and for reports the
// headline figures and every breakdown category (compute by kind, exposed communication by group, bubble,
// optimizer, memory by component) with the change from A to B.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace moeplan::planner {

// One plan field that differs: its dotted key and the two values (null where one side lacks the key).
struct FieldDiff {
  std::string key;
  nlohmann::json a, b;
};

// The leaves of two plan-file objects that differ, in key order. Objects are compared field by field; arrays
// and scalars as values.
std::vector<FieldDiff> diff_fields(const nlohmann::json& a, const nlohmann::json& b);

// One figure of two reports (a missing breakdown category counts as 0 s or 0 bytes).
struct FigureDiff {
  std::string key;   // "step_time_s", "breakdown.compute.grouped_gemm", "memory.components.activations", ...
  std::string unit;  // "s", "tokens/s", "bytes", "fraction"
  double a = 0, b = 0;
  double change() const { return b - a; }
  double relative() const { return a != 0 ? b / a - 1 : 0; }
};

// The headline figures and every breakdown category of two `simulate --json` reports (or `plan --out-dir`
// reports), in a fixed order: headline, compute, exposed communication, bubble and optimizer, memory.
std::vector<FigureDiff> diff_reports(const nlohmann::json& a, const nlohmann::json& b);

}  // namespace moeplan::planner
