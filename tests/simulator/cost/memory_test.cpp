// Memory per GPU: the distributed optimizer's buffers against Megatron's own estimator, each selective
// recompute module's saving, full recompute, TE's FP8 caches, the dispatcher buffers and the fit range, all
// in closed form; activations per layer against MegaScale-MoE's full and SAR formulas for the SP + EP layout
// they describe (megascale-moe.md §6).
#include <doctest/doctest.h>

#include <cmath>

#include "simulator/core/model_stats.h"
#include "simulator/cost/memory.h"
#include "simulator/io/hardware_loader.h"
#include "simulator/io/model_loader.h"
#include "simulator/io/stack_loader.h"
#include "simulator/workload/lower.h"

using namespace moeplan;

namespace {

// Eight GPUs of one node, 4096 tokens per micro-batch, one micro-batch per rank; experts over `ep`.
Plan one_node_plan(int64_t ep) {
  Plan p;
  p.gpus = 8;
  p.seq_len = 4096;
  p.global_batch = 8;
  p.experts.ep = ep;
  return p;
}

// The recurrent-mixer tests' plan: one node, ep 4, tp 2 (4096 tokens per rank's micro-batch).
Plan tp2_node_plan() {
  Plan p = one_node_plan(4);
  p.attention.tp = 2;
  return p;
}

// One layer's activations under tp2_node_plan() on a stack.
cost::LayerActivations tp2_activations(const ModelSpec& m, const LayerSpec& layer, const char* stack) {
  return cost::layer_activations(m, tp2_node_plan(), io::load_stack(stack).value(), layer, 1.0);
}

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

// DeepSeek-V3 at TP 2 (as the Megatron-Bridge H100 recipe), b = 1, s = 4096: t = 2048 tokens per rank, tg =
// 4096 after the TP all-gather, 64 heads per rank.
Plan dsv3_plan() {
  Plan p;
  p.gpus = 128;
  p.seq_len = 4096;
  p.global_batch = 64;
  p.attention.tp = 2;
  p.experts.ep = 64;
  p.recompute = Recompute::kSelective;
  return p;
}

// Bytes layer `layer` saves with `modules` recomputed.
double saved(const ModelSpec& m, const Plan& p, const StackProfile& st, const LayerSpec& layer,
             uint16_t modules) {
  return cost::layer_activations_under(m, p, st, layer, 1.0, Recompute::kSelective, modules).total();
}

// What recomputing `module` alone saves in `layer`.
double saving(const ModelSpec& m, const Plan& p, const StackProfile& st, const LayerSpec& layer,
              RecomputeModule module) {
  return saved(m, p, st, layer, 0) - saved(m, p, st, layer, module);
}

struct Dsv3 {
  ModelSpec m = io::load_model("deepseek-v3").value();
  StackProfile st = io::load_stack("megatron-core").value();
  Plan p = dsv3_plan();
  LayerSpec moe{true, 0, true}, dense{false, 0, true};
  // t, tg, h, heads per rank, qk / v head dims, MLA ranks, top-k rows, expert / shared / dense FFN per rank.
  double t = 2048, tg = 4096, h = 7168, heads = 64, qk = 192, v = 128, rope = 64;
  double rows = 2048 * 8, f = 2048, fs = 2048 / 2, fd = 18432 / 2, experts = 256;
};

}  // namespace

TEST_SUITE("cost") {
  TEST_CASE("memory_per_gpu is the first stage of memory_per_stage with the largest total") {
    // DeepSeek-V3 over an uneven interleaved pipeline of 4 (embedding and head on different stages, stage 0
    // holding the most micro-batches in flight) and 1F1B pipelines of 2 and 8, ZeRO-1 and ZeRO-3.
    const ModelSpec m = io::load_model("deepseek-v3").value();
    const HardwareProfile hw = io::load_hardware("h100-sxm").value();
    const StackProfile st = io::load_stack("megatron-core").value();
    for (int64_t pp : {2, 4, 8}) {
      for (int64_t zero : {1, 3}) {
        Plan p;
        p.gpus = 256;
        p.seq_len = 4096;
        p.global_batch = 512;
        p.attention.tp = 2;
        p.experts.ep = 16;
        p.pipeline.pp = pp;
        p.data.zero = zero;
        if (pp == 4) {
          p.pipeline.vpp = 2;
          p.pipeline.schedule = Schedule::kInterleaved1F1B;
        }
        p.pipeline.layers_per_stage = uneven_split(m.num_layers(), pp * p.pipeline.vpp);
        CAPTURE(pp);
        CAPTURE(zero);
        const auto flight = in_flight_by_chunk(m, p);
        const auto stages = cost::memory_per_stage(m, p, hw, st, flight, 1.0);
        REQUIRE(stages.size() == static_cast<size_t>(pp));
        size_t largest = 0;
        for (size_t s = 1; s < stages.size(); ++s)
          if (stages[largest].total() < stages[s].total()) largest = s;
        const auto gpu = cost::memory_per_gpu(m, p, hw, st, flight, 1.0);
        CHECK(gpu.stage == stages[largest].stage);
        CHECK(gpu.total() == stages[largest].total());
        CHECK(gpu.total_low() == stages[largest].total_low());
        CHECK(gpu.activations == stages[largest].activations);
        CHECK(gpu.in_flight == stages[largest].in_flight);
      }
    }
  }

  TEST_CASE(
      "memory parts computed for one plan serve every plan that differs only in ZeRO, sync or overlap") {
    // The search computes memory_parts once for the plans of its innermost choices. Across models with MTP,
    // MLA, shared experts and dense layers, four stacks (fused buffers, NCCL, DeepEP, HybridEP), recompute
    // and precision choices, every variant priced with another variant's parts equals the variant priced
    // alone.
    const HardwareProfile hw = io::load_hardware("h100-sxm").value();
    int compared = 0;
    for (const char* model : {"deepseek-v3", "qwen3-235b-a22b", "mixtral-8x7b"}) {
      const ModelSpec m = io::load_model(model).value();
      const LayerKindCounts counts(m);
      for (const char* stack :
           {"moerun", "megatron-core", "megatron-core-deepep", "megatron-core-hybridep"}) {
        const StackProfile st = io::load_stack(stack).value();
        for (Recompute rc : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
          for (Precision prec : {Precision::kBf16, Precision::kFp8}) {
            CAPTURE(model);
            CAPTURE(stack);
            Plan base;
            base.gpus = 256;
            base.seq_len = 4096;
            base.global_batch = 512;
            base.attention.tp = 2;
            base.experts.ep = 16;
            base.experts.dispatch = st.dispatch_dedup() ? Dispatch::kDedup : Dispatch::kAllToAll;
            base.pipeline.pp = 4;
            base.pipeline.layers_per_stage = uneven_split(m.num_layers(), 4);
            base.recompute = rc;
            base.precision = prec;
            const auto flight = in_flight_by_chunk(m, base);
            const cost::MemoryParts parts = cost::memory_parts(m, base, hw, st, 1.2, counts);
            for (int64_t zero : {0, 1, 2, 3}) {
              for (GradSync sync :
                   {GradSync::kFp32ReduceScatter, GradSync::kBf16ReduceScatter, GradSync::kBf16AllToAll}) {
                for (bool flags : {false, true}) {
                  Plan p = base;
                  p.data.zero = zero;
                  p.compression.grad_sync = sync;
                  p.overlap = {flags, flags, !flags, flags, false, false};
                  const auto alone = cost::memory_per_gpu(m, p, hw, st, flight, 1.2, &counts);
                  const auto shared = cost::memory_per_gpu(m, p, hw, st, flight, 1.2, &counts, &parts);
                  CHECK(shared.total_low() == alone.total_low());
                  CHECK(shared.total_high() == alone.total_high());
                  CHECK(shared.weights == alone.weights);
                  CHECK(shared.gradients == alone.gradients);
                  CHECK(shared.optimizer == alone.optimizer);
                  CHECK(shared.activations == alone.activations);
                  CHECK(shared.comm_buffers == alone.comm_buffers);
                  CHECK(shared.stage == alone.stage);
                  ++compared;
                }
              }
            }
          }
        }
      }
    }
    CHECK(compared == 3 * 4 * 3 * 2 * 4 * 3 * 2);
  }

  TEST_CASE("a Gated DeltaNet saves under Megatron-Core what its autograd keeps, and no chunk states") {
    // Qwen3-Next layer 0 at tp 2, 4096 tokens: per rank conv channels 4096, 8 key and 16 value heads of 128.
    const ModelSpec qn = io::load_model("qwen3-next-80b-a3b").value();
    const LayerSpec& gdn = qn.layers[0];
    REQUIRE(gdn.mixer == MixerKind::kLinearAttention);
    const double t = 4096;
    const cost::LayerActivations mc = tp2_activations(qn, gdn, "megatron-core");
    // The conv's input, l2norm's q and k (1024 each), q and k repeated to 16 heads and v (2048 each), and per
    // value head g and two fp32 gate operands, beta and A's 64 bf16 columns; the gated norm's input and gate
    // and the out-projection's input (2048 each).
    CHECK(mc.qkv ==
          doctest::Approx(t * ((4096 + 2 * 1024 + 2 * 2048 + 2048) * 2.0 + 16 * (4 + 2 + 128 + 8))));
    CHECK(mc.core_attn == doctest::Approx(t * 3 * 2048 * 2.0));
    // moerun keeps the in-projection and conv outputs, two value-width tensors and fp32 chunk states.
    const cost::LayerActivations mr = tp2_activations(qn, gdn, "moerun");
    CHECK(mr.qkv == doctest::Approx(t * (2 * 2048 + 2 * 4096 + 64 + 2 * 2048 + 4096) / 2 * 2.0));
    CHECK(mr.core_attn == doctest::Approx(t * 2 * 2048 * 2.0 + 64.0 * 16 * 128 * 128 * 4));
    // Its gated attention layer keeps the gate (a split of the mixed QKV output the saved v holds) and the
    // gated product the out-projection saves: 8 heads of 256 per rank, each in bf16.
    const LayerSpec& attn = qn.layers[3];
    REQUIRE(attn.mixer == MixerKind::kAttention);
    ModelSpec ungated = qn;
    ungated.attention.output_gate = false;
    const cost::LayerActivations with = tp2_activations(qn, attn, "megatron-core");
    const cost::LayerActivations without = tp2_activations(ungated, attn, "megatron-core");
    CHECK(with.qkv - without.qkv == doctest::Approx(t * 8 * 256 * 2.0));
    CHECK(with.core_attn - without.core_attn == doctest::Approx(t * 8 * 256 * 2.0));
  }

  TEST_CASE("a Mamba-2 mixer saves under Megatron-Core what mamba_ssm's combined function keeps") {
    // Nemotron-3 Nano layer 0 at tp 2, 4096 tokens: per rank in-projection 10304 / 2, inner 2048, 4 groups.
    const ModelSpec nh = io::load_model("nemotron-3-nano-30b-a3b").value();
    const LayerSpec& mamba = nh.layers[0];
    REQUIRE(mamba.mixer == MixerKind::kMamba2);
    const double t = 4096;
    const cost::LayerActivations mc = tp2_activations(nh, mamba, "megatron-core");
    // zxBCdt; the ungated scan output, the gated norm's input and the out-projection's input, and the
    // norm's fp32 rstd per group. No conv output, no chunk states.
    CHECK(mc.qkv == doctest::Approx(t * (2 * 4096 + 2 * 8 * 128 + 64) / 2 * 2.0));
    CHECK(mc.core_attn == doctest::Approx(t * (3 * 2048 * 2.0 + 4 * 4.0)));
    // moerun keeps the in-projection and conv outputs, two inner-width tensors and fp32 chunk states.
    const cost::LayerActivations mr = tp2_activations(nh, mamba, "moerun");
    CHECK(mr.qkv == doctest::Approx(t * (10304 + 4096 + 2 * 8 * 128) / 2 * 2.0));
    CHECK(mr.core_attn == doctest::Approx(t * 2 * 2048 * 2.0 + 32.0 * 32 * 128 * 64 * 4));
  }

  TEST_CASE("activation memory per MoE layer matches MegaScale-MoE's full and SAR formulas") {
    // Internal-352B on MegaScale-MoE's stack under SP = EP = n = 8 with all-gather dispatch, b = 1, s = 8192:
    // k = 3, f = 14336/4096, m = 4. In bf16 elements (bytes / 2), units of b s h / n:
    //   full (tensors of the paper's Fig. 9):  2n + 2k + 3kf + 11 + 5/m
    //   SAR:                                   2kf + 4 + 2/m   (paper §4.1, exactly)
    // The paper prints 12 + 5/m for the full constant; its Fig. 9 lists the eleven unit-size tensors counted
    // here (hidden, ln1_out, qkv, q/k rope, qkv_a2a, attn, attn_a2a, attn_out, ln2_in, ln2_out, ffn_out), so
    // the twelfth is not identifiable from the paper. The formulas count routed experts only, so the model's
    // shared expert is left out here.
    ModelSpec m = io::load_model("internal-352b").value();
    m.moe.num_shared_experts = 0;
    m.moe.shared_expert_ffn = 0;
    const StackProfile st = io::load_stack("megascale-moe").value();
    Plan p = sp_ep_plan();
    const double n = 8, k = 3, f = 14336.0 / 4096.0, mm = 4;
    const double unit = 8192.0 * 4096.0 / n * 2.0;
    const LayerSpec& layer = m.layers[0];
    CHECK(cost::layer_activations(m, p, st, layer, 1.0).total() / unit ==
          doctest::Approx(2 * n + 2 * k + 3 * k * f + 11 + 5 / mm));
    p.recompute = Recompute::kSar;
    CHECK(cost::layer_activations(m, p, st, layer, 1.0).total() / unit ==
          doctest::Approx(2 * k * f + 4 + 2 / mm));
    p.recompute = Recompute::kFull;
    CHECK(cost::layer_activations(m, p, st, layer, 1.0).total() / unit == doctest::Approx(1.0));
  }

  TEST_CASE("recomputing core_attn under fused attention frees only the softmax statistics in bf16") {
    // TE's fused attention saves q, k, v, out and fp32 stats [tg, heads]; the out-projection saves out too,
    // so the checkpoint frees the stats only: tg x heads x 4 B. Under FP8 the out-projection keeps an FP8
    // copy and the bf16 out goes as well: + tg x heads x v x 2 B.
    Dsv3 c;
    CHECK(saving(c.m, c.p, c.st, c.moe, kRecomputeCoreAttn) == doctest::Approx(c.tg * c.heads * 4));
    c.p.precision = Precision::kFp8;
    CHECK(saving(c.m, c.p, c.st, c.moe, kRecomputeCoreAttn) ==
          doctest::Approx(c.tg * c.heads * 4 + c.tg * c.heads * c.v * 2));
  }

  TEST_CASE("recomputing moe_act frees FC2's input rows") {
    // FC2 saves the activation output [rows, F / etp]: rows x F x 2 B in bf16, its FP8 copy (1 B) under FP8,
    // where the rows of each of the 4 local experts are padded to a multiple of 16 (Megatron's TEGroupedMLP).
    Dsv3 c;
    CHECK(saving(c.m, c.p, c.st, c.moe, kRecomputeMoeAct) == doctest::Approx(c.rows * c.f * 2));
    c.p.precision = Precision::kFp8;
    const double padded = c.rows + 4 * expected_alignment_pad(c.rows / 4, 16);
    CHECK(padded > c.rows + 4 * 7);
    CHECK(saving(c.m, c.p, c.st, c.moe, kRecomputeMoeAct) == doctest::Approx(padded * c.f * 1));
    // Padded in the router before the all-to-all: every source pads each of the 256 experts' counts (mean
    // 16384 / 256 = 64), and the rows arrive aligned.
    c.p.experts.fp8_padding = Fp8Padding::kRouter;
    const double routed = c.rows + 256 * expected_alignment_pad(c.rows / 256, 16);
    CHECK(routed > c.rows * 1.1);
    CHECK(saving(c.m, c.p, c.st, c.moe, kRecomputeMoeAct) == doctest::Approx(routed * c.f * 1));
  }

  TEST_CASE("recomputing layernorm frees the pre-MLP norm output, and the attention norm only under MLA") {
    // MLA (separate input_layernorm) + MoE: t h 2 (pre-MLP) + t h 2 (attention norm) in bf16. GQA fuses the
    // attention norm into the QKV LayerNormLinear: t h 2. A dense layer's pre-MLP norm is fused into fc1.
    Dsv3 c;
    CHECK(saving(c.m, c.p, c.st, c.moe, kRecomputeLayernorm) == doctest::Approx(2 * c.t * c.h * 2));
    CHECK(saving(c.m, c.p, c.st, c.dense, kRecomputeLayernorm) == doctest::Approx(c.t * c.h * 2));
    const ModelSpec q = io::load_model("qwen3-235b-a22b").value();  // GQA, h = 4096
    CHECK(saving(q, c.p, c.st, c.moe, kRecomputeLayernorm) == doctest::Approx(c.t * 4096 * 2));
    // FP8: the norm's consumers keep FP8 copies (q and kv down-projections, shared fc1) that go as well,
    // and the pre-MLP output stays in bf16 for the router: 2 t h 1 + t h (2 + 1).
    c.p.precision = Precision::kFp8;
    CHECK(saving(c.m, c.p, c.st, c.moe, kRecomputeLayernorm) ==
          doctest::Approx(2 * c.t * c.h + 3 * c.t * c.h));
  }

  TEST_CASE("recomputing mla_up_proj frees the full Q, K and V but keeps the gathered rope key") {
    // Q, K [tg, heads, 192] and V [tg, heads, 128] in bf16, the fused norms' outputs [t, 1536 + 512] and
    // rsigma (fp32, two per row); the checkpoint keeps its inputs, the down projections' outputs (which the
    // norms saved already) and the rope key gathered over TP [tg, 64]:
    // tg heads (2 qk + v) 2 + t (1536 + 512) 2 + 2 t 4 - tg rope 2.
    Dsv3 c;
    CHECK(saving(c.m, c.p, c.st, c.moe, kRecomputeMlaUpProj) ==
          doctest::Approx(c.tg * c.heads * (2 * c.qk + c.v) * 2 + c.t * (1536 + 512) * 2 + 2 * c.t * 4 -
                          c.tg * c.rope * 2));
  }

  TEST_CASE("MLA's column-parallel down projections (before Megatron-Core 0.14) keep the gathered q latent") {
    // No recompute: the up projections' fused norms save their inputs, q's a view that keeps the gathered
    // [tg, 1536] alive and kv's an SP-shard copy [t, 512], where 0.14+ saves the down projections' outputs
    // on the shard [t, 1536 + 576]. mla_up_proj keeps the checkpoint's inputs: the gathered q latent, the kv
    // copy and the gathered [tg, 576] whose view the rope key is, where 0.14+ keeps the down projections'
    // outputs [t, 1536 + 576] and the gathered rope key [tg, 64].
    Dsv3 c;
    const double ql = 1536, kvl = 512;
    Plan col = c.p;
    col.attention.mla_down_proj = MlaDownProj::kColumnParallel;
    CHECK(saved(c.m, col, c.st, c.moe, 0) - saved(c.m, c.p, c.st, c.moe, 0) ==
          doctest::Approx((c.tg * ql + c.t * kvl) * 2 - c.t * (ql + kvl + c.rope) * 2));
    CHECK(saved(c.m, col, c.st, c.moe, kRecomputeMlaUpProj) -
              saved(c.m, c.p, c.st, c.moe, kRecomputeMlaUpProj) ==
          doctest::Approx((c.tg * ql + c.t * kvl + c.tg * (kvl + c.rope)) * 2 -
                          (c.t * (ql + kvl + c.rope) * 2 + c.tg * c.rope * 2)));
    // The down projections' weights [h, 1536 + 576] are column shards (tp 2), not whole on every TP rank:
    // 6 B of weight and gradient per parameter, 12 B of optimizer state over the 128 / (2 pp) = dp ranks.
    const HardwareProfile hw = io::load_hardware("h100-sxm").value();
    c.p.pipeline.pp = 16;
    col.pipeline.pp = 16;
    const auto own = cost::memory_per_gpu(c.m, c.p, hw, c.st, {{1}}, 1.0);
    const auto old = cost::memory_per_gpu(c.m, col, hw, c.st, {{1}}, 1.0);
    const double layers = 4;  // 61 layers over 16 stages: the first holds 4 (3 of them dense)
    const double halved = layers * c.h * (ql + kvl + c.rope) / 2;
    CHECK(own.weights + own.gradients - old.weights - old.gradients == doctest::Approx(6 * halved));
  }

  TEST_CASE("recomputing mlp frees a dense layer's MLP and leaves MoE layers alone") {
    // Dense SwiGLU MLP under TP: fc1's ln_out shard t h 2, fc1 output tg 2F 2, activation output tg F 2.
    Dsv3 c;
    CHECK(saving(c.m, c.p, c.st, c.dense, kRecomputeMlp) ==
          doctest::Approx(c.t * c.h * 2 + c.tg * 2 * c.fd * 2 + c.tg * c.fd * 2));
    CHECK(saving(c.m, c.p, c.st, c.moe, kRecomputeMlp) == doctest::Approx(0.0));
  }

  TEST_CASE("recomputing moe frees the whole MoE layer but its input") {
    // Router state and permute maps t E (13 + 8), FC1 input rows h 2, FC1 output rows 2F 2 + probs rows 4,
    // FC2 input rows F 2, shared expert tg (2 Fs + Fs) 2; the pre-MLP norm output stays as the input.
    Dsv3 c;
    const double expected = c.t * c.experts * 21 + c.rows * c.h * 2 + c.rows * 2 * c.f * 2 + c.rows * 4 +
                            c.rows * c.f * 2 + c.tg * 3 * c.fs * 2;
    CHECK(saving(c.m, c.p, c.st, c.moe, kRecomputeMoe) == doctest::Approx(expected));
  }

  TEST_CASE("recomputing shared_experts frees the shared expert's fc1 and activation outputs") {
    // tg x 2 Fs x 2 (fc1 output) + tg x Fs x 2 (activation output), Fs = 2048 / tp.
    Dsv3 c;
    CHECK(saving(c.m, c.p, c.st, c.moe, kRecomputeSharedExperts) == doctest::Approx(c.tg * 3 * c.fs * 2));
  }

  TEST_CASE(
      "the shared-expert overlap keeps the shared experts' gathered input, and recomputing them frees it") {
    // Megatron's shared FC1 has no parallel mode under --moe-shared-expert-overlap
    // (shared_experts.py:92-101): it keeps the tg x h input the shared stream gathered, 2 B per element in
    // BF16.
    Dsv3 c;
    const auto layer = [&](const Plan& p) {
      return cost::layer_activations_under(c.m, p, c.st, c.moe, 1.0, Recompute::kNone, 0).total();
    };
    const double in_line = layer(c.p);
    Plan overlapped = c.p;
    overlapped.overlap.shared_experts = true;
    CHECK(layer(overlapped) - in_line == doctest::Approx(c.tg * c.h * 2));
    // The moe module recomputes the whole layer from its input either way.
    CHECK(saving(c.m, overlapped, c.st, c.moe, kRecomputeMoe) -
              saving(c.m, c.p, c.st, c.moe, kRecomputeMoe) ==
          doctest::Approx(c.tg * c.h * 2));
  }

  TEST_CASE("padded to capacity, the experts keep their capacity's rows") {
    // DeepSeek-V3's t k = 16384 rows over 256 experts: capacity 64 x cf per expert and source. At cf 1.5,
    // 96 per expert, 1.5x the rows the experts' tensors hold at cf 1 (FC1 input, FC1 output and probs, FC2
    // input: rows (h 2 + 2 f 2 + 4 + f 2)).
    Dsv3 c;
    const auto layer = [&](const Plan& p) {
      return cost::layer_activations_under(c.m, p, c.st, c.moe, 1.0, Recompute::kNone, 0).total();
    };
    Plan p = c.p;
    p.routing.capacity_factor = 1.0;
    p.routing.pad_to_capacity = true;
    const double at_one = layer(p);
    CHECK(at_one == doctest::Approx(layer(c.p)));  // E divides t k: exactly the dropless rows
    p.routing.capacity_factor = 1.5;
    CHECK(layer(p) - at_one ==
          doctest::Approx(0.5 * c.rows * (c.h * 2 + 2 * c.f * 2 + 4 + c.f * 2)).epsilon(1e-6));
  }

  TEST_CASE("full recompute keeps one input per group of layers (uniform) or per leading layer (block)") {
    // Mixtral-8x7B, one stage of 32 layers, one micro-batch in flight, t = 4096, input t h 2 B. With W the
    // bytes one layer saves without recompute and H the head's (final norm, logits):
    //   uniform N = 4: 8 inputs + the working set of a recomputed group of 4 layers, 4 W, + H
    //   block N = 4:   4 inputs + 28 W + one layer's working set W + H
    const ModelSpec m = io::load_model("mixtral-8x7b").value();
    const HardwareProfile hw = io::load_hardware("h100-sxm").value();
    const StackProfile st = io::load_stack("megatron-core").value();
    Plan p = one_node_plan(8);
    const double w = cost::layer_activations_under(m, p, st, m.layers[0], 1.0, Recompute::kNone, 0).total();
    const double head = cost::head_activations(m, p, st, 1.0);
    const double input = 4096.0 * 4096 * 2;
    p.recompute = Recompute::kFull;
    p.recompute_num_layers = 4;
    p.recompute_method = RecomputeMethod::kUniform;
    CHECK(cost::memory_per_gpu(m, p, hw, st, {{1}}, 1.0).activations ==
          doctest::Approx(8 * input + 4 * w + head));
    p.recompute_method = RecomputeMethod::kBlock;
    CHECK(cost::memory_per_gpu(m, p, hw, st, {{1}}, 1.0).activations ==
          doctest::Approx(4 * input + 28 * w + w + head));
  }

  TEST_CASE("weights and optimizer of a dense model match Megatron's estimator") {
    // Megatron's theoretical_memory_usage.py (megatron_stack_facts.md §4.2), distributed optimizer: bytes per
    // parameter 6 + 12 / dp on the most loaded shard, tp-sharded / (pp tp) + embedding / tp (+ output / tp
    // untied at pp = 1) + replicated / pp. A Llama-3-8B-like GQA model, H = 4096, F = 14336, 32 layers, 32
    // heads over 8 KV groups, V = 128256, untied, on tp = 2, dp = 4:
    //   sharded per layer = 2 H^2 (1 + 8/32) + 3 H F, replicated per layer = 2 H (norms), + H (final norm)
    // The estimator at older commits divides the norms by tp as well (a few MB here); Megatron replicates
    // them over TP, as counted here.
    ModelSpec m;
    m.name = "dense-8b";
    m.hidden = 4096;
    m.vocab = 128256;
    m.dense_ffn = 14336;
    m.attention = {AttentionKind::kGqa, 32, 8, 128, {}, false, false, QkNorm::kNone, false, 1, false, {}};
    m.layers.assign(32, LayerSpec{false, 0, true});
    const HardwareProfile hw = io::load_hardware("h100-sxm").value();
    const StackProfile st = io::load_stack("megatron-core").value();
    Plan p = one_node_plan(1);
    p.attention.tp = 2;
    const double H = 4096, F = 14336, V = 128256, L = 32, tp = 2, dp = 4;
    const double shard = L * (2 * H * H * (1 + 8.0 / 32) + 3 * H * F) / tp + 2 * V * H / tp + L * 2 * H + H;
    const auto b = cost::memory_per_gpu(m, p, hw, st, {{1}}, 1.0);
    CHECK(b.weights + b.gradients + b.optimizer == doctest::Approx((6 + 12 / dp) * shard));
  }

  TEST_CASE("weights and optimizer of a MoE model match Megatron's estimator, experts over expert-DP") {
    // Mixtral-8x7B on 8 GPUs, ep = 8, tp = 1: dp = 8, expert-dp = world / (etp ep pp) = 1 (estimator,
    // megatron_stack_facts.md §4.2). Non-expert: 32 (2 H^2 (1 + 8/32) + 2 H + H E) + 2 V H + H at 6 + 12/8 B;
    // experts: 32 x 3 H F E / 8 at 6 + 12/1 B. The estimator at older commits has no router term (H E).
    const ModelSpec m = io::load_model("mixtral-8x7b").value();
    const HardwareProfile hw = io::load_hardware("h100-sxm").value();
    const StackProfile st = io::load_stack("megatron-core").value();
    Plan p = one_node_plan(8);
    const double H = 4096, F = 14336, V = 32000, E = 8, L = 32;
    const double dense = L * (2 * H * H * (1 + 8.0 / 32) + 2 * H + H * E) + 2 * V * H + H;
    const double experts = L * 3 * H * F * E / 8;
    const auto b = cost::memory_per_gpu(m, p, hw, st, {{1}}, 1.0);
    CHECK(b.weights + b.gradients + b.optimizer ==
          doctest::Approx((6 + 12.0 / 8) * dense + (6 + 12.0) * experts));
    // Where this model departs from the estimator, by design: --grad-reduce-in-bf16 halves the gradient
    // buffer (4 -> 2 B), and FP8 adds TE's cached FP8 weight and transpose (2 B per GEMM weight: all but the
    // embeddings, norms and router).
    const double params = dense + experts;
    p.compression.grad_sync = GradSync::kBf16ReduceScatter;
    CHECK(cost::memory_per_gpu(m, p, hw, st, {{1}}, 1.0).gradients == doctest::Approx(2 * params));
    p.precision = Precision::kFp8;
    p.fp8_recipe = Fp8Recipe::kTensorwise;
    const double gemm = params - 2 * V * H - (L * (2 * H + H * E) + H);
    CHECK(cost::memory_per_gpu(m, p, hw, st, {{1}}, 1.0).weights == doctest::Approx(2 * params + 2 * gemm));
    // FP8 parameters (--fp8-param-gather): a GEMM weight is its FP8 data and the transpose made after each
    // gather, 1 + 1 B in place of the BF16 copy, with no cache beside it; the other parameters stay BF16.
    // Blockwise scaling keeps its fp32 scales per 128x128 block of the data and of the transpose.
    p.data.fp8_param_gather = true;
    CHECK(cost::memory_per_gpu(m, p, hw, st, {{1}}, 1.0).weights == doctest::Approx(2 * params));
    p.fp8_recipe = Fp8Recipe::kBlockwise;
    CHECK(cost::memory_per_gpu(m, p, hw, st, {{1}}, 1.0).weights ==
          doctest::Approx(2 * params + gemm * 2 * 4.0 / (128 * 128)));
  }

  TEST_CASE("ZeRO stages shard optimizer states, then gradients, then weights, by bytes per parameter") {
    // Mixtral-8x7B on 8 GPUs, ep = 8, one stage: bf16 weights 2 B, fp32 grads 4 B, Adam + master 12 B.
    const ModelSpec m = io::load_model("mixtral-8x7b").value();
    const HardwareProfile hw = io::load_hardware("h100-sxm").value();
    const StackProfile st = io::load_stack("megatron-core").value();
    Plan p = one_node_plan(8);
    const ParamCounts c = count_params(m);
    const double experts = c.total.routed_experts / 8;  // each rank holds 1 of 8 experts per layer
    const double dense = c.total.total() - c.total.routed_experts;  // replicated on all 8 (dp = 8, edp = 1)
    auto mem = [&](int64_t zero) {
      p.data.zero = zero;
      return cost::memory_per_gpu(m, p, hw, st, {{1}}, 1.0);
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
    // Megatron-FSDP keeps the embedding and the output layer (32000 x 4096 each, untied) gathered all step
    // (they are in no FSDP unit); moerun's stack shards them as any parameter.
    const auto z3_moerun = cost::memory_per_gpu(m, p, hw, io::load_stack("moerun").value(), {{1}}, 1.0);
    CHECK(z3.weights - z3_moerun.weights == doctest::Approx(2.0 * 2 * 32000 * 4096 * 7 / 8));
  }

  TEST_CASE("1F1B keeps more micro-batches in flight on early stages") {
    const ModelSpec m = io::load_model("mixtral-8x7b").value();
    const HardwareProfile hw = io::load_hardware("h100-sxm").value();
    const StackProfile st = io::load_stack("megatron-core").value();
    Plan p;
    p.gpus = 32;
    p.seq_len = 4096;
    p.global_batch = 64;
    p.experts.ep = 8;
    p.pipeline.pp = 4;
    const auto b = cost::memory_per_gpu(m, p, hw, st, {{4}, {3}, {2}, {1}}, 1.0);
    CHECK(b.stage == 0);
    CHECK(b.in_flight == 4);
  }

  TEST_CASE("the last virtual stage keeps the head's logits and each MTP module") {
    // DeepSeek-V3, tp = 2: t = 2048, tg = 4096, V / tp = 64640. Head: final norm input t h 2 + rsigma t 4 +
    // output-layer input t h 2 + the logits TE's loss keeps, bf16, tg V/tp 2 (Megatron's unfused loss: its
    // fp32 softmax, tg V/tp 4). One MTP module: its embedding t h 2, the [t, 2h] concatenation 2 t h 2, one
    // MoE decoder layer and its own head.
    Dsv3 c;
    const double head = c.t * c.h * 2 + c.t * 4 + c.t * c.h * 2 + c.tg * 64640 * 2;
    const double layer = cost::layer_activations(c.m, c.p, c.st, c.moe, 1.0).total();
    CHECK(cost::head_activations(c.m, c.p, c.st, 1.0) ==
          doctest::Approx(head + c.t * c.h * 2 + 2 * c.t * c.h * 2 + layer + head));
    for (CrossEntropy ce : {CrossEntropy::kUnfused, CrossEntropy::kNative}) {
      Plan fp32_loss = c.p;
      fp32_loss.cross_entropy = ce;
      CHECK(cost::head_activations(c.m, fp32_loss, c.st, 1.0) - cost::head_activations(c.m, c.p, c.st, 1.0) ==
            doctest::Approx(2 * c.tg * 64640 * 2));  // the main head's and the MTP head's
    }
    // The MTP module's layer is counted once: removing it takes exactly its part of the head away.
    const HardwareProfile hw = io::load_hardware("h100-sxm").value();
    c.p.pipeline.pp = 2;
    c.p.pipeline.layers_per_stage = {60, 1};
    const auto last = [&] { return cost::memory_per_stage(c.m, c.p, hw, c.st, {{1}, {1}}, 1.0).back(); };
    const cost::MemoryBreakdown with_mtp = last();
    c.m.mtp_layers = 0;
    CHECK(with_mtp.activations - last().activations ==
          doctest::Approx(c.t * c.h * 2 + 2 * c.t * c.h * 2 + layer + head));
  }

  TEST_CASE("DeepEP's buffer is the larger NVL and RDMA hint of its dispatch and combine configs") {
    // DeepEP csrc/config.hpp at EP 64 (8 nodes of 8), 20 SMs -> 10 channels, hidden bytes 7168 x 2, configs
    // (32, 288, 8, 128) / (1, 288, 8, 128); per token of metadata 8 + 128 x (8 + 4 + 4):
    //   NVL  = 10 x 8 x (2 x 8 + 3) x 4 + 10 x 8 x 288 x (14336 + 2056)
    //   RDMA = 10 x 8 x 18 x 2 x 4 + 10 x 8 x 128 x 2 x (14336 + 2056 + 16) + 1 MiB
    Dsv3 c;
    c.st = io::load_stack("megatron-core-deepep").value();
    const HardwareProfile hw = io::load_hardware("h100-sxm").value();
    const double nvl = 10.0 * 8 * 19 * 4 + 10.0 * 8 * 288 * (14336 + 2056);
    const double rdma = 10.0 * 8 * 18 * 2 * 4 + 10.0 * 8 * 128 * 2 * (14336 + 2056 + 16) + 1048576;
    CHECK(cost::dispatcher_buffer_bytes(c.m, c.p, c.st, hw, 1.0) == doctest::Approx(nvl + rdma));
    // Megatron's NCCL all-to-all dispatcher keeps no buffer of its own (NCCL's are in the stack's reserve).
    c.st = io::load_stack("megatron-core").value();
    CHECK(cost::dispatcher_buffer_bytes(c.m, c.p, c.st, hw, 1.0) == 0.0);
  }

  TEST_CASE("HybridEP's buffers hold the worst case of every token of the group on one rank") {
    // Qwen3-30B-A3B, EP 16 over two nodes of 8, T = 4096 tokens, h = 2048, 8 local experts: a row is
    // 2 h + 4 x 8 x 8 B; combine T x 16 rows + 2 T (2 - 1) staging, dispatch again T x 16 + T staging.
    const ModelSpec m = io::load_model("qwen3-30b-a3b").value();
    const HardwareProfile hw = io::load_hardware("h100-sxm").value();
    const StackProfile st = io::load_stack("megatron-core-hybridep").value();
    Plan p;
    p.gpus = 16;
    p.seq_len = 4096;
    p.global_batch = 16;
    p.experts.ep = 16;
    p.experts.dispatch = Dispatch::kDedup;
    const double row = 2 * 2048 + 4.0 * 8 * 8, T = 4096;
    CHECK(cost::dispatcher_buffer_bytes(m, p, st, hw, 1.0) ==
          doctest::Approx(2 * T * 16 * row + 3 * T * row));
  }

  TEST_CASE("a plan fits on the low end of the range and is tight when the high end does not fit") {
    // The stack's reserve and fragmentation give [allocated + r_lo + f_lo a, allocated + r_hi + f_hi a].
    const ModelSpec m = io::load_model("mixtral-8x7b").value();
    HardwareProfile hw = io::load_hardware("h100-sxm").value();
    const StackProfile st = io::load_stack("megatron-core").value();
    Plan p = one_node_plan(8);
    auto b = cost::memory_per_gpu(m, p, hw, st, {{1}}, 1.0);
    const double a = b.allocated();
    CHECK(b.total_low() ==
          doctest::Approx(a + st.memory.reserve_bytes.value + st.memory.fragmentation.value * a));
    CHECK(b.total_high() ==
          doctest::Approx(a + st.memory.reserve_bytes_high.value + st.memory.fragmentation_high.value * a));
    CHECK(b.total() == doctest::Approx(0.5 * (b.total_low() + b.total_high())));
    b.capacity = 0.5 * (b.total_low() + b.total_high());
    CHECK(b.fits());
    CHECK(b.tight());
    b.capacity = b.total_high();
    CHECK(b.fits());
    CHECK_FALSE(b.tight());
    b.capacity = 0.99 * b.total_low();
    CHECK_FALSE(b.fits());
    CHECK_FALSE(b.tight());
  }

  TEST_CASE(
      "an encoder-decoder's decoder layer saves its self-attention on the targets plus cross-attention") {
    // Switch-Base-64 at tp 2, b = 2, 512 inputs: a decoder layer saves what a decoder-only layer saves for
    // the 128 targets (t = 128 per rank, tg = 256), plus its cross-attention's block input and rsigma, its
    // norm output, q [tg, 6 x 64], k and v over the gathered inputs [1024, 2 x 6 x 64], out and the fp32
    // softmax stats [tg, 6].
    const ModelSpec m = io::load_model("switch-base-64").value();
    const StackProfile st = io::load_stack("megatron-core").value();
    Plan p = one_node_plan(8);
    p.attention.tp = 2;
    p.seq_len = 512;
    p.micro_batch = 2;
    p.global_batch = 16;
    for (const size_t i : {size_t{12}, size_t{13}}) {  // dense, MoE
      const LayerSpec dec = m.layers[i];
      LayerSpec plain = dec;
      plain.role = LayerRole::kDecoderOnly;
      Plan at_targets = p;
      at_targets.seq_len = 128;
      const double self = cost::layer_activations(m, at_targets, st, plain, 1.0).total();
      const double t = 128, tg = 256, h = 768, heads = 6, hd = 64;
      const double cross = t * h * 2 + t * 4 + t * h * 2 + (tg * heads * hd + 1024 * 2 * heads * hd) * 2 +
                           tg * heads * hd * 2 + tg * heads * 4;
      CHECK(cost::layer_activations(m, p, st, dec, 1.0).total() == doctest::Approx(self + cross));
    }
    // Encoder layers save on the 512 inputs, as a decoder-only layer of the same length would.
    LayerSpec enc_plain = m.layers[1];
    enc_plain.role = LayerRole::kDecoderOnly;
    CHECK(cost::layer_activations(m, p, st, m.layers[1], 1.0).total() ==
          doctest::Approx(cost::layer_activations(m, p, st, enc_plain, 1.0).total()));
  }
}
