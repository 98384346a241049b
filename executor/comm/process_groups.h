// Process groups of a plan: which world ranks form each tp, sp, cp, ep, etp, dp, attention-replica, expert-dp
// and pp group, in the rank order of the simulator's lowering (simulator/workload/lower.cpp, group_comm):
// inside a pipeline stage, attention ranks are tp fastest, then sp, cp, dp; expert ranks are etp fastest,
// then ep, expert-dp; the stage (pp) is outermost. rank_layout is pure; make_process_groups builds MPI
// communicators.
#pragma once

#include <mpi.h>

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "executor/comm/mpi_communicator.h"
#include "simulator/core/op_graph.h"
#include "simulator/core/plan.h"
#include "simulator/core/status.h"

namespace moeplan::executor {

// The group kinds with members (every CommGroup except kNone), in enum order.
inline constexpr std::array<CommGroup, 9> kGroupKinds = {
    CommGroup::kTp, CommGroup::kSp,          CommGroup::kCp,       CommGroup::kEp, CommGroup::kEtp,
    CommGroup::kDp, CommGroup::kAttnReplica, CommGroup::kExpertDp, CommGroup::kPp};

struct GroupPlace {
  int index = 0;             // this rank's rank within the group
  std::vector<int> members;  // world ranks, in group-rank order: first + i * stride
};

struct RankLayout {
  int world_rank = 0;
  int stage = 0;                      // pipeline stage (world_rank / (gpus / pp))
  std::array<GroupPlace, 10> groups;  // indexed by CommGroup; kNone is {0, {world_rank}}

  const GroupPlace& of(CommGroup g) const { return groups[static_cast<size_t>(g)]; }
};

// Group sizes and strides (in world ranks):
//   tp  tp, 1;   sp  sp, tp;   cp  cp, tp sp;   dp  dp, tp sp cp;   attn_replica  sp cp dp, tp
//   etp etp, 1;  ep  ep, etp;  expert_dp  gpus_per_stage / (ep etp), ep etp
//   pp  pp, gpus / pp  (the lowering's kPp CommSpec is one send between two adjacent stages: size 2, the same
//       stride; this group holds all pp stages).
// Requires a plan whose degrees divide (gpus % pp, gpus_per_stage % attention mesh and expert mesh).
RankLayout rank_layout(const Plan& plan, int world_rank);

// Why a plan's meshes cannot be laid out on `world_size` ranks; empty when they can.
std::string layout_error(const Plan& plan, int world_size);

class ProcessGroups {
 public:
  // The group of kind g that this rank belongs to (kNone: world).
  Communicator& of(CommGroup g);
  Communicator& world();
  // A second communicator over the same ranks as of(g), for reductions a runner performs inside an op (not
  // collectives of the op graph): under inter-operator overlap another stream's thread may be running a graph
  // collective on of(g) at the same moment, and two collectives on one communicator from different threads
  // could be matched in different orders on different ranks.
  Communicator& internal(CommGroup g);
  const RankLayout& layout() const { return layout_; }

 private:
  friend Result<ProcessGroups> make_process_groups(const Plan& plan, MPI_Comm world);
  RankLayout layout_;
  std::unique_ptr<MpiCommunicator> world_;
  std::array<std::unique_ptr<MpiCommunicator>, 10> groups_;    // indexed by CommGroup
  std::array<std::unique_ptr<MpiCommunicator>, 10> internal_;  // indexed by CommGroup (kNone: world)
};

// This rank's place on its node: the ranks of `world` that share its memory (MPI_COMM_TYPE_SHARED), ordered
// by world rank. Collective over `world`.
struct NodePlace {
  int local_rank = 0;
  int local_size = 1;
};
NodePlace node_place(MPI_Comm world);

// The CUDA device of a rank, one GPU per local rank: local_rank when the node shows at least local_size
// devices; device 0 when each rank sees one device (a launcher that binds one GPU per task, e.g. srun
// --gpus-per-task=1); otherwise an error saying how many ranks and devices the node has.
Result<int> device_for_rank(NodePlace place, int visible_devices);

// "" when the node's ranks use distinct devices; otherwise a line naming the first two local ranks that share
// one (ids: each local rank's device PCI bus id, in local-rank order).
std::string shared_device_error(const std::vector<std::string>& bus_ids);

// One MPI_Comm_split of `world` per group kind (collective over `world`: every rank must call it). The world
// size must equal plan.gpus. Communicators are named like "ep[0,2,4,6]".
Result<ProcessGroups> make_process_groups(const Plan& plan, MPI_Comm world);

}  // namespace moeplan::executor
