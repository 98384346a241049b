// The shape at which moerun's CUDA backend runs a kFusedGemmComm op on its fused kernel (the kernel itself:
// simulator/core/fused_ops.h's fused_kind, which the cost model prices the op with). CUDA-free, so the
// mapping is tested on the CPU (tests/executor/runtime/fused_ops_test.cpp) against the lowering's own ops.
// The GEMM's depth and width swap in dgrad (dX [m, k] = dY [m, n] W^T).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <tuple>
#include <vector>

#include "executor/kernels/cuda/fused/schedule.h"
#include "simulator/core/fused_ops.h"
#include "simulator/core/op_graph.h"

namespace moeplan::executor {

struct FusedShape {
  FusedKind kind = FusedKind::kGemmA2a;
  int ranks = 1, experts = 1;
  int64_t m = 0, depth = 0, width = 0;  // GEMM rows (all local experts'), depth and width

  auto key() const { return std::tuple(static_cast<int>(kind), ranks, experts, m, depth, width); }
  // Replay's uniform routing: every rank gathers (scatters) m rows, taking (sending) m / ranks from each
  // rank. A gathering rank's peers read its `source_rows()` token rows (each several times, as top-k
  // routing reads a token once per chosen expert); a scattering rank's peers write its m receive slots.
  int64_t source_rows() const { return (m + ranks - 1) / ranks; }
  // Bytes (bf16) of one rank's buffer that the peers read from or write into.
  size_t symmetric_bytes() const {
    return static_cast<size_t>(kind == FusedKind::kGatherGrouped ? source_rows() * depth : moved_elems()) * 2;
  }
  // Bytes (bf16) each rank's kernel moves between ranks (its own share included): what the collective it
  // fuses is charged with.
  size_t moved_bytes() const { return static_cast<size_t>(moved_elems()) * 2; }

 private:
  int64_t moved_elems() const {
    switch (kind) {
      case FusedKind::kGatherGrouped:  // m rows in, depth wide
      case FusedKind::kA2aGemm:        // [m, depth] gathered from the ranks' [ranks m, depth / ranks]
        return m * depth;
      case FusedKind::kGroupedScatter:  // m rows out, width wide
      case FusedKind::kGemmA2a:         // [m, width] scattered to the ranks' [ranks m, width / ranks]
        return m * width;
    }
    return 0;
  }
};

inline FusedShape fused_shape(const Op& op, int ranks) {
  FusedShape s;
  s.kind = fused_kind(op);
  const bool grouped = s.kind == FusedKind::kGatherGrouped || s.kind == FusedKind::kGroupedScatter;
  const bool forward = op.part != GemmPart::kDgrad;
  s.ranks = ranks;
  s.depth = forward ? op.gemm.k : op.gemm.n;
  s.width = forward ? op.gemm.n : op.gemm.k;
  s.experts = grouped ? static_cast<int>(std::max<int64_t>(1, op.gemm.groups)) : 1;
  s.m = grouped ? (op.gemm.m + s.experts - 1) / s.experts * s.experts : op.gemm.m;  // whole rows per expert
  return s;
}

// The CUTLASS push combine's counts for the replay's uniform routing (push_gemm.h: counts[q][r][e] rows of
// token owner r at expert owner q's local expert e): each rank's m / experts rows per expert, spread over the
// token owners with the remainder rotated by expert owner, so each token owner receives at most m rows (its
// receive slots), and every rank computes the same matrix.
inline std::vector<int32_t> push_combine_counts(const FusedShape& s) {
  const int R = s.ranks, E = s.experts;
  const int64_t c = s.m / E;
  std::vector<int32_t> counts(static_cast<size_t>(R) * static_cast<size_t>(R) * static_cast<size_t>(E));
  for (int q = 0; q < R; ++q)
    for (int r = 0; r < R; ++r)
      for (int e = 0; e < E; ++e)
        counts[static_cast<size_t>((int64_t{q} * R + r) * E + e)] =
            static_cast<int32_t>(c / R + ((r - q + R) % R < c % R ? 1 : 0));
  return counts;
}

// The CUTLASS gather GEMM's source rows for rank `q` under the same counts (push_gemm.h: GatherGemm): its m
// rows block by block (expert by expert, each by token owner r), the j-th row it reads from r being r's
// token row j mod source_rows(), so that every row read lies in r's buffer.
inline std::vector<int32_t> gather_source_rows(const FusedShape& s, const std::vector<int32_t>& counts,
                                               int q) {
  const int R = s.ranks, E = s.experts;
  std::vector<int32_t> rows;
  std::vector<int64_t> read(static_cast<size_t>(R), 0);  // rows read from each token owner so far
  for (int e = 0; e < E; ++e)
    for (int r = 0; r < R; ++r)
      for (int64_t k = 0; k < cuda::fused::push_count(counts.data(), R, E, q, r, e); ++k)
        rows.push_back(static_cast<int32_t>(read[static_cast<size_t>(r)]++ % s.source_rows()));
  return rows;
}

}  // namespace moeplan::executor
