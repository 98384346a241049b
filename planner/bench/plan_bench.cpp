// Benchmark of the full plan search on the reference jobs: wall time on the given threads, plans
// enumerated, pruned (by reason), screened and simulated, and plans per second.
// Usage: moeplan_plan_bench [threads=2] [case...]; cases: 352b, dsv3, mixtral (on the moerun stack), qwen3
// (Qwen3-235B on 256 H100s on Megatron-Core with DeepEP, combined 1F1B in its space) (default: all).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "planner/search.h"
#include "simulator/core/units.h"
#include "simulator/io/hardware_loader.h"
#include "simulator/io/model_loader.h"
#include "simulator/io/stack_loader.h"

using namespace moeplan;

namespace {

struct Case {
  const char* key;
  const char* model;
  const char* hardware;
  planner::Job job;
  const char* stack = "moerun";
};

void run(const Case& c, int threads) {
  const ModelSpec model = io::load_model(c.model).value();
  const HardwareProfile hw = io::load_hardware(c.hardware).value();
  const StackProfile stack = io::load_stack(c.stack).value();
  const auto routing = workload::uniform_routing(std::max<int64_t>(1, model.moe.num_experts));
  planner::SearchOptions opts;
  opts.threads = threads;
  opts.top = 3;
  const auto t0 = std::chrono::steady_clock::now();
  const planner::SearchResult r = planner::search(model, hw, stack, routing, c.job, {}, opts);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fmt::print("{} on {} x {}, seq {}, global batch {}, {} stack ({} threads)\n", c.model, c.job.gpus,
             c.hardware, c.job.seq_len, c.job.global_batch, c.stack, threads);
  fmt::print(
      "  wall {:.2f} s: {} enumerated, {} legal, {} fit, {} screened ({} to a bound), {} simulated; {:.0f} "
      "plans/s\n",
      s, r.enumerated, r.legal, r.fitting, r.screened, r.screened_to_bound, r.simulated,
      static_cast<double>(r.enumerated) / s);
  fmt::print("  phases: enumerate, prune and screen {:.2f} s, simulate the finalists {:.2f} s\n",
             r.prune_and_screen_s, r.simulate_s);
  for (const auto& [why, n] : r.rejected) fmt::print("  rejected {:>9}  {}\n", n, why);
  for (size_t i = 0; i < r.plans.size(); ++i) {
    const Prediction& p = r.plans[i].prediction;
    fmt::print("  #{} {}  {:.0f} tokens/s ({:.1f}/GPU), MFU {:.1f}%, step {:.3f} s, {:.1f} GiB{}\n", i + 1,
               planner::describe(r.plans[i].plan), p.tokens_per_s, p.tokens_per_s_per_gpu, 100 * p.mfu,
               p.step_time_s, p.memory.total() / kGiB,
               p.memory.tight()
                   ? fmt::format(" (tight: {:.1f}-{:.1f} GiB of {:.2f})", p.memory.total_low() / kGiB,
                                 p.memory.total_high() / kGiB, p.memory.capacity / kGiB)
                   : "");
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::max(1, std::atoi(argv[1])) : 2;
  moeplan::retain_freed_memory();
  const std::vector<Case> cases{
      {"352b", "internal-352b", "h800-sxm", {1440, 8192, 720}},
      {"dsv3", "deepseek-v3", "h800-sxm", {2048, 4096, 15360}},
      {"mixtral", "mixtral-8x22b", "h100-sxm", {128, 4096, 256}},
      {"qwen3", "qwen3-235b-a22b", "h100-sxm", {256, 4096, 2048}, "megatron-core-deepep"},
  };
  for (const Case& c : cases) {
    bool wanted = argc <= 2;
    for (int i = 2; i < argc; ++i) wanted = wanted || c.key == std::string(argv[i]);
    if (wanted) run(c, threads);
  }
  return 0;
}
