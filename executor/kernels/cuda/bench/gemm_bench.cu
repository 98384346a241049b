// Benchmark of moerun's GEMMs (RESULT lines for executor/cuda/device_check.sh): cuBLASLt bf16 at 8192^3 and
// at an MoE-sized dense shape, cuBLASLt fp8 (per-tensor scales) at 8192^3, and the CUTLASS grouped expert
// GEMM at DeepSeek-V3-like expert shapes (hidden 7168, expert ffn 2048: fc13 is [7168, 2 x 2048], fc2 [2048,
// 7168]; 8 local experts) with 512..4096 tokens per expert, uniform and skewed routing. Each grouped row is
// judged against a single dense cuBLASLt GEMM of the same total rows (issue #6: >= 70% at >= 2048 tokens per
// expert). Every timed kernel's result is checked once first: sampled entries against a CPU dot product
// (dense), the whole output against per-expert cuBLASLt GEMMs (grouped). Last, the FP8 grouped expert GEMM
// (forward with transposed weights, dgrad) at the same shapes, checked against per-expert cuBLASLt FP8 GEMMs
// and judged against the bf16 grouped GEMM of the same op and rows (its speed-up is the ratio).
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "executor/kernels/cuda/bench/bench_util.h"
#include "executor/kernels/cuda/check.h"
#include "executor/kernels/cuda/gemm.h"
#include "executor/kernels/cuda/grouped_gemm.h"

namespace moeplan::cuda {
namespace {

using Bf16 = __nv_bfloat16;
using Fp8 = __nv_fp8_e4m3;

// Uniform in [-1, 1) from a counter hash (splitmix64 finaliser); 24 random bits, so the float is exact and
// the host reproduces the device's inputs bit for bit.
__host__ __device__ inline float hash_unit(uint64_t seed, uint64_t i) {
  uint64_t h = (i + 1) * 0x9E3779B97F4A7C15ull ^ (seed + 1) * 0xD1B54A32D192ED03ull;
  h ^= h >> 31;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 27;
  h *= 0x94D049BB133111EBull;
  h ^= h >> 33;
  return static_cast<float>(h >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

template <class T>
__host__ __device__ inline T make_value(uint64_t seed, uint64_t i) {
  return T(hash_unit(seed, i));
}
template <>
__host__ __device__ inline Bf16 make_value<Bf16>(uint64_t seed, uint64_t i) {
  return __float2bfloat16_rn(hash_unit(seed, i));
}

template <class T>
__global__ void fill_kernel(T* out, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x)
    out[i] = make_value<T>(seed, i);
}

template <class T>
void fill(DeviceBuffer<T>& buf, uint64_t seed) {
  fill_kernel<T><<<1024, 256>>>(buf.data(), buf.size(), seed);
  MOERUN_CUDA_CHECK(cudaGetLastError());
}

__host__ __device__ inline float to_float(Bf16 v) {
  return __bfloat162float(v);
}
__host__ __device__ inline float to_float(float v) {
  return v;
}

// ---- dense -----------------------------------------------------------------------------------------------

constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // Gemm's ceiling (gemm.cu)

// Sampled check of C = op(A) op(B) against a double dot product of the same hashed inputs: each entry within
// 2^-7 |ref| (one bf16 ulp: output rounding and fp32-order differences) plus 2^-8 sqrt(k) scale (entries
// are sums of k products of U(-1, 1) values, standard deviation sqrt(k) / 3 before the fp8 scales, so the
// floor is ~1% of it and still covers fp8's ~14-bit partial accumulation, DeepSeek-V3 report section
// 3.3.2). A wrong kernel errs by the order of the standard deviation.
template <class In>
bool check_dense_samples(const GemmProblem& p, uint64_t seed_a, uint64_t seed_b, const Bf16* c,
                         double scale) {
  bool ok = true;
  for (int s = 0; s < 48; ++s) {
    const int64_t i = (s * 7919) % p.m, j = (s * 104729 + 13) % p.n;
    double ref = 0;
    for (int64_t k = 0; k < p.k; ++k) {
      // Element indices of A(i, k) and B(k, j) in their stored layouts (gemm.h).
      const int64_t ia = p.op == GemmOp::kWgrad ? k * p.m + i : i * p.k + k;
      const int64_t ib = p.op == GemmOp::kDgrad ? j * p.k + k : k * p.n + j;
      const auto a =
          static_cast<double>(static_cast<float>(make_value<In>(seed_a, static_cast<uint64_t>(ia))));
      const auto b =
          static_cast<double>(static_cast<float>(make_value<In>(seed_b, static_cast<uint64_t>(ib))));
      ref += a * b;
    }
    ref *= scale;
    Bf16 got_h;
    MOERUN_CUDA_CHECK(cudaMemcpy(&got_h, c + i * p.n + j, sizeof(Bf16), cudaMemcpyDeviceToHost));
    const double got = to_float(got_h);
    const double tol =
        std::ldexp(std::abs(ref), -7) + std::ldexp(std::sqrt(static_cast<double>(p.k)), -8) * scale;
    if (!(std::abs(got - ref) <= tol)) {
      std::printf("CHECK FAILED: C(%lld, %lld) = %g, reference %g\n", static_cast<long long>(i),
                  static_cast<long long>(j), got, ref);
      ok = false;
    }
  }
  return ok;
}

// Times one dense GEMM on freshly filled operands (after a sampled check when `check`); returns TFLOP/s.
struct DenseRate {
  double ms = 0, tflops = 0;
  bool ok = true;
};

DenseRate time_dense(const GemmProblem& p, DeviceBuffer<char>& ws, bool check) {
  const Gemm g(p);
  if (!g.can_implement().empty()) {
    std::printf("dense GEMM %lldx%lldx%lld not run: %s\n", static_cast<long long>(p.m),
                static_cast<long long>(p.n), static_cast<long long>(p.k), g.can_implement().c_str());
    return {0, 0, false};
  }
  const auto m = static_cast<size_t>(p.m), n = static_cast<size_t>(p.n), k = static_cast<size_t>(p.k);
  DenseRate r;
  GemmOperands ops;
  DeviceBuffer<Bf16> a16, b16;
  DeviceBuffer<Fp8> a8, b8;
  DeviceBuffer<float> a_scale(1), b_scale(1);  // each in its own allocation, as cuBLASLt's samples do
  const float sa = 0.5f, sb = 0.25f;
  a_scale.upload(&sa, 1);
  b_scale.upload(&sb, 1);
  if (p.input == GemmType::kE4m3) {
    a8 = DeviceBuffer<Fp8>(m * k);
    b8 = DeviceBuffer<Fp8>(n * k);
    fill(a8, 11);
    fill(b8, 12);
    ops.a = a8.data();
    ops.b = b8.data();
    ops.a_scale = a_scale.data();
    ops.b_scale = b_scale.data();
  } else {
    a16 = DeviceBuffer<Bf16>(m * k);
    b16 = DeviceBuffer<Bf16>(n * k);
    fill(a16, 11);
    fill(b16, 12);
    ops.a = a16.data();
    ops.b = b16.data();
  }
  const size_t out_bytes = p.output == GemmType::kF32 ? 4 : 2;
  DeviceBuffer<char> c(m * n * out_bytes);
  MOERUN_CUDA_CHECK(cudaMemset(c.data(), 0, c.bytes()));
  ops.c = c.data();
  if (check) {
    g.run(ops, ws.data(), nullptr);
    MOERUN_CUDA_CHECK(cudaGetLastError());
    MOERUN_CUDA_CHECK(cudaDeviceSynchronize());
    const auto* c16 = reinterpret_cast<const Bf16*>(c.data());
    r.ok = p.input == GemmType::kE4m3 ? check_dense_samples<Fp8>(p, 11, 12, c16, 0.5 * 0.25)
                                      : check_dense_samples<Bf16>(p, 11, 12, c16, 1.0);
  }
  r.ms = bench::median_ms([&](cudaStream_t s) { g.run(ops, ws.data(), s); });
  r.tflops = gemm_flops(p) / (r.ms * 1e-3) / 1e12;
  return r;
}

std::string dims(int64_t m, int64_t n, int64_t k) {
  // snprintf rather than string concatenation: g++ 12 at -O3 raises a false -Wrestrict on the latter.
  char buf[96];
  std::snprintf(buf, sizeof buf, "M%lld N%lld K%lld", static_cast<long long>(m), static_cast<long long>(n),
                static_cast<long long>(k));
  return buf;
}

// ---- grouped ---------------------------------------------------------------------------------------------

// Elementwise comparison of two device arrays: counts entries with |got - ref| > rel |ref| + abs or
// non-finite.
template <class T>
__global__ void max_abs_kernel(const T* x, size_t n, unsigned int* max_bits) {
  float m = 0;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x)
    m = fmaxf(m, fabsf(to_float(x[i])));
  atomicMax(max_bits, __float_as_uint(m));  // non-negative floats order like their bit patterns
}

template <class T>
__global__ void mismatch_kernel(const T* got, const T* ref, size_t n, float rel, float abs_tol,
                                unsigned long long* bad) {
  unsigned long long local = 0;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    const float g = to_float(got[i]), r = to_float(ref[i]);
    if (!(fabsf(g - r) <= rel * fabsf(r) + abs_tol)) ++local;  // NaN fails
  }
  if (local) atomicAdd(bad, local);
}

// Number of mismatching entries (tolerance as in check_dense_samples: 2^-7 relative plus 2^-10 max|ref|).
template <class T>
unsigned long long count_mismatches(const T* got, const T* ref, size_t n) {
  DeviceBuffer<unsigned int> max_bits(1);
  DeviceBuffer<unsigned long long> bad(1);
  MOERUN_CUDA_CHECK(cudaMemset(max_bits.data(), 0, sizeof(unsigned int)));
  MOERUN_CUDA_CHECK(cudaMemset(bad.data(), 0, sizeof(unsigned long long)));
  max_abs_kernel<T><<<1024, 256>>>(ref, n, max_bits.data());
  MOERUN_CUDA_CHECK(cudaGetLastError());
  unsigned int bits = 0;
  max_bits.download(&bits, 1);
  float max_ref = 0;
  std::memcpy(&max_ref, &bits, sizeof(float));
  mismatch_kernel<T><<<1024, 256>>>(got, ref, n, 1.0f / 128, max_ref / 1024, bad.data());
  MOERUN_CUDA_CHECK(cudaGetLastError());
  unsigned long long h = 0;
  bad.download(&h, 1);
  return max_ref > 0 ? h : n;  // an all-zero reference would make the check vacuous
}

struct ExpertShape {
  const char* name;
  int64_t in, out;
};

std::vector<int64_t> expert_counts(int64_t per_expert, bool skewed) {
  // Skewed: a hot expert with 2.6x the mean down to a cold one with 0.2x (weights sum to 8).
  const double w[8] = {2.6, 1.6, 1.2, 0.9, 0.7, 0.5, 0.3, 0.2};
  std::vector<int64_t> c(8, per_expert);
  if (skewed) {
    int64_t used = 0;
    for (int e = 0; e < 7; ++e) {
      c[e] = static_cast<int64_t>(std::llround(w[e] * static_cast<double>(per_expert)));
      used += c[e];
    }
    c[7] = 8 * per_expert - used;
  }
  return c;
}

// One grouped op at one routing: check against per-expert cuBLASLt, time, print against the dense rate.
void bench_grouped(ExpertGemmOp op, const ExpertShape& shape, const std::vector<int64_t>& counts, bool skewed,
                   std::map<std::tuple<int, int64_t, int64_t>, double>& dense_rates,
                   DeviceBuffer<char>& ws_dense, bool& all_ok) {
  const int experts = static_cast<int>(counts.size());
  int64_t rows = 0;
  for (int64_t c : counts) rows += c;
  const int64_t in = shape.in, out = shape.out;
  const auto urows = static_cast<size_t>(rows), uin = static_cast<size_t>(in),
             uout = static_cast<size_t>(out);
  const auto uexp = static_cast<size_t>(experts);

  DeviceBuffer<Bf16> x(urows * uin), dy(urows * uout), w(uexp * uin * uout);
  fill(x, 21);
  fill(dy, 22);
  fill(w, 23);
  const bool wgrad = op == ExpertGemmOp::kWgrad;
  const size_t d_elems =
      op == ExpertGemmOp::kForward ? urows * uout : (wgrad ? uexp * uin * uout : urows * uin);
  DeviceBuffer<Bf16> d16(wgrad ? 0 : d_elems), ref16(wgrad ? 0 : d_elems);
  DeviceBuffer<float> d32(wgrad ? d_elems : 0), ref32(wgrad ? d_elems : 0);
  void* d = wgrad ? static_cast<void*>(d32.data()) : static_cast<void*>(d16.data());
  if (wgrad) {
    MOERUN_CUDA_CHECK(cudaMemset(d32.data(), 0, d32.bytes()));
    MOERUN_CUDA_CHECK(cudaMemset(ref32.data(), 0, ref32.bytes()));
  } else {
    MOERUN_CUDA_CHECK(cudaMemset(d16.data(), 0xff, d16.bytes()));  // NaN
  }

  std::vector<int32_t> counts32(counts.begin(), counts.end());
  DeviceBuffer<int32_t> dcounts(uexp);
  dcounts.upload(counts32.data(), uexp);
  const Bf16* a = op == ExpertGemmOp::kDgrad ? dy.data() : x.data();
  const Bf16* b = wgrad ? dy.data() : w.data();
  const GroupedGemmOperands ops{dcounts.data(), a, b, d, rows};

  GroupedGemm g({op, experts, in, out});
  const char* op_name =
      op == ExpertGemmOp::kForward ? "fwd" : (op == ExpertGemmOp::kDgrad ? "dgrad" : "wgrad");
  const std::string label = std::string("grouped_") + op_name;
  std::string shape_str = std::string(shape.name) + " 8x" + std::to_string(rows / experts) +
                          (skewed ? " skewed" : " uniform") + " in" + std::to_string(in) + " out" +
                          std::to_string(out);
  if (const std::string why = g.can_implement(); !why.empty()) {
    std::printf("%s %s not run: %s\n", label.c_str(), shape_str.c_str(), why.c_str());
    all_ok = false;
    return;
  }
  DeviceBuffer<char> ws(g.workspace_size());
  g.initialize(ws.data(), nullptr);
  g.run(ops, nullptr);
  MOERUN_CUDA_CHECK(cudaGetLastError());

  // Per-expert cuBLASLt reference on the same operands.
  int64_t offset = 0;
  for (int e = 0; e < experts; ++e) {
    const int64_t m = counts[static_cast<size_t>(e)];
    if (m > 0) {
      GemmProblem p;
      GemmOperands r;
      const int64_t wo = static_cast<int64_t>(e) * in * out;
      if (op == ExpertGemmOp::kForward) {
        p = {GemmOp::kForward, m, out, in, GemmType::kBf16, GemmType::kBf16, false};
        r = {x.data() + offset * in, w.data() + wo, ref16.data() + offset * out};
      } else if (op == ExpertGemmOp::kDgrad) {
        p = {GemmOp::kDgrad, m, in, out, GemmType::kBf16, GemmType::kBf16, false};
        r = {dy.data() + offset * out, w.data() + wo, ref16.data() + offset * in};
      } else {
        p = {GemmOp::kWgrad, in, out, m, GemmType::kBf16, GemmType::kF32, true};
        r = {x.data() + offset * in, dy.data() + offset * out, ref32.data() + wo};
      }
      const Gemm ref_gemm(p);
      if (!ref_gemm.can_implement().empty()) {
        std::printf("reference GEMM not run: %s\n", ref_gemm.can_implement().c_str());
        all_ok = false;
        return;
      }
      ref_gemm.run(r, ws_dense.data(), nullptr);
      MOERUN_CUDA_CHECK(cudaGetLastError());
    }
    offset += m;
  }
  MOERUN_CUDA_CHECK(cudaDeviceSynchronize());
  const unsigned long long bad = wgrad ? count_mismatches(d32.data(), ref32.data(), d_elems)
                                       : count_mismatches(d16.data(), ref16.data(), d_elems);
  if (bad != 0) {
    std::printf("CHECK FAILED: %s %s: %llu of %zu entries differ from per-expert cuBLASLt\n", label.c_str(),
                shape_str.c_str(), bad, d_elems);
    all_ok = false;
    return;
  }

  const GroupedGemmProblem gp{op, experts, in, out};
  const double ms = bench::median_ms([&](cudaStream_t s) { g.run(ops, s); });
  const double tflops = grouped_gemm_flops(gp, rows) / (ms * 1e-3) / 1e12;

  // The dense reference: one cuBLASLt GEMM of the same total size and op (using expert 0's weight).
  const auto key = std::make_tuple(static_cast<int>(op), rows, in * 100000 + out);
  if (!dense_rates.count(key)) {
    GemmProblem p;
    if (op == ExpertGemmOp::kForward)
      p = {GemmOp::kForward, rows, out, in, GemmType::kBf16, GemmType::kBf16, false};
    if (op == ExpertGemmOp::kDgrad)
      p = {GemmOp::kDgrad, rows, in, out, GemmType::kBf16, GemmType::kBf16, false};
    if (wgrad) p = {GemmOp::kWgrad, in, out, rows, GemmType::kBf16, GemmType::kF32, true};
    const DenseRate dr = time_dense(p, ws_dense, false);
    dense_rates[key] = dr.tflops;
    bench::print_result("gemm", std::string("cublaslt_dense_") + op_name, dims(p.m, p.n, p.k), dr.ms,
                        dr.tflops, dr.tflops, "TFLOP/s", 0);
  }
  const double target = rows / experts >= 2048 ? 0.70 : 0;
  bench::print_result("gemm", label, shape_str, ms, tflops, dense_rates[key], "TFLOP/s", target);
}

// The FP8 grouped GEMM (e4m3 A and B, unscaled; bf16 D) of one op, uniform routing: checked against
// per-expert cuBLASLt FP8 GEMMs (TN, unit scales) on the same operands, timed, printed against the bf16
// grouped GEMM of the same op and rows timed here.
void bench_grouped_fp8(ExpertGemmOp op, const ExpertShape& shape, int64_t per_expert, bool& all_ok) {
  constexpr int experts = 8;
  const int64_t rows = per_expert * experts, in = shape.in, out = shape.out;
  const bool fwd = op == ExpertGemmOp::kForward;
  const int64_t depth = fwd ? in : out, width = fwd ? out : in;  // A [rows, depth], D [rows, width]
  const auto urows = static_cast<size_t>(rows), uw = static_cast<size_t>(experts * in * out);
  DeviceBuffer<Fp8> a8(urows * static_cast<size_t>(depth)), b8(uw);
  DeviceBuffer<Bf16> a16(a8.size()), b16(uw);
  fill(a8, 31);
  fill(b8, 32);
  fill(a16, 31);
  fill(b16, 32);
  DeviceBuffer<Bf16> d(urows * static_cast<size_t>(width)), ref(d.size());
  MOERUN_CUDA_CHECK(cudaMemset(d.data(), 0xff, d.bytes()));  // NaN
  const std::vector<int32_t> counts32(experts, static_cast<int32_t>(per_expert));
  DeviceBuffer<int32_t> dcounts(experts);
  dcounts.upload(counts32.data(), experts);
  const char* op_name = fwd ? "fwd" : "dgrad";
  const std::string label = std::string("grouped_fp8_") + op_name;
  const std::string shape_str = std::string(shape.name) + " 8x" + std::to_string(per_expert) + " uniform in" +
                                std::to_string(in) + " out" + std::to_string(out);
  GroupedGemm g({op, experts, in, out, true}), g16({op, experts, in, out});
  for (const GroupedGemm* k : {&g, &g16}) {
    if (const std::string why = k->can_implement(); !why.empty()) {
      std::printf("%s %s not run: %s\n", label.c_str(), shape_str.c_str(), why.c_str());
      all_ok = false;
      return;
    }
  }
  DeviceBuffer<char> ws(g.workspace_size()), ws16(g16.workspace_size());
  g.initialize(ws.data(), nullptr);
  g16.initialize(ws16.data(), nullptr);
  const GroupedGemmOperands ops{dcounts.data(), a8.data(), b8.data(), d.data(), rows};
  g.run(ops, nullptr);
  MOERUN_CUDA_CHECK(cudaGetLastError());
  // Reference: expert e's C [m, width] = A_e [m, depth] B_e^T with B_e [width, depth] at b + e in out (the
  // forward's transposed weight, or dgrad's weight as it lies), cuBLASLt's FP8 TN GEMM with unit scales.
  DeviceBuffer<float> one(1);
  const float unit = 1.0f;
  one.upload(&unit, 1);
  DeviceBuffer<char> ws_ref(kWorkspaceBytes);
  const Gemm ref_gemm({GemmOp::kDgrad, per_expert, width, depth, GemmType::kE4m3, GemmType::kBf16, false});
  if (!ref_gemm.can_implement().empty()) {
    std::printf("reference FP8 GEMM not run: %s\n", ref_gemm.can_implement().c_str());
    all_ok = false;
    return;
  }
  for (int e = 0; e < experts; ++e) {
    const int64_t off = e * per_expert;
    ref_gemm.run({a8.data() + off * depth, b8.data() + static_cast<int64_t>(e) * in * out,
                  ref.data() + off * width, one.data(), one.data()},
                 ws_ref.data(), nullptr);
  }
  MOERUN_CUDA_CHECK(cudaDeviceSynchronize());
  if (const unsigned long long bad = count_mismatches(d.data(), ref.data(), d.size()); bad != 0) {
    std::printf("CHECK FAILED: %s %s: %llu of %zu entries differ from per-expert cuBLASLt FP8\n",
                label.c_str(), shape_str.c_str(), bad, d.size());
    all_ok = false;
    return;
  }
  const GroupedGemmProblem gp{op, experts, in, out, true};
  const double ms = bench::median_ms([&](cudaStream_t s) { g.run(ops, s); });
  const GroupedGemmOperands ops16{dcounts.data(), a16.data(), b16.data(), d.data(), rows};
  const double ms16 = bench::median_ms([&](cudaStream_t s) { g16.run(ops16, s); });
  const double flops = grouped_gemm_flops(gp, rows);
  bench::print_result("gemm", label, shape_str, ms, flops / (ms * 1e-3) / 1e12, flops / (ms16 * 1e-3) / 1e12,
                      "TFLOP/s", 0);
}

}  // namespace
}  // namespace moeplan::cuda

int main() {
  using namespace moeplan::cuda;
  if (const std::string why = device_unavailable(); !why.empty()) {
    std::printf("skipped: no CUDA device (%s)\n", why.c_str());
    return 0;
  }
  bool all_ok = true;
  DeviceBuffer<char> ws(kWorkspaceBytes);

  // Dense bf16 at 8192^3: the reference rate of every bf16 dense row.
  const GemmProblem square{GemmOp::kForward, 8192, 8192, 8192, GemmType::kBf16, GemmType::kBf16, false};
  const DenseRate sq = time_dense(square, ws, true);
  all_ok &= sq.ok;
  bench::print_result("gemm", "cublaslt_bf16_fwd", dims(8192, 8192, 8192), sq.ms, sq.tflops, sq.tflops,
                      "TFLOP/s", 0);

  // Dense bf16 at an MoE-sized layer: 16384 tokens, hidden 7168, 4096 outputs, in the three training layouts.
  const GemmProblem moe_shapes[3] = {
      {GemmOp::kForward, 16384, 4096, 7168, GemmType::kBf16, GemmType::kBf16, false},
      {GemmOp::kDgrad, 16384, 7168, 4096, GemmType::kBf16, GemmType::kBf16, false},
      {GemmOp::kWgrad, 7168, 4096, 16384, GemmType::kBf16, GemmType::kF32, true},
  };
  const char* moe_names[3] = {"cublaslt_bf16_fwd", "cublaslt_bf16_dgrad", "cublaslt_bf16_wgrad_f32acc"};
  for (int i = 0; i < 3; ++i) {
    // The fp32-output wgrad is checked through the grouped wgrad's per-expert comparison instead.
    const DenseRate r = time_dense(moe_shapes[i], ws, moe_shapes[i].output == GemmType::kBf16);
    all_ok &= r.ok;
    bench::print_result("gemm", moe_names[i], dims(moe_shapes[i].m, moe_shapes[i].n, moe_shapes[i].k), r.ms,
                        r.tflops, sq.tflops, "TFLOP/s", 0);
  }

  // Grouped expert GEMMs at DeepSeek-V3-like shapes.
  std::map<std::tuple<int, int64_t, int64_t>, double> dense_rates;
  const ExpertShape shapes[2] = {{"fc13", 7168, 4096}, {"fc2", 2048, 7168}};
  for (const ExpertShape& shape : shapes)
    for (int64_t per_expert : {512, 1024, 2048, 4096})
      for (bool skewed : {false, true})
        for (ExpertGemmOp op : {ExpertGemmOp::kForward, ExpertGemmOp::kDgrad, ExpertGemmOp::kWgrad})
          bench_grouped(op, shape, expert_counts(per_expert, skewed), skewed, dense_rates, ws, all_ok);

  // FP8 e4m3 with per-tensor scales at 8192^3 (the TN layout), its own reference; last, so that a failure
  // here cannot hide the grouped rows.
  const GemmProblem fp8{GemmOp::kDgrad, 8192, 8192, 8192, GemmType::kE4m3, GemmType::kBf16, false};
  const DenseRate f8 = time_dense(fp8, ws, true);
  all_ok &= f8.ok;
  bench::print_result("gemm", "cublaslt_fp8_tn", dims(8192, 8192, 8192), f8.ms, f8.tflops, f8.tflops,
                      "TFLOP/s", 0);

  // FP8 grouped expert GEMMs, against the bf16 grouped GEMM of the same op and rows.
  for (const ExpertShape& shape : shapes)
    for (int64_t per_expert : {1024, 4096})
      for (ExpertGemmOp op : {ExpertGemmOp::kForward, ExpertGemmOp::kDgrad})
        bench_grouped_fp8(op, shape, per_expert, all_ok);

  if (!all_ok) {
    std::printf("gemm bench: some results FAILED their checks (see CHECK FAILED lines)\n");
    return 1;
  }
  return 0;
}
