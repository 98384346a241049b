// Adam step: elementwise over 16-byte vectors of four fp32 parameters, grid-stride; the last n % 4
// parameters one per thread.
#include <algorithm>
#include <cmath>

#include "executor/kernels/cuda/adam.h"
#include "executor/kernels/cuda/memory_common.cuh"

namespace moeplan::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ void adam_one(float& p, float g, float& m, float& v, const AdamCoefficients& c) {
  m = c.b1 * m + c.one_b1 * g;
  v = c.b2 * v + c.one_b2 * g * g;
  const float update = (m * c.inv_c1) / (sqrtf(v * c.inv_c2) + c.eps) + c.wd * p;
  p -= c.lr * update;
}

__global__ void adam_kernel(float* __restrict__ master, const float* __restrict__ grad, float* __restrict__ m,
                            float* __restrict__ v, __nv_bfloat16* __restrict__ weight, int64_t n,
                            AdamCoefficients c) {
  const int64_t vecs = n / 4;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = first; i < vecs; i += stride) {
    float4 p = reinterpret_cast<const float4*>(master)[i];
    const float4 g = reinterpret_cast<const float4*>(grad)[i];
    float4 mm = reinterpret_cast<const float4*>(m)[i];
    float4 vv = reinterpret_cast<const float4*>(v)[i];
    adam_one(p.x, g.x, mm.x, vv.x, c);
    adam_one(p.y, g.y, mm.y, vv.y, c);
    adam_one(p.z, g.z, mm.z, vv.z, c);
    adam_one(p.w, g.w, mm.w, vv.w, c);
    reinterpret_cast<float4*>(master)[i] = p;
    reinterpret_cast<float4*>(m)[i] = mm;
    reinterpret_cast<float4*>(v)[i] = vv;
    auto* w = reinterpret_cast<__nv_bfloat162*>(weight + 4 * i);
    w[0] = __floats2bfloat162_rn(p.x, p.y);
    w[1] = __floats2bfloat162_rn(p.z, p.w);
  }
  const int64_t tail = 4 * vecs + first;
  if (tail < n) {
    float p = master[tail], mm = m[tail], vv = v[tail];
    adam_one(p, grad[tail], mm, vv, c);
    master[tail] = p;
    m[tail] = mm;
    v[tail] = vv;
    weight[tail] = __float2bfloat16_rn(p);
  }
}

}  // namespace

AdamCoefficients adam_coefficients(double lr, double beta1, double beta2, double eps, double weight_decay,
                                   int64_t step) {
  MOEPLAN_ASSERT(step >= 1);
  const double st = static_cast<double>(step);
  AdamCoefficients c;
  c.b1 = static_cast<float>(beta1);
  c.b2 = static_cast<float>(beta2);
  c.one_b1 = static_cast<float>(1.0 - beta1);
  c.one_b2 = static_cast<float>(1.0 - beta2);
  c.inv_c1 = static_cast<float>(1.0 / (1.0 - std::pow(beta1, st)));
  c.inv_c2 = static_cast<float>(1.0 / (1.0 - std::pow(beta2, st)));
  c.lr = static_cast<float>(lr);
  c.eps = static_cast<float>(eps);
  c.wd = static_cast<float>(weight_decay);
  return c;
}

void adam_step(float* master, const float* grad, float* m, float* v, __nv_bfloat16* weight, int64_t n,
               const AdamCoefficients& c, cudaStream_t stream) {
  MOEPLAN_ASSERT(n >= 0 && detail::aligned16(master) && detail::aligned16(grad) && detail::aligned16(m) &&
                 detail::aligned16(v) && detail::aligned16(weight));
  if (n == 0) return;
  adam_kernel<<<detail::grid_for(std::max<int64_t>(1, n / 4), kThreads), kThreads, 0, stream>>>(
      master, grad, m, v, weight, n, c);
  MOERUN_CUDA_CHECK(cudaGetLastError());
}

}  // namespace moeplan::cuda
