// Tests of moerun's memory-bound CUDA kernels against the CPU kernels (executor/kernels/cpu) and the CPU wire
// format (executor/comm/wire_format.h), on random inputs. Every output is poisoned (all bits set: NaN for
// floats, -1 for ints) before the kernel runs, so an element left unwritten fails.
//
// Precision ladder (STYLE.md): the reference runs in double on the CPU from the same bf16-rounded inputs. A
// naive bf16 kernel errs by its output rounding, up to 2^-9 |ref| per element (half an ulp); these kernels
// compute in fp32 and round once, so a bf16 output must lie within 2 x 2^-9 |ref| plus an absolute floor of
// 2^-15 max|ref| (fp32 noise on terms that cancel). fp32 outputs (statistics, gates, router gradients) must
// lie within 1e-5 |ref| + 1e-5 max|ref| (fp32 sums over at most a few thousand terms). NaN never passes.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
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
#include "executor/kernels/cuda/check.h"
#include "executor/kernels/cuda/cross_entropy.h"
#include "executor/kernels/cuda/fp8.h"
#include "executor/kernels/cuda/norm.h"
#include "executor/kernels/cuda/permute.h"
#include "executor/kernels/cuda/rope.h"
#include "executor/kernels/cuda/router.h"
#include "executor/kernels/cuda/swiglu.h"

namespace moeplan::cuda::test {
namespace {

namespace cpu = moeplan::executor::cpu;
using MatD = cpu::Mat<double>;
using VecD = cpu::Vec<double>;

// ---- host-side data ----

float round_bf16(float x) {
  return executor::float_from_bf16(executor::bf16_from_float(x));
}

// n values ~ N(0, sigma), rounded to bf16.
std::vector<float> random_bf16(size_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = round_bf16(dist(rng));
  return v;
}

MatD to_mat(const std::vector<float>& v, int64_t rows, int64_t cols) {
  MatD m(rows, cols);
  for (int64_t i = 0; i < rows * cols; ++i) m.data()[i] = static_cast<double>(v[static_cast<size_t>(i)]);
  return m;
}

// A device copy of bf16 values (given as floats already on the bf16 grid).
class Bf16Buffer {
 public:
  explicit Bf16Buffer(size_t n) : buf_(n) { poison(); }
  explicit Bf16Buffer(const std::vector<float>& v) : buf_(v.size()) { upload(v); }
  void upload(const std::vector<float>& v) {
    std::vector<uint16_t> h(v.size());
    for (size_t i = 0; i < v.size(); ++i) h[i] = executor::bf16_from_float(v[i]);
    buf_.upload(h.data(), h.size());
  }
  std::vector<float> download() const {
    std::vector<uint16_t> h(buf_.size());
    buf_.download(h.data(), h.size());
    std::vector<float> v(h.size());
    for (size_t i = 0; i < h.size(); ++i) v[i] = executor::float_from_bf16(h[i]);
    return v;
  }
  void poison() { MOERUN_CUDA_CHECK(cudaMemset(buf_.data(), 0xff, buf_.bytes())); }
  __nv_bfloat16* data() const { return reinterpret_cast<__nv_bfloat16*>(buf_.data()); }

 private:
  DeviceBuffer<uint16_t> buf_;
};

template <class T>
DeviceBuffer<T> device_copy(const std::vector<T>& v) {
  DeviceBuffer<T> d(v.size());
  d.upload(v.data(), v.size());
  return d;
}

// ---- comparisons ----

// Elements of got outside |got - ref| <= rel |ref| + abs_max * max|ref| (NaN fails); prints the first few.
template <class T>
int64_t count_off(const std::string& what, const std::vector<T>& got, const double* ref, size_t n, double rel,
                  double abs_max) {
  REQUIRE(got.size() == n);
  double max_ref = 0, max_err = 0;
  for (size_t i = 0; i < n; ++i) max_ref = std::max(max_ref, std::fabs(ref[i]));
  int64_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    const double g = static_cast<double>(got[i]), err = std::fabs(g - ref[i]);
    const bool ok = err <= rel * std::fabs(ref[i]) + abs_max * max_ref;  // false for NaN
    if (!std::isnan(err)) max_err = std::max(max_err, err);
    if (!ok && ++bad <= 5) std::printf("  %s[%zu]: got %.9g, reference %.9g\n", what.c_str(), i, g, ref[i]);
  }
  std::printf("  %s: max |err| %.3g (max |ref| %.3g), %lld off\n", what.c_str(), max_err, max_ref,
              static_cast<long long>(bad));
  return bad;
}

constexpr double kBf16Rel = 2.0 / 512.0;    // 2 x half a bf16 ulp
constexpr double kBf16Floor = 1.0 / 32768;  // 2^-15 max|ref|
constexpr double kFp32Rel = 1e-5;

int64_t off_bf16(const std::string& what, const std::vector<float>& got, const MatD& ref) {
  return count_off(what, got, ref.data(), static_cast<size_t>(ref.size()), kBf16Rel, kBf16Floor);
}
template <class T>
int64_t off_fp32(const std::string& what, const std::vector<T>& got, const double* ref, size_t n) {
  return count_off(what, got, ref, n, kFp32Rel, kFp32Rel);
}

TEST_SUITE("gpu") {
  TEST_CASE("rmsnorm forward and backward match the CPU kernel, dgamma accumulates") {
    MOERUN_SKIP_WITHOUT_DEVICE();
    // 600 rows: more than the backward's 512 blocks, so blocks take several rows. hidden 1000: 125 vectors,
    // the last thread's vectors partly past the row.
    for (const int64_t hidden : {int64_t{1000}, int64_t{4096}}) {
      const int64_t rows = 600;
      const size_t n = static_cast<size_t>(rows * hidden), h = static_cast<size_t>(hidden);
      const auto x = random_bf16(n, 1), dy = random_bf16(n, 2);
      auto gamma = random_bf16(h, 3, 0.2f);
      for (float& g : gamma) g = round_bf16(1.0f + g);
      const auto dgamma0 = random_bf16(h, 4);
      const MatD xm = to_mat(x, rows, hidden), gm = to_mat(gamma, 1, hidden), dym = to_mat(dy, rows, hidden);
      const auto ref = cpu::rmsnorm_forward<double>(xm, gm, 1e-6);
      MatD dgamma_ref = to_mat(dgamma0, 1, hidden);
      const MatD dx_ref = cpu::rmsnorm_backward<double>(xm, gm, ref.inv_rms, dym, dgamma_ref);

      Bf16Buffer dx_(x), dgm(gamma), ddy(dy), dout(n), ddx(n);
      auto inv_rms = poisoned<float>(static_cast<size_t>(rows));
      auto dgamma = device_copy(dgamma0);
      DeviceBuffer<char> ws(rmsnorm_backward_workspace_bytes(rows, hidden));
      rmsnorm_forward(dx_.data(), dgm.data(), dout.data(), inv_rms.data(), rows, hidden, 1e-6f, nullptr);
      rmsnorm_backward(dx_.data(), dgm.data(), inv_rms.data(), ddy.data(), ddx.data(), dgamma.data(),
                       ws.data(), rows, hidden, nullptr);
      MOERUN_CUDA_CHECK(cudaDeviceSynchronize());
      INFO("hidden " << hidden);
      CHECK(off_bf16("y", dout.download(), ref.y) == 0);
      CHECK(off_fp32("inv_rms", inv_rms.to_host(), ref.inv_rms.data(), static_cast<size_t>(rows)) == 0);
      CHECK(off_bf16("dx", ddx.download(), dx_ref) == 0);
      CHECK(off_fp32("dgamma", dgamma.to_host(), dgamma_ref.data(), h) == 0);
    }
  }

  TEST_CASE("swiglu forward and backward match the CPU kernel") {
    MOERUN_SKIP_WITHOUT_DEVICE();
    const int64_t rows = 100, f = 520;
    const auto in = random_bf16(static_cast<size_t>(rows * 2 * f), 5, 2.0f);
    const auto dy = random_bf16(static_cast<size_t>(rows * f), 6);
    const MatD inm = to_mat(in, rows, 2 * f), dym = to_mat(dy, rows, f);
    const MatD y_ref = cpu::swiglu_forward<double>(inm), din_ref = cpu::swiglu_backward<double>(inm, dym);
    Bf16Buffer din_(in), ddy(dy), dout(static_cast<size_t>(rows * f)), ddin(in.size());
    swiglu_forward(din_.data(), dout.data(), rows, f, nullptr);
    swiglu_backward(din_.data(), ddy.data(), ddin.data(), rows, f, nullptr);
    MOERUN_CUDA_CHECK(cudaDeviceSynchronize());
    CHECK(off_bf16("y", dout.download(), y_ref) == 0);
    CHECK(off_bf16("din", ddin.download(), din_ref) == 0);
  }

  TEST_CASE("the Adam step matches the CPU kernel over steps and writes the bf16 weight copy") {
    MOERUN_SKIP_WITHOUT_DEVICE();
    // 1003 parameters: 250 vectors of four and a tail of three. Three steps with weight decay, each against
    // the CPU kernel in double from the same fp32 state; the moments and master weights within fp32 noise
    // of a few operations, the bf16 copy within the bf16 rule.
    const size_t n = 1003;
    const cpu::AdamConfig cfg{.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    std::vector<float> p = random_bf16(n, 11), m(n, 0.0f), v(n, 0.0f);
    DeviceBuffer<float> dp = device_copy(p), dm = device_copy(m), dv = device_copy(v);
    Bf16Buffer dw(n);
    for (int64_t step = 1; step <= 3; ++step) {
      INFO("step " << step);
      const std::vector<float> g = random_bf16(n, 20 + static_cast<uint32_t>(step), 0.5f);
      std::vector<double> pr(p.begin(), p.end()), mr(m.begin(), m.end()), vr(v.begin(), v.end()),
          gr(g.begin(), g.end());
      cpu::adam_step<double>(pr, gr, mr, vr, step, cfg);
      const DeviceBuffer<float> dg = device_copy(g);
      dw.poison();
      adam_step(dp.data(), dg.data(), dm.data(), dv.data(), dw.data(), static_cast<int64_t>(n),
                adam_coefficients(cfg.lr, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay, step), nullptr);
      MOERUN_CUDA_CHECK(cudaDeviceSynchronize());
      p = dp.to_host();
      m = dm.to_host();
      v = dv.to_host();
      CHECK(off_fp32("master", p, pr.data(), n) == 0);
      CHECK(off_fp32("m", m, mr.data(), n) == 0);
      CHECK(off_fp32("v", v, vr.data(), n) == 0);
      CHECK(count_off("weight", dw.download(), pr.data(), n, kBf16Rel, kBf16Floor) == 0);
    }
  }

  TEST_CASE("rope forward and backward match the CPU kernel and leave the other columns alone") {
    MOERUN_SKIP_WITHOUT_DEVICE();
    // q of a wider row (ld = heads * head_dim + 16): the 16 trailing columns must come back unchanged.
    const int64_t tokens = 50, heads = 6, head_dim = 64, width = heads * head_dim, ld = width + 16;
    const auto rows = random_bf16(static_cast<size_t>(tokens * ld), 7);
    std::vector<int64_t> pos(static_cast<size_t>(tokens));
    std::mt19937 rng(8);
    for (int64_t& p : pos) p = std::uniform_int_distribution<int64_t>(0, 40000)(rng);
    pos[0] = 0;
    auto dpos = device_copy(pos);
    for (const double sign : {1.0, -1.0}) {
      INFO((sign > 0 ? "forward" : "backward"));
      MatD ref = to_mat(rows, tokens, ld).leftCols(width);
      if (sign > 0) {
        cpu::rope_forward<double>(ref, pos, head_dim);
      } else {
        cpu::rope_backward<double>(ref, pos, head_dim);
      }
      Bf16Buffer dx(rows);
      if (sign > 0) {
        rope_forward(dx.data(), dpos.data(), tokens, heads, head_dim, ld, kRopeTheta, nullptr);
      } else {
        rope_backward(dx.data(), dpos.data(), tokens, heads, head_dim, ld, kRopeTheta, nullptr);
      }
      MOERUN_CUDA_CHECK(cudaDeviceSynchronize());
      const auto got = dx.download();
      std::vector<float> q(static_cast<size_t>(tokens * width));
      int64_t changed = 0;
      for (int64_t t = 0; t < tokens; ++t) {
        for (int64_t c = 0; c < ld; ++c) {
          const size_t i = static_cast<size_t>(t * ld + c);
          if (c < width) {
            q[static_cast<size_t>(t * width + c)] = got[i];
          } else {
            changed += got[i] != rows[i] ? 1 : 0;
          }
        }
      }
      CHECK(changed == 0);
      CHECK(off_bf16("x", q, ref) == 0);
    }
  }

  // Logits whose softmax has no near-ties (ranks 0.05 apart plus noise under 0.01), so that the GPU's and the
  // CPU's top-k agree exactly despite fp32 rounding; rows 0 and 1 hold exact ties, broken by the lower index.
  std::vector<float> router_logits(int64_t tokens, int64_t experts, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> noise(0.0f, 0.01f);
    std::vector<float> l(static_cast<size_t>(tokens * experts));
    std::vector<int> rank(static_cast<size_t>(experts));
    for (int64_t t = 0; t < tokens; ++t) {
      std::iota(rank.begin(), rank.end(), 0);
      std::shuffle(rank.begin(), rank.end(), rng);
      for (int64_t e = 0; e < experts; ++e)
        l[static_cast<size_t>(t * experts + e)] =
            0.05f * static_cast<float>(rank[static_cast<size_t>(e)]) + noise(rng);
    }
    for (int64_t e = 0; e < experts; ++e) {
      l[static_cast<size_t>(e)] = 1.0f;                                        // all tied
      l[static_cast<size_t>(experts + e)] = static_cast<float>(e % 3) * 0.5f;  // ties in threes
    }
    return l;
  }

  TEST_CASE("router forward, statistics, aux loss and backward match the CPU kernel") {
    MOERUN_SKIP_WITHOUT_DEVICE();
    struct Shape {
      int64_t tokens, experts, k;
    };
    // 3000 tokens: more than the forward's 264 x 8 warps, so warps take several tokens.
    for (const Shape s : {Shape{300, 64, 6}, Shape{3000, 256, 8}, Shape{97, 40, 1}}) {
      for (const bool renormalize : {true, false}) {
        INFO("tokens " << s.tokens << ", experts " << s.experts << ", k " << s.k << ", renormalize "
                       << renormalize);
        const size_t te = static_cast<size_t>(s.tokens * s.experts), tk = static_cast<size_t>(s.tokens * s.k);
        const auto logits = router_logits(s.tokens, s.experts, 9);
        const auto route = cpu::router_forward<double>(to_mat(logits, s.tokens, s.experts), s.k, renormalize);
        const auto stats = cpu::router_local_stats<double>(route);
        const double coef = 0.01, scale = 0.5;
        const double loss_ref = cpu::aux_loss<double>(stats, s.tokens, s.k, coef);
        const VecD dprobs_ref = cpu::aux_loss_dprobs<double>(stats, s.tokens, s.k, coef, scale);
        const auto dgates_h = random_bf16(tk, 10);
        const MatD dlogits_ref =
            cpu::router_backward<double>(route, to_mat(dgates_h, s.tokens, s.k), dprobs_ref);

        auto dlogits_in = device_copy(logits);
        auto probs = poisoned<float>(te), gates = poisoned<float>(tk),
             prob_sums = poisoned<float>(static_cast<size_t>(s.experts));
        auto experts = poisoned<int32_t>(tk), counts = poisoned<int32_t>(static_cast<size_t>(s.experts));
        DeviceBuffer<char> ws(router_forward_workspace_bytes(s.tokens, s.experts));
        router_forward(dlogits_in.data(), s.tokens, s.experts, s.k, renormalize, probs.data(), experts.data(),
                       gates.data(), counts.data(), prob_sums.data(), ws.data(), nullptr);
        auto loss = poisoned<float>(1), dprobs = poisoned<float>(static_cast<size_t>(s.experts));
        router_aux_loss(counts.data(), prob_sums.data(), s.experts, s.tokens, s.k, coef, scale, loss.data(),
                        dprobs.data(), nullptr);
        auto dgates = device_copy(dgates_h);
        auto dlogits = poisoned<float>(te);
        router_backward(probs.data(), experts.data(), gates.data(), dgates.data(), dprobs.data(), s.tokens,
                        s.experts, s.k, renormalize, dlogits.data(), nullptr);
        MOERUN_CUDA_CHECK(cudaDeviceSynchronize());

        const auto got_e = experts.to_host();
        int64_t wrong = 0;
        for (size_t i = 0; i < tk; ++i) wrong += got_e[i] != route.experts[i] ? 1 : 0;
        CHECK(wrong == 0);
        const auto got_c = counts.to_host();
        int64_t count_sum = 0, count_wrong = 0;
        for (int64_t e = 0; e < s.experts; ++e) {
          count_sum += got_c[static_cast<size_t>(e)];
          count_wrong += got_c[static_cast<size_t>(e)] != static_cast<int32_t>(stats.counts(e)) ? 1 : 0;
        }
        CHECK(count_sum == s.tokens * s.k);
        CHECK(count_wrong == 0);
        CHECK(off_fp32("probs", probs.to_host(), route.probs.data(), te) == 0);
        CHECK(off_fp32("gates", gates.to_host(), route.gates.data(), tk) == 0);
        CHECK(off_fp32("prob_sums", prob_sums.to_host(), stats.prob_sums.data(),
                       static_cast<size_t>(s.experts)) == 0);
        CHECK(off_fp32("aux loss", loss.to_host(), &loss_ref, 1) == 0);
        CHECK(off_fp32("aux dprobs", dprobs.to_host(), dprobs_ref.data(), static_cast<size_t>(s.experts)) ==
              0);
        CHECK(off_fp32("dlogits", dlogits.to_host(), dlogits_ref.data(), te) == 0);
      }
    }
  }

  // Top-k expert ids per token, distinct within a token, skewed so that some experts get no token.
  std::vector<int64_t> random_topk(int64_t tokens, int64_t k, int64_t experts, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<int64_t> ids(static_cast<size_t>(tokens * k));
    std::vector<int64_t> all(static_cast<size_t>(experts));
    std::iota(all.begin(), all.end(), int64_t{0});
    for (int64_t t = 0; t < tokens; ++t) {
      // Experts >= experts * 3 / 4 are never drawn.
      std::shuffle(all.begin(), all.begin() + experts * 3 / 4, rng);
      for (int64_t j = 0; j < k; ++j) ids[static_cast<size_t>(t * k + j)] = all[static_cast<size_t>(j)];
    }
    return ids;
  }

  TEST_CASE("the device row map equals the CPU stable sort by expert then token") {
    MOERUN_SKIP_WITHOUT_DEVICE();
    // 3000 x 8 = 24000 slots: 24 chunks of the map kernels, the last one partial.
    for (const int64_t experts : {int64_t{64}, int64_t{256}}) {
      const int64_t tokens = 3000, k = 8, slots = tokens * k;
      INFO("experts " << experts);
      const auto ids = random_topk(tokens, k, experts, 11);
      const auto idx = cpu::make_permute_index(ids, tokens, k, experts);
      std::vector<int32_t> ids32(ids.begin(), ids.end());
      auto dids = device_copy(ids32);
      auto counts = poisoned<int32_t>(static_cast<size_t>(experts));
      auto offsets = poisoned<int32_t>(static_cast<size_t>(experts + 1));
      auto slot_row = poisoned<int32_t>(static_cast<size_t>(slots)),
           row_slot = poisoned<int32_t>(static_cast<size_t>(slots));
      DeviceBuffer<char> ws(permute_map_workspace_bytes(tokens, k, experts));
      build_permute_map(dids.data(), tokens, k, experts, counts.data(), offsets.data(), slot_row.data(),
                        row_slot.data(), ws.data(), nullptr);
      MOERUN_CUDA_CHECK(cudaDeviceSynchronize());
      const auto c = counts.to_host(), o = offsets.to_host(), sr = slot_row.to_host(),
                 rs = row_slot.to_host();
      int64_t wrong = 0, empty = 0;
      for (size_t e = 0; e < static_cast<size_t>(experts); ++e) {
        wrong += c[e] != idx.counts[e] || o[e] != idx.offsets[e] ? 1 : 0;
        empty += idx.counts[e] == 0 ? 1 : 0;
      }
      CHECK(o[static_cast<size_t>(experts)] == slots);
      CHECK(empty > 0);
      for (size_t s = 0; s < static_cast<size_t>(slots); ++s) {
        wrong += sr[s] != idx.slot_row[s] ? 1 : 0;
        wrong += rs[s] != idx.row_token[s] * k + idx.row_slot[s] ? 1 : 0;
      }
      CHECK(wrong == 0);
    }
  }

  TEST_CASE("permute and unpermute with their backward passes match the CPU kernels and round-trip") {
    MOERUN_SKIP_WITHOUT_DEVICE();
    const int64_t tokens = 200, k = 4, experts = 16, hidden = 264, rows = tokens * k;
    const size_t th = static_cast<size_t>(tokens * hidden), rh = static_cast<size_t>(rows * hidden);
    const auto ids = random_topk(tokens, k, experts, 12);
    const auto idx = cpu::make_permute_index(ids, tokens, k, experts);
    // Gates of a renormalised router (rows sum to 1).
    const auto route =
        cpu::router_forward<double>(to_mat(router_logits(tokens, experts, 13), tokens, experts), k);
    std::vector<float> gates_h(static_cast<size_t>(tokens * k));
    for (size_t i = 0; i < gates_h.size(); ++i) gates_h[i] = static_cast<float>(route.gates.data()[i]);
    const MatD gm = to_mat(gates_h, tokens, k);
    const auto x = random_bf16(th, 14), yp = random_bf16(rh, 15), dy = random_bf16(th, 16);
    const auto base = random_bf16(th, 17);
    const MatD xm = to_mat(x, tokens, hidden), ypm = to_mat(yp, rows, hidden),
               dym = to_mat(dy, tokens, hidden);

    std::vector<int32_t> ids32(ids.begin(), ids.end());
    auto dids = device_copy(ids32);
    auto counts = poisoned<int32_t>(static_cast<size_t>(experts));
    auto offsets = poisoned<int32_t>(static_cast<size_t>(experts + 1));
    auto slot_row = poisoned<int32_t>(static_cast<size_t>(rows)),
         row_slot = poisoned<int32_t>(static_cast<size_t>(rows));
    DeviceBuffer<char> ws(permute_map_workspace_bytes(tokens, k, experts));
    build_permute_map(dids.data(), tokens, k, experts, counts.data(), offsets.data(), slot_row.data(),
                      row_slot.data(), ws.data(), nullptr);
    auto dgates = device_copy(gates_h);
    Bf16Buffer dx(x), dyp_in(yp), ddy(dy), xp(rh), dx_back(th), out(th), out_acc(base), dyp(rh),
        round_trip(th);
    auto dgates_out = poisoned<float>(static_cast<size_t>(tokens * k));
    permute_forward(dx.data(), row_slot.data(), xp.data(), tokens, k, hidden, nullptr);
    permute_backward(dyp_in.data(), slot_row.data(), dx_back.data(), tokens, k, hidden, nullptr);
    unpermute_forward(dyp_in.data(), slot_row.data(), dgates.data(), out.data(), tokens, k, hidden, false,
                      nullptr);
    unpermute_forward(dyp_in.data(), slot_row.data(), dgates.data(), out_acc.data(), tokens, k, hidden, true,
                      nullptr);
    unpermute_backward(ddy.data(), dyp_in.data(), slot_row.data(), dgates.data(), dyp.data(),
                       dgates_out.data(), tokens, k, hidden, nullptr);
    unpermute_forward(xp.data(), slot_row.data(), dgates.data(), round_trip.data(), tokens, k, hidden, false,
                      nullptr);
    MOERUN_CUDA_CHECK(cudaDeviceSynchronize());

    const MatD xp_ref = cpu::permute_forward<double>(xm, idx);
    const MatD dx_ref = cpu::permute_backward<double>(ypm, idx);
    MatD out_ref = MatD::Zero(tokens, hidden), out_acc_ref = to_mat(base, tokens, hidden);
    cpu::unpermute_forward<double>(ypm, idx, gm, out_ref);
    cpu::unpermute_forward<double>(ypm, idx, gm, out_acc_ref);
    const auto grads = cpu::unpermute_backward<double>(dym, ypm, idx, gm);

    const auto xp_got = xp.download();
    int64_t moved_wrong = 0;
    for (size_t i = 0; i < rh; ++i) moved_wrong += static_cast<double>(xp_got[i]) != xp_ref.data()[i] ? 1 : 0;
    CHECK(moved_wrong == 0);  // a copy: bit-exact
    CHECK(off_bf16("permute dx", dx_back.download(), dx_ref) == 0);
    CHECK(off_bf16("unpermute out", out.download(), out_ref) == 0);
    CHECK(off_bf16("unpermute out (accumulate)", out_acc.download(), out_acc_ref) == 0);
    CHECK(off_bf16("unpermute dyp", dyp.download(), grads.dyp) == 0);
    CHECK(off_fp32("unpermute dgates", dgates_out.to_host(), grads.dgates.data(),
                   static_cast<size_t>(tokens * k)) == 0);
    // Gates sum to 1 (in fp32, up to rounding), and the k copies are equal: the combine gives back x exactly
    // once rounded to bf16.
    const auto back = round_trip.download();
    int64_t round_wrong = 0;
    for (size_t i = 0; i < th; ++i) round_wrong += back[i] != x[i] ? 1 : 0;
    CHECK(round_wrong == 0);
  }

  // Bound of one dequantized value: max(2^-4 |x|, 2^-10 scale) (e4m3, wire_format.h), plus half a bf16 ulp of
  // the dequantized value (|x| + that error) and the fp32 product's rounding.
  int64_t fp8_bound_violations(const std::vector<float>& x, const std::vector<float>& y,
                               const std::vector<float>& scales, int64_t group) {
    int64_t bad = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const double s = static_cast<double>(scales[i / static_cast<size_t>(group)]);
      const double xi = static_cast<double>(x[i]), err = std::fabs(static_cast<double>(y[i]) - xi);
      const double e8 =
          std::max(executor::kE4m3RelativeError * std::fabs(xi), executor::kE4m3SubnormalAbsError * s);
      // + the bf16 rounding of the output (2^-8 relative: measured on the H200, a tie in e4m3's subnormal
      // range rounded up and then to bf16 exceeded a 2^-9 allowance) + the fp32 product's rounding.
      const double bound = e8 + (std::fabs(xi) + e8) * executor::kBf16RelativeError + 1e-6 * std::fabs(xi);
      bad += err <= bound ? 0 : 1;
    }
    return bad;
  }

  TEST_CASE(
      "fp8 quantize matches the CPU wire format byte for byte and dequantize is within the e4m3 bound") {
    MOERUN_SKIP_WITHOUT_DEVICE();
    const int64_t rows = 33, cols = 1024;
    const size_t n = static_cast<size_t>(rows * cols);
    auto x = random_bf16(n, 18, 3.0f);
    for (size_t i = 0; i < static_cast<size_t>(cols); ++i)
      x[static_cast<size_t>(cols) + i] = 0.0f;  // row 1: zero
    for (size_t i = 0; i < n; i += 97)
      x[i] = round_bf16(x[i] * 1e-4f);  // some values in e4m3's subnormal range
    Bf16Buffer dx(x);
    for (const int64_t group : {cols, kFp8BlockElems}) {
      INFO((group == cols ? "rowwise" : "blockwise (1 x 128)"));
      const size_t groups = n / static_cast<size_t>(group);
      auto q = poisoned<uint8_t>(n);
      auto scales = poisoned<float>(groups);
      Bf16Buffer y(n);
      auto* q8 = reinterpret_cast<__nv_fp8_e4m3*>(q.data());
      if (group == cols) {
        fp8_quantize_rowwise(dx.data(), q8, scales.data(), rows, cols, nullptr);
      } else {
        fp8_quantize_blockwise(dx.data(), q8, scales.data(), rows, cols, nullptr);
      }
      fp8_dequantize(q8, scales.data(), y.data(), rows, cols, group, nullptr);
      MOERUN_CUDA_CHECK(cudaDeviceSynchronize());
      const auto got_q = q.to_host();
      const auto got_s = scales.to_host();
      int64_t scale_wrong = 0, byte_wrong = 0;
      for (size_t g = 0; g < groups; ++g) {
        const std::span<const float> block(x.data() + g * static_cast<size_t>(group),
                                           static_cast<size_t>(group));
        const float s = executor::e4m3_block_scale(block);
        scale_wrong += got_s[g] != s ? 1 : 0;
        for (size_t i = 0; i < block.size(); ++i)
          byte_wrong +=
              got_q[g * static_cast<size_t>(group) + i] != executor::e4m3_from_float(block[i] / s) ? 1 : 0;
      }
      CHECK(scale_wrong == 0);
      CHECK(byte_wrong == 0);
      CHECK(got_s[group == cols ? 1 : groups / static_cast<size_t>(rows)] == 1.0f);  // row 1 is all zero
      CHECK(fp8_bound_violations(x, y.download(), got_s, group) == 0);
    }
  }

  // CPU reference of one vocabulary shard [v0, v0 + vocab): lse, target logit, per-token loss, dlogits.
  struct CeRef {
    VecD lse, target_logit, loss;
    MatD dlogits;
  };
  CeRef ce_reference(const MatD& logits, const std::vector<int64_t>& targets, int64_t v0, double scale) {
    const VecD m = cpu::loss_local_max<double>(logits);
    const auto st = cpu::loss_local_stats<double>(logits, targets, v0, m);
    CeRef r;
    r.lse = (st.sum_exp.array().log() + m.array()).matrix();
    r.target_logit = st.target_logit;
    r.loss = cpu::loss_per_token<double>(m, st);
    r.dlogits = cpu::loss_backward<double>(logits, targets, v0, m, st.sum_exp, scale);
    return r;
  }

  TEST_CASE("cross-entropy forward and backward match the CPU kernel for fp32 and bf16 logits") {
    MOERUN_SKIP_WITHOUT_DEVICE();
    const int64_t rows = 20, vocab = 5000, v0 = 1000;  // this shard holds [1000, 6000)
    const size_t n = static_cast<size_t>(rows * vocab);
    const auto logits = random_bf16(n, 19, 4.0f);
    std::vector<int64_t> targets(static_cast<size_t>(rows));
    std::mt19937 rng(20);
    for (int64_t& t : targets) t = std::uniform_int_distribution<int64_t>(v0, v0 + vocab - 1)(rng);
    targets[3] = 17;              // in another shard: target logit 0
    targets[4] = v0;              // first column
    targets[5] = v0 + vocab - 1;  // last column
    const double scale = 1.0 / 64;
    const CeRef ref = ce_reference(to_mat(logits, rows, vocab), targets, v0, scale);
    auto dtargets = device_copy(targets);
    const size_t r = static_cast<size_t>(rows);
    for (const bool bf16 : {false, true}) {
      INFO((bf16 ? "bf16 logits" : "fp32 logits"));
      auto lse = poisoned<float>(r), tl = poisoned<float>(r), loss = poisoned<float>(r);
      std::vector<float> lse_h(r);
      for (size_t i = 0; i < r; ++i) lse_h[i] = static_cast<float>(ref.lse(static_cast<Eigen::Index>(i)));
      auto dlse = device_copy(lse_h);
      std::vector<double> dl_got;
      if (bf16) {
        Bf16Buffer dlogits(logits), dgrad(n);
        cross_entropy_forward(dlogits.data(), dtargets.data(), rows, vocab, v0, lse.data(), tl.data(),
                              loss.data(), nullptr);
        cross_entropy_backward(dlogits.data(), dtargets.data(), rows, vocab, v0, dlse.data(),
                               static_cast<float>(scale), dgrad.data(), nullptr);
        MOERUN_CUDA_CHECK(cudaDeviceSynchronize());
        CHECK(off_bf16("dlogits", dgrad.download(), ref.dlogits) == 0);
      } else {
        auto dlogits = device_copy(logits);
        cross_entropy_forward(dlogits.data(), dtargets.data(), rows, vocab, v0, lse.data(), tl.data(),
                              loss.data(), nullptr);
        // In place: the gradient overwrites the logits.
        cross_entropy_backward(dlogits.data(), dtargets.data(), rows, vocab, v0, dlse.data(),
                               static_cast<float>(scale), dlogits.data(), nullptr);
        MOERUN_CUDA_CHECK(cudaDeviceSynchronize());
        CHECK(off_fp32("dlogits", dlogits.to_host(), ref.dlogits.data(), n) == 0);
      }
      CHECK(off_fp32("lse", lse.to_host(), ref.lse.data(), r) == 0);
      CHECK(off_fp32("target logit", tl.to_host(), ref.target_logit.data(), r) == 0);
      CHECK(off_fp32("loss", loss.to_host(), ref.loss.data(), r) == 0);
    }
  }
}

}  // namespace
}  // namespace moeplan::cuda::test
