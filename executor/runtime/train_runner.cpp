// The numerical training runner (see train_runner.h): one handler per op name and phase, over
// per-(micro-batch, layer) activations and per-bucket parameters, gradients and Adam moments. This file: the
// runner's set-up, its parameter buckets, the embedding and head, pipeline messages and the dispatch of ops
// to the handlers of train_attention.cpp, train_moe.cpp and train_grad_sync.cpp.
#include "executor/runtime/train_runner_impl.h"

namespace moeplan::executor {

using namespace train;  // NOLINT: the runner's own helpers

std::string train_unsupported(const Plan& p, const ModelSpec& m) {
  if (const std::string why = cpu::ReferenceModel<float>::unsupported(m); !why.empty()) return why;
  if (m.tied_embeddings) return "tied embeddings";
  for (const int64_t n : layers_per_virtual_stage(m, p))
    if (n <= 0) return "a pipeline virtual stage without layers";
  if (p.experts.etp > 1 && p.experts.dispatch == Dispatch::kAllGather)
    return "expert tensor parallelism with all-gather dispatch";
  if (m.moe.expert_ffn % p.experts.etp != 0) return "etp that does not divide the expert FFN width";
  if (p.experts.dispatch == Dispatch::kDedup) return "deduplicated all-to-all dispatch";
  if (p.experts.dispatch == Dispatch::kAllGather && p.compression.dispatch == DispatchPrecision::kFp8)
    return "FP8 dispatch with all-gather dispatch";
  if (p.overlap.intra_op) return "intra-operator overlap (fused GEMM + collective ops)";
  if (p.compression.grad_sync == GradSync::kBf16AllToAll && p.data.zero == 0)
    return "BF16 all-to-all gradient sync without ZeRO";
  if (p.precision == Precision::kFp8) return "FP8 compute";
  if (p.routing.capacity_factor) return "a capacity factor (token dropping)";
  const int64_t tp = p.attention.tp, sp = p.attention.sp, cp = p.attention.cp;
  if (p.seq_len % (2 * cp) != 0) return "cp whose 2 cp load-balanced chunks do not divide the sequence";
  if (m.attention.num_heads % tp != 0 || m.attention.num_kv_heads % tp != 0)
    return "tp that does not divide the query and kv heads";
  if ((m.attention.num_heads / tp) % sp != 0 || (m.attention.num_kv_heads / tp) % sp != 0)
    return "Ulysses sp that does not divide a tp rank's query and kv heads (kv head replication)";
  if (m.dense_ffn % tp != 0 || (m.moe.num_shared_experts * m.moe.shared_expert_ffn) % tp != 0)
    return "tp that does not divide the FFN widths";
  if ((p.micro_batch * p.seq_len) % (tp * sp * cp) != 0)
    return "tp x sp x cp that does not divide the micro-batch's tokens";
  for (const auto& l : m.layers)
    if (l.moe && m.moe.num_experts % p.experts.ep != 0) return "ep that does not divide the experts";
  return "";
}

TrainRunner::Impl::Impl(const OpGraph& g, const Plan& p, const ModelSpec& m, TrainPlace pl, GroupLookup gr,
                        GroupLookup in, Communicator& w)
    : graph(g), plan(p), model(m), place(pl), groups(std::move(gr)), internal(std::move(in)), world(w) {
  MOEPLAN_ASSERT(train_unsupported(p, m).empty());
  const auto& a = m.attention;
  pp = p.pipeline.pp;
  tp = p.attention.tp;
  sp = p.attention.sp;
  cp = p.attention.cp;
  ep = p.experts.ep;
  etp = p.experts.etp;
  h = m.hidden;
  D = a.head_dim;
  H = a.num_heads;
  KV = a.num_kv_heads;
  hl = H / tp;
  kvl = KV / tp;
  E = m.moe.num_experts;
  El = E > 0 ? E / ep : 0;
  k = m.moe.top_k;
  seq = p.seq_len;
  mb_seqs = p.micro_batch;
  T = mb_seqs * seq;
  Tc = T / cp;
  Tg = Tc / sp;
  t = Tg / tp;
  hla = hl / sp;
  kvla = kvl / sp;
  n_local = p.num_micro_batches();
  n_global = p.global_batch / p.micro_batch;
  MOEPLAN_ASSERT(graph.micro_batches == n_local);
  inv_tokens = 1.0 / static_cast<double>(p.global_batch * seq);
  aux_scale = 1.0 / static_cast<double>(n_global);
  tp_comm = groups(CommGroup::kTp);
  sp_comm = groups(CommGroup::kSp);
  cp_comm = groups(CommGroup::kCp);
  const int64_t chunk = seq / (2 * cp);
  for (int64_t q = 0; q < mb_seqs; ++q)
    for (const int64_t ch : {int64_t{place.cp}, 2 * cp - 1 - place.cp})
      for (int64_t i = 0; i < chunk; ++i) cp_rows.push_back(q * seq + ch * chunk + i);
  ep_comm = groups(CommGroup::kEp);
  etp_comm = groups(CommGroup::kEtp);
  pp_comm = groups(CommGroup::kPp);
  MOEPLAN_ASSERT(graph.num_stages == pp && place.stage >= 0 && place.stage < pp);
  MOEPLAN_ASSERT(pp == 1 || (pp_comm != nullptr && pp_comm->rank() == place.stage));
  const std::vector<int64_t> per_virtual = layers_per_virtual_stage(m, p);
  first_layer.assign(per_virtual.size() + 1, 0);
  for (size_t v = 0; v < per_virtual.size(); ++v) first_layer[v + 1] = first_layer[v] + per_virtual[v];
  MOEPLAN_ASSERT(first_layer.back() == m.num_layers());
  build_buckets();
  mbs.resize(sz(n_local));
  for (MbState& s : mbs) {
    s.layers.resize(layers.size());
    s.pos_full.resize(sz(Tc));
    for (int64_t r = 0; r < Tc; ++r) s.pos_full[sz(r)] = cp_rows[sz(r)] % seq;
  }
}

Bucket& TrainRunner::Impl::new_bucket(CommGroup group) {
  Bucket& b = buckets.emplace_back();
  b.group = group;
  b.comm = groups(group);
  return b;
}

void TrainRunner::Impl::build_buckets() {
  const int tr = place.tp;
  const int64_t h0 = tr * hl, f = model.dense_ffn / tp;
  const int64_t fs = model.moe.num_shared_experts * model.moe.shared_expert_ffn;
  const int64_t fsl = fs / tp;
  for (int64_t l = 0; l < model.num_layers(); ++l) {
    const std::string pre = fmt::format("L{}.", l);
    LayerParams lp;
    lp.moe = model.layers[sz(l)].moe;
    const auto v = std::upper_bound(first_layer.begin(), first_layer.end(), l) - first_layer.begin() - 1;
    if (!holds_virtual(v)) {
      layers.push_back(lp);
      continue;
    }
    lp.dense = buckets.size();
    Bucket& d = new_bucket(CommGroup::kAttnReplica);
    lp.attn_norm = d.add(pre + "attn_norm", 1, h, Layout::kFull, 0, {}, true);
    lp.qkv = d.add(pre + "qkv", h, (hl + 2 * kvl) * D, Layout::kCols, 0,
                   cpu::qkv_shard_columns(H, KV, D, h0, h0 + hl));
    lp.out_proj = d.add(pre + "out_proj", hl * D, h, Layout::kRows, h0 * D);
    lp.ffn_norm = d.add(pre + "ffn_norm", 1, h, Layout::kFull, 0, {}, true);
    if (!lp.moe) {
      lp.fc13 = d.add(pre + "fc13", h, 2 * f, Layout::kCols, 0,
                      cpu::fc13_shard_columns(model.dense_ffn, tr * f, (tr + 1) * f));
      lp.fc2 = d.add(pre + "fc2", f, h, Layout::kRows, tr * f);
    } else {
      lp.router = d.add(pre + "router", h, E, Layout::kFull, 0, {}, true);
      lp.shared = fs > 0;
      if (lp.shared) {
        lp.shared_fc13 = d.add(pre + "shared.fc13", h, 2 * fsl, Layout::kCols, 0,
                               cpu::fc13_shard_columns(fs, tr * fsl, (tr + 1) * fsl));
        lp.shared_fc2 = d.add(pre + "shared.fc2", fsl, h, Layout::kRows, tr * fsl);
      }
      lp.experts = buckets.size();
      Bucket& x = new_bucket(CommGroup::kExpertDp);
      // ETP shards each expert's FFN width like tp shards a dense FFN: fc13 by columns (gate and up
      // halves alike), fc2 by rows.
      const int64_t e0 = place.ep * El, fe = model.moe.expert_ffn, fr = fe / etp, f0 = place.etp * fr;
      for (int64_t e = e0; e < e0 + El; ++e) {
        const size_t i = x.add(fmt::format("{}expert{}.fc13", pre, e), h, 2 * fr, Layout::kCols, 0,
                               cpu::fc13_shard_columns(fe, f0, f0 + fr));
        if (e == e0) lp.expert_fc13 = i;
      }
      for (int64_t e = e0; e < e0 + El; ++e) {
        const size_t i = x.add(fmt::format("{}expert{}.fc2", pre, e), fr, h, Layout::kRows, f0);
        if (e == e0) lp.expert_fc2 = i;
      }
    }
    layers.push_back(lp);
  }
  // Replicated on every rank of their stage; synchronised in the optimizer.
  if (holds_virtual(0)) {
    embed_bucket = buckets.size();
    Bucket& e = new_bucket(CommGroup::kNone);
    e.outside = true;
    embedding = e.add("embedding", model.vocab, h);
  }
  if (holds_virtual(static_cast<int64_t>(first_layer.size()) - 2)) {
    head_bucket = buckets.size();
    Bucket& o = new_bucket(CommGroup::kNone);
    o.outside = true;
    final_norm = o.add("final_norm", 1, h);
    lm_head = o.add("lm_head", h, model.vocab);
  }

  for (Bucket& b : buckets) {
    const int gs = b.comm != nullptr ? b.comm->size() : 1;
    b.sharded = plan.data.zero >= 1 && gs > 1;
    b.padded = b.sharded ? (b.n + gs - 1) / gs * gs : b.n;
    const int64_t shard = b.sharded ? b.padded / gs : b.padded;
    b.lo = b.sharded ? b.comm->rank() * shard : 0;
    b.hi = b.lo + shard;
    b.p.assign(sz(b.padded), 0.0f);
    b.g.assign(sz(b.padded), 0.0f);
    if (plan.data.zero >= 2 && b.comm != nullptr)
      b.g_mb.assign(sz(n_local), std::vector<float>(sz(b.padded), 0.0f));
    b.sg.assign(sz(shard), 0.0f);
    b.m.assign(sz(shard), 0.0f);
    b.v.assign(sz(shard), 0.0f);
    for (size_t i = 0; i < b.entries.size(); ++i) {
      const Entry& e = b.entries[i];
      MapM w = b.param(i);
      if (e.name.ends_with("_norm")) {
        w.setOnes();
      } else if (e.layout == Layout::kCols) {
        cpu::init_columns<float>(w, cfg.param_seed, e.name, 0, e.gcols);
      } else {
        cpu::init_block<float>(w, cfg.param_seed, e.name, e.layout == Layout::kRows ? e.row0 : 0, 0);
      }
    }
  }
}

Bucket& TrainRunner::Impl::bucket_of(const Op& op) {
  const LayerParams& lp = layers[sz(op.layer)];
  if (op.comm.group == CommGroup::kAttnReplica) return buckets[lp.dense];
  MOEPLAN_ASSERT(op.comm.group == CommGroup::kExpertDp && lp.moe);
  return buckets[lp.experts];
}

cpu::AttnHeads TrainRunner::Impl::heads(size_t l) const {
  return {H, KV, D, place.tp * hl + place.sp * hla, place.tp * kvl + place.sp * kvla, model.layers[l].window};
}

std::vector<int64_t> TrainRunner::Impl::batch_rows(int mb, bool targets) const {
  const int64_t g = static_cast<int64_t>(place.dp) * n_local + mb;  // global micro-batch of the step
  std::vector<int64_t> seqs(sz(mb_seqs));
  for (int64_t i = 0; i < mb_seqs; ++i) seqs[sz(i)] = step * plan.global_batch + g * mb_seqs + i;
  const cpu::TokenBatch tb = cpu::synthetic_batch(cfg.data_seed, seqs, seq, model.vocab);
  const std::vector<int64_t>& all = targets ? tb.targets : tb.tokens;
  const int64_t r0 = (place.sp * tp + place.tp) * t;  // into cp_rows
  std::vector<int64_t> out(sz(t));
  for (int64_t i = 0; i < t; ++i) out[sz(i)] = all[sz(cp_rows[sz(r0 + i)])];
  return out;
}

void TrainRunner::Impl::head(const Op& op, MbState& s) {
  const bool fwd = op.phase != Phase::kBackward;
  if (static_cast<OpName>(op.name) == OpName::kEmbedding) {
    Bucket& e = buckets[embed_bucket];
    if (fwd) {
      s.tokens = batch_rows(op.micro_batch, false);
      layer_input(s, 0) = cpu::embedding_forward<float>(s.tokens, e.param(embedding), 0);
    } else {
      cpu::embedding_backward<float>(s.tokens, s.dx_embed, 0, e.grad(embedding, op.micro_batch));
    }
    return;
  }
  Bucket& o = buckets[head_bucket];
  switch (static_cast<OpName>(op.name)) {
    case OpName::kFinalNorm:
      if (fwd) {
        s.nf = cpu::rmsnorm_forward<float>(s.x_final, o.param(final_norm), cfg.norm_eps);
      } else {
        layer_input_grad(s, layers.size()) = cpu::rmsnorm_backward<float>(
            s.x_final, o.param(final_norm), s.nf.inv_rms, s.dnf, o.grad(final_norm, op.micro_batch));
      }
      return;
    case OpName::kLmHead:
      if (fwd) {
        s.logits = cpu::linear_forward<float>(s.nf.y, o.param(lm_head));
      } else if (op.part == GemmPart::kDgrad) {
        s.dnf = cpu::linear_dgrad<float>(s.dlogits, o.param(lm_head));
      } else {
        cpu::linear_wgrad<float>(s.nf.y, s.dlogits, o.grad(lm_head, op.micro_batch));
      }
      return;
    case OpName::kLoss:
      if (fwd) {
        s.targets = batch_rows(op.micro_batch, true);
        s.mx = cpu::loss_local_max<float>(s.logits);
        s.st = cpu::loss_local_stats<float>(s.logits, s.targets, 0, s.mx);
        ce_sum += static_cast<double>(cpu::loss_forward<float>(s.mx, s.st, inv_tokens));
      } else {
        s.dlogits = cpu::loss_backward<float>(s.logits, s.targets, 0, s.mx, s.st.sum_exp, inv_tokens);
      }
      return;
    default:
      MOEPLAN_ASSERT(false && "not an op outside the layers");
  }
}

M& TrainRunner::Impl::pipeline_slot(const Op& send) {
  const int64_t v = int64_t{send.chunk} * pp + send.stage;
  MbState& s = mbs[sz(send.micro_batch)];
  return send.phase == Phase::kForward ? layer_input(s, sz(first_layer[sz(v + 1)]))
                                       : layer_input_grad(s, sz(first_layer[sz(v)]));
}

void TrainRunner::Impl::pipeline_send(const Op& send) {
  const M& x = pipeline_slot(send);
  MOEPLAN_ASSERT(x.rows() == t && x.cols() == h);
  pp_comm->send(cspan_of(x), pipeline_peer_stage(graph, send), pipeline_tag(graph, send), kActWire);
}

void TrainRunner::Impl::pipeline_receive(const Op& send) {
  MOEPLAN_ASSERT(send.micro_batch >= 0 && send.micro_batch < n_local);
  MOEPLAN_ASSERT(pipeline_peer_stage(graph, send) == place.stage);
  M& x = pipeline_slot(send);
  x.resize(t, h);
  pp_comm->recv(span_of(x), send.stage, pipeline_tag(graph, send), kActWire);
}

void TrainRunner::Impl::run(const Op& op) {
  const auto name = static_cast<OpName>(op.name);
  // A recompute op re-runs its forward (phase != kBackward below) and reproduces values the runner kept.
  switch (name) {
    case OpName::kGradRs:
    case OpName::kGradCast:
    case OpName::kGradA2a:
    case OpName::kGradReduce:
      grad_sync(op);
      return;
    case OpName::kParamAg:
      param_gather(bucket_of(op));
      return;
    case OpName::kOptimizerStep:
      optimizer();
      return;
    case OpName::kPpSendFwd:
    case OpName::kPpSendBwd:
      pipeline_send(op);
      return;
    default:
      break;
  }
  MOEPLAN_ASSERT(op.micro_batch >= 0 && op.micro_batch < n_local);
  MbState& s = mbs[sz(op.micro_batch)];
  if (op.layer < 0) {
    head(op, s);
    return;
  }
  const auto l = static_cast<size_t>(op.layer);
  switch (name) {
    case OpName::kAttnNorm:
    case OpName::kAttnAg:
    case OpName::kQkvProj:
    case OpName::kRope:
    case OpName::kQkvA2a:
    case OpName::kKvProj:
    case OpName::kQProj:
    case OpName::kKvA2a:
    case OpName::kQA2a:
    case OpName::kAttnOutA2a:
    case OpName::kAttnCore:
    case OpName::kAttnCoreLocal:
    case OpName::kCpKvAg:
    case OpName::kOutProj:
    case OpName::kAttnRs:
      attention(op, s, l);
      return;
    case OpName::kFfnNorm:
    case OpName::kFfnAg:
    case OpName::kFc13:
    case OpName::kAct:
    case OpName::kFc2:
    case OpName::kFfnRs:
    case OpName::kSharedAg:
    case OpName::kSharedFc13:
    case OpName::kSharedAct:
    case OpName::kSharedFc2:
    case OpName::kSharedRs:
      ffn(op, s, l);
      return;
    case OpName::kRouter:
    case OpName::kPermute:
    case OpName::kDispatchA2a:
    case OpName::kExpertFc13:
    case OpName::kExpertAct:
    case OpName::kExpertFc2:
    case OpName::kEtpAg:
    case OpName::kEtpRs:
    case OpName::kCombineA2a:
    case OpName::kDispatchAg:
    case OpName::kScatter:
    case OpName::kGather:
    case OpName::kCombineRs:
    case OpName::kUnpermute:
      moe(op, s, l);
      return;
    case OpName::kRouterTopk:
      return;  // scores and top-k run inside the router op (router_forward and its backward)
    default:
      MOEPLAN_ASSERT(false && "op the train runner does not implement (train_unsupported should refuse)");
  }
}

bool TrainRunner::Impl::dump_owner(const Bucket& b, const Entry& e) const {
  if (b.outside) return place.tp == 0 && place.attn_replica == 0;
  if (b.group == CommGroup::kExpertDp) return place.expert_dp == 0;
  return place.attn_replica == 0 && (!e.tp_replicated || place.tp == 0);
}

TrainRunner::TrainRunner(const OpGraph& graph, const Plan& plan, const ModelSpec& model, TrainPlace place,
                         GroupLookup groups, GroupLookup internal, Communicator& world)
    : impl_(
          std::make_unique<Impl>(graph, plan, model, place, std::move(groups), std::move(internal), world)) {
  Eigen::setNbThreads(1);
}

TrainRunner::~TrainRunner() = default;

void TrainRunner::run(const Op& op) {
  impl_->run(op);
}

void TrainRunner::receive(const Op& send) {
  impl_->pipeline_receive(send);
}

TrainLoss TrainRunner::finish_step() {
  std::vector<float> v = {static_cast<float>(impl_->ce_sum), static_cast<float>(impl_->aux_sum)};
  if (impl_->world.size() > 1) impl_->world.all_reduce(v, WireFormat::kFp32);
  impl_->ce_sum = impl_->aux_sum = 0;
  return {static_cast<double>(v[0]) + static_cast<double>(v[1]), v[0], v[1]};
}

Result<bool> TrainRunner::dump_params(const std::string& path) {
  Impl& I = *impl_;
  for (Bucket& b : I.buckets) I.param_gather(b);  // ZeRO shards updated after the last gather
  const cpu::ReferenceModel<float> layout(I.model, I.cfg);
  const auto& infos = layout.params();
  std::vector<float> flat(layout.flat_params().size(), 0.0f);
  for (Bucket& b : I.buckets) {  // this stage's; other stages' ranks own the rest
    for (size_t ei = 0; ei < b.entries.size(); ++ei) {
      const Entry& e = b.entries[ei];
      if (!I.dump_owner(b, e)) continue;
      const cpu::ParamInfo& gi = layout.info(e.name);
      MapM global(flat.data() + gi.offset, gi.rows, gi.cols);
      const MapM local = b.param(ei);
      switch (e.layout) {
        case Layout::kFull:
          global = local;
          break;
        case Layout::kRows:
          global.middleRows(e.row0, e.rows) = local;
          break;
        case Layout::kCols:
          for (int64_t j = 0; j < e.cols; ++j) global.col(e.gcols[sz(j)]) = local.col(j);
          break;
      }
    }
  }
  // Every value has one owner and zeros elsewhere, so the fp32 sum is exact.
  if (I.world.size() > 1) I.world.all_reduce(flat, WireFormat::kFp32);
  if (I.place.world_rank != 0) return true;
  nlohmann::json header = {{"format", "moerun-params-v1"}, {"params", nlohmann::json::array()}};
  for (const cpu::ParamInfo& i : infos)
    header["params"].push_back({{"name", i.name}, {"rows", i.rows}, {"cols", i.cols}, {"offset", i.offset}});
  const std::string hs = header.dump();
  std::string out = "MOERUNP1";
  const uint64_t n = hs.size();
  out.append(reinterpret_cast<const char*>(&n), sizeof n);  // little-endian hosts only (x86, arm64)
  out += hs;
  out.append(reinterpret_cast<const char*>(flat.data()), flat.size() * sizeof(float));
  return write_file_atomic(path, out);
}

}  // namespace moeplan::executor
