// The experts' second GEMM with its exchange in the GEMM's epilogue (issue 17, item 3), on CUTLASS's SM90
// grouped kernel (TMA + wgmma, warp-specialised; grouped_gemm_kernels.cuh) instead of the fused kernels'
// single-stage wmma main loop (fused_gemm_comm.h, GroupedGemmReduceScatter): the grouped GEMM's groups are
// (local expert, token owner) blocks of rows, and each group's output pointer is the token owner's receive
// buffer, a peer's NCCL symmetric window, so the epilogue stores every finished tile over NVLink to the rank
// that owns its tokens while the other tiles are computed (Flux's GEMM + reduce-scatter does the same). A
// token owner then waits for every peer's rows and sums each token's top-k rows with their gates.
//
// One run, per rank: tell every peer that this rank's receive buffer is free (its previous combine has read
// it); wait until every peer's is; the push GEMM; tell every peer that its rows are in place; wait for every
// peer's rows and combine. Each step is a kernel on the caller's stream, so the host never waits, and no
// kernel waits for a peer's later step, so ranks cannot wait on each other in a cycle. With
// `virtual_ranks` = ranks every rank of the group runs on this GPU (peers are buffers here), one rank's GEMM
// after another, which tests the layouts and the signalling without a second GPU.
//
// Layouts (schedule.h: push_source_row, push_receive_row): `counts` [R][R][E] holds the group's routing,
// counts[q][r][e] rows of token owner r's tokens at expert owner q's local expert e, the same array on every
// rank (Megatron's dispatchers exchange these counts before the dispatch). An expert owner's rows h are
// expert by expert, each expert's rows by token owner (the order the dispatch delivers them in); a token
// owner's receive buffer holds blocks in (expert owner, local expert) order, and recv_row names the row of
// each (token, choice) there, known from the owner's own routing.
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

  struct Impl;  // the CUTLASS kernels; defined in push_gemm_combine.cu

 private:
  PushGemmCombineArgs args_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moeplan::cuda::fused
