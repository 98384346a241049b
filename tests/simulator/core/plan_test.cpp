// Plan legality: each rule fires on a plan that breaks it, with a reason naming the numbers, and stays silent
// on a legal plan.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>

#include "simulator/core/plan.h"
#include "simulator/io/hardware_loader.h"
#include "simulator/io/model_loader.h"

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
}
