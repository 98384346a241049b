// Causal attention core (ops attn_core, attn_core_local) on a shard: a subset of query heads, a set of query
// positions and a set of key positions (rope already applied, see rope.h).
//
//   q [Tq, Hl D]: local query heads, head i = global head head0 + i, columns [i D, (i+1) D)
//   k [Tk, KVl D], v [Tk, KVl Dv]: local kv heads, head j = global kv head kv_head0 + j; the value head dim
//     Dv is D unless AttnHeads::v_dim says otherwise (MLA: D 192, Dv 128); out and dout are [Tq, Hl Dv]
//   GQA: global query head h reads global kv head h / (heads / kv_heads), which must be a local one.
//   Mask: key j is visible to query i iff k_pos[j] <= q_pos[i] and (window == 0 or
//     q_pos[i] - k_pos[j] < window) and, when segment ids are given, q_seg[i] == k_seg[j] (several
//     sequences in one call).
//   Scores s = (q . k) / sqrt(D); out = softmax(s) v per head; lse = log sum exp(s) per (query, head);
//     a query that sees no key here gets lse = -inf and an output row of 0.
//
// Splits the executor composes:
//   heads (TP, Ulysses SP): call with the rank's heads; results are the matching columns of full attention.
//   queries (CP, Megatron's two load-balanced chunks): call with the rank's q_pos against all keys.
//   keys (CP's local / remote parts): attention over two disjoint key sets merges exactly with attn_merge;
//     the backward then runs per key set with the *merged* out and lse, giving partial dq (summed over the
//     key sets) and dk, dv for that key set.
// Backward returns dk, dv for the given keys (under CP after an all-gather of k, v: reduce-scatter them).
// When kv heads are replicated over ranks (kv_heads < tp), each rank's dk, dv holds only its query heads'
// part: sum over those ranks (the replicated qkv columns' wgrad needs the same reduction).
#pragma once

#include "executor/kernels/cpu/types.h"

namespace moeplan::executor::cpu {

struct AttnHeads {
  int64_t num_heads = 0;     // global query heads
  int64_t num_kv_heads = 0;  // global kv heads
  int64_t head_dim = 0;
  int64_t head0 = 0;     // global index of q's first head
  int64_t kv_head0 = 0;  // global index of k's and v's first kv head
  int64_t window = 0;    // sliding window in tokens, 0 = full causal
  int64_t v_dim = 0;     // value head dim, 0 = head_dim
};

template <class S>
struct AttnOut {
  Mat<S> out;  // [Tq, Hl Dv]
  Mat<S> lse;  // [Tq, Hl]
};

template <class S>
struct AttnGrads {
  Mat<S> dq;  // [Tq, Hl D]
  Mat<S> dk;  // [Tk, KVl D]
  Mat<S> dv;  // [Tk, KVl Dv]
};

// q_seg, k_seg: empty (one sequence) or one id per row.
template <class S>
AttnOut<S> attn_core_forward(const CRef<S>& q, const CRef<S>& k, const CRef<S>& v, Positions q_pos,
                             Positions k_pos, const AttnHeads& heads, Positions q_seg = {},
                             Positions k_seg = {});

// P = exp(s - lse), dv = P^T dout, dP = dout v^T, dS = P (dP - rowsum(dout * out)), dq = dS k / sqrt(D),
// dk = dS^T q / sqrt(D), per head; dk, dv sum over the query heads of a group.
template <class S>
AttnGrads<S> attn_core_backward(const CRef<S>& q, const CRef<S>& k, const CRef<S>& v, const CRef<S>& out,
                                const CRef<S>& lse, const CRef<S>& dout, Positions q_pos, Positions k_pos,
                                const AttnHeads& heads, Positions q_seg = {}, Positions k_seg = {});

// Merges attention over a second, disjoint key set into (out, lse): lse = log(e^lse + e^lse_b),
// out = out e^(lse_a - lse) + out_b e^(lse_b - lse), per (query, head).
template <class S>
void attn_merge(MRef<S> out, MRef<S> lse, const CRef<S>& out_b, const CRef<S>& lse_b);

}  // namespace moeplan::executor::cpu
