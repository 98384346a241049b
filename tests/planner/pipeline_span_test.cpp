// The screen's pipeline run task by task: 1F1B and interleaved 1F1B with equal stages against their closed
// forms, the latency of a send between stages, combined 1F1B pairs, and the steady state's extrapolation
// against running every micro-batch on uneven stages.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "planner/pipeline_span.h"

using namespace moeplan;
using planner::PipelineShape;
using planner::PipelineSpan;
using planner::VirtualStageTimes;

namespace {

double d(int64_t x) {
  return static_cast<double>(x);
}

std::vector<VirtualStageTimes> equal(int64_t virtual_stages, double f, double b) {
  return std::vector<VirtualStageTimes>(static_cast<size_t>(virtual_stages), {f, b, f, b});
}

double longest(const std::vector<double>& ends) {
  return *std::max_element(ends.begin(), ends.end());
}

}  // namespace

TEST_CASE("equal 1F1B stages take (m + pp - 1) forwards and backwards, the last stage pp - 1 forwards less") {
  PipelineSpan span;
  const double f = 1.0, b = 2.0;
  for (int64_t pp : {1, 2, 4, 8}) {
    for (int64_t m : {1, 3, 8, 17, 64}) {
      CAPTURE(pp);
      CAPTURE(m);
      const std::vector<double> ends =
          span.stage_ends({pp, 1, m, Schedule::k1F1B, false}, equal(pp, f, b), 0);
      REQUIRE(ends.size() == static_cast<size_t>(pp));
      CHECK(ends.front() == doctest::Approx(d(m + pp - 1) * (f + b)).epsilon(1e-12));
      CHECK(ends.back() == doctest::Approx(d(pp - 1) * f + d(m) * (f + b)).epsilon(1e-12));
    }
  }
}

TEST_CASE("equal interleaved stages shrink the fill and drain by the number of chunks") {
  PipelineSpan span;
  const double f = 1.0, b = 2.0;  // a stage's whole pass; each of its v chunks holds 1/v of it
  for (int64_t pp : {2, 4}) {
    for (int64_t v : {2, 3}) {
      for (int64_t groups : {1, 2, 5}) {
        const int64_t m = groups * pp;
        CAPTURE(pp);
        CAPTURE(v);
        CAPTURE(m);
        const std::vector<double> ends = span.stage_ends({pp, v, m, Schedule::kInterleaved1F1B, false},
                                                         equal(pp * v, f / d(v), b / d(v)), 0);
        CHECK(longest(ends) == doctest::Approx(d(m) * (f + b) + d(pp - 1) * (f + b) / d(v)).epsilon(1e-12));
      }
    }
  }
}

TEST_CASE("a send between stages delays each dependant on the other stage by its latency") {
  // Two stages, one micro-batch: forward on 0, hop, forward and backward on 1, hop, backward on 0.
  PipelineSpan span;
  const double f = 1.0, b = 2.0, hop = 0.25;
  const std::vector<double> ends = span.stage_ends({2, 1, 1, Schedule::k1F1B, false}, equal(2, f, b), hop);
  CHECK(ends[1] == doctest::Approx(2 * f + b + hop));
  CHECK(ends[0] == doctest::Approx(2 * f + 2 * b + 2 * hop));
}

TEST_CASE("combined 1F1B runs each steady forward beside a backward at the pair's time") {
  // One stage: the first forward alone, then m - 1 pairs, then the last backward alone.
  PipelineSpan span;
  const double f = 1.0, b = 2.0, pf = 0.8, pb = 1.5;
  for (int64_t m : {1, 2, 9, 40}) {
    CAPTURE(m);
    const std::vector<double> ends =
        span.stage_ends({1, 1, m, Schedule::k1F1B, true}, {VirtualStageTimes{f, b, pf, pb}}, 0);
    CHECK(ends[0] == doctest::Approx(f + d(m - 1) * (pf + pb) + b).epsilon(1e-12));
  }
}

TEST_CASE("the steady state's extrapolation equals running every micro-batch on uneven stages") {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(0.5, 2.0);
  PipelineSpan span;
  int64_t extrapolated = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const int64_t pp = 1 + trial % 6, v = trial % 3 == 0 ? 2 : 1;
    const int64_t m = v > 1 ? pp * (3 + 2 * (trial % 7)) : 5 + 7 * trial;
    const bool combined = trial % 4 == 1;
    std::vector<VirtualStageTimes> times;
    for (int64_t k = 0; k < pp * v; ++k) times.push_back({u(rng), 2 * u(rng), u(rng), 2 * u(rng)});
    const double hop = trial % 2 == 0 ? 0.0 : 0.1 * u(rng);
    const PipelineShape shape{pp, v, m, v > 1 ? Schedule::kInterleaved1F1B : Schedule::k1F1B, combined};
    CAPTURE(trial);
    const std::vector<double> whole = span.stage_ends(shape, times, hop, true);
    CHECK(span.last_micro_batches_run() == m);
    const std::vector<double> fast = span.stage_ends(shape, times, hop);
    if (span.last_micro_batches_run() < m) ++extrapolated;  // probes shorter than the step settled
    REQUIRE(fast.size() == whole.size());
    for (size_t s = 0; s < whole.size(); ++s) CHECK(fast[s] == doctest::Approx(whole[s]).epsilon(1e-9));
    // No stage is faster than its own passes run back to back.
    for (int64_t s = 0; s < pp; ++s) {
      double own = 0;
      for (int64_t c = 0; c < v; ++c) {
        const VirtualStageTimes& t = times[static_cast<size_t>(c * pp + s)];
        own += combined ? std::min(t.forward + t.backward, t.paired_forward + t.paired_backward)
                        : t.forward + t.backward;
      }
      CHECK(whole[static_cast<size_t>(s)] >= d(m) * own * (1 - 1e-12));
    }
  }
  CHECK(extrapolated >= 20);  // the extrapolation was exercised, not only the fallback
}

TEST_CASE("DualPipeV runs its V: each chunk's passes on the stages both ways, weight gradients held back") {
  // Equal stages and chunks. Every stage runs 2m forwards and 2m backwards whatever it holds back, so none
  // ends before m times its two chunks' passes; holding weight gradients back for the weights tasks fills
  // the cool-down's gaps, so the step is never longer than with none held back; a latency between stages
  // only adds.
  PipelineSpan span;
  const double f = 1.0, b = 2.0;
  for (int64_t pp : {2, 4, 8}) {
    for (int64_t m : {2 * pp, 4 * pp}) {
      CAPTURE(pp);
      CAPTURE(m);
      const PipelineShape shape{pp, 2, m, Schedule::kDualPipeV, false};
      std::vector<VirtualStageTimes> held(static_cast<size_t>(2 * pp), {f, b, f, b, 0.4 * b});
      const std::vector<VirtualStageTimes> none(static_cast<size_t>(2 * pp), {f, b, f, b, 0.0});
      const std::vector<double> zero_bubble = span.stage_ends(shape, held, 0.0);
      const std::vector<double> plain = span.stage_ends(shape, none, 0.0);
      REQUIRE(zero_bubble.size() == static_cast<size_t>(pp));
      for (double e : zero_bubble) CHECK(e >= d(m) * 2 * (f + b) * (1 - 1e-12));
      CHECK(longest(zero_bubble) <= longest(plain) * (1 + 1e-12));
      CHECK(span.last_micro_batches_run() == m);  // DualPipeV runs whole
      // A latency between stages delays the step, by at least the first micro-batch's way down and up.
      const std::vector<double> late = span.stage_ends(shape, none, 0.5);
      CHECK(longest(late) >= longest(plain) + 0.5 * 2 * d(pp - 1) * (1 - 1e-12));
    }
  }
}
