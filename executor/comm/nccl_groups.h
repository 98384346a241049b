// The plan's process groups as NCCL communicators, for the GPU backend: the world from a unique id that world
// rank 0 makes and MPI broadcasts (the Debian OpenMPI is not CUDA-aware: MPI carries only this host data),
// then one ncclCommSplit of the world per group kind, with the members of make_process_groups' MPI
// communicators (rank_layout: color = the group's first world rank, key = the rank in the group).
#pragma once

#include <mpi.h>

#include <array>
#include <memory>

#include "executor/comm/nccl_communicator.h"
#include "executor/comm/process_groups.h"

namespace moeplan::executor {

class NcclGroups {
 public:
  // The group of kind g that this rank belongs to (kNone: world).
  NcclCommunicator& of(CommGroup g);
  NcclCommunicator& world() { return *world_; }
  // ncclCommAbort on every communicator (the watchdog's way out of a hung collective).
  void abort_all();

 private:
  friend Result<NcclGroups> make_nccl_groups(const RankLayout& layout, MPI_Comm world);
  std::unique_ptr<NcclCommunicator> world_;
  std::array<std::unique_ptr<NcclCommunicator>, 10> groups_;  // indexed by CommGroup
};

// Collective over `world` (every rank calls it, each with its CUDA device already selected; NCCL refuses two
// ranks on one device). `layout` is this rank's rank_layout of the plan.
Result<NcclGroups> make_nccl_groups(const RankLayout& layout, MPI_Comm world);

}  // namespace moeplan::executor
