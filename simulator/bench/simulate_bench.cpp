// Benchmark of one simulated training step: wall time of predict() (the periodic steady state where it
// applies) beside the same step simulated micro-batch by micro-batch, the ops each simulates and how far
// their step times differ, for the reference cases and for growing GPU and micro-batch counts; peak
// memory. `fitted_ms` is predict() with the hardware profile's cost-model fit (a few ms) done once
// beforehand, as the planner prices its finalists. Usage: moeplan_simulate_bench [repeats=5 [threads=1]] |
// --million [repeats [threads]] | --loop 352b|dsv3 [repeats [threads]] (one case's predict() alone, for
// a profiler). `threads` is predict()'s for the periodic steady state's runs; the whole
// step runs on one.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "simulator/io/hardware_loader.h"
#include "simulator/io/model_loader.h"
#include "simulator/io/stack_loader.h"
#include "simulator/predict/predict.h"

using namespace moeplan;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double peak_rss_mb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;
}

struct Timing {
  double total = 0, whole = 0;  // ms: predict() as simulate runs it, and with every micro-batch simulated
  double shared_fit = 0;        // ms: predict() with the hardware's cost-model fit done once beforehand
  int64_t ops = 0, simulated_ops = 0, micro_batches = 0, simulated_micro_batches = 0;
  double step = 0, whole_step = 0;
};

int g_threads = 1;

// `fit`: the hardware's cost-model fit, shared as the planner's finalists, sweeps and assumption checks share
// it; null: predict() fits the profile itself, as `moeplan simulate` does.
Prediction predict_once(const ModelSpec& m, const Plan& p, const HardwareProfile& hw, const StackProfile& st,
                        bool whole, double& seconds,
                        const std::shared_ptr<const cost::CostModel::HardwareFit>& fit = nullptr) {
  const auto routing = workload::uniform_routing(m.moe.num_experts);
  const auto t0 = Clock::now();
  Prediction pr =
      predict(m, p, hw, st, routing,
              {.critical_path = true, .whole_step = whole, .threads = g_threads, .hardware_fit = fit});
  seconds = seconds_since(t0);
  if (!pr.violations.empty()) {
    std::fprintf(stderr, "bench plan invalid: %s\n", pr.violations.front().reason.c_str());
    std::exit(1);
  }
  return pr;
}

// Medians over `repeats` of predict() (periodic steady state where it applies) and, with `whole`, of the same
// step simulated micro-batch by micro-batch.
Timing median_of(int repeats, const ModelSpec& m, const Plan& p, const HardwareProfile& hw,
                 const StackProfile& st, bool whole = true, bool shared_fit = true) {
  Timing t;
  std::vector<double> fast, slow, shared;
  const auto fit = shared_fit ? cost::CostModel::fit_hardware(hw) : nullptr;
  for (int i = 0; i < repeats; ++i) {
    double sec = 0;
    const Prediction pr = predict_once(m, p, hw, st, false, sec);
    fast.push_back(sec);
    if (shared_fit) {
      predict_once(m, p, hw, st, false, sec, fit);
      shared.push_back(sec);
    }
    t.ops = pr.ops_in_step;
    t.simulated_ops = pr.simulation.simulated_ops;
    t.micro_batches = pr.simulation.micro_batches;
    t.simulated_micro_batches = pr.simulation.simulated_micro_batches;
    t.step = pr.step_time_s;
    if (whole) {
      t.whole_step = predict_once(m, p, hw, st, true, sec).step_time_s;
      slow.push_back(sec);
    }
  }
  auto median = [](std::vector<double>& v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : 1e3 * v[v.size() / 2];
  };
  t.total = median(fast);
  t.shared_fit = median(shared);
  t.whole = median(slow);
  return t;
}

void header() {
  fmt::print("{:<48} {:>9} {:>9} {:>11} {:>9} {:>9} {:>9} {:>10} {:>9}\n", "case", "ops", "sim_ops",
             "mb sim/all", "total_ms", "fitted_ms", "whole_ms", "step_s", "rel_diff");
}

void row(const std::string& name, const Timing& t) {
  const std::string whole = t.whole > 0 ? fmt::format("{:.1f}", t.whole) : "-";
  const std::string fitted = t.shared_fit > 0 ? fmt::format("{:.1f}", t.shared_fit) : "-";
  const std::string diff =
      t.whole > 0 ? fmt::format("{:.1e}", std::abs(t.step - t.whole_step) / t.whole_step) : "-";
  fmt::print("{:<48} {:>9} {:>9} {:>11} {:>9.1f} {:>9} {:>9} {:>10.3f} {:>9}\n", name, t.ops, t.simulated_ops,
             fmt::format("{}/{}", t.simulated_micro_batches, t.micro_batches), t.total, fitted, whole, t.step,
             diff);
}

Plan internal_352b(int64_t gpus, int64_t global_batch) {
  Plan p;
  p.model = "internal-352b";
  p.hardware = "h800-sxm";
  p.gpus = gpus;
  p.seq_len = 8192;
  p.global_batch = global_batch;
  p.attention.sp = 8;
  p.experts.ep = 8;
  p.experts.dispatch = Dispatch::kAllGather;
  p.pipeline.pp = 15;
  p.overlap = {true, true, true, true};
  p.compression.grad_sync = GradSync::kBf16AllToAll;
  p.recompute = Recompute::kSar;
  return p;
}

Plan deepseek_v3(int64_t global_batch) {
  Plan p;
  p.gpus = 16384;
  p.seq_len = 4096;
  p.global_batch = global_batch;
  p.experts.ep = 64;
  p.experts.dispatch = Dispatch::kDedup;
  p.pipeline.pp = 16;
  p.pipeline.layers_per_stage = {3, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 2};
  p.overlap = {false, false, true, true};
  p.precision = Precision::kFp8;
  p.fp8_recipe = Fp8Recipe::kBlockwise;
  p.recompute = Recompute::kFull;
  return p;
}

}  // namespace

// `moeplan_simulate_bench [repeats=5 [threads]]`: the table; `moeplan_simulate_bench --million [repeats]`:
// only the global batch of 1,048,576 sequences as simulate predicts it, so that the peak RSS printed is
// that case's alone; `--loop 352b|dsv3 [repeats]`: that case's predict() alone, medians.
int main(int argc, char** argv) {
  const bool million = argc > 1 && std::strcmp(argv[1], "--million") == 0;
  const bool loop = argc > 1 && std::strcmp(argv[1], "--loop") == 0;
  const int arg = million ? 2 : loop ? 3 : 1;
  const int repeats = argc > arg ? std::max(1, std::atoi(argv[arg])) : 5;
  g_threads = argc > arg + 1 ? std::max(1, std::atoi(argv[arg + 1])) : 1;
  fmt::print("threads for the periodic runs: {}\n", g_threads);
  moeplan::retain_freed_memory();
  const HardwareProfile h800 = io::load_hardware("h800-sxm").value();
  const StackProfile moerun = io::load_stack("moerun").value();
  // Node-deduplicated dispatch: Megatron-Core with DeepEP (moerun has no deduplicated dispatch).
  const StackProfile deepep = io::load_stack("megatron-core-deepep").value();
  const ModelSpec m352 = io::load_model("internal-352b").value();
  const ModelSpec v3 = io::load_model("deepseek-v3").value();
  if (loop) {
    // A profiling aid: predict() of one case `repeats` times with the hardware fit shared, nothing else, so
    // that `perf record` sees only the periodic steady state's path.
    const bool dsv3 = argc > 2 && std::strcmp(argv[2], "dsv3") == 0;
    const int n = repeats;
    const ModelSpec& m = dsv3 ? v3 : m352;
    const Plan p = dsv3 ? deepseek_v3(122880) : internal_352b(1440, 720);
    const StackProfile& st = dsv3 ? deepep : moerun;
    const auto fit = cost::CostModel::fit_hardware(h800);
    std::vector<double> times;
    for (int i = 0; i < n; ++i) {
      double sec = 0;
      predict_once(m, p, h800, st, false, sec, fit);
      times.push_back(sec);
    }
    std::sort(times.begin(), times.end());
    fmt::print("{}: {} runs, median {:.2f} ms, least {:.2f} ms\n", dsv3 ? "dsv3 gb122880" : "352b 1440 GPUs",
               n, 1e3 * times[times.size() / 2], 1e3 * times.front());
    return 0;
  }
  header();
  if (million) {
    row("DeepSeek-V3 16384 GPUs gb1048576 (deepep)",
        median_of(repeats, v3, deepseek_v3(1048576), h800, deepep, false, false));
    fmt::print("peak RSS: {:.1f} MB\n", peak_rss_mb());
    return 0;
  }
  row("Internal-352B 1440 GPUs SP8 EP8 PP15 gb720",
      median_of(repeats, m352, internal_352b(1440, 720), h800, moerun));
  row("DeepSeek-V3 16384 GPUs EP64 PP16 gb15360 (deepep)",
      median_of(repeats, v3, deepseek_v3(15360), h800, deepep));
  row("DeepSeek-V3 16384 GPUs EP64 PP16 gb122880 (deepep)",
      median_of(repeats, v3, deepseek_v3(122880), h800, deepep));

  fmt::print("\nscaling with GPUs (Internal-352B, global batch 720; micro-batches = 720 / dp):\n");
  for (int64_t gpus : {240, 480, 720, 960, 1440}) {
    row(fmt::format("  {} GPUs", gpus), median_of(repeats, m352, internal_352b(gpus, 720), h800, moerun));
  }
  fmt::print("\nscaling with micro-batches (Internal-352B, 1440 GPUs, dp 12):\n");
  for (int64_t gb : {180, 360, 720, 1440, 2880, 11520, 46080}) {
    row(fmt::format("  global batch {} ({} micro-batches)", gb, gb / 12),
        median_of(repeats, m352, internal_352b(1440, gb), h800, moerun, gb <= 11520));
  }
  fmt::print("\npeak RSS at the end: {:.1f} MB\n", peak_rss_mb());
  return 0;
}
