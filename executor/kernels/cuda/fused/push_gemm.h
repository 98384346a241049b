// The fused kernels whose GEMM produces what a peer needs (issue 17, item 3), on CUTLASS's SM90 grouped
// kernel (TMA + wgmma, warp-specialised; grouped_gemm_kernels.cuh) instead of the fused kernels' single-stage
// wmma main loop (fused_gemm_comm.h): the grouped GEMM's groups are the blocks of the output that go to one
// rank, and each group's output pointer is that rank's buffer, a peer's NCCL symmetric window, so the
// epilogue stores every finished tile over NVLink to where it is needed while the other tiles are computed
// (Flux's GEMM + reduce-scatter does the same; TMA stores to a peer's memory as to its own: "TMA knows
// nothing about the memory being on remote or local GPU", CUTLASS issue 1943, and nvFuser PR 6011 tests TMA
// writes into peers' symmetric memory on Hopper).
//   PushGemmCombine    the experts' second GEMM (GroupedGemmReduceScatter's job): groups are (local expert,
//                      token owner) row blocks, stored in the token owner's receive buffer; each token owner
//                      then sums its tokens' top-k rows with their gates
//   PushGemmAllToAll   the Ulysses QKV projection (GemmAllToAll's job): groups are rank p's column blocks of
//                      x W, stored in rank p's output at this rank's rows
// And, on the consumer side, one fused kernel as a pipeline of chunks instead (CUTLASS's kernels have no
// main loop that waits for a chunk before its loads):
//   GatherGemm         the experts' first GEMM (AllGatherGroupedGemm's job): each token owner's rows are
//                      gathered from its buffer on a side stream, a chunk per token owner, while the grouped
//                      GEMM computes the chunks gathered before it (one launch per chunk, leaving SMs to the
//                      gathers), the own rows first
// The all-to-all + GEMM stays on fused_gemm_comm.h: its chunks split the GEMM's depth, so chunked launches
// would each read and write an fp32 partial of the whole output; at the Ulysses shapes (4096 tokens, 4096
// wide, 8 ranks: 128 MB per chunk against a 17 GFLOP chunk GEMM) that traffic outlasts the chunk's GEMM.
//
// One run, per rank: tell every peer that this rank's receive buffer is free (its previous run's reader has
// read it); wait until every peer's is; the push GEMM; tell every peer that its rows are in place; wait for
// every peer's rows (and combine them). Each step is a kernel on the caller's stream, so the host never
// waits, and no kernel waits for a peer's later step, so ranks cannot wait on each other in a cycle. With
// `virtual_ranks` = ranks every rank of the group runs on this GPU (peers are buffers here), one rank's GEMM
// after another, which tests the layouts and the signalling without a second GPU.
//
// PushGemmCombine's layouts (schedule.h: push_source_row, push_receive_row): `counts` [R][R][E] holds the
// group's routing, counts[q][r][e] rows of token owner r's tokens at expert owner q's local expert e, the
// same array on every rank (Megatron's dispatchers exchange these counts before the dispatch). An expert
// owner's rows h are expert by expert, each expert's rows by token owner (the order the dispatch delivers
// them in); a token owner's receive buffer holds blocks in (expert owner, local expert) order, and recv_row
// names the row of each (token, choice) there, known from the owner's own routing.
//
// Built for sm_90a alone; can_implement says why not elsewhere. Never run on a GPU yet (written 2026-12-07,
// with no device lent): its GPU test and benchmark rows are in the device check.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "executor/kernels/cuda/fused/schedule.h"

namespace moeplan::cuda::fused {

struct PushGemmCombineArgs {
  int ranks = 1;          // R: ranks of the group (1..kMaxRanks)
  int virtual_ranks = 1;  // 1 (this process is one rank of R) or R (all of them, on this GPU)
  int experts = 0;        // E: local experts per rank (E x R <= 1024 groups)
  int64_t in = 0;         // h's width, the GEMM's depth (multiple of 8)
  int64_t hidden = 0;     // the GEMM's and the output's width (multiple of 8)
  int64_t rows = 0;       // capacity of h: the rows a rank's experts hold at most
  int64_t tokens = 0;     // tokens of each rank
  int64_t top_k = 0;      // expert rows per token
};

struct PushGemmCombineOperands {
  int rank = 0;
  __nv_bfloat16* recv[kMaxRanks] = {};  // peer p's receive buffer [tokens * top_k, hidden] (symmetric)
  uint32_t* signals[kMaxRanks] = {};    // peer p's signal array (kSignalSlots, symmetric, zeroed once)
  const int32_t* counts = nullptr;      // [R][R][E] the group's routing (device), as above
  const int32_t* recv_row = nullptr;    // [tokens * top_k] row of this rank's recv holding (t, j)
  const __nv_bfloat16* h = nullptr;     // [rows, in] this rank's expert rows, as above
  const __nv_bfloat16* w = nullptr;     // [experts, in, hidden]
  const float* gates = nullptr;         // [tokens, top_k] gate of each (token, choice)
  __nv_bfloat16* out = nullptr;  // [tokens, hidden] out[t] = sum_j gates[t, j] recv[recv_row[t top_k + j]]
};

// Empty when the kernel can run here with these shapes; otherwise why not (a shape rule, no device, a device
// other than sm_90, or a build without its sm_90a code).
std::string can_implement(const PushGemmCombineArgs& a);

// Lifecycle (CUTLASS's): construct, workspace_size(), initialize(workspace) once (builds each virtual rank's
// CUTLASS kernel on its part of the workspace), then run(operands, stream) any number of times with one
// Operands per virtual rank, collectively: every rank of the group calls run the same number of times. The
// counts may change from run to run (read on the device); their sums must stay within `rows` and
// tokens x top_k (a violation traps: a bug upstream).
class PushGemmCombine {
 public:
  explicit PushGemmCombine(const PushGemmCombineArgs& args);
  ~PushGemmCombine();
  PushGemmCombine(const PushGemmCombine&) = delete;
  PushGemmCombine& operator=(const PushGemmCombine&) = delete;

  size_t workspace_size() const;
  void initialize(void* workspace, cudaStream_t stream);
  void run(std::span<const PushGemmCombineOperands> ranks, cudaStream_t stream);

  const PushGemmCombineArgs& args() const { return args_; }

  struct Impl;  // the CUTLASS kernels, one per virtual rank; defined in push_gemm.cu

 private:
  PushGemmCombineArgs args_;
  std::unique_ptr<Impl> impl_;
};

// ---- GEMM + all-to-all (Ulysses QKV projection) ----------------------------------------------------------
struct PushGemmAllToAllArgs {
  int ranks = 1;              // R (1..kMaxRanks)
  int virtual_ranks = 1;      // 1 or R
  int64_t tokens = 0;         // S: each rank's sequence shard
  int64_t hidden = 0;         // the GEMM's depth (multiple of 8)
  int64_t cols_per_rank = 0;  // columns (heads x head dim) each rank receives (multiple of 8)
};
struct PushGemmAllToAllOperands {
  int rank = 0;
  const __nv_bfloat16* x = nullptr;    // [tokens, hidden]
  const __nv_bfloat16* w = nullptr;    // [hidden, ranks * cols_per_rank], rank p's columns at p cols_per_rank
  __nv_bfloat16* out[kMaxRanks] = {};  // peer p's [ranks * tokens, cols_per_rank]: rank q's rows at q tokens
  uint32_t* signals[kMaxRanks] = {};   // peer p's signal array (kSignalSlots, symmetric, zeroed once)
};

std::string can_implement(const PushGemmAllToAllArgs& a);

// As PushGemmCombine; run() returns with every peer's rows on their way into this rank's `out`, complete when
// the stream gets past the run.
class PushGemmAllToAll {
 public:
  explicit PushGemmAllToAll(const PushGemmAllToAllArgs& args);
  ~PushGemmAllToAll();
  PushGemmAllToAll(const PushGemmAllToAll&) = delete;
  PushGemmAllToAll& operator=(const PushGemmAllToAll&) = delete;

  size_t workspace_size() const;
  void initialize(void* workspace, cudaStream_t stream);
  void run(std::span<const PushGemmAllToAllOperands> ranks, cudaStream_t stream);

  const PushGemmAllToAllArgs& args() const { return args_; }

 private:
  PushGemmAllToAllArgs args_;
  std::unique_ptr<PushGemmCombine::Impl> impl_;  // the same per-virtual-rank kernels
};

// ---- All-gather + grouped GEMM, chunk by chunk (the experts' first GEMM) ----------------------------------
// Layouts: `counts` [R][R][E] as PushGemmCombine's; this rank's `gathered` and `y` hold its experts' rows
// expert by expert and each expert's rows by token owner, PushGemmCombine's h layout, so block (e, r) of
// the rows comes from token owner r, and its rows are rows src_row[i] of r's x.
struct GatherGemmArgs {
  int ranks = 1;          // R: ranks of the group (1..kMaxRanks)
  int virtual_ranks = 1;  // 1 or R
  int experts = 0;        // E: local experts per rank (E x R <= 1024)
  int64_t tokens = 0;     // rows of each rank's x
  int64_t hidden = 0;     // x's width, the GEMM's depth (multiple of 8)
  int64_t out = 0;        // the GEMM's width (multiple of 8)
  int64_t rows = 0;       // capacity of gathered and y: a rank's experts hold at most this many rows
  int gather_sms = 16;    // SMs the grouped GEMM leaves to the gathers beside it (1..half the GPU)
};
struct GatherGemmOperands {
  int rank = 0;
  const __nv_bfloat16* x[kMaxRanks] = {};  // peer p's tokens [tokens, hidden] (symmetric)
  uint32_t* signals[kMaxRanks] = {};       // peer p's signal array (kSignalSlots, symmetric, zeroed once)
  const int32_t* counts = nullptr;         // [R][R][E] the group's routing (device), as above
  const int32_t* src_row = nullptr;        // [rows] the row of its token owner's x that row i holds
  __nv_bfloat16* gathered = nullptr;       // [rows, hidden] the gathered rows (output, local)
  const __nv_bfloat16* w = nullptr;        // [experts, hidden, out]
  __nv_bfloat16* y = nullptr;              // [rows, out] y_e = gathered_e W_e
};

std::string can_implement(const GatherGemmArgs& a);

// One run, per rank: tell every peer that this rank's x is ready; on a side stream, for each token owner r
// (this rank first), wait for r's x, gather block (e, r) of every expert; on the caller's stream, each
// chunk's grouped GEMM (E groups) once its gather is done; tell every peer its x has been read; wait until
// every peer has read this rank's x (so the caller may overwrite it after the run). Lifecycle as
// PushGemmCombine's; the counts may change from run to run (read on the device; a negative count, a sum
// over `rows` or a src_row outside x traps).
class GatherGemm {
 public:
  explicit GatherGemm(const GatherGemmArgs& args);
  ~GatherGemm();
  GatherGemm(const GatherGemm&) = delete;
  GatherGemm& operator=(const GatherGemm&) = delete;

  size_t workspace_size() const;
  void initialize(void* workspace, cudaStream_t stream);
  void run(std::span<const GatherGemmOperands> ranks, cudaStream_t stream);

  const GatherGemmArgs& args() const { return args_; }

 private:
  GatherGemmArgs args_;
  std::unique_ptr<PushGemmCombine::Impl> impl_;  // R grouped kernels (one per chunk) per virtual rank
  cudaStream_t side_ = nullptr;                  // the gathers
  cudaEvent_t fork_ = nullptr, join_ = nullptr;
  std::vector<cudaEvent_t> gathered_;  // [virtual rank][chunk]
};

}  // namespace moeplan::cuda::fused
