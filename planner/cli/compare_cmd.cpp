// `moeplan compare PREDICTED MEASURED`: a prediction against a measurement of the same plan. MEASURED is a
// step report (moerun's report.json, or another prediction: joined op by op) or a Chrome trace of a real run
// (PyTorch profiler / Kineto, Nsight Systems, moerun: joined by op category). The analysis is
// planner/compare.h; this file parses options and prints.
#include <variant>

#include <fmt/format.h>

#include "planner/cli/cli_common.h"
#include "planner/compare.h"

namespace moeplan::cli {
namespace {

struct Options {
  std::string predicted, measured;
  bool json = false;
  int top = 8;
  int64_t device = -1;
  int64_t steps = 1;
};

int run_compare(const Options& o) {
  Result<planner::StepReport> p = planner::read_step_report(o.predicted);
  if (!p) return bad_input(p.error().message);
  Result<planner::MeasuredInput> m = planner::read_measured(o.measured);
  if (!m) return bad_input(m.error().message);

  if (const auto* report = std::get_if<planner::StepReport>(&m.value())) {
    Result<planner::ReportComparison> c = planner::compare_reports(p.value(), *report);
    if (!c) return bad_input(c.error().message);
    if (o.json) {
      print_json(planner::report_comparison_json(c.value()));
    } else {
      fmt::print("{}", planner::report_comparison_text(c.value(), o.top));
    }
    return kExitOk;
  }

  const auto& trace = std::get<calibrate::TraceFile>(m.value());
  Result<calibrate::KernelPatterns> patterns = calibrate::load_kernel_patterns();
  if (!patterns) return bad_input(patterns.error().message);
  Result<planner::TraceMeasurement> measured =
      planner::measure_trace(trace, patterns.value(), {.device = o.device, .steps = o.steps});
  if (!measured) return bad_input(measured.error().message);
  const planner::TraceComparison c = planner::compare_with_trace(p.value(), measured.value());
  if (o.json) {
    print_json(planner::trace_comparison_json(c));
  } else {
    fmt::print("{}", planner::trace_comparison_text(c));
  }
  return kExitOk;
}

}  // namespace

Runner add_compare(CLI::App& app) {
  auto o = std::make_shared<Options>();
  app.add_option("predicted", o->predicted, "Report JSON (moeplan simulate --json, or a moerun report.json)")
      ->required();
  app.add_option(
         "measured", o->measured,
         "What the first is judged against: a report JSON (moerun's report.json, or another "
         "prediction; joined op by op) or a Chrome-trace JSON of a real run (PyTorch profiler / Kineto, "
         "Nsight Systems export, moerun trace.json; joined by op category)")
      ->required();
  app.add_option("--top", o->top, "Rows of the contributor and op tables (report against report)")
      ->check(CLI::Range(1, 1000));
  app.add_option("--device", o->device,
                 "Trace only: the device whose kernels are measured (default: the lowest device id in the "
                 "trace)")
      ->check(CLI::NonNegativeNumber);
  app.add_option(
         "--steps", o->steps,
         "Trace only: training steps the trace holds, when it has no ProfilerStep#N ranges (step time "
         "= span of the device's kernels / steps)")
      ->check(CLI::Range(int64_t{1}, int64_t{1'000'000}));
  app.add_flag("--json", o->json, "Print one JSON object");
  return [o]() { return run_compare(*o); };
}

}  // namespace moeplan::cli
