// The plan's process groups as NCCL communicators, for the GPU backend: the world from a unique id that world
// rank 0 makes and MPI broadcasts (the Debian OpenMPI is not CUDA-aware: MPI carries only this host data),
// then one ncclCommSplit of the world per group kind, with the members of make_process_groups' MPI
// communicators (rank_layout: color = the group's first world rank, key = the rank in the group); with
// pipeline parallelism, one two-rank communicator per directed pipeline link, split from the pipeline group
// (a link's sends and receives then come from one host thread on each side: NCCL's calls on one
// communicator must not race, and its point-to-point operations match in the order each side issues them).
#pragma once

#include <mpi.h>

#include <array>
#include <map>
#include <memory>
#include <span>
#include <utility>

#include "executor/comm/nccl_communicator.h"
#include "executor/comm/process_groups.h"

namespace moeplan::executor {

class NcclGroups {
 public:
  // The group of kind g that this rank belongs to (kNone: world).
  NcclCommunicator& of(CommGroup g);
  NcclCommunicator& world() { return *world_; }
  // The link from stage `from` to stage `to` (the sender is its rank 0, the receiver its rank 1); nullptr
  // unless this rank's stage is one of its ends and the link was made.
  NcclCommunicator* link(int from, int to);
  // ncclCommAbort on every communicator (the watchdog's way out of a hung collective).
  void abort_all();

 private:
  friend Result<NcclGroups> make_nccl_groups(const RankLayout& layout, MPI_Comm world,
                                             std::span<const std::pair<int, int>> links);
  std::unique_ptr<NcclCommunicator> world_;
  std::array<std::unique_ptr<NcclCommunicator>, 10> groups_;  // indexed by CommGroup
  std::map<std::pair<int, int>, std::unique_ptr<NcclCommunicator>> links_;
};

// Collective over `world` (every rank calls it, each with its CUDA device already selected; NCCL refuses two
// ranks on one device). `layout` is this rank's rank_layout of the plan; `links` the graph's directed
// pipeline links (pipeline_links in executor/runtime/stage_schedule.h), the same list on every rank: one
// ncclCommSplit of the pipeline group each, in this order.
Result<NcclGroups> make_nccl_groups(const RankLayout& layout, MPI_Comm world,
                                    std::span<const std::pair<int, int>> links = {});

}  // namespace moeplan::executor
