// Device pieces of the fused kernels (fused_gemm_comm.cu): the kTileM x kTileN block tile of a bf16 GEMM
// with fp32 accumulation on tensor cores (wmma), and the flag operations CTAs and GPUs signal each other
// with. Included by .cu files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cstdint>

#include "executor/kernels/cuda/fused/schedule.h"
#include "executor/kernels/cuda/memory_common.cuh"

namespace moeplan::cuda::fused::detail {

inline constexpr int kThreads = 256;  // 8 warps: 2 along the rows x 4 along the columns, 64 x 64 outputs each
inline constexpr int kWarps = kThreads / 32;
inline constexpr int kWarpTile = 64;
inline constexpr int kFrags = kWarpTile / 16;  // 16 x 16 fragments per warp tile side
static_assert(kTileM == 2 * kWarpTile && kTileN == 4 * kWarpTile && kTileK % 16 == 0);

// Padded rows keep wmma's 32-byte fragment alignment and spread the rows over the shared-memory banks.
inline constexpr int kPadA = kTileK + 8;
inline constexpr int kPadB = kTileN + 8;
struct alignas(128) TileSmem {
  __nv_bfloat16 a[kTileM][kPadA];
  __nv_bfloat16 b[kTileK][kPadB];
  float scratch[kWarps][16][16];  // one fragment per warp on its way out
};

using Acc = nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float>;

// ---- Flags -----------------------------------------------------------------------------------------------
// Counters and epochs only grow; comparisons are wrap-safe (the difference read as signed).
__device__ __forceinline__ uint32_t ld_acquire_gpu(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release_gpu(uint32_t* p, uint32_t v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void st_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void add_release_gpu(uint32_t* p, uint32_t v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void add_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("red.release.sys.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t fetch_add_acq_rel_gpu(uint32_t* p, uint32_t v) {
  uint32_t old;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}
__device__ __forceinline__ bool reached(uint32_t value, uint32_t target) {
  return static_cast<int32_t>(value - target) >= 0;
}
// Spins (with backoff) until *p >= target; one thread of a CTA calls these, then the CTA synchronises.
__device__ __forceinline__ void wait_gpu(const uint32_t* p, uint32_t target) {
  while (!reached(ld_acquire_gpu(p), target)) __nanosleep(32);
}
__device__ __forceinline__ void wait_sys(const uint32_t* p, uint32_t target) {
  while (!reached(ld_acquire_sys(p), target)) __nanosleep(64);
}

// The CTA's writes so far, visible on this GPU before counter `p` grows by one.
__device__ __forceinline__ void cta_signal_gpu(uint32_t* p) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    add_release_gpu(p, 1);
  }
}

// ---- Rows ------------------------------------------------------------------------------------------------
// One warp copies a row of n bf16 values (n % 8 == 0, both rows 16-byte aligned), reading through L2 (the
// source may have been written during this kernel, by another CTA or GPU).
__device__ __forceinline__ void warp_copy_row(const __nv_bfloat16* src, __nv_bfloat16* dst, int64_t n) {
  const auto* s = reinterpret_cast<const uint4*>(src);
  auto* d = reinterpret_cast<uint4*>(dst);
  for (int64_t i = threadIdx.x % 32; i < n / 8; i += 32) d[i] = __ldcg(s + i);
}

// ---- Block tile ------------------------------------------------------------------------------------------
__device__ __forceinline__ void zero(Acc (&acc)[kFrags][kFrags]) {
#pragma unroll
  for (int i = 0; i < kFrags; ++i)
#pragma unroll
    for (int j = 0; j < kFrags; ++j) nvcuda::wmma::fill_fragment(acc[i][j], 0.0f);
}

// acc += A[0:rows, k_begin:k_end] B[k_begin:k_end, n0:n0 + kTileN] for row-major A (leading dimension lda;
// rows past `rows` read as zero) and B (ldb; columns past n read as zero). k_begin % 8 == 0, k_end % 8 == 0
// (a 16-byte vector is wholly inside or outside), pointers 16-byte aligned. A is read through L2.
__device__ __forceinline__ void mma_tile(TileSmem& s, Acc (&acc)[kFrags][kFrags], const __nv_bfloat16* a,
                                         int64_t lda, int64_t rows, const __nv_bfloat16* b, int64_t ldb,
                                         int64_t n0, int64_t n, int64_t k_begin, int64_t k_end) {
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32;
  const int wm = warp / 4, wn = warp % 4;
  const uint4 zero4 = make_uint4(0, 0, 0, 0);
  for (int64_t k0 = k_begin; k0 < k_end; k0 += kTileK) {
    // A: kTileM rows x kTileK / 8 vectors; B: kTileK rows x kTileN / 8 vectors.
    for (int id = tid; id < kTileM * (kTileK / 8); id += kThreads) {
      const int r = id / (kTileK / 8), v = id % (kTileK / 8);
      const int64_t k = k0 + v * 8;
      uint4 val = zero4;
      if (r < rows && k < k_end) val = __ldcg(reinterpret_cast<const uint4*>(a + r * lda + k));
      *reinterpret_cast<uint4*>(&s.a[r][v * 8]) = val;
    }
    for (int id = tid; id < kTileK * (kTileN / 8); id += kThreads) {
      const int r = id / (kTileN / 8), v = id % (kTileN / 8);
      const int64_t k = k0 + r, col = n0 + v * 8;
      uint4 val = zero4;
      if (k < k_end && col < n) val = *reinterpret_cast<const uint4*>(b + k * ldb + col);
      *reinterpret_cast<uint4*>(&s.b[r][v * 8]) = val;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kTileK; kk += 16) {
      nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, __nv_bfloat16, nvcuda::wmma::row_major>
          fa[kFrags];
      nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, __nv_bfloat16, nvcuda::wmma::row_major>
          fb[kFrags];
#pragma unroll
      for (int i = 0; i < kFrags; ++i)
        nvcuda::wmma::load_matrix_sync(fa[i], &s.a[wm * kWarpTile + i * 16][kk], kPadA);
#pragma unroll
      for (int j = 0; j < kFrags; ++j)
        nvcuda::wmma::load_matrix_sync(fb[j], &s.b[kk][wn * kWarpTile + j * 16], kPadB);
#pragma unroll
      for (int i = 0; i < kFrags; ++i)
#pragma unroll
        for (int j = 0; j < kFrags; ++j) nvcuda::wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
    }
    __syncthreads();
  }
}

// Hands the tile to `store(row, col, v)` eight consecutive outputs at a time (row < kTileM, col < kTileN,
// col % 8 == 0); the store decides what is in bounds.
template <class Store>
__device__ __forceinline__ void store_tile(TileSmem& s, Acc (&acc)[kFrags][kFrags], Store&& store) {
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int wm = warp / 4, wn = warp % 4;
  const int r = lane / 2, c = (lane % 2) * 8;
#pragma unroll
  for (int i = 0; i < kFrags; ++i)
#pragma unroll
    for (int j = 0; j < kFrags; ++j) {
      nvcuda::wmma::store_matrix_sync(&s.scratch[warp][0][0], acc[i][j], 16, nvcuda::wmma::mem_row_major);
      __syncwarp();
      float v[8];
#pragma unroll
      for (int q = 0; q < 8; ++q) v[q] = s.scratch[warp][r][c + q];
      store(wm * kWarpTile + i * 16 + r, wn * kWarpTile + j * 16 + c, v);
      __syncwarp();
    }
}

// Eight fp32 values rounded to bf16 into a 16-byte aligned row position.
__device__ __forceinline__ void store8(__nv_bfloat16* p, const float (&v)[8]) {
  *reinterpret_cast<uint4*>(p) = ::moeplan::cuda::detail::from_float8(v);
}

}  // namespace moeplan::cuda::fused::detail
