// RMSNorm (ops attn_norm, ffn_norm, final_norm): y = x * r * gamma, r = 1 / sqrt(mean(x^2) + eps) per row.
// eps: ModelSpec carries none, so 1e-6 (kRmsNormEps) unless the caller passes another.
// Backward returns dx and accumulates dgamma += sum over the local rows of dy * x * r. Under sequence splits
// (SP, CP, data the rank holds alone) dgamma is partial: the executor all-reduces it with the other gradients
// of the replicated weights.
#pragma once

#include "executor/kernels/cpu/types.h"

namespace moeplan::executor::cpu {

inline constexpr double kRmsNormEps = 1e-6;

template <class S>
struct RmsNormOut {
  Mat<S> y;        // [T, h]
  Vec<S> inv_rms;  // [T]: r per row, for the backward
};

// gamma: [1, h].
template <class S>
RmsNormOut<S> rmsnorm_forward(const CRef<S>& x, const CRef<S>& gamma, double eps = kRmsNormEps);
// dx = r * (gamma * dy) - x * r^3 / h * sum_j(gamma_j dy_j x_j); dgamma [1, h] += sum_rows dy * x * r.
template <class S>
Mat<S> rmsnorm_backward(const CRef<S>& x, const CRef<S>& gamma, const CVecRef<S>& inv_rms, const CRef<S>& dy,
                        MRef<S> dgamma);

}  // namespace moeplan::executor::cpu
