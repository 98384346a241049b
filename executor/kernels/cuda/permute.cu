// Permute kernels. The map: slots are cut into chunks of kChunk; (1) each block counts its chunk's slots per
// expert, (2) one block scans the counts expert-major (expert, then chunk) into each chunk's first row per
// expert, (3) each block walks its chunk in slot order, one thread per expert, handing out rows: stable by
// construction. The data kernels move 16-byte vectors, one block per row or token.
#include "executor/kernels/cuda/memory_common.cuh"
#include "executor/kernels/cuda/permute.h"
#include "executor/kernels/cuda/router.h"

namespace moeplan::cuda {
namespace {

using detail::kRowVecs;
using detail::kVecElems;

constexpr int kChunk = 1024;      // slots per block of the map kernels
constexpr int kMapThreads = 256;  // >= experts is not required: threads loop over experts
constexpr int kScanThreads = 1024;
constexpr int kDataThreads = 128;

int64_t chunks_of(int64_t slots) {
  return (slots + kChunk - 1) / kChunk;
}

// Loads this block's chunk of expert ids into ids; returns its length.
__device__ int load_chunk(const int32_t* __restrict__ top_experts, int64_t slots, int experts, int32_t* ids) {
  const int64_t s0 = static_cast<int64_t>(blockIdx.x) * kChunk;
  const int n = static_cast<int>(slots - s0 < kChunk ? slots - s0 : kChunk);
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int32_t e = top_experts[s0 + i];
    if (e < 0 || e >= experts) __trap();
    ids[i] = e;
  }
  __syncthreads();
  return n;
}

// chunk_counts [experts, chunks]: slots of chunk b routed to expert e.
__global__ void map_count_kernel(const int32_t* __restrict__ top_experts, int64_t slots, int experts,
                                 int64_t chunks, int32_t* __restrict__ chunk_counts) {
  __shared__ int32_t ids[kChunk];
  const int n = load_chunk(top_experts, slots, experts, ids);
  for (int e = threadIdx.x; e < experts; e += blockDim.x) {
    int c = 0;
    for (int i = 0; i < n; ++i) c += ids[i] == e ? 1 : 0;
    chunk_counts[e * chunks + blockIdx.x] = c;
  }
}

// One block: chunk_offsets = exclusive scan of chunk_counts (expert-major), counts, offsets.
__global__ void __launch_bounds__(kScanThreads)
    map_scan_kernel(const int32_t* __restrict__ chunk_counts, int experts, int64_t chunks,
                    int32_t* __restrict__ chunk_offsets, int32_t* __restrict__ counts,
                    int32_t* __restrict__ offsets) {
  __shared__ int32_t warp_tot[32];
  const int64_t n = experts * chunks;
  const int64_t per = (n + kScanThreads - 1) / kScanThreads;
  const int64_t begin = threadIdx.x * per, end = begin + per < n ? begin + per : n;
  int32_t local = 0;
  for (int64_t i = begin; i < end; ++i) local += chunk_counts[i];
  // Exclusive scan of the threads' sums: within warps by shuffles, then over the warps' totals.
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int32_t inc = local;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int32_t v = __shfl_up_sync(0xffffffffu, inc, o);
    if (lane >= o) inc += v;
  }
  if (lane == 31) warp_tot[warp] = inc;
  __syncthreads();
  if (warp == 0) {
    int32_t w = warp_tot[lane];
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int32_t v = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += v;
    }
    warp_tot[lane] = w;  // inclusive over warps
  }
  __syncthreads();
  int32_t run = inc - local + (warp > 0 ? warp_tot[warp - 1] : 0);
  for (int64_t i = begin; i < end; ++i) {
    chunk_offsets[i] = run;
    run += chunk_counts[i];
  }
  __syncthreads();
  for (int e = threadIdx.x; e < experts; e += blockDim.x) {
    int32_t c = 0;
    for (int64_t b = 0; b < chunks; ++b) c += chunk_counts[e * chunks + b];
    counts[e] = c;
    offsets[e] = chunk_offsets[e * chunks];
  }
  if (threadIdx.x == 0) offsets[experts] = warp_tot[31];
}

__global__ void map_write_kernel(const int32_t* __restrict__ top_experts, int64_t slots, int experts,
                                 int64_t chunks, const int32_t* __restrict__ chunk_offsets,
                                 int32_t* __restrict__ slot_row, int32_t* __restrict__ row_slot) {
  __shared__ int32_t ids[kChunk];
  const int n = load_chunk(top_experts, slots, experts, ids);
  const int32_t s0 = static_cast<int32_t>(blockIdx.x) * kChunk;
  for (int e = threadIdx.x; e < experts; e += blockDim.x) {
    int32_t row = chunk_offsets[e * chunks + blockIdx.x];
    for (int i = 0; i < n; ++i) {
      if (ids[i] == e) {
        slot_row[s0 + i] = row;
        row_slot[row] = s0 + i;
        ++row;
      }
    }
  }
}

__global__ void permute_forward_kernel(const __nv_bfloat16* __restrict__ x,
                                       const int32_t* __restrict__ row_slot, __nv_bfloat16* __restrict__ xp,
                                       int top_k, int64_t hidden) {
  const int64_t r = blockIdx.x;
  const int64_t t = row_slot[r] / top_k;
  const __nv_bfloat16* src = x + t * hidden;
  __nv_bfloat16* dst = xp + r * hidden;
  for (int64_t c = threadIdx.x; c < hidden / kVecElems; c += blockDim.x)
    reinterpret_cast<uint4*>(dst)[c] = detail::load8(src, c);
}

// This token's k permuted rows in ascending order (the CPU kernel's summation order) and, when gates is not
// null, their gates; in shared memory. Threads j < k load, thread 0 sorts (k <= 8: insertion sort).
__device__ void sorted_rows(const int32_t* __restrict__ slot_row, const float* __restrict__ gates, int64_t t,
                            int top_k, int32_t* rows, float* g) {
  if (threadIdx.x < top_k) {
    rows[threadIdx.x] = slot_row[t * top_k + threadIdx.x];
    g[threadIdx.x] = gates != nullptr ? gates[t * top_k + threadIdx.x] : 1.0f;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int j = 1; j < top_k; ++j) {
      const int32_t r = rows[j];
      const float gj = g[j];
      int i = j;
      for (; i > 0 && rows[i - 1] > r; --i) {
        rows[i] = rows[i - 1];
        g[i] = g[i - 1];
      }
      rows[i] = r;
      g[i] = gj;
    }
  }
  __syncthreads();
}

// out[t] = (base ? base[t] : 0) + sum_j g_j * src[row_j]: the un-permute (gates) and the permute backward
// (no gates: g = 1).
__global__ void combine_kernel(const __nv_bfloat16* __restrict__ src, const int32_t* __restrict__ slot_row,
                               const float* __restrict__ gates, __nv_bfloat16* out, int top_k, int64_t hidden,
                               bool accumulate) {
  __shared__ int32_t rows[kRouterMaxTopK];
  __shared__ float g[kRouterMaxTopK];
  const int64_t t = blockIdx.x;
  sorted_rows(slot_row, gates, t, top_k, rows, g);
  __nv_bfloat16* o = out + t * hidden;
  for (int64_t c = threadIdx.x; c < hidden / kVecElems; c += blockDim.x) {
    float acc[8];
    if (accumulate) {
      detail::to_float8(detail::load8(o, c), acc);
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] = 0.0f;
    }
    for (int j = 0; j < top_k; ++j) {
      float v[8];
      detail::to_float8(detail::load8(src + static_cast<int64_t>(rows[j]) * hidden, c), v);
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] += g[j] * v[i];
    }
    detail::store8(o, c, acc);
  }
}

__global__ void __launch_bounds__(detail::kMaxRowThreads)
    unpermute_backward_kernel(const __nv_bfloat16* __restrict__ dy, const __nv_bfloat16* __restrict__ yp,
                              const int32_t* __restrict__ slot_row, const float* __restrict__ gates,
                              __nv_bfloat16* __restrict__ dyp, float* __restrict__ dgates, int top_k,
                              int64_t hidden) {
  __shared__ float red[32];
  const int64_t t = blockIdx.x;
  const int64_t vecs = hidden / kVecElems;
  float d[kRowVecs][8];
#pragma unroll
  for (int i = 0; i < kRowVecs; ++i) {
    const int64_t c = threadIdx.x + i * blockDim.x;
    if (c < vecs) detail::to_float8(detail::load8(dy + t * hidden, c), d[i]);
  }
  for (int j = 0; j < top_k; ++j) {
    const int64_t r = slot_row[t * top_k + j];
    const float g = gates[t * top_k + j];
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < kRowVecs; ++i) {
      const int64_t c = threadIdx.x + i * blockDim.x;
      if (c < vecs) {
        float y[8], o[8];
        detail::to_float8(detail::load8(yp + r * hidden, c), y);
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          dot += d[i][k] * y[k];
          o[k] = g * d[i][k];
        }
        detail::store8(dyp + r * hidden, c, o);
      }
    }
    dot = detail::block_sum(dot, red);
    if (threadIdx.x == 0) dgates[t * top_k + j] = dot;
  }
}

void check_data(const void* a, const void* b, int64_t top_k, int64_t hidden) {
  MOEPLAN_ASSERT(top_k >= 1 && top_k <= kRouterMaxTopK && hidden > 0 && hidden % kVecElems == 0);
  MOEPLAN_ASSERT(detail::aligned16(a) && detail::aligned16(b));
}

}  // namespace

size_t permute_map_workspace_bytes(int64_t tokens, int64_t top_k, int64_t experts) {
  return 2 * static_cast<size_t>(experts * chunks_of(tokens * top_k)) * sizeof(int32_t);
}

void build_permute_map(const int32_t* top_experts, int64_t tokens, int64_t top_k, int64_t experts,
                       int32_t* counts, int32_t* offsets, int32_t* slot_row, int32_t* row_slot,
                       void* workspace, cudaStream_t stream) {
  const int64_t slots = tokens * top_k;
  MOEPLAN_ASSERT(top_k >= 1 && experts >= 1 && slots < (int64_t{1} << 31));
  const int64_t chunks = chunks_of(slots);
  if (chunks == 0) {
    MOERUN_CUDA_CHECK(cudaMemsetAsync(counts, 0, static_cast<size_t>(experts) * sizeof(int32_t), stream));
    MOERUN_CUDA_CHECK(
        cudaMemsetAsync(offsets, 0, static_cast<size_t>(experts + 1) * sizeof(int32_t), stream));
    return;
  }
  auto* chunk_counts = static_cast<int32_t*>(workspace);
  int32_t* chunk_offsets = chunk_counts + experts * chunks;
  const int e = static_cast<int>(experts);
  map_count_kernel<<<static_cast<unsigned>(chunks), kMapThreads, 0, stream>>>(top_experts, slots, e, chunks,
                                                                              chunk_counts);
  MOERUN_CUDA_CHECK(cudaGetLastError());
  map_scan_kernel<<<1, kScanThreads, 0, stream>>>(chunk_counts, e, chunks, chunk_offsets, counts, offsets);
  MOERUN_CUDA_CHECK(cudaGetLastError());
  map_write_kernel<<<static_cast<unsigned>(chunks), kMapThreads, 0, stream>>>(
      top_experts, slots, e, chunks, chunk_offsets, slot_row, row_slot);
  MOERUN_CUDA_CHECK(cudaGetLastError());
}

void permute_forward(const __nv_bfloat16* x, const int32_t* row_slot, __nv_bfloat16* xp, int64_t tokens,
                     int64_t top_k, int64_t hidden, cudaStream_t stream) {
  check_data(x, xp, top_k, hidden);
  if (tokens == 0) return;
  permute_forward_kernel<<<static_cast<unsigned>(tokens * top_k), kDataThreads, 0, stream>>>(
      x, row_slot, xp, static_cast<int>(top_k), hidden);
  MOERUN_CUDA_CHECK(cudaGetLastError());
}

void permute_backward(const __nv_bfloat16* dxp, const int32_t* slot_row, __nv_bfloat16* dx, int64_t tokens,
                      int64_t top_k, int64_t hidden, cudaStream_t stream) {
  check_data(dxp, dx, top_k, hidden);
  if (tokens == 0) return;
  combine_kernel<<<static_cast<unsigned>(tokens), kDataThreads, 0, stream>>>(
      dxp, slot_row, nullptr, dx, static_cast<int>(top_k), hidden, false);
  MOERUN_CUDA_CHECK(cudaGetLastError());
}

void unpermute_forward(const __nv_bfloat16* yp, const int32_t* slot_row, const float* gates,
                       __nv_bfloat16* out, int64_t tokens, int64_t top_k, int64_t hidden, bool accumulate,
                       cudaStream_t stream) {
  check_data(yp, out, top_k, hidden);
  if (tokens == 0) return;
  combine_kernel<<<static_cast<unsigned>(tokens), kDataThreads, 0, stream>>>(
      yp, slot_row, gates, out, static_cast<int>(top_k), hidden, accumulate);
  MOERUN_CUDA_CHECK(cudaGetLastError());
}

void unpermute_backward(const __nv_bfloat16* dy, const __nv_bfloat16* yp, const int32_t* slot_row,
                        const float* gates, __nv_bfloat16* dyp, float* dgates, int64_t tokens, int64_t top_k,
                        int64_t hidden, cudaStream_t stream) {
  check_data(dy, yp, top_k, hidden);
  MOEPLAN_ASSERT(detail::aligned16(dyp));
  if (tokens == 0) return;
  unpermute_backward_kernel<<<static_cast<unsigned>(tokens), detail::row_threads(hidden), 0, stream>>>(
      dy, yp, slot_row, gates, dyp, dgates, static_cast<int>(top_k), hidden);
  MOERUN_CUDA_CHECK(cudaGetLastError());
}

}  // namespace moeplan::cuda
