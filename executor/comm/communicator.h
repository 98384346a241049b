// Communicator: the collectives one group of ranks runs, behind one interface so that the MPI (CPU) and NCCL
// (GPU) backends swap. Values are fp32 in memory; a wire format rounds them to what actually crosses the
// link (BF16 gradients, FP8 dispatch), so compressed plans compute with the precision they would have.
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace moeplan::executor {

// What crosses the wire. kBf16: round-to-nearest-even to bfloat16 (16 bits per value on the wire).
// kFp8E4m3: per block of 128 consecutive values, scale = amax / 448, values rounded to e4m3 (saturating),
// one fp32 scale per block on the wire. Reductions always add in fp32 after the values arrive.
enum class WireFormat : uint8_t { kFp32, kBf16, kFp8E4m3 };

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // For messages and traces: "tp", "ep", "dp", ... and the member world ranks, e.g. "ep[0,2,4,6]".
  virtual const std::string& name() const = 0;

  // In place: data = sum over the group of every rank's data.
  virtual void all_reduce(std::span<float> data, WireFormat wire) = 0;
  // out.size() == in.size() * size(); rank r's `in` lands at out[r * in.size(), (r + 1) * in.size()).
  virtual void all_gather(std::span<const float> in, std::span<float> out, WireFormat wire) = 0;
  // in.size() == out.size() * size(); out = sum over ranks r of r's in[rank() * out.size(), ...).
  virtual void reduce_scatter(std::span<const float> in, std::span<float> out, WireFormat wire) = 0;
  // Variable all-to-all. send_counts[p] values go to peer p, taken consecutively from `in` in peer order;
  // recv_counts[p] values arrive from peer p, stored consecutively in `out` in peer order (counts in values).
  virtual void all_to_all_v(std::span<const float> in, std::span<const int64_t> send_counts,
                            std::span<float> out, std::span<const int64_t> recv_counts, WireFormat wire) = 0;
  // Point to point within the group (peer is a group rank). Blocking.
  virtual void send(std::span<const float> data, int peer, int tag, WireFormat wire) = 0;
  virtual void recv(std::span<float> data, int peer, int tag, WireFormat wire) = 0;
  virtual void barrier() = 0;
};

}  // namespace moeplan::executor
