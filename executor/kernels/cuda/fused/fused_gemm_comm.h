// moerun's fused tile-level GEMM + communication kernels (intra-operator overlap, MegaScale-MoE §4.2 and
// COMET): communication of one chunk of rows runs while the tiles of the chunks before it are computed, with
// signalling between CTAs and between GPUs done on the device, never by the host.
//
//   AllGatherGroupedGemm      experts' first GEMM: pull each local expert's rows from the ranks that own
//                             them (all-gather + scatter), grouped GEMM on the rows as their chunk lands
//   GroupedGemmReduceScatter  experts' second GEMM: grouped GEMM, each finished chunk of rows pushed to the
//                             rank that owns its token, then the gate-weighted sum of a token's top-k rows
//   GemmAllToAll              Ulysses QKV projection: GEMM, each finished chunk pushed to the rank that owns
//                             its heads
//   AllToAllGemm              Ulysses output projection: copy engines fetch each rank's chunk of the
//                             attention output while the GEMM consumes the chunks already fetched
//
// Lifecycle (CUTLASS's): can_implement(args), construct, workspace_size(), initialize(workspace) once, then
// run(operands, stream) any number of times, collectively: every rank of the group calls run the same
// number of times in the same order.
//
// Peers. A rank sees the group's symmetric buffers as arrays of pointers, one per peer (peer p's buffer at
// [p]). On GPUs of one NVLink domain they are NCCL symmetric-memory windows (symmetric_memory.h: LSA
// pointers); with `virtual_ranks` = ranks, every rank of the group runs on this one GPU in one launch and
// its peers are buffers on this device, which tests the tile signalling without a second GPU. Signal arrays
// (kSignalSlots uint32 per rank, schedule.h) are symmetric too, zeroed before the first run, and owned by
// one kernel object.
//
// The kernels' CTAs wait on each other, so all of them must be resident at once: the grid is sized from the
// occupancy calculator and launched cooperatively (the launch waits for room, or fails, rather than hang);
// AllToAllGemm's CTAs wait only on copy engines and launch normally. Beside other kernels that wait on peers
// (NCCL's, on other streams), leave them SMs (Group::sms_left): a fused kernel holding every SM while its
// peer sits in a collective this GPU cannot schedule would make the two ranks wait on each other.
//
// Tile shape, communication SMs and pipeline depth are simulator/core/fused_kernels.h's, the parameters the
// cost model predicts these kernels with. The tile main loop is a warp-level bf16 MMA (wmma) with fp32
// accumulation: simpler than the CUTLASS wgmma grouped GEMM (grouped_gemm.h), and expected to be slower (not
// yet measured: the fused benchmark reports both).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "executor/kernels/cuda/check.h"
#include "executor/kernels/cuda/fused/schedule.h"

namespace moeplan::cuda::fused {

using Bf16 = __nv_bfloat16;

// How a run is laid out on the GPU.
struct Group {
  int ranks = 1;          // R: ranks of the group (1..kMaxRanks)
  int virtual_ranks = 1;  // 1 (this process is one rank of R) or R (all of them, on this GPU)
  int ctas_per_rank = 0;  // CTAs per (virtual) rank; 0: the co-resident grid shared evenly
  int sms_left = 0;       // SMs left idle for other kernels (kFusedSmsLeftForCollectives in a training step)
};

// ---- All-gather + scatter + grouped GEMM --------------------------------------------------------------
struct AllGatherGroupedGemmArgs {
  Group group;
  int experts = 0;     // local experts (1..kMaxExperts)
  int64_t tokens = 0;  // rows of each rank's x
  int64_t hidden = 0;  // x's width, the GEMM's depth (multiple of 8)
  int64_t out = 0;     // the GEMM's width (multiple of 8)
  int64_t rows = 0;    // capacity of `gathered` and `y`; the counts sum to at most this
};
struct AllGatherGroupedGemmOperands {
  int rank = 0;
  const Bf16* x[kMaxRanks] = {};      // peer p's tokens [tokens, hidden] (symmetric)
  uint32_t* signals[kMaxRanks] = {};  // peer p's signal array (symmetric)
  const int32_t* counts = nullptr;    // [experts] rows per local expert (device)
  const int32_t* src_rank = nullptr;  // [rows] row i of the expert-sorted buffer comes from rank src_rank[i]
  const int32_t* src_row = nullptr;   // [rows] ... its row src_row[i]
  Bf16* gathered = nullptr;           // [rows, hidden] the gathered rows (output, local)
  const Bf16* w = nullptr;            // [experts, hidden, out]
  Bf16* y = nullptr;                  // [rows, out] y_e = gathered_e W_e
};

// ---- Grouped GEMM + gather + reduce-scatter -------------------------------------------------------------
struct GroupedGemmReduceScatterArgs {
  Group group;
  int experts = 0;
  int64_t in = 0;      // h's width, the GEMM's depth (multiple of 8)
  int64_t hidden = 0;  // the GEMM's width and the output's (multiple of 8)
  int64_t rows = 0;    // capacity of h and y
  int64_t tokens = 0;  // tokens of each rank
  int64_t top_k = 0;   // expert rows per token
};
struct GroupedGemmReduceScatterOperands {
  int rank = 0;
  Bf16* recv[kMaxRanks] = {};  // peer p's receive buffer [tokens * top_k, hidden] (symmetric)
  uint32_t* signals[kMaxRanks] = {};
  const int32_t* counts = nullptr;    // [experts]
  const int32_t* dst_rank = nullptr;  // [rows] row i's token lives on rank dst_rank[i] ...
  const int32_t* dst_slot = nullptr;  // [rows] ... as its slot t * top_k + j
  const Bf16* h = nullptr;            // [rows, in] expert-sorted rows
  const Bf16* w = nullptr;            // [experts, in, hidden]
  Bf16* y = nullptr;                  // [rows, hidden] y_e = h_e W_e (staging, local)
  const float* gates = nullptr;       // [tokens, top_k] gate of each slot (this rank's tokens)
  Bf16* out = nullptr;  // [tokens, hidden] out[t] = sum_j gates[t, j] recv[t top_k + j], fp32 sum
};

// ---- GEMM + all-to-all (Ulysses QKV projection) ---------------------------------------------------------
struct GemmAllToAllArgs {
  Group group;
  int64_t tokens = 0;         // S: each rank's sequence shard
  int64_t hidden = 0;         // the GEMM's depth (multiple of 8)
  int64_t cols_per_rank = 0;  // columns (heads x head dim) each rank receives (multiple of 8)
};
struct GemmAllToAllOperands {
  int rank = 0;
  const Bf16* x = nullptr;    // [tokens, hidden]
  const Bf16* w = nullptr;    // [hidden, ranks * cols_per_rank], rank p's columns at p cols_per_rank
  Bf16* staged = nullptr;     // [tokens, ranks * cols_per_rank] x w (local)
  Bf16* out[kMaxRanks] = {};  // peer p's [ranks * tokens, cols_per_rank]: rank q's rows at q tokens
  uint32_t* signals[kMaxRanks] = {};
};

// ---- All-to-all + GEMM (Ulysses output projection) ------------------------------------------------------
struct AllToAllGemmArgs {
  Group group;
  int64_t tokens = 0;         // S
  int64_t cols_per_rank = 0;  // each rank's attention-output width (multiple of kTileK)
  int64_t out = 0;            // the GEMM's width (multiple of 8)
};
struct AllToAllGemmOperands {
  int rank = 0;
  const Bf16* in[kMaxRanks] = {};  // peer p's [ranks * tokens, cols_per_rank], rank q's rows at q tokens
  uint32_t* signals[kMaxRanks] = {};
  Bf16* gathered = nullptr;  // [tokens, ranks * cols_per_rank]: this rank's rows of every peer
  const Bf16* w = nullptr;   // [ranks * cols_per_rank, out]
  Bf16* y = nullptr;         // [tokens, out]
};

// Empty when the kernel can run here with these shapes; otherwise why not (shape rule, no device, a device
// older than sm_80).
std::string can_implement(const AllGatherGroupedGemmArgs& a);
std::string can_implement(const GroupedGemmReduceScatterArgs& a);
std::string can_implement(const GemmAllToAllArgs& a);
std::string can_implement(const AllToAllGemmArgs& a);

// One class per kernel; `Args` and `Operands` above. run() takes one Operands per virtual rank.
template <class Args, class Operands>
class FusedKernel {
 public:
  explicit FusedKernel(const Args& args);
  ~FusedKernel();
  FusedKernel(const FusedKernel&) = delete;
  FusedKernel& operator=(const FusedKernel&) = delete;

  size_t workspace_size() const;
  // Zeroes the workspace's chunk counters on `stream`; the workspace stays this object's.
  void initialize(void* workspace, cudaStream_t stream);
  void run(std::span<const Operands> ranks, cudaStream_t stream);

  const Args& args() const { return args_; }
  int ctas_per_rank() const { return ctas_; }  // after initialize()
  int comm_ctas() const { return comm_ctas_; }
  int chunks() const { return chunks_; }  // pipeline chunks of one rank's rows (per peer, for the dense pair)

 private:
  Args args_;
  void* workspace_ = nullptr;
  uint32_t epoch_ = 0;
  int ctas_ = 0, comm_ctas_ = 0, chunks_ = 0;
  std::vector<cudaStream_t> side_;  // AllToAllGemm: one copy stream per virtual rank
  cudaEvent_t fork_ = nullptr;
  std::vector<cudaEvent_t> join_;
};

// The group's signal arrays when every rank is virtual (on this GPU): one zeroed allocation, rank p's array
// at p kSignalSlots. Use one per kernel object.
class VirtualSignals {
 public:
  explicit VirtualSignals(int ranks) : buf_(static_cast<size_t>(ranks) * kSignalSlots) {
    MOERUN_CUDA_CHECK(cudaMemset(buf_.data(), 0, buf_.bytes()));
  }
  uint32_t* of(int p) const { return buf_.data() + static_cast<int64_t>(p) * kSignalSlots; }

 private:
  DeviceBuffer<uint32_t> buf_;
};

using AllGatherGroupedGemm = FusedKernel<AllGatherGroupedGemmArgs, AllGatherGroupedGemmOperands>;
using GroupedGemmReduceScatter = FusedKernel<GroupedGemmReduceScatterArgs, GroupedGemmReduceScatterOperands>;
using GemmAllToAll = FusedKernel<GemmAllToAllArgs, GemmAllToAllOperands>;
using AllToAllGemm = FusedKernel<AllToAllGemmArgs, AllToAllGemmOperands>;

}  // namespace moeplan::cuda::fused
