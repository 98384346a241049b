// Shard equivalences in fp32 (what moerun runs): each kernel on its shard, combined the way the executor
// combines them (sums standing for all-reduce / reduce-scatter), equals the unsharded kernel.
// Tolerance kShardTol = 1e-5 of the largest entry: shards change only the order of fp32 sums (at most a few
// dozen terms here, so at most ~1e-6 relative), and a wrong combination is off by O(1).
#include <doctest/doctest.h>

#include <numeric>

#include "executor/kernels/cpu/kernels.h"
#include "tests/executor/kernels/cpu/test_util.h"

namespace moeplan::executor::cpu::test {
namespace {

constexpr double kShardTol = 1e-5;

MatF rndf(int64_t rows, int64_t cols, uint64_t seed, double scale = 1.0) {
  return rnd(rows, cols, seed, scale).cast<float>();
}

std::vector<int64_t> iota(int64_t n, int64_t start = 0) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), start);
  return v;
}

MatF gather_rows(const MatF& m, std::span<const int64_t> rows) {
  MatF out(static_cast<int64_t>(rows.size()), m.cols());
  for (size_t i = 0; i < rows.size(); ++i) out.row(static_cast<int64_t>(i)) = m.row(rows[i]);
  return out;
}

// Full attention layer (qkv projection, rope, attention, out projection) forward and backward.
struct AttnLayer {
  int64_t h = 16, heads = 4, kv = 2, d = 4, t = 6;
  MatF x, wqkv, wout, dy;
  std::vector<int64_t> pos;
  AttnLayer() {
    x = rndf(t, h, 40);
    wqkv.resize(h, (heads + 2 * kv) * d);
    init_block<float>(wqkv, 1, "L0.qkv", 0, 0, 0.3);
    wout.resize(heads * d, h);
    init_block<float>(wout, 1, "L0.out_proj", 0, 0, 0.3);
    dy = rndf(t, h, 41);
    pos = iota(t);
  }
  struct Result {
    MatF y, att, dx, dwqkv, dwout;
  };
  // Query heads [h0, h1): the shard's columns of qkv and rows of out_proj; the full layer is h0 = 0, h1 =
  // heads.
  Result run(int64_t h0, int64_t h1) const {
    const int64_t group = heads / kv, g0 = h0 / group, g1 = (h1 - 1) / group + 1;
    const int64_t qc = (h1 - h0) * d, kc = (g1 - g0) * d;
    const std::vector<int64_t> cols = qkv_shard_columns(heads, kv, d, h0, h1);
    const MatF w = gather_columns<float>(wqkv, cols);
    MatF w_init(h, static_cast<int64_t>(cols.size()));
    init_columns<float>(w_init, 1, "L0.qkv", 0, cols, 0.3);
    CHECK(w_init == w);  // a rank initialises exactly its slice
    const MatF wo = wout.middleRows(h0 * d, qc);
    MatF qkv = linear_forward<float>(x, w);
    rope_forward<float>(qkv.leftCols(qc), pos, d);
    rope_forward<float>(qkv.middleCols(qc, kc), pos, d);
    const AttnHeads ah{heads, kv, d, h0, g0, 0};
    const AttnOut<float> o =
        attn_core_forward<float>(qkv.leftCols(qc), qkv.middleCols(qc, kc), qkv.rightCols(kc), pos, pos, ah);
    Result r;
    r.att = o.out;
    r.y = linear_forward<float>(o.out, wo);
    r.dwout = MatF::Zero(qc, h);
    linear_wgrad<float>(o.out, dy, r.dwout);
    const MatF datt = linear_dgrad<float>(dy, wo);
    const AttnGrads<float> g = attn_core_backward<float>(qkv.leftCols(qc), qkv.middleCols(qc, kc),
                                                         qkv.rightCols(kc), o.out, o.lse, datt, pos, pos, ah);
    MatF dqkv(t, qkv.cols());
    dqkv << g.dq, g.dk, g.dv;
    rope_backward<float>(dqkv.leftCols(qc), pos, d);
    rope_backward<float>(dqkv.middleCols(qc, kc), pos, d);
    r.dwqkv = MatF::Zero(h, qkv.cols());
    linear_wgrad<float>(x, dqkv, r.dwqkv);
    r.dx = linear_dgrad<float>(dqkv, w);
    return r;
  }
};

TEST_CASE("shard: attention over head subsets (TP / Ulysses) equals attention over all heads") {
  const AttnLayer layer;
  const AttnLayer::Result full = layer.run(0, layer.heads);
  // tp 2: two heads and one kv head per rank; tp 4: one head per rank, kv heads replicated on rank pairs.
  for (const int64_t tp : {2, 4}) {
    CAPTURE(tp);
    const int64_t per = layer.heads / tp;
    MatF y = MatF::Zero(layer.t, layer.h), dx = MatF::Zero(layer.t, layer.h);
    MatF dwqkv = MatF::Zero(layer.wqkv.rows(), layer.wqkv.cols());
    for (int64_t r = 0; r < tp; ++r) {
      const AttnLayer::Result s = layer.run(r * per, (r + 1) * per);
      CHECK(rel_err<float>(s.att, full.att.middleCols(r * per * layer.d, per * layer.d)) < kShardTol);
      CHECK(rel_err<float>(s.dwout, full.dwout.middleRows(r * per * layer.d, per * layer.d)) < kShardTol);
      y += s.y;    // attn_rs: reduce-scatter (here a sum) of the row-sharded out_proj
      dx += s.dx;  // the column-sharded qkv dgrad sums over the group
      const std::vector<int64_t> cols =
          qkv_shard_columns(layer.heads, layer.kv, layer.d, r * per, (r + 1) * per);
      for (size_t j = 0; j < cols.size(); ++j) dwqkv.col(cols[j]) += s.dwqkv.col(static_cast<int64_t>(j));
    }
    CHECK(rel_err<float>(y, full.y) < kShardTol);
    CHECK(rel_err<float>(dx, full.dx) < kShardTol);
    CHECK(rel_err<float>(dwqkv, full.dwqkv) < kShardTol);  // replicated kv columns: summed over their ranks
  }
}

TEST_CASE(
    "shard: load-balanced context-parallel query chunks against all keys equal rows of full attention") {
  const int64_t s_len = 8, heads = 4, kv = 2, d = 4;
  const MatF q_raw = rndf(s_len, heads * d, 42), k_raw = rndf(s_len, kv * d, 43), v = rndf(s_len, kv * d, 44);
  const MatF dout = rndf(s_len, heads * d, 45);
  const std::vector<int64_t> all = iota(s_len);
  const AttnHeads ah{heads, kv, d, 0, 0, 0};
  MatF q = q_raw, k = k_raw;
  rope_forward<float>(q, all, d);
  rope_forward<float>(k, all, d);  // keys are roped by their owners, then all-gathered
  const AttnOut<float> full = attn_core_forward<float>(q, k, v, all, all, ah);
  const AttnGrads<float> gfull = attn_core_backward<float>(q, k, v, full.out, full.lse, dout, all, all, ah);
  MatF dq_full = gfull.dq;
  rope_backward<float>(dq_full, all, d);
  // cp 2: four chunks of 2; rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2.
  const std::vector<std::vector<int64_t>> ranks{{0, 1, 6, 7}, {2, 3, 4, 5}};
  MatF dk = MatF::Zero(s_len, kv * d), dv = MatF::Zero(s_len, kv * d);
  for (const auto& rows : ranks) {
    MatF qr = gather_rows(q_raw, rows);
    rope_forward<float>(qr, rows, d);
    const AttnOut<float> o = attn_core_forward<float>(qr, k, v, rows, all, ah);
    CHECK(rel_err<float>(o.out, gather_rows(full.out, rows)) < kShardTol);
    const AttnGrads<float> g =
        attn_core_backward<float>(qr, k, v, o.out, o.lse, gather_rows(dout, rows), rows, all, ah);
    MatF dq = g.dq;
    rope_backward<float>(dq, rows, d);
    CHECK(rel_err<float>(dq, gather_rows(dq_full, rows)) < kShardTol);
    dk += g.dk;  // reduce-scatter of dk, dv to the keys' owners
    dv += g.dv;
  }
  CHECK(rel_err<float>(dk, gfull.dk) < kShardTol);
  CHECK(rel_err<float>(dv, gfull.dv) < kShardTol);
}

TEST_CASE("shard: attention over two key sets merges to full attention, backward per key set") {
  const int64_t s_len = 8, heads = 2, kv = 1, d = 4;
  const MatF q = rndf(s_len, heads * d, 46), k = rndf(s_len, kv * d, 47), v = rndf(s_len, kv * d, 48);
  const MatF dout = rndf(s_len, heads * d, 49);
  const std::vector<int64_t> all = iota(s_len), first = iota(4), second = iota(4, 4);
  const AttnHeads ah{heads, kv, d, 0, 0, 0};
  const AttnOut<float> full = attn_core_forward<float>(q, k, v, all, all, ah);
  const AttnGrads<float> gfull = attn_core_backward<float>(q, k, v, full.out, full.lse, dout, all, all, ah);
  AttnOut<float> m = attn_core_forward<float>(q, k.topRows(4), v.topRows(4), all, first, ah);
  const AttnOut<float> b = attn_core_forward<float>(q, k.bottomRows(4), v.bottomRows(4), all, second, ah);
  attn_merge<float>(m.out, m.lse, b.out, b.lse);
  CHECK(rel_err<float>(m.out, full.out) < kShardTol);
  CHECK(rel_err<float>(m.lse, full.lse) < kShardTol);
  const AttnGrads<float> g1 =
      attn_core_backward<float>(q, k.topRows(4), v.topRows(4), m.out, m.lse, dout, all, first, ah);
  const AttnGrads<float> g2 =
      attn_core_backward<float>(q, k.bottomRows(4), v.bottomRows(4), m.out, m.lse, dout, all, second, ah);
  CHECK(rel_err<float>(MatF(g1.dq + g2.dq), gfull.dq) < kShardTol);
  MatF dk(s_len, kv * d), dv(s_len, kv * d);
  dk << g1.dk, g2.dk;
  dv << g1.dv, g2.dv;
  CHECK(rel_err<float>(dk, gfull.dk) < kShardTol);
  CHECK(rel_err<float>(dv, gfull.dv) < kShardTol);
}

TEST_CASE("shard: column-sharded fc13 + SwiGLU + row-sharded fc2, summed, equals the unsharded MLP") {
  const int64_t t = 5, h = 16, f = 12;
  const MatF x = rndf(t, h, 50), dy = rndf(t, h, 51);
  MatF w13(h, 2 * f), w2(f, h);
  init_block<float>(w13, 3, "L0.fc13", 0, 0, 0.3);
  init_block<float>(w2, 3, "L0.fc2", 0, 0, 0.3);
  const MatF h13 = linear_forward<float>(x, w13);
  const MatF a = swiglu_forward<float>(h13);
  const MatF y = linear_forward<float>(a, w2);
  const MatF da = linear_dgrad<float>(dy, w2);
  MatF dw2 = MatF::Zero(f, h), dw13 = MatF::Zero(h, 2 * f);
  linear_wgrad<float>(a, dy, dw2);
  const MatF dh13 = swiglu_backward<float>(h13, da);
  linear_wgrad<float>(x, dh13, dw13);
  const MatF dx = linear_dgrad<float>(dh13, w13);
  for (const int64_t tp : {2, 3}) {
    CAPTURE(tp);
    const int64_t fr = f / tp;
    MatF ys = MatF::Zero(t, h), dxs = MatF::Zero(t, h);
    for (int64_t r = 0; r < tp; ++r) {
      const std::vector<int64_t> cols = fc13_shard_columns(f, r * fr, (r + 1) * fr);
      MatF w13r(h, 2 * fr);
      init_columns<float>(w13r, 3, "L0.fc13", 0, cols, 0.3);
      CHECK(w13r == gather_columns<float>(w13, cols));
      MatF w2r(fr, h);
      init_block<float>(w2r, 3, "L0.fc2", r * fr, 0, 0.3);
      CHECK(w2r == w2.middleRows(r * fr, fr));
      const MatF h13r = linear_forward<float>(x, w13r);
      const MatF ar = swiglu_forward<float>(h13r);
      ys += linear_forward<float>(ar, w2r);  // ffn_rs
      const MatF dar = linear_dgrad<float>(dy, w2r);
      MatF dw2r = MatF::Zero(fr, h), dw13r = MatF::Zero(h, 2 * fr);
      linear_wgrad<float>(ar, dy, dw2r);
      const MatF dh13r = swiglu_backward<float>(h13r, dar);
      linear_wgrad<float>(x, dh13r, dw13r);
      dxs += linear_dgrad<float>(dh13r, w13r);
      CHECK(rel_err<float>(dw2r, dw2.middleRows(r * fr, fr)) < kShardTol);
      CHECK(rel_err<float>(dw13r, gather_columns<float>(dw13, cols)) < kShardTol);
    }
    CHECK(rel_err<float>(ys, y) < kShardTol);
    CHECK(rel_err<float>(dxs, dx) < kShardTol);
  }
}

TEST_CASE("shard: vocab-parallel cross entropy over 2 and 4 shards equals the unsharded CE") {
  const int64_t t = 6, h = 8, vocab = 20;
  const MatF x = rndf(t, h, 52);
  const MatF w = rndf(h, vocab, 53, 0.5);
  const std::vector<int64_t> targets{0, 19, 7, 7, 12, 3};
  const double inv = 1.0 / 24.0;  // this micro-batch is a quarter of the global batch
  const MatF logits = linear_forward<float>(x, w);
  const Vec<float> m = loss_local_max<float>(logits);
  const CeStats<float> st = loss_local_stats<float>(logits, targets, 0, m);
  const float loss = loss_forward<float>(m, st, inv);
  const MatF dlogits = loss_backward<float>(logits, targets, 0, m, st.sum_exp, inv);
  const MatF dx = linear_dgrad<float>(dlogits, w);
  const std::vector<std::vector<int64_t>> splits{{0, 7, 20}, {0, 5, 10, 15, 20}};
  for (const auto& bounds : splits) {
    const size_t n = bounds.size() - 1;
    CAPTURE(n);
    std::vector<MatF> lg(n);
    Vec<float> gmax = Vec<float>::Constant(t, -std::numeric_limits<float>::infinity());
    for (size_t r = 0; r < n; ++r) {
      lg[r] = linear_forward<float>(x, w.middleCols(bounds[r], bounds[r + 1] - bounds[r]));
      gmax = gmax.cwiseMax(loss_local_max<float>(lg[r]));  // all-reduce MAX
    }
    CeStats<float> g{Vec<float>::Zero(t), Vec<float>::Zero(t)};
    for (size_t r = 0; r < n; ++r) {
      const CeStats<float> s = loss_local_stats<float>(lg[r], targets, bounds[r], gmax);
      g.sum_exp += s.sum_exp;  // all-reduce SUM
      g.target_logit += s.target_logit;
    }
    CHECK(loss_forward<float>(gmax, g, inv) == doctest::Approx(loss).epsilon(1e-6));
    MatF dxs = MatF::Zero(t, h);
    for (size_t r = 0; r < n; ++r) {
      const MatF d = loss_backward<float>(lg[r], targets, bounds[r], gmax, g.sum_exp, inv);
      CHECK(rel_err<float>(d, dlogits.middleCols(bounds[r], bounds[r + 1] - bounds[r])) < kShardTol);
      dxs += linear_dgrad<float>(d, w.middleCols(bounds[r], bounds[r + 1] - bounds[r]));
    }
    CHECK(rel_err<float>(dxs, dx) < kShardTol);
  }
}

TEST_CASE("shard: vocab-parallel embedding summed over shards equals the full lookup, backward per shard") {
  const std::vector<int64_t> ids{0, 19, 7, 7, 12, 3};
  const MatF table = rndf(20, 8, 54), dy = rndf(6, 8, 55);
  const MatF full = embedding_forward<float>(ids, table, 0);
  MatF dfull = MatF::Zero(20, 8);
  embedding_backward<float>(ids, dy, 0, dfull);
  MatF sum = MatF::Zero(6, 8);
  for (const int64_t v0 : {0, 5, 10, 15}) {
    sum += embedding_forward<float>(ids, table.middleRows(v0, 5), v0);
    MatF d = MatF::Zero(5, 8);
    embedding_backward<float>(ids, dy, v0, d);
    CHECK(d == dfull.middleRows(v0, 5));
  }
  CHECK(sum == full);
}

TEST_CASE("shard: experts split into two ranges equal all experts (forward, dgrad, wgrad)") {
  const int64_t t = 10, h = 6, f = 5, e_n = 4, k = 2;
  const MatF logits = rndf(t, e_n, 56, 2.0);
  const Route<float> route = router_forward<float>(logits, k);
  const PermuteIndex idx = make_permute_index(route.experts, t, k, e_n);
  const MatF xp = permute_forward<float>(rndf(t, h, 57), idx);
  const MatF w = rndf(e_n * h, f, 58), dy = rndf(t * k, f, 59);
  const MatF y = expert_gemm_forward<float>(xp, w, idx.counts);
  const MatF dx = expert_gemm_dgrad<float>(dy, w, idx.counts);
  MatF dw = MatF::Zero(e_n * h, f);
  expert_gemm_wgrad<float>(xp, dy, idx.counts, dw);
  for (const auto& [e0, e1] : {std::pair<int64_t, int64_t>{0, 2}, {2, 4}}) {
    const int64_t r0 = idx.offsets[static_cast<size_t>(e0)], rows = idx.offsets[static_cast<size_t>(e1)] - r0;
    const std::span<const int64_t> counts(idx.counts.data() + e0, static_cast<size_t>(e1 - e0));
    const MatF wr = w.middleRows(e0 * h, (e1 - e0) * h);
    CHECK(expert_gemm_forward<float>(xp.middleRows(r0, rows), wr, counts) == y.middleRows(r0, rows));
    CHECK(expert_gemm_dgrad<float>(dy.middleRows(r0, rows), wr, counts) == dx.middleRows(r0, rows));
    MatF dwr = MatF::Zero(wr.rows(), f);
    expert_gemm_wgrad<float>(xp.middleRows(r0, rows), dy.middleRows(r0, rows), counts, dwr);
    CHECK(dwr == dw.middleRows(e0 * h, (e1 - e0) * h));
  }
}

TEST_CASE("shard: router statistics of token shards, summed, give the micro-batch's aux loss and gradient") {
  const int64_t t = 12, e_n = 4, k = 2;
  const MatF logits = rndf(t, e_n, 60, 2.0);
  const MatF dgates = rndf(t, k, 61);
  const double coef = 0.01, scale = 0.5;
  const Route<float> route = router_forward<float>(logits, k);
  const RouterStats<float> st = router_local_stats<float>(route);
  const float aux = aux_loss<float>(st, t, k, coef);
  const MatF dlogits = router_backward<float>(route, dgates, aux_loss_dprobs<float>(st, t, k, coef, scale));
  // Two ranks hold tokens [0, 5) and [5, 12) (e.g. two SP ranks).
  const Route<float> ra = router_forward<float>(logits.topRows(5), k),
                     rb = router_forward<float>(logits.bottomRows(7), k);
  RouterStats<float> g = router_local_stats<float>(ra);
  const RouterStats<float> sb = router_local_stats<float>(rb);
  g.counts += sb.counts;  // all-reduce SUM
  g.prob_sums += sb.prob_sums;
  CHECK(aux_loss<float>(g, t, k, coef) == doctest::Approx(aux).epsilon(1e-6));
  const Vec<float> dp = aux_loss_dprobs<float>(g, t, k, coef, scale);
  CHECK(rel_err<float>(router_backward<float>(ra, dgates.topRows(5), dp), dlogits.topRows(5)) < kShardTol);
  CHECK(rel_err<float>(router_backward<float>(rb, dgates.bottomRows(7), dp), dlogits.bottomRows(7)) <
        kShardTol);
}

}  // namespace
}  // namespace moeplan::executor::cpu::test
