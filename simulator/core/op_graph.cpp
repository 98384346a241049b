// Names of op-graph vocabulary, shared by reports and traces of both the simulator and moerun.
#include "simulator/core/op_graph.h"

#include <numeric>
#include <string>

namespace moeplan {

std::vector<int32_t> stage_ops(const OpGraph& graph, int64_t stage) {
  std::vector<int32_t> ids;
  if (graph.stage_first.size() == static_cast<size_t>(graph.num_stages) + 1) {
    if (stage < 0 || stage >= graph.num_stages) return ids;
    const auto s = static_cast<size_t>(stage);
    ids.resize(graph.stage_first[s + 1] - graph.stage_first[s]);
    std::iota(ids.begin(), ids.end(), static_cast<int32_t>(graph.stage_first[s]));
    return ids;
  }
  for (size_t i = 0; i < graph.ops.size(); ++i) {
    prefetch_op_ahead(graph.ops, i);
    if (graph.ops[i].stage == stage) ids.push_back(graph.ops[i].id);
  }
  return ids;
}

std::string op_label(const Op& op) {
  std::string s;
  s.reserve(40);
  if (op.layer >= 0) {
    s.push_back('L');
    s.append(std::to_string(op.layer));
    s.push_back('.');
  }
  s.append(kOpNames[op.name]);
  if (op.part == GemmPart::kDgrad) s += ".dgrad";
  if (op.part == GemmPart::kWgrad) s += ".wgrad";
  return s;
}

const char* name_of(OpKind k) {
  switch (k) {
    case OpKind::kGemm:
      return "gemm";
    case OpKind::kGroupedGemm:
      return "grouped_gemm";
    case OpKind::kAttention:
      return "attention";
    case OpKind::kMemoryBound:
      return "memory_bound";
    case OpKind::kCollective:
      return "collective";
    case OpKind::kSendRecv:
      return "send_recv";
    case OpKind::kFusedGemmComm:
      return "fused_gemm_comm";
    case OpKind::kOptimizer:
      return "optimizer";
  }
  return "?";
}

const char* name_of(Phase p) {
  switch (p) {
    case Phase::kForward:
      return "fwd";
    case Phase::kBackward:
      return "bwd";
    case Phase::kRecompute:
      return "recompute";
    case Phase::kOptimizer:
      return "optimizer";
  }
  return "?";
}

const char* name_of(Stream s) {
  switch (s) {
    case Stream::kCompute:
      return "compute";
    case Stream::kComm:
      return "comm";
    case Stream::kSide:
      return "side";
    case Stream::kDpComm:
      return "dp_comm";
    case Stream::kPpComm:
      return "pp_comm";
    case Stream::kTpComm:
      return "tp_comm";
    case Stream::kShared:
      return "shared";
  }
  return "?";
}

const char* name_of(CommGroup g) {
  switch (g) {
    case CommGroup::kNone:
      return "none";
    case CommGroup::kTp:
      return "tp";
    case CommGroup::kSp:
      return "sp";
    case CommGroup::kCp:
      return "cp";
    case CommGroup::kEp:
      return "ep";
    case CommGroup::kEtp:
      return "etp";
    case CommGroup::kDp:
      return "dp";
    case CommGroup::kAttnReplica:
      return "dp_attn";
    case CommGroup::kExpertDp:
      return "dp_expert";
    case CommGroup::kPp:
      return "pp";
  }
  return "?";
}

const char* name_of(Collective c) {
  switch (c) {
    case Collective::kAllReduce:
      return "all_reduce";
    case Collective::kAllGather:
      return "all_gather";
    case Collective::kReduceScatter:
      return "reduce_scatter";
    case Collective::kAllToAll:
      return "all_to_all";
    case Collective::kSendRecv:
      return "send_recv";
  }
  return "?";
}

}  // namespace moeplan
