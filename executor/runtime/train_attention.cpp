// The train runner's attention block: norm, QKV projections, rope, Ulysses all-to-alls, context-parallel
// attention and the output projection, forward and backward (see train_runner_impl.h).
#include "executor/runtime/train_runner_impl.h"

namespace moeplan::executor {

using namespace train;  // NOLINT: the runner's own helpers

void TrainRunner::Impl::attention(const Op& op, MbState& s, size_t l) {
  LayerState& c = s.layers[l];
  const LayerParams& lp = layers[l];
  Bucket& b = buckets[lp.dense];
  const bool fwd = op.phase != Phase::kBackward;
  const int64_t qc = hl * D, kc = kvl * D;
  // The rows this rank projects: the sp chunk of the micro-batch (all of it without Ulysses).
  const cpu::Positions pos = cpu::Positions(s.pos_full).subspan(sz(place.sp * Tg), sz(Tg));
  switch (static_cast<OpName>(op.name)) {
    case OpName::kAttnNorm:
      if (fwd) {
        c.n1 = cpu::rmsnorm_forward<float>(c.x_in, b.param(lp.attn_norm), cfg.norm_eps);
        c.a_full = c.n1.y;
      } else {
        if (split_qkv() && tp == 1) c.da_full = c.da_q + c.da_kv;
        const M& dn1 = tp > 1 ? c.dn1 : c.da_full;
        layer_input_grad(s, l) =
            c.dx_mid + cpu::rmsnorm_backward<float>(c.x_in, b.param(lp.attn_norm), c.n1.inv_rms, dn1,
                                                    b.grad(lp.attn_norm, op.micro_batch));
      }
      return;
    case OpName::kAttnAg:  // backward: reduce-scatter of the input gradient
      if (fwd) {
        c.a_full = all_gather_rows(tp_comm, c.n1.y);
      } else {
        if (split_qkv()) c.da_full = c.da_q + c.da_kv;
        c.dn1 = reduce_scatter_rows(tp_comm, c.da_full);
      }
      return;
    // Ulysses with inter-op overlap: the k|v projection and its all-to-all go first, beside the q
    // projection (the graph's kv_proj, kv_a2a, q_proj, rope (q only), q_a2a). k's rope is applied right
    // after its projection, and undone on its gradient right after the all-to-all back.
    case OpName::kKvProj: {
      auto w = b.param(lp.qkv).middleCols(qc, 2 * kc);
      if (fwd) {
        c.qkv.resize(Tg, qc + 2 * kc);
        c.qkv.middleCols(qc, 2 * kc) = cpu::linear_forward<float>(c.a_full, w);
        cpu::rope_forward<float>(c.qkv.middleCols(qc, kc), pos, D, cfg.rope_theta);
      } else if (op.part == GemmPart::kDgrad) {
        c.da_kv = cpu::linear_dgrad<float>(c.dkv, w);
      } else {
        cpu::linear_wgrad<float>(c.a_full, c.dkv, b.grad(lp.qkv, op.micro_batch).middleCols(qc, 2 * kc));
      }
      return;
    }
    case OpName::kQProj: {
      auto w = b.param(lp.qkv).leftCols(qc);
      if (fwd) {
        c.qkv.leftCols(qc) = cpu::linear_forward<float>(c.a_full, w);
      } else if (op.part == GemmPart::kDgrad) {
        c.da_q = cpu::linear_dgrad<float>(c.dq, w);
      } else {
        cpu::linear_wgrad<float>(c.a_full, c.dq, b.grad(lp.qkv, op.micro_batch).leftCols(qc));
      }
      return;
    }
    case OpName::kKvA2a:
      if (fwd) {
        c.kv_a = rows_to_heads(M(c.qkv.middleCols(qc, 2 * kc)), {kc, kc});
      } else {
        c.dkv = heads_to_rows(attn_input_grad(c, false), {kc, kc});
        cpu::rope_backward<float>(c.dkv.leftCols(kc), pos, D, cfg.rope_theta);
      }
      return;
    case OpName::kQA2a:
      if (fwd) {
        c.q_a = rows_to_heads(M(c.qkv.leftCols(qc)), {qc});
      } else {
        c.dq = heads_to_rows(attn_input_grad(c, true), {qc});
        cpu::rope_backward<float>(c.dq, pos, D, cfg.rope_theta);
      }
      return;
    case OpName::kQkvProj:
      if (fwd) {
        c.qkv = cpu::linear_forward<float>(c.a_full, b.param(lp.qkv));
      } else if (op.part == GemmPart::kDgrad) {
        c.da_full = cpu::linear_dgrad<float>(c.dqkv, b.param(lp.qkv));
      } else {
        cpu::linear_wgrad<float>(c.a_full, c.dqkv, b.grad(lp.qkv, op.micro_batch));
      }
      return;
    case OpName::kRope:
      if (split_qkv()) {  // q only: k was roped after its projection (kv_proj)
        if (fwd) cpu::rope_forward<float>(c.qkv.leftCols(qc), pos, D, cfg.rope_theta);
        // backward: q's rope is undone after q's all-to-all back (q_a2a), before q_proj needs it
        return;
      }
      if (fwd) {
        cpu::rope_forward<float>(c.qkv.leftCols(qc), pos, D, cfg.rope_theta);
        cpu::rope_forward<float>(c.qkv.middleCols(qc, kc), pos, D, cfg.rope_theta);
      } else {
        if (cp > 1 && sp == 1) cp_attention_grads(c, c.dqkv);
        cpu::rope_backward<float>(c.dqkv.leftCols(qc), pos, D, cfg.rope_theta);
        cpu::rope_backward<float>(c.dqkv.middleCols(qc, kc), pos, D, cfg.rope_theta);
      }
      return;
    case OpName::kQkvA2a:  // Ulysses: sequence-split rows of all heads -> all rows of this rank's heads
      if (fwd) {
        c.qkv_a = rows_to_heads(c.qkv, {qc, kc, kc});
      } else {
        if (cp > 1) cp_attention_grads(c, c.dqkv_a);
        c.dqkv = heads_to_rows(c.dqkv_a, {qc, kc, kc});
      }
      return;
    case OpName::kAttnOutA2a:  // Ulysses: back to this rank's rows of all heads
      if (fwd) {
        c.att = heads_to_rows(c.att_a, {qc});
      } else {
        c.datt_a = rows_to_heads(c.datt, {qc});
      }
      return;
    case OpName::kAttnCore:
    case OpName::kAttnCoreLocal:
    case OpName::kCpKvAg:
      attention_core(op, s, c, l);
      return;
    case OpName::kOutProj: {
      const M& dy = tp > 1 ? c.d_o : c.dx_mid;
      if (fwd) {
        c.o_part = cpu::linear_forward<float>(c.att, b.param(lp.out_proj));
        if (tp == 1) c.x_mid = c.x_in + c.o_part;
      } else if (op.part == GemmPart::kDgrad) {
        c.datt = cpu::linear_dgrad<float>(dy, b.param(lp.out_proj));
      } else {
        cpu::linear_wgrad<float>(c.att, dy, b.grad(lp.out_proj, op.micro_batch));
      }
      return;
    }
    case OpName::kAttnRs:  // backward: all-gather of the output gradient
      if (fwd) {
        c.x_mid = c.x_in + reduce_scatter_rows(tp_comm, c.o_part);
      } else {
        c.d_o = all_gather_rows(tp_comm, c.dx_mid);
      }
      return;
    default:
      MOEPLAN_ASSERT(false && "not an attention op");
  }
}

void TrainRunner::Impl::attention_core(const Op& op, MbState& s, LayerState& c, size_t l) {
  const bool fwd = op.phase != Phase::kBackward;
  const cpu::AttnHeads hd = heads(l);
  const int64_t qa = hla * D, ka = kvla * D, sq = seq / cp;  // sq: a sequence's rows on one cp rank

  const M& in = sp > 1 ? c.qkv_a : c.qkv;
  M& att = sp > 1 ? c.att_a : c.att;
  const M& datt = sp > 1 ? c.datt_a : c.datt;
  const cpu::Positions pos(s.pos_full);
  const auto name = static_cast<OpName>(op.name);
  if (name == OpName::kCpKvAg) {
    if (fwd) {  // (with split q and k|v paths, the local pass may be assembling qkv_a meanwhile)
      c.kv_all = all_gather_rows(cp_comm, split_qkv() ? c.kv_a : M(in.middleCols(qa, 2 * ka)));
      M mine(Tc, 1);
      for (int64_t r = 0; r < Tc; ++r) mine(r, 0) = static_cast<float>(s.pos_full[sz(r)]);  // exact
      c.pos_all = all_gather_rows(cp_comm, mine);
    } else {
      c.dkv_remote = reduce_scatter_rows(cp_comm, c.dkv_all);
    }
    return;
  }
  const bool local = name == OpName::kAttnCoreLocal || cp == 1;
  if (split_qkv() && fwd && local) {  // the first attention pass: the two all-to-alls' results side by side
    c.qkv_a.resize(Tc, qa + 2 * ka);
    c.qkv_a << c.q_a, c.kv_a;
  }
  if (fwd) {
    if (local) {
      att.resize(Tc, qa);
      c.lse.resize(Tc, hla);
    }
  } else if (local) {
    c.dq_local = M::Zero(Tc, qa);
    c.dkv_local = M::Zero(Tc, 2 * ka);
  } else {
    c.dq_remote = M::Zero(Tc, qa);
    c.dkv_all = M::Zero(Tc * cp, 2 * ka);
  }
  for (int64_t q = 0; q < mb_seqs; ++q) {
    const cpu::Positions qp = pos.subspan(sz(q * sq), sz(sq));
    const auto rows = in.middleRows(q * sq, sq);
    if (local) {
      if (fwd) {
        cpu::AttnOut<float> o = cpu::attn_core_forward<float>(rows.leftCols(qa), rows.middleCols(qa, ka),
                                                              rows.middleCols(qa + ka, ka), qp, qp, hd);
        att.middleRows(q * sq, sq) = o.out;
        c.lse.middleRows(q * sq, sq) = o.lse;
      } else {
        cpu::AttnGrads<float> g = cpu::attn_core_backward<float>(
            rows.leftCols(qa), rows.middleCols(qa, ka), rows.middleCols(qa + ka, ka),
            att.middleRows(q * sq, sq), c.lse.middleRows(q * sq, sq), datt.middleRows(q * sq, sq), qp, qp,
            hd);
        c.dq_local.middleRows(q * sq, sq) = g.dq;
        c.dkv_local.block(q * sq, 0, sq, ka) = g.dk;
        c.dkv_local.block(q * sq, ka, sq, ka) = g.dv;
      }
      continue;
    }
    // The other cp ranks' keys of sequence q, in cp rank order.
    const int64_t nk = sq * (cp - 1);
    M kv(nk, 2 * ka);
    std::vector<int64_t> kpos(sz(nk)), src(sz(nk));
    int64_t j = 0;
    for (int64_t r = 0; r < cp; ++r) {
      if (r == place.cp) continue;
      for (int64_t i = 0; i < sq; ++i, ++j) {
        src[sz(j)] = r * Tc + q * sq + i;
        kv.row(j) = c.kv_all.row(src[sz(j)]);
        kpos[sz(j)] = static_cast<int64_t>(c.pos_all(src[sz(j)], 0));
      }
    }
    const cpu::Positions kp(kpos);
    if (fwd) {
      cpu::AttnOut<float> o =
          cpu::attn_core_forward<float>(rows.leftCols(qa), kv.leftCols(ka), kv.rightCols(ka), qp, kp, hd);
      cpu::attn_merge<float>(att.middleRows(q * sq, sq), c.lse.middleRows(q * sq, sq), o.out, o.lse);
    } else {
      cpu::AttnGrads<float> g = cpu::attn_core_backward<float>(
          rows.leftCols(qa), kv.leftCols(ka), kv.rightCols(ka), att.middleRows(q * sq, sq),
          c.lse.middleRows(q * sq, sq), datt.middleRows(q * sq, sq), qp, kp, hd);
      c.dq_remote.middleRows(q * sq, sq) = g.dq;
      for (int64_t i = 0; i < nk; ++i) {
        c.dkv_all.block(src[sz(i)], 0, 1, ka) = g.dk.row(i);
        c.dkv_all.block(src[sz(i)], ka, 1, ka) = g.dv.row(i);
      }
    }
  }
  if (!fwd && cp == 1) {  // no cp split: the local pass saw every key
    M& dqkv = sp > 1 ? c.dqkv_a : c.dqkv;
    dqkv.resize(Tc, qa + 2 * ka);
    dqkv << c.dq_local, c.dkv_local;
  }
}

M TrainRunner::Impl::attn_input_grad(const LayerState& c, bool q) const {
  const int64_t qa = hla * D;
  if (cp > 1) return q ? M(c.dq_local + c.dq_remote) : M(c.dkv_local + c.dkv_remote);
  return q ? M(c.dqkv_a.leftCols(qa)) : M(c.dqkv_a.rightCols(c.dqkv_a.cols() - qa));
}

void TrainRunner::Impl::cp_attention_grads(LayerState& c, M& dqkv) const {
  MOEPLAN_ASSERT(cp > 1);
  const M dq = attn_input_grad(c, true), dkv = attn_input_grad(c, false);
  dqkv.resize(Tc, dq.cols() + dkv.cols());
  dqkv << dq, dkv;
}

M TrainRunner::Impl::rows_to_heads(const M& x, const std::vector<int64_t>& widths) const {
  int64_t w = 0;
  for (const int64_t g : widths) w += g / sp;
  M send(Tg * sp, w);  // [peer][Tg rows][w]
  for (int64_t p = 0; p < sp; ++p) {
    int64_t col = 0, src = 0;
    for (const int64_t g : widths) {
      send.block(p * Tg, col, Tg, g / sp) = x.middleCols(src + p * (g / sp), g / sp);
      col += g / sp;
      src += g;
    }
  }
  M out(Tc, w);
  const std::vector<int64_t> counts(sz(sp), Tg * w);
  sp_comm->all_to_all_v(cspan_of(send), counts, span_of(out), counts, kActWire);
  return out;
}

M TrainRunner::Impl::heads_to_rows(const M& y, const std::vector<int64_t>& widths) const {
  int64_t w = 0, full = 0;
  for (const int64_t g : widths) {
    w += g / sp;
    full += g;
  }
  M recv(Tg * sp, w);  // [peer][my Tg rows][peer's heads]
  const std::vector<int64_t> counts(sz(sp), Tg * w);
  sp_comm->all_to_all_v(cspan_of(y), counts, span_of(recv), counts, kActWire);
  M out(Tg, full);
  for (int64_t p = 0; p < sp; ++p) {
    int64_t col = 0, dst = 0;
    for (const int64_t g : widths) {
      out.middleCols(dst + p * (g / sp), g / sp) = recv.block(p * Tg, col, Tg, g / sp);
      col += g / sp;
      dst += g;
    }
  }
  return out;
}

}  // namespace moeplan::executor
