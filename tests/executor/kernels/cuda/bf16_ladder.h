// What the GEMM-shaped GPU tests share (gemm_test.cpp, fused_test.cpp): bf16 matrices in double, their
// device copies, and the precision-ladder check. Test-only; host code.
#pragma once

#include <cuda_bf16.h>
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "executor/kernels/cpu/init.h"
#include "executor/kernels/cpu/types.h"
#include "executor/kernels/cuda/check.h"

namespace moeplan::cuda::test {

using MatD = executor::cpu::Mat<double>;
using Bf16 = __nv_bfloat16;

inline double bf16_round(double x) {
  return static_cast<double>(__bfloat162float(__float2bfloat16_rn(static_cast<float>(x))));
}

inline MatD round_bf16(const MatD& m) {
  return m.unaryExpr([](double x) { return bf16_round(x); });
}

// Standard normal entries (stream `tag` of the seed), rounded to bf16: the exact values the GPU sees.
inline MatD random_bf16(int64_t rows, int64_t cols, uint64_t seed, uint64_t tag) {
  MatD m(rows, cols);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) m(i, j) = bf16_round(executor::cpu::init_normal(seed, tag, i, j));
  return m;
}

// A device copy (at least one element, so empty matrices still get a valid pointer).
inline DeviceBuffer<Bf16> upload_bf16(const MatD& m) {
  std::vector<Bf16> h(static_cast<size_t>(m.size()));
  for (int64_t i = 0; i < m.rows(); ++i)
    for (int64_t j = 0; j < m.cols(); ++j)
      h[static_cast<size_t>(i * m.cols() + j)] = __float2bfloat16_rn(static_cast<float>(m(i, j)));
  DeviceBuffer<Bf16> d(std::max<size_t>(h.size(), 1));
  if (!h.empty()) d.upload(h.data(), h.size());
  return d;
}

// [rows, cols] bf16 at `d`, after the device finishes.
inline MatD download_bf16(const Bf16* d, int64_t rows, int64_t cols) {
  std::vector<Bf16> h(static_cast<size_t>(rows * cols));
  MOERUN_CUDA_CHECK(cudaDeviceSynchronize());
  if (!h.empty()) MOERUN_CUDA_CHECK(cudaMemcpy(h.data(), d, h.size() * sizeof(Bf16), cudaMemcpyDeviceToHost));
  MatD m(rows, cols);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      m(i, j) = static_cast<double>(__bfloat162float(h[static_cast<size_t>(i * cols + j)]));
  return m;
}
inline MatD download_bf16(const DeviceBuffer<Bf16>& d, int64_t rows, int64_t cols) {
  return download_bf16(d.data(), rows, cols);
}

// max |got - ref| <= factor * max |naive - ref| + floor_rel * max |ref|, and no NaN anywhere.
inline void check_ladder(const MatD& got, const MatD& ref, const MatD& naive, double factor, double floor_rel,
                         const std::string& what) {
  REQUIRE(got.rows() == ref.rows());
  REQUIRE(got.cols() == ref.cols());
  if (ref.size() == 0) return;
  const double scale = ref.cwiseAbs().maxCoeff();
  const double naive_err = (naive - ref).cwiseAbs().maxCoeff();
  double err = 0;
  int64_t nan = 0;
  for (int64_t i = 0; i < got.rows(); ++i)
    for (int64_t j = 0; j < got.cols(); ++j) {
      if (!std::isfinite(got(i, j))) {
        ++nan;
        continue;
      }
      err = std::max(err, std::abs(got(i, j) - ref(i, j)));
    }
  const double bound = factor * naive_err + floor_rel * scale;
  INFO(what << ": max error " << err << ", bound " << bound << " (naive " << naive_err << ", max|ref| "
            << scale << "), non-finite " << nan);
  CHECK(nan == 0);
  CHECK(err <= bound);
  CHECK(scale > 0);  // a zero reference would make the check vacuous
}

}  // namespace moeplan::cuda::test
