// Benchmark of one simulated training step: wall time per phase (lower, cost, event simulation, critical
// path), events per second and peak memory, for the reference cases and for growing GPU and
// micro-batch counts. Usage: moeplan_simulate_bench [repeats=5]. Single-threaded by construction.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <fmt/format.h>

#include "simulator/io/hardware_loader.h"
#include "simulator/io/model_loader.h"
#include "simulator/io/stack_loader.h"
#include "simulator/predict/predict.h"
#include "simulator/workload/lower.h"

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
  double total = 0, lower = 0, engine = 0, critical = 0;
  size_t ops = 0;
  int64_t events = 0;
  double step = 0;
};

Timing run_once(const ModelSpec& m, const Plan& p, const HardwareProfile& hw, const StackProfile& st) {
  Timing t;
  const auto routing = workload::uniform_routing(m.moe.num_experts);
  auto t0 = Clock::now();
  const Prediction pr = predict(m, p, hw, st, routing, {.critical_path = true});
  t.total = seconds_since(t0);
  if (!pr.violations.empty()) {
    std::fprintf(stderr, "bench plan invalid: %s\n", pr.violations.front().reason.c_str());
    std::exit(1);
  }
  t.ops = pr.graph.ops.size();
  t.events = pr.timeline.events;
  t.step = pr.step_time_s;
  // Phase timings, measured separately on the same inputs.
  t0 = Clock::now();
  const OpGraph g = lower(m, p, {.gpus_per_node = 8, .expert_load_scale = 1.0, .dropped_fraction = 0.0});
  t.lower = seconds_since(t0);
  engine::EngineOptions eo;
  t0 = Clock::now();
  const auto tl = engine::simulate(pr.graph, pr.costs, eo);
  t.engine = seconds_since(t0);
  t0 = Clock::now();
  (void)engine::critical_path(tl);
  t.critical = seconds_since(t0);
  return t;
}

Timing median_of(int repeats, const ModelSpec& m, const Plan& p, const HardwareProfile& hw,
                 const StackProfile& st) {
  std::vector<Timing> runs;
  for (int i = 0; i < repeats; ++i) runs.push_back(run_once(m, p, hw, st));
  std::sort(runs.begin(), runs.end(), [](const Timing& a, const Timing& b) { return a.total < b.total; });
  return runs[runs.size() / 2];
}

void row(const char* name, const Timing& t) {
  fmt::print("{:<44} {:>8} {:>9.1f} {:>8.1f} {:>8.1f} {:>8.1f} {:>10.2f} {:>9.3f}\n", name, t.ops,
             t.total * 1e3, t.lower * 1e3, t.engine * 1e3, t.critical * 1e3,
             static_cast<double>(t.events) / t.engine / 1e6, t.step);
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

}  // namespace

int main(int argc, char** argv) {
  const int repeats = argc > 1 ? std::max(1, std::atoi(argv[1])) : 5;
  moeplan::retain_freed_memory();
  const HardwareProfile h800 = io::load_hardware("h800-sxm").value();
  const StackProfile moerun = io::load_stack("moerun").value();
  const StackProfile deepep = io::load_stack("megatron-core-deepep").value();
  const ModelSpec m352 = io::load_model("internal-352b").value();
  const ModelSpec v3 = io::load_model("deepseek-v3").value();

  fmt::print("{:<44} {:>8} {:>9} {:>8} {:>8} {:>8} {:>10} {:>9}\n", "case", "ops", "total_ms", "lower",
             "engine", "critpath", "Mevents/s", "step_s");
  const Timing ref = median_of(repeats, m352, internal_352b(1440, 720), h800, moerun);
  row("Internal-352B 1440 GPUs SP8 EP8 PP15 gb720", ref);
  const double rss_after_ref = peak_rss_mb();

  Plan dsv3;
  dsv3.gpus = 16384;
  dsv3.seq_len = 4096;
  dsv3.global_batch = 15360;
  dsv3.experts.ep = 64;
  dsv3.experts.dispatch = Dispatch::kDedup;
  dsv3.pipeline.pp = 16;
  dsv3.pipeline.layers_per_stage = {3, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 2};
  dsv3.overlap = {false, false, true, true};
  dsv3.precision = Precision::kFp8;
  dsv3.fp8_recipe = Fp8Recipe::kBlockwise;
  dsv3.recompute = Recompute::kFull;
  // Node-deduplicated dispatch: Megatron-Core with DeepEP (moerun has no deduplicated dispatch).
  row("DeepSeek-V3 16384 GPUs EP64 PP16 gb15360 (deepep)", median_of(repeats, v3, dsv3, h800, deepep));
  dsv3.global_batch = 15360 * 8;
  row("DeepSeek-V3 16384 GPUs EP64 PP16 gb122880 (deepep)", median_of(repeats, v3, dsv3, h800, deepep));

  fmt::print("\nscaling with GPUs (Internal-352B, global batch 720; micro-batches = 720 / dp):\n");
  for (int64_t gpus : {240, 480, 720, 960, 1440}) {
    row(fmt::format("  {} GPUs", gpus).c_str(),
        median_of(repeats, m352, internal_352b(gpus, 720), h800, moerun));
  }
  fmt::print("\nscaling with micro-batches (Internal-352B, 1440 GPUs, dp 12):\n");
  for (int64_t gb : {180, 360, 720, 1440, 2880}) {
    row(fmt::format("  global batch {} ({} micro-batches)", gb, gb / 12).c_str(),
        median_of(repeats, m352, internal_352b(1440, gb), h800, moerun));
  }
  fmt::print("\npeak RSS after the Internal-352B reference case: {:.1f} MB; at the end: {:.1f} MB\n",
             rss_after_ref, peak_rss_mb());
  return 0;
}
