// fused_ops.h against the lowering: every fused op of a plan with Ulysses SP and EP under intra-operator
// overlap maps to the kernel whose communication is the op's collective, forward and dgrad, and the rows
// that kernel moves are the bytes the cost model charges the collective with.
#include "executor/runtime/fused_ops.h"

#include <doctest/doctest.h>

#include <map>
#include <set>

#include "simulator/io/model_loader.h"
#include "simulator/workload/lower.h"

namespace moeplan::executor {
namespace {

ModelSpec one_layer() {
  ModelSpec m = io::load_model("internal-352b").value();
  m.layers.resize(1);
  return m;
}

Plan intra_op_plan(Dispatch dispatch) {
  Plan p;
  p.gpus = 8;
  p.seq_len = 8192;
  p.global_batch = 1;
  p.micro_batch = 1;
  p.data.zero = 0;
  p.attention.sp = 8;
  p.experts.ep = 8;
  p.experts.dispatch = dispatch;
  p.overlap.intra_op = true;
  return p;
}

struct Seen {
  FusedKind kind;
  FusedShape shape;
  const Op* op;
};

// The layer-0, micro-batch-0 fused ops of `g`, by (name, forward?); they point into `g`.
std::map<std::pair<OpName, bool>, Seen> fused_ops(const OpGraph& g) {
  std::map<std::pair<OpName, bool>, Seen> out;
  for (const Op& op : g.ops) {
    if (op.kind != OpKind::kFusedGemmComm || op.layer != 0 || op.micro_batch != 0) continue;
    const FusedShape s = fused_shape(op, static_cast<int>(op.comm.group_size));
    out[{static_cast<OpName>(op.name), op.phase == Phase::kForward}] = {s.kind, s, &op};
  }
  return out;
}

// Fused shapes of `kind` whose rows do not split evenly over experts and ranks (one to eight of each, 0 to
// 1000 rows), each handed to `f`.
template <class F>
void for_each_uneven_shape(FusedKind kind, F&& f) {
  for (int ranks : {1, 2, 3, 8})
    for (int experts : {1, 3, 8})
      for (int64_t m : {int64_t{0}, int64_t{7}, int64_t{96}, int64_t{1000}}) {
        CAPTURE(ranks);
        CAPTURE(experts);
        CAPTURE(m);
        FusedShape s;
        s.kind = kind;
        s.ranks = ranks;
        s.experts = experts;
        s.m = m;
        f(s);
      }
}

}  // namespace

TEST_SUITE("executor_runtime") {
  TEST_CASE("Ulysses fused ops map to GEMM + all-to-all and back, moving exactly the collective's bytes") {
    const ModelSpec m = one_layer();
    const OpGraph g = lower(m, intra_op_plan(Dispatch::kAllToAll), {});
    const auto ops = fused_ops(g);
    REQUIRE(ops.count({OpName::kQkvProjA2a, true}) == 1);
    REQUIRE(ops.count({OpName::kQkvProjA2a, false}) == 1);
    REQUIRE(ops.count({OpName::kA2aOutProj, true}) == 1);
    REQUIRE(ops.count({OpName::kA2aOutProj, false}) == 1);
    CHECK(ops.at({OpName::kQkvProjA2a, true}).kind == FusedKind::kGemmA2a);
    CHECK(ops.at({OpName::kQkvProjA2a, false}).kind == FusedKind::kA2aGemm);
    CHECK(ops.at({OpName::kA2aOutProj, true}).kind == FusedKind::kA2aGemm);
    CHECK(ops.at({OpName::kA2aOutProj, false}).kind == FusedKind::kGemmA2a);
    for (const auto& [key, seen] : ops) {
      if (key.first != OpName::kQkvProjA2a && key.first != OpName::kA2aOutProj) continue;
      INFO(op_label(*seen.op));
      CHECK(static_cast<double>(seen.shape.moved_bytes()) == doctest::Approx(seen.op->comm.bytes));
      CHECK(seen.shape.symmetric_bytes() == seen.shape.moved_bytes());
      // The input of the projection is the hidden state, on either side of the all-to-all.
      const int64_t h = m.hidden;
      const bool qkv = key.first == OpName::kQkvProjA2a;
      CHECK((qkv == key.second ? seen.shape.depth : seen.shape.width) == h);
    }
  }

  TEST_CASE(
      "expert fused ops map to gather + grouped GEMM and grouped GEMM + scatter, in both dispatch modes") {
    const ModelSpec m = one_layer();
    for (const Dispatch d : {Dispatch::kAllToAll, Dispatch::kAllGather}) {
      const bool a2a = d == Dispatch::kAllToAll;
      INFO("dispatch " << (a2a ? "all-to-all" : "all-gather"));
      const OpGraph g = lower(m, intra_op_plan(d), {});  // outlives `ops`, which points into it
      const auto ops = fused_ops(g);
      const OpName fc13 = a2a ? OpName::kA2aFc13 : OpName::kAgScatterFc13;
      const OpName fc2 = a2a ? OpName::kFc2A2a : OpName::kFc2GatherRs;
      REQUIRE(ops.count({fc13, true}) == 1);
      REQUIRE(ops.count({fc13, false}) == 1);
      REQUIRE(ops.count({fc2, true}) == 1);
      REQUIRE(ops.count({fc2, false}) == 1);
      CHECK(ops.at({fc13, true}).kind == FusedKind::kGatherGrouped);
      CHECK(ops.at({fc13, false}).kind == FusedKind::kGroupedScatter);
      CHECK(ops.at({fc2, true}).kind == FusedKind::kGroupedScatter);
      CHECK(ops.at({fc2, false}).kind == FusedKind::kGatherGrouped);
      for (const auto& [key, seen] : ops) {
        if (key.first != fc13 && key.first != fc2) continue;
        INFO(op_label(*seen.op));
        // The rows that move are hidden-wide: the gathered GEMM's input, the scattered GEMM's output.
        const FusedShape& s = seen.shape;
        CHECK((s.kind == FusedKind::kGatherGrouped ? s.depth : s.width) == m.hidden);
        CHECK(s.experts == m.moe.num_experts / 8);
        CHECK(s.m % s.experts == 0);
        CHECK(s.m >= seen.op->gemm.m);
        // All-to-all dispatch: the kernel moves the collective's rows (top-k copies of the tokens), up to the
        // rounding to whole rows per expert.
        if (a2a)
          CHECK(static_cast<double>(s.moved_bytes()) == doctest::Approx(seen.op->comm.bytes).epsilon(0.01));
      }
    }
  }

  TEST_CASE("the push combine's uniform counts fill no token owner past its slots, the same on every rank") {
    // Rows that do not split evenly over experts and token owners, one to eight ranks: every count is the
    // even share or one more, an expert owner holds experts x (m / experts) rows, and a token owner receives
    // as many (at most m, its receive slots), summed over the expert owners.
    for_each_uneven_shape(FusedKind::kGroupedScatter, [](const FusedShape& s) {
      const int ranks = s.ranks, experts = s.experts;
      const int64_t m = s.m;
      const std::vector<int32_t> c = push_combine_counts(s);
      REQUIRE(c.size() == static_cast<size_t>(ranks * ranks * experts));
      const int64_t per_expert = m / experts;
      auto at = [&](int q, int r, int e) { return c[static_cast<size_t>((q * ranks + r) * experts + e)]; };
      for (int q = 0; q < ranks; ++q) {
        int64_t held = 0;
        for (int e = 0; e < experts; ++e) {
          int64_t expert_rows = 0;
          for (int r = 0; r < ranks; ++r) {
            CHECK(at(q, r, e) >= per_expert / ranks);
            CHECK(at(q, r, e) <= per_expert / ranks + 1);
            expert_rows += at(q, r, e);
          }
          CHECK(expert_rows == per_expert);
          held += expert_rows;
        }
        CHECK(held <= m);
      }
      for (int r = 0; r < ranks; ++r) {
        int64_t received = 0;
        for (int q = 0; q < ranks; ++q)
          for (int e = 0; e < experts; ++e) received += at(q, r, e);
        CHECK(received == experts * per_expert);
        CHECK(received <= m);
      }
    });
  }
}

TEST_SUITE("executor_runtime") {
  TEST_CASE("the gather GEMM's source rows lie in each token owner's buffer, block by block") {
    // Each expert owner's m rows, in (expert, token owner) blocks: as many rows as the counts give it, every
    // source row inside the owner's source_rows() tokens, and a token owner's rows read in turn (0, 1, ...
    // wrapping), so no row of its buffer is read twice before every other one has been.
    for_each_uneven_shape(FusedKind::kGatherGrouped, [](FusedShape s) {
      const int ranks = s.ranks, experts = s.experts;
      s.m = s.m / experts * experts;  // whole rows per expert, as fused_shape rounds them
      const std::vector<int32_t> c = push_combine_counts(s);
      for (int q = 0; q < ranks; ++q) {
        const std::vector<int32_t> rows = gather_source_rows(s, c, q);
        CHECK(static_cast<int64_t>(rows.size()) == s.m);
        std::vector<int64_t> next(static_cast<size_t>(ranks), 0);
        size_t i = 0;
        for (int e = 0; e < experts; ++e)
          for (int r = 0; r < ranks; ++r)
            for (int32_t k = 0; k < c[static_cast<size_t>((q * ranks + r) * experts + e)]; ++k, ++i) {
              REQUIRE(i < rows.size());
              CHECK(rows[i] >= 0);
              CHECK(rows[i] < s.source_rows());
              CHECK(rows[i] == next[static_cast<size_t>(r)]++ % s.source_rows());
            }
      }
    });
  }
}

}  // namespace moeplan::executor
