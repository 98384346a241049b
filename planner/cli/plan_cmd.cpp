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
#include "planner/launch.h"
#include "planner/report/html_report.h"
#include "planner/search.h"
#include "simulator/core/model_notes.h"
#include "simulator/core/units.h"
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
          {"mfu_peak_dtype", p.mfu_peak_dtype},
          {"mfu_bf16_equivalent", p.mfu_bf16},
          {"memory_per_gpu_bytes", p.memory.total()},
          {"memory_per_gpu_bytes_range", {p.memory.total_low(), p.memory.total_high()}},
          {"memory_fits", p.memory.fits()},
          {"memory_tight", p.memory.tight()},
          {"exposed_comm_s", comm.is_null() ? nlohmann::json::object() : comm},
          {"exposed_comm_total_s", exposed_comm(p)},
          {"bubble_s", p.breakdown.bubble},
          {"extrapolations", p.extrapolations},
          {"hypothetical", p.provenance.hypothetical},
          {"why_hypothetical", p.provenance.targets}};
}

// A relative margin as a percentage with the digits it needs: "5.9%", "0.04%", "under 0.01%".
std::string margin_text(double margin) {
  const double pct = 100 * margin;
  if (pct >= 0.095) return fmt::format("{:.1f}%", pct);
  if (pct >= 0.005) return fmt::format("{:.2f}%", pct);
  return "under 0.01%";
}

// Whether #1 stays first with each unmeasured stack or hardware number alone at either end of its range.
void print_ranking(const AssumptionRanking& ranking, size_t listed) {
  if (listed < 2 || ranking.ends == 0) return;
  // Plans listed after #1 although faster as given: the ranking put them there for memory (tight, or not
  // fitting), not for the stack's numbers.
  std::string faster;
  for (size_t p : ranking.faster_as_given) faster += fmt::format("{}#{}", faster.empty() ? "" : ", ", p + 1);
  const size_t compared = listed - ranking.faster_as_given.size();
  if (!faster.empty()) {
    fmt::print("{} {} faster than #1 as given, listed after it for memory; {}\n", faster,
               ranking.faster_as_given.size() == 1 ? "is" : "are",
               compared < 2 ? "no other listed plan is left to compare" : "not counted below");
  }
  if (compared < 2) return;
  const char* counted = faster.empty() ? "" : " and counted";
  if (ranking.overtakes.empty()) {
    fmt::print(
        "#1 stays the fastest of the {} listed{} with each unmeasured stack or hardware number alone at "
        "either end of its range ({} ends)\n",
        compared, counted, ranking.ends);
    return;
  }
  fmt::print(
      "a plan listed after #1{} overtakes it at {} of the {} ends: the order rests on numbers nobody "
      "measured:\n",
      counted, ranking.overtakes.size(), ranking.ends);
  for (size_t i = 0; i < ranking.overtakes.size() && i < 4; ++i) {
    const RankOvertake& t = ranking.overtakes[i];
    fmt::print("  with {} = {}, #{} is {} faster\n", t.path, in_file_unit(t.at, t.unit), t.plan + 1,
               margin_text(t.faster));
  }
}

// Time and cost of training on `tokens` at a plan's predicted rate (and its range).
nlohmann::json time_to_train(const Prediction& p, int64_t gpus, double tokens, double gpu_hour_cost) {
  const auto hours = [&](double rate) { return rate > 0 ? tokens / rate / 3600.0 : 0.0; };
  nlohmann::json j = {{"tokens", tokens},
                      {"hours", hours(p.tokens_per_s)},
                      {"hours_range", {hours(p.tokens_per_s_high), hours(p.tokens_per_s_low)}},
                      {"gpu_hours", hours(p.tokens_per_s) * static_cast<double>(gpus)}};
  if (gpu_hour_cost > 0) j["cost"] = hours(p.tokens_per_s) * static_cast<double>(gpus) * gpu_hour_cost;
  return j;
}

std::string duration_text(double hours) {
  if (hours >= 48) return fmt::format("{:.1f} days", hours / 24);
  if (hours >= 1) return fmt::format("{:.1f} h", hours);
  return fmt::format("{:.0f} min", hours * 60);
}

// When nothing fits: the smallest memory need the search found, and the smallest GPU count (doubling the
// job's, up to 64x) at which some plan fits, from the memory test alone.
void print_nothing_fits(const planner::SearchResult& r, const ModelSpec& model, const HardwareProfile& hw,
                        const StackProfile& stack, const workload::RoutingDistribution& routing,
                        const planner::Job& job, const planner::SearchSpace& space, int threads) {
  if (!r.smallest_need_plan) {
    fmt::print("no plan fits: no legal plan for this job (see the rejections below).\n");
    return;
  }
  fmt::print("no plan fits: the smallest memory need found is {} per GPU against {} of HBM\n  ({})\n",
             human_bytes(r.smallest_need_bytes), human_bytes(r.capacity_bytes),
             planner::describe(*r.smallest_need_plan));
  planner::SearchOptions fit;
  fit.fit_only = true;
  fit.threads = threads;
  for (int64_t k = 2; k <= 64; k *= 2) {
    planner::Job bigger = job;
    bigger.gpus = job.gpus * k;
    const planner::SearchResult more = planner::search(model, hw, stack, routing, bigger, space, fit);
    if (more.fitting > 0) {
      fmt::print("  {} GPUs ({}x) give {} plans that fit: moeplan plan --gpus {} ...\n", bigger.gpus, k,
                 more.fitting, bigger.gpus);
      return;
    }
  }
  fmt::print(
      "  no plan fits at up to {} GPUs either: a shorter sequence, a smaller micro-batch or an FP8 "
      "plan may\n",
      job.gpus * 64);
}

}  // namespace

Runner add_plan(CLI::App& app) {
  struct Options {
    std::string model = kDefaultModel, hardware = kDefaultHardware, stack = kDefaultStack,
                routing = "uniform";
    int64_t gpus = kDefaultGpus, seq = kDefaultSeq, batch = kDefaultBatch, top = 5;
    std::vector<std::string> fix;
    std::string precision = "any";
    std::string out_dir, html;
    int threads = 2;
    bool json = false;
    bool list_keys = false, no_assumptions = false;
    double tokens = 0, gpu_hour_cost = 0;
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
  app.add_flag("--no-assumptions", o->no_assumptions,
               "Skip predicting the listed plans again with each unmeasured stack or hardware number at the "
               "ends of its range");
  app.add_flag("--list-keys", o->list_keys, "Print the plan keys --fix accepts, one per line, and exit");
  app.add_option("--tokens", o->tokens,
                 "Training tokens: adds time-to-train and GPU-hours per plan (e.g. 1e12)")
      ->check(CLI::Range(1.0, 1e18));
  app.add_option("--gpu-hour-cost", o->gpu_hour_cost,
                 "Price of one GPU-hour, for the cost column with --tokens")
      ->check(CLI::Range(0.0, 1e6));
  return [o]() {
    if (o->list_keys) {
      for (const std::string& k : planner::plan_keys()) fmt::print("{}\n", k);
      return kExitOk;
    }
    if (o->gpu_hour_cost > 0 && o->tokens <= 0) return bad_input("--gpu-hour-cost needs --tokens N");
    if (o->batch > kMaxGlobalBatch) {
      return bad_input(fmt::format("--global-batch {}: {}", o->batch, kGlobalBatchTooLarge));
    }
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
    Result<workload::RoutingDistribution> routing =
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
    opts.prefer_memory_margin = true;
    const bool tty = isatty(STDERR_FILENO) && !o->json;
    if (tty) {
      opts.progress = [](int64_t enumerated) {
        std::fprintf(stderr, "\rsearching: %lld plans enumerated", static_cast<long long>(enumerated));
      };
    }
    planner::SearchResult r =
        planner::search(model.value(), hw.value(), stack.value(), routing.value(), job, space, opts);
    if (tty) std::fprintf(stderr, "\r%60s\r", "");
    if (r.enumerated == 0 && !space.fixed.empty()) {
      // The pins left nothing to search: say which one, with the values the search has for it.
      return bad_input(planner::explain_unmatched_fix(model.value(), hw.value(), stack.value(), job, space));
    }
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
        // The plan file names its inputs (given relative to the working directory) as the loader resolves
        // them from the plan's folder.
        const Plan saved = planner::rebase_plan_paths(rp.plan, "", base + ".json");
        const ReportContext ctx{saved, model.value(), hw.value(), stack.value()};
        nlohmann::json report = prediction_json(rp.prediction, ctx);
        report["plan"] = io::plan_to_json(saved);
        // The trace shows the whole step: a prediction that added the steady phase's periods runs again,
        // micro-batch by micro-batch (the same step time).
        std::optional<Prediction> whole;
        if (rp.prediction.simulation.extrapolated) {
          whole = predict(model.value(), rp.plan, hw.value(), stack.value(), routing.value(),
                          {.critical_path = false, .whole_step = true, .op_summary = false});
        }
        const Prediction& traced = whole ? *whole : rp.prediction;
        std::string note;  // the default trace selection of a large step, said once per file
        const Result<TraceSelection> trace_sel = trace_selection(traced.graph, -1, "", &note);
        if (!trace_sel) return bad_input(trace_sel.error().message);
        if (!note.empty()) std::fprintf(stderr, "moeplan: %s.trace.json: %s\n", base.c_str(), note.c_str());
        for (const auto& [path, text] :
             {std::pair{base + ".json", io::plan_to_json(saved).dump(2) + "\n"},
              std::pair{base + ".report.json", report.dump(2) + "\n"},
              std::pair{base + ".trace.json",
                        chrome_trace(traced.graph, traced.timeline.ops, trace_sel.value())}}) {
          Result<bool> w = write_file_atomic(path, text);
          if (!w) return bad_input(w.error().message);
        }
      }
    }

    // What the ranking rests on: #1's step over the unmeasured numbers, and whether another listed
    // plan overtakes it with any one of them at either end of its range.
    std::optional<AssumptionRange> assumed;
    AssumptionRanking ranking;
    if (!r.plans.empty() && !o->no_assumptions) {
      std::vector<Plan> listed;
      std::vector<double> steps;
      for (const auto& rp : r.plans) {
        listed.push_back(rp.plan);
        steps.push_back(rp.prediction.step_time_s);
      }
      assumed = assumption_range(model.value(), listed[0], hw.value(), stack.value(), routing.value(),
                                 steps[0], o->threads);
      ranking = ranking_over_assumptions(model.value(), listed, steps, hw.value(), stack.value(),
                                         routing.value(), o->threads);
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
      report::HtmlOptions html;
      if (assumed)
        html.assumptions = assumptions_json(*assumed, r.plans[0].prediction.tokens_per_step, job.gpus);
      const std::string page =
          report::plan_html({r, job, model.value(), hw.value(), stack.value(), best}, html);
      Result<bool> w = write_file_atomic(o->html, page);
      if (!w) return bad_input(w.error().message);
    }

    if (o->json) {
      nlohmann::json plans = nlohmann::json::array();
      for (const auto& rp : r.plans) {
        nlohmann::json entry = {
            {"plan", io::plan_to_json(rp.plan)},
            {"layout", planner::describe(rp.plan)},
            {"predicted", summary_json(rp.prediction)},
            {"tied_with_best", planner::tied_with_best(r.plans[0].prediction, rp.prediction)}};
        if (o->tokens > 0) {
          entry["time_to_train"] = time_to_train(rp.prediction, job.gpus, o->tokens, o->gpu_hour_cost);
        }
        plans.push_back(std::move(entry));
      }
      nlohmann::json smallest = nullptr;
      if (r.smallest_need_plan) {
        smallest = {{"plan", io::plan_to_json(*r.smallest_need_plan)},
                    {"layout", planner::describe(*r.smallest_need_plan)},
                    {"memory_per_gpu_bytes_low", r.smallest_need_bytes}};
      }
      nlohmann::json out = {{"model", model.value().name},
                            {"hardware", hw.value().name},
                            {"stack", stack.value().name},
                            {"stack_calibrated", stack.value().calibrated},
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
                            {"cuda_graphs_tried", r.graph_tried},
                            {"cuda_graphs_kept", r.graph_kept},
                            {"faster_tight_unlisted", r.faster_tight_unlisted},
                            {"hbm_capacity_bytes", r.capacity_bytes},
                            {"smallest_memory_need", smallest},
                            {"elapsed_s", r.elapsed_s}};
      if (r.fastest_tight_unlisted) {
        const Prediction& p = r.fastest_tight_unlisted->prediction;
        out["fastest_tight_unlisted"] = {
            {"rank", r.fastest_tight_rank},
            {"layout", planner::describe(r.fastest_tight_unlisted->plan)},
            {"tokens_per_s_per_gpu", p.tokens_per_s_per_gpu},
            {"memory_per_gpu_bytes_range", {p.memory.total_low(), p.memory.total_high()}}};
      }
      if (const auto notes = model_notes(model.value()); !notes.empty()) out["model_notes"] = notes;
      if (assumed) {
        out["assumptions"] = assumptions_json(*assumed, r.plans[0].prediction.tokens_per_step, job.gpus);
        nlohmann::json overtakes = nlohmann::json::array();
        for (const RankOvertake& t : ranking.overtakes) {
          overtakes.push_back({{"number", t.path},
                               {"at", t.at / t.unit},
                               {"rank", t.plan + 1},
                               {"faster_than_first", t.faster}});
        }
        nlohmann::json faster = nlohmann::json::array();
        for (size_t p : ranking.faster_as_given) faster.push_back(p + 1);
        out["ranking_over_assumptions"] = {{"ends", ranking.ends},
                                           {"predictions", ranking.predictions},
                                           {"overtakes", overtakes},
                                           {"faster_as_given", faster}};
      }
      print_json(out);
      return r.plans.empty() ? kExitInfeasible : kExitOk;
    }

    fmt::print("{} on {} x {} ({} stack{}), seq {}, global batch {}\n", model.value().name, job.gpus,
               hw.value().name, stack.value().name, stack.value().calibrated ? "" : ", uncalibrated",
               job.seq_len, job.global_batch);
    for (const auto& n : model_notes(model.value())) fmt::print("model: {}\n", n);
    fmt::print("{} plans enumerated, {} legal, {} fit in memory, {} screened, {} simulated in {:.2f} s\n",
               r.enumerated, r.legal, r.fitting, r.screened, r.simulated, r.elapsed_s);
    if (r.graph_tried > 0) {
      fmt::print(
          "{} of them held up by the host simulated again with per-layer CUDA graphs (layout cg): {} faster "
          "with them (their memory priced as without)\n",
          r.graph_tried, r.graph_kept);
    }
    fmt::print("\n");
    if (r.plans.empty()) {
      print_nothing_fits(r, model.value(), hw.value(), stack.value(), routing.value(), job, space,
                         o->threads);
    } else {
      const Prediction& best = r.plans[0].prediction;
      // The layout column as wide as its longest entry, so the figures line up.
      size_t width = 6;
      for (const auto& rp : r.plans) width = std::max(width, planner::describe(rp.plan).size());
      fmt::print("{:>2}  {:<{}} {:>8} {:>13} {:>7} {:>6} {:>6} {:>7} {:>7} {:>7} {:>7}\n", "#", "layout",
                 width, "tok/s/GPU", "range", "vs #1", "MFU", "bf16", "step s", "mem GiB", "exp.com",
                 "bubble");
      for (size_t i = 0; i < r.plans.size(); ++i) {
        const Prediction& p = r.plans[i].prediction;
        const double g = static_cast<double>(job.gpus);
        const std::string vs = i == 0
                                   ? "best"
                                   : fmt::format("{:+.1f}%{}", 100 * (p.tokens_per_s / best.tokens_per_s - 1),
                                                 planner::tied_with_best(best, p) ? "=" : "");
        fmt::print(
            "{:>2}  {:<{}} {:>8.0f} {:>13} {:>7} {:>5.1f}% {:>5.1f}% {:>7.3f} {:>7.1f} {:>7.3f} "
            "{:>7.3f}{}{}\n",
            i + 1, planner::describe(r.plans[i].plan), width, p.tokens_per_s_per_gpu,
            fmt::format("{:.0f}-{:.0f}", p.tokens_per_s_low / g, p.tokens_per_s_high / g), vs, 100 * p.mfu,
            100 * p.mfu_bf16, p.step_time_s, p.memory.total() / kGiB, exposed_comm(p), p.breakdown.bubble,
            p.memory.fits()
                ? (p.memory.tight() ? fmt::format("  (tight: {:.1f}-{:.1f} GiB)", p.memory.total_low() / kGiB,
                                                  p.memory.total_high() / kGiB)
                                    : std::string())
                : std::string("  (does not fit)"),
            p.provenance.hypothetical ? "  HYPOTHETICAL" : "");
      }
      size_t tied = 0;
      for (const auto& rp : r.plans) tied += planner::tied_with_best(best, rp.prediction) ? 1 : 0;
      fmt::print(
          "\nrange: tokens/s/GPU at the ends of the cost model's fit errors. \"=\" after vs #1: the range "
          "overlaps #1's,\nso the model cannot tell the two apart ({} of the {} listed, #1 included); among "
          "such ties, plans\nwhose memory range fits wholly come before tight ones.\n",
          tied, r.plans.size());
      if (r.fastest_tight_unlisted) {
        const Prediction& p = r.fastest_tight_unlisted->prediction;
        fmt::print(
            "{} faster plan{} tied with #1 but tight {} not listed; the fastest, at #{} (--top {} lists it): "
            "{}, {:.0f} tok/s/GPU ({:+.1f}%), {:.1f}-{:.1f} GiB.\n",
            r.faster_tight_unlisted, r.faster_tight_unlisted == 1 ? "" : "s",
            r.faster_tight_unlisted == 1 ? "is" : "are", r.fastest_tight_rank, r.fastest_tight_rank,
            planner::describe(r.fastest_tight_unlisted->plan), p.tokens_per_s_per_gpu,
            100 * (p.tokens_per_s / best.tokens_per_s - 1), p.memory.total_low() / kGiB,
            p.memory.total_high() / kGiB);
      }
      fmt::print(
          "MFU: model FLOPs (no recompute) / (step time x GPUs x the dense peak of the plan's precision: FP8 "
          "for\nFP8 plans); bf16: the same against the dense BF16 peak. exp.com: communication seconds per "
          "step "
          "not\nhidden behind compute; bubble: pipeline idle seconds per step; mem GiB: the busiest stage's "
          "HBM need\n(of {} per GPU), the middle of its range; tight: the low end of the range fits, the "
          "high "
          "end does not.\n",
          human_bytes(hw.value().gpu.hbm_capacity_bytes.value));
      fmt::print("{}\n", planner::layout_legend());
      if (assumed) {
        fmt::print("\n#1 ");
        print_assumptions(*assumed, best.tokens_per_step, job.gpus);
        print_ranking(ranking, r.plans.size());
      }
      if (o->tokens > 0) {
        fmt::print("\ntime to train {:.3g} tokens:\n", o->tokens);
        for (size_t i = 0; i < r.plans.size(); ++i) {
          const nlohmann::json t =
              time_to_train(r.plans[i].prediction, job.gpus, o->tokens, o->gpu_hour_cost);
          fmt::print("  #{:<2} {} ({} - {}), {:.0f} GPU-hours{}\n", i + 1,
                     duration_text(t.at("hours").get<double>()),
                     duration_text(t.at("hours_range").at(0).get<double>()),
                     duration_text(t.at("hours_range").at(1).get<double>()), t.at("gpu_hours").get<double>(),
                     t.contains("cost") ? fmt::format(", cost {:.0f}", t.at("cost").get<double>()) : "");
        }
      }
    }
    // What makes the listed predictions hypothetical, once for the table.
    std::vector<const Prediction*> listed;
    for (const auto& rp : r.plans) listed.push_back(&rp.prediction);
    print_hypothetical(listed, stack.value().name);
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
    if (!r.plans.empty()) {
      fmt::print(
          "\nnext: moeplan plan ... --out-dir plans/   (writes plans/plan1.json ... with reports and "
          "traces),\n      then moeplan simulate plans/plan1.json and moeplan launch plans/plan1.json "
          "--for megatron\n");
    }
    return r.plans.empty() ? kExitInfeasible : kExitOk;
  };
}

}  // namespace moeplan::cli
