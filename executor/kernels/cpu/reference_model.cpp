#include "executor/kernels/cpu/reference_model.h"

#include <fmt/format.h>

#include <stdexcept>
#include <type_traits>

#include "executor/kernels/cpu/attention.h"
#include "executor/kernels/cpu/linear.h"
#include "executor/kernels/cpu/swiglu.h"
#include "executor/kernels/cpu/vocab.h"
#include "simulator/core/status.h"

namespace moeplan::executor::cpu {

template <class S>
struct ReferenceModel<S>::Batch {
  std::vector<int64_t> tokens, targets, pos;
  int64_t sequences = 0, seq_len = 0;
  double inv_tokens = 0;  // 1 / tokens of the global batch
  double aux_scale = 0;   // 1 / micro-batches of the global batch
};

namespace {

// Activations of one layer for one micro-batch, kept for the backward.
template <class S>
struct LayerCache {
  Mat<S> x_in, x_mid;
  RmsNormOut<S> n1, n2;
  Mat<S> qkv;       // after rope
  Mat<S> att, lse;  // attention output [T, H D] and log-sum-exp [T, H]
  Mat<S> h13, act;  // dense FFN, or shared experts in a MoE layer
  Route<S> route;   // MoE
  PermuteIndex idx;
  Mat<S> xp, e13, ea, eo;
  RouterStats<S> stats;
};

}  // namespace

template <class S>
std::string ReferenceModel<S>::unsupported(const ModelSpec& m) {
  const auto& a = m.attention;
  if (m.encoder_decoder()) return "an encoder-decoder (cross-attention, relative position bias)";
  if (a.kind != AttentionKind::kGqa) return "MLA attention";
  if (m.norm != NormKind::kRmsNorm) return "LayerNorm";
  if (m.activation != FfnActivation::kSwiGlu) return "a GELU or ReLU FFN";
  if (a.qkv_bias || a.out_bias || m.lm_head_bias) return "biases";
  if (a.qk_norm != QkNorm::kNone) return "qk-norm";
  if (a.sinks) return "attention sinks";
  if (a.kv_share_layers != 1) return "cross-layer attention";
  if (a.indexer.heads > 0) return "DSA sparse attention";
  if (a.output_gate) return "gated attention outputs";
  if (m.mtp_layers != 0) return "multi-token prediction";
  if (m.moe.shared_expert_gate || m.moe.expert_bias || m.moe.router_bias || m.moe.router_score_bias)
    return "shared-expert gates, expert or router biases";
  if (m.hidden <= 0 || m.vocab <= 0 || m.layers.empty()) return "an empty model";
  if (a.num_heads <= 0 || a.num_kv_heads <= 0 || a.num_heads % a.num_kv_heads != 0) return "this head layout";
  if (a.head_dim <= 0 || a.head_dim % 2 != 0) return "an odd head_dim (rope pairs dims)";
  for (const auto& l : m.layers) {
    if (!l.kv_projection) return "layers without k/v projections";
    if (l.mixer != MixerKind::kAttention) return "Gated DeltaNet, Mamba-2 or FFN-only layers";
    if (!l.ffn) return "layers without an FFN";
    if (l.moe && (m.moe.num_experts <= 0 || m.moe.top_k <= 0 || m.moe.expert_ffn <= 0))
      return "MoE layers without experts";
    if (!l.moe && m.dense_ffn <= 0) return "dense layers without dense_ffn";
  }
  return "";
}

template <class S>
size_t ReferenceModel<S>::add(const std::string& name, int64_t rows, int64_t cols) {
  const int64_t offset = info_.empty() ? 0 : info_.back().offset + info_.back().size();
  info_.push_back({name, rows, cols, offset});
  return info_.size() - 1;
}

template <class S>
Eigen::Map<Mat<S>> ReferenceModel<S>::map(std::vector<S>& buf, size_t p, int64_t row_mult) {
  const ParamInfo& i = info_[p];
  return Eigen::Map<Mat<S>>(buf.data() + i.offset, i.rows * row_mult, i.cols);
}

template <class S>
ReferenceModel<S>::ReferenceModel(const ModelSpec& spec, const ReferenceConfig& cfg)
    : spec_(spec), cfg_(cfg) {
  if (const std::string why = unsupported(spec); !why.empty())
    throw std::invalid_argument(
        fmt::format("moerun reference model: {} is not supported ({})", why, spec.name));
  const auto& a = spec.attention;
  const int64_t h = spec.hidden, d = a.head_dim;
  embedding_ = add("embedding", spec.vocab, h);
  for (int64_t l = 0; l < spec.num_layers(); ++l) {
    const std::string p = fmt::format("L{}.", l);
    LayerParams lp;
    lp.moe = spec.layers[static_cast<size_t>(l)].moe;
    lp.attn_norm = add(p + "attn_norm", 1, h);
    lp.qkv = add(p + "qkv", h, (a.num_heads + 2 * a.num_kv_heads) * d);
    lp.out_proj = add(p + "out_proj", a.num_heads * d, h);
    lp.ffn_norm = add(p + "ffn_norm", 1, h);
    if (!lp.moe) {
      lp.fc13 = add(p + "fc13", h, 2 * spec.dense_ffn);
      lp.fc2 = add(p + "fc2", spec.dense_ffn, h);
    } else {
      const auto& e = spec.moe;
      lp.router = add(p + "router", h, e.num_experts);
      const int64_t fs = e.num_shared_experts * e.shared_expert_ffn;
      lp.shared = fs > 0;
      if (lp.shared) {
        lp.shared_fc13 = add(p + "shared.fc13", h, 2 * fs);
        lp.shared_fc2 = add(p + "shared.fc2", fs, h);
      }
      for (int64_t x = 0; x < e.num_experts; ++x) {
        const size_t i = add(fmt::format("{}expert{}.fc13", p, x), h, 2 * e.expert_ffn);
        if (x == 0) lp.expert_fc13 = i;
      }
      for (int64_t x = 0; x < e.num_experts; ++x) {
        const size_t i = add(fmt::format("{}expert{}.fc2", p, x), e.expert_ffn, h);
        if (x == 0) lp.expert_fc2 = i;
      }
    }
    layers_.push_back(lp);
  }
  final_norm_ = add("final_norm", 1, h);
  if (!spec.tied_embeddings) lm_head_ = add("lm_head", h, spec.vocab);

  const size_t total = static_cast<size_t>(info_.back().offset + info_.back().size());
  params_.assign(total, S(0));
  grads_.assign(total, S(0));
  adam_m_.assign(total, S(0));
  adam_v_.assign(total, S(0));
  for (size_t i = 0; i < info_.size(); ++i) {
    const std::string& n = info_[i].name;
    if (n.ends_with("_norm")) {
      map(params_, i).setOnes();
    } else {
      init_block<S>(map(params_, i), cfg_.param_seed, n, 0, 0);
    }
  }
}

template <class S>
bool ReferenceModel<S>::has(std::string_view name) const {
  for (const auto& i : info_)
    if (i.name == name) return true;
  return false;
}

template <class S>
const ParamInfo& ReferenceModel<S>::info(std::string_view name) const {
  for (const auto& i : info_)
    if (i.name == name) return i;
  MOEPLAN_ASSERT(false && "no such parameter");
  std::abort();
}

template <class S>
Eigen::Map<Mat<S>> ReferenceModel<S>::param(std::string_view name) {
  const ParamInfo& i = info(name);
  return Eigen::Map<Mat<S>>(params_.data() + i.offset, i.rows, i.cols);
}
template <class S>
Eigen::Map<const Mat<S>> ReferenceModel<S>::param(std::string_view name) const {
  const ParamInfo& i = info(name);
  return Eigen::Map<const Mat<S>>(params_.data() + i.offset, i.rows, i.cols);
}
template <class S>
Eigen::Map<Mat<S>> ReferenceModel<S>::grad(std::string_view name) {
  const ParamInfo& i = info(name);
  return Eigen::Map<Mat<S>>(grads_.data() + i.offset, i.rows, i.cols);
}
template <class S>
Eigen::Map<const Mat<S>> ReferenceModel<S>::grad(std::string_view name) const {
  const ParamInfo& i = info(name);
  return Eigen::Map<const Mat<S>>(grads_.data() + i.offset, i.rows, i.cols);
}

template <class S>
void ReferenceModel<S>::zero_grad() {
  std::fill(grads_.begin(), grads_.end(), S(0));
}

template <class S>
void ReferenceModel<S>::optimizer_step() {
  ++steps_;
  adam_step<S>(params_, grads_, adam_m_, adam_v_, steps_, cfg_.adam);
}

template <class S>
S ReferenceModel<S>::train_step(std::span<const int64_t> sequences, int64_t micro_batch, int64_t seq_len) {
  zero_grad();
  const StepLoss<S> l = forward_backward(sequences, micro_batch, seq_len);
  optimizer_step();
  return l.total;
}

template <class S>
StepLoss<S> ReferenceModel<S>::forward_backward(std::span<const int64_t> sequences, int64_t micro_batch,
                                                int64_t seq_len) {
  return run(sequences, micro_batch, seq_len, true);
}

template <class S>
StepLoss<S> ReferenceModel<S>::loss(std::span<const int64_t> sequences, int64_t micro_batch,
                                    int64_t seq_len) {
  return run(sequences, micro_batch, seq_len, false);
}

template <class S>
StepLoss<S> ReferenceModel<S>::run(std::span<const int64_t> sequences, int64_t micro_batch, int64_t seq_len,
                                   bool backward) {
  const int64_t n = static_cast<int64_t>(sequences.size());
  MOEPLAN_ASSERT(micro_batch > 0 && seq_len > 0 && n > 0 && n % micro_batch == 0);
  const int64_t n_micro = n / micro_batch;
  StepLoss<S> total;
  S aux_sum = 0;
  for (int64_t mb = 0; mb < n_micro; ++mb) {
    Batch b;
    const auto seqs =
        sequences.subspan(static_cast<size_t>(mb * micro_batch), static_cast<size_t>(micro_batch));
    TokenBatch tb = synthetic_batch(cfg_.data_seed, seqs, seq_len, spec_.vocab);
    b.tokens = std::move(tb.tokens);
    b.targets = std::move(tb.targets);
    b.sequences = micro_batch;
    b.seq_len = seq_len;
    b.pos.resize(b.tokens.size());
    for (size_t t = 0; t < b.pos.size(); ++t) b.pos[t] = static_cast<int64_t>(t) % seq_len;
    b.inv_tokens = 1.0 / static_cast<double>(n * seq_len);
    b.aux_scale = 1.0 / static_cast<double>(n_micro);
    S ce = 0, aux = 0;
    run_micro_batch(b, backward, ce, aux);
    total.ce += ce;
    aux_sum += aux * static_cast<S>(b.aux_scale);
  }
  total.aux = aux_sum;
  total.total = total.ce + total.aux;
  last_ = total;
  return total;
}

template <class S>
void ReferenceModel<S>::run_micro_batch(const Batch& b, bool backward, S& ce, S& aux) {
  const auto& a = spec_.attention;
  const auto& moe = spec_.moe;
  const int64_t h = spec_.hidden, d = a.head_dim, nh = a.num_heads, nkv = a.num_kv_heads;
  const int64_t T = static_cast<int64_t>(b.tokens.size()), seq = b.seq_len;
  const Positions pos_all(b.pos);
  const int64_t q_cols = nh * d, kv_cols = nkv * d;

  // ---- forward
  Mat<S> x = embedding_forward<S>(b.tokens, map(params_, embedding_), 0);
  std::vector<LayerCache<S>> cache(layers_.size());
  aux = 0;
  for (size_t l = 0; l < layers_.size(); ++l) {
    const LayerParams& lp = layers_[l];
    LayerCache<S>& c = cache[l];
    AttnHeads heads{nh, nkv, d, 0, 0, spec_.layers[l].window};
    c.x_in = x;
    c.n1 = rmsnorm_forward<S>(x, map(params_, lp.attn_norm), cfg_.norm_eps);
    c.qkv = linear_forward<S>(c.n1.y, map(params_, lp.qkv));
    rope_forward<S>(c.qkv.leftCols(q_cols), pos_all, d, cfg_.rope_theta);
    rope_forward<S>(c.qkv.middleCols(q_cols, kv_cols), pos_all, d, cfg_.rope_theta);
    c.att.resize(T, q_cols);
    c.lse.resize(T, nh);
    for (int64_t s = 0; s < b.sequences; ++s) {
      const Positions pos = pos_all.subspan(static_cast<size_t>(s * seq), static_cast<size_t>(seq));
      const auto rows = c.qkv.middleRows(s * seq, seq);
      AttnOut<S> o = attn_core_forward<S>(rows.leftCols(q_cols), rows.middleCols(q_cols, kv_cols),
                                          rows.middleCols(q_cols + kv_cols, kv_cols), pos, pos, heads);
      c.att.middleRows(s * seq, seq) = o.out;
      c.lse.middleRows(s * seq, seq) = o.lse;
    }
    x += linear_forward<S>(c.att, map(params_, lp.out_proj));
    c.x_mid = x;
    c.n2 = rmsnorm_forward<S>(x, map(params_, lp.ffn_norm), cfg_.norm_eps);
    if (!lp.moe) {
      c.h13 = linear_forward<S>(c.n2.y, map(params_, lp.fc13));
      c.act = swiglu_forward<S>(c.h13);
      x += linear_forward<S>(c.act, map(params_, lp.fc2));
    } else {
      const Mat<S> logits = linear_forward<S>(c.n2.y, map(params_, lp.router));
      c.route = router_forward<S>(logits, moe.top_k, cfg_.renormalize_gates);
      c.stats = router_local_stats<S>(c.route);
      aux += aux_loss<S>(c.stats, T, moe.top_k, cfg_.aux_coef);
      Mat<S> y = Mat<S>::Zero(T, h);
      if (lp.shared) {
        c.h13 = linear_forward<S>(c.n2.y, map(params_, lp.shared_fc13));
        c.act = swiglu_forward<S>(c.h13);
        y = linear_forward<S>(c.act, map(params_, lp.shared_fc2));
      }
      c.idx = make_permute_index(c.route.experts, T, moe.top_k, moe.num_experts);
      c.xp = permute_forward<S>(c.n2.y, c.idx);
      if constexpr (std::is_same_v<S, float>) {
        if (cfg_.dispatch_fwd) cfg_.dispatch_fwd(c.xp.data(), h, c.idx.offsets);
      }
      c.e13 = expert_gemm_forward<S>(c.xp, map(params_, lp.expert_fc13, moe.num_experts), c.idx.counts);
      c.ea = swiglu_forward<S>(c.e13);
      c.eo = expert_gemm_forward<S>(c.ea, map(params_, lp.expert_fc2, moe.num_experts), c.idx.counts);
      unpermute_forward<S>(c.eo, c.idx, c.route.gates, y);
      x += y;
    }
  }
  const RmsNormOut<S> nf = rmsnorm_forward<S>(x, map(params_, final_norm_), cfg_.norm_eps);
  Mat<S> logits;
  if (spec_.tied_embeddings) {
    logits.noalias() = nf.y * map(params_, embedding_).transpose();
  } else {
    logits = linear_forward<S>(nf.y, map(params_, lm_head_));
  }
  const Vec<S> mx = loss_local_max<S>(logits);
  const CeStats<S> st = loss_local_stats<S>(logits, b.targets, 0, mx);
  ce = loss_forward<S>(mx, st, b.inv_tokens);
  if (!backward) return;

  // ---- backward
  const Mat<S> dlogits = loss_backward<S>(logits, b.targets, 0, mx, st.sum_exp, b.inv_tokens);
  Mat<S> dnf;
  if (spec_.tied_embeddings) {
    dnf.noalias() = dlogits * map(params_, embedding_);
    map(grads_, embedding_).noalias() += dlogits.transpose() * nf.y;
  } else {
    dnf = linear_dgrad<S>(dlogits, map(params_, lm_head_));
    linear_wgrad<S>(nf.y, dlogits, map(grads_, lm_head_));
  }
  Mat<S> dx = rmsnorm_backward<S>(x, map(params_, final_norm_), nf.inv_rms, dnf, map(grads_, final_norm_));
  for (size_t li = layers_.size(); li-- > 0;) {
    const LayerParams& lp = layers_[li];
    LayerCache<S>& c = cache[li];
    AttnHeads heads{nh, nkv, d, 0, 0, spec_.layers[li].window};
    // FFN / MoE branch: dx is the gradient of the layer's output.
    Mat<S> dn2;
    if (!lp.moe) {
      const Mat<S> dact = linear_dgrad<S>(dx, map(params_, lp.fc2));
      linear_wgrad<S>(c.act, dx, map(grads_, lp.fc2));
      const Mat<S> dh13 = swiglu_backward<S>(c.h13, dact);
      linear_wgrad<S>(c.n2.y, dh13, map(grads_, lp.fc13));
      dn2 = linear_dgrad<S>(dh13, map(params_, lp.fc13));
    } else {
      const int64_t ne = moe.num_experts;
      const UnpermuteGrads<S> ug = unpermute_backward<S>(dx, c.eo, c.idx, c.route.gates);
      const Mat<S> dea = expert_gemm_dgrad<S>(ug.dyp, map(params_, lp.expert_fc2, ne), c.idx.counts);
      expert_gemm_wgrad<S>(c.ea, ug.dyp, c.idx.counts, map(grads_, lp.expert_fc2, ne));
      const Mat<S> de13 = swiglu_backward<S>(c.e13, dea);
      expert_gemm_wgrad<S>(c.xp, de13, c.idx.counts, map(grads_, lp.expert_fc13, ne));
      Mat<S> dxp = expert_gemm_dgrad<S>(de13, map(params_, lp.expert_fc13, ne), c.idx.counts);
      if constexpr (std::is_same_v<S, float>) {
        if (cfg_.dispatch_bwd) cfg_.dispatch_bwd(dxp.data(), h, c.idx.offsets);
      }
      dn2 = permute_backward<S>(dxp, c.idx);
      if (lp.shared) {
        const Mat<S> dact = linear_dgrad<S>(dx, map(params_, lp.shared_fc2));
        linear_wgrad<S>(c.act, dx, map(grads_, lp.shared_fc2));
        const Mat<S> dh13 = swiglu_backward<S>(c.h13, dact);
        linear_wgrad<S>(c.n2.y, dh13, map(grads_, lp.shared_fc13));
        dn2 += linear_dgrad<S>(dh13, map(params_, lp.shared_fc13));
      }
      const Vec<S> aux_dp = aux_loss_dprobs<S>(c.stats, T, moe.top_k, cfg_.aux_coef, b.aux_scale);
      const Mat<S> dlog = router_backward<S>(c.route, ug.dgates, aux_dp);
      linear_wgrad<S>(c.n2.y, dlog, map(grads_, lp.router));
      dn2 += linear_dgrad<S>(dlog, map(params_, lp.router));
    }
    dx +=
        rmsnorm_backward<S>(c.x_mid, map(params_, lp.ffn_norm), c.n2.inv_rms, dn2, map(grads_, lp.ffn_norm));
    // Attention branch: dx is now the gradient of x_mid.
    const Mat<S> datt = linear_dgrad<S>(dx, map(params_, lp.out_proj));
    linear_wgrad<S>(c.att, dx, map(grads_, lp.out_proj));
    Mat<S> dqkv(T, c.qkv.cols());
    for (int64_t s = 0; s < b.sequences; ++s) {
      const Positions pos = pos_all.subspan(static_cast<size_t>(s * seq), static_cast<size_t>(seq));
      const auto rows = c.qkv.middleRows(s * seq, seq);
      AttnGrads<S> g = attn_core_backward<S>(rows.leftCols(q_cols), rows.middleCols(q_cols, kv_cols),
                                             rows.middleCols(q_cols + kv_cols, kv_cols),
                                             c.att.middleRows(s * seq, seq), c.lse.middleRows(s * seq, seq),
                                             datt.middleRows(s * seq, seq), pos, pos, heads);
      dqkv.block(s * seq, 0, seq, q_cols) = g.dq;
      dqkv.block(s * seq, q_cols, seq, kv_cols) = g.dk;
      dqkv.block(s * seq, q_cols + kv_cols, seq, kv_cols) = g.dv;
    }
    rope_backward<S>(dqkv.leftCols(q_cols), pos_all, d, cfg_.rope_theta);
    rope_backward<S>(dqkv.middleCols(q_cols, kv_cols), pos_all, d, cfg_.rope_theta);
    linear_wgrad<S>(c.n1.y, dqkv, map(grads_, lp.qkv));
    const Mat<S> dn1 = linear_dgrad<S>(dqkv, map(params_, lp.qkv));
    dx +=
        rmsnorm_backward<S>(c.x_in, map(params_, lp.attn_norm), c.n1.inv_rms, dn1, map(grads_, lp.attn_norm));
  }
  embedding_backward<S>(b.tokens, dx, 0, map(grads_, embedding_));
}

template class ReferenceModel<float>;
template class ReferenceModel<double>;

}  // namespace moeplan::executor::cpu
