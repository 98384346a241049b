// Finite-difference checks (double) of every kernel's backward.
#include <doctest/doctest.h>

#include "executor/kernels/cpu/kernels.h"
#include "tests/executor/kernels/cpu/test_util.h"

namespace moeplan::executor::cpu::test {
namespace {

TEST_CASE("linear: dgrad and wgrad match finite differences, wgrad accumulates") {
  MatD x = rnd(5, 4, 1), w = rnd(4, 3, 2);
  const MatD r = rnd(5, 3, 3);
  auto f = [&] { return dot(linear_forward<double>(x, w), r); };
  const MatD dx = linear_dgrad<double>(r, w);
  MatD dw = MatD::Zero(4, 3);
  linear_wgrad<double>(x, r, dw);
  check_grad(x, dx, f, "dx");
  check_grad(w, dw, f, "dw");
  MatD dw2 = dw;
  linear_wgrad<double>(x, r, dw2);
  CHECK((dw2 - 2.0 * dw).cwiseAbs().maxCoeff() < 1e-14);
}

TEST_CASE("rmsnorm: dx and dgamma match finite differences") {
  MatD x = rnd(4, 6, 4), g = (MatD::Ones(1, 6) + rnd(1, 6, 5, 0.3)).eval();
  const MatD r = rnd(4, 6, 6);
  auto f = [&] { return dot(rmsnorm_forward<double>(x, g).y, r); };
  const RmsNormOut<double> o = rmsnorm_forward<double>(x, g);
  MatD dg = MatD::Zero(1, 6);
  const MatD dx = rmsnorm_backward<double>(x, g, o.inv_rms, r, dg);
  check_grad(x, dx, f, "dx");
  check_grad(g, dg, f, "dgamma");
  // Unit gains: every row has root mean square 1 (up to eps).
  const MatD y = rmsnorm_forward<double>(x, MatD::Ones(1, 6)).y;
  for (int64_t t = 0; t < 4; ++t)
    CHECK(std::sqrt(y.row(t).squaredNorm() / 6.0) == doctest::Approx(1.0).epsilon(1e-5));
}

TEST_CASE("swiglu: [gate | up] layout and backward") {
  MatD in = rnd(4, 6, 7, 2.0);
  const MatD r = rnd(4, 3, 8);
  const MatD y = swiglu_forward<double>(in);
  const double g = in(1, 2), u = in(1, 5);
  CHECK(y(1, 2) == doctest::Approx(g / (1.0 + std::exp(-g)) * u));
  auto f = [&] { return dot(swiglu_forward<double>(in), r); };
  check_grad(in, swiglu_backward<double>(in, r), f, "din");
}

TEST_CASE("rope: rotation from absolute positions, backward is its transpose") {
  const int64_t d = 8;
  const std::vector<int64_t> pos{0, 5, 17, 1000};
  MatD x = rnd(4, 2 * d, 9);
  const MatD r = rnd(4, 2 * d, 10);
  MatD y = x;
  rope_forward<double>(y, pos, d);
  CHECK((y.row(0) - x.row(0)).cwiseAbs().maxCoeff() == 0.0);  // position 0: identity
  for (int64_t t = 0; t < 4; ++t)
    CHECK(y.row(t).squaredNorm() == doctest::Approx(x.row(t).squaredNorm()).epsilon(1e-12));
  // Dim 0 and dim d/2 of head 1 at position 5 rotate by 5 radians (i = 0: frequency 1).
  const double c = std::cos(5.0), s = std::sin(5.0);
  CHECK(y(1, d) == doctest::Approx(x(1, d) * c - x(1, d + d / 2) * s));
  CHECK(y(1, d + d / 2) == doctest::Approx(x(1, d + d / 2) * c + x(1, d) * s));
  auto f = [&] {
    MatD z = x;
    rope_forward<double>(z, pos, d);
    return dot(z, r);
  };
  MatD dx = r;
  rope_backward<double>(dx, pos, d);
  check_grad(x, dx, f, "dx");
}

struct AttnCase {
  const char* name;
  std::vector<int64_t> q_pos, k_pos, q_seg, k_seg;
  int64_t window = 0;
};

TEST_CASE("attention: dq, dk, dv match finite differences (GQA, causal, windows, segments, MLA's v_dim)") {
  const std::vector<AttnCase> cases{
      {"causal, contiguous", {0, 1, 2, 3, 4, 5}, {0, 1, 2, 3, 4, 5}, {}, {}, 0},
      {"query chunk against keys", {2, 3, 9, 10}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, {}, {}, 0},
      {"sliding window 3", {0, 1, 2, 3, 4, 5, 6}, {0, 1, 2, 3, 4, 5, 6}, {}, {}, 3},
      {"two sequences", {0, 1, 2, 0, 1, 2}, {0, 1, 2, 0, 1, 2}, {0, 0, 0, 1, 1, 1}, {0, 0, 0, 1, 1, 1}, 0},
      {"a query with no visible key", {1, 2, 3}, {2, 3}, {}, {}, 0},
  };
  const int64_t h = 4, kv = 2, d = 4;
  for (const auto& c : cases) {
    // Value heads as wide as the score heads (v_dim 0), narrower (MLA's 128 against 192) and wider.
    for (const int64_t v_dim : {int64_t{0}, int64_t{3}, int64_t{6}}) {
      CAPTURE(c.name);
      CAPTURE(v_dim);
      const int64_t dv = v_dim > 0 ? v_dim : d;
      const auto tq = static_cast<int64_t>(c.q_pos.size()), tk = static_cast<int64_t>(c.k_pos.size());
      MatD q = rnd(tq, h * d, 11), k = rnd(tk, kv * d, 12), v = rnd(tk, kv * dv, 13);
      const MatD r = rnd(tq, h * dv, 14);
      const AttnHeads heads{h, kv, d, 0, 0, c.window, v_dim};
      auto f = [&] {
        return dot(attn_core_forward<double>(q, k, v, c.q_pos, c.k_pos, heads, c.q_seg, c.k_seg).out, r);
      };
      const AttnOut<double> o = attn_core_forward<double>(q, k, v, c.q_pos, c.k_pos, heads, c.q_seg, c.k_seg);
      const AttnGrads<double> g =
          attn_core_backward<double>(q, k, v, o.out, o.lse, r, c.q_pos, c.k_pos, heads, c.q_seg, c.k_seg);
      check_grad(q, g.dq, f, "dq");
      check_grad(k, g.dk, f, "dk");
      check_grad(v, g.dv, f, "dv");
    }
  }
}

TEST_CASE("attention: narrower value heads equal the same values zero-padded to the score head dim") {
  // MLA's shape (scores over d, values over dv < d) against attention whose value heads are the same
  // values padded with zeros to d: the outputs, lse, dq and dk are equal, and so are dv's first dv columns.
  const int64_t h = 4, kv = 2, d = 6, dv = 4, t = 7;
  const std::vector<int64_t> pos{0, 1, 2, 3, 4, 5, 6};
  const MatD q = rnd(t, h * d, 21), k = rnd(t, kv * d, 22), v = rnd(t, kv * dv, 23),
             dout = rnd(t, h * dv, 24);
  MatD v_pad = MatD::Zero(t, kv * d), dout_pad = MatD::Zero(t, h * d);
  for (int64_t j = 0; j < kv; ++j) v_pad.middleCols(j * d, dv) = v.middleCols(j * dv, dv);
  for (int64_t i = 0; i < h; ++i) dout_pad.middleCols(i * d, dv) = dout.middleCols(i * dv, dv);
  const AttnHeads narrow{h, kv, d, 0, 0, 0, dv}, padded{h, kv, d};
  const AttnOut<double> o = attn_core_forward<double>(q, k, v, pos, pos, narrow);
  const AttnOut<double> p = attn_core_forward<double>(q, k, v_pad, pos, pos, padded);
  REQUIRE(o.out.cols() == h * dv);
  CHECK((o.lse - p.lse).cwiseAbs().maxCoeff() < 1e-14);
  for (int64_t i = 0; i < h; ++i) {
    CHECK((o.out.middleCols(i * dv, dv) - p.out.middleCols(i * d, dv)).cwiseAbs().maxCoeff() < 1e-14);
    CHECK(p.out.middleCols(i * d + dv, d - dv).cwiseAbs().maxCoeff() == 0.0);
  }
  const AttnGrads<double> g = attn_core_backward<double>(q, k, v, o.out, o.lse, dout, pos, pos, narrow);
  const AttnGrads<double> e =
      attn_core_backward<double>(q, k, v_pad, p.out, p.lse, dout_pad, pos, pos, padded);
  CHECK((g.dq - e.dq).cwiseAbs().maxCoeff() < 1e-13);
  CHECK((g.dk - e.dk).cwiseAbs().maxCoeff() < 1e-13);
  REQUIRE(g.dv.cols() == kv * dv);
  for (int64_t j = 0; j < kv; ++j)
    CHECK((g.dv.middleCols(j * dv, dv) - e.dv.middleCols(j * d, dv)).cwiseAbs().maxCoeff() < 1e-13);
}

TEST_CASE("attention: output rows are softmax-weighted values and lse matches") {
  const int64_t d = 2;
  const MatD q = rnd(2, d, 15), k = rnd(2, d, 16), v = rnd(2, d, 17);
  const std::vector<int64_t> pos{0, 1};
  const AttnOut<double> o = attn_core_forward<double>(q, k, v, pos, pos, AttnHeads{1, 1, d});
  CHECK((o.out.row(0) - v.row(0)).cwiseAbs().maxCoeff() < 1e-15);  // position 0 sees only itself
  const double s0 = q.row(1).dot(k.row(0)) / std::sqrt(2.0), s1 = q.row(1).dot(k.row(1)) / std::sqrt(2.0);
  const double lse = std::log(std::exp(s0) + std::exp(s1));
  CHECK(o.lse(1, 0) == doctest::Approx(lse));
  const MatD expect = (std::exp(s0 - lse) * v.row(0) + std::exp(s1 - lse) * v.row(1)).eval();
  CHECK((o.out.row(1) - expect).cwiseAbs().maxCoeff() < 1e-14);
}

TEST_CASE("router: softmax, top-k with ties to the lower index, renormalised gates") {
  MatD logits(2, 4);
  logits << 1.0, 3.0, 3.0, 0.5,  //
      0.0, 0.0, 0.0, 0.0;
  const Route<double> r = router_forward<double>(logits, 2, true);
  CHECK(r.experts == std::vector<int64_t>{1, 2, 0, 1});
  CHECK(r.gates(0, 0) == doctest::Approx(0.5));
  CHECK(r.gates(1, 1) == doctest::Approx(0.5));
  CHECK(r.probs.row(0).sum() == doctest::Approx(1.0));
  const Route<double> raw = router_forward<double>(logits, 2, false);
  CHECK(raw.gates(1, 0) == doctest::Approx(0.25));
  CHECK(raw.gates(0, 0) == doctest::Approx(r.probs(0, 1)));
}

TEST_CASE("router: gradient through the gates into the logits (renormalised and raw)") {
  for (const bool renorm : {true, false}) {
    CAPTURE(renorm);
    MatD logits = rnd(6, 5, 18, 2.0);
    const MatD rg = rnd(6, 2, 19);
    auto f = [&] { return dot(router_forward<double>(logits, 2, renorm).gates, rg); };
    const Route<double> r = router_forward<double>(logits, 2, renorm);
    check_grad(logits, router_backward<double>(r, rg, VecD()), f, "dlogits");
  }
}

TEST_CASE("router: aux loss gradient (f_e constant) from the global statistics") {
  MatD logits = rnd(8, 4, 20, 2.0);
  const int64_t k = 2;
  const double coef = 0.5, scale = 0.25;
  auto f = [&] {
    const Route<double> r = router_forward<double>(logits, k);
    return scale * aux_loss<double>(router_local_stats<double>(r), 8, k, coef);
  };
  const Route<double> r = router_forward<double>(logits, k);
  const RouterStats<double> st = router_local_stats<double>(r);
  CHECK(st.counts.sum() == 16.0);
  CHECK(st.prob_sums.sum() == doctest::Approx(8.0));
  // Hand value: coef * E * sum_e (c_e / (T k)) (P_e / T).
  double expect = 0;
  for (int64_t e = 0; e < 4; ++e) expect += st.counts(e) / 16.0 * st.prob_sums(e) / 8.0;
  CHECK(aux_loss<double>(st, 8, k, coef) == doctest::Approx(coef * 4.0 * expect));
  const MatD dlogits =
      router_backward<double>(r, MatD::Zero(8, k), aux_loss_dprobs<double>(st, 8, k, coef, scale));
  check_grad(logits, dlogits, f, "dlogits");
}

TEST_CASE("permute / unpermute: stable grouping by expert, gradients into rows and gates") {
  const int64_t t_n = 5, k = 2, e_n = 4, hd = 3;
  const std::vector<int64_t> experts{2, 0, 0, 3, 2, 1, 2, 0, 3, 1};  // (token, slot) row-major
  const PermuteIndex idx = make_permute_index(experts, t_n, k, e_n);
  CHECK(idx.counts == std::vector<int64_t>{3, 2, 3, 2});
  CHECK(idx.offsets == std::vector<int64_t>{0, 3, 5, 8, 10});
  CHECK(idx.row_token == std::vector<int64_t>{0, 1, 3, 2, 4, 0, 2, 3, 1, 4});
  for (int64_t s = 0; s < t_n * k; ++s) {
    const int64_t row = idx.slot_row[static_cast<size_t>(s)];
    CHECK(idx.row_token[static_cast<size_t>(row)] == s / k);
    CHECK(idx.row_slot[static_cast<size_t>(row)] == s % k);
  }
  MatD x = rnd(t_n, hd, 21);
  const MatD rp = rnd(t_n * k, hd, 22);
  auto fp = [&] { return dot(permute_forward<double>(x, idx), rp); };
  check_grad(x, permute_backward<double>(rp, idx), fp, "permute dx");

  MatD yp = rnd(t_n * k, hd, 23), gates = rnd(t_n, k, 24);
  const MatD base = rnd(t_n, hd, 25), r = rnd(t_n, hd, 26);
  auto fu = [&] {
    MatD out = base;
    unpermute_forward<double>(yp, idx, gates, out);
    return dot(out, r);
  };
  const UnpermuteGrads<double> g = unpermute_backward<double>(r, yp, idx, gates);
  check_grad(yp, g.dyp, fu, "unpermute dyp");
  check_grad(gates, g.dgates, fu, "unpermute dgates");
  MatD out = base;
  unpermute_forward<double>(yp, idx, gates, out);
  const MatD expect =
      (base.row(1) + gates(1, 0) * yp.row(idx.slot_row[2]) + gates(1, 1) * yp.row(idx.slot_row[3])).eval();
  CHECK((out.row(1) - expect).cwiseAbs().maxCoeff() < 1e-14);
}

TEST_CASE("expert GEMMs: grouped forward, dgrad, wgrad (with an empty expert)") {
  const std::vector<int64_t> counts{2, 0, 5};
  MatD x = rnd(7, 3, 27), w = rnd(9, 4, 28);
  const MatD r = rnd(7, 4, 29);
  const MatD y = expert_gemm_forward<double>(x, w, counts);
  CHECK((y.middleRows(2, 5) - x.middleRows(2, 5) * w.middleRows(6, 3)).cwiseAbs().maxCoeff() < 1e-14);
  auto f = [&] { return dot(expert_gemm_forward<double>(x, w, counts), r); };
  MatD dw = MatD::Zero(9, 4);
  expert_gemm_wgrad<double>(x, r, counts, dw);
  check_grad(x, expert_gemm_dgrad<double>(r, w, counts), f, "dx");
  check_grad(w, dw, f, "dw");
  CHECK(dw.middleRows(3, 3).cwiseAbs().maxCoeff() == 0.0);
}

TEST_CASE("MoE block end to end: gradients reach the router through gates and aux loss") {
  // x -> router -> permute -> fc13 -> swiglu -> fc2 -> unpermute (gates) ; loss = dot(out, r) + aux.
  const int64_t t_n = 6, hd = 4, e_n = 4, k = 2, f = 3;
  MatD x = rnd(t_n, hd, 30), wr = rnd(hd, e_n, 31), w13 = rnd(e_n * hd, 2 * f, 32), w2 = rnd(e_n * f, hd, 33);
  const MatD r = rnd(t_n, hd, 34);
  const double coef = 0.3;
  auto forward = [&](bool grads, MatD* dx, MatD* dwr, MatD* dw13, MatD* dw2) {
    const MatD logits = linear_forward<double>(x, wr);
    const Route<double> route = router_forward<double>(logits, k);
    const RouterStats<double> st = router_local_stats<double>(route);
    const PermuteIndex idx = make_permute_index(route.experts, t_n, k, e_n);
    const MatD xp = permute_forward<double>(x, idx);
    const MatD h13 = expert_gemm_forward<double>(xp, w13, idx.counts);
    const MatD a = swiglu_forward<double>(h13);
    const MatD yp = expert_gemm_forward<double>(a, w2, idx.counts);
    MatD out = MatD::Zero(t_n, hd);
    unpermute_forward<double>(yp, idx, route.gates, out);
    const double loss = dot(out, r) + aux_loss<double>(st, t_n, k, coef);
    if (!grads) return loss;
    const UnpermuteGrads<double> ug = unpermute_backward<double>(r, yp, idx, route.gates);
    const MatD da = expert_gemm_dgrad<double>(ug.dyp, w2, idx.counts);
    expert_gemm_wgrad<double>(a, ug.dyp, idx.counts, *dw2);
    const MatD dh13 = swiglu_backward<double>(h13, da);
    expert_gemm_wgrad<double>(xp, dh13, idx.counts, *dw13);
    *dx = permute_backward<double>(expert_gemm_dgrad<double>(dh13, w13, idx.counts), idx);
    const MatD dlogits = router_backward<double>(route, ug.dgates, aux_loss_dprobs<double>(st, t_n, k, coef));
    linear_wgrad<double>(x, dlogits, *dwr);
    *dx += linear_dgrad<double>(dlogits, wr);
    return loss;
  };
  MatD dx, dwr = MatD::Zero(hd, e_n), dw13 = MatD::Zero(e_n * hd, 2 * f), dw2 = MatD::Zero(e_n * f, hd);
  forward(true, &dx, &dwr, &dw13, &dw2);
  auto fl = [&] { return forward(false, nullptr, nullptr, nullptr, nullptr); };
  check_grad(x, dx, fl, "dx");
  check_grad(wr, dwr, fl, "d router");
  check_grad(w13, dw13, fl, "d fc13");
  check_grad(w2, dw2, fl, "d fc2");
}

TEST_CASE("embedding: lookup of local rows, zero rows outside, backward accumulates") {
  const std::vector<int64_t> ids{3, 1, 3, 0, 4};
  MatD table = rnd(5, 3, 35);
  const MatD y = embedding_forward<double>(ids, table, 0);
  CHECK((y.row(0) - table.row(3)).cwiseAbs().maxCoeff() == 0.0);
  const MatD r = rnd(5, 3, 36);
  auto f = [&] { return dot(embedding_forward<double>(ids, table, 0), r); };
  MatD dt = MatD::Zero(5, 3);
  embedding_backward<double>(ids, r, 0, dt);
  check_grad(table, dt, f, "dtable");
  // Shard [2, 4): ids 3 (twice) are local, 1, 0, 4 give zero rows.
  const MatD shard = table.middleRows(2, 2);
  const MatD ys = embedding_forward<double>(ids, shard, 2);
  CHECK(ys.row(1).cwiseAbs().maxCoeff() == 0.0);
  CHECK((ys.row(2) - table.row(3)).cwiseAbs().maxCoeff() == 0.0);
}

TEST_CASE("cross entropy: loss value and gradient of the logits") {
  const std::vector<int64_t> targets{0, 5, 2, 2};
  MatD logits = rnd(4, 6, 37, 2.0);
  const double inv = 1.0 / 10.0;
  auto f = [&] {
    const VecD m = loss_local_max<double>(logits);
    return loss_forward<double>(m, loss_local_stats<double>(logits, targets, 0, m), inv);
  };
  const VecD m = loss_local_max<double>(logits);
  const CeStats<double> st = loss_local_stats<double>(logits, targets, 0, m);
  double expect = 0;
  for (int64_t t = 0; t < 4; ++t)
    expect += std::log(logits.row(t).array().exp().sum()) - logits(t, targets[static_cast<size_t>(t)]);
  CHECK(f() == doctest::Approx(expect * inv).epsilon(1e-12));
  check_grad(logits, loss_backward<double>(logits, targets, 0, m, st.sum_exp, inv), f, "dlogits");
}

}  // namespace
}  // namespace moeplan::executor::cpu::test
