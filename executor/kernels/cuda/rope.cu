// RoPE kernel: one block per token; the block computes the token's D/2 (cos, sin) pairs once in shared memory
// and rotates every head with 16-byte vectors (8 dims of the first half with the matching 8 of the second).
#include "executor/kernels/cuda/memory_common.cuh"
#include "executor/kernels/cuda/rope.h"

namespace moeplan::cuda {
namespace {

using detail::kVecElems;

constexpr int kThreads = 128;
constexpr int kMaxHalf = 256;  // head_dim <= 512
constexpr double kPi = 3.141592653589793238462643383279502884;

// sign +1 rotates by +angle (forward), -1 by -angle (backward).
__global__ void rope_kernel(__nv_bfloat16* __restrict__ x, const int64_t* __restrict__ pos, int64_t heads,
                            int64_t head_dim, int64_t ld, double theta, double sign) {
  __shared__ float cs[kMaxHalf], sn[kMaxHalf];
  const int64_t t = blockIdx.x;
  const int64_t half = head_dim / 2;
  const double p = static_cast<double>(pos[t]);
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    const double inv_freq = pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
    // angle / pi: sincospi reduces its argument exactly, where sin / cos of angles up to ~1e6 would take the
    // slow (local-memory) Payne-Hanek path; the two differ from the CPU's angle by a few double ulps.
    double s = 0, c = 0;
    sincospi(p * (inv_freq / kPi), &s, &c);
    cs[i] = static_cast<float>(c);
    sn[i] = static_cast<float>(sign * s);
  }
  __syncthreads();
  const int64_t hv = half / kVecElems;  // vectors per half head
  __nv_bfloat16* row = x + t * ld;
  for (int64_t w = threadIdx.x; w < heads * hv; w += blockDim.x) {
    const int64_t h = w / hv, i0 = (w - h * hv) * kVecElems;
    __nv_bfloat16* lo = row + h * head_dim + i0;
    __nv_bfloat16* hi = lo + half;
    float a[8], b[8], oa[8], ob[8];
    detail::to_float8(detail::load8(lo, 0), a);
    detail::to_float8(detail::load8(hi, 0), b);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float c = cs[i0 + j], s = sn[i0 + j];
      oa[j] = a[j] * c - b[j] * s;
      ob[j] = b[j] * c + a[j] * s;
    }
    detail::store8(lo, 0, oa);
    detail::store8(hi, 0, ob);
  }
}

void launch(__nv_bfloat16* x, const int64_t* pos, int64_t tokens, int64_t heads, int64_t head_dim, int64_t ld,
            double theta, double sign, cudaStream_t stream) {
  MOEPLAN_ASSERT(head_dim > 0 && head_dim % (2 * kVecElems) == 0 && head_dim / 2 <= kMaxHalf);
  MOEPLAN_ASSERT(ld % kVecElems == 0 && ld >= heads * head_dim && detail::aligned16(x));
  if (tokens == 0 || heads == 0) return;
  rope_kernel<<<static_cast<unsigned>(tokens), kThreads, 0, stream>>>(x, pos, heads, head_dim, ld, theta,
                                                                      sign);
  MOERUN_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void rope_forward(__nv_bfloat16* x, const int64_t* pos, int64_t tokens, int64_t heads, int64_t head_dim,
                  int64_t ld, double theta, cudaStream_t stream) {
  launch(x, pos, tokens, heads, head_dim, ld, theta, 1.0, stream);
}

void rope_backward(__nv_bfloat16* dx, const int64_t* pos, int64_t tokens, int64_t heads, int64_t head_dim,
                   int64_t ld, double theta, cudaStream_t stream) {
  launch(dx, pos, tokens, heads, head_dim, ld, theta, -1.0, stream);
}

}  // namespace moeplan::cuda
