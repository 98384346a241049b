// Vocabulary-parallel embedding (op embedding) and output layer + cross entropy (ops lm_head, loss), as in
// Megatron: a rank holds vocabulary rows [v0, v1).
//
// Embedding: table shard [v1 - v0, h]; ids outside [v0, v1) give zero rows, so the full embedding is the sum
// over the vocabulary shards (the executor all-reduces / reduce-scatters the outputs); the backward
// accumulates into the local rows only, in token order.
//
// Output layer: logits shard = x W_out[:, v0:v1] (linear_forward with the column shard; lm_head of a tied
// model uses the embedding shard transposed). Cross entropy in three steps with all-reduces in between:
//   1. m_local = loss_local_max(logits)                      -> all-reduce MAX -> m
//   2. (sum_exp, target_logit) = loss_local_stats(logits, targets, v0, m)
//        sum_exp = sum over local columns of exp(logit - m); target_logit = the target's logit where the
//        target is in [v0, v1), else 0                       -> all-reduce SUM of both
//   3. loss = loss_forward(m, sum_exp, target_logit, inv_tokens) = inv_tokens * sum_t (log sum_exp_t + m_t -
//        target_t), summed in token order; dlogits = loss_backward(...) = inv_tokens * (softmax - onehot) on
//        the local columns.
// inv_tokens = 1 / (tokens of the *global* batch), so micro-batches and data-parallel ranks add up to the
// mean over the global batch.
#pragma once

#include "executor/kernels/cpu/types.h"

namespace moeplan::executor::cpu {

template <class S>
Mat<S> embedding_forward(Positions ids, const CRef<S>& table, int64_t v0);
template <class S>
void embedding_backward(Positions ids, const CRef<S>& dy, int64_t v0, MRef<S> dtable);

template <class S>
Vec<S> loss_local_max(const CRef<S>& logits);  // [T]

template <class S>
struct CeStats {
  Vec<S> sum_exp;       // [T]
  Vec<S> target_logit;  // [T]
};
template <class S>
CeStats<S> loss_local_stats(const CRef<S>& logits, Positions targets, int64_t v0, const CVecRef<S>& max);

// Per-token losses log(sum_exp) + max - target_logit, [T].
template <class S>
Vec<S> loss_per_token(const CVecRef<S>& max, const CeStats<S>& global);
// inv_tokens * sum over tokens (in order) of the per-token losses.
template <class S>
S loss_forward(const CVecRef<S>& max, const CeStats<S>& global, double inv_tokens);
// d loss / d logits on the local columns: inv_tokens * (exp(logit - max) / sum_exp - [col == target]).
template <class S>
Mat<S> loss_backward(const CRef<S>& logits, Positions targets, int64_t v0, const CVecRef<S>& max,
                     const CVecRef<S>& global_sum_exp, double inv_tokens);

}  // namespace moeplan::executor::cpu
