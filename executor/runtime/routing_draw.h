// Routing drawn from a plan's distribution, for the replay: which experts the tokens of every rank of an EP
// group pick in one MoE layer of one micro-batch, so the expert GEMMs run the rows their rank received and
// the EP all-to-alls carry the counts the ranks exchange, instead of every rank running the busiest rank's
// rows.
//
// The draw follows the routing model the prediction's imbalance comes from (simulator/workload/routing.h):
// each of a rank's t tokens picks top_k distinct experts, expert e with inclusion probability
// pi_e = min(1, c p_e) (c = top_k unless some expert is capped at 1: then c > top_k so that sum pi_e =
// top_k), independently of the other tokens; experts lie contiguously on the EP ranks. A token's picks are a
// systematic sample over a random order of the experts (exact inclusion probabilities, never the same expert
// twice); under uniform routing, a uniformly random k-subset by a partial shuffle. Group-limited routing
// (n_group / topk_group) is not drawn, as the model does not price it either.
//
// Every rank of a group draws the whole group's routing from the same seed (routing_seed of the group, layer,
// micro-batch and step), so the ranks agree on all counts without communicating.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "simulator/core/model_spec.h"
#include "simulator/core/op_graph.h"
#include "simulator/core/plan.h"
#include "simulator/workload/lower.h"
#include "simulator/workload/routing.h"

namespace moeplan::executor {

// The routing of one MoE layer for one micro-batch in one EP group.
struct DrawnRouting {
  int64_t ep = 1, experts = 1;
  std::vector<int64_t> rows;  // [src * experts + e]: assignments of EP rank src's tokens to expert e

  int64_t experts_per_rank() const { return experts / ep; }
  // Rows EP rank src sends to EP rank dst (the assignments of src's tokens to dst's experts).
  int64_t sent(int64_t src, int64_t dst) const;
  // Rows EP rank r receives for its local expert g, from every source rank.
  int64_t expert_rows(int64_t r, int64_t g) const;
  // Rows EP rank r receives, all its experts.
  int64_t received(int64_t r) const;
  // The busiest rank's received rows over the mean rank's (1 when nothing is routed).
  double busiest_over_mean() const;
};

// pi_e for a distribution and top_k (see the header): sum top_k, each in [0, 1]. Where fewer than top_k
// experts have any probability, the picks left over are spread over the others by their room below 1.
std::vector<double> inclusion_probabilities(const workload::RoutingDistribution& dist, int64_t top_k);

// Draws the routing of `tokens_per_rank` tokens on each of `ep` ranks (experts = inclusion.size(), a
// multiple of ep; top_k = sum of inclusion, rounded). Deterministic in `seed`.
DrawnRouting draw_routing(const std::vector<double>& inclusion, int64_t tokens_per_rank, int64_t ep,
                          uint64_t seed);

// The seed of one draw: the run's seed, the EP group (any id its ranks share and other groups do not), the
// layer, the micro-batch and the step, mixed (splitmix64) so that neighbouring tuples draw independently.
uint64_t routing_seed(uint64_t run_seed, int64_t ep_group, int64_t layer, int64_t micro_batch, int64_t step);

// Empty when a replay of `plan` can draw its routing, else one phrase naming what it cannot draw (the replay
// then runs the lowered rows: the busiest rank's, on every rank).
std::string routing_draw_unsupported(const ModelSpec& model, const Plan& plan,
                                     const LoweringOptions& lowering);

// Routed tokens per rank of one micro-batch, as the lowering's MoE layers count them
// (workload::routed_tokens_per_rank at the plan's seq_len).
int64_t routed_tokens_per_rank(const Plan& plan);

// What a replay needs to draw: the inclusion probabilities, the group's geometry and this rank's place in it.
struct RoutingDrawSpec {
  std::vector<double> inclusion;
  int64_t tokens_per_rank = 0;
  int64_t ep = 1;
  int64_t ep_rank = 0;   // this rank's index in its EP group
  int64_t ep_group = 0;  // shared by the group's ranks (its first world rank)
  int stage = 0;         // the pipeline stage whose MoE layers this rank draws
  uint64_t run_seed = 1;
  // Rows per rank that the graph's routed ops carry: t top_k expert_load_scale (the busiest rank's). A routed
  // op's values per row, and a memory-bound op's bytes per row, are its own over these.
  double lowered_rows = 0;
};

// A runner's draws: which ops are routed, each step's routing of every MoE layer and micro-batch of the
// stage, and what each routed op then runs on this rank. Routed ops (by name, in a drawn layer and
// micro-batch of the stage): the experts' grouped GEMMs, fused or not; the EP all-to-alls that carry rows
// towards the experts in the forward (dispatch, probs) or back from them (combine); memory-bound ops whose
// bytes are per received row (activation, GLU clamp, bias, scatter, gather, chunk sorts).
class RoutingDraws {
 public:
  RoutingDraws(std::span<const Op> ops, RoutingDrawSpec spec);

  // Draws the next step's routing (the first call draws step 0).
  void draw_step();

  // This rank's rows per local expert for a routed grouped GEMM whose groups are the local experts; empty
  // otherwise.
  std::vector<int64_t> expert_rows(const Op& op) const;
  // Index of the op's (layer, micro-batch) among the drawn ones, for a routed grouped GEMM (as expert_rows);
  // -1 otherwise.
  int64_t draw_index(const Op& op) const;
  // Values this rank sends to and receives from each EP peer in a routed all-to-all (rows towards the
  // experts in the forward and recompute, back from them in the backward; the reverse for the combine), each
  // row `op_values` / lowered_rows values (at least 1), `op_values` being the op's whole buffer; nullopt for
  // other ops.
  struct Exchange {
    std::vector<int64_t> send, recv;
    int64_t send_total = 0, recv_total = 0;
  };
  std::optional<Exchange> exchange(const Op& op, int64_t op_values) const;
  // Received rows over the lowered rows for a memory-bound op whose bytes are per received row; nullopt for
  // other ops.
  std::optional<double> row_scale(const Op& op) const;

  const RoutingDrawSpec& spec() const { return spec_; }
  int64_t local_experts() const { return static_cast<int64_t>(spec_.inclusion.size()) / spec_.ep; }
  int64_t keys() const { return static_cast<int64_t>(keys_.size()); }
  // This step's draw of the i-th (layer, micro-batch).
  const DrawnRouting& draw(int64_t i) const { return draws_[static_cast<size_t>(i)]; }

  // Over every step drawn so far: the draws (MoE layers x micro-batches x steps), the mean over draws of the
  // EP group's busiest rank's received rows over the mean rank's, and each EP rank's mean received rows.
  struct Stats {
    int64_t draws = 0;
    double busiest_over_mean = 0;
    std::vector<double> ep_rank_rows;
  };
  Stats stats() const;

 private:
  const DrawnRouting* of(const Op& op) const;
  int64_t index_of(const Op& op) const;

  RoutingDrawSpec spec_;
  std::vector<std::pair<int32_t, int32_t>> keys_;  // (layer, micro-batch) of the stage's MoE layers, sorted
  std::vector<DrawnRouting> draws_;                // this step's, by key
  int64_t steps_ = 0;
  Stats sums_;
};

}  // namespace moeplan::executor
