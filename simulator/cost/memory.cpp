// Memory per GPU (see memory.h). Notation as in the lowering: t = b*s/(tp*sp*cp) tokens per rank, tg = t*tp
// tokens after the TP all-gather, ta = tg*sp tokens at attention after the Ulysses all-to-all.
#include "simulator/cost/memory.h"

#include <algorithm>

#include "simulator/core/model_stats.h"
#include "simulator/core/units.h"

namespace moeplan::cost {
namespace {

double d(int64_t x) {
  return static_cast<double>(x);
}

// Saved activations of one layer under a recompute policy (the plan's, or another one without copying it).
LayerActivations activations_under(const ModelSpec& m, const Plan& p, const LayerSpec& layer,
                                   double expert_load_scale, Recompute recompute) {
  const auto& a = m.attention;
  const int64_t tp = p.attention.tp, sp = p.attention.sp, cp = p.attention.cp;
  const double h = d(m.hidden);
  const double t = d(p.micro_batch * p.seq_len / (tp * sp * cp));
  const double tg = t * d(tp), ta = tg * d(sp);
  const int64_t heads_r = a.num_heads / tp;
  const int64_t kv_r = std::max<int64_t>(1, a.num_kv_heads / tp);
  const double heads_a = d(heads_r) / d(sp);
  const bool mla = a.kind == AttentionKind::kMla;
  const double qk = d(a.qk_dim()), v = d(a.v_dim());
  const double q_w = d(heads_r) * qk;
  const double kv_w = mla ? d(heads_r) * (qk + v) : 2.0 * d(std::max(kv_r, sp)) * d(a.head_dim);
  const double rope_w = d(heads_r + kv_r) * (mla ? d(a.mla.qk_rope_head_dim) : d(a.head_dim));

  LayerActivations r;
  // Kept under every policy except full recompute: layer input, residual, attention inputs and output.
  const double attn_inputs = ta * (q_w + kv_w) / d(sp);  // q/k/v as attention reads them
  const double attn_out = ta * heads_a * v;
  if (recompute == Recompute::kFull) {
    r.attention = t * h;  // the layer input; everything else is recomputed
    return r;
  }
  // MegaScale-MoE's SAR keeps the tensors below; Megatron's selective modules are priced as no recompute
  // here until the per-module accounting lands.
  const bool selective = recompute == Recompute::kSar;
  if (selective) {
    r.attention = t * h + t * h + attn_inputs + attn_out;  // hidden, ln2_in, q/k/v, attention output
  } else {
    r.attention = t * h                                 // hidden
                  + t * h                               // ln1_out (stored sequence-sharded under TP)
                  + tg * (q_w + kv_w)                   // q/k/v projection output
                  + tg * rope_w                         // rope outputs
                  + (sp > 1 ? attn_inputs : 0.0)        // q/k/v after the all-to-all
                  + attn_out                            // attention output
                  + (sp > 1 ? tg * d(heads_r) * v : 0)  // attention output after the all-to-all
                  + t * h                               // out-projection output
                  + t * h;                              // ln2_in (residual)
  }
  if (layer.moe) {
    const auto& e = m.moe;
    const int64_t etp = p.experts.etp, ep = p.experts.ep;
    const double rows = t * d(e.top_k) * expert_load_scale;
    const double rows_e = rows * d(etp);
    const double f_r = d(e.expert_ffn) / d(etp);
    const bool gather = p.experts.dispatch == Dispatch::kAllGather;
    const double fs = d(e.num_shared_experts * e.shared_expert_ffn) / d(tp);
    const double shared_full = e.num_shared_experts > 0 ? 3.0 * tg * fs : 0.0;
    if (selective) {
      r.moe = 2.0 * rows_e * f_r + (e.num_shared_experts > 0 ? 2.0 * tg * fs : 0.0);
    } else {
      r.moe = t * h                             // ln2_out
              + (gather ? t * d(ep) * h : 0.0)  // ln2_out all-gathered over EP
              + rows * h                        // ffn_in (scattered or dispatched rows)
              + 3.0 * rows_e * f_r              // fc1_out, fc3_out, fc2_in
              + rows_e * h                      // fc2_out
              + (gather ? t * d(ep) * h : 0.0)  // fc2_out gathered before the reduce-scatter
              + t * h                           // ffn_out
              + shared_full;
    }
  } else {
    const double f_r = d(m.dense_ffn) / d(tp);
    r.dense_ffn = selective ? 2.0 * tg * f_r : t * h + 3.0 * tg * f_r + t * h;
  }
  return r;
}

}  // namespace

LayerActivations layer_activation_elements(const ModelSpec& m, const Plan& p, const LayerSpec& layer,
                                           double expert_load_scale) {
  return activations_under(m, p, layer, expert_load_scale, p.recompute);
}

MemoryBreakdown memory_per_gpu(const ModelSpec& m, const Plan& p, const HardwareProfile& hw,
                               const std::vector<int64_t>& in_flight, double expert_load_scale) {
  const int64_t pp = p.pipeline.pp, vpp = p.pipeline.vpp;
  const int64_t tp = p.attention.tp, ep = p.experts.ep, etp = p.experts.etp;
  const double replicas = d(p.attention.sp * p.attention.cp * p.dp());  // ranks holding the same dense params
  const double edp = d(p.expert_dp());
  const double weight_bytes = p.precision == Precision::kFp8 ? 3.0 : 2.0;  // bf16 (+ an fp8 copy)
  const double dt = bytes_of(DType::kBf16);
  std::vector<int64_t> layers(static_cast<size_t>(pp * vpp), m.num_layers() / (pp * vpp));
  if (!p.pipeline.layers_per_stage.empty()) {
    layers = p.pipeline.layers_per_stage;
  } else {
    for (int64_t i = 0; i < m.num_layers() % (pp * vpp); ++i) ++layers[static_cast<size_t>(i)];
  }
  std::vector<int64_t> first(layers.size() + 1, 0);
  for (size_t i = 0; i < layers.size(); ++i) first[i + 1] = first[i] + layers[i];

  // Per distinct layer kind: parameters on this rank and saved activations (layers of a kind are identical).
  struct Kind {
    LayerSpec spec;
    double dense = 0, experts = 0, activations = 0;
  };
  std::vector<Kind> kinds;
  std::vector<size_t> kind_of(m.layers.size());
  for (size_t l = 0; l < m.layers.size(); ++l) {
    const LayerSpec& spec = m.layers[l];
    auto it = std::find_if(kinds.begin(), kinds.end(), [&](const Kind& k) {
      return k.spec.moe == spec.moe && k.spec.window == spec.window &&
             k.spec.kv_projection == spec.kv_projection;
    });
    if (it == kinds.end()) {
      const ParamBreakdown lp = layer_params(m, spec);
      kinds.push_back({spec, (lp.total() - lp.routed_experts) / d(tp), lp.routed_experts / d(ep * etp),
                       layer_activation_elements(m, p, spec, expert_load_scale).total() * dt});
      it = kinds.end() - 1;
    }
    kind_of[l] = static_cast<size_t>(it - kinds.begin());
  }
  double largest_full = 0;  // one layer's full working set while it is recomputed
  if (p.recompute != Recompute::kNone) {
    for (const Kind& k : kinds) {
      largest_full = std::max(
          largest_full, activations_under(m, p, k.spec, expert_load_scale, Recompute::kNone).total() * dt);
    }
  }

  MemoryBreakdown worst;
  for (int64_t s = 0; s < pp; ++s) {
    MemoryBreakdown b;
    b.stage = s;
    b.capacity = hw.gpu.hbm_capacity_bytes.value;
    double dense = 0, experts = 0, act_per_chunk = 0, largest_layer = 0;
    int64_t chunks_layers = 0;
    for (int64_t c = 0; c < vpp; ++c) {
      const int64_t v = c * pp + s;
      for (int64_t l = first[static_cast<size_t>(v)]; l < first[static_cast<size_t>(v) + 1]; ++l) {
        const Kind& k = kinds[kind_of[static_cast<size_t>(l)]];
        dense += k.dense;
        experts += k.experts;
        largest_layer = std::max(largest_layer, k.dense + k.experts);
        act_per_chunk += k.activations;
        ++chunks_layers;
      }
    }
    // Embedding on the first stage, output layer on the last (vocabulary split over tp).
    const double vocab_params = d(m.vocab) * d(m.hidden) / d(tp);
    if (s == 0) dense += vocab_params;
    if (s == pp - 1 && (!m.tied_embeddings || pp > 1)) dense += vocab_params;
    const double params = dense + experts;

    const int64_t zero = p.data.zero;
    b.weights = zero == 3 ? (dense / replicas + experts / edp + 2.0 * largest_layer) * weight_bytes
                          : params * weight_bytes;
    b.gradients = zero >= 2 ? (dense / replicas + experts / edp) * 4.0 : params * 4.0;
    b.optimizer = zero >= 1 ? (dense / replicas + experts / edp) * 12.0 : params * 12.0;

    // Activations: the peak number of live chunks, each holding its layers' saved tensors (averaged over the
    // stage's chunks), plus one layer's full working set while it is recomputed.
    b.in_flight = in_flight.empty() ? 1 : in_flight[static_cast<size_t>(s)];
    b.activations = d(b.in_flight) * act_per_chunk / d(std::max<int64_t>(1, vpp));
    if (chunks_layers > 0) b.activations += largest_full;
    const double t = d(p.micro_batch * p.seq_len / (tp * p.attention.sp * p.attention.cp));
    if (s == pp - 1) b.activations += t * d(tp) * d(m.vocab) / d(tp) * 4.0;  // fp32 logits for the loss

    // Communication buffers: send + receive of the largest per-layer exchange (dispatched rows or the EP
    // all-gather), and a DP bucket of one layer's fp32 gradients.
    const double rows = m.is_moe() ? t * d(m.moe.top_k) * expert_load_scale * d(etp) : 0.0;
    const double dispatch =
        p.experts.dispatch == Dispatch::kAllGather ? t * d(ep) * d(m.hidden) : rows * d(m.hidden);
    b.comm_buffers = 2.0 * dispatch * dt + largest_layer * 4.0;
    b.reserve = kReserveFixedBytes +
                kFragmentation * (b.weights + b.gradients + b.optimizer + b.activations + b.comm_buffers);
    if (s == 0 || b.total() > worst.total()) worst = b;
  }
  return worst;
}

}  // namespace moeplan::cost
