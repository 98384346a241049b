// The step over a stack's ranged numbers: each number at either end is exactly the prediction with that
// stack, slower host issue and slower memory-bound kernels never shorten the step, the corners bound every
// single end, numbers without a range are left alone, and threads change nothing.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "simulator/predict/assumptions.h"
#include "tests/simulator/predict/megatron_case.h"

using namespace moeplan;

namespace {

// The shared Megatron-Core job: the alltoall dispatcher's host wait exposes the host's issue time.
struct Job : test::MegatronCase {
  double step(const StackProfile& s) const {
    const Prediction p = run(s);
    REQUIRE(p.violations.empty());
    return p.step_time_s;
  }
  double step_on(const Plan& p, const StackProfile& s) const {
    const Prediction r = predict(model, p, hw, s, workload::uniform_routing(model.moe.num_experts));
    REQUIRE(r.violations.empty());
    return r.step_time_s;
  }
  double step_on(const Plan& p) const { return step_on(p, stack); }
  AssumptionRange range(const StackProfile& s, int threads = 1) const {
    return assumption_range(model, plan, hw, s, workload::uniform_routing(model.moe.num_experts), step(s),
                            threads);
  }
};

const AssumptionEffect& effect(const AssumptionRange& r, const std::string& path) {
  for (const AssumptionEffect& e : r.effects) {
    if (e.path == path) return e;
  }
  FAIL("no effect for " << path);
  return r.effects.front();
}

}  // namespace

TEST_SUITE("predict") {
  TEST_CASE("each ranged number at either end is the prediction with the stack set there") {
    const Job job;
    const AssumptionRange r = job.range(job.stack);
    REQUIRE(r.effects.size() >= 5);
    for (const char* path : {"host.issue_us_per_kernel", "memory_bound_efficiency"}) {
      CAPTURE(path);
      const AssumptionEffect& e = effect(r, path);
      for (const bool high : {false, true}) {
        StackProfile s = job.stack;
        for (const StackProfile::Number& n : s.numbers()) {
          if (n.path == e.path) n.number->value = high ? e.high : e.low;
        }
        CHECK((high ? e.step_at_high : e.step_at_low) == job.step(s));
      }
    }
    // A slower host and slower memory-bound kernels never shorten the step; this job exposes both.
    const AssumptionEffect& host = effect(r, "host.issue_us_per_kernel");
    CHECK(host.step_at_low <= r.step_time_s);
    CHECK(host.step_at_high > r.step_time_s);
    const AssumptionEffect& mem = effect(r, "memory_bound_efficiency");
    CHECK(mem.step_at_low > r.step_time_s);
    CHECK(mem.step_at_high < r.step_time_s);
  }

  TEST_CASE("the GPU's sustained tensor-core rate is varied as a stack number is, on a copy of the profile") {
    // The H100's sustained BF16 rate is assumed (carried from an H200): each end is the prediction on the
    // profile with the rate set there; a slower GPU lengthens the step, the tables' own rate shortens it.
    const Job job;
    const AssumptionRange r = job.range(job.stack);
    const AssumptionEffect& e = effect(r, "gpu.sustained_rate.bf16");
    CHECK(e.basis == Basis::kAssumed);
    CHECK(e.value == job.hw.gpu.sustained_rate.at("bf16").value);
    for (const bool high : {false, true}) {
      HardwareProfile h = job.hw;
      h.gpu.sustained_rate.at("bf16").value = high ? e.high : e.low;
      const Prediction p =
          predict(job.model, job.plan, h, job.stack, workload::uniform_routing(job.model.moe.num_experts));
      REQUIRE(p.violations.empty());
      CHECK((high ? e.step_at_high : e.step_at_low) == p.step_time_s);
    }
    CHECK(e.step_at_low > r.step_time_s);
    CHECK(e.step_at_high < r.step_time_s);
    // The FP8 rate prices nothing in this BF16 plan and is left out; in the FP8 plan it moves the step.
    auto has = [](const AssumptionRange& a, const std::string& path) {
      return std::any_of(a.effects.begin(), a.effects.end(), [&](const auto& x) { return x.path == path; });
    };
    CHECK_FALSE(has(r, "gpu.sustained_rate.fp8"));
    Job fp8 = job;
    fp8.plan.precision = Precision::kFp8;
    fp8.plan.fp8_recipe = Fp8Recipe::kTensorwise;
    const AssumptionRange f = fp8.range(fp8.stack);
    REQUIRE(has(f, "gpu.sustained_rate.fp8"));
    CHECK(effect(f, "gpu.sustained_rate.fp8").step_at_low > f.step_time_s);
  }

  TEST_CASE("the corners bound every single end, and the effects come largest swing first") {
    const Job job;
    const AssumptionRange r = job.range(job.stack);
    CHECK(r.fastest_s < r.step_time_s);
    CHECK(r.slowest_s > r.step_time_s);
    for (size_t i = 0; i < r.effects.size(); ++i) {
      const AssumptionEffect& e = r.effects[i];
      CAPTURE(e.path);
      CHECK(r.fastest_s <= std::min(e.step_at_low, e.step_at_high));
      CHECK(r.slowest_s >= std::max(e.step_at_low, e.step_at_high));
      if (i > 0) CHECK(r.effects[i - 1].swing(r.step_time_s) >= e.swing(r.step_time_s));
    }
    // Every number at its slow end together is at least as slow as the slowest one alone.
    StackProfile slow = job.stack;
    for (const StackProfile::Number& n : slow.numbers()) {
      for (const AssumptionEffect& e : r.effects) {
        if (n.path == e.path && std::max(e.step_at_low, e.step_at_high) > r.step_time_s)
          n.number->value = e.step_at_high >= e.step_at_low ? e.high : e.low;
      }
    }
    CHECK(r.slowest_s == std::max(job.step(slow), r.slowest_s));
  }

  TEST_CASE("numbers without a range, or with a range of one value, are not varied") {
    Job job;
    for (auto& [dtype, n] : job.hw.gpu.sustained_rate) n.range.reset();
    StackProfile s = job.stack;
    for (const StackProfile::Number& n : s.numbers()) n.number->range.reset();
    AssumptionRange r = job.range(s);
    CHECK(r.effects.empty());
    CHECK(r.predictions == 0);
    CHECK(r.fastest_s == r.step_time_s);
    CHECK(r.slowest_s == r.step_time_s);

    s.host_s_per_kernel.range = std::pair{s.host_s_per_kernel.value, s.host_s_per_kernel.value};
    r = job.range(s);
    REQUIRE(r.effects.size() == 1);
    CHECK(r.predictions == 0);
    CHECK(r.effects[0].step_at_low == r.step_time_s);
    CHECK(r.effects[0].step_at_high == r.step_time_s);
    CHECK(r.effects[0].unit == 1e-6);
  }

  TEST_CASE("the recurrent scan's chain time is varied only where the model has Gated DeltaNet layers") {
    const Job job;
    for (const AssumptionEffect& e : job.range(job.stack).effects) CHECK(e.path != "recurrent_scan.chunk_us");
    ModelSpec qn = io::load_model("qwen3-next-80b-a3b").value();
    qn.layers.resize(4);
    Plan p;
    p.gpus = 8;
    p.seq_len = 4096;
    p.global_batch = 8;
    p.experts.ep = 8;
    const auto routing = workload::uniform_routing(qn.moe.num_experts);
    const Prediction base = predict(qn, p, job.hw, job.stack, routing);
    REQUIRE(base.violations.empty());
    const AssumptionRange r = assumption_range(qn, p, job.hw, job.stack, routing, base.step_time_s, 1);
    const AssumptionEffect& e = effect(r, "recurrent_scan.chunk_us");
    CHECK(e.low == doctest::Approx(1.25e-6));
    CHECK(e.high == doctest::Approx(2.8e-6));
    CHECK(e.step_at_low <= base.step_time_s);
    CHECK(e.step_at_high >= base.step_time_s);
  }

  TEST_CASE("the casts' rate is varied in a BF16 plan only where it casts its gradients for an all-to-all") {
    // MegaScale-MoE's BF16 gradient all-to-all casts each shard first (a cast kernel, priced at the stack's
    // cast rate): on a stack that states that rate and runs that sync, a BF16 plan prices the rate and its
    // ends move the step; without that sync a BF16 plan casts nothing and the rate is not varied.
    const Job job;
    StackProfile s = job.stack;
    s.capabilities.grad_sync.push_back("bf16_all_to_all");
    for (const AssumptionEffect& e : job.range(s).effects)
      CHECK(e.path.rfind("memory_bound_efficiency_by_kind.cast", 0) != 0);
    Plan a2a = job.plan;
    a2a.compression.grad_sync = GradSync::kBf16AllToAll;
    const auto routing = workload::uniform_routing(job.model.moe.num_experts);
    const Prediction base = predict(job.model, a2a, job.hw, s, routing);
    REQUIRE(base.violations.empty());
    const AssumptionRange r = assumption_range(job.model, a2a, job.hw, s, routing, base.step_time_s, 1);
    const AssumptionEffect& e = effect(r, "memory_bound_efficiency_by_kind.cast.backward");
    CHECK(e.low == doctest::Approx(0.9));
    // A slower cast of every gradient shard moves the step (here 8 us shorter: the engine's sharing of SMs
    // and links need not make a slower kernel a longer step).
    CHECK(e.step_at_low != base.step_time_s);
  }

  TEST_CASE("threads change nothing") {
    const Job job;
    const AssumptionRange a = job.range(job.stack, 1), b = job.range(job.stack, 3);
    CHECK(a.fastest_s == b.fastest_s);
    CHECK(a.slowest_s == b.slowest_s);
    CHECK(a.predictions == b.predictions);
    REQUIRE(a.effects.size() == b.effects.size());
    for (size_t i = 0; i < a.effects.size(); ++i) {
      CHECK(a.effects[i].path == b.effects[i].path);
      CHECK(a.effects[i].step_at_low == b.effects[i].step_at_low);
      CHECK(a.effects[i].step_at_high == b.effects[i].step_at_high);
    }
  }

  TEST_CASE("a ranking predicts no end of a number a plan does not price, which leaves that plan's step") {
    // A BF16 plan and its FP8 (per-tensor) copy, neither with TE's userbuffers. The BF16 plan prices no FP8
    // number (the FP8 tensor-core rate, the casts, the block-scaled GEMM rate) and neither prices the
    // userbuffers' reduce-scatter speed or the block-scaled rate: those ends are not predicted for that plan,
    // and predicting them anyway gives its step as given, bit for bit.
    const Job job;
    Plan fp8 = job.plan;
    fp8.precision = Precision::kFp8;
    const double step_bf16 = job.step(job.stack), step_fp8 = job.step_on(fp8);
    const bool fp8_first = step_fp8 <= step_bf16;
    const std::vector<Plan> plans =
        fp8_first ? std::vector<Plan>{fp8, job.plan} : std::vector<Plan>{job.plan, fp8};
    const std::vector<double> steps =
        fp8_first ? std::vector<double>{step_fp8, step_bf16} : std::vector<double>{step_bf16, step_fp8};
    const auto routing = workload::uniform_routing(job.model.moe.num_experts);
    const AssumptionRanking r =
        ranking_over_assumptions(job.model, plans, steps, job.hw, job.stack, routing, 2);
    REQUIRE(r.faster_as_given.empty());

    // Each unpriced number's ends, set one at a time: the step of the plan that does not price it stays.
    struct Unpriced {
      const Plan* plan;
      double step;
      std::vector<std::string> paths;
    };
    const std::vector<std::string> not_fp8 = {"userbuffers_rs_speed", "fp8_block_gemm_rate"};
    std::vector<std::string> not_bf16 = not_fp8;
    for (const char* p : {"memory_bound_efficiency_by_kind.cast.forward",
                          "memory_bound_efficiency_by_kind.cast.backward", "gpu.sustained_rate.fp8"})
      not_bf16.push_back(p);
    int64_t skipped = 0;
    for (const Unpriced& u : {Unpriced{&job.plan, step_bf16, not_bf16}, Unpriced{&fp8, step_fp8, not_fp8}}) {
      for (const std::string& path : u.paths) {
        CAPTURE(path);
        StackProfile probe = job.stack;
        HardwareProfile hw = job.hw;
        const Stated<double>* n = nullptr;
        for (const StackProfile::Number& x : probe.numbers()) {
          if (x.path == path) n = x.number;
        }
        if (path == "gpu.sustained_rate.fp8") n = &hw.gpu.sustained_rate.at("fp8");
        if (n == nullptr || !n->range) continue;  // not a ranged number of this stack
        for (const double end : {n->range->first, n->range->second}) {
          if (end == n->value) continue;
          ++skipped;
          StackProfile s = job.stack;
          HardwareProfile h = job.hw;
          for (const StackProfile::Number& x : s.numbers()) {
            if (x.path == path) x.number->value = end;
          }
          if (path == "gpu.sustained_rate.fp8") h.gpu.sustained_rate.at("fp8").value = end;
          const Prediction p = predict(job.model, *u.plan, h, s, routing);
          REQUIRE(p.violations.empty());
          CHECK(p.step_time_s == u.step);
        }
      }
    }
    CHECK(skipped >= 5);
    CHECK(r.predictions == 2 * r.ends - skipped);
  }

  TEST_CASE(
      "a ranking's first plan is overtaken where another plan's step becomes shorter, by the margin there") {
    const Job job;
    // ZeRO-2 runs as Megatron-FSDP without gradient-accumulation fusion: its weight gradients are written
    // once, so the main-gradient epilogue that the ZeRO-1 plan pays is not its cost. With its gradients
    // reduce-scattered in BF16 it is a little faster as given; the ZeRO-1 plan overtakes it where that
    // epilogue hides more than the measured share (the high end of its range).
    Plan zero2 = job.plan;
    zero2.data.zero = 2;
    zero2.compression.grad_sync = GradSync::kBf16ReduceScatter;
    const Plan& zero1 = job.plan;
    const double step1 = job.step_on(zero2), step2 = job.step(job.stack);
    REQUIRE(step2 > step1);
    const auto routing = workload::uniform_routing(job.model.moe.num_experts);
    const AssumptionRanking r =
        ranking_over_assumptions(job.model, {zero2, zero1}, {step1, step2}, job.hw, job.stack, routing, 2);
    CHECK(r.ends >= 10);
    CHECK(r.faster_as_given.empty());
    bool at_more_overlap = false;
    for (const RankOvertake& t : r.overtakes) {
      CAPTURE(t.path);
      CHECK(t.plan == 1);
      StackProfile s = job.stack;
      for (const StackProfile::Number& n : s.numbers()) {
        if (n.path == t.path) n.number->value = t.at;
      }
      CHECK(t.faster == doctest::Approx(1.0 - job.step(s) / job.step_on(zero2, s)).epsilon(1e-12));
      at_more_overlap = at_more_overlap || (t.path == "wgrad_accumulation.epilogue_overlap" &&
                                            t.at > job.stack.wgrad_accumulation.epilogue_overlap.value);
    }
    CHECK(at_more_overlap);

    // Listed the other way round, the second plan is faster as given: the ranking put it there for another
    // reason (memory), so it is named and not counted, and nothing overtakes.
    const AssumptionRanking back =
        ranking_over_assumptions(job.model, {zero1, zero2}, {step2, step1}, job.hw, job.stack, routing, 2);
    CHECK(back.faster_as_given == std::vector<size_t>{1});
    CHECK(back.overtakes.empty());

    // With a plan faster as given listed third, the overtakings are the second plan's, as before.
    Plan etp1 = job.plan;
    etp1.experts.etp = 1;
    const double step3 = job.step_on(etp1);
    REQUIRE(step3 < step1);
    const AssumptionRanking three = ranking_over_assumptions(
        job.model, {zero2, zero1, etp1}, {step1, step2, step3}, job.hw, job.stack, routing, 2);
    CHECK(three.faster_as_given == std::vector<size_t>{2});
    REQUIRE(three.overtakes.size() == r.overtakes.size());
    for (size_t i = 0; i < r.overtakes.size(); ++i) {
      CHECK(three.overtakes[i].plan == 1);
      CHECK(three.overtakes[i].path == r.overtakes[i].path);
      CHECK(three.overtakes[i].faster == r.overtakes[i].faster);
    }

    // The same plan twice, or one plan: nothing overtakes.
    CHECK(
        ranking_over_assumptions(job.model, {job.plan, job.plan}, {step1, step1}, job.hw, job.stack, routing)
            .overtakes.empty());
    CHECK(ranking_over_assumptions(job.model, {job.plan}, {step1}, job.hw, job.stack, routing).ends == 0);
  }
}
