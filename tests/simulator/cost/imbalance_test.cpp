// The load-imbalance model against closed forms (expected maxima of normals, capacity drops), against Monte
// Carlo routing of real top-k choices, and on deterministic (sigma = 0) loads.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <numbers>
#include <random>
#include <vector>

#include "simulator/cost/imbalance.h"

using namespace moeplan::cost;

namespace {

const double kSqrtPi = std::sqrt(std::numbers::pi);
const double kPhiAtZero = 1.0 / std::sqrt(2.0 * std::numbers::pi);  // phi(0)

// Monte Carlo of uniform top-k routing (k <= 2): each of `tokens` tokens picks a uniform expert a of E, then
// (for k = 2) a uniform b of the other E - 1 (draw in [0, E-1), step over a), each index from 32 random bits
// by multiply-shift (bias E/2^32). Experts sit contiguously on ep ranks. Means over trials of the busiest
// rank's load and of the fraction a per-expert capacity C = cf*T*k/E drops.
struct Simulated {
  double busiest_rank = 0;
  double dropped_fraction = 0;
};

Simulated simulate_uniform(int64_t experts, int64_t top_k, int64_t ep, int64_t tokens, double capacity_factor,
                           int trials) {
  REQUIRE((top_k == 1 || top_k == 2));
  std::mt19937_64 rng(20240611);
  const auto e_count = static_cast<uint64_t>(experts);
  const size_t per_rank = static_cast<size_t>(experts / ep);
  const double assignments = static_cast<double>(tokens * top_k);
  const double capacity = capacity_factor * assignments / static_cast<double>(experts);
  std::vector<double> load(static_cast<size_t>(experts));
  Simulated sim;
  for (int t = 0; t < trials; ++t) {
    std::fill(load.begin(), load.end(), 0.0);
    for (int64_t token = 0; token < tokens; ++token) {
      const uint64_t bits = rng();
      const uint64_t first = ((bits & 0xffffffffu) * e_count) >> 32;
      load[first] += 1;
      if (top_k == 2) {
        const uint64_t other = ((bits >> 32) * (e_count - 1)) >> 32;
        load[other + (other >= first ? 1 : 0)] += 1;
      }
    }
    double busiest = 0, dropped = 0;
    for (size_t r = 0; r * per_rank < load.size(); ++r) {
      double rank_load = 0;
      for (size_t e = r * per_rank; e < (r + 1) * per_rank; ++e) rank_load += load[e];
      busiest = std::max(busiest, rank_load);
    }
    for (double l : load) dropped += std::max(0.0, l - capacity);
    sim.busiest_rank += busiest / trials;
    sim.dropped_fraction += dropped / assignments / trials;
  }
  return sim;
}

}  // namespace

TEST_SUITE("cost") {
  TEST_CASE("the expected max of n standard normals matches its closed forms") {
    // E[max of n iid N(0,1)] = int x d(Phi(x)^n): 0 for n = 1, 1/sqrt(pi) for 2, 3/(2 sqrt(pi)) for 3,
    // 6 atan(sqrt 2)/pi^(3/2) for 4 (David & Nagaraja, Order Statistics, 3.2).
    CHECK(expected_max_std_normal(1) == doctest::Approx(0.0).epsilon(1e-8));
    CHECK(expected_max_std_normal(2) == doctest::Approx(1.0 / kSqrtPi).epsilon(1e-8));
    CHECK(expected_max_std_normal(3) == doctest::Approx(1.5 / kSqrtPi).epsilon(1e-8));
    CHECK(expected_max_std_normal(4) ==
          doctest::Approx(6.0 * std::atan(std::sqrt(2.0)) / std::pow(std::numbers::pi, 1.5)).epsilon(1e-8));
    // n = 8, 100, 1000: int_0^inf (1 - Phi^n) - int_-inf^0 Phi^n by long-double Simpson, 2.8M points
    // (Harter 1961 tabulates 1.42360, 2.50759, 3.24144).
    CHECK(expected_max_std_normal(8) == doctest::Approx(1.4236003060).epsilon(1e-8));
    CHECK(expected_max_std_normal(100) == doctest::Approx(2.5075936364).epsilon(1e-8));
    CHECK(expected_max_std_normal(1000) == doctest::Approx(3.2414357691).epsilon(1e-8));
  }

  TEST_CASE("two ranks of one expert each: the busiest is mu + sigma/sqrt(pi)") {
    // E = 2 experts on ep = 2 ranks, top-1 uniform, T = 10000 tokens: each rank ~ N(5000, 10000 * 1/2 * 1/2),
    // sigma = 50, and E[max of two iid normals] = mu + sigma/sqrt(pi) = 5028.2095.
    const RoutingLoad l = routing_load(uniform_routing(2), 10000, 1, 2, std::nullopt, false);
    CHECK(l.assignments == 10000);
    CHECK(l.mean_rank_assignments == 5000);
    CHECK(l.mean_expert_rows == 5000);
    CHECK(l.busiest_rank_assignments == doctest::Approx(5000 + 50 / kSqrtPi).epsilon(1e-9));
    CHECK(l.busiest_expert_rows == doctest::Approx(l.busiest_rank_assignments));
    CHECK(l.dropped_fraction == 0);
  }

  TEST_CASE("uniform imbalance is 1 + e_ep sqrt((ep - 1)/(T k)) and shrinks as tokens grow") {
    // Uniform routing, E = 64, top-8, ep = 8: every rank ~ N(T k/8, T k (1/8)(7/8)), so
    // busiest / mean = 1 + e_8 sqrt(7/(T k)) with e_8 = E[max of 8 N(0,1)] = 1.4236003.
    double previous = 0;
    for (double tokens : {1e3, 1e4, 1e5, 1e6}) {
      CAPTURE(tokens);
      const double imbalance =
          routing_load(uniform_routing(64), tokens, 8, 8, std::nullopt, false).imbalance();
      CHECK(imbalance == doctest::Approx(1 + 1.4236003 * std::sqrt(7 / (tokens * 8))).epsilon(1e-7));
      if (previous > 0) CHECK(imbalance < previous);
      previous = imbalance;
    }
    CHECK(previous < 1.002);
  }

  TEST_CASE("busiest rank matches Monte Carlo of real top-2 routing within 2%") {
    // T = 4096 tokens, each routed to 2 distinct of E = 8 experts uniformly, ep = 8 (one expert per rank);
    // 20000 trials (standard error of the mean max ~0.13 assignments, 0.3% of its excess over the mean). The
    // model's independence and its Binomial(T k, 1/E) variance err in opposite directions here: its excess
    // over the mean (42.6) is within ~1% of the simulated one, so that is checked to 3% as well.
    const Simulated sim = simulate_uniform(8, 2, 8, 4096, 1.0, 20000);
    const RoutingLoad l = routing_load(uniform_routing(8), 4096, 2, 8, std::nullopt, false);
    CHECK(l.busiest_rank_assignments == doctest::Approx(sim.busiest_rank).epsilon(0.02));
    CHECK(l.busiest_rank_assignments - 1024 == doctest::Approx(sim.busiest_rank - 1024).epsilon(0.03));

    // Capacity factor 1.0 on the same runs: C = T k/E = 1024 per expert. The model's variance
    // T k (1/E)(1 - 1/E) exceeds the exact variance of a top-k-distinct count, T (k/E)(1 - k/E), by
    // (1 - 1/E)/(1 - k/E) = 7/6, and at z = 0 the drop sigma phi(0) is proportional to sigma: the model drops
    // sqrt(7/6) (8.0%) more than real routing. Checked to 2%: the Monte Carlo error is ~0.4% (a trial's drops
    // vary by ~52%: 8 experts, each (L-C)+ with sd sigma sqrt(1/2 - 1/(2 pi)) against mean sigma phi(0)).
    const RoutingLoad capped = routing_load(uniform_routing(8), 4096, 2, 8, 1.0, false);
    CHECK(sim.dropped_fraction > 0);
    CHECK(capped.dropped_fraction ==
          doctest::Approx(sim.dropped_fraction * std::sqrt(7.0 / 6.0)).epsilon(0.02));
  }

  TEST_CASE("with top-1 routing the dropped fraction matches Monte Carlo within 2%") {
    // T = 4096 tokens, top-1 of E = 8, cf = 1.0: an expert's count is exactly Binomial(T, 1/8), which the
    // model takes as N(512, 448); drops = E * sigma * phi(0) / T = 8 * 21.166 * 0.39894 / 4096 = 1.649%.
    // The normal approximation of the binomial's mean excess errs O(1/(T p)); 10000 trials give ~0.5%
    // Monte Carlo error.
    const Simulated sim = simulate_uniform(8, 1, 8, 4096, 1.0, 10000);
    const RoutingLoad l = routing_load(uniform_routing(8), 4096, 1, 8, 1.0, false);
    CHECK(l.dropped_fraction == doctest::Approx(8 * std::sqrt(448.0) * kPhiAtZero / 4096).epsilon(1e-9));
    CHECK(l.dropped_fraction == doctest::Approx(sim.dropped_fraction).epsilon(0.02));
  }

  TEST_CASE("capacity factor 1.0 drops a positive fraction, a large one drops nothing") {
    // E = 64, top-8, ep = 8, T = 2048. At cf = 1 every expert sits at z = 0: drops = E sigma phi(0) / (T k)
    // with sigma^2 = T k (1/64)(63/64).
    const double sigma = std::sqrt(2048.0 * 8 / 64 * 63 / 64);
    const RoutingLoad none = routing_load(uniform_routing(64), 2048, 8, 8, std::nullopt, false);
    const RoutingLoad tight = routing_load(uniform_routing(64), 2048, 8, 8, 1.0, false);
    CHECK(tight.dropped_fraction == doctest::Approx(64 * sigma * kPhiAtZero / (2048 * 8)).epsilon(1e-9));
    CHECK(tight.busiest_expert_rows <= 256);
    CHECK(tight.busiest_rank_assignments <= 8 * 256);
    CHECK(tight.busiest_rank_assignments < none.busiest_rank_assignments);

    const RoutingLoad loose = routing_load(uniform_routing(64), 2048, 8, 8, 3.0, false);
    CHECK(loose.dropped_fraction < 1e-12);
    CHECK(loose.busiest_rank_assignments == doctest::Approx(none.busiest_rank_assignments).epsilon(1e-9));
    CHECK(loose.busiest_expert_rows == doctest::Approx(none.busiest_expert_rows).epsilon(1e-9));

    // Per-rank capacity (MegaScale-MoE): C = cf T k/ep on the rank load, sigma_r^2 = T k (1/8)(7/8).
    const double sigma_rank = std::sqrt(2048.0 * 8 / 8 * 7 / 8);
    const RoutingLoad per_rank = routing_load(uniform_routing(64), 2048, 8, 8, 1.0, true);
    CHECK(per_rank.dropped_fraction ==
          doctest::Approx(8 * sigma_rank * kPhiAtZero / (2048 * 8)).epsilon(1e-9));
    CHECK(per_rank.busiest_rank_assignments <= 2048);
    CHECK(per_rank.busiest_rank_assignments > 2048 - 1);  // some rank is over C in almost every step
  }

  TEST_CASE("zipf skew makes rank 0 the busiest and the imbalance larger than uniform's") {
    // E = 64, top-8, ep = 8, T = 4096, p_e ~ 1/(e+1): rank 0 holds experts 0..7, P_0 = H_8/H_64 = 0.573,
    // its mean load T k P_0 is many sigma above every other rank's, so the busiest is rank 0, at T k P_0.
    const RoutingDistribution zipf = zipf_routing(64, 1.0);
    double h8 = 0, h64 = 0;
    for (int e = 1; e <= 64; ++e) (e <= 8 ? h8 : h64) += 1.0 / e;
    h64 += h8;
    double p0 = 0, p1 = 0;
    for (int e = 0; e < 8; ++e) p0 += zipf.expert_probability[static_cast<size_t>(e)];
    for (int e = 8; e < 16; ++e) p1 += zipf.expert_probability[static_cast<size_t>(e)];
    CHECK(p0 == doctest::Approx(h8 / h64));
    CHECK(zipf.expert_probability[0] == doctest::Approx(1 / h64));

    const RoutingLoad skewed = routing_load(zipf, 4096, 8, 8, std::nullopt, false);
    const RoutingLoad flat = routing_load(uniform_routing(64), 4096, 8, 8, std::nullopt, false);
    const double a = 4096.0 * 8, sigma0 = std::sqrt(a * p0 * (1 - p0));
    CHECK(a * p0 - a * p1 > 20 * sigma0);  // rank 0 dominates rank 1, the next busiest
    CHECK(skewed.busiest_rank_assignments == doctest::Approx(a * p0).epsilon(1e-6));
    CHECK(skewed.imbalance() == doctest::Approx(8 * p0).epsilon(1e-6));
    CHECK(skewed.imbalance() > flat.imbalance());
    CHECK(skewed.busiest_expert_rows == doctest::Approx(a / h64).epsilon(1e-6));  // expert 0
  }

  TEST_CASE("deterministic loads (sigma = 0) give exact answers and no NaN") {
    // One expert on one rank: every assignment lands there, L = T exactly.
    const RoutingLoad one = routing_load(routing_from_counts({5.0}), 1000, 1, 1, std::nullopt, false);
    CHECK(one.busiest_rank_assignments == 1000);
    CHECK(one.busiest_expert_rows == 1000);
    CHECK(one.imbalance() == 1);
    const RoutingLoad half = routing_load(routing_from_counts({5.0}), 1000, 1, 1, 0.5, false);
    CHECK(half.dropped_fraction == 0.5);
    CHECK(half.busiest_rank_assignments == 500);

    // All traffic to expert 0 of 4 on 2 ranks: rank 0 gets T, rank 1 nothing; imbalance = ep = 2.
    const RoutingDistribution hot = routing_from_counts({3.0, 0.0, 0.0, 0.0});
    const RoutingLoad l = routing_load(hot, 1000, 1, 2, std::nullopt, false);
    CHECK(l.busiest_rank_assignments == 1000);
    CHECK(l.busiest_expert_rows == 1000);
    CHECK(l.imbalance() == 2);
    // Per-expert cf = 2: C = 2 T/4 = 500, half the assignments drop; rank 0 keeps 500.
    const RoutingLoad per_expert = routing_load(hot, 1000, 1, 2, 2.0, false);
    CHECK(per_expert.dropped_fraction == 0.5);
    CHECK(per_expert.busiest_expert_rows == 500);
    CHECK(per_expert.busiest_rank_assignments == 500);
    // Per-rank cf = 1: C = T/2 = 500 on rank 0, which keeps half of expert 0's rows.
    const RoutingLoad per_rank = routing_load(hot, 1000, 1, 2, 1.0, true);
    CHECK(per_rank.dropped_fraction == 0.5);
    CHECK(per_rank.busiest_rank_assignments == 500);
    CHECK(per_rank.busiest_expert_rows == 500);
    for (const RoutingLoad& r : {one, half, l, per_expert, per_rank}) {
      CHECK(std::isfinite(r.busiest_rank_assignments));
      CHECK(std::isfinite(r.busiest_expert_rows));
      CHECK(std::isfinite(r.dropped_fraction));
      CHECK(std::isfinite(r.imbalance()));
    }

    // No tokens: nothing to route, imbalance 1.
    const RoutingLoad empty = routing_load(uniform_routing(8), 0, 2, 4, 1.0, false);
    CHECK(empty.busiest_rank_assignments == 0);
    CHECK(empty.dropped_fraction == 0);
    CHECK(empty.imbalance() == 1);
  }

  TEST_CASE("routing_from_counts normalises and zipf with s = 0 is uniform") {
    const RoutingDistribution d = routing_from_counts({1, 3, 0, 4});
    CHECK(d.expert_probability == std::vector<double>{0.125, 0.375, 0.0, 0.5});
    const RoutingDistribution flat = zipf_routing(16, 0.0);
    for (double p : flat.expert_probability) CHECK(p == doctest::Approx(1.0 / 16));
  }
}
