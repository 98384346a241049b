// import (planner/import.h): shell words as bash reads them, and the round trip that defines the importer:
// every top plan of a search on a Megatron stack whose launch has no "not expressible" line comes back from
// its own `launch --for megatron` text unchanged.
#include "planner/import.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "planner/launch.h"
#include "planner/search.h"
#include "simulator/io/hardware_loader.h"
#include "simulator/io/model_loader.h"
#include "simulator/io/plan_io.h"
#include "simulator/io/stack_loader.h"

using namespace moeplan;

namespace {

// The plan-file form of `p` with the references an import does not produce normalised.
nlohmann::json comparable(Plan p) {
  p.model = "m";
  p.hardware = "h";
  // Without pipeline stages there is no p2p to overlap: the flag has no effect and no Megatron form.
  if (p.pipeline.pp == 1) p.overlap.pp_comm = false;
  return io::plan_to_json(p);
}

// Top plans of a search, each launched for Megatron and imported back; returns how many round-tripped.
int round_trip(const std::string& model_name, const std::string& stack_name, planner::Job job,
               bool fused_index_conversion = false, uint8_t cuda_graphs = 0) {
  const ModelSpec model = io::load_model(model_name).value();
  const HardwareProfile hw = io::load_hardware("h100-sxm").value();
  const StackProfile stack = io::load_stack(stack_name).value();
  planner::SearchOptions opts;
  opts.top = 8;
  const auto r = planner::search(model, hw, stack, workload::uniform_routing(model.moe.num_experts), job,
                                 planner::SearchSpace{}, opts);
  int checked = 0;
  for (auto rp : r.plans) {
    rp.plan.model = model_name;
    rp.plan.hardware = "h100-sxm";
    rp.plan.stack = stack_name;
    rp.plan.experts.fused_index_conversion = fused_index_conversion;
    rp.plan.cuda_graphs = cuda_graphs;
    if (!validate(rp.plan, model, hw).empty()) continue;  // the graphs' rules refuse this plan
    const planner::MegatronArgs args = planner::megatron_args(rp.plan, model, hw);
    CAPTURE(planner::describe(rp.plan));
    CHECK_MESSAGE(args.not_expressible.empty(), args.not_expressible.front());
    if (!args.not_expressible.empty()) continue;
    const std::string text = planner::megatron_text(rp.plan, model, hw, "plan.json");
    const Result<planner::Imported> imported = planner::import_megatron(text, model, {});
    REQUIRE_MESSAGE(imported, imported.error().message);
    nlohmann::json j = imported.value().plan;
    j["model"] = "m";
    j["hardware"] = "h";
    const Result<Plan> back = io::plan_from_json(j, "imported");
    REQUIRE_MESSAGE(back, back.error().message);
    CHECK(comparable(back.value()).dump() == comparable(rp.plan).dump());
    CHECK_MESSAGE(imported.value().unread.empty(), imported.value().unread.front());
    ++checked;
  }
  return checked;
}

}  // namespace

TEST_SUITE("import") {
  TEST_CASE("shell_words joins continued lines, drops comments and quotes, keeps --flag=value") {
    const auto w = planner::shell_words(
        "# a comment --not-a-flag 1\ntorchrun --nnodes=2 pretrain_gpt.py \\\n  --recompute-modules core_attn "
        "moe_act \\\n  --pipeline-model-parallel-layout 'E,t|t,L'  # trailing\n");
    const std::vector<std::string> expected = {"torchrun",
                                               "--nnodes=2",
                                               "pretrain_gpt.py",
                                               "--recompute-modules",
                                               "core_attn",
                                               "moe_act",
                                               "--pipeline-model-parallel-layout",
                                               "E,t|t,L"};
    CHECK(w == expected);
  }

  TEST_CASE("launch --for megatron then import gives the same plan (megatron-core, all-to-all)") {
    CHECK(round_trip("mixtral-8x22b", "megatron-core", {128, 4096, 256}) >= 5);
  }

  TEST_CASE("launch --for megatron then import gives the same plan (DeepEP and HybridEP stacks)") {
    CHECK(round_trip("qwen3-30b-a3b", "megatron-core-deepep", {32, 4096, 128}) >= 5);
    // DeepEP's fused index conversion is Megatron's --enable-experimental (with the fused permute).
    CHECK(round_trip("qwen3-30b-a3b", "megatron-core-deepep", {32, 4096, 128}, true) >= 5);
    CHECK(round_trip("qwen3-30b-a3b", "megatron-core-hybridep", {32, 4096, 128}) >= 5);
    CHECK(round_trip("deepseek-moe-16b", "megatron-core", {32, 4096, 128}) >= 5);  // shared experts
  }

  TEST_CASE("launch --for megatron then import gives the same plan (per-layer CUDA graphs)") {
    const uint8_t router = kGraphAttn | kGraphMoeRouter | kGraphMoePreprocess;
    CHECK(round_trip("mixtral-8x22b", "megatron-core", {128, 4096, 256}, false, router) >= 3);
    CHECK(round_trip("qwen3-30b-a3b", "megatron-core-hybridep", {32, 4096, 128}, false, router) >= 3);
    CHECK(round_trip("deepseek-moe-16b", "megatron-core", {32, 4096, 128}, false, kGraphAttn) >= 3);
    // Megatron's forms: --cuda-graph-modules (0.18+) like --cuda-graph-scope; no scope or "full" is the
    // whole layer; the local implementation is not modelled (a note, no graphs).
    const ModelSpec model = io::load_model("mixtral-8x7b").value();
    const std::string text =
        "torchrun --nnodes 1 --nproc-per-node 8 pretrain_gpt.py --expert-model-parallel-size 8 --seq-length "
        "4096 --moe-token-dispatcher-type alltoall";
    for (const auto& [flags, want] :
         {std::pair<std::string, nlohmann::json>{" --cuda-graph-impl transformer_engine --cuda-graph-modules "
                                                 "attn moe_router",
                                                 {"attn", "moe_router"}},
          {" --cuda-graph-impl transformer_engine", {"layer"}},
          {" --cuda-graph-impl transformer_engine --cuda-graph-scope full", {"layer"}}}) {
      CAPTURE(flags);
      const auto r = planner::import_megatron(text + flags, model, {});
      REQUIRE_MESSAGE(r, r.error().message);
      CHECK(r.value().plan.at("cuda_graphs") == want);
      CHECK(r.value().unread.empty());
    }
    const auto local = planner::import_megatron(text + " --cuda-graph-impl local", model, {});
    REQUIRE_MESSAGE(local, local.error().message);
    CHECK_FALSE(local.value().plan.contains("cuda_graphs"));
    CHECK(std::any_of(local.value().notes.begin(), local.value().notes.end(),
                      [](const std::string& n) { return n.find("not modelled") != std::string::npos; }));
  }

  TEST_CASE("import reads --mtp-num-layers as the plan's mtp_layers where it differs from the config") {
    const ModelSpec model = io::load_model("mixtral-8x7b").value();
    const std::string text =
        "torchrun --nnodes 1 --nproc-per-node 8 pretrain_gpt.py --expert-model-parallel-size 8 --seq-length "
        "4096 --moe-token-dispatcher-type alltoall";
    // MTP is a training choice: --mtp-num-layers on a config that counts none, or none on one that has one.
    const auto mtp = planner::import_megatron(text + " --mtp-num-layers 1", model, {});
    REQUIRE_MESSAGE(mtp, mtp.error().message);
    CHECK(mtp.value().plan.at("mtp_layers") == 1);
    CHECK_FALSE(planner::import_megatron(text, model, {}).value().plan.contains("mtp_layers"));
    const auto v3 = planner::import_megatron(
        "torchrun --nnodes 8 --nproc-per-node 8 pretrain_gpt.py --expert-model-parallel-size 64 --seq-length "
        "4096 --moe-token-dispatcher-type alltoall",
        io::load_model("deepseek-v3").value(), {});
    REQUIRE_MESSAGE(v3, v3.error().message);
    CHECK(v3.value().plan.at("mtp_layers") == 0);
  }

  TEST_CASE("import reads Megatron's defaults and refuses a launch for another model") {
    const ModelSpec model = io::load_model("mixtral-8x7b").value();
    const std::string text =
        "torchrun --nnodes 2 --nproc-per-node 8 pretrain_gpt.py --tensor-model-parallel-size 2 "
        "--expert-model-parallel-size 4 --context-parallel-size 2 --seq-length 8192 --num-layers 32 "
        "--recompute-granularity selective --fp8-format hybrid --cross-entropy-loss-fusion";
    const auto r = planner::import_megatron(text, model, {});
    REQUIRE_MESSAGE(r, r.error().message);
    const nlohmann::json& p = r.value().plan;
    CHECK(p.at("gpus") == 16);
    CHECK(p.at("experts").at("etp") == 2);                  // defaults to tp
    CHECK(p.at("experts").at("dispatch") == "all_gather");  // Megatron's default dispatcher
    CHECK(p.at("attention").at("cp") == 2);                 // p2p ring, priced as the K/V all-gather (noted)
    CHECK(p.at("fp8_recipe") == "delayed");
    CHECK(p.at("cross_entropy") == "native");
    CHECK(p.at("recompute").at("modules") == nlohmann::json::array({"core_attn"}));
    CHECK(p.at("global_batch") == 4);  // Megatron's default: micro-batch 1 x dp (16 / (tp 2 x cp 2))
    CHECK_FALSE(p.at("experts").contains("fp8_padding"));  // Megatron's default: the experts pad
    for (const char* flag : {" --moe-router-padding-for-fp8", " --moe-router-padding-for-quantization"}) {
      CAPTURE(flag);
      const auto padded =
          planner::import_megatron(text + " --moe-token-dispatcher-type alltoall" + flag, model, {});
      REQUIRE_MESSAGE(padded, padded.error().message);
      CHECK(padded.value().plan.at("experts").at("fp8_padding") == "router");
      CHECK(padded.value().unread.empty());
    }
    CHECK_FALSE(p.at("data").contains("fp8_param_gather"));  // BF16 parameters
    const auto fp8_params =
        planner::import_megatron(text + " --use-distributed-optimizer --fp8-param-gather", model, {});
    REQUIRE_MESSAGE(fp8_params, fp8_params.error().message);
    CHECK(fp8_params.value().plan.at("data").at("fp8_param_gather") == true);
    CHECK(fp8_params.value().unread.empty());
    // --moe-shared-expert-overlap is inert without shared experts (Megatron builds no SharedExpertMLP): read,
    // and left off; DeepSeek-MoE-16B's two shared experts take it.
    const auto inert = planner::import_megatron(text + " --moe-shared-expert-overlap", model, {});
    REQUIRE_MESSAGE(inert, inert.error().message);
    CHECK_FALSE(inert.value().plan.at("overlap").contains("shared_experts"));
    CHECK(inert.value().unread.empty());
    const auto shared = planner::import_megatron(
        "torchrun --nnodes 2 --nproc-per-node 8 pretrain_gpt.py --expert-model-parallel-size 8 "
        "--seq-length 4096 --moe-token-dispatcher-type alltoall --moe-shared-expert-overlap",
        io::load_model("deepseek-moe-16b").value(), {});
    REQUIRE_MESSAGE(shared, shared.error().message);
    CHECK(shared.value().plan.at("overlap").at("shared_experts") == true);
    const auto padded =
        planner::import_megatron(text +
                                     " --moe-token-dispatcher-type alltoall --moe-expert-capacity-factor 1.0 "
                                     "--moe-pad-expert-input-to-capacity",
                                 model, {});
    REQUIRE_MESSAGE(padded, padded.error().message);
    CHECK(padded.value().plan.at("routing").at("pad_to_capacity") == true);
    CHECK(padded.value().plan.at("routing").at("capacity_factor") == 1.0);
    const auto wrong = planner::import_megatron(text + " --hidden-size 1024", model, {});
    REQUIRE(!wrong);
    CHECK(wrong.error().message.find("--hidden-size 1024: the model mixtral-8x7b has 4096") !=
          std::string::npos);
    const auto no_gpus = planner::import_megatron("--seq-length 4096", model, {});
    REQUIRE(!no_gpus);
    CHECK(no_gpus.error().message.find("give --gpus N") != std::string::npos);
  }

  TEST_CASE("an MLA model under TP is imported with the stack's down-projection layout and a note on it") {
    // The Megatron-Core version is not in the flags: the plan keeps the stack's own layout (0.14+), and the
    // notes say how to price an older run.
    const ModelSpec model = io::load_model("deepseek-v3").value();
    const std::string base =
        "torchrun --nnodes 32 --nproc-per-node 8 pretrain_gpt.py --pipeline-model-parallel-size 16 "
        "--expert-model-parallel-size 64 --seq-length 4096 --global-batch-size 4096 "
        "--decoder-first-pipeline-num-layers 3 --decoder-last-pipeline-num-layers 2 ";
    auto note_on_layout = [](const planner::Imported& r) {
      return std::any_of(r.notes.begin(), r.notes.end(), [](const std::string& n) {
        return n.find("attention.mla_down_proj") != std::string::npos;
      });
    };
    const auto tp2 = planner::import_megatron(base + "--tensor-model-parallel-size 2", model, {});
    REQUIRE_MESSAGE(tp2, tp2.error().message);
    CHECK_FALSE(tp2.value().plan.at("attention").contains("mla_down_proj"));
    CHECK(note_on_layout(tp2.value()));
    const auto tp1 = planner::import_megatron(base + "--tensor-model-parallel-size 1", model, {});
    REQUIRE_MESSAGE(tp1, tp1.error().message);
    CHECK_FALSE(note_on_layout(tp1.value()));
  }

  TEST_CASE("the embedding and the loss counted in the pipeline split take a layer from the end stages") {
    // Qwen3-235B's 94 layers with the embedding and the loss counted are 96: pp 8 x 4 virtual stages of 3,
    // the first (rank 0's first) and the last (rank 7's last) building 2 decoder layers.
    const ModelSpec model = io::load_model("qwen3-235b-a22b").value();
    const std::string base =
        "torchrun --nnodes 32 --nproc-per-node 8 pretrain_gpt.py --tensor-model-parallel-size 4 "
        "--pipeline-model-parallel-size 8 "
        "--expert-model-parallel-size 8 --seq-length 4096 --global-batch-size 2048 ";
    const std::string counted =
        "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split";
    std::vector<int64_t> expected(32, 3);  // 8 ranks x 4 virtual stages, in model order
    expected.front() = 2;
    expected.back() = 2;
    for (const std::string vflag :
         {"--num-virtual-stages-per-pipeline-rank 4", "--num-layers-per-virtual-pipeline-stage 3"}) {
      CAPTURE(vflag);
      const auto r = planner::import_megatron(base + vflag + " " + counted, model, {});
      REQUIRE_MESSAGE(r, r.error().message);
      CHECK(r.value().unread.empty());
      const nlohmann::json& pipe = r.value().plan.at("pipeline");
      CHECK(pipe.at("vpp") == 4);
      CHECK(pipe.at("layers_per_stage").get<std::vector<int64_t>>() == expected);
    }
    // Only the embedding: 95 layers do not split over 8 ranks.
    const auto uneven =
        planner::import_megatron(base + "--account-for-embedding-in-pipeline-split", model, {});
    REQUIRE(!uneven);
    CHECK(uneven.error().message.find("95 layers") != std::string::npos);
    // Megatron refuses the counted split beside explicit first / last stage sizes, and so does import.
    const auto both = planner::import_megatron(
        base + counted + " --decoder-first-pipeline-num-layers 10 --decoder-last-pipeline-num-layers 10",
        model, {});
    REQUIRE(!both);
    CHECK(both.error().message.find("cannot be set with") != std::string::npos);
    // Without the embedding and loss, 94 / 8 is not whole: no virtual stage size fits.
    const auto bad_virtual =
        planner::import_megatron(base + "--num-layers-per-virtual-pipeline-stage 3", model, {});
    REQUIRE(!bad_virtual);
    CHECK(bad_virtual.error().message.find("--num-layers-per-virtual-pipeline-stage 3") != std::string::npos);
  }
}
