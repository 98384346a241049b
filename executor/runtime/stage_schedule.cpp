// Builds one stage's lanes and local dependencies from the op graph (see stage_schedule.h).
#include "executor/runtime/stage_schedule.h"
#include "simulator/core/status.h"

#include <algorithm>
#include <map>
#include <set>

namespace moeplan::executor {

StageSchedule schedule_stage(const OpGraph& graph, int stage) {
  StageSchedule s;
  s.stage = stage;
  s.task_of_op.assign(graph.ops.size(), -1);

  // Lanes: the streams this stage uses, in Stream order.
  int lane_of_stream[kNumStreams];
  std::fill(std::begin(lane_of_stream), std::end(lane_of_stream), -1);
  for (const Op& op : graph.ops) {
    if (op.stage == stage) lane_of_stream[static_cast<int>(op.stream)] = 0;
  }
  for (int k = 0; k < kNumStreams; ++k) {
    if (lane_of_stream[k] < 0) continue;
    lane_of_stream[k] = static_cast<int>(s.lanes.size());
    s.lanes.emplace_back();
    s.lane_names.emplace_back(name_of(static_cast<Stream>(k)));
  }
  for (const Op& op : graph.ops) {
    if (op.stage != stage) continue;
    StageTask t;
    t.op = op.id;
    t.lane = lane_of_stream[static_cast<int>(op.stream)];
    s.task_of_op[static_cast<size_t>(op.id)] = static_cast<int32_t>(s.tasks.size());
    s.tasks.push_back(std::move(t));
  }

  // Receives: one per foreign send this stage depends on, on a lane per source stage.
  std::map<int32_t, int32_t> receive_of_send;  // send op id -> task index (ordered by id = send order)
  for (const Op& op : graph.ops) {
    if (op.stage != stage) continue;
    for (int32_t d : graph.deps_of(op)) {
      const Op& dep = graph.ops[static_cast<size_t>(d)];
      if (dep.stage == stage) continue;
      MOEPLAN_ASSERT(dep.kind == OpKind::kSendRecv);  // stages only meet through pipeline sends
      receive_of_send.emplace(d, -1);
    }
  }
  std::map<int, int> lane_of_source;
  for (auto& [send, task] : receive_of_send) {
    const int source = graph.ops[static_cast<size_t>(send)].stage;
    auto it = lane_of_source.find(source);
    if (it == lane_of_source.end()) {
      it = lane_of_source.emplace(source, static_cast<int>(s.lanes.size())).first;
      s.lanes.emplace_back();
      s.lane_names.push_back("recv<-stage" + std::to_string(source));
    }
    StageTask t;
    t.op = send;
    t.receive = true;
    t.lane = it->second;
    task = static_cast<int32_t>(s.tasks.size());
    s.tasks.push_back(std::move(t));
  }

  // Local dependencies, and the lanes' issue order (graph order; receives in send order).
  for (StageTask& t : s.tasks) {
    if (t.receive) continue;
    const Op& op = graph.ops[static_cast<size_t>(t.op)];
    for (int32_t d : graph.deps_of(op)) {
      const int32_t local = graph.ops[static_cast<size_t>(d)].stage == stage
                                ? s.task_of_op[static_cast<size_t>(d)]
                                : receive_of_send.at(d);
      MOEPLAN_ASSERT(local >= 0);
      t.deps.push_back(local);
    }
  }
  for (size_t i = 0; i < s.tasks.size(); ++i)
    s.lanes[static_cast<size_t>(s.tasks[i].lane)].push_back(static_cast<int32_t>(i));
  return s;
}

int pipeline_peer_stage(const OpGraph& graph, const Op& send) {
  MOEPLAN_ASSERT(send.kind == OpKind::kSendRecv);
  const int pp = graph.num_stages;
  const bool forward = send.phase == Phase::kForward;
  return forward ? (send.stage + 1) % pp : (send.stage + pp - 1) % pp;
}

int pipeline_tag(const OpGraph& graph, const Op& send) {
  const int64_t mb = send.micro_batch, chunks = graph.chunks_per_stage;
  return static_cast<int>((mb * chunks + send.chunk) * 2 + (send.phase == Phase::kForward ? 0 : 1));
}

std::vector<std::pair<int, int>> pipeline_links(const OpGraph& graph) {
  std::set<std::pair<int, int>> links;
  for (const Op& op : graph.ops) {
    if (op.kind == OpKind::kSendRecv) links.emplace(op.stage, pipeline_peer_stage(graph, op));
  }
  return {links.begin(), links.end()};
}

}  // namespace moeplan::executor
