// The op graph of one training step: the contract between prediction (simulator) and execution (moerun). One
// op is one kernel, one collective or one point-to-point transfer on one stream of one representative rank
// per pipeline stage. Both sides name ops identically (op_label), so predicted and measured traces join op by
// op.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "simulator/core/hardware.h"
#include "simulator/core/units.h"

namespace moeplan {

enum class OpKind : uint8_t {
  kGemm,           // dense GEMM [m, k] x [k, n]
  kGroupedGemm,    // one GEMM per local expert; gemm.m: the rows of all local experts (busiest rank)
  kAttention,      // fused causal attention (flash)
  kMemoryBound,    // norms, activations, permutes, casts, embedding, loss
  kCollective,     // all-gather, reduce-scatter, all-reduce, all-to-all over a group
  kSendRecv,       // pipeline point-to-point
  kFusedGemmComm,  // tile-pipelined GEMM with a collective (intra-operator overlap)
  kOptimizer,      // Adam step over the rank's parameter shard
};

enum class Phase : uint8_t { kForward, kBackward, kRecompute, kOptimizer };

// Which half of a GEMM's backward an op is (its label ends in ".dgrad" / ".wgrad").
enum class GemmPart : uint8_t { kNone, kDgrad, kWgrad };

// Process groups of a plan; CommGroup::kAttnReplica is dp x sp x cp (the ranks that hold the same attention
// weights), kExpertDp the ranks that hold the same experts.
enum class CommGroup : uint8_t { kNone, kTp, kSp, kCp, kEp, kEtp, kDp, kAttnReplica, kExpertDp, kPp };

// Streams of one rank. Ops on a stream run in order; edges across streams are events. kTpComm: the tensor-
// parallel exchanges a framework issues asynchronously beside its GEMMs (TE's column-parallel backward), on
// the TP group's own NCCL stream, apart from the expert-parallel exchanges on kComm. kShared: Megatron's
// shared-expert stream (--moe-shared-expert-overlap), apart from kSide, where its device-to-host count copies
// run.
enum class Stream : uint8_t {
  kCompute = 0,
  kComm = 1,
  kSide = 2,
  kDpComm = 3,
  kPpComm = 4,
  kTpComm = 5,
  kShared = 6
};
inline constexpr int kNumStreams = 7;

// What a memory-bound op does (for the breakdown and the stack's efficiency).
enum class MemOp : uint8_t {
  kNone,
  kNorm,
  kActivation,
  kRope,
  kPermute,
  kCast,
  kEmbedding,
  kLoss,  // the loss as one kernel each way (TE's Triton kernels, moerun, MegaScale-MoE)
  kRouting,
  kReduce,
  kLossUnfused,  // Megatron's eager cross-entropy: one PyTorch kernel per step of the loss
  kLossNative,   // Megatron's fused cross-entropy (--cross-entropy-fusion-impl native, torch.compile)
  kGlu           // the gated activation of an MLP (SwiGLU): silu(gate) * up, and its gradient
};

// A GEMM's shape. A memory-bound op whose lowering states it holds here the tensor its kernel walks: m rows
// of n columns, k the kernel's inner size where it has one (the top-k picks of routing and permutes, the head
// dim of RoPE and QK-norm), 0 when not stated; the cost model prices such ops by their bytes alone.
struct GemmShape {
  int64_t m = 0, n = 0, k = 0;  // rows, output columns, reduction
  int64_t groups = 1;           // local experts for grouped GEMMs
};

// Shapes and groups are 32-bit: a step repeats every op once per micro-batch, so the op is kept small (a
// 1,440-GPU step has about 100k ops, a 2,048-GPU DeepSeek-V3 step about 1.7M).
struct AttentionShape {
  int32_t batch = 0, seq_q = 0, seq_kv = 0, heads = 0, qk_dim = 0, v_dim = 0;
  int32_t window = 0;  // 0 = full causal
  bool causal = true;
  int16_t kv_heads = 0;  // K/V heads on this rank (GQA, MQA); 0: one per query head
};

struct CommSpec {
  Collective collective = Collective::kAllReduce;
  CommGroup group = CommGroup::kNone;
  DType dtype = DType::kBf16;
  // A node-deduplicated exchange (DeepEP / HybridEP): `bytes` arrive over NVLink (one row per token and
  // destination rank), `bytes * nic_bytes_scale` leave the node over RDMA (one per token and remote node).
  bool node_dedup = false;
  int32_t group_size = 1;
  int32_t stride = 1;  // rank distance between consecutive group members (placement on nodes)
  double bytes = 0;    // message size as nccl-tests counts it (the full buffer of the collective)
  double nic_bytes_scale =
      1.0;  // bytes over the NIC relative to a plain collective (node-deduplicated dispatch < 1)
  // A routed all-to-all under skewed routing: the busiest rank's bytes over the mean rank's (`bytes` are the
  // busiest rank's). Priced from the profile's measured all-to-all-v table with a hot receiver where it
  // holds the group, else as a uniform exchange of `bytes`.
  double hot_factor = 1.0;
  // Whether the hot-receiver rule above prices it (DeepEP's and HybridEP's deduplicated kernels keep their
  // own pricing).
  bool hot_routed() const { return collective == Collective::kAllToAll && hot_factor > 1.0 && !node_dedup; }
  // Moved by Transformer Engine's userbuffers (Plan::Overlap::tp_comm) instead of NCCL: in a kFusedGemmComm
  // op, chunk by chunk beside the GEMM (an all-gather as a ring exchange of copy-engine peer copies feeding
  // the GEMM's chunks, a reduce-scatter after each of the GEMM's row chunks); in a collective op, one
  // exchange beside a GEMM on TE's communication SMs.
  bool userbuffers = false;
};

struct Op {
  int32_t id = 0;
  // Into OpGraph::deps. Within the op's first 40 bytes, with its kind, stream, host sync and stage: the
  // passes over every op of a step (the lowering's dependency pass, the engine's set-up) read no further.
  uint32_t dep_begin = 0, dep_count = 0;
  uint16_t name = 0;  // index into kOpNames
  OpKind kind = OpKind::kMemoryBound;
  Phase phase = Phase::kForward;
  Stream stream = Stream::kCompute;
  MemOp mem = MemOp::kNone;
  GemmPart part = GemmPart::kNone;
  DType dtype = DType::kBf16;
  uint16_t kernels = 1;    // kernel launches the host issues for this op (an aggregate op counts several)
  bool host_sync = false;  // the host waits for this op to finish on the device before issuing the next
  // Inside a CUDA graph the plan captures (Plan::cuda_graphs): issued by the graph's replay, not by the host
  // one kernel at a time. The first op of each replay carries the replay's host calls and the copy of the
  // graph's inputs into its static buffers (graph_copy_bytes, read and written; TE's Graphed.forward /
  // backward copy_ each input or incoming gradient that is not already there).
  bool graphed = false;
  float graph_copy_bytes = 0;
  // Kernels around the main one that move aux_bytes (FP8 current scaling: amax, scale, cast), per group of
  // a grouped GEMM; each takes at least the stack's shortest kernel.
  uint8_t aux_kernels = 0;
  // A weight-gradient GEMM that accumulates into the main gradient buffer in its epilogue (D = A·B + C, C and
  // D the buffer; Megatron's gradient-accumulation fusion): that buffer's bytes per element; 0 when the GEMM
  // writes its own output.
  uint8_t accum_bytes = 0;
  // An FP8 GEMM whose operands carry block scales (the plan's --fp8-recipe blockwise): the scales are applied
  // in the main loop, so it runs at the stack's fp8_block_gemm_rate of the per-tensor scaled rate.
  bool block_scaled = false;
  int16_t stage = 0;   // pipeline stage (the representative rank)
  int16_t chunk = 0;   // virtual pipeline chunk on that stage
  int32_t layer = -1;  // model layer, -1 for embedding, head, optimizer
  int32_t micro_batch = -1;
  double flops = 0;      // FLOPs this op executes (attention backward counts its recomputation)
  double hbm_bytes = 0;  // bytes read + written in HBM
  // Bytes moved by memory-bound kernels the stack runs around this op's main kernel (FP8 quantize, amax and
  // transpose of a GEMM's input): priced at the stack's memory-bound efficiency, after the main kernel.
  double aux_bytes = 0;
  GemmShape gemm;
  AttentionShape attn;
  CommSpec comm;
};

// Base names of ops; an op's label is "<name>" or "L<layer>.<name>" (op_label), with phase and micro-batch
// beside it.
inline constexpr const char* kOpNames[] = {
#define MOEPLAN_OP_NAME(id, text) text,
#include "simulator/core/op_names.def"
#undef MOEPLAN_OP_NAME
};
enum class OpName : uint16_t {
#define MOEPLAN_OP_NAME(id, text) id,
#include "simulator/core/op_names.def"
#undef MOEPLAN_OP_NAME
  kCount
};

// A pass over every op of a large graph waits on memory for each op: measured on the 2-core VM, a third of
// op_summary's time on a 115k-op step was the load of each op's first field, the hardware fetching no stride
// of sizeof(Op) ahead. Such a pass asks for the op `kOpPrefetchDistance` places ahead: the line of its first
// bytes (id, dependencies, kind, stream, stage, layer, name) or, for a pass that reads every field (`whole`),
// all of its lines. Graphs below `kOpPrefetchMinOps` (the screen's runs of a layer or two) stay in cache, and
// the prefetches would only add instructions: the search's screen took 8-24 % longer with them.
inline constexpr size_t kOpPrefetchDistance = 8;
inline constexpr size_t kOpPrefetchMinOps = 4096;
inline void prefetch_op_ahead(const std::vector<Op>& ops, size_t i, bool whole = false) {
  if (ops.size() < kOpPrefetchMinOps || i + kOpPrefetchDistance >= ops.size()) return;
  const char* at = reinterpret_cast<const char*>(&ops[i + kOpPrefetchDistance]);
  for (size_t line = 0; line < (whole ? sizeof(Op) : 1); line += 64) __builtin_prefetch(at + line);
}

struct OpGraph {
  std::vector<Op> ops;
  std::vector<int32_t> deps;  // flat dependency lists
  int num_stages = 1;
  int chunks_per_stage = 1;
  int64_t micro_batches = 1;
  // Where the lowering emitted the ops stage after stage: stage s's ops are the ids [stage_first[s],
  // stage_first[s + 1]) (num_stages + 1 entries). Empty where a graph's stages interleave (one built by
  // hand), so a pass over one stage's ops need not read every op (stage_ops).
  std::vector<uint32_t> stage_first;

  std::span<const int32_t> deps_of(const Op& op) const { return {deps.data() + op.dep_begin, op.dep_count}; }
};

// The ids of one stage's ops in id order: from stage_first where the graph has it, else by reading every op.
std::vector<int32_t> stage_ops(const OpGraph& graph, int64_t stage);

// When one op ran (simulated or measured), in seconds from the step's start. Indexed by op id.
struct OpTiming {
  double start = 0, end = 0;
};

std::string op_label(const Op& op);  // "L3.qkv_proj", "L3.qkv_proj.dgrad", "embedding"
const char* name_of(OpKind k);
const char* name_of(Phase p);
const char* name_of(Stream s);
const char* name_of(CommGroup g);
const char* name_of(Collective c);

}  // namespace moeplan
