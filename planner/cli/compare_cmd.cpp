// `moeplan compare PREDICTED MEASURED`: joins two step reports of one plan (`moeplan simulate --json`,
// `moerun run`'s report.json; either side may be either) op by op and by category, and names what the
// end-to-end step-time error is made of, so a prediction can be checked against a run. The analysis is
// planner/compare.h; this file parses options and prints.
#include <fmt/format.h>

#include "planner/cli/cli_common.h"
#include "planner/compare.h"

namespace moeplan::cli {
namespace {

struct Options {
  std::string predicted, measured;
  bool json = false;
  int top = 8;
};

int run_compare(const Options& o) {
  Result<planner::StepReport> p = planner::read_step_report(o.predicted);
  if (!p) return bad_input(p.error().message);
  Result<planner::StepReport> m = planner::read_step_report(o.measured);
  if (!m) return bad_input(m.error().message);
  Result<planner::ReportComparison> c = planner::compare_reports(p.value(), m.value());
  if (!c) return bad_input(c.error().message);
  if (o.json) {
    print_json(planner::report_comparison_json(c.value()));
  } else {
    fmt::print("{}", planner::report_comparison_text(c.value(), o.top));
  }
  return kExitOk;
}

}  // namespace

Runner add_compare(CLI::App& app) {
  auto o = std::make_shared<Options>();
  app.add_option("predicted", o->predicted, "Report JSON (moeplan simulate --json, or a moerun report.json)")
      ->required();
  app.add_option("measured", o->measured,
                 "Report JSON the first is judged against (moerun's report.json, or another prediction)")
      ->required();
  app.add_option("--top", o->top, "Rows of the contributor and op tables")->check(CLI::Range(1, 1000));
  app.add_flag("--json", o->json, "Print one JSON object");
  return [o]() { return run_compare(*o); };
}

}  // namespace moeplan::cli
