#include "executor/kernels/cpu/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "simulator/core/status.h"

namespace moeplan::executor::cpu {

template <class S>
Route<S> router_forward(const CRef<S>& logits, int64_t top_k, bool renormalize) {
  const Eigen::Index t_n = logits.rows(), e_n = logits.cols();
  MOEPLAN_ASSERT(top_k >= 1 && top_k <= e_n);
  Route<S> r;
  r.top_k = top_k;
  r.renormalize = renormalize;
  r.probs.resize(t_n, e_n);
  r.experts.resize(static_cast<size_t>(t_n * top_k));
  r.gates.resize(t_n, top_k);
  std::vector<int64_t> order(static_cast<size_t>(e_n));
  for (Eigen::Index t = 0; t < t_n; ++t) {
    const S m = logits.row(t).maxCoeff();
    S sum = 0;
    for (Eigen::Index e = 0; e < e_n; ++e) {
      r.probs(t, e) = std::exp(logits(t, e) - m);
      sum += r.probs(t, e);
    }
    r.probs.row(t) /= sum;
    std::iota(order.begin(), order.end(), int64_t{0});
    const auto p = r.probs.row(t);
    std::partial_sort(order.begin(), order.begin() + top_k, order.end(),
                      [&](int64_t a, int64_t b) { return p(a) > p(b) || (p(a) == p(b) && a < b); });
    S denom = 0;
    for (int64_t j = 0; j < top_k; ++j) denom += p(order[static_cast<size_t>(j)]);
    for (int64_t j = 0; j < top_k; ++j) {
      const int64_t e = order[static_cast<size_t>(j)];
      r.experts[static_cast<size_t>(t * top_k + j)] = e;
      r.gates(t, j) = renormalize ? p(e) / denom : p(e);
    }
  }
  return r;
}

template <class S>
Mat<S> router_backward(const Route<S>& route, const CRef<S>& dgates, const CVecRef<S>& aux_dprobs) {
  const Eigen::Index t_n = route.probs.rows(), e_n = route.probs.cols();
  const int64_t k = route.top_k;
  MOEPLAN_ASSERT(dgates.rows() == t_n && dgates.cols() == k);
  MOEPLAN_ASSERT(aux_dprobs.size() == 0 || aux_dprobs.size() == e_n);
  Mat<S> dlogits(t_n, e_n);
  Vec<S> dp(e_n);
  for (Eigen::Index t = 0; t < t_n; ++t) {
    if (aux_dprobs.size() > 0) {
      dp = aux_dprobs;
    } else {
      dp.setZero();
    }
    const auto p = route.probs.row(t);
    if (route.renormalize) {
      S denom = 0, dot = 0;
      for (int64_t j = 0; j < k; ++j) {
        denom += p(route.experts[static_cast<size_t>(t * k + j)]);
        dot += dgates(t, j) * route.gates(t, j);
      }
      for (int64_t j = 0; j < k; ++j)
        dp(route.experts[static_cast<size_t>(t * k + j)]) += (dgates(t, j) - dot) / denom;
    } else {
      for (int64_t j = 0; j < k; ++j) dp(route.experts[static_cast<size_t>(t * k + j)]) += dgates(t, j);
    }
    const S pdp = p.dot(dp.transpose());
    dlogits.row(t) = p.cwiseProduct((dp.array() - pdp).matrix().transpose());
  }
  return dlogits;
}

template <class S>
RouterStats<S> router_local_stats(const Route<S>& route) {
  const Eigen::Index e_n = route.probs.cols();
  RouterStats<S> s{Vec<S>::Zero(e_n), Vec<S>::Zero(e_n)};
  for (const int64_t e : route.experts) s.counts(e) += S(1);
  for (Eigen::Index t = 0; t < route.probs.rows(); ++t) s.prob_sums += route.probs.row(t).transpose();
  return s;
}

template <class S>
S aux_loss(const RouterStats<S>& global, int64_t tokens, int64_t top_k, double coef) {
  MOEPLAN_ASSERT(tokens > 0 && global.counts.size() == global.prob_sums.size());
  const S inv_tk = static_cast<S>(1.0 / static_cast<double>(tokens * top_k));
  const S inv_t = static_cast<S>(1.0 / static_cast<double>(tokens));
  S acc = 0;
  for (Eigen::Index e = 0; e < global.counts.size(); ++e)
    acc += (global.counts(e) * inv_tk) * (global.prob_sums(e) * inv_t);
  return static_cast<S>(coef * static_cast<double>(global.counts.size())) * acc;
}

template <class S>
Vec<S> aux_loss_dprobs(const RouterStats<S>& global, int64_t tokens, int64_t top_k, double coef,
                       double scale) {
  MOEPLAN_ASSERT(tokens > 0);
  const S inv_tk = static_cast<S>(1.0 / static_cast<double>(tokens * top_k));
  const S c =
      static_cast<S>(scale * coef * static_cast<double>(global.counts.size()) / static_cast<double>(tokens));
  Vec<S> d(global.counts.size());
  for (Eigen::Index e = 0; e < d.size(); ++e) d(e) = c * (global.counts(e) * inv_tk);
  return d;
}

PermuteIndex make_permute_index(std::span<const int64_t> experts, int64_t tokens, int64_t top_k,
                                int64_t num_experts) {
  MOEPLAN_ASSERT(static_cast<int64_t>(experts.size()) == tokens * top_k);
  PermuteIndex idx;
  idx.tokens = tokens;
  idx.top_k = top_k;
  idx.num_experts = num_experts;
  idx.counts.assign(static_cast<size_t>(num_experts), 0);
  for (const int64_t e : experts) {
    MOEPLAN_ASSERT(e >= 0 && e < num_experts);
    ++idx.counts[static_cast<size_t>(e)];
  }
  idx.offsets.assign(static_cast<size_t>(num_experts) + 1, 0);
  for (size_t e = 0; e < static_cast<size_t>(num_experts); ++e)
    idx.offsets[e + 1] = idx.offsets[e] + idx.counts[e];
  std::vector<int64_t> cursor(idx.offsets.begin(), idx.offsets.end() - 1);
  const size_t rows = experts.size();
  idx.row_token.resize(rows);
  idx.row_slot.resize(rows);
  idx.slot_row.resize(rows);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t j = 0; j < top_k; ++j) {
      const size_t s = static_cast<size_t>(t * top_k + j);
      const int64_t r = cursor[static_cast<size_t>(experts[s])]++;
      idx.row_token[static_cast<size_t>(r)] = t;
      idx.row_slot[static_cast<size_t>(r)] = j;
      idx.slot_row[s] = r;
    }
  }
  return idx;
}

template <class S>
Mat<S> permute_forward(const CRef<S>& x, const PermuteIndex& idx) {
  MOEPLAN_ASSERT(x.rows() == idx.tokens);
  const Eigen::Index rows = static_cast<Eigen::Index>(idx.row_token.size());
  Mat<S> xp(rows, x.cols());
  for (Eigen::Index r = 0; r < rows; ++r) xp.row(r) = x.row(idx.row_token[static_cast<size_t>(r)]);
  return xp;
}

template <class S>
Mat<S> permute_backward(const CRef<S>& dxp, const PermuteIndex& idx) {
  MOEPLAN_ASSERT(dxp.rows() == static_cast<Eigen::Index>(idx.row_token.size()));
  Mat<S> dx = Mat<S>::Zero(idx.tokens, dxp.cols());
  for (Eigen::Index r = 0; r < dxp.rows(); ++r) dx.row(idx.row_token[static_cast<size_t>(r)]) += dxp.row(r);
  return dx;
}

template <class S>
void unpermute_forward(const CRef<S>& yp, const PermuteIndex& idx, const CRef<S>& gates, MRef<S> out) {
  MOEPLAN_ASSERT(yp.rows() == static_cast<Eigen::Index>(idx.row_token.size()) && out.rows() == idx.tokens &&
                 out.cols() == yp.cols() && gates.rows() == idx.tokens && gates.cols() == idx.top_k);
  for (Eigen::Index r = 0; r < yp.rows(); ++r) {
    const int64_t t = idx.row_token[static_cast<size_t>(r)], j = idx.row_slot[static_cast<size_t>(r)];
    out.row(t) += gates(t, j) * yp.row(r);
  }
}

template <class S>
UnpermuteGrads<S> unpermute_backward(const CRef<S>& dy, const CRef<S>& yp, const PermuteIndex& idx,
                                     const CRef<S>& gates) {
  MOEPLAN_ASSERT(yp.rows() == static_cast<Eigen::Index>(idx.row_token.size()) && dy.rows() == idx.tokens &&
                 dy.cols() == yp.cols() && gates.rows() == idx.tokens && gates.cols() == idx.top_k);
  UnpermuteGrads<S> g{Mat<S>(yp.rows(), yp.cols()), Mat<S>(idx.tokens, idx.top_k)};
  for (Eigen::Index r = 0; r < yp.rows(); ++r) {
    const int64_t t = idx.row_token[static_cast<size_t>(r)], j = idx.row_slot[static_cast<size_t>(r)];
    g.dyp.row(r) = gates(t, j) * dy.row(t);
    g.dgates(t, j) = dy.row(t).dot(yp.row(r));
  }
  return g;
}

namespace {

Eigen::Index check_groups(Eigen::Index rows, Eigen::Index w_rows, std::span<const int64_t> counts) {
  MOEPLAN_ASSERT(!counts.empty() && w_rows % static_cast<Eigen::Index>(counts.size()) == 0);
  int64_t total = 0;
  for (const int64_t c : counts) {
    MOEPLAN_ASSERT(c >= 0);
    total += c;
  }
  MOEPLAN_ASSERT(total == rows);
  return w_rows / static_cast<Eigen::Index>(counts.size());
}

}  // namespace

template <class S>
Mat<S> expert_gemm_forward(const CRef<S>& x, const CRef<S>& w, std::span<const int64_t> counts) {
  const Eigen::Index in = check_groups(x.rows(), w.rows(), counts);
  MOEPLAN_ASSERT(x.cols() == in);
  Mat<S> y(x.rows(), w.cols());
  Eigen::Index row = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const Eigen::Index n = counts[i];
    if (n > 0)
      y.middleRows(row, n).noalias() =
          x.middleRows(row, n) * w.middleRows(static_cast<Eigen::Index>(i) * in, in);
    row += n;
  }
  return y;
}

template <class S>
Mat<S> expert_gemm_dgrad(const CRef<S>& dy, const CRef<S>& w, std::span<const int64_t> counts) {
  const Eigen::Index in = check_groups(dy.rows(), w.rows(), counts);
  MOEPLAN_ASSERT(dy.cols() == w.cols());
  Mat<S> dx(dy.rows(), in);
  Eigen::Index row = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const Eigen::Index n = counts[i];
    if (n > 0)
      dx.middleRows(row, n).noalias() =
          dy.middleRows(row, n) * w.middleRows(static_cast<Eigen::Index>(i) * in, in).transpose();
    row += n;
  }
  return dx;
}

template <class S>
void expert_gemm_wgrad(const CRef<S>& x, const CRef<S>& dy, std::span<const int64_t> counts, MRef<S> dw) {
  const Eigen::Index in = check_groups(x.rows(), dw.rows(), counts);
  MOEPLAN_ASSERT(x.cols() == in && dy.rows() == x.rows() && dy.cols() == dw.cols());
  Eigen::Index row = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const Eigen::Index n = counts[i];
    if (n > 0)
      dw.middleRows(static_cast<Eigen::Index>(i) * in, in).noalias() +=
          x.middleRows(row, n).transpose() * dy.middleRows(row, n);
    row += n;
  }
}

#define MOERUN_INSTANTIATE(S)                                                                           \
  template Route<S> router_forward<S>(const CRef<S>&, int64_t, bool);                                   \
  template Mat<S> router_backward<S>(const Route<S>&, const CRef<S>&, const CVecRef<S>&);               \
  template RouterStats<S> router_local_stats<S>(const Route<S>&);                                       \
  template S aux_loss<S>(const RouterStats<S>&, int64_t, int64_t, double);                              \
  template Vec<S> aux_loss_dprobs<S>(const RouterStats<S>&, int64_t, int64_t, double, double);          \
  template Mat<S> permute_forward<S>(const CRef<S>&, const PermuteIndex&);                              \
  template Mat<S> permute_backward<S>(const CRef<S>&, const PermuteIndex&);                             \
  template void unpermute_forward<S>(const CRef<S>&, const PermuteIndex&, const CRef<S>&, MRef<S>);     \
  template UnpermuteGrads<S> unpermute_backward<S>(const CRef<S>&, const CRef<S>&, const PermuteIndex&, \
                                                   const CRef<S>&);                                     \
  template Mat<S> expert_gemm_forward<S>(const CRef<S>&, const CRef<S>&, std::span<const int64_t>);     \
  template Mat<S> expert_gemm_dgrad<S>(const CRef<S>&, const CRef<S>&, std::span<const int64_t>);       \
  template void expert_gemm_wgrad<S>(const CRef<S>&, const CRef<S>&, std::span<const int64_t>, MRef<S>);
MOERUN_INSTANTIATE(float)
MOERUN_INSTANTIATE(double)
#undef MOERUN_INSTANTIATE

}  // namespace moeplan::executor::cpu
