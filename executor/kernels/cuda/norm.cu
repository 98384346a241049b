// RMSNorm kernels: one block per row (forward) or per strided set of rows (backward), the row in registers.
#include "executor/kernels/cuda/memory_common.cuh"
#include "executor/kernels/cuda/norm.h"

namespace moeplan::cuda {
namespace {

using detail::kRowVecs;
using detail::kVecElems;

// Blocks of the backward: enough to fill 132 SMs several times over at any row count, few enough that the
// partial sums [blocks, hidden] fp32 stay small (14 MiB at hidden 7168).
constexpr int64_t kNormBackwardBlocks = 512;

__global__ void __launch_bounds__(detail::kMaxRowThreads)
    rmsnorm_forward_kernel(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ gamma,
                           __nv_bfloat16* __restrict__ y, float* __restrict__ inv_rms, int64_t hidden,
                           float eps) {
  __shared__ float red[32];
  const int64_t row = blockIdx.x;
  const int64_t vecs = hidden / kVecElems;
  const __nv_bfloat16* xr = x + row * hidden;
  float v[kRowVecs][8];
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < kRowVecs; ++i) {
    const int64_t c = threadIdx.x + i * blockDim.x;
    if (c < vecs) {
      detail::to_float8(detail::load8(xr, c), v[i]);
#pragma unroll
      for (int j = 0; j < 8; ++j) ss += v[i][j] * v[i][j];
    }
  }
  ss = detail::block_sum(ss, red);
  const float r = 1.0f / sqrtf(ss / static_cast<float>(hidden) + eps);
  if (threadIdx.x == 0) inv_rms[row] = r;
  __nv_bfloat16* yr = y + row * hidden;
#pragma unroll
  for (int i = 0; i < kRowVecs; ++i) {
    const int64_t c = threadIdx.x + i * blockDim.x;
    if (c < vecs) {
      float g[8], o[8];
      detail::to_float8(detail::load8(gamma, c), g);
#pragma unroll
      for (int j = 0; j < 8; ++j) o[j] = v[i][j] * r * g[j];
      detail::store8(yr, c, o);
    }
  }
}

// partial [gridDim.x, hidden] fp32: this block's sum of dy * x * r over its rows.
__global__ void __launch_bounds__(detail::kMaxRowThreads)
    rmsnorm_backward_kernel(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ gamma,
                            const float* __restrict__ inv_rms, const __nv_bfloat16* __restrict__ dy,
                            __nv_bfloat16* __restrict__ dx, float* __restrict__ partial, int64_t rows,
                            int64_t hidden) {
  __shared__ float red[32];
  const int64_t vecs = hidden / kVecElems;
  const float inv_h = 1.0f / static_cast<float>(hidden);
  float acc[kRowVecs][8];
#pragma unroll
  for (int i = 0; i < kRowVecs; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;

  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const __nv_bfloat16* xr = x + row * hidden;
    const __nv_bfloat16* dyr = dy + row * hidden;
    const float r = inv_rms[row];
    float xv[kRowVecs][8], gdy[kRowVecs][8];
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < kRowVecs; ++i) {
      const int64_t c = threadIdx.x + i * blockDim.x;
      if (c < vecs) {
        float g[8], d[8];
        detail::to_float8(detail::load8(xr, c), xv[i]);
        detail::to_float8(detail::load8(dyr, c), d);
        detail::to_float8(detail::load8(gamma, c), g);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          gdy[i][j] = d[j] * g[j];
          dot += gdy[i][j] * xv[i][j];
          acc[i][j] += d[j] * xv[i][j] * r;
        }
      }
    }
    dot = detail::block_sum(dot, red);
    const float c3 = r * r * r * inv_h * dot;
    __nv_bfloat16* dxr = dx + row * hidden;
#pragma unroll
    for (int i = 0; i < kRowVecs; ++i) {
      const int64_t c = threadIdx.x + i * blockDim.x;
      if (c < vecs) {
        float o[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) o[j] = gdy[i][j] * r - xv[i][j] * c3;
        detail::store8(dxr, c, o);
      }
    }
  }
  float* pr = partial + static_cast<int64_t>(blockIdx.x) * hidden;
#pragma unroll
  for (int i = 0; i < kRowVecs; ++i) {
    const int64_t c = threadIdx.x + i * blockDim.x;
    if (c < vecs) {
      auto* p4 = reinterpret_cast<float4*>(pr + c * kVecElems);
      p4[0] = make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
      p4[1] = make_float4(acc[i][4], acc[i][5], acc[i][6], acc[i][7]);
    }
  }
}

// dgamma[col] += sum over parts of partial[part, col]. A block takes 32 columns; its 16 thread rows each sum
// every 16th part (coalesced 128-byte rows), then thread row 0 adds the 16 sums in order (deterministic).
constexpr int kSumCols = 32, kSumRows = 16;
__global__ void column_sum_kernel(const float* __restrict__ partial, int64_t parts, int64_t cols,
                                  float* __restrict__ dgamma) {
  __shared__ float sums[kSumRows][kSumCols + 1];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kSumCols + threadIdx.x;
  float acc = 0.0f;
  if (col < cols)
    for (int64_t p = threadIdx.y; p < parts; p += kSumRows) acc += partial[p * cols + col];
  sums[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    float s = 0.0f;
    for (int r = 0; r < kSumRows; ++r) s += sums[r][threadIdx.x];
    dgamma[col] += s;
  }
}

int64_t backward_blocks(int64_t rows) {
  return rows < kNormBackwardBlocks ? rows : kNormBackwardBlocks;
}

}  // namespace

void rmsnorm_forward(const __nv_bfloat16* x, const __nv_bfloat16* gamma, __nv_bfloat16* y, float* inv_rms,
                     int64_t rows, int64_t hidden, float eps, cudaStream_t stream) {
  MOEPLAN_ASSERT(detail::aligned16(x) && detail::aligned16(gamma) && detail::aligned16(y));
  if (rows == 0) return;
  const int threads = detail::row_threads(hidden);
  rmsnorm_forward_kernel<<<static_cast<unsigned>(rows), threads, 0, stream>>>(x, gamma, y, inv_rms, hidden,
                                                                              eps);
  MOERUN_CUDA_CHECK(cudaGetLastError());
}

size_t rmsnorm_backward_workspace_bytes(int64_t rows, int64_t hidden) {
  return static_cast<size_t>(backward_blocks(rows) * hidden) * sizeof(float);
}

void rmsnorm_backward(const __nv_bfloat16* x, const __nv_bfloat16* gamma, const float* inv_rms,
                      const __nv_bfloat16* dy, __nv_bfloat16* dx, float* dgamma, void* workspace,
                      int64_t rows, int64_t hidden, cudaStream_t stream) {
  MOEPLAN_ASSERT(detail::aligned16(x) && detail::aligned16(gamma) && detail::aligned16(dy) &&
                 detail::aligned16(dx) && detail::aligned16(workspace));
  if (rows == 0) return;
  const int threads = detail::row_threads(hidden);
  const int64_t blocks = backward_blocks(rows);
  auto* partial = static_cast<float*>(workspace);
  rmsnorm_backward_kernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(x, gamma, inv_rms, dy, dx,
                                                                                 partial, rows, hidden);
  MOERUN_CUDA_CHECK(cudaGetLastError());
  column_sum_kernel<<<static_cast<unsigned>((hidden + kSumCols - 1) / kSumCols), dim3(kSumCols, kSumRows), 0,
                      stream>>>(partial, blocks, hidden, dgamma);
  MOERUN_CUDA_CHECK(cudaGetLastError());
}

}  // namespace moeplan::cuda
