// RMSNorm on the GPU (ops attn_norm, ffn_norm, final_norm), the CPU kernel's definition
// (executor/kernels/cpu/norm.h): y = x * r * gamma, r = 1 / sqrt(mean(x^2) + eps) per row; bf16 tensors,
// fp32 math and statistics.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace moeplan::cuda {

// Preconditions of the norm kernels (bugs when broken): hidden % 8 == 0, hidden <= 16384 (the row is held
// in registers), bf16 pointers 16-byte aligned.

// x [rows, hidden] bf16, gamma [hidden] bf16 -> y [rows, hidden] bf16, inv_rms [rows] fp32 (r, for the
// backward).
void rmsnorm_forward(const __nv_bfloat16* x, const __nv_bfloat16* gamma, __nv_bfloat16* y, float* inv_rms,
                     int64_t rows, int64_t hidden, float eps, cudaStream_t stream);

// Bytes of the backward's workspace: fp32 partial dgamma sums, one row per block.
size_t rmsnorm_backward_workspace_bytes(int64_t rows, int64_t hidden);

// dx [rows, hidden] bf16 = r * (gamma * dy) - x * r^3 / hidden * sum_j(gamma_j dy_j x_j);
// dgamma [hidden] fp32 += sum over rows of dy * x * r. Each block sums its rows' dgamma in fp32 registers
// into the workspace; a second kernel adds the partials in block order (deterministic, no atomics).
void rmsnorm_backward(const __nv_bfloat16* x, const __nv_bfloat16* gamma, const float* inv_rms,
                      const __nv_bfloat16* dy, __nv_bfloat16* dx, float* dgamma, void* workspace,
                      int64_t rows, int64_t hidden, cudaStream_t stream);

}  // namespace moeplan::cuda
