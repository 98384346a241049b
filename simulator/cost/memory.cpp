// Memory per GPU (see memory.h). Notation as in the lowering: t = b*s/(tp*sp*cp) tokens per rank, tg = t*tp
// tokens after the TP all-gather, ta = tg*sp tokens at attention after the Ulysses all-to-all. Sources: F =
// /work/notes/megatron_stack_facts.md (MLM = Megatron-LM d98e8a64, TE = TransformerEngine d0067d0d), K =
// /work/notes/kernel_facts.md, DeepEP = deepseek-ai/DeepEP.
#include "simulator/cost/memory.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "simulator/core/model_stats.h"
#include "simulator/core/status.h"
#include "simulator/core/units.h"

namespace moeplan::cost {
namespace {

double d(int64_t x) {
  return static_cast<double>(x);
}

constexpr double kBf16 = 2.0;
constexpr double kFp32 = 4.0;

// Router state a MoE layer keeps per (token, expert): fp32 scores for the score function's backward, fp32
// scores for the aux loss, the probs (router dtype, 4 B as Megatron-Bridge's fp32 router) and the bool
// routing map (MU:766-957, RT:804-832; the lowering's router op reads the same 13 B). Assumption: what the
// fused top-k kernel keeps is not read from source.
constexpr double kRouterBytesPerTokenExpert = 13.0;
// TE's fused permutation keeps a row-id map [t, E] (int32) and its inverse for unpermute (TE
// permutation.py:321,370). Assumption: 2 x int32 per (token, expert).
constexpr double kPermuteMapBytesPerTokenExpert = 8.0;

// Bytes per element of an activation an FP8 GEMM saves for its weight gradient: the columnwise FP8 copy (on
// Hopper an explicit transpose; F §2.3 grouped_linear.py:903-915, §4.3 layernorm_linear.py:477-487), plus
// the recipe's scales: blockwise keeps one fp32 scale per 1x128 block, MXFP8 one e8m0 byte per 32.
double fp8_saved_bytes(Fp8Recipe r) {
  switch (r) {
    case Fp8Recipe::kBlockwise:
      return 1.0 + kFp32 / 128.0;
    case Fp8Recipe::kMxfp8:
      return 1.0 + 1.0 / 32.0;
    case Fp8Recipe::kDelayed:
    case Fp8Recipe::kTensorwise:
      break;
  }
  return 1.0;
}

// Bytes per GEMM weight of TE's FP8 weight workspaces, cached across the step's micro-batches
// (transformer_engine.py:1338-1345, TE base.py:792-880): rowwise + columnwise (on Hopper the transpose,
// float8_tensor_storage.py:285-312), 2 B for per-tensor recipes; blockwise adds an fp32 scale per 128x128
// block of each, MXFP8 an e8m0 byte per 32. Under --fp8-param-gather (Plan::Data::fp8_param_gather) the
// weights are FP8 themselves and only the scales remain beside them.
double fp8_weight_cache_bytes(Fp8Recipe r) {
  switch (r) {
    case Fp8Recipe::kBlockwise:
      return 2.0 + 2.0 * kFp32 / (128.0 * 128.0);
    case Fp8Recipe::kMxfp8:
      return 2.0 + 2.0 / 32.0;
    case Fp8Recipe::kDelayed:
    case Fp8Recipe::kTensorwise:
      break;
  }
  return 2.0;
}

bool fused_stack(const StackProfile& stack) {
  return stack.dispatcher.kind.value == DispatcherKind::kFused;
}

double tokens_per_rank(const Plan& p) {
  return d(p.micro_batch * p.seq_len) / d(p.attention.tp * p.attention.sp * p.attention.cp);
}

// The tokens per rank a layer runs on (an encoder-decoder's decoder layers run on its targets).
double tokens_per_rank(const Plan& p, const LayerSpec& layer) {
  return d(p.micro_batch * layer_seq_len(layer, p.seq_len)) /
         d(p.attention.tp * p.attention.sp * p.attention.cp);
}

// Megatron-Core + TE: what each module saves (F §4.3) with the selective modules `rc` recomputed (F §3.1).
// `down`: MLA's down-projection layout (mla_down_proj_of); `pad`: where FP8 pads the experts' rows
// (fp8_padding_of).
LayerActivations megatron_layer(const ModelSpec& m, const Plan& p, const LayerSpec& layer, double load,
                                uint16_t rc, MlaDownProj down, Fp8Padding pad) {
  const auto& a = m.attention;
  const int64_t tp = p.attention.tp;
  const double h = d(m.hidden);
  const double t = tokens_per_rank(p, layer), tg = t * d(tp);
  const bool fp8 = p.precision == Precision::kFp8;
  const double g = fp8 ? fp8_saved_bytes(p.fp8_recipe) : kBf16;  // a GEMM's saved input, per element
  auto on = [&](RecomputeModule x) { return (rc & x) != 0; };
  const int64_t heads_r = a.num_heads / tp;
  const int64_t kv_r = std::max<int64_t>(1, a.num_kv_heads / tp);
  const double qk = d(a.qk_dim()), v = d(a.v_dim());
  const double glu = m.activation == FfnActivation::kSwiGlu ? 2.0 : 1.0;  // FC1 width over F

  LayerActivations r;
  r.input = t * h * kBf16 + t * kFp32;  // + the first norm's fp32 rsigma per row
  if (a.kind == AttentionKind::kMla) {
    // input_layernorm is a TENorm module; the q/kv down-projections (TELinear, parallel_mode duplicated over
    // the SP shard, multi_latent_attention.py:526-527,573-574) save its output: bf16 once, or an FP8 copy
    // each. `layernorm` frees it: they keep the original, refilled by recompute (TL:473-536, MLA:1117-1118).
    r.attn_norm = on(kRecomputeLayernorm) ? 0.0 : (fp8 ? 2.0 * t * h * g : t * h * kBf16);
    const auto& l = a.mla;
    const double ql = d(l.q_lora_rank), kvl = d(l.kv_lora_rank), rope = d(l.qk_rope_head_dim);
    // The q/kv norms are fused into the up projections (TELayerNormColumnParallelLinear, gpt_layer_specs.py),
    // which save their inputs (the down-projection outputs; kv_combined stays whole through its split views)
    // with rsigma, and their outputs (SP shards, re-gathered in backward). `mla_up_proj`
    // (CheckpointWithoutOutput, MLA:983-987) runs norms and up projections inside the checkpoint and keeps
    // its inputs instead: the down-projection outputs in bf16 and the gathered rope key [tg, rope].
    double norm_in, norm_out;
    if (down != MlaDownProj::kColumnParallel || tp == 1) {
      norm_in = t * (ql + kvl + rope) * kBf16 + (on(kRecomputeMlaUpProj) ? 0.0 : 2.0 * t * kFp32);
      norm_out = on(kRecomputeMlaUpProj) ? tg * rope * kBf16 : t * (ql + kvl) * g;
    } else {
      // Before Megatron-Core 0.14 (multi_latent_attention.py:381-411 at 7094270) the down projections'
      // outputs are gathered over TP, then cut to the sequence shard: q's shard is a view that keeps the
      // gathered [tg, q_lora] alive, kv's a copy (its split view is not contiguous); the rope key stays a
      // view of the gathered [tg, kv_lora + rope]. The q/kv norms are fused into the up projections
      // (TELayerNormColumnParallelLinear), which save their inputs with rsigma and their SP-shard outputs;
      // `mla_up_proj` checkpoints all of it and keeps the three inputs instead.
      const double kept = (tg * ql + t * kvl) * kBf16;
      norm_in = on(kRecomputeMlaUpProj) ? 0.0 : kept + 2.0 * t * kFp32;
      norm_out = on(kRecomputeMlaUpProj) ? kept + tg * (kvl + rope) * kBf16 : t * (ql + kvl) * g;
    }
    r.mla_latent = norm_in + norm_out;
    // Full Q, K, V [tg, heads_r, qk | qk | v], made contiguous for TE (MLA:977-979); `mla_up_proj` frees
    // them after attention and regenerates them before its backward.
    r.qkv = on(kRecomputeMlaUpProj) ? 0.0 : tg * d(heads_r) * (2.0 * qk + v) * kBf16;
  } else {
    // The QKV LayerNormLinear saves its ln_out SP shard (FP8: the FP8 tensor), re-gathered in backward (TE
    // layernorm_linear.py:467-536); the norm is fused, so `layernorm` does not reach it.
    r.attn_norm = t * h * g;
    // q, k, v are torch.split views of the mixed QKV output (attention.py:1915): attention's saved v keeps
    // the whole buffer alive; RoPE (and QK-norm) make new q and k.
    const double q_w = d(heads_r) * qk, kv_w = d(kv_r) * d(a.head_dim);
    r.qkv = tg * ((q_w + 2.0 * kv_w) + (q_w + kv_w)) * kBf16;
  }
  // Fused attention saves q, k, v, out in bf16 and fp32 softmax stats per (token, head) (TE
  // backends.py:1598-1664); the out-projection saves its input: the same bf16 out, or an FP8 copy.
  // `core_attn` (tensor_parallel.checkpoint) frees out and the stats, except what the out-projection keeps.
  const double out = tg * d(heads_r) * v;
  const double softmax_stats = tg * d(heads_r) * kFp32;
  r.core_attn = on(kRecomputeCoreAttn) ? out * g : out * kBf16 + softmax_stats + (fp8 ? out * g : 0.0);
  // Qwen3-Next's output gate (attention.py _torch_compiled_output_gate at bbc762d5): the gate is a split of
  // the mixed QKV output, which the saved v keeps alive, and the out-projection saves the gated product, a
  // tensor of its own beside attention's saved output (under FP8 its copy is the one counted above).
  if (a.output_gate && a.kind != AttentionKind::kMla) {
    r.qkv += tg * d(heads_r) * d(a.head_dim) * kBf16;
    if (!on(kRecomputeCoreAttn) && !fp8) r.core_attn += out * kBf16;
  }
  r.mlp_residual = t * h * kBf16 + t * kFp32;  // the MLP block's norm input and rsigma
  if (layer.role == LayerRole::kDecoder) {
    // Cross-attention, saved as self-attention's: its block input and rsigma, the q projection's norm
    // output, q [tg, heads_r * hd] and k, v over the encoder's gathered tokens, out and the softmax stats;
    // under FP8 the k/v projection keeps its own copy of the encoder output's shard.
    const double t_enc = tokens_per_rank(p), kv_w = 2.0 * d(kv_r) * d(a.head_dim);
    r.mlp_residual += t * h * kBf16 + t * kFp32;
    r.attn_norm += t * h * g + (fp8 ? t_enc * h * g : 0.0);
    r.qkv += (tg * d(heads_r) * qk + t_enc * d(tp) * kv_w) * kBf16;
    r.core_attn += on(kRecomputeCoreAttn) ? out * g : out * kBf16 + softmax_stats + (fp8 ? out * g : 0.0);
  }

  if (layer.moe) {
    const auto& e = m.moe;
    const int64_t etp = p.experts.etp;
    const double experts = d(e.num_experts);
    double rows = t * d(e.top_k) * load * d(etp) *
                  capacity_padded_rows_factor(p, t, e.top_k, e.num_experts);  // after the ETP all-gather
    // FP8's row alignment (as the lowering pads them): the router's padding of every expert's count on each
    // source before an alltoall exchange, else each local expert's received rows padded.
    const int align = fp8_row_alignment(p);
    if (pad == Fp8Padding::kRouter && p.experts.dispatch != Dispatch::kDedup) {
      rows += d(etp) * alignment_pad_rows(t * d(e.top_k), experts, align);
    } else if (pad != Fp8Padding::kNone) {
      rows += alignment_pad_rows(rows, experts / d(p.experts.ep), align);
    }
    const double f_r = d(e.expert_ffn) / d(etp);
    const bool whole = on(kRecomputeMoe);  // ML:699-717: the MoE layer re-runs from its input
    const bool shared = e.num_shared_experts > 0 && !whole && !on(kRecomputeSharedExperts);
    // pre_mlp_layernorm is its own module in MoE layers. Its output is saved by the router (bf16 input,
    // MU:1380-1384) and by the shared experts' fc1 (FP8: its own copy); the permute keeps only maps.
    // `layernorm` frees it (consumers keep the original); `moe` keeps it as the checkpoint's input.
    const bool ln = on(kRecomputeLayernorm);
    // Under Megatron's shared-expert overlap the shared experts' fc1 has no parallel mode and keeps the input
    // the shared stream gathered over TP, not the shard (shared_experts.py:92-101 at core_v0.16.0).
    const bool gathered_shared_in = shared && p.overlap.shared_experts && tp > 1;
    r.mlp_norm = ln ? 0.0 : t * h * kBf16;
    if (fp8 && shared && !ln && !gathered_shared_in) r.mlp_norm += t * h * g;
    if (!whole) {
      r.router = t * experts * (kRouterBytesPerTokenExpert + kPermuteMapBytesPerTokenExpert);
      if (p.experts.dispatch == Dispatch::kAllGather) {
        // Megatron's allgather dispatcher gathers the routing map (bool) and probs over ETP x EP
        // (TD:281-303).
        r.router += t * d(p.experts.ep * etp) * experts * (1.0 + kFp32);
      }
      // FC1 (GroupedLinear) saves its input rows (FP8: the columnwise copy); the weighted activation saves
      // FC1's output and the rows' probs (memory-efficient permutation: probs applied before FC2, so the
      // unpermute keeps no FC2 output); FC2 saves the activation output, which `moe_act` frees (EX:269-276).
      r.expert_fc1_in = rows * h * g;
      r.expert_fc1_out = rows * glu * f_r * kBf16 + rows * kFp32;
      r.expert_fc2_in = on(kRecomputeMoeAct) ? 0.0 : rows * f_r * g;
      if (shared) {
        const double fs_r = d(e.num_shared_experts * e.shared_expert_ffn) / d(tp);
        r.shared = tg * glu * fs_r * kBf16 + tg * fs_r * g;
        if (gathered_shared_in) r.shared += tg * h * g;
      }
    }
  } else if (!on(kRecomputeMlp)) {
    // fc1 is a LayerNormLinear: ln_out shard, fc1 output (saved by the activation), activation output (saved
    // by fc2). `mlp` checkpoints the whole MLP, norm included, keeping its input (TL:537-539, 992-1011).
    const double f_r = d(m.dense_ffn) / d(tp);
    r.mlp_norm = t * h * g;
    r.dense_mlp = tg * glu * f_r * kBf16 + tg * f_r * g;
  }
  return r;
}

// moerun / MegaScale-MoE without recompute: every tensor of the forward data flow that backward reads
// (megascale-moe.md §3.5 for SP + EP, Fig. 9), in bf16 elements.
LayerActivations megascale_layer(const ModelSpec& m, const Plan& p, const LayerSpec& layer, double load,
                                 bool sar) {
  const auto& a = m.attention;
  const int64_t tp = p.attention.tp, sp = p.attention.sp;
  const double h = d(m.hidden);
  const double t = tokens_per_rank(p, layer), tg = t * d(tp), ta = tg * d(sp);
  const int64_t heads_r = a.num_heads / tp;
  const int64_t kv_r = std::max<int64_t>(1, a.num_kv_heads / tp);
  const double heads_a = d(heads_r) / d(sp);
  const bool mla = a.kind == AttentionKind::kMla;
  const double qk = d(a.qk_dim()), v = d(a.v_dim());
  const double q_w = d(heads_r) * qk;
  const double kv_w = mla ? d(heads_r) * (qk + v) : 2.0 * d(std::max(kv_r, sp)) * d(a.head_dim);
  const double rope_w = d(heads_r + kv_r) * (mla ? d(a.mla.qk_rope_head_dim) : d(a.head_dim));
  const double attn_inputs = ta * (q_w + kv_w) / d(sp);  // q/k/v as attention reads them
  const double attn_out = ta * heads_a * v;

  LayerActivations r;  // elements here, bytes on return
  if (sar) {
    // SAR keeps the layer input, the residual, attention's q/k/v and output, and FC1/FC3 outputs.
    r.input = t * h;
    r.mlp_residual = t * h;
    r.qkv = attn_inputs;
    r.core_attn = attn_out;
  } else {
    r.input = t * h;                                              // hidden
    r.attn_norm = t * h;                                          // ln1_out (sequence-sharded under TP)
    r.qkv = tg * (q_w + kv_w) + tg * rope_w;                      // q/k/v projection output, rope outputs
    r.other = (sp > 1 ? attn_inputs + tg * d(heads_r) * v : 0.0)  // q/k/v and output after all-to-alls
              + t * h;                                            // out-projection output
    r.core_attn = attn_out;                                       // attention output
    r.mlp_residual = t * h;                                       // ln2_in
  }
  if (layer.role == LayerRole::kDecoder) {
    // Cross-attention (its rules keep sp = 1): q over the targets, k and v over the encoder's gathered
    // tokens, its output and out-projection output, its block input.
    const double t_enc = tokens_per_rank(p);
    r.qkv += tg * q_w + t_enc * d(tp) * kv_w;
    r.core_attn += tg * d(heads_r) * v;
    r.mlp_residual += t * h;
    if (!sar) {
      r.attn_norm += t * h;
      r.other += t * h;
    }
  }
  if (layer.moe) {
    const auto& e = m.moe;
    const int64_t etp = p.experts.etp, ep = p.experts.ep;
    const double rows = t * d(e.top_k) * load;
    const double rows_e = rows * d(etp);
    const double f_r = d(e.expert_ffn) / d(etp);
    const bool gather = p.experts.dispatch == Dispatch::kAllGather;
    const double fs = d(e.num_shared_experts * e.shared_expert_ffn) / d(tp);
    if (sar) {
      r.expert_fc1_out = 2.0 * rows_e * f_r;
      r.shared = e.num_shared_experts > 0 ? 2.0 * tg * fs : 0.0;
    } else {
      r.mlp_norm = t * h;                              // ln2_out
      r.other += (gather ? 2.0 * t * d(ep) * h : 0.0)  // ln2_out gathered, fc2_out gathered
                 + rows_e * h + t * h;                 // fc2_out, ffn_out
      r.expert_fc1_in = rows * h;                      // scattered or dispatched rows
      r.expert_fc1_out = 2.0 * rows_e * f_r;           // fc1_out, fc3_out
      r.expert_fc2_in = rows_e * f_r;                  // fc2_in
      r.shared = e.num_shared_experts > 0 ? 3.0 * tg * fs : 0.0;
    }
  } else {
    const double f_r = d(m.dense_ffn) / d(tp);
    if (sar) {
      r.dense_mlp = 2.0 * tg * f_r;
    } else {
      r.mlp_norm = t * h;
      r.dense_mlp = 3.0 * tg * f_r;
      r.other += t * h;
    }
  }
  for (double* x :
       {&r.input, &r.attn_norm, &r.mla_latent, &r.qkv, &r.core_attn, &r.mlp_residual, &r.mlp_norm, &r.router,
        &r.expert_fc1_in, &r.expert_fc1_out, &r.expert_fc2_in, &r.shared, &r.dense_mlp, &r.other}) {
    *x *= kBf16;
  }
  return r;
}

// `down`: how MLA's down projections run (mla_down_proj_of): duplicated over TP or gathered, each rank holds
// them whole; column-parallel, its shard.
LocalParams local_params(const ModelSpec& m, const Plan& p, const LayerSpec& spec, MlaDownProj down_layout) {
  const ParamBreakdown lp = layer_params(m, spec);
  // MLA's down-projections, when every TP rank holds them whole.
  const double down = down_layout != MlaDownProj::kColumnParallel ? mla_down_params(m) : 0.0;
  LocalParams r;
  r.replicated = lp.norms + lp.router + down;
  r.sharded = (lp.total() - lp.routed_experts - r.replicated) / d(p.attention.tp);
  r.experts = lp.routed_experts / d(p.experts.ep * p.experts.etp);
  r.gemm = r.sharded + down + r.experts;  // biases and q/k norms among `sharded` are negligible
  return r;
}

// DeepEP's recommended configs (DeepEP deep_ep buffer.py get_dispatch_config / get_combine_config, K §1.6):
// tokens each channel's NVL receive buffer holds, and the RDMA (send chunk, receive buffer) of dispatch and
// combine, by group size.
struct DeepEpConfig {
  int64_t nvl_recv, rdma_send_dispatch, rdma_send_combine, rdma_recv;
};
DeepEpConfig deepep_config(int64_t ranks) {
  if (ranks <= 8) return {256, 6, 6, 128};
  if (ranks <= 16) return {288, 20, 12, 128};
  if (ranks <= 64) return {288, 8, 8, 128};
  if (ranks <= 96) return {480, 12, 8, 128};
  if (ranks <= 128) return {560, 12, 8, 128};
  return {720, 12, 8, 128};
}

// DeepEP csrc/config.hpp Config::get_nvl_buffer_size_hint and get_rdma_buffer_size_hint (deepseek-ai/DeepEP
// 030cdf0a), with NUM_MAX_NVL_PEERS = 8, kNumMaxTopK = kNumMaxScales = 128, SourceMeta 8 B, topk_idx int64:
//   channels c = sms / 2, nvl = min(R, 8), rdma = max(R / 8, 1), hb = hidden bytes (Megatron: H x 2,
//   fused_a2a.py:24-33)
//   NVL  = c nvl (2 rdma + 3) 4 + c nvl nvl_recv (hb + 8 + 128 x 8 + 128 x 4 + 128 x 4)
//   RDMA = c rdma (8 x 2 + 2) 2 x 4 + c rdma rdma_recv 2 (hb + 8 + 128 x 8 + 128 x 4 + 128 x 4 + 16) + 1 MiB
//          (only when R > 8; rdma_recv aligned up to the send chunk)
// Megatron allocates one Buffer of the larger NVL and RDMA hint of the two configs (fused_a2a.py get_buffer).
double deepep_buffer_bytes(double hidden_bytes, int64_t ranks, int64_t sms) {
  constexpr int64_t kNvlPeers = 8;
  const double meta = 8.0 + 128.0 * 8.0 + 128.0 * 4.0 + 128.0 * 4.0;
  const DeepEpConfig c = deepep_config(ranks);
  const double channels = d(std::max<int64_t>(1, sms / 2));
  const int64_t nvl = std::min(ranks, kNvlPeers), rdma = std::max<int64_t>(ranks / kNvlPeers, 1);
  const double nvl_bytes =
      channels * d(nvl) * d(2 * rdma + 3) * 4.0 + channels * d(nvl) * d(c.nvl_recv) * (hidden_bytes + meta);
  if (ranks <= kNvlPeers) return nvl_bytes;
  auto align_up = [](int64_t x, int64_t to) { return (x + to - 1) / to * to; };
  const int64_t recv =
      std::max(align_up(c.rdma_recv, c.rdma_send_dispatch), align_up(c.rdma_recv, c.rdma_send_combine));
  const double rdma_bytes = channels * d(rdma) * d(kNvlPeers * 2 + 2) * 2.0 * 4.0 +
                            channels * d(rdma) * d(recv) * 2.0 * (hidden_bytes + meta + 16.0) + 1048576.0;
  return nvl_bytes + rdma_bytes;
}

// HybridEP (DeepEP hybrid-ep csrc/hybrid_ep/hybrid_ep.cu allocate_buffer, allocate_buffer_for_dispatch /
// _for_combine, read at 017a5202): expert-side buffers sized for the worst case that every token of the
// group lands on one rank, T x R rows of a bf16 token and fp32 probs over the node's experts, for combine,
// and for dispatch again when the group spans nodes (inside one node they share); RDMA staging of T x (N - 1)
// rows, once for dispatch and twice for combine. Megatron passes the rank's token count as T (fused_a2a.py
// init_hybrid_ep_buffer).
double hybridep_buffer_bytes(double tokens, double hidden, int64_t ranks, int64_t per_node,
                             int64_t local_experts) {
  per_node = std::max<int64_t>(1, std::min(per_node, ranks));
  const double nodes = d(std::max<int64_t>(1, ranks / per_node));
  const double row = hidden * kBf16 + kFp32 * d(local_experts * per_node);
  const double expert_side = tokens * d(ranks) * row;
  const double staging = tokens * (nodes - 1.0) * row;
  return expert_side * (nodes > 1.0 ? 2.0 : 1.0) + 3.0 * staging;
}

}  // namespace

// A layer whose blocks differ from attention + FFN (model_notes.h): what the attention formulas above say for
// the mixer is replaced, and a block the layer lacks saves nothing. A Gated DeltaNet or Mamba-2 mixer saves
// its norm output, the in-projection and conv outputs [tg, (in_width + conv_channels) / tp], the scan output
// and the gated norm output [tg, 2 out_width / tp] in bf16, and its fp32 chunk states
// [b, s / chunk, heads / tp, dk, dv] (derived from the kernels' inputs and outputs; no trace checks it).
// Under Megatron-Core (`eager`: eager PyTorch around FLA, gated_delta_net.py at bbc762d5) a Gated DeltaNet
// saves what its autograd keeps instead: the conv's input (causal_conv1d_fn saves x), FLA's l2norm outputs of
// q and k, the scan's q and k repeated to the value heads and v, per value head g (fp32), beta and A (its 64
// columns in bf16 after solve_tril) and the gate math's fp32 softplus input and product operand, the gated
// norm's input and gate and the out-projection's input; the in-projection's output is only copied from and
// is freed, and FLA recomputes the chunk states in backward (ChunkGatedDeltaRuleFunction saves q, k, v, g,
// beta, A). A Mamba-2 mixer under Megatron-Core saves what mamba_ssm's MambaSplitConv1dScanCombinedFn keeps
// (zxBCdt and the ungated scan output) and its gated norm's and out-projection's inputs.
namespace {
LayerActivations reshape_blocks(const ModelSpec& m, const Plan& p, const LayerSpec& layer, bool eager,
                                LayerActivations r) {
  if (layer.mixer != MixerKind::kAttention) {
    r.attn_norm = r.mla_latent = r.qkv = r.core_attn = 0.0;
    if (layer.mixer == MixerKind::kNone) r.mlp_residual = 0.0;  // the block's input is the layer input
  }
  if (layer.mixer == MixerKind::kLinearAttention || layer.mixer == MixerKind::kMamba2) {
    const bool gdn = layer.mixer == MixerKind::kLinearAttention;
    const auto& g = m.linear_attention;
    const auto& s = m.mamba;
    const double tp = d(p.attention.tp), t = tokens_per_rank(p), tg = t * tp;
    const double in_w = d(gdn ? g.in_proj_width() : s.in_proj_width());
    const double conv = d(gdn ? g.conv_channels() : s.conv_channels());
    const double out_w = d(gdn ? g.value_dim() : s.inner());
    const double heads = d(gdn ? g.value_heads : s.heads) / tp;
    const double dk = d(gdn ? g.key_head_dim : s.state_size), dv = d(gdn ? g.value_head_dim : s.head_dim);
    const double chunks = std::ceil(d(p.seq_len) / d(gdn ? g.chunk : s.chunk));
    r.attn_norm = t * d(m.hidden) * kBf16;
    if (gdn && eager) {
      // q and k repeated to the value heads are tensors of their own only where there are more value heads.
      const double qk = d(g.key_dim()) / tp;
      const double repeated = g.value_heads > g.key_heads ? 2.0 * heads * dk : 0.0;
      r.qkv = tg * ((conv / tp + 2.0 * qk + repeated + heads * dv) * kBf16 +
                    heads * (kFp32 + kBf16 + d(g.chunk) * kBf16 + 2.0 * kFp32));
      r.core_attn = tg * 3.0 * out_w / tp * kBf16;
    } else if (eager) {
      // Mamba-2 under Megatron-Core: mamba_split_conv1d_scan_combined saves zxBCdt and the scan's output
      // before its gate (out_x); the conv output and the chunk states are recomputed in backward. The gated
      // RMSNorm saves its input and fp32 rstd per group, the out-projection its input.
      r.qkv = tg * in_w / tp * kBf16;
      r.core_attn = tg * (3.0 * out_w / tp * kBf16 + d(s.groups) / tp * kFp32);
    } else {
      r.qkv = tg * (in_w + conv) / tp * kBf16;
      r.core_attn = tg * 2.0 * out_w / tp * kBf16 + d(p.micro_batch) * chunks * heads * dk * dv * kFp32;
    }
  }
  if (!layer.ffn) {
    r.mlp_residual = r.mlp_norm = r.router = r.expert_fc1_in = r.expert_fc1_out = r.expert_fc2_in = r.shared =
        r.dense_mlp = 0.0;
  }
  return r;
}
}  // namespace

LayerActivations layer_activations_under(const ModelSpec& m, const Plan& p, const StackProfile& stack,
                                         const LayerSpec& layer, double expert_load_scale,
                                         Recompute recompute, uint16_t modules) {
  if (layer.mixer != MixerKind::kAttention || !layer.ffn) {
    LayerSpec plain = layer;
    plain.mixer = MixerKind::kAttention;
    plain.ffn = true;
    if (recompute == Recompute::kFull)
      return layer_activations_under(m, p, stack, plain, expert_load_scale, recompute, modules);
    return reshape_blocks(m, p, layer, !fused_stack(stack),
                          layer_activations_under(m, p, stack, plain, expert_load_scale, recompute, modules));
  }
  switch (recompute) {
    case Recompute::kFull: {
      LayerActivations r;
      r.input = tokens_per_rank(p, layer) * d(m.hidden) * kBf16;  // the checkpoint's input; all else re-runs
      return r;
    }
    case Recompute::kSar:
      return megascale_layer(m, p, layer, expert_load_scale, true);
    case Recompute::kNone:
      return fused_stack(stack) ? megascale_layer(m, p, layer, expert_load_scale, false)
                                : megatron_layer(m, p, layer, expert_load_scale, 0,
                                                 mla_down_proj_of(p, stack), fp8_padding_of(p, stack));
    case Recompute::kSelective:
      break;
  }
  return megatron_layer(m, p, layer, expert_load_scale, modules, mla_down_proj_of(p, stack),
                        fp8_padding_of(p, stack));
}

LayerActivations layer_activations(const ModelSpec& m, const Plan& p, const StackProfile& stack,
                                   const LayerSpec& layer, double expert_load_scale) {
  return layer_activations_under(m, p, stack, layer, expert_load_scale, p.recompute, p.recompute_modules);
}

double head_activations(const ModelSpec& m, const Plan& p, const StackProfile& stack,
                        double expert_load_scale) {
  const bool encdec = m.encoder_decoder();
  // An encoder-decoder's head runs on its decoder's tokens, and its encoder's output stays for backward.
  const double t =
      encdec ? d(p.micro_batch * decoder_seq_len(p.seq_len)) / d(p.attention.tp) : tokens_per_rank(p);
  const double h = d(m.hidden), tg = t * d(p.attention.tp);
  const double g = p.precision == Precision::kFp8 ? fp8_saved_bytes(p.fp8_recipe) : kBf16;
  // Final norm input and rsigma, the output layer's saved input (its SP shard, re-gathered in backward), and
  // what the loss keeps of the logits for backward: Megatron's unfused and native losses cast them to fp32
  // and save the softmax in fp32 (tensor_parallel/cross_entropy.py calculate_logits_max, exp_logits;
  // fusions/fused_cross_entropy.py save_for_backward at 1e057005; Megatron's estimator:
  // S b H 4 (1 + V/H), theoretical_memory_usage.py); TE's Triton loss writes the gradient into the bf16
  // logits and saves them (TE v2.4 pytorch/cross_entropy.py:49-53).
  const bool te_loss = !fused_stack(stack) && p.cross_entropy == CrossEntropy::kTe;
  const double head = t * h * kBf16 + t * kFp32 + t * h * kBf16 +
                      tg * d(m.vocab) / d(p.attention.tp) * (te_loss ? kBf16 : kFp32) +
                      (encdec ? tokens_per_rank(p) * h * kBf16 : 0.0);
  // Each MTP module (gpt_model.py:173: the MTP stage has its own embedding): the next tokens' embedding
  // (enorm input), the [t, 2h] concatenation eh_proj saves, one decoder layer (MoE when the model is), its
  // own head.
  const LayerSpec mtp_layer{m.is_moe(), 0, true};
  const double mtp = t * h * kBf16 + 2.0 * t * h * g +
                     layer_activations(m, p, stack, mtp_layer, expert_load_scale).total() + head;
  return head + d(m.mtp_layers) * mtp;
}

double dispatcher_buffer_bytes(const ModelSpec& m, const Plan& p, const StackProfile& stack,
                               const HardwareProfile& hw, double expert_load_scale,
                               const LayerKindCounts* counts) {
  if (!m.is_moe()) return 0.0;
  const double h = d(m.hidden), t = tokens_per_rank(p);
  const int64_t group =
      p.experts.ep * p.experts.etp;  // the flex dispatcher's group is ETP x EP (TD:1893-1919)
  switch (stack.dispatcher.kind.value) {
    case DispatcherKind::kDeepEp:
      return group > 1 ? deepep_buffer_bytes(h * kBf16, group, stack.dispatcher.sms.value) : 0.0;
    case DispatcherKind::kHybridEp:
      return group > 1 ? hybridep_buffer_bytes(t, h, group, hw.node.gpus_per_node.value,
                                               m.moe.num_experts / p.experts.ep)
                       : 0.0;
    case DispatcherKind::kNcclAllToAll:
    case DispatcherKind::kNcclAllGather:
      return 0.0;  // NCCL's own buffers are in the stack's reserve
    case DispatcherKind::kFused:
      break;
  }
  // moerun / MegaScale-MoE: send + receive windows of the largest per-layer exchange (dispatched rows, or the
  // EP all-gather), and a DP bucket of one layer's fp32 gradients (assumption, as before this model).
  const double rows = t * d(m.moe.top_k) * expert_load_scale * d(p.experts.etp);
  const double exchange = p.experts.dispatch == Dispatch::kAllGather ? t * d(p.experts.ep) * h : rows * h;
  // The largest layer's parameters, one evaluation per distinct layer kind.
  std::optional<LayerKindCounts> own;
  if (!counts) counts = &own.emplace(m);
  double largest_layer = 0;
  for (const LayerSpec& spec : counts->kinds()) {
    const LocalParams lp = local_params(m, p, spec, mla_down_proj_of(p, stack));
    largest_layer = std::max(largest_layer, lp.dense() + lp.experts);
  }
  return 2.0 * exchange * kBf16 + largest_layer * kFp32;
}

namespace {

// What each stage holds (MemoryParts::stages and chunk_bytes), from the layer kinds' memory in `parts`.
void hold_stages(const ModelSpec& m, const Plan& p, const LayerKindCounts& counts, MemoryParts& parts) {
  const int64_t pp = p.pipeline.pp, vpp = p.pipeline.vpp, tp = p.attention.tp;
  const int64_t chunks = pp * vpp;
  // Decoder layers of virtual stage v: [first(v), first(v + 1)).
  const int64_t base = m.num_layers() / chunks, extra = m.num_layers() % chunks;
  const std::vector<int64_t>& split = p.pipeline.layers_per_stage;
  std::vector<int64_t> first;
  if (!split.empty()) {
    first.assign(split.size() + 1, 0);
    for (size_t i = 0; i < split.size(); ++i) first[i + 1] = first[i] + split[i];
  }
  auto first_layer = [&](int64_t v) {
    return split.empty() ? v * base + std::min(v, extra) : first[static_cast<size_t>(v)];
  };

  const std::vector<LayerMemory>& kinds = parts.kinds;
  const double input_bytes = tokens_per_rank(p) * d(m.hidden) * kBf16;
  const bool full = p.recompute == Recompute::kFull;
  const int64_t group_layers = std::max<int64_t>(1, p.recompute_num_layers);
  const double vocab_params = d(m.vocab) * d(m.hidden) / d(tp);

  parts.stages.assign(static_cast<size_t>(pp), StageHolding{});
  parts.chunk_bytes.assign(static_cast<size_t>(chunks), 0.0);
  for (int64_t s = 0; s < pp; ++s) {
    StageHolding& h = parts.stages[static_cast<size_t>(s)];
    // `count` layers of one kind: their parameters, and the largest layer and working set among them.
    auto hold = [&](const LayerMemory& k, int64_t count) {
      h.sharded += d(count) * k.params.sharded;
      h.gemm += d(count) * k.params.gemm;
      h.replicated += d(count) * k.params.replicated;
      h.experts += d(count) * k.params.experts;
      h.largest_layer = std::max(h.largest_layer, k.params.dense() + k.params.experts);
      h.working = std::max(h.working, k.working);
    };
    for (int64_t c = 0; c < vpp; ++c) {
      const int64_t v = virtual_stage(c, s, pp, p.pipeline.schedule);
      const bool last = v == chunks - 1;
      const int64_t a = first_layer(v), e = first_layer(v + 1);
      const int64_t n = e - a;  // decoder layers; MTP layers follow on the last
      double& bytes = parts.chunk_bytes[static_cast<size_t>(s * vpp + c)];
      // Full recompute (recompute.py:157-181): uniform keeps one input per group of N layers of the chunk;
      // block checkpoints the first N layers of the chunk and keeps everything of the rest.
      if (full) {
        bytes += d(p.recompute_method == RecomputeMethod::kUniform ? (n + group_layers - 1) / group_layers
                                                                   : std::min(n, group_layers)) *
                 input_bytes;
      }
      for (size_t k = 0; k < kinds.size(); ++k) {
        const int64_t count = counts.in(k, a, e);
        if (count == 0) continue;
        hold(kinds[k], count);
        if (!full) {
          bytes += d(count) * kinds[k].saved;
        } else if (p.recompute_method != RecomputeMethod::kUniform) {
          bytes += d(counts.in(k, std::min(e, a + group_layers), e)) * kinds[k].working;
        }
      }
      if (last && m.mtp_layers > 0) hold(parts.mtp, m.mtp_layers);  // its activations are among the head's
      h.layers += n + (last ? m.mtp_layers : 0);
      h.longest_chunk = std::max(h.longest_chunk, n);
      if (last) {
        bytes += parts.head;
        // MTP: the projection [2h -> h] (TP-sharded) and three norms (replicated) (lower.cpp local_params).
        h.sharded += d(m.mtp_layers) * 2.0 * d(m.hidden) * d(m.hidden) / d(tp);
        h.gemm += d(m.mtp_layers) * 2.0 * d(m.hidden) * d(m.hidden) / d(tp);
        h.replicated += d(m.mtp_layers) * 3.0 * d(m.hidden);
      }
    }
    // Embedding with the first virtual stage, output layer with the last (vocabulary split over tp): the
    // first and last pipeline stages, or both on stage 0 under DualPipeV's V. The MTP stage holds its own
    // copy of the embedding (gpt_model.py:173) unless it also holds the embedding or it is tied to the
    // output.
    const bool has_embedding = stage_of_virtual(0, pp, p.pipeline.schedule) == s;
    const bool has_head = stage_of_virtual(chunks - 1, pp, p.pipeline.schedule) == s;
    const bool shared = has_embedding && has_head;  // one stage holds both ends
    if (has_embedding) h.embeddings += vocab_params;
    if (has_head && (!m.tied_embeddings || !shared)) h.embeddings += vocab_params;
    if (has_head && !shared && m.mtp_layers > 0 && !m.tied_embeddings) h.embeddings += vocab_params;
    if (has_head) h.replicated += d(m.hidden) * (m.norm == NormKind::kLayerNorm ? 2.0 : 1.0);  // final norm
  }
}

// Each pipeline stage's memory, in stage order, passed to `visit` (memory_per_stage keeps them all,
// memory_per_gpu only the largest).
template <class Visit>
void visit_stages(const ModelSpec& m, const Plan& p, const HardwareProfile& hw, const StackProfile& stack,
                  const std::vector<std::vector<int64_t>>& in_flight, double expert_load_scale,
                  const LayerKindCounts* counts_in, const MemoryParts* parts_in, Visit&& visit) {
  // The model's layer kinds and the plan's memory parts, computed here when the caller has none.
  std::optional<LayerKindCounts> own;
  const LayerKindCounts& counts = counts_in ? *counts_in : own.emplace(m);
  std::optional<MemoryParts> own_parts;
  const MemoryParts& parts =
      parts_in ? *parts_in : own_parts.emplace(memory_parts(m, p, hw, stack, expert_load_scale, counts));
  const int64_t pp = p.pipeline.pp, vpp = p.pipeline.vpp;
  MOEPLAN_ASSERT(parts.stages.size() == static_cast<size_t>(pp) &&
                 parts.chunk_bytes.size() == static_cast<size_t>(pp * vpp));
  const double replicas = d(p.attention.sp * p.attention.cp * p.dp());  // ranks holding the same dense params
  const double edp = d(p.expert_dp());
  const bool fp8 = p.precision == Precision::kFp8;
  // Megatron's main-gradient buffer (F §4.1, param_and_grad_buffer.py:888-899).
  const double grad_bytes = main_grad_bytes(p);
  // The bf16 parameter buffer (param_and_grad_buffer.py:1180-1195) and the fp32 main parameters with Adam's
  // m and v (distrib_optimizer.py:370-463), per parameter, as the training job states them (model_stats.h).
  const TrainingBytesPerParam job = bytes_per_param(DType::kBf16);

  for (int64_t s = 0; s < pp; ++s) {
    const StageHolding& h = parts.stages[static_cast<size_t>(s)];
    const double* chunk_bytes = parts.chunk_bytes.data() + s * vpp;
    MemoryBreakdown b;
    b.stage = s;
    b.capacity = hw.gpu.hbm_capacity_bytes.value;
    const double dense = h.sharded + h.replicated + h.embeddings;
    const double params = dense + h.experts;

    const int64_t zero = p.data.zero;
    const double sharded_params = dense / replicas + h.experts / edp;
    // ZeRO-3 keeps the parameter shards and two layers gathered (the one running and the one prefetched). On
    // the Megatron stacks (Megatron-FSDP) the embedding and output layer stay gathered all step: they are
    // not in an FSDP unit (lower.cpp, the stage's gathers).
    const double whole_vocab =
        zero == 3 && !fused_stack(stack) ? h.embeddings - h.embeddings / replicas : 0.0;
    b.weights = zero == 3 ? (sharded_params + whole_vocab + 2.0 * h.largest_layer) * job.weights
                          : params * job.weights;
    // FP8: TE's cached weight and transpose; moerun / MegaScale-MoE: one FP8 copy per GEMM weight
    // (assumption, as before this model). With FP8 parameters (--fp8-param-gather) a GEMM weight is its FP8
    // data (1 B in the uint8 parameter buffer) and the transpose made after each gather (1 B): the 2 B of
    // the BF16 parameter it replaces, and no cache beside it; the recipe's scales remain.
    if (fp8) {
      const bool fused = fused_stack(stack);
      const double cache = fused ? 1.0 : fp8_weight_cache_bytes(p.fp8_recipe);
      b.weights += h.gemm * (fp8_params(p) && !fused ? cache - 2.0 : cache);
    }
    b.gradients = (zero >= 2 ? sharded_params : params) * grad_bytes;
    b.optimizer = (zero >= 1 ? sharded_params : params) * job.optimizer;

    // Activations: each in-flight micro-batch chunk holds its layers' saved tensors; the layer whose backward
    // runs adds its working set: its activation gradients and what recompute restores, taken as the tensors
    // it saves without recompute (assumption), for a group of N layers under uniform full recompute.
    const bool by_chunk = s < static_cast<int64_t>(in_flight.size()) &&
                          static_cast<int64_t>(in_flight[static_cast<size_t>(s)].size()) == vpp;
    b.in_flight = 0;
    for (int64_t c = 0; c < vpp; ++c) {
      const int64_t n = by_chunk ? in_flight[static_cast<size_t>(s)][static_cast<size_t>(c)] : 1;
      b.in_flight += n;
      b.activations += d(n) * chunk_bytes[c];
    }
    if (!by_chunk && s < static_cast<int64_t>(in_flight.size()) &&
        !in_flight[static_cast<size_t>(s)].empty()) {
      // A total without its chunks: spread it evenly over them.
      int64_t total = 0;
      for (int64_t n : in_flight[static_cast<size_t>(s)]) total += n;
      double all = 0;
      for (int64_t c = 0; c < vpp; ++c) all += chunk_bytes[c];
      b.in_flight = total;
      b.activations = d(total) * all / d(vpp);
    }
    if (h.layers > 0) {
      const int64_t group = p.recompute == Recompute::kFull && p.recompute_method == RecomputeMethod::kUniform
                                ? std::min(std::max<int64_t>(1, p.recompute_num_layers), h.longest_chunk)
                                : 1;
      b.activations += d(group) * h.working;
    }
    b.comm_buffers = parts.comm;

    // The allocator's reserve and fragmentation, as the stack states them (a range).
    const double allocated = b.allocated();
    b.reserve_low = stack.memory.reserve_bytes.value + stack.memory.fragmentation.value * allocated;
    b.reserve_high =
        stack.memory.reserve_bytes_high.value + stack.memory.fragmentation_high.value * allocated;
    b.reserve = 0.5 * (b.reserve_low + b.reserve_high);
    visit(b);
  }
}

}  // namespace

MemoryParts memory_parts(const ModelSpec& m, const Plan& p, const HardwareProfile& hw,
                         const StackProfile& stack, double expert_load_scale, const LayerKindCounts& counts) {
  auto kind_of = [&](const LayerSpec& spec) {
    const LocalParams lp = local_params(m, p, spec, mla_down_proj_of(p, stack));
    return LayerMemory{
        lp, layer_activations(m, p, stack, spec, expert_load_scale).total(),
        layer_activations_under(m, p, stack, spec, expert_load_scale, Recompute::kNone, 0).total()};
  };
  MemoryParts out;
  out.kinds.reserve(counts.kinds().size());
  for (const LayerSpec& spec : counts.kinds()) out.kinds.push_back(kind_of(spec));
  if (m.mtp_layers > 0) out.mtp = kind_of(LayerSpec{m.is_moe(), 0, true});
  out.comm = dispatcher_buffer_bytes(m, p, stack, hw, expert_load_scale, &counts);
  out.head = head_activations(m, p, stack, expert_load_scale);
  hold_stages(m, p, counts, out);
  return out;
}

std::vector<MemoryBreakdown> memory_per_stage(const ModelSpec& m, const Plan& p, const HardwareProfile& hw,
                                              const StackProfile& stack,
                                              const std::vector<std::vector<int64_t>>& in_flight,
                                              double expert_load_scale, const LayerKindCounts* counts) {
  std::vector<MemoryBreakdown> stages;
  stages.reserve(static_cast<size_t>(p.pipeline.pp));
  visit_stages(m, p, hw, stack, in_flight, expert_load_scale, counts, nullptr,
               [&](const MemoryBreakdown& b) { stages.push_back(b); });
  return stages;
}

MemoryBreakdown memory_per_gpu(const ModelSpec& m, const Plan& p, const HardwareProfile& hw,
                               const StackProfile& stack, const std::vector<std::vector<int64_t>>& in_flight,
                               double expert_load_scale, const LayerKindCounts* counts,
                               const MemoryParts* parts) {
  // The first stage with the largest total (max_element over memory_per_stage would pick the same one).
  MemoryBreakdown largest;
  bool any = false;
  visit_stages(m, p, hw, stack, in_flight, expert_load_scale, counts, parts, [&](const MemoryBreakdown& b) {
    if (!any || largest.total() < b.total()) largest = b;
    any = true;
  });
  return largest;
}

}  // namespace moeplan::cost
