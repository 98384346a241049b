// Tests of the stage's parameter buffer layout (executor/runtime/param_layout.h).
#include "executor/runtime/param_layout.h"

#include <doctest/doctest.h>

#include <set>

#include "simulator/core/model_stats.h"
#include "tests/executor/runtime/runtime_fixtures.h"

namespace moeplan::executor {

TEST_SUITE("executor_runtime") {
  TEST_CASE("a stage's weights are packed once each, and every GEMM of one weight finds the same slice") {
    const RunInputs in = test::load_tiny("params_pp2", test::tiny_plan(2, test::kPp2Vpp2, 256, 8));
    const OpGraph& g = in.graph;
    for (int stage = 0; stage < 2; ++stage) {
      const ParamLayout l = param_layout(g.ops, stage);
      REQUIRE(!l.slices.empty());
      // Slices are disjoint, aligned and inside the buffer.
      int64_t end = 0;
      for (const auto& [key, s] : l.slices) {
        CHECK(s.offset >= end);
        CHECK(s.offset % 256 == 0);
        end = s.offset + s.elements;
      }
      CHECK(end <= l.elements);
      // Each GEMM of the stage (forward, recomputed forward, dgrad, wgrad, every micro-batch) has a slice of
      // its weight's size; another stage's ops have none here.
      int parts[3] = {0, 0, 0};
      for (const Op& op : g.ops) {
        if (!has_weight(op)) continue;
        const ParamSlice* s = l.of(op);
        if (op.stage != stage) {
          // Layers live on one stage; the head's and embedding's names are the stage's own too.
          if (s != nullptr) CHECK(op.layer < 0);
          continue;
        }
        REQUIRE(s != nullptr);
        CHECK(s->elements == std::max<int64_t>(1, op.gemm.groups) * op.gemm.k * op.gemm.n);
        ++parts[static_cast<int>(op.part)];
      }
      CHECK(parts[static_cast<int>(GemmPart::kNone)] > 0);
      CHECK(parts[static_cast<int>(GemmPart::kDgrad)] > 0);
      CHECK(parts[static_cast<int>(GemmPart::kWgrad)] > 0);
    }
  }

  TEST_CASE("one rank's parameter buffer holds the model's GEMM weights: all but the embedding and norms") {
    const RunInputs in = test::load_tiny(
        "params_one",
        test::tiny_plan(1,
                        "\"attention\": {\"tp\": 1, \"sp\": 1, \"cp\": 1}, \"experts\": {\"ep\": 1, "
                        "\"etp\": 1}, \"pipeline\": {\"pp\": 1, \"vpp\": 1, \"schedule\": \"1f1b\"}"));
    const ParamLayout l = param_layout(in.graph.ops, 0);
    const ParamBreakdown p = count_params(in.loaded.model).total;
    int64_t packed = 0;
    for (const auto& [key, s] : l.slices) packed += s.elements;
    const double gemm_weights = p.total() - p.embedding - p.norms;
    CAPTURE(packed);
    CAPTURE(gemm_weights);
    // tiny-moe has no biases (parameters outside GEMM operands): every other parameter is a GEMM weight.
    CHECK(static_cast<double>(packed) == gemm_weights);
  }
}

}  // namespace moeplan::executor
