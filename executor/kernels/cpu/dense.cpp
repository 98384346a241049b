// linear.h, norm.h, swiglu.h, rope.h.
#include <cmath>

#include "executor/kernels/cpu/linear.h"
#include "executor/kernels/cpu/norm.h"
#include "executor/kernels/cpu/rope.h"
#include "executor/kernels/cpu/swiglu.h"
#include "simulator/core/status.h"

namespace moeplan::executor::cpu {

template <class S>
Mat<S> linear_forward(const CRef<S>& x, const CRef<S>& w) {
  MOEPLAN_ASSERT(x.cols() == w.rows());
  Mat<S> y(x.rows(), w.cols());
  y.noalias() = x * w;
  return y;
}

template <class S>
Mat<S> linear_dgrad(const CRef<S>& dy, const CRef<S>& w) {
  MOEPLAN_ASSERT(dy.cols() == w.cols());
  Mat<S> dx(dy.rows(), w.rows());
  dx.noalias() = dy * w.transpose();
  return dx;
}

template <class S>
void linear_wgrad(const CRef<S>& x, const CRef<S>& dy, MRef<S> dw) {
  MOEPLAN_ASSERT(x.rows() == dy.rows() && dw.rows() == x.cols() && dw.cols() == dy.cols());
  dw.noalias() += x.transpose() * dy;
}

template <class S>
RmsNormOut<S> rmsnorm_forward(const CRef<S>& x, const CRef<S>& gamma, double eps) {
  MOEPLAN_ASSERT(gamma.rows() == 1 && gamma.cols() == x.cols());
  RmsNormOut<S> out{Mat<S>(x.rows(), x.cols()), Vec<S>(x.rows())};
  const S inv_h = S(1) / static_cast<S>(x.cols());
  for (Eigen::Index t = 0; t < x.rows(); ++t) {
    const S ms = x.row(t).squaredNorm() * inv_h;
    const S r = S(1) / std::sqrt(ms + static_cast<S>(eps));
    out.inv_rms(t) = r;
    out.y.row(t) = (x.row(t) * r).cwiseProduct(gamma);
  }
  return out;
}

template <class S>
Mat<S> rmsnorm_backward(const CRef<S>& x, const CRef<S>& gamma, const CVecRef<S>& inv_rms, const CRef<S>& dy,
                        MRef<S> dgamma) {
  MOEPLAN_ASSERT(gamma.rows() == 1 && gamma.cols() == x.cols() && dy.rows() == x.rows() &&
                 dy.cols() == x.cols() && inv_rms.size() == x.rows());
  MOEPLAN_ASSERT(dgamma.rows() == 1 && dgamma.cols() == x.cols());
  Mat<S> dx(x.rows(), x.cols());
  const S inv_h = S(1) / static_cast<S>(x.cols());
  for (Eigen::Index t = 0; t < x.rows(); ++t) {
    const S r = inv_rms(t);
    const auto gdy = dy.row(t).cwiseProduct(gamma);
    const S dot = gdy.dot(x.row(t));
    dx.row(t) = gdy * r - x.row(t) * (r * r * r * inv_h * dot);
    dgamma += dy.row(t).cwiseProduct(x.row(t)) * r;
  }
  return dx;
}

template <class S>
Mat<S> swiglu_forward(const CRef<S>& in) {
  MOEPLAN_ASSERT(in.cols() % 2 == 0);
  const Eigen::Index f = in.cols() / 2;
  Mat<S> out(in.rows(), f);
  for (Eigen::Index t = 0; t < in.rows(); ++t) {
    for (Eigen::Index j = 0; j < f; ++j) {
      const S g = in(t, j);
      const S s = S(1) / (S(1) + std::exp(-g));
      out(t, j) = g * s * in(t, f + j);
    }
  }
  return out;
}

template <class S>
Mat<S> swiglu_backward(const CRef<S>& in, const CRef<S>& dy) {
  MOEPLAN_ASSERT(in.cols() % 2 == 0 && dy.cols() * 2 == in.cols() && dy.rows() == in.rows());
  const Eigen::Index f = in.cols() / 2;
  Mat<S> din(in.rows(), in.cols());
  for (Eigen::Index t = 0; t < in.rows(); ++t) {
    for (Eigen::Index j = 0; j < f; ++j) {
      const S g = in(t, j), u = in(t, f + j);
      const S s = S(1) / (S(1) + std::exp(-g));
      din(t, j) = dy(t, j) * u * (s + g * s * (S(1) - s));
      din(t, f + j) = dy(t, j) * g * s;
    }
  }
  return din;
}

namespace {

// sign +1 rotates by +angle (forward), -1 by -angle (backward: the transpose of a rotation).
template <class S>
void rope_apply(MRef<S> x, Positions pos, int64_t head_dim, double theta, double sign) {
  MOEPLAN_ASSERT(head_dim % 2 == 0 && x.cols() % head_dim == 0);
  MOEPLAN_ASSERT(static_cast<Eigen::Index>(pos.size()) == x.rows());
  const int64_t half = head_dim / 2, heads = x.cols() / head_dim;
  std::vector<S> c(static_cast<size_t>(half)), s(static_cast<size_t>(half));
  for (Eigen::Index t = 0; t < x.rows(); ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const double inv_freq = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
      const double angle = static_cast<double>(pos[static_cast<size_t>(t)]) * inv_freq;
      c[static_cast<size_t>(i)] = static_cast<S>(std::cos(angle));
      s[static_cast<size_t>(i)] = static_cast<S>(sign * std::sin(angle));
    }
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t base = h * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const S x1 = x(t, base + i), x2 = x(t, base + half + i);
        const S ci = c[static_cast<size_t>(i)], si = s[static_cast<size_t>(i)];
        x(t, base + i) = x1 * ci - x2 * si;
        x(t, base + half + i) = x2 * ci + x1 * si;
      }
    }
  }
}

}  // namespace

template <class S>
void rope_forward(MRef<S> x, Positions pos, int64_t head_dim, double theta) {
  rope_apply<S>(x, pos, head_dim, theta, 1.0);
}

template <class S>
void rope_backward(MRef<S> dx, Positions pos, int64_t head_dim, double theta) {
  rope_apply<S>(dx, pos, head_dim, theta, -1.0);
}

#define MOERUN_INSTANTIATE(S)                                                                            \
  template Mat<S> linear_forward<S>(const CRef<S>&, const CRef<S>&);                                     \
  template Mat<S> linear_dgrad<S>(const CRef<S>&, const CRef<S>&);                                       \
  template void linear_wgrad<S>(const CRef<S>&, const CRef<S>&, MRef<S>);                                \
  template RmsNormOut<S> rmsnorm_forward<S>(const CRef<S>&, const CRef<S>&, double);                     \
  template Mat<S> rmsnorm_backward<S>(const CRef<S>&, const CRef<S>&, const CVecRef<S>&, const CRef<S>&, \
                                      MRef<S>);                                                          \
  template Mat<S> swiglu_forward<S>(const CRef<S>&);                                                     \
  template Mat<S> swiglu_backward<S>(const CRef<S>&, const CRef<S>&);                                    \
  template void rope_forward<S>(MRef<S>, Positions, int64_t, double);                                    \
  template void rope_backward<S>(MRef<S>, Positions, int64_t, double);
MOERUN_INSTANTIATE(float)
MOERUN_INSTANTIATE(double)
#undef MOERUN_INSTANTIATE

}  // namespace moeplan::executor::cpu
