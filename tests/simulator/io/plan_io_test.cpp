// Plan files: defaults for absent sections, strict keys, a write/read round trip, and the recompute object
// form.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "simulator/io/model_loader.h"
#include "simulator/io/plan_io.h"

using namespace moeplan;

namespace {
Result<Plan> parse(const char* text) {
  auto j = io::parse_json_text(text, "plan.json");
  REQUIRE(j.ok());
  return io::plan_from_json(j.value(), "plan.json");
}
}  // namespace

TEST_SUITE("io") {
  TEST_CASE("a minimal plan takes the documented defaults") {
    auto p = parse(R"({"model": "mixtral-8x7b", "hardware": "h100-sxm", "gpus": 8, "seq_len": 4096,
                       "global_batch": 64})");
    REQUIRE(p.ok());
    CHECK(p.value().micro_batch == 1);
    CHECK(p.value().attention.tp == 1);
    CHECK(p.value().experts.dispatch == Dispatch::kAllToAll);
    CHECK(p.value().pipeline.schedule == Schedule::k1F1B);
    CHECK(p.value().data.zero == 1);
    CHECK(p.value().recompute == Recompute::kNone);
    CHECK(p.value().routing.distribution == "uniform");
    CHECK_FALSE(p.value().routing.capacity_factor.has_value());
    CHECK(p.value().routing.fused_router);
    CHECK(p.value().cross_entropy == CrossEntropy::kTe);
    CHECK_FALSE(p.value().experts.fused_index_conversion);
    CHECK_FALSE(io::plan_to_json(p.value()).at("experts").contains("fused_index_conversion"));
    CHECK(p.value().attention.mla_down_proj == MlaDownProj::kStack);  // as the stack builds them
    CHECK_FALSE(io::plan_to_json(p.value()).at("attention").contains("mla_down_proj"));
    CHECK(p.value().experts.fp8_padding == Fp8Padding::kStack);  // where the stack pads
    CHECK_FALSE(io::plan_to_json(p.value()).at("experts").contains("fp8_padding"));
    CHECK_FALSE(p.value().data.fp8_param_gather);  // BF16 parameters
    CHECK_FALSE(io::plan_to_json(p.value()).at("data").contains("fp8_param_gather"));
  }

  TEST_CASE("a plan survives writing and reading back") {
    auto p = parse(R"({"model": "m", "hardware": "h", "gpus": 1440, "seq_len": 8192, "global_batch": 720,
                       "attention": {"sp": 8, "mla_down_proj": "column_parallel"}, "experts": {"ep": 8, "dispatch": "all_gather", "fused_index_conversion": true, "fp8_padding": "experts"},
                       "pipeline": {"pp": 15, "vpp": 2, "schedule": "interleaved_1f1b"}, "data": {"zero": 1, "fp8_param_gather": true},
                       "overlap": {"inter_op": true, "intra_op": true}, "compression": {"grad_sync": "bf16_all_to_all"},
                       "precision": "fp8", "recompute": "sar",
                       "routing": {"distribution": "zipf:1.2", "capacity_factor": 1.25, "fused_router": false},
                       "cross_entropy": "native"})");
    REQUIRE(p.ok());
    const auto j = io::plan_to_json(p.value());
    auto back = io::plan_from_json(j, "again.json");
    REQUIRE(back.ok());
    CHECK(io::plan_to_json(back.value()) == j);
    CHECK(back.value().pipeline.vpp == 2);
    CHECK(back.value().routing.capacity_factor == doctest::Approx(1.25));
    CHECK_FALSE(back.value().routing.fused_router);
    CHECK(back.value().cross_entropy == CrossEntropy::kNative);
    CHECK(back.value().experts.fused_index_conversion);
    CHECK(back.value().attention.mla_down_proj == MlaDownProj::kColumnParallel);
    CHECK(j.at("attention").at("mla_down_proj") == "column_parallel");
    CHECK(back.value().experts.fp8_padding == Fp8Padding::kExperts);
    CHECK(back.value().data.fp8_param_gather);
  }

  TEST_CASE("bad plan values are one-line errors") {
    CHECK(
        parse(R"({"model": "m", "hardware": "h", "gpus": 8, "seq_len": 1, "global_batch": 1,
                    "pipeline": {"schedule": "gpipe"}})")
            .error()
            .message ==
        "plan.json: field 'pipeline.schedule': expected one of \"1f1b\" \"interleaved_1f1b\" \"dualpipev\", "
        "got "
        "string \"gpipe\"");
    CHECK(parse(R"({"model": "m", "hardware": "h", "gpus": 8, "seq_len": 1, "global_batch": 1,
                    "routing": {"distribution": "zipf:-1"}})")
              .error()
              .message.find("'routing.distribution'") != std::string::npos);
    CHECK(
        parse(
            R"({"model": "m", "hardware": "h", "gpus": 8, "seq_len": 1, "global_batch": 1, "atention": {}})")
            .error()
            .message == "plan.json: field 'atention': unknown key (did you mean 'attention'?)");
    CHECK(parse(R"({"model": "m", "hardware": "h", "gpus": 8, "seq_len": 1, "global_batch": 1,
                    "attention": {"mla_down_proj": "stack"}})")
              .error()
              .message ==
          "plan.json: field 'attention.mla_down_proj': expected one of \"duplicated\" "
          "\"column_parallel\" \"gathered\", got string \"stack\"");
    CHECK(parse(R"({"model": "m", "hardware": "h", "gpus": 8, "seq_len": 1, "global_batch": 1,
                    "experts": {"fp8_padding": "gemm"}})")
              .error()
              .message ==
          "plan.json: field 'experts.fp8_padding': expected one of \"experts\" \"dispatcher\" \"router\" "
          "\"none\", got string \"gemm\"");
  }

  TEST_CASE("a plan file loads its model and hardware relative to itself or by built-in name") {
    const std::string path = "/tmp/moeplan_plan_io_test_" + std::to_string(::getpid()) + ".json";
    {
      std::ofstream f(path);
      f << R"({"model": "models/mixtral-8x7b.json", "hardware": "h100-sxm", "gpus": 8, "seq_len": 4096,
               "global_batch": 64, "experts": {"ep": 8}})";
    }
    auto loaded = io::load_plan(path);
    REQUIRE_MESSAGE(loaded.ok(), (loaded.ok() ? "" : loaded.error().message));
    CHECK(loaded.value().model.moe.num_experts == 8);
    CHECK(loaded.value().hardware.name == "h100-sxm");
    std::remove(path.c_str());
  }

  TEST_CASE("recompute's object form names Megatron's modules, method and layer count, and round-trips") {
    auto sel = parse(R"({"model": "m", "hardware": "h", "gpus": 8, "seq_len": 1, "global_batch": 1,
                         "recompute": {"granularity": "selective", "modules": ["moe_act", "core_attn", "mla_up_proj"]}})");
    REQUIRE(sel.ok());
    CHECK(sel.value().recompute == Recompute::kSelective);
    CHECK(sel.value().recompute_modules == (kRecomputeMoeAct | kRecomputeCoreAttn | kRecomputeMlaUpProj));
    const nlohmann::json j = io::plan_to_json(sel.value());
    // Written in Megatron's flag order.
    CHECK(j.at("recompute") ==
          nlohmann::json{{"granularity", "selective"}, {"modules", {"core_attn", "moe_act", "mla_up_proj"}}});
    auto back = io::plan_from_json(j, "again.json");
    REQUIRE(back.ok());
    CHECK(back.value().recompute_modules == sel.value().recompute_modules);
    CHECK(io::plan_to_json(back.value()) == j);

    auto full = parse(R"({"model": "m", "hardware": "h", "gpus": 8, "seq_len": 1, "global_batch": 1,
                          "recompute": {"granularity": "full", "method": "block", "num_layers": 3}})");
    REQUIRE(full.ok());
    CHECK(full.value().recompute_method == RecomputeMethod::kBlock);
    CHECK(full.value().recompute_num_layers == 3);
    const nlohmann::json jf = io::plan_to_json(full.value());
    CHECK(jf.at("recompute") ==
          nlohmann::json{{"granularity", "full"}, {"method", "block"}, {"num_layers", 3}});
    auto full_back = io::plan_from_json(jf, "again.json");
    REQUIRE(full_back.ok());
    CHECK(io::plan_to_json(full_back.value()) == jf);

    // The defaults (selective: core_attn; full: uniform, 1 layer) stay the plain strings.
    auto plain = parse(R"({"model": "m", "hardware": "h", "gpus": 8, "seq_len": 1, "global_batch": 1,
                           "recompute": "selective"})");
    REQUIRE(plain.ok());
    CHECK(plain.value().recompute_modules == kRecomputeCoreAttn);
    CHECK(io::plan_to_json(plain.value()).at("recompute") == "selective");
  }

  TEST_CASE("cuda_graphs names Megatron's scopes, round-trips, and a bad one is a one-line error") {
    auto p = parse(R"({"model": "m", "hardware": "h", "gpus": 8, "seq_len": 1, "global_batch": 1,
                       "cuda_graphs": ["moe_router", "attn", "moe_preprocess"]})");
    REQUIRE(p.ok());
    CHECK(p.value().cuda_graphs == (kGraphAttn | kGraphMoeRouter | kGraphMoePreprocess));
    const auto j = io::plan_to_json(p.value());
    CHECK(j.at("cuda_graphs") == nlohmann::json::array({"attn", "moe_router", "moe_preprocess"}));
    auto back = io::plan_from_json(j, "again.json");
    REQUIRE(back.ok());
    CHECK(back.value().cuda_graphs == p.value().cuda_graphs);
    CHECK_FALSE(io::plan_to_json(parse(R"({"model": "m", "hardware": "h", "gpus": 8, "seq_len": 1,
                                          "global_batch": 1})")
                                     .value())
                    .contains("cuda_graphs"));
    const std::string bad =
        parse(R"({"model": "m", "hardware": "h", "gpus": 8, "seq_len": 1, "global_batch": 1,
                                       "cuda_graphs": ["attn", "moe_routr"]})")
            .error()
            .message;
    CHECK(bad.find('\n') == std::string::npos);
    CHECK_MESSAGE(bad.find("'cuda_graphs[1]'") != std::string::npos, bad);
    CHECK_MESSAGE(bad.find("(did you mean \"moe_router\"?)") != std::string::npos, bad);
    const std::string empty = parse(R"({"model": "m", "hardware": "h", "gpus": 8, "seq_len": 1,
                                         "global_batch": 1, "cuda_graphs": []})")
                                  .error()
                                  .message;
    CHECK_MESSAGE(empty.find("at least one scope") != std::string::npos, empty);
  }

  TEST_CASE("mtp_layers is the plan's training choice, round-trips, and loading the plan applies it") {
    auto p = parse(R"({"model": "m", "hardware": "h", "gpus": 8, "seq_len": 1, "global_batch": 1,
                       "mtp_layers": 1})");
    REQUIRE(p.ok());
    REQUIRE(p.value().mtp_layers);
    CHECK(*p.value().mtp_layers == 1);
    CHECK(io::plan_to_json(p.value()).at("mtp_layers") == 1);
    CHECK_FALSE(io::plan_to_json(parse(R"({"model": "m", "hardware": "h", "gpus": 8, "seq_len": 1,
                                          "global_batch": 1})")
                                     .value())
                    .contains("mtp_layers"));
    const std::string bad = parse(R"({"model": "m", "hardware": "h", "gpus": 8, "seq_len": 1,
                                       "global_batch": 1, "mtp_layers": -1})")
                                .error()
                                .message;
    CHECK_MESSAGE(bad.find("'mtp_layers'") != std::string::npos, bad);
    // Qwen3-Next's config counts no MTP layer; a plan that trains one loads the model with it.
    const std::string path = "/tmp/moeplan_plan_io_mtp_" + std::to_string(::getpid()) + ".json";
    {
      std::ofstream f(path);
      f << R"({"model": "qwen3-next-80b-a3b", "hardware": "h100-sxm", "gpus": 8, "seq_len": 4096,
               "global_batch": 8, "mtp_layers": 1})";
    }
    const auto loaded = io::load_plan(path);
    REQUIRE_MESSAGE(loaded.ok(), (loaded.ok() ? "" : loaded.error().message));
    CHECK(loaded.value().model.mtp_layers == 1);
    CHECK(io::load_model("qwen3-next-80b-a3b").value().mtp_layers == 0);
    std::remove(path.c_str());
  }

  TEST_CASE("a bad recompute module or a key of the other granularity is a one-line error") {
    const std::string bad =
        parse(R"({"model": "m", "hardware": "h", "gpus": 8, "seq_len": 1, "global_batch": 1,
                                      "recompute": {"granularity": "selective", "modules": ["core_attn", "moe_ac"]}})")
            .error()
            .message;
    CHECK(bad.find('\n') == std::string::npos);
    CHECK_MESSAGE(bad.find("'recompute.modules") != std::string::npos, bad);
    CHECK_MESSAGE(bad.find("(did you mean \"moe_act\"?)") != std::string::npos, bad);
    CHECK_MESSAGE(bad.find("\"moe_ac\"") != std::string::npos, bad);
    const std::string mixed =
        parse(R"({"model": "m", "hardware": "h", "gpus": 8, "seq_len": 1, "global_batch": 1,
                                        "recompute": {"granularity": "full", "modules": ["moe_act"]}})")
            .error()
            .message;
    CHECK(mixed.find('\n') == std::string::npos);
    CHECK_MESSAGE(mixed.find("'recompute.modules'") != std::string::npos, mixed);
    const std::string method =
        parse(R"({"model": "m", "hardware": "h", "gpus": 8, "seq_len": 1, "global_batch": 1,
                                         "recompute": {"granularity": "selective", "method": "block"}})")
            .error()
            .message;
    CHECK_MESSAGE(method.find("'recompute.method'") != std::string::npos, method);
  }
}
