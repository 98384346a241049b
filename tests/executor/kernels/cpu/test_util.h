// Helpers for the CPU kernel tests: deterministic random matrices and finite-difference gradient checks.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <functional>

#include "executor/kernels/cpu/init.h"
#include "executor/kernels/cpu/types.h"

namespace moeplan::executor::cpu::test {

using MatD = Mat<double>;
using VecD = Vec<double>;
using MatF = Mat<float>;

// Standard normal entries from the counter-based generator (scale * z).
inline MatD rnd(int64_t rows, int64_t cols, uint64_t seed, double scale = 1.0) {
  MatD m(rows, cols);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) m(i, j) = scale * init_normal(seed, 0x7e57, i, j);
  return m;
}

// Gradient checks run in double with central differences, step h = 1e-5: truncation error ~ h^2 |f'''| ~
// 1e-10, rounding ~ 1e-16 |f| / h ~ 1e-10 for the losses used (|f| <= 10); the tolerance |fd - analytic| <=
// 1e-8 + 1e-6 |analytic| leaves two orders of margin over that noise and still catches any wrong or missing
// term (which shows up at 1e-3 relative or more).
inline constexpr double kFdStep = 1e-5;
inline constexpr double kFdAtol = 1e-8;
inline constexpr double kFdRtol = 1e-6;

inline double central_difference(double& x, const std::function<double()>& f, double h = kFdStep) {
  const double x0 = x;
  x = x0 + h;
  const double fp = f();
  x = x0 - h;
  const double fm = f();
  x = x0;
  return (fp - fm) / (2.0 * h);
}

// Compares `analytic` with finite differences of f over every entry of `m` (or every `stride`-th entry).
// The check passes when every |fd - analytic| <= atol + rtol |analytic|; reports the worst ratio.
template <class M>
void check_grad(M&& m, const MatD& analytic, const std::function<double()>& f, const char* what,
                int64_t stride = 1, double atol = kFdAtol, double rtol = kFdRtol) {
  REQUIRE(analytic.rows() == m.rows());
  REQUIRE(analytic.cols() == m.cols());
  double worst = 0;
  int64_t checked = 0;
  for (int64_t i = 0; i < m.rows(); ++i) {
    for (int64_t j = 0; j < m.cols(); ++j) {
      if ((i * m.cols() + j) % stride != 0) continue;
      const double fd = central_difference(m(i, j), f);
      const double an = analytic(i, j);
      worst = std::max(worst, std::abs(fd - an) / (atol + rtol * std::abs(an)));
      ++checked;
    }
  }
  INFO(what << ": " << checked << " entries, worst |fd - analytic| / (atol + rtol |analytic|) = " << worst);
  CHECK(worst <= 1.0);
}

// sum(a * b): the scalar loss that makes `b` the upstream gradient of `a`.
inline double dot(const MatD& a, const MatD& b) {
  return a.cwiseProduct(b).sum();
}

// Largest |a - b| relative to max |b| (norm-wise, robust to entries near zero).
template <class S>
double rel_err(const Mat<S>& a, const Mat<S>& b) {
  const double denom = std::max(static_cast<double>(b.cwiseAbs().maxCoeff()), 1e-30);
  return static_cast<double>((a - b).cwiseAbs().maxCoeff()) / denom;
}

}  // namespace moeplan::executor::cpu::test
