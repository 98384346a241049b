// Tests of the replay runner (executor/runtime/replay_runner.h), single process: every op kind of a real
// graph runs, the work its kernels are given follows the op's shape, and communication buffers have the op's
// bytes.
#include "executor/runtime/replay_runner.h"

#include <doctest/doctest.h>

#include <optional>

#include "simulator/core/attention_calls.h"
#include "tests/executor/runtime/runtime_fixtures.h"

namespace moeplan::executor {

TEST_SUITE("executor_runtime") {
  TEST_CASE("the replay runner runs every op of a tiny-moe stage without peers") {
    const RunInputs in = test::load_tiny("replay_all", test::tiny_plan(2, test::kDp2Ep2));
    ReplayRunner r(in.graph, [](CommGroup) -> Communicator* { return nullptr; });
    for (const Op& op : in.graph.ops) r.run(op);
    CHECK(r.scratch_bytes() > 0);
    CHECK(r.scratch_bytes() <= ReplayRunner::kScratchCapBytes * (kNumStreams + in.graph.num_stages));
  }

  TEST_CASE("a GEMM with 16 times the FLOPs runs 16 times the FLOPs in every backward part") {
    // Checked by the FLOPs of the operands the products were given, not by time: timed checks failed on
    // CI's busy machine.
    const OpGraph g;
    for (GemmPart part : {GemmPart::kNone, GemmPart::kDgrad, GemmPart::kWgrad}) {
      CAPTURE(static_cast<int>(part));
      Op small, big;
      small.kind = big.kind = OpKind::kGemm;
      small.part = big.part = part;
      small.gemm = {64, 64, 64, 1};
      big.gemm = {256, 256, 64, 1};  // [256, 64] x [64, 256]: 16x the FLOPs
      auto work_of = [&g](const Op& op) {
        ReplayRunner r(g, [](CommGroup) -> Communicator* { return nullptr; });
        r.run(op);
        return r.gemm_work();
      };
      CHECK(work_of(small).products == 1);
      CHECK(work_of(small).flops == 2.0 * 64 * 64 * 64);
      CHECK(work_of(big).flops == 16 * work_of(small).flops);
    }
    // A grouped GEMM runs one product per group over the op's rows.
    Op grouped;
    grouped.kind = OpKind::kGroupedGemm;
    grouped.gemm = {256, 32, 64, 4};
    ReplayRunner r(g, [](CommGroup) -> Communicator* { return nullptr; });
    r.run(grouped);
    CHECK(r.gemm_work().products == 4);
    CHECK(r.gemm_work().flops == 2.0 * 256 * 32 * 64);
  }

  TEST_CASE("causal attention over four times the sequence runs it, and backward runs the backward kernel") {
    const OpGraph g;
    Op a;
    a.kind = OpKind::kAttention;
    a.attn = {1, 256, 256, 4, 32, 32, 0, true};
    Op b = a;
    b.attn.seq_q = b.attn.seq_kv = 1024;
    Op back = a;
    back.phase = Phase::kBackward;
    auto work_of = [&g](const Op& op) {
      ReplayRunner r(g, [](CommGroup) -> Communicator* { return nullptr; });
      r.run(op);
      return r.attention_work();
    };
    CHECK(work_of(a).query_rows == 256);
    CHECK(work_of(a).key_rows == 256);
    CHECK(work_of(b).query_rows == 1024);
    CHECK(work_of(b).key_rows == 1024);
    CHECK(work_of(a).backward_calls == 0);
    CHECK(work_of(back).backward_calls == 1);
    CHECK(work_of(back).key_rows == 256);
  }

  TEST_CASE(
      "under context parallelism the local part runs the rank's own keys and the remote part the rest") {
    // cp = 8 over 2,048 tokens: the rank's 256 queries (chunks of 128) against its own 256 keys (one eighth
    // of its FLOPs), and non-causally against 7 x 128 others (the rest). Both ops state the whole sequence
    // as keys; run at that shape, each call gave the kernel 2,048 keys. Checked by what the kernel was given,
    // not by time: a busy machine made a timed check fail.
    const OpGraph g;
    Op local;
    local.kind = OpKind::kAttention;
    local.name = static_cast<uint16_t>(OpName::kAttnCoreLocal);
    local.attn = {1, 256, 2048, 2, 32, 32, 0, true, 2};
    const double rank_flops = 256.0 * 2.0 * 2 * 64 * 2049.0 / 2.0;
    local.flops = rank_flops / 8;
    Op remote = local;
    remote.name = static_cast<uint16_t>(OpName::kAttnCore);
    remote.flops = rank_flops - local.flops;
    auto work_of = [&g](const Op& op) {
      ReplayRunner r(g, [](CommGroup) -> Communicator* { return nullptr; });
      r.run(op);
      return r.attention_work();
    };
    const ReplayRunner::AttentionWork l = work_of(local), m = work_of(remote);
    CHECK(l.kernel_calls == 1);
    CHECK(l.query_rows == 256);
    CHECK(l.key_rows == 256);
    CHECK(m.kernel_calls == 7);
    CHECK(m.query_rows == 7 * 256);
    CHECK(m.key_rows == 7 * 128);
    Op back = remote;
    back.phase = Phase::kBackward;
    back.flops = remote.flops * kAttentionBackwardFlops;  // a backward op states its own FLOPs
    CHECK(work_of(back).key_rows == 7 * 128);
  }

  TEST_CASE("an MLA attention op runs its values at their own head dim, forward and backward") {
    // DeepSeek-V3's MLA on a rank: 16 heads, scores over 192 dims, values over 128, one K/V head per
    // query head. Before, the CPU kernel had one head dim and ran the values at 192.
    const OpGraph g;
    Op mla;
    mla.kind = OpKind::kAttention;
    mla.attn = {1, 128, 128, 16, 192, 128, 0, true, 16};
    mla.flops = AttentionCall{1, 128, 128, 16, 16, 192, 128, 0, true}.forward_flops();
    for (Phase phase : {Phase::kForward, Phase::kBackward}) {
      Op op = mla;
      op.phase = phase;
      if (phase == Phase::kBackward) op.flops *= kAttentionBackwardFlops;
      ReplayRunner r(g, [](CommGroup) -> Communicator* { return nullptr; });
      r.run(op);
      const ReplayRunner::AttentionWork w = r.attention_work();
      CHECK(w.kernel_calls == 1);
      CHECK(w.key_rows == 128);
      CHECK(w.value_cols == 16 * 128);
    }
  }

  TEST_CASE("with drawn routing, a rank runs the expert rows its experts drew and none when they drew none") {
    // tiny-moe (8 experts, top 2) on EP 2: every token picks two of rank 0's experts 0-3, none of rank 1's.
    const RunInputs in = test::load_tiny("replay_draw", test::tiny_plan(2, test::kDp2Ep2));
    auto expert_scratch = [&in](std::optional<int64_t> ep_rank) {
      ReplayRunner r(in.graph, [](CommGroup) -> Communicator* { return nullptr; });
      if (ep_rank) {
        RoutingDrawSpec spec;
        spec.inclusion = {0.5, 0.5, 0.5, 0.5, 0, 0, 0, 0};
        spec.tokens_per_rank = routed_tokens_per_rank(in.loaded.plan);
        spec.ep = 2;
        spec.ep_rank = *ep_rank;
        spec.lowered_rows = static_cast<double>(spec.tokens_per_rank * 2) * in.lowering.expert_load_scale;
        r.draw_routing(spec);
      }
      r.prepare_step();
      int ran = 0;
      for (const Op& op : in.graph.ops) {
        const auto name = static_cast<OpName>(op.name);
        if (name != OpName::kExpertFc13 && name != OpName::kExpertFc2) continue;
        r.run(op);
        ++ran;
      }
      CHECK(ran > 0);
      if (ep_rank) {
        const ReplayRunner::RoutingStats st = r.routing_stats();
        CHECK(st.draws > 0);
        CHECK(st.busiest_over_mean == doctest::Approx(2.0));  // one rank gets everything
        CHECK(st.ep_rank_rows[1] == 0.0);
      }
      return r.scratch_bytes();
    };
    const double busy = expert_scratch(0), idle = expert_scratch(1), lowered = expert_scratch(std::nullopt);
    // Rank 0 holds every row of both ranks' tokens (twice the mean), more than the graph's busiest-rank rows;
    // rank 1 only its experts' weights.
    CHECK(busy > lowered);
    CHECK(idle < lowered);
    CHECK(idle < busy / 2);
  }

  TEST_CASE("communication buffers hold the op's bytes in whole shares per rank") {
    CommSpec c;
    c.dtype = DType::kBf16;
    c.bytes = 1000;  // 500 bf16 values
    CHECK(comm_values(c, 1) == 500);
    CHECK(comm_values(c, 4) == 500);
    CHECK(comm_values(c, 3) == 501);
    c.dtype = DType::kFp32;
    CHECK(comm_values(c, 8) == 256);  // 250 rounded up to 8 shares of 32
    CHECK(wire_format_of(DType::kBf16) == WireFormat::kBf16);
    CHECK(wire_format_of(DType::kFp8) == WireFormat::kFp8E4m3);
    CHECK(wire_format_of(DType::kFp32) == WireFormat::kFp32);
  }
}

}  // namespace moeplan::executor
