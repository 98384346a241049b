// Each Hugging Face family maps onto ModelSpec as its modeling code builds the layers.
#include <doctest/doctest.h>

#include "simulator/io/model_loader.h"

using namespace moeplan;

namespace {
ModelSpec load(const char* name) {
  auto m = io::load_model(name);
  REQUIRE_MESSAGE(m.ok(), (m.ok() ? "" : m.error().message));
  return m.value();
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
}
