// Each Hugging Face family maps onto ModelSpec as its modeling code builds the layers.
#include <doctest/doctest.h>

#include <vector>

#include "simulator/io/model_loader.h"
#include "tests/simulator/io/parse_model.h"

using namespace moeplan;

namespace {
ModelSpec load(const char* name) {
  auto m = io::load_model(name);
  REQUIRE_MESSAGE(m.ok(), (m.ok() ? "" : m.error().message));
  return m.value();
}
ModelSpec parse(const char* text) {
  return test::parse_model(text);
}
int count_mixer(const ModelSpec& m, MixerKind k, bool ffn) {
  int n = 0;
  for (const auto& l : m.layers) n += l.mixer == k && l.ffn == ffn ? 1 : 0;
  return n;
}
std::string error_of(const char* text) {
  auto j = io::parse_json_text(text, "cfg.json");
  REQUIRE(j.ok());
  auto m = io::model_from_json(j.value(), "cfg.json", "cfg");
  REQUIRE_FALSE(m.ok());
  return m.error().message;
}
}  // namespace

TEST_SUITE("io") {
  TEST_CASE("the rotary base, norm epsilon and rope_scaling are read where each family keeps them") {
    const ModelSpec mixtral = load("mixtral-8x7b");
    CHECK(mixtral.rope_theta == 1e6);
    CHECK(mixtral.norm_eps == 1e-5);
    CHECK(mixtral.rope_scaling.empty());
    const ModelSpec dbrx = load("dbrx");  // attn_config.rope_theta; no epsilon stated
    CHECK(dbrx.rope_theta == 5e5);
    CHECK(dbrx.norm_eps == 0);
    const ModelSpec nemotron = load("nemotron-3-nano-30b-a3b");  // layer_norm_epsilon
    CHECK(nemotron.norm_eps == 1e-5);
    const ModelSpec ds = load("deepseek-v3");
    CHECK(ds.rope_scaling == "yarn factor 40");
    const ModelSpec scout = load("llama-4-scout");  // text_config, rope_type
    CHECK(scout.rope_theta == 5e5);
    CHECK(scout.rope_scaling == "llama3 factor 16");
    const ModelSpec plain = parse(
        R"({"format": "moeplan-model-v1", "hidden_size": 64, "num_layers": 2, "vocab_size": 128,
            "rope_theta": 500000, "norm_eps": 1e-6, "attention": {"heads": 4}, "ffn": {},
            "moe": {"num_experts": 4, "top_k": 2, "expert_ffn_size": 128}})");
    CHECK(plain.rope_theta == 5e5);
    CHECK(plain.norm_eps == 1e-6);
    CHECK(load("internal-352b").rope_theta == 0);
    CHECK(error_of(R"({"model_type": "mixtral", "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 8,
                      "num_attention_heads": 4, "rope_theta": -1})")
              .find("rope_theta") != std::string::npos);
  }

  TEST_CASE("DeepSeek-V3: MLA, 3 dense layers, 1 shared expert, MTP") {
    const ModelSpec m = load("deepseek-v3");
    CHECK(m.attention.kind == AttentionKind::kMla);
    CHECK(m.attention.qk_dim() == 192);
    CHECK(m.attention.v_dim() == 128);
    CHECK(m.num_layers() == 61);
    CHECK(m.num_moe_layers() == 58);
    CHECK_FALSE(m.layers[2].moe);
    CHECK(m.layers[3].moe);
    CHECK(m.moe.num_shared_experts == 1);
    CHECK(m.moe.router_score_bias);
    CHECK(m.mtp_layers == 1);
  }

  TEST_CASE("Qwen2-MoE has one gated shared expert and q/k/v biases, and Qwen3 has per-head q/k norms") {
    const ModelSpec q2 = load("qwen2-57b-a14b");
    CHECK(q2.moe.num_shared_experts == 1);
    CHECK(q2.moe.shared_expert_ffn == 20480);
    CHECK(q2.moe.shared_expert_gate);
    CHECK(q2.attention.qkv_bias);
    const ModelSpec q3 = load("qwen3-30b-a3b");
    CHECK(q3.attention.qk_norm == QkNorm::kPerHead);
    CHECK(q3.attention.head_dim == 128);  // explicit head_dim, not hidden / heads = 64
    CHECK(q3.moe.num_shared_experts == 0);
  }

  TEST_CASE("Hunyuan-Large shares K/V across layer pairs (CLA) and ties embeddings") {
    const ModelSpec m = load("hunyuan-large");
    CHECK(m.attention.kv_share_layers == 2);
    CHECK(m.layers[0].kv_projection);
    CHECK_FALSE(m.layers[1].kv_projection);
    CHECK(m.tied_embeddings);
    CHECK(m.moe.num_shared_experts == 1);
  }

  TEST_CASE("DBRX reads its nested ffn_config and attn_config") {
    const ModelSpec m = load("dbrx");
    CHECK(m.hidden == 6144);
    CHECK(m.moe.num_experts == 16);
    CHECK(m.moe.top_k == 4);
    CHECK(m.attention.num_kv_heads == 8);
    CHECK(m.norm == NormKind::kLayerNormNoBias);
  }

  TEST_CASE("Llama 4 Maverick interleaves MoE and dense layers from text_config") {
    const ModelSpec m = load("llama-4-maverick");
    CHECK(m.num_layers() == 48);
    CHECK(m.num_moe_layers() == 24);
    CHECK_FALSE(m.layers[0].moe);
    CHECK(m.layers[1].moe);
    CHECK(m.dense_ffn == 16384);
  }

  // Issue 16 families, from the real configs in models/ (models/README.md says where each came from).
  TEST_CASE("Qwen3-Next: a gated full-attention layer every fourth, Gated DeltaNet otherwise, all MoE") {
    const ModelSpec m = load("qwen3-next-80b-a3b");
    CHECK(m.num_layers() == 48);
    CHECK(m.num_moe_layers() == 48);
    CHECK(count_mixer(m, MixerKind::kAttention, true) == 12);
    CHECK(count_mixer(m, MixerKind::kLinearAttention, true) == 36);
    CHECK(m.layers[3].mixer == MixerKind::kAttention);
    CHECK(m.layers[4].mixer == MixerKind::kLinearAttention);
    CHECK(m.attention.output_gate);
    CHECK(m.attention.qk_norm == QkNorm::kPerHead);
    CHECK(m.linear_attention.key_heads == 16);
    CHECK(m.linear_attention.value_heads == 32);
    CHECK(m.linear_attention.conv_kernel == 4);
    CHECK(m.moe.num_experts == 512);
    CHECK(m.moe.top_k == 10);
    CHECK(m.moe.shared_expert_gate);
    CHECK(m.checkpoint_quantization.empty());
  }

  TEST_CASE("Nemotron-H reads one block per pattern character: Mamba-2, attention or MoE") {
    const ModelSpec m = load("nemotron-3-nano-30b-a3b");
    CHECK(m.num_layers() == 52);
    CHECK(count_mixer(m, MixerKind::kMamba2, false) == 23);
    CHECK(count_mixer(m, MixerKind::kAttention, false) == 6);
    CHECK(count_mixer(m, MixerKind::kNone, true) == 23);
    CHECK(m.num_moe_layers() == 23);
    CHECK(m.activation == FfnActivation::kRelu2);
    CHECK(m.mamba.heads == 64);
    CHECK(m.mamba.inner() == 4096);
    CHECK(m.mamba.groups == 8);
    CHECK(m.mamba.chunk == 128);
    CHECK(m.moe.router_score_bias);
    CHECK(m.moe.shared_expert_ffn == 3712);
  }

  TEST_CASE("DeepSeek-V3.2 adds the DSA indexer to V3's layout and reports its FP8 checkpoint") {
    const ModelSpec m = load("deepseek-v3.2");
    CHECK(m.attention.kind == AttentionKind::kMla);
    CHECK(m.attention.indexer.heads == 64);
    CHECK(m.attention.indexer.head_dim == 128);
    CHECK(m.attention.indexer.top_k == 2048);
    CHECK(m.num_moe_layers() == 58);
    CHECK(m.mtp_layers == 1);
    CHECK(m.checkpoint_quantization == "fp8, fmt e4m3, activation_scheme dynamic, weight blocks 128x128");
  }

  TEST_CASE("MiniMax-M2.5: sigmoid routing with a score bias, q/k norms over all heads, MTP left out") {
    const ModelSpec m = load("minimax-m2.5");
    CHECK(m.moe.num_experts == 256);
    CHECK(m.moe.expert_ffn == 1536);
    CHECK(m.moe.score == RouterScore::kSigmoid);
    CHECK(m.moe.router_score_bias);
    CHECK(m.moe.num_shared_experts == 0);
    CHECK(m.attention.qk_norm == QkNorm::kFull);
    CHECK(m.mtp_layers == 0);
    CHECK(m.not_counted.find("3 MTP modules") != std::string::npos);
    CHECK(m.checkpoint_quantization ==
          "fp8, fmt float8_e4m3fn, activation_scheme dynamic, weight blocks 128x128, 3 modules left "
          "unquantized");
  }

  TEST_CASE("Kimi K2.5 reads its text_config and the quantization stated there, not the vision tower") {
    const ModelSpec m = load("kimi-k2.5");
    CHECK(m.family == "kimi_k2");
    CHECK(m.attention.kind == AttentionKind::kMla);
    CHECK(m.moe.num_experts == 384);
    CHECK(m.num_moe_layers() == 60);
    CHECK(m.checkpoint_quantization.starts_with("compressed-tensors, format pack-quantized"));
    CHECK(m.checkpoint_quantization.find("group_0: weights int4-bit, group 32") != std::string::npos);
    CHECK(m.not_counted.find("vision") != std::string::npos);
  }

  TEST_CASE("GLM-4.5-Air: q/k/v biases without an o bias, one dense layer, sigmoid group routing, MTP") {
    const ModelSpec m = load("glm-4.5-air");
    CHECK(m.attention.qkv_bias);
    CHECK_FALSE(m.attention.out_bias);
    CHECK(m.attention.qk_norm == QkNorm::kNone);
    CHECK_FALSE(m.layers[0].moe);
    CHECK(m.num_moe_layers() == 45);
    CHECK(m.moe.score == RouterScore::kSigmoid);
    CHECK(m.moe.router_score_bias);
    CHECK(m.mtp_layers == 1);
    // The MLX community conversion names no method: the stated keys are reported as they are.
    CHECK(m.checkpoint_quantization == "method not named, bits 4, group_size 64");
  }

  // Families without a real config found in public repositories (models/README.md): their keys, read from
  // small hand-written configs.
  TEST_CASE("ERNIE 4.5 MoE: expert keys of its own and MoE between the start and end layer") {
    const ModelSpec m = parse(R"({"model_type": "ernie4_5_moe", "hidden_size": 64, "num_hidden_layers": 6,
        "vocab_size": 100, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96,
        "moe_num_experts": 8, "moe_k": 2, "moe_intermediate_size": 32, "moe_num_shared_experts": 2,
        "moe_layer_start_index": 1, "moe_layer_end_index": 4, "moe_layer_interval": 1,
        "tie_word_embeddings": true})");
    CHECK_FALSE(m.layers[0].moe);
    CHECK(m.layers[1].moe);
    CHECK(m.layers[4].moe);
    CHECK_FALSE(m.layers[5].moe);
    CHECK(m.moe.num_shared_experts == 2);
    CHECK(m.moe.shared_expert_ffn == 32);
    CHECK(m.dense_ffn == 96);
    CHECK(m.tied_embeddings);
    CHECK(error_of(R"({"model_type": "ernie4_5_moe", "hidden_size": 64, "num_hidden_layers": 2,
        "vocab_size": 100, "num_attention_heads": 4, "moe_num_experts": 8, "moe_k": 2,
        "moe_intermediate_size": 32, "use_bias": true})")
              .find("'use_bias': expected false") != std::string::npos);
  }

  TEST_CASE("Granite MoE: experts of intermediate_size, and the shared variant adds one shared expert") {
    const char* base = R"({"model_type": "granitemoe", "hidden_size": 64, "num_hidden_layers": 2,
        "vocab_size": 100, "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 32,
        "num_local_experts": 8, "num_experts_per_tok": 2, "tie_word_embeddings": true})";
    const ModelSpec g = parse(base);
    CHECK(g.moe.expert_ffn == 32);
    CHECK(g.moe.num_shared_experts == 0);
    CHECK(g.num_moe_layers() == 2);
    const ModelSpec s = parse(R"({"model_type": "granitemoeshared", "hidden_size": 64, "num_hidden_layers": 2,
        "vocab_size": 100, "num_attention_heads": 4, "intermediate_size": 32, "num_local_experts": 8,
        "num_experts_per_tok": 2, "shared_intermediate_size": 128})");
    CHECK(s.moe.num_shared_experts == 1);
    CHECK(s.moe.shared_expert_ffn == 128);
    CHECK_FALSE(s.moe.shared_expert_gate);
  }

  TEST_CASE("Hunyuan V1 MoE accepts per-layer lists with one value, and names a list that varies") {
    const ModelSpec m = parse(R"({"model_type": "hunyuan_v1_moe", "hidden_size": 64, "num_hidden_layers": 3,
        "vocab_size": 100, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "intermediate_size": 48, "num_experts": 8, "moe_topk": [2, 2, 2], "moe_intermediate_size": [32, 32, 32],
        "num_shared_expert": [1, 1, 1], "use_mixed_mlp_moe": true, "use_qk_norm": true})");
    CHECK(m.moe.top_k == 2);
    CHECK(m.moe.expert_ffn == 32);
    CHECK(m.moe.num_shared_experts == 1);
    CHECK(m.moe.shared_expert_ffn == 48);
    CHECK(m.attention.qk_norm == QkNorm::kPerHead);
    CHECK(
        error_of(R"({"model_type": "hunyuan_v1_moe", "hidden_size": 64, "num_hidden_layers": 2,
        "vocab_size": 100, "num_attention_heads": 4, "num_experts": 8, "moe_topk": [2, 4],
        "moe_intermediate_size": 32})") ==
        "cfg.json: field 'moe_topk': expected the same value on every layer (per-layer expert shapes are not "
        "modelled), got array [2,4]");
  }

  TEST_CASE("Llama 4: an explicit moe_layers list wins over the interleave step") {
    const ModelSpec m = parse(R"({"model_type": "llama4", "text_config": {"hidden_size": 64,
        "num_hidden_layers": 4, "vocab_size": 100, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "intermediate_size": 32, "intermediate_size_mlp": 96, "num_local_experts": 4,
        "num_experts_per_tok": 1, "interleave_moe_layer_step": 1, "moe_layers": [1, 3]}})");
    CHECK_FALSE(m.layers[0].moe);
    CHECK(m.layers[1].moe);
    CHECK_FALSE(m.layers[2].moe);
    CHECK(m.num_moe_layers() == 2);
  }

  TEST_CASE("inconsistent shapes are rejected with the field named") {
    CHECK(error_of(R"({"model_type": "mixtral", "hidden_size": 4096, "num_hidden_layers": 2, "vocab_size": 10,
                       "num_attention_heads": 32, "num_key_value_heads": 8, "num_local_experts": 8,
                       "num_experts_per_tok": 9, "intermediate_size": 64})") ==
          "cfg.json: field 'num_experts_per_tok': expected at most the number of experts (8), got number 9");
    CHECK(error_of(R"({"model_type": "mixtral", "hidden_size": 4000, "num_hidden_layers": 2, "vocab_size": 10,
                       "num_attention_heads": 48, "num_key_value_heads": 8, "num_local_experts": 8,
                       "num_experts_per_tok": 2, "intermediate_size": 64})")
              .find("a divisor of the hidden size 4000") != std::string::npos);
    CHECK(error_of(R"({"model_type": "mixtral", "hidden_size": 4096, "num_hidden_layers": 2, "vocab_size": 10,
                       "num_attention_heads": 32, "num_key_value_heads": 6, "num_local_experts": 8,
                       "num_experts_per_tok": 2, "intermediate_size": 64})")
              .find("'num_key_value_heads': expected a divisor of the 32 attention heads") !=
          std::string::npos);
  }

  TEST_CASE("an unsupported family names the supported ones") {
    CHECK(error_of(R"({"model_type": "bert"})").find("a supported MoE family (mixtral, ") !=
          std::string::npos);
    CHECK(error_of(R"({"hidden_size": 4})").find("'model_type': required but missing") != std::string::npos);
  }

  TEST_CASE("the plain form rejects unknown keys with a suggestion") {
    CHECK(error_of(R"({"format": "moeplan-model-v1", "hidden_size": 64, "num_layer": 2})") ==
          "cfg.json: field 'num_layer': unknown key (did you mean 'num_layers'?)");
  }

  TEST_CASE("built-in names and repository paths resolve, and unknown names list the built-ins") {
    CHECK(io::load_model("models/mixtral-8x7b.json").ok());
    auto r = io::load_model("no-such-model");
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().message.find("not a built-in models name (built-ins: dbrx, ") != std::string::npos);
  }

  TEST_CASE("routers read their score function and expert-group limit") {
    // DeepSeek-V3: sigmoid scores, top-8 within the best 4 of 8 groups (noaux_tc); DeepSeek-V2: softmax, best
    // 3 of 8 groups (group_limited_greedy); Llama 4: sigmoid, no groups; Mixtral: softmax, no groups.
    const ModelSpec v3 = load("deepseek-v3");
    CHECK(v3.moe.score == RouterScore::kSigmoid);
    CHECK(v3.moe.groups == 8);
    CHECK(v3.moe.group_top_k == 4);
    CHECK(v3.moe.group_limited());
    const ModelSpec v2 = load("deepseek-v2");
    CHECK(v2.moe.score == RouterScore::kSoftmax);
    CHECK(v2.moe.groups == 8);
    CHECK(v2.moe.group_top_k == 3);
    CHECK(v2.moe.group_limited());
    for (const char* name : {"llama-4-scout", "llama-4-maverick"}) {
      CAPTURE(name);
      const ModelSpec l4 = load(name);
      CHECK(l4.moe.score == RouterScore::kSigmoid);
      CHECK_FALSE(l4.moe.group_limited());
    }
    const ModelSpec mixtral = load("mixtral-8x7b");
    CHECK(mixtral.moe.score == RouterScore::kSoftmax);
    CHECK_FALSE(mixtral.moe.group_limited());
  }

  TEST_CASE("switch_transformers: encoder then decoder layers, experts every sparse_step as HF builds them") {
    const ModelSpec m = load("switch-base-64");
    REQUIRE(m.num_layers() == 24);
    CHECK(m.encoder_decoder());
    CHECK(m.activation == FfnActivation::kRelu);
    CHECK(m.position == PositionKind::kRelativeBias);
    CHECK(m.relative_buckets == 32);
    CHECK(m.tied_embeddings);
    CHECK(m.moe.num_experts == 64);
    CHECK(m.moe.top_k == 1);
    CHECK(m.moe.expert_ffn == 3072);
    CHECK(m.attention.num_heads == 12);
    CHECK(m.attention.head_dim == 64);
    for (int64_t i = 0; i < 24; ++i) {
      CAPTURE(i);
      const LayerSpec& l = m.layers[static_cast<size_t>(i)];
      const int64_t j = i % 12;  // index within its stack
      CHECK(l.role == (i < 12 ? LayerRole::kEncoder : LayerRole::kDecoder));
      CHECK(l.moe == (j % 2 == 1));  // sparse_step 2: HF's i % step == 1
      CHECK(l.position_bias == (j == 0));
    }
    // Without the step keys, the step is num_layers // num_sparse_*_layers; step 1 makes every layer sparse
    // and 0 none; a gated FFN has three matrices.
    const ModelSpec c = parse(R"({"model_type": "switch_transformers", "d_model": 64, "d_ff": 128,
        "d_kv": 16, "num_heads": 4, "num_layers": 8, "num_decoder_layers": 3, "num_sparse_encoder_layers": 2,
        "decoder_sparse_step": 1, "num_experts": 8, "vocab_size": 100, "is_gated_act": true})");
    std::vector<bool> moe;
    for (const auto& l : c.layers) moe.push_back(l.moe);
    CHECK(moe == std::vector<bool>{false, true, false, false, false, true, false, false, true, true, true});
    CHECK(c.activation == FfnActivation::kSwiGlu);
    const ModelSpec dense = parse(R"({"model_type": "switch_transformers", "d_model": 64, "d_ff": 128,
        "d_kv": 16, "num_heads": 4, "num_layers": 2, "encoder_sparse_step": 0, "decoder_sparse_step": 0,
        "num_experts": 8, "vocab_size": 100})");
    CHECK(dense.num_moe_layers() == 0);
    CHECK_FALSE(dense.is_moe());
    CHECK(dense.num_layers() == 4);  // num_decoder_layers defaults to num_layers
  }
}
