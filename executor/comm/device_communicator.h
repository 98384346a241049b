// DeviceCommunicator: the collectives of one group of GPUs, on device buffers, enqueued on a CUDA stream -
// the GPU backend's counterpart of Communicator (communicator.h), which works on host fp32 spans. Reductions
// sum. Element types are simulator/core's DType (kFp8 is e4m3, moved as bytes and never reduced).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "simulator/core/units.h"

namespace moeplan::executor {

class DeviceCommunicator {
 public:
  virtual ~DeviceCommunicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const std::string& name() const = 0;

  // In place: data[count] = sum over the group.
  virtual void all_reduce(void* data, size_t count, DType type, cudaStream_t stream) = 0;
  // out[size() * count]: rank r's in[count] at r * count.
  virtual void all_gather(const void* in, void* out, size_t count, DType type, cudaStream_t stream) = 0;
  // in[size() * count] -> out[count] = sum over ranks of their in[rank() * count, ...).
  virtual void reduce_scatter(const void* in, void* out, size_t count, DType type, cudaStream_t stream) = 0;
  // Variable all-to-all; counts (host, in elements) per peer, segments consecutive in peer order.
  virtual void all_to_all_v(const void* in, std::span<const int64_t> send_counts, void* out,
                            std::span<const int64_t> recv_counts, DType type, cudaStream_t stream) = 0;
  // Point to point within the group (peer is a group rank).
  virtual void send(const void* data, size_t count, DType type, int peer, cudaStream_t stream) = 0;
  virtual void recv(void* data, size_t count, DType type, int peer, cudaStream_t stream) = 0;
};

}  // namespace moeplan::executor
