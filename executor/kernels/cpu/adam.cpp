#include "executor/kernels/cpu/adam.h"

#include <cmath>

#include "simulator/core/status.h"

namespace moeplan::executor::cpu {

template <class S>
void adam_step(std::span<S> params, std::span<const S> grads, std::span<S> m, std::span<S> v, int64_t step,
               const AdamConfig& cfg) {
  MOEPLAN_ASSERT(step >= 1 && grads.size() == params.size() && m.size() == params.size() &&
                 v.size() == params.size());
  const double st = static_cast<double>(step);
  const S b1 = static_cast<S>(cfg.beta1), b2 = static_cast<S>(cfg.beta2);
  const S one_b1 = static_cast<S>(1.0 - cfg.beta1), one_b2 = static_cast<S>(1.0 - cfg.beta2);
  const S inv_c1 = static_cast<S>(1.0 / (1.0 - std::pow(cfg.beta1, st)));
  const S inv_c2 = static_cast<S>(1.0 / (1.0 - std::pow(cfg.beta2, st)));
  const S lr = static_cast<S>(cfg.lr), eps = static_cast<S>(cfg.eps), wd = static_cast<S>(cfg.weight_decay);
  for (size_t i = 0; i < params.size(); ++i) {
    const S g = grads[i];
    m[i] = b1 * m[i] + one_b1 * g;
    v[i] = b2 * v[i] + one_b2 * g * g;
    const S update = (m[i] * inv_c1) / (std::sqrt(v[i] * inv_c2) + eps) + wd * params[i];
    params[i] -= lr * update;
  }
}

template void adam_step<float>(std::span<float>, std::span<const float>, std::span<float>, std::span<float>,
                               int64_t, const AdamConfig&);
template void adam_step<double>(std::span<double>, std::span<const double>, std::span<double>,
                                std::span<double>, int64_t, const AdamConfig&);

}  // namespace moeplan::executor::cpu
