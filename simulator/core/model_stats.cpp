// Parameter and FLOP counting from the architecture alone; formulas are in model_stats.h.
#include "simulator/core/model_stats.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace moeplan {
namespace {

double norm_params(NormKind kind, int64_t width) {
  const auto w = static_cast<double>(width);
  return kind == NormKind::kLayerNorm ? 2.0 * w : w;
}

double ffn_matrices(FfnActivation a) {
  return a == FfnActivation::kSwiGlu ? 3.0 : 2.0;
}

// Weights of the DSA lightning indexer of one layer: wq_b [q_lora_rank -> heads*head_dim], wk [h ->
// head_dim], weights_proj [h -> heads]; 0 without an indexer.
double indexer_matmul_params(const ModelSpec& m) {
  const auto& x = m.attention.indexer;
  if (x.heads <= 0) return 0.0;
  const auto h = static_cast<double>(m.hidden);
  const auto q_in =
      static_cast<double>(m.attention.mla.q_lora_rank > 0 ? m.attention.mla.q_lora_rank : m.hidden);
  const auto heads = static_cast<double>(x.heads), dim = static_cast<double>(x.head_dim);
  return q_in * heads * dim + h * dim + h * heads;
}

// The k and v projections of a decoder layer's cross-attention [h -> kv_heads * head_dim] each: they
// multiply the encoder's tokens, not the decoder's.
double cross_kv_params(const ModelSpec& m) {
  return 2.0 * static_cast<double>(m.hidden) * static_cast<double>(m.attention.num_kv_heads) *
         static_cast<double>(m.attention.head_dim);
}

// Weights of the token mixer's projections of one layer (q/k/v/o, MLA, the DSA indexer, or the in/out
// projections of a Gated DeltaNet or Mamba-2 mixer): these are also the GEMM weights a token multiplies.
double attention_matmul_params(const ModelSpec& m, const LayerSpec& layer) {
  const auto& a = m.attention;
  const auto h = static_cast<double>(m.hidden);
  const auto heads = static_cast<double>(a.num_heads);
  switch (layer.mixer) {
    case MixerKind::kNone:
      return 0.0;
    case MixerKind::kLinearAttention: {
      const auto& g = m.linear_attention;
      return h * static_cast<double>(g.in_proj_width()) + static_cast<double>(g.value_dim()) * h;
    }
    case MixerKind::kMamba2: {
      const auto& s = m.mamba;
      return h * static_cast<double>(s.in_proj_width()) + static_cast<double>(s.inner()) * h;
    }
    case MixerKind::kAttention:
      break;
  }
  if (a.kind == AttentionKind::kMla) {
    const auto& d = a.mla;
    const auto qk = static_cast<double>(d.qk_nope_head_dim + d.qk_rope_head_dim);
    const double q = d.q_lora_rank > 0 ? h * static_cast<double>(d.q_lora_rank) +
                                             static_cast<double>(d.q_lora_rank) * heads * qk
                                       : h * heads * qk;
    const double kv_a = h * static_cast<double>(d.kv_lora_rank + d.qk_rope_head_dim);
    const double kv_b =
        static_cast<double>(d.kv_lora_rank) * heads * static_cast<double>(d.qk_nope_head_dim + d.v_head_dim);
    const double o = heads * static_cast<double>(d.v_head_dim) * h;
    return q + kv_a + kv_b + o + indexer_matmul_params(m);
  }
  const auto hd = static_cast<double>(a.head_dim);
  const double q = h * heads * hd * (a.output_gate ? 2.0 : 1.0);
  const double kv = layer.kv_projection ? 2.0 * h * static_cast<double>(a.num_kv_heads) * hd : 0.0;
  const double o = heads * hd * h;
  // An encoder-decoder's decoder layer has a second attention: q from the decoder, k and v from the encoder
  // output, o back to h (T5 EncDecAttention).
  const double cross = layer.role == LayerRole::kDecoder ? 2.0 * h * heads * hd + cross_kv_params(m) : 0.0;
  return q + kv + o + cross;
}

// Biases, sinks, q/k norms and MLA's low-rank norms of one layer; for the recurrent mixers their conv1d, the
// per-head dt bias, A (and D) and the gated output norm.
double attention_small_params(const ModelSpec& m, const LayerSpec& layer) {
  const auto& a = m.attention;
  const auto heads = static_cast<double>(a.num_heads);
  double p = 0;
  switch (layer.mixer) {
    case MixerKind::kNone:
      return 0.0;
    case MixerKind::kLinearAttention: {
      const auto& g = m.linear_attention;
      return static_cast<double>(g.conv_channels() * g.conv_kernel + 2 * g.value_heads + g.value_head_dim);
    }
    case MixerKind::kMamba2: {
      const auto& s = m.mamba;
      const int64_t conv = s.conv_channels() * s.conv_kernel + (s.conv_bias ? s.conv_channels() : 0);
      const int64_t bias = s.proj_bias ? s.in_proj_width() + m.hidden : 0;
      return static_cast<double>(conv + 3 * s.heads + s.inner() + bias);
    }
    case MixerKind::kAttention:
      break;
  }
  if (a.kind == AttentionKind::kMla) {
    if (a.mla.q_lora_rank > 0) p += norm_params(m.norm, a.mla.q_lora_rank);
    p += norm_params(m.norm, a.mla.kv_lora_rank);
    // The DSA indexer's k norm is a LayerNorm with weight and bias.
    if (a.indexer.heads > 0) p += 2.0 * static_cast<double>(a.indexer.head_dim);
    return p;
  }
  const auto hd = static_cast<double>(a.head_dim);
  const auto kv = static_cast<double>(a.num_kv_heads);
  if (a.qkv_bias) p += heads * hd + (layer.kv_projection ? 2.0 * kv * hd : 0.0);
  if (a.out_bias) p += static_cast<double>(m.hidden);
  switch (a.qk_norm) {
    case QkNorm::kPerHead:
      p += 2.0 * hd;
      break;
    case QkNorm::kFull:
      p += heads * hd + kv * hd;
      break;
    case QkNorm::kNone:
    case QkNorm::kUnweighted:
      break;
  }
  if (a.sinks) p += heads;
  if (layer.position_bias) p += static_cast<double>(m.relative_buckets) * heads;
  return p;
}

struct MoeLayerParams {
  double routed_total = 0;
  double routed_active = 0;
  double shared = 0;
  double router = 0;
};

MoeLayerParams moe_layer_params(const ModelSpec& m) {
  const auto& e = m.moe;
  const auto h = static_cast<double>(m.hidden);
  const double mats = ffn_matrices(m.activation);
  const auto f = static_cast<double>(e.expert_ffn);
  // GPT-OSS expert biases: fused gate/up bias [2f] and down bias [h].
  const double per_expert = mats * h * f + (e.expert_bias ? (mats - 1.0) * f + h : 0.0);
  MoeLayerParams p;
  p.routed_total = static_cast<double>(e.num_experts) * per_expert;
  p.routed_active = static_cast<double>(e.top_k) * per_expert;
  p.shared = static_cast<double>(e.num_shared_experts) * mats * h * static_cast<double>(e.shared_expert_ffn) +
             (e.shared_expert_gate ? h : 0.0);
  const auto experts = static_cast<double>(e.num_experts);
  p.router = h * experts + (e.router_bias ? experts : 0.0) + (e.router_score_bias ? experts : 0.0);
  return p;
}

// Parameters of one decoder layer added into `total` and `active`.
void add_layer(const ModelSpec& m, const LayerSpec& layer, ParamBreakdown& total, ParamBreakdown& active) {
  const double attn = attention_matmul_params(m, layer) + attention_small_params(m, layer);
  // One pre-norm per sub-block: the mixer's, the cross-attention's and the FFN's.
  const double norms = ((layer.mixer != MixerKind::kNone ? 1.0 : 0.0) +
                        (layer.role == LayerRole::kDecoder ? 1.0 : 0.0) + (layer.ffn ? 1.0 : 0.0)) *
                       norm_params(m.norm, m.hidden);
  total.attention += attn;
  active.attention += attn;
  total.norms += norms;
  active.norms += norms;
  if (!layer.ffn) return;
  if (layer.moe) {
    const MoeLayerParams p = moe_layer_params(m);
    total.routed_experts += p.routed_total;
    active.routed_experts += p.routed_active;
    total.shared_experts += p.shared;
    active.shared_experts += p.shared;
    total.router += p.router;
    active.router += p.router;
  } else {
    const double dense =
        ffn_matrices(m.activation) * static_cast<double>(m.hidden) * static_cast<double>(m.dense_ffn);
    total.dense_ffn += dense;
    active.dense_ffn += dense;
  }
}

}  // namespace

double mla_down_params(const ModelSpec& m) {
  if (m.attention.kind != AttentionKind::kMla) return 0.0;
  const auto& l = m.attention.mla;
  return static_cast<double>(m.hidden) *
         static_cast<double>(l.q_lora_rank + l.kv_lora_rank + l.qk_rope_head_dim);
}

ParamBreakdown layer_params(const ModelSpec& m, const LayerSpec& layer) {
  ParamBreakdown total, active;
  add_layer(m, layer, total, active);
  return total;
}

ParamCounts count_params(const ModelSpec& m) {
  ParamCounts c;
  const auto h = static_cast<double>(m.hidden);
  const auto v = static_cast<double>(m.vocab);
  c.total.embedding = v * h;
  c.total.output = m.tied_embeddings ? 0.0 : v * h + (m.lm_head_bias ? v : 0.0);
  // The final norm; an encoder-decoder has one after each stack.
  c.total.norms = (m.encoder_decoder() ? 2.0 : 1.0) * norm_params(m.norm, m.hidden);
  c.active = c.total;
  for (const auto& layer : m.layers) add_layer(m, layer, c.total, c.active);

  if (m.mtp_layers > 0) {
    // One MTP module: norms of the hidden state and of the next token's embedding, a projection [2h -> h],
    // one MoE decoder layer and its output norm; embedding and output head are shared with the main model.
    ParamBreakdown t, a;
    const LayerSpec mtp_layer{.moe = m.is_moe(), .window = 0, .kv_projection = true};
    add_layer(m, mtp_layer, t, a);
    const double per_module = t.total() + 3.0 * norm_params(m.norm, m.hidden) + 2.0 * h * h;
    c.mtp = static_cast<double>(m.mtp_layers) * per_module;
  }
  return c;
}

double mean_attended_keys(int64_t seq_len, int64_t window) {
  const auto s = static_cast<double>(seq_len);
  if (window <= 0 || window >= seq_len) return (s + 1.0) / 2.0;
  const auto w = static_cast<double>(window);
  return (w * (w + 1.0) / 2.0 + (s - w) * w) / s;
}

int64_t t5_target_len(int64_t encoder_seq_len) {
  // T5's random_spans_helper: the longest raw span of T tokens whose corrupted input, the non-noise tokens
  // plus one sentinel per noise span plus EOS, fits in the encoder; the target holds the noise tokens, one
  // sentinel per span and EOS. Python's round() ties to even, as nearbyint does by default.
  auto lengths = [](int64_t t) {
    const auto noise = static_cast<int64_t>(std::nearbyint(static_cast<double>(t) * kSpanNoiseDensity));
    const auto spans = static_cast<int64_t>(std::nearbyint(static_cast<double>(noise) / kSpanMeanLength));
    return std::pair<int64_t, int64_t>{t - noise + spans + 1, noise + spans + 1};
  };
  int64_t t = std::max<int64_t>(encoder_seq_len - 1, 1);
  while (lengths(t + 1).first <= encoder_seq_len) ++t;
  return lengths(t).second;
}

int64_t decoder_seq_len(int64_t encoder_seq_len) {
  const int64_t target = t5_target_len(encoder_seq_len);
  return (target + kDecoderSeqMultiple - 1) / kDecoderSeqMultiple * kDecoderSeqMultiple;
}

int64_t layer_seq_len(const LayerSpec& layer, int64_t seq_len) {
  return layer.role == LayerRole::kDecoder ? decoder_seq_len(seq_len) : seq_len;
}

double mixer_core_flops(const ModelSpec& m, const LayerSpec& layer, int64_t seq_len) {
  const auto d = [](int64_t x) { return static_cast<double>(x); };
  switch (layer.mixer) {
    case MixerKind::kNone:
      return 0.0;
    case MixerKind::kLinearAttention: {
      const auto& g = m.linear_attention;
      return d(g.value_heads) * chunked_scan_flops(g.key_head_dim, g.value_head_dim, g.chunk);
    }
    case MixerKind::kMamba2: {
      const auto& s = m.mamba;
      return d(s.heads) * chunked_scan_flops(s.state_size, s.head_dim, s.chunk);
    }
    case MixerKind::kAttention:
      break;
  }
  const auto& a = m.attention;
  // DSA: the core attends the indexer's top_k keys of each query, min(i + 1, top_k) for query i, which is the
  // key count of a top_k-token window; the indexer scores every causal key with its small heads (QK only).
  const int64_t window = a.indexer.heads > 0 ? a.indexer.top_k : layer.window;
  const double per_key = 2.0 * d(a.num_heads) * d(a.qk_dim() + a.v_dim());
  // An encoder attends every key; a decoder layer of an encoder-decoder attends its causal targets, then
  // (cross-attention) every encoder token.
  if (layer.role == LayerRole::kEncoder) return per_key * d(seq_len);
  if (layer.role == LayerRole::kDecoder)
    return per_key * (mean_attended_keys(decoder_seq_len(seq_len), 0) + d(seq_len));
  double f = per_key * mean_attended_keys(seq_len, window);
  if (a.indexer.heads > 0)
    f += 2.0 * d(a.indexer.heads) * d(a.indexer.head_dim) * mean_attended_keys(seq_len, 0);
  return f;
}

double chunked_scan_flops(int64_t dk, int64_t dv, int64_t chunk) {
  const auto k = static_cast<double>(dk), v = static_cast<double>(dv);
  return 2.0 * (k + v) * mean_attended_keys(chunk, 0) + 4.0 * k * v;
}

namespace {

// The layer's FLOPs per token it runs on, times `tokens` (its tokens per counted token: an encoder-decoder's
// decoder layers run on targets / inputs of them).
void add_layer_flops(const ModelSpec& m, const LayerSpec& layer, int64_t seq_len, FlopBreakdown& f,
                     double tokens = 1.0) {
  f.attention_proj += tokens * 2.0 * attention_matmul_params(m, layer);
  f.attention_core += tokens * mixer_core_flops(m, layer, seq_len);
  const auto h = static_cast<double>(m.hidden);
  const double mats = ffn_matrices(m.activation);
  if (!layer.ffn) return;
  if (layer.moe) {
    const auto& e = m.moe;
    f.routed_experts +=
        tokens * 2.0 * static_cast<double>(e.top_k) * mats * h * static_cast<double>(e.expert_ffn);
    f.shared_experts +=
        tokens * 2.0 *
        (static_cast<double>(e.num_shared_experts) * mats * h * static_cast<double>(e.shared_expert_ffn) +
         (e.shared_expert_gate ? h : 0.0));
    f.router += tokens * 2.0 * h * static_cast<double>(e.num_experts);
  } else {
    f.dense_ffn += tokens * 2.0 * mats * h * static_cast<double>(m.dense_ffn);
  }
}

}  // namespace

FlopsPerToken flops_per_token(const ModelSpec& m, int64_t seq_len) {
  FlopsPerToken r;
  // An encoder-decoder's tokens are its encoder's input tokens: a decoder layer (and the head) runs on
  // decoder_seq_len / seq_len target tokens per input token.
  const double targets = m.encoder_decoder()
                             ? static_cast<double>(decoder_seq_len(seq_len)) / static_cast<double>(seq_len)
                             : 1.0;
  for (const auto& layer : m.layers) {
    const bool decoder = layer.role == LayerRole::kDecoder;
    add_layer_flops(m, layer, seq_len, r.forward, decoder ? targets : 1.0);
    // Cross-attention's k and v projections run on every input token.
    if (decoder) r.forward.attention_proj += 2.0 * cross_kv_params(m) * (1.0 - targets);
  }
  r.forward.lm_head = 2.0 * static_cast<double>(m.hidden) * static_cast<double>(m.vocab) * targets;
  r.train_step = kTrainFlopsPerForwardFlop * r.forward.total();
  if (m.mtp_layers > 0) {
    FlopBreakdown f;
    const LayerSpec mtp_layer{.moe = m.is_moe(), .window = 0, .kv_projection = true};
    add_layer_flops(m, mtp_layer, seq_len, f);
    const auto h = static_cast<double>(m.hidden);
    // + the [2h -> h] projection and a second pass through the shared output head
    r.mtp_forward = static_cast<double>(m.mtp_layers) *
                    (f.total() + 2.0 * 2.0 * h * h + 2.0 * h * static_cast<double>(m.vocab));
  }
  return r;
}

TrainingBytesPerParam bytes_per_param(DType compute) {
  switch (compute) {
    case DType::kFp32:
      return {.weights = 4, .gradients = 4, .optimizer = 8};
    case DType::kFp8:
      return {.weights = 2 + 1, .gradients = 4, .optimizer = 12};
    case DType::kBf16:
    case DType::kFp16:
      return {.weights = 2, .gradients = 4, .optimizer = 12};
  }
  return {};
}

LayerKindCounts::LayerKindCounts(const ModelSpec& m) {
  for (size_t l = 0; l < m.layers.size(); ++l) {
    const LayerSpec& spec = m.layers[l];
    auto it =
        std::find_if(kinds_.begin(), kinds_.end(), [&](const LayerSpec& k) { return k.same_kind(spec); });
    if (it == kinds_.end()) {
      kinds_.push_back(spec);
      first_.push_back(static_cast<int64_t>(l));
      before_.emplace_back(m.layers.size() + 1, 0);
      it = kinds_.end() - 1;
    }
    const auto k = static_cast<size_t>(it - kinds_.begin());
    for (size_t j = 0; j < kinds_.size(); ++j) before_[j][l + 1] = before_[j][l] + (j == k ? 1 : 0);
  }
}

size_t LayerKindCounts::kind_of(int64_t layer) const {
  for (size_t k = 0; k < kinds_.size(); ++k)
    if (in(k, layer, layer + 1) == 1) return k;
  return kinds_.size();
}

}  // namespace moeplan
