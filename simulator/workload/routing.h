// Expert load imbalance: how many token-expert assignments the busiest EP rank and the busiest expert receive
// when the router's choices are random, and how many a capacity factor drops. Pure functions, no I/O.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "simulator/core/model_spec.h"
#include "simulator/core/plan.h"

namespace moeplan::workload {

// Token distribution over routed experts: probabilities p_e (sum 1), one per expert. p_e is the share of
// token-expert assignments that go to expert e.
struct RoutingDistribution {
  std::vector<double> expert_probability;  // size E
};

// p_e = 1/E.
RoutingDistribution uniform_routing(int64_t experts);
// p_e = (e+1)^-s / H(E, s), H(E, s) = sum_{e=0}^{E-1} (e+1)^-s; expert 0 is the most popular. s >= 0.
RoutingDistribution zipf_routing(int64_t experts, double s);
// p_e = c_e / sum(c); counts >= 0 and finite, sum > 0.
RoutingDistribution routing_from_counts(const std::vector<double>& counts);

struct RoutingLoad {
  double assignments = 0;            // T*k token-expert assignments entering the EP group
  double mean_rank_assignments = 0;  // T*k/ep
  double busiest_rank_assignments =
      0;                           // expected max over the ep ranks (after dropping, if a capacity applies)
  double mean_expert_rows = 0;     // T*k/E
  double busiest_expert_rows = 0;  // expected max over experts (after dropping)
  double dropped_fraction = 0;     // expected fraction of assignments dropped by the capacity
  // busiest / mean rank load, >= 1 typically; 1 when there are no tokens.
  double imbalance() const {
    return mean_rank_assignments > 0 ? busiest_rank_assignments / mean_rank_assignments : 1.0;
  }
};

// T tokens, each routed to top_k = k distinct experts, experts placed contiguously on ep ranks (rank r holds
// the S = E/ep experts [r*S, (r+1)*S)). Tokens are independent; a unit's load is the sum over tokens, taken
// as normal:
//   expert e: L_e ~ N(T q_e, T q_e (1 - q_e)),  q_e = min(1, k p_e)    (Binomial(T, q_e): e is one of a
//             token's k picks with probability q_e)
//   rank r:   L_r ~ N(T k P_r, T k P_r (1 - P_r) (E - k)/(E - 1)),  P_r = sum_{e in r} p_e
// Uniform routing (p_e = 1/E) makes both exact: a token's k picks are k of E without replacement, so the
// number on rank r is hypergeometric with mean k S/E and variance k (S/E)(1 - S/E)(E - k)/(E - 1). For
// non-uniform p the rank keeps that form with S/E -> P_r (exact for k = 1: multinomial); a rank of one
// expert is that expert. p_e > 1/k cannot occur with distinct picks: such an expert is clamped to every
// token (L_e = T), while ranks keep T k P_r.
// The loads of all units sum to T k, so they are negatively correlated (-1/(n-1) between n uniform units).
// For n units with equal shares, E[max_i L_i] equals the max of independent N(mu_i, Var_i / (1 - 1/n))
// (L_i = mu + s (Z_i - Zbar), the shift Zbar common to all); in general unit i (share w_i = p_e or P_r) is
// taken as independent with variance Var_i / (1 - w_i), which over-estimates a little when shares differ.
// Busiest: E[max_i L_i] = a + int_a^inf (1 - F(x)) dx, F(x) = prod_i Phi((x - mu_i)/sigma_i), a below
// which F ~ 0, by Gauss-Legendre quadrature: error < 1e-6 sigma; 5-9 us for uniform or zipf routing over
// E = 256 experts, 40-65 us when all 256 experts have distinct, overlapping loads (-O2, one core).
// Against Monte Carlo of uniform top-k routing (top-2 of 8 on ep = 2, 4, 8 ranks, T = 4096; top-8 of 64 on
// ep = 2, 8, T = 2048) the busiest rank's excess over the mean agrees within 0.6%, and the dropped fraction
// at cf = 1 (either capacity) within 0.6%. The normal tail under-states a binomial's (skewed) upper tail
// when T q_e is small: the busiest expert's excess is 2% low at T q_e = 256, 6% low at T q_e = 32.
// Capacity (optional, capacity_factor = cf):
//   per expert (default):  C = cf*T*k/E on each L_e;
//   per rank (per_rank_capacity; MegaScale-MoE sizes capacity per GPU): C = cf*T*k/ep on each L_r.
//   A unit with L ~ N(mu, sigma^2) (its marginal variance) drops E[(L-C)+] = sigma*phi(z) + (mu - C)*(1 -
//   Phi(z)), z = (C - mu)/sigma ((mu - C)+ when sigma = 0); dropped_fraction = sum over units / (T*k).
//   Busiest after dropping: E[min(C, max_i L_i)] = a + int_a^C (1 - F(x)) dx (<= min(C, E[max])).
//   Per-expert capacity, E/ep > 1: rank r keeps sum_e min(L_e, C), taken as normal with mean
//   sum_e (mu_e - D_e) and variance sigma_r^2 * sum_e Var(min(L_e, C)) / sum_e sigma_e^2 (sigma_r^2 the
//   rank's variance for the max, sigma_e^2 and Var(min) marginal), at most (E/ep)*C
//   (at cf = 1 its total is within 0.2% of Monte Carlo, but its small excess over the kept mean is 17% low
//   for top-2 of 8 on ep = 2, 4 and 7% high for top-8 of 64 on ep = 8).
//   Per-rank capacity, E/ep > 1: each expert of rank r keeps 1 - D_r/mu_r of its load, at most C.
// sigma = 0 (a deterministic unit, e.g. p_e in {0, 1}) is exact: its step CDF sets a = mu.
// Preconditions (asserted): E >= 1, ep >= 1, E % ep == 0, 1 <= top_k <= E, tokens >= 0, capacity_factor > 0.
RoutingLoad routing_load(const RoutingDistribution& dist, double tokens, int64_t top_k, int64_t ep,
                         std::optional<double> capacity_factor, bool per_rank_capacity);

// Expected max of n iid standard normals (n >= 1): int x d(Phi(x)^n). n=1 -> 0, n=2 -> 1/sqrt(pi),
// n=3 -> 3/(2 sqrt(pi)). Same integrator as routing_load; exposed for tests.
double expected_max_std_normal(int64_t n);

// The routing load of one micro-batch of a plan: each rank of the EP group routes its t = b*s/(tp*sp*cp)
// tokens, T = t*ep enter the group; capacity per expert (plan.routing.capacity_factor). `scale` is the
// busiest rank's rows relative to the mean of the kept rows (>= 1), what the lowering and the memory model
// multiply expert rows by.
struct PlanRouting {
  RoutingLoad load;
  double scale = 1.0;
  // An encoder-decoder's decoder layers route each micro-batch's targets, fewer tokens than its inputs: their
  // own load and scale (for a decoder-only model, the same as above).
  RoutingLoad decoder_load;
  double decoder_scale = 1.0;
  // What the memory model multiplies every MoE layer's expert rows by: the busier of the two.
  double memory_scale() const { return scale > decoder_scale ? scale : decoder_scale; }
};
PlanRouting plan_routing(const ModelSpec& model, const Plan& plan, const RoutingDistribution& dist);

// The tokens each rank of an EP group routes per micro-batch of `seq` tokens per sequence: its share of the
// attention mesh, b * seq / (tp * sp * cp). plan_routing's t, and what moerun draws routing for.
int64_t routed_tokens_per_rank(const Plan& plan, int64_t seq);

}  // namespace moeplan::workload
