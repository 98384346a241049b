// The train runner's FFN block and routed experts: the dense FFN and shared experts, the router, permutes,
// all-to-all and all-gather dispatch, expert tensor parallelism and the expert GEMMs (see
// train_runner_impl.h).
#include "executor/runtime/train_runner_impl.h"

namespace moeplan::executor {

using namespace train;  // NOLINT: the runner's own helpers

void TrainRunner::Impl::ffn(const Op& op, MbState& s, size_t l) {
  LayerState& c = s.layers[l];
  const LayerParams& lp = layers[l];
  Bucket& b = buckets[lp.dense];
  const bool fwd = op.phase != Phase::kBackward;
  const size_t w13 = lp.moe ? lp.shared_fc13 : lp.fc13, w2 = lp.moe ? lp.shared_fc2 : lp.fc2;
  switch (static_cast<OpName>(op.name)) {
    case OpName::kFfnNorm:
      if (fwd) {
        c.n2 = cpu::rmsnorm_forward<float>(c.x_mid, b.param(lp.ffn_norm), cfg.norm_eps);
        c.b_full = c.n2.y;
      } else {
        // d(b) = routed + shared + router (the reference's order); dense layers: the FFN's alone.
        M dn2;
        if (lp.moe) {
          dn2 = c.dn2_routed;
          if (lp.shared) dn2 += tp > 1 ? c.dn2_ffn : c.db_full;
          dn2 += c.dn2_router;
        } else {
          dn2 = tp > 1 ? c.dn2_ffn : c.db_full;
        }
        c.dx_mid = c.dx_out + cpu::rmsnorm_backward<float>(c.x_mid, b.param(lp.ffn_norm), c.n2.inv_rms, dn2,
                                                           b.grad(lp.ffn_norm, op.micro_batch));
      }
      return;
    case OpName::kFfnAg:
    case OpName::kSharedAg:
      if (fwd) {
        c.b_full = all_gather_rows(tp_comm, c.n2.y);
      } else {
        c.dn2_ffn = reduce_scatter_rows(tp_comm, c.db_full);
      }
      return;
    case OpName::kFc13:
    case OpName::kSharedFc13:
      if (fwd) {
        c.h13 = cpu::linear_forward<float>(c.b_full, b.param(w13));
      } else if (op.part == GemmPart::kDgrad) {
        c.db_full = cpu::linear_dgrad<float>(c.dh13, b.param(w13));
      } else {
        cpu::linear_wgrad<float>(c.b_full, c.dh13, b.grad(w13, op.micro_batch));
      }
      return;
    case OpName::kAct:
    case OpName::kSharedAct:
      if (fwd) {
        c.act = cpu::swiglu_forward<float>(c.h13);
      } else {
        c.dh13 = cpu::swiglu_backward<float>(c.h13, c.dact);
      }
      return;
    case OpName::kFc2:
    case OpName::kSharedFc2: {
      const M& dy = tp > 1 ? c.dff_full : c.dx_out;
      if (fwd) {
        c.f_part = cpu::linear_forward<float>(c.act, b.param(w2));
        if (tp == 1 && !lp.moe) layer_output(s, l) = c.x_mid + c.f_part;
        if (tp == 1 && lp.moe) c.f_local = c.f_part;
      } else if (op.part == GemmPart::kDgrad) {
        c.dact = cpu::linear_dgrad<float>(dy, b.param(w2));
      } else {
        cpu::linear_wgrad<float>(c.act, dy, b.grad(w2, op.micro_batch));
      }
      return;
    }
    case OpName::kFfnRs:
    case OpName::kSharedRs:
      if (fwd) {
        if (lp.moe) {
          c.f_local = reduce_scatter_rows(tp_comm, c.f_part);
        } else {
          layer_output(s, l) = c.x_mid + reduce_scatter_rows(tp_comm, c.f_part);
        }
      } else {
        c.dff_full = all_gather_rows(tp_comm, c.dx_out);
      }
      return;
    default:
      MOEPLAN_ASSERT(false && "not an FFN op");
  }
}

M TrainRunner::Impl::reorder(const LayerState& c, const M& x, bool to_expert) const {
  if (ep == 1) return x;
  M out(x.rows(), x.cols());
  std::vector<int64_t> src(sz(ep * El)), dst(sz(ep * El));
  int64_t r = 0;
  for (int64_t p = 0; p < ep; ++p)
    for (int64_t e = 0; e < El; ++e) {
      src[sz(p * El + e)] = r;
      r += c.recv_counts[sz(p * El + e)];
    }
  r = 0;
  for (int64_t e = 0; e < El; ++e)
    for (int64_t p = 0; p < ep; ++p) {
      dst[sz(p * El + e)] = r;
      r += c.recv_counts[sz(p * El + e)];
    }
  for (size_t i = 0; i < src.size(); ++i) {
    const int64_t n = c.recv_counts[i];
    if (n == 0) continue;
    if (to_expert) {
      out.middleRows(dst[i], n) = x.middleRows(src[i], n);
    } else {
      out.middleRows(src[i], n) = x.middleRows(dst[i], n);
    }
  }
  return out;
}

M TrainRunner::Impl::exchange(const M& x, const std::vector<int64_t>& send_rows,
                              const std::vector<int64_t>& recv_rows, WireFormat wire) {
  if (ep == 1) return x;
  std::vector<int64_t> sc(sz(ep)), rc(sz(ep));
  int64_t total = 0;
  for (size_t p = 0; p < sz(ep); ++p) {
    sc[p] = send_rows[p] * h;
    rc[p] = recv_rows[p] * h;
    total += recv_rows[p];
  }
  M out(total, h);
  ep_comm->all_to_all_v(cspan_of(x), sc, span_of(out), rc, wire);
  return out;
}

WireFormat TrainRunner::Impl::dispatch_wire(bool fwd) const {
  if (plan.compression.dispatch != DispatchPrecision::kFp8) return kActWire;
  return fwd ? WireFormat::kFp8E4m3 : WireFormat::kBf16;
}

void TrainRunner::Impl::moe(const Op& op, MbState& s, size_t l) {
  LayerState& c = s.layers[l];
  const LayerParams& lp = layers[l];
  Bucket& b = buckets[lp.dense];
  Bucket& x = buckets[lp.experts];
  const bool fwd = op.phase != Phase::kBackward;
  switch (static_cast<OpName>(op.name)) {
    case OpName::kRouter:
      if (fwd) {
        const M logits = cpu::linear_forward<float>(c.n2.y, b.param(lp.router));
        c.route = cpu::router_forward<float>(logits, k, cfg.renormalize_gates);
        c.stats = cpu::router_local_stats<float>(c.route);
        if (tp > 1 || sp > 1 || cp > 1) {
          // the tp, sp and cp ranks split the micro-batch's tokens: sum their statistics
          std::vector<float> st(sz(2 * E));
          std::copy(c.stats.counts.data(), c.stats.counts.data() + E, st.begin());
          std::copy(c.stats.prob_sums.data(), c.stats.prob_sums.data() + E, st.begin() + E);
          for (const CommGroup g : {CommGroup::kTp, CommGroup::kSp, CommGroup::kCp})
            if (Communicator* red = internal(g)) red->all_reduce(st, WireFormat::kFp32);
          std::copy(st.begin(), st.begin() + E, c.stats.counts.data());
          std::copy(st.begin() + E, st.end(), c.stats.prob_sums.data());
        }
        if (place.tp == 0 && place.sp == 0 && place.cp == 0 && op.phase == Phase::kForward)
          aux_sum += static_cast<double>(cpu::aux_loss<float>(c.stats, T, k, cfg.aux_coef)) * aux_scale;
      } else if (op.part == GemmPart::kDgrad) {
        const Vf aux_dp = cpu::aux_loss_dprobs<float>(c.stats, T, k, cfg.aux_coef, aux_scale);
        c.dlog = cpu::router_backward<float>(c.route, c.dgates, aux_dp);
        c.dn2_router = cpu::linear_dgrad<float>(c.dlog, b.param(lp.router));
      } else {
        cpu::linear_wgrad<float>(c.n2.y, c.dlog, b.grad(lp.router, op.micro_batch));
      }
      return;
    case OpName::kPermute:
      if (fwd) {
        c.idx = cpu::make_permute_index(c.route.experts, t, k, E);
        c.xp = cpu::permute_forward<float>(c.n2.y, c.idx);
      } else {
        c.dn2_routed = cpu::permute_backward<float>(c.dxp, c.idx);
      }
      return;
    case OpName::kDispatchA2a:
      if (fwd) {
        dispatch_counts(c);
        c.xr = reorder(c, exchange(c.xp, c.send_rows, c.recv_rows, dispatch_wire(true)), true);
      } else {
        c.dxp = exchange(reorder(c, c.dxr, false), c.recv_rows, c.send_rows, dispatch_wire(false));
      }
      return;
    case OpName::kDispatchAg:
      if (fwd) {
        gather_tokens(c);
      } else {  // the all-gather's backward: each token's gradient (and its gates') summed at its source
        c.dn2_routed = reduce_scatter_rows(ep_comm, c.dxg);
        c.dgates = reduce_scatter_rows(ep_comm, c.dgates_g);
      }
      return;
    case OpName::kScatter: {  // keep the gathered rows routed to this rank's experts, expert-major
      const int64_t rows_all = ep * t * k;
      if (fwd) {
        c.xr = cpu::permute_forward<float>(c.xg, c.idx_g).middleRows(c.local_row0, local_rows(c));
      } else {
        M dxp = M::Zero(rows_all, h);
        dxp.middleRows(c.local_row0, local_rows(c)) = c.dxr;
        c.dxg = cpu::permute_backward<float>(dxp, c.idx_g);
      }
      return;
    }
    case OpName::kGather: {  // this rank's experts' gated outputs, summed per gathered token
      const int64_t rows_all = ep * t * k;
      if (fwd) {
        c.yp = M::Zero(rows_all, h);
        c.yp.middleRows(c.local_row0, local_rows(c)) = c.eo;
        c.partial = M::Zero(ep * t, h);
        cpu::unpermute_forward<float>(c.yp, c.idx_g, c.gates_g, c.partial);
      } else {
        cpu::UnpermuteGrads<float> ug = cpu::unpermute_backward<float>(c.dpartial, c.yp, c.idx_g, c.gates_g);
        c.d_eo = ug.dyp.middleRows(c.local_row0, local_rows(c));
        c.dgates_g = std::move(ug.dgates);  // zero for the slots of other ranks' experts
      }
      return;
    }
    case OpName::kCombineRs:
      if (fwd) {
        c.y_routed = reduce_scatter_rows(ep_comm, c.partial);
      } else {
        c.dpartial = all_gather_rows(ep_comm, c.dx_out);
      }
      return;
    case OpName::kEtpAg:  // the ETP group's dispatched rows, for this rank's shard of the experts
      if (fwd) {
        etp_counts(c);
        c.xe = etp_gather(c, c.xr);
      } else {
        c.dxr = etp_scatter_sum(c, c.dxe);
      }
      return;
    case OpName::kEtpRs:  // the partial expert outputs summed over the ETP group, back to their owners
      if (fwd) {
        c.eo = etp_scatter_sum(c, c.eo_part);
      } else {
        c.d_eo_e = etp_gather(c, c.d_eo);
      }
      return;
    case OpName::kExpertFc13:
      if (fwd) {
        c.e13 = cpu::expert_gemm_forward<float>(ex_in(c), x.param(lp.expert_fc13, El), ex_counts(c));
      } else if (op.part == GemmPart::kDgrad) {
        (etp > 1 ? c.dxe : c.dxr) =
            cpu::expert_gemm_dgrad<float>(c.de13, x.param(lp.expert_fc13, El), ex_counts(c));
      } else {
        cpu::expert_gemm_wgrad<float>(ex_in(c), c.de13, ex_counts(c),
                                      x.grad(lp.expert_fc13, op.micro_batch, El));
      }
      return;
    case OpName::kExpertAct:
      if (fwd) {
        c.ea = cpu::swiglu_forward<float>(c.e13);
      } else {
        c.de13 = cpu::swiglu_backward<float>(c.e13, c.dea);
      }
      return;
    case OpName::kExpertFc2: {
      const M& d_eo = etp > 1 ? c.d_eo_e : c.d_eo;
      if (fwd) {
        (etp > 1 ? c.eo_part : c.eo) =
            cpu::expert_gemm_forward<float>(c.ea, x.param(lp.expert_fc2, El), ex_counts(c));
      } else if (op.part == GemmPart::kDgrad) {
        c.dea = cpu::expert_gemm_dgrad<float>(d_eo, x.param(lp.expert_fc2, El), ex_counts(c));
      } else {
        cpu::expert_gemm_wgrad<float>(c.ea, d_eo, ex_counts(c), x.grad(lp.expert_fc2, op.micro_batch, El));
      }
      return;
    }
    case OpName::kCombineA2a:
      if (fwd) {
        c.yp = exchange(reorder(c, c.eo, false), c.recv_rows, c.send_rows);
      } else {
        c.d_eo = reorder(c, exchange(c.dyp, c.send_rows, c.recv_rows), true);
      }
      return;
    case OpName::kUnpermute:
      if (gather_mode()) {  // the combine reduce-scatter already summed the gated expert outputs
        if (fwd)
          layer_output(s, l) = lp.shared ? M(c.x_mid + c.f_local + c.y_routed) : M(c.x_mid + c.y_routed);
        return;
      }
      if (fwd) {
        M y = lp.shared ? c.f_local : M::Zero(t, h);
        cpu::unpermute_forward<float>(c.yp, c.idx, c.route.gates, y);
        layer_output(s, l) = c.x_mid + y;
      } else {
        cpu::UnpermuteGrads<float> ug = cpu::unpermute_backward<float>(c.dx_out, c.yp, c.idx, c.route.gates);
        c.dyp = std::move(ug.dyp);
        c.dgates = std::move(ug.dgates);
      }
      return;
    default:
      MOEPLAN_ASSERT(false && "not an MoE op");
  }
}

const std::vector<int64_t>& TrainRunner::Impl::ex_counts(const LayerState& c) const {
  return etp > 1 ? c.etp_expert_counts : c.local_counts;
}

void TrainRunner::Impl::etp_counts(LayerState& c) {
  std::vector<float> mine(sz(El)), all(sz(El * etp));
  for (int64_t e = 0; e < El; ++e) mine[sz(e)] = static_cast<float>(c.local_counts[sz(e)]);  // exact < 2^24
  internal(CommGroup::kEtp)->all_gather(mine, all, WireFormat::kFp32);
  c.etp_rows.assign(sz(El * etp), 0);
  c.etp_expert_counts.assign(sz(El), 0);
  for (int64_t i = 0; i < El * etp; ++i) {
    c.etp_rows[sz(i)] = static_cast<int64_t>(all[sz(i)]);
    c.etp_expert_counts[sz(i % El)] += c.etp_rows[sz(i)];
  }
}

int64_t TrainRunner::Impl::etp_row(const LayerState& c, int64_t q, int64_t e, bool expert_major) const {
  int64_t r = 0;
  for (int64_t qq = 0; qq < etp; ++qq)
    for (int64_t ee = 0; ee < El; ++ee) {
      const bool before = expert_major ? (ee < e || (ee == e && qq < q)) : (qq < q || (qq == q && ee < e));
      if (before) r += c.etp_rows[sz(qq * El + ee)];
    }
  return r;
}

M TrainRunner::Impl::etp_gather(const LayerState& c, const M& own) {
  const int64_t cols = own.cols();
  std::vector<int64_t> sc(sz(etp), own.rows() * cols), rc(sz(etp), 0);
  int64_t total = 0;
  for (int64_t q = 0; q < etp; ++q)
    for (int64_t e = 0; e < El; ++e) {
      rc[sz(q)] += c.etp_rows[sz(q * El + e)] * cols;
      total += c.etp_rows[sz(q * El + e)];
    }
  M send(own.rows() * etp, cols);
  for (int64_t q = 0; q < etp; ++q) send.middleRows(q * own.rows(), own.rows()) = own;
  M recv(total, cols);  // [q][e]
  etp_comm->all_to_all_v(cspan_of(send), sc, span_of(recv), rc, kActWire);
  M out(total, cols);  // [e][q]
  for (int64_t q = 0; q < etp; ++q)
    for (int64_t e = 0; e < El; ++e) {
      const int64_t n = c.etp_rows[sz(q * El + e)];
      if (n > 0) out.middleRows(etp_row(c, q, e, true), n) = recv.middleRows(etp_row(c, q, e, false), n);
    }
  return out;
}

M TrainRunner::Impl::etp_scatter_sum(const LayerState& c, const M& group_rows) {
  const int64_t cols = group_rows.cols(), mine = c.xr.rows();
  M send(group_rows.rows(), cols);  // [q][e]
  std::vector<int64_t> sc(sz(etp), 0), rc(sz(etp), mine * cols);
  for (int64_t q = 0; q < etp; ++q)
    for (int64_t e = 0; e < El; ++e) {
      const int64_t n = c.etp_rows[sz(q * El + e)];
      sc[sz(q)] += n * cols;
      if (n > 0)
        send.middleRows(etp_row(c, q, e, false), n) = group_rows.middleRows(etp_row(c, q, e, true), n);
    }
  M recv(mine * etp, cols);
  etp_comm->all_to_all_v(cspan_of(send), sc, span_of(recv), rc, kActWire);
  M out = recv.topRows(mine);
  for (int64_t q = 1; q < etp; ++q) out += recv.middleRows(q * mine, mine);
  return out;
}

int64_t TrainRunner::Impl::local_rows(const LayerState& c) const {
  const int64_t e0 = place.ep * El;
  return c.idx_g.offsets[sz(e0 + El)] - c.idx_g.offsets[sz(e0)];
}

void TrainRunner::Impl::gather_tokens(LayerState& c) {
  c.xg = all_gather_rows(ep_comm, c.n2.y);
  c.gates_g = all_gather_rows(internal(CommGroup::kEp), c.route.gates);
  M experts(t, k);
  for (int64_t i = 0; i < t * k; ++i) experts.data()[i] = static_cast<float>(c.route.experts[sz(i)]);
  const M experts_g = all_gather_rows(internal(CommGroup::kEp), experts);
  std::vector<int64_t> ex(sz(ep * t * k));
  for (size_t i = 0; i < ex.size(); ++i) ex[i] = static_cast<int64_t>(experts_g.data()[i]);
  c.idx_g = cpu::make_permute_index(ex, ep * t, k, E);
  const int64_t e0 = place.ep * El;
  c.local_row0 = c.idx_g.offsets[sz(e0)];
  c.local_counts.assign(c.idx_g.counts.begin() + e0, c.idx_g.counts.begin() + e0 + El);
}

void TrainRunner::Impl::dispatch_counts(LayerState& c) {
  c.send_rows.assign(sz(ep), 0);
  for (int64_t p = 0; p < ep; ++p)
    c.send_rows[sz(p)] = c.idx.offsets[sz((p + 1) * El)] - c.idx.offsets[sz(p * El)];
  if (ep == 1) {
    c.recv_rows = c.send_rows;
    c.recv_counts = c.idx.counts;
    c.local_counts = c.idx.counts;
    return;
  }
  std::vector<float> mine(sz(E)), theirs(sz(E));
  for (int64_t e = 0; e < E; ++e) mine[sz(e)] = static_cast<float>(c.idx.counts[sz(e)]);  // exact below 2^24
  const std::vector<int64_t> per_peer(sz(ep), El);
  internal(CommGroup::kEp)->all_to_all_v(mine, per_peer, theirs, per_peer, WireFormat::kFp32);
  c.recv_counts.assign(sz(E), 0);
  c.recv_rows.assign(sz(ep), 0);
  c.local_counts.assign(sz(El), 0);
  for (int64_t p = 0; p < ep; ++p)
    for (int64_t e = 0; e < El; ++e) {
      const auto n = static_cast<int64_t>(theirs[sz(p * El + e)]);
      c.recv_counts[sz(p * El + e)] = n;
      c.recv_rows[sz(p)] += n;
      c.local_counts[sz(e)] += n;
    }
}

}  // namespace moeplan::executor
