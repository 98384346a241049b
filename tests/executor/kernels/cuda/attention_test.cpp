// cuDNN flash attention (executor/kernels/cuda/attention.h) against the CPU attention kernel, forward, lse
// and backward, for MHA and GQA, head_dim 64 and 128, causal and full.
//
// Precision ladder (FA3's tests): inputs are random bf16; the reference is the CPU kernel in double on those
// same values. A naive bf16 attention (below: fp32 accumulation, every matmul output, P and dS rounded to
// bf16, as a bf16 PyTorch attention does) measures what bf16 arithmetic alone errs. The GPU passes when, per
// tensor, max |gpu - ref| <= 3 max |naive - ref| + 2^-8 max |ref| (the floor: one bf16 rounding of the
// largest element). FA3 uses 2x; 3x leaves room for cuDNN's different reduction orders (dk, dv sum over a GQA
// group). At these sizes bf16 output rounding alone costs ~1.6e-3 relative Frobenius error and the naive
// version ~4e-3 (bf16 flash attention is often quoted near 1e-2); the printed lines record the GPU's. The lse
// (fp32 in cuDNN) must be better than bf16: within 2e-3 of the reference, a tenth of a bf16 step at lse ~ 5,
// since backward rescales every probability by exp(lse error).
#include "executor/kernels/cuda/attention.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "executor/kernels/cpu/attention.h"
#include "executor/kernels/cuda/check.h"

namespace {

namespace cpu = moeplan::executor::cpu;
using moeplan::cuda::AttentionShape;
using moeplan::cuda::bf16;
using moeplan::cuda::CudnnHandle;
using moeplan::cuda::DeviceBuffer;
using moeplan::cuda::FlashAttention;
using moeplan::cuda::poisoned;
using Md = cpu::Mat<double>;
using Mf = cpu::Mat<float>;

float round_bf16(float x) {
  return __bfloat162float(__float2bfloat16(x));
}
const auto kRound = [](float x) { return round_bf16(x); };

// rows x cols values ~ N(0, 1), rounded to bf16 (exact in float).
Mf random_bf16(Eigen::Index rows, Eigen::Index cols, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  Mf m(rows, cols);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = round_bf16(dist(gen));
  return m;
}

DeviceBuffer<bf16> upload(const Mf& m) {
  std::vector<bf16> h(static_cast<size_t>(m.size()));
  for (size_t i = 0; i < h.size(); ++i) h[i] = __float2bfloat16(m.data()[i]);
  DeviceBuffer<bf16> d(h.size());
  d.upload(h.data(), h.size());
  return d;
}

Mf download(const DeviceBuffer<bf16>& d, Eigen::Index rows, Eigen::Index cols) {
  std::vector<bf16> h(d.size());
  d.download(h.data(), h.size());
  Mf m(rows, cols);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = __bfloat162float(h[static_cast<size_t>(i)]);
  return m;
}

struct Grads {
  Mf out, lse, dq, dk, dv;  // token-major like the inputs; lse [tokens, q_heads]
};

// The naive bf16 attention of one sequence, forward and backward, on its rows of q, k, v, do.
Grads naive_bf16(const Mf& q, const Mf& k, const Mf& v, const Mf& d_o, const AttentionShape& a) {
  const Eigen::Index s = q.rows(), d = a.head_dim, group = a.q_heads / a.kv_heads;
  const float scale = a.softmax_scale();
  Grads r{Mf(s, q.cols()), Mf(s, a.q_heads), Mf(s, q.cols()), Mf::Zero(s, k.cols()), Mf::Zero(s, k.cols())};
  Mf p(s, s), ds(s, s);
  for (Eigen::Index h = 0; h < a.q_heads; ++h) {
    const Eigen::Index g = h / group;
    const auto qh = q.middleCols(h * d, d);
    const auto kh = k.middleCols(g * d, d);
    const auto vh = v.middleCols(g * d, d);
    const auto doh = d_o.middleCols(h * d, d);
    const Mf sc = (scale * (qh * kh.transpose())).unaryExpr(kRound);
    for (Eigen::Index i = 0; i < s; ++i) {
      const Eigen::Index last = a.causal ? i : s - 1;  // keys 0 .. last are visible
      const float m = sc.row(i).head(last + 1).maxCoeff();
      float sum = 0;
      for (Eigen::Index j = 0; j <= last; ++j) sum += std::exp(sc(i, j) - m);
      r.lse(i, h) = m + std::log(sum);
      for (Eigen::Index j = 0; j < s; ++j)
        p(i, j) = j <= last ? round_bf16(std::exp(sc(i, j) - r.lse(i, h))) : 0.0f;
    }
    const Mf oh = (p * vh).unaryExpr(kRound);
    r.out.middleCols(h * d, d) = oh;
    r.dv.middleCols(g * d, d) += p.transpose() * doh;
    const Mf dp = (doh * vh.transpose()).unaryExpr(kRound);
    for (Eigen::Index i = 0; i < s; ++i) {
      const float di = doh.row(i).dot(oh.row(i));
      for (Eigen::Index j = 0; j < s; ++j) ds(i, j) = round_bf16(p(i, j) * (dp(i, j) - di));
    }
    r.dq.middleCols(h * d, d) = (scale * (ds * kh)).unaryExpr(kRound);
    r.dk.middleCols(g * d, d) += scale * (ds.transpose() * qh);
  }
  r.dk = r.dk.unaryExpr(kRound);
  r.dv = r.dv.unaryExpr(kRound);
  return r;
}

double max_abs_diff(const Mf& x, const Md& ref) {
  return (x.cast<double>() - ref).cwiseAbs().maxCoeff();
}

// The ladder check of one tensor; prints the figures so the device run's log records them.
void check_ladder(const char* name, const Mf& gpu, const Mf& naive, const Md& ref, const std::string& label) {
  INFO(label << " " << name);
  REQUIRE(gpu.rows() == ref.rows());
  REQUIRE(gpu.cols() == ref.cols());
  CHECK(gpu.allFinite());  // NaN poison left behind, or a NaN computed
  if (!gpu.allFinite()) return;
  const double ref_max = ref.cwiseAbs().maxCoeff();
  const double err = max_abs_diff(gpu, ref), err_naive = max_abs_diff(naive, ref);
  const double tol = 3 * err_naive + std::ldexp(ref_max, -8);
  const double rel_fro = (gpu.cast<double>() - ref).norm() / ref.norm();
  std::printf("%s %-3s: max err %.3e, naive bf16 %.3e, tolerance %.3e, relative Frobenius %.2e\n",
              label.c_str(), name, err, err_naive, tol, rel_fro);
  CHECK(ref_max > 0);
  // A naive version that errs by nothing, or by a lot, would make the ladder meaningless.
  CHECK(err_naive > 0);
  CHECK(err_naive < 0.05 * ref_max);
  CHECK(err <= tol);
}

struct Inputs {
  Mf q, k, v, d_o;  // token-major [batch seq, heads head_dim], bf16 values
};

Inputs random_inputs(const AttentionShape& a) {
  const Eigen::Index tokens = a.batch * a.seq, qc = a.q_heads * a.head_dim, kc = a.kv_heads * a.head_dim;
  return {random_bf16(tokens, qc, 1), random_bf16(tokens, kc, 2), random_bf16(tokens, kc, 3),
          random_bf16(tokens, qc, 4)};
}

struct Results {
  Mf out, dq, dk, dv;        // token-major like the inputs
  std::vector<float> stats;  // [batch, q_heads, seq]
};

// Forward, then backward from the GPU's own o and stats, on a non-default stream, into NaN-poisoned outputs.
Results run_gpu(const AttentionShape& a, const Inputs& in) {
  CudnnHandle handle;
  FlashAttention fa(handle.get(), a);
  INFO("unsupported: " << fa.unsupported());
  REQUIRE(fa.unsupported().empty());
  cudaStream_t stream = nullptr;
  MOERUN_CUDA_CHECK(cudaStreamCreate(&stream));
  const auto d_q = upload(in.q), d_k = upload(in.k), d_v = upload(in.v), d_dout = upload(in.d_o);
  auto d_out = poisoned<bf16>(a.q_elems());
  auto d_stats = poisoned<float>(a.stats_elems());
  auto d_dq = poisoned<bf16>(a.q_elems());
  auto d_dk = poisoned<bf16>(a.k_elems());
  auto d_dv = poisoned<bf16>(a.v_elems());
  fa.forward(d_q.data(), d_k.data(), d_v.data(), d_out.data(), d_stats.data(), stream);
  fa.backward(d_q.data(), d_k.data(), d_v.data(), d_out.data(), d_dout.data(), d_stats.data(), d_dq.data(),
              d_dk.data(), d_dv.data(), stream);
  MOERUN_CUDA_CHECK(cudaStreamSynchronize(stream));
  MOERUN_CUDA_CHECK(cudaStreamDestroy(stream));
  Results r{download(d_out, in.q.rows(), in.q.cols()), download(d_dq, in.q.rows(), in.q.cols()),
            download(d_dk, in.k.rows(), in.k.cols()), download(d_dv, in.k.rows(), in.k.cols()),
            std::vector<float>(d_stats.size())};
  d_stats.download(r.stats.data(), r.stats.size());
  return r;
}

// Checks the GPU's results, and its lse, against the CPU kernel on the same inputs.
void check_against_cpu(const AttentionShape& a, const Inputs& in, const Results& gpu) {
  const std::string label = "b" + std::to_string(a.batch) + " s" + std::to_string(a.seq) + " h" +
                            std::to_string(a.q_heads) + "/" + std::to_string(a.kv_heads) + " d" +
                            std::to_string(a.head_dim) + (a.causal ? " causal" : " full");
  INFO(label);
  const Eigen::Index tokens = a.batch * a.seq, qc = a.q_heads * a.head_dim, kc = a.kv_heads * a.head_dim;
  const Mf &q = in.q, &k = in.k, &v = in.v, &d_o = in.d_o;
  const std::vector<float>& stats = gpu.stats;

  // CPU reference in double and the naive bf16 version, one sequence at a time. Full attention is the CPU
  // kernel with every query placed after every key.
  std::vector<int64_t> k_pos(static_cast<size_t>(a.seq)), q_pos(k_pos.size());
  for (size_t i = 0; i < k_pos.size(); ++i) {
    k_pos[i] = static_cast<int64_t>(i);
    q_pos[i] = a.causal ? k_pos[i] : a.seq;
  }
  const cpu::AttnHeads heads{a.q_heads, a.kv_heads, a.head_dim, 0, 0, 0};
  const Md qd = q.cast<double>(), kd = k.cast<double>(), vd = v.cast<double>(), dod = d_o.cast<double>();
  Md ref_out(tokens, qc), ref_lse(tokens, a.q_heads), ref_dq(tokens, qc), ref_dk(tokens, kc),
      ref_dv(tokens, kc);
  Grads naive{Mf(tokens, qc), Mf(tokens, a.q_heads), Mf(tokens, qc), Mf(tokens, kc), Mf(tokens, kc)};
  for (Eigen::Index b = 0; b < a.batch; ++b) {
    const Eigen::Index r0 = b * a.seq, s = a.seq;
    const auto f = cpu::attn_core_forward<double>(qd.middleRows(r0, s), kd.middleRows(r0, s),
                                                  vd.middleRows(r0, s), q_pos, k_pos, heads);
    const auto g =
        cpu::attn_core_backward<double>(qd.middleRows(r0, s), kd.middleRows(r0, s), vd.middleRows(r0, s),
                                        f.out, f.lse, dod.middleRows(r0, s), q_pos, k_pos, heads);
    ref_out.middleRows(r0, s) = f.out;
    ref_lse.middleRows(r0, s) = f.lse;
    ref_dq.middleRows(r0, s) = g.dq;
    ref_dk.middleRows(r0, s) = g.dk;
    ref_dv.middleRows(r0, s) = g.dv;
    const Grads n =
        naive_bf16(q.middleRows(r0, s), k.middleRows(r0, s), v.middleRows(r0, s), d_o.middleRows(r0, s), a);
    naive.out.middleRows(r0, s) = n.out;
    naive.dq.middleRows(r0, s) = n.dq;
    naive.dk.middleRows(r0, s) = n.dk;
    naive.dv.middleRows(r0, s) = n.dv;
  }

  check_ladder("o", gpu.out, naive.out, ref_out, label);
  check_ladder("dq", gpu.dq, naive.dq, ref_dq, label);
  check_ladder("dk", gpu.dk, naive.dk, ref_dk, label);
  check_ladder("dv", gpu.dv, naive.dv, ref_dv, label);

  // stats [batch, q_heads, seq] against the reference's [tokens, q_heads].
  REQUIRE(stats.size() == static_cast<size_t>(a.stats_elems()));
  double lse_err = 0;
  bool lse_finite = true;
  for (Eigen::Index b = 0; b < a.batch; ++b) {
    for (Eigen::Index h = 0; h < a.q_heads; ++h) {
      for (Eigen::Index i = 0; i < a.seq; ++i) {
        const float x = stats[static_cast<size_t>((b * a.q_heads + h) * a.seq + i)];
        lse_finite = lse_finite && std::isfinite(x);
        lse_err = std::max(lse_err, std::abs(static_cast<double>(x) - ref_lse(b * a.seq + i, h)));
      }
    }
  }
  std::printf("%s lse: max err %.3e, tolerance 2e-3\n", label.c_str(), lse_err);
  CHECK(lse_finite);
  CHECK(lse_err <= 2e-3);
}

AttentionShape shape(int64_t seq, int64_t q_heads, int64_t kv_heads, int64_t head_dim, bool causal = true) {
  return AttentionShape{.batch = 2,
                        .seq = seq,
                        .q_heads = q_heads,
                        .kv_heads = kv_heads,
                        .head_dim = head_dim,
                        .causal = causal,
                        .scale = 0};
}

}  // namespace

TEST_SUITE("gpu") {
  TEST_CASE("causal MHA attention at seq 128, head_dim 64 matches the CPU kernel forward and backward") {
    MOERUN_SKIP_WITHOUT_DEVICE();
    const AttentionShape a = shape(128, 4, 4, 64);
    const Inputs in = random_inputs(a);
    check_against_cpu(a, in, run_gpu(a, in));
  }

  TEST_CASE("causal MHA attention at seq 256, head_dim 128 matches the CPU kernel forward and backward") {
    MOERUN_SKIP_WITHOUT_DEVICE();
    const AttentionShape a = shape(256, 4, 4, 128);
    const Inputs in = random_inputs(a);
    check_against_cpu(a, in, run_gpu(a, in));
  }

  TEST_CASE("causal GQA attention with 4 query heads per kv head, head_dim 64, matches the CPU kernel") {
    MOERUN_SKIP_WITHOUT_DEVICE();
    const AttentionShape a = shape(128, 8, 2, 64);
    const Inputs in = random_inputs(a);
    check_against_cpu(a, in, run_gpu(a, in));
  }

  TEST_CASE(
      "causal GQA attention with 4 query heads per kv head, head_dim 128, seq 256 matches the CPU kernel") {
    MOERUN_SKIP_WITHOUT_DEVICE();
    const AttentionShape a = shape(256, 8, 2, 128);
    const Inputs in = random_inputs(a);
    check_against_cpu(a, in, run_gpu(a, in));
  }

  TEST_CASE("full (non-causal) GQA attention matches the CPU kernel with every key visible") {
    MOERUN_SKIP_WITHOUT_DEVICE();
    const AttentionShape a = shape(128, 4, 2, 64, false);
    const Inputs in = random_inputs(a);
    check_against_cpu(a, in, run_gpu(a, in));
  }

  TEST_CASE("a shape cuDNN or the GQA layout cannot run is reported with a reason, not aborted") {
    MOERUN_SKIP_WITHOUT_DEVICE();
    CudnnHandle handle;
    const FlashAttention odd_dim(handle.get(), shape(128, 4, 4, 100));  // cuDNN wants head_dim % 8 == 0
    std::printf("head_dim 100: %s\n", odd_dim.unsupported().c_str());
    CHECK_FALSE(odd_dim.unsupported().empty());
    const FlashAttention odd_group(handle.get(), shape(128, 6, 4, 64));
    std::printf("6 query heads over 4 kv heads: %s\n", odd_group.unsupported().c_str());
    CHECK_FALSE(odd_group.unsupported().empty());
  }

  TEST_CASE("the replay's shapes run: fewer queries than keys, windows, MLA's v_dim, full blocks of keys") {
    // What attention_calls asks of cuDNN for context parallelism (a causal square, a full block
    // over other ranks' keys), sliding windows and MLA (qk 192, v 128): each builds, runs forward and
    // backward, leaves every output finite and matches the CPU kernel in double on the same bf16 inputs
    // (causal queries at the last seq of the keys' positions, full ones after every key) to 3e-2 of the
    // largest reference value: bf16 outputs, not the rounding ladder of the self-attention cases above.
    MOERUN_SKIP_WITHOUT_DEVICE();
    struct Case {
      const char* name;
      AttentionShape a;
    };
    auto with = [](AttentionShape a, int64_t seq_kv, int64_t v_dim, int64_t window) {
      a.seq_kv = seq_kv;
      a.v_dim = v_dim;
      a.window = window;
      return a;
    };
    const std::vector<Case> cases = {
        {"bottom-right causal 128 x 384", with(shape(128, 8, 2, 128), 384, 0, 0)},
        {"full block 128 x 192", with(shape(128, 8, 2, 128, false), 192, 0, 0)},
        {"window 64", with(shape(256, 8, 2, 64), 0, 0, 64)},
        {"MLA qk 192, v 128", with(shape(128, 4, 4, 192), 0, 128, 0)},
    };
    CudnnHandle handle;
    cudaStream_t stream = nullptr;
    MOERUN_CUDA_CHECK(cudaStreamCreate(&stream));
    for (const Case& c : cases) {
      INFO(c.name);
      const AttentionShape& a = c.a;
      FlashAttention fa(handle.get(), a);
      std::printf("%s: %s\n", c.name, fa.unsupported().empty() ? "built" : fa.unsupported().c_str());
      REQUIRE(fa.unsupported().empty());
      const Mf q = random_bf16(a.batch * a.seq, a.q_heads * a.head_dim, 1);
      const Mf k = random_bf16(a.batch * a.keys(), a.kv_heads * a.head_dim, 2);
      const Mf v = random_bf16(a.batch * a.keys(), a.kv_heads * a.value_dim(), 3);
      const Mf d_o = random_bf16(a.batch * a.seq, a.q_heads * a.value_dim(), 4);
      const auto d_q = upload(q), d_k = upload(k), d_v = upload(v), d_dout = upload(d_o);
      auto out = poisoned<bf16>(a.o_elems());
      auto stats = poisoned<float>(a.stats_elems());
      auto dq = poisoned<bf16>(a.q_elems());
      auto dk = poisoned<bf16>(a.k_elems());
      auto dv = poisoned<bf16>(a.v_elems());
      fa.forward(d_q.data(), d_k.data(), d_v.data(), out.data(), stats.data(), stream);
      fa.backward(d_q.data(), d_k.data(), d_v.data(), out.data(), d_dout.data(), stats.data(), dq.data(),
                  dk.data(), dv.data(), stream);
      MOERUN_CUDA_CHECK(cudaStreamSynchronize(stream));
      const Mf o_gpu = download(out, q.rows(), a.q_heads * a.value_dim()),
               dq_gpu = download(dq, q.rows(), q.cols()), dk_gpu = download(dk, k.rows(), k.cols()),
               dv_gpu = download(dv, v.rows(), v.cols());
      CHECK(o_gpu.allFinite());
      CHECK(dq_gpu.allFinite());
      CHECK(dk_gpu.allFinite());
      CHECK(dv_gpu.allFinite());
      const Eigen::Index sq = a.seq, skv = a.keys();
      std::vector<int64_t> q_pos(static_cast<size_t>(sq)), k_pos(static_cast<size_t>(skv));
      for (Eigen::Index j = 0; j < skv; ++j) k_pos[static_cast<size_t>(j)] = j;
      for (Eigen::Index i = 0; i < sq; ++i) q_pos[static_cast<size_t>(i)] = a.causal ? skv - sq + i : skv;
      const cpu::AttnHeads heads{a.q_heads, a.kv_heads, a.head_dim, 0, 0, a.window, a.value_dim()};
      const Md qd = q.cast<double>(), kd = k.cast<double>(), vd = v.cast<double>(), dod = d_o.cast<double>();
      double err[4] = {0, 0, 0, 0}, ref_max[4] = {0, 0, 0, 0};
      auto note = [&](int i, const Mf& gpu_rows, const Md& ref) {
        err[i] = std::max(err[i], (gpu_rows.cast<double>() - ref).cwiseAbs().maxCoeff());
        ref_max[i] = std::max(ref_max[i], ref.cwiseAbs().maxCoeff());
      };
      for (Eigen::Index b = 0; b < a.batch; ++b) {
        const auto f = cpu::attn_core_forward<double>(qd.middleRows(b * sq, sq), kd.middleRows(b * skv, skv),
                                                      vd.middleRows(b * skv, skv), q_pos, k_pos, heads);
        const auto g = cpu::attn_core_backward<double>(qd.middleRows(b * sq, sq), kd.middleRows(b * skv, skv),
                                                       vd.middleRows(b * skv, skv), f.out, f.lse,
                                                       dod.middleRows(b * sq, sq), q_pos, k_pos, heads);
        note(0, o_gpu.middleRows(b * sq, sq), f.out);
        note(1, dq_gpu.middleRows(b * sq, sq), g.dq);
        note(2, dk_gpu.middleRows(b * skv, skv), g.dk);
        note(3, dv_gpu.middleRows(b * skv, skv), g.dv);
      }
      const char* names[4] = {"o", "dq", "dk", "dv"};
      for (int i = 0; i < 4; ++i) {
        const double rel = err[i] / std::max(1e-12, ref_max[i]);
        std::printf("%s %s: max |gpu - cpu| %.3e of max |cpu| %.3e (%.2e)\n", c.name, names[i], err[i],
                    ref_max[i], rel);
        CHECK(rel <= 3e-2);
      }
    }
    MOERUN_CUDA_CHECK(cudaStreamDestroy(stream));
  }
}
