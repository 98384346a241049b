// Reading model architectures. Each Hugging Face family maps its own key names onto ModelSpec; keys we do not
// use are ignored (HF configs carry many), but every key we read is type- and range-checked.
#include "simulator/io/model_loader.h"

#include <algorithm>
#include <set>

#include <fmt/format.h>

#include "simulator/io/builtin_catalog.h"

namespace moeplan::io {
namespace {

constexpr int64_t kMaxHidden = 1 << 20;
constexpr int64_t kMaxLayers = 10000;
constexpr int64_t kMaxVocab = 100'000'000;
constexpr int64_t kMaxHeads = 1 << 16;
constexpr int64_t kMaxExperts = 1 << 16;
constexpr int64_t kMaxFfn = 1 << 22;
constexpr int64_t kMaxRank = 1 << 20;

constexpr const char* kFamilies[] = {"mixtral",  "phimoe",      "olmoe",       "qwen2_moe",  "qwen3_moe",
                                     "deepseek", "deepseek_v2", "deepseek_v3", "kimi_k2",    "gpt_oss",
                                     "hunyuan",  "dbrx",        "llama4",      "llama4_text"};

// The first present key among `keys` (aliases across families), or "" when none is.
std::string first_key(const JsonNode& c, std::initializer_list<const char*> keys) {
  for (const char* k : keys) {
    if (c.has(k)) return k;
  }
  return "";
}

int64_t required_int(const JsonNode& c, std::initializer_list<const char*> keys, int64_t lo, int64_t hi) {
  const std::string k = first_key(c, keys);
  if (k.empty()) c.fail(*keys.begin(), fmt::format("an integer in [{}, {}]", lo, hi));
  return c.integer(k, lo, hi);
}

// Layers i in [0, n) that are MoE layers, by the family's convention.
std::vector<LayerSpec> layer_layout(const JsonNode& c, const std::string& family, int64_t n, bool moe_model) {
  std::vector<LayerSpec> layers(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) layers[static_cast<size_t>(i)].moe = moe_model;
  if (!moe_model) return layers;
  if (family == "deepseek" || family == "deepseek_v2" || family == "deepseek_v3" || family == "kimi_k2") {
    const int64_t first_dense = c.integer_or("first_k_dense_replace", 0, 0, n);
    const int64_t freq = c.integer_or("moe_layer_freq", 1, 1, n);
    for (int64_t i = 0; i < n; ++i) layers[static_cast<size_t>(i)].moe = i >= first_dense && i % freq == 0;
  } else if (family == "qwen2_moe" || family == "qwen3_moe") {
    const int64_t step = c.integer_or("decoder_sparse_step", 1, 1, n);
    std::set<int64_t> mlp_only;
    if (c.has("mlp_only_layers")) {
      for (const auto& e : c.array("mlp_only_layers")) mlp_only.insert(e.as_integer(0, n - 1));
    }
    for (int64_t i = 0; i < n; ++i) {
      layers[static_cast<size_t>(i)].moe = !mlp_only.contains(i) && (i + 1) % step == 0;
    }
  } else if (family == "llama4_text") {
    const int64_t step = c.integer_or("interleave_moe_layer_step", 1, 1, n);
    for (int64_t i = 0; i < n; ++i) layers[static_cast<size_t>(i)].moe = (i + 1) % step == 0;
  }
  return layers;
}

void read_windows(const JsonNode& c, std::vector<LayerSpec>& layers) {
  const int64_t n = static_cast<int64_t>(layers.size());
  if (c.has("layer_types")) {
    const auto types = c.array("layer_types");
    if (static_cast<int64_t>(types.size()) != n) {
      c.fail("layer_types", fmt::format("an array of {} entries (one per layer)", n));
    }
    const int64_t window = c.integer("sliding_window", 1, int64_t{1} << 40);
    for (size_t i = 0; i < types.size(); ++i) {
      if (!types[i].raw().is_string()) types[i].fail_here("\"sliding_attention\" or \"full_attention\"");
      const auto t = types[i].raw().get<std::string>();
      if (t == "sliding_attention") {
        layers[i].window = window;
      } else if (t != "full_attention") {
        types[i].fail_here("\"sliding_attention\" or \"full_attention\"");
      }
    }
    return;
  }
  if (!c.boolean_or("use_sliding_window", true)) return;
  const int64_t window = c.integer_or("sliding_window", 0, 0, int64_t{1} << 40);
  for (auto& l : layers) l.window = window;
}

ModelSpec from_hf(const JsonNode& root, const std::string& name) {
  std::string family = root.string("model_type");
  JsonNode c = root;
  if (family == "llama4") {
    c = root.object("text_config");
    family = c.string_or("model_type", "llama4_text");
    if (family != "llama4_text") c.fail("model_type", "\"llama4_text\"");
  }
  if (std::find_if(std::begin(kFamilies), std::end(kFamilies), [&](const char* f) { return family == f; }) ==
      std::end(kFamilies)) {
    std::string list;
    for (const char* f : kFamilies) list += std::string(list.empty() ? "" : ", ") + f;
    root.fail("model_type", fmt::format("a supported MoE family ({}), or use the plain moeplan form", list));
  }
  const bool is_dbrx = family == "dbrx";
  const bool is_deepseek = family.starts_with("deepseek") || family == "kimi_k2";
  const bool is_mla = family == "deepseek_v2" || family == "deepseek_v3" || family == "kimi_k2";

  ModelSpec m;
  m.name = name;
  m.family = family;
  m.hidden = required_int(c, {"hidden_size", "d_model"}, 1, kMaxHidden);
  const int64_t n_layers = required_int(c, {"num_hidden_layers", "n_layers"}, 1, kMaxLayers);
  m.vocab = c.integer("vocab_size", 1, kMaxVocab);
  m.tied_embeddings = c.boolean_or("tie_word_embeddings", false);
  m.lm_head_bias = c.boolean_or("lm_head_bias", false);

  // Attention.
  auto& a = m.attention;
  a.num_heads = required_int(c, {"num_attention_heads", "n_heads"}, 1, kMaxHeads);
  if (is_dbrx) {
    a.num_kv_heads = c.object("attn_config").integer_or("kv_n_heads", a.num_heads, 1, a.num_heads);
  } else {
    a.num_kv_heads = c.integer_or("num_key_value_heads", a.num_heads, 1, a.num_heads);
  }
  if (a.num_heads % a.num_kv_heads != 0) {
    c.fail(is_dbrx ? "attn_config.kv_n_heads" : "num_key_value_heads",
           fmt::format("a divisor of the {} attention heads", a.num_heads));
  }
  if (c.has("head_dim")) {
    a.head_dim = c.integer("head_dim", 1, kMaxHidden);
  } else {
    if (m.hidden % a.num_heads != 0) {
      c.fail(first_key(c, {"num_attention_heads", "n_heads"}),
             fmt::format("a divisor of the hidden size {} (or give head_dim)", m.hidden));
    }
    a.head_dim = m.hidden / a.num_heads;
  }
  if (is_mla) {
    a.kind = AttentionKind::kMla;
    a.num_kv_heads = a.num_heads;
    a.mla.q_lora_rank = c.integer_or("q_lora_rank", 0, 0, kMaxRank);
    a.mla.kv_lora_rank = c.integer("kv_lora_rank", 1, kMaxRank);
    a.mla.qk_nope_head_dim = c.integer("qk_nope_head_dim", 1, kMaxRank);
    a.mla.qk_rope_head_dim = c.integer("qk_rope_head_dim", 1, kMaxRank);
    a.mla.v_head_dim = c.integer("v_head_dim", 1, kMaxRank);
    a.head_dim = a.mla.qk_nope_head_dim + a.mla.qk_rope_head_dim;
  }
  const bool attention_bias = c.boolean_or("attention_bias", false);
  if (family == "qwen2_moe") {
    a.qkv_bias = true;  // Qwen2 always has q/k/v biases and no o bias
  } else if (!is_mla) {
    a.qkv_bias = attention_bias;
    a.out_bias = attention_bias;
  }
  if (family == "qwen3_moe") a.qk_norm = QkNorm::kPerHead;
  if (family == "olmoe") a.qk_norm = QkNorm::kFull;
  if (family == "hunyuan" && c.boolean_or("use_qk_norm", false)) a.qk_norm = QkNorm::kPerHead;
  if (family == "llama4_text" && c.boolean_or("use_qk_norm", false)) a.qk_norm = QkNorm::kUnweighted;
  a.sinks = family == "gpt_oss";
  if (family == "hunyuan" && c.boolean_or("use_cla", false))
    a.kv_share_layers = c.integer("cla_share_factor", 1, 64);
  if (family == "phimoe") m.norm = NormKind::kLayerNorm;
  if (is_dbrx) m.norm = NormKind::kLayerNormNoBias;

  // Experts.
  auto& e = m.moe;
  if (is_dbrx) {
    const JsonNode f = c.object("ffn_config");
    e.num_experts = f.integer("moe_num_experts", 1, kMaxExperts);
    e.top_k = f.integer("moe_top_k", 1, kMaxExperts);
    e.expert_ffn = f.integer("ffn_hidden_size", 1, kMaxFfn);
  } else {
    e.num_experts = required_int(c, {"num_local_experts", "num_experts", "n_routed_experts"}, 1, kMaxExperts);
    e.top_k = required_int(c, {"num_experts_per_tok", "experts_per_token", "moe_topk"}, 1, kMaxExperts);
    e.expert_ffn = required_int(c, {"moe_intermediate_size", "intermediate_size"}, 1, kMaxFfn);
  }
  if (e.top_k > e.num_experts) {
    c.fail(is_dbrx ? "ffn_config.moe_top_k"
                   : first_key(c, {"num_experts_per_tok", "experts_per_token", "moe_topk"}),
           fmt::format("at most the number of experts ({})", e.num_experts));
  }
  if (is_deepseek) {
    e.num_shared_experts = c.integer_or("n_shared_experts", 0, 0, kMaxExperts);
    e.shared_expert_ffn = e.expert_ffn;
    e.router_score_bias = c.string_or("topk_method", "") == "noaux_tc";
    if (c.string_or("scoring_func", "softmax") == "sigmoid") e.score = RouterScore::kSigmoid;
    const std::string method = c.string_or("topk_method", "greedy");
    if (method == "noaux_tc" || method == "group_limited_greedy") {
      e.groups = c.integer_or("n_group", 1, 1, e.num_experts);
      if (e.num_experts % e.groups != 0)
        c.fail("n_group", fmt::format("a divisor of the {} routed experts", e.num_experts));
      e.group_top_k = c.integer_or("topk_group", e.groups, 1, e.groups);
    }
    m.dense_ffn = c.integer("intermediate_size", 1, kMaxFfn);
    m.mtp_layers = c.integer_or("num_nextn_predict_layers", 0, 0, 64);
  } else if (family == "qwen2_moe" || family == "qwen3_moe") {
    e.shared_expert_ffn = c.integer_or("shared_expert_intermediate_size", 0, 0, kMaxFfn);
    e.num_shared_experts = e.shared_expert_ffn > 0 ? 1 : 0;
    e.shared_expert_gate = e.num_shared_experts > 0;
    m.dense_ffn = c.integer_or("intermediate_size", 0, 0, kMaxFfn);
  } else if (family == "hunyuan") {
    if (c.boolean_or("use_mixed_mlp_moe", false)) {
      e.num_shared_experts = c.integer_or("num_shared_expert", 1, 0, kMaxExperts);
      e.shared_expert_ffn = e.expert_ffn;
    }
  } else if (family == "llama4_text") {
    e.score = RouterScore::kSigmoid;
    e.num_shared_experts = 1;
    e.shared_expert_ffn = e.expert_ffn;
    m.dense_ffn = c.integer_or("intermediate_size_mlp", 0, 0, kMaxFfn);
  } else if (family == "gpt_oss") {
    e.expert_bias = true;
    e.router_bias = true;
  }

  m.layers = layer_layout(c, family, n_layers, true);
  read_windows(c, m.layers);
  if (a.kv_share_layers > 1) {
    for (int64_t i = 0; i < n_layers; ++i)
      m.layers[static_cast<size_t>(i)].kv_projection = i % a.kv_share_layers == 0;
  }
  if (m.num_moe_layers() < n_layers && m.dense_ffn <= 0) {
    c.fail("intermediate_size", "a positive dense FFN size (the config has dense layers)");
  }
  return m;
}

ModelSpec from_plain(const JsonNode& c, const std::string& fallback_name) {
  c.only_keys({"format", "name", "source", "hidden_size", "num_layers", "vocab_size", "tie_embeddings",
               "norm", "attention", "ffn", "moe"});
  ModelSpec m;
  m.name = c.string_or("name", fallback_name);
  m.family = "moeplan";
  m.hidden = c.integer("hidden_size", 1, kMaxHidden);
  const int64_t n_layers = c.integer("num_layers", 1, kMaxLayers);
  m.vocab = c.integer("vocab_size", 1, kMaxVocab);
  m.tied_embeddings = c.boolean_or("tie_embeddings", false);
  m.norm = c.choice_or<NormKind>("norm", NormKind::kRmsNorm,
                                 {{"rmsnorm", NormKind::kRmsNorm}, {"layernorm", NormKind::kLayerNorm}});

  const JsonNode at = c.object("attention");
  at.only_keys({"heads", "kv_heads", "head_dim"});
  auto& a = m.attention;
  a.num_heads = at.integer("heads", 1, kMaxHeads);
  a.num_kv_heads = at.integer_or("kv_heads", a.num_heads, 1, a.num_heads);
  if (a.num_heads % a.num_kv_heads != 0)
    at.fail("kv_heads", fmt::format("a divisor of heads ({})", a.num_heads));
  if (at.has("head_dim")) {
    a.head_dim = at.integer("head_dim", 1, kMaxHidden);
  } else {
    if (m.hidden % a.num_heads != 0) at.fail("heads", fmt::format("a divisor of hidden_size ({})", m.hidden));
    a.head_dim = m.hidden / a.num_heads;
  }

  const JsonNode ffn = c.object("ffn");
  ffn.only_keys({"activation", "dense_ffn_size", "first_dense_layers"});
  m.activation =
      ffn.choice_or<FfnActivation>("activation", FfnActivation::kSwiGlu,
                                   {{"swiglu", FfnActivation::kSwiGlu}, {"gelu", FfnActivation::kGelu}});
  m.dense_ffn = ffn.integer_or("dense_ffn_size", 0, 0, kMaxFfn);
  const int64_t first_dense = ffn.integer_or("first_dense_layers", 0, 0, n_layers);

  bool moe_model = false;
  if (auto moe = c.optional_object("moe")) {
    moe->only_keys(
        {"num_experts", "top_k", "expert_ffn_size", "num_shared_experts", "shared_expert_ffn_size"});
    auto& e = m.moe;
    e.num_experts = moe->integer("num_experts", 1, kMaxExperts);
    e.top_k = moe->integer("top_k", 1, e.num_experts);
    e.expert_ffn = moe->integer("expert_ffn_size", 1, kMaxFfn);
    e.num_shared_experts = moe->integer_or("num_shared_experts", 0, 0, kMaxExperts);
    e.shared_expert_ffn =
        moe->integer_or("shared_expert_ffn_size", e.num_shared_experts > 0 ? e.expert_ffn : 0, 0, kMaxFfn);
    moe_model = true;
  }
  m.layers.resize(static_cast<size_t>(n_layers));
  for (int64_t i = 0; i < n_layers; ++i) m.layers[static_cast<size_t>(i)].moe = moe_model && i >= first_dense;
  if (m.num_moe_layers() < n_layers && m.dense_ffn <= 0) {
    ffn.fail("dense_ffn_size", "a positive size (the model has dense layers)");
  }
  return m;
}

}  // namespace

Result<ModelSpec> model_from_json(const json& j, const std::string& label, const std::string& name) {
  return catch_input_errors([&]() -> ModelSpec {
    const JsonNode root(j, label);
    if (root.has("format")) {
      const std::string f = root.string("format");
      if (f != "moeplan-model-v1") root.fail("format", "\"moeplan-model-v1\"");
      return from_plain(root, name);
    }
    if (!root.has("model_type")) {
      throw InputError(
          fmt::format("{}: field 'model_type': required but missing (expected a Hugging Face config.json, or "
                      "the plain form "
                      "with \"format\": \"moeplan-model-v1\")",
                      label));
    }
    return from_hf(root, name);
  });
}

Result<ModelSpec> load_model(const std::string& ref, const std::string& base_dir) {
  std::string label, stem;
  Result<json> j = read_input(ref, "models", base_dir, &label, &stem);
  if (!j) return j.error();
  return model_from_json(j.value(), label, stem);
}

}  // namespace moeplan::io
