// Benchmark of the full plan search on the reference jobs: wall time on the given threads, plans
// enumerated, pruned (by reason), screened and simulated, and plans per second.
// Usage: moeplan_plan_bench [--recall] [threads=2] [case...]; cases: 352b, dsv3, mixtral (on the moerun
// stack), qwen3 (Qwen3-235B on 256 H100s on Megatron-Core with DeepEP, combined 1F1B in its space) (default:
// all). --recall: what the screen's cut to the finalists costs: each search again with ten times the
// finalists and a window of 50 % (every plan the screen puts within 50 % of its best, up to 960, simulated
// in full), and whether its top five are the default search's.
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

// A case's model, hardware and stack, and uniform routing over its experts.
struct Inputs {
  explicit Inputs(const Case& c)
      : model(io::load_model(c.model).value()),
        hw(io::load_hardware(c.hardware).value()),
        stack(io::load_stack(c.stack).value()),
        routing(workload::uniform_routing(std::max<int64_t>(1, model.moe.num_experts))) {}
  planner::SearchResult search(const Case& c, const planner::SearchOptions& o) const {
    return planner::search(model, hw, stack, routing, c.job, {}, o);
  }
  ModelSpec model;
  HardwareProfile hw;
  StackProfile stack;
  workload::RoutingDistribution routing;
};

void run(const Case& c, int threads) {
  const Inputs in(c);
  planner::SearchOptions opts;
  opts.threads = threads;
  opts.top = 3;
  const auto t0 = std::chrono::steady_clock::now();
  const planner::SearchResult r = in.search(c, opts);
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

// The default search's top five against a search that simulates ten times the finalists.
void recall(const Case& c, int threads) {
  const Inputs in(c);
  planner::SearchOptions narrow;
  narrow.threads = threads;
  narrow.top = 5;
  narrow.prefer_memory_margin = true;  // as `moeplan plan` ranks
  planner::SearchOptions wide = narrow;
  wide.finalists = 10 * narrow.finalists;
  wide.finalist_window = 0.5;
  const planner::SearchResult a = in.search(c, narrow), b = in.search(c, wide);
  fmt::print("{} on {} x {}, {} stack: {} and {} finalists simulated ({:.1f} s and {:.1f} s)\n", c.model,
             c.job.gpus, c.hardware, c.stack, a.simulated, b.simulated, a.simulate_s, b.simulate_s);
  size_t same = 0;
  for (size_t i = 0; i < std::min(a.plans.size(), b.plans.size()); ++i)
    same += planner::describe(a.plans[i].plan) == planner::describe(b.plans[i].plan) ? 1 : 0;
  fmt::print("  top {}: {} of {} the same plan at the same place\n", b.plans.size(), same, a.plans.size());
  for (size_t i = 0; i < b.plans.size(); ++i) {
    const std::string d = planner::describe(b.plans[i].plan);
    size_t at = 0;
    for (size_t j = 0; j < a.plans.size(); ++j)
      if (planner::describe(a.plans[j].plan) == d) at = j + 1;
    fmt::print("  wide #{} {}  {:.1f} tokens/s/GPU; {}\n", i + 1, d,
               b.plans[i].prediction.tokens_per_s_per_gpu,
               at > 0 ? fmt::format("default #{}", at) : std::string("not in the default top"));
  }
  if (!a.plans.empty() && !b.plans.empty())
    fmt::print("  default #1 over wide #1: {:.4f}\n",
               a.plans[0].prediction.tokens_per_s_per_gpu / b.plans[0].prediction.tokens_per_s_per_gpu);
}

}  // namespace

int main(int argc, char** argv) {
  const bool recalls = argc > 1 && argv[1] == std::string("--recall");
  if (recalls) --argc, ++argv;
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
    if (wanted) recalls ? recall(c, threads) : run(c, threads);
  }
  return 0;
}
