// The fused kernels' shared schedule arithmetic (executor/kernels/cuda/fused/schedule.h) on the CPU, against
// brute force. A waiter whose target differs from the number of signals its producers send hangs the GPU
// kernel, so every count here is checked by enumerating the tiles and rows themselves.
#include "executor/kernels/cuda/fused/schedule.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <set>
#include <vector>

namespace moeplan::cuda::fused {
namespace {

std::vector<int32_t> offsets_of(const std::vector<int32_t>& counts) {
  std::vector<int32_t> off(counts.size() + 1, 0);
  for (size_t e = 0; e < counts.size(); ++e) off[e + 1] = off[e] + counts[e];
  return off;
}

// Expert row counts that exercise the edges: empty experts, single rows, exact and off-by-one tile multiples.
const std::vector<std::vector<int32_t>> kCountSets = {
    {0},         {1},          {128},    {129},        {127, 1, 0, 256}, {0, 0, 300, 0},
    {5, 7, 300}, {1000, 0, 3}, {64, 64}, {255, 257, 1}};

}  // namespace

TEST_CASE("row chunks cover every row exactly once, in order, and of_row inverts them") {
  for (int64_t rows : {0, 1, 7, 128, 129, 1000, 4097})
    for (int chunks : {1, 2, 3, 4, 8, 16, 32}) {
      const RowChunks ch = RowChunks::make(rows, chunks);
      int64_t next = 0;
      for (int c = 0; c < chunks; ++c) {
        CHECK(ch.begin(c) == next);
        CHECK(ch.end(c) >= ch.begin(c));
        for (int64_t r = ch.begin(c); r < ch.end(c); ++r) CHECK(ch.of_row(r) == c);
        next = ch.end(c);
      }
      CHECK(next == rows);
    }
}

TEST_CASE("grouped tiles enumerate each expert's output once, with tile numbers growing with rows") {
  for (const auto& counts : kCountSets)
    for (int64_t cols : {8, 256, 264, 520}) {
      const int experts = static_cast<int>(counts.size());
      const std::vector<int32_t> off = offsets_of(counts);
      std::vector<int32_t> tile_off(counts.size() + 1);
      const int64_t n_tiles = col_tiles(cols);
      expert_tile_offsets(off.data(), experts, n_tiles, tile_off.data());
      std::vector<int> covered(static_cast<size_t>(off.back() * cols), 0);
      int64_t last_row = -1;
      for (int64_t t = 0; t < tile_off[static_cast<size_t>(experts)]; ++t) {
        const GroupedTile g = locate_grouped_tile(off.data(), tile_off.data(), experts, n_tiles, t);
        REQUIRE(g.expert >= 0);
        REQUIRE(g.expert < experts);
        CHECK(g.row_begin >= off[static_cast<size_t>(g.expert)]);
        CHECK(g.row_end <= off[static_cast<size_t>(g.expert) + 1]);
        CHECK(g.row_end > g.row_begin);
        CHECK(g.row_end - g.row_begin <= kTileM);
        CHECK(g.row_begin >= last_row);  // rows never go backwards: the pipeline's order
        last_row = g.row_begin;
        for (int64_t r = g.row_begin; r < g.row_end; ++r)
          for (int64_t c = g.col; c < std::min<int64_t>(g.col + kTileN, cols); ++c)
            ++covered[static_cast<size_t>(r * cols + c)];
      }
      for (int v : covered) CHECK(v == 1);
    }
}

TEST_CASE("a chunk waits for exactly the grouped tiles that signal it") {
  for (const auto& counts : kCountSets)
    for (int chunks : {1, 4, 8, 32}) {
      const int experts = static_cast<int>(counts.size());
      const std::vector<int32_t> off = offsets_of(counts);
      std::vector<int32_t> tile_off(counts.size() + 1);
      const int64_t n_tiles = 3;
      expert_tile_offsets(off.data(), experts, n_tiles, tile_off.data());
      const RowChunks ch = RowChunks::make(off.back(), chunks);
      std::vector<int64_t> signalled(static_cast<size_t>(chunks), 0);
      for (int64_t t = 0; t < tile_off[static_cast<size_t>(experts)]; ++t) {
        const GroupedTile g = locate_grouped_tile(off.data(), tile_off.data(), experts, n_tiles, t);
        std::set<int> touched;
        for (int64_t r = g.row_begin; r < g.row_end; ++r) touched.insert(ch.of_row(r));
        CHECK(*touched.begin() == ch.of_row(g.row_begin));  // the kernels loop of_row(begin)..of_row(end - 1)
        CHECK(*touched.rbegin() == ch.of_row(g.row_end - 1));
        for (int c : touched) ++signalled[static_cast<size_t>(c)];
      }
      for (int c = 0; c < chunks; ++c)
        CHECK(grouped_tiles_touching(off.data(), experts, n_tiles, ch.begin(c), ch.end(c)) ==
              signalled[static_cast<size_t>(c)]);
    }
}

TEST_CASE("a (chunk, rank) pair of the dense kernels waits for exactly the tiles that signal it") {
  for (int64_t rows : {1, 127, 128, 200, 1000})
    for (int ranks : {1, 2, 4, 8})
      for (int64_t per_rank : {8, 72, 256, 264})
        for (int chunks : {1, 4}) {
          const int64_t cols = ranks * per_rank;
          const RowChunks ch = RowChunks::make(rows, chunks);
          std::vector<int64_t> signalled(static_cast<size_t>(chunks * ranks), 0);
          const int64_t m_tiles = ceil_div(rows, kTileM), n_tiles = col_tiles(cols);
          for (int64_t t = 0; t < m_tiles * n_tiles; ++t) {
            const int64_t row0 = (t / n_tiles) * kTileM, col0 = (t % n_tiles) * kTileN;
            const int64_t row_end = std::min(row0 + kTileM, rows), col_end = std::min(col0 + kTileN, cols);
            // As gemm_all_to_all_kernel signals.
            for (int c = ch.of_row(row0); c <= ch.of_row(row_end - 1); ++c)
              for (int64_t p = col0 / per_rank; p <= (col_end - 1) / per_rank; ++p)
                ++signalled[static_cast<size_t>(c * ranks + p)];
          }
          for (int c = 0; c < chunks; ++c)
            for (int p = 0; p < ranks; ++p)
              CHECK(row_tiles_touching(ch.begin(c), ch.end(c)) * col_tiles_touching_rank(per_rank, p) ==
                    signalled[static_cast<size_t>(c * ranks + p)]);
        }
}

TEST_CASE("the push GEMM's source and receive blocks tile each rank's rows in order, empty blocks included") {
  // Counts with empty blocks, single rows and skew, over 1 to 8 ranks and 1 to 16 local experts: enumerated
  // row by row, an expert owner's blocks follow one another in (expert, token owner) order from row 0, a
  // token owner's in (expert owner, expert) order, and each block of one is as long as the same block of the
  // other.
  for (int ranks : {1, 2, 3, 8})
    for (int experts : {1, 3, 16}) {
      CAPTURE(ranks);
      CAPTURE(experts);
      std::vector<int32_t> counts(static_cast<size_t>(ranks * ranks * experts));
      for (size_t i = 0; i < counts.size(); ++i)
        counts[i] = static_cast<int32_t>(i % 5 == 0 ? 0 : i % 7 == 0 ? 1 : (i * 37) % 300);
      const int32_t* c = counts.data();
      for (int q = 0; q < ranks; ++q) {
        int64_t next = 0;
        for (int e = 0; e < experts; ++e)
          for (int r = 0; r < ranks; ++r) {
            CHECK(push_source_row(c, ranks, experts, q, r, e) == next);
            next += push_count(c, ranks, experts, q, r, e);
          }
      }
      for (int r = 0; r < ranks; ++r) {
        int64_t next = 0;
        for (int q = 0; q < ranks; ++q)
          for (int e = 0; e < experts; ++e) {
            CHECK(push_receive_row(c, ranks, experts, r, q, e) == next);
            next += push_count(c, ranks, experts, q, r, e);
          }
        CHECK(push_receive_row(c, ranks, experts, r, ranks, 0) == next);  // all the rows r receives
      }
      // Every row of every expert owner lands once in some token owner's buffer: the totals agree.
      int64_t sent = 0, received = 0;
      for (int q = 0; q < ranks; ++q) sent += push_source_row(c, ranks, experts, q, 0, experts);
      for (int r = 0; r < ranks; ++r) received += push_receive_row(c, ranks, experts, r, ranks, 0);
      CHECK(sent == received);
      CHECK(sent == std::accumulate(counts.begin(), counts.end(), int64_t{0}));
    }
}

}  // namespace moeplan::cuda::fused
