// Lowering: per-layer communication volumes against direct per-GPU byte counts (megascale-moe.md §3.3), the
// pipeline order, and the structure of the graph (every op runs, backward mirrors forward); the ops each
// stack's token dispatcher runs and their volumes (Megatron alltoall / allgather, DeepEP / HybridEP against
// the volumes DeepEP's tests imply); Megatron's recompute modules and MegaScale-MoE's SAR; combined 1F1B;
// the kernels a stack runs beside the GEMMs (router, FP8 casts, QK-norm, MTP).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "simulator/core/model_stats.h"
#include "simulator/core/units.h"
#include "simulator/cost/collective.h"
#include "simulator/io/hardware_loader.h"
#include "simulator/io/model_loader.h"
#include "simulator/io/stack_loader.h"
#include "simulator/workload/lower.h"

using namespace moeplan;

namespace {

// A plain GQA model of one MoE layer: h = 4096, 32 heads, m = heads / KV heads, k of 8 experts.
// One layer of Internal-352B with routed experts only, as MegaScale-MoE's volume formulas count it.
ModelSpec one_layer(int64_t kv_heads, int64_t top_k) {
  ModelSpec m = io::load_model("internal-352b").value();
  m.moe.num_shared_experts = 0;
  m.moe.shared_expert_ffn = 0;
  m.layers.resize(1);
  m.attention.num_kv_heads = kv_heads;
  m.moe.num_experts = 8;
  m.moe.top_k = top_k;
  return m;
}

Plan one_node_plan() {
  Plan p;
  p.gpus = 8;
  p.seq_len = 8192;
  p.global_batch = 1;
  p.micro_batch = 1;
  p.data.zero = 0;
  return p;
}

// Elements one GPU receives from other GPUs in the forward pass of layer 0, by group:
// bytes * busbw_factor / 2 bytes per element for each collective (an all-gather of an M-byte output receives
// M (n-1)/n; a reduce-scatter of an M-byte input sends and receives M (n-1)/n; an all-to-all of M bytes M
// (n-1)/n).
std::map<CommGroup, double> received_elements(const OpGraph& g) {
  std::map<CommGroup, double> out;
  for (const Op& op : g.ops) {
    if (op.layer != 0 || op.phase != Phase::kForward || op.micro_batch != 0) continue;
    if (op.kind != OpKind::kCollective && op.kind != OpKind::kFusedGemmComm) continue;
    out[op.comm.group] += op.comm.bytes * cost::busbw_factor(op.comm.collective, op.comm.group_size) / 2.0;
  }
  return out;
}

std::string name_of_op(const Op& op) {
  return kOpNames[op.name];
}

// Names of the ops of one layer, micro-batch and phase, in emission order.
std::vector<std::string> names(const OpGraph& g, int32_t layer, int32_t mb, Phase phase) {
  std::vector<std::string> out;
  for (const Op& op : g.ops) {
    if (op.layer == layer && op.micro_batch == mb && op.phase == phase) out.push_back(name_of_op(op));
  }
  return out;
}
std::multiset<std::string> name_set(const OpGraph& g, int32_t layer, int32_t mb, Phase phase) {
  const auto v = names(g, layer, mb, phase);
  return {v.begin(), v.end()};
}

// The ops of a name in layer `layer` (any layer when -1), phase and micro-batch 0 (and GEMM part).
std::vector<const Op*> ops_named(const OpGraph& g, OpName n, int32_t layer = 0, Phase phase = Phase::kForward,
                                 GemmPart part = GemmPart::kNone) {
  std::vector<const Op*> out;
  for (const Op& op : g.ops) {
    if (op.name == static_cast<uint16_t>(n) && (layer < 0 || op.layer == layer) && op.phase == phase &&
        op.part == part && (op.micro_batch == 0 || op.micro_batch == -1))
      out.push_back(&op);
  }
  return out;
}
const Op& the_op(const OpGraph& g, OpName n, int32_t layer = 0, Phase phase = Phase::kForward,
                 GemmPart part = GemmPart::kNone) {
  const auto v = ops_named(g, n, layer, phase, part);
  REQUIRE_MESSAGE(v.size() == 1, kOpNames[static_cast<size_t>(n)] << ": " << v.size() << " ops");
  return *v.front();
}

// The ops of a name outside the layers (the embedding, the head, the loss: layer -1) of micro-batch 0.
std::vector<const Op*> end_ops(const OpGraph& g, OpName n, Phase phase = Phase::kForward,
                               GemmPart part = GemmPart::kNone) {
  std::vector<const Op*> out;
  for (const Op* op : ops_named(g, n, -1, phase, part)) {
    if (op->layer == -1) out.push_back(op);
  }
  return out;
}
const Op& the_end_op(const OpGraph& g, OpName n, Phase phase = Phase::kForward,
                     GemmPart part = GemmPart::kNone) {
  const auto v = end_ops(g, n, phase, part);
  REQUIRE_MESSAGE(v.size() == 1, kOpNames[static_cast<size_t>(n)] << ": " << v.size() << " ops");
  return *v.front();
}

// Whether `op` waits for `on` directly.
bool depends(const OpGraph& g, const Op& op, const Op& on) {
  const auto d = g.deps_of(op);
  return std::find(d.begin(), d.end(), on.id) != d.end();
}

// Lowering as a stack runs it (its dispatcher, host waits and kernel counts) on H100 nodes of 8 GPUs.
LoweringOptions stack_options(const char* stack) {
  static const HardwareProfile hw = io::load_hardware("h100-sxm").value();
  const StackProfile s = io::load_stack(stack).value();
  return lowering_options(hw, s);
}

// The first `layers` layers of Mixtral-8x7B: h = 4096, 32 heads, 8 KV heads, 8 experts, top-2, softmax
// router.
ModelSpec mixtral(int64_t layers) {
  ModelSpec m = io::load_model("mixtral-8x7b").value();
  m.layers.resize(static_cast<size_t>(layers));
  return m;
}

// EP over all `ranks` GPUs with node-deduplicated dispatch, 4096 tokens per rank, one micro-batch per step.
Plan dedup_plan(int64_t ranks) {
  Plan p;
  p.gpus = ranks;
  p.seq_len = 4096;
  p.global_batch = ranks;
  p.experts.ep = ranks;
  p.experts.dispatch = Dispatch::kDedup;
  return p;
}

// One node of 8 GPUs, 4096 tokens per micro-batch and rank (tp = 1), one micro-batch per step.
Plan node_plan(int64_t ep, int64_t etp = 1) {
  Plan p;
  p.gpus = 8;
  p.seq_len = 4096;
  p.global_batch = 8;
  p.experts.ep = ep;
  p.experts.etp = etp;
  p.data.zero = 1;
  return p;
}

// 16 GPUs: tp 2, ep 8, two pipeline stages (4 attention replicas each), 4096 tokens per sequence.
Plan tp2_pp2_plan(int64_t global_batch) {
  Plan p;
  p.gpus = 16;
  p.seq_len = 4096;
  p.global_batch = global_batch;
  p.attention.tp = 2;
  p.experts.ep = 8;
  p.pipeline.pp = 2;
  return p;
}

// Llama 4 Maverick cut to a dense layer and an MoE layer with one shared expert.
ModelSpec llama4_two_layers() {
  ModelSpec m = io::load_model("llama-4-maverick").value();
  m.layers.resize(2);
  return m;
}

// One node, EP 8, TP 2 with TE's userbuffers, 4 sequences.
Plan tp2_userbuffers_plan() {
  Plan q = node_plan(8);
  q.attention.tp = 2;
  q.global_batch = 4;
  q.overlap.tp_comm = true;
  return q;
}

// DeepSeek-V3 cut to `dense` dense layers and `moe` MoE layers (h = 7168, MLA, 256 experts in 8 groups,
// top-8 within the best 4 groups, one shared expert), without MTP unless asked.
ModelSpec deepseek_v3(int64_t dense, int64_t moe, int64_t mtp = 0) {
  ModelSpec m = io::load_model("deepseek-v3").value();
  std::vector<LayerSpec> layers;
  for (int64_t i = 0; i < dense; ++i) layers.push_back(m.layers[0]);
  for (int64_t i = 0; i < moe; ++i) layers.push_back(m.layers[3]);
  m.layers = layers;
  m.mtp_layers = mtp;
  return m;
}

// doctest::Approx compares relatively only with scale 0 (its default scale 1 is absolute below 1).
doctest::Approx rel(double value) {
  return doctest::Approx(value).scale(0);
}

// |value - printed| within half a unit of the printed number's last of `decimals` digits.
bool rounds_to(double value, double printed, int decimals = 3) {
  return std::abs(value - printed) <= 0.5 * std::pow(10.0, -decimals) + 1e-12;
}

}  // namespace

TEST_SUITE("workload") {
  TEST_CASE("TP attention moves 2 b s h (n-1)/n elements per GPU per layer (MegaScale-MoE Eq. 1)") {
    const ModelSpec m = one_layer(8, 2);
    Plan p = one_node_plan();
    p.attention.tp = 8;
    p.experts.ep = 8;
    const auto r = received_elements(lower(m, p, {}));
    const double bsh = 8192.0 * 4096.0, n = 8;
    CHECK(r.at(CommGroup::kTp) == doctest::Approx(2 * bsh * (n - 1) / n));
  }

  TEST_CASE("Ulysses SP moves b s h (2 + 2/m)(n-1)/n^2 per GPU: half of the paper's Eq. 2") {
    // q,k,v all-to-all of [b, s/n, h(1 + 2/m)] plus the output all-to-all of [b, s, h/n]. MegaScale-MoE's
    // Eq. 2 gives 2 b s h (n-1)/n (2 + 2/m)/n, twice the direct count (megascale-moe.md §3.3).
    for (int64_t kv : {8, 16}) {
      const ModelSpec m = one_layer(kv, 2);
      Plan p = one_node_plan();
      p.attention.sp = 8;
      p.experts.ep = 8;
      const auto r = received_elements(lower(m, p, {}));
      const double bsh = 8192.0 * 4096.0, n = 8, mm = 32.0 / static_cast<double>(kv);
      CHECK(r.at(CommGroup::kSp) == doctest::Approx(bsh * (2 + 2 / mm) * (n - 1) / (n * n)));
      const double eq2 = 2 * bsh * (n - 1) / n * (2 + 2 / mm) / n;
      CHECK(r.at(CommGroup::kSp) == doctest::Approx(eq2 / 2));
    }
  }

  TEST_CASE("EP all-to-all moves 2k b s h (n-1)/n^2 per GPU (MegaScale-MoE Eq. 3)") {
    for (int64_t k : {1, 2, 3}) {
      const ModelSpec m = one_layer(8, k);
      Plan p = one_node_plan();
      p.attention.sp = 8;
      p.experts.ep = 8;
      const auto r = received_elements(lower(m, p, {}));
      const double bsh = 8192.0 * 4096.0, n = 8;
      CHECK(r.at(CommGroup::kEp) == doctest::Approx(2.0 * static_cast<double>(k) * bsh * (n - 1) / (n * n)));
    }
  }

  TEST_CASE("all-gather dispatch moves the TP volume whatever top-k is") {
    // all-gather of [b, s, h] + reduce-scatter of [b, s, h]: 2 b s h (n-1)/n, the bound of the adaptive rule.
    const ModelSpec m = one_layer(8, 3);
    Plan p = one_node_plan();
    p.attention.sp = 8;
    p.experts.ep = 8;
    p.experts.dispatch = Dispatch::kAllGather;
    const auto r = received_elements(lower(m, p, {}));
    const double bsh = 8192.0 * 4096.0, n = 8;
    CHECK(r.at(CommGroup::kEp) == doctest::Approx(2 * bsh * (n - 1) / n));
  }

  TEST_CASE("memory-bound ops state the tensor their kernel walks, consistent with their bytes") {
    // Qwen3-30B-A3B (QK-norm, RoPE, SwiGLU experts, top 8 of 128) with TP 2 and EP 4, on moerun's stack and
    // on Megatron-Core's: each forward norm, activation, RoPE, router, permute and loss names its rows and
    // columns, and its bytes are the lowering's per-element count over exactly that tensor.
    const ModelSpec m = io::load_model("qwen3-30b-a3b").value();
    Plan p;
    p.gpus = 8;
    p.seq_len = 4096;
    p.global_batch = 8;
    p.attention.tp = 2;
    p.experts.ep = 4;
    for (const char* stack : {"moerun", "megatron-core"}) {
      CAPTURE(stack);
      const OpGraph g = lower(m, p, stack_options(stack));
      const int64_t t = p.seq_len / p.attention.tp;  // tokens per rank of a micro-batch (sequence parallel)
      std::map<OpName, int> stated;
      for (const Op& op : g.ops) {
        if (op.kind != OpKind::kMemoryBound || op.phase != Phase::kForward) continue;
        const auto name = static_cast<OpName>(op.name);
        const double rows = static_cast<double>(op.gemm.m), cols = static_cast<double>(op.gemm.n);
        const double bf16 = 2.0;
        switch (name) {
          case OpName::kAttnNorm:
          case OpName::kFfnNorm:
            CHECK(op.gemm.m == t);
            CHECK(op.gemm.n == m.hidden);
            CHECK(op.hbm_bytes == rel(3.0 * rows * cols * bf16));
            break;
          case OpName::kQkNorm:  // one row per head of q and k
            CHECK(op.gemm.n == m.attention.head_dim);
            CHECK(op.hbm_bytes == rel(2.0 * rows * cols * bf16));
            break;
          case OpName::kRope:  // q and k heads, rotated in place
            CHECK(op.gemm.k == m.attention.head_dim);
            CHECK(op.gemm.n % op.gemm.k == 0);
            CHECK(op.hbm_bytes == rel(2.0 * rows * cols * bf16));
            break;
          case OpName::kAct:
          case OpName::kExpertAct:  // SwiGLU: [rows, 2f] in, [rows, f] out
            CHECK(op.gemm.n == (name == OpName::kAct ? m.dense_ffn / p.attention.tp : m.moe.expert_ffn));
            CHECK(op.hbm_bytes == rel(3.0 * rows * cols * bf16));
            break;
          case OpName::kRouterTopk:
            CHECK(op.gemm.m == t);
            CHECK(op.gemm.n == m.moe.num_experts);
            CHECK(op.gemm.k == m.moe.top_k);
            CHECK(op.hbm_bytes == rel(13.0 * rows * cols));
            break;
          case OpName::kPermute:  // each token's k copies: read and written once
            CHECK(op.gemm.k == m.moe.top_k);
            CHECK(op.hbm_bytes == rel(2.0 * rows * cols * static_cast<double>(op.gemm.k) * bf16));
            break;
          case OpName::kLoss:
            CHECK(op.gemm.n == m.vocab / p.attention.tp);
            break;
          case OpName::kResidualAdd:
            CHECK(op.hbm_bytes == rel(3.0 * rows * cols * bf16));
            break;
          default:
            continue;
        }
        CHECK(op.gemm.m > 0);
        CHECK(op.gemm.n > 0);
        ++stated[name];
      }
      for (OpName n : {OpName::kAttnNorm, OpName::kFfnNorm, OpName::kQkNorm, OpName::kRope,
                       OpName::kExpertAct, OpName::kRouterTopk, OpName::kPermute, OpName::kLoss})
        CHECK_MESSAGE(stated[n] > 0, kOpNames[static_cast<size_t>(n)]);
    }
  }

  TEST_CASE(
      "the lowering records each stage's id range, holding exactly that stage's ops, under each schedule") {
    ModelSpec m = io::load_model("mixtral-8x7b").value();
    m.layers.resize(4);
    for (const Schedule schedule : {Schedule::k1F1B, Schedule::kInterleaved1F1B, Schedule::kDualPipeV}) {
      CAPTURE(static_cast<int>(schedule));
      Plan p = tp2_pp2_plan(16);
      p.pipeline.schedule = schedule;
      if (schedule != Schedule::k1F1B) p.pipeline.vpp = 2;
      const OpGraph g = lower(m, p, {});
      REQUIRE(g.stage_first.size() == static_cast<size_t>(g.num_stages) + 1);
      CHECK(g.stage_first.front() == 0);
      CHECK(g.stage_first.back() == g.ops.size());
      for (int s = 0; s < g.num_stages; ++s) {
        CAPTURE(s);
        const auto first = g.stage_first[static_cast<size_t>(s)],
                   end = g.stage_first[static_cast<size_t>(s) + 1];
        CHECK(first < end);
        int wrong = 0;
        for (uint32_t i = first; i < end; ++i) wrong += g.ops[i].stage == s ? 0 : 1;
        CHECK(wrong == 0);
      }
    }
  }

  TEST_CASE("every forward collective has a backward transpose and every GEMM a dgrad and a wgrad") {
    const ModelSpec m = io::load_model("mixtral-8x7b").value();
    const Plan p = tp2_pp2_plan(16);
    const OpGraph g = lower(m, p, {});
    int fwd_gemm = 0, dgrad = 0, wgrad = 0, fwd_coll = 0, bwd_coll = 0;
    for (const Op& op : g.ops) {
      if (op.layer < 0) continue;
      if (op.kind == OpKind::kGemm || op.kind == OpKind::kGroupedGemm) {
        if (op.phase == Phase::kForward) ++fwd_gemm;
        if (op.part == GemmPart::kDgrad) ++dgrad;
        if (op.part == GemmPart::kWgrad) ++wgrad;
      }
      if (op.kind == OpKind::kCollective &&
          (op.comm.group == CommGroup::kTp || op.comm.group == CommGroup::kEp)) {
        (op.phase == Phase::kForward ? fwd_coll : bwd_coll) += 1;
      }
    }
    CHECK(fwd_gemm > 0);
    CHECK(dgrad == fwd_gemm);
    CHECK(wgrad == fwd_gemm);
    CHECK(bwd_coll == fwd_coll);
  }

  TEST_CASE("1F1B runs p - s - 1 warm-up forwards, then alternates, and keeps at most p - s in flight") {
    const auto order = pipeline_order(1, 4, 1, 8);
    REQUIRE(order.size() == 16);
    CHECK(order[0].forward);
    CHECK(order[1].forward);
    CHECK(order[2].forward);  // 2 warm-up + the first steady forward
    CHECK_FALSE(order[3].forward);
    CHECK(peak_in_flight(order) == 3);
    CHECK(peak_in_flight(pipeline_order(0, 4, 1, 8)) == 4);
    CHECK(peak_in_flight(pipeline_order(3, 4, 1, 8)) == 1);
    // Every micro-batch and chunk runs forward and backward exactly once.
    const auto inter = pipeline_order(0, 4, 2, 8);
    std::map<std::tuple<int, int, bool>, int> seen;
    for (const auto& t : inter) ++seen[{t.micro_batch, t.chunk, t.forward}];
    CHECK(seen.size() == 8 * 2 * 2);
    for (const auto& [k, n] : seen) CHECK(n == 1);
  }

  TEST_CASE("activation peaks count each chunk's micro-batches in flight, the heaviest set first") {
    // Interleaved 1F1B, p = 4, v = 2, m = 8, stage 0: (p - 1) 2 + (v - 1) p warm-up forwards + 1 = 11 live at
    // the peak, chunk 0 first: 4 of chunk 1 and 7 of chunk 0. Equal weights give the same count as
    // peak_in_flight.
    const auto order = pipeline_order(0, 4, 2, 8);
    const auto by_chunk = peak_in_flight_by_chunk(order, 2, {1.0, 1.0});
    CHECK(by_chunk[0] + by_chunk[1] == peak_in_flight(order));
    CHECK(by_chunk == std::vector<int64_t>{7, 4});
    // Combined 1F1B adds one warm-up forward, which takes the place of the steady forward plain 1F1B holds
    // before its backward: each later forward runs against a backward layer by layer, so the pair holds one
    // chunk (and a layer), not two. The peak is plain 1F1B's, held through the steady state (at p = 1: one
    // micro-batch, not the two peak_in_flight counts).
    const auto combined = pipeline_order(0, 4, 2, 8, true);
    const auto c = peak_in_flight_by_chunk(combined, 2, {1.0, 1.0});
    CHECK(c[0] + c[1] == 11);
    CHECK(peak_in_flight_by_chunk(pipeline_order(0, 1, 1, 8, true), 1, {1.0}) == std::vector<int64_t>{1});
    CHECK(peak_in_flight(pipeline_order(0, 1, 1, 8, true)) == 2);
    // Chunks weigh what they hold: with all layers in chunk 0 the heaviest live set comes later in the steady
    // state (8 of chunk 0, 3 of chunk 1), not at the end of the warm-up.
    CHECK(peak_in_flight_by_chunk(order, 2, {1.0, 0.0}) == std::vector<int64_t>{8, 3});
  }

  TEST_CASE(
      "Megatron's shared-expert overlap: the shared experts on their own stream with their exchanges, issued "
      "around the dispatcher's all-to-alls, without userbuffers") {
    // Llama 4 Maverick cut to a dense layer and an MoE layer with one shared expert; TP 2 with TE's
    // userbuffers, EP 8, the alltoall dispatcher (token_dispatcher.py:488, 519, 636-637 at 7094270c).
    const ModelSpec l4 = llama4_two_layers();
    Plan q = tp2_userbuffers_plan();
    q.overlap.shared_experts = true;
    const LoweringOptions megatron = stack_options("megatron-core");
    const OpGraph g = lower(l4, q, megatron);
    const Op& ag = the_op(g, OpName::kSharedAg, 1);
    const Op& fc1 = the_op(g, OpName::kSharedFc13, 1);
    const Op& act = the_op(g, OpName::kSharedAct, 1);
    const Op& fc2 = the_op(g, OpName::kSharedFc2, 1);
    const Op& rs = the_op(g, OpName::kSharedRs, 1);
    for (const Op* op : {&ag, &fc1, &act, &fc2, &rs}) {
      CAPTURE(name_of_op(*op));
      CHECK(op->stream == Stream::kShared);
      CHECK_FALSE(op->comm.userbuffers);  // shared_experts.py:92-101
    }
    CHECK(fc1.kind == OpKind::kGemm);
    CHECK(the_op(g, OpName::kFc13, 0).comm.userbuffers);  // the dense MLP keeps them
    // Program order: the gather before the permute, FC1 after the dispatch exchanges, FC2 after the
    // combine's.
    CHECK(ag.id < the_op(g, OpName::kPermute, 1).id);
    CHECK(fc1.id > the_op(g, OpName::kProbsA2a, 1).id);
    CHECK(fc1.id < the_op(g, OpName::kExpertFc13, 1).id);
    CHECK(fc2.id > the_op(g, OpName::kCombineA2a, 1).id);
    CHECK(depends(g, the_op(g, OpName::kUnpermute, 1), rs));
    // The count copy the host waits for keeps its own stream; the shared experts' weight gradients run on
    // theirs (autograd's stream of the forward op).
    CHECK(the_op(g, OpName::kDispatchSync, 1).stream == Stream::kSide);
    CHECK(the_op(g, OpName::kSharedFc13, 1, Phase::kBackward, GemmPart::kWgrad).stream == Stream::kShared);
    CHECK(the_op(g, OpName::kSharedFc2, 1, Phase::kBackward, GemmPart::kDgrad).stream == Stream::kShared);
    // Its TE linears have no parallel mode there: FC1 keeps the gathered input, no re-gather for its weight
    // gradient (the attention's and the dense MLP's linears still re-gather).
    auto regathers = [](const OpGraph& graph) {
      int n = 0;
      for (const Op& op : graph.ops) {
        n += op.layer == 1 && op.micro_batch == 0 && op.phase == Phase::kBackward &&
                     op.name == static_cast<uint16_t>(OpName::kInputAg)
                 ? 1
                 : 0;
      }
      return n;
    };

    // Without it: in line on the compute stream, before the dispatch, with userbuffers.
    q.overlap.shared_experts = false;
    const OpGraph inline_ = lower(l4, q, megatron);
    CHECK(the_op(inline_, OpName::kSharedFc13, 1).stream == Stream::kCompute);
    CHECK(the_op(inline_, OpName::kSharedFc13, 1).comm.userbuffers);
    CHECK(the_op(inline_, OpName::kSharedFc2, 1).id < the_op(inline_, OpName::kDispatchA2a, 1).id);
    CHECK(the_op(inline_, OpName::kSharedFc13, 1, Phase::kBackward, GemmPart::kWgrad).stream ==
          Stream::kCompute);
    // Without userbuffers the in-line shared FC1 re-gathers its input for the weight gradient; the
    // overlapped one does not.
    q.overlap.tp_comm = false;
    const int inline_regathers = regathers(lower(l4, q, megatron));
    q.overlap.shared_experts = true;
    CHECK(regathers(lower(l4, q, megatron)) == inline_regathers - 1);
  }

  TEST_CASE(
      "with inter-op overlap each layer's gradient sync waits for its shared-expert backward on the side "
      "stream") {
    // tiny-moe has one shared expert per MoE layer; with inter_op its GEMMs run on the side stream, which the
    // compute stream's last backward op does not depend on. The layer's reduce-scatter must wait for both.
    const ModelSpec m = io::load_model("tiny-moe").value();
    Plan p;
    p.gpus = 8;
    p.seq_len = 256;
    p.global_batch = 8;
    p.experts.ep = 4;
    p.overlap.inter_op = true;
    p.overlap.dp_comm = true;
    const OpGraph g = lower(m, p, {});
    int checked = 0;
    for (const Op& sync : g.ops) {
      if (sync.name != static_cast<uint16_t>(OpName::kGradRs) || sync.layer < 1) continue;
      int32_t last_side = -1;
      for (const Op& op : g.ops) {
        if (op.layer == sync.layer && op.phase == Phase::kBackward && op.stream == Stream::kSide)
          last_side = op.id;
      }
      REQUIRE(last_side >= 0);
      // Reachability backwards from the sync through dependencies.
      std::vector<char> seen(g.ops.size(), 0);
      std::vector<int32_t> stack{sync.id};
      while (!stack.empty()) {
        const int32_t x = stack.back();
        stack.pop_back();
        for (int32_t y : g.deps_of(g.ops[static_cast<size_t>(x)])) {
          if (!seen[static_cast<size_t>(y)]) seen[static_cast<size_t>(y)] = 1, stack.push_back(y);
        }
      }
      CHECK(seen[static_cast<size_t>(last_side)]);
      ++checked;
    }
    CHECK(checked >= 3);
  }

  // ---- token dispatchers ----

  TEST_CASE("Megatron's alltoall dispatcher sends t k rows, their probs and the counts over ETP x EP") {
    // One Mixtral-8x7B layer, t = 4096 tokens, h = 4096, E = 8, k = 2, ep 4 x etp 2 (2 local experts).
    // token all-to-all: t k rows of h bf16 = t k h 2 bytes; probs all-to-all: t k probs of the router dtype
    // pb (bf16 softmax: 2, fp32 sigmoid: 4); counts: int64 per expert and rank of ETP x EP = 8 E ep etp;
    // ETP all-gather of the ep_rows = t k etp rows with their prob: ep_rows (2h + pb); ETP reduce-scatter
    // of the expert outputs in the probs dtype: ep_rows h pb; combine all-to-all as the dispatch.
    const double t = 4096, k = 2, h = 4096, e = 8, ep = 4, etp = 2;
    for (RouterScore score : {RouterScore::kSoftmax, RouterScore::kSigmoid}) {
      ModelSpec m = mixtral(1);
      m.moe.score = score;
      const double pb = score == RouterScore::kSigmoid ? 4 : 2;
      CAPTURE(pb);
      const OpGraph g = lower(m, node_plan(4, 2), stack_options("megatron-core"));
      const Op& a2a = the_op(g, OpName::kDispatchA2a);
      CHECK(a2a.comm.collective == Collective::kAllToAll);
      CHECK(a2a.comm.group == CommGroup::kEp);
      CHECK(a2a.comm.group_size == 4);
      CHECK(a2a.comm.bytes == doctest::Approx(t * k * h * 2));
      const Op& probs = the_op(g, OpName::kProbsA2a);
      CHECK(probs.comm.collective == Collective::kAllToAll);
      CHECK(probs.comm.group == CommGroup::kEp);
      CHECK(probs.comm.bytes == doctest::Approx(t * k * pb));
      const Op& counts = the_op(g, OpName::kDispatchCounts);
      CHECK(counts.comm.collective == Collective::kAllGather);
      CHECK(counts.comm.group_size == 8);
      CHECK(counts.comm.bytes == doctest::Approx(8 * e * ep * etp));
      const Op& ag = the_op(g, OpName::kEtpAg);
      CHECK(ag.comm.collective == Collective::kAllGather);
      CHECK(ag.comm.group == CommGroup::kEtp);
      CHECK(ag.comm.bytes == doctest::Approx(t * k * etp * (2 * h + pb)));
      const Op& rs = the_op(g, OpName::kEtpRs);
      CHECK(rs.comm.collective == Collective::kReduceScatter);
      CHECK(rs.comm.bytes == doctest::Approx(t * k * etp * h * pb));
      CHECK(the_op(g, OpName::kCombineA2a).comm.bytes == doctest::Approx(t * k * h * 2));
      CHECK(ops_named(g, OpName::kSortChunks).size() == 1);
      CHECK(ops_named(g, OpName::kUnsortChunks).size() == 1);
      // The host waits once per layer forward (for the counts), never in backward.
      int fwd_syncs = 0, bwd_syncs = 0;
      for (const Op& op : g.ops) {
        if (!op.host_sync) continue;
        CHECK(op.name == static_cast<uint16_t>(OpName::kDispatchSync));
        (op.phase == Phase::kForward ? fwd_syncs : bwd_syncs) += 1;
      }
      CHECK(fwd_syncs == 1);
      CHECK(bwd_syncs == 0);
    }
  }

  TEST_CASE(
      "padded to capacity, the alltoall dispatcher exchanges no counts, the host never waits, and each "
      "expert gets its capacity") {
    // One Mixtral-8x7B layer, t = 4096 tokens per rank, k = 2, E = 8, ep 4: capacity ceil(t k / E x cf) rows
    // per expert and source (Megatron get_capacity), E of them per rank: t k at cf 1, 8 x 1127 at cf 1.1.
    const double t = 4096, k = 2, e = 8, h = 4096;
    for (double cf : {1.0, 1.1}) {
      CAPTURE(cf);
      Plan p = node_plan(4);
      p.routing.capacity_factor = cf;
      p.routing.pad_to_capacity = true;
      const OpGraph g = lower(mixtral(1), p, stack_options("megatron-core"));
      CHECK(ops_named(g, OpName::kDispatchCounts).empty());
      for (const Op& op : g.ops) CHECK_FALSE(op.host_sync);
      const double rows = e * std::ceil(t * k / e * cf);
      CHECK(the_op(g, OpName::kDispatchA2a).comm.bytes == doctest::Approx(rows * h * 2));
      CHECK(the_op(g, OpName::kExpertFc13).gemm.m == doctest::Approx(rows));  // the 2 local experts' rows
      CHECK(capacity_padded_rows_factor(p, t, 2, 8) == doctest::Approx(rows / (t * k)));
      // Without the padding the counts travel and the host waits for them.
      p.routing.pad_to_capacity = false;
      const OpGraph dropping = lower(mixtral(1), p, stack_options("megatron-core"));
      CHECK(ops_named(dropping, OpName::kDispatchCounts).size() == 1);
      CHECK(ops_named(dropping, OpName::kDispatchSync).size() == 1);
      CHECK(capacity_padded_rows_factor(p, t, 2, 8) == 1.0);
    }
  }

  TEST_CASE("under per-layer CUDA graphs the scopes' ops are graphed and each replay's first op copies") {
    // Mixtral-8x7B, 2 layers, one node, TP 2, EP 8, 2 micro-batches, Megatron's all-to-all dispatcher with
    // attn, moe_router and moe_preprocess graphed: attention, the pre-MLP norm, the router, the counts and
    // the local permute are in the graph; the host's wait for the counts, the all-to-alls and the experts
    // are not. One replay per layer, micro-batch and direction: forward it copies the layer input [t, h],
    // backward the gradients of the residual, the permuted rows [t k, h] and their probs [t k].
    Plan p = node_plan(8);
    p.attention.tp = 2;
    REQUIRE(p.num_micro_batches() == 2);
    const OpGraph eager = lower(mixtral(2), p, stack_options("megatron-core"));
    for (const Op& op : eager.ops) CHECK_FALSE(op.graphed);
    p.cuda_graphs = kGraphAttn | kGraphMoeRouter | kGraphMoePreprocess;
    const OpGraph g = lower(mixtral(2), p, stack_options("megatron-core"));
    REQUIRE(g.ops.size() == eager.ops.size());  // graphs change who issues the ops, not the ops
    const std::set<OpName> inside = {
        OpName::kAttnAg,  OpName::kQkvProj, OpName::kAttnCore,   OpName::kOutProj,        OpName::kAttnRs,
        OpName::kFfnNorm, OpName::kRouter,  OpName::kRouterTopk, OpName::kDispatchCounts, OpName::kPermute};
    const std::set<OpName> outside = {OpName::kDispatchSync, OpName::kDispatchA2a, OpName::kProbsA2a,
                                      OpName::kExpertFc13,   OpName::kExpertAct,   OpName::kExpertFc2,
                                      OpName::kCombineA2a,   OpName::kEmbedding,   OpName::kLoss,
                                      OpName::kGradRs};
    int checked_in = 0, checked_out = 0;
    const double t = 2048, h = 4096, k = 2;
    std::map<std::tuple<int32_t, int32_t, bool>, int> replays;
    for (const Op& op : g.ops) {
      const auto name = static_cast<OpName>(op.name);
      if (op.layer >= 0 && inside.count(name)) {
        CHECK(op.graphed);
        ++checked_in;
      }
      if (outside.count(name)) {
        CHECK_FALSE(op.graphed);
        ++checked_out;
      }
      if (op.host_sync) CHECK_FALSE(op.graphed);
      CHECK((op.graph_copy_bytes == 0 || op.graphed));
      if (op.graph_copy_bytes == 0) continue;
      const bool fwd = op.phase == Phase::kForward;
      ++replays[{op.layer, op.micro_batch, fwd}];
      CHECK(op.graph_copy_bytes ==
            doctest::Approx(fwd ? 2 * t * h * 2 : 2 * (t * h * 2 + t * k * (h * 2 + 2))).epsilon(1e-6));
    }
    CHECK(checked_in > 0);
    CHECK(checked_out > 0);
    CHECK(replays.size() == 2 * 2 * 2);
    for (const auto& [key, n] : replays) CHECK(n == 1);
    // The forward replay starts at the layer's first op (its input norm).
    for (const Op& op : g.ops) {
      if (op.phase == Phase::kForward && op.layer >= 0 && op.graph_copy_bytes > 0)
        CHECK(static_cast<OpName>(op.name) == OpName::kAttnNorm);
    }

    // Llama 4 Maverick's dense layer and MoE layer with a shared expert overlapped beside the dispatch:
    // the dense MLP is outside (no mlp scope); the shared experts' gather is issued in the all-to-all
    // dispatcher's preprocess and is in the graph, their GEMMs are not; still one replay each way.
    {
      Plan q = node_plan(8);
      q.attention.tp = 2;
      q.overlap.shared_experts = true;
      q.cuda_graphs = kGraphAttn | kGraphMoeRouter | kGraphMoePreprocess;
      const OpGraph sh = lower(llama4_two_layers(), q, stack_options("megatron-core"));
      std::map<std::tuple<int32_t, int32_t, bool>, int> n;
      int shared_gathers = 0;
      for (const Op& op : sh.ops) {
        if (op.graph_copy_bytes > 0) ++n[{op.layer, op.micro_batch, op.phase == Phase::kForward}];
        const auto name = static_cast<OpName>(op.name);
        if (op.layer == 1 && op.phase == Phase::kForward && name == OpName::kSharedAg) {
          CHECK(op.graphed);
          ++shared_gathers;
        }
        if (name == OpName::kSharedFc13 || name == OpName::kFc13) CHECK_FALSE(op.graphed);
      }
      CHECK(shared_gathers == 2);  // one per micro-batch
      CHECK(n.size() == 2 * 2 * 2);
      for (const auto& [key, count] : n) CHECK(count == 1);
    }

    // A graphed module's recompute (the pre-MLP norm under `layernorm`) runs inside the backward graph:
    // issued by its replay, which it neither opens nor splits.
    {
      Plan q = node_plan(8);
      q.attention.tp = 2;
      q.recompute = Recompute::kSelective;
      q.recompute_modules = kRecomputeLayernorm;
      q.cuda_graphs = kGraphMoeRouter;
      const OpGraph re = lower(mixtral(2), q, stack_options("megatron-core"));
      std::map<std::tuple<int32_t, int32_t, bool>, int> n;
      int recomputed = 0;
      for (const Op& op : re.ops) {
        if (op.graph_copy_bytes > 0) ++n[{op.layer, op.micro_batch, op.phase == Phase::kForward}];
        if (op.phase == Phase::kRecompute && static_cast<OpName>(op.name) == OpName::kFfnNorm) {
          CHECK(op.graphed);
          CHECK(op.graph_copy_bytes == 0);
          ++recomputed;
        }
      }
      CHECK(recomputed == 2 * 2);
      CHECK(n.size() == 2 * 2 * 2);
      for (const auto& [key, count] : n) CHECK(count == 1);
    }

    // Whole layers, padded to capacity: every op of the layers (not their gradients' data-parallel
    // reduction) in one replay each way.
    p.cuda_graphs = kGraphLayer;
    p.routing.capacity_factor = 1.0;
    p.routing.pad_to_capacity = true;
    const OpGraph whole = lower(mixtral(2), p, stack_options("megatron-core"));
    int replay_ops = 0;
    for (const Op& op : whole.ops) {
      const auto name = static_cast<OpName>(op.name);
      const bool data_parallel = name == OpName::kGradRs || name == OpName::kGradReduce ||
                                 name == OpName::kParamAg || name == OpName::kGradCast;
      if (op.layer >= 0 && !data_parallel) CHECK(op.graphed);
      if (op.layer < 0) CHECK_FALSE(op.graphed);
      if (op.graph_copy_bytes > 0) {
        ++replay_ops;
        CHECK(op.graph_copy_bytes == doctest::Approx(2 * t * h * 2).epsilon(1e-6));
      }
    }
    CHECK(replay_ops == 2 * 2 * 2);

    // A host wait cannot be captured: GPT-OSS's clamped GLU, made eagerly with a synchronising copy on
    // Megatron-Core, stays outside and splits each forward graph in two replays.
    ModelSpec oss = io::load_model("gpt-oss-20b").value();
    oss.layers.resize(2);
    Plan q = node_plan(8);
    q.routing.capacity_factor = 1.0;
    q.routing.pad_to_capacity = true;
    q.cuda_graphs = kGraphLayer;
    const OpGraph split = lower(oss, q, stack_options("megatron-core"));
    std::map<std::tuple<int32_t, int32_t, bool>, int> n;
    int syncs = 0;
    for (const Op& op : split.ops) {
      if (op.graph_copy_bytes > 0) ++n[{op.layer, op.micro_batch, op.phase == Phase::kForward}];
      if (op.host_sync && op.layer >= 0) {
        CHECK_FALSE(op.graphed);
        ++syncs;
      }
    }
    REQUIRE(syncs == 2);  // one per layer, one micro-batch
    for (const auto& [key, count] : n) CHECK(count == (std::get<2>(key) ? 2 : 1));
  }

  TEST_CASE("routed all-to-alls carry the busiest rank's load as their hot factor, other collectives none") {
    // Mixtral-8x7B, one layer on one node, ep 8, the busiest rank at 1.3x the mean: the token, probs and
    // combine all-to-alls (forward and backward) move 1.3x the uniform bytes and say so; Megatron's alltoall
    // dispatcher and moerun's plain and fused exchanges alike.
    for (const char* stack : {"megatron-core", "moerun"}) {
      for (bool fused : {false, true}) {
        if (fused && std::string(stack) != "moerun") continue;
        CAPTURE(stack);
        CAPTURE(fused);
        Plan p = node_plan(8);
        p.overlap.intra_op = fused;
        LoweringOptions lo = stack_options(stack);
        const OpGraph even = lower(mixtral(1), p, lo);
        lo.expert_load_scale = 1.3;
        const OpGraph hot = lower(mixtral(1), p, lo);
        REQUIRE(even.ops.size() == hot.ops.size());
        int routed = 0;
        for (size_t i = 0; i < hot.ops.size(); ++i) {
          const Op& a = even.ops[i];
          const Op& b = hot.ops[i];
          CHECK(a.comm.hot_factor == 1.0);
          if (b.kind != OpKind::kCollective && b.kind != OpKind::kFusedGemmComm) continue;
          const bool is_routed = b.comm.collective == Collective::kAllToAll && b.comm.group == CommGroup::kEp;
          CHECK(b.comm.hot_factor == (is_routed ? 1.3 : 1.0));
          if (!is_routed) continue;
          CHECK(b.comm.bytes == doctest::Approx(1.3 * a.comm.bytes));
          ++routed;
        }
        // Megatron: tokens, probs and combine, each forward and backward; moerun: dispatch and combine.
        CHECK(routed == (std::string(stack) == "moerun" ? 4 : 6));
      }
    }
  }

  TEST_CASE("Megatron re-gathers a column-parallel linear's input in backward, beside its dgrad, for wgrad") {
    // Mixtral-8x7B, one layer, tp 2 with sequence parallelism on one node: TE's LayerNormLinear of the QKV
    // projection keeps its input shard and all-gathers it again in backward (one copy of attn_ag, on the TP
    // group's stream), which the weight gradient waits for and the data gradient does not. moerun's
    // stack keeps the gathered input; MLA's down projections share one gathered input and keep it.
    Plan p = node_plan(4);
    p.attention.tp = 2;
    p.global_batch = 4;
    const OpGraph g = lower(mixtral(1), p, stack_options("megatron-core"));
    const Op& ag = the_op(g, OpName::kInputAg, 0, Phase::kBackward);
    const Op& fwd = the_op(g, OpName::kAttnAg);
    CHECK(ag.comm.collective == Collective::kAllGather);
    CHECK(ag.comm.group == CommGroup::kTp);
    CHECK(ag.comm.bytes == fwd.comm.bytes);
    CHECK(fwd.stream == Stream::kCompute);  // no inter-operator overlap: the forward waits for its gather
    CHECK(ag.stream == Stream::kTpComm);    // issued asynchronously, beside the dgrad
    CHECK(ops_named(g, OpName::kInputAg).empty());  // none in forward
    const Op& wgrad = the_op(g, OpName::kQkvProj, 0, Phase::kBackward, GemmPart::kWgrad);
    const Op& dgrad = the_op(g, OpName::kQkvProj, 0, Phase::kBackward, GemmPart::kDgrad);
    CHECK(depends(g, wgrad, ag));
    CHECK_FALSE(depends(g, dgrad, ag));
    CHECK(ag.id < dgrad.id);                                                 // issued first
    CHECK(ops_named(g, OpName::kInputAg, 0, Phase::kBackward).size() == 1);  // no other column-parallel input
    CHECK(ops_named(lower(mixtral(1), p, stack_options("moerun")), OpName::kInputAg, 0, Phase::kBackward)
              .empty());
    Plan ds = p;
    ds.experts.ep = 8;
    ds.global_batch = 4;
    const OpGraph mla = lower(deepseek_v3(1, 0), ds, stack_options("megatron-core"));
    // MLA's up projections re-gather their latents, the dense MLP's fc13 its input.
    CHECK(ops_named(mla, OpName::kInputAg, 0, Phase::kBackward).size() == 3);
  }

  TEST_CASE(
      "MLA's down projections run on the sequence shard under Megatron's TP and the up projections gather") {
    // DeepSeek-V3, one dense layer, tp 2 with sequence parallelism on one node: 2048 tokens per rank, 4096 in
    // the TP group, h = 7168, q_lora_rank 1536, kv_lora_rank 512, rotary key part 64. Megatron-Core since
    // 0.14 runs the down projections as TE linears duplicated over TP on the rank's shard (no gather of the
    // hidden state), and the column-parallel up projections gather the latents; Megatron gathers the rotary
    // key part itself. moerun's stack gathers the hidden state once and projects the gathered rows.
    Plan p = node_plan(8);
    p.attention.tp = 2;
    p.global_batch = 4;
    const double t = 2048, tg = 4096, h = 7168;
    const OpGraph g = lower(deepseek_v3(1, 0), p, stack_options("megatron-core"));
    const Op& q_down = the_op(g, OpName::kQDown);
    const Op& kv_down = the_op(g, OpName::kKvDown);
    CHECK(q_down.gemm.m == t);
    CHECK(q_down.gemm.n == 1536);
    CHECK(q_down.gemm.k == h);
    CHECK(q_down.flops == 2.0 * t * h * 1536);
    CHECK(kv_down.gemm.m == t);
    CHECK(kv_down.gemm.n == 512 + 64);
    std::multiset<double> gathered;
    for (const Op* ag : ops_named(g, OpName::kAttnAg)) gathered.insert(ag->comm.bytes);
    CHECK(gathered == std::multiset<double>{tg * 64 * 2.0, tg * 512 * 2.0, tg * 1536 * 2.0});
    const Op& q_up = the_op(g, OpName::kQUp);
    CHECK(q_up.gemm.m == tg);
    CHECK(q_up.gemm.k == 1536);
    const auto q_up_deps = g.deps_of(q_up);
    REQUIRE(q_up_deps.size() == 1);
    CHECK(g.ops[static_cast<size_t>(q_up_deps[0])].comm.bytes == tg * 1536 * 2.0);
    const Op& q_norm = *ops_named(g, OpName::kMlaLatentNorm)[0];
    CHECK(depends(g, g.ops[static_cast<size_t>(q_up_deps[0])], q_norm));
    CHECK(depends(g, q_norm, q_down));
    const OpGraph own = lower(deepseek_v3(1, 0), p, stack_options("moerun"));
    CHECK(the_op(own, OpName::kAttnAg).comm.bytes == tg * h * 2.0);
    CHECK(the_op(own, OpName::kQDown).gemm.m == tg);
    // The q and kv latent norms, fused into the up projections' TE LayerNormLinear, normalise the rank's
    // sequence shard before the gather; moerun's the gathered rows. Read, written, read again in bf16.
    for (const auto& [graph, rows] : {std::pair{&g, t}, std::pair{&own, tg}}) {
      const auto norms = ops_named(*graph, OpName::kMlaLatentNorm);
      REQUIRE(norms.size() == 2);
      CHECK(norms[0]->hbm_bytes == 3.0 * rows * 1536 * 2.0);
      CHECK(norms[1]->hbm_bytes == 3.0 * rows * 512 * 2.0);
      CHECK(norms[0]->gemm.m == rows);
      CHECK(ops_named(*graph, OpName::kMlaLatentNorm, 0, Phase::kBackward).size() == 2);
    }
  }

  TEST_CASE(
      "Before Megatron-Core 0.14 MLA's down projections are column-parallel: each gathers the hidden "
      "state and its output is gathered over TP") {
    // DeepSeek-V3, one dense layer, tp 2 with sequence parallelism on one node: 2048 tokens per rank, 4096 in
    // the TP group, h = 7168, q_lora_rank 1536, kv_lora_rank 512, rotary key part 64, BF16. At 7094270 each
    // down projection is a TE column-parallel linear: it gathers the hidden state, projects its half of the
    // latent columns (1536 / 2, 576 / 2), Megatron gathers the halves over TP (an all-gather and a cat) and
    // keeps the rank's sequence shard (kv's latent, a column view, is copied to it); the up projections
    // gather that shard again. Backward: each TE linear
    // reduce-scatters its data gradient and re-gathers its input for the weight gradient; the sequence
    // slice's gradient is gathered (bf16, the latent part only for kv); the cat's split copies the rank's
    // columns (kv: after the cat of the latent's and the rope key's gradients).
    Plan p = node_plan(8);
    p.attention.tp = 2;
    p.global_batch = 4;
    p.attention.mla_down_proj = MlaDownProj::kColumnParallel;
    const double t = 2048, tg = 4096, h = 7168, b = 2.0;
    const OpGraph g = lower(deepseek_v3(1, 0), p, stack_options("megatron-core"));
    const Op& q_down = the_op(g, OpName::kQDown);
    const Op& kv_down = the_op(g, OpName::kKvDown);
    CHECK(q_down.gemm.m == tg);
    CHECK(q_down.gemm.n == 768);
    CHECK(q_down.gemm.k == h);
    CHECK(q_down.flops == 2.0 * t * h * 1536);  // the rank's share of the work, as on the sequence shard
    CHECK(kv_down.gemm.m == tg);
    CHECK(kv_down.gemm.n == 288);
    std::multiset<double> gathered;
    for (const Op* ag : ops_named(g, OpName::kAttnAg)) gathered.insert(ag->comm.bytes);
    CHECK(gathered == std::multiset<double>{tg * h * b, tg * h * b, tg * 1536 * b, tg * 576 * b,
                                            tg * 1536 * b, tg * 512 * b});
    const auto cats = ops_named(g, OpName::kMlaLatentCat);
    REQUIRE(cats.size() == 2);
    CHECK(cats[0]->hbm_bytes == 2.0 * tg * 1536 * b);
    CHECK(cats[1]->hbm_bytes == 2.0 * tg * 576 * b + 2.0 * t * 512 * b);  // and the latent's shard copied
    CHECK(cats[1]->kernels == 2);
    // q_down -> its output's gather -> the cat -> q_up's latent norm and gather of the sequence shard -> q_up
    // (kv alike).
    auto only_dep = [&](const Op& op) -> const Op& {
      const auto deps = g.deps_of(op);
      REQUIRE(deps.size() == 1);
      return g.ops[static_cast<size_t>(deps[0])];
    };
    for (auto [down, cat, up, width] : {std::tuple{&q_down, cats[0], OpName::kQUp, 1536.0},
                                        std::tuple{&kv_down, cats[1], OpName::kKvUp, 576.0}}) {
      const Op& out_ag = only_dep(*cat);
      CHECK(out_ag.comm.bytes == tg * width * b);
      CHECK(depends(g, out_ag, *down));
      const Op& up_ag = only_dep(the_op(g, up));
      CHECK(up_ag.comm.bytes == tg * (width == 576.0 ? 512.0 : width) * b);
      CHECK(only_dep(only_dep(up_ag)).id == cat->id);  // through the up projection's fused latent norm
    }
    // Backward: the gathers of the latents' sequence-slice gradients, the reduce-scatters of the four TE
    // linears' data gradients, the re-gathers of their inputs (with the dense MLP's fc13: five).
    std::multiset<double> bwd_gathers, bwd_rs;
    for (const Op* op : ops_named(g, OpName::kAttnAg, 0, Phase::kBackward)) {
      (op->comm.collective == Collective::kAllGather ? bwd_gathers : bwd_rs).insert(op->comm.bytes);
    }
    CHECK(bwd_gathers == std::multiset<double>{tg * 1536 * b, tg * 512 * b});
    CHECK(bwd_rs == std::multiset<double>{tg * h * b, tg * h * b, tg * 1536 * b, tg * 512 * b});
    CHECK(ops_named(g, OpName::kInputAg, 0, Phase::kBackward).size() == 5);
    const auto back_cats = ops_named(g, OpName::kMlaLatentCat, 0, Phase::kBackward);
    REQUIRE(back_cats.size() == 2);
    std::multiset<double> back_bytes{back_cats[0]->hbm_bytes, back_cats[1]->hbm_bytes};
    CHECK(back_bytes == std::multiset<double>{2.0 * tg * 768 * b, 2.0 * tg * 288 * b + 2.0 * tg * 576 * b});
    // The stack's own layout (0.14+) is what an unnamed plan gets; tp 1 has no layout to choose.
    p.attention.mla_down_proj = MlaDownProj::kStack;
    CHECK(ops_named(lower(deepseek_v3(1, 0), p, stack_options("megatron-core")), OpName::kMlaLatentCat)
              .empty());
    Plan one = p;
    one.attention.tp = 1;
    one.attention.mla_down_proj = MlaDownProj::kColumnParallel;
    Plan one_own = one;
    one_own.attention.mla_down_proj = MlaDownProj::kStack;
    CHECK(lower(deepseek_v3(1, 0), one, stack_options("megatron-core")).ops.size() ==
          lower(deepseek_v3(1, 0), one_own, stack_options("megatron-core")).ops.size());
  }

  TEST_CASE(
      "Megatron syncs the embedding's and output layer's gradients as any parameter's, the MTP copy's across "
      "the end stages") {
    // Mixtral-8x7B cut to two layers (vocabulary 32000, h 4096, untied), 16 GPUs: tp 2, pp 2 (a layer per
    // stage), 4 attention replicas, ZeRO-1 with overlapped DP communication, two micro-batches per rank. A
    // rank holds a vocabulary shard of 32000 / 2 x 4096 of the embedding (stage 0) and of the output layer
    // (stage 1, with the final norm's 4096).
    const ModelSpec m = mixtral(2);
    Plan p = tp2_pp2_plan(8);
    p.data.zero = 1;
    p.overlap.dp_comm = true;
    const double table = 32000.0 / 2 * 4096;
    auto outside = [](const OpGraph& g, OpName n, int stage) {
      std::vector<const Op*> out;
      for (const Op& op : g.ops) {
        if (op.name == static_cast<uint16_t>(n) && op.layer == -1 && op.stage == stage) out.push_back(&op);
      }
      return out;
    };
    auto last_backward = [](const OpGraph& g, OpName n) -> const Op& {
      const Op* last = nullptr;
      for (const Op& op : g.ops) {
        if (op.name == static_cast<uint16_t>(n) && op.phase == Phase::kBackward) last = &op;
      }
      REQUIRE(last != nullptr);
      return *last;
    };
    const OpGraph g = lower(m, p, stack_options("megatron-core"));
    const auto rs0 = outside(g, OpName::kGradRs, 0), rs1 = outside(g, OpName::kGradRs, 1);
    REQUIRE(rs0.size() == 1);
    REQUIRE(rs1.size() == 1);
    for (const Op* rs : {rs0[0], rs1[0]}) {
      CHECK(rs->comm.collective == Collective::kReduceScatter);
      CHECK(rs->comm.group == CommGroup::kAttnReplica);
      CHECK(rs->comm.group_size == 4);
      CHECK(rs->stream == Stream::kDpComm);
    }
    CHECK(rs0[0]->comm.bytes == rel(4.0 * table));           // fp32 main gradients
    CHECK(rs1[0]->comm.bytes == rel(4.0 * (table + 4096)));  // with the final norm
    // Each waits for its part's last backward: the last micro-batch's embedding, its final norm (after the
    // output layer's weight gradient on the same stream).
    const Op& emb_bwd = last_backward(g, OpName::kEmbedding);
    CHECK(emb_bwd.micro_batch == 1);
    CHECK(depends(g, *rs0[0], emb_bwd));
    CHECK(depends(g, *rs1[0], last_backward(g, OpName::kFinalNorm)));
    // ZeRO-1 gathers them ahead of their first forward, in BF16.
    const auto ag0 = outside(g, OpName::kParamAg, 0), ag1 = outside(g, OpName::kParamAg, 1);
    REQUIRE(ag0.size() == 1);
    REQUIRE(ag1.size() == 1);
    CHECK(ag0[0]->comm.bytes == rel(2.0 * table));
    CHECK(ag1[0]->comm.bytes == rel(2.0 * (table + 4096)));
    CHECK(depends(g, the_end_op(g, OpName::kEmbedding), *ag0[0]));
    CHECK(depends(g, the_end_op(g, OpName::kLmHead), *ag1[0]));
    // The optimizer steps their shards too (a quarter each), beside the layers' (moerun's executor keeps
    // them whole and syncs them itself: nothing lowered there).
    const OpGraph mr = lower(m, p, stack_options("moerun"));
    for (int stage : {0, 1}) {
      CAPTURE(stage);
      CHECK(outside(mr, OpName::kGradRs, stage).empty());
      const double extra = (stage == 0 ? table : table + 4096) / 4.0 * kAdamStepBytesPerParam;
      CHECK(outside(g, OpName::kOptimizerStep, stage).front()->hbm_bytes -
                outside(mr, OpName::kOptimizerStep, stage).front()->hbm_bytes ==
            rel(extra));
    }
    // ZeRO-2 reduce-scatters every micro-batch's gradients: the embedding's twice, after each backward.
    Plan z2 = p;
    z2.data.zero = 2;
    const OpGraph g2 = lower(m, z2, stack_options("megatron-core"));
    CHECK(outside(g2, OpName::kGradRs, 0).size() == 2);
    CHECK(outside(g2, OpName::kGradRs, 1).size() == 2);
    CHECK(depends(g2, *outside(g2, OpName::kGradRs, 0).back(), last_backward(g2, OpName::kEmbedding)));
    // On one stage the data-parallel stream takes them in the order the backward completes them, as
    // Megatron's buckets (reversed parameter order) do: the output layer's before the layers' (the last layer
    // first), the embedding's last; each the only one of its kind here.
    for (int64_t zero : {1, 2}) {
      CAPTURE(zero);
      Plan one = p;
      one.pipeline.pp = 1;
      one.global_batch = 16;  // two micro-batches on each of the 8 attention replicas
      one.data.zero = zero;
      const OpGraph g1 = lower(m, one, stack_options("megatron-core"));
      std::vector<int32_t> order;  // the syncs in stream (id) order: their layer, -1 for the tables
      std::vector<double> bytes;
      for (const Op& op : g1.ops) {
        // The dense parameters' (the experts' go over their own replicas).
        if (op.name != static_cast<uint16_t>(OpName::kGradRs) || op.comm.group != CommGroup::kAttnReplica)
          continue;
        order.push_back(op.layer);
        bytes.push_back(op.comm.bytes);
      }
      REQUIRE(order.size() == (zero == 1 ? 4u : 8u));  // ZeRO-2: each of the two micro-batches'
      order.erase(order.begin(), order.end() - 4);
      bytes.erase(bytes.begin(), bytes.end() - 4);
      CHECK(order == std::vector<int32_t>{-1, 1, 0, -1});
      CHECK(bytes.front() == rel(4.0 * (table + 4096)));  // the output layer with the final norm
      CHECK(bytes.back() == rel(4.0 * table));            // the embedding
    }
    // ZeRO-3 (Megatron-FSDP) gathers the layers' parameters per pass, but the embedding and the output layer
    // are not in an FSDP unit: gathered once a step, ahead of their first forward, as under ZeRO-1/2 (they
    // were not gathered at all).
    Plan z3 = p;
    z3.data.zero = 3;
    const OpGraph g3 = lower(m, z3, stack_options("megatron-core"));
    REQUIRE(outside(g3, OpName::kParamAg, 0).size() == 1);
    REQUIRE(outside(g3, OpName::kParamAg, 1).size() == 1);
    CHECK(outside(g3, OpName::kParamAg, 0).front()->stream == Stream::kDpComm);
    CHECK(depends(g3, the_end_op(g3, OpName::kEmbedding), *outside(g3, OpName::kParamAg, 0).front()));
    CHECK(depends(g3, the_end_op(g3, OpName::kLmHead), *outside(g3, OpName::kParamAg, 1).front()));
    int64_t layer_gathers = 0;
    for (const Op& op : g3.ops)
      layer_gathers += op.name == static_cast<uint16_t>(OpName::kParamAg) && op.layer >= 0;
    // Per layer, micro-batch and pass, the dense parameters (the experts have no replica: ep 8 on a stage's
    // 8 GPUs).
    CHECK(layer_gathers == 2 * 2 * 2);
    // Not overlapped, after the optimizer step on the compute stream.
    z3.overlap.dp_comm = false;
    const OpGraph g3s = lower(m, z3, stack_options("megatron-core"));
    REQUIRE(outside(g3s, OpName::kParamAg, 1).size() == 1);
    CHECK(outside(g3s, OpName::kParamAg, 1).front()->phase == Phase::kOptimizer);
    CHECK(outside(g3s, OpName::kParamAg, 1).front()->stream == Stream::kCompute);
    // Untied and without MTP the end stages share nothing: no all-reduce between them.
    CHECK(outside(g, OpName::kEmbedGradAr, 0).empty());
    CHECK(outside(g, OpName::kEmbedGradAr, 1).empty());

    // With an MTP module the last stage holds its own copy of the embedding (synced over the replicas too),
    // and finalize_model_grads all-reduces the copy's and the embedding's gradients between the two stages
    // (ranks 8 apart), on the compute stream, before the optimizer step.
    ModelSpec with_mtp = m;
    with_mtp.mtp_layers = 1;
    const OpGraph t = lower(with_mtp, p, stack_options("megatron-core"));
    CHECK(outside(t, OpName::kGradRs, 1).size() == 2);
    for (int stage : {0, 1}) {
      CAPTURE(stage);
      const auto ar = outside(t, OpName::kEmbedGradAr, stage);
      REQUIRE(ar.size() == 1);
      CHECK(ar[0]->comm.collective == Collective::kAllReduce);
      CHECK(ar[0]->comm.group_size == 2);
      CHECK(ar[0]->comm.stride == 8);
      CHECK(ar[0]->comm.bytes == rel(4.0 * table));
      CHECK(ar[0]->stream == Stream::kCompute);
      CHECK(depends(t, *outside(t, OpName::kOptimizerStep, stage).front(), *ar[0]));
    }
    // One stage holding both ends has nothing to all-reduce.
    Plan one = p;
    one.gpus = 8;
    one.pipeline.pp = 1;
    CHECK(outside(lower(with_mtp, one, stack_options("megatron-core")), OpName::kEmbedGradAr, 0).empty());
  }

  TEST_CASE("ZeRO-3 on Megatron gathers the next layer's parameters before this layer's reduce-scatter") {
    // Mixtral-8x7B cut to three layers on 16 GPUs: tp 2, ep 8, one stage, 8 attention replicas and 2 expert
    // replicas, two micro-batches per rank, ZeRO-3 with overlapped DP communication. Megatron-FSDP's
    // pre-backward hook of layer L gathers L's parameters and prefetches L-1's, both ahead of L's
    // post-backward reduce-scatter on the shared communicator; moerun's executor gathers each layer when its
    // backward begins, after the previous layer's reduce-scatter.
    const ModelSpec m = mixtral(3);
    Plan p = tp2_pp2_plan(16);
    p.pipeline.pp = 1;
    p.data.zero = 3;
    p.overlap.dp_comm = true;
    // The backward's dense-parameter gathers ('G') and gradient reduce-scatters ('R') of the layers, with
    // their layer, in the order they are issued (op id), and the gathers of each layer and pass.
    auto sequence = [&](const char* stack) {
      const OpGraph g = lower(m, p, stack_options(stack));
      std::string seq;
      std::map<std::tuple<int32_t, int32_t, Phase>, int> gathers;
      for (const Op& op : g.ops) {
        if (op.layer < 0 || op.comm.group != CommGroup::kAttnReplica) continue;
        if (op.name == static_cast<uint16_t>(OpName::kParamAg)) {
          ++gathers[{op.layer, op.micro_batch, op.phase}];
          if (op.phase == Phase::kBackward) seq += "G" + std::to_string(op.layer);
        } else if (op.name == static_cast<uint16_t>(OpName::kGradRs)) {
          seq += "R" + std::to_string(op.layer);
        }
      }
      CHECK(gathers.size() == 3 * 2 * 2);  // each layer, micro-batch and pass
      for (const auto& [key, n] : gathers) CHECK(n == 1);
      return seq;
    };
    CHECK(sequence("megatron-core") == "G2G1R2G0R1R0G2G1R2G0R1R0");
    CHECK(sequence("moerun") == "G2R2G1R1G0R0G2R2G1R1G0R0");
  }

  TEST_CASE("Megatron all-reduces over TP the gradients every TP rank holds whole, before the optimizer") {
    // DeepSeek-V3, one MoE layer, tp 2, pp 1: the two norms and the router (marked sequence_parallel), the
    // q and kv latent norms (1536 + 512), MLA's duplicated down projections (7168 x (1536 + 512 + 64)) and
    // the final norm (7168), in fp32 gradients: flattened, all-reduced over TP, copied back per tensor
    // (2 norms + router + 2 latent norms + 2 down projections + the final norm = 8), then the optimizer.
    Plan p = node_plan(8);
    p.attention.tp = 2;
    const ModelSpec m = deepseek_v3(0, 1);
    const ParamBreakdown lp = layer_params(m, m.layers[0]);
    const double down = 7168.0 * (1536 + 512 + 64), rest = lp.norms + lp.router + 1536 + 512 + 7168;
    const OpGraph g = lower(m, p, stack_options("megatron-core"));
    const auto ars = ops_named(g, OpName::kTpGradAr, -1, Phase::kOptimizer);
    REQUIRE(ars.size() == 1);
    CHECK(ars[0]->comm.collective == Collective::kAllReduce);
    CHECK(ars[0]->comm.group == CommGroup::kTp);
    CHECK(ars[0]->comm.bytes == doctest::Approx(4.0 * (rest + down)));
    const auto copies = ops_named(g, OpName::kTpGradCopy, -1, Phase::kOptimizer);
    REQUIRE(copies.size() == 2);
    CHECK(copies[0]->hbm_bytes == doctest::Approx(2.0 * 4.0 * (rest + down)));
    CHECK(copies[1]->kernels == 8);
    CHECK(depends(g, *ars[0], *copies[0]));
    CHECK(depends(g, *copies[1], *ars[0]));
    CHECK(depends(g, *ops_named(g, OpName::kOptimizerStep, -1, Phase::kOptimizer).front(), *copies[1]));
    // Column-parallel down projections are TP shards; --grad-reduce-in-bf16 halves the bytes.
    Plan old = p;
    old.attention.mla_down_proj = MlaDownProj::kColumnParallel;
    old.compression.grad_sync = GradSync::kBf16ReduceScatter;
    CHECK(ops_named(lower(m, old, stack_options("megatron-core")), OpName::kTpGradAr, -1, Phase::kOptimizer)
              .front()
              ->comm.bytes == doctest::Approx(2.0 * rest));
    // None under tp 1, nor on moerun's stack (its train runner reduces TP-replicated entries over TP
    // outside the op graph, train_grad_sync.cpp, not lowered).
    CHECK(ops_named(lower(m, p, stack_options("moerun")), OpName::kTpGradAr, -1, Phase::kOptimizer).empty());
    p.attention.tp = 1;
    CHECK(ops_named(lower(m, p, stack_options("megatron-core")), OpName::kTpGradAr, -1, Phase::kOptimizer)
              .empty());
  }

  TEST_CASE(
      "Megatron's vocabulary-parallel ends exchange over TP: the embedding, the output layer, the loss") {
    // Mixtral-8x7B, one layer, tp 2 on one node, pp 1 (both ends on the stage): 2048 tokens per rank, 4096 in
    // the TP group, h = 4096, BF16 activations. The embedding looks up the group's rows in its vocabulary
    // shard and reduce-scatters them (its gradient is all-gathered back); the output layer all-gathers its
    // input, re-gathers it in backward beside the dgrad for the weight gradient and reduce-scatters the dgrad
    // before the final norm's backward; the cross-entropy reduces its row statistics over TP as each
    // implementation does. moerun's stack keeps both ends whole, and so does tp 1.
    Plan p = node_plan(4);
    p.attention.tp = 2;
    p.global_batch = 4;
    const double t = 2048, tg = 4096, h = 4096;
    p.cross_entropy = CrossEntropy::kUnfused;
    const OpGraph g = lower(mixtral(1), p, stack_options("megatron-core"));
    const Op& emb = the_end_op(g, OpName::kEmbedding);
    const Op& rs = the_end_op(g, OpName::kEmbedRs);
    CHECK(emb.gemm.m == 4096);  // the group's rows
    CHECK(emb.hbm_bytes == doctest::Approx(5.0 * tg * h * 2.0));
    CHECK(rs.comm.collective == Collective::kReduceScatter);
    CHECK(rs.comm.group == CommGroup::kTp);
    CHECK(rs.comm.bytes == tg * h * 2.0);
    CHECK(depends(g, rs, emb));
    CHECK(depends(g, *ops_named(g, OpName::kAttnNorm, 0).front(), rs));
    const Op& head_ag = the_end_op(g, OpName::kHeadAg);
    const Op& head = the_end_op(g, OpName::kLmHead);
    CHECK(head_ag.comm.collective == Collective::kAllGather);
    CHECK(head_ag.comm.bytes == tg * h * 2.0);
    CHECK(depends(g, head_ag, the_end_op(g, OpName::kFinalNorm)));
    CHECK(depends(g, head, head_ag));
    CHECK(head.gemm.m == 4096);
    const auto ars = end_ops(g, OpName::kLossAr);
    REQUIRE(ars.size() == 3);  // the rows' maximum, the target logits, the sums of exponentials
    CHECK(depends(g, *ars[0], the_end_op(g, OpName::kLoss)));
    for (const Op* ar : ars) {
      CHECK(ar->comm.collective == Collective::kAllReduce);
      CHECK(ar->comm.bytes == 4.0 * tg);
      CHECK(ar->dtype == DType::kFp32);
    }
    CHECK(depends(g, *ars[2], *ars[1]));
    // Backward: re-gather, dgrad, reduce-scatter, wgrad; the final norm waits for the reduce-scatter.
    const Op& regather = the_end_op(g, OpName::kInputAg, Phase::kBackward);
    const Op& dgrad = the_end_op(g, OpName::kLmHead, Phase::kBackward, GemmPart::kDgrad);
    const Op& wgrad = the_end_op(g, OpName::kLmHead, Phase::kBackward, GemmPart::kWgrad);
    const Op& head_rs = the_end_op(g, OpName::kHeadRs, Phase::kBackward);
    CHECK(regather.comm.bytes == head_ag.comm.bytes);
    CHECK(regather.id < dgrad.id);
    CHECK_FALSE(depends(g, dgrad, regather));
    CHECK(depends(g, wgrad, regather));
    CHECK(depends(g, head_rs, dgrad));
    CHECK(head_rs.id < wgrad.id);
    CHECK(head_rs.comm.collective == Collective::kReduceScatter);
    CHECK(head_rs.comm.bytes == tg * h * 2.0);
    CHECK(depends(g, the_end_op(g, OpName::kFinalNorm, Phase::kBackward), head_rs));
    const Op& emb_ag = the_end_op(g, OpName::kEmbedAg, Phase::kBackward);
    CHECK(emb_ag.comm.collective == Collective::kAllGather);
    CHECK(emb_ag.comm.bytes == tg * h * 2.0);
    CHECK(depends(g, the_end_op(g, OpName::kEmbedding, Phase::kBackward), emb_ag));

    // The fused native loss: two all-reduces (the maximum, then the target logits with the sums); TE's: one
    // all-gather of each rank's three statistics per row.
    p.cross_entropy = CrossEntropy::kNative;
    const OpGraph native = lower(mixtral(1), p, stack_options("megatron-core"));
    const auto nars = end_ops(native, OpName::kLossAr);
    REQUIRE(nars.size() == 2);
    CHECK(nars[0]->comm.bytes == 4.0 * tg);
    CHECK(nars[1]->comm.bytes == 8.0 * tg);
    CHECK(end_ops(native, OpName::kLossAg).empty());
    p.cross_entropy = CrossEntropy::kTe;
    const OpGraph te = lower(mixtral(1), p, stack_options("megatron-core"));
    CHECK(end_ops(te, OpName::kLossAr).empty());
    CHECK(the_end_op(te, OpName::kLossAg).comm.bytes == 12.0 * tg * 2.0);

    // moerun's ends, and Megatron's at tp 1: no exchange, the rank's own rows.
    Plan tp1 = p;
    tp1.attention.tp = 1;
    tp1.global_batch = 8;
    for (const auto& [plan, stack] : {std::pair{p, "moerun"}, std::pair{tp1, "megatron-core"}}) {
      CAPTURE(stack);
      const OpGraph whole = lower(mixtral(1), plan, stack_options(stack));
      for (OpName n : {OpName::kEmbedRs, OpName::kEmbedAg, OpName::kHeadAg, OpName::kHeadRs, OpName::kLossAr,
                       OpName::kLossAg}) {
        CHECK(end_ops(whole, n).empty());
        CHECK(end_ops(whole, n, Phase::kBackward).empty());
      }
      CHECK(end_ops(whole, OpName::kInputAg, Phase::kBackward).empty());
      const double rows = plan.attention.tp == 2 ? t : 4096;
      CHECK(the_end_op(whole, OpName::kEmbedding).hbm_bytes == doctest::Approx(2.0 * rows * h * 2.0));
    }
  }

  TEST_CASE("MTP's embedding, projection and output layer exchange over TP as Megatron runs them") {
    // DeepSeek-V3 cut to one dense layer with one MTP module, tp 2, ep 8: 2048 tokens per rank, 4096 in the
    // TP group, h = 7168. The MTP depth's embedding reduce-scatters (all-gathers its gradient) and its head
    // gathers, re-gathers and reduce-scatters like the main ones. Its projection eh_proj is TE's
    // column-parallel linear: it gathers its [t, 2h] input, and its output is gathered along the hidden dim
    // before the split to the sequence shard; backward gathers the split's gradient, reduce-scatters the
    // hidden-dim gather's, re-gathers the input beside the dgrad and reduce-scatters the dgrad. The MTP
    // embedding's backward runs on every stack; moerun's has none of the exchanges.
    Plan p = node_plan(8);
    p.attention.tp = 2;
    p.global_batch = 4;
    const double tg = 4096, h = 7168;
    const OpGraph g = lower(deepseek_v3(1, 0, 1), p, stack_options("megatron-core"));
    CHECK(end_ops(g, OpName::kEmbedRs).size() == 2);
    CHECK(end_ops(g, OpName::kHeadAg).size() == 2);
    CHECK(end_ops(g, OpName::kHeadRs, Phase::kBackward).size() == 2);
    CHECK(end_ops(g, OpName::kEmbedAg, Phase::kBackward).size() == 2);
    CHECK(end_ops(g, OpName::kMtpEmbedding, Phase::kBackward).size() == 1);
    // main head, MTP head, MTP projection
    CHECK(end_ops(g, OpName::kInputAg, Phase::kBackward).size() == 3);
    const Op& in_ag = the_end_op(g, OpName::kMtpAg);
    const Op& proj = the_end_op(g, OpName::kMtpProj);
    const Op& out_ag = the_end_op(g, OpName::kMtpOutAg);
    CHECK(in_ag.comm.collective == Collective::kAllGather);
    CHECK(in_ag.comm.bytes == tg * 2 * h * 2);
    CHECK(out_ag.comm.bytes == tg * h * 2);
    CHECK(depends(g, proj, in_ag));
    CHECK(depends(g, out_ag, proj));
    // The copies: the concatenation of [t, h] embedding and hidden state before the gather (t = tg / 2),
    // the hidden-dim gather's reassembly after it, and that split and copy again before its reduce-scatter.
    const Op& cat = the_end_op(g, OpName::kMtpCat);
    const Op& gather_cat = the_end_op(g, OpName::kMtpGatherCat);
    CHECK(cat.hbm_bytes == 4 * (tg / 2) * h * 2);
    CHECK(gather_cat.hbm_bytes == 2 * tg * h * 2);
    CHECK(depends(g, cat, the_end_op(g, OpName::kMtpNorm)));
    CHECK(depends(g, in_ag, cat));
    CHECK(depends(g, gather_cat, out_ag));
    const Op& gather_cat_back = the_end_op(g, OpName::kMtpGatherCat, Phase::kBackward);
    CHECK(end_ops(g, OpName::kMtpCat, Phase::kBackward).empty());  // views
    const Op& scatter_ag = the_end_op(g, OpName::kMtpScatterAg, Phase::kBackward);
    const Op& out_rs = the_end_op(g, OpName::kMtpOutRs, Phase::kBackward);
    const Op& dgrad = the_end_op(g, OpName::kMtpProj, Phase::kBackward, GemmPart::kDgrad);
    const Op& wgrad = the_end_op(g, OpName::kMtpProj, Phase::kBackward, GemmPart::kWgrad);
    const Op& rs = the_end_op(g, OpName::kMtpRs, Phase::kBackward);
    CHECK(scatter_ag.comm.collective == Collective::kAllGather);
    CHECK(out_rs.comm.collective == Collective::kReduceScatter);
    CHECK(rs.comm.collective == Collective::kReduceScatter);
    CHECK(rs.comm.bytes == tg * 2 * h * 2);
    CHECK(depends(g, gather_cat_back, scatter_ag));
    CHECK(depends(g, out_rs, gather_cat_back));
    CHECK(depends(g, dgrad, out_rs));
    CHECK(depends(g, rs, dgrad));
    CHECK(depends(g, the_end_op(g, OpName::kMtpNorm, Phase::kBackward), rs));
    int regathers_before_dgrad = 0;
    for (const Op* a : end_ops(g, OpName::kInputAg, Phase::kBackward)) {
      if (!depends(g, wgrad, *a)) continue;
      ++regathers_before_dgrad;
      CHECK(a->id < dgrad.id);
      CHECK_FALSE(depends(g, dgrad, *a));
      CHECK(a->comm.bytes == in_ag.comm.bytes);
    }
    CHECK(regathers_before_dgrad == 1);
    const OpGraph own = lower(deepseek_v3(1, 0, 1), p, stack_options("moerun"));
    CHECK(end_ops(own, OpName::kMtpEmbedding, Phase::kBackward).size() == 1);
    for (OpName n :
         {OpName::kHeadAg, OpName::kMtpAg, OpName::kMtpOutAg, OpName::kMtpCat, OpName::kMtpGatherCat})
      CHECK(end_ops(own, n).empty());
    // Without TP, Megatron's concatenation alone.
    Plan one = p;
    one.attention.tp = 1;
    one.global_batch = 8;
    const OpGraph no_tp = lower(deepseek_v3(1, 0, 1), one, stack_options("megatron-core"));
    CHECK(end_ops(no_tp, OpName::kMtpCat).size() == 1);
    CHECK(end_ops(no_tp, OpName::kMtpGatherCat).empty());
    for (OpName n : {OpName::kMtpRs, OpName::kMtpOutRs, OpName::kMtpScatterAg, OpName::kInputAg})
      CHECK(end_ops(own, n, Phase::kBackward).empty());
  }

  TEST_CASE("Megatron's column-parallel backward exchanges run beside the GEMMs, its forward ones in line") {
    // Mixtral-8x7B, one layer, tp 2, no inter-operator overlap: TE issues a column-parallel linear's input
    // re-gather before its dgrad GEMM and the dgrad's reduce-scatter before its wgrad GEMM, both with
    // async_op=True, and waits for them only before the wgrad and at the end of backward. They run on the
    // TP group's stream; the forward's gathers and reduce-scatters and the row-parallel linears' backward
    // gathers stay on the compute stream. Under combined 1F1B, whose EP exchanges run on the communication
    // stream, they keep their own.
    Plan p = node_plan(4);
    p.attention.tp = 2;
    p.global_batch = 4;
    const OpGraph g = lower(mixtral(1), p, stack_options("megatron-core"));
    const Op& rs = the_op(g, OpName::kAttnAg, 0, Phase::kBackward);
    CHECK(rs.comm.collective == Collective::kReduceScatter);
    CHECK(rs.stream == Stream::kTpComm);
    const Op& wgrad = the_op(g, OpName::kQkvProj, 0, Phase::kBackward, GemmPart::kWgrad);
    CHECK(wgrad.id < rs.id);  // emitted after the wgrad, waiting only for the dgrad
    CHECK_FALSE(depends(g, rs, wgrad));
    CHECK(the_op(g, OpName::kAttnRs, 0, Phase::kBackward).stream == Stream::kCompute);  // out_proj's gather
    CHECK(the_op(g, OpName::kAttnAg).stream == Stream::kCompute);
    CHECK(the_op(g, OpName::kAttnRs).stream == Stream::kCompute);
    CHECK(the_end_op(g, OpName::kHeadRs, Phase::kBackward).stream == Stream::kTpComm);
    CHECK(the_end_op(g, OpName::kInputAg, Phase::kBackward).stream == Stream::kTpComm);
    CHECK(the_end_op(g, OpName::kHeadAg).stream == Stream::kCompute);
    CHECK(the_end_op(g, OpName::kEmbedAg, Phase::kBackward).stream == Stream::kCompute);
    Plan combined = p;
    combined.overlap.cross_micro_batch = true;
    combined.global_batch = 8;
    const OpGraph c = lower(mixtral(1), combined, stack_options("megatron-core"));
    CHECK(the_op(c, OpName::kAttnAg, 0, Phase::kBackward).stream == Stream::kTpComm);
    CHECK(the_op(c, OpName::kInputAg, 0, Phase::kBackward).stream == Stream::kTpComm);
    CHECK(the_op(c, OpName::kDispatchA2a).stream == Stream::kComm);
  }

  TEST_CASE("TE's userbuffers fold the TP linears' exchanges into their GEMMs, backward as TE overlaps it") {
    // Mixtral-8x7B, one layer, tp 2 with overlap.tp_comm on Megatron-Core: the QKV projection holds its
    // input's all-gather and the output projection its reduce-scatter (no TP collective left in forward);
    // backward, the output projection's dgrad holds the gradient's all-gather (a ring exchange), and the QKV
    // projection re-gathers its input beside a plain dgrad GEMM, then reduce-scatters that dgrad beside the
    // wgrad, both on TE's communication SMs (userbuffers) on the TP stream.
    Plan p = node_plan(4);
    p.attention.tp = 2;
    p.global_batch = 4;
    p.overlap.tp_comm = true;
    const OpGraph g = lower(mixtral(1), p, stack_options("megatron-core"));
    CHECK(ops_named(g, OpName::kAttnAg).empty());
    CHECK(ops_named(g, OpName::kAttnRs).empty());
    CHECK(ops_named(g, OpName::kAttnRs, 0, Phase::kBackward).empty());
    const Op& qkv = the_op(g, OpName::kQkvProj);
    CHECK(qkv.kind == OpKind::kFusedGemmComm);
    CHECK(qkv.comm.userbuffers);
    CHECK(qkv.comm.collective == Collective::kAllGather);
    CHECK(qkv.comm.group == CommGroup::kTp);
    CHECK(qkv.comm.group_size == 2);
    CHECK(qkv.stream == Stream::kCompute);
    // The bytes the unfused lowering's all-gather and reduce-scatter move.
    Plan plain = p;
    plain.overlap.tp_comm = false;
    const OpGraph u = lower(mixtral(1), plain, stack_options("megatron-core"));
    CHECK(qkv.comm.bytes == the_op(u, OpName::kAttnAg).comm.bytes);
    CHECK(qkv.gemm.m == the_op(u, OpName::kQkvProj).gemm.m);
    const Op& proj = the_op(g, OpName::kOutProj);
    CHECK(proj.kind == OpKind::kFusedGemmComm);
    CHECK(proj.comm.userbuffers);
    CHECK(proj.comm.collective == Collective::kReduceScatter);
    CHECK(proj.comm.bytes == the_op(u, OpName::kAttnRs).comm.bytes);
    CHECK(g.ops.size() == u.ops.size() - 3);  // two forward collectives and the output projection's gather

    const Op& proj_dgrad = the_op(g, OpName::kOutProj, 0, Phase::kBackward, GemmPart::kDgrad);
    CHECK(proj_dgrad.kind == OpKind::kFusedGemmComm);
    CHECK(proj_dgrad.comm.userbuffers);
    CHECK(proj_dgrad.comm.collective == Collective::kAllGather);
    CHECK(the_op(g, OpName::kOutProj, 0, Phase::kBackward, GemmPart::kWgrad).kind == OpKind::kGemm);

    const Op& ag = the_op(g, OpName::kInputAg, 0, Phase::kBackward);
    const Op& dgrad = the_op(g, OpName::kQkvProj, 0, Phase::kBackward, GemmPart::kDgrad);
    const Op& wgrad = the_op(g, OpName::kQkvProj, 0, Phase::kBackward, GemmPart::kWgrad);
    const Op& rs = the_op(g, OpName::kAttnAg, 0, Phase::kBackward);
    CHECK(dgrad.kind == OpKind::kGemm);
    CHECK(wgrad.kind == OpKind::kGemm);
    CHECK(ag.comm.userbuffers);
    CHECK(rs.comm.userbuffers);
    CHECK(ag.comm.collective == Collective::kAllGather);
    CHECK(rs.comm.collective == Collective::kReduceScatter);
    CHECK(ag.stream == Stream::kTpComm);
    CHECK(rs.stream == Stream::kTpComm);
    CHECK(ag.comm.bytes == qkv.comm.bytes);
    CHECK(rs.comm.bytes == qkv.comm.bytes);
    CHECK(depends(g, wgrad, ag));
    CHECK_FALSE(depends(g, dgrad, ag));
    CHECK(depends(g, rs, dgrad));
    CHECK_FALSE(depends(g, rs, wgrad));
    CHECK(
        depends(g, the_op(g, OpName::kAttnNorm, 0, Phase::kBackward), rs));  // the gradient flows through it

    // The dense MLP's and the shared experts' linears alike (Llama 4 Maverick: a dense layer, then an MoE
    // layer with a shared expert).
    const OpGraph m = lower(llama4_two_layers(), tp2_userbuffers_plan(), stack_options("megatron-core"));
    for (OpName n : {OpName::kFfnAg, OpName::kFfnRs, OpName::kSharedAg, OpName::kSharedRs}) {
      CAPTURE(static_cast<int>(n));
      CHECK(ops_named(m, n, -1).empty());
    }
    for (OpName n : {OpName::kFc13, OpName::kSharedFc13, OpName::kFc2, OpName::kSharedFc2}) {
      CAPTURE(static_cast<int>(n));
      const std::vector<const Op*> ops = ops_named(m, n, -1);
      REQUIRE(ops.size() == 1);
      CHECK(ops[0]->comm.userbuffers);
      CHECK(ops[0]->comm.collective == (n == OpName::kFc13 || n == OpName::kSharedFc13
                                            ? Collective::kAllGather
                                            : Collective::kReduceScatter));
    }
    CHECK(ops_named(m, OpName::kExpertFc13, -1).size() == 1);
    CHECK(ops_named(m, OpName::kExpertFc13, -1)[0]->kind ==
          OpKind::kGroupedGemm);  // the experts' linears never

    // Not on moerun's stack, nor for MLA (DeepSeek-V3), whose linears switch the overlap off.
    const OpGraph own = lower(mixtral(1), p, stack_options("moerun"));
    CHECK(the_op(own, OpName::kQkvProj).kind == OpKind::kGemm);
    CHECK(ops_named(own, OpName::kAttnAg).size() == 1);
    Plan ds = p;
    ds.experts.ep = 8;
    const OpGraph mla = lower(deepseek_v3(1, 0), ds, stack_options("megatron-core"));
    for (const Op& op : mla.ops) CHECK_FALSE(op.comm.userbuffers);
  }

  TEST_CASE("the alltoall dispatcher sorts chunks only when a rank holds more than one expert") {
    // ep 8 over 8 experts: one local expert, no sort by expert, and no ETP collectives with etp 1.
    const OpGraph g = lower(mixtral(1), node_plan(8), stack_options("megatron-core"));
    CHECK(ops_named(g, OpName::kSortChunks).empty());
    CHECK(ops_named(g, OpName::kUnsortChunks).empty());
    CHECK(ops_named(g, OpName::kEtpAg).empty());
    CHECK(ops_named(g, OpName::kEtpRs).empty());
    CHECK(ops_named(g, OpName::kDispatchA2a).size() == 1);
  }

  TEST_CASE("Megatron's allgather dispatcher moves one copy of the tokens whatever top-k is") {
    // All-gather over EP of each rank's [t, h] bf16 tokens with its [t, E] routing map (1 byte) and probs
    // (bf16): t ep (2h + 3E) bytes; the combine reduce-scatters [t ep, h] in the probs dtype: t ep h 2.
    const double t = 4096, h = 4096, e = 8, ep = 8;
    for (int64_t k : {2, 4}) {
      CAPTURE(k);
      ModelSpec m = mixtral(1);
      m.moe.top_k = k;
      Plan p = node_plan(8);
      p.experts.dispatch = Dispatch::kAllGather;
      const OpGraph g = lower(m, p, stack_options("megatron-core"));
      const Op& ag = the_op(g, OpName::kDispatchAg);
      CHECK(ag.comm.collective == Collective::kAllGather);
      CHECK(ag.comm.bytes == doctest::Approx(t * ep * (2 * h + 3 * e)));
      CHECK(the_op(g, OpName::kCombineRs).comm.bytes == doctest::Approx(t * ep * h * 2));
      CHECK(ops_named(g, OpName::kDispatchA2a).empty());
      CHECK(ops_named(g, OpName::kProbsA2a).empty());
    }
  }

  TEST_CASE("with ETP the allgather dispatcher gathers over ETP x EP once, still one copy of the tokens") {
    // MoEAllGatherTokenDispatcher gathers tokens, routing map and probs over tp_ep_group (ETP x EP) and
    // reduce-scatters the outputs over the same group (token_dispatcher.py): ep 4 x etp 2 = 8 ranks,
    // t ep etp (2h + 3E) bytes in, t ep etp h 2 out, no separate ETP collectives, whatever k is.
    const double t = 4096, h = 4096, e = 8, span = 8;
    for (int64_t k : {2, 4}) {
      CAPTURE(k);
      ModelSpec m = mixtral(1);
      m.moe.top_k = k;
      Plan p = node_plan(4, 2);
      p.experts.dispatch = Dispatch::kAllGather;
      const OpGraph g = lower(m, p, stack_options("megatron-core"));
      const Op& ag = the_op(g, OpName::kDispatchAg);
      CHECK(ag.comm.group_size == 8);
      CHECK(ag.comm.bytes == doctest::Approx(t * span * (2 * h + 3 * e)));
      const Op& rs = the_op(g, OpName::kCombineRs);
      CHECK(rs.comm.group_size == 8);
      CHECK(rs.comm.bytes == doctest::Approx(t * span * h * 2));
      CHECK(ops_named(g, OpName::kEtpAg).empty());
      CHECK(ops_named(g, OpName::kEtpRs).empty());
    }
  }

  TEST_CASE("node-deduplicated volumes reproduce the distinct nodes and ranks DeepEP's tests imply") {
    // T = 4096, H = 7168, k = 8, E = 256 on nodes of 8 GPUs. DeepEP's tests make one expert group per node
    // and route each token within its best min(N, 4) groups; kernel_facts.md §1.7 derives, per token, the
    // distinct destination nodes D_node, the chance P_own its own node is one, and the distinct ranks D_rank.
    struct Case {
      int64_t ranks, groups, group_top_k;
      double nodes, own, dest_ranks;
    };
    const Case cases[] = {
        {8, 1, 1, 1.0, 1.0, 5.295},       // EP8 intranode, no groups
        {16, 2, 2, 1.993, 0.997, 6.523},  // EP16, 2 nodes, 2 groups
        {32, 4, 4, 3.614, 0.904, 7.267},  // EP32, 4 nodes, 4 groups
        {64, 8, 4, 3.629, 0.454, 7.359},  // EP64, 8 nodes, node limit 4 of 8 groups
    };
    for (const Case& c : cases) {
      CAPTURE(c.ranks);
      const DedupVolumes v = dedup_volumes(256, 8, c.ranks, 8, c.groups, c.group_top_k);
      CHECK_MESSAGE(rounds_to(v.nodes, c.nodes), v.nodes);
      CHECK_MESSAGE(rounds_to(v.own_node, c.own), v.own_node);
      CHECK_MESSAGE(rounds_to(v.ranks, c.dest_ranks), v.ranks);
    }
  }

  TEST_CASE(
      "DeepEP's dispatch and combine carry one row per token and destination rank, one per remote node") {
    // DeepSeek-V3 MoE layer at EP64 on 8 nodes (node limit 4 of 8 groups), T = 4096 tokens per rank,
    // H = 7168: both exchanges receive T D_rank rows over NVLink (7.359 per token) and send T (D_node -
    // P_own) rows over RDMA (3.629 - 0.454); BF16 rows are 2H bytes, FP8 dispatch rows H (1 + 4/128).
    Plan p = dedup_plan(64);
    const double t = 4096, h = 7168, d_rank = 7.359, remote = 3.629 - 0.454;
    for (auto precision : {DispatchPrecision::kBf16, DispatchPrecision::kFp8}) {
      p.compression.dispatch = precision;
      const OpGraph g = lower(deepseek_v3(0, 1), p, stack_options("megatron-core-deepep"));
      const Op& disp = the_op(g, OpName::kDispatchA2a);
      const Op& comb = the_op(g, OpName::kCombineA2a);
      const double row = precision == DispatchPrecision::kFp8 ? h * (1 + 4.0 / 128) : 2 * h;
      for (const Op* op : {&disp, &comb}) {
        CHECK(op->comm.node_dedup);
        CHECK(op->comm.group_size == 64);
        CHECK(op->comm.nic_bytes_scale == rel(remote / d_rank).epsilon(1e-3));
      }
      CHECK(disp.comm.bytes == doctest::Approx(t * d_rank * row).epsilon(1e-3));
      CHECK(comb.comm.bytes == doctest::Approx(t * d_rank * 2 * h).epsilon(1e-3));
    }
  }

  TEST_CASE("node-limited routing lowers DeepEP's NIC bytes") {
    // EP64 on 8 nodes: within 4 of 8 groups a token leaves its node for 3.629 - 0.454 = 3.175 remote nodes;
    // unlimited, for 8 (1 - C(224, 8) / C(256, 8)) (1 - 1/8) = 4.633.
    Plan p = dedup_plan(64);
    auto nic_rows = [&](const ModelSpec& m) {
      const OpGraph g = lower(m, p, stack_options("megatron-core-deepep"));
      const Op& op = the_op(g, OpName::kDispatchA2a);
      return op.comm.bytes * op.comm.nic_bytes_scale / (2 * 7168.0);
    };
    ModelSpec limited = deepseek_v3(0, 1);
    ModelSpec unlimited = limited;
    unlimited.moe.group_top_k = unlimited.moe.groups;
    CHECK(nic_rows(limited) / 4096 == doctest::Approx(3.175).epsilon(1e-3));
    CHECK(nic_rows(unlimited) / 4096 == doctest::Approx(4.633).epsilon(1e-3));
  }

  TEST_CASE("HybridEP dispatches already permuted: no local permute around the exchanges") {
    // HybridEP all-gathers the routing map and preprocesses it instead of DeepEP's layout and notify kernels:
    // one set-up op (the stack prices the whole set-up per node count, as HybridEP's benchmark measures it).
    Plan p = dedup_plan(16);
    const OpGraph deepep = lower(deepseek_v3(0, 1), p, stack_options("megatron-core-deepep"));
    const OpGraph hybrid = lower(deepseek_v3(0, 1), p, stack_options("megatron-core-hybridep"));
    CHECK(ops_named(deepep, OpName::kPermute).size() == 1);
    CHECK(ops_named(deepep, OpName::kDispatchLayout).size() == 1);
    CHECK(ops_named(deepep, OpName::kDispatchNotify).size() == 1);
    CHECK(ops_named(hybrid, OpName::kPermute).empty());
    CHECK(ops_named(hybrid, OpName::kDispatchLayout).empty());
    REQUIRE(ops_named(hybrid, OpName::kDispatchPreprocess).size() == 1);
    CHECK(the_op(hybrid, OpName::kDispatchPreprocess).comm.group_size == 16);
    CHECK(the_op(hybrid, OpName::kDispatchA2a).comm.bytes ==
          doctest::Approx(the_op(deepep, OpName::kDispatchA2a).comm.bytes));
  }

  TEST_CASE("DeepEP's fused index conversion: one kernel each way and no host wait before the permute") {
    // Megatron's fused_indices_to_multihot (--enable-experimental): a Triton kernel per direction replaces
    // the eager conversion's 3 waits and 14 + 3 kernels; the wait for the received counts stays.
    Plan p = dedup_plan(16);
    p.experts.fused_index_conversion = true;
    const OpGraph g = lower(deepseek_v3(0, 1), p, stack_options("megatron-core-deepep"));
    int waits = 0;
    for (const Op& op : g.ops) waits += op.host_sync ? 1 : 0;
    CHECK(waits == 1);
    const Op& index = the_op(g, OpName::kPermuteIndex);
    CHECK(index.kernels == 1);
    CHECK(the_op(g, OpName::kPermuteIndex, 0, Phase::kBackward).kernels == 1);
    // Reads int64 indices and fp32 probs per (token, top-k), writes a bool, an fp32 and an int32 entry per
    // (token, local expert): 12 k + 9 E bytes per received token.
    const OpGraph eager_graph =
        lower(deepseek_v3(0, 1), dedup_plan(16), stack_options("megatron-core-deepep"));
    const Op& eager = the_op(eager_graph, OpName::kPermuteIndex);
    const double e_local = 256.0 / 16, k = 8;
    // The eager conversion writes 33 bytes per (token, local expert): the same received tokens.
    const double received = eager.hbm_bytes / (33.0 * e_local);
    CHECK(index.hbm_bytes == doctest::Approx(received * (12.0 * k + 9.0 * e_local)));
    const auto on = g.deps_of(the_op(g, OpName::kPermute));
    REQUIRE(on.size() == 1);
    CHECK(g.ops[static_cast<size_t>(on[0])].name == static_cast<uint16_t>(OpName::kPermuteIndex));
    // A stack without an eager conversion (HybridEP) has nothing to fuse.
    CHECK(
        ops_named(lower(deepseek_v3(0, 1), p, stack_options("megatron-core-hybridep")), OpName::kPermuteIndex)
            .empty());
  }

  TEST_CASE(
      "DeepEP in Megatron waits for the counts, then three times more before the permute, and HybridEP "
      "once") {
    // The stacks' permute_host_waits: _indices_to_multihot's indices[mask], repeat_interleave and probs[mask]
    // each read a size the GPU computed (Megatron-Core without experimental features).
    Plan p = dedup_plan(16);
    const OpGraph deepep = lower(deepseek_v3(0, 1), p, stack_options("megatron-core-deepep"));
    const OpGraph hybrid = lower(deepseek_v3(0, 1), p, stack_options("megatron-core-hybridep"));
    auto syncs = [](const OpGraph& g, Phase phase) {
      int n = 0;
      for (const Op& op : g.ops) n += (op.host_sync && op.phase == phase) ? 1 : 0;
      return n;
    };
    CHECK(syncs(deepep, Phase::kForward) == 4);
    CHECK(syncs(deepep, Phase::kBackward) == 0);
    CHECK(syncs(hybrid, Phase::kForward) == 1);
    // The rest of the conversion (the stack's permute_index_kernels: 14 forward, 3 backward) runs between
    // the last wait and the permute; the last wait follows the dispatch.
    const Op& index = the_op(deepep, OpName::kPermuteIndex);
    CHECK(index.kernels == 14);
    CHECK(the_op(deepep, OpName::kPermuteIndex, 0, Phase::kBackward).kernels == 3);
    CHECK(ops_named(hybrid, OpName::kPermuteIndex).empty());
    const auto on_index = deepep.deps_of(the_op(deepep, OpName::kPermute));
    REQUIRE(on_index.size() == 1);
    CHECK(deepep.ops[static_cast<size_t>(on_index[0])].name == static_cast<uint16_t>(OpName::kPermuteIndex));
    const auto on = deepep.deps_of(index);
    REQUIRE(on.size() == 1);
    const Op& wait = deepep.ops[static_cast<size_t>(on[0])];
    CHECK(wait.host_sync);
    std::vector<int32_t> frontier(deepep.deps_of(wait).begin(), deepep.deps_of(wait).end());
    bool after_dispatch = false;
    for (int hops = 0; hops < 3 && !frontier.empty() && !after_dispatch; ++hops) {
      std::vector<int32_t> next;
      for (int32_t x : frontier) {
        const Op& op = deepep.ops[static_cast<size_t>(x)];
        after_dispatch |= op.name == static_cast<uint16_t>(OpName::kDispatchA2a);
        for (int32_t y : deepep.deps_of(op)) next.push_back(y);
      }
      frontier = next;
    }
    CHECK(after_dispatch);
  }

  // ---- recompute ----

  TEST_CASE("selective recompute re-runs exactly the ops of the plan's Megatron modules") {
    // One MoE layer under Megatron-Core: moe_act re-runs the expert activation, core_attn the attention core,
    // layernorm the pre-MLP norm (TE fuses the attention norm into the QKV GEMM); under MLA (DeepSeek-V3)
    // mla_up_proj re-runs the q and kv up-projections with their fused latent norms, and RoPE.
    using Names = std::multiset<std::string>;
    struct Case {
      uint16_t modules;
      bool mla;
      Names want;
    };
    const Case cases[] = {
        {kRecomputeMoeAct, false, Names{"expert_act"}},
        {kRecomputeCoreAttn, false, Names{"attn_core"}},
        {kRecomputeLayernorm, false, Names{"ffn_norm"}},
        {kRecomputeMlaUpProj, true, Names{"mla_latent_norm", "q_up", "mla_latent_norm", "kv_up", "rope"}},
        {kRecomputeCoreAttn | kRecomputeMoeAct, false, Names{"attn_core", "expert_act"}},
    };
    for (const Case& c : cases) {
      CAPTURE(c.modules);
      Plan p = node_plan(c.mla ? 8 : 4);
      p.recompute = Recompute::kSelective;
      p.recompute_modules = c.modules;
      const OpGraph g = lower(c.mla ? deepseek_v3(0, 1) : mixtral(1), p, stack_options("megatron-core"));
      CHECK(name_set(g, 0, 0, Phase::kRecompute) == c.want);
    }
  }

  TEST_CASE("the moe recompute module re-runs the whole MoE layer, its exchanges and host wait included") {
    // Everything the forward runs from the pre-MLP norm to the final unpermute (the residual add after it is
    // outside the MoE layer), before the layer's first backward op.
    Plan p = node_plan(4);
    p.recompute = Recompute::kSelective;
    p.recompute_modules = kRecomputeMoe;
    const OpGraph g = lower(mixtral(1), p, stack_options("megatron-core"));
    const auto fwd = names(g, 0, 0, Phase::kForward);
    const auto first = std::find(fwd.begin(), fwd.end(), "ffn_norm");
    const auto last = std::find(fwd.rbegin(), fwd.rend(), "unpermute");
    REQUIRE(first != fwd.end());
    REQUIRE(last != fwd.rend());
    const std::multiset<std::string> re = name_set(g, 0, 0, Phase::kRecompute);
    CHECK(re == std::multiset<std::string>(first, last.base()));
    for (const char* n :
         {"router", "dispatch_a2a", "probs_a2a", "dispatch_sync", "combine_a2a", "expert_fc2"})
      CHECK_MESSAGE(re.count(n) == 1, n);
    int32_t last_re = -1, first_bwd = -1;
    for (const Op& op : g.ops) {
      if (op.layer != 0 || op.micro_batch != 0) continue;
      if (op.phase == Phase::kRecompute) last_re = op.id;
      if (op.phase == Phase::kBackward && first_bwd < 0) first_bwd = op.id;
    }
    CHECK(last_re < first_bwd);
  }

  TEST_CASE("full recompute re-runs every layer (uniform) or the first N layers of each chunk (block)") {
    // Four Mixtral layers. uniform: each layer's recompute is its whole forward. block N: the layers at
    // positions < N of their pipeline chunk (pp 2: layers 0-1 on stage 0, 2-3 on stage 1).
    const ModelSpec m = mixtral(4);
    auto recomputed = [&](const Plan& p) {
      const OpGraph g = lower(m, p, stack_options("megatron-core"));
      std::vector<int> out;
      for (int32_t l = 0; l < 4; ++l) {
        const auto re = name_set(g, l, 0, Phase::kRecompute);
        if (re.empty()) continue;
        CHECK(re == name_set(g, l, 0, Phase::kForward));
        out.push_back(l);
      }
      return out;
    };
    Plan p = node_plan(4);
    p.recompute = Recompute::kFull;
    CHECK(recomputed(p) == std::vector<int>{0, 1, 2, 3});
    p.recompute_method = RecomputeMethod::kBlock;
    p.recompute_num_layers = 2;
    CHECK(recomputed(p) == std::vector<int>{0, 1});
    p.pipeline.pp = 2;
    p.recompute_num_layers = 1;
    CHECK(recomputed(p) == std::vector<int>{0, 2});
  }

  TEST_CASE("SAR re-runs MegaScale-MoE's set: norms, activations and communication, never a GEMM") {
    // moerun's lowering of one Mixtral layer with tp 2, ep 4. SAR drops what memory-bound and communication
    // operators produce and keeps what GEMMs and attention produce (megascale-moe.md §6): it re-runs the
    // attention norm and its TP all-gather, the pre-MLP norm, the permute, the dispatch and the expert
    // SwiGLU.
    Plan p = node_plan(4);
    p.attention.tp = 2;
    p.recompute = Recompute::kSar;
    const OpGraph g = lower(mixtral(1), p, {});
    CHECK(name_set(g, 0, 0, Phase::kRecompute) == std::multiset<std::string>{"attn_norm", "attn_ag",
                                                                             "ffn_norm", "permute",
                                                                             "dispatch_a2a", "expert_act"});
    for (const Op& op : g.ops) {
      if (op.phase == Phase::kRecompute)
        CHECK((op.kind == OpKind::kMemoryBound || op.kind == OpKind::kCollective));
    }
  }

  // ---- combined 1F1B (cross-micro-batch overlap) ----

  TEST_CASE("combined 1F1B at pp 1 runs F0, then each forward beside the previous backward, then the last") {
    // F0, (F1|B0), (F2|B1), (F3|B2), B3 (schedules.py combined 1F1B); plain 1F1B at pp 1 alternates F, B.
    const auto order = pipeline_order(0, 1, 1, 4, true);
    REQUIRE(order.size() == 8);
    const std::vector<std::tuple<bool, int, bool>> want = {
        {true, 0, false},  {true, 1, true}, {false, 0, false}, {true, 2, true},
        {false, 1, false}, {true, 3, true}, {false, 2, false}, {false, 3, false}};
    for (size_t i = 0; i < order.size(); ++i) {
      CAPTURE(i);
      CHECK(std::tuple<bool, int, bool>{order[i].forward, order[i].micro_batch, order[i].paired} == want[i]);
    }
    for (const auto& t : pipeline_order(0, 1, 1, 4)) CHECK_FALSE(t.paired);
    CHECK(pipeline_order(0, 1, 1, 4)[1].forward == false);
  }

  TEST_CASE("combined 1F1B warms up one more forward than interleaved 1F1B and pairs each later forward") {
    for (int64_t stage = 0; stage < 4; ++stage) {
      CAPTURE(stage);
      // Forwards before the first backward: the warm-up and the first steady-state forward.
      auto leading_forwards = [](const std::vector<PipelineTask>& o) {
        size_t n = 0;
        while (n < o.size() && o[n].forward) ++n;
        return n;
      };
      const auto plain = pipeline_order(stage, 4, 2, 8);
      const auto combined = pipeline_order(stage, 4, 2, 8, true);
      CHECK(leading_forwards(combined) == leading_forwards(plain) + 1);
      CHECK_FALSE(combined[leading_forwards(combined) - 2].paired);  // the last warm-up forward runs alone
      std::map<std::tuple<int, int, bool>, int> seen;
      for (size_t i = 0; i < combined.size(); ++i) {
        const auto& t = combined[i];
        ++seen[{t.micro_batch, t.chunk, t.forward}];
        if (t.paired) {
          REQUIRE(i + 1 < combined.size());
          CHECK_FALSE(combined[i + 1].forward);
        }
      }
      CHECK(seen.size() == 8 * 2 * 2);
    }
  }

  TEST_CASE(
      "a combined pair interleaves forward layer i with backward layer n-1-i, exchanges on the comm stream") {
    // Four Mixtral layers on one node, ep 8, Megatron-Core, three micro-batches: the pair (F1 | B0). Per
    // layer pair Megatron runs combine_bwd | pre_dispatch_fwd | mlp_bwd | dispatch_fwd | dispatch_bwd |
    // mlp_fwd | combine_fwd | pre_dispatch_bwd (model_chunk_schedule_plan.py:236-303): six switches between
    // the two passes per layer pair, each between forward layer i and backward layer 3 - i.
    Plan p = node_plan(8);
    p.global_batch = 24;
    p.overlap.cross_micro_batch = true;
    const OpGraph g = lower(mixtral(4), p, stack_options("megatron-core"));
    std::vector<std::pair<bool, int32_t>> pass;  // (forward, layer) of the pair's layer ops in emission order
    for (const Op& op : g.ops) {
      const bool fwd = op.phase == Phase::kForward;
      if (op.layer >= 0 && ((fwd && op.micro_batch == 1) || (!fwd && op.micro_batch == 0)))
        pass.emplace_back(fwd, op.layer);
    }
    int switches = 0;
    for (size_t i = 1; i < pass.size(); ++i) {
      if (pass[i].first == pass[i - 1].first) continue;
      ++switches;
      CHECK(pass[i].second + pass[i - 1].second == 3);
    }
    CHECK(switches == 6 * 4);
    for (const Op& op : g.ops) {
      if (op.layer < 0) continue;
      const auto n = static_cast<OpName>(op.name);
      if (n == OpName::kDispatchA2a || n == OpName::kProbsA2a || n == OpName::kCombineA2a)
        CHECK(op.stream == Stream::kComm);
      if (n == OpName::kDispatchSync) CHECK(op.stream != Stream::kComm);
      if (n == OpName::kExpertFc13) CHECK(op.stream == Stream::kCompute);
    }
    // Without the overlap the exchanges stay on the compute stream (Megatron runs them in line).
    p.overlap.cross_micro_batch = false;
    const OpGraph plain = lower(mixtral(4), p, stack_options("megatron-core"));
    CHECK(the_op(plain, OpName::kDispatchA2a).stream == Stream::kCompute);
  }

  TEST_CASE("combined 1F1B nodes wait for the whole node before them, and delayed weight gradients do not") {
    // Megatron's nodes of one micro-batch share one CUDA event: each waits on it, then records it after its
    // last kernel (pipeline_parallel/utils.py ScheduleNode.stream_acquire_context); backward_dw runs after
    // the record (models/common/utils.py TransformerLayerNode.backward_dw). So without
    // --delay-wgrad-compute the backward dispatch waits for the experts' weight gradients and the next
    // layer's backward combine for attention's; with it, they are issued later and neither waits for them.
    // Pair (F1 | B0) of four Mixtral layers: backward layer 2 of micro-batch 0 beside forward layer 1.
    Plan p = node_plan(8);
    p.global_batch = 24;
    p.overlap.cross_micro_batch = true;
    for (bool delay : {false, true}) {
      CAPTURE(delay);
      p.overlap.delay_wgrad = delay;
      const OpGraph g = lower(mixtral(4), p, stack_options("megatron-core"));
      auto only = [&](OpName n, int32_t layer, int32_t mb, Phase phase, GemmPart part = GemmPart::kNone) {
        const Op* found = nullptr;
        for (const Op& op : g.ops) {
          if (static_cast<OpName>(op.name) != n || op.layer != layer || op.micro_batch != mb ||
              op.phase != phase || op.part != part)
            continue;
          REQUIRE(found == nullptr);
          found = &op;
        }
        REQUIRE(found != nullptr);
        return found;
      };
      auto wgrads = [&](std::initializer_list<OpName> names) {
        std::vector<int32_t> ids;
        for (const Op& op : g.ops) {
          if (op.layer == 2 && op.micro_batch == 0 && op.part == GemmPart::kWgrad &&
              std::find(names.begin(), names.end(), static_cast<OpName>(op.name)) != names.end())
            ids.push_back(op.id);
        }
        REQUIRE_FALSE(ids.empty());
        return std::pair{*std::min_element(ids.begin(), ids.end()),
                         *std::max_element(ids.begin(), ids.end())};
      };
      // The latest compute-stream op it waits for, through any chain of dependencies.
      auto latest_wait = [&](const Op* op) {
        int32_t latest = -1;
        std::vector<int32_t> todo(g.deps_of(*op).begin(), g.deps_of(*op).end());
        std::set<int32_t> seen;
        while (!todo.empty()) {
          const int32_t w = todo.back();
          todo.pop_back();
          if (!seen.insert(w).second) continue;
          const Op& on = g.ops[static_cast<size_t>(w)];
          if (on.stream == Stream::kCompute) latest = std::max(latest, w);
          todo.insert(todo.end(), g.deps_of(on).begin(), g.deps_of(on).end());
        }
        return latest;
      };
      const auto [expert_first, expert_last] = wgrads({OpName::kExpertFc13, OpName::kExpertFc2});
      const auto [attn_first, attn_last] = wgrads({OpName::kQkvProj, OpName::kOutProj});
      const Op* dispatch_bwd = only(OpName::kDispatchA2a, 2, 0, Phase::kBackward);
      const Op* combine_bwd_next = only(OpName::kCombineA2a, 1, 0, Phase::kBackward);
      REQUIRE(dispatch_bwd->stream == Stream::kComm);
      REQUIRE(combine_bwd_next->stream == Stream::kComm);
      if (!delay) {
        // The compute stream runs in order: waiting for an op at or after the last weight gradient waits for
        // all of them.
        CHECK(latest_wait(dispatch_bwd) >= expert_last);
        CHECK(latest_wait(combine_bwd_next) >= attn_last);
      } else {
        // Issued after the forward dispatch of micro-batch 1 (layer 1), before the backward dispatch, which
        // waits only for ops before them; attention's after its node, before the next layer's combine.
        CHECK(expert_first > only(OpName::kDispatchA2a, 1, 1, Phase::kForward)->id);
        CHECK(expert_last < dispatch_bwd->id);
        CHECK(latest_wait(dispatch_bwd) < expert_first);
        CHECK(
            attn_first >
            only(OpName::kQkvProj, 2, 0, Phase::kBackward, GemmPart::kDgrad)->id);  // after its node's dgrads
        CHECK(attn_last < combine_bwd_next->id);
        CHECK(latest_wait(combine_bwd_next) < attn_first);
      }
    }
  }

  // ---- work beside the GEMMs ----

  TEST_CASE(
      "Megatron's router launches the kernels its source runs, forward and backward, and moerun's one") {
    // Counted from Megatron-LM's router (1e057005 unfused, 2edffadb fused; see megatron_router_kernels):
    // a softmax router with the switch aux loss, and DeepSeek-V3's sigmoid router with its score bias, 8
    // groups, scaling 2.5 and the sequence aux loss; +1 each for the aux loss's collective when TP splits
    // the sequence.
    struct Row {
      bool deepseek, fused, partitioned;
      int forward, backward;
    };
    for (const Row& r :
         {Row{false, false, false, 21, 13}, Row{false, false, true, 22, 13}, Row{false, true, true, 7, 10},
          Row{true, false, false, 46, 29}, Row{true, false, true, 47, 30}, Row{true, true, true, 10, 11}}) {
      CAPTURE(r.deepseek);
      CAPTURE(r.fused);
      CAPTURE(r.partitioned);
      const ModelSpec m = r.deepseek ? deepseek_v3(0, 1) : mixtral(1);
      const RouterKernels k = megatron_router_kernels(m.moe, r.fused, r.partitioned);
      CHECK(k.forward == r.forward);
      CHECK(k.backward == r.backward);
      // The graph carries them: the router's top-k op forward and its backward (TP 2 splits the sequence).
      Plan p = node_plan(8);
      p.attention.tp = r.partitioned ? 2 : 1;
      p.routing.fused_router = r.fused;
      const OpGraph g = lower(m, p, stack_options("megatron-core"));
      CHECK(the_op(g, OpName::kRouterTopk).kernels == r.forward);
      CHECK(the_op(g, OpName::kRouterTopk, 0, Phase::kBackward).kernels == r.backward);
      // moerun runs its router as one kernel each way, fused or not.
      const OpGraph own = lower(m, p, stack_options("moerun"));
      CHECK(the_op(own, OpName::kRouterTopk).kernels == 1);
      CHECK(the_op(own, OpName::kRouterTopk, 0, Phase::kBackward).kernels == 1);
    }
    // DeepSeek-V3's router, forward and backward together, against Megatron's GB200 notes (3c1b98ef^, l.85:
    // "72" kernels before fusion): within 10 %.
    const RouterKernels ds = megatron_router_kernels(deepseek_v3(0, 1).moe, false, true);
    CHECK(std::abs(ds.forward + ds.backward - 72) <= 7);
  }

  TEST_CASE("the loss moves the bytes of the plan's cross-entropy kernels over the [t, V / tp] logits") {
    // Per logit, forward / backward: TE 6 / 4 (two reads of the bf16 logits, the gradient written in place,
    // then scaled), native fusion 22 / 18 (its backward copies the mutated softmax, then multiplies, writes
    // it back and casts), unfused 42 / 14; moerun's one fused kernel 12 / 8 whatever the plan. The two
    // Megatron implementations are memory-bound kinds of their own, for their measured rates.
    const ModelSpec m = mixtral(1);
    const double logits = 4096.0 * static_cast<double>(m.vocab);
    auto loss_op = [&](const char* stack, CrossEntropy ce, Phase phase) {
      Plan p = node_plan(8);
      p.cross_entropy = ce;
      const OpGraph g = lower(m, p, stack_options(stack));
      for (const Op& op : g.ops)
        if (op.name == static_cast<uint16_t>(OpName::kLoss) && op.phase == phase) return op;
      return Op{};
    };
    auto loss_bytes = [&](const char* stack, CrossEntropy ce, Phase phase) {
      return loss_op(stack, ce, phase).hbm_bytes;
    };
    CHECK(loss_bytes("megatron-core", CrossEntropy::kTe, Phase::kForward) == doctest::Approx(6 * logits));
    CHECK(loss_bytes("megatron-core", CrossEntropy::kTe, Phase::kBackward) == doctest::Approx(4 * logits));
    CHECK(loss_bytes("megatron-core", CrossEntropy::kNative, Phase::kForward) ==
          doctest::Approx(22 * logits));
    CHECK(loss_bytes("megatron-core", CrossEntropy::kNative, Phase::kBackward) ==
          doctest::Approx(18 * logits));
    CHECK(loss_bytes("megatron-core", CrossEntropy::kUnfused, Phase::kForward) ==
          doctest::Approx(42 * logits));
    CHECK(loss_bytes("megatron-core", CrossEntropy::kUnfused, Phase::kBackward) ==
          doctest::Approx(14 * logits));
    CHECK(loss_bytes("moerun", CrossEntropy::kUnfused, Phase::kForward) == doctest::Approx(12 * logits));
    CHECK(loss_bytes("moerun", CrossEntropy::kTe, Phase::kBackward) == doctest::Approx(8 * logits));
    CHECK(loss_op("megatron-core", CrossEntropy::kUnfused, Phase::kForward).mem == MemOp::kLossUnfused);
    CHECK(loss_op("megatron-core", CrossEntropy::kNative, Phase::kBackward).mem == MemOp::kLossNative);
    CHECK(loss_op("megatron-core", CrossEntropy::kTe, Phase::kForward).mem == MemOp::kLoss);
    CHECK(loss_op("moerun", CrossEntropy::kUnfused, Phase::kForward).mem == MemOp::kLoss);
  }

  TEST_CASE("a gated activation reads 2F and writes F forward, and moves 5F per row backward") {
    // SwiGLU over the expert rows: forward reads gate and up (2F) and writes F; its gradient reads the
    // incoming gradient (F) and the saved input (2F) and writes the input's gradient (2F). A gated unit is
    // the memory-bound kind kGlu, for the stack's measured rate; the recomputation moves the forward's bytes.
    const ModelSpec m = mixtral(1);
    Plan p = node_plan(8);
    const OpGraph g = lower(m, p, stack_options("megatron-core"));
    const Op& fwd = the_op(g, OpName::kExpertAct);
    const Op& bwd = the_op(g, OpName::kExpertAct, 0, Phase::kBackward);
    CHECK(fwd.mem == MemOp::kGlu);
    CHECK(bwd.mem == MemOp::kGlu);
    CHECK(bwd.hbm_bytes == doctest::Approx(fwd.hbm_bytes * 5.0 / 3.0));
    CHECK(bwd.kernels == 1);
  }

  TEST_CASE("Megatron stacks run a residual add after each sublayer, dense or MoE, and moerun fuses them") {
    // Megatron's bias-dropout-add after attention and after the MLP, whether the MLP is dense or a MoELayer
    // (TransformerLayer self_attn_bda / mlp_bda): reads the sublayer output and the residual [t, h] and
    // writes the sum, 3 t h x 2 bytes; no backward kernel (the gradient passes through).
    const Plan p = node_plan(8);
    const ModelSpec m = deepseek_v3(1, 1);  // layer 0 dense, layer 1 MoE
    const OpGraph g = lower(m, p, stack_options("megatron-core"));
    for (int32_t layer : {0, 1}) {
      CAPTURE(layer);
      const auto adds = ops_named(g, OpName::kResidualAdd, layer);
      CHECK(adds.size() == 2);
      for (const Op* op : adds) CHECK(op->hbm_bytes == doctest::Approx(3.0 * 4096 * 7168 * 2));
      CHECK(ops_named(g, OpName::kResidualAdd, layer, Phase::kBackward).empty());
    }
    CHECK(ops_named(lower(m, p, stack_options("moerun")), OpName::kResidualAdd, -1).empty());
  }

  TEST_CASE("Megatron's weight gradients accumulate into the main gradient, fp32 unless reduced in bf16") {
    // Every weight-gradient GEMM (dense, grouped, output layer) says the bytes per element of the buffer its
    // epilogue reads and writes; forward and dgrad GEMMs write activations. moerun, and Megatron under
    // ZeRO-2/3, write each gradient once.
    Plan p = node_plan(8);
    const ModelSpec m = deepseek_v3(1, 1);
    auto accum = [&](const OpGraph& g) {
      std::multiset<int> out;
      int wgrads = 0;
      for (const Op& op : g.ops) {
        if (op.kind != OpKind::kGemm && op.kind != OpKind::kGroupedGemm) continue;
        if (op.part == GemmPart::kWgrad) ++wgrads;
        if (op.part != GemmPart::kWgrad) CHECK(op.accum_bytes == 0);
        if (op.part == GemmPart::kWgrad) out.insert(op.accum_bytes);
      }
      CHECK(wgrads > 0);
      return out;
    };
    for (const auto& [sync, bytes] :
         {std::pair{GradSync::kFp32ReduceScatter, 4}, {GradSync::kBf16ReduceScatter, 2}}) {
      CAPTURE(bytes);
      p.compression.grad_sync = sync;
      const auto got = accum(lower(m, p, stack_options("megatron-core")));
      CHECK(got.count(bytes) == got.size());
    }
    p.compression.grad_sync = GradSync::kFp32ReduceScatter;
    const auto moerun = accum(lower(m, p, stack_options("moerun")));
    CHECK(moerun.count(0) == moerun.size());
    // ZeRO-2/3 launch as Megatron-FSDP with --no-gradient-accumulation-fusion (planner/launch.cpp).
    for (int zero : {2, 3}) {
      CAPTURE(zero);
      p.data.zero = zero;
      const auto fsdp = accum(lower(m, p, stack_options("megatron-core")));
      CHECK(fsdp.count(0) == fsdp.size());
    }
  }

  TEST_CASE("Megatron adds GPT-OSS's expert bias per expert and clamps its GLU eagerly, syncing the stream") {
    // GPT-OSS-120B's first layer on one node, EP 8: 16 local experts, 4096 tokens x top-4 = 16,384 rows per
    // rank, h = f = 2880. TEGroupedMLP._apply_bias: per expert t + b * p (bf16 probs: the product writes
    // 2 h, the sum reads 4 h and writes 2 h), then one concatenation (4 h): 12 h bytes per row in 2 x 16 + 1
    // kernels; backward g * p and g * b with their sums (6 h each) and the split's concatenation (4 h):
    // 16 h in 4 x 16 + 1. The clamped GLU: two clamps (4 f) and a concatenation (4 f), 16 f bytes per row in
    // 3 kernels; backward two masked gradients (6 f) and a concatenation (4 f), 20 f; then the offset's
    // host-to-device copy, which waits for the compute stream. Under moe_act recompute the clamps and the
    // wait run again.
    ModelSpec m = io::load_model("gpt-oss-120b").value();
    m.layers.resize(1);
    REQUIRE(m.moe.glu_limit == 7.0);
    Plan p = node_plan(8);
    p.recompute = Recompute::kSelective;
    p.recompute_modules = kRecomputeMoeAct;
    const OpGraph g = lower(m, p, stack_options("megatron-core"));
    const double rows = 4096.0 * 4, h = 2880, f = 2880;
    const Op& bias = the_op(g, OpName::kExpertBias);
    CHECK(bias.hbm_bytes == doctest::Approx(12.0 * rows * h));
    CHECK(bias.kernels == 33);
    const Op& bias_bwd = the_op(g, OpName::kExpertBias, 0, Phase::kBackward);
    CHECK(bias_bwd.hbm_bytes == doctest::Approx(16.0 * rows * h));
    CHECK(bias_bwd.kernels == 65);
    const Op& clamp = the_op(g, OpName::kExpertGluClamp);
    CHECK(clamp.hbm_bytes == doctest::Approx(16.0 * rows * f));
    CHECK(clamp.kernels == 3);
    CHECK(the_op(g, OpName::kExpertGluClamp, 0, Phase::kBackward).hbm_bytes ==
          doctest::Approx(20.0 * rows * f));
    const Op& sync = the_op(g, OpName::kExpertActSync);
    CHECK(sync.host_sync);
    CHECK(sync.stream == Stream::kCompute);
    CHECK(ops_named(g, OpName::kExpertActSync, 0, Phase::kBackward).empty());
    // Program order: fc1, clamps, the wait, the activation, fc2, the bias.
    const auto fwd = names(g, 0, 0, Phase::kForward);
    auto at = [&](const char* n) { return std::find(fwd.begin(), fwd.end(), n) - fwd.begin(); };
    CHECK(at("expert_fc13") < at("expert_glu_clamp"));
    CHECK(at("expert_glu_clamp") < at("expert_act_sync"));
    CHECK(at("expert_act_sync") < at("expert_act"));
    CHECK(at("expert_fc2") < at("expert_bias"));
    CHECK(name_set(g, 0, 0, Phase::kRecompute) ==
          std::multiset<std::string>{"expert_glu_clamp", "expert_act_sync", "expert_act"});
    // The flex dispatchers hand the experts the same counts; moerun runs neither, and nor does a model
    // without biases or clamps on Megatron.
    for (const char* stack : {"megatron-core-deepep", "megatron-core-hybridep"}) {
      CAPTURE(stack);
      Plan q = node_plan(8);
      q.experts.dispatch = Dispatch::kDedup;
      const OpGraph flex = lower(m, q, stack_options(stack));
      CHECK(ops_named(flex, OpName::kExpertBias).size() == 1);
      CHECK(ops_named(flex, OpName::kExpertActSync).size() == 1);
    }
    const OpGraph own = lower(m, node_plan(8), stack_options("moerun"));
    CHECK(ops_named(own, OpName::kExpertBias).empty());
    CHECK(ops_named(own, OpName::kExpertGluClamp).empty());
    const OpGraph plain = lower(mixtral(1), node_plan(8), stack_options("megatron-core"));
    CHECK(ops_named(plain, OpName::kExpertBias).empty());
    CHECK(ops_named(plain, OpName::kExpertActSync).empty());
  }

  TEST_CASE(
      "FP8 pads each expert's rows where the stack pads them: in the experts or the dispatch or the router") {
    // Mixtral-8x7B on one node, ep 4: each rank receives t k = 8192 rows (h = 4096) for its 2 local experts
    // (4096 each), FC1 n = 2 x 14336. FP8 GEMMs take each expert's rows in multiples of 16: a Poisson count
    // with mean 4096 pads 7.5 rows on average. Megatron-Core's TEGroupedMLP pads them itself (TE's
    // Fp8Padding: the rows and the bf16 probs copied into padded buffers, two kernels; Fp8Unpadding: the
    // output copied back, one), the padded rows running through the GEMMs; backward the copies mirror.
    const double t = 4096, k = 2, h = 4096, n = 2 * 14336, rows = t * k, local = 2;
    const double pad = expected_alignment_pad(rows / local, 16);
    CHECK(pad == doctest::Approx(7.5).epsilon(1e-3));
    const double padded = rows + local * pad;
    Plan p = node_plan(4);
    p.precision = Precision::kFp8;
    p.fp8_recipe = Fp8Recipe::kTensorwise;
    {
      const OpGraph g = lower(mixtral(1), p, stack_options("megatron-core"));
      const Op& fc13 = the_op(g, OpName::kExpertFc13);
      CHECK(fc13.flops == rel(2 * padded * n * h));
      const Op& pad_op = the_op(g, OpName::kFp8Pad);
      CHECK(pad_op.hbm_bytes == rel((rows + padded) * (h * 2 + 2)));
      CHECK(pad_op.kernels == 2);
      CHECK(depends(g, fc13, pad_op));
      const Op& unpad = the_op(g, OpName::kFp8Unpad);
      CHECK(unpad.hbm_bytes == rel((padded + rows) * h * 2));
      CHECK(unpad.kernels == 1);
      CHECK(depends(g, unpad, the_op(g, OpName::kExpertFc2)));
      CHECK(the_op(g, OpName::kFp8Pad, 0, Phase::kBackward).hbm_bytes == rel(pad_op.hbm_bytes));
      CHECK(the_op(g, OpName::kFp8Unpad, 0, Phase::kBackward).hbm_bytes == rel(unpad.hbm_bytes));
      CHECK(the_op(g, OpName::kDispatchA2a).comm.bytes == rel(rows * h * 2));
    }
    {
      // --moe-router-padding-for-quantization under the alltoall dispatcher: each rank pads all 8 experts'
      // counts (mean t k / 8 = 1024) in its routing map before the exchange, so the padded rows cross the
      // network and arrive aligned: no copies.
      p.experts.fp8_padding = Fp8Padding::kRouter;
      const OpGraph g = lower(mixtral(1), p, stack_options("megatron-core"));
      const double routed = rows + 8 * expected_alignment_pad(t * k / 8, 16);
      CHECK(ops_named(g, OpName::kFp8Pad).empty());
      CHECK(ops_named(g, OpName::kFp8Unpad).empty());
      CHECK(the_op(g, OpName::kDispatchA2a).comm.bytes == rel(routed * h * 2));
      CHECK(the_op(g, OpName::kExpertFc13).flops == rel(2 * routed * n * h));
      p.experts.fp8_padding = Fp8Padding::kStack;
    }
    {
      // BF16 pads nothing; neither does moerun, whose CUTLASS grouped GEMM takes any row count.
      Plan b = p;
      b.precision = Precision::kBf16;
      const OpGraph g = lower(mixtral(1), b, stack_options("megatron-core"));
      CHECK(ops_named(g, OpName::kFp8Pad).empty());
      CHECK(the_op(g, OpName::kExpertFc13).flops == rel(2 * rows * n * h));
      const OpGraph r = lower(mixtral(1), p, stack_options("moerun"));
      CHECK(ops_named(r, OpName::kFp8Pad).empty());
      CHECK(the_op(r, OpName::kExpertFc13).flops == rel(2 * rows * n * h));
    }
    {
      // HybridEP pads inside its dispatch, and DeepEP's fused permute pads the received rows (TE 2.12+):
      // the GEMMs run the padded rows, without copies (the stacks' own). Before those builds (Megatron-Core
      // 0.14 with TE 2.7) TEGroupedMLP padded DeepEP's rows itself: the plan says experts.
      Plan d = dedup_plan(8);
      d.precision = Precision::kFp8;
      d.fp8_recipe = Fp8Recipe::kTensorwise;
      const OpGraph deepep = lower(mixtral(1), d, stack_options("megatron-core-deepep"));
      const OpGraph hybrid = lower(mixtral(1), d, stack_options("megatron-core-hybridep"));
      d.experts.fp8_padding = Fp8Padding::kExperts;
      const OpGraph deepep_old = lower(mixtral(1), d, stack_options("megatron-core-deepep"));
      CHECK(ops_named(deepep, OpName::kFp8Pad).empty());
      CHECK(ops_named(hybrid, OpName::kFp8Pad).empty());
      CHECK(ops_named(deepep_old, OpName::kFp8Pad).size() == 1);
      CHECK(ops_named(deepep_old, OpName::kFp8Unpad).size() == 1);
      const double one_expert = rows + expected_alignment_pad(rows, 16);  // ep 8: one local expert
      for (const OpGraph* g : {&deepep, &hybrid, &deepep_old}) {
        CHECK(the_op(*g, OpName::kExpertFc13).flops == rel(2 * one_expert * n * h));
      }
    }
  }

  TEST_CASE(
      "under delayed scaling the norms TE fuses into LayerNormLinears write FP8 and their GEMMs only "
      "transpose") {
    // TE v2.4 normalization.cpp: a Float8Quantizer (delayed scaling) takes the fused norm kernel, which
    // writes the FP8 output; current scaling runs the norm in bf16, then amax, scale, cast. The fused norms:
    // the attention norm before QKV (not MLA's, a TENorm of its own), the dense MLP's before FC1, MLA's
    // latent norms before the up projections. Each writes 1 B instead of 2 per output element forward (its
    // backward as before), and its linear's quantisation is the transpose alone: 2 B per input element,
    // not 4. DeepSeek-V3 (h = 7168, dense FFN 18432, q_lora 1536, kv_lora 512) without TP: t = 4096 rows.
    const double t = 4096, h = 7168, q_lora = 1536, kv_lora = 512;
    Plan p = node_plan(8);
    p.precision = Precision::kFp8;
    p.fp8_recipe = Fp8Recipe::kTensorwise;
    const OpGraph current = lower(deepseek_v3(1, 0), p, stack_options("megatron-core"));
    p.fp8_recipe = Fp8Recipe::kDelayed;
    const OpGraph delayed = lower(deepseek_v3(1, 0), p, stack_options("megatron-core"));
    const Op& ffn_norm = the_op(delayed, OpName::kFfnNorm);
    CHECK(ffn_norm.hbm_bytes == rel(the_op(current, OpName::kFfnNorm).hbm_bytes - t * h));
    CHECK(the_op(delayed, OpName::kFfnNorm, 0, Phase::kBackward).hbm_bytes ==
          rel(the_op(current, OpName::kFfnNorm, 0, Phase::kBackward).hbm_bytes));
    CHECK(the_op(delayed, OpName::kFc13).aux_bytes == rel(t * h * 2));
    CHECK(the_op(delayed, OpName::kFc13).aux_kernels == 1);
    CHECK(the_op(delayed, OpName::kFc13, 0, Phase::kBackward, GemmPart::kDgrad).aux_bytes ==
          rel(t * 2 * 18432 * 4));  // the incoming gradient, at the recipe's 4 B
    CHECK(the_op(delayed, OpName::kQUp).aux_bytes == rel(t * q_lora * 2));
    CHECK(the_op(delayed, OpName::kKvUp).aux_bytes == rel(t * kv_lora * 2));
    const auto norms = ops_named(delayed, OpName::kMlaLatentNorm);
    const auto norms_current = ops_named(current, OpName::kMlaLatentNorm);
    REQUIRE(norms.size() == 2);
    REQUIRE(norms_current.size() == 2);
    CHECK(norms[0]->hbm_bytes + norms[1]->hbm_bytes ==
          rel(norms_current[0]->hbm_bytes + norms_current[1]->hbm_bytes - t * (q_lora + kv_lora)));
    // MLA's input norm feeds TE linears of their own: unchanged; the down projections quantise at 4 B.
    CHECK(the_op(delayed, OpName::kAttnNorm).hbm_bytes == rel(the_op(current, OpName::kAttnNorm).hbm_bytes));
    CHECK(the_op(delayed, OpName::kKvDown).aux_bytes == rel(t * h * 4));
    // A grouped-query model's attention norm is fused into qkv_proj.
    const OpGraph gqa = lower(mixtral(1), p, stack_options("megatron-core"));
    p.fp8_recipe = Fp8Recipe::kTensorwise;
    const OpGraph gqa_current = lower(mixtral(1), p, stack_options("megatron-core"));
    CHECK(the_op(gqa, OpName::kAttnNorm).hbm_bytes ==
          rel(the_op(gqa_current, OpName::kAttnNorm).hbm_bytes - 4096.0 * 4096.0));
    // So is a Mamba mixer's and a Gated DeltaNet's input norm into its in_proj (hybrid_layer_specs.py).
    for (const char* name : {"nemotron-3-nano-30b-a3b", "qwen3-next-80b-a3b"}) {
      CAPTURE(name);
      const ModelSpec hybrid = io::load_model(name).value();
      p.fp8_recipe = Fp8Recipe::kDelayed;
      const OpGraph fused = lower(hybrid, p, stack_options("megatron-core"));
      p.fp8_recipe = Fp8Recipe::kTensorwise;
      const OpGraph unfused = lower(hybrid, p, stack_options("megatron-core"));
      const auto in_proj = ops_named(fused, OpName::kMixerInProj, -1);
      const auto in_proj_current = ops_named(unfused, OpName::kMixerInProj, -1);
      REQUIRE_FALSE(in_proj.empty());
      REQUIRE_FALSE(in_proj_current.empty());
      CHECK(in_proj[0]->aux_bytes == rel(4096.0 * static_cast<double>(hybrid.hidden) * 2));
      CHECK(in_proj_current[0]->aux_bytes == rel(4096.0 * static_cast<double>(hybrid.hidden) * 6));
    }
  }

  TEST_CASE("FP8 GEMMs quantise their input forward and the incoming gradient in dgrad, per recipe") {
    // Bytes per element to read BF16 and write the FP8 copy and its transpose: delayed 4, tensorwise 6 (one
    // more read for the current amax), blockwise 2 + 2 (1 + 4/128) (an fp32 scale per 128 values). Mixtral's
    // qkv_proj is [t, h] x [h, n], t = h = 4096, n = (32 + 2 x 8) x 128 = 6144: forward quantises t h
    // elements, dgrad the t n gradient, wgrad nothing (both transposes exist). The expert FC1/FC3 quantises
    // its t k rows of h (ep 8, uniform routing), padded; the router GEMM stays BF16. Kernels per quantised
    // tensor (TE's quantizers): current scaling computes the amax, the scale, then casts (3); delayed and
    // block scaling cast with the scale at hand (1). A grouped GEMM quantises per expert. Under delayed
    // scaling the qkv_proj's input comes in FP8 from the norm TE fuses into it: only its transpose is made
    // (read 1, write 1).
    const double t = 4096, h = 4096, n = 6144, k = 2;
    struct Case {
      Fp8Recipe recipe;
      double per;
      int kernels;
      double qkv_per;
    };
    const double block = 2.0 + 2.0 * (1 + 4.0 / 128);
    const Case recipes[] = {{Fp8Recipe::kDelayed, 4.0, 1, 2.0},
                            {Fp8Recipe::kTensorwise, 6.0, 3, 6.0},
                            {Fp8Recipe::kBlockwise, block, 1, block}};
    for (const auto& [recipe, per, kernels, qkv_per] : recipes) {
      CAPTURE(per);
      Plan p = node_plan(8);
      p.precision = Precision::kFp8;
      p.fp8_recipe = recipe;
      const OpGraph g = lower(mixtral(1), p, stack_options("megatron-core"));
      const Op& qkv = the_op(g, OpName::kQkvProj);
      CHECK(qkv.aux_bytes == doctest::Approx(t * h * qkv_per));
      CHECK(qkv.aux_kernels == kernels);
      CHECK(qkv.kernels == 1 + kernels);
      const Op& dgrad = the_op(g, OpName::kQkvProj, 0, Phase::kBackward, GemmPart::kDgrad);
      CHECK(dgrad.aux_bytes == doctest::Approx(t * n * per));
      CHECK(dgrad.aux_kernels == kernels);
      const Op& wgrad = the_op(g, OpName::kQkvProj, 0, Phase::kBackward, GemmPart::kWgrad);
      CHECK(wgrad.aux_bytes == 0.0);
      CHECK(wgrad.aux_kernels == 0);
      CHECK(wgrad.kernels == 1);
      const Op& fc13 = the_op(g, OpName::kExpertFc13);
      // Its one local expert's rows padded to a multiple of 16 (TEGroupedMLP's Fp8Padding).
      CHECK(fc13.aux_bytes == doctest::Approx((t * k + expected_alignment_pad(t * k, 16)) * h * per));
      CHECK(fc13.aux_kernels == kernels);
      CHECK(the_op(g, OpName::kRouter).aux_bytes == 0.0);
      CHECK(the_op(g, OpName::kRouter).aux_kernels == 0);
    }
    const OpGraph bf16 = lower(mixtral(1), node_plan(8), stack_options("megatron-core"));
    CHECK(the_op(bf16, OpName::kQkvProj).aux_bytes == 0.0);
  }

  TEST_CASE("under block scaling exactly the FP8 GEMMs are block-scaled, under per-tensor scales none") {
    // Mixtral, one layer on a node, ep 8: every GEMM an FP8 plan runs in FP8 (dense, grouped, each part) is
    // marked block-scaled under the blockwise recipe, which the cost model prices at the stack's block rate;
    // the BF16 router GEMM, memory-bound ops and exchanges are not, and no op is under delayed or
    // tensorwise scaling or in BF16.
    for (Fp8Recipe recipe : {Fp8Recipe::kBlockwise, Fp8Recipe::kTensorwise, Fp8Recipe::kDelayed}) {
      CAPTURE(static_cast<int>(recipe));
      Plan p = node_plan(8);
      p.precision = Precision::kFp8;
      p.fp8_recipe = recipe;
      const OpGraph g = lower(mixtral(1), p, stack_options("megatron-core"));
      int fp8_gemms = 0, marked = 0;
      for (const Op& op : g.ops) {
        const bool gemm = op.kind == OpKind::kGemm || op.kind == OpKind::kGroupedGemm;
        const bool fp8_gemm = gemm && op.dtype == DType::kFp8;
        fp8_gemms += fp8_gemm ? 1 : 0;
        marked += op.block_scaled ? 1 : 0;
        if (op.block_scaled) CHECK(fp8_gemm);
        if (recipe == Fp8Recipe::kBlockwise && fp8_gemm) CHECK(op.block_scaled);
      }
      CHECK(fp8_gemms > 0);
      CHECK(marked == (recipe == Fp8Recipe::kBlockwise ? fp8_gemms : 0));
      CHECK_FALSE(the_op(g, OpName::kExpertFc13, 0, Phase::kBackward, GemmPart::kWgrad).block_scaled ==
                  (recipe != Fp8Recipe::kBlockwise));
      CHECK_FALSE(the_op(g, OpName::kRouter).block_scaled);
    }
    const OpGraph bf16 = lower(mixtral(1), node_plan(8), stack_options("megatron-core"));
    for (const Op& op : bf16.ops) CHECK_FALSE(op.block_scaled);
  }

  TEST_CASE("TE gathers TP linears' inputs and gradients in FP8 under per-tensor scales after the amax") {
    // Mixtral-8x7B, one layer, tp 2 with sequence parallelism on Megatron-Core: 2048 tokens per rank, 4096
    // gathered, h = 4096. Under FP8 with per-tensor scales TE quantises the QKV projection's input before
    // its all-gather (1 byte per element) and re-gathers the FP8 copy for the weight gradient; the data
    // gradient's reduce-scatter stays BF16; the output projection's incoming gradient is quantised and
    // gathered in FP8 in backward. Current scaling (tensorwise) first all-reduces each quantised tensor's
    // amax over TP (4 bytes, MAX): one before the forward gather, one before the gradient's. Delayed scaling
    // gathers FP8 without it; block scaling gathers BF16; so do BF16 plans and the moerun stack.
    Plan p = node_plan(4);
    p.attention.tp = 2;
    p.global_batch = 4;
    p.precision = Precision::kFp8;
    const double tg = 4096, h = 4096;
    struct Case {
      Fp8Recipe recipe;
      double gather_bytes;  // per element
      size_t amax;          // all-reduces per pass
    };
    for (const Case& c : {Case{Fp8Recipe::kTensorwise, 1, 1}, Case{Fp8Recipe::kDelayed, 1, 0},
                          Case{Fp8Recipe::kBlockwise, 2, 0}}) {
      CAPTURE(static_cast<int>(c.recipe));
      p.fp8_recipe = c.recipe;
      const OpGraph g = lower(mixtral(1), p, stack_options("megatron-core"));
      const Op& ag = the_op(g, OpName::kAttnAg);
      CHECK(ag.comm.bytes == tg * h * c.gather_bytes);
      CHECK(the_op(g, OpName::kInputAg, 0, Phase::kBackward).comm.bytes == ag.comm.bytes);  // the re-gather
      CHECK(the_op(g, OpName::kAttnAg, 0, Phase::kBackward).comm.collective == Collective::kReduceScatter);
      CHECK(the_op(g, OpName::kAttnAg, 0, Phase::kBackward).comm.bytes == tg * h * 2.0);
      CHECK(the_op(g, OpName::kAttnRs).comm.bytes == tg * h * 2.0);
      const Op& grad_ag = the_op(g, OpName::kAttnRs, 0, Phase::kBackward);
      CHECK(grad_ag.comm.collective == Collective::kAllGather);
      CHECK(grad_ag.comm.bytes == tg * h * c.gather_bytes);
      const auto fwd_ar = ops_named(g, OpName::kFp8AmaxAr),
                 bwd_ar = ops_named(g, OpName::kFp8AmaxAr, 0, Phase::kBackward);
      REQUIRE(fwd_ar.size() == c.amax);
      REQUIRE(bwd_ar.size() == c.amax);
      if (c.amax == 0) continue;
      CHECK(fwd_ar[0]->comm.collective == Collective::kAllReduce);
      CHECK(fwd_ar[0]->comm.group == CommGroup::kTp);
      CHECK(fwd_ar[0]->comm.bytes == 4.0);
      CHECK(depends(g, ag, *fwd_ar[0]));
      CHECK(depends(g, grad_ag, *bwd_ar[0]));
      // Under TE's userbuffers the same: the rings move FP8, the data gradient reduces in BF16.
      Plan ub = p;
      ub.overlap.tp_comm = true;
      const OpGraph u = lower(mixtral(1), ub, stack_options("megatron-core"));
      CHECK(the_op(u, OpName::kQkvProj).comm.bytes == tg * h);
      CHECK(the_op(u, OpName::kOutProj).comm.bytes == tg * h * 2.0);  // the forward reduce-scatter
      CHECK(the_op(u, OpName::kOutProj, 0, Phase::kBackward, GemmPart::kDgrad).comm.bytes == tg * h);
      CHECK(the_op(u, OpName::kAttnAg, 0, Phase::kBackward).comm.collective == Collective::kReduceScatter);
      CHECK(the_op(u, OpName::kAttnAg, 0, Phase::kBackward).comm.bytes == tg * h * 2.0);
      CHECK(ops_named(u, OpName::kFp8AmaxAr).size() == 1);
      CHECK(ops_named(u, OpName::kFp8AmaxAr, 0, Phase::kBackward).size() == 1);
    }
    p.fp8_recipe = Fp8Recipe::kTensorwise;
    const OpGraph moerun = lower(mixtral(1), p, stack_options("moerun"));
    CHECK(the_op(moerun, OpName::kAttnAg).comm.bytes == tg * h * 2.0);
    CHECK(ops_named(moerun, OpName::kFp8AmaxAr).empty());
    Plan bf16 = p;
    bf16.precision = Precision::kBf16;
    const OpGraph b = lower(mixtral(1), bf16, stack_options("megatron-core"));
    CHECK(the_op(b, OpName::kAttnAg).comm.bytes == tg * h * 2.0);
    CHECK(ops_named(b, OpName::kFp8AmaxAr).empty());
  }

  // pp 2 over four Mixtral layers, ep 4 on four GPUs, in FP8 with `recipe`.
  Plan two_stage_fp8_plan(Fp8Recipe recipe) {
    Plan p = node_plan(4);
    p.pipeline.pp = 2;
    p.precision = Precision::kFp8;
    p.fp8_recipe = recipe;
    return p;
  }
  // A Mixtral layer's parameters on one rank of ep 4: the dense ones and a quarter of the routed experts.
  double local_layer_params(const ModelSpec& m) {
    const ParamBreakdown lp = layer_params(m, m.layers[0]);
    return lp.total() - lp.routed_experts + lp.routed_experts / 4;
  }

  TEST_CASE("FP8 weights are cast once per step on each stage, before the stage's first forward") {
    // pp 2 over four Mixtral layers, ep 4, two micro-batches, blockwise recipe: one weight_cast per stage of
    // its local parameters (dense + routed experts / ep) x (2 + 2 (1 + 4/128)) bytes, four kernels per layer.
    const ModelSpec m = mixtral(4);
    const Plan p = two_stage_fp8_plan(Fp8Recipe::kBlockwise);
    const OpGraph g = lower(m, p, stack_options("megatron-core"));
    const double per_layer = local_layer_params(m);
    std::vector<const Op*> casts;
    for (const Op& op : g.ops) {
      if (op.name == static_cast<uint16_t>(OpName::kWeightCast)) casts.push_back(&op);
    }
    REQUIRE(casts.size() == 2);
    for (const Op* cast : casts) {
      CAPTURE(cast->stage);
      CHECK(cast->hbm_bytes == doctest::Approx(2 * per_layer * (2.0 + 2.0 * (1 + 4.0 / 128))));
      CHECK(cast->kernels == 8);
      // The stage's first forward op after the cast waits for it.
      const Op* first = nullptr;
      for (const Op& op : g.ops) {
        if (op.stage == cast->stage && op.phase == Phase::kForward && op.id != cast->id &&
            op.micro_batch == 0 && op.kind != OpKind::kCollective) {
          first = &op;
          break;
        }
      }
      REQUIRE(first != nullptr);
      const auto deps = g.deps_of(*first);
      CHECK(std::find(deps.begin(), deps.end(), cast->id) != deps.end());
    }
  }

  TEST_CASE("FP8 parameters are gathered in FP8, and their transposes replace the step's weight casts") {
    // The same job in tensorwise FP8, with and without --fp8-param-gather: each parameter all-gather moves
    // 1 B per parameter instead of 2; each stage's weight_cast reads and writes 1 B per local parameter
    // (the transpose of the gathered FP8 weight) instead of current scaling's 6 B (amax, cast, transpose).
    const ModelSpec m = mixtral(4);
    Plan p = two_stage_fp8_plan(Fp8Recipe::kTensorwise);
    const double per_layer = local_layer_params(m);
    const OpGraph bf16_params = lower(m, p, stack_options("megatron-core"));
    p.data.fp8_param_gather = true;
    const OpGraph fp8_params = lower(m, p, stack_options("megatron-core"));
    auto all_named = [](const OpGraph& g, OpName n) {
      std::vector<const Op*> out;
      for (const Op& op : g.ops)
        if (op.name == static_cast<uint16_t>(n)) out.push_back(&op);
      return out;
    };
    const auto casts = all_named(fp8_params, OpName::kWeightCast);
    REQUIRE(casts.size() == 2);
    for (const Op* cast : casts) CHECK(cast->hbm_bytes == doctest::Approx(2 * per_layer * 2.0));
    for (const Op* cast : all_named(bf16_params, OpName::kWeightCast))
      CHECK(cast->hbm_bytes == doctest::Approx(2 * per_layer * 6.0));
    const auto gathers = all_named(fp8_params, OpName::kParamAg);
    const auto bf16_gathers = all_named(bf16_params, OpName::kParamAg);
    REQUIRE(!gathers.empty());
    REQUIRE(gathers.size() == bf16_gathers.size());
    int outside = 0;
    for (size_t i = 0; i < gathers.size(); ++i) {
      if (gathers[i]->layer < 0) {
        // The embedding and output layer are not TE modules: their parameters stay BF16.
        ++outside;
        CHECK(gathers[i]->comm.bytes == doctest::Approx(bf16_gathers[i]->comm.bytes));
        CHECK(gathers[i]->comm.dtype == DType::kBf16);
        continue;
      }
      CHECK(gathers[i]->comm.bytes == doctest::Approx(bf16_gathers[i]->comm.bytes / 2));
      CHECK(gathers[i]->comm.dtype == DType::kFp8);
    }
    CHECK(outside == 2);
  }

  TEST_CASE(
      "Megatron-Core's Gated DeltaNet lowers its layout copies, l2norm and gate kernels around FLA's scan") {
    // Qwen3-Next layer 0 at tp 2 on megatron-core: 4096 tokens, per rank 8 key and 16 value heads of 128,
    // conv channels 4096, value width 2048, beta and alpha 32 (gated_delta_net.py at bbc762d5).
    ModelSpec qn = io::load_model("qwen3-next-80b-a3b").value();
    qn.layers = {qn.layers[0]};
    Plan p = node_plan(8);
    p.attention.tp = 2;
    p.experts.ep = 4;
    const OpGraph g = lower(qn, p, stack_options("megatron-core"));
    const double t = 4096, dt = 2;
    // The copy of the conv channels to [b, d, s] before the conv, then q, k, v, the gate, beta and alpha
    // copied and q and k (1024 wide each) repeated to the 16 value heads (read once, written twice).
    const auto layout = ops_named(g, OpName::kMixerLayout);
    REQUIRE(layout.size() == 2);
    CHECK(layout[0]->hbm_bytes == doctest::Approx(2 * t * 4096 * dt));
    CHECK(layout[0]->kernels == 1);
    CHECK(layout[1]->hbm_bytes == doctest::Approx(t * (2.0 * (4096 + 2048 + 32) + 2 * (1 + 2) * 1024) * dt));
    CHECK(layout[1]->kernels == 8);
    // FLA's l2norm of q and k: read and written forward, three tensors read and one written backward.
    CHECK(the_op(g, OpName::kMixerQkNorm).hbm_bytes == doctest::Approx(4 * t * 1024 * dt));
    CHECK(the_op(g, OpName::kMixerQkNorm, 0, Phase::kBackward).hbm_bytes ==
          doctest::Approx(6 * t * 1024 * dt));
    CHECK(the_op(g, OpName::kMixerGates).kernels == 7);
    CHECK(the_op(g, OpName::kMixerGates, 0, Phase::kBackward).kernels == 9);
    // The scan: per token and value head 14 dk + 12 dv + 12 c + 4 dk dv / c + 30 bytes forward in six
    // kernels, 42 dk + 30 dv + 4 c + 8 dk dv / c + 60 backward in nine; 64 chunks walked by 16 heads x 2
    // value blocks of chains, once forward and twice backward.
    const Op& fwd = the_op(g, OpName::kMixerScan);
    CHECK(fwd.hbm_bytes == doctest::Approx(t * 16 * (14 * 128 + 12 * 128 + 12 * 64 + 4 * 256 + 30)));
    CHECK(fwd.kernels == 6);
    CHECK(fwd.gemm.m == 64);
    CHECK(fwd.gemm.n == 32);
    CHECK(fwd.gemm.k == 1);
    const Op& bwd = the_op(g, OpName::kMixerScan, 0, Phase::kBackward);
    CHECK(bwd.hbm_bytes == doctest::Approx(t * 16 * (42 * 128 + 30 * 128 + 4 * 64 + 8 * 256 + 60)));
    CHECK(bwd.kernels == 9);
    CHECK(bwd.gemm.k == 2);
    // moerun runs none of Megatron's eager kernels: its scan keeps the plain byte count and no chains.
    const OpGraph m = lower(qn, p, stack_options("moerun"));
    CHECK(ops_named(m, OpName::kMixerLayout).empty());
    CHECK(ops_named(m, OpName::kMixerQkNorm).empty());
    CHECK(the_op(m, OpName::kMixerScan).gemm.k == 0);
  }

  TEST_CASE("Megatron-Core's Mamba-2 mixer lowers mamba_ssm's SSD kernels and causal_conv1d's backward") {
    // Nemotron-3 Nano layer 0 (Mamba-2) at tp 2 on megatron-core: 4096 tokens, per rank 32 heads of 64,
    // 4 groups of state 128, chunks of 128, conv channels (4096 + 2 x 8 x 128) / 2 = 3072.
    ModelSpec nh = io::load_model("nemotron-3-nano-30b-a3b").value();
    nh.layers = {nh.layers[0]};
    REQUIRE(nh.layers[0].mixer == MixerKind::kMamba2);
    Plan p = node_plan(8);
    p.attention.tp = 2;
    const OpGraph g = lower(nh, p, stack_options("megatron-core"));
    const double t = 4096, dt = 2, h = 32, hd = 64, grp = 4, n = 128, c = 128;
    // Forward: 10 hp + 12 hpn / c + 8 gn + 8 gc + 26 h bytes per token in the five SSD kernels and the two
    // of A = -exp(A_log); backward 34 hp + 34 hpn / c + 54 gn + 32 gc + 150 h + hc / 4 in 42.
    const Op& fwd = the_op(g, OpName::kMixerScan);
    CHECK(fwd.hbm_bytes ==
          doctest::Approx(t * (10 * h * hd + 12 * h * hd * n / c + 8 * grp * n + 8 * grp * c + 26 * h)));
    CHECK(fwd.kernels == 7);
    CHECK(fwd.gemm.k == 0);
    const Op& bwd = the_op(g, OpName::kMixerScan, 0, Phase::kBackward);
    CHECK(bwd.hbm_bytes == doctest::Approx(t * (34 * h * hd + 34 * h * hd * n / c + 54 * grp * n +
                                                32 * grp * c + 150 * h + h * c / 4)));
    CHECK(bwd.kernels == 42);
    // The conv: read and written forward; backward its forward again (2) and causal_conv1d's backward
    // reading x and the output gradient and writing dx (3), with the weight and bias gradients zero-filled.
    CHECK(the_op(g, OpName::kMixerConv).hbm_bytes == doctest::Approx(2 * t * 3072 * dt));
    const Op& conv_bwd = the_op(g, OpName::kMixerConv, 0, Phase::kBackward);
    CHECK(conv_bwd.hbm_bytes == doctest::Approx(5 * t * 3072 * dt));
    CHECK(conv_bwd.kernels == 4);
    // One sequence per micro-batch: Megatron's rearranges are views. Two sequences: zxBCdt and y copied.
    CHECK(ops_named(g, OpName::kMixerLayout).empty());
    Plan two = p;
    two.micro_batch = 2;
    two.global_batch = 16;
    const auto copies = ops_named(lower(nh, two, stack_options("megatron-core")), OpName::kMixerLayout);
    REQUIRE(copies.size() == 2);
    CHECK(copies[0]->hbm_bytes == doctest::Approx(2 * 2 * t * (2 * 4096 + 2 * 8 * 128 + 64) / 2 * dt));
    CHECK(copies[1]->hbm_bytes == doctest::Approx(2 * 2 * t * 2048 * dt));
    // moerun runs none of mamba_ssm's kernels: its scan keeps the inputs, output and fp32 states once.
    const OpGraph m = lower(nh, p, stack_options("moerun"));
    CHECK(the_op(m, OpName::kMixerScan).hbm_bytes ==
          doctest::Approx(t * (3072 + 32 + 2048) * dt + 2.0 * 32 * 32 * 128 * 64 * 4));
    CHECK(the_op(m, OpName::kMixerScan, 0, Phase::kBackward).hbm_bytes ==
          doctest::Approx(the_op(m, OpName::kMixerScan).hbm_bytes));
  }

  TEST_CASE(
      "recurrent mixers lower to GEMM projections around a memory-bound scan, and FFN-only blocks to the "
      "FFN") {
    // Qwen3-Next layers 0 (Gated DeltaNet) and 3 (gated attention), tp 2, t = 4096 tokens per micro-batch.
    ModelSpec qn = io::load_model("qwen3-next-80b-a3b").value();
    qn.layers = {qn.layers[0], qn.layers[3]};
    Plan p = node_plan(8);
    p.attention.tp = 2;
    p.experts.ep = 4;
    const OpGraph g = lower(qn, p, stack_options("moerun"));
    // In-projection [tg = 4096, (2*2048 + 2*4096 + 64) / 2] from h = 2048; out-projection [4096, 2048 / ...].
    const Op& in = the_op(g, OpName::kMixerInProj);
    CHECK(in.gemm.m == 4096);
    CHECK(in.gemm.n == (2 * 2048 + 2 * 4096 + 64) / 2);
    CHECK(in.gemm.k == 2048);
    const Op& out = the_op(g, OpName::kMixerOutProj);
    CHECK(out.gemm.n == 2048);
    CHECK(out.gemm.k == 4096 / 2);
    // The scan reads q, k, v (4096 conv channels per rank), b and a (32 per rank), writes the output (2048
    // per rank) in bf16, and writes and reads 64 chunks x 16 heads x 128 x 128 fp32 states.
    const Op& scan = the_op(g, OpName::kMixerScan);
    CHECK(scan.kind == OpKind::kMemoryBound);
    CHECK(scan.hbm_bytes == doctest::Approx(4096.0 * (4096 + 32 + 2048) * 2 + 2.0 * 64 * 16 * 128 * 128 * 4));
    CHECK(scan.flops == doctest::Approx(4096.0 * 16 * (256.0 * 65 + 4 * 128.0 * 128)));
    CHECK(ops_named(g, OpName::kAttnCore).empty());
    CHECK(ops_named(g, OpName::kAttnCore, 1).size() == 1);
    CHECK(ops_named(g, OpName::kMixerScan, 1).empty());
    // The gated attention layer's q projection is twice as wide (the output gate), and the gate multiplies
    // the core's output of its 8 heads of 256 per rank: read with the gate, written (backward: three tensors
    // read, two written).
    CHECK(the_op(g, OpName::kQkvProj, 1).gemm.n == (16 * 256 * 2 + 2 * 2 * 256) / 2);
    CHECK(the_op(g, OpName::kAttnOutputGate, 1).hbm_bytes == doctest::Approx(3.0 * 4096 * 8 * 256 * 2));
    CHECK(the_op(g, OpName::kAttnOutputGate, 1, Phase::kBackward).hbm_bytes ==
          doctest::Approx(5.0 * 4096 * 8 * 256 * 2));
    CHECK(ops_named(g, OpName::kAttnOutputGate, 0).empty());
    // Nemotron-H: a Mamba-2 block has no FFN ops, an 'E' block no attention ops, and its experts' FC1 is one
    // matrix wide (squared ReLU).
    ModelSpec nh = io::load_model("nemotron-3-nano-30b-a3b").value();
    nh.layers = {nh.layers[0], nh.layers[1]};
    const OpGraph h = lower(nh, node_plan(8), stack_options("moerun"));
    CHECK(ops_named(h, OpName::kRouter, 0).empty());
    CHECK(ops_named(h, OpName::kMixerScan, 0).size() == 1);
    CHECK(ops_named(h, OpName::kAttnNorm, 1).empty());
    CHECK(ops_named(h, OpName::kRouter, 1).size() == 1);
    CHECK(the_op(h, OpName::kExpertFc13, 1).gemm.n == 1856);
    // Under TE's userbuffers the Mamba mixer's projections hold their TP exchanges (Megatron builds them
    // with the fc1 and fc2 buffers).
    Plan ub = node_plan(8);
    ub.attention.tp = 2;
    ub.global_batch = 4;
    ub.overlap.tp_comm = true;
    const OpGraph hu = lower(nh, ub, stack_options("megatron-core"));
    CHECK(ops_named(hu, OpName::kAttnAg, 0).empty());
    CHECK(ops_named(hu, OpName::kAttnRs, 0).empty());
    CHECK(the_op(hu, OpName::kMixerInProj, 0).comm.userbuffers);
    CHECK(the_op(hu, OpName::kMixerInProj, 0).comm.collective == Collective::kAllGather);
    CHECK(the_op(hu, OpName::kMixerOutProj, 0).comm.collective == Collective::kReduceScatter);
    CHECK(the_op(hu, OpName::kAttnAg, 0, Phase::kBackward).comm.collective == Collective::kReduceScatter);
    CHECK(the_op(hu, OpName::kInputAg, 0, Phase::kBackward).comm.userbuffers);
  }

  TEST_CASE("DSA runs the indexer before the core, which attends a top-k window of keys") {
    // DeepSeek-V3.2, one MoE layer, seq 8192, tp 1: the indexer's q from the 1536 q latent to 64 x 128, its
    // key and weights from h, scores of 8192 x 64 rows against 4097 mean causal keys over 128 dims.
    ModelSpec m = io::load_model("deepseek-v3.2").value();
    m.layers = {m.layers[3]};
    m.mtp_layers = 0;
    Plan p = node_plan(8);
    p.seq_len = 8192;
    p.global_batch = 8;
    const OpGraph g = lower(m, p, stack_options("moerun"));
    const auto proj = ops_named(g, OpName::kIndexerProj);
    REQUIRE(proj.size() == 2);
    CHECK(proj[0]->gemm.n * proj[0]->gemm.k == 64 * 128 * 1536);
    CHECK(proj[1]->gemm.n == 128 + 64);
    const Op& score = the_op(g, OpName::kIndexerScore);
    CHECK(score.flops == doctest::Approx(2.0 * 8192 * 64 * 4097 * 128));
    const Op& core = the_op(g, OpName::kAttnCore);
    CHECK(core.attn.window == 2048);
    const double w = 2048, s = 8192;
    CHECK(core.flops == doctest::Approx(s * 2.0 * 128 * 320 * (w * (w + 1) / 2 + (s - w) * w) / s));
    // The core waits for the top-k selection.
    const Op& topk = the_op(g, OpName::kIndexerTopk);
    const auto deps = g.deps_of(core);
    CHECK(std::find(deps.begin(), deps.end(), topk.id) != deps.end());
  }

  TEST_CASE("models with QK-norm run a norm over q and k, others none") {
    // Qwen3-30B-A3B: 32 heads and 4 KV heads of 128, t = 4096: the norm reads and writes q and k in bf16,
    // 2 t (32 + 4) 128 x 2 bytes.
    ModelSpec qwen = io::load_model("qwen3-30b-a3b").value();
    qwen.layers.resize(1);
    const OpGraph g = lower(qwen, node_plan(8), stack_options("megatron-core"));
    CHECK(the_op(g, OpName::kQkNorm).hbm_bytes == doctest::Approx(2.0 * 4096 * 36 * 128 * 2));
    CHECK(ops_named(g, OpName::kQkNorm, 0, Phase::kBackward).size() == 1);
    CHECK(
        ops_named(lower(mixtral(1), node_plan(8), stack_options("megatron-core")), OpName::kQkNorm).empty());
  }

  TEST_CASE(
      "DeepSeek-V3's MTP module runs on the last stage: a decoder layer, a projection, a head and a loss") {
    // One dense and one MoE layer over pp 2 (ep 8, two micro-batches), MTP depth 1: per micro-batch the last
    // stage runs the next token's embedding, two norms, the [2h -> h] projection, one more MoE decoder layer
    // (index 2), its own final norm, the head (the model's) and the MTP loss; backward the loss, head and
    // projection gradients and the norms. The first stage runs none of it.
    Plan p;
    p.gpus = 16;
    p.seq_len = 4096;
    p.global_batch = 16;
    p.experts.ep = 8;
    p.pipeline.pp = 2;
    const OpGraph g = lower(deepseek_v3(1, 1, 1), p, stack_options("megatron-core"));
    auto count = [&](OpName n, Phase ph, GemmPart part = GemmPart::kNone) {
      int c = 0;
      for (const Op& op : g.ops) {
        if (op.name != static_cast<uint16_t>(n)) continue;
        CHECK(op.stage == 1);
        c += op.micro_batch == 0 && op.phase == ph && op.part == part ? 1 : 0;
      }
      return c;
    };
    for (OpName n :
         {OpName::kMtpEmbedding, OpName::kMtpNorm, OpName::kMtpProj, OpName::kMtpLmHead, OpName::kMtpLoss})
      CHECK_MESSAGE(count(n, Phase::kForward) == 1, kOpNames[static_cast<size_t>(n)]);
    CHECK(count(OpName::kMtpLoss, Phase::kBackward) == 1);
    CHECK(count(OpName::kMtpNorm, Phase::kBackward) == 1);
    for (OpName n : {OpName::kMtpLmHead, OpName::kMtpProj}) {
      CHECK(count(n, Phase::kBackward, GemmPart::kDgrad) == 1);
      CHECK(count(n, Phase::kBackward, GemmPart::kWgrad) == 1);
    }
    // The main model's final norm and the MTP module's, each under its own name (one op summary row each).
    for (OpName n : {OpName::kFinalNorm, OpName::kMtpFinalNorm}) {
      CHECK(count(n, Phase::kForward) == 1);
      CHECK(count(n, Phase::kBackward) == 1);
    }
    // The MTP decoder layer is a MoE layer like layer 1, forward and backward.
    CHECK(name_set(g, 2, 0, Phase::kForward) == name_set(g, 1, 0, Phase::kForward));
    CHECK(name_set(g, 2, 0, Phase::kBackward) == name_set(g, 1, 0, Phase::kBackward));
    for (const Op& op : g.ops) {
      if (op.layer == 2) CHECK(op.stage == 1);
    }
    const OpGraph none = lower(deepseek_v3(1, 1, 0), p, stack_options("megatron-core"));
    for (const Op& op : none.ops) CHECK(op.layer < 2);
  }

  TEST_CASE(
      "an encoder-decoder lowers its encoder on the inputs and its decoder, with cross-attention, on the "
      "targets") {
    // Switch-Base-64 cut to encoder layers 0-1 and decoder layers 0-1 (a dense and a sparse layer each), tp
    // 2, ep 4, micro-batches of 2 x 512 inputs: 512 encoder tokens and 2 x 128 / 2 = 128 targets per rank.
    ModelSpec m = io::load_model("switch-base-64").value();
    m.layers = {m.layers[0], m.layers[1], m.layers[12], m.layers[13]};
    Plan p = node_plan(4);
    p.attention.tp = 2;
    p.seq_len = 512;
    p.micro_batch = 2;
    p.global_batch = 8;
    const OpGraph g = lower(m, p, stack_options("megatron-core"));
    // Encoder self-attention: bidirectional over 512 keys, 6 heads per rank of 64.
    const Op& enc = the_op(g, OpName::kAttnCore, 0);
    CHECK_FALSE(enc.attn.causal);
    CHECK(enc.attn.seq_q == 512);
    CHECK(enc.flops == doctest::Approx(2.0 * 512 * 2 * 6 * 128 * 512));
    CHECK(the_op(g, OpName::kQkvProj, 0).gemm.m == 1024);
    // Decoder self-attention: causal over the 128 targets; cross-attention of the targets to the 512 inputs.
    const Op& self = the_op(g, OpName::kAttnCore, 2);
    CHECK(self.attn.causal);
    CHECK(self.attn.seq_q == 128);
    CHECK(the_op(g, OpName::kQkvProj, 2).gemm.m == 256);
    const Op& cross = the_op(g, OpName::kCrossAttnCore, 2);
    CHECK_FALSE(cross.attn.causal);
    CHECK(cross.attn.seq_q == 128);
    CHECK(cross.attn.seq_kv == 512);
    CHECK(cross.flops == doctest::Approx(2.0 * 128 * 2 * 6 * 128 * 512));
    // q from the gathered targets, k and v from the gathered encoder output (all-gathered over tp).
    CHECK(the_op(g, OpName::kCrossQProj, 2).gemm.m == 256);
    CHECK(the_op(g, OpName::kCrossQProj, 2).gemm.n == 6 * 64);
    CHECK(the_op(g, OpName::kCrossKvProj, 2).gemm.m == 1024);
    CHECK(the_op(g, OpName::kCrossKvProj, 2).gemm.n == 2 * 6 * 64);
    CHECK(the_op(g, OpName::kCrossKvAg, 2).comm.bytes == doctest::Approx(1024.0 * 768 * 2));
    CHECK(the_op(g, OpName::kCrossKvAg, 2, Phase::kBackward).comm.collective == Collective::kReduceScatter);
    for (OpName n : {OpName::kCrossQProj, OpName::kCrossKvProj, OpName::kCrossOutProj}) {
      CHECK(ops_named(g, n, 2, Phase::kBackward, GemmPart::kDgrad).size() == 1);
      CHECK(ops_named(g, n, 2, Phase::kBackward, GemmPart::kWgrad).size() == 1);
    }
    CHECK(ops_named(g, OpName::kCrossAttnCore, 0).empty());
    // Relative positions: no RoPE; each stack's first layer expands its [heads, s, s] bias.
    CHECK(ops_named(g, OpName::kRope, -1).empty());
    CHECK(the_op(g, OpName::kPositionBias, 0).hbm_bytes == doctest::Approx(6.0 * 512 * 512 * 2));
    CHECK(the_op(g, OpName::kPositionBias, 2).hbm_bytes == doctest::Approx(6.0 * 128 * 128 * 2));
    CHECK(ops_named(g, OpName::kPositionBias, 1).empty());
    CHECK(ops_named(g, OpName::kPositionBias, 3).empty());
    // The experts route the tokens of their own stack, the decoder's a quarter of the encoder's, each at its
    // own busiest-rank load (fewer tokens spread less evenly).
    const auto o = stack_options("megatron-core");
    LoweringOptions lo = o;
    lo.expert_load_scale = 1.05;
    lo.decoder_expert_load_scale = 1.2;
    const OpGraph gl = lower(m, p, lo);
    const auto& enc_fc1 = the_op(gl, OpName::kExpertFc13, 1);
    const auto& dec_fc1 = the_op(gl, OpName::kExpertFc13, 3);
    CHECK(dec_fc1.flops == doctest::Approx(enc_fc1.flops / 4 * 1.2 / 1.05));
    const workload::PlanRouting r = workload::plan_routing(m, p, workload::uniform_routing(64));
    CHECK(r.decoder_scale > r.scale);
    CHECK(r.memory_scale() == r.decoder_scale);
    const workload::PlanRouting plain =
        workload::plan_routing(mixtral(1), node_plan(8), workload::uniform_routing(8));
    CHECK(plain.decoder_scale == plain.scale);
    // Both stacks embed; the head and the loss run on the targets. Megatron's vocabulary-parallel embedding
    // looks up the TP group's rows (tp 2) in three walks of 5 bytes per row element in all.
    CHECK(the_op(g, OpName::kEmbedding, -1).hbm_bytes == doctest::Approx(5.0 * 2 * (512 + 128) * 768 * 2));
    CHECK(the_op(g, OpName::kLmHead, -1).gemm.m == 256);
  }
}
