// Lowering of (model, plan) to the op graph of one training step. Shapes follow MegaScale-MoE's per-layer
// data flow (megascale-moe.md §3.5) for Ulysses SP + EP, and Megatron-Core's for TP with sequence
// parallelism, CP, ETP and pipeline schedules. Notation: b micro-batch, s sequence, h hidden, t =
// b*s/(tp*sp*cp) tokens per rank.
#include "simulator/workload/lower.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "simulator/core/model_stats.h"
#include "simulator/core/status.h"

namespace moeplan {
namespace {

constexpr double kFp8ScaleOverhead = 1.0 + 4.0 / 128.0;  // one fp32 scale per 128 fp8 values
constexpr double kAttentionBackwardFlops = 2.5;          // flash-attention backward recomputes the scores
constexpr double kAdamBytesPerParam =
    30.0;  // read grad 4, read+write master 8, m 8, v 8, write bf16 weight 2

double d(int64_t x) {
  return static_cast<double>(x);
}

// One op of a layer's forward pass with the local indices of its inputs, replayed for backward and recompute.
struct LocalOp {
  Op op;
  std::vector<int> inputs;  // local indices within the layer
  bool recompute_selective = false;
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
    t_ = p.micro_batch * p.seq_len / (tp_ * sp_ * cp_);
    dt_ = DType::kBf16;  // activations travel in bf16 (FP8 only where the plan compresses the dispatch)
    comm_stream_ = p.overlap.inter_op ? Stream::kComm : Stream::kCompute;
    side_stream_ = p.overlap.inter_op ? Stream::kSide : Stream::kCompute;
    dp_stream_ = p.overlap.dp_comm ? Stream::kDpComm : Stream::kCompute;
    pp_stream_ = p.overlap.pp_comm ? Stream::kPpComm : Stream::kCompute;
    layers_ = layers_per_virtual_stage(m, p);
    first_layer_.resize(layers_.size() + 1, 0);
    std::partial_sum(layers_.begin(), layers_.end(), first_layer_.begin() + 1);
  }

  OpGraph build();

 private:
  // ---- op constructors (ops of the layer being recorded) ----
  int record(Op op, std::vector<int> inputs, bool selective = false) {
    layer_ops_.push_back({std::move(op), std::move(inputs), selective});
    return static_cast<int>(layer_ops_.size()) - 1;
  }
  Op base(OpName name, OpKind kind, Stream stream) const {
    Op op;
    op.name = static_cast<uint16_t>(name);
    op.kind = kind;
    op.stream = stream;
    op.dtype = p_.precision == Precision::kFp8 ? DType::kFp8 : DType::kBf16;
    return op;
  }
  Op gemm(OpName name, int64_t m, int64_t n, int64_t k, Stream stream = Stream::kCompute) const {
    Op op = base(name, OpKind::kGemm, stream);
    op.gemm = {m, n, k, 1};
    op.flops = 2.0 * d(m) * d(n) * d(k);
    op.hbm_bytes = (d(m) * d(k) + d(k) * d(n) + d(m) * d(n)) * bytes_of(DType::kBf16);
    return op;
  }
  Op grouped(OpName name, double rows, int64_t n, int64_t k, int64_t groups) const {
    Op op = base(name, OpKind::kGroupedGemm, Stream::kCompute);
    const auto m = static_cast<int64_t>(std::ceil(rows));
    op.gemm = {m, n, k, groups};
    op.flops = 2.0 * rows * d(n) * d(k);
    op.hbm_bytes = (rows * d(k) + d(groups) * d(k) * d(n) + rows * d(n)) * bytes_of(DType::kBf16);
    return op;
  }
  Op mem(OpName name, MemOp kind, double bytes, Stream stream = Stream::kCompute) const {
    Op op = base(name, OpKind::kMemoryBound, stream);
    op.mem = kind;
    op.hbm_bytes = bytes;
    op.dtype = DType::kBf16;
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
  Op fused(OpName name, Op gemm_part, CommSpec c) const {
    gemm_part.name = static_cast<uint16_t>(name);
    gemm_part.kind = OpKind::kFusedGemmComm;
    gemm_part.stream = Stream::kCompute;
    gemm_part.comm = c;
    return gemm_part;
  }

  // ---- layer forward recipes (record into layer_ops_) ----
  int attention_fwd(int in);
  int moe_fwd(int in);
  int dense_ffn_fwd(int in);
  void record_layer(int64_t layer);

  // ---- emission into the graph ----
  int32_t emit(const Op& proto, int16_t stage, int16_t chunk, int32_t layer, int32_t mb, Phase phase,
               std::initializer_list<int32_t> deps);
  void dep(int32_t op, int32_t on) {
    if (on >= 0) dep_pairs_.emplace_back(op, on);
  }
  // Emits the recorded layer's forward, backward or recompute pass; returns (first op, last op).
  std::pair<int32_t, int32_t> emit_layer_forward(int64_t layer, int16_t stage, int16_t chunk, int32_t mb,
                                                 int32_t input);
  std::pair<int32_t, int32_t> emit_layer_backward(int64_t layer, int16_t stage, int16_t chunk, int32_t mb,
                                                  int32_t grad_input);
  void emit_task(int16_t stage, const PipelineTask& task);
  void emit_data_parallel(int16_t stage);

  const ModelSpec& m_;
  const Plan& p_;
  const LoweringOptions& o_;
  int64_t tp_, sp_, cp_, ep_, etp_, pp_, vpp_, dp_, edp_, t_;
  DType dt_;
  Stream comm_stream_, side_stream_, dp_stream_, pp_stream_;
  std::vector<int64_t> layers_, first_layer_;

  std::vector<LocalOp> layer_ops_;
  // Per distinct layer kind (MoE or dense, window, CLA): its forward ops and, per op, the ops consuming it.
  std::vector<std::vector<LocalOp>> recipes_;
  std::vector<std::vector<std::vector<size_t>>> recipe_consumers_;
  std::vector<int> recipe_of_layer_;
  std::vector<int32_t> scratch_ids_, scratch_re_, scratch_grad_, scratch_waits_;  // reused per layer pass

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
  int32_t last_dp_op_ = -1;  // last op on the current stage's DP stream

  // A layer's parameters on this rank: replicated over the attention replicas (attention, dense FFN, shared
  // experts, router, norms; sharded by tp) and over the expert data-parallel group (routed experts).
  std::pair<double, double> local_params(int64_t layer) const {
    const ParamBreakdown lp = layer_params(m_, m_.layers[static_cast<size_t>(layer)]);
    return {(lp.total() - lp.routed_experts) / d(tp_), lp.routed_experts / d(ep_ * etp_)};
  }
  // All-gathers of a layer's bf16 parameters from their replicas (ZeRO); returns the last op, -1 if none.
  int32_t emit_param_gather(int64_t layer, int16_t stage, int16_t chunk, int32_t mb, Phase phase,
                            Stream stream, int32_t after = -1) {
    const auto [dense, experts] = local_params(layer);
    int32_t last = -1;
    for (auto [params, group] :
         {std::pair{dense, CommGroup::kAttnReplica}, std::pair{experts, CommGroup::kExpertDp}}) {
      Op ag = base(OpName::kParamAg, OpKind::kCollective, stream);
      ag.comm = comm(Collective::kAllGather, group, params * 2.0, DType::kBf16);
      if (params <= 0 || ag.comm.group_size <= 1) continue;
      last = emit(ag, stage, chunk, static_cast<int32_t>(layer), mb, phase, {after});
    }
    return last;
  }
};

int Builder::attention_fwd(int in) {
  const auto& a = m_.attention;
  const int64_t h = m_.hidden;
  const double dt = bytes_of(dt_);
  const int64_t heads_r = a.num_heads / tp_;
  const int64_t kv_r = std::max<int64_t>(1, a.num_kv_heads / tp_);  // KV heads replicate when fewer than tp
  const int64_t qk = a.qk_dim(), v = a.v_dim();

  int x = record(mem(OpName::kAttnNorm, MemOp::kNorm, 3.0 * d(t_ * h) * dt), {in}, true);
  int64_t tg = t_;  // tokens entering the projections
  if (tp_ > 1) {
    x = record(coll(OpName::kAttnAg, Collective::kAllGather, CommGroup::kTp, d(t_ * tp_ * h) * dt), {x},
               true);
    tg = t_ * tp_;
  }
  // Widths per token of q and of k+v after projection on this rank (before Ulysses splits heads).
  const bool mla = a.kind == AttentionKind::kMla;
  const int64_t q_width = heads_r * qk;
  const int64_t kv_width = mla ? heads_r * (qk + v) : 2 * std::max(kv_r, sp_) * a.head_dim;
  int q = -1, kv = -1;
  if (mla) {
    const auto& l = a.mla;
    int qd = x;
    if (l.q_lora_rank > 0) {
      qd = record(gemm(OpName::kQDown, tg, l.q_lora_rank, h), {x});
      q = record(gemm(OpName::kQUp, tg, q_width, l.q_lora_rank), {qd});
    } else {
      q = record(gemm(OpName::kQProj, tg, q_width, h), {x});
    }
    const int kvd = record(gemm(OpName::kKvDown, tg, l.kv_lora_rank + l.qk_rope_head_dim, h), {x});
    kv = record(gemm(OpName::kKvUp, tg, heads_r * (l.qk_nope_head_dim + v), l.kv_lora_rank), {kvd});
  }
  const double rope_bytes =
      2.0 * d(tg) * d(heads_r + kv_r) * d(mla ? a.mla.qk_rope_head_dim : a.head_dim) * dt;

  std::vector<int> ready;  // ops that lay q, k, v out for attention on this rank
  int64_t ta = tg;         // tokens per rank entering attention
  int64_t heads_a = heads_r;
  if (sp_ > 1) {
    ta = tg * sp_;
    heads_a = heads_r / sp_;
    const double q_bytes = d(tg * q_width) * dt, kv_bytes = d(tg * kv_width) * dt;
    if (!mla && p_.overlap.intra_op) {
      // GEMM + all-to-all: each output tile is written to its destination rank from the GEMM epilogue.
      Op f = fused(OpName::kQkvProjA2a, gemm(OpName::kQkvProj, tg, q_width + kv_width, h),
                   comm(Collective::kAllToAll, CommGroup::kSp, q_bytes + kv_bytes, dt_));
      ready = {record(f, {x})};
    } else if (p_.overlap.inter_op) {
      // K/V projection and its all-to-all first, beside the Q projection (MegaScale-MoE §4.1).
      if (!mla) kv = record(gemm(OpName::kKvProj, tg, kv_width, h), {x});
      const int kv_a2a = record(coll(OpName::kKvA2a, Collective::kAllToAll, CommGroup::kSp, kv_bytes), {kv});
      if (!mla) q = record(gemm(OpName::kQProj, tg, q_width, h), {x});
      const int r = record(mem(OpName::kRope, MemOp::kRope, rope_bytes), {q});
      ready = {record(coll(OpName::kQA2a, Collective::kAllToAll, CommGroup::kSp, q_bytes), {r}), kv_a2a};
    } else {
      if (!mla) q = kv = record(gemm(OpName::kQkvProj, tg, q_width + kv_width, h), {x});
      const int r = record(mem(OpName::kRope, MemOp::kRope, rope_bytes), {q, kv});
      ready = {record(coll(OpName::kQkvA2a, Collective::kAllToAll, CommGroup::kSp, q_bytes + kv_bytes), {r})};
    }
  } else {
    if (!mla) q = kv = record(gemm(OpName::kQkvProj, tg, q_width + kv_width, h), {x});
    ready = {record(mem(OpName::kRope, MemOp::kRope, rope_bytes), {q, kv})};
  }

  // Attention over the full sequence for this rank's heads; CP splits the queries into 2*cp balanced chunks.
  // Per-layer sliding windows are applied by record_layer.
  auto i32 = [](int64_t v32) { return static_cast<int32_t>(v32); };
  AttentionShape shape{
      i32(p_.micro_batch), i32(p_.seq_len / cp_), i32(p_.seq_len), i32(heads_a), i32(qk), i32(v), 0, true};
  const double attn_flops =
      d(p_.micro_batch * p_.seq_len / cp_) * 2.0 * d(heads_a) * d(qk + v) * mean_attended_keys(p_.seq_len, 0);
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
    const int l = record(local, ready);
    core.flops = attn_flops - local.flops;
    att = record(core, {ag, l});
  } else {
    att = record(core, ready);
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
    out = record(gemm(OpName::kOutProj, tg, h, heads_r * v), {att});
  }
  if (tp_ > 1)
    out = record(coll(OpName::kAttnRs, Collective::kReduceScatter, CommGroup::kTp, d(tg * h) * dt), {out});
  return out;
}

int Builder::dense_ffn_fwd(int in) {
  const int64_t h = m_.hidden, f = m_.dense_ffn;
  const double dt = bytes_of(dt_);
  int x = record(mem(OpName::kFfnNorm, MemOp::kNorm, 3.0 * d(t_ * h) * dt), {in}, true);
  int64_t tg = t_;
  if (tp_ > 1) {
    x = record(coll(OpName::kFfnAg, Collective::kAllGather, CommGroup::kTp, d(t_ * tp_ * h) * dt), {x}, true);
    tg = t_ * tp_;
  }
  const int64_t f_r = f / tp_;
  int y = record(gemm(OpName::kFc13, tg, 2 * f_r, h), {x});
  y = record(mem(OpName::kAct, MemOp::kActivation, 3.0 * d(tg * f_r) * dt), {y}, true);
  y = record(gemm(OpName::kFc2, tg, h, f_r), {y});
  if (tp_ > 1)
    y = record(coll(OpName::kFfnRs, Collective::kReduceScatter, CommGroup::kTp, d(tg * h) * dt), {y});
  return y;
}

int Builder::moe_fwd(int in) {
  const auto& e = m_.moe;
  const int64_t h = m_.hidden;
  const double dt = bytes_of(dt_);
  const int64_t k = e.top_k;
  const int64_t local_experts = e.num_experts / ep_;
  const int64_t f_r = e.expert_ffn / etp_;
  const double kept = 1.0 - o_.dropped_fraction;
  // Rows routed to the busiest rank of the EP group (the slowest rank decides).
  const double rows = d(t_ * k) * o_.expert_load_scale * kept;
  const bool fp8_dispatch = p_.compression.dispatch == DispatchPrecision::kFp8;
  const DType dispatch_dt = fp8_dispatch ? DType::kFp8 : dt_;
  const double dispatch_elt = fp8_dispatch ? bytes_of(DType::kFp8) * kFp8ScaleOverhead : dt;

  const int x = record(mem(OpName::kFfnNorm, MemOp::kNorm, 3.0 * d(t_ * h) * dt), {in}, true);
  Op router = gemm(OpName::kRouter, t_, e.num_experts, h);
  router.hbm_bytes += d(t_ * e.num_experts) * 4.0;  // fp32 scores for softmax / top-k
  const int r = record(router, {x});

  // Shared experts: a dense FFN on the side stream, beside dispatch (MegaScale-MoE §4.1).
  int shared = -1;
  if (e.num_shared_experts > 0) {
    const int64_t fs = e.num_shared_experts * e.shared_expert_ffn / tp_;
    int64_t tg = t_;
    int y = x;
    if (tp_ > 1) {
      y = record(coll(OpName::kSharedAg, Collective::kAllGather, CommGroup::kTp, d(t_ * tp_ * h) * dt), {y},
                 true);
      tg = t_ * tp_;
    }
    y = record(gemm(OpName::kSharedFc13, tg, 2 * fs, h, side_stream_), {y});
    y = record(mem(OpName::kSharedAct, MemOp::kActivation, 3.0 * d(tg * fs) * dt, side_stream_), {y}, true);
    y = record(gemm(OpName::kSharedFc2, tg, h, fs, side_stream_), {y});
    if (tp_ > 1)
      y = record(coll(OpName::kSharedRs, Collective::kReduceScatter, CommGroup::kTp, d(tg * h) * dt), {y});
    shared = y;
  }

  const bool gather_mode = p_.experts.dispatch == Dispatch::kAllGather;
  const double ep_rows = rows * d(etp_);  // rows each expert GEMM sees after the ETP all-gather
  int y;
  if (gather_mode) {
    // all-gather -> local scatter (drop rows for other ranks' experts) -> grouped GEMMs -> gather ->
    // reduce-scatter
    const double ag_bytes = d(t_ * ep_) * d(h) * dispatch_elt;
    if (p_.overlap.intra_op && etp_ == 1) {
      y = record(
          fused(OpName::kAgScatterFc13, grouped(OpName::kExpertFc13, ep_rows, 2 * f_r, h, local_experts),
                comm(Collective::kAllGather, CommGroup::kEp, ag_bytes, dispatch_dt)),
          {r});
    } else {
      y = record(coll(OpName::kDispatchAg, Collective::kAllGather, CommGroup::kEp, ag_bytes, dispatch_dt),
                 {r}, true);
      y = record(mem(OpName::kScatter, MemOp::kPermute, 2.0 * rows * d(h) * dt), {y}, true);
    }
  } else {
    y = record(mem(OpName::kPermute, MemOp::kPermute, 2.0 * d(t_ * k * h) * dt), {r}, true);
    Op a2a = coll(OpName::kDispatchA2a, Collective::kAllToAll, CommGroup::kEp, rows * d(h) * dispatch_elt,
                  dispatch_dt);
    if (p_.experts.dispatch == Dispatch::kDedup) {
      const int64_t g = o_.gpus_per_node;
      const int64_t span = ep_ * etp_;  // ranks covered by the EP group's stride pattern
      const int64_t nodes = span > g ? span / g : 1;
      a2a.comm.nic_bytes_scale = dedup_nic_scale(e.num_experts, k, nodes);
    }
    if (p_.overlap.intra_op && etp_ == 1) {
      y = record(
          fused(OpName::kA2aFc13, grouped(OpName::kExpertFc13, ep_rows, 2 * f_r, h, local_experts), a2a.comm),
          {y});
    } else {
      y = record(a2a, {y}, true);
    }
  }
  const bool fused_fc13 = p_.overlap.intra_op && etp_ == 1;
  if (!fused_fc13) {
    if (etp_ > 1) {
      y = record(coll(OpName::kEtpAg, Collective::kAllGather, CommGroup::kEtp, ep_rows * d(h) * dt), {y},
                 true);
    }
    y = record(grouped(OpName::kExpertFc13, ep_rows, 2 * f_r, h, local_experts), {y});
  }
  y = record(mem(OpName::kExpertAct, MemOp::kActivation, 3.0 * ep_rows * d(f_r) * dt), {y}, true);
  if (fused_fc13) {
    const double bytes = gather_mode ? d(t_ * ep_ * h) * dt : rows * d(h) * dt;
    const Collective c = gather_mode ? Collective::kReduceScatter : Collective::kAllToAll;
    y = record(fused(gather_mode ? OpName::kFc2GatherRs : OpName::kFc2A2a,
                     grouped(OpName::kExpertFc2, ep_rows, h, f_r, local_experts),
                     comm(c, CommGroup::kEp, bytes, dt_)),
               {y});
  } else {
    y = record(grouped(OpName::kExpertFc2, ep_rows, h, f_r, local_experts), {y});
    if (etp_ > 1) {
      y = record(coll(OpName::kEtpRs, Collective::kReduceScatter, CommGroup::kEtp, ep_rows * d(h) * dt), {y});
    }
    if (gather_mode) {
      y = record(mem(OpName::kGather, MemOp::kPermute, 2.0 * rows * d(h) * dt), {y});
      y = record(coll(OpName::kCombineRs, Collective::kReduceScatter, CommGroup::kEp, d(t_ * ep_ * h) * dt),
                 {y});
    } else {
      y = record(coll(OpName::kCombineA2a, Collective::kAllToAll, CommGroup::kEp, rows * d(h) * dt), {y});
    }
  }
  std::vector<int> ins{y};
  if (shared >= 0) ins.push_back(shared);
  return record(mem(OpName::kUnpermute, MemOp::kPermute, (d(t_ * k * h) + 2.0 * d(t_ * h)) * dt), ins);
}

void Builder::record_layer(int64_t layer) {
  layer_ops_.clear();
  const LayerSpec& l = m_.layers[static_cast<size_t>(layer)];
  const int a = attention_fwd(-1);
  if (l.moe) {
    moe_fwd(a);
  } else {
    dense_ffn_fwd(a);
  }
  // Layer-specific attention: sliding windows and CLA (no K/V projection) change the attention ops' work.
  for (auto& lo : layer_ops_) {
    Op& op = lo.op;
    if (op.kind == OpKind::kAttention && l.window > 0) {
      op.attn.window = static_cast<int32_t>(l.window);
      op.flops *= mean_attended_keys(p_.seq_len, l.window) / mean_attended_keys(p_.seq_len, 0);
    }
  }
}

int32_t Builder::emit(const Op& proto, int16_t stage, int16_t chunk, int32_t layer, int32_t mb, Phase phase,
                      std::initializer_list<int32_t> deps) {
  Op& op = g_.ops.emplace_back(proto);
  op.id = static_cast<int32_t>(g_.ops.size() - 1);
  op.stage = stage;
  op.chunk = chunk;
  op.layer = layer;
  op.micro_batch = mb;
  op.phase = phase;
  for (int32_t x : deps) dep(op.id, x);
  if (op.stream == Stream::kDpComm) last_dp_op_ = op.id;
  return op.id;
}

std::pair<int32_t, int32_t> Builder::emit_layer_forward(int64_t layer, int16_t stage, int16_t chunk,
                                                        int32_t mb, int32_t input) {
  const auto& ops = recipes_[static_cast<size_t>(recipe_of_layer_[static_cast<size_t>(layer)])];
  std::vector<int32_t>& ids = scratch_ids_;
  ids.resize(ops.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    ids[i] = emit(ops[i].op, stage, chunk, static_cast<int32_t>(layer), mb, Phase::kForward, {});
    if (ops[i].inputs.size() == 1 && ops[i].inputs[0] < 0) dep(ids[i], input);
    for (int in : ops[i].inputs) {
      if (in >= 0) dep(ids[i], ids[static_cast<size_t>(in)]);
    }
  }
  if (p_.data.zero == 3 && o_.data_parallel)
    dep(ids.front(), emit_param_gather(layer, stage, chunk, mb, Phase::kForward, dp_stream_));
  if (layer_first_fwd_[static_cast<size_t>(layer)] < 0)
    layer_first_fwd_[static_cast<size_t>(layer)] = ids.front();
  return {ids.front(), ids.back()};
}

// Backward of a recorded layer: ops in reverse; a GEMM gives dgrad then wgrad, a collective its transpose
// (all-gather <-> reduce-scatter, all-to-all reversed), attention its backward kernel. Recompute (full or
// selective) re-runs forward ops first; backward ops that read their outputs wait for them.
std::pair<int32_t, int32_t> Builder::emit_layer_backward(int64_t layer, int16_t stage, int16_t chunk,
                                                         int32_t mb, int32_t grad_input) {
  const auto recipe = static_cast<size_t>(recipe_of_layer_[static_cast<size_t>(layer)]);
  const auto& ops = recipes_[recipe];
  const auto& consumers = recipe_consumers_[recipe];
  const auto n = ops.size();
  if (n == 0) return {-1, grad_input};
  const auto L = static_cast<int32_t>(layer);
  int32_t first = -1;

  const int32_t zero3_gather = p_.data.zero == 3 && o_.data_parallel
                                   ? emit_param_gather(layer, stage, chunk, mb, Phase::kBackward, dp_stream_)
                                   : -1;

  // Recompute pass.
  std::vector<int32_t>& re = scratch_re_;
  re.assign(n, -1);
  if (p_.recompute != Recompute::kNone) {
    for (size_t i = 0; i < n; ++i) {
      if (p_.recompute == Recompute::kSelective && !ops[i].recompute_selective) continue;
      re[i] = emit(ops[i].op, stage, chunk, L, mb, Phase::kRecompute, {});
      if (first < 0) first = re[i];
      for (int in : ops[i].inputs) {
        if (in >= 0 && re[static_cast<size_t>(in)] >= 0) dep(re[i], re[static_cast<size_t>(in)]);
      }
      if (ops[i].inputs.size() == 1 && ops[i].inputs[0] < 0) dep(re[i], grad_input);
    }
  }

  std::vector<int32_t>& grad = scratch_grad_;  // the op producing the gradient of op i's input
  grad.assign(n, -1);
  int32_t last = -1;
  for (size_t ri = n; ri-- > 0;) {
    Op op = ops[ri].op;
    std::vector<int32_t>& waits = scratch_waits_;
    waits.clear();
    if (consumers[ri].empty()) waits.push_back(grad_input);
    for (size_t c : consumers[ri]) waits.push_back(grad[c]);
    for (int in : ops[ri].inputs) {
      if (in >= 0 && re[static_cast<size_t>(in)] >= 0) waits.push_back(re[static_cast<size_t>(in)]);
    }
    if (re[ri] >= 0) waits.push_back(re[ri]);
    auto emit_with = [&](const Op& o) {
      const int32_t id = emit(o, stage, chunk, L, mb, Phase::kBackward, {});
      for (int32_t w : waits) dep(id, w);
      if (first < 0) dep(id, zero3_gather);
      if (first < 0) first = id;
      return id;
    };
    switch (op.kind) {
      case OpKind::kGemm:
      case OpKind::kGroupedGemm:
      case OpKind::kFusedGemmComm: {
        Op dgrad = op;
        dgrad.part = GemmPart::kDgrad;
        if (op.kind == OpKind::kFusedGemmComm) {
          // The transposed fused kernel: its collective reverses direction.
          if (op.comm.collective == Collective::kAllGather)
            dgrad.comm.collective = Collective::kReduceScatter;
          else if (op.comm.collective == Collective::kReduceScatter)
            dgrad.comm.collective = Collective::kAllGather;
        }
        grad[ri] = emit_with(dgrad);
        Op wgrad = op;
        wgrad.kind = op.kind == OpKind::kFusedGemmComm
                         ? (op.gemm.groups > 1 ? OpKind::kGroupedGemm : OpKind::kGemm)
                         : op.kind;
        wgrad.comm = {};
        wgrad.part = GemmPart::kWgrad;
        const int32_t w = emit(wgrad, stage, chunk, L, mb, Phase::kBackward, {grad[ri]});
        last = w;
        continue;
      }
      case OpKind::kAttention: {
        op.flops *= kAttentionBackwardFlops;
        op.hbm_bytes *= 2.0;
        break;
      }
      case OpKind::kCollective: {
        if (op.comm.collective == Collective::kAllGather) {
          op.comm.collective = Collective::kReduceScatter;
        } else if (op.comm.collective == Collective::kReduceScatter) {
          op.comm.collective = Collective::kAllGather;
        }
        if (op.comm.dtype == DType::kFp8) {  // gradients of an FP8 dispatch travel in bf16, without scales
          op.comm.bytes = op.comm.bytes / (bytes_of(DType::kFp8) * kFp8ScaleOverhead) * bytes_of(dt_);
          op.comm.dtype = dt_;
          op.dtype = dt_;
        }
        break;
      }
      default:
        break;
    }
    grad[ri] = emit_with(op);
    last = grad[ri];
  }
  // The gradient leaving the layer is that of its first op's input.
  const int32_t out = grad.front();
  return {first, out >= 0 ? out : last};
}

void Builder::emit_task(int16_t stage, const PipelineTask& task) {
  const int64_t v = task.chunk * pp_ + stage;  // virtual stage
  const int64_t last_v = pp_ * vpp_ - 1;
  const int64_t l0 = first_layer_[static_cast<size_t>(v)], l1 = first_layer_[static_cast<size_t>(v) + 1];
  const int32_t mb = task.micro_batch;
  const double dt = bytes_of(dt_);
  const int64_t h = m_.hidden;
  int32_t first = -1, cur = -1;
  auto track = [&](int32_t id) {
    if (first < 0) first = id;
    cur = id;
  };
  if (task.forward) {
    if (v == 0 && o_.embedding_and_head) {
      track(emit(mem(OpName::kEmbedding, MemOp::kEmbedding, 2.0 * d(t_ * h) * dt), stage, task.chunk, -1, mb,
                 Phase::kForward, {}));
    }
    for (int64_t l = l0; l < l1; ++l) {
      auto [f, last] = emit_layer_forward(l, stage, task.chunk, mb, cur);
      if (first < 0) first = f;
      cur = last;
    }
    if (v == last_v && o_.embedding_and_head) {
      const int64_t tg = t_ * tp_;
      track(emit(mem(OpName::kFinalNorm, MemOp::kNorm, 3.0 * d(t_ * h) * dt), stage, task.chunk, -1, mb,
                 Phase::kForward, {cur}));
      track(emit(gemm(OpName::kLmHead, tg, m_.vocab / tp_, h), stage, task.chunk, -1, mb, Phase::kForward,
                 {cur}));
      track(emit(mem(OpName::kLoss, MemOp::kLoss, 3.0 * d(tg * (m_.vocab / tp_)) * 4.0), stage, task.chunk,
                 -1, mb, Phase::kForward, {cur}));
    }
  } else {
    if (v == last_v && o_.embedding_and_head) {
      const int64_t tg = t_ * tp_;
      track(emit(mem(OpName::kLoss, MemOp::kLoss, 2.0 * d(tg * (m_.vocab / tp_)) * 4.0), stage, task.chunk,
                 -1, mb, Phase::kBackward, {}));
      Op head = gemm(OpName::kLmHead, tg, m_.vocab / tp_, h);
      head.part = GemmPart::kDgrad;
      track(emit(head, stage, task.chunk, -1, mb, Phase::kBackward, {cur}));
      const int32_t dgrad = cur;
      head.part = GemmPart::kWgrad;
      emit(head, stage, task.chunk, -1, mb, Phase::kBackward, {dgrad});
      track(emit(mem(OpName::kFinalNorm, MemOp::kNorm, 4.0 * d(t_ * h) * dt), stage, task.chunk, -1, mb,
                 Phase::kBackward, {dgrad}));
    }
    for (int64_t l = l1; l-- > l0;) {
      auto [f, out] = emit_layer_backward(l, stage, task.chunk, mb, cur);
      if (first < 0) first = f;
      cur = out;
      // Gradients of the layer are final after its last micro-batch; ZeRO-2/3 keep only their gradient shard,
      // so every micro-batch's gradients are reduce-scattered.
      if (mb == p_.num_micro_batches() - 1 || p_.data.zero >= 2) {
        layer_last_bwd_[static_cast<size_t>(l)] = g_.ops.back().id;
        int32_t side = -1;
        if (side_stream_ != Stream::kCompute) {
          for (size_t i = static_cast<size_t>(f); i < g_.ops.size(); ++i) {
            if (g_.ops[i].stream == side_stream_) side = g_.ops[i].id;
          }
        }
        layer_last_side_bwd_[static_cast<size_t>(l)] = side;
        if (p_.data.zero >= 2 && o_.data_parallel) emit_data_parallel(stage);
      }
    }
    if (v == 0 && o_.embedding_and_head) {
      track(emit(mem(OpName::kEmbedding, MemOp::kEmbedding, 2.0 * d(t_ * h) * dt), stage, task.chunk, -1, mb,
                 Phase::kBackward, {cur}));
    }
  }
  task_first_[task_index(mb, v, task.forward)] = first;
  // Send the activation (forward) or its gradient (backward) to the neighbouring virtual stage.
  const bool sends = task.forward ? v < last_v : v > 0;
  if (sends) {
    Op send = base(task.forward ? OpName::kPpSendFwd : OpName::kPpSendBwd, OpKind::kSendRecv, pp_stream_);
    send.comm = comm(Collective::kSendRecv, CommGroup::kPp, d(t_ * h) * dt, dt_);
    task_send_[task_index(mb, v, task.forward)] =
        emit(send, stage, task.chunk, -1, mb, task.forward ? Phase::kForward : Phase::kBackward, {cur});
  }
}

// Gradient synchronisation of the layers whose last backward was just recorded (ZeRO-3: per micro-batch), the
// optimizer step, and (ZeRO >= 1) the parameter all-gather.
void Builder::emit_data_parallel(int16_t stage) {
  const bool bf16_a2a = p_.compression.grad_sync == GradSync::kBf16AllToAll;
  // Last layer first: the order in which backward finishes layers, so that the in-order DP stream starts
  // each layer's synchronisation as soon as its gradients are complete.
  for (size_t l = layer_last_bwd_.size(); l-- > 0;) {
    const int32_t after = layer_last_bwd_[l];
    if (after < 0) continue;
    const int32_t side = layer_last_side_bwd_[l];
    layer_last_bwd_[l] = -1;
    const ParamBreakdown lp = layer_params(m_, m_.layers[l]);
    const double dense = (lp.total() - lp.routed_experts) / d(tp_);
    const double experts = lp.routed_experts / d(ep_ * etp_);
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
        Op rs = base(OpName::kGradRs, OpKind::kCollective, dp_stream_);
        rs.comm = comm(p_.data.zero == 0 ? Collective::kAllReduce : Collective::kReduceScatter, group,
                       params * 4.0, DType::kFp32);
        emit(rs, stage, 0, L, -1, Phase::kBackward, {after, side});
      }
    }
  }
}

OpGraph Builder::build() {
  const int64_t mbs = p_.num_micro_batches();
  g_.num_stages = static_cast<int>(pp_);
  g_.chunks_per_stage = static_cast<int>(vpp_);
  g_.micro_batches = mbs;

  // Distinct layer recipes: recorded once per distinct (moe, window, kv_projection).
  recipe_of_layer_.assign(m_.layers.size(), -1);
  std::vector<LayerSpec> kinds;
  for (size_t l = 0; l < m_.layers.size(); ++l) {
    const LayerSpec& s = m_.layers[l];
    auto it = std::find_if(kinds.begin(), kinds.end(), [&](const LayerSpec& k) {
      return k.moe == s.moe && k.window == s.window && k.kv_projection == s.kv_projection;
    });
    if (it == kinds.end()) {
      kinds.push_back(s);
      record_layer(static_cast<int64_t>(l));
      recipes_.push_back(layer_ops_);
      std::vector<std::vector<size_t>> consumers(layer_ops_.size());
      for (size_t i = 0; i < layer_ops_.size(); ++i) {
        for (int in : layer_ops_[i].inputs) {
          if (in >= 0) consumers[static_cast<size_t>(in)].push_back(i);
        }
      }
      recipe_consumers_.push_back(std::move(consumers));
      it = kinds.end() - 1;
    }
    recipe_of_layer_[l] = static_cast<int>(it - kinds.begin());
  }

  size_t per_step = 0;
  for (size_t l = 0; l < m_.layers.size(); ++l)
    per_step += recipes_[static_cast<size_t>(recipe_of_layer_[l])].size();
  g_.ops.reserve(static_cast<size_t>(mbs) * per_step * 4 + 1024);
  dep_pairs_.reserve(g_.ops.capacity() * 2);
  const size_t tasks = static_cast<size_t>(mbs * pp_ * vpp_ * 2);
  task_first_.assign(tasks, -1);
  task_send_.assign(tasks, -1);
  layer_last_bwd_.assign(m_.layers.size(), -1);
  layer_last_side_bwd_.assign(m_.layers.size(), -1);
  layer_first_fwd_.assign(m_.layers.size(), -1);
  layer_param_gather_.assign(m_.layers.size(), -1);

  for (int16_t stage = 0; stage < pp_; ++stage) {
    last_dp_op_ = -1;
    std::fill(layer_first_fwd_.begin(), layer_first_fwd_.end(), -1);
    std::vector<int64_t> stage_layers;
    for (int16_t c = 0; c < vpp_; ++c) {
      const int64_t v = c * pp_ + stage;
      for (int64_t l = first_layer_[static_cast<size_t>(v)]; l < first_layer_[static_cast<size_t>(v) + 1];
           ++l) {
        stage_layers.push_back(l);
      }
    }
    // ZeRO-1/2 with overlapped DP communication: parameters updated by the previous step are gathered layer
    // by layer ahead of their first forward (Megatron overlaps this all-gather with the forward pass).
    const bool prefetch = (p_.data.zero == 1 || p_.data.zero == 2) && p_.overlap.dp_comm && o_.data_parallel;
    if (prefetch) {
      for (int64_t l : stage_layers) {
        layer_param_gather_[static_cast<size_t>(l)] =
            emit_param_gather(l, stage, 0, -1, Phase::kForward, Stream::kDpComm);
      }
    }
    for (const PipelineTask& task : pipeline_order(stage, pp_, vpp_, mbs)) {
      emit_task(stage, task);
      if (!task.forward && p_.data.zero < 2 && o_.data_parallel) emit_data_parallel(stage);
    }
    if (prefetch) {
      for (int64_t l : stage_layers) {
        dep(layer_first_fwd_[static_cast<size_t>(l)], layer_param_gather_[static_cast<size_t>(l)]);
      }
    }
    if (!o_.data_parallel) continue;
    // Optimizer step over this rank's shard, once every gradient of the stage is synchronised.
    double shard = 0;
    for (int64_t l : stage_layers) {
      const ParamBreakdown lp = layer_params(m_, m_.layers[static_cast<size_t>(l)]);
      const double dense = (lp.total() - lp.routed_experts) / d(tp_);
      const double experts = lp.routed_experts / d(ep_ * etp_);
      shard += p_.data.zero == 0 ? dense + experts : dense / d(sp_ * cp_ * dp_) + experts / d(edp_);
    }
    Op opt = base(OpName::kOptimizerStep, OpKind::kOptimizer, Stream::kCompute);
    opt.hbm_bytes = shard * kAdamBytesPerParam;
    opt.flops = shard * 12.0;
    const int32_t o = emit(opt, stage, 0, -1, -1, Phase::kOptimizer, {g_.ops.back().id, last_dp_op_});
    // Without overlap the updated parameters are gathered after the step, exposed.
    if (!prefetch && (p_.data.zero == 1 || p_.data.zero == 2)) {
      for (int64_t l : stage_layers)
        emit_param_gather(l, stage, 0, -1, Phase::kOptimizer, Stream::kCompute, o);
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
  for (size_t i = 0; i < g_.ops.size(); ++i) {
    g_.ops[i].dep_begin = count[i];
    g_.ops[i].dep_count = count[i + 1] - count[i];
  }
  return std::move(g_);
}

}  // namespace

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

std::vector<int64_t> layers_per_virtual_stage(const ModelSpec& model, const Plan& plan) {
  const int64_t chunks = plan.pipeline.pp * plan.pipeline.vpp;
  if (!plan.pipeline.layers_per_stage.empty()) return plan.pipeline.layers_per_stage;
  std::vector<int64_t> out(static_cast<size_t>(chunks), model.num_layers() / chunks);
  for (int64_t i = 0; i < model.num_layers() % chunks; ++i) ++out[static_cast<size_t>(i)];
  return out;
}

std::vector<PipelineTask> pipeline_order(int64_t stage, int64_t stages, int64_t chunks,
                                         int64_t micro_batches) {
  std::vector<PipelineTask> order;
  const int64_t total = micro_batches * chunks;
  order.reserve(static_cast<size_t>(2 * total));
  // k-th forward / backward of this stage -> (micro-batch, chunk), Megatron-Core's interleaved mapping
  // (chunks = 1 reduces to plain 1F1B): groups of `stages` micro-batches cycle through the chunks.
  auto fwd = [&](int64_t k) {
    const int64_t group = k / (stages * chunks), in_group = k % (stages * chunks);
    return PipelineTask{true, static_cast<int32_t>(group * stages + in_group % stages),
                        static_cast<int16_t>(in_group / stages)};
  };
  auto bwd = [&](int64_t k) {
    PipelineTask t = fwd(k);
    t.forward = false;
    t.chunk = static_cast<int16_t>(chunks - 1 - t.chunk);
    return t;
  };
  const int64_t warmup = chunks == 1 ? std::min(stages - stage - 1, total)
                                     : std::min((stages - stage - 1) * 2 + (chunks - 1) * stages, total);
  int64_t f = 0, b = 0;
  for (; f < warmup; ++f) order.push_back(fwd(f));
  while (f < total) {
    order.push_back(fwd(f++));
    order.push_back(bwd(b++));
  }
  while (b < total) order.push_back(bwd(b++));
  return order;
}

int64_t peak_in_flight(const std::vector<PipelineTask>& order) {
  int64_t live = 0, peak = 0;
  for (const auto& t : order) {
    live += t.forward ? 1 : -1;
    peak = std::max(peak, live);
  }
  return peak;
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
