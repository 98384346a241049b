// The work of one rank: the ops of its pipeline stage, grouped into lanes (one worker thread per stream the
// stage uses, plus one per neighbouring stage it receives pipeline messages from), with local dependencies.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "simulator/core/op_graph.h"

namespace moeplan::executor {

struct StageTask {
  int32_t op = -1;       // op id; for a receive, the id of the neighbouring stage's send op
  bool receive = false;  // the receiving half of a pipeline send
  int lane = 0;
  std::vector<int32_t> deps;  // task indices that must end before this task starts
};

struct StageSchedule {
  int stage = 0;
  std::vector<StageTask> tasks;
  std::vector<std::vector<int32_t>> lanes;  // task indices per lane, in issue order
  std::vector<std::string> lane_names;      // "compute", "pp_comm", "recv<-stage1"
  std::vector<int32_t> task_of_op;          // op id -> task index (-1: not run by this stage)
};

// Ops of `stage` in graph order on the lane of their stream. Dependencies on another stage's pipeline send
// become dependencies on a receive task; receives from one source stage run in that stage's send order (its
// sends are on one stream, issued in graph order), so blocking send / recv pairs always match.
StageSchedule schedule_stage(const OpGraph& graph, int stage);

// Pipeline peers and tags. A send goes to the next virtual stage (forward) or the previous one (backward);
// the tag is unique per (micro-batch, sender chunk, direction) between two stages.
int pipeline_peer_stage(const OpGraph& graph, const Op& send);
int pipeline_tag(const OpGraph& graph, const Op& send);

// The graph's directed pipeline links, (sending stage, receiving stage) for each pair of stages a send goes
// between, sorted. Every rank derives the same list from the same graph: the GPU backend makes one NCCL
// communicator per link from it, in this order, so that each communicator is used by one host thread on each
// of its two ranks (the sender's pipeline lane, the receiver's lane for that source stage) and carries one
// direction only, its sends and receives issued in the same order on both sides.
std::vector<std::pair<int, int>> pipeline_links(const OpGraph& graph);

}  // namespace moeplan::executor
