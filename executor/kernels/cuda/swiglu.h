// SwiGLU on the GPU (ops act, shared_act, expert_act), the CPU kernel's layout
// (executor/kernels/cpu/swiglu.h): input [rows, 2f] bf16 laid out [gate | up], output [rows, f] = silu(gate)
// * up; fp32 math.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace moeplan::cuda {

// Preconditions (bugs when broken): f % 8 == 0, pointers 16-byte aligned.

// in [rows, 2f] bf16 -> out [rows, f] bf16.
void swiglu_forward(const __nv_bfloat16* in, __nv_bfloat16* out, int64_t rows, int64_t f,
                    cudaStream_t stream);

// in [rows, 2f], dy [rows, f] -> din [rows, 2f]: d_gate = dy * up * (s + g s (1 - s)), d_up = dy * g * s,
// s = sigmoid(g).
void swiglu_backward(const __nv_bfloat16* in, const __nv_bfloat16* dy, __nv_bfloat16* din, int64_t rows,
                     int64_t f, cudaStream_t stream);

}  // namespace moeplan::cuda
