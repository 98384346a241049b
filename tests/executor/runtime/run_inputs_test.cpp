// Tests of plan loading for execution (executor/runtime/run_inputs.h).
#include "executor/runtime/run_inputs.h"

#include <doctest/doctest.h>

#include "tests/executor/runtime/runtime_fixtures.h"

namespace moeplan::executor {

TEST_SUITE("executor_runtime") {
  TEST_CASE("a legal plan loads with an op graph of one stage per pipeline stage") {
    const RunInputs in = test::load_tiny("inputs_pp2", test::tiny_plan(2, test::kPp2));
    CHECK(in.violations.empty());
    CHECK(in.graph.num_stages == 2);
    CHECK(!in.graph.ops.empty());
    CHECK(in.expert_load_scale >= 1.0);
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
