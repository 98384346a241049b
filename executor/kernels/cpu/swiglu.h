// SwiGLU (ops act, expert_act, shared_act): input [T, 2f] laid out [gate | up] (per shard: a column shard of
// fc13 keeps its gate and up columns together, see fc13_shard_columns), output [T, f] = silu(gate) * up with
// silu(g) = g * sigmoid(g). Purely row- and column-local, so it runs on any shard unchanged.
#pragma once

#include "executor/kernels/cpu/types.h"

namespace moeplan::executor::cpu {

template <class S>
Mat<S> swiglu_forward(const CRef<S>& in);
// d_gate = dy * up * (s + g s (1 - s)), d_up = dy * silu(g), s = sigmoid(g); returns [T, 2f].
template <class S>
Mat<S> swiglu_backward(const CRef<S>& in, const CRef<S>& dy);

}  // namespace moeplan::executor::cpu
