// The periodic steady state: a step predicted from two short runs checked op by op (or three, checked by
// their figures) and the repeating period equals the whole step simulated micro-batch by micro-batch, in
// every reported figure, on many layouts and schedules; the op-by-op check itself on runs that differ by one
// period and on runs it must refuse.
#include <algorithm>
#include <string>

#include <doctest/doctest.h>
#include <fmt/format.h>

#include "simulator/io/hardware_loader.h"
#include "simulator/io/model_loader.h"
#include "simulator/io/stack_loader.h"
#include "simulator/predict/periodic.h"
#include "simulator/predict/predict.h"

using namespace moeplan;

namespace {

ModelSpec truncated(const char* name, size_t layers) {
  ModelSpec m = io::load_model(name).value();
  m.layers.resize(layers);
  m.mtp_layers = 0;
  return m;
}

struct Layout {
  std::string name;
  ModelSpec model;
  std::string stack = "megatron-core";
  Plan plan;
};

Plan base_plan(int64_t pp, int64_t micro_batches) {
  Plan p;
  p.gpus = 8 * pp;
  p.seq_len = 4096;
  p.experts.ep = 8;
  p.pipeline.pp = pp;
  p.global_batch = micro_batches * p.dp();
  p.overlap.dp_comm = true;
  p.overlap.pp_comm = true;
  return p;
}

std::vector<Layout> layouts() {
  std::vector<Layout> out;
  {
    Layout l{"1f1b pp4", truncated("mixtral-8x7b", 8), "megatron-core", base_plan(4, 40)};
    out.push_back(l);
  }
  {
    Layout l{"1f1b pp1 (no pipeline)", truncated("mixtral-8x7b", 2), "megatron-core", base_plan(1, 24)};
    out.push_back(l);
  }
  {
    Layout l{"interleaved pp4 vpp2", truncated("mixtral-8x7b", 8), "megatron-core", base_plan(4, 96)};
    l.plan.pipeline.vpp = 2;
    l.plan.pipeline.schedule = Schedule::kInterleaved1F1B;
    out.push_back(l);
  }
  {
    Layout l{"1f1b pp3 uneven split, full recompute, ZeRO-3", truncated("mixtral-8x7b", 7), "megatron-core",
             base_plan(3, 30)};
    l.plan.pipeline.layers_per_stage = {3, 2, 2};
    l.plan.recompute = Recompute::kFull;
    l.plan.data.zero = 3;
    out.push_back(l);
  }
  {
    Layout l{"dualpipev pp4", truncated("mixtral-8x7b", 8), "megatron-core", base_plan(4, 40)};
    l.plan.pipeline.vpp = 2;
    l.plan.pipeline.schedule = Schedule::kDualPipeV;
    out.push_back(l);
  }
  {
    Layout l{"combined 1f1b (cross-micro-batch EP overlap), interleaved", truncated("mixtral-8x7b", 8),
             "megatron-core", base_plan(2, 36)};
    l.plan.pipeline.vpp = 2;
    l.plan.pipeline.schedule = Schedule::kInterleaved1F1B;
    l.plan.overlap.cross_micro_batch = true;
    out.push_back(l);
  }
  {
    // DeepEP's host syncs, tp 2 with SP, cross-node EP 16: host-bound stretches and contention.
    Layout l{"deepep tp2 ep16 pp2", truncated("deepseek-v3", 6), "megatron-core-deepep", base_plan(2, 30)};
    l.plan.gpus = 64;
    l.plan.attention.tp = 2;
    l.plan.experts.ep = 16;
    l.plan.experts.dispatch = Dispatch::kDedup;
    l.plan.global_batch = 30 * l.plan.dp();
    out.push_back(l);
  }
  {
    Layout l{"moerun stack, all overlaps, SAR", truncated("mixtral-8x7b", 8), "moerun", base_plan(4, 40)};
    l.plan.attention.sp = 2;
    l.plan.global_batch = 40 * l.plan.dp();
    l.plan.overlap = {true, true, true, true};
    l.plan.recompute = Recompute::kSar;
    out.push_back(l);
  }
  return out;
}

// |a - b| within `rel` of `scale`.
bool near(double a, double b, double scale, double rel = 1e-9) {
  return std::abs(a - b) <= rel * scale;
}

// `summary_rel`: the op summary's totals, each a sum over hundreds of ops, to this fraction of the step.
void check_same(const Prediction& x, const Prediction& w, double summary_rel = 1e-9) {
  const double step = w.step_time_s;
  CHECK(near(x.step_time_s, step, step));
  CHECK(near(x.tokens_per_s, w.tokens_per_s, w.tokens_per_s));
  CHECK(near(x.tokens_per_s_low, w.tokens_per_s_low, w.tokens_per_s));
  CHECK(near(x.tokens_per_s_high, w.tokens_per_s_high, w.tokens_per_s));
  CHECK(near(x.mfu, w.mfu, w.mfu));
  CHECK(x.ops_in_step == w.ops_in_step);
  CHECK(x.events == w.events);
  CHECK(x.critical_stage == w.critical_stage);
  CHECK(x.memory.total() == w.memory.total());
  REQUIRE(x.stage_end.size() == w.stage_end.size());
  for (size_t s = 0; s < w.stage_end.size(); ++s) CHECK(near(x.stage_end[s], w.stage_end[s], step));
  auto same_map = [&](const std::map<std::string, double>& a, const std::map<std::string, double>& b) {
    for (const auto& [k, v] : b) {
      CAPTURE(k);
      const double got = a.count(k) ? a.at(k) : 0.0;
      CHECK(near(got, v, step));
    }
    for (const auto& [k, v] : a) {
      CAPTURE(k);
      CHECK(near(v, b.count(k) ? b.at(k) : 0.0, step));
    }
  };
  same_map(x.breakdown.compute, w.breakdown.compute);
  same_map(x.breakdown.exposed_comm, w.breakdown.exposed_comm);
  CHECK(near(x.breakdown.bubble, w.breakdown.bubble, step));
  CHECK(near(x.breakdown.optimizer, w.breakdown.optimizer, step));
  same_map(x.critical_path_seconds, w.critical_path_seconds);
  CHECK(x.critical_path_ops == w.critical_path_ops);
  CHECK(near(x.provenance.measured, w.provenance.measured, 1.0));
  CHECK(near(x.provenance.derived, w.provenance.derived, 1.0));
  CHECK(near(x.provenance.assumed, w.provenance.assumed, 1.0));
  CHECK(near(x.provenance.target, w.provenance.target, 1.0));
  REQUIRE(x.op_summary.size() == w.op_summary.size());
  for (size_t i = 0; i < w.op_summary.size(); ++i) {
    const OpSummaryRow &a = x.op_summary[i], &b = w.op_summary[i];
    CAPTURE(b.op);
    CHECK(a.stage == b.stage);
    CHECK(a.op == b.op);
    CHECK(a.count == b.count);
    CHECK(near(a.total_s, b.total_s, step, summary_rel));
  }
}

}  // namespace

TEST_SUITE("predict") {
  TEST_CASE("the periodic steady state predicts every figure of the whole step, on many layouts") {
    for (const Layout& l : layouts()) {
      CAPTURE(l.name);
      StackProfile stack = io::load_stack(l.stack).value();
      // No stack profile runs DualPipeV yet; the engine does, so this one is given it.
      if (l.plan.pipeline.schedule == Schedule::kDualPipeV)
        stack.capabilities.schedules.push_back("dualpipev");
      const HardwareProfile hw = io::load_hardware("h100-sxm").value();
      const auto routing = workload::uniform_routing(l.model.moe.num_experts);
      const Prediction x = predict(l.model, l.plan, hw, stack, routing);
      for (const Violation& v : x.violations) MESSAGE(v.reason);
      REQUIRE(x.violations.empty());
      // Its runs on several threads: the same numbers, bit for bit.
      const Prediction t = predict(l.model, l.plan, hw, stack, routing, {.threads = 3});
      CHECK(t.step_time_s == x.step_time_s);
      CHECK(t.breakdown.total() == x.breakdown.total());
      CHECK(t.critical_path_seconds == x.critical_path_seconds);
      const Prediction w = predict(l.model, l.plan, hw, stack, routing, {.whole_step = true});
      // Extrapolated: fewer micro-batches simulated (the graph holds only those), the rest added.
      CHECK_MESSAGE(x.simulation.extrapolated, x.simulation.why_full);
      // Every layout here passes the op-by-op check of two runs.
      CHECK_MESSAGE(x.simulation.runs == 2, x.simulation.why_three_runs);
      CHECK(x.simulation.why_three_runs.empty());
      CHECK(x.simulation.simulated_micro_batches < x.simulation.micro_batches);
      CHECK(x.graph.micro_batches == x.simulation.simulated_micro_batches);
      CHECK(x.simulation.simulated_micro_batches +
                x.simulation.periods_added * x.simulation.period_micro_batches ==
            x.simulation.micro_batches);
      CHECK_FALSE(w.simulation.extrapolated);
      CHECK(w.graph.micro_batches == l.plan.num_micro_batches());
      check_same(x, w);
      // The three-run check, where the op-by-op one fails, gives the same step.
      const Prediction three = predict(l.model, l.plan, hw, stack, routing, {.op_by_op = false});
      CHECK(three.simulation.runs == 3);
      CHECK_FALSE(three.simulation.why_three_runs.empty());
      check_same(three, w);
    }
  }

  TEST_CASE("the periodic steady state equals the whole step over a grid of schedules, stacks and settings") {
    // Three schedules x three stacks x four settings; a combination the stack or the plan rules refuse is
    // skipped, and most must remain. Every one that is extrapolated equals the whole step in every figure.
    const HardwareProfile hw = io::load_hardware("h100-sxm").value();
    int checked = 0, two_runs = 0;
    for (int schedule = 0; schedule < 3; ++schedule) {
      for (const std::string stack_name : {"megatron-core", "moerun", "megatron-core-deepep"}) {
        for (int setting = 0; setting < 4; ++setting) {
          const bool deepep = stack_name == "megatron-core-deepep";
          // Layers divisible by the virtual stages: 3 x 2 or 2 x 2 x 2.
          ModelSpec model = truncated(deepep ? "deepseek-v3" : "mixtral-8x7b", schedule == 0 ? 6 : 8);
          Plan p = base_plan(schedule == 0 ? 3 : 2, 24);
          if (deepep) p.experts.dispatch = Dispatch::kDedup;
          if (schedule > 0) p.pipeline.vpp = 2;
          if (schedule == 1) p.pipeline.schedule = Schedule::kInterleaved1F1B;
          if (schedule == 2) p.pipeline.schedule = Schedule::kDualPipeV;
          if (setting == 1) p.overlap = {};
          if (setting == 2) p.recompute = Recompute::kFull;
          if (setting == 3) p.precision = Precision::kFp8;
          if (setting == 3) p.fp8_recipe = Fp8Recipe::kBlockwise;
          StackProfile stack = io::load_stack(stack_name).value();
          if (schedule == 2) stack.capabilities.schedules.push_back("dualpipev");
          const auto routing = workload::uniform_routing(model.moe.num_experts);
          const Prediction x = predict(model, p, hw, stack, routing);
          CAPTURE(schedule);
          CAPTURE(stack_name);
          CAPTURE(setting);
          if (!x.violations.empty()) {
            MESSAGE("skipped: ", x.violations.front().reason);
            continue;
          }
          const Prediction w = predict(model, p, hw, stack, routing, {.whole_step = true});
          CHECK_MESSAGE(x.simulation.extrapolated, x.simulation.why_full);
          two_runs += x.simulation.runs == 2 ? 1 : 0;
          if (x.simulation.runs != 2) MESSAGE(x.simulation.why_three_runs);
          check_same(x, w);
          ++checked;
        }
      }
    }
    MESSAGE(checked, " combinations checked, ", two_runs, " from two runs");
    CHECK(checked >= 24);
    CHECK(two_runs >= checked - 4);
  }

  TEST_CASE("a long interleaved run whose op times drift by rounding alone is still two runs") {
    // Qwen3-235B on 256 H100s, DeepEP beside compute, interleaved PP 16 x 4 with combined 1F1B and ZeRO-2:
    // the planner's finalist whose runs at 48 and 64 micro-batches put ops up to 5e-10 of the step apart
    // (rounding: every compute kernel's start and end changes the dispatcher's rate). At 1e-11 of the step it
    // took three runs, 2.25 M simulated ops where two take 0.57 M.
    const ModelSpec model = io::load_model("qwen3-235b-a22b").value();
    const HardwareProfile hw = io::load_hardware("h100-sxm").value();
    const StackProfile stack = io::load_stack("megatron-core-deepep").value();
    Plan p;
    p.gpus = 256;
    p.seq_len = 4096;
    p.micro_batch = 2;
    p.global_batch = 128 * 2 * 4;  // 128 micro-batches on dp 4
    p.attention.sp = 4;
    p.experts.ep = 16;
    p.experts.dispatch = Dispatch::kDedup;
    p.pipeline.pp = 16;
    p.pipeline.vpp = 4;
    p.pipeline.schedule = Schedule::kInterleaved1F1B;
    p.pipeline.layers_per_stage =
        uneven_split(model.num_layers(), 64);  // the planner's split: 1, 2 x 30, 1 x 33
    p.data.zero = 2;
    p.compression.grad_sync = GradSync::kBf16ReduceScatter;
    p.precision = Precision::kFp8;
    p.overlap.dp_comm = true;
    p.overlap.pp_comm = true;
    p.overlap.cross_micro_batch = true;
    p.overlap.delay_wgrad = true;
    const auto routing = workload::uniform_routing(model.moe.num_experts);
    const Prediction x = predict(model, p, hw, stack, routing);
    for (const Violation& v : x.violations) MESSAGE(v.reason);
    REQUIRE(x.violations.empty());
    CHECK_MESSAGE(x.simulation.runs == 2, x.simulation.why_three_runs);
    CHECK(x.simulation.simulated_micro_batches == 48);
    // Every figure to 1e-9 of the step, the op summary's totals (sums over hundreds of ops) to 1e-8: the
    // whole step's own pp_send_bwd total on stage 1 does not grow by exactly the same amount each period.
    // Simulated whole at 32, 48, ..., 144 micro-batches, its growth per period ranges over 0.0299892140467 to
    // 0.0299892239112 s (10 ns), and the extrapolated total at 128 is 14 ns (1.7e-9 of the step) from the
    // whole step's.
    const Prediction w = predict(model, p, hw, stack, routing, {.whole_step = true});
    check_same(x, w, 1e-8);
  }

  TEST_CASE("figures that repeat are extrapolated by whole periods, and one that does not is named") {
    // Three runs whose figures grow by the same step each: 10 more periods add 10 steps.
    auto figures = [](double step, int64_t ops, double bubble) {
      StepFigures f;
      f.step_time = step;
      f.ops = ops;
      f.events = 2 * ops;
      f.stage_end = {step - 0.1, step};
      f.breakdown.compute["gemm"] = step / 2;
      f.breakdown.bubble = bubble;
      f.cp_seconds["gemm"] = step / 2;
      OpSummaryRow row;
      row.op = "L0.fc13";
      row.count = ops / 10;
      row.total_s = step / 4;
      f.summary = {row};
      return f;
    };
    StepFigures a = figures(1.0, 100, 0.2);
    auto x = PeriodicExtrapolation::checked(10, 1e-12);
    x.figures(a, figures(1.5, 130, 0.2), figures(2.0, 160, 0.2));
    CHECK(x.ok());
    CHECK(a.step_time == doctest::Approx(6.0));
    CHECK(a.ops == 400);
    CHECK(a.events == 800);
    CHECK(a.stage_end[1] == doctest::Approx(6.0));
    CHECK(a.breakdown.compute.at("gemm") == doctest::Approx(3.0));
    CHECK(a.breakdown.bubble == doctest::Approx(0.2));
    CHECK(a.summary[0].count == 40);
    CHECK(a.summary[0].total_s == doctest::Approx(1.5));
    // A bubble that grows faster in the second period than in the first does not repeat.
    StepFigures b = figures(1.0, 100, 0.2);
    auto y = PeriodicExtrapolation::checked(10, 1e-12);
    y.figures(b, figures(1.5, 130, 0.25), figures(2.0, 160, 0.35));
    CHECK_FALSE(y.ok());
    CHECK(y.failed() == "bubble");
    // Counts repeat exactly or not at all; an op that appears in one run only breaks the summary.
    StepFigures c = figures(1.0, 100, 0.2);
    auto z = PeriodicExtrapolation::checked(10, 1e-12);
    StepFigures extra = figures(2.0, 161, 0.2);
    extra.events = 320;  // the events repeat, the ops do not
    extra.summary.push_back(extra.summary.front());
    z.figures(c, figures(1.5, 130, 0.2), extra);
    CHECK_FALSE(z.ok());
    CHECK(z.failed() == "ops");
    extra.ops = 160;
    StepFigures e = figures(1.0, 100, 0.2);
    auto w = PeriodicExtrapolation::checked(10, 1e-12);
    w.figures(e, figures(1.5, 130, 0.2), extra);
    CHECK_FALSE(w.ok());
    CHECK(w.failed() == "op summary");
  }

  TEST_CASE("a batch too small to gain from the periodic state is simulated whole, and says so") {
    Layout l{"1f1b pp4", truncated("mixtral-8x7b", 8), "megatron-core", base_plan(4, 8)};
    const Prediction p = predict(l.model, l.plan, io::load_hardware("h100-sxm").value(),
                                 io::load_stack(l.stack).value(), workload::uniform_routing(8));
    CHECK_FALSE(p.simulation.extrapolated);
    CHECK(p.graph.micro_batches == 8);
    CHECK(p.simulation.why_full.find("too small") != std::string::npos);
  }

  TEST_CASE("a batch that two runs can save time on but three cannot: two runs, else the whole step") {
    // pp 4, 1F1B: runs of 6 and 7 micro-batches save time on 16; the three-run check (5, 6, 7 and up to three
    // slides) would not.
    Layout l{"1f1b pp4", truncated("mixtral-8x7b", 8), "megatron-core", base_plan(4, 16)};
    const HardwareProfile hw = io::load_hardware("h100-sxm").value();
    const StackProfile stack = io::load_stack(l.stack).value();
    const auto routing = workload::uniform_routing(8);
    const Prediction x = predict(l.model, l.plan, hw, stack, routing);
    CHECK_MESSAGE(x.simulation.extrapolated, x.simulation.why_full);
    CHECK(x.simulation.runs == 2);
    const Prediction w = predict(l.model, l.plan, hw, stack, routing, {.whole_step = true});
    check_same(x, w);
    const Prediction three = predict(l.model, l.plan, hw, stack, routing, {.op_by_op = false});
    CHECK_FALSE(three.simulation.extrapolated);
    CHECK(three.simulation.why_full.find("three-run check") != std::string::npos);
    CHECK(three.step_time_s == w.step_time_s);
  }

  TEST_CASE(
      "a run one period longer is recognised op by op, and a moved op, dependency or slow host is not") {
    Layout l{"1f1b pp4", truncated("mixtral-8x7b", 8), "megatron-core", base_plan(4, 5)};
    const HardwareProfile hw = io::load_hardware("h100-sxm").value();
    const StackProfile stack = io::load_stack(l.stack).value();
    const auto routing = workload::uniform_routing(8);
    auto whole = [&](int64_t micro_batches) {
      Plan p = l.plan;
      p.global_batch = micro_batches * p.dp();
      return predict(l.model, p, hw, stack, routing, {.whole_step = true});
    };
    const Prediction a = whole(5), b = whole(6), c = whole(7);
    const double tol = kInsertedPeriodTolerance * b.step_time_s;  // predict()'s
    const InsertedPeriod ok = inserted_period(a.graph, a.timeline, b.graph, b.timeline, b.costs, tol);
    CHECK_MESSAGE(ok.ok, ok.failed);
    CHECK(ok.period_s == b.step_time_s - a.step_time_s);
    // The next period adds the same time: what the two runs imply about the third holds.
    CHECK(c.step_time_s == doctest::Approx(b.step_time_s + ok.period_s).epsilon(1e-12));
    const InsertedPeriod next = inserted_period(b.graph, b.timeline, c.graph, c.timeline, c.costs, tol);
    CHECK_MESSAGE(next.ok, next.failed);
    // Two periods apart is not one.
    CHECK_FALSE(inserted_period(a.graph, a.timeline, c.graph, c.timeline, c.costs, tol).ok);

    // One op of the inserted period ending later: named.
    auto last_of = [&](const Prediction& p, int64_t micro_batch) {
      int32_t id = -1;
      for (const Op& op : p.graph.ops) {
        if (op.micro_batch == micro_batch && op.stage == 1 && op.stream == Stream::kCompute) id = op.id;
      }
      REQUIRE(id >= 0);
      return static_cast<size_t>(id);
    };
    {
      engine::Timeline late = b.timeline;
      late.ops[last_of(b, 5)].end += 1e-6;
      const InsertedPeriod r = inserted_period(a.graph, a.timeline, b.graph, late, b.costs, tol);
      CHECK_FALSE(r.ok);
      MESSAGE(r.failed);
      CHECK(r.failed.find("stage 1") != std::string::npos);
    }
    // One of a's ops running later in b than the same op or one period later.
    {
      engine::Timeline late = b.timeline;
      late.ops[last_of(b, 0)].end += 1e-6;
      CHECK_FALSE(inserted_period(a.graph, a.timeline, b.graph, late, b.costs, tol).ok);
    }
    // A dependency of the inserted period that is neither its block's one block on nor the same op.
    {
      OpGraph g = b.graph;
      const Op& op = g.ops[last_of(b, 5)];
      REQUIRE(op.dep_count > 0);
      g.deps[op.dep_begin] = g.ops.back().id;
      CHECK_FALSE(inserted_period(a.graph, a.timeline, g, b.timeline, b.costs, tol).ok);
    }
    // A host that needs longer than the period to issue it, and never waits for the device, falls behind
    // with every period. (Where it waits in each period, the timeline shows whether it keeps up.)
    {
      std::vector<cost::OpCost> slow = b.costs;
      for (cost::OpCost& cost : slow) cost.host_seconds = ok.period_s;
      OpGraph ga = a.graph, gb = b.graph;
      for (Op& op : ga.ops) op.host_sync = false;
      for (Op& op : gb.ops) op.host_sync = false;
      CHECK(inserted_period(ga, a.timeline, gb, b.timeline, b.costs, tol).ok);
      const InsertedPeriod r = inserted_period(ga, a.timeline, gb, b.timeline, slow, tol);
      CHECK_FALSE(r.ok);
      CHECK(r.failed.find("the host of stage") != std::string::npos);
    }
  }

  TEST_CASE("the check's walk over the dependencies names the same first misfit on any number of threads") {
    Layout l{"1f1b pp4", truncated("mixtral-8x7b", 8), "megatron-core", base_plan(4, 5)};
    const HardwareProfile hw = io::load_hardware("h100-sxm").value();
    const StackProfile stack = io::load_stack(l.stack).value();
    auto whole = [&](int64_t micro_batches) {
      Plan p = l.plan;
      p.global_batch = micro_batches * p.dp();
      return predict(l.model, p, hw, stack, workload::uniform_routing(8), {.whole_step = true});
    };
    const Prediction a = whole(5), b = whole(6);
    const double tol = kInsertedPeriodTolerance * b.step_time_s;
    const StreamIndex sb(b.graph, {});
    // a's first and last ops that wait for another, each made to wait for an op it does not: in the first
    // and the last of any number of slices.
    auto waits = [](const Op& op) { return op.dep_count > 0; };
    const auto first = std::find_if(a.graph.ops.begin(), a.graph.ops.end(), waits);
    const auto last = std::find_if(a.graph.ops.rbegin(), a.graph.ops.rend(), waits);
    REQUIRE(first != a.graph.ops.end());
    REQUIRE(last != a.graph.ops.rend());
    REQUIRE(first->id < last->id);
    auto check = [&](const OpGraph& g, const Op& op) {
      const std::string named =
          fmt::format("{} (stage {}, micro-batch {})", op_label(op), op.stage, op.micro_batch);
      const StreamIndex sa(g, {});
      const InsertedPeriod one = inserted_period(g, a.timeline, sa, b.graph, b.timeline, sb, b.costs, tol, 1);
      CHECK_FALSE(one.ok);
      CHECK(one.failed == named);
      for (int threads : {2, 3, 4, 7}) {
        const InsertedPeriod r =
            inserted_period(g, a.timeline, sa, b.graph, b.timeline, sb, b.costs, tol, threads);
        CHECK_FALSE(r.ok);
        CHECK(r.failed == one.failed);
      }
    };
    CHECK(inserted_period(a.graph, a.timeline, StreamIndex(a.graph, {}), b.graph, b.timeline, sb, b.costs,
                          tol, 3)
              .ok);
    OpGraph g = a.graph;
    g.deps[last->dep_begin] = a.graph.ops.front().id == g.deps[last->dep_begin] ? 1 : a.graph.ops.front().id;
    check(g, *last);
    g.deps[first->dep_begin] = a.graph.ops.back().id;
    check(g, *first);
  }
}
