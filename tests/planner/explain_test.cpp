// The technique ablation of explain(): the last row is the plan's own prediction, the baseline is TP-only
// without overlap, each row changes only its technique's fields, and a technique the plan does not use
// repeats the previous row.
#include <doctest/doctest.h>

#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "planner/explain.h"
#include "simulator/io/hardware_loader.h"
#include "simulator/io/model_loader.h"
#include "simulator/io/plan_io.h"
#include "simulator/io/stack_loader.h"

using namespace moeplan;

namespace {

struct Case {
  ModelSpec model = io::load_model("mixtral-8x7b").value();
  HardwareProfile hw = io::load_hardware("h100-sxm").value();
  StackProfile stack = io::load_stack("moerun").value();
  // Mixtral-8x7B on 4 nodes: Ulysses attention, EP experts, two pipeline stages, inter-operator overlap,
  // both compressions, selective recompute; no intra-operator overlap.
  Plan plan = [] {
    Plan p;
    p.model = "mixtral-8x7b";
    p.hardware = "h100-sxm";
    p.gpus = 32;
    p.seq_len = 4096;
    p.global_batch = 32;
    p.attention = {1, 2, 1};
    p.experts = {8, 1, Dispatch::kAllToAll};
    p.pipeline.pp = 2;
    p.overlap = {true, false, true, true};
    p.compression = {GradSync::kBf16AllToAll, DispatchPrecision::kFp8};
    p.recompute = Recompute::kSar;
    return p;
  }();
  workload::RoutingDistribution routing() const { return workload::uniform_routing(model.moe.num_experts); }
  std::vector<planner::ExplainRow> explain() const {
    return planner::explain(model, plan, hw, stack, routing());
  }
};

// Dotted keys whose values differ between two plans in the plan-file form.
std::set<std::string> changed_keys(const Plan& a, const Plan& b) {
  const nlohmann::json ja = io::plan_to_json(a), jb = io::plan_to_json(b);
  // Keys on either side: plan files leave some flags out while they are off.
  auto value = [](const nlohmann::json& j, const std::string& key) {
    return j.contains(key) ? j.at(key) : nlohmann::json();
  };
  std::set<std::string> out;
  for (const nlohmann::json* side : {&ja, &jb}) {
    for (auto it = side->begin(); it != side->end(); ++it) {
      const nlohmann::json x = value(ja, it.key()), y = value(jb, it.key());
      if (it->is_object()) {
        for (auto jt = it->begin(); jt != it->end(); ++jt) {
          if (value(x, jt.key()) != value(y, jt.key())) out.insert(it.key() + "." + jt.key());
        }
      } else if (x != y) {
        out.insert(it.key());
      }
    }
  }
  return out;
}

bool subset(const std::set<std::string>& a, const std::set<std::string>& allowed) {
  for (const std::string& k : a) {
    if (!allowed.contains(k)) return false;
  }
  return true;
}

// A Megatron-Core plan ranked with `xmb+dw` (combined 1F1B with delayed weight gradients): Mixtral-8x7B,
// tp 2, ep 8 on 32 GPUs, one stage, two micro-batches, no compression.
Case combined_1f1b_case(Recompute recompute) {
  Case c;
  c.stack = io::load_stack("megatron-core").value();
  c.plan.attention = {2, 1, 1};
  c.plan.pipeline.pp = 1;
  c.plan.overlap = {false, false, true, false, true, true};
  c.plan.compression = {};
  c.plan.recompute = recompute;
  return c;
}

}  // namespace

TEST_SUITE("planner") {
  TEST_CASE("the last explain row is the plan itself and predicts exactly what predict() does") {
    const Case c;
    const auto rows = c.explain();
    REQUIRE(rows.size() == 6);
    const Prediction p = predict(c.model, c.plan, c.hw, c.stack, c.routing());
    REQUIRE(p.violations.empty());
    CHECK(io::plan_to_json(rows.back().plan) == io::plan_to_json(c.plan));
    CHECK(rows.back().valid());
    CHECK(rows.back().prediction.step_time_s == p.step_time_s);
    CHECK(rows.back().prediction.tokens_per_s == p.tokens_per_s);
    CHECK(rows.back().prediction.memory.total() == p.memory.total());
    CHECK(rows.back().exposed_comm_s == planner::exposed_comm_seconds(p));
  }

  TEST_CASE("the explain baseline is TP attention and TP experts with every overlap and compression off") {
    const Case c;
    const auto rows = c.explain();
    const Plan& b = rows.front().plan;
    CHECK(b.attention.tp == 2);  // tp*sp of the plan
    CHECK(b.attention.sp == 1);
    CHECK(b.attention.cp == 1);
    CHECK(b.experts.ep == 1);
    CHECK(b.experts.etp == 8);  // ep*etp of the plan, within one node
    CHECK_FALSE(b.overlap.inter_op);
    CHECK_FALSE(b.overlap.intra_op);
    CHECK_FALSE(b.overlap.dp_comm);
    CHECK_FALSE(b.overlap.pp_comm);
    CHECK(b.compression.grad_sync == GradSync::kFp32ReduceScatter);
    CHECK(b.compression.dispatch == DispatchPrecision::kBf16);
    CHECK(b.recompute == Recompute::kFull);
    CHECK(b.pipeline.pp == 2);
    CHECK(rows.front().note.empty());
    CHECK(rows.front().valid());
    CHECK_FALSE(rows.front().comm_removed_s.has_value());
  }

  TEST_CASE("each explain row changes only the fields of its own technique") {
    const Case c;
    const auto rows = c.explain();
    REQUIRE(rows.size() == 6);
    const std::set<std::string> allowed[] = {
        {"attention.tp", "attention.sp", "attention.cp", "experts.ep", "experts.etp", "experts.dispatch"},
        {"overlap.inter_op", "overlap.dp_comm", "overlap.pp_comm", "overlap.cross_micro_batch",
         "overlap.delay_wgrad"},
        {"overlap.intra_op", "overlap.tp_comm"},
        {"compression.grad_sync", "compression.dispatch"},
        {"recompute"},
    };
    for (size_t i = 1; i < rows.size(); ++i) {
      CAPTURE(i);
      const std::set<std::string> changed = changed_keys(rows[i - 1].plan, rows[i].plan);
      CHECK(subset(changed, allowed[i - 1]));
      CHECK(changed.empty() != rows[i].in_plan);
    }
    // This plan uses every technique but intra-operator overlap.
    CHECK(changed_keys(rows[0].plan, rows[1].plan) ==
          std::set<std::string>{"attention.tp", "attention.sp", "experts.ep", "experts.etp"});
    CHECK(changed_keys(rows[3].plan, rows[4].plan) ==
          std::set<std::string>{"compression.grad_sync", "compression.dispatch"});
    CHECK(changed_keys(rows[4].plan, rows[5].plan) == std::set<std::string>{"recompute"});
  }

  TEST_CASE("combined 1F1B and its delayed weight gradients come with the inter-operator overlap row") {
    // Before, no row turned them on, so the last row was not the plan.
    const Case c = combined_1f1b_case(Recompute::kNone);
    const auto rows = c.explain();
    REQUIRE(rows.size() == 6);
    CHECK(io::plan_to_json(rows.back().plan) == io::plan_to_json(c.plan));
    CHECK(rows.back().valid());
    CHECK_FALSE(rows[1].plan.overlap.cross_micro_batch);
    CHECK(rows[2].plan.overlap.cross_micro_batch);
    CHECK(rows[2].plan.overlap.delay_wgrad);
    CHECK(rows[2].in_plan);
    CHECK(rows[2].prediction.step_time_s ==
          doctest::Approx(rows.back().prediction.step_time_s).epsilon(1e-12));
  }

  TEST_CASE("combined 1F1B with selective recompute brings the plan's recompute before the overlap rows") {
    // The baseline recomputes whole layers, under which combined 1F1B is illegal: in the order of the
    // ablation, rows 3-5 could not run. The recompute row moves up to row 3 and says why.
    Case c = combined_1f1b_case(Recompute::kSelective);
    REQUIRE(validate(c.plan, c.model, c.hw).empty());
    const auto rows = c.explain();
    REQUIRE(rows.size() == 6);
    CHECK(rows.front().plan.recompute == Recompute::kFull);
    CHECK(rows[2].technique == "+ selective recompute");
    CHECK(rows[2].note.find("cannot run with full recompute") != std::string::npos);
    CHECK(rows[3].technique == "+ inter-operator overlap");
    CHECK(rows[4].technique == "+ intra-operator overlap");
    CHECK(rows[5].technique == "+ compression");
    CHECK(io::plan_to_json(rows.back().plan) == io::plan_to_json(c.plan));
    const std::set<std::string> allowed[] = {
        {"attention.tp", "attention.sp", "attention.cp", "experts.ep", "experts.etp", "experts.dispatch"},
        {"recompute"},
        {"overlap.inter_op", "overlap.dp_comm", "overlap.pp_comm", "overlap.cross_micro_batch",
         "overlap.delay_wgrad"},
        {"overlap.intra_op", "overlap.tp_comm"},
        {"compression.grad_sync", "compression.dispatch"},
    };
    for (size_t i = 0; i < rows.size(); ++i) {
      CAPTURE(i);
      CHECK_MESSAGE(rows[i].valid(), rows[i].reason);
      if (i > 0) CHECK(subset(changed_keys(rows[i - 1].plan, rows[i].plan), allowed[i - 1]));
    }
    CHECK(changed_keys(rows[1].plan, rows[2].plan) == std::set<std::string>{"recompute"});
    CHECK(rows[3].plan.overlap.cross_micro_batch);
    CHECK(rows[3].in_plan);
    // Without combined 1F1B the order is the ablation's own.
    c.plan.overlap.cross_micro_batch = false;
    c.plan.overlap.delay_wgrad = false;
    const auto plain = c.explain();
    CHECK(plain[2].technique == "+ inter-operator overlap");
    CHECK(plain[5].technique == "+ selective recompute");
    CHECK(plain[5].note.empty());
  }

  TEST_CASE("a plan's CUDA graphs are a row of their own, after its recompute, every row legal") {
    // The baseline recomputes whole layers, under which per-layer graphs are illegal: it runs without them,
    // and the last row adds the plan's scopes; plans without graphs keep six rows.
    Case c = combined_1f1b_case(Recompute::kSelective);
    c.plan.cuda_graphs = kGraphAttn | kGraphMoeRouter | kGraphMoePreprocess;
    REQUIRE(validate(c.plan, c.model, c.hw).empty());
    const auto rows = c.explain();
    REQUIRE(rows.size() == 7);
    CHECK(rows.front().plan.cuda_graphs == 0);
    CHECK(rows.back().technique == "+ CUDA graphs");
    CHECK(rows.back().in_plan);
    CHECK(changed_keys(rows[5].plan, rows[6].plan) == std::set<std::string>{"cuda_graphs"});
    CHECK(io::plan_to_json(rows.back().plan) == io::plan_to_json(c.plan));
    for (const auto& r : rows) CHECK_MESSAGE(r.valid(), r.technique << ": " << r.reason);
    c.plan.cuda_graphs = 0;
    CHECK(c.explain().size() == 6);
  }

  TEST_CASE("a technique the plan does not use repeats the previous explain row") {
    const Case c;
    const auto rows = c.explain();
    const planner::ExplainRow& intra = rows[3];
    CHECK_FALSE(intra.in_plan);
    CHECK(intra.prediction.step_time_s == rows[2].prediction.step_time_s);
    CHECK(intra.exposed_comm_s == rows[2].exposed_comm_s);
    REQUIRE(intra.comm_removed_s.has_value());
    CHECK(*intra.comm_removed_s == 0.0);
    // Every used technique's row runs and says how much exposed communication it removed.
    for (size_t i = 1; i < rows.size(); ++i) {
      CAPTURE(i);
      CHECK(rows[i].valid());
      REQUIRE(rows[i].comm_removed_s.has_value());
      CHECK(*rows[i].comm_removed_s == doctest::Approx(rows[i - 1].exposed_comm_s - rows[i].exposed_comm_s));
    }
  }

  TEST_CASE("a plan without recompute keeps none in the baseline, so the recompute row is not in the plan") {
    Case c;
    c.plan.recompute = Recompute::kNone;
    const auto rows = c.explain();
    CHECK(rows.front().plan.recompute == Recompute::kNone);
    CHECK_FALSE(rows.back().in_plan);
    CHECK(rows.back().prediction.step_time_s == rows[4].prediction.step_time_s);
  }

  TEST_CASE("an expert mesh larger than a node gives the baseline the largest legal ETP share and a note") {
    // ep8 x etp2 = 16 GPUs: etp16 would span two nodes, so the baseline takes etp8 x ep2.
    Case c;
    c.plan.experts = {8, 2, Dispatch::kAllToAll};
    std::string note;
    const Plan b = planner::explain_baseline(c.model, c.plan, c.hw, &note);
    CHECK(b.experts.etp == 8);
    CHECK(b.experts.ep == 2);
    CHECK(note.find("ep2 etp8") != std::string::npos);
    CHECK(note.find("etp16") != std::string::npos);
    CHECK(validate(b, c.model, c.hw).empty());
  }

  TEST_CASE("the baseline keeps the plan's dispatch, so a DeepEP stack can run every row") {
    // megatron-core-deepep has no plain all-to-all: a baseline with one would be refused by the stack.
    Case c;
    c.stack = io::load_stack("megatron-core-deepep").value();
    c.plan.stack = "megatron-core-deepep";
    c.plan.attention = {2, 1, 1};
    c.plan.experts = {8, 1, Dispatch::kDedup};
    c.plan.overlap = {};
    c.plan.compression = {};
    c.plan.recompute = Recompute::kNone;
    const auto rows = c.explain();
    CHECK(rows.front().plan.experts.dispatch == Dispatch::kDedup);
    for (const auto& r : rows) {
      CAPTURE(r.technique);
      CHECK_MESSAGE(r.valid(), r.reason);
    }
  }

  TEST_CASE("an attention mesh that TP alone cannot take gives the baseline the largest legal TP share") {
    // Ulysses sp4 needs only the heads to divide; TP also splits the hidden size, and 4098 = 2 * 2049 divides
    // by tp2 but not by tp4.
    Case c;
    c.model.hidden = 4098;
    c.plan.attention = {1, 4, 1};
    std::string note;
    const Plan b = planner::explain_baseline(c.model, c.plan, c.hw, &note);
    CHECK(b.attention.tp == 2);
    CHECK(b.attention.sp == 2);
    CHECK(note.find("attention tp2 sp2") != std::string::npos);
    CHECK(note.find("hidden size") != std::string::npos);
  }

  TEST_CASE("TE's userbuffers come in with the intra-operator row, where the TP linears are split") {
    Case c;
    c.stack = io::load_stack("megatron-core").value();
    c.plan.attention = {2, 1, 1};
    c.plan.overlap = {false, false, true, true};
    c.plan.overlap.tp_comm = true;
    c.plan.compression = {};
    c.plan.recompute = Recompute::kNone;
    const auto rows = c.explain();
    REQUIRE(rows.size() == 6);
    REQUIRE(rows[3].technique == "+ intra-operator overlap");
    CHECK(changed_keys(rows[2].plan, rows[3].plan) == std::set<std::string>{"overlap.tp_comm"});
    CHECK(rows[3].in_plan);
    CHECK_MESSAGE(rows[3].valid(), rows[3].reason);
    CHECK(rows[3].prediction.step_time_s < rows[2].prediction.step_time_s);  // the exchanges hide
  }
}
