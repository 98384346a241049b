// Parameter counts against the counts shared/reference/hf-configs/SOURCES.md derives from each real config
// (they reproduce the published figures), and FLOPs per token against closed forms.
#include <doctest/doctest.h>

#include <string>

#include "simulator/core/model_stats.h"
#include "simulator/io/model_loader.h"

using namespace moeplan;

namespace {

ModelSpec load(const std::string& name) {
  auto m = io::load_model(name);
  REQUIRE_MESSAGE(m.ok(), (m.ok() ? "" : m.error().message));
  return m.value();
}

struct Expected {
  const char* model;
  double total_b;  // billions, "Config count" column of SOURCES.md
  double active_b;
};

}  // namespace

TEST_SUITE("core") {
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
    // Internal-352B: standard counting from MegaScale-MoE Table 2 gives ~341 B / ~35 B (megascale-moe.md
    // §2.1).
    const ParamCounts m1 = count_params(load("internal-352b"));
    CHECK(m1.total.total() / 1e9 == doctest::Approx(341.0).epsilon(0.01));
    CHECK(m1.active.total() / 1e9 == doctest::Approx(35.0).epsilon(0.02));
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
    // Internal-352B at S = 8192: per layer q,o = 4096x4096, k,v = 4096x1024; 3 of 32 experts of 3x4096x14336;
    // router 4096x32; attention 2 x 32 heads x (128 + 128) x (S+1)/2; LM head 4096 x 65536.
    const ModelSpec m = load("internal-352b");
    const double s = 8192, h = 4096;
    const double proj = 2 * (2 * h * h + 2 * h * 1024);
    const double experts = 2 * 3 * 3 * h * 14336;
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

  TEST_CASE("bytes per parameter of mixed-precision Adam") {
    CHECK(bytes_per_param(DType::kBf16).total() == 18);  // 2 bf16 weights + 4 fp32 grads + 12 master/m/v
    CHECK(bytes_per_param(DType::kFp32).total() == 16);
    CHECK(bytes_per_param(DType::kFp8).weights == 3);
  }
}
