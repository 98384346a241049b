// Invariants of whole-step predictions: more bandwidth or FLOP/s never slows a step, overlap never loses to
// the same plan serialised, doubling DP at a fixed per-replica batch leaves per-GPU compute unchanged; and
// the breakdown accounts for the whole step; the stack decides which overlaps count and which plans run.
#include <algorithm>

#include <doctest/doctest.h>

#include "simulator/engine/engine.h"
#include "simulator/io/hardware_loader.h"
#include "simulator/io/model_loader.h"
#include "simulator/io/stack_loader.h"
#include "simulator/predict/predict.h"
#include "simulator/predict/report.h"
#include "tests/simulator/predict/megatron_case.h"

using namespace moeplan;

namespace {

struct Case {
  ModelSpec model = io::load_model("mixtral-8x7b").value();
  HardwareProfile hw = io::load_hardware("h100-sxm").value();
  StackProfile stack = io::load_stack("moerun").value();
  Plan plan = [] {
    Plan p;
    p.gpus = 32;
    p.seq_len = 4096;
    p.global_batch = 32;
    p.attention.tp = 2;
    p.experts.ep = 8;
    p.pipeline.pp = 2;
    p.overlap = {true, false, true, true};
    p.recompute = Recompute::kSar;
    return p;
  }();
  Prediction run() const {
    return predict(model, plan, hw, stack, workload::uniform_routing(model.moe.num_experts));
  }
};

double compute_flops(const Prediction& p, int64_t stage) {
  double f = 0;
  for (const Op& op : p.graph.ops) {
    if (op.stage == stage && op.kind != OpKind::kOptimizer && op.kind != OpKind::kCollective) f += op.flops;
  }
  return f;
}

using test::MegatronCase;

}  // namespace

TEST_SUITE("predict") {
  TEST_CASE("a hardware fit shared by many predictions gives each the report it gets fitting alone") {
    // The cost model's fit reads the hardware profile only, so one fit serves every stack and plan on it:
    // the whole report (step, breakdown, memory, op summary, extrapolation notes) must be the same.
    Case c;
    const auto fit = cost::CostModel::fit_hardware(c.hw);
    const auto routing = workload::uniform_routing(c.model.moe.num_experts);
    for (const char* stack_name : {"moerun", "megatron-core", "megatron-core-deepep"}) {
      CAPTURE(stack_name);
      const StackProfile stack = io::load_stack(stack_name).value();
      Plan plan = c.plan;
      plan.global_batch = 128;            // the periodic steady state, two runs
      plan.recompute = Recompute::kNone;  // the Megatron stacks have no SAR
      if (stack.dispatch_dedup()) plan.experts.dispatch = Dispatch::kDedup;  // DeepEP's only dispatcher
      const Prediction alone = predict(c.model, plan, c.hw, stack, routing);
      const Prediction shared = predict(c.model, plan, c.hw, stack, routing, {.hardware_fit = fit});
      REQUIRE_MESSAGE(alone.violations.empty(), alone.violations.front().reason);
      CHECK(alone.simulation.extrapolated);
      const ReportContext ctx{plan, c.model, c.hw, stack};
      CHECK(prediction_json(shared, ctx).dump() == prediction_json(alone, ctx).dump());
    }
  }

  TEST_CASE("op graphs shared through a lowering cache give every prediction the report it gets alone") {
    // The assumption ranges predict one plan under many stack settings through one LoweringCache: a setting
    // that changes only prices reuses the graphs; one that changes the lowering (here weight gradients into
    // the main gradient buffer) lowers its own. Each report equals the one predicted without the cache.
    Case c;
    const StackProfile base = io::load_stack("megatron-core").value();
    Plan plan = c.plan;
    plan.global_batch = 128;  // the periodic steady state, two runs
    plan.recompute = Recompute::kNone;
    const auto routing = workload::uniform_routing(c.model.moe.num_experts);
    const auto cache = std::make_shared<LoweringCache>();
    StackProfile slower = base;
    slower.memory_bound_efficiency.value = 0.37;
    StackProfile own_grads = base;
    own_grads.wgrad_accumulation.into_main_grad.value = !base.wgrad_accumulation.into_main_grad.value;
    // Graphs each setting lowers: the base stack its two runs, the slower one none, the other lowering its
    // own two, the base stack again none.
    const std::vector<std::pair<const StackProfile*, int64_t>> settings = {
        {&base, 2}, {&slower, 0}, {&own_grads, 2}, {&base, 0}};
    std::vector<double> steps;
    for (const auto& [stack, lowers] : settings) {
      const int64_t before = cache->lowered();
      const Prediction alone = predict(c.model, plan, c.hw, *stack, routing);
      const Prediction shared = predict(c.model, plan, c.hw, *stack, routing, {.lowerings = cache});
      REQUIRE_MESSAGE(alone.violations.empty(), alone.violations.front().reason);
      CHECK(alone.simulation.extrapolated);
      const ReportContext ctx{plan, c.model, c.hw, *stack};
      CHECK(prediction_json(shared, ctx).dump() == prediction_json(alone, ctx).dump());
      CHECK(shared.graph.ops.empty());  // the graph stays the cache's
      CHECK_FALSE(alone.graph.ops.empty());
      CHECK(cache->lowered() - before == lowers);
      steps.push_back(shared.step_time_s);
    }
    CHECK(cache->lowered() == 4);  // two runs for each of the two lowerings
    CHECK(cache->reused() == 4);   // the slower stack's two runs, and the base stack's second time
    // The reused graphs were priced again: slower memory-bound kernels lengthen the step.
    CHECK(steps[1] > steps[0]);
    CHECK(steps[3] == steps[0]);
  }

  TEST_CASE("releasing a prediction's simulated run frees its arrays and keeps its figures") {
    // The search keeps each finalist's prediction; with the arrays' buffers kept (as `v = {}` and `clear()`
    // keep them), 96 finalists of 115k ops held 8 MB of op costs each.
    const Prediction whole = Case{}.run();
    REQUIRE(whole.violations.empty());
    REQUIRE_FALSE(whole.costs.empty());
    REQUIRE_FALSE(whole.critical_path.empty());
    Prediction p = whole;
    release_simulated_run(p);
    CHECK(p.graph.ops.capacity() == 0);
    CHECK(p.graph.deps.capacity() == 0);
    CHECK(p.graph.stage_first.capacity() == 0);
    CHECK(p.costs.capacity() == 0);
    CHECK(p.timeline.ops.capacity() == 0);
    CHECK(p.timeline.issued.capacity() == 0);
    CHECK(p.timeline.gated_by.capacity() == 0);
    CHECK(p.critical_path.capacity() == 0);
    CHECK(p.step_time_s == whole.step_time_s);
    CHECK(p.breakdown.total() == whole.breakdown.total());
    CHECK(p.memory.total() == whole.memory.total());
    CHECK(p.critical_path_seconds == whole.critical_path_seconds);
    CHECK(p.ops_in_step == whole.ops_in_step);
  }

  TEST_CASE("the breakdown of the critical stage sums to the step time") {
    const Prediction p = Case{}.run();
    REQUIRE(p.violations.empty());
    CHECK(p.breakdown.total() == doctest::Approx(p.step_time_s).epsilon(1e-9));
    CHECK(p.tokens_per_s_low <= p.tokens_per_s);
    CHECK(p.tokens_per_s_high >= p.tokens_per_s);
    CHECK(p.mfu > 0.05);
    CHECK(p.mfu < 0.8);
  }

  TEST_CASE("the breakdown merges each stream's ops in time order as a sort of all of them would") {
    // stage_breakdown merges the streams' edges (each stream runs its ops in id order) and sorts only where
    // a stream's ops arrive out of time order: a stage's ids in reverse order take the sort, and every
    // figure must be the same bit for bit, on every stage of a pipelined, overlapped step.
    const Case c;
    const Prediction p = predict(c.model, c.plan, c.hw, c.stack,
                                 workload::uniform_routing(c.model.moe.num_experts), {.whole_step = true});
    REQUIRE(p.violations.empty());
    for (int64_t s = 0; s < c.plan.pipeline.pp; ++s) {
      CAPTURE(s);
      std::vector<int32_t> ids = stage_ops(p.graph, s);
      REQUIRE(ids.size() > 100);
      const StepBreakdown merged = stage_breakdown(p.graph, p.costs, p.timeline, ids);
      std::reverse(ids.begin(), ids.end());
      const StepBreakdown sorted = stage_breakdown(p.graph, p.costs, p.timeline, ids);
      CHECK(merged.compute == sorted.compute);
      CHECK(merged.exposed_comm == sorted.exposed_comm);
      CHECK(merged.bubble == sorted.bubble);
      CHECK(merged.host_wait == sorted.host_wait);
      CHECK(merged.optimizer == sorted.optimizer);
      CHECK(merged.total() > 0);
    }
  }

  TEST_CASE("idle time that ends when the host issues the next op is the host's, inside the bubble") {
    // One stage: a GEMM over [0, 1]; a collective issued at 0.5 over [1, 2] (running, so not idle); a GEMM
    // whose inputs were ready at 2 but which the host issued at 3, over [3, 4]; a GEMM issued at 4.2 that
    // waited for a dependency until 5, over [5, 6]; the step ends at 7. Idle: [2, 3] the host's, [4, 5] a
    // wait, [6, 7] the end.
    OpGraph g;
    for (int i = 0; i < 4; ++i) {
      Op op;
      op.id = i;
      op.kind = i == 1 ? OpKind::kCollective : OpKind::kGemm;
      g.ops.push_back(op);
    }
    std::vector<cost::OpCost> costs(4);
    costs[1].resource = cost::Resource::kNvlink;
    engine::Timeline t;
    t.ops = {{0, 1}, {1, 2}, {3, 4}, {5, 6}};
    t.issued = {0, 0.5, 3, 4.2};
    t.step_time = 7;
    const StepBreakdown b = stage_breakdown(g, costs, t, 0);
    CHECK(b.bubble == doctest::Approx(3.0));
    CHECK(b.host_wait == doctest::Approx(1.0));
    CHECK(b.total() == doctest::Approx(7.0));
    // Megatron's alltoall dispatcher: the host waits for the split sizes in every MoE layer forward, and
    // the device then waits for it to issue the permute; a slower host makes it longer.
    const MegatronCase c;
    const Prediction p = c.run();
    REQUIRE(p.violations.empty());
    CHECK(p.breakdown.host_wait > 0);
    CHECK(p.breakdown.host_wait <= p.breakdown.bubble);
    StackProfile slow = c.stack;
    slow.host_s_per_kernel.value *= 2;
    CHECK(c.run(slow).breakdown.host_wait > p.breakdown.host_wait);
  }

  TEST_CASE("the critical chain the engine records is a longest path of the simulated graph") {
    // Under overlap and contention (processor sharing), for several layouts: the chain runs without gaps
    // from time 0 to the step's end, and no path through the graph is longer (Boost.Graph longest path).
    // The host issues instantly here: its issue times are not edges of the graph.
    Case c;
    c.stack.host_s_per_kernel.value = 0;
    c.stack.host_sync_s.value = 0;
    for (int variant = 0; variant < 3; ++variant) {
      if (variant == 1) {
        c.plan.pipeline.vpp = 2;
        c.plan.pipeline.schedule = Schedule::kInterleaved1F1B;
        c.plan.overlap = {true, true, true, true};
      }
      if (variant == 2) c.plan.data.zero = 3, c.plan.recompute = Recompute::kFull;
      const Prediction p = c.run();
      REQUIRE(p.violations.empty());
      const auto& tl = p.timeline;
      const auto chain = engine::critical_path(tl);
      REQUIRE(!chain.empty());
      CHECK(tl.ops[static_cast<size_t>(chain.front())].start == 0.0);
      CHECK(tl.ops[static_cast<size_t>(chain.back())].end == p.step_time_s);
      for (size_t k = 1; k < chain.size(); ++k) {
        CHECK(tl.ops[static_cast<size_t>(chain[k])].start == tl.ops[static_cast<size_t>(chain[k - 1])].end);
      }
      const auto longest = engine::longest_path(p.graph, tl);
      double along = 0;
      for (int32_t id : longest)
        along += tl.ops[static_cast<size_t>(id)].end - tl.ops[static_cast<size_t>(id)].start;
      CHECK(along == doctest::Approx(p.step_time_s).epsilon(1e-9));
    }
  }

  TEST_CASE("more bandwidth or more FLOP/s never makes a step slower") {
    Case c;
    const double base = c.run().step_time_s;
    SUBCASE("NVLink") {
      c.hw.node.nvlink_bw_achieved_bytes_per_s.value *= 2;
      c.hw.node.nvlink_bw_uni_bytes_per_s.value *= 2;
      for (auto& k : c.hw.calibration.collectives) {
        if (k.scope == Scope::kIntraNode) {
          for (auto& pt : k.points) pt.second *= 2;
        }
      }
      for (auto& k : c.hw.calibration.plateaus) k.busbw_bytes_per_s *= 2;
      CHECK(c.run().step_time_s <= base);
    }
    SUBCASE("NIC") {
      c.hw.scale_out.nic_bw_achieved_bytes_per_s.value *= 2;
      c.hw.scale_out.nic_bw_bytes_per_s.value *= 2;
      CHECK(c.run().step_time_s <= base);
    }
    SUBCASE("peak FLOP/s") {
      for (auto& [k, v] : c.hw.gpu.peak_flops_per_s) v.value *= 2;
      for (auto& t : c.hw.calibration.attention) {
        for (auto& pt : t.points) pt.second *= 2;
      }
      CHECK(c.run().step_time_s < base);
    }
    SUBCASE("HBM") {
      c.hw.gpu.hbm_bw_achieved_bytes_per_s.value *= 2;
      c.hw.gpu.hbm_bw_peak_bytes_per_s.value *= 2;
      CHECK(c.run().step_time_s < base);
    }
  }

  TEST_CASE("an overlapped schedule is never slower than the same plan serialised") {
    Case c;
    for (Dispatch d : {Dispatch::kAllToAll, Dispatch::kAllGather}) {
      c.plan.experts.dispatch = d;
      c.plan.overlap = {false, false, false, false};
      const double serial = c.run().step_time_s;
      c.plan.overlap = {true, false, true, true};
      const double inter = c.run().step_time_s;
      CHECK(inter <= serial);
    }
  }

  TEST_CASE("doubling DP at a fixed per-replica batch leaves per-GPU compute unchanged") {
    Case c;
    const Prediction a = c.run();
    c.plan.gpus *= 2;
    c.plan.global_batch *= 2;
    const Prediction b = c.run();
    for (int64_t s = 0; s < c.plan.pipeline.pp; ++s)
      CHECK(compute_flops(a, s) == doctest::Approx(compute_flops(b, s)));
  }

  TEST_CASE("an illegal plan is a value with its reasons") {
    Case c;
    c.plan.experts.ep = 3;
    const Prediction p = c.run();
    CHECK_FALSE(p.violations.empty());
    CHECK(p.graph.ops.empty());
  }

  TEST_CASE("cross-micro-batch overlap hides exposed expert-parallel all-to-alls") {
    // Combined 1F1B runs each micro-batch's dispatch and combine beside another's compute: the step is no
    // slower than 1F1B with the exchanges in line, and here faster (they cross nodes).
    MegatronCase c;
    const Prediction plain = c.run();
    REQUIRE(plain.violations.empty());
    c.plan.overlap.cross_micro_batch = true;
    const Prediction combined = c.run();
    REQUIRE(combined.violations.empty());
    CHECK(combined.effective_plan.overlap.cross_micro_batch);
    CHECK(combined.notices.empty());
    CHECK(combined.step_time_s <= plain.step_time_s);
    CHECK(combined.step_time_s < 0.99 * plain.step_time_s);
  }

  TEST_CASE("per-layer CUDA graphs shorten a host-bound step and cost their copies where the host keeps up") {
    // TP 2, EP 8 on one node. Qwen3-30B-A3B at 512 tokens: attention's and the router's kernels are shorter
    // than the host's 25 us per framework call, so the GPU waits for the host; graphed, one replay issues
    // each part. Mixtral-8x7B at 4,096 tokens: its kernels keep the GPU busy while the host issues, and the
    // graphs only add their input copies.
    const HardwareProfile hw = io::load_hardware("h100-sxm").value();
    const StackProfile stack = io::load_stack("megatron-core").value();
    for (const auto& [name, seq] :
         {std::pair<std::string, int64_t>{"qwen3-30b-a3b", 512}, {"mixtral-8x7b", 4096}}) {
      CAPTURE(name);
      Plan p;
      p.gpus = 8;
      p.seq_len = seq;
      p.global_batch = 16;
      p.attention.tp = 2;
      p.experts.ep = 8;
      p.overlap.dp_comm = true;
      const ModelSpec m = io::load_model(name).value();
      const auto routing = workload::uniform_routing(m.moe.num_experts);
      const Prediction eager = predict(m, p, hw, stack, routing);
      p.cuda_graphs = kGraphAttn | kGraphMoeRouter | kGraphMoePreprocess;
      const Prediction g = predict(m, p, hw, stack, routing);
      REQUIRE(eager.violations.empty());
      REQUIRE(g.violations.empty());
      if (seq == 512) {
        CHECK(eager.breakdown.host_wait > 0.3 * eager.step_time_s);
        CHECK(g.breakdown.host_wait < 0.5 * eager.breakdown.host_wait);
        CHECK(g.step_time_s < 0.8 * eager.step_time_s);
      } else {
        CHECK(eager.breakdown.host_wait < 0.01 * eager.step_time_s);
        CHECK(g.step_time_s > eager.step_time_s);
        CHECK(g.step_time_s < 1.02 * eager.step_time_s);
      }
    }
  }

  TEST_CASE("a plan's mtp_layers trains that many MTP layers whatever the model config counts") {
    // Four Mixtral-8x7B layers: a plan with one MTP layer predicts as the model with one; zero on a model
    // with one predicts as the model without.
    const MegatronCase c;
    ModelSpec with = c.model;
    with.mtp_layers = 1;
    Plan p = c.plan;
    p.mtp_layers = 1;
    const auto routing = workload::uniform_routing(c.model.moe.num_experts);
    const Prediction by_plan = predict(c.model, p, c.hw, c.stack, routing);
    const Prediction by_model = predict(with, c.plan, c.hw, c.stack, routing);
    REQUIRE(by_plan.violations.empty());
    CHECK(by_plan.step_time_s == doctest::Approx(by_model.step_time_s).epsilon(1e-12));
    CHECK(by_plan.step_time_s > c.run().step_time_s);
    p.mtp_layers = 0;
    CHECK(predict(with, p, c.hw, c.stack, routing).step_time_s ==
          doctest::Approx(c.run().step_time_s).epsilon(1e-12));
  }

  TEST_CASE("a prediction says what priced its routed all-to-alls under skewed routing") {
    // Mixtral-8x7B on 32 H100s, ep 8, zipf routing: the busiest EP rank draws more than the mean, so the
    // plain exchanges carry a hot factor. The built-in profile has no hot-receiver table: the report says
    // they were priced as a uniform exchange of the busiest rank's bytes. With a table for the group's shape
    // it names the table, and the step moves to what the table measures.
    Case c;
    c.plan.recompute = Recompute::kNone;
    const auto zipf = workload::zipf_routing(c.model.moe.num_experts, 1.0);
    const Prediction plain = predict(c.model, c.plan, c.hw, c.stack, zipf);
    REQUIRE(plain.violations.empty());
    REQUIRE(plain.hot_exchanges.size() == 1);
    const Prediction::HotExchange& e = plain.hot_exchanges[0];
    CHECK(e.ranks == 8);
    CHECK(e.hot_factor == doctest::Approx(plain.routing.imbalance()));
    CHECK(e.hot_factor > 1.0);
    CHECK(e.table_source.empty());
    const ReportContext ctx{c.plan, c.model, c.hw, c.stack};
    const nlohmann::json row = prediction_json(plain, ctx)["routing"]["hot_alltoalls"].at(0);
    CHECK(row["priced_from"] == "busiest_rank_uniform");
    CHECK(row["table_source"].is_null());
    // The whole step finds its hot exchanges while it hashes the ops' cost keys; the periodic steady state's
    // runs (checked op by op, so hashed by their stream index) read every op again. The same exchanges.
    Plan longer = c.plan;
    longer.global_batch *= 16;
    const Prediction periodic = predict(c.model, longer, c.hw, c.stack, zipf);
    const Prediction whole = predict(c.model, longer, c.hw, c.stack, zipf, {.whole_step = true});
    REQUIRE(periodic.simulation.extrapolated);
    REQUIRE(!whole.simulation.extrapolated);
    REQUIRE(periodic.hot_exchanges.size() == 1);
    REQUIRE(whole.hot_exchanges.size() == 1);
    CHECK(whole.hot_exchanges[0].ranks == periodic.hot_exchanges[0].ranks);
    CHECK(whole.hot_exchanges[0].nodes == periodic.hot_exchanges[0].nodes);
    CHECK(whole.hot_exchanges[0].hot_factor == periodic.hot_exchanges[0].hot_factor);
    CHECK(whole.hot_exchanges[0].hot_factor > 1.0);

    HardwareProfile measured = c.hw;
    AllToAllSkewTable t;
    t.ranks = e.ranks;
    t.nodes = e.nodes;
    t.source = "moerun bench --plan test.json (test)";
    for (int64_t bytes : {int64_t{1} << 16, int64_t{1} << 30}) {
      t.points.push_back({bytes, 1.0, 1e-3});
      t.points.push_back({bytes, 4.0, 2e-3});  // 2x at a hot factor of 4
    }
    measured.calibration.alltoall_skew = {t};
    const Prediction tabled = predict(c.model, c.plan, measured, c.stack, zipf);
    REQUIRE(tabled.hot_exchanges.size() == 1);
    CHECK(tabled.hot_exchanges[0].table_source == t.source);
    const ReportContext tctx{c.plan, c.model, measured, c.stack};
    CHECK(prediction_json(tabled, tctx)["routing"]["hot_alltoalls"].at(0)["priced_from"] == "measured_table");
    CHECK(tabled.step_time_s != plain.step_time_s);

    // Uniform routing: the busiest rank still draws the expected maximum of its share, less than under zipf;
    // without expert parallelism there is no routed exchange at all.
    const Prediction even = c.run();
    REQUIRE(even.hot_exchanges.size() == 1);
    CHECK(even.hot_exchanges[0].hot_factor < e.hot_factor);
    c.plan.experts.ep = 1;
    const Prediction none = c.run();
    REQUIRE(none.violations.empty());
    CHECK(none.hot_exchanges.empty());
    const ReportContext nctx{c.plan, c.model, c.hw, c.stack};
    CHECK(prediction_json(none, nctx)["routing"]["hot_alltoalls"].empty());
  }

  TEST_CASE("an overlap the stack lacks predicts exactly as the plan without it, with a notice") {
    // Megatron-Core has no MegaScale-MoE inter-operator overlap (K/V all-to-all beside Q, shared experts on a
    // side stream): asking for it changes nothing but the notice.
    MegatronCase c;
    const Prediction without = c.run();
    c.plan.overlap.inter_op = true;
    const Prediction asked = c.run();
    REQUIRE(asked.violations.empty());
    CHECK(asked.step_time_s == without.step_time_s);
    CHECK(asked.graph.ops.size() == without.graph.ops.size());
    CHECK_FALSE(asked.effective_plan.overlap.inter_op);
    REQUIRE(asked.notices.size() == 1);
    CHECK(asked.notices[0].find("overlap.inter_op") != std::string::npos);
    CHECK(without.notices.empty());
  }

  TEST_CASE("a plan feature the stack cannot run is refused before anything is predicted") {
    // Megatron-Core's alltoall and allgather dispatchers send one copy per expert; node-deduplicated dispatch
    // needs DeepEP or HybridEP (the megatron-core-deepep / -hybridep stacks).
    MegatronCase c;
    c.plan.experts.dispatch = Dispatch::kDedup;
    const Prediction p = c.run();
    REQUIRE(p.violations.size() == 1);
    CHECK(p.violations[0].rule == "stack_dispatch");
    CHECK(p.graph.ops.empty());
    c.stack = io::load_stack("megatron-core-deepep").value();
    CHECK(c.run().violations.empty());
  }

  TEST_CASE("the target-share line names one share, or the range of several as printed") {
    const std::string tail = "% of the critical path is priced by stack numbers that are targets";
    CHECK(target_share_line(0.52, 0.52) == "52" + tail);
    CHECK(target_share_line(0.52, 0.61) == "52-61" + tail);
    CHECK(target_share_line(0.521, 0.524) == "52" + tail);  // both print as 52
  }

  TEST_CASE("a prediction is hypothetical exactly when it credits what its stack has only as a target") {
    // moerun's overlaps are design targets: a plan that uses them is hypothetical and says which; the same
    // plan without overlaps rests on measured, derived and assumed numbers only.
    Case c;
    const Prediction overlapped = c.run();
    REQUIRE(overlapped.violations.empty());
    CHECK(overlapped.provenance.hypothetical);
    const auto names = [](const Prediction& p, const char* key) {
      return std::any_of(p.provenance.targets.begin(), p.provenance.targets.end(),
                         [&](const std::string& t) { return t.find(key) != std::string::npos; });
    };
    CHECK(names(overlapped, "overlap.inter_op"));
    CHECK(names(overlapped, "overlap.dp_comm"));
    CHECK_FALSE(names(overlapped, "overlap.intra_op"));  // not in the plan
    c.plan.overlap = {false, false, false, false};
    const Prediction plain = c.run();
    CHECK_FALSE(plain.provenance.hypothetical);
    CHECK(plain.provenance.targets.empty());
    CHECK(plain.provenance.target == 0.0);
    // The shares are of the critical path's time and add up to one.
    const auto& v = plain.provenance;
    CHECK(v.measured + v.derived + v.assumed + v.target == doctest::Approx(1.0).epsilon(1e-9));
    CHECK(v.measured > 0.0);
    // Megatron-Core's overlaps are read from its source (derived): never hypothetical.
    const Prediction mcore = MegatronCase{}.run();
    CHECK_FALSE(mcore.provenance.hypothetical);
  }
}
