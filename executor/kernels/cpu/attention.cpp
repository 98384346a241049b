#include "executor/kernels/cpu/attention.h"

#include <cmath>
#include <limits>

#include "simulator/core/status.h"

namespace moeplan::executor::cpu {

namespace {

struct Layout {
  int64_t d = 0, dv = 0, hl = 0, kvl = 0, group = 0;
  // Local kv head of local query head i.
  int64_t kv_of(const AttnHeads& a, int64_t i) const { return (a.head0 + i) / group - a.kv_head0; }
};

template <class S>
Layout check_layout(const CRef<S>& q, const CRef<S>& k, const CRef<S>& v, Positions q_pos, Positions k_pos,
                    const AttnHeads& a, Positions q_seg, Positions k_seg) {
  MOEPLAN_ASSERT(a.head_dim > 0 && a.num_kv_heads > 0 && a.num_heads % a.num_kv_heads == 0);
  MOEPLAN_ASSERT(a.v_dim >= 0);
  Layout l;
  l.d = a.head_dim;
  l.dv = a.v_dim > 0 ? a.v_dim : a.head_dim;
  MOEPLAN_ASSERT(q.cols() % l.d == 0 && k.cols() % l.d == 0 && k.rows() == v.rows());
  l.hl = q.cols() / l.d;
  l.kvl = k.cols() / l.d;
  MOEPLAN_ASSERT(v.cols() == l.kvl * l.dv);
  l.group = a.num_heads / a.num_kv_heads;
  MOEPLAN_ASSERT(a.head0 >= 0 && a.head0 + l.hl <= a.num_heads);
  MOEPLAN_ASSERT(a.kv_head0 >= 0 && a.kv_head0 + l.kvl <= a.num_kv_heads);
  for (int64_t i = 0; i < l.hl; ++i) MOEPLAN_ASSERT(l.kv_of(a, i) >= 0 && l.kv_of(a, i) < l.kvl);
  MOEPLAN_ASSERT(static_cast<Eigen::Index>(q_pos.size()) == q.rows());
  MOEPLAN_ASSERT(static_cast<Eigen::Index>(k_pos.size()) == k.rows());
  MOEPLAN_ASSERT(q_seg.empty() == k_seg.empty());
  MOEPLAN_ASSERT(q_seg.empty() || (q_seg.size() == q_pos.size() && k_seg.size() == k_pos.size()));
  return l;
}

// visible(i, j) as a [Tq, Tk] 0/1 matrix.
Eigen::Matrix<bool, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> make_mask(
    Positions q_pos, Positions k_pos, int64_t window, Positions q_seg, Positions k_seg) {
  Eigen::Matrix<bool, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> m(q_pos.size(), k_pos.size());
  for (size_t i = 0; i < q_pos.size(); ++i) {
    for (size_t j = 0; j < k_pos.size(); ++j) {
      bool ok = k_pos[j] <= q_pos[i] && (window == 0 || q_pos[i] - k_pos[j] < window);
      if (!q_seg.empty()) ok = ok && q_seg[i] == k_seg[j];
      m(static_cast<Eigen::Index>(i), static_cast<Eigen::Index>(j)) = ok;
    }
  }
  return m;
}

}  // namespace

template <class S>
AttnOut<S> attn_core_forward(const CRef<S>& q, const CRef<S>& k, const CRef<S>& v, Positions q_pos,
                             Positions k_pos, const AttnHeads& heads, Positions q_seg, Positions k_seg) {
  const Layout l = check_layout<S>(q, k, v, q_pos, k_pos, heads, q_seg, k_seg);
  const auto mask = make_mask(q_pos, k_pos, heads.window, q_seg, k_seg);
  const S scale = static_cast<S>(1.0 / std::sqrt(static_cast<double>(l.d)));
  const S neg_inf = -std::numeric_limits<S>::infinity();
  const Eigen::Index tq = q.rows(), tk = k.rows();
  AttnOut<S> r{Mat<S>::Zero(tq, l.hl * l.dv), Mat<S>(tq, l.hl)};
  Mat<S> s(tq, tk);
  for (int64_t h = 0; h < l.hl; ++h) {
    const int64_t g = l.kv_of(heads, h);
    s.noalias() = q.middleCols(h * l.d, l.d) * k.middleCols(g * l.d, l.d).transpose();
    for (Eigen::Index i = 0; i < tq; ++i) {
      S m = neg_inf;
      for (Eigen::Index j = 0; j < tk; ++j) {
        if (mask(i, j)) {
          s(i, j) *= scale;
          m = std::max(m, s(i, j));
        }
      }
      if (m == neg_inf) {  // no visible key: p = 0
        s.row(i).setZero();
        r.lse(i, h) = neg_inf;
        continue;
      }
      S sum = 0;
      for (Eigen::Index j = 0; j < tk; ++j) {
        s(i, j) = mask(i, j) ? std::exp(s(i, j) - m) : S(0);
        sum += s(i, j);
      }
      s.row(i) /= sum;
      r.lse(i, h) = m + std::log(sum);
    }
    r.out.middleCols(h * l.dv, l.dv).noalias() = s * v.middleCols(g * l.dv, l.dv);
  }
  return r;
}

template <class S>
AttnGrads<S> attn_core_backward(const CRef<S>& q, const CRef<S>& k, const CRef<S>& v, const CRef<S>& out,
                                const CRef<S>& lse, const CRef<S>& dout, Positions q_pos, Positions k_pos,
                                const AttnHeads& heads, Positions q_seg, Positions k_seg) {
  const Layout l = check_layout<S>(q, k, v, q_pos, k_pos, heads, q_seg, k_seg);
  MOEPLAN_ASSERT(out.rows() == q.rows() && out.cols() == l.hl * l.dv && dout.rows() == q.rows() &&
                 dout.cols() == out.cols() && lse.rows() == q.rows() && lse.cols() == l.hl);
  const auto mask = make_mask(q_pos, k_pos, heads.window, q_seg, k_seg);
  const S scale = static_cast<S>(1.0 / std::sqrt(static_cast<double>(l.d)));
  const S neg_inf = -std::numeric_limits<S>::infinity();
  const Eigen::Index tq = q.rows(), tk = k.rows();
  AttnGrads<S> g{Mat<S>::Zero(tq, q.cols()), Mat<S>::Zero(tk, k.cols()), Mat<S>::Zero(tk, v.cols())};
  Mat<S> p(tq, tk), dp(tq, tk);
  for (int64_t h = 0; h < l.hl; ++h) {
    const int64_t kv = l.kv_of(heads, h);
    const auto qh = q.middleCols(h * l.d, l.d);
    const auto kh = k.middleCols(kv * l.d, l.d);
    const auto vh = v.middleCols(kv * l.dv, l.dv);
    const auto doh = dout.middleCols(h * l.dv, l.dv);
    p.noalias() = qh * kh.transpose();
    for (Eigen::Index i = 0; i < tq; ++i) {
      const S lse_i = lse(i, h);
      for (Eigen::Index j = 0; j < tk; ++j)
        p(i, j) = (mask(i, j) && lse_i != neg_inf) ? std::exp(p(i, j) * scale - lse_i) : S(0);
    }
    g.dv.middleCols(kv * l.dv, l.dv).noalias() += p.transpose() * doh;
    dp.noalias() = doh * vh.transpose();
    for (Eigen::Index i = 0; i < tq; ++i) {
      const S di = doh.row(i).dot(out.middleCols(h * l.dv, l.dv).row(i));
      dp.row(i) = p.row(i).cwiseProduct((dp.row(i).array() - di).matrix()) * scale;  // dS * scale
    }
    g.dq.middleCols(h * l.d, l.d).noalias() = dp * kh;
    g.dk.middleCols(kv * l.d, l.d).noalias() += dp.transpose() * qh;
  }
  return g;
}

template <class S>
void attn_merge(MRef<S> out, MRef<S> lse, const CRef<S>& out_b, const CRef<S>& lse_b) {
  MOEPLAN_ASSERT(out.rows() == out_b.rows() && out.cols() == out_b.cols() && lse.rows() == lse_b.rows() &&
                 lse.cols() == lse_b.cols() && lse.rows() == out.rows() && out.cols() % lse.cols() == 0);
  const Eigen::Index d = out.cols() / lse.cols();
  const S neg_inf = -std::numeric_limits<S>::infinity();
  for (Eigen::Index i = 0; i < out.rows(); ++i) {
    for (Eigen::Index h = 0; h < lse.cols(); ++h) {
      const S a = lse(i, h), b = lse_b(i, h);
      if (b == neg_inf) continue;
      if (a == neg_inf) {
        lse(i, h) = b;
        out.row(i).segment(h * d, d) = out_b.row(i).segment(h * d, d);
        continue;
      }
      const S m = std::max(a, b);
      const S merged = m + std::log(std::exp(a - m) + std::exp(b - m));
      out.row(i).segment(h * d, d) = out.row(i).segment(h * d, d) * std::exp(a - merged) +
                                     out_b.row(i).segment(h * d, d) * std::exp(b - merged);
      lse(i, h) = merged;
    }
  }
}

#define MOERUN_INSTANTIATE(S)                                                                            \
  template AttnOut<S> attn_core_forward<S>(const CRef<S>&, const CRef<S>&, const CRef<S>&, Positions,    \
                                           Positions, const AttnHeads&, Positions, Positions);           \
  template AttnGrads<S> attn_core_backward<S>(const CRef<S>&, const CRef<S>&, const CRef<S>&,            \
                                              const CRef<S>&, const CRef<S>&, const CRef<S>&, Positions, \
                                              Positions, const AttnHeads&, Positions, Positions);        \
  template void attn_merge<S>(MRef<S>, MRef<S>, const CRef<S>&, const CRef<S>&);
MOERUN_INSTANTIATE(float)
MOERUN_INSTANTIATE(double)
#undef MOERUN_INSTANTIATE

}  // namespace moeplan::executor::cpu
