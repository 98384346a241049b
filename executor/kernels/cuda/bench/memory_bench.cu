// Bandwidth of moerun's memory-bound CUDA kernels at MoE shapes (DeepSeek-V3-like: hidden 7168, 256 experts
// top-8, expert ffn 2048, vocab 129280), against the device's achieved copy bandwidth; issue 6's target is
// 70%. Rates count the fewest bytes each kernel must read and write. Every timed kernel's output is first
// checked against the CPU kernels on a slice; a failed check is reported and makes the program exit 1.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "executor/comm/wire_format.h"
#include "executor/kernels/cpu/adam.h"
#include "executor/kernels/cpu/moe.h"
#include "executor/kernels/cpu/norm.h"
#include "executor/kernels/cpu/rope.h"
#include "executor/kernels/cpu/swiglu.h"
#include "executor/kernels/cpu/vocab.h"
#include "executor/kernels/cuda/adam.h"
#include "executor/kernels/cuda/bench/bench_util.h"
#include "executor/kernels/cuda/check.h"
#include "executor/kernels/cuda/cross_entropy.h"
#include "executor/kernels/cuda/fp8.h"
#include "executor/kernels/cuda/norm.h"
#include "executor/kernels/cuda/permute.h"
#include "executor/kernels/cuda/rope.h"
#include "executor/kernels/cuda/router.h"
#include "executor/kernels/cuda/swiglu.h"

namespace moeplan::cuda {
namespace {

namespace cpu = moeplan::executor::cpu;
using MatF = cpu::Mat<float>;
using Bf16 = __nv_bfloat16;

// ---- data ----

__device__ uint32_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return static_cast<uint32_t>(x);
}

// Uniform in [-amp, amp), from a hash of (seed, index).
__global__ void fill_kernel(Bf16* p, int64_t n, uint64_t seed, float amp) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    p[i] = __float2bfloat16(
        amp * (static_cast<float>(mix(seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(i))) *
                   2.3283064e-10f * 2.0f -
               1.0f));
}
__global__ void fill_kernel(float* p, int64_t n, uint64_t seed, float amp) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    p[i] = amp * (static_cast<float>(mix(seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(i))) *
                      2.3283064e-10f * 2.0f -
                  1.0f);
}

// Values rounded to multiples of step: logits without near-ties (distinct ones differ by at least step), so
// that the GPU's and the CPU's top-k agree exactly; exact ties go to the lower index on both.
__global__ void snap_kernel(float* p, int64_t n, float step) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    p[i] = rintf(p[i] / step) * step;
}

template <class T>
DeviceBuffer<T> random_buffer(size_t n, uint64_t seed, float amp = 1.0f) {
  DeviceBuffer<T> b(n);
  fill_kernel<<<4096, 256>>>(b.data(), static_cast<int64_t>(n), seed, amp);
  MOERUN_CUDA_CHECK(cudaGetLastError());
  return b;
}

// Elements [first, first + n) of a device tensor, as floats.
std::vector<float> fetch(const Bf16* p, int64_t first, int64_t n) {
  std::vector<uint16_t> h(static_cast<size_t>(n));
  MOERUN_CUDA_CHECK(cudaMemcpy(h.data(), p + first, h.size() * 2, cudaMemcpyDeviceToHost));
  std::vector<float> v(h.size());
  for (size_t i = 0; i < h.size(); ++i) v[i] = executor::float_from_bf16(h[i]);
  return v;
}
template <class T>
std::vector<T> fetch(const T* p, int64_t first, int64_t n) {
  std::vector<T> v(static_cast<size_t>(n));
  MOERUN_CUDA_CHECK(cudaMemcpy(v.data(), p + first, v.size() * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}

MatF as_mat(const std::vector<float>& v, int64_t rows, int64_t cols) {
  return Eigen::Map<const MatF>(v.data(), rows, cols);
}

// ---- checks ----

int g_failed = 0;

// |got - ref| <= rel |ref| + floor max|ref| for every element (NaN fails). bf16 outputs: rel 2^-8 (twice half
// an ulp), floor 2^-15; fp32 outputs: 1e-4 (the reference runs in fp32 too).
void check(const std::string& what, const std::vector<float>& got, const float* ref, size_t n, double rel,
           double floor) {
  double max_ref = 0;
  for (size_t i = 0; i < n; ++i) max_ref = std::max(max_ref, std::fabs(static_cast<double>(ref[i])));
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - static_cast<double>(ref[i]));
    if (!(err <= rel * std::fabs(static_cast<double>(ref[i])) + floor * max_ref) && ++bad <= 3)
      std::printf("  %s[%zu]: got %.7g, reference %.7g\n", what.c_str(), i, static_cast<double>(got[i]),
                  static_cast<double>(ref[i]));
  }
  if (got.size() != n) bad = std::max<size_t>(bad, 1);
  std::printf("check %s: %s (%zu values)\n", what.c_str(), bad == 0 ? "ok" : "FAILED", n);
  g_failed += bad == 0 ? 0 : 1;
}
void check_bf16(const std::string& what, const std::vector<float>& got, const MatF& ref) {
  check(what, got, ref.data(), static_cast<size_t>(ref.size()), 1.0 / 256, 1.0 / 32768);
}
void check_fp32(const std::string& what, const std::vector<float>& got, const float* ref, size_t n) {
  check(what, got, ref, n, 1e-4, 1e-4);
}
void check_true(const std::string& what, bool ok) {
  std::printf("check %s: %s\n", what.c_str(), ok ? "ok" : "FAILED");
  g_failed += ok ? 0 : 1;
}

// ---- timing ----

double g_copy_gbs = 0;

void report(const std::string& kernel, const std::string& shape, double bytes,
            const std::function<void()>& fn, double target = 0.70) {
  const double ms = bench::median_ms([&](cudaStream_t) { fn(); });
  bench::print_result("memory", kernel, shape, ms, bytes / (ms * 1e-3) / 1e9, g_copy_gbs, "GB/s", target);
}

constexpr int64_t kCheckRows = 8;  // rows of each output checked against the CPU

void bench_norm() {
  const int64_t t = 16384, h = 7168;
  const size_t n = static_cast<size_t>(t * h);
  auto x = random_buffer<Bf16>(n, 1, 2.0f), dy = random_buffer<Bf16>(n, 2),
       gamma = random_buffer<Bf16>(static_cast<size_t>(h), 3);
  DeviceBuffer<Bf16> y(n), dx(n);
  DeviceBuffer<float> inv_rms(static_cast<size_t>(t)), dgamma(static_cast<size_t>(h));
  DeviceBuffer<char> ws(rmsnorm_backward_workspace_bytes(t, h));
  MOERUN_CUDA_CHECK(cudaMemset(dgamma.data(), 0, dgamma.bytes()));
  rmsnorm_forward(x.data(), gamma.data(), y.data(), inv_rms.data(), t, h, 1e-6f, nullptr);
  rmsnorm_backward(x.data(), gamma.data(), inv_rms.data(), dy.data(), dx.data(), dgamma.data(), ws.data(), t,
                   h, nullptr);
  const auto xs = fetch(x.data(), 0, kCheckRows * h), dys = fetch(dy.data(), 0, kCheckRows * h);
  const MatF g = as_mat(fetch(gamma.data(), 0, h), 1, h);
  const auto ref = cpu::rmsnorm_forward<float>(as_mat(xs, kCheckRows, h), g, 1e-6);
  MatF dg = MatF::Zero(1, h);
  const MatF dx_ref =
      cpu::rmsnorm_backward<float>(as_mat(xs, kCheckRows, h), g, ref.inv_rms, as_mat(dys, kCheckRows, h), dg);
  check_bf16("rmsnorm y", fetch(y.data(), 0, kCheckRows * h), ref.y);
  check_fp32("rmsnorm inv_rms", fetch(inv_rms.data(), 0, kCheckRows), ref.inv_rms.data(), kCheckRows);
  check_bf16("rmsnorm dx", fetch(dx.data(), 0, kCheckRows * h), dx_ref);
  {  // dgamma over all rows, in double on the host
    const auto xa = fetch(x.data(), 0, t * h), dya = fetch(dy.data(), 0, t * h);
    const auto r = fetch(inv_rms.data(), 0, t);
    std::vector<double> acc(static_cast<size_t>(h), 0.0);
    for (int64_t i = 0; i < t; ++i)
      for (int64_t j = 0; j < h; ++j) {
        const size_t k = static_cast<size_t>(i * h + j);
        acc[static_cast<size_t>(j)] += static_cast<double>(dya[k]) * xa[k] * r[static_cast<size_t>(i)];
      }
    std::vector<float> accf(acc.begin(), acc.end());
    check_fp32("rmsnorm dgamma (all rows)", fetch(dgamma.data(), 0, h), accf.data(), static_cast<size_t>(h));
  }
  const std::string shape = "16384 x 7168";
  report("rmsnorm fwd", shape, 4.0 * t * h + 4.0 * t + 2.0 * h,
         [&] { rmsnorm_forward(x.data(), gamma.data(), y.data(), inv_rms.data(), t, h, 1e-6f, nullptr); });
  report("rmsnorm bwd", shape, 6.0 * t * h + 4.0 * t + 6.0 * h, [&] {
    rmsnorm_backward(x.data(), gamma.data(), inv_rms.data(), dy.data(), dx.data(), dgamma.data(), ws.data(),
                     t, h, nullptr);
  });
}

void bench_swiglu() {
  const int64_t t = 16384, f = 2048;
  auto in = random_buffer<Bf16>(static_cast<size_t>(t * 2 * f), 4, 3.0f);
  auto dy = random_buffer<Bf16>(static_cast<size_t>(t * f), 5);
  DeviceBuffer<Bf16> out(static_cast<size_t>(t * f)), din(static_cast<size_t>(t * 2 * f));
  swiglu_forward(in.data(), out.data(), t, f, nullptr);
  swiglu_backward(in.data(), dy.data(), din.data(), t, f, nullptr);
  const MatF ins = as_mat(fetch(in.data(), 0, kCheckRows * 2 * f), kCheckRows, 2 * f);
  const MatF dys = as_mat(fetch(dy.data(), 0, kCheckRows * f), kCheckRows, f);
  check_bf16("swiglu y", fetch(out.data(), 0, kCheckRows * f), cpu::swiglu_forward<float>(ins));
  check_bf16("swiglu din", fetch(din.data(), 0, kCheckRows * 2 * f), cpu::swiglu_backward<float>(ins, dys));
  const std::string shape = "16384 x 2*2048";
  report("swiglu fwd", shape, 6.0 * t * f, [&] { swiglu_forward(in.data(), out.data(), t, f, nullptr); });
  report("swiglu bwd", shape, 10.0 * t * f,
         [&] { swiglu_backward(in.data(), dy.data(), din.data(), t, f, nullptr); });
}

void bench_rope() {
  const int64_t t = 16384, heads = 128, d = 64, w = heads * d;
  auto x = random_buffer<Bf16>(static_cast<size_t>(t * w), 6);
  std::vector<int64_t> pos_h(static_cast<size_t>(t));
  for (int64_t i = 0; i < t; ++i) pos_h[static_cast<size_t>(i)] = i % 4096;  // 4 sequences of 4096
  DeviceBuffer<int64_t> pos(pos_h.size());
  pos.upload(pos_h.data(), pos_h.size());
  const std::vector<int64_t> check_pos = {0, 1, 2, 3, 4095, 4096, 4097, 16383};  // rows checked
  std::vector<float> before;
  for (const int64_t r : check_pos) {
    const auto v = fetch(x.data(), r * w, w);
    before.insert(before.end(), v.begin(), v.end());
  }
  rope_forward(x.data(), pos.data(), t, heads, d, w, kRopeTheta, nullptr);
  MatF ref = as_mat(before, static_cast<int64_t>(check_pos.size()), w);
  std::vector<int64_t> p;
  std::vector<float> got;
  for (const int64_t r : check_pos) {
    p.push_back(pos_h[static_cast<size_t>(r)]);
    const auto v = fetch(x.data(), r * w, w);
    got.insert(got.end(), v.begin(), v.end());
  }
  cpu::rope_forward<float>(ref, p, d);
  check_bf16("rope fwd", got, ref);
  const std::string shape = "16384 x 128 heads x 64";
  // The timed runs rotate x again and again in place; rotations keep its norms, so the data stays bounded.
  report("rope fwd", shape, 4.0 * t * w + 8.0 * t,
         [&] { rope_forward(x.data(), pos.data(), t, heads, d, w, kRopeTheta, nullptr); });
  report("rope bwd", shape, 4.0 * t * w + 8.0 * t,
         [&] { rope_backward(x.data(), pos.data(), t, heads, d, w, kRopeTheta, nullptr); });
}

void bench_router() {
  const int64_t t = 16384, e = 256, k = 8;
  const size_t te = static_cast<size_t>(t * e), tk = static_cast<size_t>(t * k);
  auto logits = random_buffer<float>(te, 7, 4.0f);
  snap_kernel<<<4096, 256>>>(logits.data(), static_cast<int64_t>(te), 0.125f);
  MOERUN_CUDA_CHECK(cudaGetLastError());
  auto dgates = random_buffer<float>(tk, 8);
  DeviceBuffer<float> probs(te), gates(tk), prob_sums(static_cast<size_t>(e)), dlogits(te);
  DeviceBuffer<int32_t> experts(tk), counts(static_cast<size_t>(e));
  DeviceBuffer<char> ws(router_forward_workspace_bytes(t, e));
  auto fwd = [&] {
    router_forward(logits.data(), t, e, k, true, probs.data(), experts.data(), gates.data(), counts.data(),
                   prob_sums.data(), ws.data(), nullptr);
  };
  auto bwd = [&] {
    router_backward(probs.data(), experts.data(), gates.data(), dgates.data(), nullptr, t, e, k, true,
                    dlogits.data(), nullptr);
  };
  fwd();
  bwd();
  const int64_t rows = 64;
  const auto route = cpu::router_forward<float>(as_mat(fetch(logits.data(), 0, rows * e), rows, e), k);
  const auto got_e = fetch(experts.data(), 0, rows * k);
  check_true("router top-k experts", std::equal(got_e.begin(), got_e.end(), route.experts.begin()));
  check_fp32("router gates", fetch(gates.data(), 0, rows * k), route.gates.data(),
             static_cast<size_t>(rows * k));
  const auto c = fetch(counts.data(), 0, e);
  check_true("router counts sum to tokens * k", std::accumulate(c.begin(), c.end(), int64_t{0}) == t * k);
  const MatF dl_ref = cpu::router_backward<float>(route, as_mat(fetch(dgates.data(), 0, rows * k), rows, k),
                                                  cpu::Vec<float>());
  check_fp32("router dlogits", fetch(dlogits.data(), 0, rows * e), dl_ref.data(),
             static_cast<size_t>(rows * e));
  const std::string shape = "16384 x 256 experts, top-8";
  report("router fwd", shape, 8.0 * t * e + 8.0 * t * k, fwd);
  report("router bwd", shape, 8.0 * t * e + 12.0 * t * k, bwd);
}

void bench_permute() {
  const int64_t t = 16384, k = 8, e = 256, h = 7168, rows = t * k;
  const size_t th = static_cast<size_t>(t * h), rh = static_cast<size_t>(rows * h);
  // Top-8 of a random router: distinct experts per token.
  std::vector<int32_t> ids(static_cast<size_t>(rows));
  uint64_t s = 12345;
  for (int64_t i = 0; i < t; ++i) {
    for (int64_t j = 0; j < k;) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      const auto ex = static_cast<int32_t>((s >> 33) % static_cast<uint64_t>(e));
      const auto first = ids.begin() + i * k;
      if (std::find(first, first + j, ex) == first + j) ids[static_cast<size_t>(i * k + j++)] = ex;
    }
  }
  DeviceBuffer<int32_t> dids(ids.size()), counts(static_cast<size_t>(e)), offsets(static_cast<size_t>(e + 1)),
      slot_row(ids.size()), row_slot(ids.size());
  dids.upload(ids.data(), ids.size());
  DeviceBuffer<char> ws(permute_map_workspace_bytes(t, k, e));
  auto map = [&] {
    build_permute_map(dids.data(), t, k, e, counts.data(), offsets.data(), slot_row.data(), row_slot.data(),
                      ws.data(), nullptr);
  };
  map();
  {
    const std::vector<int64_t> ids64(ids.begin(), ids.end());
    const auto idx = cpu::make_permute_index(ids64, t, k, e);
    const auto sr = fetch(slot_row.data(), 0, rows);
    const auto o = fetch(offsets.data(), 0, e + 1);
    check_true("permute map (all slots)", std::equal(sr.begin(), sr.end(), idx.slot_row.begin()) &&
                                              std::equal(o.begin(), o.end(), idx.offsets.begin()));
  }
  auto x = random_buffer<Bf16>(th, 9), yp = random_buffer<Bf16>(rh, 10), dy = random_buffer<Bf16>(th, 11);
  auto gates = random_buffer<float>(static_cast<size_t>(rows), 12, 0.25f);
  DeviceBuffer<Bf16> xp(rh), out(th), dyp(rh), dx(th);
  DeviceBuffer<float> dgates(static_cast<size_t>(rows));
  auto perm = [&] { permute_forward(x.data(), row_slot.data(), xp.data(), t, k, h, nullptr); };
  auto perm_bwd = [&] { permute_backward(yp.data(), slot_row.data(), dx.data(), t, k, h, nullptr); };
  auto unperm = [&] {
    unpermute_forward(yp.data(), slot_row.data(), gates.data(), out.data(), t, k, h, false, nullptr);
  };
  auto unperm_bwd = [&] {
    unpermute_backward(dy.data(), yp.data(), slot_row.data(), gates.data(), dyp.data(), dgates.data(), t, k,
                       h, nullptr);
  };
  perm();
  perm_bwd();
  unperm();
  unperm_bwd();
  {
    // Tokens 0..7 in double on the host from their rows.
    const auto sr = fetch(slot_row.data(), 0, kCheckRows * k);
    const auto g = fetch(gates.data(), 0, kCheckRows * k);
    const auto xs = fetch(x.data(), 0, kCheckRows * h), dys = fetch(dy.data(), 0, kCheckRows * h);
    MatF xp_ref(kCheckRows * k, h), dx_ref = MatF::Zero(kCheckRows, h), out_ref = MatF::Zero(kCheckRows, h),
                                    dyp_ref(kCheckRows * k, h);
    std::vector<float> xp_got, dyp_got, dg_ref(static_cast<size_t>(kCheckRows * k));
    for (int64_t i = 0; i < kCheckRows; ++i) {
      for (int64_t j = 0; j < k; ++j) {
        const size_t slot = static_cast<size_t>(i * k + j);
        const int64_t r = sr[slot];
        const auto y = fetch(yp.data(), r * h, h);
        const auto xpr = fetch(xp.data(), r * h, h), dypr = fetch(dyp.data(), r * h, h);
        xp_got.insert(xp_got.end(), xpr.begin(), xpr.end());
        dyp_got.insert(dyp_got.end(), dypr.begin(), dypr.end());
        double dot = 0;
        for (int64_t c = 0; c < h; ++c) {
          const size_t tc = static_cast<size_t>(i * h + c);
          xp_ref(static_cast<int64_t>(slot), c) = xs[tc];
          dx_ref(i, c) += y[static_cast<size_t>(c)];
          out_ref(i, c) += g[slot] * y[static_cast<size_t>(c)];
          dyp_ref(static_cast<int64_t>(slot), c) = g[slot] * dys[tc];
          dot += static_cast<double>(dys[tc]) * y[static_cast<size_t>(c)];
        }
        dg_ref[slot] = static_cast<float>(dot);
      }
    }
    check_true("permute fwd (bit-exact rows)", std::equal(xp_got.begin(), xp_got.end(), xp_ref.data()));
    check_bf16("permute bwd", fetch(dx.data(), 0, kCheckRows * h), dx_ref);
    check_bf16("unpermute fwd", fetch(out.data(), 0, kCheckRows * h), out_ref);
    check_bf16("unpermute bwd dyp", dyp_got, dyp_ref);
    check_fp32("unpermute bwd dgates", fetch(dgates.data(), 0, kCheckRows * k), dg_ref.data(), dg_ref.size());
  }
  const std::string shape = "16384 tokens x 7168, top-8 of 256";
  report("permute map", "16384 x top-8 of 256", 4.0 * rows * 3 + 8.0 * e, map, 0);
  report("permute fwd", shape, 2.0 * (th + rh), perm);
  report("permute bwd", shape, 2.0 * (th + rh), perm_bwd);
  report("unpermute fwd", shape, 2.0 * (th + rh) + 8.0 * rows, unperm);
  report("unpermute bwd", shape, 2.0 * (th + 2 * rh) + 12.0 * rows, unperm_bwd);
}

void bench_fp8() {
  const int64_t t = 16384, h = 7168;
  const size_t n = static_cast<size_t>(t * h);
  auto x = random_buffer<Bf16>(n, 13, 5.0f);
  DeviceBuffer<uint8_t> q(n);
  DeviceBuffer<float> scales(n / kFp8BlockElems);
  DeviceBuffer<Bf16> y(n);
  auto* q8 = reinterpret_cast<__nv_fp8_e4m3*>(q.data());
  const auto xs = fetch(x.data(), 0, kCheckRows * h);
  for (const int64_t group : {h, kFp8BlockElems}) {
    const std::string kind = group == h ? "rowwise" : "1x128";
    auto quant = [&] {
      if (group == h) {
        fp8_quantize_rowwise(x.data(), q8, scales.data(), t, h, nullptr);
      } else {
        fp8_quantize_blockwise(x.data(), q8, scales.data(), t, h, nullptr);
      }
    };
    auto dequant = [&] { fp8_dequantize(q8, scales.data(), y.data(), t, h, group, nullptr); };
    quant();
    dequant();
    const int64_t groups = kCheckRows * h / group;
    const auto sc = fetch(scales.data(), 0, groups);
    const auto qs = fetch(q.data(), 0, kCheckRows * h);
    const auto ys = fetch(y.data(), 0, kCheckRows * h);
    bool bytes_ok = true, bound_ok = true;
    for (int64_t g = 0; g < groups; ++g) {
      const std::span<const float> block(xs.data() + g * group, static_cast<size_t>(group));
      const float s = executor::e4m3_block_scale(block);
      bytes_ok = bytes_ok && sc[static_cast<size_t>(g)] == s;
      for (int64_t i = 0; i < group; ++i) {
        const size_t at = static_cast<size_t>(g * group + i);
        bytes_ok = bytes_ok && qs[at] == executor::e4m3_from_float(xs[at] / s);
        const double xv = std::fabs(static_cast<double>(xs[at]));
        const double e8 = std::max(xv / 16, static_cast<double>(s) / 1024);
        bound_ok =
            bound_ok && std::fabs(static_cast<double>(ys[at] - xs[at])) <= e8 + (xv + e8) / 512 + 1e-6 * xv;
      }
    }
    check_true("fp8 " + kind + " quantize (bytes and scales equal the CPU wire format)", bytes_ok);
    check_true("fp8 " + kind + " dequantize (within the e4m3 bound)", bound_ok);
    const std::string shape = "16384 x 7168";
    const double scale_bytes = 4.0 * static_cast<double>(n) / static_cast<double>(group);
    report("fp8 quantize " + kind, shape, 3.0 * static_cast<double>(n) + scale_bytes, quant);
    report("fp8 dequantize " + kind, shape, 3.0 * static_cast<double>(n) + scale_bytes, dequant);
  }
}

void bench_cross_entropy() {
  const int64_t t = 8192, v = 129280;
  const size_t n = static_cast<size_t>(t * v);
  auto logits = random_buffer<Bf16>(n, 14, 8.0f);
  std::vector<int64_t> tg(static_cast<size_t>(t));
  for (int64_t i = 0; i < t; ++i) tg[static_cast<size_t>(i)] = (i * 7919) % v;
  DeviceBuffer<int64_t> targets(tg.size());
  targets.upload(tg.data(), tg.size());
  DeviceBuffer<float> lse(static_cast<size_t>(t)), tl(static_cast<size_t>(t)), loss(static_cast<size_t>(t));
  DeviceBuffer<Bf16> dlogits(n);
  const float scale = 1.0f / static_cast<float>(t);
  auto fwd = [&] {
    cross_entropy_forward(logits.data(), targets.data(), t, v, 0, lse.data(), tl.data(), loss.data(),
                          nullptr);
  };
  auto bwd = [&] {
    cross_entropy_backward(logits.data(), targets.data(), t, v, 0, lse.data(), scale, dlogits.data(),
                           nullptr);
  };
  fwd();
  bwd();
  const int64_t rows = 4;
  const MatF l = as_mat(fetch(logits.data(), 0, rows * v), rows, v);
  const std::span<const int64_t> tr(tg.data(), static_cast<size_t>(rows));
  const auto m = cpu::loss_local_max<float>(l);
  const auto st = cpu::loss_local_stats<float>(l, tr, 0, m);
  const auto loss_ref = cpu::loss_per_token<float>(m, st);
  check_fp32("cross-entropy loss", fetch(loss.data(), 0, rows), loss_ref.data(), static_cast<size_t>(rows));
  check_bf16("cross-entropy dlogits", fetch(dlogits.data(), 0, rows * v),
             cpu::loss_backward<float>(l, tr, 0, m, st.sum_exp, 1.0 / static_cast<double>(t)));
  const std::string shape = "8192 x 129280 bf16";
  report("cross-entropy fwd", shape, 2.0 * static_cast<double>(n) + 20.0 * t, fwd);
  report("cross-entropy bwd", shape, 4.0 * static_cast<double>(n) + 12.0 * t, bwd);
}

// The optimizer's Adam step over 64 Mi parameters (a shard of that size: 1.1 GiB of state), 30 bytes per
// parameter as the lowering's optimizer op counts them; its first values checked against the CPU kernel.
void bench_adam() {
  const int64_t n = int64_t{1} << 26;
  const size_t un = static_cast<size_t>(n);
  auto master = random_buffer<float>(un, 40), grad = random_buffer<float>(un, 41, 0.1f);
  auto m = random_buffer<float>(un, 42, 0.01f), v = random_buffer<float>(un, 43, 0.01f);
  // v must be >= 0: squares of the random values.
  {
    std::vector<float> h = fetch(v.data(), 0, n);
    for (float& x : h) x *= x;
    MOERUN_CUDA_CHECK(cudaMemcpy(v.data(), h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice));
  }
  DeviceBuffer<Bf16> weight(un);
  const int64_t k = 4096 + 3;  // checked values: whole vectors and three of the next
  std::vector<float> p0 = fetch(master.data(), 0, k), g0 = fetch(grad.data(), 0, k),
                     m0 = fetch(m.data(), 0, k), v0 = fetch(v.data(), 0, k);
  const cpu::AdamConfig cfg{.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  const AdamCoefficients c = adam_coefficients(cfg.lr, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay, 5);
  adam_step(master.data(), grad.data(), m.data(), v.data(), weight.data(), n, c, nullptr);
  cpu::adam_step<float>(p0, g0, m0, v0, 5, cfg);
  check_fp32("adam master", fetch(master.data(), 0, k), p0.data(), static_cast<size_t>(k));
  check_fp32("adam m", fetch(m.data(), 0, k), m0.data(), static_cast<size_t>(k));
  check_fp32("adam v", fetch(v.data(), 0, k), v0.data(), static_cast<size_t>(k));
  check("adam bf16 weight", fetch(weight.data(), 0, k), p0.data(), static_cast<size_t>(k), 1.0 / 256,
        1.0 / 32768);
  report("adam step", "67108864 params", 30.0 * static_cast<double>(n),
         [&] { adam_step(master.data(), grad.data(), m.data(), v.data(), weight.data(), n, c, nullptr); });
}

}  // namespace
}  // namespace moeplan::cuda

int main() {
  namespace mc = moeplan::cuda;
  if (const std::string why = mc::device_unavailable(); !why.empty()) {
    std::printf("skipped: no CUDA device (%s)\n", why.c_str());
    return 0;
  }
  const size_t copy_bytes = size_t{2} << 30;
  const double copy_bps = mc::bench::copy_bandwidth(copy_bytes);
  mc::g_copy_gbs = copy_bps / 1e9;
  mc::bench::print_result("memory", "copy (cudaMemcpy D2D)", "2 GiB",
                          2.0 * static_cast<double>(copy_bytes) / copy_bps * 1e3, mc::g_copy_gbs,
                          mc::g_copy_gbs, "GB/s", 0);
  mc::bench_norm();
  mc::bench_swiglu();
  mc::bench_rope();
  mc::bench_router();
  mc::bench_permute();
  mc::bench_fp8();
  mc::bench_cross_entropy();
  mc::bench_adam();
  MOERUN_CUDA_CHECK(cudaDeviceSynchronize());
  if (mc::g_failed > 0) {
    std::printf("memory bench: %d checks FAILED\n", mc::g_failed);
    return 1;
  }
  std::printf("memory bench: all checks ok\n");
  return 0;
}
