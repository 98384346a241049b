// Parameter counts against the counts shared/reference/hf-configs/SOURCES.md derives from each real config
// (they reproduce the published figures), and FLOPs per token against closed forms.
#include <doctest/doctest.h>

#include <string>

#include "simulator/core/model_stats.h"
#include "simulator/io/model_loader.h"
#include "tests/simulator/io/parse_model.h"

using namespace moeplan;

namespace {

ModelSpec load(const std::string& name) {
  auto m = io::load_model(name);
  REQUIRE_MESSAGE(m.ok(), (m.ok() ? "" : m.error().message));
  return m.value();
}

using test::parse_model;

struct Expected {
  const char* model;
  double total_b;  // billions, "Config count" column of SOURCES.md
  double active_b;
};

}  // namespace

TEST_SUITE("core") {
  TEST_CASE("layers are counted by kind over any range: DeepSeek-V3's three dense layers, then MoE") {
    const ModelSpec m = io::load_model("deepseek-v3").value();
    const LayerKindCounts counts(m);
    REQUIRE(counts.kinds().size() == 2);
    const size_t dense = counts.kinds()[0].moe ? 1 : 0, moe = 1 - dense;
    CHECK(!counts.kinds()[dense].moe);
    CHECK(counts.in(dense, 0, 3) == 3);
    CHECK(counts.in(moe, 0, 3) == 0);
    CHECK(counts.in(dense, 2, 10) == 1);
    CHECK(counts.in(moe, 2, 10) == 7);
    CHECK(counts.in(moe, 0, m.num_layers()) == m.num_layers() - 3);
    CHECK(counts.in(moe, 5, 5) == 0);
    CHECK(counts.kind_of(2) == dense);
    CHECK(counts.kind_of(3) == moe);
    CHECK(counts.first_of(moe) == 3);
  }

  TEST_CASE("parameter totals and actives agree within 1% with the config-derived counts") {
    // SOURCES.md, table column "Config count total / active" (billions).
    const Expected cases[] = {
        {"mixtral-8x7b", 46.70, 12.88},    {"mixtral-8x22b", 140.62, 39.15},
        {"deepseek-v2", 235.74, 21.38},    {"deepseek-v3", 671.03, 37.55},
        {"deepseek-moe-16b", 16.38, 2.83}, {"qwen2-57b-a14b", 57.41, 14.25},
        {"qwen3-30b-a3b", 30.53, 3.35},    {"qwen3-235b-a22b", 235.09, 22.19},
        {"olmoe-1b-7b", 6.92, 1.28},       {"gpt-oss-120b", 116.83, 5.71},
        {"gpt-oss-20b", 20.91, 4.19},      {"hunyuan-large", 388.70, 51.32},
        {"kimi-k2", 1026.41, 32.86},       {"dbrx", 131.60, 36.47},
        {"llama-4-scout", 107.77, 17.17},  {"llama-4-maverick", 400.71, 17.18},
    };
    for (const auto& c : cases) {
      CAPTURE(c.model);
      const ParamCounts p = count_params(load(c.model));
      CHECK(p.total.total() / 1e9 == doctest::Approx(c.total_b).epsilon(0.01));
      CHECK(p.active.total() / 1e9 == doctest::Approx(c.active_b).epsilon(0.01));
    }
  }

  TEST_CASE("publishers' own counting conventions are reproduced where they differ") {
    // GPT-OSS: OpenAI leaves the input embedding out of "active" (SOURCES.md: 5.13 B and 3.61 B).
    const ParamCounts big = count_params(load("gpt-oss-120b"));
    CHECK((big.active.total() - big.active.embedding) / 1e9 == doctest::Approx(5.13).epsilon(0.01));
    const ParamCounts small = count_params(load("gpt-oss-20b"));
    CHECK((small.active.total() - small.active.embedding) / 1e9 == doctest::Approx(3.61).epsilon(0.01));
    // DeepSeek-V3: 671 B without the MTP module; the Hub's 685 B adds ~14 B of MTP weights, of which the
    // module's own layers (without its copies of embedding and head, 2 x 129280 x 7168 = 1.85 B) are ~11.7 B.
    const ParamCounts v3 = count_params(load("deepseek-v3"));
    CHECK(v3.mtp / 1e9 == doctest::Approx(685.0 - 671.0 - 1.85).epsilon(0.05));
  }

  TEST_CASE("published figures of models without a config count are reproduced") {
    // Phi-3.5-MoE: 42 B total / 6.6 B active (Phi-3 technical report via the HF PhiMoE docs).
    const ParamCounts phi = count_params(load("phi-3.5-moe"));
    CHECK(phi.total.total() / 1e9 == doctest::Approx(42.0).epsilon(0.01));
    CHECK(phi.active.total() / 1e9 == doctest::Approx(6.6).epsilon(0.01));
    // Internal-352B: MegaScale-MoE Table 2 with one shared expert of the routed experts' size (the table
    // lists routed experts only) comes to the name's 352 B; 3 routed and the shared expert active: ~45.3 B.
    const ParamCounts m1 = count_params(load("internal-352b"));
    CHECK(m1.total.total() / 1e9 == doctest::Approx(352.0).epsilon(0.002));
    CHECK(m1.active.total() / 1e9 == doctest::Approx(45.3).epsilon(0.002));
    // Without it, the standard counting of Table 2 alone: ~341 B / ~35 B (megascale-moe.md §2.1).
    ModelSpec routed_only = load("internal-352b");
    routed_only.moe.num_shared_experts = 0;
    routed_only.moe.shared_expert_ffn = 0;
    const ParamCounts m0 = count_params(routed_only);
    CHECK(m0.total.total() / 1e9 == doctest::Approx(341.0).epsilon(0.01));
    CHECK(m0.active.total() / 1e9 == doctest::Approx(35.0).epsilon(0.02));
  }

  TEST_CASE("tiny model parameters match a hand count") {
    // h=64, 4 layers (1 dense, 3 MoE), 8 heads of 8 (4 KV), vocab 512, dense FFN 128, 8 experts of 64, top-2,
    // 1 shared expert of 64, RMSNorm, untied.
    const ParamCounts p = count_params(load("tiny-moe"));
    const double h = 64, v = 512;
    const double attn = h * 64 + 2 * h * 32 + 64 * h;  // q, k, v, o
    const double expert = 3 * h * 64;
    CHECK(p.total.embedding == v * h);
    CHECK(p.total.output == v * h);
    CHECK(p.total.attention == 4 * attn);
    CHECK(p.total.dense_ffn == 3 * h * 128);
    CHECK(p.total.routed_experts == 3 * 8 * expert);
    CHECK(p.active.routed_experts == 3 * 2 * expert);
    CHECK(p.total.shared_experts == 3 * expert);
    CHECK(p.total.router == 3 * h * 8);
    CHECK(p.total.norms == 4 * 2 * h + h);
  }

  TEST_CASE("forward FLOPs per token equal 2 x active GEMM weights plus causal attention") {
    // Internal-352B at S = 8192: per layer q,o = 4096x4096, k,v = 4096x1024; 3 of 32 experts and the shared
    // expert, each 3x4096x14336; router 4096x32; attention 2 x 32 heads x (128 + 128) x (S+1)/2; LM head
    // 4096 x 65536.
    const ModelSpec m = load("internal-352b");
    const double s = 8192, h = 4096;
    const double proj = 2 * (2 * h * h + 2 * h * 1024);
    const double experts = 2 * (3 + 1) * 3 * h * 14336;
    const double router = 2 * h * 32;
    const double core = 2 * 32 * 256 * (s + 1) / 2;
    const double head = 2 * h * 65536;
    const FlopsPerToken f = flops_per_token(m, 8192);
    CHECK(f.forward.total() == doctest::Approx(60 * (proj + experts + router + core) + head).epsilon(1e-12));
    CHECK(f.train_step == doctest::Approx(3 * f.forward.total()));
  }

  TEST_CASE("sliding windows cap the keys each query attends to") {
    CHECK(mean_attended_keys(4096, 0) == doctest::Approx(2048.5));  // causal: (S+1)/2
    CHECK(mean_attended_keys(4096, 8192) == doctest::Approx(2048.5));
    // W = 128 < S = 4096: (128*129/2 + (4096-128)*128) / 4096
    CHECK(mean_attended_keys(4096, 128) == doctest::Approx((128.0 * 129 / 2 + 3968.0 * 128) / 4096));
    // GPT-OSS alternates 128-token windows and full attention.
    const ModelSpec m = load("gpt-oss-120b");
    int sliding = 0;
    for (const auto& l : m.layers) sliding += l.window == 128 ? 1 : 0;
    CHECK(sliding == 18);
  }

  // Issue 16 families. The config counts are computed apart from moeplan, from each file's fields and the
  // Hugging Face modules' parameter shapes (weights, biases, norms, conv kernels, per-head dt/A/D; untied
  // embeddings twice; MTP and vision towers left out); models/README.md has the script's formulas.
  TEST_CASE("issue 16 families: totals and actives equal the independent config counts") {
    const Expected cases[] = {
        {"glm-4.5-air", 106.852, 13.424},      {"minimax-m2.5", 228.690, 11.031},
        {"deepseek-v3.2", 671.878, 38.404},    {"kimi-k2.5", 1026.408, 32.862},
        {"qwen3-next-80b-a3b", 79.674, 3.875}, {"nemotron-3-nano-30b-a3b", 31.578, 3.580},
    };
    for (const auto& c : cases) {
      CAPTURE(c.model);
      const ParamCounts p = count_params(load(c.model));
      CHECK(p.total.total() / 1e9 == doctest::Approx(c.total_b).epsilon(1e-4));
      CHECK(p.active.total() / 1e9 == doctest::Approx(c.active_b).epsilon(1e-4));
    }
  }

  TEST_CASE("issue 16 families reproduce their published parameter counts") {
    auto without_embeddings = [](const ParamCounts& p) {
      return (p.active.total() - p.active.embedding - p.active.output) / 1e9;
    };
    // GLM-4.5-Air: "106 billion total parameters and 12 billion active parameters" (GLM-4.5 model card,
    // zai-org/GLM-4.5 README; arXiv:2508.06471). The MTP layer is left out of both, embeddings out of active.
    const ParamCounts glm = count_params(load("glm-4.5-air"));
    CHECK(glm.total.total() / 1e9 == doctest::Approx(106.0).epsilon(0.01));
    CHECK(without_embeddings(glm) == doctest::Approx(12.0).epsilon(0.02));
    // MiniMax-M2 / M2.5: "230 billion total parameters with 10 billion active parameters" (MiniMax-M2 model
    // card); the three MTP modules are not in the 230 B, embeddings not in the 10 B.
    const ParamCounts mm = count_params(load("minimax-m2.5"));
    CHECK(mm.total.total() / 1e9 == doctest::Approx(230.0).epsilon(0.01));
    CHECK(without_embeddings(mm) == doctest::Approx(10.0).epsilon(0.03));
    // DeepSeek-V3.2: DeepSeek-V3's 671 B (37 B active) plus the lightning indexer; the Hub counts 685 B with
    // the MTP module. The indexer per layer: wq_b 1536 x 64*128, wk 7168 x 128, its LayerNorm 2 x 128,
    // weights_proj 7168 x 64.
    const ParamCounts v32 = count_params(load("deepseek-v3.2"));
    const ParamCounts v3 = count_params(load("deepseek-v3"));
    const double indexer = 1536.0 * 64 * 128 + 7168.0 * 128 + 2 * 128 + 7168.0 * 64;
    CHECK(v32.total.total() - v3.total.total() == doctest::Approx(61 * indexer));
    CHECK(v32.active.total() - v3.active.total() == doctest::Approx(61 * indexer));
    CHECK((v32.total.total() + v32.mtp) / 1e9 == doctest::Approx(685.0).epsilon(0.01));
    // Kimi K2.5: "Total Parameters 1T, Activated Parameters 32B" (Kimi-K2.5 model card); its text model has
    // Kimi K2's shapes, and the MoonViT vision tower is not counted.
    const ParamCounts k25 = count_params(load("kimi-k2.5"));
    CHECK(k25.total.total() == doctest::Approx(count_params(load("kimi-k2")).total.total()));
    CHECK(k25.total.total() / 1e12 == doctest::Approx(1.0).epsilon(0.03));
    CHECK(k25.active.total() / 1e9 == doctest::Approx(32.0).epsilon(0.03));
    // Qwen3-Next-80B-A3B: "80B in total and 3B activated" (Qwen3-Next-80B-A3B model card); 3B is the rounded
    // figure of the name: 3.25 B without the embeddings.
    const ParamCounts qn = count_params(load("qwen3-next-80b-a3b"));
    CHECK(qn.total.total() / 1e9 == doctest::Approx(80.0).epsilon(0.01));
    CHECK(without_embeddings(qn) == doctest::Approx(3.25).epsilon(0.01));
    CHECK(without_embeddings(qn) < 3.5);
    // Nemotron 3 Nano 30B-A3B: 31.6 B total, about 3.2 B active per token, 3.6 B with the embeddings (the
    // Nemotron 3 Nano report's figures as public model pages quote them, e.g.
    // https://www.open-source-ai.tech/models/nemotron-3-nano); the model card rounds to "3.5B active and 30B
    // in total". Its 3.2 B leaves out the input embedding.
    const ParamCounts nh = count_params(load("nemotron-3-nano-30b-a3b"));
    CHECK(nh.total.total() / 1e9 == doctest::Approx(31.6).epsilon(0.01));
    CHECK(nh.active.total() / 1e9 == doctest::Approx(3.6).epsilon(0.01));
    CHECK((nh.active.total() - nh.active.embedding) / 1e9 == doctest::Approx(3.2).epsilon(0.01));
  }

  TEST_CASE("Switch Transformers: the checkpoint's parameter count and the paper's 1571 B") {
    // google/switch-base-64: the safetensors index (huggingface.co/google/switch-base-64, refs/pr/6,
    // model.safetensors.index.json) states total_size 15,459,087,360 bytes of float32 tensors, 3,864,771,840
    // values. Those hold the 32128 x 768 embedding four times (shared, and the tied copies the index lists
    // apart), which the count below holds once.
    const ModelSpec base = load("switch-base-64");
    const ParamCounts p = count_params(base);
    const double embedding = 32128.0 * 768;
    CHECK(p.total.total() == 3'790'748'928.0);
    CHECK(p.total.total() + 3 * embedding == 15'459'087'360.0 / 4);
    // By hand: 12 sparse layers of 64 experts (wi, wo), 12 dense FFNs, 12 encoder self-attentions, 12
    // decoder self- and cross-attentions, routers, 62 RMS norms (2 per encoder layer, 3 per decoder layer,
    // 2 final), the two [32 buckets, 12 heads] bias tables, the embedding.
    const double ffn = 2.0 * 768 * 3072, attn = 4.0 * 768 * 768;
    CHECK(p.total.routed_experts == 12 * 64 * ffn);
    CHECK(p.total.dense_ffn == 12 * ffn);
    CHECK(p.total.attention == 12 * attn + 12 * 2 * attn + 2 * 32 * 12);
    CHECK(p.total.norms == 62 * 768.0);
    CHECK(p.active.routed_experts == 12 * ffn);

    // Switch-C as the paper's Table 9 gives it (Fedus et al. 2022): d_model 2080, d_ff 6144, 32 heads of
    // d_kv 64, 15 layers in each stack, 2048 experts in every layer; 1571 B parameters. (The Hub's
    // switch-c-2048 config states 12 decoder layers, decoder_sparse_step 0 and 30 heads, which would build
    // dense decoder layers; it is not used here.)
    const ModelSpec c = parse_model(R"({"model_type": "switch_transformers", "d_model": 2080, "d_ff": 6144,
        "d_kv": 64, "num_heads": 32, "num_layers": 15, "num_decoder_layers": 15, "encoder_sparse_step": 1,
        "decoder_sparse_step": 1, "num_experts": 2048, "vocab_size": 32128})");
    CHECK(count_params(c).total.total() / 1e9 == doctest::Approx(1571.0).epsilon(0.001));
  }

  TEST_CASE("an encoder-decoder's FLOPs per input token: encoder layers, and decoder layers on the targets") {
    // T5 span corruption: 512 inputs give 114 targets (random_spans_helper), padded to 128.
    CHECK(t5_target_len(512) == 114);
    CHECK(decoder_seq_len(512) == 128);
    CHECK(decoder_seq_len(2048) % kDecoderSeqMultiple == 0);
    CHECK(t5_target_len(2048) < decoder_seq_len(2048));
    const ModelSpec m = parse_model(R"({"model_type": "switch_transformers", "d_model": 64, "d_ff": 256,
        "d_kv": 16, "num_heads": 4, "num_layers": 1, "num_decoder_layers": 1, "encoder_sparse_step": 1,
        "decoder_sparse_step": 0, "num_experts": 8, "vocab_size": 1000})");
    const int64_t s = 512;
    const double r = 128.0 / 512.0, h = 64, inner = 64, f = 256;
    const FlopsPerToken x = flops_per_token(m, s);
    // Encoder: q, k, v, o on every input token; bidirectional attention over all 512 keys; one expert and
    // the router. Decoder, per target: self q, k, v, o and cross q, o; causal attention over (128+1)/2 keys
    // and cross-attention over 512; a dense FFN; the head. Cross k, v run on every input token.
    CHECK(x.forward.attention_proj ==
          doctest::Approx(2 * 4 * h * inner + r * 2 * 6 * h * inner + 2 * 2 * h * inner));
    CHECK(x.forward.attention_core == doctest::Approx(2 * 4 * 32 * 512 + r * 2 * 4 * 32 * (64.5 + 512)));
    CHECK(x.forward.routed_experts == doctest::Approx(2 * 2 * h * f));
    CHECK(x.forward.router == doctest::Approx(2 * h * 8));
    CHECK(x.forward.dense_ffn == doctest::Approx(r * 2 * 2 * h * f));
    CHECK(x.forward.lm_head == doctest::Approx(r * 2 * h * 1000));
  }

  TEST_CASE("recurrent mixers count their conv, per-head and norm parameters and chunked-scan FLOPs") {
    // Qwen3-Next Gated DeltaNet (16 key / 32 value heads of 128, conv 4, hidden 2048):
    //   in_proj 2048 x (2*2048 + 2*4096 + 2*32), out_proj 4096 x 2048, conv (2*2048 + 4096) x 4,
    //   dt_bias + A_log 2 x 32, gated norm 128.
    const ModelSpec qn = load("qwen3-next-80b-a3b");
    const LayerSpec& gdn = qn.layers[0];
    REQUIRE(gdn.mixer == MixerKind::kLinearAttention);
    const double gdn_params =
        2048.0 * (2 * 2048 + 2 * 4096 + 64) + 4096.0 * 2048 + (2 * 2048 + 4096) * 4.0 + 64 + 128;
    CHECK(layer_params(qn, gdn).attention == doctest::Approx(gdn_params));
    // Gated attention (layer 3): q_proj doubles for the output gate; per-head q/k norms of 256.
    const LayerSpec& full = qn.layers[3];
    REQUIRE(full.mixer == MixerKind::kAttention);
    const double full_params = 2048.0 * 16 * 256 * 2 + 2 * 2048.0 * 2 * 256 + 16 * 256.0 * 2048 + 2 * 256;
    CHECK(layer_params(qn, full).attention == doctest::Approx(full_params));
    // Scan FLOPs per token: 32 heads x (2 (128 + 128) (64 + 1) / 2 + 4 x 128 x 128), chunks of 64.
    CHECK(mixer_core_flops(qn, gdn, 4096) == doctest::Approx(32.0 * (256.0 * 65 + 4 * 128.0 * 128)));
    // Nemotron-H Mamba-2 (64 heads of 64, state 128, 8 groups, conv 4 with bias, hidden 2688): in_proj
    // 2688 x (2*4096 + 2*8*128 + 64), out_proj 4096 x 2688, conv (4096 + 2048) x (4 + 1), dt_bias, A_log, D
    // 3 x 64, gated norm 4096; the block has one norm.
    const ModelSpec nh = load("nemotron-3-nano-30b-a3b");
    const LayerSpec& mamba = nh.layers[0];
    REQUIRE(mamba.mixer == MixerKind::kMamba2);
    const ParamBreakdown mp = layer_params(nh, mamba);
    CHECK(mp.attention == doctest::Approx(2688.0 * (2 * 4096 + 2 * 8 * 128 + 64) + 4096.0 * 2688 +
                                          6144.0 * 5 + 3 * 64 + 4096));
    CHECK(mp.norms == doctest::Approx(2688.0));
    CHECK(mp.dense_ffn + mp.routed_experts + mp.shared_experts + mp.router == 0.0);
    // An 'E' block: no mixer, one norm, squared-ReLU experts of two matrices, the router and its score bias.
    const LayerSpec& moe = nh.layers[1];
    REQUIRE(moe.mixer == MixerKind::kNone);
    const ParamBreakdown ep = layer_params(nh, moe);
    CHECK(ep.attention == 0.0);
    CHECK(ep.norms == doctest::Approx(2688.0));
    CHECK(ep.routed_experts == doctest::Approx(128.0 * 2 * 2688 * 1856));
    CHECK(ep.shared_experts == doctest::Approx(2.0 * 2688 * 3712));
    CHECK(ep.router == doctest::Approx(2688.0 * 128 + 128));
    // SSD FLOPs per token: 64 heads x (2 (128 + 64) (128 + 1) / 2 + 4 x 128 x 64), chunks of 128.
    CHECK(mixer_core_flops(nh, mamba, 4096) == doctest::Approx(64.0 * (192.0 * 129 + 4 * 128.0 * 64)));
  }

  TEST_CASE("DSA attends top-k keys per query and its indexer scores every causal key") {
    // DeepSeek-V3.2 at S = 8192: the core over min(i + 1, 2048) keys, 128 heads x (192 + 128); the indexer
    // 64 heads x 128 over (S + 1) / 2 keys, QK only.
    const ModelSpec m = load("deepseek-v3.2");
    const double s = 8192, w = 2048;
    const double keys = (w * (w + 1) / 2 + (s - w) * w) / s;
    CHECK(mixer_core_flops(m, m.layers[5], 8192) ==
          doctest::Approx(2.0 * 128 * 320 * keys + 2.0 * 64 * 128 * (s + 1) / 2));
  }

  TEST_CASE("bytes per parameter of mixed-precision Adam") {
    CHECK(bytes_per_param(DType::kBf16).total() == 18);  // 2 bf16 weights + 4 fp32 grads + 12 master/m/v
    CHECK(bytes_per_param(DType::kFp32).total() == 16);
    CHECK(bytes_per_param(DType::kFp8).weights == 3);
  }
}
