// FP8 kernels: the rowwise quantizer holds its row in registers (one block per row); the blockwise one gives
// each 1 x 128 tile to a half-warp (8 values a lane); the dequantizer is elementwise over 8-value vectors.
#include <cfloat>

#include "executor/kernels/cuda/fp8.h"
#include "executor/kernels/cuda/memory_common.cuh"

namespace moeplan::cuda {
namespace {

using detail::kRowVecs;
using detail::kVecElems;

constexpr float kE4m3Max = 448.0f;  // largest finite e4m3: 1.75 * 2^8
constexpr int kThreads = 256;

__device__ __forceinline__ float scale_of(float amax) {
  return amax == 0.0f ? 1.0f : fmaxf(amax / kE4m3Max, FLT_MIN);
}

// 8 values divided by scale -> 8 e4m3 bytes (round to nearest even, saturating).
__device__ __forceinline__ uint2 quantize8(const float (&v)[8], float scale) {
  uint2 out;
  auto* b = reinterpret_cast<__nv_fp8_storage_t*>(&out);
#pragma unroll
  for (int j = 0; j < 8; ++j) b[j] = __nv_cvt_float_to_fp8(v[j] / scale, __NV_SATFINITE, __NV_E4M3);
  return out;
}

__global__ void __launch_bounds__(detail::kMaxRowThreads)
    quantize_rowwise_kernel(const __nv_bfloat16* __restrict__ x, uint2* __restrict__ q,
                            float* __restrict__ scales, int64_t cols) {
  __shared__ float red[32];
  const int64_t row = blockIdx.x, vecs = cols / kVecElems;
  float v[kRowVecs][8];
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < kRowVecs; ++i) {
    const int64_t c = threadIdx.x + i * blockDim.x;
    if (c < vecs) {
      detail::to_float8(detail::load8(x + row * cols, c), v[i]);
#pragma unroll
      for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(v[i][j]));
    }
  }
  amax = detail::block_max(amax, red);
  const float scale = scale_of(amax);
  if (threadIdx.x == 0) scales[row] = scale;
#pragma unroll
  for (int i = 0; i < kRowVecs; ++i) {
    const int64_t c = threadIdx.x + i * blockDim.x;
    if (c < vecs) q[row * vecs + c] = quantize8(v[i], scale);
  }
}

// Tiles are numbered row-major (tile g covers values [128 g, 128 g + 128) of the flat tensor, since
// cols % 128 == 0); a warp takes two consecutive tiles, lanes 0-15 the first.
__global__ void quantize_blockwise_kernel(const __nv_bfloat16* __restrict__ x, uint2* __restrict__ q,
                                          float* __restrict__ scales, int64_t tiles) {
  const int lane = threadIdx.x & 31;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t warps = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  for (int64_t base = 2 * warp; base < tiles; base += 2 * warps) {
    const int64_t tile = base + (lane >> 4);
    const bool valid = tile < tiles;
    const int64_t vec = tile * (kFp8BlockElems / kVecElems) + (lane & 15);
    float v[8];
    float amax = 0.0f;
    if (valid) {
      detail::to_float8(detail::load8(x, vec), v);
#pragma unroll
      for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(v[j]));
    }
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    if (valid) {
      const float scale = scale_of(amax);
      if ((lane & 15) == 0) scales[tile] = scale;
      q[vec] = quantize8(v, scale);
    }
  }
}

__global__ void dequantize_kernel(const uint2* __restrict__ q, const float* __restrict__ scales,
                                  __nv_bfloat16* __restrict__ y, int64_t vecs, int64_t group) {
  for (int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; v < vecs;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float scale = scales[v * kVecElems / group];
    const uint2 packed = q[v];
    const auto* b = reinterpret_cast<const __nv_fp8_storage_t*>(&packed);
    float f[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      __nv_fp8_e4m3 e;
      e.__x = b[j];
      f[j] = static_cast<float>(e) * scale;
    }
    detail::store8(y, v, f);
  }
}

bool aligned8(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 8 == 0;
}

}  // namespace

void fp8_quantize_rowwise(const __nv_bfloat16* x, __nv_fp8_e4m3* q, float* scales, int64_t rows, int64_t cols,
                          cudaStream_t stream) {
  MOEPLAN_ASSERT(detail::aligned16(x) && aligned8(q));
  if (rows == 0) return;
  quantize_rowwise_kernel<<<static_cast<unsigned>(rows), detail::row_threads(cols), 0, stream>>>(
      x, reinterpret_cast<uint2*>(q), scales, cols);
  MOERUN_CUDA_CHECK(cudaGetLastError());
}

void fp8_quantize_blockwise(const __nv_bfloat16* x, __nv_fp8_e4m3* q, float* scales, int64_t rows,
                            int64_t cols, cudaStream_t stream) {
  MOEPLAN_ASSERT(cols > 0 && cols % kFp8BlockElems == 0 && detail::aligned16(x) && aligned8(q));
  const int64_t tiles = rows * cols / kFp8BlockElems;
  if (tiles == 0) return;
  quantize_blockwise_kernel<<<detail::grid_for(tiles * 16, kThreads), kThreads, 0, stream>>>(
      x, reinterpret_cast<uint2*>(q), scales, tiles);
  MOERUN_CUDA_CHECK(cudaGetLastError());
}

void fp8_dequantize(const __nv_fp8_e4m3* q, const float* scales, __nv_bfloat16* y, int64_t rows, int64_t cols,
                    int64_t group, cudaStream_t stream) {
  MOEPLAN_ASSERT(cols > 0 && cols % kVecElems == 0 && group % kVecElems == 0 && cols % group == 0);
  MOEPLAN_ASSERT(aligned8(q) && detail::aligned16(y));
  const int64_t vecs = rows * cols / kVecElems;
  if (vecs == 0) return;
  dequantize_kernel<<<detail::grid_for(vecs, kThreads), kThreads, 0, stream>>>(
      reinterpret_cast<const uint2*>(q), scales, y, vecs, group);
  MOERUN_CUDA_CHECK(cudaGetLastError());
}

}  // namespace moeplan::cuda
