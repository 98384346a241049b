// The shareable report of issue #8: one self-contained HTML page (inline CSS and SVG, no scripts, nothing
// fetched) for a simulated plan (`moeplan simulate --html`) or a plan search (`moeplan plan --html`). Every
// number on the page comes from the same prediction `--json` prints (prediction_json), so the two agree.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "planner/search.h"
#include "simulator/predict/predict.h"
#include "simulator/predict/report.h"

namespace moeplan::report {

struct HtmlOptions {
  // The step timeline draws at most this many rectangles (ops plus the exposed-communication and idle marks);
  // beyond it, neighbouring ops on a row merge at a coarser time resolution and the page says so.
  int64_t max_timeline_rects = 6000;
  // Pipeline stages drawn in the timeline; beyond it the first, last and critical stages and evenly spaced
  // ones in between are drawn, and the page says which.
  int64_t max_timeline_stages = 8;
};

// `&`, `<`, `>`, `"` and `'` as entities: safe in element text and in quoted attribute values.
std::string html_escape(std::string_view text);

// The page of one simulated plan: its layout, the summary, the step-time breakdown, memory per GPU against
// HBM capacity and the step timeline. An illegal plan gets a page listing the rules it breaks.
std::string simulate_html(const Prediction& p, const ReportContext& ctx, const HtmlOptions& options = {});

// The page of a plan search: the top plans as a table with bars of tokens/s per GPU and MFU, their
// breakdowns and memory, and the best plan's summary and timeline. `best` is the first plan's prediction with
// its op graph and timeline (SearchOptions::keep_graphs, or predict() again: it is deterministic).
struct PlanSearchPage {
  const planner::SearchResult& result;
  const planner::Job& job;
  const ModelSpec& model;
  const HardwareProfile& hardware;
  const StackProfile& stack;
  const Prediction* best = nullptr;  // null when the search found no plan
};
std::string plan_html(const PlanSearchPage& page, const HtmlOptions& options = {});

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

}  // namespace moeplan::report
