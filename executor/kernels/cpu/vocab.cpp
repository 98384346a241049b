#include "executor/kernels/cpu/vocab.h"

#include <cmath>

#include "simulator/core/status.h"

namespace moeplan::executor::cpu {

template <class S>
Mat<S> embedding_forward(Positions ids, const CRef<S>& table, int64_t v0) {
  const int64_t v1 = v0 + table.rows();
  Mat<S> y = Mat<S>::Zero(static_cast<Eigen::Index>(ids.size()), table.cols());
  for (size_t t = 0; t < ids.size(); ++t)
    if (ids[t] >= v0 && ids[t] < v1) y.row(static_cast<Eigen::Index>(t)) = table.row(ids[t] - v0);
  return y;
}

template <class S>
void embedding_backward(Positions ids, const CRef<S>& dy, int64_t v0, MRef<S> dtable) {
  MOEPLAN_ASSERT(dy.rows() == static_cast<Eigen::Index>(ids.size()) && dy.cols() == dtable.cols());
  const int64_t v1 = v0 + dtable.rows();
  for (size_t t = 0; t < ids.size(); ++t)
    if (ids[t] >= v0 && ids[t] < v1) dtable.row(ids[t] - v0) += dy.row(static_cast<Eigen::Index>(t));
}

template <class S>
Vec<S> loss_local_max(const CRef<S>& logits) {
  Vec<S> m(logits.rows());
  for (Eigen::Index t = 0; t < logits.rows(); ++t) m(t) = logits.row(t).maxCoeff();
  return m;
}

template <class S>
CeStats<S> loss_local_stats(const CRef<S>& logits, Positions targets, int64_t v0, const CVecRef<S>& max) {
  MOEPLAN_ASSERT(static_cast<Eigen::Index>(targets.size()) == logits.rows() && max.size() == logits.rows());
  CeStats<S> s{Vec<S>(logits.rows()), Vec<S>::Zero(logits.rows())};
  const int64_t v1 = v0 + logits.cols();
  for (Eigen::Index t = 0; t < logits.rows(); ++t) {
    S sum = 0;
    for (Eigen::Index j = 0; j < logits.cols(); ++j) sum += std::exp(logits(t, j) - max(t));
    s.sum_exp(t) = sum;
    const int64_t y = targets[static_cast<size_t>(t)];
    if (y >= v0 && y < v1) s.target_logit(t) = logits(t, y - v0);
  }
  return s;
}

template <class S>
Vec<S> loss_per_token(const CVecRef<S>& max, const CeStats<S>& global) {
  MOEPLAN_ASSERT(global.sum_exp.size() == max.size() && global.target_logit.size() == max.size());
  Vec<S> l(max.size());
  for (Eigen::Index t = 0; t < max.size(); ++t)
    l(t) = std::log(global.sum_exp(t)) + max(t) - global.target_logit(t);
  return l;
}

template <class S>
S loss_forward(const CVecRef<S>& max, const CeStats<S>& global, double inv_tokens) {
  const Vec<S> l = loss_per_token<S>(max, global);
  S sum = 0;
  for (Eigen::Index t = 0; t < l.size(); ++t) sum += l(t);
  return sum * static_cast<S>(inv_tokens);
}

template <class S>
Mat<S> loss_backward(const CRef<S>& logits, Positions targets, int64_t v0, const CVecRef<S>& max,
                     const CVecRef<S>& global_sum_exp, double inv_tokens) {
  MOEPLAN_ASSERT(static_cast<Eigen::Index>(targets.size()) == logits.rows() && max.size() == logits.rows() &&
                 global_sum_exp.size() == logits.rows());
  const S scale = static_cast<S>(inv_tokens);
  const int64_t v1 = v0 + logits.cols();
  Mat<S> d(logits.rows(), logits.cols());
  for (Eigen::Index t = 0; t < logits.rows(); ++t) {
    const S inv_sum = S(1) / global_sum_exp(t);
    for (Eigen::Index j = 0; j < logits.cols(); ++j)
      d(t, j) = std::exp(logits(t, j) - max(t)) * inv_sum * scale;
    const int64_t y = targets[static_cast<size_t>(t)];
    if (y >= v0 && y < v1) d(t, y - v0) -= scale;
  }
  return d;
}

#define MOERUN_INSTANTIATE(S)                                                                                \
  template Mat<S> embedding_forward<S>(Positions, const CRef<S>&, int64_t);                                  \
  template void embedding_backward<S>(Positions, const CRef<S>&, int64_t, MRef<S>);                          \
  template Vec<S> loss_local_max<S>(const CRef<S>&);                                                         \
  template CeStats<S> loss_local_stats<S>(const CRef<S>&, Positions, int64_t, const CVecRef<S>&);            \
  template Vec<S> loss_per_token<S>(const CVecRef<S>&, const CeStats<S>&);                                   \
  template S loss_forward<S>(const CVecRef<S>&, const CeStats<S>&, double);                                  \
  template Mat<S> loss_backward<S>(const CRef<S>&, Positions, int64_t, const CVecRef<S>&, const CVecRef<S>&, \
                                   double);
MOERUN_INSTANTIATE(float)
MOERUN_INSTANTIATE(double)
#undef MOERUN_INSTANTIATE

}  // namespace moeplan::executor::cpu
