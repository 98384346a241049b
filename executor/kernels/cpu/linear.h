// Linear layers (ops qkv_proj, out_proj, fc13, fc2, shared_fc13, shared_fc2, router, lm_head): y = x W with
// W [in, out]. Backward is two ops in the op graph, so two functions: dgrad dx = dy W^T and wgrad dW += x^T
// dy (accumulates, so micro-batches add up in the same buffer).
//
// Shards are just smaller W; the kernels do not know. Under tensor parallelism:
//   column shards (qkv_proj, fc13, shared_fc13, expert_fc13, lm_head with vocab shards): W[:, cols]; the
//     input x is replicated (all-gathered), the output is this rank's columns; dgrad gives a partial dx that
//     the executor sums over the group (reduce-scatter / all-reduce); wgrad is complete for those columns.
//   row shards (out_proj, fc2, shared_fc2, expert_fc2): W[rows, :]; x is this rank's slice of the features;
//     the output is a partial sum the executor reduces (reduce-scatter / all-reduce); dgrad and wgrad are
//     complete for the rank's slice.
#pragma once

#include "executor/kernels/cpu/types.h"

namespace moeplan::executor::cpu {

template <class S>
Mat<S> linear_forward(const CRef<S>& x, const CRef<S>& w);  // [T, in] x [in, out] -> [T, out]
template <class S>
Mat<S> linear_dgrad(const CRef<S>& dy, const CRef<S>& w);  // [T, out] x [in, out]^T -> [T, in]
template <class S>
void linear_wgrad(const CRef<S>& x, const CRef<S>& dy, MRef<S> dw);  // dw [in, out] += x^T dy

}  // namespace moeplan::executor::cpu
