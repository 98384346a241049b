// moerun's GPU GEMMs against the CPU kernels: cuBLASLt dense GEMMs (executor/kernels/cpu/linear.h) and the
// grouped expert GEMMs (executor/kernels/cpu/moe.h, expert_gemm_*), from the same bf16 (or e4m3) inputs.
//
// Precision ladder. The reference is the CPU kernel in double on the rounded inputs, so the only errors left
// are the GPU's accumulation and output rounding. The GPU result must stay within `factor` times the error of
// a naive version of the same output precision plus a small floor relative to the largest |reference|:
//   bf16 output: naive = the double reference rounded to bf16 (what an exact GEMM writing bf16 errs);
//     fp32 accumulation adds ~k 2^-24 |a||b|, far below, so 3x naive + 1e-4 max|ref| holds with margin.
//   fp32 output (wgrad's dW += x^T dy): naive = the float CPU kernel (sequential fp32 accumulation, error
//     ~k 2^-24 |a||b|); tensor cores accumulate in fp32 but in another order and aligning addends by
//     truncation (up to 2^-23 per add, so at most k 2^-23 max|ref| < 4e-5 max|ref| for k <= 300 here): 8x
//     naive + 5e-5 max|ref|.
//   fp8 inputs, bf16 output: reference on the dequantised inputs; Hopper's fp8 MMA accumulates with ~14 bits
//     before cuBLASLt promotes to fp32 (DeepSeek-V3 report, section 3.3.2: "around 14 bits" on H800), which
//     for these sizes stays below the bf16 output rounding: 3x naive + 1e-3 max|ref|.
// A wrong transpose, expert, offset or scale gives errors of order max|ref|, far above every bound. Outputs
// are poisoned with NaN before each run (NaN never passes), and accumulating outputs start from random
// values.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "executor/kernels/cpu/init.h"
#include "executor/kernels/cpu/linear.h"
#include "executor/kernels/cpu/moe.h"
#include "executor/kernels/cuda/check.h"
#include "executor/kernels/cuda/gemm.h"
#include "executor/kernels/cuda/grouped_gemm.h"
#include "tests/executor/kernels/cuda/bf16_ladder.h"

namespace moeplan::cuda {
namespace {

using executor::cpu::Mat;
using MatF = Mat<float>;
using test::Bf16;
using test::bf16_round;
using test::check_ladder;
using test::download_bf16;
using test::MatD;
using test::round_bf16;
using test::upload_bf16;

MatD random_bf16(int64_t rows, int64_t cols, uint64_t seed) {
  return test::random_bf16(rows, cols, seed, 0x6e3);
}

DeviceBuffer<float> upload_f32(const MatD& m) {
  std::vector<float> h(static_cast<size_t>(m.size()));
  for (int64_t i = 0; i < m.rows(); ++i)
    for (int64_t j = 0; j < m.cols(); ++j)
      h[static_cast<size_t>(i * m.cols() + j)] = static_cast<float>(m(i, j));
  DeviceBuffer<float> d(h.size());
  d.upload(h.data(), h.size());
  return d;
}

// A [rows, cols] bf16 device buffer filled with NaN, so that any element a kernel fails to write shows.
DeviceBuffer<Bf16> nan_bf16(int64_t rows, int64_t cols) {
  std::vector<Bf16> h(static_cast<size_t>(rows * cols),
                      __float2bfloat16_rn(std::numeric_limits<float>::quiet_NaN()));
  DeviceBuffer<Bf16> d(h.size());
  d.upload(h.data(), h.size());
  return d;
}

MatD download_f32(const DeviceBuffer<float>& d, int64_t rows, int64_t cols) {
  std::vector<float> h(static_cast<size_t>(rows * cols));
  MOERUN_CUDA_CHECK(cudaDeviceSynchronize());
  d.download(h.data(), h.size());
  MatD m(rows, cols);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) m(i, j) = static_cast<double>(h[static_cast<size_t>(i * cols + j)]);
  return m;
}

// Runs one cuBLASLt GEMM (with its workspace) and synchronises.
void run_gemm(const Gemm& g, const GemmOperands& ops) {
  REQUIRE_MESSAGE(g.can_implement().empty(), g.can_implement());
  DeviceBuffer<char> ws(g.workspace_size());
  g.run(ops, ws.data(), nullptr);
  MOERUN_CUDA_CHECK(cudaGetLastError());
  MOERUN_CUDA_CHECK(cudaDeviceSynchronize());
}

// Shapes off every tile multiple (cuBLASLt handles any bf16 shape).
constexpr int64_t kTokens = 200, kIn = 264, kOut = 136;

}  // namespace

TEST_SUITE("gpu") {
  TEST_CASE("cuBLASLt bf16 forward GEMM y = x W matches the CPU linear_forward") {
    MOERUN_SKIP_WITHOUT_DEVICE();
    const MatD x = random_bf16(kTokens, kIn, 1), w = random_bf16(kIn, kOut, 2);
    auto dx = upload_bf16(x), dw = upload_bf16(w);
    auto dy = nan_bf16(kTokens, kOut);
    const Gemm g({GemmOp::kForward, kTokens, kOut, kIn, GemmType::kBf16, GemmType::kBf16, false});
    run_gemm(g, {dx.data(), dw.data(), dy.data()});
    const MatD ref = executor::cpu::linear_forward<double>(x, w);
    check_ladder(download_bf16(dy, kTokens, kOut), ref, round_bf16(ref), 3.0, 1e-4, "forward");
  }

  TEST_CASE("cuBLASLt bf16 dgrad GEMM dx = dy W^T matches the CPU linear_dgrad") {
    MOERUN_SKIP_WITHOUT_DEVICE();
    const MatD dy = random_bf16(kTokens, kOut, 3), w = random_bf16(kIn, kOut, 4);
    auto d_dy = upload_bf16(dy), dw = upload_bf16(w);
    auto dx = nan_bf16(kTokens, kIn);
    const Gemm g({GemmOp::kDgrad, kTokens, kIn, kOut, GemmType::kBf16, GemmType::kBf16, false});
    run_gemm(g, {d_dy.data(), dw.data(), dx.data()});
    const MatD ref = executor::cpu::linear_dgrad<double>(dy, w);
    check_ladder(download_bf16(dx, kTokens, kIn), ref, round_bf16(ref), 3.0, 1e-4, "dgrad");
  }

  TEST_CASE("cuBLASLt wgrad GEMM dW += x^T dy into fp32 matches the CPU linear_wgrad") {
    MOERUN_SKIP_WITHOUT_DEVICE();
    const MatD x = random_bf16(kTokens, kIn, 5), dy = random_bf16(kTokens, kOut, 6);
    const MatD dw0 = random_bf16(kIn, kOut, 7);  // the accumulator's previous contents
    auto dx = upload_bf16(x), d_dy = upload_bf16(dy);
    auto dw = upload_f32(dw0);
    const Gemm g({GemmOp::kWgrad, kIn, kOut, kTokens, GemmType::kBf16, GemmType::kF32, true});
    run_gemm(g, {dx.data(), d_dy.data(), dw.data()});
    MatD ref = dw0;
    executor::cpu::linear_wgrad<double>(x, dy, ref);
    MatF naive = dw0.cast<float>();
    executor::cpu::linear_wgrad<float>(x.cast<float>(), dy.cast<float>(), naive);
    check_ladder(download_f32(dw, kIn, kOut), ref, naive.cast<double>(), 8.0, 5e-5, "wgrad");
  }

  TEST_CASE("cuBLASLt bf16 wgrad GEMM without accumulation overwrites its bf16 output") {
    MOERUN_SKIP_WITHOUT_DEVICE();
    const MatD x = random_bf16(kTokens, kIn, 8), dy = random_bf16(kTokens, kOut, 9);
    auto dx = upload_bf16(x), d_dy = upload_bf16(dy);
    auto dw = nan_bf16(kIn, kOut);
    const Gemm g({GemmOp::kWgrad, kIn, kOut, kTokens, GemmType::kBf16, GemmType::kBf16, false});
    run_gemm(g, {dx.data(), d_dy.data(), dw.data()});
    MatD ref = MatD::Zero(kIn, kOut);
    executor::cpu::linear_wgrad<double>(x, dy, ref);
    check_ladder(download_bf16(dw, kIn, kOut), ref, round_bf16(ref), 3.0, 1e-4, "wgrad bf16");
  }

  TEST_CASE("cuBLASLt fp8 e4m3 GEMM with per-tensor scales matches the CPU on dequantised inputs") {
    MOERUN_SKIP_WITHOUT_DEVICE();
    // C [m, n] = A [m, k] B [n, k]^T (fp8 takes only this layout on Hopper); m, n, k multiples of 16.
    constexpr int64_t m = 192, n = 144, k = 512;
    const MatD a = random_bf16(m, k, 10) * 3.0, b = random_bf16(n, k, 11) * 0.05;
    // Per-tensor scale: amax maps to e4m3's largest finite value, 448.
    auto quantise = [](const MatD& x, float& scale, std::vector<__nv_fp8_e4m3>& q) {
      scale = static_cast<float>(x.cwiseAbs().maxCoeff() / 448.0);
      MatD deq(x.rows(), x.cols());
      q.resize(static_cast<size_t>(x.size()));
      for (int64_t i = 0; i < x.rows(); ++i)
        for (int64_t j = 0; j < x.cols(); ++j) {
          const __nv_fp8_e4m3 v(static_cast<float>(x(i, j)) / scale);
          q[static_cast<size_t>(i * x.cols() + j)] = v;
          deq(i, j) = static_cast<double>(static_cast<float>(v)) * static_cast<double>(scale);
        }
      return deq;
    };
    float sa = 0, sb = 0;
    std::vector<__nv_fp8_e4m3> qa, qb;
    const MatD a_deq = quantise(a, sa, qa), b_deq = quantise(b, sb, qb);
    DeviceBuffer<__nv_fp8_e4m3> da(qa.size()), db(qb.size());
    da.upload(qa.data(), qa.size());
    db.upload(qb.data(), qb.size());
    DeviceBuffer<float> a_scale(1), b_scale(1);  // each in its own allocation, as cuBLASLt's samples do
    a_scale.upload(&sa, 1);
    b_scale.upload(&sb, 1);
    auto dc = nan_bf16(m, n);
    const Gemm g({GemmOp::kDgrad, m, n, k, GemmType::kE4m3, GemmType::kBf16, false});
    run_gemm(g, {da.data(), db.data(), dc.data(), a_scale.data(), b_scale.data()});
    const MatD ref = executor::cpu::linear_dgrad<double>(a_deq, b_deq);
    check_ladder(download_bf16(dc, m, n), ref, round_bf16(ref), 3.0, 1e-3, "fp8");

    // The weight-gradient form: the same product accumulated into an fp32 C (C += A B^T), as an FP8 weight
    // gradient adds into its FP32 main gradient.
    const MatD c0 = random_bf16(m, n, 12);
    auto dc32 = upload_f32(c0);
    const Gemm acc({GemmOp::kDgrad, m, n, k, GemmType::kE4m3, GemmType::kF32, true});
    REQUIRE_MESSAGE(acc.can_implement().empty(), acc.can_implement());
    run_gemm(acc, {da.data(), db.data(), dc32.data(), a_scale.data(), b_scale.data()});
    const MatD ref32 = c0 + ref;
    check_ladder(download_f32(dc32, m, n), ref32, ref32.cast<float>().cast<double>(), 8.0, 1e-3,
                 "fp8 fp32 acc");
  }
}

// Shape and type rules are decided on the host, before cuBLASLt or CUTLASS is asked: these run everywhere.
TEST_SUITE("gemm") {
  TEST_CASE("fp8 GEMMs in a layout Hopper lacks are refused with a reason") {
    const Gemm g({GemmOp::kForward, 128, 128, 128, GemmType::kE4m3, GemmType::kBf16, false});
    CHECK(g.can_implement().find("fp8") != std::string::npos);
    CHECK(gemm_shape_rules({GemmOp::kDgrad, 128, 128, 120, GemmType::kE4m3, GemmType::kBf16, false}) != "");
    CHECK(gemm_shape_rules({GemmOp::kDgrad, 128, 128, 128, GemmType::kE4m3, GemmType::kBf16, false}) == "");
    // An FP8 weight gradient into its FP32 main gradient: fp32 output, accumulated.
    CHECK(gemm_shape_rules({GemmOp::kDgrad, 128, 128, 128, GemmType::kE4m3, GemmType::kF32, true}) == "");
    CHECK(gemm_shape_rules({GemmOp::kDgrad, 128, 128, 128, GemmType::kE4m3, GemmType::kE4m3, false}) != "");
  }

  TEST_CASE("grouped GEMMs whose rows are not 16-byte multiples are refused with a reason") {
    const GroupedGemm g({ExpertGemmOp::kForward, 4, 100, 256});
    CHECK(g.can_implement().find("multiples of 8") != std::string::npos);
    // FP8: 1-byte values, so 16-value rows; forward and data gradient only.
    const GroupedGemm fp8({ExpertGemmOp::kForward, 4, 200, 256, true});
    CHECK(fp8.can_implement().find("multiples of 16") != std::string::npos);
    const GroupedGemm wgrad({ExpertGemmOp::kWgrad, 4, 256, 256, true});
    CHECK(wgrad.can_implement().find("forward and data gradient only") != std::string::npos);
  }
}

// Grouped expert GEMMs: 5 experts with counts {0, 1, 37, 128, 300} (an empty expert, a single row, rows off
// the 128-row tile, exactly one tile, several tiles with a remainder); in = 200, out = 328 are multiples of 8
// (16-byte rows) but not of the 128 x 256 output tile nor of the 64-deep K tile, and wgrad's reduction over
// m_e rows ends inside a K tile for every non-empty expert but the 128-row one. The row buffers hold 5 rows
// more than the counts use, to check that rows past the last expert are untouched.
namespace {

constexpr int64_t kExpIn = 200, kExpOut = 328, kSpareRows = 5;
const std::vector<int64_t> kCounts = {0, 1, 37, 128, 300};

struct ExpertSetup {
  int64_t rows = 0;  // sum of the counts
  DeviceBuffer<int32_t> counts;
};

ExpertSetup upload_counts(const std::vector<int64_t>& counts) {
  ExpertSetup s;
  s.rows = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  std::vector<int32_t> c(counts.begin(), counts.end());
  s.counts = DeviceBuffer<int32_t>(c.size());
  s.counts.upload(c.data(), c.size());
  return s;
}

// Builds, initialises and runs one grouped GEMM over kCounts, then synchronises.
void run_grouped(ExpertGemmOp op, const GroupedGemmOperands& ops, int64_t in = kExpIn, int64_t out = kExpOut,
                 bool fp8 = false) {
  GroupedGemm g({op, static_cast<int>(kCounts.size()), in, out, fp8});
  REQUIRE_MESSAGE(g.can_implement().empty(), g.can_implement());
  DeviceBuffer<char> ws(g.workspace_size());
  g.initialize(ws.data(), nullptr);
  g.run(ops, nullptr);
  MOERUN_CUDA_CHECK(cudaGetLastError());
  MOERUN_CUDA_CHECK(cudaDeviceSynchronize());
}

// The rows [rows, rows + kSpareRows) of a poisoned output must still be NaN.
void check_untouched_tail(const MatD& got, int64_t rows) {
  int64_t written = 0;
  for (int64_t i = rows; i < got.rows(); ++i)
    for (int64_t j = 0; j < got.cols(); ++j) written += std::isnan(got(i, j)) ? 0 : 1;
  CHECK_MESSAGE(written == 0, "rows past the experts' rows were written");
}

// Each value rounded to e4m3 (unscaled: the inputs lie well inside its range), in row-major order, and the
// matrix of the rounded values.
MatD to_e4m3(const MatD& x, std::vector<__nv_fp8_e4m3>& q) {
  MatD deq(x.rows(), x.cols());
  q.resize(static_cast<size_t>(x.size()));
  for (int64_t i = 0; i < x.rows(); ++i)
    for (int64_t j = 0; j < x.cols(); ++j) {
      const __nv_fp8_e4m3 v(static_cast<float>(x(i, j)));
      q[static_cast<size_t>(i * x.cols() + j)] = v;
      deq(i, j) = static_cast<double>(static_cast<float>(v));
    }
  return deq;
}

DeviceBuffer<__nv_fp8_e4m3> upload_e4m3(const std::vector<__nv_fp8_e4m3>& q) {
  DeviceBuffer<__nv_fp8_e4m3> d(q.size());
  d.upload(q.data(), q.size());
  return d;
}

}  // namespace

TEST_SUITE("gpu") {
  TEST_CASE(
      "FP8 grouped expert GEMM forward (transposed weights) and dgrad match the CPU on e4m3-rounded inputs") {
    MOERUN_SKIP_WITHOUT_DEVICE();
    // in = 208, out = 336: multiples of 16 (16-byte e4m3 rows), of neither the output tile nor the 128-deep
    // K tile. The reference multiplies the rounded values in double; fp8 tolerance as the dense test's.
    constexpr int64_t in = 208, out = 336;
    ExpertSetup s = upload_counts(kCounts);
    const int64_t cap = s.rows + kSpareRows, experts = static_cast<int64_t>(kCounts.size());
    std::vector<__nv_fp8_e4m3> qx, qw, qdy;
    const MatD x = to_e4m3(random_bf16(cap, in, 41) * 4.0, qx);
    const MatD w = to_e4m3(random_bf16(experts * in, out, 42) * 0.5, qw);
    const MatD dy = to_e4m3(random_bf16(cap, out, 43) * 4.0, qdy);
    // The forward reads each expert's weight transposed: wt [E, out, in].
    std::vector<__nv_fp8_e4m3> qwt(qw.size());
    for (int64_t e = 0; e < experts; ++e)
      for (int64_t k = 0; k < in; ++k)
        for (int64_t n = 0; n < out; ++n)
          qwt[static_cast<size_t>((e * out + n) * in + k)] = qw[static_cast<size_t>((e * in + k) * out + n)];
    auto dx = upload_e4m3(qx), dwt = upload_e4m3(qwt), dw = upload_e4m3(qw), d_dy = upload_e4m3(qdy);

    // Runs one op into a poisoned [cap, width] output and checks it against `ref` on the experts' rows.
    auto check = [&](ExpertGemmOp op, const void* a, const void* b, int64_t width, const MatD& ref,
                     const char* what) {
      auto d = nan_bf16(cap, width);
      run_grouped(op, {s.counts.data(), a, b, d.data(), cap}, in, out, true);
      const MatD got = download_bf16(d, cap, width);
      check_ladder(got.topRows(s.rows), ref, round_bf16(ref), 3.0, 1e-3, what);
      check_untouched_tail(got, s.rows);
    };
    check(ExpertGemmOp::kForward, dx.data(), dwt.data(), out,
          executor::cpu::expert_gemm_forward<double>(x.topRows(s.rows), w, kCounts), "fp8 grouped forward");
    check(ExpertGemmOp::kDgrad, d_dy.data(), dw.data(), in,
          executor::cpu::expert_gemm_dgrad<double>(dy.topRows(s.rows), w, kCounts), "fp8 grouped dgrad");
  }

  TEST_CASE("grouped expert GEMM forward matches the CPU expert_gemm_forward, empty experts included") {
    MOERUN_SKIP_WITHOUT_DEVICE();
    ExpertSetup s = upload_counts(kCounts);
    const int64_t cap = s.rows + kSpareRows, experts = static_cast<int64_t>(kCounts.size());
    const MatD x = random_bf16(cap, kExpIn, 21), w = random_bf16(experts * kExpIn, kExpOut, 22);
    auto dx = upload_bf16(x), dw = upload_bf16(w);
    auto dy = nan_bf16(cap, kExpOut);
    run_grouped(ExpertGemmOp::kForward, {s.counts.data(), dx.data(), dw.data(), dy.data(), cap});
    const MatD got = download_bf16(dy, cap, kExpOut);
    const MatD ref = executor::cpu::expert_gemm_forward<double>(x.topRows(s.rows), w, kCounts);
    check_ladder(got.topRows(s.rows), ref, round_bf16(ref), 3.0, 1e-4, "grouped forward");
    check_untouched_tail(got, s.rows);
  }

  TEST_CASE("grouped expert GEMM dgrad matches the CPU expert_gemm_dgrad, empty experts included") {
    MOERUN_SKIP_WITHOUT_DEVICE();
    ExpertSetup s = upload_counts(kCounts);
    const int64_t cap = s.rows + kSpareRows, experts = static_cast<int64_t>(kCounts.size());
    const MatD dy = random_bf16(cap, kExpOut, 23), w = random_bf16(experts * kExpIn, kExpOut, 24);
    auto d_dy = upload_bf16(dy), dw = upload_bf16(w);
    auto dx = nan_bf16(cap, kExpIn);
    run_grouped(ExpertGemmOp::kDgrad, {s.counts.data(), d_dy.data(), dw.data(), dx.data(), cap});
    const MatD got = download_bf16(dx, cap, kExpIn);
    const MatD ref = executor::cpu::expert_gemm_dgrad<double>(dy.topRows(s.rows), w, kCounts);
    check_ladder(got.topRows(s.rows), ref, round_bf16(ref), 3.0, 1e-4, "grouped dgrad");
    check_untouched_tail(got, s.rows);
  }

  TEST_CASE(
      "grouped expert GEMM wgrad accumulates x^T dy per expert into fp32 and leaves empty experts alone") {
    MOERUN_SKIP_WITHOUT_DEVICE();
    ExpertSetup s = upload_counts(kCounts);
    const int64_t cap = s.rows + kSpareRows, experts = static_cast<int64_t>(kCounts.size());
    const MatD x = random_bf16(cap, kExpIn, 25), dy = random_bf16(cap, kExpOut, 26);
    const MatD dw0 = random_bf16(experts * kExpIn, kExpOut, 27);
    auto dx = upload_bf16(x), d_dy = upload_bf16(dy);
    auto dw = upload_f32(dw0);
    run_grouped(ExpertGemmOp::kWgrad, {s.counts.data(), dx.data(), d_dy.data(), dw.data(), cap});
    const MatD got = download_f32(dw, experts * kExpIn, kExpOut);
    MatD ref = dw0;
    executor::cpu::expert_gemm_wgrad<double>(x.topRows(s.rows), dy.topRows(s.rows), kCounts, ref);
    MatF naive = dw0.cast<float>();
    executor::cpu::expert_gemm_wgrad<float>(x.topRows(s.rows).cast<float>(), dy.topRows(s.rows).cast<float>(),
                                            kCounts, naive);
    check_ladder(got, ref, naive.cast<double>(), 8.0, 5e-5, "grouped wgrad");
    // Expert 0 has no rows: its gradient block must be exactly what it was (the float image of dw0).
    const MatD before = dw0.topRows(kExpIn).cast<float>().cast<double>();
    CHECK((got.topRows(kExpIn).array() == before.array()).all());
  }

  TEST_CASE("grouped expert GEMM reruns with new counts on the same workspace without host synchronisation") {
    MOERUN_SKIP_WITHOUT_DEVICE();
    // Two micro-batches with different routing through one initialised GroupedGemm; the counts live only in
    // device memory and are replaced between the runs by an asynchronous copy on the same stream.
    const std::vector<int64_t> counts_a = {300, 0, 128, 37, 1}, counts_b = {5, 200, 0, 0, 261};
    const int64_t rows = 466, experts = 5;  // both sum to 466
    ExpertSetup s = upload_counts(counts_a);
    const MatD x = random_bf16(rows, kExpIn, 31), w = random_bf16(experts * kExpIn, kExpOut, 32);
    auto dx = upload_bf16(x), dw = upload_bf16(w);
    auto y_a = nan_bf16(rows, kExpOut), y_b = nan_bf16(rows, kExpOut);
    GroupedGemm g({ExpertGemmOp::kForward, static_cast<int>(experts), kExpIn, kExpOut});
    REQUIRE_MESSAGE(g.can_implement().empty(), g.can_implement());
    DeviceBuffer<char> ws(g.workspace_size());
    cudaStream_t stream = nullptr;
    MOERUN_CUDA_CHECK(cudaStreamCreate(&stream));
    g.initialize(ws.data(), stream);
    g.run({s.counts.data(), dx.data(), dw.data(), y_a.data(), rows}, stream);
    const std::vector<int32_t> next(counts_b.begin(), counts_b.end());
    MOERUN_CUDA_CHECK(cudaMemcpyAsync(s.counts.data(), next.data(), next.size() * sizeof(int32_t),
                                      cudaMemcpyHostToDevice, stream));
    g.run({s.counts.data(), dx.data(), dw.data(), y_b.data(), rows}, stream);
    MOERUN_CUDA_CHECK(cudaStreamSynchronize(stream));
    MOERUN_CUDA_CHECK(cudaStreamDestroy(stream));
    const MatD ref_a = executor::cpu::expert_gemm_forward<double>(x, w, counts_a);
    const MatD ref_b = executor::cpu::expert_gemm_forward<double>(x, w, counts_b);
    check_ladder(download_bf16(y_a, rows, kExpOut), ref_a, round_bf16(ref_a), 3.0, 1e-4, "first routing");
    check_ladder(download_bf16(y_b, rows, kExpOut), ref_b, round_bf16(ref_b), 3.0, 1e-4, "second routing");
  }
}

}  // namespace moeplan::cuda
