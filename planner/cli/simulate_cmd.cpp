// `moeplan simulate PLAN`: predicts one training step of a plan (step time, throughput, MFU, memory per GPU,
// a breakdown) and writes its Chrome trace and HTML report; exit 3 when the plan is illegal or does not fit.
#include <cctype>
#include <filesystem>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "planner/cli/cli_common.h"
#include "planner/report/html_report.h"
#include "simulator/core/model_notes.h"
#include "simulator/io/plan_io.h"
#include "simulator/io/router_trace.h"
#include "simulator/io/stack_loader.h"
#include "simulator/predict/periodic.h"
#include "simulator/predict/report.h"

namespace moeplan::cli {
namespace {

std::string to_upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

void print_text(const Prediction& p, const ReportContext& ctx) {
  const auto& m = p.memory;
  fmt::print("{} on {} x {} ({} stack{}){}\n", ctx.model.name, ctx.plan.gpus, ctx.hardware.name,
             ctx.stack.name, ctx.stack.calibrated ? "" : ", uncalibrated",
             p.provenance.hypothetical ? " -- HYPOTHETICAL" : "");
  // MFU names the peak it divides by: the dense peak of the plan's precision, and BF16's beside an FP8 one.
  const std::string bf16_too =
      p.mfu_peak_dtype == "bf16" ? "" : fmt::format(", {:.1f}% of the BF16 peak", 100 * p.mfu_bf16);
  fmt::print(
      "step {:.3f} s | {:.0f} tokens/s ({:.0f}-{:.0f}) | {:.1f} tokens/s/GPU | MFU {:.1f}% of the {} "
      "peak{}\n",
      p.step_time_s, p.tokens_per_s, p.tokens_per_s_low, p.tokens_per_s_high, p.tokens_per_s_per_gpu,
      100 * p.mfu, to_upper(p.mfu_peak_dtype), bf16_too);
  fmt::print("memory per GPU (stage {}): {} ({} - {}) of {} -> {}\n", m.stage, human_bytes(m.total()),
             human_bytes(m.total_low()), human_bytes(m.total_high()), human_bytes(m.capacity),
             !m.fits() ? "DOES NOT FIT" : (m.tight() ? "fits, tight (the high end does not)" : "fits"));
  fmt::print(
      "  weights {}, gradients {}, optimizer {}, activations {} ({} micro-batch chunks in flight), comm "
      "buffers {}, reserve {}\n",
      human_bytes(m.weights), human_bytes(m.gradients), human_bytes(m.optimizer), human_bytes(m.activations),
      m.in_flight, human_bytes(m.comm_buffers), human_bytes(m.reserve));
  if (const StepSimulation& sim = p.simulation; sim.extrapolated) {
    const int64_t m0 = sim.simulated_micro_batches, d = sim.period_micro_batches;
    const std::string runs = sim.runs == 2 ? fmt::format("{} and {}", m0, m0 + d)
                                           : fmt::format("{}, {} and {}", m0, m0 + d, m0 + 2 * d);
    fmt::print(
        "simulated at {} of its {} micro-batches: the steady phase repeats every {} micro-batch(es) "
        "({:.4f} s){}, so the other {} periods are added: the same step as simulating them, up to "
        "rounding (--whole-step simulates every micro-batch)\n",
        runs, sim.micro_batches, d, sim.period_s,
        sim.runs == 2 ? fmt::format(", checked op by op to {:g} of the step", kInsertedPeriodTolerance)
                      : std::string(", checked by its figures"),
        sim.periods_added);
  }
  const auto& b = p.breakdown;
  fmt::print("breakdown of stage {} (seconds):\n", p.critical_stage);
  for (const auto& [k, v] : b.compute) fmt::print("  compute {:<18} {:9.4f}\n", k, v);
  for (const auto& [k, v] : b.exposed_comm) fmt::print("  exposed comm {:<13} {:9.4f}\n", k, v);
  fmt::print("  bubble / idle              {:9.4f}\n", b.bubble);
  // Only where it shows at the breakdown's precision (a few microseconds would print as 0.0000).
  if (b.host_wait >= 0.5e-4)
    fmt::print(
        "    of which host-bound      {:9.4f}  (the GPU waits for the host to issue; "
        "host.issue_us_per_kernel "
        "is {})\n",
        b.host_wait, name_of(ctx.stack.host_s_per_kernel.basis));
  fmt::print("  optimizer                  {:9.4f}\n", b.optimizer);
  if (ctx.plan.cuda_graphs != 0) {
    fmt::print(
        "CUDA graphs per layer ({}): their kernels issued by one replay per layer, micro-batch and "
        "direction, "
        "each two host calls and a copy of the graph's inputs\n",
        fmt::join(cuda_graph_scope_names(ctx.plan.cuda_graphs), ", "));
  }
  if (p.routing.mean_rank_assignments > 0) {
    fmt::print("routing: busiest EP rank gets {:.3f}x the mean; {:.2f}% of assignments dropped\n",
               p.routing.imbalance(), 100 * p.routing.dropped_fraction);
    if (p.decoder_routing.mean_rank_assignments != p.routing.mean_rank_assignments) {
      fmt::print("  decoder layers (the targets): {:.3f}x the mean; {:.2f}% dropped\n",
                 p.decoder_routing.imbalance(), 100 * p.decoder_routing.dropped_fraction);
    }
  }
  for (const auto& e : p.hot_exchanges) {
    if (e.table_source.empty()) {
      fmt::print(
          "  routed all-to-alls on {} ranks / {} node(s), busiest rank {:.3f}x: priced as a uniform "
          "exchange of the busiest rank's bytes\n"
          "    (assumed; the profile has no hot-receiver table for this group)\n",
          e.ranks, e.nodes, e.hot_factor);
    } else {
      fmt::print(
          "  routed all-to-alls on {} ranks / {} node(s), busiest rank {:.3f}x: priced from the measured "
          "hot-receiver table ({})\n",
          e.ranks, e.nodes, e.hot_factor, e.table_source);
    }
  }
  const auto& pv = p.provenance;
  fmt::print(
      "critical path priced by stack and hardware numbers that are: {:.0f}% measured, {:.0f}% derived, "
      "{:.0f}% assumed, "
      "{:.0f}% target\n",
      100 * pv.measured, 100 * pv.derived, 100 * pv.assumed, 100 * pv.target);
  for (const auto& t : pv.targets) fmt::print("hypothetical: {}\n", t);
  for (const auto& n : p.notices) fmt::print("stack: {}\n", n);
  for (const auto& n : model_notes(ctx.model)) fmt::print("model: {}\n", n);
  if (!p.extrapolations.empty()) {
    fmt::print("outside the calibrated data ({}):\n", p.extrapolations.size());
    for (const auto& e : p.extrapolations) fmt::print("  - {}\n", e);
  }
}

}  // namespace

Runner add_simulate(CLI::App& app) {
  struct Options {
    std::string plan, trace, html, stack, hardware, trace_stages;
    int64_t trace_micro_batches = -1;
    int threads = 2;
    bool json = false, whole_step = false, no_assumptions = false;
  };
  auto o = std::make_shared<Options>();
  app.add_option("plan", o->plan, "Plan file (JSON)")->required();
  app.add_option("--trace", o->trace, "Write the step's Chrome trace (opens in Perfetto) to this file");
  app.add_option("--trace-micro-batches", o->trace_micro_batches,
                 "Micro-batches the trace shows, from the first (0: all; default: as many as keep the file "
                 "near 100 MB)");
  app.add_option("--trace-stages", o->trace_stages,
                 "Pipeline stages the trace shows, e.g. 0,7-9 (default: all)");
  app.add_option("--html", o->html,
                 "Write a self-contained HTML report (summary, breakdown, memory, timeline) to this file");
  app.add_option("--stack", o->stack,
                 "Software stack profile (overrides the plan's; default " + std::string(kDefaultStack) + ")");
  app.add_option(
      "--hardware", o->hardware,
      "Hardware profile (overrides the plan's), e.g. one `moeplan calibrate` fitted on the cluster");
  app.add_flag("--json", o->json, "Print one JSON object");
  app.add_flag("--whole-step", o->whole_step,
               "Simulate every micro-batch instead of adding the repeating steady phase exactly (implied by "
               "--trace)");
  app.add_flag("--no-assumptions", o->no_assumptions,
               "Skip predicting the step again with each unmeasured stack or hardware number at the ends of "
               "its range");
  app.add_option("--threads", o->threads,
                 "Threads for the periodic steady state's small runs and the assumptions' predictions")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  return [o]() {
    Result<PlanInputs> in = load_plan_inputs(o->plan, o->stack, o->hardware);
    if (!in) return bad_input(in.error().message);
    const auto& [plan, model, hw, path] = in.value().loaded;
    const StackProfile& stack = in.value().stack;
    const workload::RoutingDistribution& routing = in.value().routing;

    // A trace shows every simulated op, so it needs the whole step.
    const Prediction p = predict(model, plan, hw, stack, routing,
                                 {.whole_step = o->whole_step || !o->trace.empty(), .threads = o->threads});
    const ReportContext ctx{plan, model, hw, stack};
    std::optional<AssumptionRange> assumed;
    if (p.violations.empty() && !o->no_assumptions)
      assumed = assumption_range(model, plan, hw, stack, routing, p.step_time_s, o->threads);
    if (!o->trace.empty() && p.violations.empty()) {
      std::string note;
      Result<TraceSelection> sel = trace_selection(p.graph, o->trace_micro_batches, o->trace_stages, &note);
      if (!sel) return bad_input(sel.error().message);
      Result<bool> w = write_file_atomic(o->trace, chrome_trace(p.graph, p.timeline.ops, sel.value()));
      if (!w) return bad_input(w.error().message);
      if (!note.empty()) std::fprintf(stderr, "moeplan: %s: %s\n", o->trace.c_str(), note.c_str());
    }
    if (!o->html.empty()) {  // also for an illegal plan: the page lists the rules it breaks
      report::HtmlOptions html;
      if (assumed) html.assumptions = assumptions_json(*assumed, p.tokens_per_step, plan.gpus);
      Result<bool> w = write_file_atomic(o->html, report::simulate_html(p, ctx, html));
      if (!w) return bad_input(w.error().message);
    }
    if (o->json) {
      nlohmann::json j = prediction_json(p, ctx);
      j["plan"] = io::plan_to_json(plan);
      if (assumed) j["assumptions"] = assumptions_json(*assumed, p.tokens_per_step, plan.gpus);
      if (const auto notes = model_notes(model); !notes.empty()) j["model_notes"] = notes;
      print_json(j);
    } else if (!p.violations.empty()) {
      fmt::print("{}: the plan cannot run, {} rule(s) broken:\n", path, p.violations.size());
      for (const auto& v : p.violations) fmt::print("  {}: {}\n", v.rule, v.reason);
    } else {
      print_text(p, ctx);
      if (assumed) print_assumptions(*assumed, p.tokens_per_step, plan.gpus);
    }
    if (!p.violations.empty()) return kExitInfeasible;
    if (!p.memory.fits()) return does_not_fit(p.memory);
    return kExitOk;
  };
}

}  // namespace moeplan::cli
