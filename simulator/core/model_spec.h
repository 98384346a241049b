// ModelSpec: the architecture of one MoE (or dense) decoder-only transformer, in the terms the cost model and
// the executor need. Built by simulator/io from a Hugging Face config.json or from moeplan's plain model
// form.
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
};

struct MlaDims {
  int64_t q_lora_rank = 0;  // 0: q projected directly from h
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
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
      1;  // cross-layer attention (Hunyuan CLA): one k/v projection per this many layers

  int64_t qk_dim() const {
    return kind == AttentionKind::kMla ? mla.qk_nope_head_dim + mla.qk_rope_head_dim : head_dim;
  }
  int64_t v_dim() const { return kind == AttentionKind::kMla ? mla.v_head_dim : head_dim; }
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
  bool router_score_bias = false;  // a per-expert score-correction bias (DeepSeek-V3 aux-loss-free balancing)
  RouterScore score = RouterScore::kSoftmax;
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
};

struct ModelSpec {
  std::string name;    // e.g. "mixtral-8x22b"
  std::string family;  // the config convention it came from: "mixtral", "deepseek_v3", "moeplan", ...
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

  int64_t num_layers() const { return static_cast<int64_t>(layers.size()); }
  int64_t num_moe_layers() const {
    int64_t n = 0;
    for (const auto& l : layers) n += l.moe ? 1 : 0;
    return n;
  }
  bool is_moe() const { return moe.num_experts > 0; }
};

}  // namespace moeplan
