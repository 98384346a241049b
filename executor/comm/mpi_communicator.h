// MpiCommunicator: the Communicator of the CPU backend, over one MPI communicator. Collectives are built from
// MPI all-to-all / all-gather / point-to-point byte transfers of packed wire formats, and every reduction
// adds in fp32, in rank order, after the values arrive, so results are bit-identical on every rank and
// independent of MPI's algorithm choice. Every call waits for its transfer without spinning a core (the
// nonblocking call, then tests with yields and short sleeps): the stream threads of a rank share its core.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <string>
#include <vector>

#include "executor/comm/communicator.h"
#include "simulator/core/status.h"

namespace moeplan::executor {

// MPI_Init_thread asking for MPI_THREAD_MULTIPLE (stream threads call different communicators at once).
// Returns the provided level, or an error naming it when it is lower (the caller should MPI_Finalize and exit
// 2). When MPI is already initialised, only checks the level.
Result<int> init_mpi(int* argc, char*** argv);

// "ep[0,2,4,6]": a group name and its members' world ranks.
std::string group_name(const std::string& kind, const std::vector<int>& world_ranks);

// Thread safety: one thread at a time per communicator (its scratch buffers are its own); different
// communicators may be used concurrently from different threads.
class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm` (freed in the destructor) unless it is MPI_COMM_WORLD or MPI_COMM_SELF.
  MpiCommunicator(MPI_Comm comm, std::string name);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  MPI_Comm comm() const { return comm_; }

  // Error bounds for the executor's tolerances, u = relative_error_bound(wire) (wire_format.h; fp8 adds its
  // subnormal floor 2^-10 scale per rounding), s = the exact sum, fp32 additions aside (p 2^-24 sum |x_r|):
  //   all_gather |out - x| <= u |x|;  reduce_scatter |out - s| <= u sum_r |x_r|;
  //   all_reduce |out - s| <= u sum_r |x_r| + u (|s| + u sum_r |x_r|)  (inputs rounded, then the sum).
  // all_reduce: reduce_scatter of zero-padded chunks of ceil(n / size) values, then all_gather of the reduced
  // chunks (both legs in `wire`; each rank's own chunk is rounded too, so every rank holds the same bits).
  void all_reduce(std::span<float> data, WireFormat wire) override;
  void all_gather(std::span<const float> in, std::span<float> out, WireFormat wire) override;
  // All-to-all of packed chunks (chunk p to rank p), then out = sum over r = 0..size-1 of chunk r, in fp32.
  void reduce_scatter(std::span<const float> in, std::span<float> out, WireFormat wire) override;
  void all_to_all_v(std::span<const float> in, std::span<const int64_t> send_counts, std::span<float> out,
                    std::span<const int64_t> recv_counts, WireFormat wire) override;
  void send(std::span<const float> data, int peer, int tag, WireFormat wire) override;
  void recv(std::span<float> data, int peer, int tag, WireFormat wire) override;
  void barrier() override;

 private:
  // Packed all-to-all: `in` holds size() segments of `send_counts` values; out receives `recv_counts`.
  void exchange(std::span<const float> in, std::span<const int64_t> send_counts, std::span<float> out,
                std::span<const int64_t> recv_counts, WireFormat wire);

  MPI_Comm comm_;
  bool owned_;
  int rank_ = 0;
  int size_ = 1;
  std::string name_;
  std::vector<std::byte> send_bytes_, recv_bytes_;  // packed payloads
  std::vector<float> scratch_, chunk_,
      padded_;  // [size, chunk] received; [chunk] reduced; [size, chunk] all_reduce
};

}  // namespace moeplan::executor
