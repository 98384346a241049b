// SwiGLU kernels: elementwise over 16-byte vectors (8 bf16 of the gate and the matching 8 of up),
// grid-stride.
#include "executor/kernels/cuda/memory_common.cuh"
#include "executor/kernels/cuda/swiglu.h"

namespace moeplan::cuda {
namespace {

using detail::kVecElems;

constexpr int kThreads = 256;

__global__ void swiglu_forward_kernel(const __nv_bfloat16* __restrict__ in, __nv_bfloat16* __restrict__ out,
                                      int64_t rows, int64_t f) {
  const int64_t fv = f / kVecElems, total = rows * fv;
  for (int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; v < total;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = v / fv, c = v - row * fv;
    const __nv_bfloat16* r = in + row * 2 * f;
    float g[8], u[8], o[8];
    detail::to_float8(detail::load8(r, c), g);
    detail::to_float8(detail::load8(r, fv + c), u);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float s = 1.0f / (1.0f + expf(-g[j]));
      o[j] = g[j] * s * u[j];
    }
    detail::store8(out + row * f, c, o);
  }
}

__global__ void swiglu_backward_kernel(const __nv_bfloat16* __restrict__ in,
                                       const __nv_bfloat16* __restrict__ dy, __nv_bfloat16* __restrict__ din,
                                       int64_t rows, int64_t f) {
  const int64_t fv = f / kVecElems, total = rows * fv;
  for (int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; v < total;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = v / fv, c = v - row * fv;
    const __nv_bfloat16* r = in + row * 2 * f;
    float g[8], u[8], d[8], dg[8], du[8];
    detail::to_float8(detail::load8(r, c), g);
    detail::to_float8(detail::load8(r, fv + c), u);
    detail::to_float8(detail::load8(dy + row * f, c), d);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float s = 1.0f / (1.0f + expf(-g[j]));
      dg[j] = d[j] * u[j] * (s + g[j] * s * (1.0f - s));
      du[j] = d[j] * g[j] * s;
    }
    __nv_bfloat16* dr = din + row * 2 * f;
    detail::store8(dr, c, dg);
    detail::store8(dr, fv + c, du);
  }
}

void check_shape(const void* a, const void* b, int64_t f) {
  MOEPLAN_ASSERT(f > 0 && f % kVecElems == 0 && detail::aligned16(a) && detail::aligned16(b));
}

}  // namespace

void swiglu_forward(const __nv_bfloat16* in, __nv_bfloat16* out, int64_t rows, int64_t f,
                    cudaStream_t stream) {
  check_shape(in, out, f);
  if (rows == 0) return;
  swiglu_forward_kernel<<<detail::grid_for(rows * f / kVecElems, kThreads), kThreads, 0, stream>>>(in, out,
                                                                                                   rows, f);
  MOERUN_CUDA_CHECK(cudaGetLastError());
}

void swiglu_backward(const __nv_bfloat16* in, const __nv_bfloat16* dy, __nv_bfloat16* din, int64_t rows,
                     int64_t f, cudaStream_t stream) {
  check_shape(in, din, f);
  MOEPLAN_ASSERT(detail::aligned16(dy));
  if (rows == 0) return;
  swiglu_backward_kernel<<<detail::grid_for(rows * f / kVecElems, kThreads), kThreads, 0, stream>>>(
      in, dy, din, rows, f);
  MOERUN_CUDA_CHECK(cudaGetLastError());
}

}  // namespace moeplan::cuda
