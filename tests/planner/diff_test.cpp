// diff: the plan fields that differ and the figures of two reports, by category.
#include "planner/diff.h"

#include <doctest/doctest.h>

using nlohmann::json;
using namespace moeplan::planner;

TEST_SUITE("diff") {
  TEST_CASE("diff_fields lists exactly the differing leaves with dotted keys, one-sided keys as null") {
    const json a = {{"gpus", 16}, {"experts", {{"ep", 8}, {"etp", 1}}}, {"recompute", "none"}};
    const json b = {
        {"gpus", 16}, {"experts", {{"ep", 4}, {"etp", 1}}}, {"recompute", "selective"}, {"stack", "x"}};
    const auto d = diff_fields(a, b);
    REQUIRE(d.size() == 3);
    CHECK(d[0].key == "experts.ep");
    CHECK(d[0].a == 8);
    CHECK(d[0].b == 4);
    CHECK(d[1].key == "recompute");
    CHECK(d[2].key == "stack");
    CHECK(d[2].a.is_null());
    CHECK(diff_fields(a, a).empty());
  }

  TEST_CASE("diff_reports: headline, every compute and communication category of either side, memory") {
    const json a = {
        {"step_time_s", 2.0},
        {"tokens_per_s", 100.0},
        {"breakdown", {{"compute", {{"gemm", 1.0}}}, {"exposed_comm", {{"ep", 0.5}}}, {"bubble", 0.2}}},
        {"memory", {{"per_gpu_bytes", 10.0}, {"components", {{"weights", 4.0}}}}}};
    const json b = {
        {"step_time_s", 1.5},
        {"tokens_per_s", 133.0},
        {"breakdown", {{"compute", {{"gemm", 1.0}, {"attention", 0.1}}}, {"exposed_comm", json::object()}}},
        {"memory", {{"per_gpu_bytes", 12.0}, {"components", {{"weights", 4.0}, {"activations", 8.0}}}}}};
    const auto rows = diff_reports(a, b);
    auto row = [&](const std::string& k) -> const FigureDiff& {
      for (const auto& r : rows)
        if (r.key == k) return r;
      FAIL("no row " << k);
      return rows.front();
    };
    CHECK(row("step_time_s").change() == doctest::Approx(-0.5));
    CHECK(row("step_time_s").relative() == doctest::Approx(-0.25));
    CHECK(row("breakdown.compute.attention").a == 0);
    CHECK(row("breakdown.compute.attention").b == doctest::Approx(0.1));
    CHECK(row("breakdown.exposed_comm.ep").b == 0);
    CHECK(row("breakdown.bubble").b == 0);
    CHECK(row("memory.components.activations").unit == "bytes");
    CHECK(rows.front().key == "step_time_s");
  }
}
