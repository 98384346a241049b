// The HTML report's charts, drawn as inline SVG into the page's buffer: the step breakdown and memory as
// stacked bars, the step timeline (its layout exposed for the tests), and one bar per plan of a value. The
// page around them is html_report.cpp.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner/report/html_format.h"
#include "simulator/predict/predict.h"

namespace moeplan::report {

struct HtmlOptions {
  // The step timeline draws at most this many rectangles (ops plus the exposed-communication and idle marks);
  // beyond it, neighbouring ops on a row merge at a coarser time resolution and the page says so.
  int64_t max_timeline_rects = 6000;
  // Pipeline stages drawn in the timeline; beyond it the first, last and critical stages and evenly spaced
  // ones in between are drawn, and the page says which.
  int64_t max_timeline_stages = 8;
  // The plan's step over its stack's unmeasured numbers (assumptions_json), shown in the summary; null: not
  // computed (simulate --no-assumptions).
  nlohmann::json assumptions;
};

// The step timeline as drawn: one row per (pipeline stage, stream) that has ops, then one row per stage with
// its exposed communication and idle time. Exposed for the tests; simulate_html draws exactly these.
enum class MarkKind : uint8_t { kOp, kExposedComm, kIdle };
struct TimelineRect {
  int32_t row = 0;
  double start = 0, end = 0;  // seconds from the step's start
  MarkKind kind = MarkKind::kOp;
  std::string category;   // ops: compute op kind or communication group (the breakdown's keys)
  int32_t first_op = -1;  // op id of the first op merged into it (kOp)
  int64_t ops = 0;        // ops merged into it (kOp)
};
struct TimelineRow {
  int32_t stage = 0;
  int32_t stream = -1;  // -1: the stage's exposed-communication / idle row
  std::string label;
};
struct TimelineLayout {
  std::vector<TimelineRow> rows;
  std::vector<TimelineRect> rects;
  std::vector<int32_t> stages;  // drawn, ascending
  int32_t num_stages = 0;
  int64_t ops_drawn = 0;          // ops with a positive duration on the drawn stages
  double merge_resolution_s = 0;  // 0: one rectangle per op; else gaps and ops below this merge
};
TimelineLayout timeline_layout(const Prediction& p, const HtmlOptions& options = {});

namespace html {

struct Segment {
  std::string category;  // a kCategories name, or "exposed:<group>" / "bubble"
  std::string label;
  std::string fill;
  double seconds = 0;
};

// The breakdown in drawing order: compute, optimizer, exposed communication, idle. Same numbers as --json's
// "breakdown".
std::vector<Segment> breakdown_segments(const nlohmann::json& b);

// One stacked bar per row (a plan, its --json "breakdown"), scaled to the longest; under each group of
// segments a band saying compute / exposed communication / idle.
void breakdown_chart(Out& out, const std::vector<std::pair<std::string, nlohmann::json>>& rows);

// One stacked bar per row (--json "memory"), against a line at HBM capacity.
void memory_chart(Out& out, const std::vector<std::pair<std::string, nlohmann::json>>& rows);

// The step timeline of `t` (timeline_layout of `p`): rows, rectangles, a time axis.
void timeline_chart(Out& out, const Prediction& p, const TimelineLayout& t);

// A horizontal bar per plan of one value (tokens/s per GPU, MFU), labelled by `label`.
void value_bars(Out& out, const std::string& title, const std::vector<double>& values,
                const std::function<std::string(double)>& label);

}  // namespace html
}  // namespace moeplan::report
