// Replay of ops on a GPU with the CUDA backend's kernels (see cuda_replay_runner.h).
#include "executor/runtime/cuda_replay_runner.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "executor/comm/nccl_communicator.h"
#include "executor/comm/symmetric_memory.h"
#include "executor/kernels/cuda/adam.h"
#include "executor/kernels/cuda/attention.h"
#include "executor/kernels/cuda/check.h"
#include "executor/kernels/cuda/cross_entropy.h"
#include "executor/kernels/cuda/fp8.h"
#include "executor/kernels/cuda/fused/fused_gemm_comm.h"
#include "executor/kernels/cuda/fused/push_gemm.h"
#include "executor/kernels/cuda/gemm.h"
#include "executor/kernels/cuda/grouped_gemm.h"
#include "executor/kernels/cuda/norm.h"
#include "executor/kernels/cuda/permute.h"
#include "executor/kernels/cuda/rope.h"
#include "executor/kernels/cuda/router.h"
#include "executor/kernels/cuda/swiglu.h"
#include "executor/runtime/activation_layout.h"
#include "executor/runtime/fused_ops.h"
#include "executor/runtime/param_layout.h"
#include "executor/runtime/replay_runner.h"
#include "simulator/core/attention_calls.h"
#include "simulator/core/model_stats.h"
#include "simulator/core/status.h"

namespace moeplan::executor {
namespace {

using cuda::DeviceBuffer;

size_t sz(int64_t v) {
  MOEPLAN_ASSERT(v >= 0);
  return static_cast<size_t>(v);
}

[[noreturn]] void refuse(const Op& op, const std::string& why) {
  std::fprintf(stderr, "moerun: the CUDA replay cannot run op %s (%s)\n", op_label(op).c_str(), why.c_str());
  std::abort();
}

// ---- Fused GEMM + communication ops (fused_ops.h maps an op to its kernel and shape) --------------------
// This process is one of the group's `ranks` ranks (no virtual ranks: one GPU per rank), leaving SMs to the
// NCCL kernels of the other streams.
cuda::fused::Group this_process_of(int ranks) {
  return {ranks, 1, 0, static_cast<int>(kFusedSmsLeftForCollectives)};
}
cuda::fused::AllGatherGroupedGemmArgs gather_grouped_args(const FusedShape& s) {
  return {this_process_of(s.ranks), s.experts, s.source_rows(), s.depth, s.width, s.m};
}
// Top-1 receive slots, m of them: each rank receives m rows (m / ranks from each).
cuda::fused::GroupedGemmReduceScatterArgs grouped_scatter_args(const FusedShape& s) {
  return {this_process_of(s.ranks), s.experts, s.depth, s.width, s.m, s.m, 1};
}
cuda::fused::GemmAllToAllArgs gemm_a2a_args(const FusedShape& s) {
  return {this_process_of(s.ranks), s.m, s.depth, s.width / s.ranks};
}
cuda::fused::AllToAllGemmArgs a2a_gemm_args(const FusedShape& s) {
  return {this_process_of(s.ranks), s.m, s.depth / s.ranks, s.width};
}

// The CUTLASS push kernels at the same shapes: every rank's m receive slots one token each (top-1).
cuda::fused::PushGemmCombineArgs push_combine_args(const FusedShape& s) {
  return {s.ranks, 1, s.experts, s.depth, s.width, s.m, s.m, 1};
}
cuda::fused::PushGemmAllToAllArgs push_a2a_args(const FusedShape& s) {
  return {s.ranks, 1, s.m, s.depth, s.width / s.ranks};
}
// The gather GEMM at the same shape: each rank reads source_rows() tokens of every peer.
cuda::fused::GatherGemmArgs gather_gemm_args(const FusedShape& s) {
  cuda::fused::GatherGemmArgs a;
  a.ranks = s.ranks;
  a.experts = s.experts;
  a.tokens = s.source_rows();
  a.hidden = s.depth;
  a.out = s.width;
  a.rows = s.m;
  return a;
}
// The kinds that have a kernel on CUTLASS's grouped GEMM (push_gemm.h): the two whose GEMM produces what
// the peers need, and the experts' gather + GEMM chunk by chunk.
bool has_cutlass_kernel(FusedKind k) {
  return k == FusedKind::kGroupedScatter || k == FusedKind::kGemmA2a || k == FusedKind::kGatherGrouped;
}

// Empty when the fused kernel (the CUTLASS one where `cutlass`) can run the shape here, else why not.
std::string fused_unsupported(const FusedShape& s, bool cutlass) {
  switch (s.kind) {
    case FusedKind::kGatherGrouped:
      return cutlass ? cuda::fused::can_implement(gather_gemm_args(s))
                     : cuda::fused::can_implement(gather_grouped_args(s));
    case FusedKind::kGroupedScatter:
      return cutlass ? cuda::fused::can_implement(push_combine_args(s))
                     : cuda::fused::can_implement(grouped_scatter_args(s));
    case FusedKind::kGemmA2a:
      if (s.width % s.ranks != 0) return "the GEMM's width does not split evenly over the group's ranks";
      return cutlass ? cuda::fused::can_implement(push_a2a_args(s))
                     : cuda::fused::can_implement(gemm_a2a_args(s));
    case FusedKind::kA2aGemm:
      if (s.depth % s.ranks != 0) return "the GEMM's depth does not split evenly over the group's ranks";
      return cuda::fused::can_implement(a2a_gemm_args(s));
  }
  return "unknown fused kernel";
}

// A group's symmetric memory for its fused ops: per rank, kMaxFusedKernels signal arrays, then one data
// region as large as the largest fused op of the group needs (its fused ops run one at a time, on the
// compute stream).
constexpr int kMaxFusedKernels = 64;
constexpr size_t kSignalRegionBytes = size_t{kMaxFusedKernels} * cuda::fused::kSignalSlots * sizeof(uint32_t);

struct GroupMemory {
  int rank = 0, ranks = 1;
  size_t data_bytes = 0;
  int kernels = 0;                                   // signal arrays handed out
  std::unique_ptr<SymmetricMemory> symmetric;        // ranks > 1: an NCCL window
  DeviceBuffer<char> own;                            // ranks == 1: plain device memory
  std::array<char*, cuda::fused::kMaxRanks> base{};  // each rank's region, as this process sees it

  uint32_t* signals(int p, int index) const {
    return reinterpret_cast<uint32_t*>(base[sz(p)]) + static_cast<int64_t>(index) * cuda::fused::kSignalSlots;
  }
  cuda::fused::Bf16* data(int p) const {
    return reinterpret_cast<cuda::fused::Bf16*>(base[sz(p)] + kSignalRegionBytes);
  }
};

}  // namespace

std::string cuda_unsupported(const Plan& plan, const ModelSpec& model) {
  // Its attention replays as square causal self-attention.
  if (model.encoder_decoder()) return "an encoder-decoder model (bidirectional and cross-attention)";
  // The ops of an MTP module outside its decoder layer (its norms, projection and final norm) have no layer
  // of their own, so two modules' would share their places in the activation stash (activation_layout.h).
  if (const int64_t mtp = plan.mtp_layers.value_or(model.mtp_layers); mtp > 1)
    return fmt::format("{} MTP modules (the replay keeps the saved tensors of one)", mtp);
  if (plan.overlap.intra_op) {
    // The lowering fuses Ulysses' all-to-alls (sp > 1) and, without ETP, the experts' dispatch and combine.
    const int64_t sp = plan.attention.sp, ep = plan.experts.etp == 1 ? plan.experts.ep : 1;
    const int64_t widest = std::max(sp, ep);
    if (widest > cuda::fused::kMaxRanks)
      return fmt::format(
          "fused intra-operator kernels over a group of {} ranks (they span at most {}: one "
          "NVLink domain)",
          widest, cuda::fused::kMaxRanks);
  }
  return "";
}

// One op-graph stream's resources: its CUDA stream, scratch buffers and the kernel objects of the shapes it
// has run. Ops of one stream run one at a time on one host thread, so nothing here is shared between threads
// except the byte counters.
// Bit of a GEMM cache key that keeps a lane's FP8 GEMMs apart from its bf16 ones of the same layout and
// shape.
constexpr int kFp8GemmKey = 1 << 8;
constexpr int kFp8WgradKey = 1 << 9;  // and its FP8 weight gradients (fp32 output, accumulated) from the rest

struct Lane {
  cudaStream_t stream = nullptr;
  cudaEvent_t before = nullptr, after = nullptr;  // around the last op's work
  double last_seconds = -1;                       // that op's device time
  std::vector<DeviceBuffer<char>> slots;
  DeviceBuffer<char> gemm_workspace;
  std::map<std::tuple<int, int64_t, int64_t, int64_t>, std::unique_ptr<cuda::Gemm>> gemms;
  struct Grouped {
    std::unique_ptr<cuda::GroupedGemm> kernel;
    DeviceBuffer<char> workspace;
    DeviceBuffer<int32_t> counts;
  };
  std::map<std::tuple<int, int, int64_t, int64_t, int64_t>, Grouped> grouped;
  struct Fused {
    std::unique_ptr<cuda::fused::AllGatherGroupedGemm> gather_grouped;
    std::unique_ptr<cuda::fused::GroupedGemmReduceScatter> grouped_scatter;
    std::unique_ptr<cuda::fused::GemmAllToAll> gemm_a2a;
    std::unique_ptr<cuda::fused::AllToAllGemm> a2a_gemm;
    std::unique_ptr<cuda::fused::PushGemmCombine> push_combine;
    std::unique_ptr<cuda::fused::PushGemmAllToAll> push_a2a;
    std::unique_ptr<cuda::fused::GatherGemm> gather_gemm;
    DeviceBuffer<char> workspace;
    DeviceBuffer<int32_t> counts, map_rank, map_row;  // uniform routing: counts and the row map
  };
  std::map<std::tuple<int, int, int, int, int64_t, int64_t, int64_t>, Fused> fused;
  std::unique_ptr<cuda::CudnnHandle> cudnn;
  // Per call shape: batch, queries, keys, heads, kv heads, qk and v dims, window, causal.
  std::map<std::array<int64_t, 9>, std::unique_ptr<cuda::FlashAttention>> attention;
  std::map<int64_t, DeviceBuffer<int64_t>> positions;  // by row count: 0 .. rows - 1
  std::map<int64_t, DeviceBuffer<int32_t>> row_maps;   // by slot count: the identity permutation
  DeviceBuffer<float> unit_scale;                      // 1.0f: the FP8 GEMMs' per-tensor scales
};

static void open_lane(Lane& l) {
  MOERUN_CUDA_CHECK(cudaStreamCreateWithFlags(&l.stream, cudaStreamNonBlocking));
  MOERUN_CUDA_CHECK(cudaEventCreate(&l.before));
  MOERUN_CUDA_CHECK(cudaEventCreate(&l.after));
}

// Kernel objects and buffers first (after the stream has drained), then the events and the stream.
static void close_lane(Lane& l) {
  const cudaStream_t s = l.stream;
  const cudaEvent_t before = l.before, after = l.after;
  cudaStreamSynchronize(s);
  l = Lane{};
  cudaEventDestroy(before);
  cudaEventDestroy(after);
  cudaStreamDestroy(s);
}

struct CudaReplayRunner::Impl {
  DeviceGroupLookup groups;
  PipelineLinkLookup links;
  Mode mode = Mode::kEnqueue;
  FusedKernels fused_kernels = FusedKernels::kWmma;
  std::vector<Lane> lanes;
  // Pipeline receives: a lane per stage that sends to this one (made at construction, so that the lanes'
  // threads only read the map), and each receive's end by its send's op id, which the ops that consume the
  // message wait on (no timing: the trace has no receive ops; a plain record, so under capture it is the
  // graph's dependency edge).
  std::map<int, Lane> receive_lanes;
  std::map<int32_t, cudaEvent_t> receive_done;
  // The stage's parameters at their real size (param_layout.h), made at construction: bf16 weights, their
  // fp32 main gradients (the weight-gradient GEMMs accumulate into them; the optimizer steps them) and, where
  // the stage has FP8 GEMMs, the weights' e4m3 copies.
  ParamLayout params;
  DeviceBuffer<char> weights, grads, fp8_weights;
  // The stage's saved activations at their real size (activation_layout.h), made at construction: each
  // forward GEMM's input, each attention's q, k, v, o and statistics, each RMSNorm's input and inverse RMS
  // and each SwiGLU's input in its micro-batch's stash, read back by the backward of that micro-batch; a
  // tensor two forwards keep lies there once, written there by its producer.
  ActivationLayout acts;
  DeviceBuffer<char> activations;
  std::atomic<double> bytes{0}, high_water{0};
  std::atomic<int64_t> kernel_ops{0};  // memory-bound and optimizer ops run on their own kernel, all steps
  std::atomic<int64_t> adam_steps{0};  // optimizer ops run (optimizer): the Adam step counter
  std::atomic<int64_t> fp8_ops{0};     // GEMM ops run in FP8 with their input cast (fp8_gemm), all steps
  // kEnqueue: each op's start and end events by op id (made at construction for the ops this rank runs, so
  // the lanes' threads only read the map), and the step's start event on the compute stream.
  std::map<int32_t, std::pair<cudaEvent_t, cudaEvent_t>> op_events;
  cudaEvent_t step_start = nullptr;
  // kGraph: the steps begun, whether the lanes' enqueues are being captured, the instantiated step, each op's
  // end as an event internal to the capture (the cross-stream dependencies; its timing events are external
  // record nodes) and the events that fork the other streams from the compute stream's capture and join them.
  int64_t steps_begun = 0;
  bool capturing = false;
  cudaGraphExec_t graph_exec = nullptr;
  std::map<int32_t, cudaEvent_t> dep_events;
  cudaEvent_t fork = nullptr;
  std::vector<cudaEvent_t> joins;

  // Fused ops' group memory and each fused kernel's signal array, set up before any lane runs (the windows
  // are collective over their groups) and only read afterwards.
  std::map<CommGroup, GroupMemory> fused_memory;
  std::map<std::tuple<int, int, int, int, int64_t, int64_t, int64_t>, int> signal_index;

  // Routing draws (draw_routing): the ops this rank runs, the draws, and this step's rows per local expert of
  // each drawn (layer, micro-batch) ([draw index][local expert]), on the host and in device memory (copied
  // before the step's clock starts; the grouped GEMMs read them there).
  std::span<const Op> graph_ops;
  int own_stage = 0;  // the stage this rank runs
  // The device current at construction: the stage executor's lane threads are new threads, whose current
  // device is device 0 until they set it (bind_device), and a kernel must launch into a stream of the
  // current device.
  int device = 0;
  // The sizing pass (size_buffers, before the first step): every op of the stage once, in graph order, on
  // this thread, with no communication, so that each scratch buffer, workspace and kernel object exists
  // before any NCCL kernel is in flight (cudaMalloc and cudaFree synchronise the device; behind a receive
  // that waits for a peer whose own host thread is in such a call, both ranks would hang). `sizing` is set
  // during the pass and `sized` after it; a buffer that must grow later (drawn routing) is made
  // stream-ordered and the one it replaces is dropped at the next step's start.
  bool sizing = false, sized = false;
  std::mutex retired_mutex;
  std::vector<DeviceBuffer<char>> retired;
  std::optional<RoutingDraws> draws;
  std::vector<int32_t> draw_rows;
  DeviceBuffer<int32_t> draw_rows_device;

  Impl(DeviceGroupLookup gr, PipelineLinkLookup li)
      : groups(std::move(gr)), links(std::move(li)), lanes(sz(kNumStreams)) {
    for (Lane& l : lanes) open_lane(l);
  }

  // Every lane a capture forks and joins: the op-graph streams' (the compute stream first), then the
  // receives'.
  std::vector<Lane*> all_lanes() {
    std::vector<Lane*> out;
    for (Lane& l : lanes) out.push_back(&l);
    for (auto& [stage, l] : receive_lanes) out.push_back(&l);
    return out;
  }

  // The link a pipeline send goes over, from either end.
  DeviceCommunicator* link(const Op& send) {
    DeviceCommunicator* c = links ? links(send) : nullptr;
    if (c == nullptr || c->size() != 2)
      refuse(send, "a pipeline message without the two-rank NCCL communicator of its link");
    return c;
  }

  // Whether ops of this fused kind run their CUTLASS kernel.
  bool cutlass_kernel(FusedKind k) const {
    return fused_kernels == FusedKernels::kCutlassPush && has_cutlass_kernel(k);
  }

  int group_ranks(CommGroup g) {
    DeviceCommunicator* c = groups(g);
    return c == nullptr ? 1 : c->size();
  }

  static std::tuple<int, int, int, int, int64_t, int64_t, int64_t> fused_key(CommGroup g,
                                                                             const FusedShape& s) {
    const auto [kind, ranks, experts, m, depth, width] = s.key();
    return {static_cast<int>(g), kind, ranks, experts, m, depth, width};
  }

  // Every fused op of this rank: check that its kernel can run, size its group's symmetric buffer and give
  // each distinct kernel a signal array (in op order, the same on every rank of the group), then create the
  // groups' windows in CommGroup order (collective; the same order on every rank).
  void prepare_fused(std::span<const Op> ops) {
    for (const Op& op : ops) {
      if (op.kind != OpKind::kFusedGemmComm || op.comm.userbuffers) continue;
      const CommGroup g = op.comm.group;
      const int ranks = group_ranks(g);
      if (ranks > cuda::fused::kMaxRanks)
        refuse(op, fmt::format("fused kernels span at most {} ranks (one NVLink domain); the group has {}",
                               cuda::fused::kMaxRanks, ranks));
      const FusedShape s = fused_shape(op, ranks);
      if (const std::string why = fused_unsupported(s, cutlass_kernel(s.kind)); !why.empty()) refuse(op, why);
      GroupMemory& mem = fused_memory[g];
      mem.ranks = ranks;
      mem.data_bytes = std::max(mem.data_bytes, s.symmetric_bytes());
      if (signal_index.emplace(fused_key(g, s), mem.kernels).second && ++mem.kernels > kMaxFusedKernels)
        refuse(op, fmt::format("more than {} distinct fused kernels in one group", kMaxFusedKernels));
    }
    for (auto& [g, mem] : fused_memory) {
      const size_t region = kSignalRegionBytes + mem.data_bytes;
      if (mem.ranks == 1) {
        mem.own = DeviceBuffer<char>(region);
        MOERUN_CUDA_CHECK(cudaMemset(mem.own.data(), 0, region));
        mem.base[0] = mem.own.data();
      } else {
        auto* nccl = dynamic_cast<NcclCommunicator*>(groups(g));
        if (nccl == nullptr) {
          std::fprintf(stderr, "moerun: fused kernels need the group's NCCL communicator\n");
          std::abort();
        }
        Result<std::unique_ptr<SymmetricMemory>> made = SymmetricMemory::create(*nccl, region);
        if (!made) {
          std::fprintf(stderr, "moerun: symmetric memory for fused kernels: %s\n",
                       made.error().message.c_str());
          std::abort();
        }
        mem.symmetric = std::move(made.value());
        mem.rank = mem.symmetric->rank();
        for (int p = 0; p < mem.ranks; ++p) mem.base[sz(p)] = static_cast<char*>(mem.symmetric->peer(p));
      }
      count(static_cast<double>(region));
    }
  }
  ~Impl() {
    for (auto& [id, ev] : op_events) {
      cudaEventDestroy(ev.first);
      cudaEventDestroy(ev.second);
    }
    for (auto& [id, ev] : receive_done) cudaEventDestroy(ev);
    if (step_start != nullptr) cudaEventDestroy(step_start);
    if (graph_exec != nullptr) cudaGraphExecDestroy(graph_exec);
    for (auto& [id, ev] : dep_events) cudaEventDestroy(ev);
    if (fork != nullptr) cudaEventDestroy(fork);
    for (cudaEvent_t ev : joins) cudaEventDestroy(ev);
    for (Lane* l : all_lanes()) close_lane(*l);
  }

  void count(double delta) {
    const double now = bytes.fetch_add(delta) + delta;
    double hw = high_water.load();
    while (now > hw && !high_water.compare_exchange_weak(hw, now)) {
    }
  }

  // Scratch slot `i` of at least `n` bytes; fresh memory holds 0x3C bytes (bf16 and fp32 ~0.0115: finite,
  // nonzero data, as timings on zeros can flatter a kernel).
  void* slot(Lane& l, size_t i, size_t n) {
    if (l.slots.size() <= i) l.slots.resize(i + 1);
    DeviceBuffer<char>& b = l.slots[i];
    if (b.size() < n) {
      if (sized) {
        {  // still allocated, and counted, until the next step's start frees it
          const std::lock_guard<std::mutex> lock(retired_mutex);
          retired.push_back(std::move(b));
        }
        b = DeviceBuffer<char>::stream_ordered(n, l.stream);
      } else {
        count(-static_cast<double>(b.size()));
        b = DeviceBuffer<char>(n);
      }
      count(static_cast<double>(n));
      MOERUN_CUDA_CHECK(cudaMemsetAsync(b.data(), 0x3C, n, l.stream));
    }
    return b.data();
  }

  // An FP8 GEMM: its input cast (op.aux_bytes: the recipe's quantise, amax and transpose traffic) as the
  // project's e4m3 quantiser over A [m, k] (128-value block scales, or a scale per row where k is no multiple
  // of 128) plus a copy of the rest of the bytes, then cuBLASLt's e4m3 GEMM in the one layout Hopper runs
  // (TN: A [m, k], B [n, k]). Forward and data gradient write bf16. The weight gradient (no cast of its own:
  // the forward's and the data gradient's casts wrote the transposed copies it reads) is dW [in, out] = X^T
  // [in, tokens] (dY^T [out, tokens])^T, accumulated into its FP32 main gradient. False when the shape breaks
  // the kernels' rules (multiples of 16) or cuBLASLt has no algorithm: the caller runs it in bf16.
  bool fp8_gemm(const Op& op, Lane& l) {
    const bool wgrad = op.part == GemmPart::kWgrad;
    int64_t m = op.gemm.m, n = op.gemm.n, k = op.gemm.k;  // forward: Y [m, n] = X [m, k] W [k, n]
    if (op.part == GemmPart::kDgrad) std::swap(n, k);     // dX [m, k] = dY [m, n] W^T
    if (wgrad) {                                          // dW [k, n] = X^T dY over the m tokens
      m = op.gemm.k;
      k = op.gemm.m;
    }
    if (m % 16 != 0 || n % 16 != 0 || k % 16 != 0 || (op.aux_bytes > 0 && !fp8_castable(k))) return false;
    // Kept under its own key beside the bf16 GEMMs, even when cuBLASLt refuses it (asked each time).
    auto& g =
        l.gemms[{static_cast<int>(cuda::GemmOp::kDgrad) | kFp8GemmKey | (wgrad ? kFp8WgradKey : 0), m, n, k}];
    if (!g) {
      g = std::make_unique<cuda::Gemm>(cuda::GemmProblem{cuda::GemmOp::kDgrad, m, n, k, cuda::GemmType::kE4m3,
                                                         wgrad ? cuda::GemmType::kF32 : cuda::GemmType::kBf16,
                                                         wgrad});
      if (g->can_implement().empty() && l.gemm_workspace.size() < g->workspace_size()) {
        count(static_cast<double>(g->workspace_size()) - static_cast<double>(l.gemm_workspace.size()));
        l.gemm_workspace = DeviceBuffer<char>(g->workspace_size());
      }
    }
    if (!g->can_implement().empty()) return false;
    // The forward casts its input into its stash; the weight gradient reads that e4m3 copy there.
    __nv_fp8_e4m3* q = fp8_input(l, m, k, op.aux_bytes, saved(op, sz(m * k)));
    const float* one = unit_scale(l);
    // B is the weight's e4m3 copy (forward, dgrad) or the incoming gradient's (wgrad, which accumulates into
    // the weight's main gradient).
    const ParamSlice* w = params.of(op);
    void* b = w != nullptr && !wgrad ? fp8_weight(*w) : slot(l, 1, sz(n * k));
    void* c = w != nullptr && wgrad ? grad(*w) : slot(l, 2, sz(m * n) * (wgrad ? 4 : 2));
    g->run({q, b, c, one, one}, l.gemm_workspace.data(), l.stream);
    fp8_ops.fetch_add(1);
    return true;
  }

  // 128-value blocks (DeepSeek-V3's recipe, the moerun stack's) where a row of k values splits into them,
  // else one scale per row (held in registers: up to 16,384 values). The two move the same bytes.
  static bool fp8_castable(int64_t k) { return k % 128 == 0 || k <= 16384; }

  // An FP8 GEMM's A operand [m, k] at `to` (slot 0 where null): with `aux_bytes` (the recipe's quantise, amax
  // and transpose traffic) the project's e4m3 quantiser over a bf16 [m, k] at `from` (slot 3 where null;
  // scales in slot 4) plus a copy of the rest of those bytes; without, the operand as it lies (its cast was
  // counted elsewhere).
  __nv_fp8_e4m3* fp8_input(Lane& l, int64_t m, int64_t k, double aux_bytes, void* to = nullptr,
                           const void* from = nullptr) {
    auto* q = static_cast<__nv_fp8_e4m3*>(to != nullptr ? to : slot(l, 0, sz(m * k)));
    if (aux_bytes <= 0) return q;
    const bool rowwise = k % 128 != 0;
    const auto* x = static_cast<const __nv_bfloat16*>(from != nullptr ? from : slot(l, 3, sz(m * k) * 2));
    auto* scales = static_cast<float*>(slot(l, 4, sz(m * (rowwise ? 1 : k / 128)) * 4));
    if (rowwise) {
      cuda::fp8_quantize_rowwise(x, q, scales, m, k, l.stream);
    } else {
      cuda::fp8_quantize_blockwise(x, q, scales, m, k, l.stream);
    }
    copy(aux_bytes - static_cast<double>(m * k) * 3.0 - static_cast<double>(m) * 4.0, l, 5);
    return q;
  }

  void gemm(const Op& op, Lane& l) {
    const int64_t m = op.gemm.m, n = op.gemm.n, k = op.gemm.k;
    if (m <= 0 || n <= 0 || k <= 0) return;
    if (op.gemm.groups > 1) return grouped(op, l);
    if (op.dtype == DType::kFp8 && fp8_gemm(op, l)) return;
    cuda::GemmProblem p;
    switch (op.part) {
      case GemmPart::kNone:  // Y [m, n] = X [m, k] W [k, n]
        p = {cuda::GemmOp::kForward, m, n, k, cuda::GemmType::kBf16, cuda::GemmType::kBf16, false};
        break;
      case GemmPart::kDgrad:  // dX [m, k] = dY [m, n] W^T
        p = {cuda::GemmOp::kDgrad, m, k, n, cuda::GemmType::kBf16, cuda::GemmType::kBf16, false};
        break;
      case GemmPart::kWgrad:  // dW [k, n] += X^T dY, fp32 main grad
        p = {cuda::GemmOp::kWgrad, k, n, m, cuda::GemmType::kBf16, cuda::GemmType::kF32, true};
        break;
    }
    auto& g = l.gemms[{static_cast<int>(p.op), p.m, p.n, p.k}];
    if (!g) {
      g = std::make_unique<cuda::Gemm>(p);
      if (!g->can_implement().empty()) refuse(op, g->can_implement());
      if (l.gemm_workspace.size() < g->workspace_size()) {
        count(static_cast<double>(g->workspace_size()) - static_cast<double>(l.gemm_workspace.size()));
        l.gemm_workspace = DeviceBuffer<char>(g->workspace_size());
      }
    }
    // A [m, k] or [k, m], B [k, n] or [n, k]: both m k and k n elements; C [m, n]. The weight (forward and
    // dgrad's B) and the weight gradient (wgrad's C) at their place in the parameter buffers.
    const size_t c_bytes = sz(p.m * p.n) * (p.output == cuda::GemmType::kF32 ? 4 : 2);
    const ParamSlice* w = params.of(op);
    const bool wgrad = op.part == GemmPart::kWgrad;
    void* b = w != nullptr && !wgrad ? weight(*w) : slot(l, 1, sz(p.k * p.n) * 2);
    void* c = w != nullptr && wgrad ? grad(*w) : produced(op, c_bytes);
    if (c == nullptr) c = slot(l, 2, c_bytes);
    // A: the forward's input X, or the weight gradient's X^T, in the micro-batch's stash.
    void* a = saved(op, sz(p.m * p.k) * 2);
    g->run({a != nullptr ? a : slot(l, 0, sz(p.m * p.k) * 2), b, c}, l.gemm_workspace.data(), l.stream);
  }

  void grouped(const Op& op, Lane& l) {
    const int e = static_cast<int>(op.gemm.groups);
    const int64_t per = (op.gemm.m + e - 1) / e, in = op.gemm.k, out = op.gemm.n;
    // Drawn routing: each local expert's rows this step, already in device memory; else uniform rows.
    const int64_t drawn = draws ? draws->draw_index(op) : -1;
    int64_t rows = per * e;
    if (drawn >= 0) {
      rows = 0;
      for (int64_t g = 0; g < e; ++g) rows += draw_rows[sz(drawn * e + g)];
      rows = std::max<int64_t>(1, rows);  // a rank whose experts drew nothing still passes real buffers
    }
    const cuda::ExpertGemmOp kind = op.part == GemmPart::kDgrad   ? cuda::ExpertGemmOp::kDgrad
                                    : op.part == GemmPart::kWgrad ? cuda::ExpertGemmOp::kWgrad
                                                                  : cuda::ExpertGemmOp::kForward;
    // FP8 forward and data gradient: e4m3 operands after the quantiser over the rows this rank runs (the
    // weight gradient stays bf16: its K is each expert's row count, which FP8's 16-byte TMA rows would need
    // padded to 16, as Megatron's --moe-router-padding-for-fp8 does).
    const int64_t depth = kind == cuda::ExpertGemmOp::kDgrad ? out : in;  // A's columns
    const bool fp8 = op.dtype == DType::kFp8 && kind != cuda::ExpertGemmOp::kWgrad && in % 16 == 0 &&
                     out % 16 == 0 && (op.aux_bytes <= 0 || fp8_castable(depth));
    Lane::Grouped& g = l.grouped[{static_cast<int>(kind) | (fp8 ? kFp8GemmKey : 0), e, in, out,
                                  drawn >= 0 ? int64_t{-1} : per}];
    if (!g.kernel) {
      g.kernel = std::make_unique<cuda::GroupedGemm>(cuda::GroupedGemmProblem{kind, e, in, out, fp8});
      if (const std::string why = g.kernel->can_implement(); !why.empty()) refuse(op, why);
      g.workspace = DeviceBuffer<char>(g.kernel->workspace_size());
      if (drawn < 0) {
        const std::vector<int32_t> counts(sz(e), static_cast<int32_t>(per));  // uniform routing
        g.counts = DeviceBuffer<int32_t>(counts.size());
        MOERUN_CUDA_CHECK(cudaMemcpyAsync(g.counts.data(), counts.data(), counts.size() * sizeof(int32_t),
                                          cudaMemcpyHostToDevice, l.stream));
      }
      count(static_cast<double>(g.workspace.size()));
      g.kernel->initialize(g.workspace.data(), l.stream);
    }
    const int32_t* counts = drawn >= 0 ? draw_rows_device.data() + drawn * e : g.counts.data();
    if (fp8) {
      // The cast's bytes scale with the rows drawn; the weights are their cached e4m3 copy (transposed for
      // the forward, grouped_gemm.h), 1 byte per value.
      const double cast =
          op.aux_bytes * static_cast<double>(rows) / static_cast<double>(std::max<int64_t>(1, op.gemm.m));
      const __nv_fp8_e4m3* a = fp8_input(l, rows, depth, cast, nullptr, saved(op, sz(rows * depth) * 2));
      const int64_t width = kind == cuda::ExpertGemmOp::kDgrad ? in : out;
      const ParamSlice* ws = params.of(op);
      g.kernel->run({counts, a, ws != nullptr ? fp8_weight(*ws) : slot(l, 1, sz(e * in * out)),
                     slot(l, 2, sz(rows * width) * 2), rows},
                    l.stream);
      fp8_ops.fetch_add(1);
      return;
    }
    // Forward: x [rows, in], w [E, in, out] -> y [rows, out]; dgrad: dy [rows, out], w -> dx [rows, in];
    // wgrad: x [rows, in], dy [rows, out] -> dw [E, in, out] fp32.
    // The experts' weights and their gradient at their place in the parameter buffers.
    const size_t w = sz(e * in * out) * 2;
    const ParamSlice* ws = params.of(op);
    void* weight_in = ws != nullptr ? weight(*ws) : slot(l, 1, w);
    // The forward's input rows in the micro-batch's stash, which the weight gradient reads back (scratch
    // where the rows drawn this step outgrow it).
    void* x = kind == cuda::ExpertGemmOp::kDgrad ? nullptr : saved(op, sz(rows * in) * 2);
    if (x == nullptr && kind != cuda::ExpertGemmOp::kDgrad) x = slot(l, 0, sz(rows * in) * 2);
    cuda::GroupedGemmOperands ops;
    switch (kind) {
      case cuda::ExpertGemmOp::kForward: {
        void* y = produced(op, sz(rows * out) * 2);
        ops = {counts, x, weight_in, y != nullptr ? y : slot(l, 2, sz(rows * out) * 2), rows};
        break;
      }
      case cuda::ExpertGemmOp::kDgrad:
        ops = {counts, slot(l, 0, sz(rows * out) * 2), weight_in, slot(l, 2, sz(rows * in) * 2), rows};
        break;
      case cuda::ExpertGemmOp::kWgrad:
        ops = {counts, x, slot(l, 1, sz(rows * out) * 2), ws != nullptr ? grad(*ws) : slot(l, 2, w * 2),
               rows};
        break;
    }
    g.kernel->run(ops, l.stream);
  }

  // A fused op on its kernel: uniform routing (rows spread evenly over experts and ranks), operands in the
  // lane's scratch slots, the peers' buffers in the group's symmetric memory.
  void fused(const Op& op, Lane& l) {
    const GroupMemory& mem = fused_memory.at(op.comm.group);
    const FusedShape s = fused_shape(op, mem.ranks);
    const auto key = fused_key(op.comm.group, s);
    const int sig = signal_index.at(key);
    Lane::Fused& f = l.fused[key];
    const bool fresh = f.workspace.size() == 0;
    auto init = [&](auto& kernel, const auto& args) {
      kernel = std::make_unique<std::remove_reference_t<decltype(*kernel)>>(args);
      f.workspace = DeviceBuffer<char>(kernel->workspace_size());
      count(static_cast<double>(f.workspace.size()));
      kernel->initialize(f.workspace.data(), l.stream);
    };
    auto upload = [](const std::vector<int32_t>& h) {
      DeviceBuffer<int32_t> d(std::max<size_t>(h.size(), 1));
      if (!h.empty()) d.upload(h.data(), h.size());
      return d;
    };
    // Row i of this rank's expert-sorted buffer is global row g = rank m + i: it comes from (goes to) rank
    // g % ranks, as that rank's token row (g / ranks) % source_rows (receive slot g / ranks).
    auto routing = [&] {
      const bool gathers = s.kind == FusedKind::kGatherGrouped;
      std::vector<int32_t> counts(sz(s.experts), static_cast<int32_t>(s.m / s.experts)), rank_of, row_of;
      for (int64_t i = 0; i < s.m; ++i) {
        const int64_t g = mem.rank * s.m + i;
        rank_of.push_back(static_cast<int32_t>(g % s.ranks));
        row_of.push_back(static_cast<int32_t>(gathers ? (g / s.ranks) % s.source_rows() : g / s.ranks));
      }
      f.counts = upload(counts);
      f.map_rank = upload(rank_of);
      f.map_row = upload(row_of);
    };
    auto bf = [](void* p) { return static_cast<cuda::fused::Bf16*>(p); };
    // Each peer's data region and this kernel's signal array in it.
    auto peers = [&](auto& data, uint32_t*(&signals)[cuda::fused::kMaxRanks]) {
      for (int p = 0; p < s.ranks; ++p) {
        data[p] = mem.data(p);
        signals[p] = mem.signals(p, sig);
      }
    };
    // Either gather kernel's operands: the peers' tokens, the routing, this rank's rows, weights and output.
    auto gather_operands = [&](auto& o) {
      o.rank = mem.rank;
      peers(o.x, o.signals);
      o.counts = f.counts.data();
      o.src_row = f.map_row.data();
      o.gathered = bf(slot(l, 0, sz(s.m * s.depth) * 2));
      o.w = bf(slot(l, 1, sz(s.depth * s.width) * 2 * sz(s.experts)));
      o.y = bf(slot(l, 2, sz(s.m * s.width) * 2));
    };
    // Either combine kernel's: the peers' receive buffers, the routing, this rank's rows, weights, gates
    // and output.
    auto combine_operands = [&](auto& o) {
      o.rank = mem.rank;
      peers(o.recv, o.signals);
      o.counts = f.counts.data();
      o.h = bf(slot(l, 0, sz(s.m * s.depth) * 2));
      o.w = bf(slot(l, 1, sz(s.depth * s.width) * 2 * sz(s.experts)));
      o.gates = static_cast<const float*>(slot(l, 3, sz(s.m) * 4));
      o.out = bf(slot(l, 4, sz(s.m * s.width) * 2));
    };
    // Either GEMM + all-to-all kernel's: the peers' outputs, this rank's input and weight.
    auto all_to_all_operands = [&](auto& o) {
      o.rank = mem.rank;
      peers(o.out, o.signals);
      o.x = bf(slot(l, 0, sz(s.m * s.depth) * 2));
      o.w = bf(slot(l, 1, sz(s.depth * s.width) * 2));
    };
    switch (s.kind) {
      case FusedKind::kGatherGrouped: {
        if (cutlass_kernel(s.kind)) {
          if (fresh) {
            init(f.gather_gemm, gather_gemm_args(s));
            const std::vector<int32_t> counts = push_combine_counts(s);
            f.counts = upload(counts);
            f.map_row = upload(gather_source_rows(s, counts, mem.rank));
          }
          cuda::fused::GatherGemmOperands o;
          gather_operands(o);
          if (!sizing) f.gather_gemm->run(std::span(&o, 1), l.stream);
          break;
        }
        if (fresh) {
          init(f.gather_grouped, gather_grouped_args(s));
          routing();
        }
        cuda::fused::AllGatherGroupedGemmOperands o;
        gather_operands(o);
        o.src_rank = f.map_rank.data();
        if (!sizing) f.gather_grouped->run(std::span(&o, 1), l.stream);
        break;
      }
      case FusedKind::kGroupedScatter: {
        if (cutlass_kernel(s.kind)) {
          if (fresh) {
            init(f.push_combine, push_combine_args(s));
            f.counts = upload(push_combine_counts(s));
          }
          cuda::fused::PushGemmCombineOperands o;
          combine_operands(o);
          o.recv_row = iota(l.row_maps, l, s.m);  // slot t at receive row t
          if (!sizing) f.push_combine->run(std::span(&o, 1), l.stream);
          break;
        }
        if (fresh) {
          init(f.grouped_scatter, grouped_scatter_args(s));
          routing();
        }
        cuda::fused::GroupedGemmReduceScatterOperands o;
        combine_operands(o);
        o.dst_rank = f.map_rank.data();
        o.dst_slot = f.map_row.data();
        o.y = bf(slot(l, 2, sz(s.m * s.width) * 2));
        if (!sizing) f.grouped_scatter->run(std::span(&o, 1), l.stream);
        break;
      }
      case FusedKind::kGemmA2a: {
        if (cutlass_kernel(s.kind)) {
          if (fresh) init(f.push_a2a, push_a2a_args(s));
          cuda::fused::PushGemmAllToAllOperands o;
          all_to_all_operands(o);
          if (!sizing) f.push_a2a->run(std::span(&o, 1), l.stream);
          break;
        }
        if (fresh) init(f.gemm_a2a, gemm_a2a_args(s));
        cuda::fused::GemmAllToAllOperands o;
        all_to_all_operands(o);
        o.staged = bf(slot(l, 2, sz(s.m * s.width) * 2));
        if (!sizing) f.gemm_a2a->run(std::span(&o, 1), l.stream);
        break;
      }
      case FusedKind::kA2aGemm: {
        if (fresh) init(f.a2a_gemm, a2a_gemm_args(s));
        cuda::fused::AllToAllGemmOperands o;
        o.rank = mem.rank;
        peers(o.in, o.signals);
        o.gathered = bf(slot(l, 0, sz(s.m * s.depth) * 2));
        o.w = bf(slot(l, 1, sz(s.depth * s.width) * 2));
        o.y = bf(slot(l, 2, sz(s.m * s.width) * 2));
        if (!sizing) f.a2a_gemm->run(std::span(&o, 1), l.stream);
        break;
      }
    }
  }

  // cuDNN's flash attention for each call that does the op's work (attention_calls: GQA's kv
  // heads, MLA's v_dim, windows, context parallelism's local and remote parts at their key counts).
  void attention(const Op& op, Lane& l) {
    // Each call's q, k, v, o and statistics in turn in the micro-batch's stash (scratch where it has none).
    char* stash = static_cast<char*>(saved(op, sz(attention_saved_bytes(op))));
    for (const AttentionCall& c : attention_calls(op)) {
      const std::array<int64_t, 5> part = attention_saved_parts(c);
      if (!l.cudnn) l.cudnn = std::make_unique<cuda::CudnnHandle>();
      auto& f = l.attention[{c.batch, c.seq_q, c.seq_kv, c.heads, c.kv_heads, c.qk_dim, c.v_dim, c.window,
                             c.causal ? 1 : 0}];
      if (!f) {
        cuda::AttentionShape s;
        s.batch = c.batch;
        s.seq = c.seq_q;
        s.seq_kv = c.seq_kv;
        s.q_heads = c.heads;
        s.kv_heads = c.kv_heads;
        s.head_dim = c.qk_dim;
        s.v_dim = c.v_dim;
        s.window = c.window;
        s.causal = c.causal;
        f = std::make_unique<cuda::FlashAttention>(l.cudnn->get(), s);
        if (!f->unsupported().empty()) refuse(op, f->unsupported());
        count(static_cast<double>(f->workspace_bytes()));
      }
      const cuda::AttentionShape& s = f->shape();
      const size_t qb = sz(s.q_elems()) * 2, ob = sz(s.o_elems()) * 2, kb = sz(s.k_elems()) * 2;
      const size_t vb = sz(s.v_elems()) * 2, st = sz(s.stats_elems()) * 4;
      const std::array<size_t, 5> need{qb, kb, vb, ob, st};
      std::array<void*, 5> at{};
      for (size_t i = 0; i < at.size(); ++i) {
        const bool fits = stash != nullptr && need[i] <= sz(part[i]);
        at[i] = fits ? stash : slot(l, i, need[i]);
        if (stash != nullptr) stash += part[i];
      }
      auto* q = static_cast<cuda::bf16*>(at[0]);
      auto* k = static_cast<cuda::bf16*>(at[1]);
      auto* v = static_cast<cuda::bf16*>(at[2]);
      auto* o = static_cast<cuda::bf16*>(at[3]);
      auto* stats = static_cast<float*>(at[4]);
      if (op.phase == Phase::kBackward) {
        auto* d_o = static_cast<cuda::bf16*>(slot(l, 5, ob));
        f->backward(q, k, v, o, d_o, stats, static_cast<cuda::bf16*>(slot(l, 6, qb)),
                    static_cast<cuda::bf16*>(slot(l, 7, kb)), static_cast<cuda::bf16*>(slot(l, 8, vb)),
                    l.stream);
      } else {
        f->forward(q, k, v, o, stats, l.stream);
      }
    }
  }

  // 0 .. n - 1 in device memory, made once per n on the lane's stream and kept in `cache`:
  //   - positions (int64): the RoPE kernel's token positions and the loss's targets, real values, so RoPE's
  //     angles stay in range;
  //   - row maps (int32): token-expert slot s is permuted row s, the permute kernels' map for tokens already
  //     in expert order, which moves the same rows as any other map (the kernels' time follows the rows
  //     they move, and every map moves each slot's row once).
  template <class T>
  const T* iota(std::map<int64_t, DeviceBuffer<T>>& cache, Lane& l, int64_t n) {
    DeviceBuffer<T>& b = cache[n];
    if (b.size() == 0) {
      std::vector<T> host(sz(n));
      for (int64_t i = 0; i < n; ++i) host[sz(i)] = static_cast<T>(i);
      b = DeviceBuffer<T>(host.size());
      count(static_cast<double>(host.size() * sizeof(T)));
      MOERUN_CUDA_CHECK(
          cudaMemcpyAsync(b.data(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice, l.stream));
      MOERUN_CUDA_CHECK(cudaStreamSynchronize(l.stream));  // `host` leaves scope
    }
    return b.data();
  }

  // The project's memory-bound kernel of an op whose lowering states the tensor it walks (op_graph.h), at
  // that shape, on scratch data: RMSNorm (forward, backward), SwiGLU (forward, backward), RoPE (both), the
  // fused cross-entropy (moerun's loss kind only: the stacks' unfused and native losses keep their own
  // bytes), the router's softmax and top-k (forward), and the token permute and unpermute (both; rows t,
  // cols h, inner k). False when the op has none here, or its shape breaks the kernel's preconditions: the
  // caller copies the op's bytes instead.
  bool memory_kernel(const Op& op, Lane& l) {
    const int64_t rows = op.gemm.m, cols = op.gemm.n, inner = op.gemm.k;
    if (rows <= 0 || cols <= 0) return false;
    const bool fwd = op.phase != Phase::kBackward;
    const size_t elems = sz(rows * cols);
    auto bf16 = [&](size_t i, size_t n) { return static_cast<__nv_bfloat16*>(slot(l, i, n * 2)); };
    auto f32 = [&](size_t i, size_t n) { return static_cast<float*>(slot(l, i, n * 4)); };
    if (is_rmsnorm(op)) {
      if (cols % 8 != 0 || cols > 16384) return false;
      // The input and the inverse RMS in the micro-batch's stash, where the backward reads them.
      const std::array<int64_t, 2> part = norm_saved_parts(rows, cols);
      auto* stash = static_cast<char*>(saved(op, sz(part[0] + part[1])));
      const auto* x = stash != nullptr ? reinterpret_cast<const __nv_bfloat16*>(stash) : bf16(0, elems);
      const __nv_bfloat16* gamma = bf16(1, sz(cols));
      float* inv_rms = stash != nullptr ? reinterpret_cast<float*>(stash + part[0]) : f32(3, sz(rows));
      if (fwd) {
        void* y = produced(op, elems * 2);  // the output, where its consumer keeps it
        cuda::rmsnorm_forward(x, gamma, y != nullptr ? static_cast<__nv_bfloat16*>(y) : bf16(2, elems),
                              inv_rms, rows, cols, 1e-6f, l.stream);
      } else {
        void* ws = slot(l, 7, cuda::rmsnorm_backward_workspace_bytes(rows, cols));
        cuda::rmsnorm_backward(x, gamma, inv_rms, bf16(4, elems), bf16(5, elems), f32(6, sz(cols)), ws, rows,
                               cols, l.stream);
      }
      return true;
    }
    if (is_swiglu(op)) {
      if (cols % 8 != 0) return false;
      const void* stash = saved(op, 4 * elems);  // the input, where the backward reads it
      const auto* in = stash != nullptr ? static_cast<const __nv_bfloat16*>(stash) : bf16(0, 2 * elems);
      if (fwd) {
        void* y = produced(op, elems * 2);  // the output, where its consumer keeps it
        cuda::swiglu_forward(in, y != nullptr ? static_cast<__nv_bfloat16*>(y) : bf16(1, elems), rows, cols,
                             l.stream);
      } else {
        cuda::swiglu_backward(in, bf16(2, elems), bf16(3, 2 * elems), rows, cols, l.stream);
      }
      return true;
    }
    switch (static_cast<OpName>(op.name)) {
      case OpName::kRope: {
        if (inner <= 0 || inner % 16 != 0 || inner > 512 || cols % 8 != 0 || cols % inner != 0) return false;
        const int64_t* pos = iota(l.positions, l, rows);
        if (fwd) {
          cuda::rope_forward(bf16(0, elems), pos, rows, cols / inner, inner, cols, cuda::kRopeTheta,
                             l.stream);
        } else {
          cuda::rope_backward(bf16(0, elems), pos, rows, cols / inner, inner, cols, cuda::kRopeTheta,
                              l.stream);
        }
        return true;
      }
      case OpName::kLoss:
      case OpName::kMtpLoss: {
        if (op.mem != MemOp::kLoss || cols % 8 != 0) return false;
        const __nv_bfloat16* logits = bf16(0, elems);
        const int64_t* targets = iota(l.positions, l, rows);
        float* lse = f32(2, sz(rows));
        if (fwd) {
          cuda::cross_entropy_forward(logits, targets, rows, cols, 0, lse, f32(3, sz(rows)), f32(4, sz(rows)),
                                      l.stream);
        } else {
          cuda::cross_entropy_backward(logits, targets, rows, cols, 0, lse, 1.0f / static_cast<float>(rows),
                                       bf16(5, elems), l.stream);
        }
        return true;
      }
      case OpName::kPermute:
      case OpName::kUnpermute: {
        // x / out [t, h] and xp / yp [t k, h] bf16, gates [t, k] fp32; slot s is permuted row s.
        if (op.mem != MemOp::kPermute || inner < 1 || cols % 8 != 0 || cols > 16384) return false;
        if (rows * inner >= (int64_t{1} << 31)) return false;
        const int32_t* map = iota(l.row_maps, l, rows * inner);
        const size_t wide = elems * sz(inner);
        const bool permute = static_cast<OpName>(op.name) == OpName::kPermute;
        if (permute && fwd) {
          cuda::permute_forward(bf16(0, elems), map, bf16(1, wide), rows, inner, cols, l.stream);
        } else if (permute) {
          cuda::permute_backward(bf16(1, wide), map, bf16(0, elems), rows, inner, cols, l.stream);
        } else if (fwd) {
          cuda::unpermute_forward(bf16(1, wide), map, f32(2, sz(rows * inner)), bf16(0, elems), rows, inner,
                                  cols, false, l.stream);
        } else {
          cuda::unpermute_backward(bf16(0, elems), bf16(1, wide), map, f32(2, sz(rows * inner)),
                                   bf16(3, wide), f32(4, sz(rows * inner)), rows, inner, cols, l.stream);
        }
        return true;
      }
      case OpName::kRouterTopk: {
        if (!fwd || cols > 256 || inner < 1 || inner > std::min<int64_t>(8, cols)) return false;
        void* ws = slot(l, 7, cuda::router_forward_workspace_bytes(rows, cols));
        cuda::router_forward(f32(0, elems), rows, cols, inner, true, f32(1, elems),
                             static_cast<int32_t*>(slot(l, 2, sz(rows * inner) * 4)),
                             f32(3, sz(rows * inner)), static_cast<int32_t*>(slot(l, 4, sz(cols) * 4)),
                             f32(5, sz(cols)), ws, l.stream);
        return true;
      }
      default:
        return false;
    }
  }

  // The optimizer step as the project's Adam kernel over the shard's parameters (the op's bytes over
  // kAdamStepBytesPerParam): its fp32 master weights and moments in scratch slots of their own (from
  // kOptimizerSlot: no other op writes them), kept from step to step as the state is, and the shard's main
  // gradients and bf16 weights in the parameter buffers (the first n of them: which shard a rank steps
  // changes no byte count; the buffers are made at least n long). False for an empty shard.
  static constexpr size_t kOptimizerSlot = 16;  // above every other op's slots (0-8)
  bool optimizer(const Op& op, Lane& l) {
    const int64_t n = shard_params(op);
    if (n <= 0) return false;
    const size_t f32 = sz(n) * 4;
    auto state = [&](size_t i) { return static_cast<float*>(slot(l, kOptimizerSlot + i, f32)); };
    const int64_t step = adam_steps.fetch_add(1) + 1;
    cuda::adam_step(state(0), reinterpret_cast<float*>(grads.data()), state(1), state(2),
                    reinterpret_cast<__nv_bfloat16*>(weights.data()), n,
                    cuda::adam_coefficients(1e-4, 0.9, 0.95, 1e-8, 0.1, step), l.stream);
    return true;
  }
  static int64_t shard_params(const Op& op) {
    return static_cast<int64_t>(std::llround(op.hbm_bytes / kAdamStepBytesPerParam));
  }

  // A weight's place in the parameter buffers.
  void* weight(const ParamSlice& s) { return weights.data() + s.offset * 2; }
  void* grad(const ParamSlice& s) { return grads.data() + s.offset * 4; }
  void* fp8_weight(const ParamSlice& s) { return fp8_weights.data() + s.offset; }

  // The stage's parameter buffers, long enough for its weights and for its largest optimizer shard, filled
  // as fresh scratch memory is (0x3C: finite, nonzero).
  // The stage's activation stashes (every op may read them, so made before any lane runs).
  void make_activations(const OpGraph& graph, int stage) {
    acts = activation_layout(graph, stage);
    if (acts.bytes <= 0) return;
    activations = DeviceBuffer<char>(sz(acts.bytes));
    count(static_cast<double>(acts.bytes));
    MOERUN_CUDA_CHECK(cudaMemset(activations.data(), 0x3C, sz(acts.bytes)));
  }

  // Where `op`'s saved tensors of `need` bytes lie in its micro-batch's stash, or nullptr where it keeps or
  // reads none there or they outgrow its slice (drawn rows, a GEMM run in another precision).
  void* saved(const Op& op, size_t need) {
    const int64_t at = acts.offset_of(op);
    if (at < 0 || need > sz(acts.bytes_of(op))) return nullptr;
    return activations.data() + at;
  }

  // Where a forward writes its output of `need` bytes in its micro-batch's stash (the consumer that keeps
  // it), or nullptr where it writes to scratch.
  void* produced(const Op& op, size_t need) {
    const int64_t at = acts.output_offset(op);
    if (at < 0 || need > sz(acts.output_bytes_of(op))) return nullptr;
    return activations.data() + at;
  }

  void draw_step();  // this step's routing draw, its rows per local expert copied to the device

  void make_params(std::span<const Op> ops, int stage) {
    params = param_layout(ops, stage);
    int64_t n = params.elements;
    bool fp8 = false;
    for (const Op& op : ops) {
      if (op.stage != stage) continue;
      if (op.kind == OpKind::kOptimizer) n = std::max(n, shard_params(op));
      fp8 = fp8 || (op.dtype == DType::kFp8 && has_weight(op));
    }
    if (n <= 0) return;
    auto make = [&](DeviceBuffer<char>& b, size_t size) {
      b = DeviceBuffer<char>(size);
      count(static_cast<double>(size));
      MOERUN_CUDA_CHECK(cudaMemset(b.data(), 0x3C, size));
    };
    make(weights, sz(n) * 2);
    make(grads, sz(n) * 4);
    if (fp8) make(fp8_weights, sz(params.elements));
  }

  // A device copy that moves `hbm_bytes` (reads and writes half each), between scratch slots `first` and
  // first + 1.
  void copy(double hbm_bytes, Lane& l, size_t first = 0) {
    if (hbm_bytes <= 0) return;
    const auto n = static_cast<size_t>(hbm_bytes / 2.0);  // read n, write n
    if (n == 0) return;
    MOERUN_CUDA_CHECK(
        cudaMemcpyAsync(slot(l, first, n), slot(l, first + 1, n), n, cudaMemcpyDeviceToDevice, l.stream));
  }

  // One fp32 1.0 in device memory: the per-tensor scales of the replay's FP8 GEMMs. Made once per lane.
  const float* unit_scale(Lane& l) {
    if (l.unit_scale.size() == 0) {
      const float one = 1.0f;
      l.unit_scale = DeviceBuffer<float>(1);
      count(sizeof(float));
      MOERUN_CUDA_CHECK(
          cudaMemcpyAsync(l.unit_scale.data(), &one, sizeof one, cudaMemcpyHostToDevice, l.stream));
      MOERUN_CUDA_CHECK(cudaStreamSynchronize(l.stream));  // `one` leaves scope
    }
    return l.unit_scale.data();
  }

  // A pipeline message (comm.bytes of comm.dtype): its values, and the lane's slot 0 that holds it.
  std::pair<void*, size_t> message(const Op& send, Lane& l) {
    const auto values = sz(comm_values(send.comm, 1));
    return {slot(l, 0, values * static_cast<size_t>(bytes_of(send.comm.dtype))), values};
  }

  // Whether this rank receives `op`: another stage's pipeline send over a link this rank is at the end of.
  bool received_here(const Op& op) const {
    return op.kind == OpKind::kSendRecv && op.stage != own_stage && links && links(op) != nullptr;
  }

  // A pipeline send: the message to the link's other rank.
  void send(const Op& op, Lane& l) {
    DeviceCommunicator* c = link(op);
    const auto [buf, values] = message(op, l);
    if (!sizing) c->send(buf, values, op.comm.dtype, 1 - c->rank(), l.stream);
  }

  // The op's work on its lane's stream (run() puts its timing events around it).
  void work(const Op& op, Lane& l) {
    switch (op.kind) {
      case OpKind::kGemm:
      case OpKind::kGroupedGemm:
        gemm(op, l);
        break;
      case OpKind::kAttention:
        attention(op, l);
        break;
      case OpKind::kMemoryBound:
      case OpKind::kOptimizer: {
        // Drawn routing: an op over the experts' rows moves the bytes of the rows this rank received.
        const std::optional<double> scale = draws ? draws->row_scale(op) : std::nullopt;
        if (op.kind == OpKind::kMemoryBound && !scale && memory_kernel(op, l)) {
          kernel_ops.fetch_add(1);
          break;
        }
        if (op.kind == OpKind::kOptimizer && !scale && optimizer(op, l)) {
          kernel_ops.fetch_add(1);
          break;
        }
        copy(op.hbm_bytes * scale.value_or(1.0), l);
        break;
      }
      case OpKind::kCollective:
      case OpKind::kSendRecv:
        collective(op, l);
        break;
      case OpKind::kFusedGemmComm:
        // TE's userbuffers pipeline (a Megatron plan's overlap.tp_comm) is not one of moerun's kernels: its
        // GEMM, then its exchange, as the CPU replay runs it.
        if (op.comm.userbuffers) {
          gemm(op, l);
          collective(op, l);
        } else {
          fused(op, l);
        }
        break;
    }
  }

  // The sizing pass (see `sizing`): every op of the stage, and every receive of another stage's message, at
  // this step's shapes and draws, then the device drained. The ops' counters stay as they were.
  void size_buffers() {
    const int64_t kernels = kernel_ops.load(), fp8 = fp8_ops.load(), adam = adam_steps.load();
    sizing = true;
    for (const Op& op : graph_ops) {
      if (op.stage == own_stage) {
        work(op, lanes[static_cast<size_t>(op.stream)]);
      } else if (received_here(op)) {
        message(op, receive_lanes.at(op.stage));
      }
    }
    MOERUN_CUDA_CHECK(cudaGetLastError());
    MOERUN_CUDA_CHECK(cudaDeviceSynchronize());
    sizing = false;
    sized = true;
    kernel_ops.store(kernels);
    fp8_ops.store(fp8);
    adam_steps.store(adam);
  }

  void collective(const Op& op, Lane& l) {
    if (op.kind == OpKind::kSendRecv) return send(op, l);
    DeviceCommunicator* c = groups(op.comm.group);
    if (c == nullptr) return;  // a group of one rank moves nothing
    const int size = c->size();
    const int64_t values = comm_values(op.comm, size);
    const size_t eb = static_cast<size_t>(bytes_of(op.comm.dtype));
    // Drawn routing: the values this rank sends each peer and receives from it in an all-to-all.
    const auto x = op.comm.collective == Collective::kAllToAll && draws
                       ? draws->exchange(op, comm_values(op.comm, 1))
                       : std::nullopt;
    void* buf = slot(l, 0, sz(x ? std::max<int64_t>(1, x->send_total) : values) * eb);
    void* out = slot(l, 1, sz(x ? std::max<int64_t>(1, x->recv_total) : values) * eb);
    if (sizing) return;
    DType t = op.comm.dtype;
    switch (op.comm.collective) {
      case Collective::kAllReduce:
        if (t == DType::kFp8) t = DType::kBf16;  // nothing reduces fp8
        c->all_reduce(buf, sz(values), t, l.stream);
        break;
      case Collective::kAllGather:
        c->all_gather(buf, out, sz(values / size), t, l.stream);
        break;
      case Collective::kReduceScatter:
        if (t == DType::kFp8) t = DType::kBf16;
        c->reduce_scatter(buf, out, sz(values / size), t, l.stream);
        break;
      case Collective::kAllToAll: {
        if (x) {
          c->all_to_all_v(buf, x->send, out, x->recv, t, l.stream);
          break;
        }
        const std::vector<int64_t> counts(sz(size), values / size);
        c->all_to_all_v(buf, counts, out, counts, t, l.stream);
        break;
      }
      case Collective::kSendRecv:
        refuse(op, "a send collective outside a pipeline send op");
    }
  }
};

CudaReplayRunner::CudaReplayRunner(DeviceGroupLookup groups, const OpGraph& graph, int stage, Mode mode,
                                   PipelineLinkLookup links, FusedKernels fused_kernels)
    : impl_(std::make_unique<Impl>(std::move(groups), std::move(links))) {
  Impl& I = *impl_;
  const std::span<const Op> ops = graph.ops;
  I.mode = mode;
  I.fused_kernels = fused_kernels;
  I.graph_ops = ops;
  I.own_stage = stage;
  MOERUN_CUDA_CHECK(cudaGetDevice(&I.device));
  I.prepare_fused(ops);
  I.make_params(ops, stage);
  I.make_activations(graph, stage);
  // This stage's ops get events; the sends it receives (those whose link has this rank at an end and
  // another stage as sender), a receive lane per sending stage and an end event each.
  auto internal = [] {
    cudaEvent_t ev = nullptr;
    MOERUN_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    return ev;
  };
  const bool enqueue = mode != Mode::kHostSync;
  for (const Op& op : ops) {
    if (!I.received_here(op)) continue;
    if (!I.receive_lanes.contains(op.stage)) open_lane(I.receive_lanes[op.stage]);
    if (enqueue) I.receive_done.emplace(op.id, internal());
  }
  if (!enqueue) return;
  MOERUN_CUDA_CHECK(cudaEventCreate(&I.step_start));
  for (const Op& op : ops) {
    if (op.stage != stage) continue;
    std::pair<cudaEvent_t, cudaEvent_t> ev{};
    MOERUN_CUDA_CHECK(cudaEventCreate(&ev.first));
    MOERUN_CUDA_CHECK(cudaEventCreate(&ev.second));
    I.op_events.emplace(op.id, ev);
    if (mode == Mode::kGraph) I.dep_events.emplace(op.id, internal());
  }
  if (mode != Mode::kGraph) return;
  I.fork = internal();
  I.joins.resize(I.all_lanes().size());
  for (cudaEvent_t& ev : I.joins) ev = internal();
}

CudaReplayRunner::~CudaReplayRunner() = default;

namespace {

// The calling thread's current device, set once per thread (lane threads start on device 0).
thread_local int t_bound_device = -1;

void bind_device(int device) {
  if (t_bound_device == device) return;
  MOERUN_CUDA_CHECK(cudaSetDevice(device));
  t_bound_device = device;
}

}  // namespace

void CudaReplayRunner::run(const Op& op) {
  Impl& I = *impl_;
  bind_device(I.device);
  Lane& l = I.lanes[static_cast<size_t>(op.stream)];
  const bool enqueue = I.mode != Mode::kHostSync;
  const auto [ev_begin, ev_end] = enqueue ? I.op_events.at(op.id) : std::pair{l.before, l.after};
  // Under capture an op's timing events become event record nodes of the graph (external), recorded each
  // time the graph runs; a plain record would only order the capture's streams.
  const unsigned record_flags = I.capturing ? cudaEventRecordExternal : cudaEventRecordDefault;
  MOERUN_CUDA_CHECK(cudaEventRecordWithFlags(ev_begin, l.stream, record_flags));
  I.work(op, l);
  MOERUN_CUDA_CHECK(cudaGetLastError());
  MOERUN_CUDA_CHECK(cudaEventRecordWithFlags(ev_end, l.stream, record_flags));
  if (I.capturing) MOERUN_CUDA_CHECK(cudaEventRecord(I.dep_events.at(op.id), l.stream));
  if (enqueue) return;
  MOERUN_CUDA_CHECK(cudaStreamSynchronize(l.stream));
  float ms = 0;
  MOERUN_CUDA_CHECK(cudaEventElapsedTime(&ms, ev_begin, ev_end));
  l.last_seconds = static_cast<double>(ms) * 1e-3;
}

double CudaReplayRunner::device_seconds(const Op& op) const {
  return impl_->mode != Mode::kHostSync ? -1 : impl_->lanes[static_cast<size_t>(op.stream)].last_seconds;
}

bool CudaReplayRunner::enqueues() const {
  return impl_->mode != Mode::kHostSync;
}

bool CudaReplayRunner::replays_step() const {
  return impl_->graph_exec != nullptr;
}

// Ops of one stream run in order on its CUDA stream; an op of another stream is waited for on the device
// (under capture, on the dependency's internal end event: a dependency edge of the graph).
void CudaReplayRunner::after(const Op& op, const Op& dep) {
  if (dep.stream == op.stream) return;
  const Impl& I = *impl_;
  bind_device(I.device);
  const Lane& l = I.lanes[static_cast<size_t>(op.stream)];
  const cudaEvent_t done = I.capturing ? I.dep_events.at(dep.id) : I.op_events.at(dep.id).second;
  MOERUN_CUDA_CHECK(cudaStreamWaitEvent(l.stream, done, 0));
}

void CudaReplayRunner::after_receive(const Op& op, const Op& send) {
  const Impl& I = *impl_;
  bind_device(I.device);
  const Lane& l = I.lanes[static_cast<size_t>(op.stream)];
  MOERUN_CUDA_CHECK(cudaStreamWaitEvent(l.stream, I.receive_done.at(send.id), 0));
}

// The step's start: on the compute stream, which every other stream's first op follows on the host. kGraph:
// the second step begins the capture on the compute stream, the other streams joining it through the fork
// event (their later work is captured, not run); later steps launch the graph.
void CudaReplayRunner::begin_step() {
  Impl& I = *impl_;
  const cudaStream_t origin = I.lanes[0].stream;
  ++I.steps_begun;
  if (I.graph_exec != nullptr) {
    MOERUN_CUDA_CHECK(cudaEventRecord(I.step_start, origin));
    MOERUN_CUDA_CHECK(cudaGraphLaunch(I.graph_exec, origin));
    return;
  }
  if (I.mode == Mode::kGraph && I.steps_begun == 2) {
    // Relaxed: the lanes' threads enqueue while the compute stream captures (their buffers exist since the
    // sizing pass, so none is allocated under capture).
    MOERUN_CUDA_CHECK(cudaStreamBeginCapture(origin, cudaStreamCaptureModeRelaxed));
    MOERUN_CUDA_CHECK(cudaEventRecord(I.fork, origin));
    const std::vector<Lane*> all = I.all_lanes();
    for (size_t i = 1; i < all.size(); ++i) MOERUN_CUDA_CHECK(cudaStreamWaitEvent(all[i]->stream, I.fork, 0));
    I.capturing = true;
    return;
  }
  MOERUN_CUDA_CHECK(cudaEventRecord(I.step_start, origin));
}

// Waits for the step. The captured step: the other streams join the compute stream, the capture ends, and the
// graph is instantiated and launched (its ops' times from the launch).
void CudaReplayRunner::end_step() {
  Impl& I = *impl_;
  const cudaStream_t origin = I.lanes[0].stream;
  const std::vector<Lane*> all = I.all_lanes();
  if (I.capturing) {
    for (size_t i = 1; i < all.size(); ++i) {
      MOERUN_CUDA_CHECK(cudaEventRecord(I.joins[i], all[i]->stream));
      MOERUN_CUDA_CHECK(cudaStreamWaitEvent(origin, I.joins[i], 0));
    }
    cudaGraph_t graph = nullptr;
    MOERUN_CUDA_CHECK(cudaStreamEndCapture(origin, &graph));
    I.capturing = false;
    MOERUN_CUDA_CHECK(cudaGraphInstantiate(&I.graph_exec, graph, 0));
    MOERUN_CUDA_CHECK(cudaGraphDestroy(graph));
    MOERUN_CUDA_CHECK(cudaEventRecord(I.step_start, origin));
    MOERUN_CUDA_CHECK(cudaGraphLaunch(I.graph_exec, origin));
  }
  for (const Lane* l : all) MOERUN_CUDA_CHECK(cudaStreamSynchronize(l->stream));
}

OpTiming CudaReplayRunner::interval(const Op& op) const {
  const auto& [ev_begin, ev_end] = impl_->op_events.at(op.id);
  float start_ms = 0, end_ms = 0;
  MOERUN_CUDA_CHECK(cudaEventElapsedTime(&start_ms, impl_->step_start, ev_begin));
  MOERUN_CUDA_CHECK(cudaEventElapsedTime(&end_ms, impl_->step_start, ev_end));
  return {static_cast<double>(start_ms) * 1e-3, static_cast<double>(end_ms) * 1e-3};
}

// The receive of `send`'s message on the sending stage's receive lane, into its slot 0 (receives have no
// dependencies: enqueued at once, they run in the sender's order). kHostSync: returns once it has arrived.
void CudaReplayRunner::receive(const Op& send) {
  Impl& I = *impl_;
  bind_device(I.device);
  Lane& l = I.receive_lanes.at(send.stage);
  DeviceCommunicator* c = I.link(send);
  const auto [buf, values] = I.message(send, l);
  c->recv(buf, values, send.comm.dtype, 1 - c->rank(), l.stream);
  if (I.mode == Mode::kHostSync) {
    MOERUN_CUDA_CHECK(cudaStreamSynchronize(l.stream));
  } else {
    MOERUN_CUDA_CHECK(cudaEventRecord(I.receive_done.at(send.id), l.stream));
  }
}

void CudaReplayRunner::draw_routing(RoutingDrawSpec spec) {
  impl_->draws.emplace(impl_->graph_ops, std::move(spec));
}

// This step's draw, its rows per local expert copied to the device while nothing runs (the previous step has
// ended: end_step or the per-op waits), before the step's clock starts.
void CudaReplayRunner::prepare_step() {
  Impl& I = *impl_;
  // No kernel of this rank is in flight here (the last step ended with a host wait): a safe point to free the
  // buffers drawn routing outgrew, and, before the first step, to make every buffer (size_buffers).
  for (const DeviceBuffer<char>& b : I.retired) I.count(-static_cast<double>(b.size()));
  I.retired.clear();
  if (I.draws) I.draw_step();
  if (!I.sized) I.size_buffers();
}

void CudaReplayRunner::Impl::draw_step() {
  RoutingDraws& r = *draws;
  r.draw_step();
  const int64_t e = r.local_experts();
  draw_rows.assign(sz(std::max<int64_t>(1, r.keys() * e)), 0);
  for (int64_t i = 0; i < r.keys(); ++i) {
    for (int64_t g = 0; g < e; ++g)
      draw_rows[sz(i * e + g)] = static_cast<int32_t>(r.draw(i).expert_rows(r.spec().ep_rank, g));
  }
  if (draw_rows_device.size() < draw_rows.size()) {
    count(static_cast<double>((draw_rows.size() - draw_rows_device.size()) * sizeof(int32_t)));
    draw_rows_device = DeviceBuffer<int32_t>(draw_rows.size());
  }
  MOERUN_CUDA_CHECK(cudaMemcpy(draw_rows_device.data(), draw_rows.data(), draw_rows.size() * sizeof(int32_t),
                               cudaMemcpyHostToDevice));
}

RoutingDraws::Stats CudaReplayRunner::routing_stats() const {
  return impl_->draws ? impl_->draws->stats() : RoutingDraws::Stats{};
}

int64_t CudaReplayRunner::kernel_memory_ops() const {
  return impl_->kernel_ops.load();
}

int64_t CudaReplayRunner::fp8_gemm_ops() const {
  return impl_->fp8_ops.load();
}

double CudaReplayRunner::device_bytes() const {
  return impl_->bytes.load();
}

std::array<double, 2> CudaReplayRunner::activation_stashes() const {
  int64_t stashes = 0;
  for (const int64_t n : impl_->acts.stashes) stashes += n;
  return {static_cast<double>(impl_->acts.bytes), static_cast<double>(stashes)};
}

std::array<double, 3> CudaReplayRunner::parameter_bytes() const {
  const Impl& I = *impl_;
  return {static_cast<double>(I.weights.size()), static_cast<double>(I.grads.size()),
          static_cast<double>(I.fp8_weights.size())};
}

double CudaReplayRunner::device_high_water_bytes() const {
  return impl_->high_water.load();
}

}  // namespace moeplan::executor
