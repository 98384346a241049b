// `moeplan plan`: which parallel layout, overlap, compression and recompute to run for a model, cluster and
// job. Prints the top plans ranked by simulated tokens/s and why the others were rejected; --html writes them
// as a report page.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>

#include <fmt/format.h>

#include "planner/cli/cli_common.h"
#include "planner/report/html_report.h"
#include "planner/search.h"
#include "simulator/core/model_notes.h"
#include "simulator/io/hardware_loader.h"
#include "simulator/io/json_reader.h"
#include "simulator/io/model_loader.h"
#include "simulator/io/plan_io.h"
#include "simulator/io/router_trace.h"
#include "simulator/io/stack_loader.h"
#include "simulator/predict/report.h"

namespace moeplan::cli {
namespace {

double exposed_comm(const Prediction& p) {
  double t = 0;
  for (const auto& [k, v] : p.breakdown.exposed_comm) t += v;
  return t;
}

nlohmann::json summary_json(const Prediction& p) {
  nlohmann::json comm;
  for (const auto& [k, v] : p.breakdown.exposed_comm) comm[k] = v;
  return {{"step_time_s", p.step_time_s},
          {"tokens_per_s", p.tokens_per_s},
          {"tokens_per_s_per_gpu", p.tokens_per_s_per_gpu},
          {"tokens_per_s_range", {p.tokens_per_s_low, p.tokens_per_s_high}},
          {"mfu", p.mfu},
          {"memory_per_gpu_bytes", p.memory.total()},
          {"memory_per_gpu_bytes_range", {p.memory.total_low(), p.memory.total_high()}},
          {"memory_fits", p.memory.fits()},
          {"memory_tight", p.memory.tight()},
          {"exposed_comm_s", comm.is_null() ? nlohmann::json::object() : comm},
          {"bubble_s", p.breakdown.bubble},
          {"extrapolations", p.extrapolations},
          {"hypothetical", p.provenance.hypothetical},
          {"why_hypothetical", p.provenance.targets}};
}

}  // namespace

Runner add_plan(CLI::App& app) {
  struct Options {
    std::string model = kDefaultModel, hardware = kDefaultHardware, stack = "moerun", routing = "uniform";
    int64_t gpus = kDefaultGpus, seq = kDefaultSeq, batch = kDefaultBatch, top = 5;
    std::vector<std::string> fix;
    std::string precision = "any";
    std::string out_dir, html;
    int threads = 2;
    bool json = false;
  };
  auto o = std::make_shared<Options>();
  app.add_option("--model,-m", o->model, "Model: a config.json path or a built-in name")
      ->capture_default_str();
  app.add_option("--hardware", o->hardware, "Hardware profile: a path or a built-in name")
      ->capture_default_str();
  app.add_option("--stack", o->stack, "Software stack that will run the plan")->capture_default_str();
  app.add_option("--gpus", o->gpus, "GPUs")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--seq-len,-s", o->seq, "Sequence length, tokens")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  app.add_option("--global-batch,-b", o->batch, "Global batch, sequences")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  app.add_option("--top,-k", o->top, "Plans to print")->capture_default_str()->check(CLI::Range(1, 1000));
  app.add_option("--fix", o->fix,
                 "Pin a plan key, e.g. --fix experts.ep=8 --fix pipeline.pp=15 (repeatable)");
  app.add_option("--precision", o->precision, "Restrict precision: bf16, fp8 or any")
      ->capture_default_str()
      ->check(CLI::IsMember({"bf16", "fp8", "any"}));
  app.add_option("--routing", o->routing, "Token routing: uniform, zipf:<s>, or a router-trace file")
      ->capture_default_str();
  app.add_option("--threads", o->threads, "Worker threads")->capture_default_str()->check(CLI::Range(1, 64));
  app.add_option("--out-dir", o->out_dir,
                 "Write each top plan as a plan file with its report and trace here");
  app.add_option("--html", o->html,
                 "Write a self-contained HTML report (top plans, the best plan's breakdown, memory and "
                 "timeline) to this file");
  app.add_flag("--json", o->json, "Print one JSON object");
  return [o]() {
    // Checked before the search, which can take minutes; write_file_atomic reports any other failure.
    const std::filesystem::path html_dir = std::filesystem::path(o->html).parent_path();
    if (!o->html.empty() && !html_dir.empty() && !std::filesystem::is_directory(html_dir)) {
      return bad_input(fmt::format("{}: cannot write (directory missing or not writable)", o->html));
    }
    Result<ModelSpec> model = io::load_model(o->model);
    if (!model) return bad_input(model.error().message);
    Result<HardwareProfile> hw = io::load_hardware(o->hardware);
    if (!hw) return bad_input(hw.error().message);
    Result<StackProfile> stack = io::load_stack(o->stack);
    if (!stack) return bad_input(stack.error().message);
    Result<cost::RoutingDistribution> routing =
        io::routing_distribution(o->routing, std::max<int64_t>(1, model.value().moe.num_experts), "");
    if (!routing) return bad_input(routing.error().message);

    Result<planner::SearchSpace> parsed = search_space(o->precision, o->fix);
    if (!parsed) return bad_input(parsed.error().message);
    const planner::SearchSpace& space = parsed.value();

    planner::Job job{o->gpus, o->seq, o->batch};
    planner::SearchOptions opts;
    opts.top = o->top;
    opts.threads = o->threads;
    opts.keep_graphs = !o->out_dir.empty();
    const bool tty = isatty(STDERR_FILENO) && !o->json;
    if (tty) {
      opts.progress = [](int64_t done, int64_t total) {
        std::fprintf(stderr, "\rscreening %lld / %lld plans", static_cast<long long>(done),
                     static_cast<long long>(total));
      };
    }
    planner::SearchResult r =
        planner::search(model.value(), hw.value(), stack.value(), routing.value(), job, space, opts);
    if (tty) std::fprintf(stderr, "\r%60s\r", "");
    for (auto& rp : r.plans) {
      rp.plan.model = o->model;
      rp.plan.hardware = o->hardware;
      rp.plan.stack = o->stack;
      rp.plan.routing.distribution = o->routing;
    }

    if (!o->out_dir.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(o->out_dir, ec);
      if (ec) return bad_input(fmt::format("{}: cannot create directory: {}", o->out_dir, ec.message()));
      for (size_t i = 0; i < r.plans.size(); ++i) {
        const auto& rp = r.plans[i];
        const std::string base = fmt::format("{}/plan{}", o->out_dir, i + 1);
        const ReportContext ctx{rp.plan, model.value(), hw.value(), stack.value()};
        nlohmann::json report = prediction_json(rp.prediction, ctx);
        report["plan"] = io::plan_to_json(rp.plan);
        for (const auto& [path, text] :
             {std::pair{base + ".json", io::plan_to_json(rp.plan).dump(2) + "\n"},
              std::pair{base + ".report.json", report.dump(2) + "\n"},
              std::pair{base + ".trace.json",
                        chrome_trace(rp.prediction.graph, rp.prediction.timeline.ops)}}) {
          Result<bool> w = write_file_atomic(path, text);
          if (!w) return bad_input(w.error().message);
        }
      }
    }

    if (!o->html.empty()) {
      // The detail section needs the best plan's timeline: predict it again unless the search kept it
      // (deterministic: the same numbers as the ranking).
      std::optional<Prediction> again;
      const Prediction* best = nullptr;
      if (!r.plans.empty()) {
        if (opts.keep_graphs) {
          best = &r.plans[0].prediction;
        } else {
          again = predict(model.value(), r.plans[0].plan, hw.value(), stack.value(), routing.value());
          best = &*again;
        }
      }
      const std::string page = report::plan_html({r, job, model.value(), hw.value(), stack.value(), best});
      Result<bool> w = write_file_atomic(o->html, page);
      if (!w) return bad_input(w.error().message);
    }

    if (o->json) {
      nlohmann::json plans = nlohmann::json::array();
      for (const auto& rp : r.plans) {
        plans.push_back({{"plan", io::plan_to_json(rp.plan)},
                         {"layout", planner::describe(rp.plan)},
                         {"predicted", summary_json(rp.prediction)}});
      }
      nlohmann::json out = {{"model", model.value().name},
                            {"hardware", hw.value().name},
                            {"stack", stack.value().name},
                            {"gpus", job.gpus},
                            {"seq_len", job.seq_len},
                            {"global_batch", job.global_batch},
                            {"plans", plans},
                            {"rejected", r.rejected},
                            {"candidates", r.enumerated},
                            {"legal", r.legal},
                            {"fitting", r.fitting},
                            {"screened", r.screened},
                            {"simulated", r.simulated},
                            {"elapsed_s", r.elapsed_s}};
      if (const auto notes = model_notes(model.value()); !notes.empty()) out["model_notes"] = notes;
      print_json(out);
      return r.plans.empty() ? kExitInfeasible : kExitOk;
    }

    fmt::print("{} on {} x {} ({} stack), seq {}, global batch {}\n", model.value().name, job.gpus,
               hw.value().name, stack.value().name, job.seq_len, job.global_batch);
    for (const auto& n : model_notes(model.value())) fmt::print("model: {}\n", n);
    fmt::print("{} plans enumerated, {} legal, {} fit in memory, {} screened, {} simulated in {:.2f} s\n\n",
               r.enumerated, r.legal, r.fitting, r.screened, r.simulated, r.elapsed_s);
    if (r.plans.empty()) {
      fmt::print("no plan fits.\n");
    } else {
      fmt::print("{:>2}  {:<62} {:>10} {:>8} {:>6} {:>7} {:>8} {:>7} {:>7}\n", "#", "layout", "tokens/s",
                 "per GPU", "MFU", "step s", "mem GB", "comm s", "bubble");
      for (size_t i = 0; i < r.plans.size(); ++i) {
        const Prediction& p = r.plans[i].prediction;
        fmt::print("{:>2}  {:<62} {:>10.0f} {:>8.1f} {:>5.1f}% {:>7.3f} {:>8.1f} {:>7.3f} {:>7.3f}{}{}\n",
                   i + 1, planner::describe(r.plans[i].plan), p.tokens_per_s, p.tokens_per_s_per_gpu,
                   100 * p.mfu, p.step_time_s, p.memory.total() / 1e9, exposed_comm(p), p.breakdown.bubble,
                   p.memory.fits() ? (p.memory.tight() ? "  (tight)" : "") : "  (does not fit)",
                   p.provenance.hypothetical ? "  HYPOTHETICAL" : "");
      }
    }
    // What makes the listed predictions hypothetical, once for the table.
    std::vector<std::string> targets;
    for (const auto& rp : r.plans) {
      for (const auto& t : rp.prediction.provenance.targets) {
        if (std::find(targets.begin(), targets.end(), t) == targets.end()) targets.push_back(t);
      }
    }
    if (!targets.empty()) {
      fmt::print("\nHYPOTHETICAL: these predictions credit capabilities the {} stack has not measured:\n",
                 stack.value().name);
      for (const auto& t : targets) fmt::print("  - {}\n", t);
    }
    if (!r.plans.empty()) {
      fmt::print(
          "\nMFU: model FLOPs (no recompute) / (step time x GPUs x dense BF16 peak); FP8 plans can exceed "
          "the "
          "BF16 ceiling.\n");
    }
    if (!r.rejected.empty()) {
      fmt::print("\nrejected:\n");
      for (const auto& [why, n] : r.rejected) fmt::print("  {:>8}  {}\n", n, why);
    }
    if (!r.plans.empty() && !stack.value().calibrated) {
      fmt::print(
          "\nnote: the {} stack profile is uncalibrated (public-measurement assumptions); see `moeplan "
          "simulate` on a plan for its extrapolations.\n",
          stack.value().name);
    }
    return r.plans.empty() ? kExitInfeasible : kExitOk;
  };
}

}  // namespace moeplan::cli
