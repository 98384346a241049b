// Adam with decoupled weight decay (op optimizer), fp32, on a flat span of parameters with its own flat
// moment spans: element-wise, so a ZeRO shard updates its slice and gets exactly what a full update gives
// there.
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p = p - lr * ( (m / c1) / (sqrt(v / c2) + eps) + wd * p ),  c1 = 1 - b1^step, c2 = 1 - b2^step
// step counts from 1. Coefficients are computed in double and rounded to S once per call.
#pragma once

#include <span>

#include "executor/kernels/cpu/types.h"

namespace moeplan::executor::cpu {

struct AdamConfig {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.0;
};

template <class S>
void adam_step(std::span<S> params, std::span<const S> grads, std::span<S> m, std::span<S> v, int64_t step,
               const AdamConfig& cfg = {});

}  // namespace moeplan::executor::cpu
