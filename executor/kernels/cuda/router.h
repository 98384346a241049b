// MoE router on the GPU (op router, after its GEMM), the CPU kernel's definitions
// (executor/kernels/cpu/moe.h): p = softmax over all experts of the logits; the top-k experts by p (ties to
// the lower expert index), in descending order of p; gates = the top-k p renormalised to sum to 1
// (renormalize) or the raw p. The Switch auxiliary loss uses per-expert assignment counts and sums of p over
// the local tokens, which the executor sums over the ranks that split the micro-batch before router_aux_loss.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace moeplan::cuda {

inline constexpr int kRouterMaxExperts = 256;
inline constexpr int kRouterMaxTopK = 8;

// Bytes of router_forward's workspace: per-warp partial counts and probability sums.
size_t router_forward_workspace_bytes(int64_t tokens, int64_t experts);

// logits [tokens, experts] fp32 -> probs [tokens, experts] fp32 (kept for the backward), top_experts
// [tokens, k] int32 (slot 0 the largest p), gates [tokens, k] fp32, counts [experts] int32 (assignments over
// these tokens; they sum to tokens * k), prob_sums [experts] fp32 (sum over these tokens of p_e). counts and
// prob_sums are overwritten, summed in a fixed order (deterministic). experts <= 256, 1 <= k <= min(8,
// experts).
void router_forward(const float* logits, int64_t tokens, int64_t experts, int64_t top_k, bool renormalize,
                    float* probs, int32_t* top_experts, float* gates, int32_t* counts, float* prob_sums,
                    void* workspace, cudaStream_t stream);

// From the global stats (summed over the ranks splitting the micro-batch; tokens = the micro-batch's):
// loss [1] = coef * E * sum_e (counts_e / (T k)) * (prob_sums_e / T), and when dprobs is not null
// dprobs [E] = scale * coef * E / T * counts_e / (T k) (the gradient of scale * loss with respect to every
// token's p_e; it is the same for every token).
void router_aux_loss(const int32_t* counts, const float* prob_sums, int64_t experts, int64_t tokens,
                     int64_t top_k, double coef, double scale, float* loss, float* dprobs,
                     cudaStream_t stream);

// dgates [tokens, k] fp32 (from unpermute_backward) and aux_dprobs [experts] (null for none) -> dlogits
// [tokens, experts] fp32: dp_e = aux_dp_e + sum over slots j with e_j = e of (renormalize ? (dg_j - sum_l
// dg_l g_l) / sum_l p_{e_l} : dg_j), dlogits = p * (dp - p . dp).
void router_backward(const float* probs, const int32_t* top_experts, const float* gates, const float* dgates,
                     const float* aux_dprobs, int64_t tokens, int64_t experts, int64_t top_k,
                     bool renormalize, float* dlogits, cudaStream_t stream);

}  // namespace moeplan::cuda
