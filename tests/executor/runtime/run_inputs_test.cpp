// Tests of plan loading for execution (executor/runtime/run_inputs.h).
#include "executor/runtime/run_inputs.h"

#include <doctest/doctest.h>

#include "simulator/io/router_trace.h"
#include "simulator/io/stack_loader.h"
#include "simulator/predict/predict.h"
#include "tests/executor/runtime/runtime_fixtures.h"

namespace moeplan::executor {

TEST_SUITE("executor_runtime") {
  TEST_CASE("a legal plan loads with an op graph of one stage per pipeline stage") {
    const RunInputs in = test::load_tiny("inputs_pp2", test::tiny_plan(2, test::kPp2));
    CHECK(in.violations.empty());
    CHECK(in.graph.num_stages == 2);
    CHECK(!in.graph.ops.empty());
    CHECK(in.lowering.expert_load_scale >= 1.0);
  }

  TEST_CASE("moerun runs the graph predict() prices: same ops, shapes and dependencies, on every stack") {
    for (const std::string stack : {"moerun", "megatron-core", "megatron-core-deepep"}) {
      CAPTURE(stack);
      // DeepEP's dispatcher is the node-deduplicated all-to-all.
      const std::string dispatch = stack.ends_with("deepep") ? "dedup" : "all_to_all";
      const std::string fields =
          "\"attention\": {\"tp\": 1, \"sp\": 1, \"cp\": 1}, \"experts\": {\"ep\": 2, \"etp\": 1, "
          "\"dispatch\": \"" +
          dispatch +
          "\"}, \"routing\": {\"distribution\": \"zipf:1.1\"}, "
          "\"overlap\": {\"inter_op\": true, \"intra_op\": false, \"dp_comm\": true, \"pp_comm\": true, "
          "\"cross_micro_batch\": true}";
      std::string text = test::tiny_plan(4, fields);
      text.insert(1, "\"stack\": \"" + stack + "\", ");
      const RunInputs in = test::load_tiny("inputs_same", text);
      REQUIRE(in.violations.empty());
      const Plan& plan = in.loaded.plan;
      Result<StackProfile> st = io::load_stack(stack, "");
      REQUIRE(st);
      Result<workload::RoutingDistribution> routing =
          io::routing_distribution(plan.routing.distribution, in.loaded.model.moe.num_experts, "");
      REQUIRE(routing);
      const Prediction p = predict(in.loaded.model, plan, in.loaded.hardware, st.value(), routing.value());
      REQUIRE(p.violations.empty());
      const OpGraph& a = in.graph;
      const OpGraph& b = p.graph;
      REQUIRE(a.ops.size() == b.ops.size());
      CHECK(a.deps == b.deps);
      int differing = 0;
      for (size_t i = 0; i < a.ops.size(); ++i) {
        const Op &x = a.ops[i], &y = b.ops[i];
        const bool same = x.name == y.name && x.kind == y.kind && x.phase == y.phase &&
                          x.stream == y.stream && x.stage == y.stage && x.micro_batch == y.micro_batch &&
                          x.flops == y.flops && x.hbm_bytes == y.hbm_bytes && x.comm.bytes == y.comm.bytes &&
                          x.gemm.m == y.gemm.m && x.kernels == y.kernels && x.host_sync == y.host_sync &&
                          x.dep_begin == y.dep_begin && x.dep_count == y.dep_count;
        differing += same ? 0 : 1;
      }
      CHECK(differing == 0);
      CHECK(in.lowering.expert_load_scale > 1.0);  // zipf routing loads one EP rank more than the other
    }
  }

  TEST_CASE("an unreadable plan is an error naming the file") {
    Result<RunInputs> in = load_run_inputs("/nonexistent/plan.json");
    REQUIRE(!in);
    CHECK(in.error().message.find("/nonexistent/plan.json") != std::string::npos);
  }

  TEST_CASE("a plan that breaks a rule loads with its violations and no graph") {
    // ep 3 does not divide tiny-moe's 8 experts.
    const RunInputs in = test::load_tiny(
        "inputs_bad",
        test::tiny_plan(3, "\"attention\": {\"tp\": 1, \"sp\": 1, \"cp\": 1}, \"experts\": {\"ep\": 3}"));
    CHECK(!in.violations.empty());
    CHECK(in.graph.ops.empty());
  }
}

}  // namespace moeplan::executor
