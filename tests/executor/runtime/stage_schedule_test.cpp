// Tests of one stage's lanes, receives and local dependencies (executor/runtime/stage_schedule.h).
#include "executor/runtime/stage_schedule.h"

#include <doctest/doctest.h>

#include <set>

#include "tests/executor/runtime/runtime_fixtures.h"

namespace moeplan::executor {

TEST_SUITE("executor_runtime") {
  TEST_CASE("every op of a stage is scheduled once on the lane of its stream and no other stage's op is") {
    const RunInputs in = test::load_tiny("sched_pp2", test::tiny_plan(2, test::kPp2));
    const OpGraph& g = in.graph;
    REQUIRE(g.num_stages == 2);
    for (int stage = 0; stage < 2; ++stage) {
      const StageSchedule s = schedule_stage(g, stage);
      std::set<int32_t> seen;
      for (const StageTask& t : s.tasks) {
        if (t.receive) continue;
        const Op& op = g.ops[static_cast<size_t>(t.op)];
        CHECK(op.stage == stage);
        CHECK(s.lane_names[static_cast<size_t>(t.lane)] == name_of(op.stream));
        CHECK(seen.insert(t.op).second);
      }
      size_t on_stage = 0;
      for (const Op& op : g.ops) on_stage += op.stage == stage ? 1 : 0;
      CHECK(seen.size() == on_stage);
    }
  }

  TEST_CASE("a stage receives each neighbour send it depends on in the order the neighbour sends them") {
    const RunInputs in = test::load_tiny("sched_vpp2", test::tiny_plan(2, test::kPp2Vpp2, 256, 8));
    const OpGraph& g = in.graph;
    for (int stage = 0; stage < 2; ++stage) {
      const StageSchedule s = schedule_stage(g, stage);
      int receives = 0;
      for (size_t lane = 0; lane < s.lanes.size(); ++lane) {
        int32_t prev = -1;
        for (int32_t ti : s.lanes[lane]) {
          const StageTask& t = s.tasks[static_cast<size_t>(ti)];
          if (!t.receive) continue;
          ++receives;
          const Op& send = g.ops[static_cast<size_t>(t.op)];
          CHECK(send.kind == OpKind::kSendRecv);
          CHECK(send.stage != stage);
          CHECK(pipeline_peer_stage(g, send) == stage);
          CHECK(t.op > prev);  // the sender's graph order is its issue order
          prev = t.op;
        }
      }
      // One receive per send addressed to this stage.
      int expected = 0;
      for (const Op& op : g.ops)
        expected += op.kind == OpKind::kSendRecv && op.stage != stage && pipeline_peer_stage(g, op) == stage;
      CHECK(receives == expected);
      CHECK(receives > 0);
    }
  }

  TEST_CASE("pipeline tags are unique among the sends from one stage to another") {
    const RunInputs in = test::load_tiny("sched_tags", test::tiny_plan(2, test::kPp2Vpp2, 256, 8));
    const OpGraph& g = in.graph;
    std::set<std::tuple<int, int, int>> tags;
    int sends = 0;
    for (const Op& op : g.ops) {
      if (op.kind != OpKind::kSendRecv) continue;
      ++sends;
      CHECK(tags.insert({op.stage, pipeline_peer_stage(g, op), pipeline_tag(g, op)}).second);
      CHECK(pipeline_tag(g, op) < 32767);  // MPI guarantees tags up to 32767
    }
    CHECK(sends > 0);
  }

  TEST_CASE("dependencies inside a lane always point to earlier tasks of that lane") {
    const RunInputs in = test::load_tiny("sched_deps", test::tiny_plan(2, test::kDp2Ep2));
    const StageSchedule s = schedule_stage(in.graph, 0);
    std::vector<int> position(s.tasks.size(), -1);
    for (const auto& lane : s.lanes) {
      for (size_t i = 0; i < lane.size(); ++i) position[static_cast<size_t>(lane[i])] = static_cast<int>(i);
    }
    for (size_t i = 0; i < s.tasks.size(); ++i) {
      for (int32_t d : s.tasks[i].deps) {
        if (s.tasks[static_cast<size_t>(d)].lane == s.tasks[i].lane)
          CHECK(position[static_cast<size_t>(d)] < position[i]);
      }
    }
    CHECK(s.lanes.size() >= 2);  // inter-op overlap puts collectives beside compute
  }
}

}  // namespace moeplan::executor
