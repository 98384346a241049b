// `moeplan sweep`: what-if over one variable. Each value re-plans (the best plan of the search) or, with
// --plan, re-simulates a fixed plan; one table row per value, as text, CSV or JSON.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include <fmt/format.h>

#include "planner/cli/cli_common.h"
#include "planner/explain.h"
#include "planner/search.h"
#include "planner/sweep.h"
#include "simulator/core/units.h"
#include "simulator/io/hardware_loader.h"
#include "simulator/io/json_reader.h"
#include "simulator/io/model_loader.h"
#include "simulator/io/plan_io.h"
#include "simulator/io/router_trace.h"
#include "simulator/io/stack_loader.h"

namespace moeplan::cli {
namespace {

std::string keys_help() {
  std::string s = "KEY=V1,V2,...: the variable and its values. Keys:\n";
  for (const planner::SweepKey& k : planner::sweep_keys()) s += fmt::format("  {:<14} {}\n", k.name, k.help);
  s += "  PLAN KEY       any key of --fix (experts.ep, pipeline.pp, micro_batch, overlap.intra_op,\n"
       "                 routing.distribution, ...): set on the --plan, else pinned as --fix KEY=V\n"
       "Bandwidth factors (0.5, 1, 2) scale bandwidth terms only; latencies stay.";
  return s;
}

// A CSV cell: quoted when it holds a comma, a quote or a line break.
std::string csv_cell(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

nlohmann::json row_json(const planner::SweepRow& r) {
  nlohmann::json j = {
      {"value", r.value},
      {"layout", r.plan ? nlohmann::json(planner::describe(*r.plan)) : nlohmann::json(nullptr)},
      {"plan", r.plan ? io::plan_to_json(*r.plan) : nlohmann::json(nullptr)},
      {"reason", r.reason.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.reason)},
      {"predicted", nullptr}};
  if (r.has_numbers()) {
    const Prediction& p = r.prediction;
    j["predicted"] = {{"step_time_s", p.step_time_s},
                      {"tokens_per_s", p.tokens_per_s},
                      {"tokens_per_s_per_gpu", p.tokens_per_s_per_gpu},
                      {"mfu", p.mfu},
                      {"memory_per_gpu_bytes", p.memory.total()},
                      {"memory_per_gpu_bytes_range", {p.memory.total_low(), p.memory.total_high()}},
                      {"memory_fits", p.memory.fits()},
                      {"memory_tight", p.memory.tight()},
                      {"exposed_comm_s", planner::exposed_comm_seconds(p)},
                      {"bubble_s", p.breakdown.bubble},
                      {"hypothetical", p.provenance.hypothetical},
                      {"why_hypothetical", p.provenance.targets}};
  }
  return j;
}

void print_csv(const std::string& key, const std::vector<planner::SweepRow>& rows) {
  fmt::print(
      "{},layout,tokens_per_s,tokens_per_s_per_gpu,mfu,step_time_s,memory_per_gpu_gib,memory_fits,"
      "exposed_comm_s,bubble_s,hypothetical,reason\n",
      key);
  for (const planner::SweepRow& r : rows) {
    const std::string value = csv_cell(planner::vary_value_text(r.value));
    const std::string layout = r.plan ? csv_cell(planner::describe(*r.plan)) : "";
    if (!r.has_numbers()) {
      fmt::print("{},{},,,,,,,,,,{}\n", value, layout, csv_cell(r.reason));
      continue;
    }
    const Prediction& p = r.prediction;
    fmt::print("{},{},{:.1f},{:.2f},{:.4f},{:.6f},{:.3f},{},{:.6f},{:.6f},{},{}\n", value, layout,
               p.tokens_per_s, p.tokens_per_s_per_gpu, p.mfu, p.step_time_s, p.memory.total() / kGiB,
               p.memory.fits() ? "true" : "false", planner::exposed_comm_seconds(p), p.breakdown.bubble,
               p.provenance.hypothetical ? "true" : "false", csv_cell(r.reason));
  }
}

void print_text(const std::string& key, const std::vector<planner::SweepRow>& rows) {
  size_t w = key.size(), lw = 6;
  for (const planner::SweepRow& r : rows) {
    w = std::max(w, planner::vary_value_text(r.value).size());
    if (r.has_numbers()) lw = std::max(lw, planner::describe(*r.plan).size());
  }
  fmt::print("{:<{}}  {:<{}} {:>10} {:>9} {:>6} {:>7} {:>7} {:>7} {:>8}\n", key, w, "layout", lw, "tokens/s",
             "per GPU", "MFU", "step s", "mem GiB", "comm s", "bubble s");
  for (const planner::SweepRow& r : rows) {
    const std::string value = planner::vary_value_text(r.value);
    if (!r.has_numbers()) {
      fmt::print("{:<{}}  {}\n", value, w, r.reason);
      continue;
    }
    const Prediction& p = r.prediction;
    fmt::print("{:<{}}  {:<{}} {:>10.0f} {:>9.1f} {:>5.1f}% {:>7.3f} {:>7.1f} {:>7.3f} {:>8.3f}{}\n", value,
               w, planner::describe(*r.plan), lw, p.tokens_per_s, p.tokens_per_s_per_gpu, 100 * p.mfu,
               p.step_time_s, p.memory.total() / kGiB, planner::exposed_comm_seconds(p), p.breakdown.bubble,
               (r.reason.empty() ? "" : "  (" + r.reason + ")") +
                   (p.provenance.hypothetical ? "  HYPOTHETICAL" : ""));
  }
}

// The knee of a GPU sweep: where tokens/s per GPU falls below 80 % of the smallest count's.
void print_knee(const std::vector<planner::SweepRow>& rows) {
  const planner::GpuScaling g = planner::gpu_scaling(rows);
  fmt::print("\nscaling (tokens/s per GPU against the first row):");
  for (size_t i = 0; i < rows.size(); ++i) {
    if (g.efficiency[i]) {
      fmt::print(" {} GPUs {:.0f}%", planner::vary_value_text(rows[i].value), 100 * *g.efficiency[i]);
    }
  }
  fmt::print("\n");
  if (!g.knee) return;
  if (g.knee_in_range) {
    fmt::print(
        "knee: {} GPUs, the last count at which each GPU keeps >= {:.0f}% of the first row's rate; beyond "
        "it, added GPUs buy less\n",
        planner::vary_value_text(rows[*g.knee].value), 100 * g.threshold);
  } else {
    fmt::print("no knee in the swept range: every count keeps >= {:.0f}% of the first row's per-GPU rate\n",
               100 * g.threshold);
  }
}

}  // namespace

Runner add_sweep(CLI::App& app) {
  struct Options {
    std::string model = kDefaultModel, hardware = kDefaultHardware, stack, routing = "uniform";
    int64_t gpus = kDefaultGpus, seq = kDefaultSeq, batch = kDefaultBatch;
    std::vector<std::string> fix;
    std::string precision = "any";
    std::string vary, plan;
    int threads = 2;
    bool csv = false, json = false;
  };
  auto o = std::make_shared<Options>();
  app.add_option("--vary", o->vary, keys_help())->required();
  CLI::Option* plan = app.add_option(
      "--plan", o->plan, "Re-simulate this fixed plan file with each value instead of re-planning");
  auto replan_only = [&](CLI::Option* opt) { opt->excludes(plan); };
  replan_only(app.add_option("--model,-m", o->model, "Model: a config.json path or a built-in name")
                  ->capture_default_str());
  CLI::Option* hardware =
      app.add_option("--hardware", o->hardware,
                     "Hardware profile: a path or a built-in name (with --plan, overrides the plan's)")
          ->capture_default_str();
  app.add_option("--stack", o->stack,
                 "Software stack that will run the plan (default " + std::string(kDefaultStack) +
                     "; with --plan, overrides the plan's)");
  replan_only(app.add_option("--gpus", o->gpus, "GPUs")
                  ->capture_default_str()
                  ->check(CLI::Range(int64_t{1}, int64_t{1} << 20)));
  replan_only(app.add_option("--seq-len,-s", o->seq, "Sequence length, tokens")
                  ->capture_default_str()
                  ->check(CLI::Range(int64_t{1}, int64_t{1} << 24)));
  replan_only(app.add_option("--global-batch,-b", o->batch, "Global batch, sequences")
                  ->capture_default_str()
                  ->check(CLI::Range(int64_t{1}, int64_t{1} << 30)));
  replan_only(app.add_option("--fix", o->fix, "Pin a plan key, e.g. --fix experts.ep=8 (repeatable)"));
  replan_only(app.add_option("--precision", o->precision, "Restrict precision: bf16, fp8 or any")
                  ->capture_default_str()
                  ->check(CLI::IsMember({"bf16", "fp8", "any"})));
  replan_only(
      app.add_option("--routing", o->routing, "Token routing: uniform, zipf:<s>, or a router-trace file")
          ->capture_default_str());
  app.add_option("--threads", o->threads,
                 "Worker threads of the search (with --plan: of each simulated step)")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  CLI::Option* csv = app.add_flag("--csv", o->csv, "Print a CSV header and one line per value");
  app.add_flag("--json", o->json, "Print one JSON object {vary: {key, values}, rows: [...]}")->excludes(csv);
  return [o, hardware]() {
    const bool fixed = !o->plan.empty();
    Result<planner::Vary> vary = planner::parse_vary(o->vary, fixed);
    if (!vary) return bad_input(vary.error().message);
    if (o->batch > kMaxGlobalBatch) {
      return bad_input(fmt::format("--global-batch {}: {}", o->batch, kGlobalBatchTooLarge));
    }

    planner::SweepCase base;
    std::string label;  // the first line of the text table
    if (fixed) {
      // The plan's own routing must resolve; a value that breaks it later (experts) is a row's reason.
      Result<PlanInputs> in = load_plan_inputs(o->plan, o->stack, hardware->count() > 0 ? o->hardware : "");
      if (!in) return bad_input(in.error().message);
      io::LoadedPlan& lp = in.value().loaded;
      base.model = std::move(lp.model);
      base.hw = std::move(lp.hardware);
      base.stack = std::move(in.value().stack);
      base.routing_base = in.value().dir;
      base.plan = std::move(lp.plan);
      label = fmt::format("{} on {} x {} ({} stack{}), plan {} ({}), varying {}", base.model.name,
                          base.plan->gpus, base.hw.name, base.stack.name,
                          base.stack.calibrated ? "" : ", uncalibrated", lp.path,
                          planner::describe(*base.plan), vary.value().key);
    } else {
      Result<ModelSpec> model = io::load_model(o->model);
      if (!model) return bad_input(model.error().message);
      Result<HardwareProfile> hw = io::load_hardware(o->hardware);
      if (!hw) return bad_input(hw.error().message);
      Result<StackProfile> stack = io::load_stack(o->stack.empty() ? kDefaultStack : o->stack);
      if (!stack) return bad_input(stack.error().message);
      if (auto r =
              io::routing_distribution(o->routing, std::max<int64_t>(1, model.value().moe.num_experts), "");
          !r) {
        return bad_input(r.error().message);
      }
      Result<planner::SearchSpace> space = search_space(o->precision, o->fix);
      if (!space) return bad_input(space.error().message);
      base.space = std::move(space).value();
      base.model = std::move(model).value();
      base.hw = std::move(hw).value();
      base.stack = std::move(stack).value();
      base.job = {o->gpus, o->seq, o->batch};
      base.routing = o->routing;
      label = fmt::format("{} on {} x {} ({} stack{}), seq {}, global batch {}: best plan per value of {}",
                          base.model.name, o->gpus, base.hw.name, base.stack.name,
                          base.stack.calibrated ? "" : ", uncalibrated", o->seq, o->batch, vary.value().key);
    }

    planner::SweepOptions opts;
    opts.search.threads = o->threads;
    const bool tty = isatty(STDERR_FILENO) && !o->json && !o->csv;
    if (tty) {
      opts.progress = [](size_t done, size_t total) {
        std::fprintf(stderr, "\rvalue %zu / %zu", done, total);
      };
    }
    std::vector<planner::SweepRow> rows = planner::sweep(base, vary.value(), opts);
    if (tty) std::fprintf(stderr, "\r%40s\r", "");
    if (!fixed) {
      // Row plans name the inputs the way plan files do, so each can be saved and simulated.
      for (planner::SweepRow& r : rows) {
        if (!r.plan) continue;
        r.plan->model = o->model;
        r.plan->hardware = o->hardware;
        r.plan->stack = o->stack.empty() ? kDefaultStack : o->stack;
      }
    }

    const std::string& key = vary.value().key;
    if (o->json) {
      nlohmann::json out = nlohmann::json::array();
      for (const planner::SweepRow& r : rows) out.push_back(row_json(r));
      nlohmann::json j = {{"vary", {{"key", key}, {"values", vary.value().values}}},
                          {"mode", fixed ? "fixed_plan" : "replan"},
                          {"model", base.model.name},
                          {"hardware", base.hw.name},
                          {"stack", base.stack.name},
                          {"rows", out}};
      if (key == "gpus") {
        const planner::GpuScaling g = planner::gpu_scaling(rows);
        for (size_t i = 0; i < rows.size(); ++i) {
          j["rows"][i]["scaling_efficiency"] = g.efficiency[i] ? nlohmann::json(*g.efficiency[i]) : nullptr;
        }
        j["knee"] = g.knee ? nlohmann::json{{"gpus", rows[*g.knee].value},
                                            {"in_range", g.knee_in_range},
                                            {"threshold", g.threshold}}
                           : nlohmann::json(nullptr);
      }
      if (fixed) {
        j["plan_file"] = o->plan;
      } else {
        j["job"] = {{"gpus", o->gpus}, {"seq_len", o->seq}, {"global_batch", o->batch}};
      }
      print_json(j);
    } else if (o->csv) {
      print_csv(key, rows);
    } else {
      fmt::print("{}\n\n", label);
      print_text(key, rows);
      if (key == "gpus") print_knee(rows);
      std::vector<const Prediction*> predicted;
      for (const planner::SweepRow& r : rows) {
        if (r.has_numbers()) predicted.push_back(&r.prediction);
      }
      print_hypothetical(predicted, base.stack.name);
    }
    return kExitOk;
  };
}

}  // namespace moeplan::cli
