// moerun's attention core on the GPU: causal (or full) GQA flash attention, bf16, forward and backward, run
// by cuDNN's fused SDPA graphs (cudnn_frontend). The GPU counterpart of executor/kernels/cpu/attention.h for
// one shard holding whole sequences: same token-major layout, same scores, same log-sum-exp.
//
//   q, o, do, dq [batch, seq, q_heads, head_dim] bf16: token-major, i.e. the CPU kernel's [Tq, Hl D] with the
//     batch's sequences stacked (what Megatron's BSHD/THD layouts hold).
//   k, v, dk, dv [batch, keys, kv_heads, head_dim] bf16; query head h reads kv head h / (q_heads / kv_heads).
//   v, o, do, dv have v_dim columns per head where it differs from head_dim (MLA).
//   stats [batch, q_heads, seq] fp32: lse = log sum_j exp(s_ij), natural log, the CPU kernel's lse
//   transposed.
//     cuDNN before 9.26 reads the backward's stats only in this head-major layout (cudnn_frontend 1.32,
//     node/scaled_dot_product_flash_attention.h), so we keep it rather than the CPU's [Tq, Hl].
//   Scores s_ij = scale q_i . k_j; causal: key j is visible to query i iff j <= i (the CPU kernel with
//     q_pos = k_pos = 0 .. seq-1). Backward: dk, dv of a kv head sum over the query heads of its group.
//
// All cudnn_frontend code lives in attention.cpp: its headers make one heavy translation unit.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cudnn_graph.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace moeplan::cuda {

using bf16 = __nv_bfloat16;

struct AttentionShape {
  int64_t batch = 0;
  int64_t seq = 0;  // queries per sequence (and keys, for self-attention)
  int64_t q_heads = 0;
  int64_t kv_heads = 0;  // divides q_heads
  int64_t head_dim = 0;  // of q and k
  bool causal = true;
  float scale = 0;  // softmax scale; 0 selects 1/sqrt(head_dim), the CPU kernel's
  // Keys per sequence when they differ from the queries (context parallelism's parts, cross-attention): a
  // causal mask then aligns the diagonal bottom-right (query i sees key j iff j <= i + keys - seq). 0: seq.
  int64_t seq_kv = 0;
  int64_t v_dim = 0;   // of v, o, do, dv (MLA: 128 beside head_dim 192); 0: head_dim
  int64_t window = 0;  // causal sliding window: query i sees only keys with i' - j < window; 0: none

  float softmax_scale() const;
  int64_t keys() const { return seq_kv > 0 ? seq_kv : seq; }
  int64_t value_dim() const { return v_dim > 0 ? v_dim : head_dim; }
  int64_t q_elems() const { return batch * seq * q_heads * head_dim; }         // q, dq
  int64_t o_elems() const { return batch * seq * q_heads * value_dim(); }      // o, do
  int64_t k_elems() const { return batch * keys() * kv_heads * head_dim; }     // k, dk
  int64_t v_elems() const { return batch * keys() * kv_heads * value_dim(); }  // v, dv
  int64_t stats_elems() const { return batch * q_heads * seq; }
};

// Owns a cuDNN handle (cudnnCreate / cudnnDestroy); one per device and host thread.
class CudnnHandle {
 public:
  CudnnHandle();
  ~CudnnHandle();
  CudnnHandle(const CudnnHandle&) = delete;
  CudnnHandle& operator=(const CudnnHandle&) = delete;
  cudnnHandle_t get() const { return handle_; }

 private:
  cudnnHandle_t handle_ = nullptr;
};

// One attention shape: builds the forward and backward cuDNN graphs and their plans once, at construction
// (hundreds of ms; keep one object per shape, e.g. one for all layers of a model), and owns the workspace
// both plans need. forward() and backward() enqueue on `stream` (set on the handle) and return without
// syncing. Not thread-safe: the workspace and the handle's stream are shared by the calls.
class FlashAttention {
 public:
  FlashAttention(cudnnHandle_t handle, const AttentionShape& shape);
  ~FlashAttention();
  FlashAttention(FlashAttention&&) noexcept;
  FlashAttention& operator=(FlashAttention&&) noexcept;

  // Empty when both graphs built; else why not, naming the cuDNN version, the device's architecture and the
  // stage that refused (e.g. head_dim not a multiple of 8, cuDNN 9.10.0's known SDPA bug). Calling forward()
  // or backward() on an unsupported object is a bug and aborts.
  const std::string& unsupported() const;
  const AttentionShape& shape() const;
  size_t workspace_bytes() const;

  // o = softmax(s) v per head; stats = lse per (sequence, head, query), needed by backward().
  void forward(const bf16* q, const bf16* k, const bf16* v, bf16* o, float* stats, cudaStream_t stream);

  // Gradients from the forward's o and stats. dq, dk, dv are overwritten (not accumulated).
  void backward(const bf16* q, const bf16* k, const bf16* v, const bf16* o, const bf16* d_o,
                const float* stats, bf16* dq, bf16* dk, bf16* dv, cudaStream_t stream);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moeplan::cuda
