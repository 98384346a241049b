// Router kernels: one warp per token, each lane holding experts lane, lane + 32, ... (up to 8) in registers;
// softmax and top-k by warp shuffles; per-warp statistics reduced by a second kernel in warp order.
#include <climits>

#include "executor/kernels/cuda/memory_common.cuh"
#include "executor/kernels/cuda/router.h"

namespace moeplan::cuda {
namespace {

constexpr int kPerLane = kRouterMaxExperts / 32;
constexpr int kWarpsPerBlock = 8;
constexpr int64_t kMaxBlocks = 264;  // 2 per SM of an H100/H200: enough warps, few partial rows

int64_t forward_blocks(int64_t tokens) {
  const int64_t b = (tokens + kWarpsPerBlock - 1) / kWarpsPerBlock;
  return b < 1 ? 1 : (b > kMaxBlocks ? kMaxBlocks : b);
}

// part_counts, part_sums: [warps of the grid, experts], this warp's sums over its tokens.
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    router_forward_kernel(const float* __restrict__ logits, int64_t tokens, int experts, int top_k,
                          bool renormalize, float* __restrict__ probs, int32_t* __restrict__ top_experts,
                          float* __restrict__ gates, int32_t* __restrict__ part_counts,
                          float* __restrict__ part_sums) {
  const int lane = threadIdx.x & 31;
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  float psum[kPerLane];
  int cnt[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    psum[i] = 0.0f;
    cnt[i] = 0;
  }
  for (int64_t t = warp; t < tokens; t += warps) {
    const float* l = logits + t * experts;
    float p[kPerLane];
    float m = -INFINITY;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int e = lane + 32 * i;
      p[i] = e < experts ? l[e] : -INFINITY;
      m = fmaxf(m, p[i]);
    }
    m = detail::warp_max(m);
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      p[i] = lane + 32 * i < experts ? expf(p[i] - m) : 0.0f;
      s += p[i];
    }
    s = detail::warp_sum(s);
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int e = lane + 32 * i;
      if (e < experts) {
        p[i] /= s;
        probs[t * experts + e] = p[i];
        psum[i] += p[i];
      }
    }
    // Top-k: k rounds of a warp arg-max over the experts not yet taken; larger p wins, ties to the lower id.
    unsigned taken = 0;
    float top_p[kRouterMaxTopK];
    int top_e[kRouterMaxTopK];
    float denom = 0.0f;
#pragma unroll
    for (int j = 0; j < kRouterMaxTopK; ++j) {
      if (j >= top_k) break;
      float bv = -1.0f;
      int be = INT_MAX;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const int e = lane + 32 * i;
        if (e < experts && !((taken >> i) & 1u) && p[i] > bv) {
          bv = p[i];
          be = e;
        }
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oe = __shfl_xor_sync(0xffffffffu, be, o);
        if (ov > bv || (ov == bv && oe < be)) {
          bv = ov;
          be = oe;
        }
      }
      if ((be & 31) == lane) {
        taken |= 1u << (be >> 5);
#pragma unroll
        for (int i = 0; i < kPerLane; ++i) cnt[i] += (be >> 5) == i ? 1 : 0;
      }
      top_p[j] = bv;
      top_e[j] = be;
      denom += bv;
    }
    if (lane == 0) {
#pragma unroll
      for (int j = 0; j < kRouterMaxTopK; ++j) {
        if (j >= top_k) break;
        top_experts[t * top_k + j] = top_e[j];
        gates[t * top_k + j] = renormalize ? top_p[j] / denom : top_p[j];
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + 32 * i;
    if (e < experts) {
      part_counts[warp * experts + e] = cnt[i];
      part_sums[warp * experts + e] = psum[i];
    }
  }
}

// counts[e], prob_sums[e] = sums over the grid's warps of the partials. A block takes 32 experts; its 16
// thread rows each sum every 16th warp (coalesced rows), then thread row 0 adds the 16 sums in order
// (deterministic).
constexpr int kSumCols = 32, kSumRows = 16;
__global__ void router_stats_kernel(const int32_t* __restrict__ part_counts,
                                    const float* __restrict__ part_sums, int64_t warps, int experts,
                                    int32_t* __restrict__ counts, float* __restrict__ prob_sums) {
  __shared__ float sums[kSumRows][kSumCols + 1];
  __shared__ int32_t cnts[kSumRows][kSumCols + 1];
  const int e = blockIdx.x * kSumCols + threadIdx.x;
  float s = 0.0f;
  int32_t c = 0;
  if (e < experts) {
    for (int64_t w = threadIdx.y; w < warps; w += kSumRows) {
      s += part_sums[w * experts + e];
      c += part_counts[w * experts + e];
    }
  }
  sums[threadIdx.y][threadIdx.x] = s;
  cnts[threadIdx.y][threadIdx.x] = c;
  __syncthreads();
  if (threadIdx.y == 0 && e < experts) {
    float ts = 0.0f;
    int32_t tc = 0;
    for (int r = 0; r < kSumRows; ++r) {
      ts += sums[r][threadIdx.x];
      tc += cnts[r][threadIdx.x];
    }
    counts[e] = tc;
    prob_sums[e] = ts;
  }
}

__global__ void router_aux_loss_kernel(const int32_t* __restrict__ counts,
                                       const float* __restrict__ prob_sums, int experts, float inv_tk,
                                       float inv_t, float loss_coef, float grad_coef,
                                       float* __restrict__ loss, float* __restrict__ dprobs) {
  __shared__ float red[32];
  float acc = 0.0f;
  for (int e = threadIdx.x; e < experts; e += blockDim.x) {
    const float f = static_cast<float>(counts[e]) * inv_tk;
    acc += f * (prob_sums[e] * inv_t);
    if (dprobs != nullptr) dprobs[e] = grad_coef * f;
  }
  acc = detail::block_sum(acc, red);
  if (threadIdx.x == 0) *loss = loss_coef * acc;
}

__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    router_backward_kernel(const float* __restrict__ probs, const int32_t* __restrict__ top_experts,
                           const float* __restrict__ gates, const float* __restrict__ dgates,
                           const float* __restrict__ aux_dprobs, int64_t tokens, int experts, int top_k,
                           bool renormalize, float* __restrict__ dlogits) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5); t < tokens;
       t += warps) {
    const float* pr = probs + t * experts;
    float p[kPerLane], dp[kPerLane];
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int e = lane + 32 * i;
      p[i] = e < experts ? pr[e] : 0.0f;
      dp[i] = e < experts && aux_dprobs != nullptr ? aux_dprobs[e] : 0.0f;
    }
    float denom = 0.0f, dot = 0.0f;
    if (renormalize) {
      for (int j = 0; j < top_k; ++j) {
        denom += pr[top_experts[t * top_k + j]];
        dot += dgates[t * top_k + j] * gates[t * top_k + j];
      }
    }
    for (int j = 0; j < top_k; ++j) {
      const int e = top_experts[t * top_k + j];
      const float dg = dgates[t * top_k + j];
      const float v = renormalize ? (dg - dot) / denom : dg;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) dp[i] += e == lane + 32 * i ? v : 0.0f;
    }
    float pdp = 0.0f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) pdp += p[i] * dp[i];
    pdp = detail::warp_sum(pdp);
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int e = lane + 32 * i;
      if (e < experts) dlogits[t * experts + e] = p[i] * (dp[i] - pdp);
    }
  }
}

void check_shape(int64_t experts, int64_t top_k) {
  MOEPLAN_ASSERT(experts >= 1 && experts <= kRouterMaxExperts);
  MOEPLAN_ASSERT(top_k >= 1 && top_k <= kRouterMaxTopK && top_k <= experts);
}

}  // namespace

size_t router_forward_workspace_bytes(int64_t tokens, int64_t experts) {
  const int64_t warps = forward_blocks(tokens) * kWarpsPerBlock;
  return static_cast<size_t>(warps * experts) * (sizeof(int32_t) + sizeof(float));
}

void router_forward(const float* logits, int64_t tokens, int64_t experts, int64_t top_k, bool renormalize,
                    float* probs, int32_t* top_experts, float* gates, int32_t* counts, float* prob_sums,
                    void* workspace, cudaStream_t stream) {
  check_shape(experts, top_k);
  const int64_t blocks = forward_blocks(tokens), warps = blocks * kWarpsPerBlock;
  auto* part_counts = static_cast<int32_t*>(workspace);
  auto* part_sums = reinterpret_cast<float*>(part_counts + warps * experts);
  router_forward_kernel<<<static_cast<unsigned>(blocks), kWarpsPerBlock * 32, 0, stream>>>(
      logits, tokens, static_cast<int>(experts), static_cast<int>(top_k), renormalize, probs, top_experts,
      gates, part_counts, part_sums);
  MOERUN_CUDA_CHECK(cudaGetLastError());
  router_stats_kernel<<<static_cast<unsigned>((experts + kSumCols - 1) / kSumCols), dim3(kSumCols, kSumRows),
                        0, stream>>>(part_counts, part_sums, warps, static_cast<int>(experts), counts,
                                     prob_sums);
  MOERUN_CUDA_CHECK(cudaGetLastError());
}

void router_aux_loss(const int32_t* counts, const float* prob_sums, int64_t experts, int64_t tokens,
                     int64_t top_k, double coef, double scale, float* loss, float* dprobs,
                     cudaStream_t stream) {
  MOEPLAN_ASSERT(tokens > 0);
  check_shape(experts, top_k);
  const double e = static_cast<double>(experts), t = static_cast<double>(tokens);
  router_aux_loss_kernel<<<1, 256, 0, stream>>>(counts, prob_sums, static_cast<int>(experts),
                                                static_cast<float>(1.0 / (t * static_cast<double>(top_k))),
                                                static_cast<float>(1.0 / t), static_cast<float>(coef * e),
                                                static_cast<float>(scale * coef * e / t), loss, dprobs);
  MOERUN_CUDA_CHECK(cudaGetLastError());
}

void router_backward(const float* probs, const int32_t* top_experts, const float* gates, const float* dgates,
                     const float* aux_dprobs, int64_t tokens, int64_t experts, int64_t top_k,
                     bool renormalize, float* dlogits, cudaStream_t stream) {
  check_shape(experts, top_k);
  if (tokens == 0) return;
  const int64_t blocks = (tokens + kWarpsPerBlock - 1) / kWarpsPerBlock;
  router_backward_kernel<<<static_cast<unsigned>(blocks < 4096 ? blocks : 4096), kWarpsPerBlock * 32, 0,
                           stream>>>(probs, top_experts, gates, dgates, aux_dprobs, tokens,
                                     static_cast<int>(experts), static_cast<int>(top_k), renormalize,
                                     dlogits);
  MOERUN_CUDA_CHECK(cudaGetLastError());
}

}  // namespace moeplan::cuda
