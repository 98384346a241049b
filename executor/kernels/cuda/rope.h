// Rotary position embedding on the GPU (op rope), the CPU kernel's convention (executor/kernels/cpu/rope.h):
// "rotate half" (Llama / GPT-NeoX), within a head dims i and i + D/2 are rotated by pos * theta^(-2i/D),
// i < D/2, from each token's absolute position. cos and sin are computed in double and rounded to fp32, as on
// the CPU; the rotation runs in fp32 on bf16 data, in place.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace moeplan::cuda {

inline constexpr double kRopeTheta = 10000.0;

// x: [tokens, ld] bf16, the first heads * head_dim columns of each row rotated in place (ld lets q or k be
// columns of a fused qkv row); pos [tokens] int64 in device memory. Preconditions (bugs when broken):
// head_dim % 16 == 0, head_dim <= 512, ld % 8 == 0, ld >= heads * head_dim, x 16-byte aligned.
void rope_forward(__nv_bfloat16* x, const int64_t* pos, int64_t tokens, int64_t heads, int64_t head_dim,
                  int64_t ld, double theta, cudaStream_t stream);
// The transpose (inverse rotation), in place on the gradient.
void rope_backward(__nv_bfloat16* dx, const int64_t* pos, int64_t tokens, int64_t heads, int64_t head_dim,
                   int64_t ld, double theta, cudaStream_t stream);

}  // namespace moeplan::cuda
