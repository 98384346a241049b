// The step timeline's layout (planner/report/svg_charts.h): one rectangle per op while the budget allows,
// merged ops accounted for, the stages drawn, and marks that add up to the breakdown.
#include "planner/report/svg_charts.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "tests/planner/report/report_fixtures.h"

using namespace moeplan;
using moeplan::test::op_rects;
using moeplan::test::ops_with_duration;
using moeplan::test::Simulated;

TEST_SUITE("report.svg") {
  TEST_CASE("a small plan's timeline draws one rectangle per op with a duration") {
    const Simulated s("tiny-moe-ep2.json");
    const report::TimelineLayout t = report::timeline_layout(s.p);
    CHECK(t.merge_resolution_s == 0);
    CHECK(t.ops_drawn == ops_with_duration(s.p, t.stages));
    CHECK(t.ops_drawn > 50);
    const auto rects = op_rects(report::simulate_html(s.p, s.ctx()));
    CHECK(static_cast<int64_t>(rects.size()) == t.ops_drawn);
    CHECK(std::all_of(rects.begin(), rects.end(), [](int64_t n) { return n == 1; }));
  }

  TEST_CASE("over the rectangle budget the timeline merges ops, accounts for every one and says so") {
    const Simulated s("tiny-moe-ep2.json");
    const report::HtmlOptions small{
        .max_timeline_rects = 60, .max_timeline_stages = 12, .assumptions = nullptr};
    const report::TimelineLayout t = report::timeline_layout(s.p, small);
    CHECK(t.merge_resolution_s > 0);
    CHECK(static_cast<int64_t>(t.rects.size()) <= 60);
    const std::string html = report::simulate_html(s.p, s.ctx(), small);
    const auto rects = op_rects(html);
    int64_t covered = 0;
    for (int64_t n : rects) covered += n;
    CHECK(covered == ops_with_duration(s.p, t.stages));
    CHECK(static_cast<int64_t>(rects.size()) < covered);
    CHECK(html.find("id=\"merged\"") != std::string::npos);
  }

  TEST_CASE("a deep pipeline draws the first, last and critical stages and names the ones it shows") {
    const Simulated s("mixtral-8x22b-128xh100.json");  // pp 8
    REQUIRE(s.p.graph.num_stages == 8);
    const report::TimelineLayout t = report::timeline_layout(
        s.p, {.max_timeline_rects = 3000, .max_timeline_stages = 4, .assumptions = nullptr});
    CHECK(t.stages.size() == 4);
    CHECK(t.stages.front() == 0);
    CHECK(t.stages.back() == 7);
    CHECK(std::find(t.stages.begin(), t.stages.end(), s.p.critical_stage) != t.stages.end());
    CHECK(static_cast<int64_t>(t.rects.size()) <= 3000);
    const std::string html = report::simulate_html(
        s.p, s.ctx(), {.max_timeline_rects = 3000, .max_timeline_stages = 4, .assumptions = nullptr});
    CHECK(html.find("Showing 4 of 8 pipeline stages") != std::string::npos);
  }

  TEST_CASE("the exposed-communication and idle marks of the breakdown's stage add up to the breakdown") {
    // Without merging, the marks are the intervals stage_breakdown attributes to exposed communication and
    // to the bubble, so their lengths sum to those parts (pp 8: a real bubble; EP all-to-all: exposed comm).
    // The whole step: where the periodic steady state is extrapolated, the timeline draws only the run that
    // was simulated.
    const Simulated s("mixtral-8x22b-128xh100.json", {.whole_step = true});
    const report::TimelineLayout t = report::timeline_layout(
        s.p, {.max_timeline_rects = int64_t{1} << 40, .max_timeline_stages = 8, .assumptions = nullptr});
    REQUIRE(t.merge_resolution_s == 0);
    double exposed = 0, idle = 0;
    for (const auto& r : t.rects) {
      if (t.rows[static_cast<size_t>(r.row)].stage != s.p.critical_stage) continue;
      if (r.kind == report::MarkKind::kExposedComm) exposed += r.end - r.start;
      if (r.kind == report::MarkKind::kIdle) idle += r.end - r.start;
    }
    double comm = 0;
    for (const auto& [k, v] : s.p.breakdown.exposed_comm) comm += v;
    REQUIRE(comm > 0);
    REQUIRE(s.p.breakdown.bubble > 0);
    CHECK(exposed == doctest::Approx(comm).epsilon(1e-9));
    CHECK(idle == doctest::Approx(s.p.breakdown.bubble).epsilon(1e-9));
  }
}
