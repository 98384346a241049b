// Plan legality: each rule fires on a plan that breaks it, with a reason naming the numbers, and stays silent
// on a legal plan; a stack refuses the plan features it cannot run and switches off the overlaps it lacks.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "simulator/core/plan.h"
#include "simulator/io/hardware_loader.h"
#include "simulator/io/model_loader.h"
#include "simulator/io/stack_loader.h"

using namespace moeplan;

namespace {

struct Fixture {
  ModelSpec model = io::load_model("mixtral-8x22b").value();   // 56 layers, 48 heads, 8 KV heads, 8 experts
  HardwareProfile hw = io::load_hardware("h100-sxm").value();  // 8 GPUs per node
  Plan plan = [] {
    Plan p;
    p.model = "mixtral-8x22b";
    p.hardware = "h100-sxm";
    p.gpus = 128;
    p.seq_len = 4096;
    p.global_batch = 256;
    p.attention.tp = 2;
    p.experts.ep = 8;
    p.pipeline.pp = 8;
    return p;
  }();

  std::vector<std::string> rules() const {
    std::vector<std::string> out;
    for (const auto& v : validate(plan, model, hw)) out.push_back(v.rule);
    return out;
  }
  bool breaks(const std::string& rule) const {
    const auto r = rules();
    return std::find(r.begin(), r.end(), rule) != r.end();
  }
};

}  // namespace

TEST_SUITE("core") {
  TEST_CASE("a legal plan has no violations and derives dp and micro-batches") {
    Fixture f;
    CHECK(f.rules().empty());
    CHECK(f.plan.dp() == 128 / 8 / 2);
    CHECK(f.plan.expert_dp() == 128 / 8 / 8);
    CHECK(f.plan.num_micro_batches() == 256 / 8);
  }

  TEST_CASE("each broken rule is reported") {
    Fixture f;
    SUBCASE("heads not divisible by tp*sp") {
      f.plan.attention.tp = 2;
      f.plan.attention.sp = 5;
      f.plan.gpus = 80;
      CHECK(f.breaks("heads_divisible"));
    }
    SUBCASE("KV heads vs tp*sp") {
      f.plan.attention.tp = 16;  // 8 KV heads divide 16: replicated, legal
      CHECK_FALSE(f.breaks("kv_heads_vs_tp"));
      f.plan.attention.tp = 6;  // 6 neither divides 8 nor is divided by it
      CHECK(f.breaks("kv_heads_vs_tp"));
    }
    SUBCASE("degrees must divide the GPUs") {
      f.plan.pipeline.pp = 3;
      CHECK(f.breaks("gpus_divisible_by_pp"));
    }
    SUBCASE("attention mesh must divide a stage") {
      f.plan.attention.tp = 3;
      CHECK(f.breaks("attention_mesh_divides_stage"));
    }
    SUBCASE("an MLA down-projection layout needs MLA attention") {
      f.plan.attention.mla_down_proj = MlaDownProj::kColumnParallel;
      CHECK(f.breaks("mla_down_proj_needs_mla"));  // Mixtral-8x22B has grouped-query attention
      f.model = io::load_model("deepseek-v3").value();
      CHECK_FALSE(f.breaks("mla_down_proj_needs_mla"));
    }
    SUBCASE(
        "naming where FP8 pads the experts' rows needs an FP8 plan of an MoE model and router padding a "
        "dispatcher other than all_gather") {
      f.plan.experts.fp8_padding = Fp8Padding::kRouter;
      CHECK(f.breaks("fp8_padding_needs_fp8_moe"));  // a BF16 plan
      f.plan.precision = Precision::kFp8;
      CHECK_FALSE(f.breaks("fp8_padding_needs_fp8_moe"));
      CHECK_FALSE(f.breaks("fp8_router_padding_dispatch"));
      f.plan.experts.dispatch = Dispatch::kAllGather;
      CHECK(f.breaks("fp8_router_padding_dispatch"));
      f.plan.experts.fp8_padding = Fp8Padding::kExperts;
      CHECK_FALSE(f.breaks("fp8_router_padding_dispatch"));
    }
    SUBCASE("FP8 parameters need an FP8 plan and the distributed optimizer (Megatron)") {
      f.plan.data.fp8_param_gather = true;
      CHECK(f.breaks("fp8_param_gather_needs_fp8"));  // a BF16 plan
      f.plan.precision = Precision::kFp8;
      CHECK_FALSE(f.breaks("fp8_param_gather_needs_fp8"));
      CHECK_FALSE(f.breaks("fp8_param_gather_needs_sharding"));  // zero 1
      f.plan.data.zero = 0;
      CHECK(f.breaks("fp8_param_gather_needs_sharding"));
      f.plan.data.zero = 3;  // Megatron-FSDP
      CHECK_FALSE(f.breaks("fp8_param_gather_needs_sharding"));
    }
    SUBCASE("experts divisible by ep") {
      f.plan.experts.ep = 16;
      CHECK(f.breaks("experts_divisible_by_ep"));
    }
    SUBCASE("etp divides the expert FFN") {
      f.plan.experts.etp = 3;
      CHECK(f.breaks("expert_ffn_divisible_by_etp"));
    }
    SUBCASE("layers divisible by pp*vpp, or an explicit split") {
      f.plan.pipeline.pp = 16;
      CHECK(f.breaks("layers_divisible"));  // 56 layers over 16 stages
      f.plan.pipeline.layers_per_stage = {3, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 3, 3, 3, 2, 2};
      CHECK_FALSE(f.breaks("layers_divisible"));
      CHECK_FALSE(f.breaks("layers_per_stage_sum"));
      f.plan.pipeline.layers_per_stage.back() = 1;
      CHECK(f.breaks("layers_per_stage_sum"));
    }
    SUBCASE("global batch divisible by micro_batch x dp") {
      f.plan.global_batch = 100;
      CHECK(f.breaks("batch_divisible"));
    }
    SUBCASE("sequence divisible by its splits") {
      f.plan.seq_len = 4095;
      CHECK(f.breaks("seq_divisible"));
      f.plan.seq_len = 4096 + 4;  // tp=2, cp=4 -> needs a multiple of 2*4*2 = 16
      f.plan.attention.cp = 4;
      f.plan.gpus = 512;
      CHECK(f.breaks("seq_divisible"));
    }
    SUBCASE("interleaving needs vpp > 1 and micro-batches a multiple of pp") {
      f.plan.pipeline.vpp = 7;
      CHECK(f.breaks("vpp_needs_interleaved"));
      f.plan.pipeline.schedule = Schedule::kInterleaved1F1B;
      CHECK_FALSE(f.breaks("vpp_needs_interleaved"));
      f.plan.global_batch = 8 * 12;  // 12 micro-batches, not a multiple of pp = 8
      CHECK(f.breaks("interleaved_micro_batches"));
    }
    SUBCASE("whole nodes") {
      f.plan.gpus = 12;
      f.plan.pipeline.pp = 1;
      f.plan.attention.tp = 2;
      f.plan.experts.ep = 2;
      f.plan.global_batch = 12;
      CHECK(f.breaks("whole_nodes"));
    }
  }

  TEST_CASE(
      "first_broken_rule names validate()'s first rule, with or without reasons, and nothing when legal") {
    Fixture f;
    int legal = 0, broken = 0;
    for (int64_t gpus : {64, 80, 128}) {
      for (int64_t tp : {1, 2, 3, 8}) {
        for (int64_t ep : {1, 4, 16}) {
          for (int64_t pp : {1, 3, 8}) {
            for (int64_t vpp : {1, 2}) {
              Plan p = f.plan;
              p.gpus = gpus;
              p.attention.tp = tp;
              p.experts.ep = ep;
              p.pipeline.pp = pp;
              p.pipeline.vpp = vpp;
              p.pipeline.schedule = vpp > 1 ? Schedule::kInterleaved1F1B : Schedule::k1F1B;
              CAPTURE(gpus);
              CAPTURE(tp);
              CAPTURE(ep);
              CAPTURE(pp);
              CAPTURE(vpp);
              const auto named = validate(p, f.model, f.hw, false), with_reasons = validate(p, f.model, f.hw);
              REQUIRE(named.size() == with_reasons.size());
              const char* first = first_broken_rule(p, f.model, f.hw);
              if (named.empty()) {
                CHECK(first == nullptr);
                ++legal;
              } else {
                REQUIRE(first != nullptr);
                CHECK(named.front().rule == first);
                CHECK(with_reasons.front().rule == first);
                ++broken;
              }
            }
          }
        }
      }
    }
    CHECK(legal > 10);
    CHECK(broken > 100);
  }

  TEST_CASE("the rows FP8's alignment adds to a Poisson count are E[(-c) mod a]") {
    // A count almost surely 0 or 1 pads 15 rows with probability P(c = 1), about its mean; a mean past a^2
    // spreads the count evenly over the residues: (a - 1) / 2; no alignment pads nothing.
    CHECK(expected_alignment_pad(0.0, 16) == 0.0);
    CHECK(expected_alignment_pad(1e-4, 16) == doctest::Approx(15e-4).epsilon(1e-3));
    CHECK(expected_alignment_pad(4096, 16) == 7.5);
    CHECK(expected_alignment_pad(4096, 32) == 15.5);
    CHECK(expected_alignment_pad(100, 1) == 0.0);
    // Means 2 and 200 (below a^2 = 256: summed), against the sum over c of e^-m m^c / c! ((16 - c % 16) % 16)
    // written out here; at 200 within 1e-6 of 7.5 (exp(-2 pi^2 200 / 256) = 2e-7).
    for (double mean : {2.0, 200.0}) {
      double direct = 0, prob = std::exp(-mean);
      for (int c = 0; c < 800; ++c) {
        direct += prob * ((16 - c % 16) % 16);
        prob *= mean / (c + 1);
      }
      CHECK(expected_alignment_pad(mean, 16) == doctest::Approx(direct).epsilon(1e-9));
    }
    CHECK(expected_alignment_pad(200, 16) == doctest::Approx(7.5).epsilon(1e-6));
    CHECK(expected_alignment_pad(2, 16) < 14.0);  // counts 0 (13.5 %) pad nothing
  }

  TEST_CASE("a violation's reason names the numbers involved") {
    Fixture f;
    f.plan.experts.ep = 16;
    const auto v = validate(f.plan, f.model, f.hw);
    REQUIRE(!v.empty());
    bool found = false;
    for (const auto& x : v)
      found |= x.reason.find("(8)") != std::string::npos && x.reason.find("(16)") != std::string::npos;
    CHECK(found);
  }

  TEST_CASE("Megatron's recompute modules and full recompute keep their rules") {
    // mixtral-8x22b: GQA, no shared experts, 56 layers; pp 8 gives chunks of 7 layers.
    Fixture f;
    f.plan.recompute = Recompute::kSelective;
    f.plan.recompute_modules = kRecomputeCoreAttn | kRecomputeMoeAct | kRecomputeMoe;
    CHECK(f.rules().empty());
    SUBCASE("at least one module") {
      f.plan.recompute_modules = 0;
      CHECK(f.breaks("recompute_modules"));
    }
    SUBCASE("mla_up_proj needs MLA") {
      f.plan.recompute_modules = kRecomputeMlaUpProj;
      CHECK(f.breaks("recompute_mla_up_proj_needs_mla"));
      f.model = io::load_model("deepseek-v3").value();
      CHECK_FALSE(f.breaks("recompute_mla_up_proj_needs_mla"));
    }
    SUBCASE("shared_experts needs shared experts") {
      f.plan.recompute_modules = kRecomputeSharedExperts;
      CHECK(f.breaks("recompute_shared_experts_needs_shared"));
    }
    SUBCASE("the delayed FP8 recipe recomputes neither moe_act nor layernorm") {
      // Megatron refuses them together (transformer_config.py:2000-2012); other recipes and modules are fine.
      f.plan.precision = Precision::kFp8;
      f.plan.fp8_recipe = Fp8Recipe::kDelayed;
      CHECK(f.breaks("recompute_fp8_delayed"));
      f.plan.recompute_modules = kRecomputeLayernorm;
      CHECK(f.breaks("recompute_fp8_delayed"));
      f.plan.recompute_modules = kRecomputeCoreAttn | kRecomputeMoe;
      CHECK(f.rules().empty());
      f.plan.recompute_modules = kRecomputeMoeAct;
      f.plan.fp8_recipe = Fp8Recipe::kTensorwise;
      CHECK(f.rules().empty());
    }
    SUBCASE("full recompute checkpoints 1 to the largest chunk's layers") {
      f.plan.recompute = Recompute::kFull;
      f.plan.recompute_num_layers = 7;
      CHECK(f.rules().empty());
      f.plan.recompute_num_layers = 8;
      CHECK(f.breaks("recompute_num_layers"));
      f.plan.recompute_num_layers = 0;
      CHECK(f.breaks("recompute_num_layers"));
    }
  }

  TEST_CASE("cross-micro-batch overlap needs ep > 1, no full recompute or moe module, and vpp when pp > 1") {
    // Megatron's rules for --overlap-moe-expert-parallel-comm (transformer_config.py:3002-3072; also the
    // alltoall or flex dispatcher and at most one MTP layer).
    Fixture f;
    f.plan.overlap.cross_micro_batch = true;
    f.plan.pipeline.vpp = 7;  // 56 layers over 8 x 7 chunks; 32 micro-batches, a multiple of pp
    f.plan.pipeline.schedule = Schedule::kInterleaved1F1B;
    CHECK(f.rules().empty());
    SUBCASE("ep > 1") {
      f.plan.experts.ep = 1;
      CHECK(f.breaks("cross_micro_batch_needs_ep"));
    }
    SUBCASE("no full recompute") {
      f.plan.recompute = Recompute::kFull;
      CHECK(f.breaks("cross_micro_batch_no_full_recompute"));
    }
    SUBCASE("no moe recompute module, other modules allowed") {
      f.plan.recompute = Recompute::kSelective;
      f.plan.recompute_modules = kRecomputeMoeAct;
      CHECK(f.rules().empty());
      f.plan.recompute_modules = kRecomputeMoeAct | kRecomputeMoe;
      CHECK(f.breaks("cross_micro_batch_no_moe_recompute"));
    }
    SUBCASE("the alltoall or flex dispatcher") {
      f.plan.experts.dispatch = Dispatch::kAllGather;
      CHECK(f.breaks("cross_micro_batch_needs_a2a_dispatch"));
      f.plan.experts.dispatch = Dispatch::kDedup;
      CHECK(f.rules().empty());
    }
    SUBCASE("at most one MTP layer") {
      f.model.mtp_layers = 2;
      CHECK(f.breaks("cross_micro_batch_mtp_layers"));
      f.model.mtp_layers = 1;
      CHECK(f.rules().empty());
    }
    SUBCASE("delayed weight gradients only inside it") {
      f.plan.overlap.delay_wgrad = true;
      CHECK(f.rules().empty());
      f.plan.overlap.cross_micro_batch = false;
      CHECK(f.breaks("delay_wgrad_needs_cross_micro_batch"));
    }
    SUBCASE("a virtual pipeline when pp > 1") {
      f.plan.pipeline.vpp = 1;
      f.plan.pipeline.schedule = Schedule::k1F1B;
      CHECK(f.breaks("cross_micro_batch_needs_vpp"));
      f.plan.pipeline.pp = 1;
      CHECK(f.rules().empty());
    }
  }

  TEST_CASE("a plan feature the stack cannot run is refused with its rule and the stack's list") {
    Fixture f;
    StackProfile stack = io::load_stack("megatron-core").value();
    auto refused = [&]() {
      std::vector<std::string> out;
      for (const auto& v : validate_for_stack(f.plan, stack)) out.push_back(v.rule);
      return out;
    };
    CHECK(refused().empty());
    SUBCASE("dispatch") {
      f.plan.experts.dispatch = Dispatch::kDedup;
      const auto v = validate_for_stack(f.plan, stack);
      REQUIRE(v.size() == 1);
      CHECK(v[0].rule == "stack_dispatch");
      CHECK(v[0].reason ==
            "stack megatron-core cannot run experts.dispatch \"dedup\" (it has: all_to_all, all_gather)");
    }
    SUBCASE("recompute granularity") {
      f.plan.recompute = Recompute::kSar;
      CHECK(refused() == std::vector<std::string>{"stack_recompute"});
    }
    SUBCASE("recompute module") {
      f.plan.recompute = Recompute::kSelective;
      f.plan.recompute_modules = kRecomputeCoreAttn | kRecomputeMoeAct;
      CHECK(refused().empty());
      stack.capabilities.recompute_modules = {"core_attn"};
      CHECK(refused() == std::vector<std::string>{"stack_recompute_modules"});
    }
    SUBCASE("schedule") {
      f.plan.pipeline.schedule = Schedule::kInterleaved1F1B;
      f.plan.pipeline.vpp = 7;
      CHECK(refused().empty());
      stack.capabilities.schedules = {"1f1b"};
      CHECK(refused() == std::vector<std::string>{"stack_schedule"});
    }
    SUBCASE("precision and FP8 recipe") {
      f.plan.precision = Precision::kFp8;
      f.plan.fp8_recipe = Fp8Recipe::kMxfp8;  // Blackwell only
      CHECK(refused() == std::vector<std::string>{"stack_fp8_recipe"});
      f.plan.fp8_recipe = Fp8Recipe::kBlockwise;
      CHECK(refused().empty());
      stack.capabilities.precision = {"bf16"};
      CHECK(refused() == std::vector<std::string>{"stack_precision"});
    }
    SUBCASE("gradient sync") {
      f.plan.compression.grad_sync = GradSync::kBf16AllToAll;
      CHECK(refused() == std::vector<std::string>{"stack_grad_sync"});
      f.plan.compression.grad_sync = GradSync::kBf16ReduceScatter;
      CHECK(refused().empty());
    }
    SUBCASE("dispatch precision") {
      f.plan.compression.dispatch = DispatchPrecision::kFp8;
      CHECK(refused() == std::vector<std::string>{"stack_dispatch_precision"});
    }
    SUBCASE("MLA's down-projection layout: the stack's own unless the plan names one it lists") {
      CHECK(mla_down_proj_of(f.plan, stack) == MlaDownProj::kDuplicated);  // Megatron-Core 0.14+
      f.plan.attention.mla_down_proj = MlaDownProj::kColumnParallel;       // before 0.14
      CHECK(refused().empty());
      CHECK(mla_down_proj_of(f.plan, stack) == MlaDownProj::kColumnParallel);
      f.plan.attention.mla_down_proj = MlaDownProj::kGathered;
      const auto v = validate_for_stack(f.plan, stack);
      REQUIRE(v.size() == 1);
      CHECK(v[0].rule == "stack_mla_down_proj");
      CHECK(v[0].reason ==
            "stack megatron-core cannot run attention.mla_down_proj \"gathered\" (it has: "
            "duplicated, column_parallel)");
      const StackProfile moerun = io::load_stack("moerun").value();
      CHECK(validate_for_stack(f.plan, moerun).empty());
      f.plan.attention.mla_down_proj = MlaDownProj::kStack;
      CHECK(mla_down_proj_of(f.plan, moerun) == MlaDownProj::kGathered);
    }
    SUBCASE("FP8's row padding: the stack's own place unless the plan names one it lists") {
      CHECK(fp8_padding_of(f.plan, stack) == Fp8Padding::kNone);  // a BF16 plan pads nothing
      f.plan.precision = Precision::kFp8;
      CHECK(fp8_padding_of(f.plan, stack) == Fp8Padding::kExperts);  // TEGroupedMLP's Fp8Padding
      f.plan.experts.fp8_padding = Fp8Padding::kRouter;
      CHECK(refused().empty());
      CHECK(fp8_padding_of(f.plan, stack) == Fp8Padding::kRouter);
      f.plan.experts.fp8_padding = Fp8Padding::kDispatcher;
      const auto v = validate_for_stack(f.plan, stack);
      REQUIRE(v.size() == 1);
      CHECK(v[0].rule == "stack_fp8_padding");
      CHECK(v[0].reason ==
            "stack megatron-core cannot run experts.fp8_padding \"dispatcher\" (it has: experts, router)");
      f.plan.experts.fp8_padding = Fp8Padding::kStack;
      CHECK(fp8_padding_of(f.plan, io::load_stack("megatron-core-hybridep").value()) ==
            Fp8Padding::kDispatcher);
      CHECK(fp8_padding_of(f.plan, io::load_stack("moerun").value()) == Fp8Padding::kNone);
    }
    SUBCASE("FP8 parameters only where the stack gathers them") {
      f.plan.precision = Precision::kFp8;
      f.plan.data.fp8_param_gather = true;
      CHECK(refused().empty());  // Megatron-Core: --fp8-param-gather
      const auto v = validate_for_stack(f.plan, io::load_stack("moerun").value());
      const auto it =
          std::find_if(v.begin(), v.end(), [](const Violation& x) { return x.rule == "stack_param_gather"; });
      REQUIRE(it != v.end());
      CHECK(it->reason == "stack moerun cannot run parameters gathered in \"fp8\" (it has: bf16)");
    }
    SUBCASE("an unstated capability allows everything") {
      stack.capabilities = {};
      f.plan.experts.dispatch = Dispatch::kDedup;
      f.plan.recompute = Recompute::kSar;
      CHECK(refused().empty());
    }
  }

  TEST_CASE("overlaps the stack lacks are switched off, each with a notice, and the others are kept") {
    // Megatron-Core achieves DP and PP overlap (with a virtual pipeline) and combined 1F1B, not
    // MegaScale-MoE's inter- or intra-operator overlap; moerun has no combined 1F1B.
    Fixture f;
    f.plan.overlap = {true, true, true, true, true, true};
    f.plan.pipeline.vpp = 2;
    f.plan.pipeline.schedule = Schedule::kInterleaved1F1B;
    const StackProfile megatron = io::load_stack("megatron-core").value();
    std::vector<std::string> notices;
    const Plan p = with_stack_overlaps(f.plan, megatron, &notices);
    CHECK_FALSE(p.overlap.inter_op);
    CHECK_FALSE(p.overlap.intra_op);
    CHECK(p.overlap.dp_comm);
    CHECK(p.overlap.pp_comm);
    CHECK(p.overlap.cross_micro_batch);
    CHECK(p.overlap.delay_wgrad);
    REQUIRE(notices.size() == 2);
    CHECK(notices[0].rfind("overlap.inter_op asked for, but stack megatron-core does not achieve it", 0) ==
          0);
    CHECK(notices[1].rfind("overlap.intra_op asked for", 0) == 0);
    notices.clear();
    const Plan q = with_stack_overlaps(f.plan, io::load_stack("moerun").value(), &notices);
    CHECK(q.overlap.inter_op);
    CHECK_FALSE(q.overlap.cross_micro_batch);
    CHECK_FALSE(q.overlap.delay_wgrad);  // it lives inside the combined 1F1B
    REQUIRE(notices.size() == 1);
    CHECK(notices[0].find("overlap.cross_micro_batch") != std::string::npos);
  }

  TEST_CASE("Megatron overlaps pipeline sends only with a virtual pipeline, other stacks on every schedule") {
    // Megatron sets overlap_p2p_comm False without VPP (arguments.py:583-590 at core_v0.16.0).
    Fixture f;
    REQUIRE(f.plan.pipeline.pp == 8);
    f.plan.overlap.pp_comm = true;
    const StackProfile megatron = io::load_stack("megatron-core").value();
    CHECK(megatron.overlaps.pp_comm_needs_vpp.value);
    std::vector<std::string> notices;
    CHECK_FALSE(with_stack_overlaps(f.plan, megatron, &notices).overlap.pp_comm);
    REQUIRE(notices.size() == 1);
    CHECK(notices[0].rfind("overlap.pp_comm asked for, but stack megatron-core overlaps pipeline sends only "
                           "with a virtual pipeline",
                           0) == 0);
    CHECK(notices[0].find("arguments.py:583-590") != std::string::npos);
    CHECK_FALSE(stack_overlaps_pipeline_sends(megatron, 8, 1));
    CHECK(stack_overlaps_pipeline_sends(megatron, 8, 2));
    CHECK_FALSE(stack_overlaps_pipeline_sends(megatron, 1, 2));
    for (const char* name : {"megatron-core-deepep", "megatron-core-hybridep"})
      CHECK(io::load_stack(name).value().overlaps.pp_comm_needs_vpp.value);
    // MegaScale-MoE overlaps them in 1F1B too; a profile without the key overlaps them everywhere.
    const StackProfile megascale = io::load_stack("megascale-moe").value();
    notices.clear();
    CHECK(with_stack_overlaps(f.plan, megascale, &notices).overlap.pp_comm);
    CHECK(notices.empty());
    CHECK(stack_overlaps_pipeline_sends(megascale, 8, 1));
    StackProfile without = megatron;
    without.overlaps.pp_comm_needs_vpp = {false, kNotStated};
    CHECK(stack_overlaps_pipeline_sends(without, 8, 1));
  }

  TEST_CASE("padding to capacity needs a capacity factor and the all-to-all dispatch") {
    Fixture f;
    f.plan.routing.pad_to_capacity = true;
    CHECK(f.breaks("pad_to_capacity_needs_capacity_factor"));
    f.plan.routing.capacity_factor = 1.0;
    REQUIRE(f.plan.experts.dispatch == Dispatch::kAllToAll);
    CHECK(f.rules().empty());
    f.plan.experts.dispatch = Dispatch::kAllGather;
    CHECK(f.breaks("pad_to_capacity_needs_all_to_all"));
    f.plan.experts.dispatch = Dispatch::kDedup;
    CHECK(f.breaks("pad_to_capacity_needs_all_to_all"));
  }

  TEST_CASE("per-layer CUDA graphs follow Megatron's rules, and a stack without them refuses them") {
    Fixture f;
    f.plan.cuda_graphs = kGraphAttn | kGraphMoeRouter | kGraphMoePreprocess;
    CHECK(f.rules().empty());
    f.plan.cuda_graphs = kGraphLayer | kGraphAttn;
    CHECK(f.breaks("cuda_graphs_layer_alone"));
    f.plan.cuda_graphs = kGraphMoe | kGraphMoeRouter;
    CHECK(f.breaks("cuda_graphs_moe_or_router"));
    f.plan.cuda_graphs = kGraphMoePreprocess;
    CHECK(f.breaks("cuda_graphs_preprocess_needs_router"));
    f.plan.cuda_graphs = kGraphMlp;  // Mixtral's layers are all MoE
    CHECK(f.breaks("cuda_graphs_mlp_needs_dense_layers"));
    f.model.layers[0].moe = false;
    CHECK(f.rules().empty());
    f.plan.cuda_graphs = kGraphMamba;
    CHECK(f.breaks("cuda_graphs_mamba_needs_mamba"));
    // The whole MoE in a graph: drop-and-pad only.
    for (uint8_t whole : {uint8_t{kGraphMoe}, uint8_t{kGraphLayer}}) {
      CAPTURE(int{whole});
      f.plan.cuda_graphs = whole;
      CHECK(f.breaks("cuda_graphs_moe_needs_padding"));
      f.plan.routing.capacity_factor = 1.0;
      f.plan.routing.pad_to_capacity = true;
      CHECK(f.rules().empty());
      f.plan.overlap.cross_micro_batch = true;
      f.plan.pipeline.vpp = 2;
      f.plan.pipeline.schedule = Schedule::kInterleaved1F1B;
      CHECK(f.breaks("cuda_graphs_cross_micro_batch"));
      f.plan.overlap.cross_micro_batch = false;
      f.plan.pipeline.vpp = 1;
      f.plan.pipeline.schedule = Schedule::k1F1B;
      f.plan.routing.pad_to_capacity = false;
      f.plan.routing.capacity_factor.reset();
    }
    // The all-to-all dispatcher's preprocess copies counts to the host under a capacity factor without
    // padding; the flex dispatcher's does not.
    f.plan.cuda_graphs = kGraphMoeRouter | kGraphMoePreprocess;
    f.plan.routing.capacity_factor = 1.25;
    CHECK(f.breaks("cuda_graphs_preprocess_host_copies"));
    f.plan.experts.dispatch = Dispatch::kDedup;
    CHECK(f.rules().empty());
    f.plan.experts.dispatch = Dispatch::kAllToAll;
    f.plan.routing.capacity_factor.reset();
    CHECK(f.rules().empty());
    f.plan.recompute = Recompute::kFull;
    CHECK(f.breaks("cuda_graphs_no_full_recompute"));
    f.plan.recompute = Recompute::kSelective;
    f.plan.recompute_modules = kRecomputeMoe;
    CHECK(f.breaks("cuda_graphs_moe_recompute_router"));
    f.plan.recompute_modules = kRecomputeMoeAct | kRecomputeLayernorm;
    CHECK(f.rules().empty());

    // Each reason names Megatron's source.
    f.plan.cuda_graphs = kGraphMoePreprocess;
    const auto v = validate(f.plan, f.model, f.hw);
    REQUIRE_FALSE(v.empty());
    CHECK(v[0].reason.find("transformer_config.py") != std::string::npos);

    f.plan.cuda_graphs = kGraphAttn | kGraphMoeRouter;
    f.plan.recompute = Recompute::kNone;
    CHECK(validate_for_stack(f.plan, io::load_stack("megatron-core").value()).empty());
    f.plan.experts.dispatch = Dispatch::kDedup;
    for (const char* name : {"megatron-core-deepep", "megatron-core-hybridep"})
      CHECK(validate_for_stack(f.plan, io::load_stack(name).value()).empty());
    for (const char* name : {"moerun", "megascale-moe"}) {
      f.plan.experts.dispatch = Dispatch::kAllToAll;
      const auto refused = validate_for_stack(f.plan, io::load_stack(name).value());
      REQUIRE(refused.size() == 2);  // attn and moe_router, each named
      CHECK(refused[0].rule == "stack_cuda_graphs");
      CHECK(refused[0].reason.find("\"attn\"") != std::string::npos);
    }
    CHECK(cuda_graph_scope_names(kAllCudaGraphScopes) ==
          std::vector<std::string>{"layer", "attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba"});
  }

  TEST_CASE("the shared-expert overlap follows Megatron's rules, and a stack without it runs them in line") {
    Fixture f;
    f.plan.overlap.shared_experts = true;
    CHECK(f.breaks("shared_experts_overlap_needs_shared_experts"));  // Mixtral has none
    f.model.moe.num_shared_experts = 1;
    f.model.moe.shared_expert_ffn = 4096;
    CHECK(f.rules().empty());
    f.plan.experts.dispatch = Dispatch::kDedup;  // the flex dispatcher (Megatron-Core 0.18+)
    CHECK(f.rules().empty());
    f.plan.experts.dispatch = Dispatch::kAllGather;
    CHECK(f.breaks("shared_experts_overlap_needs_a2a_dispatch"));
    f.plan.experts.dispatch = Dispatch::kAllToAll;
    f.plan.overlap.cross_micro_batch = true;
    CHECK(f.breaks("shared_experts_overlap_not_cross_micro_batch"));
    f.plan.overlap.cross_micro_batch = false;
    f.plan.recompute = Recompute::kSelective;
    f.plan.recompute_modules = kRecomputeSharedExperts;
    CHECK(f.breaks("shared_experts_overlap_no_shared_recompute"));
    f.plan.recompute_modules = kRecomputeMoeAct;
    CHECK(f.rules().empty());

    std::vector<std::string> notices;
    CHECK(with_stack_overlaps(f.plan, io::load_stack("megatron-core").value(), &notices)
              .overlap.shared_experts);
    CHECK(notices.empty());
    CHECK_FALSE(
        with_stack_overlaps(f.plan, io::load_stack("moerun").value(), &notices).overlap.shared_experts);
    REQUIRE(notices.size() == 1);
    CHECK(notices[0].rfind("overlap.shared_experts asked for, but stack moerun does not achieve it", 0) == 0);
  }

  TEST_CASE("TE's userbuffers need tp > 1, and a stack without them gives them no credit, saying so") {
    Fixture f;
    f.plan.overlap.tp_comm = true;
    CHECK(f.rules().empty());
    f.plan.attention.tp = 1;
    CHECK(f.breaks("tp_comm_needs_tp"));
    f.plan.attention.tp = 2;
    std::vector<std::string> notices;
    CHECK(with_stack_overlaps(f.plan, io::load_stack("megatron-core").value(), &notices).overlap.tp_comm);
    CHECK(notices.empty());
    CHECK_FALSE(with_stack_overlaps(f.plan, io::load_stack("moerun").value(), &notices).overlap.tp_comm);
    REQUIRE(notices.size() == 1);
    CHECK(notices[0].rfind("overlap.tp_comm asked for, but stack moerun does not achieve it", 0) == 0);
  }

  TEST_CASE("recurrent mixers refuse context parallelism and need their heads to split over tp*sp") {
    Fixture f;
    f.model = io::load_model("qwen3-next-80b-a3b").value();  // Gated DeltaNet: 16 key, 32 value heads
    f.plan.model = "qwen3-next-80b-a3b";
    f.plan.seq_len = 32768;
    f.plan.attention.tp = 2;
    f.plan.experts.ep = 8;
    f.plan.pipeline.pp = 8;
    CHECK(f.rules().empty());
    f.plan.attention.tp = 1;
    f.plan.attention.cp = 2;
    CHECK(f.breaks("recurrent_mixer_no_cp"));
    CHECK_FALSE(f.breaks("mixer_heads_divisible"));
    // Nemotron-H: 64 Mamba heads in 8 groups; tp 16 splits the heads but not the groups (its 2 KV heads
    // replicate, and the 32 attention heads split).
    f.model = io::load_model("nemotron-3-nano-30b-a3b").value();
    f.plan.attention.cp = 1;
    f.plan.attention.tp = 16;
    f.plan.pipeline.pp = 4;
    CHECK(f.breaks("mixer_heads_divisible"));
    f.plan.attention.tp = 8;
    CHECK_FALSE(f.breaks("mixer_heads_divisible"));
    // A plain attention model is not affected.
    f.model = io::load_model("mixtral-8x22b").value();
    f.plan.attention.tp = 2;
    f.plan.attention.cp = 2;
    f.plan.pipeline.pp = 8;
    CHECK_FALSE(f.breaks("recurrent_mixer_no_cp"));
  }

  TEST_CASE("an encoder-decoder keeps pp = sp = cp = 1 and its targets split over tp") {
    Fixture f;
    f.model = io::load_model("switch-base-64").value();  // 12 heads, 64 experts, 128 targets for 512 inputs
    f.plan.model = "switch-base-64";
    f.plan.seq_len = 512;
    f.plan.attention.tp = 2;
    f.plan.experts.ep = 8;
    f.plan.pipeline.pp = 1;
    CHECK(f.rules() == std::vector<std::string>{});
    f.plan.pipeline.pp = 2;
    CHECK(f.breaks("encoder_decoder_pp"));
    f.plan.pipeline.pp = 1;
    f.plan.attention.tp = 1;
    f.plan.attention.sp = 2;
    CHECK(f.breaks("encoder_decoder_sequence_split"));
    f.plan.attention.sp = 1;
    f.plan.attention.cp = 2;
    CHECK(f.breaks("encoder_decoder_sequence_split"));
    f.plan.attention.cp = 1;
    // tp 3 splits the 12 heads, the 768 hidden and 384 inputs, but not their 128 targets (86, padded);
    // 768 inputs have 192 targets (172, padded), which it splits.
    f.plan.seq_len = 384;
    f.plan.attention.tp = 3;
    CHECK(f.breaks("decoder_seq_divisible"));
    CHECK_FALSE(f.breaks("seq_divisible"));
    f.plan.seq_len = 768;
    CHECK_FALSE(f.breaks("decoder_seq_divisible"));
    // A decoder-only model is not affected.
    f.model = io::load_model("mixtral-8x22b").value();
    f.plan.model = "mixtral-8x22b";
    f.plan.seq_len = 4096;
    f.plan.attention.tp = 2;
    f.plan.pipeline.pp = 4;
    CHECK_FALSE(f.breaks("encoder_decoder_pp"));
  }
}
