// Memory per GPU: ZeRO stages against bytes per parameter, and activations per layer against MegaScale-MoE's
// full and SAR formulas for the SP + EP layout they describe (megascale-moe.md §6).
#include <doctest/doctest.h>

#include "simulator/core/model_stats.h"
#include "simulator/cost/memory.h"
#include "simulator/io/hardware_loader.h"
#include "simulator/io/model_loader.h"

using namespace moeplan;

namespace {
Plan sp_ep_plan() {
  Plan p;
  p.gpus = 8;
  p.seq_len = 8192;
  p.global_batch = 1;
  p.attention.sp = 8;
  p.experts.ep = 8;
  p.experts.dispatch = Dispatch::kAllGather;
  return p;
}
}  // namespace

TEST_SUITE("cost") {
  TEST_CASE("activation memory per MoE layer matches MegaScale-MoE's full and SAR formulas") {
    // Internal-352B under SP = EP = n = 8 with all-gather dispatch, b = 1, s = 8192: k = 3, f = 14336/4096,
    // m = 4. In units of b s h / n:
    //   full (tensors of the paper's Fig. 9):  2n + 2k + 3kf + 11 + 5/m
    //   SAR:                                   2kf + 4 + 2/m   (paper §4.1, exactly)
    // The paper prints 12 + 5/m for the full constant; its Fig. 9 lists the eleven unit-size tensors counted
    // here (hidden, ln1_out, qkv, q/k rope, qkv_a2a, attn, attn_a2a, attn_out, ln2_in, ln2_out, ffn_out), so
    // the twelfth is not identifiable from the paper.
    const ModelSpec m = io::load_model("internal-352b").value();
    Plan p = sp_ep_plan();
    const double n = 8, k = 3, f = 14336.0 / 4096.0, mm = 4;
    const double unit = 8192.0 * 4096.0 / n;
    const LayerSpec& layer = m.layers[0];
    const auto full = cost::layer_activation_elements(m, p, layer, 1.0);
    CHECK(full.total() / unit == doctest::Approx(2 * n + 2 * k + 3 * k * f + 11 + 5 / mm));
    p.recompute = Recompute::kSelective;
    const auto sar = cost::layer_activation_elements(m, p, layer, 1.0);
    CHECK(sar.total() / unit == doctest::Approx(2 * k * f + 4 + 2 / mm));
    p.recompute = Recompute::kFull;
    CHECK(cost::layer_activation_elements(m, p, layer, 1.0).total() / unit == doctest::Approx(1.0));
  }

  TEST_CASE("ZeRO stages shard optimizer states, then gradients, then weights, by bytes per parameter") {
    // Mixtral-8x7B on 8 GPUs, ep = 8, one stage: bf16 weights 2 B, fp32 grads 4 B, Adam + master 12 B.
    const ModelSpec m = io::load_model("mixtral-8x7b").value();
    const HardwareProfile hw = io::load_hardware("h100-sxm").value();
    Plan p;
    p.gpus = 8;
    p.seq_len = 4096;
    p.global_batch = 8;
    p.experts.ep = 8;
    const ParamCounts c = count_params(m);
    const double experts = c.total.routed_experts / 8;  // each rank holds 1 of 8 experts per layer
    const double dense = c.total.total() - c.total.routed_experts;  // replicated on all 8 (dp = 8, edp = 1)
    auto mem = [&](int64_t zero) {
      p.data.zero = zero;
      return cost::memory_per_gpu(m, p, hw, {1}, 1.0);
    };
    const auto z0 = mem(0), z1 = mem(1), z2 = mem(2), z3 = mem(3);
    CHECK(z0.weights == doctest::Approx(2 * (dense + experts)));
    CHECK(z0.gradients == doctest::Approx(4 * (dense + experts)));
    CHECK(z0.optimizer == doctest::Approx(12 * (dense + experts)));
    CHECK(z1.optimizer == doctest::Approx(12 * (dense / 8 + experts)));  // experts: expert-dp = 1, unsharded
    CHECK(z1.gradients == doctest::Approx(z0.gradients));
    CHECK(z2.gradients == doctest::Approx(4 * (dense / 8 + experts)));
    CHECK(z3.weights < z2.weights);
    CHECK(z3.optimizer == doctest::Approx(z2.optimizer));
  }

  TEST_CASE("1F1B keeps more micro-batches in flight on early stages") {
    const ModelSpec m = io::load_model("mixtral-8x7b").value();
    const HardwareProfile hw = io::load_hardware("h100-sxm").value();
    Plan p;
    p.gpus = 32;
    p.seq_len = 4096;
    p.global_batch = 64;
    p.experts.ep = 8;
    p.pipeline.pp = 4;
    const auto b = cost::memory_per_gpu(m, p, hw, {4, 3, 2, 1}, 1.0);
    CHECK(b.stage == 0);
    CHECK(b.in_flight == 4);
  }
}
