// NcclCommunicator: DeviceCommunicator over one NCCL communicator. The world communicator is made from a
// unique id that rank 0 creates and the others receive out of band (MPI carries it: nccl_groups.h); every
// plan group is an ncclCommSplit of the world (color: the group's first world rank, key: the rank in the
// group), as MpiCommunicator's groups are MPI_Comm_split's. Failures: setup returns an error naming the
// NCCL call and its message; a collective that fails to enqueue aborts the process with the same; abort()
// (ncclCommAbort) tears a hung communicator down, for the watchdog.
#pragma once

#include <nccl.h>

#include <memory>
#include <string>

#include "executor/comm/device_communicator.h"
#include "simulator/core/status.h"

namespace moeplan::executor {

class NcclCommunicator final : public DeviceCommunicator {
 public:
  // ncclCommInitRank on the current CUDA device: collective over the `nranks` callers with the same id.
  static Result<std::unique_ptr<NcclCommunicator>> init(const ncclUniqueId& id, int nranks, int rank,
                                                        std::string name);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  // ncclCommSplit: collective over this communicator; ranks with the same color form one group, ordered by
  // key. A rank whose color is NCCL_SPLIT_NOCOLOR joins no group and gets nullptr.
  Result<std::unique_ptr<NcclCommunicator>> split(int color, int key, std::string name);
  // Empty while healthy; else NCCL's asynchronous error (ncclCommGetAsyncError).
  std::string async_error() const;
  // ncclCommAbort: returns at once even when a collective of this communicator hangs; the object is then
  // unusable.
  void abort();

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  ncclComm_t comm() const { return comm_; }

  void all_reduce(void* data, size_t count, DType type, cudaStream_t stream) override;
  void all_gather(const void* in, void* out, size_t count, DType type, cudaStream_t stream) override;
  void reduce_scatter(const void* in, void* out, size_t count, DType type, cudaStream_t stream) override;
  void all_to_all_v(const void* in, std::span<const int64_t> send_counts, void* out,
                    std::span<const int64_t> recv_counts, DType type, cudaStream_t stream) override;
  void send(const void* data, size_t count, DType type, int peer, cudaStream_t stream) override;
  void recv(void* data, size_t count, DType type, int peer, cudaStream_t stream) override;

 private:
  NcclCommunicator(ncclComm_t comm, std::string name);
  ncclComm_t comm_ = nullptr;
  int rank_ = 0, size_ = 1;
  std::string name_;
  bool aborted_ = false;
};

// A fresh unique id (rank 0 of a world calls it; host sockets only, no device needed).
Result<ncclUniqueId> nccl_unique_id();

}  // namespace moeplan::executor
