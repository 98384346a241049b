// The load-imbalance model against closed forms (expected maxima of normals, capacity drops), against Monte
// Carlo routing of real top-k choices, and on deterministic (sigma = 0) loads.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <random>
#include <vector>

#include "simulator/workload/routing.h"

using namespace moeplan::workload;

namespace {

const double kSqrtPi = std::sqrt(std::numbers::pi);
const double kPhiAtZero = 1.0 / std::sqrt(2.0 * std::numbers::pi);  // phi(0)

// Monte Carlo of uniform top-k routing: each of `tokens` tokens picks k distinct experts of E <= 64, each a
// uniform draw (32 random bits, multiply-shift: bias E/2^32; two draws per 64-bit word) redrawn while
// already picked. Returns the experts' loads, [trials][experts].
std::vector<std::vector<double>> sample_uniform_loads(int64_t experts, int64_t top_k, int64_t tokens,
                                                      int trials) {
  REQUIRE(experts <= 64);
  std::mt19937_64 rng(20240611);
  const auto e_count = static_cast<uint64_t>(experts);
  uint64_t word = 0;
  bool half_left = false;
  auto draw = [&] {
    half_left = !half_left;
    if (half_left) word = rng();
    const uint64_t bits = half_left ? word & 0xffffffffu : word >> 32;
    return (bits * e_count) >> 32;
  };
  std::vector<std::vector<double>> loads(static_cast<size_t>(trials),
                                         std::vector<double>(static_cast<size_t>(experts)));
  for (std::vector<double>& load : loads) {
    for (int64_t token = 0; token < tokens; ++token) {
      uint64_t picked = 0;
      for (int64_t pick = 0; pick < top_k;) {
        const uint64_t e = draw();
        if (picked >> e & 1) continue;
        picked |= uint64_t{1} << e;
        load[e] += 1;
        ++pick;
      }
    }
  }
  return loads;
}

// Means over trials, experts placed contiguously on ep ranks: the busiest rank's load, and the fractions of
// the T k assignments that C = cf T k/E per expert and C = cf T k/ep per rank drop.
struct Simulated {
  double busiest_rank = 0;
  double dropped_per_expert = 0;
  double dropped_per_rank = 0;
};

Simulated summarize(const std::vector<std::vector<double>>& loads, int64_t top_k, int64_t ep, int64_t tokens,
                    double capacity_factor) {
  const size_t experts = loads.front().size();
  const size_t per_rank = experts / static_cast<size_t>(ep);
  const double assignments = static_cast<double>(tokens * top_k);
  const double c_expert = capacity_factor * assignments / static_cast<double>(experts);
  const double c_rank = capacity_factor * assignments / static_cast<double>(ep);
  const auto trials = static_cast<double>(loads.size());
  Simulated sim;
  for (const std::vector<double>& load : loads) {
    double busiest = 0, per_expert = 0, per_rank_drop = 0;
    for (size_t r = 0; r * per_rank < experts; ++r) {
      double rank_load = 0;
      for (size_t e = r * per_rank; e < (r + 1) * per_rank; ++e) {
        rank_load += load[e];
        per_expert += std::max(0.0, load[e] - c_expert);
      }
      busiest = std::max(busiest, rank_load);
      per_rank_drop += std::max(0.0, rank_load - c_rank);
    }
    sim.busiest_rank += busiest / trials;
    sim.dropped_per_expert += per_expert / assignments / trials;
    sim.dropped_per_rank += per_rank_drop / assignments / trials;
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

  TEST_CASE("two ranks of one expert each: the busiest is mu + sigma sqrt(2/pi)") {
    // E = 2 experts on ep = 2 ranks, top-1 uniform, T = 10000 tokens: each rank ~ N(5000, 10000 * 1/2 * 1/2),
    // sigma = 50, and the two loads sum to T: max = 5000 + |L_0 - 5000|, E[max] = 5000 + 50 sqrt(2/pi) =
    // 5039.8942 (the model's independent ranks with variance sigma^2 / (1 - 1/2) give the same).
    const RoutingLoad l = routing_load(uniform_routing(2), 10000, 1, 2, std::nullopt, false);
    CHECK(l.assignments == 10000);
    CHECK(l.mean_rank_assignments == 5000);
    CHECK(l.mean_expert_rows == 5000);
    CHECK(l.busiest_rank_assignments ==
          doctest::Approx(5000 + 50 * std::sqrt(2 / std::numbers::pi)).epsilon(1e-9));
    CHECK(l.busiest_expert_rows == doctest::Approx(l.busiest_rank_assignments));
    CHECK(l.dropped_fraction == 0);
  }

  TEST_CASE("uniform imbalance is 1 + e_ep sqrt(ep (E - k)/((E - 1) T k)) and shrinks as tokens grow") {
    // Uniform routing, E = 64, top-8, ep = 8: a token's picks on a rank are hypergeometric, so every rank
    // ~ N(T k/8, T k (1/8)(7/8)(56/63)); the 8 loads sum to T k, so the max is that of independent normals
    // with variance T k (1/8)(56/63): busiest / mean = 1 + e_8 sqrt(8 (56/63)/(T k)), e_8 = E[max of 8
    // N(0,1)] = 1.4236003.
    double previous = 0;
    for (double tokens : {1e3, 1e4, 1e5, 1e6}) {
      CAPTURE(tokens);
      const double imbalance =
          routing_load(uniform_routing(64), tokens, 8, 8, std::nullopt, false).imbalance();
      CHECK(imbalance ==
            doctest::Approx(1 + 1.4236003 * std::sqrt(8.0 * 56 / 63 / (tokens * 8))).epsilon(1e-7));
      if (previous > 0) CHECK(imbalance < previous);
      previous = imbalance;
    }
    CHECK(previous < 1.002);
  }

  TEST_CASE("top-2 of 8 experts: busiest rank and drops match Monte Carlo on 8 and on 2 ranks") {
    // T = 4096 tokens, each routed to 2 distinct of E = 8 experts uniformly; 20000 trials.
    // ep = 8: expert count ~ Binomial(T, 2/8), sigma^2 = 4096 (1/4)(3/4) = 768; the busiest of the 8 (which
    // sum to T k) is 1024 + e_8 sqrt(768 / (7/8)). ep = 2: a token's picks on a rank of 4 experts are
    // hypergeometric, variance 2 (1/2)(1/2)(6/7), so sigma_r^2 = 4096 * 3/7; the two sum to T k:
    // busiest = 4096 + sigma_r sqrt(2/pi). At cf = 1 every unit sits at z = 0 and drops sigma phi(0).
    // Monte Carlo standard errors: 0.3% (ep = 8) and 0.5% (ep = 2) of the busiest rank's excess over the
    // mean, 0.4% and 0.5% of the dropped fractions. The old model (Binomial(T k, p), independent units) was
    // 24% low on the ep = 2 excess and 8% high on the drops.
    const auto loads = sample_uniform_loads(8, 2, 4096, 20000);
    const double sigma = std::sqrt(768.0), sigma_rank = std::sqrt(4096.0 * 3 / 7);

    const Simulated sim8 = summarize(loads, 2, 8, 4096, 1.0);
    const RoutingLoad l8 = routing_load(uniform_routing(8), 4096, 2, 8, std::nullopt, false);
    CHECK(l8.busiest_rank_assignments == doctest::Approx(1024 + 1.4236003060 * sigma / std::sqrt(7.0 / 8)));
    CHECK(l8.busiest_rank_assignments - 1024 == doctest::Approx(sim8.busiest_rank - 1024).epsilon(0.02));
    const RoutingLoad capped8 = routing_load(uniform_routing(8), 4096, 2, 8, 1.0, false);
    CHECK(capped8.dropped_fraction == doctest::Approx(8 * sigma * kPhiAtZero / 8192).epsilon(1e-9));
    CHECK(capped8.dropped_fraction == doctest::Approx(sim8.dropped_per_expert).epsilon(0.02));

    const Simulated sim2 = summarize(loads, 2, 2, 4096, 1.0);
    const RoutingLoad l2 = routing_load(uniform_routing(8), 4096, 2, 2, std::nullopt, false);
    CHECK(l2.busiest_rank_assignments ==
          doctest::Approx(4096 + sigma_rank * std::sqrt(2 / std::numbers::pi)).epsilon(1e-9));
    CHECK(l2.busiest_rank_assignments - 4096 == doctest::Approx(sim2.busiest_rank - 4096).epsilon(0.02));
    const RoutingLoad per_rank2 = routing_load(uniform_routing(8), 4096, 2, 2, 1.0, true);
    CHECK(per_rank2.dropped_fraction == doctest::Approx(2 * sigma_rank * kPhiAtZero / 8192).epsilon(1e-9));
    CHECK(per_rank2.dropped_fraction == doctest::Approx(sim2.dropped_per_rank).epsilon(0.02));
    // Per-expert capacity drops do not depend on the placement.
    const RoutingLoad capped2 = routing_load(uniform_routing(8), 4096, 2, 2, 1.0, false);
    CHECK(capped2.dropped_fraction == doctest::Approx(capped8.dropped_fraction).epsilon(1e-12));
    CHECK(sim2.dropped_per_expert == doctest::Approx(sim8.dropped_per_expert).epsilon(1e-12));
  }

  TEST_CASE("top-8 of 64 experts on 8 ranks: busiest rank and drops match Monte Carlo") {
    // T = 2048 tokens, 8 distinct of E = 64 experts each, ep = 8; 5000 trials. Expert count
    // ~ Binomial(2048, 1/8): sigma^2 = 224; rank sigma_r^2 = T k (1/8)(7/8)(56/63) = 1592.9 (hypergeometric).
    // Monte Carlo standard errors: 0.6% of the busiest rank's excess, 0.3% of the per-expert drops, 0.7% of
    // the per-rank drops.
    const auto loads = sample_uniform_loads(64, 8, 2048, 5000);
    const Simulated sim = summarize(loads, 8, 8, 2048, 1.0);
    const RoutingLoad l = routing_load(uniform_routing(64), 2048, 8, 8, std::nullopt, false);
    CHECK(l.busiest_rank_assignments - 2048 == doctest::Approx(sim.busiest_rank - 2048).epsilon(0.02));
    const RoutingLoad per_expert = routing_load(uniform_routing(64), 2048, 8, 8, 1.0, false);
    CHECK(per_expert.dropped_fraction == doctest::Approx(sim.dropped_per_expert).epsilon(0.02));
    const RoutingLoad per_rank = routing_load(uniform_routing(64), 2048, 8, 8, 1.0, true);
    CHECK(per_rank.dropped_fraction == doctest::Approx(sim.dropped_per_rank).epsilon(0.03));
  }

  TEST_CASE("with top-1 routing the dropped fraction matches Monte Carlo within 2%") {
    // T = 4096 tokens, top-1 of E = 8, cf = 1.0: an expert's count is exactly Binomial(T, 1/8), which the
    // model takes as N(512, 448); drops = E * sigma * phi(0) / T = 8 * 21.166 * 0.39894 / 4096 = 1.649%.
    // The normal approximation of the binomial's mean excess errs O(1/(T p)); 10000 trials give ~0.5%
    // Monte Carlo error.
    const Simulated sim = summarize(sample_uniform_loads(8, 1, 4096, 10000), 1, 8, 4096, 1.0);
    const RoutingLoad l = routing_load(uniform_routing(8), 4096, 1, 8, 1.0, false);
    CHECK(l.dropped_fraction == doctest::Approx(8 * std::sqrt(448.0) * kPhiAtZero / 4096).epsilon(1e-9));
    CHECK(l.dropped_fraction == doctest::Approx(sim.dropped_per_expert).epsilon(0.02));
  }

  TEST_CASE("capacity factor 1.0 drops a positive fraction, a large one drops nothing") {
    // E = 64, top-8, ep = 8, T = 2048. At cf = 1 every expert sits at z = 0: drops = E sigma phi(0) / (T k)
    // with sigma^2 = T (k/E)(1 - k/E) = 2048 (1/8)(7/8).
    const double sigma = std::sqrt(2048.0 / 8 * 7 / 8);
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

    // Per-rank capacity (MegaScale-MoE): C = cf T k/ep on the rank load, sigma_r^2 = T k (1/8)(7/8)(56/63).
    const double sigma_rank = std::sqrt(2048.0 * 8 / 8 * 7 / 8 * 56 / 63);
    const RoutingLoad per_rank = routing_load(uniform_routing(64), 2048, 8, 8, 1.0, true);
    CHECK(per_rank.dropped_fraction ==
          doctest::Approx(8 * sigma_rank * kPhiAtZero / (2048 * 8)).epsilon(1e-9));
    CHECK(per_rank.busiest_rank_assignments <= 2048);
    CHECK(per_rank.busiest_rank_assignments > 2048 - 1);  // some rank is over C in almost every step
  }

  TEST_CASE("zipf skew makes rank 0 the busiest and the imbalance larger than uniform's") {
    // E = 64, top-8, ep = 8, T = 4096, p_e ~ 1/(e+1): rank 0 holds experts 0..7, P_0 = H_8/H_64 = 0.573,
    // its mean load T k P_0 is many sigma above every other rank's, so the busiest is rank 0, at T k P_0.
    // Expert 0 has k p_0 = 8/H_64 = 1.69 > 1, which distinct picks cannot reach: it is clamped to every
    // token, T rows (expert 1, at q = 0.84, lies ~27 sigma below).
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
    // Rank 0's sd for the max: a P_0 (1 - P_0)(56/63) / (1 - P_0).
    const double a = 4096.0 * 8, sigma0 = std::sqrt(a * p0 * 56 / 63);
    CHECK(a * p0 - a * p1 > 20 * sigma0);  // rank 0 dominates rank 1, the next busiest
    CHECK(skewed.busiest_rank_assignments == doctest::Approx(a * p0).epsilon(1e-6));
    CHECK(skewed.imbalance() == doctest::Approx(8 * p0).epsilon(1e-6));
    CHECK(skewed.imbalance() > flat.imbalance());
    CHECK(skewed.busiest_expert_rows == doctest::Approx(4096).epsilon(1e-9));  // expert 0
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
    // Top-2 with all traffic on experts 0 and 1 (p = 1/2 each): every token picks both, so each expert gets
    // T rows and rank 0 (experts 0, 1) gets T k, the other rank nothing.
    const RoutingDistribution pair = routing_from_counts({1.0, 1.0, 0.0, 0.0});
    const RoutingLoad both = routing_load(pair, 1000, 2, 2, std::nullopt, false);
    CHECK(both.busiest_expert_rows == 1000);
    CHECK(both.busiest_rank_assignments == 2000);
    CHECK(both.imbalance() == 2);
    // One rank (ep = 1) receives all T k assignments, whatever the routing: per-rank cf = 1 drops nothing.
    const RoutingLoad single = routing_load(uniform_routing(8), 1000, 2, 1, 1.0, true);
    CHECK(single.dropped_fraction == 0);
    CHECK(single.busiest_rank_assignments == 2000);
    for (const RoutingLoad& r : {one, half, l, per_expert, per_rank, both, single}) {
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
