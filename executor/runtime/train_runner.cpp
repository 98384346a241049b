// The numerical training runner (see train_runner.h): one handler per op name and phase, over
// per-(micro-batch, layer) activations and per-bucket parameters, gradients and Adam moments.
#include "executor/runtime/train_runner.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include <nlohmann/json.hpp>

#include "executor/kernels/cpu/kernels.h"
#include "executor/kernels/cpu/reference_model.h"
#include "executor/runtime/stage_schedule.h"
#include "simulator/io/op_trace.h"
#include "simulator/workload/lower.h"

namespace moeplan::executor {
namespace {

using cpu::Mat;
using M = Mat<float>;
using MapM = Eigen::Map<M>;
using Vf = cpu::Vec<float>;

constexpr WireFormat kActWire = WireFormat::kFp32;     // activations cross the wire in fp32 (see the header)
constexpr size_t kNoBucket = static_cast<size_t>(-1);  // a bucket this rank's stage does not hold

size_t sz(int64_t v) {
  MOEPLAN_ASSERT(v >= 0);
  return static_cast<size_t>(v);
}

std::span<float> span_of(M& m) {
  return {m.data(), sz(m.size())};
}
std::span<const float> cspan_of(const M& m) {
  return {m.data(), sz(m.size())};
}

// [rows, h] on each rank -> [rows * size, h], rank r's rows at r * rows (token rows of a sequence split).
M all_gather_rows(Communicator* c, const M& x) {
  if (c == nullptr) return x;
  M out(x.rows() * c->size(), x.cols());
  c->all_gather(cspan_of(x), span_of(out), kActWire);
  return out;
}
// [rows, h] partial sums -> this rank's [rows / size, h] block of the sum.
M reduce_scatter_rows(Communicator* c, const M& x) {
  if (c == nullptr) return x;
  MOEPLAN_ASSERT(x.rows() % c->size() == 0);
  M out(x.rows() / c->size(), x.cols());
  c->reduce_scatter(cspan_of(x), span_of(out), kActWire);
  return out;
}

enum class Layout : uint8_t { kFull, kCols, kRows };

// One parameter tensor (or this rank's shard of it) inside a bucket.
struct Entry {
  std::string name;
  int64_t rows = 0, cols = 0;  // local shape
  int64_t offset = 0;          // into the bucket's flat buffers
  Layout layout = Layout::kFull;
  int64_t row0 = 0;            // kRows: first global row
  std::vector<int64_t> gcols;  // kCols: global column of each local column
  bool tp_replicated = false;  // whole on every tp rank, gradients partial over tp (sequence split)
  int64_t size() const { return rows * cols; }
};

// Parameters synchronised together over one group: a layer's dense part, its routed experts, the embedding or
// the head.
struct Bucket {
  std::vector<Entry> entries;
  CommGroup group = CommGroup::kNone;
  Communicator* comm = nullptr;  // nullptr: the group has one rank (no gradient sync op in the graph)
  bool outside = false;  // embedding or head: whole on every rank of the stage, synced in the optimizer
  bool sharded = false;  // ZeRO >= 1 over a group of more than one rank
  int64_t n = 0, padded = 0, lo = 0, hi = 0;
  std::vector<float> p, g;      // [padded]: parameters (fp32 master, whole) and gradients
  std::vector<float> sg, m, v;  // [hi - lo]: synchronised gradient shard, Adam moments
  std::vector<float> a2a;       // [padded]: received gradient chunks (BF16 all-to-all sync)
  // ZeRO-2/3: one gradient buffer per micro-batch (the graph reduce-scatters micro-batch j's gradients on the
  // DP stream without ordering micro-batch j + 1's wgrads after it); the i-th sync op of a step is
  // micro-batch i's.
  std::vector<std::vector<float>> g_mb;
  int syncs = 0;              // sync ops of this bucket run in the current step (DP stream, in order)
  bool stale = false;         // the optimizer updated this rank's shard since the last parameter gather
  std::vector<float> gather;  // [padded] all-gather landing buffer (DP stream only)

  size_t add(std::string name, int64_t rows, int64_t cols, Layout layout = Layout::kFull, int64_t row0 = 0,
             std::vector<int64_t> gcols = {}, bool tp_replicated = false) {
    entries.push_back({std::move(name), rows, cols, n, layout, row0, std::move(gcols), tp_replicated});
    n += rows * cols;
    return entries.size() - 1;
  }
  // `count` consecutive entries of one shape starting at entry i, stacked.
  MapM param(size_t i, int64_t count = 1) {
    const Entry& e = entries[i];
    return MapM(p.data() + e.offset, e.rows * count, e.cols);
  }
  std::vector<float>& grads_of(int mb) { return g_mb.empty() ? g : g_mb[static_cast<size_t>(mb)]; }
  MapM grad(size_t i, int mb, int64_t count = 1) {
    const Entry& e = entries[i];
    return MapM(grads_of(mb).data() + e.offset, e.rows * count, e.cols);
  }
};

struct LayerParams {
  bool moe = false, shared = false;
  size_t dense = kNoBucket, experts = kNoBucket;  // bucket indices (experts only for MoE layers); kNoBucket:
                                                  // the layer belongs to another pipeline stage
  size_t attn_norm = 0, qkv = 0, out_proj = 0, ffn_norm = 0, fc13 = 0, fc2 = 0;
  size_t router = 0, shared_fc13 = 0, shared_fc2 = 0, expert_fc13 = 0, expert_fc2 = 0;
};

// Activations and gradients of one layer for one micro-batch. t = local token rows, Tg = rows after the tp
// all-gather (the micro-batch's T / sp), T = the micro-batch's rows (what attention sees), k = top-k.
struct LayerState {
  M x_in, x_mid;                  // [t, h]
  cpu::RmsNormOut<float> n1, n2;  // [t, h]
  M a_full;                       // [Tg, h] attention input
  M qkv, att, lse, o_part;        // [Tg, (hl + 2 kvl) D], [Tg, hl D], [T, hla], [Tg, h]
  M b_full, h13, act, f_part;     // [Tg, h], dense FFN or shared experts: [Tg, 2F], [Tg, F], [Tg, h]
  M f_local;                      // [t, h] shared experts' output after the tp reduce-scatter
  cpu::Route<float> route;
  cpu::RouterStats<float> stats;  // summed over the tp ranks of the micro-batch
  cpu::PermuteIndex idx;
  std::vector<int64_t> send_rows, recv_rows;  // [ep] permuted rows to / from each EP peer
  std::vector<int64_t> recv_counts;           // [ep * El] rows from peer p for local expert e at p El + e
  std::vector<int64_t> local_counts;          // [El] rows per local expert
  M xp, xr, e13, ea, eo, yp;  // [t k, h]; expert-major [R, h], [R, 2Fe], [R, Fe], [R, h]; [t k, h]
  // All-gather dispatch: the EP group's tokens [ep t, h] (peer p's rows at p t), their routes and permuted
  // order, and where this rank's experts' rows sit in it ([local_row0, local_row0 + R)).
  M xg, gates_g, partial, y_routed;  // [ep t, h], [ep t, k], [ep t, h], [t, h]
  cpu::PermuteIndex idx_g;
  int64_t local_row0 = 0;
  // Backward.
  M dx_out, dx_mid, d_o, datt, dqkv, da_full, dn1;
  M q_a, kv_a, dq, dkv, da_q, da_kv;  // Ulysses with inter-op overlap: the q and k|v paths apart
  M qkv_a, att_a, datt_a, dqkv_a;     // Ulysses: [Tc, (hla + 2 kvla) D], [Tc, hla D] and their gradients
  // Context parallelism: gathered k|v and positions of every cp rank's rows [cp Tc, 2 kvla D], [cp Tc, 1];
  // the key sets' gradients (local: own keys; remote: the others', reduce-scattered to their owners).
  M kv_all, pos_all, dq_local, dkv_local, dq_remote, dkv_all, dkv_remote;
  M dff_full, dact, dh13, db_full, dn2_ffn;
  M dyp, dgates, d_eo, dea, de13, dxr, dxp, dn2_routed, dlog, dn2_router;
  M dpartial, dgates_g, dxg;  // all-gather dispatch: [ep t, h], [ep t, k], [ep t, h]
  // ETP: the ETP group's rows for this rank's expert shards (expert-major, then ETP rank) and the partial fc2
  // output over them; rows per (ETP rank, local expert) and per local expert.
  M xe, eo_part, dxe, d_eo_e;
  std::vector<int64_t> etp_rows, etp_expert_counts;
};

struct MbState {
  std::vector<int64_t> tokens, targets;  // [t] this rank's rows
  std::vector<int64_t> pos_full;         // [Tc] positions of this cp rank's rows (cp_rows)
  std::vector<LayerState> layers;
  M x_final, logits, dlogits, dnf, dx_embed;
  cpu::RmsNormOut<float> nf;
  Vf mx;
  cpu::CeStats<float> st;
};

}  // namespace

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

struct TrainRunner::Impl {
  const OpGraph& graph;
  Plan plan;
  ModelSpec model;
  TrainPlace place;
  GroupLookup groups;
  GroupLookup internal;  // twins of `groups` for the reductions performed inside ops (kNone: world)
  Communicator& world;
  cpu::ReferenceConfig cfg;  // seeds, rope, eps, aux coefficient, Adam: the reference's defaults

  int64_t pp = 1, tp = 1, sp = 1, cp = 1, ep = 1, etp = 1, h = 0, D = 0, H = 0, KV = 0, hl = 0, kvl = 0,
          E = 0, El = 0, k = 0;
  int64_t hla = 0, kvla = 0;  // heads of this rank inside attention (hl / sp, kvl / sp)
  int64_t seq = 0, mb_seqs = 0, T = 0, Tc = 0, Tg = 0, t = 0, n_local = 0, n_global = 0;
  // Context parallelism (Megatron's load balancing): each sequence is cut into 2 cp chunks and cp rank c
  // holds chunks c and 2 cp - 1 - c of every sequence. cp_rows: the micro-batch rows of this cp rank, per
  // sequence (chunk c, then its mirror) - the Tc = T / cp rows that sp and tp split further.
  std::vector<int64_t> cp_rows;
  double inv_tokens = 0, aux_scale = 0;
  Communicator* tp_comm = nullptr;
  Communicator* sp_comm = nullptr;
  Communicator* cp_comm = nullptr;
  Communicator* ep_comm = nullptr;
  Communicator* etp_comm = nullptr;
  Communicator* pp_comm = nullptr;
  std::vector<int64_t> first_layer;  // [pp vpp + 1]: first layer of each virtual stage, then the layer count

  std::vector<Bucket> buckets;
  std::vector<LayerParams> layers;
  size_t embed_bucket = kNoBucket, head_bucket = kNoBucket;  // kNoBucket: on another stage
  size_t embedding = 0, final_norm = 0, lm_head = 0;         // entries of the embedding and head buckets
  std::vector<MbState> mbs;
  int64_t step = 0;  // completed optimizer steps
  double ce_sum = 0, aux_sum = 0;

  Impl(const OpGraph& g, const Plan& p, const ModelSpec& m, TrainPlace pl, GroupLookup gr, GroupLookup in,
       Communicator& w)
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

  // Whether this rank's stage runs virtual stage v (the lowering's chunk c of stage s is v = c pp + s).
  bool holds_virtual(int64_t v) const { return v % pp == place.stage; }

  Bucket& new_bucket(CommGroup group) {
    Bucket& b = buckets.emplace_back();
    b.group = group;
    b.comm = groups(group);
    return b;
  }

  void build_buckets() {
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

  // The bucket a gradient-sync or parameter-gather op of `layer` over `group` refers to.
  Bucket& bucket_of(const Op& op) {
    const LayerParams& lp = layers[sz(op.layer)];
    if (op.comm.group == CommGroup::kAttnReplica) return buckets[lp.dense];
    MOEPLAN_ASSERT(op.comm.group == CommGroup::kExpertDp && lp.moe);
    return buckets[lp.experts];
  }

  // The activation entering layer l (l = layers: the final norm's input).
  M& layer_input(MbState& s, size_t l) { return l < layers.size() ? s.layers[l].x_in : s.x_final; }
  // The activation leaving layer l.
  M& layer_output(MbState& s, size_t l) { return layer_input(s, l + 1); }
  // Where the gradient of layer l's input goes.
  M& layer_input_grad(MbState& s, size_t l) { return l > 0 ? s.layers[l - 1].dx_out : s.dx_embed; }

  cpu::AttnHeads heads(size_t l) const {
    return {
        H, KV, D, place.tp * hl + place.sp * hla, place.tp * kvl + place.sp * kvla, model.layers[l].window};
  }

  // ---- ops outside the layers
  // This rank's token rows of micro-batch `mb` of the current step: tokens, or the next-token targets. The
  // embedding and the loss run on different stages when pp > 1, so each draws its own half. The optimizer op
  // (which advances `step`) runs on the compute lane after both.
  std::vector<int64_t> batch_rows(int mb, bool targets) const {
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

  void head(const Op& op, MbState& s) {
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

  // ---- pipeline messages
  // The slot a pipeline send reads on its stage and its receive writes on the neighbouring one: forward, the
  // activation entering the first layer of the next virtual stage; backward, the gradient of this virtual
  // stage's first layer's input. [t, h] either way.
  M& pipeline_slot(const Op& send) {
    const int64_t v = int64_t{send.chunk} * pp + send.stage;
    MbState& s = mbs[sz(send.micro_batch)];
    return send.phase == Phase::kForward ? layer_input(s, sz(first_layer[sz(v + 1)]))
                                         : layer_input_grad(s, sz(first_layer[sz(v)]));
  }

  void pipeline_send(const Op& send) {
    const M& x = pipeline_slot(send);
    MOEPLAN_ASSERT(x.rows() == t && x.cols() == h);
    pp_comm->send(cspan_of(x), pipeline_peer_stage(graph, send), pipeline_tag(graph, send), kActWire);
  }

  void pipeline_receive(const Op& send) {
    MOEPLAN_ASSERT(send.micro_batch >= 0 && send.micro_batch < n_local);
    MOEPLAN_ASSERT(pipeline_peer_stage(graph, send) == place.stage);
    M& x = pipeline_slot(send);
    x.resize(t, h);
    pp_comm->recv(span_of(x), send.stage, pipeline_tag(graph, send), kActWire);
  }

  // ---- attention block
  void attention(const Op& op, MbState& s, size_t l) {
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

  // Attention over this rank's query rows (the cp rank's Tc rows) for hla query and kvla kv heads: after the
  // Ulysses all-to-all, or directly (sp = 1: hla = hl). Without cp, attn_core sees every key. With cp, the
  // op graph splits it: attn_core_local attends to this cp rank's own keys, cp_kv_ag all-gathers k and v over
  // cp, attn_core attends to the other ranks' keys and merges (attn_merge); backward runs per key set with
  // the merged out and lse, and the gathered keys' dk, dv return by the all-gather's reduce-scatter.
  void attention_core(const Op& op, MbState& s, LayerState& c, size_t l) {
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
  bool split_qkv() const { return sp > 1 && plan.overlap.inter_op; }
  // The gradient of the attention input's q part or k|v part (all rows of this rank's heads): from the two
  // key sets' passes under cp, else from the one attention pass.
  M attn_input_grad(const LayerState& c, bool q) const {
    const int64_t qa = hla * D;
    if (cp > 1) return q ? M(c.dq_local + c.dq_remote) : M(c.dkv_local + c.dkv_remote);
    return q ? M(c.dqkv_a.leftCols(qa)) : M(c.dqkv_a.rightCols(c.dqkv_a.cols() - qa));
  }
  // With cp: the attention input's gradient from the two key sets' passes (run by the consumer of that
  // gradient, which the graph orders after both attn_core_local's backward and cp_kv_ag's reduce-scatter).
  void cp_attention_grads(LayerState& c, M& dqkv) const {
    MOEPLAN_ASSERT(cp > 1);
    const M dq = attn_input_grad(c, true), dkv = attn_input_grad(c, false);
    dqkv.resize(Tc, dq.cols() + dkv.cols());
    dqkv << dq, dkv;
  }

  // Ulysses all-to-all, rows -> heads: x holds this rank's Tg rows of all of its tp heads, as column groups
  // of widths `widths` (q, k, v: each sp peer's heads are a contiguous 1 / sp of every group); the result
  // holds all T rows (sp peer p's rows at p Tg) of this rank's heads, the groups' slices side by side.
  M rows_to_heads(const M& x, const std::vector<int64_t>& widths) const {
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
  // The inverse: all T rows of this rank's heads -> this rank's Tg rows of every sp peer's heads.
  M heads_to_rows(const M& y, const std::vector<int64_t>& widths) const {
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

  // ---- FFN block: ffn_norm and the dense FFN or the shared experts (the same ops on b_full)
  void ffn(const Op& op, MbState& s, size_t l) {
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

  // ---- routed experts
  // Source-major rows ([peer p][local expert e]) <-> expert-major rows ([e][p]).
  M reorder(const LayerState& c, const M& x, bool to_expert) const {
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
  // Rows to each EP peer (send_rows of x, in peer order) -> rows from each peer.
  M exchange(const M& x, const std::vector<int64_t>& send_rows, const std::vector<int64_t>& recv_rows,
             WireFormat wire = kActWire) {
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
  // FP8 dispatch (MegaScale-MoE, DeepSeek-V3): the dispatched rows cross the wire as e4m3 with a scale per
  // 128 values, their gradients as bf16 (the lowering sizes both so).
  WireFormat dispatch_wire(bool fwd) const {
    if (plan.compression.dispatch != DispatchPrecision::kFp8) return kActWire;
    return fwd ? WireFormat::kFp8E4m3 : WireFormat::kBf16;
  }

  void moe(const Op& op, MbState& s, size_t l) {
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
          cpu::UnpermuteGrads<float> ug =
              cpu::unpermute_backward<float>(c.dpartial, c.yp, c.idx_g, c.gates_g);
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
          cpu::UnpermuteGrads<float> ug =
              cpu::unpermute_backward<float>(c.dx_out, c.yp, c.idx, c.route.gates);
          c.dyp = std::move(ug.dyp);
          c.dgates = std::move(ug.dgates);
        }
        return;
      default:
        MOEPLAN_ASSERT(false && "not an MoE op");
    }
  }

  bool gather_mode() const { return plan.experts.dispatch == Dispatch::kAllGather; }

  // The rows the expert GEMMs see and their counts per local expert: this rank's dispatched rows, or with ETP
  // the whole ETP group's (expert-major, then ETP rank).
  const M& ex_in(const LayerState& c) const { return etp > 1 ? c.xe : c.xr; }
  const std::vector<int64_t>& ex_counts(const LayerState& c) const {
    return etp > 1 ? c.etp_expert_counts : c.local_counts;
  }
  // Rows per (ETP rank q, local expert e) at q El + e: a small all-gather of every rank's local counts.
  void etp_counts(LayerState& c) {
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
  // First row of block (q, e) in ETP-rank-major order ([q][e]) and in expert-major order ([e][q]).
  int64_t etp_row(const LayerState& c, int64_t q, int64_t e, bool expert_major) const {
    int64_t r = 0;
    for (int64_t qq = 0; qq < etp; ++qq)
      for (int64_t ee = 0; ee < El; ++ee) {
        const bool before = expert_major ? (ee < e || (ee == e && qq < q)) : (qq < q || (qq == q && ee < e));
        if (before) r += c.etp_rows[sz(qq * El + ee)];
      }
    return r;
  }
  // All-gather (variable rows) of each ETP rank's expert-major rows -> the group's rows, expert-major.
  M etp_gather(const LayerState& c, const M& own) {
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
  // The inverse direction: the group's rows (expert-major) -> each owner's rows, summed over the ETP ranks in
  // rank order (the reduce-scatter of partial fc2 outputs, and the all-gather's backward).
  M etp_scatter_sum(const LayerState& c, const M& group_rows) {
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
  int64_t local_rows(const LayerState& c) const {
    const int64_t e0 = place.ep * El;
    return c.idx_g.offsets[sz(e0 + El)] - c.idx_g.offsets[sz(e0)];
  }

  // All-gather dispatch: the EP group's tokens, expert choices (as floats, exact below 2^24) and gates, then
  // the permuted order of all of them (expert-major, then source rank, then token), of which this rank keeps
  // its experts' rows.
  void gather_tokens(LayerState& c) {
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

  // Rows per (peer, local expert) for this micro-batch's dispatch: a small all-to-all of the counts.
  void dispatch_counts(LayerState& c) {
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
    for (int64_t e = 0; e < E; ++e)
      mine[sz(e)] = static_cast<float>(c.idx.counts[sz(e)]);  // exact below 2^24
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

  // ---- data parallelism and the optimizer
  // grad_cast and grad_reduce carry no group: they belong to the grad_a2a they feed or follow.
  Bucket& sync_bucket_of(const Op& op) {
    if (op.kind == OpKind::kCollective) return bucket_of(op);
    for (const int32_t d : graph.deps_of(op)) {
      const Op& dep = graph.ops[sz(d)];
      if (static_cast<OpName>(dep.name) == OpName::kGradA2a) return bucket_of(dep);
    }
    MOEPLAN_ASSERT(false && "grad_reduce without its grad_a2a");
    std::abort();
  }

  void grad_sync(const Op& op) {
    if (static_cast<OpName>(op.name) == OpName::kGradCast) return;  // fp32 -> bf16: the a2a's wire rounds
    Bucket& b = sync_bucket_of(op);
    MOEPLAN_ASSERT(b.comm != nullptr);
    const auto shard = static_cast<size_t>(b.hi - b.lo);
    const bool reads_grads = static_cast<OpName>(op.name) != OpName::kGradReduce;
    std::vector<float>& g =
        b.grads_of(reads_grads && !b.g_mb.empty() ? b.syncs++ % static_cast<int>(n_local) : 0);
    switch (static_cast<OpName>(op.name)) {
      case OpName::kGradRs:
        if (op.comm.collective == Collective::kAllReduce) {
          MOEPLAN_ASSERT(!b.sharded);
          b.comm->all_reduce(g, WireFormat::kFp32);
          for (size_t i = 0; i < shard; ++i) b.sg[i] += g[i];
        } else {
          MOEPLAN_ASSERT(b.sharded && op.comm.collective == Collective::kReduceScatter);
          std::vector<float> out(shard);
          b.comm->reduce_scatter(g, out, WireFormat::kFp32);
          for (size_t i = 0; i < shard; ++i) b.sg[i] += out[i];
        }
        std::fill(g.begin(), g.end(), 0.0f);
        return;
      case OpName::kGradA2a: {
        MOEPLAN_ASSERT(b.sharded);
        const std::vector<int64_t> counts(sz(b.comm->size()), static_cast<int64_t>(shard));
        b.a2a.assign(g.size(), 0.0f);
        b.comm->all_to_all_v(g, counts, b.a2a, counts, WireFormat::kBf16);
        std::fill(g.begin(), g.end(), 0.0f);
        return;
      }
      case OpName::kGradReduce:  // local fp32 reduce of the received bf16 chunks, in rank order
        for (int r = 0; r < b.comm->size(); ++r)
          for (size_t i = 0; i < shard; ++i) b.sg[i] += b.a2a[static_cast<size_t>(r) * shard + i];
        return;
      default:
        MOEPLAN_ASSERT(false && "not a gradient sync op");
    }
  }

  // The all-gather always runs; its result replaces the parameters only when the optimizer changed a shard
  // since the last gather (later gathers of the step, ZeRO-3's per micro-batch, would rewrite the same values
  // while another stream reads them).
  void param_gather(Bucket& b) {
    if (!b.sharded) return;
    const std::vector<float> mine(b.p.begin() + b.lo, b.p.begin() + b.hi);
    b.gather.resize(b.p.size());
    b.comm->all_gather(mine, b.gather, WireFormat::kFp32);
    if (b.stale) b.p.swap(b.gather);
    b.stale = false;
  }

  void optimizer() {
    ++step;
    for (Bucket& b : buckets) {
      if (!b.outside) continue;
      // Sum over the ranks of the stage: its attention mesh, tp x attention replicas (sp cp dp).
      for (const CommGroup g : {CommGroup::kTp, CommGroup::kAttnReplica})
        if (Communicator* c = internal(g)) c->all_reduce(b.g, WireFormat::kFp32);
    }
    for (Bucket& b : buckets) {
      if (b.outside || b.comm == nullptr) {  // no gradient sync op in the graph: the shard is everything
        for (size_t i = 0; i < b.sg.size(); ++i) b.sg[i] += b.g[i];
        std::fill(b.g.begin(), b.g.end(), 0.0f);
      }
      if (tp_comm != nullptr && !b.outside) {
        for (const Entry& e : b.entries) {
          if (!e.tp_replicated) continue;
          const int64_t lo = std::max(e.offset, b.lo), hi = std::min(e.offset + e.size(), b.hi);
          if (lo < hi)
            internal(CommGroup::kTp)
                ->all_reduce(std::span<float>(b.sg).subspan(sz(lo - b.lo), sz(hi - lo)), WireFormat::kFp32);
        }
      }
      cpu::adam_step<float>(std::span<float>(b.p).subspan(sz(b.lo), sz(b.hi - b.lo)), b.sg, b.m, b.v, step,
                            cfg.adam);
      std::fill(b.sg.begin(), b.sg.end(), 0.0f);
      b.stale = b.sharded;
      b.syncs = 0;
    }
  }

  void run(const Op& op) {
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

  // Which rank writes each tensor into the dump: one replica of each piece, on the stage holding it.
  bool dump_owner(const Bucket& b, const Entry& e) const {
    if (b.outside) return place.tp == 0 && place.attn_replica == 0;
    if (b.group == CommGroup::kExpertDp) return place.expert_dp == 0;
    return place.attn_replica == 0 && (!e.tp_replicated || place.tp == 0);
  }
};

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
