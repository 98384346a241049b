// Op-graph helpers: a stage's ops.
#include "simulator/core/op_graph.h"

#include <doctest/doctest.h>

#include <vector>

using namespace moeplan;

namespace {

OpGraph graph_of_stages(const std::vector<int16_t>& stages, int num_stages) {
  OpGraph g;
  g.num_stages = num_stages;
  for (size_t i = 0; i < stages.size(); ++i) {
    Op op;
    op.id = static_cast<int32_t>(i);
    op.stage = stages[i];
    g.ops.push_back(op);
  }
  return g;
}

}  // namespace

TEST_SUITE("core") {
  TEST_CASE("a stage's ops are read from every op where the graph has no stage ranges") {
    const OpGraph g = graph_of_stages({1, 0, 2, 1, 0, 1}, 3);
    CHECK(stage_ops(g, 0) == std::vector<int32_t>{1, 4});
    CHECK(stage_ops(g, 1) == std::vector<int32_t>{0, 3, 5});
    CHECK(stage_ops(g, 2) == std::vector<int32_t>{2});
    CHECK(stage_ops(g, 3).empty());
  }

  TEST_CASE("a stage's ops are its id range where the graph has stage ranges, an empty stage included") {
    OpGraph g = graph_of_stages({0, 0, 2, 2, 2}, 3);
    g.stage_first = {0, 2, 2, 5};
    CHECK(stage_ops(g, 0) == std::vector<int32_t>{0, 1});
    CHECK(stage_ops(g, 1).empty());
    CHECK(stage_ops(g, 2) == std::vector<int32_t>{2, 3, 4});
    CHECK(stage_ops(g, -1).empty());
    CHECK(stage_ops(g, 3).empty());
  }
}
