// Lowering: per-layer communication volumes against direct per-GPU byte counts (megascale-moe.md §3.3), the
// pipeline order, and the structure of the graph (every op runs, backward mirrors forward).
#include <doctest/doctest.h>

#include <map>

#include "simulator/core/units.h"
#include "simulator/cost/collective.h"
#include "simulator/io/model_loader.h"
#include "simulator/workload/lower.h"

using namespace moeplan;

namespace {

// A plain GQA model of one MoE layer: h = 4096, 32 heads, m = heads / KV heads, k of 8 experts.
ModelSpec one_layer(int64_t kv_heads, int64_t top_k) {
  ModelSpec m = io::load_model("internal-352b").value();
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

  TEST_CASE("every forward collective has a backward transpose and every GEMM a dgrad and a wgrad") {
    const ModelSpec m = io::load_model("mixtral-8x7b").value();
    Plan p;
    p.gpus = 16;
    p.seq_len = 4096;
    p.global_batch = 16;
    p.attention.tp = 2;
    p.experts.ep = 8;
    p.pipeline.pp = 2;
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
}
