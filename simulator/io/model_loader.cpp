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

// Families read from the top level; llama4 and kimi_k25 are read from their text_config.
constexpr const char* kFamilies[] = {"mixtral",
                                     "phimoe",
                                     "olmoe",
                                     "qwen2_moe",
                                     "qwen3_moe",
                                     "qwen3_next",
                                     "deepseek",
                                     "deepseek_v2",
                                     "deepseek_v3",
                                     "deepseek_v32",
                                     "kimi_k2",
                                     "kimi_k25",
                                     "gpt_oss",
                                     "hunyuan",
                                     "hunyuan_v1_moe",
                                     "dbrx",
                                     "llama4",
                                     "llama4_text",
                                     "glm4_moe",
                                     "minimax_m2",
                                     "ernie4_5_moe",
                                     "granitemoe",
                                     "granitemoeshared",
                                     "nemotron_h",
                                     "switch_transformers"};

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

// A key that is an integer, or (Hunyuan-A13B) an array with one integer per layer. Per-layer values must all
// be equal: ModelSpec has one expert shape for every MoE layer.
int64_t uniform_int(const JsonNode& c, const char* key, int64_t n_layers, int64_t lo, int64_t hi) {
  if (!c.raw().contains(key) || !c.raw().at(key).is_array()) return c.integer(key, lo, hi);
  const auto values = c.array(key);
  if (static_cast<int64_t>(values.size()) != n_layers) {
    c.fail(key, fmt::format("an integer or an array of {} integers (one per layer)", n_layers));
  }
  const int64_t first = values.empty() ? 0 : values.front().as_integer(lo, hi);
  for (const auto& v : values) {
    if (v.as_integer(lo, hi) != first) {
      c.fail(key, "the same value on every layer (per-layer expert shapes are not modelled)");
    }
  }
  return first;
}

// Layers i in [0, n) that are MoE layers, by the family's convention.
std::vector<LayerSpec> layer_layout(const JsonNode& c, const std::string& family, int64_t n, bool moe_model) {
  std::vector<LayerSpec> layers(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) layers[static_cast<size_t>(i)].moe = moe_model;
  if (!moe_model) return layers;
  if (family == "deepseek" || family == "deepseek_v2" || family == "deepseek_v3" ||
      family == "deepseek_v32" || family == "kimi_k2" || family == "glm4_moe") {
    const int64_t first_dense = c.integer_or("first_k_dense_replace", 0, 0, n);
    const int64_t freq = c.integer_or("moe_layer_freq", 1, 1, n);
    for (int64_t i = 0; i < n; ++i) layers[static_cast<size_t>(i)].moe = i >= first_dense && i % freq == 0;
  } else if (family == "qwen2_moe" || family == "qwen3_moe" || family == "qwen3_next") {
    const int64_t step = c.integer_or("decoder_sparse_step", 1, 1, n);
    std::set<int64_t> mlp_only;
    if (c.has("mlp_only_layers")) {
      for (const auto& e : c.array("mlp_only_layers")) mlp_only.insert(e.as_integer(0, n - 1));
    }
    for (int64_t i = 0; i < n; ++i) {
      layers[static_cast<size_t>(i)].moe = !mlp_only.contains(i) && (i + 1) % step == 0;
    }
  } else if (family == "llama4_text") {
    if (c.has("moe_layers")) {
      // An explicit list (the Hub config has one) wins over the interleave step, as in Llama4TextConfig.
      for (auto& l : layers) l.moe = false;
      for (const auto& e : c.array("moe_layers"))
        layers[static_cast<size_t>(e.as_integer(0, n - 1))].moe = true;
    } else {
      const int64_t step = c.integer_or("interleave_moe_layer_step", 1, 1, n);
      for (int64_t i = 0; i < n; ++i) layers[static_cast<size_t>(i)].moe = (i + 1) % step == 0;
    }
  } else if (family == "ernie4_5_moe") {
    // Ernie4_5_MoeModel: MoE where (i + 1) % interval == 0 and start <= i <= end (end -1: the last layer).
    const int64_t start = c.integer_or("moe_layer_start_index", 0, 0, n);
    int64_t end = c.integer_or("moe_layer_end_index", -1, -1, n - 1);
    if (end < 0) end = n - 1;
    const int64_t interval = c.integer_or("moe_layer_interval", 1, 1, n);
    for (int64_t i = 0; i < n; ++i) {
      layers[static_cast<size_t>(i)].moe = (i + 1) % interval == 0 && i >= start && i <= end;
    }
  }
  return layers;
}

// Qwen3-Next: layer_types ("linear_attention" / "full_attention"), else a full-attention layer every
// full_attention_interval layers (the last of each group), as Qwen3NextConfig builds layer_types.
void qwen3_next_mixers(const JsonNode& c, std::vector<LayerSpec>& layers) {
  const int64_t n = static_cast<int64_t>(layers.size());
  const char* expected = "\"linear_attention\" or \"full_attention\"";
  if (c.has("layer_types")) {
    const auto types = c.array("layer_types");
    if (static_cast<int64_t>(types.size()) != n) {
      c.fail("layer_types", fmt::format("an array of {} entries (one per layer)", n));
    }
    for (size_t i = 0; i < types.size(); ++i) {
      if (!types[i].raw().is_string()) types[i].fail_here(expected);
      const auto t = types[i].raw().get<std::string>();
      if (t == "linear_attention") {
        layers[i].mixer = MixerKind::kLinearAttention;
      } else if (t != "full_attention") {
        types[i].fail_here(expected);
      }
    }
    return;
  }
  const int64_t interval = c.integer_or("full_attention_interval", 4, 1, n);
  for (int64_t i = 0; i < n; ++i) {
    if ((i + 1) % interval != 0) layers[static_cast<size_t>(i)].mixer = MixerKind::kLinearAttention;
  }
}

// Nemotron-H: hybrid_override_pattern has one character per layer: M Mamba-2, * attention, E MoE, - MLP.
void nemotron_h_blocks(const JsonNode& c, std::vector<LayerSpec>& layers) {
  const std::string pattern = c.string("hybrid_override_pattern");
  if (pattern.size() != layers.size()) {
    c.fail("hybrid_override_pattern",
           fmt::format("one of M, *, E, - per layer ({} characters, got {})", layers.size(), pattern.size()));
  }
  for (size_t i = 0; i < pattern.size(); ++i) {
    LayerSpec& l = layers[i];
    switch (pattern[i]) {
      case 'M':
        l = {.moe = false, .window = 0, .kv_projection = true, .mixer = MixerKind::kMamba2, .ffn = false};
        break;
      case '*':
        l = {.moe = false, .window = 0, .kv_projection = true, .mixer = MixerKind::kAttention, .ffn = false};
        break;
      case 'E':
        l = {.moe = true, .window = 0, .kv_projection = true, .mixer = MixerKind::kNone, .ffn = true};
        break;
      case '-':
        l = {.moe = false, .window = 0, .kv_projection = true, .mixer = MixerKind::kNone, .ffn = true};
        break;
      default:
        c.fail("hybrid_override_pattern",
               fmt::format("only the characters M, *, E, - (character {} is '{}')", i, pattern[i]));
    }
  }
}

// One line describing a quantization_config as the config states it: the method and the keys that say what is
// stored (format, bits, block or group size, what stays unquantized). Unknown methods are reported, not
// refused.
std::string quantization_summary(const JsonNode& q) {
  const json& v = q.raw();
  std::vector<std::string> parts;
  parts.push_back(v.contains("quant_method") && v.at("quant_method").is_string()
                      ? v.at("quant_method").get<std::string>()
                      : std::string("method not named"));
  auto text = [&](const json& x) { return x.is_string() ? x.get<std::string>() : x.dump(); };
  for (const char* k : {"fmt", "quant_algo", "format", "bits", "group_size", "activation_scheme"}) {
    if (v.contains(k) && !v.at(k).is_null()) parts.push_back(fmt::format("{} {}", k, text(v.at(k))));
  }
  if (v.contains("weight_block_size") && v.at("weight_block_size").is_array()) {
    std::string block;
    for (const auto& x : v.at("weight_block_size")) block += (block.empty() ? "" : "x") + text(x);
    parts.push_back("weight blocks " + block);
  }
  // compressed-tensors: each config group's weight scheme.
  if (v.contains("config_groups") && v.at("config_groups").is_object()) {
    for (const auto& [name, g] : v.at("config_groups").items()) {
      if (!g.is_object() || !g.contains("weights") || !g.at("weights").is_object()) continue;
      const json& w = g.at("weights");
      parts.push_back(fmt::format(
          "{}: weights {}{}-bit{}", name, w.contains("type") ? text(w.at("type")) : "",
          w.contains("num_bits") ? text(w.at("num_bits")) : "?",
          w.contains("group_size") && !w.at("group_size").is_null() ? ", group " + text(w.at("group_size"))
                                                                    : ""));
    }
  }
  for (const char* k : {"modules_to_not_convert", "ignore"}) {
    if (v.contains(k) && v.at(k).is_array() && !v.at(k).empty())
      parts.push_back(fmt::format("{} modules left unquantized", v.at(k).size()));
  }
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : ", ") + p;
  return out;
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

// The rotary base, the norm epsilon, the rope_scaling and the routed experts' scaling factor of a config
// (DBRX keeps rope_theta in attn_config; newer configs keep it in rope_parameters).
void read_launch_constants(const JsonNode& c, ModelSpec& m) {
  constexpr double kMaxTheta = 1e12;
  if (c.has("rope_theta")) {
    m.rope_theta = c.number("rope_theta", 1, kMaxTheta);
  } else {
    for (const char* holder : {"attn_config", "rope_parameters"}) {
      if (auto o = c.optional_object(holder); o && o->has("rope_theta")) {
        m.rope_theta = o->number("rope_theta", 1, kMaxTheta);
        break;
      }
    }
  }
  if (c.has("partial_rotary_factor")) m.rotary_fraction = c.number("partial_rotary_factor", 1e-3, 1);
  for (const char* key :
       {"rms_norm_eps", "layer_norm_epsilon", "norm_eps", "layer_norm_eps", "norm_epsilon"}) {
    if (c.has(key)) {
      m.norm_eps = c.number(key, 1e-12, 1);
      break;
    }
  }
  m.moe.routed_scaling = c.number_or("routed_scaling_factor", 1.0, 1e-6, 1e6);
  if (auto r = c.optional_object("rope_scaling")) {
    std::string type = r->has("rope_type") ? r->string("rope_type") : r->string_or("type", "");
    const double factor = r->number_or("factor", 0, 0, 1e9);
    m.rope_scaling = factor > 0 ? fmt::format("{} factor {:g}", type, factor) : type;
  }
}

// The experts-every-`step` rule of one stack of a Switch Transformer, as HF's SwitchTransformersStack applies
// it: the config's {encoder,decoder}_sparse_step when it states one, else num_layers // num_sparse_layers
// (0: no sparse layer); layer i is sparse when step == 1 or i % step == 1.
std::vector<bool> switch_sparse_layers(const JsonNode& c, const char* step_key, const char* count_key,
                                       int64_t layers) {
  int64_t step = 0;
  if (c.has(step_key)) {
    step = c.integer(step_key, 0, layers);
  } else {
    const int64_t sparse = c.integer_or(count_key, 0, 0, layers);
    step = sparse > 0 ? layers / sparse : 0;
  }
  std::vector<bool> moe(static_cast<size_t>(layers), false);
  for (int64_t i = 0; i < layers; ++i) moe[static_cast<size_t>(i)] = step == 1 || (step > 1 && i % step == 1);
  return moe;
}

// Switch Transformer (HF SwitchTransformersConfig): a T5 encoder-decoder whose sparse layers route each token
// to one expert. Encoder layers first (bidirectional), then decoder layers (causal self-attention and
// cross-attention); T5 attention (q, k, v, o without biases, heads x d_kv wide), relative position buckets in
// each stack's first layer, RMS norms without biases, a ReLU FFN (wi, wo) or a gated one, one embedding
// shared by both stacks and the head. expert_capacity is not read: plans route dropless (model_notes.h).
ModelSpec from_switch(const JsonNode& c, const std::string& name) {
  ModelSpec m;
  m.name = name;
  m.family = "switch_transformers";
  m.hidden = c.integer("d_model", 1, kMaxHidden);
  m.vocab = c.integer("vocab_size", 1, kMaxVocab);
  m.tied_embeddings = c.boolean_or("tie_word_embeddings", true);
  m.norm = NormKind::kRmsNorm;
  m.norm_eps = c.number_or("layer_norm_epsilon", 1e-6, 1e-12, 1);
  m.position = PositionKind::kRelativeBias;
  m.relative_buckets = c.integer_or("relative_attention_num_buckets", 32, 1, 1 << 16);
  auto& a = m.attention;
  a.num_heads = c.integer("num_heads", 1, kMaxHeads);
  a.num_kv_heads = a.num_heads;
  a.head_dim = c.integer("d_kv", 1, kMaxHidden);
  // A gated FFN (T5 v1.1's gated-gelu) has three matrices, priced as SwiGLU's.
  const std::string act = c.string_or("dense_act_fn", "relu");
  if (c.boolean_or("is_gated_act", false)) {
    m.activation = FfnActivation::kSwiGlu;
  } else if (act == "relu") {
    m.activation = FfnActivation::kRelu;
  } else if (act == "gelu" || act == "gelu_new") {
    m.activation = FfnActivation::kGelu;
  } else {
    c.fail("dense_act_fn", "\"relu\", \"gelu\" or \"gelu_new\"");
  }
  m.dense_ffn = c.integer("d_ff", 1, kMaxFfn);
  const int64_t enc = c.integer("num_layers", 1, kMaxLayers);
  const int64_t dec = c.integer_or("num_decoder_layers", enc, 1, kMaxLayers);
  const int64_t experts = c.integer_or("num_experts", 0, 0, kMaxExperts);
  const std::vector<bool> enc_moe =
      switch_sparse_layers(c, "encoder_sparse_step", "num_sparse_encoder_layers", enc);
  const std::vector<bool> dec_moe =
      switch_sparse_layers(c, "decoder_sparse_step", "num_sparse_decoder_layers", dec);
  for (int64_t i = 0; i < enc + dec; ++i) {
    const bool encoder = i < enc;
    const auto j = static_cast<size_t>(encoder ? i : i - enc);
    LayerSpec l;
    l.moe = experts > 0 && (encoder ? enc_moe[j] : dec_moe[j]);
    l.role = encoder ? LayerRole::kEncoder : LayerRole::kDecoder;
    l.position_bias = j == 0;
    m.layers.push_back(l);
  }
  if (m.num_moe_layers() > 0) {
    auto& e = m.moe;
    e.num_experts = experts;
    e.top_k = c.integer_or("num_selected_experts", 1, 1, experts);
    e.expert_ffn = m.dense_ffn;
    e.router_bias = c.boolean_or("router_bias", false);
  }
  return m;
}

ModelSpec from_hf(const JsonNode& root, const std::string& name) {
  std::string family = root.string("model_type");
  JsonNode c = root;
  std::string not_counted;
  if (family == "llama4") {
    c = root.object("text_config");
    family = c.string_or("model_type", "llama4_text");
    if (family != "llama4_text") c.fail("model_type", "\"llama4_text\"");
  } else if (family == "kimi_k25") {
    // Kimi K2.5: a vision tower around a DeepSeek-V3-layout text model (text_config).
    c = root.object("text_config");
    family = c.string_or("model_type", "kimi_k2");
    if (family != "kimi_k2" && family != "deepseek_v3")
      c.fail("model_type", "\"kimi_k2\" or \"deepseek_v3\"");
    if (root.has("vision_config")) not_counted = "the vision tower and projector (vision_config)";
  }
  if (family == "switch_transformers") return from_switch(root, name);
  if (std::find_if(std::begin(kFamilies), std::end(kFamilies), [&](const char* f) { return family == f; }) ==
      std::end(kFamilies)) {
    std::string list;
    for (const char* f : kFamilies) list += std::string(list.empty() ? "" : ", ") + f;
    root.fail("model_type", fmt::format("a supported MoE family ({}), or use the plain moeplan form", list));
  }
  const bool is_dbrx = family == "dbrx";
  const bool is_deepseek = family.starts_with("deepseek") || family == "kimi_k2";
  const bool is_mla =
      family == "deepseek_v2" || family == "deepseek_v3" || family == "deepseek_v32" || family == "kimi_k2";
  const bool is_hunyuan_v1 = family == "hunyuan_v1_moe";

  ModelSpec m;
  m.name = name;
  m.family = family;
  m.not_counted = not_counted;
  m.hidden = required_int(c, {"hidden_size", "d_model"}, 1, kMaxHidden);
  const int64_t n_layers = required_int(c, {"num_hidden_layers", "n_layers"}, 1, kMaxLayers);
  m.vocab = c.integer("vocab_size", 1, kMaxVocab);
  // Kimi K2.5 states tying on the wrapper and on text_config; the text model's own key decides.
  m.tied_embeddings = c.boolean_or("tie_word_embeddings", false);
  m.lm_head_bias = c.boolean_or("lm_head_bias", false);
  // The checkpoint's quantization, from the top level or the text model's config (Kimi K2.5).
  for (const JsonNode* q : std::initializer_list<const JsonNode*>{&root, &c}) {
    if (m.checkpoint_quantization.empty() && q->has("quantization_config"))
      m.checkpoint_quantization = quantization_summary(q->object("quantization_config"));
  }

  read_launch_constants(c, m);

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
  if (family == "deepseek_v32") {
    a.indexer.heads = c.integer("index_n_heads", 1, kMaxHeads);
    a.indexer.head_dim = c.integer("index_head_dim", 1, kMaxRank);
    a.indexer.top_k = c.integer("index_topk", 1, int64_t{1} << 40);
  }
  const bool attention_bias = c.boolean_or("attention_bias", false);
  if (family == "qwen2_moe") {
    a.qkv_bias = true;  // Qwen2 always has q/k/v biases and no o bias
  } else if (family == "glm4_moe") {
    a.qkv_bias = attention_bias;  // Glm4MoeAttention: attention_bias on q/k/v, never on o_proj
  } else if (family == "ernie4_5_moe") {
    // use_bias also puts biases on every MLP projection, which ModelSpec does not count.
    if (c.boolean_or("use_bias", false))
      c.fail("use_bias", "false (biased FFN projections are not modelled)");
  } else if (!is_mla) {
    a.qkv_bias = attention_bias;
    a.out_bias = attention_bias;
  }
  if (family == "qwen3_moe" || family == "qwen3_next") a.qk_norm = QkNorm::kPerHead;
  if (family == "olmoe") a.qk_norm = QkNorm::kFull;
  if ((family == "hunyuan" || is_hunyuan_v1 || family == "glm4_moe") && c.boolean_or("use_qk_norm", false))
    a.qk_norm = QkNorm::kPerHead;
  if (family == "llama4_text" && c.boolean_or("use_qk_norm", false)) a.qk_norm = QkNorm::kUnweighted;
  if (family == "minimax_m2" && c.boolean_or("use_qk_norm", false)) {
    // MiniMaxM2Attention: "per_layer" norms q and k over all their heads at once.
    a.qk_norm = c.choice_or<QkNorm>("qk_norm_type", QkNorm::kFull,
                                    {{"per_layer", QkNorm::kFull}, {"per_head", QkNorm::kPerHead}});
  }
  a.output_gate = family == "qwen3_next";
  a.sinks = family == "gpt_oss";
  if ((family == "hunyuan" || is_hunyuan_v1) && c.boolean_or("use_cla", false))
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
  } else if (family == "ernie4_5_moe") {
    e.num_experts = c.integer("moe_num_experts", 1, kMaxExperts);
    e.top_k = c.integer("moe_k", 1, kMaxExperts);
    e.expert_ffn = c.integer("moe_intermediate_size", 1, kMaxFfn);
  } else if (is_hunyuan_v1) {
    e.num_experts = uniform_int(c, "num_experts", n_layers, 1, kMaxExperts);
    e.top_k = uniform_int(c, "moe_topk", n_layers, 1, kMaxExperts);
    e.expert_ffn = uniform_int(c, "moe_intermediate_size", n_layers, 1, kMaxFfn);
  } else {
    e.num_experts = required_int(c, {"num_local_experts", "num_experts", "n_routed_experts"}, 1, kMaxExperts);
    e.top_k = required_int(c, {"num_experts_per_tok", "experts_per_token", "moe_topk"}, 1, kMaxExperts);
    e.expert_ffn = required_int(c, {"moe_intermediate_size", "intermediate_size"}, 1, kMaxFfn);
  }
  if (e.top_k > e.num_experts) {
    c.fail(is_dbrx                    ? "ffn_config.moe_top_k"
           : family == "ernie4_5_moe" ? "moe_k"
           : is_hunyuan_v1            ? "moe_topk"
                           : first_key(c, {"num_experts_per_tok", "experts_per_token", "moe_topk"}),
           fmt::format("at most the number of experts ({})", e.num_experts));
  }
  // DeepSeek-style group-limited routing (n_group / topk_group).
  auto read_groups = [&]() {
    e.groups = c.integer_or("n_group", 1, 1, e.num_experts);
    if (e.num_experts % e.groups != 0)
      c.fail("n_group", fmt::format("a divisor of the {} routed experts", e.num_experts));
    e.group_top_k = c.integer_or("topk_group", e.groups, 1, e.groups);
  };
  if (is_deepseek) {
    e.num_shared_experts = c.integer_or("n_shared_experts", 0, 0, kMaxExperts);
    e.shared_expert_ffn = e.expert_ffn;
    e.router_score_bias = c.string_or("topk_method", "") == "noaux_tc";
    if (c.string_or("scoring_func", "softmax") == "sigmoid") e.score = RouterScore::kSigmoid;
    const std::string method = c.string_or("topk_method", "greedy");
    if (method == "noaux_tc" || method == "group_limited_greedy") read_groups();
    m.dense_ffn = c.integer("intermediate_size", 1, kMaxFfn);
    m.mtp_layers = c.integer_or("num_nextn_predict_layers", 0, 0, 64);
  } else if (family == "glm4_moe") {
    // Glm4MoeTopkRouter: sigmoid scores with a score-correction bias, group-limited top-k.
    e.num_shared_experts = c.integer_or("n_shared_experts", 0, 0, kMaxExperts);
    e.shared_expert_ffn = e.expert_ffn;
    e.router_score_bias = true;
    e.score = RouterScore::kSigmoid;
    read_groups();
    m.dense_ffn = c.integer("intermediate_size", 1, kMaxFfn);
    m.mtp_layers = c.integer_or("num_nextn_predict_layers", 0, 0, 64);
  } else if (family == "qwen2_moe" || family == "qwen3_moe" || family == "qwen3_next") {
    e.shared_expert_ffn = c.integer_or("shared_expert_intermediate_size", 0, 0, kMaxFfn);
    e.num_shared_experts = e.shared_expert_ffn > 0 ? 1 : 0;
    e.shared_expert_gate = e.num_shared_experts > 0;
    m.dense_ffn = c.integer_or("intermediate_size", 0, 0, kMaxFfn);
  } else if (family == "hunyuan") {
    if (c.boolean_or("use_mixed_mlp_moe", false)) {
      e.num_shared_experts = c.integer_or("num_shared_expert", 1, 0, kMaxExperts);
      e.shared_expert_ffn = e.expert_ffn;
    }
  } else if (is_hunyuan_v1) {
    // HunYuanMoEV1: the shared MLP is num_shared_expert x intermediate_size wide.
    if (c.boolean_or("use_mixed_mlp_moe", false)) {
      e.num_shared_experts =
          c.has("num_shared_expert") ? uniform_int(c, "num_shared_expert", n_layers, 0, 64) : 1;
      e.shared_expert_ffn = c.integer("intermediate_size", 1, kMaxFfn);
    }
  } else if (family == "minimax_m2") {
    e.score =
        c.string_or("scoring_func", "softmax") == "sigmoid" ? RouterScore::kSigmoid : RouterScore::kSoftmax;
    e.router_score_bias = c.boolean_or("use_routing_bias", false);
    e.shared_expert_ffn = c.integer_or("shared_intermediate_size", 0, 0, kMaxFfn);
    e.num_shared_experts = e.shared_expert_ffn > 0 ? 1 : 0;
    if (c.boolean_or("use_mtp", false) && c.integer_or("num_mtp_modules", 0, 0, 64) > 0) {
      m.not_counted = fmt::format("the {} MTP modules (num_mtp_modules; their layout is not in the config)",
                                  c.integer("num_mtp_modules", 0, 64));
    }
  } else if (family == "ernie4_5_moe") {
    // Ernie4_5_MoeSparseMoeBlock: one shared MLP of moe_num_shared_experts x moe_intermediate_size, and a
    // per-expert score-correction bias (moe_statics).
    e.num_shared_experts = c.integer_or("moe_num_shared_experts", 0, 0, kMaxExperts);
    e.shared_expert_ffn = e.expert_ffn;
    e.router_score_bias = true;
    m.dense_ffn = c.integer_or("intermediate_size", 0, 0, kMaxFfn);
  } else if (family == "granitemoeshared") {
    e.shared_expert_ffn = c.integer_or("shared_intermediate_size", 0, 0, kMaxFfn);
    e.num_shared_experts = e.shared_expert_ffn > 0 ? 1 : 0;
  } else if (family == "nemotron_h") {
    // NemotronHMoE: sigmoid router with a score-correction bias, squared-ReLU experts (up, down).
    e.score = RouterScore::kSigmoid;
    e.router_score_bias = true;
    read_groups();
    e.num_shared_experts = c.integer_or("n_shared_experts", 0, 0, kMaxExperts);
    e.shared_expert_ffn =
        e.num_shared_experts > 0 ? c.integer("moe_shared_expert_intermediate_size", 1, kMaxFfn) : 0;
    m.dense_ffn = c.integer_or("intermediate_size", 0, 0, kMaxFfn);
    const std::string act = c.string_or("mlp_hidden_act", "relu2");
    if (act != "relu2") c.fail("mlp_hidden_act", "\"relu2\"");
    m.activation = FfnActivation::kRelu2;
    if (c.boolean_or("mlp_bias", false))
      c.fail("mlp_bias", "false (biased FFN projections are not modelled)");
  } else if (family == "llama4_text") {
    e.score = RouterScore::kSigmoid;
    e.num_shared_experts = 1;
    e.shared_expert_ffn = e.expert_ffn;
    m.dense_ffn = c.integer_or("intermediate_size_mlp", 0, 0, kMaxFfn);
  } else if (family == "gpt_oss") {
    e.expert_bias = true;
    e.router_bias = true;
    e.glu_limit = c.number_or("swiglu_limit", 0, 0, 1e6);
  }

  m.layers = layer_layout(c, family, n_layers, true);
  if (family == "qwen3_next") {
    m.norm_zero_centered = true;  // Qwen3NextRMSNorm: x_hat * (1 + weight), the weight initialised to zero
    qwen3_next_mixers(c, m.layers);
    auto& g = m.linear_attention;
    g.key_heads = c.integer("linear_num_key_heads", 1, kMaxHeads);
    g.value_heads = c.integer("linear_num_value_heads", 1, kMaxHeads);
    if (g.value_heads % g.key_heads != 0)
      c.fail("linear_num_value_heads", fmt::format("a multiple of linear_num_key_heads ({})", g.key_heads));
    g.key_head_dim = c.integer("linear_key_head_dim", 1, kMaxRank);
    g.value_head_dim = c.integer("linear_value_head_dim", 1, kMaxRank);
    g.conv_kernel = c.integer("linear_conv_kernel_dim", 1, 64);
  } else if (family == "nemotron_h") {
    nemotron_h_blocks(c, m.layers);
    auto& s = m.mamba;
    s.heads = c.integer("mamba_num_heads", 1, kMaxHeads);
    s.head_dim = c.integer("mamba_head_dim", 1, kMaxRank);
    s.state_size = c.integer("ssm_state_size", 1, kMaxRank);
    s.groups = c.integer_or("n_groups", 1, 1, s.heads);
    if (s.heads % s.groups != 0)
      c.fail("n_groups", fmt::format("a divisor of the {} Mamba heads (mamba_num_heads)", s.heads));
    s.conv_kernel = c.integer("conv_kernel", 1, 64);
    s.chunk = c.integer_or("chunk_size", 128, 1, 1 << 16);
    s.conv_bias = c.boolean_or("use_conv_bias", true);
    s.proj_bias = c.boolean_or("mamba_proj_bias", false);
  } else {
    read_windows(c, m.layers);
  }
  if (a.kv_share_layers > 1) {
    for (int64_t i = 0; i < n_layers; ++i)
      m.layers[static_cast<size_t>(i)].kv_projection = i % a.kv_share_layers == 0;
  }
  const bool has_dense =
      std::any_of(m.layers.begin(), m.layers.end(), [](const LayerSpec& l) { return l.ffn && !l.moe; });
  if (has_dense && m.dense_ffn <= 0) {
    c.fail("intermediate_size", "a positive dense FFN size (the config has dense layers)");
  }
  return m;
}

ModelSpec from_plain(const JsonNode& c, const std::string& fallback_name) {
  c.only_keys({"format", "name", "source", "hidden_size", "num_layers", "vocab_size", "tie_embeddings",
               "norm", "norm_eps", "rope_theta", "attention", "ffn", "moe"});
  ModelSpec m;
  m.name = c.string_or("name", fallback_name);
  m.family = "moeplan";
  m.source = c.string_or("source", "");
  m.hidden = c.integer("hidden_size", 1, kMaxHidden);
  const int64_t n_layers = c.integer("num_layers", 1, kMaxLayers);
  m.vocab = c.integer("vocab_size", 1, kMaxVocab);
  m.tied_embeddings = c.boolean_or("tie_embeddings", false);
  m.norm = c.choice_or<NormKind>("norm", NormKind::kRmsNorm,
                                 {{"rmsnorm", NormKind::kRmsNorm}, {"layernorm", NormKind::kLayerNorm}});
  read_launch_constants(c, m);

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
