// moerun's fused GEMM + communication kernels (fused_gemm_comm.h). One launch covers every virtual rank
// (blockIdx.y); within a rank, CTAs [0, comm_ctas) move data and the others compute tiles (the all-to-all +
// GEMM kernel has no communication CTAs: copy engines move its data).
//
// Signalling, inside a GPU: a CTA finishes its writes, synchronises, and one thread fences and bumps a
// counter with release semantics; the waiting CTA's first thread spins on an acquire load, then the CTA
// synchronises and reads through L2 (__ldcg: L1 is not coherent with the other SMs' writes). Between GPUs
// (or virtual ranks) the same at system scope, on the peers' symmetric signal arrays.
#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "executor/kernels/cuda/check.h"
#include "executor/kernels/cuda/fused/fused_gemm_comm.h"
#include "executor/kernels/cuda/fused/tile_mma.cuh"
#include "simulator/core/status.h"

namespace moeplan::cuda::fused {
namespace {

using detail::Acc;
using detail::kFrags;
using detail::kThreads;
using detail::kWarps;
using detail::TileSmem;

// ---- Launch parameters (by value, __grid_constant__: no upload per run) -------------------------------
template <class Args, class Operands>
struct Launch {
  Args args;
  Operands ops[kMaxRanks];
  uint32_t* work = nullptr;      // the workspace: counters or flags, per virtual rank
  uint32_t* finished = nullptr;  // [virtual rank] communication CTAs finished, over all runs
  int comm_ctas = 0;
  int chunks = 0;
  uint32_t epoch = 0;
};

// The local experts' row offsets from their counts (a bug upstream, and a trap, when a count is negative or
// they exceed `rows`) and their tile offsets (schedule.h), in shared memory for the whole CTA.
__device__ void grouped_layout(const int32_t* counts, int experts, int64_t rows, int64_t n_tiles,
                               int32_t* off, int32_t* tile_off) {
  if (threadIdx.x == 0) {
    off[0] = 0;
    for (int e = 0; e < experts; ++e) {
      if (counts[e] < 0) __trap();
      off[e + 1] = off[e] + counts[e];
    }
    if (off[experts] > rows) __trap();
    expert_tile_offsets(off, experts, n_tiles, tile_off);
  }
  __syncthreads();
}

// This rank tells every peer: ready (value `epoch`, one writer per slot).
__device__ void signal_ready(uint32_t* const* signals, int ranks, int rank, uint32_t epoch) {
  if (threadIdx.x == 0) {
    __threadfence_system();
    for (int p = 0; p < ranks; ++p) detail::st_release_sys(signals[p] + kSignalReady + rank, epoch);
  }
}
// Waits until every peer has said ready to this rank.
__device__ void wait_ready(const uint32_t* mine, int ranks, uint32_t epoch) {
  if (threadIdx.x == 0)
    for (int p = 0; p < ranks; ++p) detail::wait_sys(mine + kSignalReady + p, epoch);
  __syncthreads();
}
// This communication CTA is done with every peer. The last of the rank's `comm_ctas` to get here tells the
// peers (value `epoch`, one writer per slot), so a peer's wait does not depend on how many CTAs this rank
// gave to communication.
__device__ void signal_done(uint32_t* const* signals, int ranks, int rank, uint32_t* finished, int comm_ctas,
                            uint32_t epoch) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();
    const uint32_t before = detail::fetch_add_acq_rel_gpu(finished, 1);
    if (before + 1 == epoch * static_cast<uint32_t>(comm_ctas)) {
      __threadfence_system();
      for (int p = 0; p < ranks; ++p) detail::st_release_sys(signals[p] + kSignalDone + rank, epoch);
    }
  }
}
__device__ void wait_done(const uint32_t* mine, int ranks, uint32_t target) {
  if (threadIdx.x == 0)
    for (int p = 0; p < ranks; ++p) detail::wait_sys(mine + kSignalDone + p, target);
  __syncthreads();
}

// ---- All-gather + scatter + grouped GEMM ---------------------------------------------------------------
using AgLaunch = Launch<AllGatherGroupedGemmArgs, AllGatherGroupedGemmOperands>;

__global__ void __launch_bounds__(kThreads, 1)
    all_gather_grouped_gemm_kernel(const __grid_constant__ AgLaunch L) {
  const auto& a = L.args;
  const auto& o = L.ops[blockIdx.y];
  const int ranks = a.group.ranks, experts = a.experts;
  __shared__ int32_t off[kMaxExperts + 1], tile_off[kMaxExperts + 1];
  __shared__ TileSmem s;
  const int64_t n_tiles = col_tiles(a.out);
  grouped_layout(o.counts, experts, a.rows, n_tiles, off, tile_off);
  const RowChunks ch = RowChunks::make(off[experts], L.chunks);
  uint32_t* counters = L.work + static_cast<int64_t>(blockIdx.y) * L.chunks;
  const uint32_t* mine = o.signals[o.rank];

  if (static_cast<int>(blockIdx.x) < L.comm_ctas) {
    // Pull each chunk's rows from their ranks (a warp per row), then count the chunk as landed.
    const int cta = static_cast<int>(blockIdx.x), warp = static_cast<int>(threadIdx.x) / 32;
    if (cta == 0) signal_ready(o.signals, ranks, o.rank, L.epoch);  // this rank's x is readable
    wait_ready(mine, ranks, L.epoch);
    const int64_t stride = int64_t{L.comm_ctas} * kWarps;
    for (int c = 0; c < ch.chunks; ++c) {
      for (int64_t r = ch.begin(c) + cta * kWarps + warp; r < ch.end(c); r += stride) {
        const int src = o.src_rank[r];
        const int64_t row = o.src_row[r];
        if (src < 0 || src >= ranks || row < 0 || row >= a.tokens) __trap();
        detail::warp_copy_row(o.x[src] + row * a.hidden, o.gathered + r * a.hidden, a.hidden);
      }
      detail::cta_signal_gpu(counters + c);
    }
    signal_done(o.signals, ranks, o.rank, L.finished + blockIdx.y, L.comm_ctas, L.epoch);  // done reading x
    if (cta == 0) wait_done(mine, ranks, L.epoch);
    return;
  }

  const uint32_t landed = L.epoch * static_cast<uint32_t>(L.comm_ctas);
  const int compute = static_cast<int>(gridDim.x) - L.comm_ctas;
  Acc acc[kFrags][kFrags];
  for (int64_t t = static_cast<int>(blockIdx.x) - L.comm_ctas; t < tile_off[experts]; t += compute) {
    const GroupedTile g = locate_grouped_tile(off, tile_off, experts, n_tiles, t);
    if (threadIdx.x == 0)
      for (int c = ch.of_row(g.row_begin); c <= ch.of_row(g.row_end - 1); ++c)
        detail::wait_gpu(counters + c, landed);
    __syncthreads();
    detail::zero(acc);
    detail::mma_tile(s, acc, o.gathered + g.row_begin * a.hidden, a.hidden, g.row_end - g.row_begin,
                     o.w + static_cast<int64_t>(g.expert) * a.hidden * a.out, a.out, g.col, a.out, 0,
                     a.hidden);
    detail::store_tile(s, acc, [&](int r, int c, const float(&v)[8]) {
      const int64_t row = g.row_begin + r, col = g.col + c;
      if (row < g.row_end && col < a.out) detail::store8(o.y + row * a.out + col, v);
    });
  }
}

// ---- Grouped GEMM + gather + reduce-scatter -------------------------------------------------------------
using RsLaunch = Launch<GroupedGemmReduceScatterArgs, GroupedGemmReduceScatterOperands>;

__global__ void __launch_bounds__(kThreads, 1)
    grouped_gemm_reduce_scatter_kernel(const __grid_constant__ RsLaunch L) {
  const auto& a = L.args;
  const auto& o = L.ops[blockIdx.y];
  const int ranks = a.group.ranks, experts = a.experts;
  __shared__ int32_t off[kMaxExperts + 1], tile_off[kMaxExperts + 1];
  __shared__ TileSmem s;
  const int64_t n_tiles = col_tiles(a.hidden);
  grouped_layout(o.counts, experts, a.rows, n_tiles, off, tile_off);
  const RowChunks ch = RowChunks::make(off[experts], L.chunks);
  const int64_t max_tiles = (ceil_div(a.rows, kTileM) + experts) * n_tiles;
  uint32_t* tile_flags = L.work + static_cast<int64_t>(blockIdx.y) * max_tiles;
  const uint32_t* mine = o.signals[o.rank];

  if (static_cast<int>(blockIdx.x) < L.comm_ctas) {
    // Once every tile of a chunk's rows is written, push its rows to their tokens' ranks.
    const int cta = static_cast<int>(blockIdx.x), warp = static_cast<int>(threadIdx.x) / 32;
    if (cta == 0) signal_ready(o.signals, ranks, o.rank, L.epoch);  // this rank's receive buffer is free
    wait_ready(mine, ranks, L.epoch);
    const int64_t stride = int64_t{L.comm_ctas} * kWarps, slots = a.tokens * a.top_k;
    for (int c = 0; c < ch.chunks; ++c) {
      const int64_t begin = ch.begin(c), end = ch.end(c);
      if (threadIdx.x == 0)
        for (int e = 0; e < experts; ++e) {
          const int64_t lo = max64(begin, off[e]), hi = min64(end, off[e + 1]);
          if (lo >= hi) continue;
          for (int64_t mt = (lo - off[e]) / kTileM; mt <= (hi - 1 - off[e]) / kTileM; ++mt)
            for (int64_t nt = 0; nt < n_tiles; ++nt)
              detail::wait_gpu(tile_flags + tile_off[e] + mt * n_tiles + nt, L.epoch);
        }
      __syncthreads();
      for (int64_t r = begin + cta * kWarps + warp; r < end; r += stride) {
        const int dst = o.dst_rank[r];
        const int64_t slot = o.dst_slot[r];
        if (dst < 0 || dst >= ranks || slot < 0 || slot >= slots) __trap();
        detail::warp_copy_row(o.y + r * a.hidden, o.recv[dst] + slot * a.hidden, a.hidden);
      }
    }
    signal_done(o.signals, ranks, o.rank, L.finished + blockIdx.y, L.comm_ctas, L.epoch);  // all rows sent
  } else {
    const int compute = static_cast<int>(gridDim.x) - L.comm_ctas;
    Acc acc[kFrags][kFrags];
    for (int64_t t = static_cast<int>(blockIdx.x) - L.comm_ctas; t < tile_off[experts]; t += compute) {
      const GroupedTile g = locate_grouped_tile(off, tile_off, experts, n_tiles, t);
      detail::zero(acc);
      detail::mma_tile(s, acc, o.h + g.row_begin * a.in, a.in, g.row_end - g.row_begin,
                       o.w + static_cast<int64_t>(g.expert) * a.in * a.hidden, a.hidden, g.col, a.hidden, 0,
                       a.in);
      detail::store_tile(s, acc, [&](int r, int c, const float(&v)[8]) {
        const int64_t row = g.row_begin + r, col = g.col + c;
        if (row < g.row_end && col < a.hidden) detail::store8(o.y + row * a.hidden + col, v);
      });
      __syncthreads();
      if (threadIdx.x == 0) {
        __threadfence();
        detail::st_release_gpu(tile_flags + t, L.epoch);
      }
    }
  }

  // Every CTA of the rank: once all peers have pushed, the gate-weighted sum of each token's rows (a warp
  // per token, fp32 in slot order).
  wait_done(mine, ranks, L.epoch);
  const Bf16* recv = o.recv[o.rank];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kWarps;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * kWarps + warp; t < a.tokens; t += stride)
    for (int64_t v = lane; v < a.hidden / 8; v += 32) {
      float sum[8] = {};
      for (int64_t j = 0; j < a.top_k; ++j) {
        const float gate = o.gates[t * a.top_k + j];
        float x[8];
        ::moeplan::cuda::detail::to_float8(
            __ldcg(reinterpret_cast<const uint4*>(recv + (t * a.top_k + j) * a.hidden) + v), x);
#pragma unroll
        for (int q = 0; q < 8; ++q) sum[q] += gate * x[q];
      }
      detail::store8(o.out + t * a.hidden + v * 8, sum);
    }
}

// ---- GEMM + all-to-all ------------------------------------------------------------------------------------
using GaLaunch = Launch<GemmAllToAllArgs, GemmAllToAllOperands>;

__global__ void __launch_bounds__(kThreads, 1) gemm_all_to_all_kernel(const __grid_constant__ GaLaunch L) {
  const auto& a = L.args;
  const auto& o = L.ops[blockIdx.y];
  const int ranks = a.group.ranks;
  __shared__ TileSmem s;
  const int64_t cols = ranks * a.cols_per_rank, n_tiles = col_tiles(cols),
                m_tiles = ceil_div(a.tokens, kTileM);
  const RowChunks ch = RowChunks::make(a.tokens, L.chunks);
  uint32_t* counters = L.work + static_cast<int64_t>(blockIdx.y) * L.chunks * ranks;  // [chunk][peer]
  const uint32_t* mine = o.signals[o.rank];

  if (static_cast<int>(blockIdx.x) < L.comm_ctas) {
    // Each (chunk, peer) pair, in chunk order and starting with the next rank, goes to one CTA; once its
    // tiles are written, its rows of the peer's columns go to the peer (a warp per row).
    const int cta = static_cast<int>(blockIdx.x), warp = static_cast<int>(threadIdx.x) / 32;
    if (cta == 0) signal_ready(o.signals, ranks, o.rank, L.epoch);  // this rank's output buffer is free
    wait_ready(mine, ranks, L.epoch);
    for (int j = cta; j < L.chunks * ranks; j += L.comm_ctas) {
      const int c = j / ranks, p = (o.rank + 1 + j % ranks) % ranks;
      const int64_t begin = ch.begin(c), end = ch.end(c);
      const uint32_t expected =
          static_cast<uint32_t>(row_tiles_touching(begin, end) * col_tiles_touching_rank(a.cols_per_rank, p));
      if (threadIdx.x == 0) detail::wait_gpu(counters + c * ranks + p, L.epoch * expected);
      __syncthreads();
      for (int64_t r = begin + warp; r < end; r += kWarps)
        detail::warp_copy_row(o.staged + r * cols + p * a.cols_per_rank,
                              o.out[p] + (o.rank * a.tokens + r) * a.cols_per_rank, a.cols_per_rank);
    }
    signal_done(o.signals, ranks, o.rank, L.finished + blockIdx.y, L.comm_ctas, L.epoch);
    if (cta == 0) wait_done(mine, ranks, L.epoch);
    return;
  }

  const int compute = static_cast<int>(gridDim.x) - L.comm_ctas;
  Acc acc[kFrags][kFrags];
  for (int64_t t = static_cast<int>(blockIdx.x) - L.comm_ctas; t < m_tiles * n_tiles; t += compute) {
    const int64_t row0 = (t / n_tiles) * kTileM, col0 = (t % n_tiles) * kTileN;
    const int64_t rows = min64(kTileM, a.tokens - row0), col_end = min64(col0 + kTileN, cols);
    detail::zero(acc);
    detail::mma_tile(s, acc, o.x + row0 * a.hidden, a.hidden, rows, o.w, cols, col0, cols, 0, a.hidden);
    detail::store_tile(s, acc, [&](int r, int c, const float(&v)[8]) {
      const int64_t row = row0 + r, col = col0 + c;
      if (r < rows && col < cols) detail::store8(o.staged + row * cols + col, v);
    });
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      for (int c = ch.of_row(row0); c <= ch.of_row(row0 + rows - 1); ++c)
        for (int64_t p = col0 / a.cols_per_rank; p <= (col_end - 1) / a.cols_per_rank; ++p)
          detail::add_release_gpu(counters + c * ranks + p, 1);
    }
  }
}

// ---- All-to-all + GEMM (copy engines fetch; every CTA computes) ------------------------------------------
using AaLaunch = Launch<AllToAllGemmArgs, AllToAllGemmOperands>;

__global__ void __launch_bounds__(kThreads, 1) all_to_all_gemm_kernel(const __grid_constant__ AaLaunch L) {
  const auto& a = L.args;
  const auto& o = L.ops[blockIdx.y];
  const int ranks = a.group.ranks;
  __shared__ TileSmem s;
  const int64_t depth = ranks * a.cols_per_rank, n_tiles = col_tiles(a.out),
                m_tiles = ceil_div(a.tokens, kTileM);
  const RowChunks ch = RowChunks::make(a.tokens, L.chunks);
  const uint32_t* fetched = L.work + static_cast<int64_t>(blockIdx.y) * L.chunks * ranks;  // [chunk][peer]
  Acc acc[kFrags][kFrags];
  for (int64_t t = blockIdx.x; t < m_tiles * n_tiles; t += gridDim.x) {
    const int64_t row0 = (t / n_tiles) * kTileM, col0 = (t % n_tiles) * kTileN;
    const int64_t rows = min64(kTileM, a.tokens - row0);
    detail::zero(acc);
    // The reduction runs peer by peer in the order the copies are issued (this rank's own rows first).
    for (int j = 0; j < ranks; ++j) {
      const int p = (o.rank + j) % ranks;
      if (threadIdx.x == 0)
        for (int c = ch.of_row(row0); c <= ch.of_row(row0 + rows - 1); ++c)
          detail::wait_sys(fetched + c * ranks + p, L.epoch);
      __syncthreads();
      detail::mma_tile(s, acc, o.gathered + row0 * depth, depth, rows, o.w, a.out, col0, a.out,
                       p * a.cols_per_rank, (p + 1) * a.cols_per_rank);
    }
    detail::store_tile(s, acc, [&](int r, int c, const float(&v)[8]) {
      const int64_t row = row0 + r, col = col0 + c;
      if (r < rows && col < a.out) detail::store8(o.y + row * a.out + col, v);
    });
  }
}

// ---- Host side --------------------------------------------------------------------------------------------
std::string group_rule(const Group& g) {
  if (g.ranks < 1 || g.ranks > kMaxRanks) return "ranks must be in [1, " + std::to_string(kMaxRanks) + "]";
  if (g.virtual_ranks != 1 && g.virtual_ranks != g.ranks) return "virtual_ranks must be 1 or ranks";
  if (g.ctas_per_rank < 0 || g.sms_left < 0) return "ctas_per_rank and sms_left must be >= 0";
  return {};
}

std::string device_rule() {
  if (std::string why = device_unavailable(); !why.empty()) return why;
  int dev = 0, major = 0;
  MOERUN_CUDA_CHECK(cudaGetDevice(&dev));
  MOERUN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  if (major < 8) return "the fused kernels need bf16 tensor cores (sm_80 or newer)";
  return {};
}

std::string first_error(std::initializer_list<std::string> rules) {
  for (const std::string& r : rules)
    if (!r.empty()) return r;
  return {};
}

std::string mult(int64_t v, int64_t m, const char* what) {
  return v > 0 && v % m == 0 ? std::string()
                             : std::string(what) + " must be a positive multiple of " + std::to_string(m);
}

// Driver entry points for stream memory operations (never link libcuda: cudaGetDriverEntryPointByVersion).
struct StreamMemOps {
  PFN_cuStreamWriteValue32_v11070 write = nullptr;
  PFN_cuStreamWaitValue32_v11070 wait = nullptr;
};
const StreamMemOps& stream_mem_ops() {
  static const StreamMemOps ops = [] {
    StreamMemOps o;
    cudaDriverEntryPointQueryResult q{};
    void* fn = nullptr;
    MOERUN_CUDA_CHECK(
        cudaGetDriverEntryPointByVersion("cuStreamWriteValue32", &fn, 12000, cudaEnableDefault, &q));
    if (q != cudaDriverEntryPointSuccess || fn == nullptr) {
      std::fprintf(stderr, "moerun: the driver has no cuStreamWriteValue32\n");
      std::abort();
    }
    o.write = reinterpret_cast<PFN_cuStreamWriteValue32_v11070>(fn);
    MOERUN_CUDA_CHECK(
        cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &fn, 12000, cudaEnableDefault, &q));
    if (q != cudaDriverEntryPointSuccess || fn == nullptr) {
      std::fprintf(stderr, "moerun: the driver has no cuStreamWaitValue32\n");
      std::abort();
    }
    o.wait = reinterpret_cast<PFN_cuStreamWaitValue32_v11070>(fn);
    return o;
  }();
  return ops;
}

void check_cu(CUresult r, const char* call) {
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "moerun: driver call %s failed with CUresult %d\n", call, static_cast<int>(r));
    std::abort();
  }
}
void write_value(cudaStream_t st, uint32_t* p, uint32_t v) {
  check_cu(stream_mem_ops().write(st, reinterpret_cast<CUdeviceptr>(p), v, CU_STREAM_WRITE_VALUE_DEFAULT),
           "cuStreamWriteValue32");
}
void wait_value(cudaStream_t st, uint32_t* p, uint32_t v) {
  check_cu(stream_mem_ops().wait(st, reinterpret_cast<CUdeviceptr>(p), v, CU_STREAM_WAIT_VALUE_GEQ),
           "cuStreamWaitValue32");
}

template <class Args>
constexpr const FusedKernelParams& params_of() {
  if constexpr (std::is_same_v<Args, AllGatherGroupedGemmArgs>)
    return kAllGatherGroupedGemm;
  else if constexpr (std::is_same_v<Args, GroupedGemmReduceScatterArgs>)
    return kGroupedGemmReduceScatter;
  else if constexpr (std::is_same_v<Args, GemmAllToAllArgs>)
    return kGemmAllToAll;
  else
    return kAllToAllGemm;
}

template <class Args>
const void* kernel_of() {
  if constexpr (std::is_same_v<Args, AllGatherGroupedGemmArgs>)
    return reinterpret_cast<const void*>(&all_gather_grouped_gemm_kernel);
  else if constexpr (std::is_same_v<Args, GroupedGemmReduceScatterArgs>)
    return reinterpret_cast<const void*>(&grouped_gemm_reduce_scatter_kernel);
  else if constexpr (std::is_same_v<Args, GemmAllToAllArgs>)
    return reinterpret_cast<const void*>(&gemm_all_to_all_kernel);
  else
    return reinterpret_cast<const void*>(&all_to_all_gemm_kernel);
}

// SMs the all-to-all + GEMM kernel leaves free at least, in case the driver moves a device-to-device copy
// with a kernel rather than a copy engine (the GEMM's CTAs wait for the copies, so they must not take every
// SM): the SMs a training step leaves to collectives anyway, so the cost model's count holds.
constexpr int kCopyHeadroomSms = static_cast<int>(kFusedSmsLeftForCollectives);

// The grid of one (virtual) rank: the co-resident CTAs shared by the virtual ranks, capped by the request.
int grid_ctas(const Group& g, const void* kernel, bool copy_engines) {
  int dev = 0, sms = 0, per_sm = 0;
  MOERUN_CUDA_CHECK(cudaGetDevice(&dev));
  MOERUN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  MOERUN_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0));
  const int left = copy_engines ? std::max(kCopyHeadroomSms, g.sms_left) : g.sms_left;
  const int usable = std::max(1, sms - left);
  int ctas = usable * per_sm / g.virtual_ranks;
  if (g.ctas_per_rank > 0) ctas = std::min(ctas, g.ctas_per_rank);
  return ctas;
}

// Communication CTAs: the cost model's SMs for communication, scaled to this rank's share of the GPU, at
// least one, and leaving at least one CTA to compute.
int comm_ctas_for(const FusedKernelParams& fp, int ctas) {
  if (fp.comm_sms == 0) return 0;
  int dev = 0, sms = 0;
  MOERUN_CUDA_CHECK(cudaGetDevice(&dev));
  MOERUN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const int scaled = static_cast<int>((fp.comm_sms * ctas + sms / 2) / sms);
  return std::clamp(scaled, 1, std::max(1, ctas - 1));
}

bool aligned(const void* p) {
  return ::moeplan::cuda::detail::aligned16(p);
}

// Bugs upstream, caught before a kernel would trap or hang on them: ranks in range and distinct, every
// 16-byte vector path on 16-byte aligned buffers.
template <class Args, class Operands>
void check_operands(const Args& a, std::span<const Operands> ranks) {
  uint32_t seen = 0;
  for (const Operands& o : ranks) {
    MOEPLAN_ASSERT(o.rank >= 0 && o.rank < a.group.ranks && !(seen & (1u << o.rank)));
    seen |= 1u << o.rank;
    for (int p = 0; p < a.group.ranks; ++p) MOEPLAN_ASSERT(o.signals[p] != nullptr);
    if constexpr (std::is_same_v<Args, AllGatherGroupedGemmArgs>) {
      for (int p = 0; p < a.group.ranks; ++p) MOEPLAN_ASSERT(aligned(o.x[p]));
      MOEPLAN_ASSERT(aligned(o.gathered) && aligned(o.w) && aligned(o.y) && o.counts && o.src_rank &&
                     o.src_row);
    } else if constexpr (std::is_same_v<Args, GroupedGemmReduceScatterArgs>) {
      for (int p = 0; p < a.group.ranks; ++p) MOEPLAN_ASSERT(aligned(o.recv[p]));
      MOEPLAN_ASSERT(aligned(o.h) && aligned(o.w) && aligned(o.y) && aligned(o.out) && o.counts &&
                     o.dst_rank && o.dst_slot && o.gates);
    } else if constexpr (std::is_same_v<Args, GemmAllToAllArgs>) {
      for (int p = 0; p < a.group.ranks; ++p) MOEPLAN_ASSERT(aligned(o.out[p]));
      MOEPLAN_ASSERT(aligned(o.x) && aligned(o.w) && aligned(o.staged));
    } else {
      for (int p = 0; p < a.group.ranks; ++p) MOEPLAN_ASSERT(o.in[p] != nullptr);
      MOEPLAN_ASSERT(aligned(o.gathered) && aligned(o.w) && aligned(o.y));
    }
  }
}

}  // namespace

std::string can_implement(const AllGatherGroupedGemmArgs& a) {
  return first_error(
      {group_rule(a.group),
       a.experts >= 1 && a.experts <= kMaxExperts ? std::string() : "experts must be in [1, 512]",
       mult(a.hidden, 8, "hidden"), mult(a.out, 8, "out"),
       a.tokens >= 0 && a.rows >= 0 ? std::string() : "tokens and rows must be >= 0", device_rule()});
}
std::string can_implement(const GroupedGemmReduceScatterArgs& a) {
  return first_error(
      {group_rule(a.group),
       a.experts >= 1 && a.experts <= kMaxExperts ? std::string() : "experts must be in [1, 512]",
       mult(a.in, 8, "in"), mult(a.hidden, 8, "hidden"),
       a.tokens >= 0 && a.rows >= 0 && a.top_k >= 1 ? std::string()
                                                    : "tokens, rows >= 0 and top_k >= 1 needed",
       device_rule()});
}
std::string can_implement(const GemmAllToAllArgs& a) {
  return first_error({group_rule(a.group), mult(a.hidden, 8, "hidden"),
                      mult(a.cols_per_rank, 8, "cols_per_rank"),
                      a.tokens >= 1 ? std::string() : "tokens must be >= 1", device_rule()});
}
std::string can_implement(const AllToAllGemmArgs& a) {
  return first_error({group_rule(a.group), mult(a.cols_per_rank, kTileK, "cols_per_rank"),
                      mult(a.out, 8, "out"), a.tokens >= 1 ? std::string() : "tokens must be >= 1",
                      device_rule()});
}

template <class Args, class Operands>
FusedKernel<Args, Operands>::FusedKernel(const Args& args) : args_(args) {
  const FusedKernelParams& fp = params_of<Args>();
  chunks_ = static_cast<int>(fp.chunks_per_peer);
  if constexpr (std::is_same_v<Args, AllGatherGroupedGemmArgs> ||
                std::is_same_v<Args, GroupedGemmReduceScatterArgs>)
    chunks_ *= args.group.ranks;  // expert rows come from (go to) every rank: one pipeline over all of them
}

template <class Args, class Operands>
FusedKernel<Args, Operands>::~FusedKernel() {
  for (cudaStream_t st : side_) cudaStreamDestroy(st);
  for (cudaEvent_t ev : join_) cudaEventDestroy(ev);
  if (fork_) cudaEventDestroy(fork_);
}

template <class Args, class Operands>
size_t FusedKernel<Args, Operands>::workspace_size() const {
  const int64_t v = args_.group.virtual_ranks, r = args_.group.ranks;
  int64_t words = 0;
  if constexpr (std::is_same_v<Args, AllGatherGroupedGemmArgs>)
    words = v * chunks_;
  else if constexpr (std::is_same_v<Args, GroupedGemmReduceScatterArgs>)
    words = v * (ceil_div(args_.rows, kTileM) + args_.experts) * col_tiles(args_.hidden);
  else
    words = v * chunks_ * r;
  return static_cast<size_t>(words + v) * sizeof(uint32_t);  // + each virtual rank's `finished` counter
}

template <class Args, class Operands>
void FusedKernel<Args, Operands>::initialize(void* workspace, cudaStream_t stream) {
  MOEPLAN_ASSERT(can_implement(args_).empty());
  MOEPLAN_ASSERT(epoch_ == 0);  // counters zeroed under a running epoch would never reach their targets
  workspace_ = workspace;
  MOERUN_CUDA_CHECK(cudaMemsetAsync(workspace_, 0, workspace_size(), stream));
  constexpr bool copy_engines = std::is_same_v<Args, AllToAllGemmArgs>;
  ctas_ = grid_ctas(args_.group, kernel_of<Args>(), copy_engines);
  comm_ctas_ = comm_ctas_for(params_of<Args>(), ctas_);
  MOEPLAN_ASSERT(ctas_ > comm_ctas_);
  if constexpr (copy_engines) {
    if (side_.empty()) {
      side_.resize(static_cast<size_t>(args_.group.virtual_ranks));
      join_.resize(side_.size());
      for (size_t i = 0; i < side_.size(); ++i) {
        MOERUN_CUDA_CHECK(cudaStreamCreateWithFlags(&side_[i], cudaStreamNonBlocking));
        MOERUN_CUDA_CHECK(cudaEventCreateWithFlags(&join_[i], cudaEventDisableTiming));
      }
      MOERUN_CUDA_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
    }
  }
}

template <class Args, class Operands>
void FusedKernel<Args, Operands>::run(std::span<const Operands> ranks, cudaStream_t stream) {
  MOEPLAN_ASSERT(workspace_ != nullptr);
  MOEPLAN_ASSERT(static_cast<int>(ranks.size()) == args_.group.virtual_ranks);
  check_operands(args_, ranks);
  ++epoch_;
  Launch<Args, Operands> L;
  L.args = args_;
  for (size_t v = 0; v < ranks.size(); ++v) L.ops[v] = ranks[v];
  L.work = static_cast<uint32_t*>(workspace_);
  L.finished = L.work + workspace_size() / sizeof(uint32_t) - ranks.size();
  L.comm_ctas = comm_ctas_;
  L.chunks = chunks_;
  L.epoch = epoch_;
  const dim3 grid(static_cast<unsigned>(ctas_), static_cast<unsigned>(ranks.size()));

  if constexpr (std::is_same_v<Args, AllToAllGemmArgs>) {
    // Copy streams: say ready, wait for every peer's ready, fetch each (chunk, peer) block and flag it,
    // say done, wait until every peer is done with this rank's input. Virtual ranks skip the handshake: the
    // fork event already orders every rank's input before the copies, and the join events every copy
    // before the stream goes on (and streams waiting on each other's writes could deadlock when they share
    // a hardware queue).
    const int R = args_.group.ranks;
    const bool handshake = args_.group.virtual_ranks == 1;
    const int64_t S = args_.tokens, cpr = args_.cols_per_rank, depth = R * cpr;
    const RowChunks ch = RowChunks::make(S, chunks_);
    MOERUN_CUDA_CHECK(cudaEventRecord(fork_, stream));
    for (size_t v = 0; v < ranks.size(); ++v) {
      const Operands& o = ranks[v];
      cudaStream_t st = side_[v];
      uint32_t* flags = L.work + static_cast<int64_t>(v) * chunks_ * R;
      MOERUN_CUDA_CHECK(cudaStreamWaitEvent(st, fork_, 0));
      // Tell every peer `slot`, then wait until every peer has told this rank.
      auto exchange = [&](int slot) {
        if (!handshake) return;
        for (int p = 0; p < R; ++p) write_value(st, o.signals[p] + slot + o.rank, epoch_);
        for (int p = 0; p < R; ++p) wait_value(st, o.signals[o.rank] + slot + p, epoch_);
      };
      exchange(kSignalReady);
      for (int c = 0; c < ch.chunks; ++c)
        for (int j = 0; j < R; ++j) {
          const int p = (o.rank + j) % R;
          const int64_t begin = ch.begin(c), rows = ch.end(c) - begin;
          if (rows > 0)
            MOERUN_CUDA_CHECK(cudaMemcpy2DAsync(o.gathered + begin * depth + p * cpr, depth * sizeof(Bf16),
                                                o.in[p] + (o.rank * S + begin) * cpr, cpr * sizeof(Bf16),
                                                cpr * sizeof(Bf16), rows, cudaMemcpyDefault, st));
          write_value(st, flags + c * R + p, epoch_);
        }
      exchange(kSignalDone);
      MOERUN_CUDA_CHECK(cudaEventRecord(join_[v], st));
    }
    all_to_all_gemm_kernel<<<grid, kThreads, 0, stream>>>(L);
    MOERUN_CUDA_CHECK(cudaGetLastError());
    for (cudaEvent_t ev : join_) MOERUN_CUDA_CHECK(cudaStreamWaitEvent(stream, ev, 0));
  } else {
    // Cooperative: the launch waits until every CTA can be resident at once (they wait on each other), and
    // fails rather than hangs when the grid cannot be.
    cudaLaunchAttribute coop{};
    coop.id = cudaLaunchAttributeCooperative;
    coop.val.cooperative = 1;
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(kThreads);
    cfg.stream = stream;
    cfg.attrs = &coop;
    cfg.numAttrs = 1;
    if constexpr (std::is_same_v<Args, AllGatherGroupedGemmArgs>)
      MOERUN_CUDA_CHECK(cudaLaunchKernelEx(&cfg, all_gather_grouped_gemm_kernel, L));
    else if constexpr (std::is_same_v<Args, GroupedGemmReduceScatterArgs>)
      MOERUN_CUDA_CHECK(cudaLaunchKernelEx(&cfg, grouped_gemm_reduce_scatter_kernel, L));
    else
      MOERUN_CUDA_CHECK(cudaLaunchKernelEx(&cfg, gemm_all_to_all_kernel, L));
  }
}

template class FusedKernel<AllGatherGroupedGemmArgs, AllGatherGroupedGemmOperands>;
template class FusedKernel<GroupedGemmReduceScatterArgs, GroupedGemmReduceScatterOperands>;
template class FusedKernel<GemmAllToAllArgs, GemmAllToAllOperands>;
template class FusedKernel<AllToAllGemmArgs, AllToAllGemmOperands>;

}  // namespace moeplan::cuda::fused
