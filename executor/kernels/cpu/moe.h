// Mixture-of-experts kernels: router (op router, after its GEMM, which is linear_forward with Wr [h, E]),
// auxiliary load-balancing loss, permute / unpermute (ops permute, scatter, unpermute) and the grouped expert
// GEMMs (ops expert_fc13, expert_fc2; expert_act is swiglu_forward).
//
// Routing: p = softmax over all experts of the logits; the top-k experts by p (ties to the lower expert
// index), in descending order of p (slot 0 is the largest); gates = the top-k p renormalised to sum to 1
// (renormalize = true, the default; Mixtral, Qwen) or the raw p (renormalize = false).
//
// Auxiliary loss (Switch form): aux = coef * E * sum_e f_e * P_e, f_e = (assignments to e) / (T k),
// P_e = (sum over tokens of p_e) / T; f_e carries no gradient. Tokens of one micro-batch are split over
// ranks, so: (1) router_local_stats over the local tokens, (2) the executor all-reduces the stats (sum) over
// the ranks that split the micro-batch, (3) aux_loss / aux_loss_dprobs with the global stats and the global
// T. Every token gets the same dp_e, so router_backward takes it as a vector [E].
//
// Permutation: rows are grouped by expert (ascending), within an expert by token index (stable), giving
// per-expert counts and offsets; the rows of experts [e0, e1) are contiguous, so the rows for an EP rank are
// one block. unpermute accumulates gate * expert output into each token's row, in permuted-row order (expert
// ascending), on top of what `out` already holds (the shared experts' output in the reference model).
#pragma once

#include <vector>

#include "executor/kernels/cpu/types.h"

namespace moeplan::executor::cpu {

inline constexpr double kAuxLossCoef = 0.01;

template <class S>
struct Route {
  int64_t top_k = 0;
  bool renormalize = true;
  Mat<S> probs;                  // [T, E] softmax
  std::vector<int64_t> experts;  // [T * k]: expert of (token t, slot j) at t * k + j
  Mat<S> gates;                  // [T, k]
};

template <class S>
Route<S> router_forward(const CRef<S>& logits, int64_t top_k, bool renormalize = true);

// dgates [T, k] (from unpermute_backward) and the aux loss gradient per expert (aux_loss_dprobs; empty for
// none) -> dlogits [T, E]: dp_e = sum over slots with e_j = e of (renormalize ? (dg_j - sum_l dg_l g_l) /
// sum_l p_l : dg_j) + aux_dp_e, then dlogits = p * (dp - p . dp).
template <class S>
Mat<S> router_backward(const Route<S>& route, const CRef<S>& dgates, const CVecRef<S>& aux_dprobs);

template <class S>
struct RouterStats {
  Vec<S> counts;     // [E] assignments (exact in float up to 2^24)
  Vec<S> prob_sums;  // [E] sum over tokens of p_e
};
template <class S>
RouterStats<S> router_local_stats(const Route<S>& route);
// coef * E * sum_e (counts_e / (T k)) * (prob_sums_e / T), T = tokens of the micro-batch (all ranks).
template <class S>
S aux_loss(const RouterStats<S>& global, int64_t tokens, int64_t top_k, double coef = kAuxLossCoef);
// d(scale * aux) / d p_{t, e} = scale * coef * E * f_e / T for every token t: a vector [E].
template <class S>
Vec<S> aux_loss_dprobs(const RouterStats<S>& global, int64_t tokens, int64_t top_k,
                       double coef = kAuxLossCoef, double scale = 1.0);

struct PermuteIndex {
  int64_t tokens = 0, top_k = 0, num_experts = 0;
  std::vector<int64_t> counts;     // [E] rows per expert
  std::vector<int64_t> offsets;    // [E + 1] first row of each expert
  std::vector<int64_t> row_token;  // [T k] token of permuted row r
  std::vector<int64_t> row_slot;   // [T k] top-k slot of permuted row r
  std::vector<int64_t> slot_row;   // [T k] permuted row of (t, j), at t * k + j
};
PermuteIndex make_permute_index(std::span<const int64_t> experts, int64_t tokens, int64_t top_k,
                                int64_t num_experts);

template <class S>
Mat<S> permute_forward(const CRef<S>& x, const PermuteIndex& idx);  // [T, h] -> [T k, h]
// dx[t] = sum of its rows' gradients, in permuted-row order.
template <class S>
Mat<S> permute_backward(const CRef<S>& dxp, const PermuteIndex& idx);
// out[t] += gates(t, j) * yp[row], over rows in permuted order.
template <class S>
void unpermute_forward(const CRef<S>& yp, const PermuteIndex& idx, const CRef<S>& gates, MRef<S> out);
template <class S>
struct UnpermuteGrads {
  Mat<S> dyp;     // [T k, h] = gates(t, j) * dy[t]
  Mat<S> dgates;  // [T, k] = dy[t] . yp[row]
};
template <class S>
UnpermuteGrads<S> unpermute_backward(const CRef<S>& dy, const CRef<S>& yp, const PermuteIndex& idx,
                                     const CRef<S>& gates);

// Grouped GEMM over a contiguous range of local experts (a loop of GEMMs). w stacks the local experts'
// weights: [n * in, out], expert i at rows [i in, (i + 1) in); counts [n] rows per expert, in order, summing
// to x.rows(). ETP shards are smaller per-expert weights stacked the same way.
template <class S>
Mat<S> expert_gemm_forward(const CRef<S>& x, const CRef<S>& w, std::span<const int64_t> counts);
template <class S>
Mat<S> expert_gemm_dgrad(const CRef<S>& dy, const CRef<S>& w, std::span<const int64_t> counts);
template <class S>
void expert_gemm_wgrad(const CRef<S>& x, const CRef<S>& dy, std::span<const int64_t> counts, MRef<S> dw);

}  // namespace moeplan::executor::cpu
