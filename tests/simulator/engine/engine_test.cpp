// The event engine on hand-built graphs whose timelines have closed forms: pipeline bubbles of 1F1B and
// interleaved 1F1B, link sharing, stream order, determinism and the critical path; the host thread that
// issues each stage's ops (issue costs, waits at host syncs).
#include <doctest/doctest.h>

#include <algorithm>
#include <vector>

#include "simulator/engine/engine.h"
#include "simulator/workload/lower.h"

using namespace moeplan;

namespace {

struct Built {
  OpGraph g;
  std::vector<cost::OpCost> costs;
};

// p stages, m micro-batches, v chunks per stage: one compute op per (task), forward costing tf / v and
// backward tb / v, sends costing nothing; the order of each stage is pipeline_order().
Built pipeline_graph(int64_t p, int64_t m, int64_t v, double tf, double tb) {
  Built b;
  b.g.num_stages = static_cast<int>(p);
  b.g.chunks_per_stage = static_cast<int>(v);
  b.g.micro_batches = m;
  std::vector<std::pair<int32_t, int32_t>> deps;
  // task id of (mb, virtual stage, fwd) -> op id; send op ids likewise
  std::vector<int32_t> first(static_cast<size_t>(m * p * v * 2), -1), send(first.size(), -1);
  auto idx = [&](int64_t mb, int64_t vs, bool fwd) {
    return static_cast<size_t>((mb * p * v + vs) * 2 + (fwd ? 0 : 1));
  };
  auto add = [&](int64_t stage, Stream s, double seconds) {
    Op op;
    op.id = static_cast<int32_t>(b.g.ops.size());
    op.stage = static_cast<int16_t>(stage);
    op.stream = s;
    op.kind = s == Stream::kCompute ? OpKind::kGemm : OpKind::kSendRecv;
    b.g.ops.push_back(op);
    cost::OpCost c;
    c.seconds = seconds;
    c.resource = s == Stream::kCompute ? cost::Resource::kSm : cost::Resource::kNvlink;
    b.costs.push_back(c);
    return op.id;
  };
  for (int64_t s = 0; s < p; ++s) {
    for (const auto& t : pipeline_order(s, p, v, m)) {
      const int64_t vs = t.chunk * p + s;
      const int32_t op = add(s, Stream::kCompute, (t.forward ? tf : tb) / static_cast<double>(v));
      first[idx(t.micro_batch, vs, t.forward)] = op;
      const bool sends = t.forward ? vs < p * v - 1 : vs > 0;
      if (sends) {
        const int32_t sop = add(s, Stream::kPpComm, 0.0);
        deps.emplace_back(sop, op);
        send[idx(t.micro_batch, vs, t.forward)] = sop;
      }
    }
  }
  for (int64_t mb = 0; mb < m; ++mb) {
    for (int64_t vs = 0; vs < p * v; ++vs) {
      if (vs > 0) deps.emplace_back(first[idx(mb, vs, true)], send[idx(mb, vs - 1, true)]);
      if (vs < p * v - 1) deps.emplace_back(first[idx(mb, vs, false)], send[idx(mb, vs + 1, false)]);
      if (vs == p * v - 1) deps.emplace_back(first[idx(mb, vs, false)], first[idx(mb, vs, true)]);
    }
  }
  std::sort(deps.begin(), deps.end());
  for (auto& op : b.g.ops) {
    op.dep_begin = static_cast<uint32_t>(b.g.deps.size());
    for (auto [o, on] : deps) {
      if (o == op.id) b.g.deps.push_back(on);
    }
    op.dep_count = static_cast<uint32_t>(b.g.deps.size()) - op.dep_begin;
  }
  return b;
}

// Appends an op on stage 0, with no dependencies, and its cost.
struct OpSpec {
  Stream stream = Stream::kCompute;
  double seconds = 1.0;
  double host_seconds = 0;
  bool host_sync = false;
  double host_sync_seconds = 0;
  cost::Resource resource = cost::Resource::kSm;
  double sm_fraction = 0;
  double rate_beside_compute = 1.0;
};
int32_t add_op(Built& b, const OpSpec& o) {
  Op op;
  op.id = static_cast<int32_t>(b.g.ops.size());
  op.stream = o.stream;
  op.kind = o.resource == cost::Resource::kSm ? OpKind::kGemm : OpKind::kCollective;
  op.host_sync = o.host_sync;
  b.g.ops.push_back(op);
  cost::OpCost c;
  c.seconds = o.seconds;
  c.host_seconds = o.host_seconds;
  c.host_sync_seconds = o.host_sync_seconds;
  c.resource = o.resource;
  c.sm_fraction = o.sm_fraction;
  c.rate_beside_compute = o.rate_beside_compute;
  b.costs.push_back(c);
  return op.id;
}

}  // namespace

TEST_SUITE("engine") {
  TEST_CASE("the 1F1B bubble fraction is (p-1)/(m+p-1)") {
    // p stages, m micro-batches, forward 1 s and backward 2 s per stage: step = (m + p - 1) * 3 s, of which
    // each stage computes m * 3 s (its sends take no SMs).
    for (auto [p, m] : {std::pair{1L, 4L}, std::pair{4L, 8L}, std::pair{8L, 8L}, std::pair{2L, 16L},
                        std::pair{15L, 60L}, std::pair{17L, 20L}}) {
      CAPTURE(p);
      CAPTURE(m);
      Built b = pipeline_graph(p, m, 1, 1.0, 2.0);
      const auto t = engine::simulate(b.g, b.costs, {});
      const double ideal = static_cast<double>(m) * 3.0;
      CHECK(t.step_time == doctest::Approx(static_cast<double>(m + p - 1) * 3.0));
      CHECK(1.0 - ideal / t.step_time ==
            doctest::Approx(static_cast<double>(p - 1) / static_cast<double>(m + p - 1)));
      REQUIRE(t.stage_sm.size() == static_cast<size_t>(p));
      for (double busy : t.stage_sm) CHECK(busy == doctest::Approx(ideal));
    }
  }

  TEST_CASE("interleaving over v chunks shrinks the bubble by v") {
    // Megatron's interleaved schedule: bubble time (p-1)(tf+tb)/v.
    const int64_t p = 4, m = 8;
    for (int64_t v : {2L, 4L}) {
      CAPTURE(v);
      Built b = pipeline_graph(p, m, v, 1.0, 2.0);
      const auto t = engine::simulate(b.g, b.costs, {});
      CHECK(t.step_time == doctest::Approx(static_cast<double>(m) * 3.0 +
                                           static_cast<double>(p - 1) * 3.0 / static_cast<double>(v)));
    }
  }

  TEST_CASE("transfers sharing a link split its bandwidth, and kernels sharing the SMs split them") {
    Built b;
    b.g.num_stages = 1;
    for (int i = 0; i < 2; ++i) {
      Op op;
      op.id = i;
      op.stream = i == 0 ? Stream::kComm : Stream::kDpComm;
      op.kind = OpKind::kCollective;
      b.g.ops.push_back(op);
      cost::OpCost c;
      c.seconds = 1.0;
      c.resource = cost::Resource::kNic;
      b.costs.push_back(c);
    }
    auto t = engine::simulate(b.g, b.costs, {});
    CHECK(t.ops[0].end == doctest::Approx(2.0));
    CHECK(t.ops[1].end == doctest::Approx(2.0));
    // One on NVLink, one on the NIC: no sharing.
    b.costs[1].resource = cost::Resource::kNvlink;
    t = engine::simulate(b.g, b.costs, {});
    CHECK(t.step_time == doctest::Approx(1.0));
  }

  TEST_CASE("compute beside communication loses the SMs the communication kernels take") {
    Built b;
    b.g.num_stages = 1;
    for (int i = 0; i < 2; ++i) {
      Op op;
      op.id = i;
      op.stream = i == 0 ? Stream::kCompute : Stream::kComm;
      op.kind = i == 0 ? OpKind::kGemm : OpKind::kCollective;
      b.g.ops.push_back(op);
      cost::OpCost c;
      c.seconds = i == 0 ? 1.0 : 0.5;
      c.resource = i == 0 ? cost::Resource::kSm : cost::Resource::kNvlink;
      c.sm_fraction = i == 0 ? 0.0 : 0.2;
      b.costs.push_back(c);
    }
    engine::EngineOptions o;
    const auto t = engine::simulate(b.g, b.costs, o);
    // First 0.5 s at 80% speed (0.4 s of work), the remaining 0.6 s alone: ends at 1.1 s.
    CHECK(t.ops[0].end == doctest::Approx(1.1));
    CHECK(t.ops[1].end == doctest::Approx(0.5));
  }

  TEST_CASE("the same graph gives the same timeline and the critical path spans the step") {
    Built b = pipeline_graph(4, 8, 1, 1.0, 2.0);
    const auto t1 = engine::simulate(b.g, b.costs, {});
    const auto t2 = engine::simulate(b.g, b.costs, {});
    for (size_t i = 0; i < t1.ops.size(); ++i) {
      CHECK(t1.ops[i].start == t2.ops[i].start);
      CHECK(t1.ops[i].end == t2.ops[i].end);
    }
    const auto path = engine::critical_path(t1);
    double sum = 0;
    for (int32_t id : path)
      sum += t1.ops[static_cast<size_t>(id)].end - t1.ops[static_cast<size_t>(id)].start;
    CHECK(sum == doctest::Approx(t1.step_time));
    CHECK(path == engine::longest_path(b.g, t1));
  }

  TEST_CASE("compute beside a DeepEP exchange runs at the overlap efficiency on the SMs DeepEP leaves") {
    // A 1 s GEMM beside a 0.5 s exchange holding 20 of 132 SMs, overlap efficiency 0.9: for 0.5 s the GEMM
    // runs at r = (1 - 20/132) x 0.9, then alone: it ends at 0.5 + (1 - 0.5 r).
    Built b;
    add_op(b, {});
    add_op(b, {.stream = Stream::kComm,
               .seconds = 0.5,
               .resource = cost::Resource::kNic,
               .sm_fraction = 20.0 / 132});
    engine::EngineOptions o;
    o.overlap_compute_efficiency = 0.9;
    const auto t = engine::simulate(b.g, b.costs, o);
    const double r = (1 - 20.0 / 132) * 0.9;
    CHECK(t.ops[0].end == doctest::Approx(0.5 + (1 - 0.5 * r)));
    CHECK(t.ops[1].end == doctest::Approx(0.5));
  }

  TEST_CASE("a dispatcher exchange beside compute runs at its rate beside compute, and at full rate alone") {
    // A 0.5 s exchange at 0.7 of its rate beside a 0.2 s GEMM: 0.14 s of its work in the first 0.2 s, the
    // other 0.36 s alone: it ends at 0.56 s. Alone the same exchange takes its 0.5 s.
    Built b;
    add_op(b, {.seconds = 0.2});
    add_op(b, {.stream = Stream::kComm,
               .seconds = 0.5,
               .resource = cost::Resource::kNic,
               .rate_beside_compute = 0.7});
    auto t = engine::simulate(b.g, b.costs, {});
    CHECK(t.ops[0].end == doctest::Approx(0.2));
    CHECK(t.ops[1].end == doctest::Approx(0.2 + (0.5 - 0.2 * 0.7)));
    Built alone;
    add_op(alone, {.stream = Stream::kComm,
                   .seconds = 0.5,
                   .resource = cost::Resource::kNvlink,
                   .rate_beside_compute = 0.7});
    t = engine::simulate(alone.g, alone.costs, {});
    CHECK(t.ops[0].end == doctest::Approx(0.5));
    // Two exchanges on one link beside compute split the slowed rate: each at 0.7 / 2 while the 0.2 s GEMM
    // runs, then 1 / 2: 0.07 s of work each, the other 0.43 s at half rate, ending at 0.2 + 0.86.
    Built two;
    add_op(two, {.seconds = 0.2});
    for (Stream s : {Stream::kComm, Stream::kDpComm})
      add_op(two,
             {.stream = s, .seconds = 0.5, .resource = cost::Resource::kNic, .rate_beside_compute = 0.7});
    t = engine::simulate(two.g, two.costs, {});
    CHECK(t.ops[1].end == doctest::Approx(0.2 + 2 * (0.5 - 0.2 * 0.35)));
    CHECK(t.ops[2].end == doctest::Approx(t.ops[1].end));
  }

  TEST_CASE("a host slower than the GPU makes the step the sum of its issue times") {
    // Ten 1 s kernels in a row, each taking the host h to issue: op i is issued at (i + 1) h. With h = 3 s
    // the GPU waits for each, so the step is 10 h + 1; with h = 0.5 s the host runs ahead after the first
    // and the step is h + 10.
    for (double h : {3.0, 0.5}) {
      CAPTURE(h);
      Built b;
      for (int i = 0; i < 10; ++i) add_op(b, {.host_seconds = h});
      const auto t = engine::simulate(b.g, b.costs, {});
      for (size_t i = 0; i < 10; ++i) CHECK(t.issued[i] == doctest::Approx(h * static_cast<double>(i + 1)));
      CHECK(t.step_time == doctest::Approx(h > 1 ? 10 * h + 1 : h + 10));
      // The critical chain runs through every op (each waited for the one issued before it).
      CHECK(engine::critical_path(t).size() == 10);
    }
  }

  TEST_CASE("a host sync stops the host until the op ends plus the round trip") {
    // op 0: a 10 s kernel the host waits for, with a 2 s round trip; op 1: an independent 1 s transfer on
    // another stream issued after it. The host reaches op 1 at 12 s, so op 1 runs 12-13 s (at 0 s without
    // the sync), and the critical chain goes from op 0 to op 1 through the host.
    Built b;
    add_op(b, {.seconds = 10, .host_sync = true, .host_sync_seconds = 2});
    add_op(b, {.stream = Stream::kComm, .resource = cost::Resource::kNvlink});
    auto t = engine::simulate(b.g, b.costs, {});
    CHECK(t.issued[1] == doctest::Approx(12));
    CHECK(t.ops[1].start == doctest::Approx(12));
    CHECK(t.step_time == doctest::Approx(13));
    CHECK(t.gated_by[1] == 0);
    CHECK(engine::critical_path(t) == std::vector<int32_t>{0, 1});
    b.g.ops[0].host_sync = false;
    t = engine::simulate(b.g, b.costs, {});
    CHECK(t.ops[1].start == 0.0);
    CHECK(t.step_time == doctest::Approx(10));
  }

  TEST_CASE("with no host costs the timeline is the host-free engine's") {
    // Interleaved 1F1B over 4 stages with sends on their own stream: a host issuing in no time, with no host
    // syncs, changes no start or end.
    Built b = pipeline_graph(4, 8, 2, 1.0, 2.0);
    engine::EngineOptions with_host, without;
    without.host = false;
    const auto a = engine::simulate(b.g, b.costs, with_host);
    const auto c = engine::simulate(b.g, b.costs, without);
    REQUIRE(a.ops.size() == c.ops.size());
    for (size_t i = 0; i < a.ops.size(); ++i) {
      CHECK(a.ops[i].start == c.ops[i].start);
      CHECK(a.ops[i].end == c.ops[i].end);
    }
    CHECK(a.step_time == c.step_time);
  }
}
