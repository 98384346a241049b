// Permute / un-permute of MoE tokens on the GPU (ops permute, scatter, unpermute), the CPU kernel's order
// (executor/kernels/cpu/moe.h): permuted rows are grouped by expert (ascending), within an expert by source
// slot t * k + j (on one rank: by token), so the rows of experts [e0, e1) are one contiguous block. The row
// map is built on the device from the router's top-k expert ids with no host synchronisation.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace moeplan::cuda {

// Bytes of build_permute_map's workspace (per-chunk expert counts and their scan).
size_t permute_map_workspace_bytes(int64_t tokens, int64_t top_k, int64_t experts);

// top_experts [tokens, k] int32 -> counts [experts] int32, offsets [experts + 1] int32 (exclusive scan of
// counts; offsets[experts] = tokens * k), slot_row [tokens * k] int32 (permuted row of slot t * k + j),
// row_slot [tokens * k] int32 (source slot t * k + j of permuted row r). tokens * k < 2^31. An expert id
// outside [0, experts) traps the kernel (a bug upstream).
void build_permute_map(const int32_t* top_experts, int64_t tokens, int64_t top_k, int64_t experts,
                       int32_t* counts, int32_t* offsets, int32_t* slot_row, int32_t* row_slot,
                       void* workspace, cudaStream_t stream);

// Preconditions of the data kernels (bugs when broken): hidden % 8 == 0, bf16 pointers 16-byte aligned;
// unpermute_backward also hidden <= 16384 (dy's row is held in registers).

// x [tokens, hidden] bf16 -> xp [tokens * k, hidden] bf16, xp[r] = x[row_slot[r] / k].
void permute_forward(const __nv_bfloat16* x, const int32_t* row_slot, __nv_bfloat16* xp, int64_t tokens,
                     int64_t top_k, int64_t hidden, cudaStream_t stream);
// dxp [tokens * k, hidden] -> dx [tokens, hidden] bf16: dx[t] = sum over its rows in permuted order, fp32.
void permute_backward(const __nv_bfloat16* dxp, const int32_t* slot_row, __nv_bfloat16* dx, int64_t tokens,
                      int64_t top_k, int64_t hidden, cudaStream_t stream);

// yp [tokens * k, hidden] bf16, gates [tokens, k] fp32 -> out [tokens, hidden] bf16:
// out[t] = (accumulate ? out[t] : 0) + sum over t's rows, in permuted order, of gate * yp[row]; fp32 sums.
void unpermute_forward(const __nv_bfloat16* yp, const int32_t* slot_row, const float* gates,
                       __nv_bfloat16* out, int64_t tokens, int64_t top_k, int64_t hidden, bool accumulate,
                       cudaStream_t stream);
// dy [tokens, hidden] -> dyp [tokens * k, hidden] bf16 = gates(t, j) * dy[t]; dgates [tokens, k] fp32 =
// dy[t] . yp[row].
void unpermute_backward(const __nv_bfloat16* dy, const __nv_bfloat16* yp, const int32_t* slot_row,
                        const float* gates, __nv_bfloat16* dyp, float* dgates, int64_t tokens, int64_t top_k,
                        int64_t hidden, cudaStream_t stream);

}  // namespace moeplan::cuda
