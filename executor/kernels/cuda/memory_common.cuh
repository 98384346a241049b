// Device helpers shared by moerun's memory-bound CUDA kernels (norm, swiglu, rope, router, permute, fp8,
// cross_entropy): 16-byte bf16 vectors, warp and block reductions, and the launch shape of the
// one-block-per-row kernels that hold their row in registers. Included by .cu files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "executor/kernels/cuda/check.h"
#include "simulator/core/status.h"

namespace moeplan::cuda::detail {

inline constexpr int kVecElems = 8;         // bf16 values per 16-byte vector
inline constexpr int kRowVecs = 4;          // 16-byte vectors per thread in the row-in-registers kernels
inline constexpr int kMaxRowThreads = 512;  // their largest block (__launch_bounds__: <= 128 registers)
inline constexpr int64_t kMaxRowElems = int64_t{kVecElems} * kRowVecs * kMaxRowThreads;  // 16384

inline bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// Threads of a row-in-registers block for a row of `elems` bf16 values: a multiple of 32 with kRowVecs
// vectors each. A bug (assertion) when the row does not fit.
inline int row_threads(int64_t elems) {
  MOEPLAN_ASSERT(elems > 0 && elems % kVecElems == 0 && elems <= kMaxRowElems);
  const int64_t vecs = elems / kVecElems;
  const int64_t threads = ((vecs + kRowVecs - 1) / kRowVecs + 31) / 32 * 32;
  return static_cast<int>(threads);
}

// Blocks of a grid-stride loop over `work` items with `threads` per block (capped; the loop covers the rest).
inline unsigned grid_for(int64_t work, int threads) {
  const int64_t blocks = (work + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > (int64_t{1} << 20) ? (int64_t{1} << 20) : blocks));
}

__device__ __forceinline__ void to_float8(const uint4& u, float (&f)[8]) {
  const auto* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 p = __bfloat1622float2(h[i]);
    f[2 * i] = p.x;
    f[2 * i + 1] = p.y;
  }
}

__device__ __forceinline__ uint4 from_float8(const float (&f)[8]) {
  uint4 u;
  auto* h = reinterpret_cast<__nv_bfloat162*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
  return u;
}

// Vector v (of 8 bf16 values) of a row.
__device__ __forceinline__ uint4 load8(const __nv_bfloat16* row, int64_t v) {
  return reinterpret_cast<const uint4*>(row)[v];
}
__device__ __forceinline__ void store8(__nv_bfloat16* row, int64_t v, const float (&f)[8]) {
  reinterpret_cast<uint4*>(row)[v] = from_float8(f);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32); every thread gets the same value (each warp adds the
// warps' sums in the same order). smem: 32 floats; safe to call repeatedly (the first barrier protects the
// previous call's reads).
__device__ __forceinline__ float block_sum(float v, float* smem) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  return warp_sum(lane < warps ? smem[lane] : 0.0f);
}

__device__ __forceinline__ float block_max(float v, float* smem) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  return warp_max(lane < warps ? smem[lane] : -INFINITY);
}

}  // namespace moeplan::cuda::detail
