// Cross-entropy on the GPU (op loss), the CPU kernel's definitions (executor/kernels/cpu/vocab.h): per-token
// loss = log(sum_j exp(logit_j)) - logit_target with a numerically stable log-sum-exp, and dlogits =
// scale * (softmax - onehot(target)). Logits in fp32 or bf16 (what the lm_head GEMM writes); fp32 math.
// Vocabulary shards: the columns are [v0, v0 + vocab); a target outside them contributes 0 to target_logit,
// and the executor combines shards as lse = log(sum_shards exp(lse_shard)), target_logit = sum over shards.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace moeplan::cuda {

// Preconditions (bugs when broken): vocab % 8 == 0, logits and dlogits 16-byte aligned.

// logits [rows, vocab], targets [rows] int64 -> lse [rows] fp32 (log-sum-exp over the shard), target_logit
// [rows] fp32, and when loss is not null loss [rows] fp32 = lse - target_logit (the loss when unsharded).
void cross_entropy_forward(const float* logits, const int64_t* targets, int64_t rows, int64_t vocab,
                           int64_t v0, float* lse, float* target_logit, float* loss, cudaStream_t stream);
void cross_entropy_forward(const __nv_bfloat16* logits, const int64_t* targets, int64_t rows, int64_t vocab,
                           int64_t v0, float* lse, float* target_logit, float* loss, cudaStream_t stream);

// dlogits [rows, vocab] = scale * (exp(logit - lse) - [col == target]), lse the global log-sum-exp and scale
// typically 1 / tokens. dlogits may alias logits (in place).
void cross_entropy_backward(const float* logits, const int64_t* targets, int64_t rows, int64_t vocab,
                            int64_t v0, const float* lse, float scale, float* dlogits, cudaStream_t stream);
void cross_entropy_backward(const __nv_bfloat16* logits, const int64_t* targets, int64_t rows, int64_t vocab,
                            int64_t v0, const float* lse, float scale, __nv_bfloat16* dlogits,
                            cudaStream_t stream);

}  // namespace moeplan::cuda
