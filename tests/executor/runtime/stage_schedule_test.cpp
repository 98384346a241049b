// Tests of one stage's lanes, receives and local dependencies (executor/runtime/stage_schedule.h).
#include "executor/runtime/stage_schedule.h"

#include <doctest/doctest.h>

#include <map>
#include <set>
#include <string>

#include "tests/executor/runtime/runtime_fixtures.h"

namespace moeplan::executor {
namespace {

// Runs every stage's lanes as a GPU runs them once enqueued: each lane in order, a task once the tasks it
// depends on have ended, and a pipeline send only together with its receive, once that receive is the next
// task of the receiver's lane for its source (NCCL's send blocks its stream until the peer's receive runs;
// counting that as the worst case). Returns "" when every task ends, else the tasks each lane is stuck at.
std::string run_with_blocking_sends(const OpGraph& g) {
  std::vector<StageSchedule> stages;
  for (int s = 0; s < g.num_stages; ++s) stages.push_back(schedule_stage(g, s));
  std::map<int32_t, std::pair<int, int32_t>> receive_of_send;  // send op -> (stage, task)
  for (const StageSchedule& s : stages) {
    for (size_t i = 0; i < s.tasks.size(); ++i) {
      if (s.tasks[i].receive) receive_of_send[s.tasks[i].op] = {s.stage, static_cast<int32_t>(i)};
    }
  }
  std::vector<std::vector<size_t>> next(stages.size());  // per stage and lane: the next task's position
  std::vector<std::vector<char>> ended(stages.size());
  for (size_t s = 0; s < stages.size(); ++s) {
    next[s].assign(stages[s].lanes.size(), 0);
    ended[s].assign(stages[s].tasks.size(), 0);
  }
  auto head = [&](size_t s, size_t lane) -> int32_t {
    const auto& l = stages[s].lanes[lane];
    return next[s][lane] < l.size() ? l[next[s][lane]] : -1;
  };
  auto ready = [&](size_t s, int32_t t) {
    for (int32_t d : stages[s].tasks[static_cast<size_t>(t)].deps)
      if (!ended[s][static_cast<size_t>(d)]) return false;
    return true;
  };
  for (bool moved = true; moved;) {
    moved = false;
    for (size_t s = 0; s < stages.size(); ++s) {
      for (size_t lane = 0; lane < stages[s].lanes.size(); ++lane) {
        const int32_t t = head(s, lane);
        if (t < 0 || stages[s].tasks[static_cast<size_t>(t)].receive || !ready(s, t)) continue;
        const Op& op = g.ops[static_cast<size_t>(stages[s].tasks[static_cast<size_t>(t)].op)];
        if (op.kind == OpKind::kSendRecv) {
          const auto [rs, rt] = receive_of_send.at(op.id);
          const size_t r = static_cast<size_t>(rs);
          const size_t rlane = static_cast<size_t>(stages[r].tasks[static_cast<size_t>(rt)].lane);
          if (head(r, rlane) != rt) continue;
          ended[r][static_cast<size_t>(rt)] = 1;
          ++next[r][rlane];
        }
        ended[s][static_cast<size_t>(t)] = 1;
        ++next[s][lane];
        moved = true;
      }
    }
  }
  std::string stuck;
  for (size_t s = 0; s < stages.size(); ++s) {
    for (size_t lane = 0; lane < stages[s].lanes.size(); ++lane) {
      const int32_t t = head(s, lane);
      if (t < 0) continue;
      const StageTask& task = stages[s].tasks[static_cast<size_t>(t)];
      stuck += "stage " + std::to_string(s) + " " + stages[s].lane_names[lane] + ": " +
               (task.receive ? "receive of " : "") + op_label(g.ops[static_cast<size_t>(task.op)]) + "; ";
    }
  }
  return stuck;
}

const char* kPp4 =
    "\"attention\": {\"tp\": 1, \"sp\": 1, \"cp\": 1}, \"experts\": {\"ep\": 1, \"etp\": 1}, "
    "\"pipeline\": {\"pp\": 4, \"vpp\": 1, \"schedule\": \"1f1b\"}";
const char* kPp2DualPipeV =
    "\"attention\": {\"tp\": 1, \"sp\": 1, \"cp\": 1}, \"experts\": {\"ep\": 1, \"etp\": 1}, "
    "\"pipeline\": {\"pp\": 2, \"vpp\": 2, \"schedule\": \"dualpipev\"}";

}  // namespace

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

  TEST_CASE("each pipeline send goes over one directed link to the stage whose ops wait for it") {
    struct Case {
      const char* name;
      int gpus;
      const char* fields;
      int batch;
    };
    for (const Case& c : {Case{"links_pp2", 2, test::kPp2, 4}, Case{"links_vpp2", 2, test::kPp2Vpp2, 8},
                          Case{"links_pp4", 4, kPp4, 8}, Case{"links_dpv", 2, kPp2DualPipeV, 8}}) {
      const std::string label = c.name;
      CAPTURE(label);
      const RunInputs in = test::load_tiny(c.name, test::tiny_plan(c.gpus, c.fields, 256, c.batch));
      const OpGraph& g = in.graph;
      std::set<std::pair<int, int>> used;
      for (const Op& op : g.ops) {
        for (int32_t d : g.deps_of(op)) {
          const Op& dep = g.ops[static_cast<size_t>(d)];
          if (dep.stage == op.stage) continue;
          CHECK(dep.kind == OpKind::kSendRecv);
          CHECK(pipeline_peer_stage(g, dep) == op.stage);
          used.emplace(dep.stage, op.stage);
        }
      }
      const std::vector<std::pair<int, int>> links = pipeline_links(g);
      CHECK(std::set<std::pair<int, int>>(links.begin(), links.end()) == used);
      CHECK(std::is_sorted(links.begin(), links.end()));
      for (const auto& [from, to] : links) CHECK(from != to);
      // A pipeline of p stages has its forward and backward links between neighbours (and, interleaved, the
      // last stage's to the first and back).
      CHECK(links.size() >= static_cast<size_t>(2 * (g.num_stages - 1)));
    }
  }

  TEST_CASE("every stage's lanes run to the end when each pipeline send waits for its receive") {
    for (const auto& [name, gpus, fields, batch] :
         {std::tuple{"block_pp2", 2, test::kPp2, 4}, std::tuple{"block_vpp2", 2, test::kPp2Vpp2, 8},
          std::tuple{"block_pp4", 4, kPp4, 8}, std::tuple{"block_pp4_m3", 4, kPp4, 3},
          std::tuple{"block_dpv", 2, kPp2DualPipeV, 8}}) {
      const std::string label = name;
      CAPTURE(label);
      const RunInputs in = test::load_tiny(name, test::tiny_plan(gpus, fields, 256, batch));
      CHECK(run_with_blocking_sends(in.graph) == "");
    }
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
