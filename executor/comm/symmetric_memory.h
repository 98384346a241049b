// SymmetricMemory: one buffer per rank of an NCCL communicator, registered as a symmetric window (NCCL
// 2.28's device API), that every rank can load from and store to directly over NVLink. It is what the fused
// GEMM + communication kernels (executor/kernels/cuda/fused/fused_gemm_comm.h) get as their peers' buffers:
// peer(p) is rank p's buffer mapped into this process (ncclGetPeerPointer, read once on the device at
// creation). Only ranks in one load/store domain (one NVLink node) qualify; a communicator that spans more
// is refused with a reason. NCCL itself decides whether a communicator supports symmetric memory at all
// (nccl_requirement() says on what); NCCL before 2.28.7 never gives it to a communicator with one rank on
// its node, so a one-rank group gets an error there, not a window.
#pragma once

#include <array>
#include <cstddef>
#include <memory>
#include <string>

#include "executor/comm/nccl_communicator.h"
#include "simulator/core/status.h"

namespace moeplan::executor {

class SymmetricMemory {
 public:
  static constexpr int kMaxPeers = 8;

  // Collective over `comm`: each rank allocates `bytes` (rounded up to NCCL's window alignment) with
  // ncclMemAlloc, zeroes it, registers it (NCCL_WIN_COLL_SYMMETRIC) and reads the peers' addresses. Returns
  // after every rank's buffer is zeroed, so peers may write into it at once.
  static Result<std::unique_ptr<SymmetricMemory>> create(NcclCommunicator& comm, size_t bytes);
  // What the NCCL this process runs (ncclGetVersion) requires of a communicator for symmetric memory, in
  // words; create's error says it when NCCL refuses.
  static std::string nccl_requirement();
  // Whether that NCCL can give symmetric memory to a communicator with one rank on its node (a one-rank
  // group): from 2.28.7 on, not before.
  static bool nccl_supports_one_rank_per_node();
  ~SymmetricMemory();
  SymmetricMemory(const SymmetricMemory&) = delete;
  SymmetricMemory& operator=(const SymmetricMemory&) = delete;

  int rank() const { return rank_; }
  int ranks() const { return ranks_; }
  size_t bytes() const { return bytes_; }
  void* local() const { return peers_[static_cast<size_t>(rank_)]; }
  void* peer(int p) const { return peers_[static_cast<size_t>(p)]; }

 private:
  SymmetricMemory() = default;
  ncclComm_t comm_ = nullptr;
  ncclWindow_t window_ = nullptr;
  void* buffer_ = nullptr;
  size_t bytes_ = 0;
  int rank_ = 0, ranks_ = 1;
  std::array<void*, kMaxPeers> peers_{};
};

}  // namespace moeplan::executor
