// The arithmetic that moerun's fused GEMM + communication kernels (fused_gemm_comm.h) agree on between
// their compute and communication CTAs: how rows split into pipeline chunks, which output tiles exist and in
// what order, and how many tile completions each chunk waits for. A CTA that waits for a count no other CTA
// reaches hangs the kernel, so these functions are host + device and tested on the CPU
// (tests/executor/kernels/cuda/fused/schedule_test.cpp) against brute force.
//
// Tile shape and pipeline depth come from simulator/core/fused_kernels.h, the parameters the cost model
// predicts the kernels with; the static_asserts below keep the two from drifting apart.
#pragma once

#include <cstdint>

#include "simulator/core/fused_kernels.h"

#if defined(__CUDACC__)
#define MOERUN_HD __host__ __device__ __forceinline__
#else
#define MOERUN_HD inline
#endif

namespace moeplan::cuda::fused {

// The block tile of every fused kernel: kTileM x kTileN outputs, kTileK deep per main-loop step.
inline constexpr int kTileM = 128;
inline constexpr int kTileN = 256;
inline constexpr int kTileK = 32;
static_assert(kGemmAllToAll.tile_m == kTileM && kGemmAllToAll.tile_n == kTileN);
static_assert(kAllToAllGemm.tile_m == kTileM && kAllToAllGemm.tile_n == kTileN);
static_assert(kAllGatherGroupedGemm.tile_m == kTileM && kAllGatherGroupedGemm.tile_n == kTileN);
static_assert(kGroupedGemmReduceScatter.tile_m == kTileM && kGroupedGemmReduceScatter.tile_n == kTileN);

// Ranks of one fused group: LSA peers (one NVLink domain), at most a node's eight GPUs.
inline constexpr int kMaxRanks = 8;
// Local experts of one grouped fused kernel (their row offsets live in shared memory).
inline constexpr int kMaxExperts = 512;

MOERUN_HD int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}
MOERUN_HD int64_t min64(int64_t a, int64_t b) {
  return a < b ? a : b;
}
MOERUN_HD int64_t max64(int64_t a, int64_t b) {
  return a > b ? a : b;
}

// `rows` rows cut into `chunks` consecutive pieces of ceil(rows / chunks) rows; the last ones are shorter or
// empty when the rows do not divide evenly (an empty chunk is still signalled, so nobody waits on it).
struct RowChunks {
  int64_t rows = 0;
  int64_t chunk_rows = 1;
  int chunks = 1;

  MOERUN_HD static RowChunks make(int64_t rows, int chunks) {
    RowChunks c;
    c.rows = rows;
    c.chunks = chunks;
    c.chunk_rows = rows > 0 ? ceil_div(rows, chunks) : 1;
    return c;
  }
  MOERUN_HD int64_t begin(int c) const { return min64(rows, int64_t{c} * chunk_rows); }
  MOERUN_HD int64_t end(int c) const { return min64(rows, int64_t{c + 1} * chunk_rows); }
  MOERUN_HD int of_row(int64_t r) const { return static_cast<int>(r / chunk_rows); }
};

// The output tiles of a grouped GEMM over experts whose rows are contiguous: expert e owns rows
// [off[e], off[e + 1]) and ceil(m_e / kTileM) row tiles, each `n_tiles` wide. Tiles are numbered expert by
// expert, row tile by row tile, then across the columns, so a tile's number grows with its rows: compute
// CTAs taking tiles in number order consume (and produce) rows in the order the chunks are moved.
// `tile_off` [E + 1] is the running count of tiles (tile_off[0] = 0).
MOERUN_HD void expert_tile_offsets(const int32_t* off, int experts, int64_t n_tiles, int32_t* tile_off) {
  tile_off[0] = 0;
  for (int e = 0; e < experts; ++e)
    tile_off[e + 1] = tile_off[e] + static_cast<int32_t>(ceil_div(off[e + 1] - off[e], kTileM) * n_tiles);
}

struct GroupedTile {
  int expert = 0;
  int64_t row_begin = 0, row_end = 0;  // rows of the tile in the expert-sorted buffer
  int64_t col = 0;                     // first output column
};

// Tile number t (0 <= t < tile_off[experts]) located by binary search over tile_off.
MOERUN_HD GroupedTile locate_grouped_tile(const int32_t* off, const int32_t* tile_off, int experts,
                                          int64_t n_tiles, int64_t t) {
  int lo = 0, hi = experts - 1;  // the expert e with tile_off[e] <= t < tile_off[e + 1]
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (tile_off[mid] <= t)
      lo = mid;
    else
      hi = mid - 1;
  }
  const int64_t local = t - tile_off[lo];
  GroupedTile g;
  g.expert = lo;
  g.row_begin = off[lo] + (local / n_tiles) * kTileM;
  g.row_end = min64(g.row_begin + kTileM, off[lo + 1]);
  g.col = (local % n_tiles) * kTileN;
  return g;
}

// Row tiles of the experts that overlap rows [begin, end), times the column tiles: how many tile
// completions a chunk of those rows waits for when every tile signals each chunk its rows touch.
MOERUN_HD int64_t grouped_tiles_touching(const int32_t* off, int experts, int64_t n_tiles, int64_t begin,
                                         int64_t end) {
  if (begin >= end) return 0;
  int64_t count = 0;
  for (int e = 0; e < experts; ++e) {
    const int64_t lo = max64(begin, off[e]), hi = min64(end, off[e + 1]);
    if (lo >= hi) continue;
    count += (hi - 1 - off[e]) / kTileM - (lo - off[e]) / kTileM + 1;
  }
  return count * n_tiles;
}

// Dense tiles: a [rows, cols] output in row tiles of kTileM and column tiles of kTileN, numbered row-major.
// Columns [p cols_per_rank, (p + 1) cols_per_rank) belong to rank p (Ulysses: rank p's heads).
MOERUN_HD int64_t col_tiles(int64_t cols) {
  return ceil_div(cols, kTileN);
}
// Column tiles that overlap rank p's columns.
MOERUN_HD int64_t col_tiles_touching_rank(int64_t cols_per_rank, int p) {
  const int64_t lo = int64_t{p} * cols_per_rank, hi = lo + cols_per_rank;
  return (hi - 1) / kTileN - lo / kTileN + 1;
}
// Row tiles that overlap rows [begin, end).
MOERUN_HD int64_t row_tiles_touching(int64_t begin, int64_t end) {
  return begin >= end ? 0 : (end - 1) / kTileM - begin / kTileM + 1;
}

// The push GEMM's layouts (push_gemm.h). `counts` [R][R][E] is the group's routing: counts[q][r][e]
// rows of token owner r's tokens at expert owner q's local expert e. An expert owner keeps its rows expert by
// expert, each expert's rows by token owner; a token owner receives its rows as blocks in (expert owner,
// local expert) order.
MOERUN_HD int64_t push_count(const int32_t* counts, int ranks, int experts, int q, int r, int e) {
  return counts[(int64_t{q} * ranks + r) * experts + e];
}
// The first row of the block (local expert e, token owner r) among expert owner q's rows.
MOERUN_HD int64_t push_source_row(const int32_t* counts, int ranks, int experts, int q, int r, int e) {
  int64_t row = 0;
  for (int e2 = 0; e2 < e; ++e2)
    for (int r2 = 0; r2 < ranks; ++r2) row += push_count(counts, ranks, experts, q, r2, e2);
  for (int r2 = 0; r2 < r; ++r2) row += push_count(counts, ranks, experts, q, r2, e);
  return row;
}
// The first row, in token owner r's receive buffer, of the block expert owner q's local expert e sends it;
// with q = ranks (and e = 0), the rows r receives in all.
MOERUN_HD int64_t push_receive_row(const int32_t* counts, int ranks, int experts, int r, int q, int e) {
  int64_t row = 0;
  for (int q2 = 0; q2 < q; ++q2)
    for (int e2 = 0; e2 < experts; ++e2) row += push_count(counts, ranks, experts, q2, r, e2);
  for (int e2 = 0; e2 < e; ++e2) row += push_count(counts, ranks, experts, q, r, e2);
  return row;
}

// Slots of a rank's signal array (uint32, in symmetric memory: peers write them). ready[p]: rank p may
// proceed (its input is written, or its receive buffer is free); done[p]: rank p has finished with this rank
// (read its input, or written its output). Values only grow: a run with epoch n waits for n (or n times the
// writers), so the array is zeroed once, when the kernel object is initialised.
inline constexpr int kSignalReady = 0;
inline constexpr int kSignalDone = kMaxRanks;
inline constexpr int kSignalSlots = 2 * kMaxRanks;

}  // namespace moeplan::cuda::fused
