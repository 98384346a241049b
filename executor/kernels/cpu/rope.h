// Rotary position embedding (op rope), applied in place to q or k columns [T, n_heads * head_dim] from the
// tokens' absolute positions (so any chunk of a sequence, contiguous or not, is rotated like the whole).
// Convention "rotate half" (Llama / GPT-NeoX): within a head, dims i and i + D/2 form a pair rotated by angle
// pos * theta^(-2i/D), i < D/2. Angles, cos and sin are computed in double and rounded to S.
// theta: 10000 (ModelSpec carries none).
#pragma once

#include "executor/kernels/cpu/types.h"

namespace moeplan::executor::cpu {

inline constexpr double kRopeTheta = 10000.0;

template <class S>
void rope_forward(MRef<S> x, Positions pos, int64_t head_dim, double theta = kRopeTheta);
// The transpose (inverse rotation), in place on the gradient.
template <class S>
void rope_backward(MRef<S> dx, Positions pos, int64_t head_dim, double theta = kRopeTheta);

}  // namespace moeplan::executor::cpu
