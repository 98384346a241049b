// Tests of the replay's routing draws (executor/runtime/routing_draw.h): every token picks top_k distinct
// experts, ranks that share a seed draw the same routing, the inclusion probabilities are the plan's, and
// over many draws the busiest EP rank's load is what the routing model that prices the prediction expects.
#include "executor/runtime/routing_draw.h"

#include <doctest/doctest.h>

#include <cmath>
#include <set>

#include "tests/executor/runtime/runtime_fixtures.h"

namespace moeplan::executor {

TEST_SUITE("executor_runtime") {
  TEST_CASE("inclusion probabilities are top_k p_e, capped at 1 with the excess spread over the rest") {
    const std::vector<double> u = inclusion_probabilities(workload::uniform_routing(8), 2);
    for (double v : u) CHECK(v == doctest::Approx(0.25));
    // zipf:2 over 8 experts: p_0 = 1 / H(8, 2) = 0.6547, so 2 p_0 > 1: expert 0 is in every token's picks and
    // the second pick is spread over the rest in proportion to p: pi_e = p_e / (1 - p_0).
    const workload::RoutingDistribution z = workload::zipf_routing(8, 2.0);
    const std::vector<double> pi = inclusion_probabilities(z, 2);
    const double p0 = z.expert_probability[0];
    CHECK(p0 > 0.5);
    CHECK(pi[0] == 1.0);
    double sum = 0;
    for (size_t e = 0; e < pi.size(); ++e) {
      sum += pi[e];
      if (e > 0) CHECK(pi[e] == doctest::Approx(z.expert_probability[e] / (1 - p0)));
    }
    CHECK(sum == doctest::Approx(2.0));
    // A router trace with one busy expert of four, top 2: every token picks it and one of the three idle
    // ones.
    const std::vector<double> idle = inclusion_probabilities(workload::routing_from_counts({5, 0, 0, 0}), 2);
    CHECK(idle[0] == 1.0);
    for (size_t e = 1; e < 4; ++e) CHECK(idle[e] == doctest::Approx(1.0 / 3));
    const DrawnRouting d = draw_routing(idle, 30, 2, 3);
    CHECK(d.expert_rows(0, 0) == 60);  // both ranks' 30 tokens
    CHECK(d.received(0) + d.received(1) == 120);
  }

  TEST_CASE("each token picks top_k distinct experts, and each rank routes all its tokens") {
    for (const workload::RoutingDistribution& dist :
         {workload::uniform_routing(8), workload::zipf_routing(8, 1.2)}) {
      const std::vector<double> pi = inclusion_probabilities(dist, 3);
      // One token per rank: every expert is picked at most once, and exactly three are picked.
      for (uint64_t seed = 0; seed < 200; ++seed) {
        const DrawnRouting d = draw_routing(pi, 1, 4, seed);
        for (int64_t src = 0; src < 4; ++src) {
          int64_t picks = 0;
          for (int64_t e = 0; e < 8; ++e) {
            const int64_t n = d.rows[static_cast<size_t>(src * 8 + e)];
            CHECK(n >= 0);
            CHECK(n <= 1);
            picks += n;
          }
          CHECK(picks == 3);
        }
      }
      const DrawnRouting d = draw_routing(pi, 500, 4, 7);
      int64_t received = 0;
      for (int64_t r = 0; r < 4; ++r) {
        int64_t sent = 0, by_expert = 0;
        for (int64_t p = 0; p < 4; ++p) sent += d.sent(r, p);
        for (int64_t g = 0; g < d.experts_per_rank(); ++g) by_expert += d.expert_rows(r, g);
        CHECK(sent == 1500);
        CHECK(by_expert == d.received(r));
        received += d.received(r);
      }
      CHECK(received == 4 * 1500);
      CHECK(d.busiest_over_mean() >= 1.0);
    }
  }

  TEST_CASE("ranks that share a seed draw the same routing, and each part of the seed changes it") {
    const std::vector<double> pi = inclusion_probabilities(workload::uniform_routing(16), 2);
    const uint64_t base = routing_seed(1, 0, 3, 2, 5);
    CHECK(draw_routing(pi, 256, 4, base).rows == draw_routing(pi, 256, 4, base).rows);
    std::set<uint64_t> seeds{base};
    for (uint64_t s :
         {routing_seed(2, 0, 3, 2, 5), routing_seed(1, 1, 3, 2, 5), routing_seed(1, 0, 4, 2, 5),
          routing_seed(1, 0, 3, 3, 5), routing_seed(1, 0, 3, 2, 6), routing_seed(1, 0, 2, 3, 5)}) {
      CHECK(seeds.insert(s).second);
      CHECK(draw_routing(pi, 256, 4, s).rows != draw_routing(pi, 256, 4, base).rows);
    }
  }

  TEST_CASE(
      "over many draws, experts get top_k p_e of the tokens and the busiest rank what the model expects") {
    // The routing model (simulator/workload/routing.h) prices the prediction's busiest EP rank; the draws are
    // Monte Carlo of the same random routing, so their mean busiest-over-mean must agree with it. Uniform
    // top-2 of 8 on 4 ranks and zipf:0.5 top-2 of 8 on 2 ranks, 1,024 tokens per rank, 3,000 draws: the
    // Monte Carlo standard error of the mean excess over an even load is about 1 % of it (uniform), and the
    // model's stated error 0.6 %.
    struct Case {
      workload::RoutingDistribution dist;
      int64_t ep;
    };
    for (const Case& c : {Case{workload::uniform_routing(8), 4}, Case{workload::zipf_routing(8, 0.5), 2}}) {
      const int64_t t = 1024, k = 2, draws = 3000;
      const std::vector<double> pi = inclusion_probabilities(c.dist, k);
      std::vector<double> expert_mean(8, 0.0);
      double ratio = 0;
      for (int64_t i = 0; i < draws; ++i) {
        const DrawnRouting d = draw_routing(pi, t, c.ep, routing_seed(9, 0, i, 0, 0));
        ratio += d.busiest_over_mean();
        for (int64_t e = 0; e < 8; ++e) {
          for (int64_t src = 0; src < c.ep; ++src)
            expert_mean[static_cast<size_t>(e)] +=
                static_cast<double>(d.rows[static_cast<size_t>(src * 8 + e)]);
        }
      }
      ratio /= static_cast<double>(draws);
      const double tokens = static_cast<double>(t * c.ep);
      for (size_t e = 0; e < 8; ++e) {
        // Each expert's mean load over draws: T pi_e, within 5 standard errors of the Bernoulli sum.
        const double mean = expert_mean[e] / static_cast<double>(draws);
        const double se = std::sqrt(tokens * pi[e] * (1 - pi[e]) / static_cast<double>(draws));
        CHECK(std::abs(mean - tokens * pi[e]) < 5 * se);
      }
      const workload::RoutingLoad model =
          workload::routing_load(c.dist, tokens, k, c.ep, std::nullopt, false);
      INFO("ep " << c.ep << ": drawn " << ratio << ", model " << model.imbalance());
      CHECK(model.imbalance() > 1.01);
      // The excess over an even load, which is what imbalance adds, within 5 % (about 4 standard errors).
      CHECK(ratio - 1 == doctest::Approx(model.imbalance() - 1).epsilon(0.05));
    }
  }

  TEST_CASE("routing is drawn for a plain EP plan and not where the draw would not be the lowered graph's") {
    const RunInputs in = test::load_tiny("draw_ok", test::tiny_plan(2, test::kDp2Ep2));
    CHECK(routing_draw_unsupported(in.loaded.model, in.loaded.plan, in.lowering).empty());
    CHECK(routed_tokens_per_rank(in.loaded.plan) == 256);
    Plan cf = in.loaded.plan;
    cf.routing.capacity_factor = 1.25;
    CHECK(routing_draw_unsupported(in.loaded.model, cf, in.lowering).find("capacity") != std::string::npos);
    Plan etp = in.loaded.plan;
    etp.experts.etp = 2;
    CHECK(routing_draw_unsupported(in.loaded.model, etp, in.lowering).find("etp") != std::string::npos);
  }
}

}  // namespace moeplan::executor
