// `moeplan calibrate`: builds a hardware profile from calibration sources (a folder of nccl-tests output and
// CSV tables with a profile.json, committed under hwprofiles/sources/ or written by `moerun bench`) and
// reports how well the cost model then predicts each source measurement.
#include <filesystem>

#include <fmt/format.h>

#include "planner/cli/cli_common.h"
#include "simulator/calibrate/fit_report.h"
#include "simulator/calibrate/sources.h"
#include "simulator/calibrate/stack/stack_fit.h"
#include "simulator/calibrate/stack/trace_reader.h"
#include "simulator/io/hardware_loader.h"
#include "simulator/io/op_trace.h"
#include "simulator/io/stack_loader.h"

namespace moeplan::cli {
namespace {

// `--trace`: a stack profile from per-op traces; the step time of the traced run is never a target.
template <class Options>
int run_trace_fit(const Options& o) {
  if (o.hardware.empty())
    return bad_input("calibrate --trace: give --hardware H (the GPUs the trace ran on)");
  auto hw = io::load_hardware(o.hardware);
  if (!hw) return bad_input(hw.error().message);
  calibrate::StackFitOptions options;
  options.name = std::filesystem::path(o.stack).stem().string();
  auto base = io::load_stack(o.stack);
  options.base_label = base ? o.stack : std::string(kDefaultTraceStack);
  if (!base) base = io::load_stack(kDefaultTraceStack);
  if (!base) return bad_input(base.error().message);
  options.base = base.value();
  auto patterns = calibrate::load_kernel_patterns();
  if (!patterns) return bad_input(patterns.error().message);
  options.patterns = patterns.value();
  if (o.moerun_experts.size() == 3) {
    options.moerun_experts = {o.moerun_experts[0], o.moerun_experts[1], o.moerun_experts[2]};
  }
  std::vector<calibrate::TraceFile> traces;
  for (const auto& path : o.traces) {
    auto t = calibrate::read_trace(path);
    if (!t) return bad_input(t.error().message);
    traces.push_back(std::move(t).value());
  }
  auto fit = calibrate::fit_stack(traces, hw.value(), options);
  if (!fit) return bad_input(fit.error().message);
  if (!o.out.empty()) {
    if (auto w = write_file_atomic(o.out, calibrate::stack_json(fit.value())); !w)
      return bad_input(w.error().message);
  }
  if (o.json) {
    print_json(calibrate::fit_report_json(fit.value()));
  } else {
    fmt::print("{}{}", calibrate::fit_report_text(fit.value()),
               o.out.empty() ? "" : fmt::format("-> {}\n", o.out));
  }
  return kExitOk;
}

}  // namespace

Runner add_calibrate(CLI::App& app) {
  struct Options {
    std::string sources;
    std::string hardware;
    std::string out;
    std::string stack = kDefaultTraceStack;
    std::vector<std::string> traces;
    std::vector<int64_t> moerun_experts;
    bool report = false;
    bool json = false;
  };
  auto o = std::make_shared<Options>();
  auto* src =
      app.add_option("--sources,--bench", o->sources,
                     "Calibration sources folder: profile.json + the nccl-tests outputs and CSV tables it "
                     "lists (hwprofiles/sources/<name>, or a `moerun bench --out` folder)");
  auto* hw =
      app.add_option("--hardware", o->hardware,
                     "Report the fit of an existing hardware profile (name or file) instead of building one");
  src->excludes(hw);
  auto* tr =
      app.add_option("--trace", o->traces,
                     "Per-op Chrome traces of a short real run (PyTorch profiler / Kineto, Nsight Systems "
                     "export, moerun trace.json): fit the stack profile named by --stack, keeping what the "
                     "traces do not determine from that stack (or moerun's when it does not exist yet); "
                     "needs --hardware");
  tr->excludes(src);
  app.add_option(
         "--moerun-experts", o->moerun_experts,
         "For moerun traces (which carry FLOPs, not shapes): local experts, hidden size, expert FFN size")
      ->expected(3);
  app.add_option("-o,--out", o->out,
                 "Write the built profile here (atomically); without it nothing is written");
  app.add_option(
         "--stack", o->stack,
         "The stack: with --trace, the one to fit (its name; an existing stack of that name is the base); "
         "otherwise the stack whose attention kernel the report's attention rows prefer (grouped-GEMM rows "
         "are "
         "scored with their own kernel class)")
      ->capture_default_str();
  app.add_flag("--report", o->report, "Print the fit report: per table, predicted vs measured");
  app.add_flag("--json", o->json, "Print the fit report as one JSON object");
  return [o]() {
    if (!o->traces.empty()) return run_trace_fit(*o);
    if (o->sources.empty() && o->hardware.empty()) {
      return bad_input(
          "calibrate: give --sources DIR, --hardware H (fit report) or --trace FILE --hardware H");
    }
    Result<StackProfile> stack = io::load_stack(o->stack);
    if (!stack) return bad_input(stack.error().message);
    HardwareProfile profile;
    if (!o->sources.empty()) {
      auto doc = calibrate::build_profile(o->sources);
      if (!doc) return bad_input(doc.error().message);
      const std::string text = calibrate::profile_text(doc.value());
      auto loaded = io::hardware_from_json(nlohmann::json::parse(text), o->sources);
      if (!loaded) return bad_input(loaded.error().message);
      profile = loaded.value();
      if (!o->out.empty()) {
        if (auto w = write_file_atomic(o->out, text); !w) return bad_input(w.error().message);
      }
      if (!o->json) {
        const auto& c = profile.calibration;
        fmt::print(
            "{}: {} collective curves, {} GEMM, {} grouped-GEMM, {} attention tables, {} HBM kernels{}\n",
            profile.name, c.collectives.size(), c.gemm.size(), c.grouped_gemm.size(), c.attention.size(),
            c.hbm.size(), o->out.empty() ? "" : fmt::format(" -> {}", o->out));
      }
    } else {
      auto loaded = io::load_hardware(o->hardware);
      if (!loaded) return bad_input(loaded.error().message);
      profile = loaded.value();
    }
    if (o->report || o->json || !o->hardware.empty()) {
      const calibrate::FitReport r = calibrate::fit_report(profile, stack.value());
      if (o->json) {
        print_json(calibrate::fit_report_json(r));
      } else {
        fmt::print("{}", calibrate::fit_report_text(r));
      }
    }
    return kExitOk;
  };
}

}  // namespace moeplan::cli
