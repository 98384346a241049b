// FP8 (e4m3, OCP E4M3FN) quantize / dequantize on the GPU with per-row scales or per-128-element block scales
// (1 x 128 tiles along the row, as DeepSeek-V3's and MegaScale-MoE's FP8 dispatch). The CPU wire format's
// rules (executor/comm/wire_format.h): scale = amax / 448 of the group (1 when the group is all zero, at
// least FLT_MIN), q = e4m3(x / scale) rounded to nearest even, saturating; x ~ float(q) * scale. Error bound
// per value: |x - dq(x)| <= max(2^-4 |x|, 2^-10 scale) before the bf16 rounding of dq.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace moeplan::cuda {

inline constexpr int64_t kFp8BlockElems = 128;

// Preconditions (bugs when broken): cols % 8 == 0 (rowwise; cols <= 16384, the row is held in registers) or
// cols % 128 == 0 (blockwise); x and y 16-byte aligned, q 8-byte aligned; finite inputs.

// x [rows, cols] bf16 -> q [rows, cols] e4m3, scales [rows] fp32.
void fp8_quantize_rowwise(const __nv_bfloat16* x, __nv_fp8_e4m3* q, float* scales, int64_t rows, int64_t cols,
                          cudaStream_t stream);
// x [rows, cols] bf16 -> q [rows, cols] e4m3, scales [rows, cols / 128] fp32.
void fp8_quantize_blockwise(const __nv_bfloat16* x, __nv_fp8_e4m3* q, float* scales, int64_t rows,
                            int64_t cols, cudaStream_t stream);
// q [rows, cols] e4m3 -> y [rows, cols] bf16 = float(q) * scale of its group; group = cols (rowwise scales)
// or 128 (blockwise scales).
void fp8_dequantize(const __nv_fp8_e4m3* q, const float* scales, __nv_bfloat16* y, int64_t rows, int64_t cols,
                    int64_t group, cudaStream_t stream);

}  // namespace moeplan::cuda
