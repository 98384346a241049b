// The shareable report of issue #8: one self-contained HTML page (inline CSS and SVG, no scripts, nothing
// fetched) for a simulated plan (`moeplan simulate --html`) or a plan search (`moeplan plan --html`). Every
// number on the page comes from the same prediction `--json` prints (prediction_json), so the two agree.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "planner/report/svg_charts.h"
#include "planner/search.h"
#include "simulator/predict/predict.h"
#include "simulator/predict/report.h"

namespace moeplan::report {

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

}  // namespace moeplan::report
