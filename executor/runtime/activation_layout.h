// Where each micro-batch's saved activations lie on the GPU replay. A forward op that keeps tensors for its
// backward writes them into its micro-batch's stash, and the backward ops of that micro-batch read them
// there, so the replay holds the stage's activations at their real size, a stash per micro-batch in flight,
// instead of scratch buffers every op shares (which stay hot in L2 and hold none of the activation memory).
// What a forward op keeps here (saved_bytes):
//   - a GEMM: its input X [m, k], which the weight-gradient GEMM reads again; bf16, or e4m3 for an FP8 dense
//     GEMM (the transposable copy the weight gradient reads);
//   - a grouped expert GEMM: its input rows [m, k] in bf16 (the replay's expert weight gradients are bf16);
//   - attention: q, k, v, the output and the softmax statistics of each of its calls (attention_calls);
//   - RMSNorm: its input [rows, cols] (bf16) and the inverse RMS of each row (fp32);
//   - SwiGLU: its input [rows, 2 cols] (bf16).
// Routing, permutes, RoPE, the loss and the ops that run as copies keep theirs in scratch. A tensor two
// forwards keep is kept once, as autograd holds it: where a forward keeps what the forward it depends on
// directly wrote as it is (a GEMM's input from a norm, SwiGLU or attention; SwiGLU's input from a bf16
// GEMM), that producer writes its output into the consumer's slice (an attention's o already lies in its
// own), and the producer's other such consumers read it there; a test holds the stash within the memory
// model's activations. A forward the stage recomputes keeps nothing across the pipeline.
// A stage holds, per chunk, as many stashes as it has micro-batches of that chunk whose first stashing
// forward has run and whose last reading backward has not, in graph order (the order its lanes issue); a
// micro-batch takes the lowest stash free when its first stashing forward runs, so stashes rotate.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <span>
#include <utility>
#include <vector>

#include "simulator/core/attention_calls.h"
#include "simulator/core/op_graph.h"

namespace moeplan::executor {

struct SavedSlice {
  int64_t offset = 0;  // in bytes from its chunk's stash start
  int64_t bytes = 0;
  int16_t chunk = 0;  // the chunk whose stashes hold it (its layer's)
};

struct ActivationLayout {
  using Key = std::pair<int32_t, uint16_t>;  // (layer, op name)
  // A forward that keeps a tensor another forward of its micro-batch keeps: where it lies in that one's
  // slice.
  struct Alias {
    Key owner;
    int64_t delta = 0;  // bytes into the owner's slice
    int64_t bytes = 0;
  };
  std::map<Key, SavedSlice> slices;  // by the forward's key: the tensors it alone keeps
  std::map<Key, Alias> aliases;      // forwards that share another's tensor (no slice of their own)
  std::map<Key, Key> outputs;        // producers that write their output into a consumer's slice
  std::vector<int64_t> stash_bytes;  // per chunk: one micro-batch's saved tensors
  std::vector<int64_t> stashes;      // per chunk: stashes the stage holds
  std::vector<int64_t> chunk_base;   // per chunk: where its stashes start in the buffer
  std::map<std::pair<int16_t, int32_t>, int32_t> stash_of;  // (chunk, micro-batch) -> stash index
  int64_t bytes = 0;                                        // the buffer: every chunk's stashes

  // Where `op`'s saved tensors lie in the buffer (its forward's slice in its micro-batch's stash), or -1 when
  // it keeps or reads none there.
  int64_t offset_of(const Op& op) const;
  // That slice's bytes (0 where offset_of is -1).
  int64_t bytes_of(const Op& op) const;
  // Where a forward writes its output, in its micro-batch's stash (the slice of the consumer that keeps it),
  // or -1 where it writes elsewhere; and those bytes.
  int64_t output_offset(const Op& op) const;
  int64_t output_bytes_of(const Op& op) const;
  // Where the tensors of a forward `key` of `micro_batch` lie (its alias resolved), or -1.
  int64_t place(const Key& key, int32_t micro_batch) const;
};

// The ops the replay runs on the project's RMSNorm and SwiGLU kernels: a memory-bound op of a norm's name, an
// activation op of SwiGLU's (MemOp::kGlu), each with the tensor it walks stated ([rows, cols] in gemm.m, n).
bool is_rmsnorm(const Op& op);
bool is_swiglu(const Op& op);

// The bytes of an attention call's saved tensors in the order the replay lays them out: q, k, v, o (bf16)
// and the softmax statistics (fp32, one per query and head), each rounded up to 256 bytes.
std::array<int64_t, 5> attention_saved_parts(const AttentionCall& c);

// An RMSNorm's saved tensors in the replay's order: the input (bf16) and the inverse RMS per row (fp32),
// each rounded up to 256 bytes.
std::array<int64_t, 2> norm_saved_parts(int64_t rows, int64_t cols);

// An attention op's saved tensors: attention_saved_parts of each of its calls.
int64_t attention_saved_bytes(const Op& op);

// What a forward (Phase::kForward) op keeps in its micro-batch's stash; 0 for any other op.
int64_t saved_bytes(const Op& op);

// Whether `op` (a backward op) reads its forward's stash: a weight-gradient GEMM, an attention, RMSNorm or
// SwiGLU backward.
bool reads_saved(const Op& op);

// The stashes of `stage`'s ops of `graph`.
ActivationLayout activation_layout(const OpGraph& graph, int stage);

}  // namespace moeplan::executor
