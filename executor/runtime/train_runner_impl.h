// The train runner's state and handlers (train_runner.h), shared by the files that implement them by concern:
// train_runner.cpp (buckets, the embedding and head, pipeline messages, dispatch of ops), train_attention.cpp
// (attention and context parallelism), train_moe.cpp (the FFN, routed experts, dispatch and ETP) and
// train_grad_sync.cpp (gradient synchronisation, ZeRO gathers and the optimizer). Internal: only those
// files include it.
#pragma once

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

namespace moeplan::executor::train {

using cpu::Mat;
using M = Mat<float>;
using MapM = Eigen::Map<M>;
using Vf = cpu::Vec<float>;

inline constexpr WireFormat kActWire =
    WireFormat::kFp32;  // activations cross the wire in fp32 (see the header)
inline constexpr size_t kNoBucket = static_cast<size_t>(-1);  // a bucket this rank's stage does not hold

inline size_t sz(int64_t v) {
  MOEPLAN_ASSERT(v >= 0);
  return static_cast<size_t>(v);
}

inline std::span<float> span_of(M& m) {
  return {m.data(), sz(m.size())};
}
inline std::span<const float> cspan_of(const M& m) {
  return {m.data(), sz(m.size())};
}

// [rows, h] on each rank -> [rows * size, h], rank r's rows at r * rows (token rows of a sequence split).
inline M all_gather_rows(Communicator* c, const M& x) {
  if (c == nullptr) return x;
  M out(x.rows() * c->size(), x.cols());
  c->all_gather(cspan_of(x), span_of(out), kActWire);
  return out;
}
// [rows, h] partial sums -> this rank's [rows / size, h] block of the sum.
inline M reduce_scatter_rows(Communicator* c, const M& x) {
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

}  // namespace moeplan::executor::train

namespace moeplan::executor {

struct TrainRunner::Impl {
  using M = train::M;
  using MapM = train::MapM;
  using Vf = train::Vf;
  using Layout = train::Layout;
  using Entry = train::Entry;
  using Bucket = train::Bucket;
  using LayerParams = train::LayerParams;
  using LayerState = train::LayerState;
  using MbState = train::MbState;

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
  size_t embed_bucket = train::kNoBucket, head_bucket = train::kNoBucket;  // kNoBucket: on another stage
  size_t embedding = 0, final_norm = 0, lm_head = 0;  // entries of the embedding and head buckets
  std::vector<MbState> mbs;
  int64_t step = 0;  // completed optimizer steps
  double ce_sum = 0, aux_sum = 0;

  Impl(const OpGraph& g, const Plan& p, const ModelSpec& m, TrainPlace pl, GroupLookup gr, GroupLookup in,
       Communicator& w);

  // Whether this rank's stage runs virtual stage v (the lowering's chunk c of stage s is v = c pp + s).
  bool holds_virtual(int64_t v) const { return v % pp == place.stage; }

  Bucket& new_bucket(CommGroup group);

  void build_buckets();

  // The bucket a gradient-sync or parameter-gather op of `layer` over `group` refers to.
  Bucket& bucket_of(const Op& op);

  // The activation entering layer l (l = layers: the final norm's input).
  M& layer_input(MbState& s, size_t l) { return l < layers.size() ? s.layers[l].x_in : s.x_final; }
  // The activation leaving layer l.
  M& layer_output(MbState& s, size_t l) { return layer_input(s, l + 1); }
  // Where the gradient of layer l's input goes.
  M& layer_input_grad(MbState& s, size_t l) { return l > 0 ? s.layers[l - 1].dx_out : s.dx_embed; }

  cpu::AttnHeads heads(size_t l) const;

  // ---- ops outside the layers
  // This rank's token rows of micro-batch `mb` of the current step: tokens, or the next-token targets. The
  // embedding and the loss run on different stages when pp > 1, so each draws its own half. The optimizer op
  // (which advances `step`) runs on the compute lane after both.
  std::vector<int64_t> batch_rows(int mb, bool targets) const;

  void head(const Op& op, MbState& s);

  // ---- pipeline messages
  // The slot a pipeline send reads on its stage and its receive writes on the neighbouring one: forward, the
  // activation entering the first layer of the next virtual stage; backward, the gradient of this virtual
  // stage's first layer's input. [t, h] either way.
  M& pipeline_slot(const Op& send);

  void pipeline_send(const Op& send);

  void pipeline_receive(const Op& send);

  // ---- attention block
  void attention(const Op& op, MbState& s, size_t l);

  // Attention over this rank's query rows (the cp rank's Tc rows) for hla query and kvla kv heads: after the
  // Ulysses all-to-all, or directly (sp = 1: hla = hl). Without cp, attn_core sees every key. With cp, the
  // op graph splits it: attn_core_local attends to this cp rank's own keys, cp_kv_ag all-gathers k and v over
  // cp, attn_core attends to the other ranks' keys and merges (attn_merge); backward runs per key set with
  // the merged out and lse, and the gathered keys' dk, dv return by the all-gather's reduce-scatter.
  void attention_core(const Op& op, MbState& s, LayerState& c, size_t l);
  bool split_qkv() const { return sp > 1 && plan.overlap.inter_op; }
  // The gradient of the attention input's q part or k|v part (all rows of this rank's heads): from the two
  // key sets' passes under cp, else from the one attention pass.
  M attn_input_grad(const LayerState& c, bool q) const;
  // With cp: the attention input's gradient from the two key sets' passes (run by the consumer of that
  // gradient, which the graph orders after both attn_core_local's backward and cp_kv_ag's reduce-scatter).
  void cp_attention_grads(LayerState& c, M& dqkv) const;

  // Ulysses all-to-all, rows -> heads: x holds this rank's Tg rows of all of its tp heads, as column groups
  // of widths `widths` (q, k, v: each sp peer's heads are a contiguous 1 / sp of every group); the result
  // holds all T rows (sp peer p's rows at p Tg) of this rank's heads, the groups' slices side by side.
  M rows_to_heads(const M& x, const std::vector<int64_t>& widths) const;
  // The inverse: all T rows of this rank's heads -> this rank's Tg rows of every sp peer's heads.
  M heads_to_rows(const M& y, const std::vector<int64_t>& widths) const;

  // ---- FFN block: ffn_norm and the dense FFN or the shared experts (the same ops on b_full)
  void ffn(const Op& op, MbState& s, size_t l);

  // ---- routed experts
  // Source-major rows ([peer p][local expert e]) <-> expert-major rows ([e][p]).
  M reorder(const LayerState& c, const M& x, bool to_expert) const;
  // Rows to each EP peer (send_rows of x, in peer order) -> rows from each peer.
  M exchange(const M& x, const std::vector<int64_t>& send_rows, const std::vector<int64_t>& recv_rows,
             WireFormat wire = train::kActWire);
  // FP8 dispatch (MegaScale-MoE, DeepSeek-V3): the dispatched rows cross the wire as e4m3 with a scale per
  // 128 values, their gradients as bf16 (the lowering sizes both so).
  WireFormat dispatch_wire(bool fwd) const;

  void moe(const Op& op, MbState& s, size_t l);

  bool gather_mode() const { return plan.experts.dispatch == Dispatch::kAllGather; }

  // The rows the expert GEMMs see and their counts per local expert: this rank's dispatched rows, or with ETP
  // the whole ETP group's (expert-major, then ETP rank).
  const M& ex_in(const LayerState& c) const { return etp > 1 ? c.xe : c.xr; }
  const std::vector<int64_t>& ex_counts(const LayerState& c) const;
  // Rows per (ETP rank q, local expert e) at q El + e: a small all-gather of every rank's local counts.
  void etp_counts(LayerState& c);
  // First row of block (q, e) in ETP-rank-major order ([q][e]) and in expert-major order ([e][q]).
  int64_t etp_row(const LayerState& c, int64_t q, int64_t e, bool expert_major) const;
  // All-gather (variable rows) of each ETP rank's expert-major rows -> the group's rows, expert-major.
  M etp_gather(const LayerState& c, const M& own);
  // The inverse direction: the group's rows (expert-major) -> each owner's rows, summed over the ETP ranks in
  // rank order (the reduce-scatter of partial fc2 outputs, and the all-gather's backward).
  M etp_scatter_sum(const LayerState& c, const M& group_rows);
  int64_t local_rows(const LayerState& c) const;

  // All-gather dispatch: the EP group's tokens, expert choices (as floats, exact below 2^24) and gates, then
  // the permuted order of all of them (expert-major, then source rank, then token), of which this rank keeps
  // its experts' rows.
  void gather_tokens(LayerState& c);

  // Rows per (peer, local expert) for this micro-batch's dispatch: a small all-to-all of the counts.
  void dispatch_counts(LayerState& c);

  // ---- data parallelism and the optimizer
  // grad_cast and grad_reduce carry no group: they belong to the grad_a2a they feed or follow.
  Bucket& sync_bucket_of(const Op& op);

  void grad_sync(const Op& op);

  // The all-gather always runs; its result replaces the parameters only when the optimizer changed a shard
  // since the last gather (later gathers of the step, ZeRO-3's per micro-batch, would rewrite the same values
  // while another stream reads them).
  void param_gather(Bucket& b);

  void optimizer();

  void run(const Op& op);

  // Which rank writes each tensor into the dump: one replica of each piece, on the stage holding it.
  bool dump_owner(const Bucket& b, const Entry& e) const;
};

}  // namespace moeplan::executor
