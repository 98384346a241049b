// Cross-entropy kernels: one block per row. The forward reads the row once with an online log-sum-exp (a
// running max and a sum rescaled when the max grows), merged across threads as (max, sum) pairs; the backward
// is elementwise given the row's lse.
#include "executor/kernels/cuda/cross_entropy.h"
#include "executor/kernels/cuda/memory_common.cuh"

namespace moeplan::cuda {
namespace {

constexpr int kThreads = 512;

// 16 bytes of a row: 4 fp32 or 8 bf16 values.
template <class T>
constexpr int kPerVec = 16 / static_cast<int>(sizeof(T));

__device__ __forceinline__ void load16(const float* row, int64_t v, float (&f)[4]) {
  const float4 u = reinterpret_cast<const float4*>(row)[v];
  f[0] = u.x;
  f[1] = u.y;
  f[2] = u.z;
  f[3] = u.w;
}
__device__ __forceinline__ void load16(const __nv_bfloat16* row, int64_t v, float (&f)[8]) {
  detail::to_float8(detail::load8(row, v), f);
}
__device__ __forceinline__ void store16(float* row, int64_t v, const float (&f)[4]) {
  reinterpret_cast<float4*>(row)[v] = make_float4(f[0], f[1], f[2], f[3]);
}
__device__ __forceinline__ void store16(__nv_bfloat16* row, int64_t v, const float (&f)[8]) {
  detail::store8(row, v, f);
}

// Merges (m, s) with (om, os): s relative to the larger max. Empty pairs are (-inf, 0).
__device__ __forceinline__ void merge(float& m, float& s, float om, float os) {
  const float mn = fmaxf(m, om);
  if (mn == -INFINITY) return;
  s = s * expf(m - mn) + os * expf(om - mn);
  m = mn;
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    ce_forward_kernel(const T* __restrict__ logits, const int64_t* __restrict__ targets, int64_t vocab,
                      int64_t v0, float* __restrict__ lse, float* __restrict__ target_logit,
                      float* __restrict__ loss) {
  __shared__ float sm[32], ss[32];
  constexpr int kN = kPerVec<T>;
  const int64_t row = blockIdx.x;
  const T* lr = logits + row * vocab;
  float m = -INFINITY, s = 0.0f;
  for (int64_t v = threadIdx.x; v < vocab / kN; v += blockDim.x) {
    float f[kN];
    load16(lr, v, f);
    float vm = f[0];
#pragma unroll
    for (int j = 1; j < kN; ++j) vm = fmaxf(vm, f[j]);
    const float mn = fmaxf(m, vm);
    float add = 0.0f;
#pragma unroll
    for (int j = 0; j < kN; ++j) add += expf(f[j] - mn);
    s = s * expf(m - mn) + add;
    m = mn;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float om = __shfl_xor_sync(0xffffffffu, m, o), os = __shfl_xor_sync(0xffffffffu, s, o);
    merge(m, s, om, os);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    sm[warp] = m;
    ss[warp] = s;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float bm = sm[0], bs = ss[0];
    for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w) merge(bm, bs, sm[w], ss[w]);
    const float l = bm + logf(bs);
    const int64_t y = targets[row];
    const float tl = y >= v0 && y < v0 + vocab ? static_cast<float>(lr[y - v0]) : 0.0f;
    lse[row] = l;
    target_logit[row] = tl;
    if (loss != nullptr) loss[row] = l - tl;
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    ce_backward_kernel(const T* logits, const int64_t* __restrict__ targets, int64_t vocab, int64_t v0,
                       const float* __restrict__ lse, float scale, T* dlogits) {
  constexpr int kN = kPerVec<T>;
  const int64_t row = blockIdx.x;
  const float l = lse[row];
  const int64_t y = targets[row] - v0;  // target column in this shard, if in [0, vocab)
  const T* lr = logits + row * vocab;
  T* dr = dlogits + row * vocab;
  for (int64_t v = threadIdx.x; v < vocab / kN; v += blockDim.x) {
    float f[kN];
    load16(lr, v, f);
#pragma unroll
    for (int j = 0; j < kN; ++j) {
      f[j] = expf(f[j] - l) * scale;
      if (v * kN + j == y) f[j] -= scale;
    }
    store16(dr, v, f);
  }
}

template <class T>
void forward(const T* logits, const int64_t* targets, int64_t rows, int64_t vocab, int64_t v0, float* lse,
             float* target_logit, float* loss, cudaStream_t stream) {
  MOEPLAN_ASSERT(vocab > 0 && vocab % detail::kVecElems == 0 && detail::aligned16(logits));
  if (rows == 0) return;
  ce_forward_kernel<T><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(logits, targets, vocab, v0, lse,
                                                                             target_logit, loss);
  MOERUN_CUDA_CHECK(cudaGetLastError());
}

template <class T>
void backward(const T* logits, const int64_t* targets, int64_t rows, int64_t vocab, int64_t v0,
              const float* lse, float scale, T* dlogits, cudaStream_t stream) {
  MOEPLAN_ASSERT(vocab > 0 && vocab % detail::kVecElems == 0 && detail::aligned16(logits) &&
                 detail::aligned16(dlogits));
  if (rows == 0) return;
  ce_backward_kernel<T>
      <<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(logits, targets, vocab, v0, lse, scale, dlogits);
  MOERUN_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void cross_entropy_forward(const float* logits, const int64_t* targets, int64_t rows, int64_t vocab,
                           int64_t v0, float* lse, float* target_logit, float* loss, cudaStream_t stream) {
  forward(logits, targets, rows, vocab, v0, lse, target_logit, loss, stream);
}
void cross_entropy_forward(const __nv_bfloat16* logits, const int64_t* targets, int64_t rows, int64_t vocab,
                           int64_t v0, float* lse, float* target_logit, float* loss, cudaStream_t stream) {
  forward(logits, targets, rows, vocab, v0, lse, target_logit, loss, stream);
}
void cross_entropy_backward(const float* logits, const int64_t* targets, int64_t rows, int64_t vocab,
                            int64_t v0, const float* lse, float scale, float* dlogits, cudaStream_t stream) {
  backward(logits, targets, rows, vocab, v0, lse, scale, dlogits, stream);
}
void cross_entropy_backward(const __nv_bfloat16* logits, const int64_t* targets, int64_t rows, int64_t vocab,
                            int64_t v0, const float* lse, float scale, __nv_bfloat16* dlogits,
                            cudaStream_t stream) {
  backward(logits, targets, rows, vocab, v0, lse, scale, dlogits, stream);
}

}  // namespace moeplan::cuda
