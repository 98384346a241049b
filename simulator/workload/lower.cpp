// Lowering of (model, plan) to the op graph of one training step. Shapes follow MegaScale-MoE's per-layer
// data flow (megascale-moe.md §3.5) for Ulysses SP + EP, and Megatron-Core's for TP with sequence
// parallelism, CP, ETP, its token dispatchers (alltoall, allgather, flex with DeepEP / HybridEP), selective
// and full recompute and its pipeline schedules (1F1B, interleaved, combined 1F1B). Notation: b micro-batch,
// s sequence, h hidden, t = b*s/(tp*sp*cp) tokens per rank, k top-k, E routed experts.
#include "simulator/workload/lower.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>

#include "simulator/core/attention_calls.h"
#include "simulator/core/model_stats.h"
#include "simulator/core/status.h"

namespace moeplan {
namespace {

constexpr double kFp8ScaleOverhead = 1.0 + 4.0 / 128.0;  // one fp32 scale per 128 fp8 values

double d(int64_t x) {
  return static_cast<double>(x);
}

// The dtype an op of the plan is tagged with: FP8 plans run their ops in FP8.
DType op_dtype(const Plan& p) {
  return p.precision == Precision::kFp8 ? DType::kFp8 : DType::kBf16;
}

// The all-gather a column-parallel linear's op holds under TE's userbuffers, by the name it has unfused.
OpName ub_gather_name(OpName linear) {
  switch (linear) {
    case OpName::kQkvProj:
    case OpName::kMixerInProj:
      return OpName::kAttnAg;
    case OpName::kFc13:
      return OpName::kFfnAg;
    case OpName::kSharedFc13:
      return OpName::kSharedAg;
    default:
      return OpName::kInputAg;
  }
}

// Kernels Transformer Engine launches to quantise one tensor (TE pytorch/csrc/quantizer.cpp): current
// scaling (tensorwise) computes the amax, then the scale from it, then casts (Float8CurrentScalingQuantizer::
// quantize_impl: nvte_compute_amax, nvte_compute_scale_from_amax, nvte_quantize_v2); delayed scaling casts
// with the scale of its amax history (the history is updated once per step); block and MX scaling compute
// each block's scale inside the cast kernel.
int fp8_quantize_kernels(Fp8Recipe r) {
  return r == Fp8Recipe::kTensorwise ? 3 : 1;
}

// The Megatron combined-1F1B sub-layer nodes (model_chunk_schedule_plan.py): what runs before the dispatch
// on the compute stream, the dispatch exchange, the experts, and the combine exchange.
enum class Node : uint8_t { kPreDispatch, kDispatch, kMlp, kCombine };
// FLA's chunked gated delta rule (fla/ops/gated_delta_rule/chunk.py), the scan Megatron-Core's Gated DeltaNet
// calls: HBM bytes per token and value head, from the tensors each of its Triton kernels reads and writes
// (bf16 q, k, v, w, u, v_new and outputs; fp32 g, A before solve_tril, bf16 after it; the chunk states h
// [chunks, heads, dk, dv] in bf16 as k.new_empty allocates them), dk, dv head dims, c the chunk. q and k
// arrive repeated to the value heads (gated_delta_net.py repeat_interleave). Forward, six kernels:
// chunk_local_cumsum (g: 4 + 4), chunk_scaled_dot_kkt (k, beta, g -> A: 2dk + 6 + 4c), solve_tril (A -> bf16:
// 4c + 2c), recompute_w_u (k, v, beta, g, A -> w, u: 4dk + 4dv + 2c + 6), chunk_gated_delta_rule_fwd_h (k, w,
// u, g -> v_new, h: 4dk + 4dv + 4 + 2 dk dv / c), chunk_fwd_o (q, k, v_new, h, g -> o: 4dk + 4dv + 2 dk dv /
// c + 4).
double fla_scan_forward_bytes(double dk, double dv, double c) {
  return 14.0 * dk + 12.0 * dv + 12.0 * c + 4.0 * dk * dv / c + 30.0;
}
constexpr int kFlaScanForwardKernels = 6;
// Backward, nine kernels (chunk_gated_delta_rule_bwd): recompute_w_u and fwd_h again (as above),
// chunk_bwd_dv_local (q, k, do, g -> dv: 4dk + 4dv + 4), chunk_gated_delta_rule_bwd_dhu (q, k, w, do, dv,
// g -> dh, dv2: 6dk + 6dv + 2 dk dv / c + 4), chunk_bwd_dqkwg (q, k, w, v_new, h, dh, dv, do, g -> dq, dk,
// dw, dg: 12dk + 6dv + 4 dk dv / c + 8), prepare_wy_repr_bwd (k, v, beta, g, A, dw, du -> dk2, dv, db, dg2:
// 6dk + 6dv + 2c + 12), dk.add_(dk2) (6dk), dg.add_(dg2) (12) and the reverse chunk_local_cumsum of dg (8).
double fla_scan_backward_bytes(double dk, double dv, double c) {
  return 42.0 * dk + 30.0 * dv + 4.0 * c + 8.0 * dk * dv / c + 60.0;
}
constexpr int kFlaScanBackwardKernels = 9;
// The scan's kernels that walk the chunks one after another (fwd_h forward; fwd_h again and bwd_dhu
// backward).
constexpr int kFlaScanForwardChains = 1;
constexpr int kFlaScanBackwardChains = 2;
constexpr int64_t kFlaValueBlock = 64;  // BV of the chain kernels (their autotuned 32 or 64; 64 on Hopper)
// Mamba-2's SSD scan as Megatron-Core trains it (ssm/mamba_mixer.py _ssm_training at core_v0.16-0.19 and
// d98e8a64: mamba_ssm's mamba_split_conv1d_scan_combined, ops/triton/ssd_combined.py at e9594ce): HBM bytes
// per token for h heads of head dim p, g groups of state n, chunks of c tokens (rank-local heads and groups),
// from the tensors each Triton kernel reads and writes: bf16 x, z, B, C, dt and outputs, fp32 dt and
// dA_cumsum [heads, chunks, c], fp32 CB [groups, chunks, c, c], chunk states [chunks, heads, p, n] fp32 from
// _chunk_state_fwd and bf16 after _state_passing_fwd (no state_dtype: C's dtype). A tensor is counted once
// per kernel that touches it (a group's B, C and CB shared by its heads come from L2). Forward, five
// kernels: _chunk_cumsum_fwd (dt -> dt, dA_cumsum: 2h + 8h), _chunk_state_fwd (B, x, dt, dA_cumsum ->
// states: 2gn + 2hp + 8h + 4hpn / c), _state_passing_fwd (4hpn / c -> 2hpn / c), _bmm_chunk_fwd (C, B -> CB:
// 4gn + 4gc), _chunk_scan_fwd (CB, x, z, dt, dA_cumsum, C, states -> out, out_x: 4gc + 8hp + 8h + 2gn +
// 2hpn / c). Megatron's A = -exp(A_log) before it adds two kernels (A_log, dt_bias and D are kept in fp32, so
// their .float() copies nothing).
double ssd_scan_forward_bytes(double h, double p, double g, double n, double c) {
  return 10.0 * h * p + 12.0 * h * p * n / c + 8.0 * g * n + 8.0 * g * c + 26.0 * h;
}
constexpr int kSsdForwardKernels = 5 + 2;
// Backward (MambaSplitConv1dScanCombinedFn.backward -> _mamba_chunk_scan_combined_bwd): dt cloned (4h), the
// forward's cumsum, bmm and chunk-state kernels again and _state_passing_fwd with fp32 output (8hpn / c),
// _chunk_scan_bwd_dz (x, z, out_x, dout -> dz, dout_x: 12hp), _chunk_scan_bwd_dstates (C, dA, dout ->
// fp32 dstates: 2gn + 4h + 2hp + 4hpn / c), _state_passing_bwd (fp32 states and dstates -> bf16 both: 12hpn
// / c), _chunk_scan_chunk_state_bwd_dx (x, dt, dA, B, CB, dout, dstates -> dx, fp32 ddt: 6hp + 12h + 2gn +
// 4gc + 2hpn / c), _chunk_state_bwd_db and _chunk_scan_bwd_dC (each x or dout, dt, dA, dstates or states, B
// or C -> fp32 dB or dC and ddA, then the sum over splits: 2hp + 2hpn / c + 14gn + 24h and + 8h), the dCB
// kernel and its sum (4hp + 12gc + 8h), two _bmm_chunk_bwd (C or B, dCB, fp32 residual -> bf16: 8gn + 4gc
// each), the reverse cumsum as flip, cumsum, flip (24h), _chunk_scan_bwd_ddAcs_stable and its sum (4hp + 4gc
// + 12h + hc / 4), two adds of ddA (24h) and _chunk_cumsum_bwd (12h). With one split over the heads of a
// group (nheads_per_program reaches heads / groups when batch x chunks x heads >= SMs x heads / groups).
double ssd_scan_backward_bytes(double h, double p, double g, double n, double c) {
  return 34.0 * h * p + 34.0 * h * p * n / c + 54.0 * g * n + 32.0 * g * c + 150.0 * h + h * c / 4.0;
}
// Counted from the wrappers: the 18 kernels above, their reductions over splits and tiles, the zero-fills
// of Triton's init_to_zero and of the dA / dt_bias workspaces and their sums (40), and the backward of
// A = -exp(A_log) (2).
constexpr int kSsdBackwardKernels = 42;

constexpr int kNodes = 4;

// One op of a layer's forward pass with the local indices of its inputs, replayed for backward and recompute.
struct LocalOp {
  Op op;
  std::vector<int> inputs;  // local indices within the layer
  bool sar = false;         // recomputed by MegaScale-MoE's selective activation rematerialization
  uint16_t module = 0;      // the Megatron recompute modules it belongs to (RecomputeModule bits)
  Node node = Node::kPreDispatch;
  bool forward_only = false;  // no backward op (routing metadata, host syncs): gradients pass through
  // A collective whose backward moves the same way (a gather whose gradient is gathered again, of
  // backward_bytes when >= 0) instead of the reverse collective.
  bool backward_same_way = false;
  // A memory-bound op whose backward moves other bytes or launches other kernels than its forward (autograd
  // of eager elementwise code); < 0: the backward mirrors the forward.
  double backward_bytes = -1;
  uint16_t backward_kernels = 0;
  bool graphed = false;  // inside the plan's CUDA graph of the layer (Plan::cuda_graphs)
};

// A layer recipe: its forward ops, per op the ops consuming it, and the index range of each node.
struct Recipe {
  std::vector<LocalOp> ops;
  std::vector<std::vector<size_t>> consumers;
  std::array<std::pair<size_t, size_t>, kNodes> nodes{};  // [begin, end) per node
  // Under CUDA graphs: the bytes a replay copies (read and written) into the graph's static buffers, the
  // layer's input forward, the incoming gradients of the graph's outputs backward.
  double graph_fwd_copy = 0, graph_bwd_copy = 0;
};

// The emission state of one (layer, micro-batch) pass, kept across its nodes.
struct LayerPass {
  int64_t layer = -1;
  int16_t stage = 0, chunk = 0;
  int32_t mb = 0;
  int32_t input = -1;  // forward: the layer input's producer; backward: the incoming gradient's producer
  int32_t first = -1;  // first op emitted for the pass
  int32_t zero3_gather = -1;
  std::vector<int32_t> ids;   // forward: emitted id per recipe op
  std::vector<int32_t> re;    // backward: recomputed id per recipe op (-1: not recomputed)
  std::vector<int32_t> grad;  // backward: the op producing the gradient of op i's input
  std::vector<uint8_t> recomputed_node;
  int32_t last = -1;
  // Combined 1F1B: the op that ends the pass's latest node. Megatron's nodes of one micro-batch share one
  // CUDA event (pipeline_parallel/utils.py ScheduleNode.stream_acquire_context): each waits on it before its
  // first kernel and records it after its last, so a node on the other stream starts after the whole node
  // before it, not only after the op whose output it reads. Kept from layer to layer within a task.
  int32_t node_end = -1;
};

class Builder {
 public:
  Builder(const ModelSpec& m, const Plan& p, const LoweringOptions& o) : m_(m), p_(p), o_(o) {
    tp_ = p.attention.tp;
    sp_ = p.attention.sp;
    cp_ = p.attention.cp;
    ep_ = p.experts.ep;
    etp_ = p.experts.etp;
    pp_ = p.pipeline.pp;
    vpp_ = p.pipeline.vpp;
    dp_ = p.dp();
    edp_ = p.expert_dp();
    t_ = t_seq_ = p.micro_batch * p.seq_len / (tp_ * sp_ * cp_);
    // An encoder-decoder's head and loss run on the decoder's tokens (its rules keep sp = cp = 1).
    encdec_ = m.encoder_decoder();
    t_head_ = encdec_ ? p.micro_batch * decoder_seq_len(p.seq_len) / tp_ : t_seq_;
    seq_ = p.seq_len;
    glu_ = m.activation == FfnActivation::kSwiGlu ? 2 : 1;
    dt_ = DType::kBf16;  // activations travel in bf16 (FP8 only where the plan compresses the dispatch)
    combined_ = p.overlap.cross_micro_batch;
    delay_wgrad_ = combined_ && p.overlap.delay_wgrad;
    schedule_ = p.pipeline.schedule;
    comm_stream_ = p.overlap.inter_op ? Stream::kComm : Stream::kCompute;
    shared_overlap_ = p.overlap.shared_experts && !p.overlap.inter_op;
    side_stream_ = p.overlap.inter_op ? Stream::kSide : shared_overlap_ ? Stream::kShared : Stream::kCompute;
    dp_stream_ = p.overlap.dp_comm ? Stream::kDpComm : Stream::kCompute;
    megatron_ = o.dispatcher != DispatcherKind::kFused;
    mla_down_ = mla_down_proj_of(p, o.mla_down_proj);
    fp8_pad_ = fp8_padding_of(p, o.fp8_padding);
    fp8_align_ = fp8_row_alignment(p);
    // TE's userbuffers take the TP exchanges of the attention's and the MLPs' linears (Megatron builds them
    // with tp_comm_buffer_name qkv, proj, fc1, fc2; the experts' linears never: extensions/
    // transformer_engine.py:150-195 at 1e057005). MLA's linears carry other buffer names, and the first one
    // built switches tp_comm_overlap off in the configuration every later module shares (ibid.:150-160), so
    // an MLA model runs without them.
    ub_ = megatron_ && tp_ > 1 && sp_ == 1 && p.overlap.tp_comm && m.attention.kind != AttentionKind::kMla;
    // Under FP8 with per-tensor scales, TE quantises a TP linear's input before its sequence-parallel
    // all-gather and gathers the FP8 copy, and so the incoming gradient of a row-parallel linear in backward
    // (v2.4 module/layernorm_linear.py:229-262, module/base.py grad_output_preprocess:1045-1075 with their
    // quantizers; distributed.py gather_along_first_dim -> _all_gather_fp8). Block scaling gathers in BF16
    // (force_hp_blockwise_ln_out_gather). Current scaling (tensorwise) first all-reduces the tensor's amax
    // over TP so every rank quantises with one scale (module/linear.py and layernorm_linear.py
    // _customize_quantizers_float8_current_scaling: with_amax_reduction on the column-parallel input and the
    // row-parallel gradient; csrc/extensions/cast.cpp and normalization.cpp: allreduce(MAX)->wait()).
    fp8_tp_gather_ = megatron_ && tp_ > 1 && p.precision == Precision::kFp8 &&
                     (p.fp8_recipe == Fp8Recipe::kDelayed || p.fp8_recipe == Fp8Recipe::kTensorwise);
    fp8_amax_ar_ = fp8_tp_gather_ && p.fp8_recipe == Fp8Recipe::kTensorwise;
    // Under delayed scaling TE's norm kernel writes a LayerNormLinear's input in FP8 itself (v2.4
    // csrc/extensions/normalization.cpp layernorm_fwd / rmsnorm_fwd: force_unfused_kernel is false for a
    // Float8Quantizer; current scaling and block scaling run the norm, then quantise), and the FP8 transpose
    // for the weight gradient follows from that copy (common/normalization ln_api.cpp, rmsnorm_api.cpp:
    // nvte_transpose of the output when its columnwise data is wanted; after an FP8 gather, the gathered
    // copy's transpose): record_norm_into_linear, linear_after_norm.
    fp8_norm_out_ = megatron_ && p.precision == Precision::kFp8 && p.fp8_recipe == Fp8Recipe::kDelayed;
    fp8_block_ = p.precision == Precision::kFp8 && p.fp8_recipe == Fp8Recipe::kBlockwise;
    layers_ = layers_per_virtual_stage(m, p);
    // Multi-token prediction modules (DeepSeek-V3) run on the last virtual stage, after its layers, as layer
    // indices past the model's own (Megatron's layout puts them there, 'm' before the loss).
    n_main_ = m.num_layers();
    mtp_ = o.embedding_and_head ? m.mtp_layers : 0;
    mtp_spec_ = LayerSpec{m.is_moe(), 0, true};
    first_layer_.resize(layers_.size() + 1, 0);
    std::partial_sum(layers_.begin(), layers_.end(), first_layer_.begin() + 1);
  }

  OpGraph build();

 private:
  // ---- op constructors (ops of the layer being recorded) ----
  int record(Op op, std::vector<int> inputs, bool sar = false, bool forward_only = false) {
    if (o_.eager_framework) op.kernels = static_cast<uint16_t>(op.kernels + eager_extra_kernels(op));
    // A host wait cannot be captured: it stays outside the graph (and splits it).
    const bool graphed = graph_ && !op.host_sync;
    layer_ops_.push_back({std::move(op), std::move(inputs), sar, module_, node_, forward_only});
    layer_ops_.back().graphed = graphed;
    return static_cast<int>(layer_ops_.size()) - 1;
  }
  // Recorded op `i`'s backward moves `bytes` in `kernels` kernels.
  void backward_as(int i, double bytes, int kernels) {
    LocalOp& lo = layer_ops_[static_cast<size_t>(i)];
    lo.backward_bytes = bytes;
    lo.backward_kernels = static_cast<uint16_t>(kernels);
  }
  // Kernels beyond the op's main one that Megatron-Core + TE launch for it (read from their sources):
  // TE's fused RoPE runs once for q and once for k, QK-norm once each, cuDNN attention a forward kernel and a
  // stats/prep kernel, TE's fused permute builds its row map first, chunk sorts build their map, and the
  // token unpermute reduces after gathering.
  static int eager_extra_kernels(const Op& op) {
    switch (static_cast<OpName>(op.name)) {
      case OpName::kRope:
      case OpName::kQkNorm:
      case OpName::kAttnCore:
      case OpName::kAttnCoreLocal:
      case OpName::kSortChunks:
      case OpName::kUnsortChunks:
      case OpName::kUnpermute:
        return 1;
      case OpName::kPermute:
        return 2;
      default:
        return 0;
    }
  }
  Op base(OpName name, OpKind kind, Stream stream) const {
    Op op;
    op.name = static_cast<uint16_t>(name);
    op.kind = kind;
    op.stream = stream;
    op.dtype = op_dtype(p_);
    return op;
  }
  // FP8 GEMMs quantise their input here (forward) and the incoming gradient in backward (set at emission).
  double fp8_input_cast(double elements) const {
    return p_.precision == Precision::kFp8 ? elements * fp8_cast_bytes_per_element(p_.fp8_recipe) : 0.0;
  }
  Op gemm(OpName name, int64_t m, int64_t n, int64_t k, Stream stream = Stream::kCompute) const {
    Op op = base(name, OpKind::kGemm, stream);
    op.gemm = {m, n, k, 1};
    op.flops = 2.0 * d(m) * d(n) * d(k);
    op.hbm_bytes = (d(m) * d(k) + d(k) * d(n) + d(m) * d(n)) * bytes_of(DType::kBf16);
    op.aux_bytes = fp8_input_cast(d(m) * d(k));
    if (op.aux_bytes > 0) {
      op.aux_kernels = static_cast<uint8_t>(fp8_quantize_kernels(p_.fp8_recipe));
      op.kernels = static_cast<uint16_t>(1 + op.aux_kernels);
    }
    return op;
  }
  // A GEMM with no quantisation around it: a weight gradient (both operands' FP8 transposes exist already).
  static void without_casts(Op& op) {
    op.aux_bytes = 0;
    op.aux_kernels = 0;
    op.kernels = 1;
  }
  // Records a norm that TE fuses into the LayerNormLinear after it: under delayed scaling its `elements`
  // outputs are written in FP8 (fp8_norm_out_); its backward moves what it moved before.
  int record_norm_into_linear(Op norm, double elements, std::vector<int> inputs, bool sar = false) {
    const double bytes = norm.hbm_bytes;
    const int kernels = norm.kernels;
    if (fp8_norm_out_) norm.hbm_bytes -= elements * (bytes_of(dt_) - bytes_of(DType::kFp8));
    const int i = record(std::move(norm), std::move(inputs), sar);
    if (fp8_norm_out_) backward_as(i, bytes, kernels);
    return i;
  }
  // That LayerNormLinear's GEMM: under delayed scaling its input arrives in FP8, so its quantisation is the
  // transpose alone (read 1 B, write 1 B per element), one kernel.
  Op linear_after_norm(Op g) const {
    if (fp8_norm_out_ && g.aux_bytes > 0)
      g.aux_bytes = d(g.gemm.m) * d(g.gemm.k) * 2.0 * bytes_of(DType::kFp8);
    return g;
  }
  // A GEMM the stack keeps in BF16 under FP8 training.
  static void in_bf16(Op& op) {
    op.dtype = DType::kBf16;
    without_casts(op);
  }
  Op grouped(OpName name, double rows, int64_t n, int64_t k, int64_t groups) const {
    Op op = base(name, OpKind::kGroupedGemm, Stream::kCompute);
    const auto m = static_cast<int64_t>(std::ceil(rows));
    op.gemm = {m, n, k, groups};
    op.flops = 2.0 * rows * d(n) * d(k);
    op.hbm_bytes = (rows * d(k) + d(groups) * d(k) * d(n) + rows * d(n)) * bytes_of(DType::kBf16);
    op.aux_bytes = fp8_input_cast(rows * d(k));
    if (op.aux_bytes > 0) op.aux_kernels = static_cast<uint8_t>(fp8_quantize_kernels(p_.fp8_recipe));
    return op;
  }
  Op mem(OpName name, MemOp kind, double bytes, Stream stream = Stream::kCompute, int kernels = 1) const {
    Op op = base(name, OpKind::kMemoryBound, stream);
    op.mem = kind;
    op.hbm_bytes = bytes;
    op.dtype = DType::kBf16;
    op.kernels = static_cast<uint16_t>(kernels);
    return op;
  }
  // States the tensor a memory-bound op's kernel walks (op_graph.h): rows, columns and the inner size (top-k
  // picks, head dim) where the kernel has one, so an executor can run that kernel at the op's shape.
  static Op walks(Op op, double rows, int64_t cols, int64_t inner = 0) {
    op.gemm = {static_cast<int64_t>(std::llround(rows)), cols, inner, 1};
    return op;
  }
  CommSpec comm(Collective c, CommGroup g, double bytes, DType dtype) const {
    return group_comm(p_, c, g, bytes, dtype);
  }
  Op coll(OpName name, Collective c, CommGroup g, double bytes, DType dtype = DType::kBf16) const {
    Op op = base(name, OpKind::kCollective, comm_stream_);
    op.comm = comm(c, g, bytes, dtype);
    op.dtype = dtype;
    return op;
  }
  // The busiest EP rank's routed rows over the mean rank's (from the routing model; the slowest rank
  // decides).
  double load_scale() const {
    return spec_role_ == LayerRole::kDecoder ? o_.decoder_expert_load_scale : o_.expert_load_scale;
  }
  // A routed all-to-all whose bytes are the busiest rank's: it carries the load scale as its hot factor.
  CommSpec routed(CommSpec c) const {
    c.hot_factor = load_scale();
    return c;
  }
  Op routed(Op op) const {
    op.comm = routed(op.comm);
    return op;
  }
  Op fused(OpName name, Op gemm_part, CommSpec c) const {
    gemm_part.name = static_cast<uint16_t>(name);
    gemm_part.kind = OpKind::kFusedGemmComm;
    gemm_part.stream = Stream::kCompute;
    gemm_part.comm = c;
    return gemm_part;
  }
  // The loss over [tg, V / tp] logits, forward or backward. Megatron stacks by the plan's implementation, in
  // HBM bytes per logit and kernels: TE's Triton kernels read the bf16 logits twice and write the gradient in
  // place (TE triton/cross_entropy.py: online_softmax_kernel, cross_entropy_kernel), then scale it
  // (element_mul_kernel); Megatron's native fusion casts to fp32 with the max, subtracts and exponentiates
  // with the sum, divides (fused_cross_entropy.py); unfused, each of cast, max, subtract, exp, sum and divide
  // is its own pass, and backward adds a cast (tensor_parallel/cross_entropy.py). The native backward is one
  // torch.compile'd function (megatron/core/jit.py: jit_fuser = torch.compile) that mutates its input, the
  // saved fp32 softmax: the functionalised index_put copies it (read 4 B, write 4 B per logit), and the
  // multiply by the loss gradient, the write back into the input and the bf16 cast run as one pass (read 4 B,
  // write 4 + 2 B): 18 B. The two Megatron implementations are their own memory-bound kinds, so a stack can
  // price them at their measured rates. moerun and MegaScale-MoE: one fused kernel each way.
  Op loss_op(OpName name, bool forward, int64_t tg) const {
    double per_logit = forward ? 12.0 : 8.0;
    int kernels = 1;
    MemOp kind = MemOp::kLoss;
    if (o_.eager_framework) {
      switch (p_.cross_entropy) {
        case CrossEntropy::kTe:
          per_logit = forward ? 6.0 : 4.0;
          kernels = forward ? 2 : 1;
          break;
        case CrossEntropy::kNative:
          per_logit = forward ? 22.0 : 18.0;
          kernels = 3;
          kind = MemOp::kLossNative;
          break;
        case CrossEntropy::kUnfused:
          per_logit = forward ? 42.0 : 14.0;
          kernels = forward ? 6 : 3;
          kind = MemOp::kLossUnfused;
          break;
      }
    }
    return walks(mem(name, kind, per_logit * d(tg * (m_.vocab / tp_)), Stream::kCompute, kernels), d(tg),
                 m_.vocab / tp_);
  }
  // A device-to-host copy of routing counts the host waits for (Megatron's dispatchers). It runs on a stream
  // of its own, as Megatron's copy does (cuda_dtoh_stream), so the host waits for the counts only.
  Op host_wait(double bytes) const {
    Op op = mem(OpName::kDispatchSync, MemOp::kRouting, bytes, Stream::kSide);
    op.host_sync = true;
    return op;
  }

  // ---- layer forward recipes (record into layer_ops_) ----
  // Self-attention; `position_bias`: this layer expands its stack's T5 relative position bias.
  int attention_fwd(int in, bool position_bias);
  int cross_attention_fwd(int in);
  int indexer_fwd(int x, int q_latent, int64_t tg);
  int recurrent_mixer_fwd(int in, MixerKind kind);
  int moe_fwd(int in);
  int moe_dispatch_megatron(int r, double rows, double ep_rows, int64_t f_r, int64_t local_experts);
  // The shared experts in three parts: the TP gather, FC1 with the activation, FC2 with the TP
  // reduce-scatter (Megatron's shared-expert overlap issues them around the dispatcher's exchanges).
  int shared_gather(int x);
  int shared_fc1(int y);
  int shared_fc2(int y);
  struct SharedPart;
  // Megatron's shared-expert overlap under the alltoall dispatcher: the shared experts' last recorded op
  // while the dispatcher records FC1 after its dispatch exchange and FC2 after its combine; -1 otherwise.
  int shared_pending_ = -1;
  int moe_dispatch_dedup(int r, double ep_rows, int64_t f_r, int64_t local_experts);
  int expert_act(int y, double ep_rows, int64_t f_r);
  int expert_mlp(int y, double ep_rows, int64_t f_r, int64_t local_experts, bool router_padded);
  int glu_act(OpName name, int y, double rows, int64_t width);
  int expert_fc2(int y, double ep_rows, int64_t f_r, int64_t local_experts);
  // Bytes per router prob: fp32 for sigmoid routers (Megatron-Bridge sets moe_router_dtype fp32 for
  // DeepSeek-V3), the activation dtype otherwise.
  double probs_bytes() const { return m_.moe.score == RouterScore::kSigmoid ? 4.0 : 2.0; }
  // Megatron's shared-expert overlap beside the all-to-all dispatcher: their TP gather issued in the
  // dispatcher's preprocess, FC1 after the dispatch, FC2 after the combine.
  bool shared_gather_in_preprocess() const {
    return shared_overlap_ && megatron_ && p_.experts.dispatch == Dispatch::kAllToAll && !p_.overlap.intra_op;
  }
  int dense_ffn_fwd(int in);
  void record_layer(int64_t layer);
  void layer_graph_copies(const LayerSpec& l);
  double graph_fwd_copy_ = 0, graph_bwd_copy_ = 0;  // of the layer just recorded (Recipe)

  // ---- emission into the graph ----
  int32_t emit(const Op& proto, int16_t stage, int16_t chunk, int32_t layer, int32_t mb, Phase phase,
               std::initializer_list<int32_t> deps);
  void dep(int32_t op, int32_t on) {
    if (on >= 0) dep_pairs_.emplace_back(op, on);
  }
  const Recipe& recipe_of(int64_t layer) const {
    return recipes_[static_cast<size_t>(recipe_of_layer_[static_cast<size_t>(layer)])];
  }
  Stream stream_of(const LocalOp& lo) const {
    // Combined 1F1B runs the dispatch and combine nodes on its communication stream.
    if (combined_ && !lo.op.host_sync && (lo.node == Node::kDispatch || lo.node == Node::kCombine))
      return Stream::kComm;
    return lo.op.stream;
  }
  bool recomputed(const LocalOp& lo, int64_t layer) const;
  void forward_begin(LayerPass& pass, int64_t layer, int16_t stage, int16_t chunk, int32_t mb, int32_t input);
  void forward_node(LayerPass& pass, Node node);
  void backward_begin(LayerPass& pass, int64_t layer, int16_t stage, int16_t chunk, int32_t mb,
                      int32_t grad_input);
  void backward_node(LayerPass& pass, Node node);
  int32_t backward_output(const LayerPass& pass) const;
  void backward_done(const LayerPass& pass);

  struct TaskState {
    PipelineTask task;
    int16_t stage = 0;
    int64_t v = 0, l0 = 0, l1 = 0;
    int32_t first = -1, cur = -1;
    void track(int32_t id) {
      if (first < 0) first = id;
      cur = id;
    }
  };
  TaskState task_begin(int16_t stage, const PipelineTask& task);
  // Megatron under tensor parallelism (with sequence parallelism, as the lowering always has it): its ends
  // split the vocabulary over TP (gpt_model.py at 1e057005) and its MTP projection exchanges over TP; moerun
  // keeps the whole table on every rank.
  bool megatron_tp() const { return megatron_ && tp_ > 1; }
  // A TP exchange that a column-parallel linear's backward issues asynchronously: the input's re-gather for
  // the weight gradient and the data gradient's reduce-scatter. TE waits for the first only before the
  // weight-gradient GEMM and for the second at the end of backward (TransformerEngine v2.4
  // module/layernorm_linear.py:650-656, 728-734, 889-892; module/linear.py alike), and so does Megatron's own
  // linear (tensor_parallel/layers.py:486-565 at 1e057005), which launches them before the GEMM they hide
  // behind (CUDA_DEVICE_MAX_CONNECTIONS=1 keeps that order): on the TP group's NCCL stream beside the GEMMs
  // (kTpComm, apart from combined 1F1B's EP exchanges). Other stacks keep the op's stream.
  Op te_async(Op op) const {
    if (megatron_) op.stream = Stream::kTpComm;
    return op;
  }
  // A TP linear's GEMM over [tg, h]-sized activations with its exchange pipelined by TE's userbuffers: one
  // op, priced as TE runs the pipeline (cost::CostModel::userbuffers_seconds), on the GEMM's stream.
  Op ub_linear(Op gemm_op, Collective c) const {
    const DType moved = c == Collective::kAllGather ? tp_gather_dtype() : dt_;
    CommSpec cs = comm(c, CommGroup::kTp, d(gemm_op.gemm.m * m_.hidden) * bytes_of(moved), moved);
    cs.userbuffers = true;
    const Stream s = gemm_op.stream;
    Op f = fused(static_cast<OpName>(gemm_op.name), gemm_op, cs);
    f.stream = s;
    return f;
  }
  // What a TP linear's sequence-parallel all-gather moves: FP8 where TE quantises before it (above).
  DType tp_gather_dtype() const { return fp8_tp_gather_ ? DType::kFp8 : dt_; }
  // The same TP exchange with its elements in `to` (one scale per tensor: no scale bytes).
  static void retype(CommSpec& c, DType to) {
    c.bytes = c.bytes / bytes_of(c.dtype) * bytes_of(to);
    c.dtype = to;
  }
  // Current scaling's all-reduce of one amax over TP before an FP8 gather: a forward-only op (its backward
  // counterpart is the gradient's own, emitted with the gradient's gather).
  Op amax_all_reduce() const {
    return coll(OpName::kFp8AmaxAr, Collective::kAllReduce, CommGroup::kTp, 4.0, DType::kFp32);
  }
  // The TP all-gather of [t, h] before a column-parallel linear, after current scaling's amax all-reduce;
  // none under userbuffers (`ub`), where the linear holds it (column_linear).
  // `width`: the gathered tensor's per-token width (the hidden size unless given).
  int tp_gather(int x, OpName name, bool ub, int64_t width = 0) {
    if (tp_ == 1) return x;
    if (fp8_amax_ar_) x = record(amax_all_reduce(), {x}, true, true);
    if (ub) return x;
    const DType moved = tp_gather_dtype();
    const int64_t w = width > 0 ? width : m_.hidden;
    return record(
        coll(name, Collective::kAllGather, CommGroup::kTp, d(t_ * tp_ * w) * bytes_of(moved), moved), {x},
        true);
  }
  Op column_linear(const Op& g, bool ub) const { return ub ? ub_linear(g, Collective::kAllGather) : g; }
  // A row-parallel linear after `input` and its TP reduce-scatter (`rs`), held inside it under userbuffers.
  int row_linear(const Op& g, int input, OpName rs, bool ub) {
    if (ub) return record(ub_linear(g, Collective::kReduceScatter), {input});
    const int y = record(g, {input});
    if (tp_ == 1) return y;
    return record(
        coll(rs, Collective::kReduceScatter, CommGroup::kTp, d(g.gemm.m * m_.hidden) * bytes_of(dt_)), {y});
  }
  // The TP reduce-scatter after a row-parallel TE linear (attention's output projection, the MLPs' FC2),
  // whose backward gathers the incoming gradient.
  static bool tp_row_rs(const Op& op) {
    const auto name = static_cast<OpName>(op.name);
    return op.comm.group == CommGroup::kTp &&
           (name == OpName::kAttnRs || name == OpName::kFfnRs || name == OpName::kSharedRs);
  }
  // That re-gather: the linear's forward all-gather once more.
  Op regather(Op forward_gather) const {
    forward_gather.name = static_cast<uint16_t>(OpName::kInputAg);
    return te_async(forward_gather);
  }
  Op embedding_op(OpName name, int64_t tokens) const;
  Op embed_exchange(int64_t tokens, bool forward) const;
  Op head_gather(int64_t tokens) const;
  int32_t head_backward(TaskState& ts, Op head, int64_t tokens);
  int32_t loss_reductions(TaskState& ts, int32_t loss, int64_t tg);
  // The MTP modules on the last virtual stage: forward after the main loss, backward before the main head.
  void emit_mtp(TaskState& ts);
  void task_end(TaskState& ts);
  void emit_task(int16_t stage, const PipelineTask& task);
  void emit_pair(int16_t stage, const PipelineTask& fwd, const PipelineTask& bwd);
  void emit_data_parallel(int16_t stage);
  void emit_weight_casts(int16_t stage, const std::vector<int64_t>& stage_layers);

  const ModelSpec& m_;
  const Plan& p_;
  const LoweringOptions& o_;
  int64_t tp_, sp_, cp_, ep_, etp_, pp_, vpp_, dp_, edp_;
  // Tokens per rank: of the layer being recorded (t_, over a sequence of seq_ tokens, causal_ or not), of the
  // model's input sequence (t_seq_: an encoder-decoder's encoder tokens), and at the head (t_head_: its
  // decoder tokens).
  int64_t t_, t_seq_, t_head_, seq_;
  bool causal_ = true;
  LayerRole spec_role_ = LayerRole::kDecoderOnly;  // the role of the layer being recorded
  // An encoder-decoder embeds its encoder's and its decoder's tokens, and normalises both stacks' outputs
  // (the encoder's final norm is priced with the decoder's, at the head, over the same tokens).
  bool encdec_ = false;
  int64_t embedded_tokens() const { return encdec_ ? t_seq_ + t_head_ : t_seq_; }
  int64_t glu_ = 2;               // FC1 width over F: 2 for SwiGLU (gate and up), 1 for GELU and squared ReLU
  int64_t n_main_ = 0, mtp_ = 0;  // the model's layers; MTP modules lowered after them
  LayerSpec mtp_spec_;
  const LayerSpec& spec_of(int64_t layer) const {
    return layer < n_main_ ? m_.layers[static_cast<size_t>(layer)] : mtp_spec_;
  }

  DType dt_;
  bool combined_ = false, delay_wgrad_ = false, megatron_ = false, ub_ = false;
  bool fp8_tp_gather_ = false, fp8_amax_ar_ = false, fp8_norm_out_ = false;
  bool fp8_block_ = false;  // FP8 GEMMs with block-scaled operands (Op::block_scaled)
  // MLA's down projections under TP: the plan's layout, else the stack's.
  MlaDownProj mla_down_ = MlaDownProj::kGathered;
  // Where an FP8 plan pads the experts' rows (kNone under BF16); the alignment of its recipe.
  Fp8Padding fp8_pad_ = Fp8Padding::kNone;
  int fp8_align_ = 16;
  Schedule schedule_ = Schedule::k1F1B;
  int64_t vstage(int64_t chunk, int64_t stage) const { return virtual_stage(chunk, stage, pp_, schedule_); }
  // The pipeline stage (rank) that runs virtual stage v.
  int64_t stage_of_virtual(int64_t v) const { return moeplan::stage_of_virtual(v, pp_, schedule_); }
  // A weight-gradient GEMM held back from its backward node, emitted later after its input gradient.
  struct DeferredWgrad {
    Op op;
    int16_t stage, chunk;
    int32_t layer, mb, dgrad;
    int32_t input = -1;  // the backward all-gather of the GEMM's input (input_ag), or -1
  };
  int32_t emit_deferred(const DeferredWgrad& w) {
    return emit(w.op, w.stage, w.chunk, w.layer, w.mb, Phase::kBackward, {w.dgrad, w.input});
  }
  // Zero-bubble backward (DualPipeV): held until a later weights task, oldest first.
  std::vector<DeferredWgrad>* deferring_ = nullptr;
  std::vector<std::vector<DeferredWgrad>> deferred_;  // per input-gradient-only backward, in order
  void emit_weights(int16_t stage);
  // --delay-wgrad-compute: those of the backward node just emitted, held until the schedule runs that node's
  // backward_dw (model_chunk_schedule_plan.py:236-303).
  std::vector<DeferredWgrad> delayed_;
  void emit_delayed(LayerPass& pass);
  Stream comm_stream_, side_stream_, dp_stream_;
  // Megatron's shared-expert overlap (without inter_op): the shared experts on their own stream (kShared,
  // apart from the count copies on kSide) with their exchanges and weight gradients.
  bool shared_overlap_ = false;
  std::vector<int64_t> layers_, first_layer_;

  std::vector<LocalOp> layer_ops_;
  uint16_t module_ = 0;             // the recompute modules of the ops being recorded
  Node node_ = Node::kPreDispatch;  // the combined-1F1B node of the ops being recorded
  bool graph_ = false;              // the ops being recorded are inside the plan's CUDA graph
  // Emission under CUDA graphs: whether the ops being emitted are graphed, and per stage the replay the last
  // emitted op belongs to ((layer, micro-batch, direction) packed; -1 after an op outside graphs).
  bool graph_emit_ = false;
  std::vector<int64_t> graph_open_;
  // Per distinct layer kind (MoE or dense, window, CLA): its recipe.
  std::vector<Recipe> recipes_;
  std::vector<int> recipe_of_layer_;
  std::vector<int64_t> chunk_position_;  // per layer: its index within its virtual stage
  std::vector<int32_t> scratch_waits_;

  OpGraph g_;
  std::vector<std::pair<int32_t, int32_t>> dep_pairs_;
  // Per (stage, micro-batch, chunk, direction): the task's first op and its pipeline send.
  std::vector<int32_t> task_first_, task_send_;
  size_t task_index(int64_t mb, int64_t v, bool fwd) const {
    return static_cast<size_t>(((mb * pp_ * vpp_) + v) * 2 + (fwd ? 0 : 1));
  }
  // Per stage: last backward op of each layer (for gradient sync) and the first forward op (for param
  // gathers).
  std::vector<int32_t> layer_last_bwd_, layer_first_fwd_;
  // Per stage and layer: the last backward op on the side stream (shared-expert GEMMs with inter-op
  // overlap), which the layer's gradient sync must also wait for; -1 when the side stream is not used.
  std::vector<int32_t> layer_last_side_bwd_;
  std::vector<int32_t> layer_param_gather_;
  // ZeRO-3 with backward prefetch: the gather a layer's backward prefetched for the next layer in backward
  // order (that layer, its micro-batch and the gather's last op; layer -1: none).
  int64_t prefetched_layer_ = -1;
  int32_t prefetched_mb_ = -1, prefetched_gather_ = -1;
  // The parameters outside the layers on Megatron stacks: the embedding (with virtual stage 0), the output
  // layer and final norm (with the last), and an MTP module's copy of the embedding (beside the output layer
  // on another stage, untied). Per part: the op after which its gradient is complete (the last micro-batch's
  // backward; ZeRO >= 2: each micro-batch's), its first forward and its parameter gather, -1 where none.
  enum VocabPart { kVocabEmbedding, kVocabHead, kVocabMtpEmbedding, kVocabParts };
  std::array<int32_t, kVocabParts> vocab_last_bwd_{-1, -1, -1}, vocab_first_fwd_{-1, -1, -1},
      vocab_gather_{-1, -1, -1};
  int32_t last_dp_op_ = -1;   // last op on the current stage's DP stream
  int32_t weight_cast_ = -1;  // the stage's FP8 weight cast (first forward waits for it)

  // A layer's parameters on this rank: replicated over the attention replicas (attention, dense FFN, shared
  // experts, router, norms; sharded by tp) and over the expert data-parallel group (routed experts).
  std::pair<double, double> local_params(int64_t layer) const {
    const ParamBreakdown lp = layer_params(m_, spec_of(layer));
    // An MTP module adds its projection [2h -> h] and three norms to its decoder layer.
    const double mtp_extra = layer >= n_main_ ? 2.0 * d(m_.hidden) * d(m_.hidden) + 3.0 * d(m_.hidden) : 0.0;
    return {(lp.total() - lp.routed_experts + mtp_extra) / d(tp_), lp.routed_experts / d(ep_ * etp_)};
  }
  // The rank's parameters of a part outside the layers on `stage` (0 where the stage does not hold it, or on
  // stacks other than Megatron's, whose executor keeps them whole and syncs them itself): a vocabulary shard
  // [vocab / tp, h] (VocabParallelEmbedding, the column-parallel output layer), the output layer with the
  // final norm, none when tied to an embedding on the same stage; the MTP stage's own embedding when the
  // output layer is untied and the embedding is elsewhere (gpt_model.py:173), as the memory model counts
  // them.
  double vocab_params(int part, int64_t stage) const {
    if (!megatron_ || !o_.embedding_and_head) return 0.0;
    const auto [first, last] = end_stages();
    const double table = d(m_.vocab) * d(m_.hidden) / d(tp_);
    switch (part) {
      case kVocabEmbedding:
        return stage == first ? table : 0.0;
      case kVocabHead:
        if (stage != last) return 0.0;
        return (m_.tied_embeddings && first == last ? 0.0 : table) + d(m_.hidden);
      default:
        return stage == last && first != last && mtp_ > 0 && !m_.tied_embeddings ? table : 0.0;
    }
  }
  // The main-gradient buffer's dtype: fp32, or bf16 under --grad-reduce-in-bf16.
  DType grad_buffer_dtype() const {
    return p_.compression.grad_sync == GradSync::kBf16ReduceScatter ? DType::kBf16 : DType::kFp32;
  }
  // The first and last pipeline stage: where the embedding and the output layer run.
  std::pair<int64_t, int64_t> end_stages() const {
    return {stage_of_virtual(0), stage_of_virtual(pp_ * vpp_ - 1)};
  }
  // A part's first forward op on the stage (its gathered parameters must be there first).
  void first_forward(int part, int32_t op) {
    if (vocab_first_fwd_[static_cast<size_t>(part)] < 0) vocab_first_fwd_[static_cast<size_t>(part)] = op;
  }
  // A part's gradient is complete after `op` when `mb` is the step's last micro-batch (ZeRO >= 2: after
  // each).
  void gradient_done(int part, int32_t mb, int32_t op) {
    if (mb == p_.num_micro_batches() - 1 || p_.data.zero >= 2)
      vocab_last_bwd_[static_cast<size_t>(part)] = op;
  }
  // A layer's parameters that Megatron keeps whole on every TP rank and whose gradients it all-reduces over
  // TP once per step: those marked sequence_parallel (the norms, the router: router.py, TE's norms; MLA's
  // duplicated down projections, extensions/transformer_engine.py TELinear at core_v0.14.0) and the q/k
  // norms under qk_layernorm (finalize_model_grads.py _allreduce_non_tensor_model_parallel_grads). MTP
  // modules add their three norms.
  // Returns {parameters, tensors}.
  std::pair<double, int> tp_replicated_params(int64_t layer) const {
    const LayerSpec& spec = spec_of(layer);
    const ParamBreakdown lp = layer_params(m_, spec);
    const auto& a = m_.attention;
    const bool mtp = layer >= n_main_;
    double n = lp.norms + lp.router + (mtp ? 3.0 * d(m_.hidden) : 0.0);
    int tensors = 2 + (spec.moe ? 1 : 0) + (mtp ? 3 : 0);
    if (a.qk_norm != QkNorm::kNone) {
      n += 2.0 * d(a.head_dim);
      tensors += 2;
    }
    if (a.kind == AttentionKind::kMla) {
      const auto& l = a.mla;
      n += d(l.q_lora_rank + l.kv_lora_rank);  // the latent norms
      tensors += 2;
      if (mla_down_ == MlaDownProj::kDuplicated) {
        n += mla_down_params(m_);
        tensors += 2;
      }
    }
    return {n, tensors};
  }
  // Megatron's finalize_model_grads after the stage's gradient synchronisation: the TP-replicated
  // gradients (above) flattened into one buffer (a cat), all-reduced over TP in the gradient buffer's dtype,
  // and copied back parameter by parameter (_flatten_dense_tensors, all_reduce, buf.copy_), on the compute
  // stream before the optimizer step. Returns the last op.
  int32_t emit_tp_replicated_grad_sync(int16_t stage, const std::vector<int64_t>& layers, bool final_norm,
                                       int32_t after) {
    double params = final_norm ? d(m_.hidden) : 0.0;
    int tensors = final_norm ? 1 : 0;
    for (int64_t l : layers) {
      const auto [n, t] = tp_replicated_params(l);
      params += n;
      tensors += t;
    }
    // The gradient buffer holds fp32, or bf16 under --grad-reduce-in-bf16.
    const DType grads = grad_buffer_dtype();
    const double bytes = params * bytes_of(grads);
    const int32_t flat = emit(mem(OpName::kTpGradCopy, MemOp::kActivation, 2.0 * bytes), stage, 0, -1, -1,
                              Phase::kOptimizer, {after, last_dp_op_});
    Op ar = coll(OpName::kTpGradAr, Collective::kAllReduce, CommGroup::kTp, bytes, grads);
    ar.stream = Stream::kCompute;
    const int32_t reduced = emit(ar, stage, 0, -1, -1, Phase::kOptimizer, {flat});
    return emit(mem(OpName::kTpGradCopy, MemOp::kActivation, 2.0 * bytes, Stream::kCompute, tensors), stage,
                0, -1, -1, Phase::kOptimizer, {reduced});
  }
  // The all-gather of a part outside the layers (vocab_params) from its replicas (ZeRO): BF16 (Megatron keeps
  // the embedding and output layer in BF16 under FP8 parameters too); -1 if none.
  int32_t emit_vocab_gather(int part, int16_t stage, Phase phase, Stream stream, int32_t after = -1) {
    const double params = vocab_params(part, stage);
    Op ag = base(OpName::kParamAg, OpKind::kCollective, stream);
    ag.comm = comm(Collective::kAllGather, CommGroup::kAttnReplica, params * 2.0, DType::kBf16);
    if (params <= 0 || ag.comm.group_size <= 1) return -1;
    return emit(ag, stage, 0, -1, -1, phase, {after});
  }
  // Megatron's all-reduce of the word embedding's gradient between the first and the last pipeline stage
  // when the last holds a copy of it (tied output layer, or an MTP module's embedding:
  // finalize_model_grads.py _allreduce_word_embedding_grads at d98e8a64, after the TP-replicated
  // gradients), the whole [vocab / tp, h] gradient in the gradient buffer's dtype over the two ranks, on the
  // compute stream before the optimizer step. Returns the last op (`after` where there is none).
  int32_t emit_embedding_grad_sync(int16_t stage, int32_t after) {
    const auto [first, last] = end_stages();
    if (!megatron_ || !o_.embedding_and_head || first == last || (stage != first && stage != last))
      return after;
    if (!m_.tied_embeddings && mtp_ == 0) return after;
    const DType grads = grad_buffer_dtype();
    Op ar = coll(OpName::kEmbedGradAr, Collective::kAllReduce, CommGroup::kPp,
                 d(m_.vocab) * d(m_.hidden) / d(tp_) * bytes_of(grads), grads);
    ar.comm.stride = static_cast<int32_t>((last - first) * (p_.gpus / pp_));
    ar.stream = Stream::kCompute;
    return emit(ar, stage, 0, -1, -1, Phase::kOptimizer, {after});
  }
  // All-gathers of a layer's parameters from their replicas (ZeRO): bf16, or FP8 under fp8_param_gather (a
  // layer's GEMM weights; its norms, biases and router, BF16 in Megatron, are under 0.1 % of its
  // parameters); returns the last op, -1 if none.
  int32_t emit_param_gather(int64_t layer, int16_t stage, int16_t chunk, int32_t mb, Phase phase,
                            Stream stream, int32_t after = -1) {
    const auto [dense, experts] = local_params(layer);
    const bool fp8 = fp8_params(p_);
    int32_t last = -1;
    for (auto [params, group] :
         {std::pair{dense, CommGroup::kAttnReplica}, std::pair{experts, CommGroup::kExpertDp}}) {
      Op ag = base(OpName::kParamAg, OpKind::kCollective, stream);
      ag.comm = fp8 ? comm(Collective::kAllGather, group, params * 1.0, DType::kFp8)
                    : comm(Collective::kAllGather, group, params * 2.0, DType::kBf16);
      if (params <= 0 || ag.comm.group_size <= 1) continue;
      last = emit(ag, stage, chunk, static_cast<int32_t>(layer), mb, phase, {after});
    }
    return last;
  }
};

int Builder::attention_fwd(int in, bool position_bias) {
  const auto& a = m_.attention;
  const int64_t h = m_.hidden;
  const double dt = bytes_of(dt_);
  const int64_t heads_r = a.num_heads / tp_;
  const int64_t kv_r = std::max<int64_t>(1, a.num_kv_heads / tp_);  // KV heads replicate when fewer than tp
  const int64_t qk = a.qk_dim(), v = a.v_dim();
  const bool mla = a.kind == AttentionKind::kMla;
  node_ = Node::kPreDispatch;

  // Megatron: TE fuses the attention norm into the QKV LayerNormLinear, so only MLA's separate norm is a
  // `layernorm` recompute module.
  module_ = mla ? kRecomputeLayernorm : 0;
  const Op attn_norm = walks(mem(OpName::kAttnNorm, MemOp::kNorm, 3.0 * d(t_ * h) * dt), d(t_), h);
  int x = mla ? record(attn_norm, {in}, true) : record_norm_into_linear(attn_norm, d(t_ * h), {in}, true);
  module_ = 0;
  // MLA's down projections under TP (MlaDownProj): Megatron-Core since 0.14 (multi_latent_attention.py,
  // 720c8b40d8 "MLA down proj switch back to TELinear") runs them as TE linears duplicated over TP on the
  // rank's sequence shard, and the up projections (column-parallel) gather the latents; the rotary key part
  // is gathered by Megatron itself (latent_gather). Before 0.14 they were column-parallel (column_down). Not
  // with DeepSeek-V3.2's indexer, which reads the gathered hidden state.
  const bool split_down = mla && tp_ > 1 && a.indexer.heads == 0;
  const bool latent_gather = split_down && mla_down_ == MlaDownProj::kDuplicated;
  const bool column_down = split_down && mla_down_ == MlaDownProj::kColumnParallel;
  if (!latent_gather && !column_down) x = tp_gather(x, OpName::kAttnAg, ub_);
  const int64_t tg = t_ * tp_;  // tokens entering the projections
  // Widths per token of q and of k+v after projection on this rank (before Ulysses splits heads).
  const int64_t q_width = heads_r * qk;
  // Qwen3-Next's q_proj also emits the output gate [heads_r * head_dim], applied after attention on this
  // rank.
  const int64_t q_proj_width = a.output_gate ? 2 * q_width : q_width;
  const int64_t kv_width = mla ? heads_r * (qk + v) : 2 * std::max(kv_r, sp_) * a.head_dim;
  int q = -1, kv = -1;
  int dsa = -1;  // DSA: the indexer's top-k selection, which the attention core waits for
  // MLA's q and kv latent norms: TE fuses each into its up projection (TELayerNormColumnParallelLinear under
  // qk_layernorm; q_layernorm and kv_layernorm are IdentityOp, gpt_layer_specs.py at 7094270 and
  // core_v0.14.0), one norm kernel over the rows the linear receives, inside the mla_up_proj checkpoint
  // (qkv_up_proj_and_rope_apply). moerun normalises the gathered latents alike.
  auto latent_norm = [&](int latent, int64_t rows, int64_t width) {
    module_ = kRecomputeMlaUpProj;
    const int y = record_norm_into_linear(
        walks(mem(OpName::kMlaLatentNorm, MemOp::kNorm, 3.0 * d(rows * width) * dt), d(rows), width),
        d(rows * width), {latent});
    module_ = 0;
    return y;
  };
  // An up projection: a column-parallel TE linear that normalises its latent shard, gathers it and projects
  // it, recomputed with its norm and gather under mla_up_proj.
  auto up = [&](int latent, int64_t width, OpName name, int64_t out) {
    const int n = latent_norm(latent, t_, width);
    module_ = kRecomputeMlaUpProj;
    const int g = tp_gather(n, OpName::kAttnAg, false, width);
    const int y = record(linear_after_norm(gemm(name, tg, out, width)), {g});
    module_ = 0;
    return y;
  };
  if (column_down) {
    const auto& l = a.mla;
    // Megatron-Core before 0.14 (gpt_layer_specs.py and multi_latent_attention.py:381-411 at 7094270): each
    // down projection is a TE column-parallel linear that gathers the hidden state itself (and again for its
    // weight gradient) and projects its share of the latent columns; Megatron gathers the shares over TP
    // (gather_from_tensor_model_parallel_region: an all-gather, then a cat into the latent's columns) and
    // keeps the rank's sequence shard (scatter_to_sequence_parallel_region: a slice, copied where kv's
    // latent is a column view of the output; mappings.py _split_along_first_dim .contiguous()). In backward
    // the slice's gradient is gathered over the sequence (an all-gather of the latent gradient, bf16) and the
    // cat's split keeps the rank's columns (a copy); kv's split of the latent and rope key concatenates their
    // gradients first (a copy). The rope key stays whole from the gathered output: no gather of its own.
    // `kv`: the down projection whose output splits into the latent and the rope key.
    auto down = [&](OpName name, int64_t width, int64_t back_width, bool kv_split) {
      const int gathered = tp_gather(x, OpName::kAttnAg, false);
      const int y = record(gemm(name, tg, (width + tp_ - 1) / tp_, h), {gathered});
      const int ag =
          record(coll(OpName::kAttnAg, Collective::kAllGather, CommGroup::kTp, d(tg * width) * bytes_of(dt_)),
                 {y}, true);
      LocalOp& g = layer_ops_[static_cast<size_t>(ag)];
      g.backward_same_way = true;
      g.backward_bytes = d(tg * back_width) * bytes_of(dt_);
      const double cat_bytes = 2.0 * d(tg * width) * dt, shard_copy = 2.0 * d(t_ * back_width) * dt;
      const int cat =
          record(mem(OpName::kMlaLatentCat, MemOp::kActivation, cat_bytes + (kv_split ? shard_copy : 0.0),
                     Stream::kCompute, kv_split ? 2 : 1),
                 {ag});
      const double split = 2.0 * d(tg) * d(width) / d(tp_) * dt;
      backward_as(cat, split + (kv_split ? cat_bytes : 0.0), kv_split ? 2 : 1);
      return cat;
    };
    if (l.q_lora_rank > 0) {
      q = up(down(OpName::kQDown, l.q_lora_rank, l.q_lora_rank, false), l.q_lora_rank, OpName::kQUp, q_width);
    } else {
      q = record(gemm(OpName::kQProj, tg, q_proj_width, h), {tp_gather(x, OpName::kAttnAg, false)});
    }
    const int kvd = down(OpName::kKvDown, l.kv_lora_rank + l.qk_rope_head_dim, l.kv_lora_rank, true);
    kv = up(kvd, l.kv_lora_rank, OpName::kKvUp, heads_r * (l.qk_nope_head_dim + v));
  } else if (latent_gather) {
    const auto& l = a.mla;
    if (l.q_lora_rank > 0) {
      const int qd = record(gemm(OpName::kQDown, t_, l.q_lora_rank, h), {x});
      q = up(qd, l.q_lora_rank, OpName::kQUp, q_width);
    } else {
      q = record(gemm(OpName::kQProj, tg, q_proj_width, h), {tp_gather(x, OpName::kAttnAg, false)});
    }
    const int kvd = record(gemm(OpName::kKvDown, t_, l.kv_lora_rank + l.qk_rope_head_dim, h), {x});
    kv = up(kvd, l.kv_lora_rank, OpName::kKvUp, heads_r * (l.qk_nope_head_dim + v));
    // The rotary key part, [t, qk_rope_head_dim] of the down projection's output, gathered by Megatron in
    // BF16 before RoPE joins it to the keys (in the graph after the up projection, whose stream it shares).
    kv = record(coll(OpName::kAttnAg, Collective::kAllGather, CommGroup::kTp,
                     d(tg * l.qk_rope_head_dim) * bytes_of(dt_)),
                {kv}, true);
  } else if (mla) {
    const auto& l = a.mla;
    int qd = x;
    if (l.q_lora_rank > 0) {
      qd = record(gemm(OpName::kQDown, tg, l.q_lora_rank, h), {x});
      const int qn = latent_norm(qd, tg, l.q_lora_rank);
      module_ = kRecomputeMlaUpProj;
      q = record(linear_after_norm(gemm(OpName::kQUp, tg, q_width, l.q_lora_rank)), {qn});
      module_ = 0;
    } else {
      q = record(gemm(OpName::kQProj, tg, q_proj_width, h), {x});
    }
    const int kvd = record(gemm(OpName::kKvDown, tg, l.kv_lora_rank + l.qk_rope_head_dim, h), {x});
    const int kvn = latent_norm(kvd, tg, l.kv_lora_rank);
    module_ = kRecomputeMlaUpProj;
    kv =
        record(linear_after_norm(gemm(OpName::kKvUp, tg, heads_r * (l.qk_nope_head_dim + v), l.kv_lora_rank)),
               {kvn});
    module_ = 0;
    if (a.indexer.heads > 0) dsa = indexer_fwd(x, qd, tg);
  }
  const double rope_bytes =
      2.0 * d(tg) * d(heads_r + kv_r) * d(mla ? a.mla.qk_rope_head_dim : a.head_dim) * dt;
  // QK-norm (Qwen3, OLMoE, Hunyuan, Llama 4): a norm over q and k before RoPE.
  const double qk_norm_bytes =
      a.qk_norm == QkNorm::kNone ? 0.0 : 2.0 * d(tg) * d(heads_r + kv_r) * d(a.head_dim) * dt;
  auto qk_norm = [&](int src) {
    return qk_norm_bytes > 0 ? record(walks(mem(OpName::kQkNorm, MemOp::kNorm, qk_norm_bytes),
                                            d(tg) * d(heads_r + kv_r), a.head_dim),
                                      {src}, true)
                             : src;
  };
  // RoPE over q and k, or (T5 relative positions) nothing: the bias enters the attention kernel.
  const bool rotary = m_.position == PositionKind::kRope;
  auto rope = [&](std::vector<int> inputs) -> std::vector<int> {
    if (!rotary) return inputs;
    const int64_t rope_dim = mla ? a.mla.qk_rope_head_dim : a.head_dim;
    return {record(
        walks(mem(OpName::kRope, MemOp::kRope, rope_bytes), d(tg), (heads_r + kv_r) * rope_dim, rope_dim),
        std::move(inputs))};
  };

  std::vector<int> ready;  // ops that lay q, k, v out for attention on this rank
  int64_t ta = tg;         // tokens per rank entering attention
  int64_t heads_a = heads_r;
  if (sp_ > 1) {
    ta = tg * sp_;
    heads_a = heads_r / sp_;
    const double q_bytes = d(tg * q_width) * dt, kv_bytes = d(tg * kv_width) * dt;
    if (!mla && p_.overlap.intra_op) {
      // GEMM + all-to-all: each output tile is written to its destination rank from the GEMM epilogue.
      Op f = fused(OpName::kQkvProjA2a, gemm(OpName::kQkvProj, tg, q_proj_width + kv_width, h),
                   comm(Collective::kAllToAll, CommGroup::kSp, q_bytes + kv_bytes, dt_));
      ready = {record(f, {x})};
    } else if (p_.overlap.inter_op) {
      // K/V projection and its all-to-all first, beside the Q projection (MegaScale-MoE §4.1).
      if (!mla) kv = record(gemm(OpName::kKvProj, tg, kv_width, h), {x});
      const int kv_a2a = record(coll(OpName::kKvA2a, Collective::kAllToAll, CommGroup::kSp, kv_bytes), {kv});
      if (!mla) q = record(gemm(OpName::kQProj, tg, q_proj_width, h), {x});
      if (mla) module_ = kRecomputeMlaUpProj;
      const std::vector<int> r = rope({qk_norm(q)});
      module_ = 0;
      ready = {record(coll(OpName::kQA2a, Collective::kAllToAll, CommGroup::kSp, q_bytes), r), kv_a2a};
    } else {
      if (!mla)
        q = kv = record(linear_after_norm(gemm(OpName::kQkvProj, tg, q_proj_width + kv_width, h)), {x});
      if (mla) module_ = kRecomputeMlaUpProj;
      const std::vector<int> r = rope({qk_norm(q), kv});
      module_ = 0;
      ready = {record(coll(OpName::kQkvA2a, Collective::kAllToAll, CommGroup::kSp, q_bytes + kv_bytes), r)};
    }
  } else {
    if (!mla) {
      q = kv = record(
          column_linear(linear_after_norm(gemm(OpName::kQkvProj, tg, q_proj_width + kv_width, h)), ub_), {x});
    }
    if (mla) module_ = kRecomputeMlaUpProj;
    ready = rope({qk_norm(q), kv});
    module_ = 0;
  }

  if (dsa >= 0) ready.push_back(dsa);
  // T5: the stack's first layer expands its [buckets, heads] table into this rank's [heads, s, s] bias, read
  // by every self-attention of the stack (that read, inside the attention kernel, is not priced).
  if (position_bias) {
    ready.push_back(
        record(mem(OpName::kPositionBias, MemOp::kActivation, d(heads_r) * d(seq_) * d(seq_) * dt), {}));
  }

  // Attention over the full sequence for this rank's heads; CP splits the queries into 2*cp balanced chunks.
  // Per-layer sliding windows are applied by record_layer.
  auto i32 = [](int64_t v32) { return static_cast<int32_t>(v32); };
  // K/V heads after Ulysses: the rank's kv_r, replicated up to sp before the all-to-all; MLA decompresses
  // K and V per query head.
  const int64_t kv_heads_a = mla ? heads_a : std::max(kv_r, sp_) / sp_;
  const AttentionShape shape{.batch = i32(p_.micro_batch),
                             .seq_q = i32(seq_ / cp_),
                             .seq_kv = i32(seq_),
                             .heads = i32(heads_a),
                             .qk_dim = i32(qk),
                             .v_dim = i32(v),
                             .window = 0,
                             .causal = causal_,
                             .kv_heads = static_cast<int16_t>(kv_heads_a)};
  const double keys = causal_ ? mean_attended_keys(seq_, 0) : d(seq_);
  const double attn_flops = d(p_.micro_batch * seq_ / cp_) * 2.0 * d(heads_a) * d(qk + v) * keys;
  Op core = base(OpName::kAttnCore, OpKind::kAttention, Stream::kCompute);
  core.attn = shape;
  core.flops = attn_flops;
  core.hbm_bytes = d(ta) * d(heads_a) * d(2 * qk + 2 * v) * dt;
  int att;
  if (cp_ > 1) {
    const double kv_cp_bytes = d(ta * cp_) * d(kv_width) / d(std::max<int64_t>(1, sp_)) * dt;
    const int ag = record(coll(OpName::kCpKvAg, Collective::kAllGather, CommGroup::kCp, kv_cp_bytes), ready);
    Op local = core;
    local.name = static_cast<uint16_t>(OpName::kAttnCoreLocal);
    local.flops = attn_flops / d(cp_);
    local.hbm_bytes = core.hbm_bytes / d(cp_);
    module_ = kRecomputeCoreAttn;
    const int l = record(local, ready);
    core.flops = attn_flops - local.flops;
    att = record(core, {ag, l});
    module_ = 0;
  } else {
    module_ = kRecomputeCoreAttn;
    att = record(core, ready);
    module_ = 0;
  }
  // Qwen3-Next's output gate, x * sigmoid(gate) on the core's output (attention.py
  // _torch_compiled_output_gate at bbc762d5, one compiled kernel): reads the output and the gate, writes the
  // product; its backward reads both and the incoming gradient and writes both gradients.
  if (a.output_gate) {
    const double elements = d(ta) * d(heads_a) * d(v);
    att = record(
        walks(mem(OpName::kAttnOutputGate, MemOp::kActivation, 3.0 * elements * dt), d(ta), heads_a * v),
        {att});
    backward_as(att, 5.0 * elements * dt, 1);
  }

  int out;
  if (sp_ > 1) {
    const double bytes = d(ta * heads_a * v) * dt;
    if (p_.overlap.intra_op) {
      out = record(fused(OpName::kA2aOutProj, gemm(OpName::kOutProj, tg, h, heads_r * v),
                         comm(Collective::kAllToAll, CommGroup::kSp, bytes, dt_)),
                   {att});
    } else {
      const int a2a =
          record(coll(OpName::kAttnOutA2a, Collective::kAllToAll, CommGroup::kSp, bytes), {att}, true);
      out = record(gemm(OpName::kOutProj, tg, h, heads_r * v), {a2a});
    }
  } else {
    const Op proj = gemm(OpName::kOutProj, tg, h, heads_r * v);
    out = record(ub_ ? ub_linear(proj, Collective::kReduceScatter) : proj, {att});
  }
  if (tp_ > 1 && !ub_)
    out = record(coll(OpName::kAttnRs, Collective::kReduceScatter, CommGroup::kTp, d(tg * h) * dt), {out});
  // The residual add after attention (Megatron's fused bias-dropout-add): read two [t, h], write one.
  if (o_.eager_framework)
    out = record(walks(mem(OpName::kResidualAdd, MemOp::kActivation, 3.0 * d(t_ * h) * dt), d(t_), h), {out},
                 false, true);
  return out;
}

// An encoder-decoder's cross-attention (T5 EncDecAttention, Megatron-Core's cross_attention with
// sequence parallelism): a norm of the decoder's tokens, q from them, k and v from the encoder's output
// (all-gathered over TP like any sequence-parallel input), attention of every target to every encoder token
// without a mask or position bias, and the out-projection reduce-scattered back.
int Builder::cross_attention_fwd(int in) {
  const auto& a = m_.attention;
  const int64_t h = m_.hidden;
  const double dt = bytes_of(dt_);
  const int64_t heads_r = a.num_heads / tp_;
  const int64_t kv_r = std::max<int64_t>(1, a.num_kv_heads / tp_);
  const int64_t hd = a.head_dim;
  const int64_t enc_seq = p_.seq_len, enc_t = t_seq_;
  node_ = Node::kPreDispatch;
  int x = record(walks(mem(OpName::kCrossNorm, MemOp::kNorm, 3.0 * d(t_ * h) * dt), d(t_), h), {in}, true);
  int enc = -1;  // the encoder output: the layer input stands for it (it precedes every decoder layer)
  int64_t tg = t_, tg_enc = enc_t;
  if (tp_ > 1) {
    x = record(coll(OpName::kCrossAg, Collective::kAllGather, CommGroup::kTp, d(t_ * tp_ * h) * dt), {x},
               true);
    enc = record(coll(OpName::kCrossKvAg, Collective::kAllGather, CommGroup::kTp, d(enc_t * tp_ * h) * dt),
                 {enc}, true);
    tg = t_ * tp_;
    tg_enc = enc_t * tp_;
  }
  const int q = record(gemm(OpName::kCrossQProj, tg, heads_r * hd, h), {x});
  const int kv = record(gemm(OpName::kCrossKvProj, tg_enc, 2 * kv_r * hd, h), {enc});
  auto i32 = [](int64_t v32) { return static_cast<int32_t>(v32); };
  Op core = base(OpName::kCrossAttnCore, OpKind::kAttention, Stream::kCompute);
  core.attn = {.batch = i32(p_.micro_batch),
               .seq_q = i32(seq_),
               .seq_kv = i32(enc_seq),
               .heads = i32(heads_r),
               .qk_dim = i32(hd),
               .v_dim = i32(hd),
               .window = 0,
               .causal = false,
               .kv_heads = static_cast<int16_t>(kv_r)};
  core.flops = d(p_.micro_batch * seq_) * 2.0 * d(heads_r) * d(2 * hd) * d(enc_seq);
  core.hbm_bytes = (d(tg) * d(heads_r) * d(2 * hd) + d(tg_enc) * d(2 * kv_r * hd)) * dt;
  module_ = kRecomputeCoreAttn;
  const int att = record(core, {q, kv});
  module_ = 0;
  int out = record(gemm(OpName::kCrossOutProj, tg, h, heads_r * hd), {att});
  if (tp_ > 1)
    out = record(coll(OpName::kCrossRs, Collective::kReduceScatter, CommGroup::kTp, d(tg * h) * dt), {out});
  if (o_.eager_framework)
    out = record(walks(mem(OpName::kResidualAdd, MemOp::kActivation, 3.0 * d(t_ * h) * dt), d(t_), h), {out},
                 false, true);
  return out;
}

// DeepSeek-V3.2's lightning indexer on this rank's heads: q from the q latent [tg, q_lora] -> [tg, heads_r *
// dim], one shared key [tg, dim] and per-head weights [tg, heads_r] from h; the scores of every query against
// every causal key as one GEMM [tg * heads_r, dim] x [dim, L] (L the mean causal key count, so its FLOPs are
// the model's), and the top-k selection reading the fp32 weighted scores [tg, L]. Priced in bf16; the gather
// of the indexer keys across sequence shards is not priced (model_notes.h says so).
int Builder::indexer_fwd(int x, int q_latent, int64_t tg) {
  const auto& ix = m_.attention.indexer;
  const int64_t h = m_.hidden;
  const int64_t heads_r = std::max<int64_t>(1, ix.heads / tp_);
  const int64_t q_in = m_.attention.mla.q_lora_rank > 0 ? m_.attention.mla.q_lora_rank : h;
  const int q = record(gemm(OpName::kIndexerProj, tg, heads_r * ix.head_dim, q_in), {q_latent});
  const int kw = record(gemm(OpName::kIndexerProj, tg, ix.head_dim + heads_r, h), {x});
  const auto keys = static_cast<int64_t>(std::ceil(mean_attended_keys(p_.seq_len, 0)));
  const int sc = record(gemm(OpName::kIndexerScore, tg * heads_r, keys, ix.head_dim), {q, kw});
  return record(mem(OpName::kIndexerTopk, MemOp::kRouting, 4.0 * d(tg) * d(keys)), {sc}, false, true);
}

// A Gated DeltaNet or Mamba-2 mixer (ModelSpec's LinearAttentionSpec / MambaSpec): its norm, the TP
// all-gather, the in-projection [tg, in_width / tp], the depthwise causal conv over its conv channels, under
// Ulysses an all-to-all of the projections by heads, the chunked scan, the gated output norm, the all-to-all
// back, the out-projection [tg, out_width / tp] -> h and the TP reduce-scatter. The scan is memory-bound over
// its inputs, output and fp32 chunk states [b, s / chunk, heads, dk, dv] written and read once (assumed;
// model_notes.h).
int Builder::recurrent_mixer_fwd(int in, MixerKind kind) {
  const bool gdn = kind == MixerKind::kLinearAttention;
  const auto& g = m_.linear_attention;
  const auto& sm = m_.mamba;
  const int64_t h = m_.hidden;
  const double dt = bytes_of(dt_);
  const int64_t in_w = (gdn ? g.in_proj_width() : sm.in_proj_width()) / tp_;
  const int64_t conv_w = (gdn ? g.conv_channels() : sm.conv_channels()) / tp_;
  const int64_t gates_w = (gdn ? 2 * g.value_heads : sm.heads) / tp_;
  const int64_t out_w = (gdn ? g.value_dim() : sm.inner()) / tp_;
  const int64_t heads_r = (gdn ? g.value_heads : sm.heads) / tp_;
  const int64_t dk = gdn ? g.key_head_dim : sm.state_size, dv = gdn ? g.value_head_dim : sm.head_dim;
  const int64_t chunk = gdn ? g.chunk : sm.chunk;
  node_ = Node::kPreDispatch;
  module_ = 0;
  // The Mamba mixer's and the Gated DeltaNet's in_proj are TE LayerNormLinears (hybrid_layer_specs.py at
  // d98e8a64): the input norm is fused into them.
  int x = record_norm_into_linear(walks(mem(OpName::kAttnNorm, MemOp::kNorm, 3.0 * d(t_ * h) * dt), d(t_), h),
                                  d(t_ * h), {in}, true);
  // Megatron's Mamba mixer builds its projections with TE's fc1 and fc2 userbuffers
  // (ssm/mamba_mixer.py:225, 315 at 1e057005); the Gated DeltaNet is not in that source.
  const bool ub = ub_ && !gdn;
  x = tp_gather(x, OpName::kAttnAg, ub);
  const int64_t tg = t_ * tp_;
  int y = record(column_linear(linear_after_norm(gemm(OpName::kMixerInProj, tg, in_w, h)), ub), {x});
  // Megatron-Core's Gated DeltaNet as gated_delta_net.py runs it (forward, lines 301-400 at bbc762d5): eager
  // PyTorch around FLA's kernels. Its layout copies, l2norm and gate math are kernels of their own.
  const bool fla = gdn && o_.eager_framework;
  if (fla) {
    // qkv.transpose(1, 2).contiguous(): the conv channels to [b, d, s] for causal_conv1d.
    y = record(mem(OpName::kMixerLayout, MemOp::kActivation, 2.0 * d(tg * conv_w) * dt), {y}, true);
  }
  // Megatron's Mamba mixer under mamba_split_conv1d_scan_combined: zxBCdt to [b, s, d] (.contiguous() copies
  // only with more than one sequence per micro-batch), causal_conv1d over the channel-last x, B, C; its
  // backward runs the conv forward again and causal_conv1d's backward (reads x and dx_conv, writes dx) with
  // the fp32 zero-filled weight and bias gradients.
  const bool ssd = !gdn && o_.eager_framework;
  const bool batched = p_.micro_batch > 1;
  if (ssd && batched)
    y = record(mem(OpName::kMixerLayout, MemOp::kActivation, 2.0 * d(tg * in_w) * dt), {y}, true);
  y = record(mem(OpName::kMixerConv, MemOp::kActivation, 2.0 * d(tg * conv_w) * dt), {y}, true);
  if (ssd) backward_as(y, 5.0 * d(tg * conv_w) * dt, 2 + 1 + (sm.conv_bias ? 1 : 0));
  if (sp_ > 1)
    y = record(coll(OpName::kMixerA2a, Collective::kAllToAll, CommGroup::kSp, d(tg * in_w) * dt), {y}, true);
  // After the all-to-all: the whole sequence (ta = tg * sp tokens) for heads_r / sp heads.
  const double ta = d(tg * sp_);
  const double heads_a = d(heads_r) / d(sp_);
  if (fla) {
    // The conv output back to [b, s, d] and split: q, k (their .contiguous() before l2norm) and v copied,
    // the gate, beta and alpha slices of the in-projection copied (.contiguous()), q and k repeated to the
    // value heads (repeat_interleave: read once, written value_heads / key_heads times) where there are more
    // value heads; with more than one sequence per micro-batch, the norm's output transposed back as well.
    const double qk = d(g.key_heads * g.key_head_dim / tp_) / d(sp_);
    const double r = d(g.value_heads / std::max<int64_t>(1, g.key_heads));
    const bool repeat = g.value_heads > g.key_heads;
    const double per_token = 2.0 * d(conv_w + out_w + gates_w) / d(sp_) +
                             (repeat ? 2.0 * (1.0 + r) * qk : 0.0) +
                             (batched ? 2.0 * d(out_w) / d(sp_) : 0.0);
    y = record(mem(OpName::kMixerLayout, MemOp::kActivation, ta * per_token * dt, Stream::kCompute,
                   4 + 2 + (repeat ? 2 : 0) + (batched ? 1 : 0)),
               {y}, true);
    // FLA's l2norm of q and k (fla/modules/l2norm.py): reads x, writes y, one kernel each; backward reads
    // x, y's rstd and dy and writes dx.
    const int n =
        record(mem(OpName::kMixerQkNorm, MemOp::kNorm, 4.0 * ta * qk * dt, Stream::kCompute, 2), {y}, true);
    backward_as(n, 6.0 * ta * qk * dt, 2);
    // g = -A_log.exp() * softplus(alpha.float() + dt_bias) in fp32 and beta.sigmoid(), per token and value
    // head: exp and neg of A_log, the cast, the add, softplus, the product and the sigmoid, seven kernels
    // (2 + 4, 4 + 4, 4 + 4, 4 + 4, 2 + 2 bytes). Their autograd adds the reductions of A_log's and dt_bias's
    // gradients over the tokens: nine kernels.
    const int gt = record(
        mem(OpName::kMixerGates, MemOp::kActivation, 34.0 * ta * heads_a, Stream::kCompute, 7), {n}, true);
    backward_as(gt, 50.0 * ta * heads_a, 9);
    y = gt;
  }
  const double chunks = std::ceil(d(p_.seq_len) / d(chunk));
  const double groups_a = d(sm.groups / tp_) / d(sp_);  // Mamba-2's B / C groups after the all-to-all
  Op scan;
  if (fla) {
    // FLA's chunked gated delta rule: its bytes per token and value head (fla_scan_forward_bytes); its
    // recurrence over the chunks is one chain per (sequence, head, 64-wide value block) that the cost model
    // times with the stack's recurrent_scan.chunk_us: the walked shape holds the chunks (m), the chains
    // (n) and the kernels that walk them one chunk after another (k).
    scan = mem(OpName::kMixerScan, MemOp::kActivation,
               ta * heads_a * fla_scan_forward_bytes(d(dk), d(dv), d(chunk)), Stream::kCompute,
               kFlaScanForwardKernels);
    scan.gemm = {static_cast<int64_t>(chunks),
                 p_.micro_batch * (heads_r / sp_) * ((dv + kFlaValueBlock - 1) / kFlaValueBlock),
                 kFlaScanForwardChains, 1};
  } else if (ssd) {
    // mamba_ssm's SSD kernels (ssd_scan_forward_bytes) over the rank's heads and groups after the
    // all-to-all; no chain term: its one walk over the chunks (_state_passing_fwd) reads and writes a
    // state per step with no matmul.
    scan = mem(OpName::kMixerScan, MemOp::kActivation,
               ta * ssd_scan_forward_bytes(heads_a, d(dv), groups_a, d(dk), d(chunk)), Stream::kCompute,
               kSsdForwardKernels);
  } else {
    const double states = 2.0 * d(p_.micro_batch) * chunks * d(heads_r) * d(dk * dv) * 4.0 / d(sp_);
    scan =
        mem(OpName::kMixerScan, MemOp::kActivation, ta * d(conv_w + gates_w + out_w) / d(sp_) * dt + states);
  }
  scan.flops = ta * heads_a * chunked_scan_flops(dk, dv, chunk);
  y = record(scan, {y}, true);
  if (fla)
    backward_as(y, ta * heads_a * fla_scan_backward_bytes(d(dk), d(dv), d(chunk)), kFlaScanBackwardKernels);
  if (ssd) {
    backward_as(y, ta * ssd_scan_backward_bytes(heads_a, d(dv), groups_a, d(dk), d(chunk)),
                kSsdBackwardKernels);
    // y back to [s, b, d] (rearrange(...).contiguous(): a copy only with more than one sequence).
    if (batched)
      y = record(mem(OpName::kMixerLayout, MemOp::kActivation, 2.0 * ta * d(out_w) / d(sp_) * dt), {y}, true);
  }
  y = record(mem(OpName::kMixerNorm, MemOp::kNorm, 3.0 * ta * d(out_w) / d(sp_) * dt), {y}, true);
  if (sp_ > 1) {
    y = record(coll(OpName::kMixerOutA2a, Collective::kAllToAll, CommGroup::kSp, d(tg * out_w) * dt), {y},
               true);
  }
  y = row_linear(gemm(OpName::kMixerOutProj, tg, h, out_w), y, OpName::kAttnRs, ub);
  if (o_.eager_framework)
    y = record(walks(mem(OpName::kResidualAdd, MemOp::kActivation, 3.0 * d(t_ * h) * dt), d(t_), h), {y},
               false, true);
  return y;
}

int Builder::dense_ffn_fwd(int in) {
  const int64_t h = m_.hidden, f = m_.dense_ffn;
  const double dt = bytes_of(dt_);
  node_ = Node::kMlp;
  module_ = kRecomputeMlp;  // the whole dense MLP (its norm is fused into FC1's LayerNormLinear)
  int x = record_norm_into_linear(walks(mem(OpName::kFfnNorm, MemOp::kNorm, 3.0 * d(t_ * h) * dt), d(t_), h),
                                  d(t_ * h), {in}, true);
  x = tp_gather(x, OpName::kFfnAg, ub_);
  const int64_t tg = t_ * tp_;
  const int64_t f_r = f / tp_;
  int y = record(column_linear(linear_after_norm(gemm(OpName::kFc13, tg, glu_ * f_r, h)), ub_), {x});
  y = glu_act(OpName::kAct, y, d(tg), f_r);
  y = row_linear(gemm(OpName::kFc2, tg, h, f_r), y, OpName::kFfnRs, ub_);
  module_ = 0;
  if (o_.eager_framework)
    y = record(walks(mem(OpName::kResidualAdd, MemOp::kActivation, 3.0 * d(t_ * h) * dt), d(t_), h), {y},
               false, true);
  return y;
}

// Megatron's alltoall (and allgather) dispatcher around the experts, as token_dispatcher.py runs it: an
// all-gather of per-expert counts, the host's wait for them, the token and probs all-to-alls of one row per
// (token, expert) pair, the ETP all-gather and reduce-scatter, the chunk sorts by local expert, the experts,
// and the combine all-to-all. Returns the combine's last op.
int Builder::moe_dispatch_megatron(int r, double rows, double ep_rows, int64_t f_r, int64_t local_experts) {
  const auto& e = m_.moe;
  const int64_t h = m_.hidden, k = e.top_k;
  const double dt = bytes_of(dt_);
  const double probs_bytes = this->probs_bytes();  // router probabilities travel in the router dtype
  const bool gather_mode = p_.experts.dispatch == Dispatch::kAllGather;
  int y;
  node_ = Node::kPreDispatch;
  if (gather_mode) {
    // MoEAllGatherTokenDispatcher: all-gather of routing map, probs and tokens over ETP x EP, a blocking
    // count copy, a local permute, the experts, a reduce-scatter in the probs dtype over ETP x EP.
    Op ag = coll(OpName::kDispatchAg, Collective::kAllGather, CommGroup::kEp,
                 d(t_ * ep_ * etp_) * (d(h) * dt + d(e.num_experts) * (probs_bytes + 1.0)));
    ag.comm.group_size = static_cast<int32_t>(ep_ * etp_);
    ag.comm.stride = 1;
    node_ = Node::kDispatch;
    y = record(ag, {r}, true);
    node_ = Node::kMlp;
    y = record(host_wait(8.0 * d(e.num_experts)), {y}, false, true);
    y = record(mem(OpName::kScatter, MemOp::kPermute, 2.0 * ep_rows * d(h) * dt, Stream::kCompute, 2), {y},
               true);
  } else {
    // Counts of tokens per expert, all-gathered over ETP x EP (int64 per expert and rank); the host copies
    // them before the permute (cuda_dtoh_point before_permutation_1) and waits before the all-to-all. Padded
    // to capacity the splits are fixed: no counts, no copy, no wait (preprocess returns before them and
    // _maybe_dtoh_and_synchronize skips drop_and_pad, token_dispatcher.py:348-371, 669-675 at 7094270c).
    const bool padded = p_.routing.pad_to_capacity;
    // The preprocess (counts, their all-gather and the local permute) in the router's graph under
    // moe_preprocess; the count copy then waits until after the graph (cuda_dtoh_point before_ep_alltoall,
    // token_dispatcher.py:439-444 at core_v0.16.0).
    const bool outer_graph = graph_;
    if (p_.cuda_graphs & kGraphMoePreprocess) graph_ = true;
    int c = r;
    if (!padded) {
      Op counts = coll(OpName::kDispatchCounts, Collective::kAllGather, CommGroup::kEp,
                       8.0 * d(e.num_experts * ep_ * etp_));
      counts.comm.group_size = static_cast<int32_t>(ep_ * etp_);
      counts.comm.stride = 1;
      counts.stream = Stream::kCompute;
      c = record(counts, {r}, false, true);
    }
    y = record(walks(mem(OpName::kPermute, MemOp::kPermute, 2.0 * d(t_ * k * h) * dt, Stream::kCompute, 2),
                     d(t_), h, k),
               {r}, true);
    graph_ = outer_graph;
    node_ = Node::kDispatch;
    const int sync = o_.dispatcher_host_sync && !padded
                         ? record(host_wait(8.0 * d(e.num_experts * ep_)), {c}, false, true)
                         : c;
    y = record(routed(coll(OpName::kDispatchA2a, Collective::kAllToAll, CommGroup::kEp, rows * d(h) * dt)),
               {y, sync}, true);
    // The probs all-to-all (the router dtype), beside the tokens.
    y = record(routed(coll(OpName::kProbsA2a, Collective::kAllToAll, CommGroup::kEp, rows * probs_bytes)),
               {y}, true);
    if (shared_pending_ >= 0) shared_pending_ = shared_fc1(shared_pending_);
  }
  node_ = Node::kMlp;
  if (etp_ > 1 && !gather_mode) {
    y = record(
        coll(OpName::kEtpAg, Collective::kAllGather, CommGroup::kEtp, ep_rows * (d(h) * dt + probs_bytes)),
        {y}, true);
  }
  if (!gather_mode && local_experts > 1) {
    y = record(mem(OpName::kSortChunks, MemOp::kPermute, 2.0 * ep_rows * (d(h) * dt + probs_bytes),
                   Stream::kCompute, 2),
               {y}, true);
  }
  y = expert_mlp(y, ep_rows, f_r, local_experts, fp8_pad_ == Fp8Padding::kRouter);  // alltoall: padded
  if (!gather_mode && local_experts > 1) {
    y = record(mem(OpName::kUnsortChunks, MemOp::kPermute, 2.0 * ep_rows * d(h) * dt, Stream::kCompute, 2),
               {y});
  }
  if (etp_ > 1 && !gather_mode) {
    // Megatron reduce-scatters the expert outputs in the probs dtype.
    y = record(
        coll(OpName::kEtpRs, Collective::kReduceScatter, CommGroup::kEtp, ep_rows * d(h) * probs_bytes), {y});
  }
  node_ = Node::kCombine;
  if (gather_mode) {
    y = record(mem(OpName::kGather, MemOp::kPermute, 2.0 * ep_rows * d(h) * dt, Stream::kCompute, 2), {y});
    Op rs = coll(OpName::kCombineRs, Collective::kReduceScatter, CommGroup::kEp,
                 d(t_ * ep_ * etp_ * h) * probs_bytes);
    rs.comm.group_size = static_cast<int32_t>(ep_ * etp_);
    rs.comm.stride = 1;
    y = record(rs, {y});
  } else {
    y = record(routed(coll(OpName::kCombineA2a, Collective::kAllToAll, CommGroup::kEp, rows * d(h) * dt)),
               {y});
    if (shared_pending_ >= 0) shared_pending_ = shared_fc2(shared_pending_);
  }
  return y;
}

// Megatron's --moe-shared-expert-overlap runs the shared experts on their own CUDA stream with their TP
// gather and reduce-scatter, and turns TE's userbuffers off for their linears (shared_experts.py:92-101,
// 154-277 at core_v0.16.0); autograd runs their backward on that stream too. While a part records: the
// shared experts' recompute modules, and their exchanges on their stream under that overlap.
struct Builder::SharedPart {
  Builder& b;
  const uint16_t module;
  const Stream comm_stream;
  const bool ub;         // TE's userbuffers for their linears
  const int64_t fs, tg;  // the shared FFN width per rank; the TP-gathered tokens
  explicit SharedPart(Builder& builder)
      : b(builder),
        module(builder.module_),
        comm_stream(builder.comm_stream_),
        ub(builder.ub_ && !builder.p_.overlap.shared_experts),
        fs(builder.m_.moe.num_shared_experts * builder.m_.moe.shared_expert_ffn / builder.tp_),
        tg(builder.t_ * builder.tp_) {
    b.module_ = kRecomputeMoe | kRecomputeSharedExperts;
    if (b.shared_overlap_) b.comm_stream_ = b.side_stream_;
  }
  ~SharedPart() {
    b.module_ = module;
    b.comm_stream_ = comm_stream;
  }
  SharedPart(const SharedPart&) = delete;
  SharedPart& operator=(const SharedPart&) = delete;
};

int Builder::shared_gather(int x) {
  const SharedPart part(*this);
  return tp_gather(x, OpName::kSharedAg, part.ub);
}

int Builder::shared_fc1(int y) {
  const SharedPart part(*this);
  y = record(
      column_linear(gemm(OpName::kSharedFc13, part.tg, glu_ * part.fs, m_.hidden, side_stream_), part.ub),
      {y});
  return record(walks(mem(OpName::kSharedAct, MemOp::kActivation, 3.0 * d(part.tg * part.fs) * bytes_of(dt_),
                          side_stream_),
                      d(part.tg), part.fs),
                {y}, true);
}

int Builder::shared_fc2(int y) {
  const SharedPart part(*this);
  return row_linear(gemm(OpName::kSharedFc2, part.tg, m_.hidden, part.fs, side_stream_), y, OpName::kSharedRs,
                    part.ub);
}

// The flex dispatcher on DeepEP or HybridEP: each token crosses RDMA once per destination node and NVLink
// once per destination rank; the combine reduces within the node before RDMA. DeepEP runs a layout and a
// notify kernel and the host waits for the received counts, then permutes locally by expert; HybridEP
// all-gathers the routing map, preprocesses it and dispatches already permuted.
int Builder::moe_dispatch_dedup(int r, double ep_rows, int64_t f_r, int64_t local_experts) {
  const auto& e = m_.moe;
  const int64_t h = m_.hidden, k = e.top_k;
  const double dt = bytes_of(dt_);
  const bool fp8_dispatch = p_.compression.dispatch == DispatchPrecision::kFp8;
  const double disp_elt = fp8_dispatch ? bytes_of(DType::kFp8) * kFp8ScaleOverhead : dt;
  const int64_t g = o_.gpus_per_node;
  const int64_t span = ep_ * etp_;  // the flex dispatcher's group is ETP x EP
  const int64_t per_node = std::min(span, g);
  const DedupVolumes v = dedup_volumes(e.num_experts, k, ep_, std::max<int64_t>(1, per_node / etp_), e.groups,
                                       e.group_limited() ? e.group_top_k : e.groups);
  // Per rank: rows received over NVLink (one per token and destination rank, x ETP copies), rows leaving the
  // node over RDMA (one per token and remote destination node).
  const double recv_rows = d(t_) * v.ranks * d(etp_);
  const double nic_rows = d(t_) * std::max(0.0, v.nodes - v.own_node) * d(etp_);
  auto exchange = [&](OpName name, double elt, DType dtype) {
    Op op = coll(name, Collective::kAllToAll, CommGroup::kEp, recv_rows * d(h) * elt, dtype);
    op.comm.group_size = static_cast<int32_t>(span);
    op.comm.stride = 1;
    op.comm.nic_bytes_scale = recv_rows > 0 ? nic_rows / recv_rows : 0.0;
    op.comm.node_dedup = true;
    return op;
  };
  node_ = Node::kDispatch;
  int y = r;
  if (o_.dispatcher == DispatcherKind::kHybridEp) {
    // HybridEP's set-up: the routing map [t, E] of every rank all-gathered, then a preprocessing kernel over
    // all of them (metadata_preprocessing). One op: the stack prices it as HybridEP's benchmark measures the
    // whole set-up beyond the dispatch kernel, per node count of the group (its comm spec places it).
    Op pre = mem(OpName::kDispatchPreprocess, MemOp::kRouting, d(t_ * span * e.num_experts));
    pre.comm = comm(Collective::kAllGather, CommGroup::kEp, d(t_ * e.num_experts * span), DType::kBf16);
    pre.comm.group_size = static_cast<int32_t>(span);
    pre.comm.stride = 1;
    y = record(pre, {y}, false, true);
  } else {
    y = record(mem(OpName::kDispatchLayout, MemOp::kRouting, d(t_ * e.num_experts) * 4.0), {y}, false, true);
    Op notify =
        coll(OpName::kDispatchNotify, Collective::kAllToAll, CommGroup::kEp, 4.0 * d(e.num_experts * span));
    notify.comm.group_size = static_cast<int32_t>(span);
    notify.comm.stride = 1;
    y = record(notify, {y}, false, true);
  }
  if (o_.dispatcher_host_sync) y = record(host_wait(4.0 * d(e.num_experts)), {y}, false, true);
  y = record(exchange(OpName::kDispatchA2a, disp_elt, fp8_dispatch ? DType::kFp8 : dt_), {r, y}, true);
  node_ = Node::kMlp;
  // The received indices become the per-expert map. Where the stack states an eager conversion
  // (permute_host_waits, permute_index_kernels), the plan may take Megatron's fused one instead.
  const double rows_k = recv_rows * d(k), rows_e = recv_rows * d(local_experts);
  if (p_.experts.fused_index_conversion && (o_.permute_host_waits > 0 || o_.permute_index_kernels > 0)) {
    // fused_indices_to_multihot (megatron/core/fusions/fused_indices_converter.py): one Triton kernel reads
    // the indices (int64) and probs (fp32) [received tokens, top-k] and writes the bool map, the probs and an
    // int32 position map [received tokens, local experts], with no host wait; its backward is one kernel
    // from the probs' gradient and the position map back to [received tokens, top-k].
    y = record(mem(OpName::kPermuteIndex, MemOp::kRouting, rows_k * (8.0 + 4.0) + rows_e * (1.0 + 4.0 + 4.0),
                   Stream::kCompute, 1),
               {y});
    backward_as(y, rows_e * (4.0 + 4.0) + rows_k * 4.0, 1);
  } else {
    // Eager: reads of sizes the GPU computed from the received indices, each a host wait (8 bytes each), and
    // the rest of that conversion: a long and a float map [received tokens, local experts] zeroed and
    // written, the routing map cast to bool; its backward gathers the probs' gradient back.
    for (int i = 0; i < o_.permute_host_waits; ++i) y = record(host_wait(8.0), {y}, false, true);
    if (o_.permute_index_kernels > 0) {
      y = record(mem(OpName::kPermuteIndex, MemOp::kRouting, rows_e * (2.0 * (8.0 + 4.0) + 8.0 + 1.0),
                     Stream::kCompute, o_.permute_index_kernels),
                 {y});
      backward_as(y, rows_k * 3.0 * 4.0, o_.permute_index_backward_kernels);
    }
  }
  if (!o_.permute_fused) {
    // A local permute of the received tokens into per-expert rows (TE fused permute).
    y = record(mem(OpName::kPermute, MemOp::kPermute, (recv_rows + ep_rows) * d(h) * dt, Stream::kCompute, 2),
               {y}, true);
  }
  y = expert_mlp(y, ep_rows, f_r, local_experts, false);
  if (!o_.permute_fused) {
    y = record(
        mem(OpName::kUnpermute, MemOp::kPermute, (ep_rows + recv_rows) * d(h) * dt, Stream::kCompute, 2),
        {y});
  }
  node_ = Node::kCombine;
  return record(exchange(OpName::kCombineA2a, dt, dt_), {y});
}

// The experts between the permute and the unpermute on a Megatron-Core stack (TEGroupedMLP). Under FP8 the
// grouped GEMMs take each expert's rows in multiples of the recipe's alignment: where the rows arrive
// unaligned, the padded rows (alignment_pad_rows over the local experts) run through the GEMMs and the
// activation. Where the experts pad them themselves (Fp8Padding::kExperts: TE's Fp8Padding and Fp8Unpadding,
// fp8_padding.py / fp8_unpadding.py), the rows and the probs are copied into padded buffers by one
// fused_multi_row_padding kernel each, and the output copied back by one cat of the per-expert slices;
// backward, the padding's split-and-cat of both gradients (one cat each) and the unpadding's padding kernel.
// `router_padded`: the router padded each source's counts before the exchange (the rows arrive aligned).
int Builder::expert_mlp(int y, double ep_rows, int64_t f_r, int64_t local_experts, bool router_padded) {
  const int64_t h = m_.hidden;
  const double dt = bytes_of(dt_);
  double rows = ep_rows;
  if (fp8_pad_ != Fp8Padding::kNone && !router_padded)
    rows += alignment_pad_rows(ep_rows, d(local_experts), fp8_align_);
  const bool copies = fp8_pad_ == Fp8Padding::kExperts;
  if (copies) {
    y = record(mem(OpName::kFp8Pad, MemOp::kPermute, (ep_rows + rows) * (d(h) * dt + probs_bytes()),
                   Stream::kCompute, 2),
               {y});
  }
  y = record(grouped(OpName::kExpertFc13, rows, glu_ * f_r, h, local_experts), {y});
  y = expert_act(y, rows, f_r);
  y = expert_fc2(y, rows, f_r, local_experts);
  if (copies) y = record(mem(OpName::kFp8Unpad, MemOp::kPermute, (rows + ep_rows) * d(h) * dt), {y});
  return y;
}

// The expert activation, in the moe_act recompute module. A clamped GLU on a stack that clamps eagerly
// (Megatron-Core's weighted_bias_quick_geglu_impl, fused_bias_geglu.py) first clamps each half of the fc1
// output and concatenates them: clamps read and write f each, the concatenation 2f; backward, each clamp's
// masked gradient reads the gradient and its input and writes f, and the chunk's backward concatenates 2f.
// It then makes its linear offset a device tensor from a Python float, a host-to-device copy that waits for
// the stream (PyTorch's memcpy_and_sync), before the fused activation kernel.
int Builder::expert_act(int y, double ep_rows, int64_t f_r) {
  const double dt = bytes_of(dt_);
  const double elems = ep_rows * d(f_r);
  module_ |= kRecomputeMoeAct;
  if (o_.eager_glu_clamp && m_.moe.glu_limit > 0 && glu_ == 2) {
    y = record(mem(OpName::kExpertGluClamp, MemOp::kActivation, 8.0 * elems * dt, Stream::kCompute, 3), {y},
               true);
    backward_as(y, 10.0 * elems * dt, 3);
    Op offset = mem(OpName::kExpertActSync, MemOp::kActivation, dt);
    offset.host_sync = true;
    y = record(offset, {y}, false, true);
  }
  y = glu_act(OpName::kExpertAct, y, ep_rows, f_r);
  module_ &= static_cast<uint16_t>(~kRecomputeMoeAct);
  return y;
}

// An MLP's activation over `elems` = rows x F/tp outputs. Forward it reads FC1's output and writes F per row
// (a gated one reads 2F: the gate and the up halves); its gradient reads the incoming gradient and the saved
// input and writes the input's gradient: 5 F per row for a gated unit (Megatron's swiglu_back, moerun's GLU
// backward), as much as forward otherwise. A gated unit is its own memory-bound kind (MemOp::kGlu), so a
// stack can price it at a measured rate.
int Builder::glu_act(OpName name, int y, double rows, int64_t width) {
  const double dt = bytes_of(dt_);
  const double elems = rows * d(width);
  if (glu_ != 2)
    return record(walks(mem(name, MemOp::kActivation, 3.0 * elems * dt), rows, width), {y}, true);
  y = record(walks(mem(name, MemOp::kGlu, 3.0 * elems * dt), rows, width), {y}, true);
  backward_as(y, 5.0 * elems * dt, 1);
  return y;
}

// The down projection and its bias, where the stack adds it outside the GEMM (Megatron-Core's
// TEGroupedMLP._apply_bias): per local expert `t + b * p` (a product in the probs dtype and a sum), then one
// concatenation, and a cast back when the probs are wider. Backward, per expert: the bias gradient
// sum(g * p) and the probs gradient sum(g * b), two kernels each, then the split's backward concatenates.
int Builder::expert_fc2(int y, double ep_rows, int64_t f_r, int64_t local_experts) {
  y = record(grouped(OpName::kExpertFc2, ep_rows, m_.hidden, f_r, local_experts), {y});
  if (!o_.eager_output_bias || !m_.moe.expert_bias) return y;
  const double dt = bytes_of(dt_);
  const double wide = std::max(dt, probs_bytes());
  const double cast = wide > dt ? wide + dt : 0.0;
  const int extra = wide > dt ? 1 : 0;
  const double elems = ep_rows * d(m_.hidden);
  const auto experts = static_cast<int>(local_experts);
  y = record(mem(OpName::kExpertBias, MemOp::kActivation, elems * (dt + 5.0 * wide + cast), Stream::kCompute,
                 2 * experts + 1 + extra),
             {y});
  backward_as(y, elems * (6.0 * wide + 2.0 * dt + cast), 4 * experts + 1 + extra);
  return y;
}

int Builder::moe_fwd(int in) {
  const auto& e = m_.moe;
  const int64_t h = m_.hidden;
  const double dt = bytes_of(dt_);
  const int64_t k = e.top_k;
  const int64_t local_experts = e.num_experts / ep_;
  const int64_t f_r = e.expert_ffn / etp_;
  const bool decoder = spec_role_ == LayerRole::kDecoder;
  const double kept = 1.0 - (decoder ? o_.decoder_dropped_fraction : o_.dropped_fraction);
  // Rows routed to the busiest rank of the EP group (the slowest rank decides); padded to capacity, every
  // rank's experts receive exactly their capacity from each source.
  double rows = p_.routing.pad_to_capacity
                    ? d(t_ * k) * capacity_padded_rows_factor(p_, d(t_), k, e.num_experts)
                    : d(t_ * k) * load_scale() * kept;
  // FP8 router padding under the alltoall dispatcher: each rank pads every expert's count in its own routing
  // map before the exchange, so each rank receives about E x the expected pad of one source's count more
  // rows.
  const bool router_padded = fp8_pad_ == Fp8Padding::kRouter && p_.experts.dispatch != Dispatch::kDedup;
  if (router_padded) rows += alignment_pad_rows(d(t_ * k) * kept, d(e.num_experts), fp8_align_);
  const bool fp8_dispatch = p_.compression.dispatch == DispatchPrecision::kFp8;
  const DType dispatch_dt = fp8_dispatch ? DType::kFp8 : dt_;
  const double dispatch_elt = fp8_dispatch ? bytes_of(DType::kFp8) * kFp8ScaleOverhead : dt;
  const bool dedup_stack =
      o_.dispatcher == DispatcherKind::kDeepEp || o_.dispatcher == DispatcherKind::kHybridEp;

  node_ = Node::kPreDispatch;
  // CUDA graphs: the whole MoE (layer, moe), or its pre-MLP norm and router (moe_router) with the shared
  // experts where they are not overlapped, and the dispatcher's preprocess (moe_preprocess, recorded there).
  const uint8_t cg = p_.cuda_graphs;
  const bool moe_graphed = (cg & (kGraphLayer | kGraphMoe)) != 0;
  graph_ = moe_graphed || (cg & kGraphMoeRouter);
  module_ = kRecomputeMoe | kRecomputeLayernorm;  // the pre-MLP norm is its own module in MoE layers
  const int x =
      record(walks(mem(OpName::kFfnNorm, MemOp::kNorm, 3.0 * d(t_ * h) * dt), d(t_), h), {in}, true);
  module_ = kRecomputeMoe;
  Op router = gemm(OpName::kRouter, t_, e.num_experts, h);
  in_bf16(router);  // the router GEMM runs in BF16 (or FP32) under FP8 training
  int r = record(router, {x});
  // Scores, top-k (group-limited where configured), probs and routing map [t, E] in fp32, and the aux loss.
  const double routing_bytes = d(t_ * e.num_experts) * 13.0;
  const RouterKernels rk =
      o_.eager_framework ? megatron_router_kernels(e, p_.routing.fused_router, tp_ * p_.attention.cp > 1)
                         : RouterKernels{};
  r = record(walks(mem(OpName::kRouterTopk, MemOp::kRouting, routing_bytes, Stream::kCompute, rk.forward),
                   d(t_), e.num_experts, k),
             {r});
  backward_as(r, routing_bytes, rk.backward);

  // Shared experts: a dense FFN on the side stream, beside dispatch (MegaScale-MoE §4.1). Megatron's
  // --moe-shared-expert-overlap issues the gather before the permute, FC1 after the dispatch all-to-all and
  // FC2 after the combine's (token_dispatcher.py:488, 519, 636-637 at 7094270c): the alltoall dispatcher
  // records the last two in place.
  int shared = -1;
  if (e.num_shared_experts > 0) {
    // In the router's graph unless overlapped (transformer_layer.py _get_submodules_under_cudagraphs);
    // overlapped beside the all-to-all dispatcher, their gather is issued in its preprocess
    // (token_dispatcher.py:626 at core_v0.16.0) and so is in that graph, its output one of the graph's.
    graph_ = moe_graphed || ((cg & kGraphMoeRouter) && !p_.overlap.shared_experts) ||
             (shared_gather_in_preprocess() && (cg & kGraphMoePreprocess));
    const int y = shared_gather(x);
    if (shared_gather_in_preprocess()) {
      shared_pending_ = y;
    } else {
      shared = shared_fc2(shared_fc1(y));
    }
  }

  graph_ = moe_graphed;
  const bool gather_mode = p_.experts.dispatch == Dispatch::kAllGather;
  const double ep_rows = rows * d(etp_);  // rows each expert GEMM sees after the ETP all-gather
  int y;
  if (dedup_stack && p_.experts.dispatch == Dispatch::kDedup) {
    y = moe_dispatch_dedup(r, ep_rows, f_r, local_experts);
  } else if (megatron_ && !p_.overlap.intra_op) {
    y = moe_dispatch_megatron(r, rows, ep_rows, f_r, local_experts);
  } else {
    // moerun / MegaScale-MoE: the plan's exchange, fused into the expert GEMMs with intra-operator overlap.
    if (gather_mode) {
      // all-gather -> local scatter (drop rows for other ranks' experts) -> grouped GEMMs -> gather ->
      // reduce-scatter
      const double ag_bytes = d(t_ * ep_) * d(h) * dispatch_elt;
      if (p_.overlap.intra_op && etp_ == 1) {
        node_ = Node::kMlp;
        y = record(
            fused(OpName::kAgScatterFc13, grouped(OpName::kExpertFc13, ep_rows, glu_ * f_r, h, local_experts),
                  comm(Collective::kAllGather, CommGroup::kEp, ag_bytes, dispatch_dt)),
            {r});
      } else {
        node_ = Node::kDispatch;
        y = record(coll(OpName::kDispatchAg, Collective::kAllGather, CommGroup::kEp, ag_bytes, dispatch_dt),
                   {r}, true);
        node_ = Node::kMlp;
        y = record(walks(mem(OpName::kScatter, MemOp::kPermute, 2.0 * rows * d(h) * dt), rows, h), {y}, true);
      }
    } else {
      y = record(walks(mem(OpName::kPermute, MemOp::kPermute, 2.0 * d(t_ * k * h) * dt), d(t_), h, k), {r},
                 true);
      Op a2a = routed(coll(OpName::kDispatchA2a, Collective::kAllToAll, CommGroup::kEp,
                           rows * d(h) * dispatch_elt, dispatch_dt));
      if (p_.experts.dispatch == Dispatch::kDedup) {
        const int64_t g = o_.gpus_per_node;
        const int64_t span = ep_ * etp_;  // ranks covered by the EP group's stride pattern
        const int64_t nodes = span > g ? span / g : 1;
        a2a.comm.nic_bytes_scale = dedup_nic_scale(e.num_experts, k, nodes);
      }
      if (p_.overlap.intra_op && etp_ == 1) {
        node_ = Node::kMlp;
        y = record(fused(OpName::kA2aFc13,
                         grouped(OpName::kExpertFc13, ep_rows, glu_ * f_r, h, local_experts), a2a.comm),
                   {y});
      } else {
        node_ = Node::kDispatch;
        y = record(a2a, {y}, true);
      }
    }
    node_ = Node::kMlp;
    const bool fused_fc13 = p_.overlap.intra_op && etp_ == 1;
    if (!fused_fc13) {
      if (etp_ > 1) {
        y = record(coll(OpName::kEtpAg, Collective::kAllGather, CommGroup::kEtp, ep_rows * d(h) * dt), {y},
                   true);
      }
      y = record(grouped(OpName::kExpertFc13, ep_rows, glu_ * f_r, h, local_experts), {y});
    }
    y = expert_act(y, ep_rows, f_r);
    if (fused_fc13) {
      const double bytes = gather_mode ? d(t_ * ep_ * h) * dt : rows * d(h) * dt;
      const Collective c = gather_mode ? Collective::kReduceScatter : Collective::kAllToAll;
      y = record(fused(gather_mode ? OpName::kFc2GatherRs : OpName::kFc2A2a,
                       grouped(OpName::kExpertFc2, ep_rows, h, f_r, local_experts),
                       gather_mode ? comm(c, CommGroup::kEp, bytes, dt_)
                                   : routed(comm(c, CommGroup::kEp, bytes, dt_))),
                 {y});
    } else {
      y = expert_fc2(y, ep_rows, f_r, local_experts);
      if (etp_ > 1) {
        y = record(coll(OpName::kEtpRs, Collective::kReduceScatter, CommGroup::kEtp, ep_rows * d(h) * dt),
                   {y});
      }
      node_ = Node::kCombine;
      if (gather_mode) {
        y = record(walks(mem(OpName::kGather, MemOp::kPermute, 2.0 * rows * d(h) * dt), rows, h), {y});
        y = record(coll(OpName::kCombineRs, Collective::kReduceScatter, CommGroup::kEp, d(t_ * ep_ * h) * dt),
                   {y});
      } else {
        y = record(routed(coll(OpName::kCombineA2a, Collective::kAllToAll, CommGroup::kEp, rows * d(h) * dt)),
                   {y});
      }
    }
  }
  if (shared_pending_ >= 0) {
    shared = shared_pending_;
    shared_pending_ = -1;
  }
  node_ = Node::kCombine;
  std::vector<int> ins{y};
  if (shared >= 0) ins.push_back(shared);
  const double unpermute_bytes = dedup_stack && p_.experts.dispatch == Dispatch::kDedup
                                     ? 2.0 * d(t_ * h) * dt
                                     : (d(t_ * k * h) + 2.0 * d(t_ * h)) * dt;
  int out = record(walks(mem(OpName::kUnpermute, MemOp::kPermute, unpermute_bytes), d(t_), h, k), ins);
  module_ = 0;
  // The residual add after the MoE layer (Megatron's mlp_bda), as after attention and the dense MLP.
  if (o_.eager_framework)
    out = record(walks(mem(OpName::kResidualAdd, MemOp::kActivation, 3.0 * d(t_ * h) * dt), d(t_), h), {out},
                 false, true);
  return out;
}

void Builder::record_layer(int64_t layer) {
  layer_ops_.clear();
  module_ = 0;
  const LayerSpec& l = spec_of(layer);
  seq_ = layer_seq_len(l, p_.seq_len);
  t_ = p_.micro_batch * seq_ / (tp_ * sp_ * cp_);
  causal_ = l.role != LayerRole::kEncoder;
  spec_role_ = l.role;
  // CUDA graphs: the mixer's part of the layer's graph (attention, linear attention and cross-attention under
  // attn, Mamba under mamba); the FFN's part is set where it records.
  const uint8_t cg = p_.cuda_graphs;
  graph_ = (cg & kGraphLayer) || (l.mixer == MixerKind::kMamba2 ? (cg & kGraphMamba) : (cg & kGraphAttn));
  int a = -1;
  switch (l.mixer) {
    case MixerKind::kAttention:
      a = attention_fwd(-1, l.position_bias);
      if (l.role == LayerRole::kDecoder) a = cross_attention_fwd(a);
      break;
    case MixerKind::kLinearAttention:
    case MixerKind::kMamba2:
      a = recurrent_mixer_fwd(-1, l.mixer);
      break;
    case MixerKind::kNone:
      break;
  }
  if (l.ffn) {
    if (l.moe) {
      moe_fwd(a);
    } else {
      graph_ = (cg & kGraphLayer) || (cg & kGraphMlp);
      dense_ffn_fwd(a);
    }
  }
  graph_ = false;
  layer_graph_copies(l);
  // Layer-specific attention: sliding windows and CLA (no K/V projection) change the attention ops' work. DSA
  // attends top_k keys per query: the key count of a top_k-token window.
  const int64_t window = m_.attention.indexer.heads > 0 ? m_.attention.indexer.top_k : l.window;
  for (auto& lo : layer_ops_) {
    Op& op = lo.op;
    if (op.kind == OpKind::kAttention && window > 0 && window < p_.seq_len) {
      op.attn.window = static_cast<int32_t>(window);
      op.flops *= mean_attended_keys(p_.seq_len, window) / mean_attended_keys(p_.seq_len, 0);
    }
  }
  t_ = t_seq_;
  seq_ = p_.seq_len;
  causal_ = true;
  spec_role_ = LayerRole::kDecoderOnly;
}

// What a replay of the layer's graph copies into its static buffers: forward its input [t, h]; backward the
// gradients of its outputs, the layer's (or the mixer's) output [t, h] where the graph ends there, or where
// it ends inside the MoE (moe_router) the residual, the MoE's input and its probs (after the all-to-all
// dispatcher's preprocess: the permuted rows [t k, h] and their probs [t k]; before: [t, h] and the probs
// [t, E]), and the shared experts' output when they are in it (transformer_layer.py _te_cuda_graph_replay
// at core_v0.16.0: the graph's outputs).
void Builder::layer_graph_copies(const LayerSpec& l) {
  graph_fwd_copy_ = graph_bwd_copy_ = 0;
  if (std::none_of(layer_ops_.begin(), layer_ops_.end(), [](const LocalOp& lo) { return lo.graphed; }))
    return;
  const auto& e = m_.moe;
  const double dt = bytes_of(dt_);
  const double act = d(t_ * m_.hidden) * dt;
  double out = act;
  const uint8_t cg = p_.cuda_graphs;
  if (l.ffn && l.moe && !(cg & (kGraphLayer | kGraphMoe)) && (cg & kGraphMoeRouter)) {
    const bool permuted = (cg & kGraphMoePreprocess) && megatron_ && !p_.overlap.intra_op &&
                          p_.experts.dispatch == Dispatch::kAllToAll;
    out += permuted ? d(t_ * e.top_k) * (d(m_.hidden) * dt + probs_bytes())
                    : act + d(t_ * e.num_experts) * probs_bytes();
    if (e.num_shared_experts > 0 && !p_.overlap.shared_experts) out += act;
    // The shared experts' gathered input, cached by the preprocess for their FC1.
    if (e.num_shared_experts > 0 && shared_gather_in_preprocess() && (cg & kGraphMoePreprocess))
      out += act * d(tp_);
  }
  graph_fwd_copy_ = 2.0 * act;
  graph_bwd_copy_ = 2.0 * out;
}

int32_t Builder::emit(const Op& proto, int16_t stage, int16_t chunk, int32_t layer, int32_t mb, Phase phase,
                      std::initializer_list<int32_t> deps) {
  Op& op = g_.ops.emplace_back(proto);
  op.id = static_cast<int32_t>(g_.ops.size() - 1);
  if (graph_emit_) {
    // A new replay where the stage's previous op was outside graphs or in another layer's, micro-batch's or
    // direction's graph: the op carries the replay's input copy.
    const bool fwd = phase == Phase::kForward;
    const int64_t replay = ((int64_t{layer} + 1) * (g_.micro_batches + 1) + (mb + 1)) * 2 + (fwd ? 0 : 1);
    int64_t& open = graph_open_[static_cast<size_t>(stage)];
    op.graphed = true;
    if (open != replay) {
      const Recipe& rc = recipe_of(layer);
      op.graph_copy_bytes = static_cast<float>(fwd ? rc.graph_fwd_copy : rc.graph_bwd_copy);
      open = replay;
    }
  } else if (!graph_open_.empty() && !proto.graphed) {
    graph_open_[static_cast<size_t>(stage)] = -1;
  }
  op.stage = stage;
  op.chunk = chunk;
  op.layer = layer;
  op.micro_batch = mb;
  op.phase = phase;
  if (op.part == GemmPart::kWgrad && (op.kind == OpKind::kGemm || op.kind == OpKind::kGroupedGemm))
    op.accum_bytes = static_cast<uint8_t>(wgrad_accum_bytes(p_, o_));
  op.block_scaled =
      fp8_block_ && op.dtype == DType::kFp8 &&
      (op.kind == OpKind::kGemm || op.kind == OpKind::kGroupedGemm || op.kind == OpKind::kFusedGemmComm);
  for (int32_t x : deps) dep(op.id, x);
  if (op.stream == Stream::kDpComm) last_dp_op_ = op.id;
  return op.id;
}

// Whether op `lo` of `layer` re-runs in backward under the plan's recompute.
bool Builder::recomputed(const LocalOp& lo, int64_t layer) const {
  switch (p_.recompute) {
    case Recompute::kNone:
      return false;
    case Recompute::kSar:
      return lo.sar;
    case Recompute::kSelective:
      return (lo.module & p_.recompute_modules) != 0;
    case Recompute::kFull:
      // uniform: every layer, checkpointed in groups; block: the first num_layers layers of each chunk.
      return p_.recompute_method == RecomputeMethod::kUniform ||
             chunk_position_[static_cast<size_t>(layer)] < p_.recompute_num_layers;
  }
  return false;
}

// A fresh pass over `layer` for one micro-batch; `input` is its activation (forward) or incoming gradient.
static void start_pass(LayerPass& pass, int64_t layer, int16_t stage, int16_t chunk, int32_t mb,
                       int32_t input) {
  const int32_t node_end = pass.node_end;
  pass = {};
  pass.node_end = node_end;
  pass.layer = layer;
  pass.stage = stage;
  pass.chunk = chunk;
  pass.mb = mb;
  pass.input = input;
}

void Builder::forward_begin(LayerPass& pass, int64_t layer, int16_t stage, int16_t chunk, int32_t mb,
                            int32_t input) {
  start_pass(pass, layer, stage, chunk, mb, input);
  pass.ids.assign(recipe_of(layer).ops.size(), -1);
  if (p_.data.zero == 3 && o_.data_parallel)
    pass.zero3_gather = emit_param_gather(layer, stage, chunk, mb, Phase::kForward, dp_stream_);
}

void Builder::forward_node(LayerPass& pass, Node node) {
  const Recipe& rc = recipe_of(pass.layer);
  const auto [b, e] = rc.nodes[static_cast<size_t>(node)];
  const auto L = static_cast<int32_t>(pass.layer);
  const int32_t after = pass.node_end;  // -1 unless combined 1F1B chains the nodes
  for (size_t i = b; i < e; ++i) {
    const LocalOp& lo = rc.ops[i];
    Op op = lo.op;
    op.stream = stream_of(lo);
    graph_emit_ = lo.graphed;
    pass.ids[i] = emit(op, pass.stage, pass.chunk, L, pass.mb, Phase::kForward, {after});
    graph_emit_ = false;
    if (lo.inputs.size() == 1 && lo.inputs[0] < 0) dep(pass.ids[i], pass.input);
    for (int in : lo.inputs) {
      if (in >= 0) dep(pass.ids[i], pass.ids[static_cast<size_t>(in)]);
    }
    if (pass.first < 0) {
      pass.first = pass.ids[i];
      dep(pass.first, pass.zero3_gather);
      dep(pass.first, weight_cast_);
      if (layer_first_fwd_[static_cast<size_t>(pass.layer)] < 0)
        layer_first_fwd_[static_cast<size_t>(pass.layer)] = pass.first;
    }
    pass.last = pass.ids[i];
    if (combined_) pass.node_end = pass.last;
  }
}

void Builder::backward_begin(LayerPass& pass, int64_t layer, int16_t stage, int16_t chunk, int32_t mb,
                             int32_t grad_input) {
  const Recipe& rc = recipe_of(layer);
  start_pass(pass, layer, stage, chunk, mb, grad_input);
  pass.re.assign(rc.ops.size(), -1);
  pass.grad.assign(rc.ops.size(), -1);
  pass.recomputed_node.assign(kNodes, 0);
  if (p_.data.zero != 3 || !o_.data_parallel) return;
  if (prefetched_layer_ == layer && prefetched_mb_ == mb) {
    pass.zero3_gather = prefetched_gather_;
  } else {
    pass.zero3_gather = emit_param_gather(layer, stage, chunk, mb, Phase::kBackward, dp_stream_);
  }
  prefetched_layer_ = -1;
  // Megatron-FSDP prefetches the next layer of the virtual stage in backward order now, ahead of this
  // layer's reduce-scatter (backward_done).
  if (o_.zero3_backward_prefetch && layer < n_main_ && chunk_position_[static_cast<size_t>(layer)] > 0) {
    prefetched_gather_ = emit_param_gather(layer - 1, stage, chunk, mb, Phase::kBackward, dp_stream_);
    prefetched_layer_ = layer - 1;
    prefetched_mb_ = mb;
  }
}

// Backward of one node of a recorded layer: its ops in reverse; a GEMM gives dgrad then wgrad, a collective
// its transpose (all-gather <-> reduce-scatter, all-to-all reversed), attention its backward kernel.
// Recompute re-runs forward ops first: Megatron's output-discarding modules just before their consumer's
// backward (so per node), full recompute, SAR and the whole-MoE module before the layer's first backward op.
void Builder::backward_node(LayerPass& pass, Node node) {
  const Recipe& rc = recipe_of(pass.layer);
  const auto& ops = rc.ops;
  const auto L = static_cast<int32_t>(pass.layer);
  const auto [nb, ne] = rc.nodes[static_cast<size_t>(node)];
  // Combined 1F1B: every op of the node waits for the end of the pass's node before it; the node ends with
  // its last op but the weight gradients --delay-wgrad-compute holds back.
  const int32_t after = pass.node_end;  // -1 unless combined 1F1B chains the nodes
  int32_t end = -1;

  auto emit_recompute = [&](size_t i) {
    if (pass.re[i] >= 0) return;
    Op op = ops[i].op;
    op.stream = stream_of(ops[i]);
    // A graphed module's recompute runs inside its layer's backward graph: issued by that replay, which the
    // node's first graphed backward op opens.
    op.graphed = ops[i].graphed;
    pass.re[i] = end = emit(op, pass.stage, pass.chunk, L, pass.mb, Phase::kRecompute, {after});
    if (pass.first < 0) {
      pass.first = pass.re[i];
      dep(pass.first, pass.zero3_gather);
    }
    for (int in : ops[i].inputs) {
      if (in >= 0 && pass.re[static_cast<size_t>(in)] >= 0) dep(pass.re[i], pass.re[static_cast<size_t>(in)]);
    }
    if (ops[i].inputs.size() == 1 && ops[i].inputs[0] < 0) dep(pass.re[i], pass.input);
  };
  const bool whole_layer_first =
      p_.recompute == Recompute::kFull || p_.recompute == Recompute::kSar ||
      (p_.recompute == Recompute::kSelective && (p_.recompute_modules & kRecomputeMoe));
  if (p_.recompute != Recompute::kNone) {
    if (whole_layer_first) {
      if (!std::any_of(pass.recomputed_node.begin(), pass.recomputed_node.end(),
                       [](uint8_t x) { return x; })) {
        for (size_t i = 0; i < ops.size(); ++i) {
          if (recomputed(ops[i], pass.layer)) emit_recompute(i);
        }
      }
    } else {
      for (size_t i = nb; i < ne; ++i) {
        if (recomputed(ops[i], pass.layer)) emit_recompute(i);
      }
    }
    pass.recomputed_node[static_cast<size_t>(node)] = 1;
  }

  for (size_t ri = ne; ri-- > nb;) {
    const LocalOp& lo = ops[ri];
    Op op = lo.op;
    op.stream = stream_of(lo);
    // Every op this recorded op's backward emits (re-gathers, amax reductions, weight gradients) is in its
    // graph when it is.
    graph_emit_ = lo.graphed;
    const auto& consumers = rc.consumers[ri];
    if (lo.forward_only) {
      // Routing metadata and host waits have no backward; the gradient passes through to their producer.
      MOEPLAN_ASSERT(consumers.size() <= 1);
      pass.grad[ri] = consumers.empty() ? pass.input : pass.grad[consumers.front()];
      continue;
    }
    std::vector<int32_t>& waits = scratch_waits_;
    waits.clear();
    if (consumers.empty()) waits.push_back(pass.input);
    for (size_t c : consumers) waits.push_back(pass.grad[c]);
    for (int in : lo.inputs) {
      if (in >= 0 && pass.re[static_cast<size_t>(in)] >= 0) waits.push_back(pass.re[static_cast<size_t>(in)]);
    }
    if (pass.re[ri] >= 0) waits.push_back(pass.re[ri]);
    auto emit_with = [&](const Op& o) {
      const int32_t id = end = emit(o, pass.stage, pass.chunk, L, pass.mb, Phase::kBackward, {after});
      for (int32_t w : waits) dep(id, w);
      if (pass.first < 0) {
        pass.first = id;
        dep(id, pass.zero3_gather);
      }
      return id;
    };
    // A row-parallel linear's incoming gradient, quantised and gathered in FP8 where TE does so (above),
    // after current scaling's amax all-reduce, which the gather then waits for.
    auto gather_gradient_in_fp8 = [&](CommSpec& c) {
      if (!fp8_tp_gather_) return;
      retype(c, DType::kFp8);
      if (!fp8_amax_ar_) return;
      const int32_t ar = emit_with(amax_all_reduce());
      waits.clear();
      waits.push_back(ar);
    };
    switch (op.kind) {
      case OpKind::kGemm:
      case OpKind::kGroupedGemm:
      case OpKind::kFusedGemmComm: {
        // Megatron + TE under sequence parallelism: a column-parallel linear keeps only its input shard for
        // backward and all-gathers it again over TP for the weight gradient, issued before the dgrad GEMM
        // and beside it (TransformerEngine v2.4 module/layernorm_linear.py:391-393 ln_out_needs_gather and
        // 632-656 gather_along_first_dim(..., async_op=True); module/linear.py:341-343 and 558-582 alike).
        // Not where the gathered input feeds several GEMMs (MLA's down projections: Megatron gathers once
        // and its duplicated linears keep the gathered input).
        int32_t input_ag = -1;
        // Under TE's userbuffers a column-parallel linear's all-gather is inside its forward op; backward
        // overlaps in bulk as without them (TE's defaults: qkv_dgrad and fc1_dgrad all-gather beside the
        // dgrad GEMM, qkv_wgrad and fc1_wgrad reduce-scatter beside the wgrad GEMM, on TE's communication
        // SMs): the re-gather, a plain dgrad GEMM, then the dgrad's reduce-scatter beside the wgrad.
        const bool ub_gather = op.kind == OpKind::kFusedGemmComm && op.comm.userbuffers &&
                               op.comm.collective == Collective::kAllGather;
        Op ub_exchange;
        if (ub_gather) {
          ub_exchange =
              base(ub_gather_name(static_cast<OpName>(op.name)), OpKind::kCollective, Stream::kCompute);
          ub_exchange.comm = op.comm;
          input_ag = emit_with(regather(ub_exchange));
          op.kind = OpKind::kGemm;
          op.comm = {};
        }
        // A shared expert's linear under Megatron's shared-expert overlap: no parallel mode there, so FC1
        // keeps the gathered input and needs no re-gather (shared_experts.py:92-101 at core_v0.16.0); its
        // weight gradient runs on the shared stream.
        const bool shared_linear = shared_overlap_ && op.stream == side_stream_;
        if (megatron_ && op.kind == OpKind::kGemm && lo.inputs.size() == 1 && lo.inputs[0] >= 0 &&
            !ub_gather && !shared_linear) {
          const auto src = static_cast<size_t>(lo.inputs[0]);
          const Op& in = ops[src].op;
          if (in.kind == OpKind::kCollective && in.comm.collective == Collective::kAllGather &&
              in.comm.group == CommGroup::kTp && rc.consumers[src].size() == 1) {
            input_ag = emit_with(regather(in));
          }
        }
        Op dgrad = op;
        dgrad.part = GemmPart::kDgrad;
        // FP8: the incoming gradient [m, n] (m n = flops / 2 k elements) is quantised (and transposed for
        // wgrad) instead of the input, at the recipe's cost whatever the forward input's (linear_after_norm).
        if (op.aux_bytes > 0 && op.gemm.k > 0)
          dgrad.aux_bytes = fp8_input_cast(op.flops / (2.0 * d(op.gemm.k)));
        if (op.kind == OpKind::kFusedGemmComm) {
          // The transposed fused kernel: its collective reverses direction.
          if (op.comm.collective == Collective::kAllGather)
            dgrad.comm.collective = Collective::kReduceScatter;
          else if (op.comm.collective == Collective::kReduceScatter)
            dgrad.comm.collective = Collective::kAllGather;
          // Under userbuffers a row-parallel linear's dgrad gathers the incoming gradient in its ring.
          if (op.comm.userbuffers && dgrad.comm.collective == Collective::kAllGather)
            gather_gradient_in_fp8(dgrad.comm);
        }
        const int32_t dgrad_id = pass.grad[ri] = emit_with(dgrad);
        if (ub_gather) {
          ub_exchange.comm.collective = Collective::kReduceScatter;
          retype(ub_exchange.comm, dt_);  // the data gradient reduces in bf16
          ub_exchange.dtype = dt_;
          pass.grad[ri] = end =
              emit(te_async(ub_exchange), pass.stage, pass.chunk, L, pass.mb, Phase::kBackward, {dgrad_id});
        }
        Op wgrad = op;
        wgrad.kind = op.kind == OpKind::kFusedGemmComm
                         ? (op.gemm.groups > 1 ? OpKind::kGroupedGemm : OpKind::kGemm)
                         : op.kind;
        wgrad.comm = {};
        wgrad.part = GemmPart::kWgrad;
        without_casts(wgrad);
        wgrad.stream = shared_linear ? side_stream_ : Stream::kCompute;
        if (deferring_) {
          deferring_->push_back({wgrad, pass.stage, pass.chunk, L, pass.mb, dgrad_id, input_ag});
        } else if (delay_wgrad_ && (node == Node::kMlp || node == Node::kPreDispatch)) {
          // backward_dw of the experts (mlp) and of attention with the shared experts (pre_dispatch):
          // fine_grained_callables.py build_transformer_layer_callables.
          delayed_.push_back({wgrad, pass.stage, pass.chunk, L, pass.mb, dgrad_id, input_ag});
        } else {
          pass.last = end =
              emit(wgrad, pass.stage, pass.chunk, L, pass.mb, Phase::kBackward, {dgrad_id, input_ag});
        }
        continue;
      }
      case OpKind::kAttention: {
        op.flops *= kAttentionBackwardFlops;
        op.hbm_bytes *= 2.0;
        break;
      }
      case OpKind::kCollective: {
        if (lo.backward_same_way) {
          if (lo.backward_bytes >= 0) op.comm.bytes = lo.backward_bytes;
          break;
        }
        // The reduce-scatter of a column-parallel linear's data gradient (the backward of the TP all-gather
        // that feeds it alone) runs beside the weight gradient on Megatron's stacks.
        if (op.comm.collective == Collective::kAllGather && op.comm.group == CommGroup::kTp &&
            consumers.size() == 1 && ops[consumers.front()].op.kind == OpKind::kGemm)
          op = te_async(op);
        const bool row_parallel_rs = op.comm.collective == Collective::kReduceScatter && tp_row_rs(op);
        if (op.comm.collective == Collective::kAllGather) {
          op.comm.collective = Collective::kReduceScatter;
        } else if (op.comm.collective == Collective::kReduceScatter) {
          op.comm.collective = Collective::kAllGather;
        }
        if (op.comm.dtype == DType::kFp8 && op.comm.group == CommGroup::kTp) {
          retype(op.comm, dt_);  // a TP linear's FP8 gather: its data gradient reduces in bf16
          op.dtype = dt_;
        } else if (op.comm.dtype == DType::kFp8) {  // gradients of an FP8 dispatch travel in bf16, no scales
          op.comm.bytes = op.comm.bytes / (bytes_of(DType::kFp8) * kFp8ScaleOverhead) * bytes_of(dt_);
          op.comm.dtype = dt_;
          op.dtype = dt_;
        } else if (row_parallel_rs) {
          gather_gradient_in_fp8(op.comm);
          op.dtype = op.comm.dtype;
        }
        break;
      }
      default:
        if (lo.backward_bytes >= 0) {
          op.hbm_bytes = lo.backward_bytes;
          op.kernels = lo.backward_kernels;
        }
        // FLA's scan walks its chunks twice backward (fwd_h recomputed, then bwd_dhu).
        if (static_cast<OpName>(op.name) == OpName::kMixerScan && op.gemm.k > 0)
          op.gemm.k = kFlaScanBackwardChains;
        break;
    }
    pass.grad[ri] = emit_with(op);
    pass.last = pass.grad[ri];
  }
  graph_emit_ = false;
  if (combined_ && end >= 0) pass.node_end = end;
}

// The weight gradients the last backward node held back, on the compute stream after what was issued since
// (Megatron's TransformerLayerNode.backward_dw records no event: the nodes that follow do not wait for them).
void Builder::emit_delayed(LayerPass& pass) {
  for (const DeferredWgrad& w : delayed_) pass.last = emit_deferred(w);
  delayed_.clear();
}

// The gradient leaving the layer: that of its first op's input.
int32_t Builder::backward_output(const LayerPass& pass) const {
  const int32_t out = pass.grad.empty() ? -1 : pass.grad.front();
  return out >= 0 ? out : pass.last;
}

// Gradients of the layer are final after its last micro-batch; ZeRO-2/3 keep only their gradient shard, so
// every micro-batch's gradients are reduce-scattered.
void Builder::backward_done(const LayerPass& pass) {
  if (pass.mb != p_.num_micro_batches() - 1 && p_.data.zero < 2) return;
  if (deferring_) return;  // the gradients are final once its weights task has run
  const auto l = static_cast<size_t>(pass.layer);
  layer_last_bwd_[l] = g_.ops.back().id;
  int32_t side = -1;
  if (side_stream_ != Stream::kCompute && pass.first >= 0) {
    for (size_t i = static_cast<size_t>(pass.first); i < g_.ops.size(); ++i) {
      if (g_.ops[i].stream == side_stream_ && g_.ops[i].layer == pass.layer) side = g_.ops[i].id;
    }
  }
  layer_last_side_bwd_[l] = side;
  if (p_.data.zero >= 2 && o_.data_parallel) emit_data_parallel(pass.stage);
}

Builder::TaskState Builder::task_begin(int16_t stage, const PipelineTask& task) {
  TaskState ts;
  ts.task = task;
  ts.stage = stage;
  ts.v = vstage(task.chunk, stage);
  ts.l0 = first_layer_[static_cast<size_t>(ts.v)];
  ts.l1 = first_layer_[static_cast<size_t>(ts.v) + 1];
  const int64_t last_v = pp_ * vpp_ - 1;
  const int32_t mb = task.micro_batch;
  const double dt = bytes_of(dt_);
  const int64_t h = m_.hidden;
  if (task.forward) {
    if (ts.v == 0 && o_.embedding_and_head) {
      ts.track(emit(embedding_op(OpName::kEmbedding, embedded_tokens()), stage, task.chunk, -1, mb,
                    Phase::kForward, {weight_cast_}));
      first_forward(kVocabEmbedding, ts.cur);
      if (megatron_tp())
        ts.track(emit(embed_exchange(embedded_tokens(), true), stage, task.chunk, -1, mb, Phase::kForward,
                      {ts.cur}));
    }
  } else if (ts.v == last_v && o_.embedding_and_head) {
    const int64_t tg = t_head_ * tp_;
    if (mtp_ > 0) emit_mtp(ts);
    ts.track(emit(loss_op(OpName::kLoss, false, tg), stage, task.chunk, -1, mb, Phase::kBackward, {ts.cur}));
    Op head = gemm(OpName::kLmHead, tg, m_.vocab / tp_, h);
    in_bf16(head);  // Megatron keeps the output layer in BF16
    const int32_t dgrad = head_backward(ts, head, t_head_);
    ts.track(emit(walks(mem(OpName::kFinalNorm, MemOp::kNorm, 4.0 * d(embedded_tokens() * h) * dt),
                        d(embedded_tokens()), h),
                  stage, task.chunk, -1, mb, Phase::kBackward, {dgrad}));
    gradient_done(kVocabHead, mb, ts.cur);  // after the output layer's weight gradient on the same stream
  }
  return ts;
}

// The output layer's backward from the loss's gradient (ts.cur); returns what the final norm's backward
// waits for. Megatron under tensor parallelism (tensor_parallel/layers.py at 1e057005,
// LinearWithGradAccumulationAndAsyncCommunication.backward, lines 479-565): the input shard is all-gathered
// again, asynchronously before the dgrad GEMM; the dgrad's rows are reduce-scattered back to the sequence
// shard asynchronously, beside the weight-gradient GEMM, which waits for the gather; backward returns after
// the reduce-scatter. Elsewhere the dgrad is what the norm waits for.
int32_t Builder::head_backward(TaskState& ts, Op head, int64_t tokens) {
  const int16_t stage = ts.stage, chunk = ts.task.chunk;
  const int32_t mb = ts.task.micro_batch;
  const int32_t grad = ts.cur;
  int32_t again = -1;
  if (megatron_tp())
    again = emit(regather(head_gather(tokens)), stage, chunk, -1, mb, Phase::kBackward, {grad});
  head.part = GemmPart::kDgrad;
  ts.track(emit(head, stage, chunk, -1, mb, Phase::kBackward, {grad}));
  const int32_t dgrad = ts.cur;
  int32_t rs = -1;
  if (megatron_tp()) {
    rs = emit(te_async(coll(OpName::kHeadRs, Collective::kReduceScatter, CommGroup::kTp,
                            d(tokens * tp_ * m_.hidden) * bytes_of(dt_))),
              stage, chunk, -1, mb, Phase::kBackward, {dgrad});
  }
  head.part = GemmPart::kWgrad;
  emit(head, stage, chunk, -1, mb, Phase::kBackward, {dgrad, again});
  return rs >= 0 ? rs : dgrad;
}

// The output layer's input gathered over TP from each rank's `tokens` rows (its forward all-gather).
Op Builder::head_gather(int64_t tokens) const {
  return coll(OpName::kHeadAg, Collective::kAllGather, CommGroup::kTp,
              d(tokens * tp_ * m_.hidden) * bytes_of(dt_));
}

// The embedding of a rank's `tokens` rows. Moerun looks up its own rows in a whole table. Megatron under TP
// (VocabParallelEmbedding.forward at 1e057005, tensor_parallel/layers.py:246-275, with
// reduce_scatter_embeddings under sequence parallelism): every rank looks up all the TP group's rows in its
// vocabulary shard (reading and writing them), zeroes the rows outside it and transposes them to
// sequence-first before the reduce-scatter; backward runs the same three walks in reverse. Bytes per walk: 2,
// 1, 2 of the rows.
Op Builder::embedding_op(OpName name, int64_t tokens) const {
  const double dt = bytes_of(dt_);
  const int64_t h = m_.hidden;
  if (!megatron_tp()) return walks(mem(name, MemOp::kEmbedding, 2.0 * d(tokens * h) * dt), d(tokens), h);
  const int64_t rows = tokens * tp_;
  return walks(mem(name, MemOp::kEmbedding, 5.0 * d(rows * h) * dt, Stream::kCompute, 3), d(rows), h);
}

// Megatron's embedding output reduce-scattered to the sequence shard over TP (forward) and its gradient
// all-gathered back (backward).
Op Builder::embed_exchange(int64_t tokens, bool forward) const {
  const double bytes = d(tokens * tp_ * m_.hidden) * bytes_of(dt_);
  return forward ? coll(OpName::kEmbedRs, Collective::kReduceScatter, CommGroup::kTp, bytes)
                 : coll(OpName::kEmbedAg, Collective::kAllGather, CommGroup::kTp, bytes);
}

// The vocabulary-parallel cross-entropy's reductions over TP, after the forward loss kernels (`loss`) on `tg`
// rows, chained; returns the last (or `loss` where there are none). Megatron at 1e057005: unfused
// (tensor_parallel/cross_entropy.py:130-154) all-reduces the rows' maximum, the target logits and the sums of
// exponentials, [tg] FP32 each; the fused native loss (fusions/fused_cross_entropy.py:94, 112) the maximum,
// then the target logits and sums together; TE's (TransformerEngine v2.4 triton/cross_entropy.py:274-303)
// all-gathers each rank's [tg x 3] FP32 statistics once.
int32_t Builder::loss_reductions(TaskState& ts, int32_t loss, int64_t tg) {
  if (!megatron_tp()) return loss;
  const int16_t stage = ts.stage, chunk = ts.task.chunk;
  const int32_t mb = ts.task.micro_batch;
  const double row = 4.0 * d(tg);
  std::vector<Op> colls;
  switch (p_.cross_entropy) {
    case CrossEntropy::kUnfused:
      for (int i = 0; i < 3; ++i)
        colls.push_back(coll(OpName::kLossAr, Collective::kAllReduce, CommGroup::kTp, row, DType::kFp32));
      break;
    case CrossEntropy::kNative:
      colls.push_back(coll(OpName::kLossAr, Collective::kAllReduce, CommGroup::kTp, row, DType::kFp32));
      colls.push_back(coll(OpName::kLossAr, Collective::kAllReduce, CommGroup::kTp, 2.0 * row, DType::kFp32));
      break;
    case CrossEntropy::kTe:
      colls.push_back(
          coll(OpName::kLossAg, Collective::kAllGather, CommGroup::kTp, 3.0 * row * d(tp_), DType::kFp32));
      break;
  }
  int32_t last = loss;
  for (const Op& c : colls) last = emit(c, stage, chunk, -1, mb, Phase::kForward, {last});
  return last;
}

void Builder::task_end(TaskState& ts) {
  const PipelineTask& task = ts.task;
  const int16_t stage = ts.stage;
  const int64_t last_v = pp_ * vpp_ - 1;
  const int32_t mb = task.micro_batch;
  const double dt = bytes_of(dt_);
  const int64_t h = m_.hidden;
  if (task.forward) {
    if (ts.v == last_v && o_.embedding_and_head) {
      const int64_t tg = t_head_ * tp_;
      ts.track(emit(walks(mem(OpName::kFinalNorm, MemOp::kNorm, 3.0 * d(embedded_tokens() * h) * dt),
                          d(embedded_tokens()), h),
                    stage, task.chunk, -1, mb, Phase::kForward, {ts.cur}));
      if (megatron_tp())
        ts.track(emit(head_gather(t_head_), stage, task.chunk, -1, mb, Phase::kForward, {ts.cur}));
      Op head = gemm(OpName::kLmHead, tg, m_.vocab / tp_, h);
      in_bf16(head);  // Megatron keeps the output layer in BF16
      ts.track(emit(head, stage, task.chunk, -1, mb, Phase::kForward, {ts.cur}));
      first_forward(kVocabHead, ts.cur);
      const int32_t main_input = ts.cur;
      ts.track(emit(loss_op(OpName::kLoss, true, tg), stage, task.chunk, -1, mb, Phase::kForward, {ts.cur}));
      ts.track(loss_reductions(ts, ts.cur, tg));
      if (mtp_ > 0) {
        const int32_t loss = ts.cur;
        ts.cur = main_input;
        emit_mtp(ts);
        dep(ts.cur, loss);
      }
    }
  } else if (ts.v == 0 && o_.embedding_and_head) {
    if (megatron_tp())
      ts.track(emit(embed_exchange(embedded_tokens(), false), stage, task.chunk, -1, mb, Phase::kBackward,
                    {ts.cur}));
    ts.track(emit(embedding_op(OpName::kEmbedding, embedded_tokens()), stage, task.chunk, -1, mb,
                  Phase::kBackward, {ts.cur}));
    gradient_done(kVocabEmbedding, mb, ts.cur);
    // ZeRO >= 2 syncs after each layer's backward (backward_done); the embedding's comes after the last.
    if (p_.data.zero >= 2 && o_.data_parallel) emit_data_parallel(stage);
  }
  task_first_[task_index(mb, ts.v, task.forward)] = ts.first;
  // Send the activation (forward) or its gradient (backward) to the neighbouring virtual stage; DualPipeV's
  // turn at the last rank stays on the rank.
  const bool sends = task.forward ? ts.v < last_v : ts.v > 0;
  const int64_t next_v = task.forward ? ts.v + 1 : ts.v - 1;
  if (sends && stage_of_virtual(next_v) == stage) {
    task_send_[task_index(mb, ts.v, task.forward)] = ts.cur;
  } else if (sends) {
    const Op send = pipeline_send(m_, p_, task.forward);
    task_send_[task_index(mb, ts.v, task.forward)] =
        emit(send, stage, task.chunk, -1, mb, task.forward ? Phase::kForward : Phase::kBackward, {ts.cur});
  }
}

// One MTP module per depth (DeepSeek-V3 §2.2): norms of the hidden state and of the next token's embedding,
// a projection [2h -> h], one decoder layer, the shared output norm and head, and its loss. Forward starts
// from the trunk's last hidden state (ts.cur); backward runs before the main head's, its gradient joining
// the trunk's.
void Builder::emit_mtp(TaskState& ts) {
  const int16_t stage = ts.stage, chunk = ts.task.chunk;
  const int32_t mb = ts.task.micro_batch;
  const double dt = bytes_of(dt_);
  const int64_t h = m_.hidden, tg = t_ * tp_;
  Op norms = mem(OpName::kMtpNorm, MemOp::kNorm, 6.0 * d(t_ * h) * dt, Stream::kCompute, 2);
  Op proj = gemm(OpName::kMtpProj, tg, h / tp_, 2 * h);
  Op head = gemm(OpName::kMtpLmHead, tg, m_.vocab / tp_, h);
  in_bf16(head);
  Op final_norm = walks(mem(OpName::kMtpFinalNorm, MemOp::kNorm, 3.0 * d(t_ * h) * dt), d(t_), h);
  // Megatron under TP (transformer/multi_token_prediction.py:459-468 at 1e057005): eh_proj is TE's
  // column-parallel linear, so under sequence parallelism it all-gathers its [t, 2h] input; its [tg, h / tp]
  // output is all-gathered along the hidden dim and split back to the sequence shard. Backward: the split's
  // gradient is all-gathered, the hidden-dim gather's reduce-scattered, and the linear re-gathers its input
  // beside the dgrad (for the wgrad) and reduce-scatters the dgrad beside the wgrad, as TE's linears do.
  const Op proj_in_ag = coll(OpName::kMtpAg, Collective::kAllGather, CommGroup::kTp, d(tg * 2 * h) * dt);
  const Op out_ag = coll(OpName::kMtpOutAg, Collective::kAllGather, CommGroup::kTp, d(tg * h) * dt);
  // Megatron's copies around eh_proj (ibid.:462-466): torch.cat of the embedding and the hidden state along
  // the hidden dim (read and write [t, 2h]); under TP, _gather_along_last_dim gathers [tp x tg, h / tp] and
  // torch.cat's the chunks along the last dim (read and write [tg, h]), and its backward splits and
  // concatenates them back before the reduce-scatter (tensor_parallel/mappings.py). The concatenation's
  // backward is views; the split to the sequence shard is a view of contiguous rows.
  const Op cat = mem(OpName::kMtpCat, MemOp::kPermute, 4.0 * d(t_ * h) * dt);
  const Op gather_cat = mem(OpName::kMtpGatherCat, MemOp::kPermute, 2.0 * d(tg * h) * dt);
  LayerPass pass;
  if (ts.task.forward) {
    for (int64_t j = 0; j < mtp_; ++j) {
      const int32_t trunk = ts.cur;
      int32_t emb = emit(embedding_op(OpName::kMtpEmbedding, t_), stage, chunk, -1, mb, Phase::kForward, {});
      first_forward(kVocabMtpEmbedding, emb);
      if (megatron_tp()) emb = emit(embed_exchange(t_, true), stage, chunk, -1, mb, Phase::kForward, {emb});
      ts.track(emit(norms, stage, chunk, -1, mb, Phase::kForward, {trunk, emb}));
      if (megatron_) ts.track(emit(cat, stage, chunk, -1, mb, Phase::kForward, {ts.cur}));
      if (megatron_tp()) ts.track(emit(proj_in_ag, stage, chunk, -1, mb, Phase::kForward, {ts.cur}));
      ts.track(emit(proj, stage, chunk, -1, mb, Phase::kForward, {ts.cur}));
      if (megatron_tp()) {
        ts.track(emit(out_ag, stage, chunk, -1, mb, Phase::kForward, {ts.cur}));
        ts.track(emit(gather_cat, stage, chunk, -1, mb, Phase::kForward, {ts.cur}));
      }
      forward_begin(pass, n_main_ + j, stage, chunk, mb, ts.cur);
      for (int n = 0; n < kNodes; ++n) forward_node(pass, static_cast<Node>(n));
      ts.cur = pass.last;
      ts.track(emit(final_norm, stage, chunk, -1, mb, Phase::kForward, {ts.cur}));
      if (megatron_tp()) ts.track(emit(head_gather(t_), stage, chunk, -1, mb, Phase::kForward, {ts.cur}));
      ts.track(emit(head, stage, chunk, -1, mb, Phase::kForward, {ts.cur}));
      ts.track(emit(loss_op(OpName::kMtpLoss, true, tg), stage, chunk, -1, mb, Phase::kForward, {ts.cur}));
      ts.track(loss_reductions(ts, ts.cur, tg));
    }
    return;
  }
  for (int64_t j = mtp_; j-- > 0;) {
    ts.track(emit(loss_op(OpName::kMtpLoss, false, tg), stage, chunk, -1, mb, Phase::kBackward, {ts.cur}));
    const int32_t head_grad = head_backward(ts, head, t_);
    ts.track(emit(final_norm, stage, chunk, -1, mb, Phase::kBackward, {head_grad}));
    backward_begin(pass, n_main_ + j, stage, chunk, mb, ts.cur);
    for (int n = kNodes; n-- > 0;) backward_node(pass, static_cast<Node>(n));
    ts.cur = backward_output(pass);
    backward_done(pass);
    int32_t again = -1;
    if (megatron_tp()) {
      ts.track(emit(coll(OpName::kMtpScatterAg, Collective::kAllGather, CommGroup::kTp, d(tg * h) * dt),
                    stage, chunk, -1, mb, Phase::kBackward, {ts.cur}));
      ts.track(emit(gather_cat, stage, chunk, -1, mb, Phase::kBackward, {ts.cur}));
      ts.track(emit(coll(OpName::kMtpOutRs, Collective::kReduceScatter, CommGroup::kTp, d(tg * h) * dt),
                    stage, chunk, -1, mb, Phase::kBackward, {ts.cur}));
      again = emit(regather(proj_in_ag), stage, chunk, -1, mb, Phase::kBackward, {ts.cur});
    }
    proj.part = GemmPart::kDgrad;
    proj.aux_bytes = proj.aux_bytes > 0 ? fp8_input_cast(d(tg) * d(h / tp_)) : 0.0;
    ts.track(emit(proj, stage, chunk, -1, mb, Phase::kBackward, {ts.cur}));
    const int32_t pd = ts.cur;
    int32_t into_norms = pd;
    if (megatron_tp()) {
      into_norms =
          emit(te_async(coll(OpName::kMtpRs, Collective::kReduceScatter, CommGroup::kTp, d(tg * 2 * h) * dt)),
               stage, chunk, -1, mb, Phase::kBackward, {pd});
    }
    Op pw = proj;
    pw.part = GemmPart::kWgrad;
    without_casts(pw);
    emit(pw, stage, chunk, -1, mb, Phase::kBackward, {pd, again});
    ts.track(emit(norms, stage, chunk, -1, mb, Phase::kBackward, {into_norms}));
    // The next token's embedding takes its gradient from the norm (the table is the model's own); off the
    // trunk's path.
    int32_t emb = ts.cur;
    if (megatron_tp()) emb = emit(embed_exchange(t_, false), stage, chunk, -1, mb, Phase::kBackward, {emb});
    gradient_done(
        kVocabMtpEmbedding, mb,
        emit(embedding_op(OpName::kMtpEmbedding, t_), stage, chunk, -1, mb, Phase::kBackward, {emb}));
  }
}

void Builder::emit_task(int16_t stage, const PipelineTask& task) {
  TaskState ts = task_begin(stage, task);
  LayerPass pass;
  if (task.forward) {
    for (int64_t l = ts.l0; l < ts.l1; ++l) {
      forward_begin(pass, l, stage, task.chunk, task.micro_batch, ts.cur);
      for (int n = 0; n < kNodes; ++n) forward_node(pass, static_cast<Node>(n));
      if (ts.first < 0) ts.first = pass.first;
      ts.cur = pass.last;
    }
  } else {
    if (task.input_grad_only) {
      deferred_.emplace_back();
      deferring_ = &deferred_.back();
    }
    for (int64_t l = ts.l1; l-- > ts.l0;) {
      backward_begin(pass, l, stage, task.chunk, task.micro_batch, ts.cur);
      for (int n = kNodes; n-- > 0;) {
        backward_node(pass, static_cast<Node>(n));
        emit_delayed(pass);
      }
      if (ts.first < 0) ts.first = pass.first;
      ts.cur = backward_output(pass);
      backward_done(pass);
    }
    deferring_ = nullptr;
  }
  task_end(ts);
}

// A weights task: the weight gradients the oldest input-gradient-only backward held back, then the layers'
// gradient synchronisation where those were their last.
void Builder::emit_weights(int16_t stage) {
  if (deferred_.empty()) return;
  const std::vector<DeferredWgrad> batch = std::move(deferred_.front());
  deferred_.erase(deferred_.begin());
  for (const DeferredWgrad& w : batch) {
    const int32_t id = emit_deferred(w);
    if (w.mb == p_.num_micro_batches() - 1 || p_.data.zero >= 2) {
      layer_last_bwd_[static_cast<size_t>(w.layer)] = id;
      layer_last_side_bwd_[static_cast<size_t>(w.layer)] = -1;
    }
  }
  if (p_.data.zero >= 2 && o_.data_parallel) emit_data_parallel(stage);
}

// Megatron's combined 1F1B step (model_chunk_schedule_plan.py:236-303): forward layer i of one micro-batch
// with backward layer n-1-i of another, node by node: combine_bwd | pre_dispatch_fwd | mlp_bwd |
// dispatch_fwd | [mlp_dw] | dispatch_bwd | mlp_fwd | combine_fwd | pre_dispatch_bwd | [pre_dispatch_dw], the
// exchanges on the communication stream, the bracketed weight gradients held back by --delay-wgrad-compute;
// layers without a partner run alone.
void Builder::emit_pair(int16_t stage, const PipelineTask& fwd, const PipelineTask& bwd) {
  TaskState b = task_begin(stage, bwd);
  TaskState f = task_begin(stage, fwd);
  const int64_t nf = f.l1 - f.l0, nb = b.l1 - b.l0;
  LayerPass fp, bp;
  for (int64_t i = 0; i < std::max(nf, nb); ++i) {
    const bool has_f = i < nf, has_b = i < nb;
    if (has_f) forward_begin(fp, f.l0 + i, stage, fwd.chunk, fwd.micro_batch, f.cur);
    if (has_b) backward_begin(bp, b.l1 - 1 - i, stage, bwd.chunk, bwd.micro_batch, b.cur);
    if (has_b) backward_node(bp, Node::kCombine);
    if (has_f) forward_node(fp, Node::kPreDispatch);
    if (has_b) backward_node(bp, Node::kMlp);
    if (has_f) forward_node(fp, Node::kDispatch);
    if (has_b) {
      emit_delayed(bp);
      backward_node(bp, Node::kDispatch);
    }
    if (has_f) forward_node(fp, Node::kMlp);
    if (has_f) forward_node(fp, Node::kCombine);
    if (has_b) {
      backward_node(bp, Node::kPreDispatch);
      emit_delayed(bp);
    }
    if (has_f) {
      if (f.first < 0) f.first = fp.first;
      f.cur = fp.last;
    }
    if (has_b) {
      if (b.first < 0) b.first = bp.first;
      b.cur = backward_output(bp);
      backward_done(bp);
    }
  }
  task_end(f);
  task_end(b);
}

// Gradient synchronisation of the layers whose last backward was just recorded (ZeRO-3: per micro-batch), the
// optimizer step, and (ZeRO >= 1) the parameter all-gather.
void Builder::emit_data_parallel(int16_t stage) {
  const bool bf16_a2a = p_.compression.grad_sync == GradSync::kBf16AllToAll;
  // The reduction of `params` gradients over `group`: all-reduced without ZeRO, else reduce-scattered, in the
  // main-gradient buffer's bytes.
  auto grad_reduce = [&](double params, CommGroup group) {
    const double grad_bytes = main_grad_bytes(p_);
    Op rs = base(OpName::kGradRs, OpKind::kCollective, dp_stream_);
    rs.comm = comm(p_.data.zero == 0 ? Collective::kAllReduce : Collective::kReduceScatter, group,
                   params * grad_bytes, grad_bytes == 2.0 ? DType::kBf16 : DType::kFp32);
    return rs;
  };
  // One layer's synchronisation, after `after` (and the side stream's last backward op of the layer).
  auto sync_layer = [&](size_t l, int32_t after, int32_t side) {
    const auto [dense, experts] = local_params(static_cast<int64_t>(l));
    for (auto [params, group] :
         {std::pair{dense, CommGroup::kAttnReplica}, std::pair{experts, CommGroup::kExpertDp}}) {
      const CommSpec probe = comm(Collective::kReduceScatter, group, 0, DType::kFp32);
      if (params <= 0 || probe.group_size <= 1) continue;
      const auto L = static_cast<int32_t>(l);
      if (bf16_a2a) {
        // BF16 all-to-all of the shards + local FP32 reduce (MegaScale-MoE §5).
        int32_t x = emit(mem(OpName::kGradCast, MemOp::kCast, params * 6.0, dp_stream_), stage, 0, L, -1,
                         Phase::kBackward, {after, side});
        Op a2a = base(OpName::kGradA2a, OpKind::kCollective, dp_stream_);
        a2a.comm = comm(Collective::kAllToAll, group, params * 2.0, DType::kBf16);
        x = emit(a2a, stage, 0, L, -1, Phase::kBackward, {x});
        emit(mem(OpName::kGradReduce, MemOp::kReduce, params * 2.0 + params / d(probe.group_size) * 8.0,
                 dp_stream_),
             stage, 0, L, -1, Phase::kBackward, {x});
      } else {
        emit(grad_reduce(params, group), stage, 0, L, -1, Phase::kBackward, {after, side});
      }
    }
  };
  // The parts outside the layers, in the gradient buffer as any parameter (DDP buckets): reduced over the
  // attention replicas like the layers' dense parameters (the BF16 all-to-all sync is MegaScale-MoE's for
  // its layers; these take the reduce-scatter).
  auto sync_vocab = [&](int part, int32_t after) {
    const double params = vocab_params(part, stage);
    const Op rs = grad_reduce(params, CommGroup::kAttnReplica);
    if (params <= 0 || rs.comm.group_size <= 1) return;
    emit(rs, stage, 0, -1, -1, Phase::kBackward, {after});
  };
  // In the order the backward completes their gradients (the op after which each is complete, by id:
  // program order), so that the in-order DP stream starts each synchronisation as soon as it can: the output
  // layer's (and an MTP copy's) before the layers' of its pass, the layers last first, the embedding's last.
  // Megatron's DDP buckets fill in that order too: reversed parameter order, the output layer's first
  // (distributed/param_and_grad_buffer.py:1236 at d98e8a64).
  struct Pending {
    int32_t after;
    int part;  // -1: layer `index`
    size_t index;
  };
  std::vector<Pending> pending;
  for (size_t l = layer_last_bwd_.size(); l-- > 0;) {
    if (layer_last_bwd_[l] >= 0) pending.push_back({layer_last_bwd_[l], -1, l});
  }
  for (int part = kVocabParts; part-- > 0;) {
    if (vocab_last_bwd_[static_cast<size_t>(part)] >= 0)
      pending.push_back({vocab_last_bwd_[static_cast<size_t>(part)], part, 0});
  }
  std::stable_sort(pending.begin(), pending.end(),
                   [](const Pending& a, const Pending& b) { return a.after < b.after; });
  for (const Pending& x : pending) {
    if (x.part < 0) {
      const int32_t side = layer_last_side_bwd_[x.index];
      layer_last_bwd_[x.index] = -1;
      sync_layer(x.index, x.after, side);
    } else {
      vocab_last_bwd_[static_cast<size_t>(x.part)] = -1;
      sync_vocab(x.part, x.after);
    }
  }
}

// FP8: TE quantises each GEMM weight (and its transpose) once per step, at the first micro-batch, and caches
// it (Megatron passes is_first_microbatch; grouped_linear.py quantize_weight). With FP8 parameters
// (fp8_param_gather) nothing is quantised in the forward: the transpose of each gathered weight is made
// after its all-gather (Megatron's post_all_gather_processing: 1 B read, 1 B written per element).
void Builder::emit_weight_casts(int16_t stage, const std::vector<int64_t>& stage_layers) {
  weight_cast_ = -1;
  if (p_.precision != Precision::kFp8) return;
  double params = 0;
  for (int64_t l : stage_layers) {
    const auto [dense, experts] = local_params(l);
    params += dense + experts;
  }
  if (params <= 0) return;
  const double bytes_per_element = fp8_params(p_) ? 2.0 : fp8_cast_bytes_per_element(p_.fp8_recipe);
  Op cast = mem(OpName::kWeightCast, MemOp::kCast, params * bytes_per_element);
  cast.kernels =
      static_cast<uint16_t>(std::min<int64_t>(65535, 4 * static_cast<int64_t>(stage_layers.size())));
  weight_cast_ = emit(cast, stage, 0, -1, 0, Phase::kForward, {});
}

OpGraph Builder::build() {
  const int64_t mbs = p_.num_micro_batches();
  g_.num_stages = static_cast<int>(pp_);
  g_.chunks_per_stage = static_cast<int>(vpp_);
  g_.micro_batches = mbs;

  // Distinct layer recipes: recorded once per distinct (moe, window, kv_projection).
  const size_t n_all = static_cast<size_t>(n_main_ + mtp_);
  recipe_of_layer_.assign(n_all, -1);
  chunk_position_.assign(n_all, 0);
  for (size_t v = 0; v + 1 < first_layer_.size(); ++v) {
    for (int64_t l = first_layer_[v]; l < first_layer_[v + 1]; ++l)
      chunk_position_[static_cast<size_t>(l)] = l - first_layer_[v];
  }
  std::vector<LayerSpec> kinds;
  for (size_t l = 0; l < n_all; ++l) {
    const LayerSpec& s = spec_of(static_cast<int64_t>(l));
    auto it = std::find_if(kinds.begin(), kinds.end(), [&](const LayerSpec& k) { return k.same_kind(s); });
    if (it == kinds.end()) {
      kinds.push_back(s);
      record_layer(static_cast<int64_t>(l));
      Recipe rc;
      rc.ops = layer_ops_;
      rc.graph_fwd_copy = graph_fwd_copy_;
      rc.graph_bwd_copy = graph_bwd_copy_;
      rc.consumers.resize(rc.ops.size());
      for (size_t i = 0; i < rc.ops.size(); ++i) {
        for (int in : rc.ops[i].inputs) {
          if (in >= 0) rc.consumers[static_cast<size_t>(in)].push_back(i);
        }
      }
      // Nodes are contiguous in recording order; an absent node is an empty range at its place.
      size_t pos = 0;
      for (int n = 0; n < kNodes; ++n) {
        const size_t b = pos;
        while (pos < rc.ops.size() && static_cast<int>(rc.ops[pos].node) == n) ++pos;
        rc.nodes[static_cast<size_t>(n)] = {b, pos};
      }
      MOEPLAN_ASSERT(pos == rc.ops.size());
      recipes_.push_back(std::move(rc));
      it = kinds.end() - 1;
    }
    recipe_of_layer_[l] = static_cast<int>(it - kinds.begin());
  }

  size_t per_step = 0;
  for (size_t l = 0; l < n_all; ++l) per_step += recipe_of(static_cast<int64_t>(l)).ops.size();
  g_.ops.reserve(static_cast<size_t>(mbs) * per_step * 4 + 1024);
  dep_pairs_.reserve(g_.ops.capacity() * 2);
  const size_t tasks = static_cast<size_t>(mbs * pp_ * vpp_ * 2);
  task_first_.assign(tasks, -1);
  task_send_.assign(tasks, -1);
  layer_last_bwd_.assign(n_all, -1);
  if (p_.cuda_graphs != 0) graph_open_.assign(static_cast<size_t>(pp_), -1);
  layer_last_side_bwd_.assign(n_all, -1);
  layer_first_fwd_.assign(n_all, -1);
  layer_param_gather_.assign(n_all, -1);

  for (int16_t stage = 0; stage < pp_; ++stage) {
    last_dp_op_ = -1;
    std::fill(layer_first_fwd_.begin(), layer_first_fwd_.end(), -1);
    vocab_last_bwd_.fill(-1);
    vocab_first_fwd_.fill(-1);
    vocab_gather_.fill(-1);
    std::vector<int64_t> stage_layers;
    for (int16_t c = 0; c < vpp_; ++c) {
      const int64_t v = vstage(c, stage);
      for (int64_t l = first_layer_[static_cast<size_t>(v)]; l < first_layer_[static_cast<size_t>(v) + 1];
           ++l) {
        stage_layers.push_back(l);
      }
      if (v == pp_ * vpp_ - 1) {
        for (int64_t j = 0; j < mtp_; ++j) stage_layers.push_back(n_main_ + j);
      }
    }
    // ZeRO-1/2 with overlapped DP communication: parameters updated by the previous step are gathered layer
    // by layer ahead of their first forward (Megatron overlaps this all-gather with the forward pass). The
    // parts outside the layers are gathered so under ZeRO-3 too: Megatron-FSDP shards only its units (the
    // decoder layers, mcore_fsdp_adapter.py:171) per pass; the embedding and output layer are the root's
    // parameters, gathered once after the step and kept (no post-forward release outside units, their
    // buckets PRESERVED across micro-batches: megatron_fsdp.py:1089-1101, param_and_grad_buffer.py:4339-4371
    // at d98e8a64).
    const bool overlapped = p_.overlap.dp_comm && o_.data_parallel;
    const bool prefetch = (p_.data.zero == 1 || p_.data.zero == 2) && overlapped;
    const bool prefetch_vocab = p_.data.zero >= 1 && overlapped;
    if (prefetch_vocab) {
      for (int part = 0; part < kVocabParts; ++part)
        vocab_gather_[static_cast<size_t>(part)] =
            emit_vocab_gather(part, stage, Phase::kForward, Stream::kDpComm);
    }
    if (prefetch) {
      for (int64_t l : stage_layers) {
        layer_param_gather_[static_cast<size_t>(l)] =
            emit_param_gather(l, stage, 0, -1, Phase::kForward, Stream::kDpComm);
      }
    }
    emit_weight_casts(stage, stage_layers);
    const std::vector<PipelineTask> order = pipeline_order(stage, pp_, vpp_, mbs, combined_, schedule_);
    deferred_.clear();
    for (size_t i = 0; i < order.size(); ++i) {
      const PipelineTask& task = order[i];
      if (task.weights) {
        emit_weights(stage);
        if (p_.data.zero < 2 && o_.data_parallel) emit_data_parallel(stage);
        continue;
      }
      if (task.paired && i + 1 < order.size() && !order[i + 1].forward) {
        emit_pair(stage, task, order[i + 1]);
        ++i;
        if (p_.data.zero < 2 && o_.data_parallel) emit_data_parallel(stage);
        continue;
      }
      emit_task(stage, task);
      if (!task.forward && p_.data.zero < 2 && o_.data_parallel) emit_data_parallel(stage);
    }
    if (prefetch) {
      for (int64_t l : stage_layers) {
        dep(layer_first_fwd_[static_cast<size_t>(l)], layer_param_gather_[static_cast<size_t>(l)]);
      }
    }
    if (prefetch_vocab) {
      for (int part = 0; part < kVocabParts; ++part)
        dep(vocab_first_fwd_[static_cast<size_t>(part)], vocab_gather_[static_cast<size_t>(part)]);
    }
    if (!o_.data_parallel) continue;
    // Optimizer step over this rank's shard, once every gradient of the stage is synchronised.
    double shard = 0;
    for (int64_t l : stage_layers) {
      const auto [dense, experts] = local_params(l);
      shard += p_.data.zero == 0 ? dense + experts : dense / d(sp_ * cp_ * dp_) + experts / d(edp_);
    }
    for (int part = 0; part < kVocabParts; ++part) {
      const double params = vocab_params(part, stage);
      shard += p_.data.zero == 0 ? params : params / d(sp_ * cp_ * dp_);
    }
    int32_t ready = g_.ops.back().id;
    if (megatron_tp()) {
      const bool last = stage == stage_of_virtual(pp_ * vpp_ - 1);
      ready = emit_tp_replicated_grad_sync(stage, stage_layers, last, ready);
    }
    ready = emit_embedding_grad_sync(stage, ready);
    Op opt = base(OpName::kOptimizerStep, OpKind::kOptimizer, Stream::kCompute);
    opt.hbm_bytes = shard * kAdamStepBytesPerParam;
    opt.flops = shard * 12.0;
    opt.kernels = 4;  // Megatron's fused multi-tensor Adam: a few launches per parameter group
    const int32_t o = emit(opt, stage, 0, -1, -1, Phase::kOptimizer, {ready, last_dp_op_});
    // Without overlap the updated parameters are gathered after the step, exposed.
    if (!prefetch && (p_.data.zero == 1 || p_.data.zero == 2)) {
      for (int64_t l : stage_layers)
        emit_param_gather(l, stage, 0, -1, Phase::kOptimizer, Stream::kCompute, o);
    }
    if (!prefetch_vocab && p_.data.zero >= 1) {
      for (int part = 0; part < kVocabParts; ++part)
        emit_vocab_gather(part, stage, Phase::kOptimizer, Stream::kCompute, o);
    }
  }

  // Cross-stage edges: a task waits for the send of its predecessor virtual stage.
  for (int64_t mb = 0; mb < mbs; ++mb) {
    for (int64_t v = 0; v < pp_ * vpp_; ++v) {
      if (v > 0) dep(task_first_[task_index(mb, v, true)], task_send_[task_index(mb, v - 1, true)]);
      if (v < pp_ * vpp_ - 1)
        dep(task_first_[task_index(mb, v, false)], task_send_[task_index(mb, v + 1, false)]);
    }
  }

  // Flatten dependencies (counting sort by op).
  std::vector<uint32_t> count(g_.ops.size() + 1, 0);
  for (auto [op, on] : dep_pairs_) ++count[static_cast<size_t>(op) + 1];
  for (size_t i = 1; i < count.size(); ++i) count[i] += count[i - 1];
  g_.deps.resize(dep_pairs_.size());
  std::vector<uint32_t> fill(count.begin(), count.end() - 1);
  for (auto [op, on] : dep_pairs_) g_.deps[fill[static_cast<size_t>(op)]++] = on;
  // The stages' id ranges, checked here: the loop above emits stage after stage.
  g_.stage_first.assign(static_cast<size_t>(g_.num_stages) + 1, 0);
  bool in_order = true;
  for (size_t i = 0; i < g_.ops.size(); ++i) {
    prefetch_op_ahead(g_.ops, i);
    Op& op = g_.ops[i];
    op.dep_begin = count[i];
    op.dep_count = count[i + 1] - count[i];
    const auto s = static_cast<size_t>(op.stage);
    in_order =
        in_order && s < static_cast<size_t>(g_.num_stages) && (i == 0 || op.stage >= g_.ops[i - 1].stage);
    if (in_order) g_.stage_first[s + 1] = static_cast<uint32_t>(i + 1);
  }
  // Stages without ops end where the one before them ends.
  for (size_t s = 1; s < g_.stage_first.size(); ++s)
    g_.stage_first[s] = std::max(g_.stage_first[s], g_.stage_first[s - 1]);
  if (!in_order) g_.stage_first.clear();
  return std::move(g_);
}

// q(S, g): the chance that a set of g experts gets none of k distinct picks among S.
double miss(double s, double g, int64_t k) {
  double q = 1.0;
  for (int64_t i = 0; i < k; ++i) q *= std::max(0.0, (s - g - d(i)) / (s - d(i)));
  return q;
}

// log C(n, r) for the hypergeometric weights.
double log_choose(int64_t n, int64_t r) {
  return std::lgamma(d(n) + 1) - std::lgamma(d(r) + 1) - std::lgamma(d(n - r) + 1);
}

// Expected distinct units (nodes or ranks) of `units` equal units holding E experts that a token reaches
// with k picks inside M of G groups (see lower.h).
double distinct_units(int64_t e, int64_t k, int64_t units, int64_t groups, int64_t m) {
  if (units <= 1) return 1.0;
  const double per_unit = d(e) / d(units);
  if (groups <= 1 || m >= groups) return d(units) * (1.0 - miss(d(e), per_unit, k));
  const double per_group = d(e) / d(groups);
  const double candidates = d(m) * per_group;
  if (groups % units == 0) {
    // Each unit holds c whole groups; j of them are among the token's M (hypergeometric).
    const int64_t c = groups / units;
    double hit = 0;
    for (int64_t j = 1; j <= std::min(c, m); ++j) {
      if (m - j > groups - c) continue;
      const double pj = std::exp(log_choose(c, j) + log_choose(groups - c, m - j) - log_choose(groups, m));
      hit += pj * (1.0 - miss(candidates, d(j) * per_group, k));
    }
    return d(units) * hit;
  }
  if (units % groups == 0) {
    // Each group spans r units; the token's M groups cover M r candidate units.
    const int64_t r = units / groups;
    return d(m * r) * (1.0 - miss(candidates, per_unit, k));
  }
  // Groups straddle units unevenly: without the limit (an upper bound on the spread).
  return d(units) * (1.0 - miss(d(e), per_unit, k));
}

}  // namespace

LoweringOptions lowering_options(const HardwareProfile& hw, const StackProfile& stack) {
  LoweringOptions o;
  o.gpus_per_node = hw.node.gpus_per_node.value;
  o.dispatcher = stack.dispatcher.kind.value;
  o.dispatcher_host_sync = stack.dispatcher.host_sync.value;
  o.permute_fused = stack.dispatcher.permute_fused.value;
  o.permute_host_waits = static_cast<int>(stack.dispatcher.permute_host_waits.value);
  o.permute_index_kernels = static_cast<int>(stack.dispatcher.permute_index_kernels.value);
  o.permute_index_backward_kernels = static_cast<int>(stack.dispatcher.permute_index_backward_kernels.value);
  o.eager_output_bias = stack.expert_mlp.eager_output_bias.value;
  o.eager_glu_clamp = stack.expert_mlp.eager_glu_clamp.value;
  o.wgrad_into_main_grad = stack.wgrad_accumulation.into_main_grad.value;
  o.eager_framework = stack.dispatcher.kind.value != DispatcherKind::kFused;
  // The Megatron stacks' ZeRO-3 is Megatron-FSDP (as the memory model takes it, memory.cpp fused_stack).
  o.zero3_backward_prefetch = o.eager_framework;
  o.mla_down_proj = stack_mla_down_proj(stack);
  o.fp8_padding = stack_fp8_padding(stack);
  return o;
}

double fp8_cast_bytes_per_element(Fp8Recipe r) {
  switch (r) {
    case Fp8Recipe::kDelayed:
      return 4.0;
    case Fp8Recipe::kTensorwise:
      return 6.0;
    case Fp8Recipe::kBlockwise:
    case Fp8Recipe::kMxfp8:
      return 2.0 + 2.0 * kFp8ScaleOverhead;
  }
  return 4.0;
}

int wgrad_accum_bytes(const Plan& plan, const LoweringOptions& options) {
  // ZeRO-2/3 run as Megatron-FSDP, which Megatron-Core's guide (and `moeplan launch`) pairs with
  // --no-gradient-accumulation-fusion: each weight gradient is then written once.
  if (!options.wgrad_into_main_grad || plan.data.zero >= 2) return 0;
  return static_cast<int>(main_grad_bytes(plan));
}

RouterKernels megatron_router_kernels(const MoeSpec& e, bool fused, bool partitioned) {
  // Read from Megatron-LM's TopKRouter (router.py) and moe_utils.py: the eager router at 1e057005 (the
  // ModelZoo runs' commit, before --moe-router-fusion existed) and the fused one at 2edffadb (Megatron-Bridge
  // v0.4.2's), with TE's fused router functions (transformer_engine/pytorch/router.py, common/fused_router:
  // one kernel each way, the aux loss one kernel forward up to TE 2.15). Counted per kernel: a view launches
  // none; a sorted torch.topk selects then sorts (2), out-of-place scatter and masked_fill copy first (2);
  // a collective is one. Megatron's recipes route in fp32 (--moe-router-dtype fp32: two casts each way at
  // 1e057005; at 2edffadb the gating function casts only in its backward, four) and balance DeepSeek-style
  // routers (score-correction bias) with the sequence aux loss, the others with the switch aux loss.
  // Check: DeepSeek-V3's router gives 47 + 30 = 77 unfused and 10 + 11 = 21 fused, against "72" and "31"
  // for its router part before and after fusion in Megatron's GB200 notes (3c1b98ef^, l.85), forward and
  // backward together (an earlier fused implementation).
  const bool sigmoid = e.score == RouterScore::kSigmoid, bias = e.router_score_bias;
  const bool seq_aux = bias;  // the recipes' aux loss for routers with a score-correction bias
  const bool scaled = e.routed_scaling != 1.0;
  const int collective = partitioned ? 1 : 0;  // over TP x CP: the token counts' all-reduce (switch loss),
                                               // the probs' all-gather (sequence loss, reduce-scatter back)
  RouterKernels k;
  if (fused) {
    // Forward: fused top-k, fused aux scores, tokens per expert (sum) and their all-reduce, fused aux loss
    // (sequence loss: / batch), / coeff and the logging tracker's add, the expert bias's count (sum, add).
    k.forward = 3 + collective + 1 + (seq_aux ? 1 : 0) + 2 + (bias ? 2 : 0);
    // Backward: the aux-loss scaler (ones, scale), [/ batch], the three fused backwards, the two gradients
    // summed into the logits', the gating function's four casts.
    k.backward = 2 + (seq_aux ? 1 : 0) + 3 + 1 + 4;
    return k;
  }
  // Forward: the input and weight cast to fp32; the scores and top-k; the masked gates (zeros, scatter),
  // the routing map (zeros, int, scatter, bool) and tokens per expert (sum); the aux loss's scores, the loss
  // and the logging tracker (divide, add in place); the expert bias's count.
  const int top_k = e.group_limited() ? 13  // group scores (top-k, sum), group top-k, mask (zeros, scatter,
                                            // expand copy, bool, not), masked_fill, masked top-k
                                      : 2;
  const int scores = sigmoid ? 1 + (bias ? 2 : 0) + top_k + 3  // sigmoid, [+bias, gather], sum, add, div
                             : top_k + 1;                      // top-k of the logits, softmax
  const int aux_loss = (seq_aux ? 7 : 4) + collective;
  k.forward = 2 + scores + (scaled ? 1 : 0) + 9 + (sigmoid ? 4 : 1) + aux_loss + 2 + (bias ? 2 : 0);
  // Backward: the aux-loss scaler (ones, scale); the loss back to its scores (sequence: scale, mean, mul,
  // mean [, reduce-scatter]; switch: scale, mul) and through them (sigmoid: the division's 6, an add, the
  // sigmoid; softmax: contiguous, softmax); the probs through the gates' scatter (a gather), [the scaling],
  // and the division, the gather (zeros, scatter-add) and the sigmoid, or the softmax and the top-k (zeros,
  // scatter); both paths summed into the logits' gradient; the two casts.
  const int loss_back = (seq_aux ? 4 + collective : 2) + (sigmoid ? 8 : 2);
  const int probs_back = 1 + (scaled ? 1 : 0) + (sigmoid ? 10 : 3);
  k.backward = 2 + loss_back + probs_back + 1 + 2;
  return k;
}

StackLowering stack_lowering(const ModelSpec& model, const Plan& plan, const HardwareProfile& hw,
                             const StackProfile& stack, const workload::RoutingDistribution& routing) {
  StackLowering out;
  out.run = with_stack_overlaps(plan, stack, &out.notices);
  out.routing = workload::plan_routing(model, out.run, routing);
  out.options = lowering_options(hw, stack);
  set_routing(out.options, out.routing);
  return out;
}

void set_routing(LoweringOptions& o, const workload::PlanRouting& r) {
  o.expert_load_scale = r.scale;
  o.dropped_fraction = r.load.dropped_fraction;
  o.decoder_expert_load_scale = r.decoder_scale;
  o.decoder_dropped_fraction = r.decoder_load.dropped_fraction;
}

CommSpec group_comm(const Plan& p, Collective c, CommGroup g, double bytes, DType dtype) {
  const int64_t tp = p.attention.tp, sp = p.attention.sp, cp = p.attention.cp;
  const int64_t ep = p.experts.ep, etp = p.experts.etp;
  CommSpec s;
  s.collective = c;
  s.group = g;
  s.bytes = bytes;
  s.dtype = dtype;
  auto set = [&s](int64_t size, int64_t stride) {
    s.group_size = static_cast<int32_t>(size);
    s.stride = static_cast<int32_t>(stride);
  };
  // Rank order, innermost first: attention tp, sp, cp, dp; experts etp, ep, expert-dp; then pp.
  switch (g) {
    case CommGroup::kTp:
      set(tp, 1);
      break;
    case CommGroup::kSp:
      set(sp, tp);
      break;
    case CommGroup::kCp:
      set(cp, tp * sp);
      break;
    case CommGroup::kDp:
      set(p.dp(), tp * sp * cp);
      break;
    case CommGroup::kAttnReplica:
      set(sp * cp * p.dp(), tp);
      break;
    case CommGroup::kEtp:
      set(etp, 1);
      break;
    case CommGroup::kEp:
      set(ep, etp);
      break;
    case CommGroup::kExpertDp:
      set(p.expert_dp(), ep * etp);
      break;
    case CommGroup::kPp:
      set(2, p.gpus / p.pipeline.pp);
      break;
    case CommGroup::kNone:
      break;
  }
  return s;
}

Op pipeline_send(const ModelSpec& model, const Plan& plan, bool forward) {
  Op send;
  send.name = static_cast<uint16_t>(forward ? OpName::kPpSendFwd : OpName::kPpSendBwd);
  send.kind = OpKind::kSendRecv;
  send.stream = plan.overlap.pp_comm ? Stream::kPpComm : Stream::kCompute;
  send.dtype = op_dtype(plan);
  const int64_t tokens = plan.micro_batch * plan.seq_len / plan.attention_mesh();
  send.comm =
      group_comm(plan, Collective::kSendRecv, CommGroup::kPp, d(tokens * model.hidden) * 2.0, DType::kBf16);
  return send;
}

std::vector<int64_t> layers_per_virtual_stage(const ModelSpec& model, const Plan& plan) {
  const int64_t chunks = plan.pipeline.pp * plan.pipeline.vpp;
  if (!plan.pipeline.layers_per_stage.empty()) return plan.pipeline.layers_per_stage;
  std::vector<int64_t> out(static_cast<size_t>(chunks), model.num_layers() / chunks);
  for (int64_t i = 0; i < model.num_layers() % chunks; ++i) ++out[static_cast<size_t>(i)];
  return out;
}

namespace {

// DualPipeV's order on rank `r` of `d` ranks for `m` micro-batches, as dualpipev.py step() issues it.
std::vector<PipelineTask> dualpipev_order(int64_t r, int64_t d, int64_t m) {
  std::vector<PipelineTask> out;
  int32_t next_f[2] = {0, 0}, next_b[2] = {0, 0};
  auto f = [&](int16_t c, bool paired = false) {
    out.push_back({true, next_f[c]++, c, paired, false, false});
  };
  auto b = [&](int16_t c, bool zb = false) { out.push_back({false, next_b[c]++, c, false, zb, false}); };
  auto w = [&]() { out.push_back({false, 0, 0, false, false, true}); };
  for (int64_t i = 0; i < (d - r - 1) * 2; ++i) f(0);  // 1: nF0
  for (int64_t i = 0; i < r + 1; ++i) f(0), f(1);      // 2: nF0F1
  for (int64_t i = 0; i < d - r - 1; ++i) {            // 3: nB1W1F1 (zero bubble)
    b(1, true);
    w();
    f(1);
  }
  for (int64_t i = 0; i < m - 2 * d + r + 1; ++i) {  // 4: nF0B1F1B0 (the last rank's first pair alone)
    const bool alone = i == 0 && r == d - 1;
    f(0, !alone);
    b(1);
    f(1, true);
    b(0);
  }
  for (int64_t i = 0; i < d - r - 1; ++i) {  // 5: nB1F1B0
    b(1);
    f(1, true);
    b(0);
  }
  const int64_t step6 = r + 1;  // 6: nB1B0, the second half zero bubble
  bool zb = false;
  for (int64_t i = 0; i < step6; ++i) {
    if (i == step6 / 2 && r % 2 == 1) zb = true;
    b(1, zb);
    if (i == step6 / 2 && r % 2 == 0) zb = true;
    b(0, zb);
  }
  for (int64_t i = 0; i < d - r - 1; ++i) {  // 7: nWB0 (zero bubble)
    w();
    b(0, true);
  }
  for (int64_t i = 0; i < r + 1; ++i) w();  // 8: nW
  return out;
}

}  // namespace

std::vector<PipelineTask> pipeline_order(int64_t stage, int64_t stages, int64_t chunks, int64_t micro_batches,
                                         bool combined, Schedule schedule) {
  if (schedule == Schedule::kDualPipeV) return dualpipev_order(stage, stages, micro_batches);
  std::vector<PipelineTask> order;
  const int64_t total = micro_batches * chunks;
  order.reserve(static_cast<size_t>(2 * total));
  // k-th forward / backward of this stage -> (micro-batch, chunk), Megatron-Core's interleaved mapping
  // (chunks = 1 reduces to plain 1F1B): groups of `stages` micro-batches cycle through the chunks.
  auto fwd = [&](int64_t k) {
    const int64_t group = k / (stages * chunks), in_group = k % (stages * chunks);
    return PipelineTask{true,
                        static_cast<int32_t>(group * stages + in_group % stages),
                        static_cast<int16_t>(in_group / stages),
                        false,
                        false,
                        false};
  };
  auto bwd = [&](int64_t k) {
    PipelineTask t = fwd(k);
    t.forward = false;
    t.chunk = static_cast<int16_t>(chunks - 1 - t.chunk);
    return t;
  };
  int64_t warmup = chunks == 1 ? std::min(stages - stage - 1, total)
                               : std::min((stages - stage - 1) * 2 + (chunks - 1) * stages, total);
  // Combined 1F1B: the forward and backward of one step must be independent, so one more micro-batch warms
  // up (schedules.py:966-970; at pp = 1 the first forward runs alone).
  if (combined) warmup = std::min(warmup + 1, total);
  int64_t f = 0, b = 0;
  for (; f < warmup; ++f) order.push_back(fwd(f));
  while (f < total) {
    PipelineTask t = fwd(f++);
    t.paired = combined;
    order.push_back(t);
    order.push_back(bwd(b++));
  }
  while (b < total) order.push_back(bwd(b++));
  return order;
}

int64_t peak_in_flight(const std::vector<PipelineTask>& order) {
  int64_t live = 0, peak = 0;
  for (const auto& t : order) {
    if (t.weights) continue;  // weight gradients free no activation chunk of their own here
    live += t.forward ? 1 : -1;
    peak = std::max(peak, live);
  }
  return peak;
}

std::vector<int64_t> peak_in_flight_by_chunk(const std::vector<PipelineTask>& order, int64_t chunks,
                                             const std::vector<double>& chunk_weight) {
  MOEPLAN_ASSERT(static_cast<int64_t>(chunk_weight.size()) == chunks);
  std::vector<int64_t> live(static_cast<size_t>(chunks), 0), best = live;
  double best_weight = -1;
  int64_t best_count = -1;
  auto consider = [&](const std::vector<int64_t>& set) {
    double w = 0;
    int64_t n = 0;
    for (size_t c = 0; c < set.size(); ++c) {
      w += d(set[c]) * chunk_weight[c];
      n += set[c];
    }
    if (w > best_weight || (w == best_weight && n > best_count)) {
      best_weight = w;
      best_count = n;
      best = set;
    }
  };
  for (size_t i = 0; i < order.size(); ++i) {
    const PipelineTask& t = order[i];
    if (t.weights) continue;  // weight gradients free no chunk of their own here
    const auto fc = static_cast<size_t>(t.chunk);
    if (t.forward && t.paired && i + 1 < order.size() && !order[i + 1].forward) {
      // The pair holds the heavier of the two chunks while forward layers grow as backward layers free.
      const auto bc = static_cast<size_t>(order[i + 1].chunk);
      std::vector<int64_t> during = live;
      if (chunk_weight[fc] > chunk_weight[bc]) {
        --during[bc];
        ++during[fc];
      }
      consider(during);
      ++live[fc];
      --live[bc];
      ++i;
      continue;
    }
    live[fc] += t.forward ? 1 : -1;
    consider(live);
  }
  return best;
}

std::vector<std::vector<int64_t>> in_flight_by_chunk(const ModelSpec& model, const Plan& plan) {
  const int64_t pp = plan.pipeline.pp, vpp = plan.pipeline.vpp;
  const std::vector<int64_t> layers = layers_per_virtual_stage(model, plan);
  std::vector<std::vector<int64_t>> out;
  for (int64_t s = 0; s < pp; ++s) {
    std::vector<double> weight(static_cast<size_t>(vpp), 0.0);
    for (int64_t c = 0; c < vpp; ++c) {
      const int64_t v = virtual_stage(c, s, pp, plan.pipeline.schedule);
      weight[static_cast<size_t>(c)] =
          d(layers[static_cast<size_t>(v)]) + (v == pp * vpp - 1 ? d(model.mtp_layers) : 0.0);
    }
    out.push_back(
        peak_in_flight_by_chunk(pipeline_order(s, pp, vpp, plan.num_micro_batches(),
                                               plan.overlap.cross_micro_batch, plan.pipeline.schedule),
                                vpp, weight));
  }
  return out;
}

DedupVolumes dedup_volumes(int64_t experts, int64_t top_k, int64_t ranks, int64_t per_node, int64_t groups,
                           int64_t group_top_k) {
  DedupVolumes v;
  per_node = std::max<int64_t>(1, std::min(per_node, ranks));
  const int64_t nodes = std::max<int64_t>(1, ranks / per_node);
  const int64_t m = std::clamp<int64_t>(group_top_k, 1, std::max<int64_t>(1, groups));
  v.nodes = distinct_units(experts, top_k, nodes, groups, m);
  v.own_node = v.nodes / d(nodes);  // every node is equally likely
  v.ranks = distinct_units(experts, top_k, ranks, groups, m);
  return v;
}

double dedup_nic_scale(int64_t experts, int64_t top_k, int64_t nodes) {
  if (nodes <= 1 || top_k <= 0) return 1.0;
  // P(no expert of a given node among the token's k) = C(E - E/N, k) / C(E, k) = prod_{i<k} (E - E/N - i)/(E
  // - i)
  const double e = d(experts), per_node = e / d(nodes);
  double miss = 1.0;
  for (int64_t i = 0; i < top_k; ++i) miss *= std::max(0.0, (e - per_node - d(i)) / (e - d(i)));
  const double dedup_copies = d(nodes - 1) * (1.0 - miss);
  const double plain_copies = d(top_k) * d(nodes - 1) / d(nodes);
  return dedup_copies / plain_copies;
}

OpGraph lower(const ModelSpec& model, const Plan& plan, const LoweringOptions& options) {
  MOEPLAN_ASSERT(options.expert_load_scale >= 1.0 - 1e-9);
  return Builder(model, plan, options).build();
}

}  // namespace moeplan
