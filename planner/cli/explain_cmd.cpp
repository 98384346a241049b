// `moeplan explain PLAN`: what each technique of a plan buys, as a cumulative table from a TP-only baseline
// without overlap, compression or selective recompute (MegaScale-MoE's ablation); exit 3 when the plan itself
// is illegal or does not fit.
#include <cstdio>
#include <filesystem>

#include <fmt/format.h>

#include "planner/cli/cli_common.h"
#include "planner/explain.h"
#include "planner/search.h"
#include "simulator/core/units.h"
#include "simulator/io/plan_io.h"
#include "simulator/io/router_trace.h"
#include "simulator/io/stack_loader.h"

namespace moeplan::cli {
namespace {

nlohmann::json optional_number(bool present, double v) {
  return present ? nlohmann::json(v) : nlohmann::json(nullptr);
}

nlohmann::json row_json(size_t index, const planner::ExplainRow& r) {
  const Prediction& p = r.prediction;
  const bool ran = r.valid();
  nlohmann::json violations = nlohmann::json::array();
  for (const Violation& v : p.violations) violations.push_back({{"rule", v.rule}, {"reason", v.reason}});
  nlohmann::json comm = nlohmann::json::object();
  for (const auto& [group, s] : p.breakdown.exposed_comm) comm[group] = s;
  return {{"row", index + 1},
          {"technique", r.technique},
          {"in_plan", r.in_plan},
          {"note", r.note},
          {"layout", planner::describe(r.plan)},
          {"plan", io::plan_to_json(r.plan)},
          {"valid", ran},
          {"violations", violations},
          {"reason", r.reason.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.reason)},
          {"step_time_s", optional_number(ran, p.step_time_s)},
          {"tokens_per_s", optional_number(ran, p.tokens_per_s)},
          {"tokens_per_s_per_gpu", optional_number(ran, p.tokens_per_s_per_gpu)},
          {"mfu", optional_number(ran, p.mfu)},
          {"memory_per_gpu_bytes", optional_number(ran, p.memory.total())},
          {"memory_per_gpu_bytes_range",
           ran ? nlohmann::json({p.memory.total_low(), p.memory.total_high()}) : nlohmann::json(nullptr)},
          {"memory_fits", ran ? nlohmann::json(p.memory.fits()) : nlohmann::json(nullptr)},
          {"memory_tight", ran ? nlohmann::json(p.memory.tight()) : nlohmann::json(nullptr)},
          {"exposed_comm_s", optional_number(ran, r.exposed_comm_s)},
          {"exposed_comm_by_group_s", ran ? comm : nlohmann::json(nullptr)},
          {"comm_removed_s", optional_number(r.comm_removed_s.has_value(), r.comm_removed_s.value_or(0))},
          {"bubble_s", optional_number(ran, p.breakdown.bubble)},
          {"hypothetical", ran ? nlohmann::json(p.provenance.hypothetical) : nlohmann::json(nullptr)},
          {"why_hypothetical", ran ? nlohmann::json(p.provenance.targets) : nlohmann::json(nullptr)}};
}

void print_table(const std::vector<planner::ExplainRow>& rows, const std::string& stack) {
  fmt::print("{:>2}  {:<48} {:>8} {:>10} {:>8} {:>6} {:>7} {:>5} {:>7} {:>8}\n", "#", "technique", "step s",
             "tokens/s", "per GPU", "MFU", "mem GiB", "fits", "comm s", "removed");
  for (size_t i = 0; i < rows.size(); ++i) {
    const planner::ExplainRow& r = rows[i];
    const std::string name = r.technique + (r.in_plan ? "" : " (not in plan)");
    if (!r.valid()) {
      fmt::print("{:>2}  {:<48} cannot run: {}\n", i + 1, name, r.reason);
      continue;
    }
    const Prediction& p = r.prediction;
    const char* fits = p.memory.tight() ? "tight" : p.memory.fits() ? "yes" : "no";
    fmt::print("{:>2}  {:<48} {:>8.3f} {:>10.0f} {:>8.1f} {:>5.1f}% {:>7.1f} {:>5} {:>7.3f} {:>8}{}\n", i + 1,
               name, p.step_time_s, p.tokens_per_s, p.tokens_per_s_per_gpu, 100 * p.mfu,
               p.memory.total() / kGiB, fits, r.exposed_comm_s,
               r.comm_removed_s ? fmt::format("{:.3f}", *r.comm_removed_s) : std::string("-"),
               p.provenance.hypothetical ? "  HYPOTHETICAL" : "");
  }
  fmt::print(
      "\nmem GiB: the busiest stage's HBM need, the middle of its range; fits: yes, tight (the low end of "
      "the "
      "range fits, the high end does not) or no\n");
  fmt::print("\nplans of the rows:\n");
  for (size_t i = 0; i < rows.size(); ++i) fmt::print("{:>2}  {}\n", i + 1, planner::describe(rows[i].plan));
  bool header = false;
  for (size_t i = 0; i < rows.size(); ++i) {
    const planner::ExplainRow& r = rows[i];
    const bool fit_reason = r.valid() && !r.reason.empty();
    if (r.note.empty() && !fit_reason) continue;
    if (!header) fmt::print("\nnotes:\n");
    header = true;
    if (!r.note.empty()) fmt::print("{:>2}  {}\n", i + 1, r.note);
    if (fit_reason) fmt::print("{:>2}  {}\n", i + 1, r.reason);
  }
  std::vector<const Prediction*> ran;
  for (const planner::ExplainRow& r : rows) {
    if (r.valid()) ran.push_back(&r.prediction);
  }
  print_hypothetical(ran, stack);
}

}  // namespace

Runner add_explain(CLI::App& app) {
  struct Options {
    std::string plan, stack, hardware;
    bool json = false;
  };
  auto o = std::make_shared<Options>();
  app.add_option("plan", o->plan, "Plan file (JSON)")->required();
  app.add_option("--stack", o->stack,
                 "Software stack profile (overrides the plan's; default " + std::string(kDefaultStack) + ")");
  app.add_option(
      "--hardware", o->hardware,
      "Hardware profile (overrides the plan's), e.g. one `moeplan calibrate` fitted on the cluster");
  app.add_flag("--json", o->json, "Print one JSON object");
  app.footer(
      "Rows (cumulative): 1 baseline: attention TP = tp*sp, experts ep 1 and etp = ep*etp (or the nearest "
      "legal split), no overlap, FP32 reduce-scatter gradients, BF16 dispatch, full recompute (none if the "
      "plan has none); 2 + the plan's attention and experts; 3 + inter-operator, DP and PP overlap; 4 + "
      "intra-operator overlap; 5 + compression; 6 + the plan's recompute. When the plan overlaps across "
      "micro-batches (Megatron's combined 1F1B, which cannot run with full recompute) and the baseline "
      "recomputes whole layers, the plan's recompute is row 3 and the overlap and compression rows follow. "
      "Pipeline, ZeRO, micro-batch, precision and batch stay as the plan's throughout.");
  return [o]() {
    Result<PlanInputs> in = load_plan_inputs(o->plan, o->stack, o->hardware);
    if (!in) return bad_input(in.error().message);
    const auto& [plan, model, hw, path] = in.value().loaded;
    const StackProfile& stack = in.value().stack;
    const workload::RoutingDistribution& routing = in.value().routing;

    const std::vector<Violation> broken = validate(plan, model, hw);
    if (!broken.empty()) {
      if (o->json) {
        nlohmann::json v = nlohmann::json::array();
        for (const Violation& b : broken) v.push_back({{"rule", b.rule}, {"reason", b.reason}});
        print_json(
            {{"plan_file", path}, {"valid", false}, {"violations", v}, {"rows", nlohmann::json::array()}});
      } else {
        fmt::print("{}: the plan cannot run, {} rule(s) broken:\n", path, broken.size());
        for (const Violation& b : broken) fmt::print("  {}: {}\n", b.rule, b.reason);
      }
      return kExitInfeasible;
    }

    const std::vector<planner::ExplainRow> rows = planner::explain(model, plan, hw, stack, routing);
    const Prediction& last = rows.back().prediction;
    if (o->json) {
      nlohmann::json out = nlohmann::json::array();
      for (size_t i = 0; i < rows.size(); ++i) out.push_back(row_json(i, rows[i]));
      print_json({{"plan_file", path},
                  {"model", model.name},
                  {"hardware", hw.name},
                  {"stack", stack.name},
                  {"valid", true},
                  {"plan", io::plan_to_json(plan)},
                  {"rows", out}});
    } else {
      fmt::print("{} on {} x {} ({} stack{}): {}\n", model.name, plan.gpus, hw.name, stack.name,
                 stack.calibrated ? "" : ", uncalibrated assumptions", planner::describe(plan));
      fmt::print(
          "each technique of the plan added in turn to a TP-only baseline (MegaScale-MoE's ablation):\n\n");
      print_table(rows, stack.name);
    }
    if (!last.memory.fits()) return does_not_fit(last.memory);
    return kExitOk;
  };
}

}  // namespace moeplan::cli
