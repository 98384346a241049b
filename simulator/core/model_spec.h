// ModelSpec: the architecture of one MoE (or dense) transformer, decoder-only or encoder-decoder (Switch
// Transformer), in the terms the cost model and the executor need. Built by simulator/io from a Hugging Face
// config.json or from moeplan's plain model form.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moeplan {

enum class AttentionKind {
  kGqa,  // multi-head / grouped-query attention: q [h -> heads*head_dim], k,v [h -> kv_heads*head_dim]
  kMla,  // DeepSeek multi-head latent attention: low-rank q and joint low-rank kv with a decoupled rope key
};

enum class NormKind {
  kRmsNorm,          // weight only
  kLayerNorm,        // weight and bias (Phi-3.5-MoE)
  kLayerNormNoBias,  // weight only (DBRX)
};

enum class QkNorm {
  kNone,
  kPerHead,     // a norm over head_dim shared by all heads (Qwen3, Hunyuan): 2*head_dim weights
  kFull,        // a norm over all heads' dims (OLMoE): heads*head_dim + kv_heads*head_dim weights
  kUnweighted,  // L2 normalisation without weights (Llama 4)
};

enum class FfnActivation {
  kSwiGlu,  // three matrices: fc1 (gate) and fc3 (up) [h -> f], fc2 (down) [f -> h]
  kGelu,    // two matrices: fc1 [h -> f], fc2 [f -> h]
  kRelu2,   // two matrices with a squared ReLU between them (Nemotron-H)
  kRelu,    // two matrices with a ReLU between them (T5 v1.0, Switch Transformer: wi, wo)
};

// How positions enter attention.
enum class PositionKind : uint8_t {
  kRope,  // rotary embedding of q and k (every decoder-only family here)
  // T5 relative position buckets: the first layer of each stack holds a learned [buckets, heads] table,
  // expanded once per forward into a [heads, s_q, s_k] bias that every self-attention of that stack adds
  // to its scores (HF has_relative_attention_bias; Megatron-Core's RelativePositionEmbedding).
  kRelativeBias,
};

// Where a layer sits. A decoder-only model has only kDecoderOnly layers; an encoder-decoder lists its encoder
// layers first, then its decoder layers.
enum class LayerRole : uint8_t {
  kDecoderOnly,  // causal self-attention over the sequence
  kEncoder,      // bidirectional self-attention over the encoder's input tokens
  kDecoder,      // causal self-attention over the target tokens, then cross-attention to the encoder output
};

// What mixes tokens in a layer. Softmax attention is priced by the attention kernels; the two recurrent kinds
// have their projections priced as GEMMs and their scan as a memory-bound kernel (model_notes.h says so).
enum class MixerKind : uint8_t {
  kAttention,        // softmax attention (GQA or MLA, as AttentionSpec says)
  kLinearAttention,  // Gated DeltaNet (Qwen3-Next linear_attention layers), LinearAttentionSpec
  kMamba2,           // Mamba-2 SSD (Nemotron-H 'M' layers), MambaSpec
  kNone,             // no mixer: an FFN-only block (Nemotron-H 'E' and '-' layers)
};

struct MlaDims {
  int64_t q_lora_rank = 0;  // 0: q projected directly from h
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
};

// DeepSeek-V3.2 sparse attention (DSA): a lightning indexer scores every earlier token with `heads` small
// heads of `head_dim` (q from the q latent, one shared k from h, a per-head weight from h), and the MLA core
// attends only the `top_k` best-scored keys of each query. heads == 0: dense attention.
struct DsaIndexerSpec {
  int64_t heads = 0;
  int64_t head_dim = 0;
  int64_t top_k = 0;
};

struct AttentionSpec {
  AttentionKind kind = AttentionKind::kGqa;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;  // MLA: equal to num_heads (each head has its own decompressed k/v)
  int64_t head_dim = 0;      // GQA: q/k/v head dim. MLA: qk_nope + qk_rope (the score dim)
  MlaDims mla;
  bool qkv_bias = false;
  bool out_bias = false;
  QkNorm qk_norm = QkNorm::kNone;
  bool sinks = false;  // one learned logit per head (GPT-OSS)
  int64_t kv_share_layers =
      1;                     // cross-layer attention (Hunyuan CLA): one k/v projection per this many layers
  bool output_gate = false;  // q_proj also emits a sigmoid gate per head dim on the output (Qwen3-Next)
  DsaIndexerSpec indexer;

  int64_t qk_dim() const {
    return kind == AttentionKind::kMla ? mla.qk_nope_head_dim + mla.qk_rope_head_dim : head_dim;
  }
  int64_t v_dim() const { return kind == AttentionKind::kMla ? mla.v_head_dim : head_dim; }
};

// Gated DeltaNet (Qwen3-Next linear_attention layers): in_proj_qkvz [h -> 2*key_dim + 2*value_dim],
// in_proj_ba [h -> 2*value_heads], a depthwise causal conv1d over q, k, v (conv_kernel taps, no bias),
// dt_bias and A_log per value head, a gated RMSNorm over value_head_dim, out_proj [value_dim -> h].
struct LinearAttentionSpec {
  int64_t key_heads = 0;
  int64_t value_heads = 0;
  int64_t key_head_dim = 0;
  int64_t value_head_dim = 0;
  int64_t conv_kernel = 0;
  int64_t chunk = 64;  // tokens per chunk of the chunked delta rule (FLA's kernels use 64; not in the config)
  int64_t key_dim() const { return key_heads * key_head_dim; }
  int64_t value_dim() const { return value_heads * value_head_dim; }
  int64_t in_proj_width() const { return 2 * key_dim() + 2 * value_dim() + 2 * value_heads; }
  int64_t conv_channels() const { return 2 * key_dim() + value_dim(); }
};

// Mamba-2 (Nemotron-H 'M' layers): in_proj [h -> 2*inner + 2*groups*state + heads] (z, x, B, C, dt), a
// depthwise causal conv1d over x, B, C, dt_bias, A_log and D per head, a gated RMSNorm over inner,
// out_proj [inner -> h]; inner = heads * head_dim.
struct MambaSpec {
  int64_t heads = 0;
  int64_t head_dim = 0;
  int64_t state_size = 0;
  int64_t groups = 1;
  int64_t conv_kernel = 0;
  int64_t chunk = 128;  // tokens per chunk of the SSD scan (HF chunk_size)
  bool conv_bias = true;
  bool proj_bias = false;
  int64_t inner() const { return heads * head_dim; }
  int64_t conv_channels() const { return inner() + 2 * groups * state_size; }
  int64_t in_proj_width() const { return 2 * inner() + 2 * groups * state_size + heads; }
};

// How the router turns logits into expert weights (the kernels differ: softmax over E, or a sigmoid per
// expert with a normalisation over the top k).
enum class RouterScore { kSoftmax, kSigmoid };

struct MoeSpec {
  int64_t num_experts = 0;  // routed experts; 0 for a dense model
  int64_t top_k = 0;
  int64_t expert_ffn = 0;           // intermediate size of one routed expert
  int64_t num_shared_experts = 0;   // always-active experts
  int64_t shared_expert_ffn = 0;    // intermediate size of one shared expert
  bool shared_expert_gate = false;  // a sigmoid gate [h -> 1] on the shared expert's output (Qwen2-MoE)
  bool expert_bias = false;         // biases in the expert projections (GPT-OSS)
  bool router_bias = false;         // a bias in the router projection (GPT-OSS)
  // The experts' GLU clamps its inputs to this magnitude before the activation (GPT-OSS swiglu_limit 7.0:
  // gate at most +limit, linear half within +-limit); 0 for none.
  double glu_limit = 0;
  bool router_score_bias = false;  // a per-expert score-correction bias (DeepSeek-V3 aux-loss-free balancing)
  RouterScore score = RouterScore::kSoftmax;
  double routed_scaling = 1.0;  // factor on the routed experts' combine weights (HF routed_scaling_factor)
  // Group-limited routing (HF n_group / topk_group): experts form `groups` contiguous groups and a token's
  // top-k is taken within its best `group_top_k` groups. DeepSeek-V3: 8 groups of 32, top 4 groups, so a
  // token reaches at most 4 nodes when each node holds one group. 1 / 0: unlimited.
  int64_t groups = 1;
  int64_t group_top_k = 0;
  bool group_limited() const { return groups > 1 && group_top_k > 0 && group_top_k < groups; }
};

struct LayerSpec {
  bool moe = false;           // routed experts (plus shared experts) instead of the dense FFN
  int64_t window = 0;         // sliding attention window in tokens; 0 = full causal attention
  bool kv_projection = true;  // false where the layer reuses an earlier layer's k/v (CLA)
  MixerKind mixer = MixerKind::kAttention;
  bool ffn = true;  // false: a mixer-only block (Nemotron-H 'M' and '*' layers)
  LayerRole role = LayerRole::kDecoderOnly;
  bool position_bias = false;  // PositionKind::kRelativeBias: this layer holds its stack's bias table

  // The fields that make two layers cost the same (one recipe, one memory evaluation per kind).
  bool same_kind(const LayerSpec& o) const {
    return moe == o.moe && window == o.window && kv_projection == o.kv_projection && mixer == o.mixer &&
           ffn == o.ffn && role == o.role && position_bias == o.position_bias;
  }
};

struct ModelSpec {
  std::string name;    // e.g. "mixtral-8x22b"
  std::string family;  // the config convention it came from: "mixtral", "deepseek_v3", "moeplan", ...
  std::string source;  // a moeplan model file's "source": where its numbers come from; empty for HF configs
  int64_t hidden = 0;
  int64_t vocab = 0;
  bool tied_embeddings = false;
  bool lm_head_bias = false;
  NormKind norm = NormKind::kRmsNorm;
  FfnActivation activation = FfnActivation::kSwiGlu;
  AttentionSpec attention;
  MoeSpec moe;
  int64_t dense_ffn = 0;  // intermediate size of the dense FFN in non-MoE layers
  std::vector<LayerSpec> layers;
  int64_t mtp_layers = 0;  // DeepSeek-V3 multi-token-prediction modules (each one more decoder layer)
  LinearAttentionSpec linear_attention;  // for MixerKind::kLinearAttention layers
  MambaSpec mamba;                       // for MixerKind::kMamba2 layers
  PositionKind position = PositionKind::kRope;
  int64_t relative_buckets = 0;  // PositionKind::kRelativeBias: buckets of the table (T5: 32)
  // The checkpoint's quantization as the config's quantization_config states it, in one line ("" when the
  // config has none). Plans train in the plan's precision from these shapes; inspect and plan report it.
  std::string checkpoint_quantization;
  // Parts of the checkpoint that are not counted (a vision tower), in one line; "" when none.
  std::string not_counted;
  // Constants that do not change the cost but a launch must state: the rotary base (rope_theta) and the norm
  // epsilon as the config gives them (0: the config does not state it), and its rope_scaling in one line
  // ("" when none; a long-context extension, not applied at pretraining length).
  double rope_theta = 0;
  double norm_eps = 0;
  std::string rope_scaling;
  // The share of each head's dims that RoPE rotates (the config's partial_rotary_factor; 1 when absent), and
  // norms whose weight is centred on zero (x_hat * (1 + w): Qwen3-Next's Qwen3NextRMSNorm in transformers'
  // modeling_qwen3_next.py).
  double rotary_fraction = 1.0;
  bool norm_zero_centered = false;

  int64_t num_layers() const { return static_cast<int64_t>(layers.size()); }
  int64_t num_moe_layers() const {
    int64_t n = 0;
    for (const auto& l : layers) n += l.moe ? 1 : 0;
    return n;
  }
  bool is_moe() const { return moe.num_experts > 0; }
  bool encoder_decoder() const {
    for (const auto& l : layers) {
      if (l.role != LayerRole::kDecoderOnly) return true;
    }
    return false;
  }
  bool has_mixer(MixerKind k) const {
    for (const auto& l : layers) {
      if (l.mixer == k) return true;
    }
    return false;
  }
};

}  // namespace moeplan
