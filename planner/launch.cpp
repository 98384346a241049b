// Launch configurations for one plan (moerun plan file + mpirun/srun, sbatch script, Megatron-LM arguments).
// The Megatron mapping follows shared/reference/megatron-flags.md (Megatron-LM d98e8a64); "A:", "TC:", ...
// below are that file's line keys.
#include "planner/launch.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <optional>
#include <set>

#include <fmt/format.h>

#include "simulator/io/plan_io.h"

namespace moeplan::planner {
namespace {

namespace fs = std::filesystem;

// A word for a POSIX shell: as is when it holds only characters the shell leaves alone, else single-quoted.
std::string shell_word(const std::string& s) {
  static constexpr std::string_view kSafe =
      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:,+@%";
  if (!s.empty() && s.find_first_not_of(kSafe) == std::string::npos) return s;
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string stem_of(const std::string& plan_path) {
  std::string stem = fs::path(plan_path).stem().string();
  for (char& c : stem) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
                    c == '_' || c == '.';
    if (!ok) c = '_';
  }
  return stem.empty() ? std::string("plan") : stem;
}

std::string one_line_summary(const Plan& p, const ModelSpec& m, const HardwareProfile& hw) {
  return fmt::format("{} on {} x {} GPUs", m.name.empty() ? p.model : m.name, p.gpus,
                     hw.name.empty() ? p.hardware : hw.name);
}

// A per-layer 0/1 pattern in the list-expression form Megatron parses for --moe-layer-freq and
// --window-attn-skip-freq (digits, ',', '[', ']', '(', ')', '+', '*' only; A:245-253): the shortest period
// repeated, e.g. "([0,1]*24)", or runs, e.g. "([0]*3+[1]*58)".
std::string pattern_expression(const std::vector<int>& bits) {
  const size_t n = bits.size();
  for (size_t period = 1; period < n; ++period) {
    if (n % period != 0) continue;
    bool repeats = true;
    for (size_t i = period; i < n && repeats; ++i) repeats = bits[i] == bits[i - period];
    if (!repeats) continue;
    if (period == 1) break;  // constant: runs give "([1]*n)"
    std::string body;
    for (size_t i = 0; i < period; ++i) body += (i ? "," : "") + std::to_string(bits[i]);
    return fmt::format("([{}]*{})", body, n / period);
  }
  std::string out = "(";
  for (size_t i = 0; i < n;) {
    size_t j = i;
    while (j < n && bits[j] == bits[i]) ++j;
    out += fmt::format("{}[{}]", i ? "+" : "", bits[i]);
    if (j - i > 1) out += fmt::format("*{}", j - i);
    i = j;
  }
  return out + ")";
}

// The integer N with bit i set exactly when (i + offset) % N == 0, if there is one (N >= 1).
int64_t integer_frequency(const std::vector<int>& bits, size_t offset) {
  for (size_t freq = 1; freq <= bits.size(); ++freq) {
    bool match = true;
    for (size_t i = 0; i < bits.size() && match; ++i) match = (bits[i] != 0) == ((i + offset) % freq == 0);
    if (match) return static_cast<int64_t>(freq);
  }
  return 0;
}

class MegatronBuilder {
 public:
  MegatronBuilder(const Plan& p, const ModelSpec& m) : p_(p), m_(m) {}

  MegatronArgs build() {
    parallel();
    pipeline();
    batch();
    model_shape();
    attention();
    experts();
    recompute();
    cuda_graphs();
    precision();
    optimizer_and_overlap();
    data();
    run();
    if (needs_max_connections_) out_.env.push_back("CUDA_DEVICE_MAX_CONNECTIONS=1");
    return std::move(out_);
  }

 private:
  template <class... Values>
  void flag(std::string_view name, const Values&... values) {
    std::string line(name);
    ((line += " " + shell_word(fmt::format("{}", values))), ...);
    out_.flags.push_back(std::move(line));
  }
  void not_expressible(std::string reason) { out_.not_expressible.push_back(std::move(reason)); }
  void note(std::string text) { out_.notes.push_back(std::move(text)); }

  int64_t cp_total() const { return p_.attention.sp * p_.attention.cp; }

  // Megatron's context parallelism takes both our Ulysses SP and our CP: its "a2a" type is Ulysses (heads
  // scattered over the group, full sequence gathered; TE DotProductAttention cp_comm_type) and "a2a+p2p" is
  // a2a inside sub-groups of hierarchical size [sp, cp] with a p2p ring between them.
  void parallel() {
    const auto& a = p_.attention;
    flag("--tensor-model-parallel-size", a.tp);
    flag("--pipeline-model-parallel-size", p_.pipeline.pp);
    if (a.tp > 1) flag("--sequence-parallel");  // MoE layers raise without it (moe_layer.py:636-640)
    const int64_t cp = cp_total();
    if (cp > 1) {
      flag("--context-parallel-size", cp);
      // TE's a2a asserts that the q and k heads on each TP rank divide by the a2a group (context_parallel.py,
      // AttnFuncWithCPAndQKVOA2A); Megatron replicates K/V heads when there are fewer than tp.
      const int64_t kv = m_.attention.num_kv_heads;
      const int64_t kv_per_tp_rank = kv >= a.tp ? kv / a.tp : 1;
      const bool a2a_ok = a.sp == 1 || kv_per_tp_rank % a.sp == 0;
      if (a.sp > 1 && !a2a_ok) {
        not_expressible(fmt::format(
            "Ulysses SP (sp = {}) with {} K/V head(s) per TP rank: Megatron's a2a context parallelism needs "
            "them "
            "divisible by sp and cannot replicate K/V heads over the SP group; mapped to --cp-comm-type "
            "all_gather instead",
            a.sp, kv_per_tp_rank));
      }
      if (a.sp > 1 && a.cp > 1 && a2a_ok) {
        flag("--cp-comm-type", "a2a+p2p");
        flag("--hierarchical-context-parallel-sizes", a.sp, a.cp);
        not_expressible(fmt::format(
            "K/V all-gather over the outer context-parallel group (cp = {}) under Ulysses SP: Megatron's "
            "hierarchical a2a+p2p exchanges K/V in a p2p ring there",
            a.cp));
      } else if (a.sp > 1 && a2a_ok) {
        flag("--cp-comm-type", "a2a");
      } else {
        flag("--cp-comm-type", "all_gather");  // the K/V all-gather the simulator models
      }
      if (p_.seq_len % (2 * cp) != 0) {
        not_expressible(
            fmt::format("sequence length {} with context-parallel size {}: Megatron needs it "
                        "divisible by 2 x {} (A:1335-1338)",
                        p_.seq_len, cp, cp));
      }
      needs_max_connections_ = true;
    }
    if (a.tp > 1) needs_max_connections_ = true;
    if (m_.is_moe()) {
      flag("--expert-model-parallel-size", p_.experts.ep);
      flag("--expert-tensor-parallel-size", p_.experts.etp);  // default would be tp (A:587-588)
    }
  }

  // Even split: Megatron's own (optionally by virtual stages per rank). Uneven: first/last stage counts when
  // every middle rank holds the same layers (TC:2294-2368), else an explicit layout string (TC:2241-2292).
  void pipeline() {
    const auto& pp = p_.pipeline;
    const std::vector<int64_t>& c = pp.layers_per_stage;
    const bool uneven =
        !c.empty() && std::adjacent_find(c.begin(), c.end(), std::not_equal_to<>()) != c.end();
    if (!uneven) {
      if (pp.vpp > 1) flag("--num-virtual-stages-per-pipeline-rank", pp.vpp);
    } else if (auto fl = first_last_split()) {
      flag("--decoder-first-pipeline-num-layers", fl->first);
      flag("--decoder-last-pipeline-num-layers", fl->second);
      if (pp.vpp > 1) flag("--num-virtual-stages-per-pipeline-rank", pp.vpp);
    } else {
      flag("--pipeline-model-parallel-layout", layout());  // VPP = stages / pp (A:941-952)
    }
    if (pp.pp > 1 && pp.vpp > 1 && !p_.overlap.pp_comm) {
      if (pp.pp > 2) {
        flag("--no-overlap-p2p-communication");
      } else {
        not_expressible(
            "pipeline p2p without overlap (overlap.pp_comm = false) at pp = 2 with a virtual pipeline: "
            "Megatron "
            "allows --no-overlap-p2p-communication with VPP only for pp > 2 (A:1000-1010), so p2p overlap "
            "stays "
            "on");
      }
    }
    if (pp.pp > 1 && pp.vpp == 1 && p_.overlap.pp_comm) {
      not_expressible(
          "overlapped pipeline p2p (overlap.pp_comm = true) without a virtual pipeline: Megatron turns p2p "
          "overlap off when VPP is 1 (A:1011-1019)");
    }
  }

  // (first, last) when rank 0's and rank pp-1's virtual stages each hold equal counts and all middle ranks'
  // virtual stages hold one common count (possibly none when pp = 2).
  std::optional<std::pair<int64_t, int64_t>> first_last_split() const {
    const auto& pp = p_.pipeline;
    const std::vector<int64_t>& c = pp.layers_per_stage;
    if (pp.pp < 2 || static_cast<int64_t>(c.size()) != pp.pp * pp.vpp) return std::nullopt;
    auto rank_count = [&](int64_t rank) -> std::optional<int64_t> {
      const int64_t first = c[static_cast<size_t>(rank)];
      for (int64_t v = 1; v < pp.vpp; ++v) {
        if (c[static_cast<size_t>(v * pp.pp + rank)] != first) return std::nullopt;
      }
      return first;
    };
    const auto f = rank_count(0), l = rank_count(pp.pp - 1);
    if (!f || !l || *f <= 0 || *l <= 0) return std::nullopt;
    std::optional<int64_t> middle;
    for (int64_t r = 1; r + 1 < pp.pp; ++r) {
      const auto mr = rank_count(r);
      if (!mr || (middle && *mr != *middle)) return std::nullopt;
      middle = mr;
    }
    if (middle && *middle <= 0) return std::nullopt;  // middle stages without layers (TC:2294-2368)
    return std::pair{*f * pp.vpp, *l * pp.vpp};
  }

  // "E,t*3|t*4|...|t*2,m,L": one '|'-separated stage per virtual stage in model order, E (embedding) first,
  // MTP layers and L (loss) in the last.
  std::string layout() const {
    const std::vector<int64_t>& c = p_.pipeline.layers_per_stage;
    std::string out;
    for (size_t i = 0; i < c.size(); ++i) {
      std::vector<std::string> items;
      if (i == 0) items.emplace_back("E");
      if (c[i] == 1) items.emplace_back("t");
      if (c[i] > 1) items.push_back(fmt::format("t*{}", c[i]));
      if (i + 1 == c.size()) {
        if (m_.mtp_layers == 1) items.emplace_back("m");
        if (m_.mtp_layers > 1) items.push_back(fmt::format("m*{}", m_.mtp_layers));
        items.emplace_back("L");
      }
      out += (i ? "|" : "") + fmt::format("{}", fmt::join(items, ","));
    }
    return out;
  }

  void batch() {
    flag("--micro-batch-size", p_.micro_batch);
    flag("--global-batch-size", p_.global_batch);
    flag("--seq-length", p_.seq_len);
    flag("--max-position-embeddings", p_.seq_len);  // required (A:1314-1317); >= seq-length (A:1353-1356)
  }

  void model_shape() {
    flag("--num-layers", m_.num_layers());
    flag("--hidden-size", m_.hidden);
    flag("--ffn-hidden-size", m_.dense_ffn > 0 ? m_.dense_ffn : m_.moe.expert_ffn);
    flag("--num-attention-heads", m_.attention.num_heads);
    flag("--normalization", m_.norm == NormKind::kRmsNorm ? "RMSNorm" : "LayerNorm");
    if (m_.norm == NormKind::kLayerNormNoBias) not_expressible("LayerNorm without bias (Megatron's has one)");
    if (m_.activation == FfnActivation::kSwiGlu) flag("--swiglu");
    if (m_.activation == FfnActivation::kRelu2) flag("--squared-relu");
    flag("--position-embedding-type", "rope");
    rope_and_norm_constants();
    if (!m_.tied_embeddings) flag("--untie-embeddings-and-output-weights");
    if (m_.lm_head_bias) not_expressible("a bias on the output layer");
    if (m_.mtp_layers > 0) flag("--mtp-num-layers", m_.mtp_layers);  // needs rope or none (A:882-886)

    // Linear biases are all or nothing in Megatron (add_bias_linear), with q/k/v biases on their own flag; an
    // MoE model with biases needs ETP = 1 (TC:2612-2615).
    const bool biases = m_.attention.out_bias || m_.moe.expert_bias;
    if (!biases || (m_.is_moe() && p_.experts.etp > 1)) {
      flag("--disable-bias-linear");
      if (m_.attention.qkv_bias) flag("--add-qkv-bias");
      if (biases) {
        not_expressible(
            fmt::format("linear-layer biases with etp = {}: Megatron needs etp = 1 for an MoE model "
                        "with biases (TC:2612-2615), so they are disabled",
                        p_.experts.etp));
      }
    }
  }

  // The rotary base (an int in Megatron, A:2418-2421) and the norm epsilon from the config; Megatron's
  // defaults (10000, 1e-5) are said where the config states none.
  void rope_and_norm_constants() {
    if (m_.rope_theta > 0) {
      const auto base = static_cast<int64_t>(std::llround(m_.rope_theta));
      flag("--rotary-base", base);
      if (static_cast<double>(base) != m_.rope_theta)
        note(fmt::format("rope_theta {:g} rounded to the integer --rotary-base {}", m_.rope_theta, base));
    } else if (m_.position == PositionKind::kRope) {
      note("the model's config states no rope_theta: Megatron's default --rotary-base 10000 applies");
    }
    // RoPE on part of each head (Megatron's --rotary-percent) and zero-centred norm weights
    // (--apply-layernorm-1p: layernorm_zero_centered_gamma, which TE's RMSNorm honours too).
    if (m_.position == PositionKind::kRope && m_.rotary_fraction < 1.0)
      flag("--rotary-percent", fmt::format("{:g}", m_.rotary_fraction));
    if (m_.norm_zero_centered) flag("--apply-layernorm-1p");
    if (m_.norm_eps > 0) {
      flag("--norm-epsilon", fmt::format("{:g}", m_.norm_eps));
    } else {
      note("the model's config states no norm epsilon: Megatron's default --norm-epsilon 1e-5 applies");
    }
    if (!m_.rope_scaling.empty()) {
      note(fmt::format(
          "the config's rope_scaling ({}) is not passed: it is a context extension, and the plan trains at "
          "sequence length {}; add --rope-type and --rotary-scaling-factor to train with it",
          m_.rope_scaling, p_.seq_len));
    }
  }

  void attention() {
    const AttentionSpec& a = m_.attention;
    if (a.kind == AttentionKind::kMla) {
      // Every MLA dimension explicitly: the CLI defaults would replace MLATransformerConfig's (AU:301-303).
      flag("--multi-latent-attention");
      if (a.mla.q_lora_rank > 0) flag("--q-lora-rank", a.mla.q_lora_rank);
      flag("--kv-lora-rank", a.mla.kv_lora_rank);
      flag("--qk-head-dim", a.mla.qk_nope_head_dim);
      flag("--qk-pos-emb-head-dim", a.mla.qk_rope_head_dim);
      flag("--v-head-dim", a.mla.v_head_dim);
      // The down projections' layout is Megatron-Core's version, not a flag.
      if (p_.attention.mla_down_proj == MlaDownProj::kColumnParallel && p_.attention.tp > 1) {
        note(
            "the plan prices MLA's down projections column-parallel, as Megatron-Core before 0.14 builds "
            "them: run a Megatron-LM of that age, or predict the plan without attention.mla_down_proj for "
            "0.14 and later (duplicated on the sequence shard)");
      }
    } else {
      flag("--kv-channels", a.head_dim);
      if (a.num_kv_heads != a.num_heads) {
        flag("--group-query-attention");
        flag("--num-query-groups", a.num_kv_heads);
      }
      const int64_t tp = p_.attention.tp;
      if (a.num_kv_heads % tp != 0 && tp % a.num_kv_heads != 0) {
        not_expressible(
            fmt::format("{} K/V heads with tp = {}: Megatron needs the query groups to be a "
                        "multiple or a divisor of tp (TC:1461-1468)",
                        a.num_kv_heads, tp));
      }
    }
    switch (a.qk_norm) {
      case QkNorm::kNone:
        break;
      case QkNorm::kPerHead:
        flag("--qk-layernorm");
        break;
      case QkNorm::kUnweighted:
        flag("--qk-l2-norm");
        break;
      case QkNorm::kFull:
        not_expressible("a q/k norm over all heads' dimensions (Megatron's --qk-layernorm is per head)");
        break;
    }
    if (a.sinks) flag("--softmax-type", "learnable");
    if (a.kv_share_layers > 1) {
      not_expressible(
          fmt::format("cross-layer attention (one K/V projection per {} layers)", a.kv_share_layers));
    }
    if (a.output_gate) flag("--attention-output-gate");
    if (a.indexer.heads > 0)
      not_expressible("DSA sparse attention and its lightning indexer (DeepSeek-V3.2)");
    if (m_.encoder_decoder()) {
      not_expressible(
          "an encoder-decoder (Switch Transformer): pretrain_gpt.py builds decoder-only models, and "
          "examples/t5/pretrain_t5.py builds T5 blocks with dense MLPs only (megatron/core/models/T5/"
          "t5_spec.py), so its sparse layers have no flags");
    }
    if (m_.has_mixer(MixerKind::kLinearAttention)) gated_delta_net();
    if (m_.has_mixer(MixerKind::kMamba2) || m_.has_mixer(MixerKind::kNone))
      not_expressible("the Mamba-2 / attention / MoE block pattern (Nemotron-H's hybrid_override_pattern)");
    sliding_windows();
  }

  // Gated DeltaNet layers (Qwen3-Next): TransformerConfig's experimental_attention_variant and linear_*
  // fields as flags (ArgumentGroupFactory, arguments.py:2373 and transformer_config.py:301-382 at d98e8a64;
  // the same fields from core_v0.16.0 on) and --linear-attention-freq (arguments.py:3579): an int N for N - 1
  // linear layers then one softmax-attention layer, repeated, else the per-layer list (1: linear attention).
  void gated_delta_net() {
    const LinearAttentionSpec& g = m_.linear_attention;
    flag("--experimental-attention-variant", "gated_delta_net");
    std::vector<int> linear, attention;
    for (const LayerSpec& l : m_.layers) {
      linear.push_back(l.mixer == MixerKind::kLinearAttention ? 1 : 0);
      attention.push_back(1 - linear.back());
    }
    if (const int64_t n = integer_frequency(attention, 1); n > 1) {
      flag("--linear-attention-freq", n);
    } else {
      std::string list = "[";
      for (size_t i = 0; i < linear.size(); ++i) list += (i ? "," : "") + std::to_string(linear[i]);
      flag("--linear-attention-freq", list + "]");
    }
    flag("--linear-conv-kernel-dim", g.conv_kernel);
    flag("--linear-key-head-dim", g.key_head_dim);
    flag("--linear-value-head-dim", g.value_head_dim);
    flag("--linear-num-key-heads", g.key_heads);
    flag("--linear-num-value-heads", g.value_heads);
    note(
        "--experimental-attention-variant gated_delta_net as Megatron-Core 0.16 to 0.19 name it (this commit "
        "takes it as a deprecated alias of gdn); the development branch of late 2025 that the ModelZoo's "
        "Qwen3-Next runs used spelled it --linear-attention-type gated_delta_net");
  }

  // One window size for the windowed layers, full attention elsewhere: layer numbers (1-based) that are a
  // multiple of --window-attn-skip-freq N attend fully, or a per-layer list with 1 for a windowed layer.
  void sliding_windows() {
    std::set<int64_t> windows;
    std::vector<int> windowed;
    for (const LayerSpec& l : m_.layers) {
      const bool is_windowed = l.window > 0 && l.window < p_.seq_len;  // a wider window attends fully
      if (is_windowed) windows.insert(l.window);
      windowed.push_back(is_windowed ? 1 : 0);
    }
    if (windows.empty()) return;
    if (windows.size() > 1) {
      not_expressible(
          fmt::format("sliding windows of {} different sizes ({}); Megatron has one --window-size",
                      windows.size(), fmt::join(windows, ", ")));
      return;
    }
    flag("--window-size", fmt::format("{},0", *windows.begin()));
    if (std::all_of(windowed.begin(), windowed.end(), [](int w) { return w == 1; })) return;
    std::vector<int> full(windowed.size());
    for (size_t i = 0; i < windowed.size(); ++i) full[i] = 1 - windowed[i];
    if (const int64_t n = integer_frequency(full, 1); n > 1) {
      flag("--window-attn-skip-freq", n);
    } else {
      flag("--window-attn-skip-freq", pattern_expression(windowed));
    }
  }

  std::string dispatcher() const {
    switch (p_.experts.dispatch) {
      case Dispatch::kAllGather:
        return "allgather";
      case Dispatch::kAllToAll:
        return "alltoall";
      case Dispatch::kDedup:
        // DeepEP needs TP x EP > 1 (TD:1835-1836); with one rank there is nothing to deduplicate.
        return p_.attention.tp * p_.experts.ep > 1 ? "flex" : "alltoall";
    }
    return "alltoall";
  }

  void experts() {
    if (!m_.is_moe()) return;
    const MoeSpec& e = m_.moe;
    flag("--num-experts", e.num_experts);
    flag("--moe-router-topk", e.top_k);
    flag("--moe-ffn-hidden-size", e.expert_ffn);
    if (e.num_shared_experts > 0) {
      flag("--moe-shared-expert-intermediate-size", e.num_shared_experts * e.shared_expert_ffn);  // total
      if (e.shared_expert_gate) flag("--moe-shared-expert-gate");
    }
    std::vector<int> moe_layers;
    for (const LayerSpec& l : m_.layers) moe_layers.push_back(l.moe ? 1 : 0);
    if (std::any_of(moe_layers.begin(), moe_layers.end(), [](int x) { return x == 0; })) {
      // An int N: layer i (0-based) is MoE when i % N == 0 (gpt_layer_specs.py:643-671).
      if (const int64_t n = integer_frequency(moe_layers, 0); n > 1) {
        flag("--moe-layer-freq", n);
      } else {
        flag("--moe-layer-freq", pattern_expression(moe_layers));
      }
    }
    flag("--moe-grouped-gemm");
    flag("--moe-permute-fusion");
    // The plan's router: fused (TE fused_topk_with_score_function and the fused aux-loss scores; TE >= 2.6,
    // MU:828-847) or Megatron's default eager one (their kernels: workload's megatron_router_kernels).
    if (p_.routing.fused_router) flag("--moe-router-fusion");
    const std::string type = dispatcher();
    flag("--moe-token-dispatcher-type", type);
    if (type == "flex") {
      // The backend is the stack's (megatron-core-hybridep runs HybridEP, the others DeepEP).
      const bool hybrid = p_.stack.find("hybridep") != std::string::npos;
      flag("--moe-flex-dispatcher-backend", hybrid ? "hybridep" : "deepep");
      // DeepEP's fused index conversion is behind Megatron's experimental switch, which also turns on its
      // other experimental code paths.
      if (!hybrid && p_.experts.fused_index_conversion) flag("--enable-experimental");
      // Where DeepEP's received rows are padded to FP8's alignment is Megatron's and TE's version, not a
      // flag.
      if (!hybrid && p_.precision == Precision::kFp8 && p_.experts.fp8_padding == Fp8Padding::kExperts) {
        note(
            "the plan prices FP8's row padding as TEGroupedMLP's copies, as Megatron-Core before the DeepEP "
            "permute padded (0.14 with Transformer Engine before 2.12): run a Megatron-LM and TE of that "
            "age, "
            "or predict the plan without experts.fp8_padding for later builds, whose --moe-permute-fusion "
            "pads the received rows");
      }
    }
    if (p_.experts.dispatch == Dispatch::kDedup && type != "flex") {
      note("node-deduplicated dispatch with tp x ep = 1 sends nothing between ranks; alltoall used");
    }

    // Router. DeepSeek-V3-style score-correction bias: sigmoid scores and aux-loss-free balancing
    // (expert bias needs sigmoid or sqrtsoftplus, TC:2617-2625). Top-1 with softmax needs pre-softmax
    // (TC:2661-2669).
    if (e.group_limited()) {
      flag("--moe-router-num-groups", e.groups);
      flag("--moe-router-group-topk", e.group_top_k);
    }
    if (e.router_score_bias) {
      flag("--moe-router-score-function", "sigmoid");
      flag("--moe-router-enable-expert-bias");
      flag("--moe-router-load-balancing-type", "none");
    } else if (e.top_k == 1) {
      flag("--moe-router-pre-softmax");
    }
    if (e.router_bias) not_expressible("a bias in the router projection");
    if (e.routed_scaling != 1.0)
      flag("--moe-router-topk-scaling-factor", fmt::format("{:g}", e.routed_scaling));
    if (e.num_experts >= 32) flag("--moe-router-dtype", "fp32");  // warns otherwise (TC:3119-3127)

    // A capacity factor drops tokens (by router probability); dropless otherwise. Default load balancing
    // (aux_loss) and none both allow it (TC:1836-1860).
    if (p_.routing.capacity_factor) {
      flag("--moe-expert-capacity-factor", *p_.routing.capacity_factor);
      flag("--moe-token-drop-policy", "probs");
      if (p_.routing.pad_to_capacity) flag("--moe-pad-expert-input-to-capacity");
    }
    const std::string& d = p_.routing.distribution;
    if (d == "uniform") {
      note(
          "routing.distribution is uniform: add --moe-router-force-load-balancing to benchmark under the "
          "same "
          "balanced routing");
    } else {
      not_expressible(
          fmt::format("routing.distribution \"{}\" is a prediction input; Megatron routes with its "
                      "learned router",
                      d));
    }
    if (p_.compression.dispatch == DispatchPrecision::kFp8) {
      not_expressible(
          "FP8 token dispatch (compression.dispatch = fp8): Megatron's --moe-dispatch-fwd-dtype takes bf16 "
          "or "
          "mxfp8, which Hopper lacks");
    }
  }

  // Per-layer CUDA graphs with TE's make_graphed_callables: the plan's scopes, none for whole layers (the
  // default scope); Megatron turns TE's RNG tracker on for them (arguments.py:1240-1246 at core_v0.16.0), and
  // TE's graphs with the caching allocator's expandable segments need NCCL_GRAPH_REGISTER=0 (ibid.
  // 1247-1253, cuda_graphs.py TECudaGraphHelper).
  void cuda_graphs() {
    if (p_.cuda_graphs == 0) return;
    flag("--cuda-graph-impl", "transformer_engine");
    if (!(p_.cuda_graphs & kGraphLayer)) {
      std::string line = "--cuda-graph-scope";
      for (const std::string& s : cuda_graph_scope_names(p_.cuda_graphs)) line += " " + s;
      out_.flags.push_back(line);
    }
    flag("--te-rng-tracker");
    out_.env.push_back("NCCL_GRAPH_REGISTER=0");
    note(
        "Megatron-Core 0.18 and later call --cuda-graph-scope --cuda-graph-modules; the old name still works "
        "there, with a deprecation warning (arguments.py at core_v0.18.0)");
  }

  // The plan's recompute as Megatron's flags: selective with exactly the plan's modules; full with its method
  // and layer count. MegaScale-MoE's SAR has no Megatron form: its nearest modules are layernorm and moe_act
  // (needs grouped GEMM, TC:1964-1967).
  void recompute() {
    switch (p_.recompute) {
      case Recompute::kNone:
        return;
      case Recompute::kSelective: {
        flag("--recompute-granularity", "selective");
        std::string line = "--recompute-modules";
        for (const std::string& m : recompute_module_names(p_.recompute_modules)) line += " " + m;
        out_.flags.push_back(line);
        return;
      }
      case Recompute::kFull:
        flag("--recompute-granularity", "full");  // needs a method and a layer count (TC:1901-1932)
        flag("--recompute-method", name_of(p_.recompute_method));
        flag("--recompute-num-layers", p_.recompute_num_layers);
        return;
      case Recompute::kSar:
        flag("--recompute-granularity", "selective");
        if (m_.is_moe()) {
          flag("--recompute-modules", "layernorm", "moe_act");
        } else {
          flag("--recompute-modules", "layernorm");
        }
        not_expressible(
            "MegaScale-MoE's selective activation rematerialization (recompute: sar) of communication "
            "outputs "
            "(the dispatched tokens, the all-to-all results) and of the dense SwiGLU: Megatron recomputes "
            "only "
            "--recompute-modules, so it keeps more activations than the plan assumes");
        return;
    }
  }

  void precision() {
    flag("--bf16");
    // The loss kernels the plan was priced with (language_module.py compute_language_model_loss).
    if (p_.cross_entropy != CrossEntropy::kUnfused) {
      flag("--cross-entropy-loss-fusion");
      flag("--cross-entropy-fusion-impl", name_of(p_.cross_entropy));
    }
    if (p_.precision == Precision::kFp8) {
      flag("--fp8-format", "e4m3");
      flag("--fp8-recipe", name_of(p_.fp8_recipe));
      // FP8 parameters, gathered in FP8 (the plan's rules ask for the distributed optimizer or FSDP).
      if (p_.data.fp8_param_gather) flag("--fp8-param-gather");
      // Where the experts' rows are padded to FP8's alignment: Megatron's default (no flag) pads them in
      // TEGroupedMLP, or in HybridEP's dispatch; the plan may pad in the router instead, which needs a
      // dispatcher other than allgather (TC:2641-2660; the plan's rules refuse it there).
      if (m_.is_moe() && p_.experts.fp8_padding == Fp8Padding::kRouter)
        flag("--moe-router-padding-for-quantization");
    }
  }

  void optimizer_and_overlap() {
    const int64_t zero = p_.data.zero;
    if (zero >= 2) {
      // ZeRO-2/3 shard gradients (and parameters): Megatron-FSDP, as the Megatron-Core guide enables it.
      flag("--use-megatron-fsdp");
      flag("--data-parallel-sharding-strategy", zero == 2 ? "optim_grads" : "optim_grads_params");
      flag("--no-gradient-accumulation-fusion");
      needs_max_connections_ = false;  // only a warning under Megatron-FSDP (A:1453-1479)
    }
    if (zero >= 1) flag("--use-distributed-optimizer");
    if (p_.overlap.dp_comm) {
      flag("--overlap-grad-reduce");
      if (zero >= 1) flag("--overlap-param-gather");  // needs the distributed optimizer (A:1024-1029)
    }
    if (p_.compression.grad_sync == GradSync::kBf16ReduceScatter) flag("--grad-reduce-in-bf16");
    if (p_.overlap.cross_micro_batch) {
      // Combined 1F1B: the EP exchange of one micro-batch beside another's compute (TC:3002-3082).
      flag("--overlap-moe-expert-parallel-comm");
      if (p_.overlap.delay_wgrad) flag("--delay-wgrad-compute");  // needs the flag above (TC:3073-3077)
      needs_max_connections_ = false;                             // only a warning with it (A:1453-1479)
    }
    if (p_.overlap.tp_comm) {
      // TE's userbuffers beside the TP linears' GEMMs, with TE's default methods (needs sequence
      // parallelism, which the launch sets under TP).
      flag("--tp-comm-overlap");
    }
    // The shared experts on their own stream beside the dispatch (TC:1820-1826: the alltoall or flex
    // dispatcher; flex only since ebfa13852f, Megatron-Core 0.18).
    if (p_.overlap.shared_experts) {
      flag("--moe-shared-expert-overlap");
      if (dispatcher() == "flex") {
        note(
            "--moe-shared-expert-overlap with the flex dispatcher needs Megatron-Core 0.18 or later "
            "(ebfa13852f); earlier builds refuse it beside any dispatcher but alltoall");
      }
    }
    if (p_.compression.grad_sync == GradSync::kBf16AllToAll) {
      not_expressible(
          "BF16 gradient sync by all-to-all with a local FP32 reduce; the nearest, --grad-reduce-in-bf16, "
          "also "
          "reduces in BF16");
    }

    if (p_.overlap.inter_op) {
      // The nearest Megatron overlaps: EP all-to-all beside another micro-batch's compute (TC:3002-3072),
      // else the shared experts beside the dispatch (TC:1813-1826; with the alltoall dispatcher, where every
      // Megatron-Core has it).
      const std::string type = dispatcher();
      const bool a2a_or_flex = type == "alltoall" || type == "flex";
      const bool moe_recompute =
          p_.recompute == Recompute::kSelective && (p_.recompute_modules & kRecomputeMoe) != 0;
      const bool ep_overlap = m_.is_moe() && p_.experts.ep > 1 && a2a_or_flex &&
                              p_.recompute != Recompute::kFull && !moe_recompute && m_.mtp_layers <= 1 &&
                              (p_.pipeline.pp == 1 || p_.pipeline.vpp > 1);
      std::string instead = "no Megatron overlap flag added";
      if (p_.overlap.cross_micro_batch) {
        // Combined 1F1B is on already (above), and Megatron refuses --moe-shared-expert-overlap beside it.
        instead =
            "--overlap-moe-expert-parallel-comm (the plan's cross-micro-batch overlap) overlaps the EP "
            "all-to-all with another micro-batch instead";
      } else if (p_.overlap.shared_experts) {
        // On already (above); Megatron refuses it beside combined 1F1B.
        instead =
            "--moe-shared-expert-overlap (the plan's overlap.shared_experts) overlaps only the shared "
            "experts with the dispatch";
      } else if (ep_overlap) {
        flag("--overlap-moe-expert-parallel-comm");
        needs_max_connections_ = false;  // only a warning with it (A:1453-1479)
        instead =
            "--overlap-moe-expert-parallel-comm overlaps the EP all-to-all with another micro-batch "
            "instead";
      } else if (m_.is_moe() && m_.moe.num_shared_experts > 0 && type == "alltoall" &&
                 !(p_.recompute == Recompute::kSelective &&
                   (p_.recompute_modules & kRecomputeSharedExperts))) {
        flag("--moe-shared-expert-overlap");
        instead = "--moe-shared-expert-overlap overlaps only the shared experts with the dispatch";
      }
      not_expressible(
          "inter-operator overlap inside a micro-batch (communication on its own stream beside "
          "independent compute, e.g. the K/V all-to-all beside the Q projection, recompute beside "
          "the gradient all-gather); " +
          instead);
    }
    if (p_.overlap.intra_op) {
      not_expressible(
          "intra-operator overlap (fused tile-level GEMM + all-to-all / all-gather / reduce-scatter "
          "kernels); "
          "Megatron's --tp-comm-overlap only chunks TP collectives beside GEMMs");
    }
  }

  // Mock data and a null tokenizer of the model's vocabulary: a benchmark run that needs no data files
  // (build_tokenizer.py:96-114).
  void data() {
    flag("--tokenizer-type", "NullTokenizer");
    flag("--vocab-size", m_.vocab);
    flag("--mock-data");
    note(
        fmt::format("mock data and a null tokenizer of {} tokens; for real training give --data-path and the "
                    "model's tokenizer instead",
                    m_.vocab));
  }

  // A throughput run: 100 iterations logging every step with its throughput, no evaluation, and a placeholder
  // optimizer schedule (the step time does not depend on its values).
  void run() {
    flag("--train-iters", 100);
    flag("--eval-iters", 0);
    flag("--lr", "1e-4");
    flag("--min-lr", "1e-5");
    flag("--lr-decay-style", "cosine");
    flag("--lr-warmup-iters", 10);
    flag("--weight-decay", "0.1");
    flag("--clip-grad", "1.0");
    flag("--adam-beta1", "0.9");
    flag("--adam-beta2", "0.95");
    flag("--init-method-std", "0.02");
    flag("--log-interval", 1);
    flag("--log-throughput");
    note(
        "a 100-iteration throughput run with a placeholder schedule (lr 1e-4 cosine, 10 warm-up iterations, "
        "no evaluation): set your own schedule, --save and --load for training");
  }

  const Plan& p_;
  const ModelSpec& m_;
  MegatronArgs out_;
  bool needs_max_connections_ = false;
};

}  // namespace

NodeLayout node_layout(const Plan& plan, const HardwareProfile& hw) {
  const int64_t g = std::max<int64_t>(1, hw.node.gpus_per_node.value);
  if (plan.gpus <= g) return {1, std::max<int64_t>(1, plan.gpus)};
  return {(plan.gpus + g - 1) / g, g};
}

std::string default_run_dir(const std::string& plan_path) {
  return "runs/" + stem_of(plan_path);
}

MoerunLaunch moerun_launch(const Plan& plan, const HardwareProfile& hw, const std::string& plan_path,
                           const std::string& run_dir, const std::string& backend) {
  const NodeLayout n = node_layout(plan, hw);
  const bool cuda = backend == "cuda";
  const std::string run =
      fmt::format("moerun run {} --backend {} --out {}", shell_word(plan_path), backend, shell_word(run_dir));
  MoerunLaunch out;
  out.plan_json = io::plan_to_json(plan).dump(2) + "\n";
  // CUDA: no core binding (moerun's host threads feed the GPU), NCCL's warnings in the job's output.
  out.mpirun = fmt::format("mpirun -np {} --map-by ppr:{}:node {}{}", plan.gpus, n.ranks_per_node,
                           cuda ? "--bind-to none -x NCCL_DEBUG=WARN " : "", run);
  out.srun_prefix =
      fmt::format("srun --mpi=pmix --nodes={} --ntasks-per-node={}{}", n.nodes, n.ranks_per_node,
                  cuda ? fmt::format(" --gpus-per-node={}", n.ranks_per_node) : "");
  out.srun = out.srun_prefix + " " + run;
  return out;
}

namespace {

// What a CUDA launch needs the user to know about devices and the network; nothing on the CPU backend.
std::string cuda_environment(const std::string& backend, bool script) {
  if (backend != "cuda") return "";
  std::string s =
      "# one rank per GPU: moerun gives local rank i the node's GPU i (GPU 0 when each task sees one GPU)\n"
      "# NCCL runs over NVLink inside a node and InfiniBand across nodes and finds the HCAs itself; where "
      "it\n"
      "# does not, set NCCL_IB_HCA to the node's InfiniBand devices (ibv_devices) and NCCL_SOCKET_IFNAME to\n"
      "# the bootstrap interface\n";
  if (script) s += "export NCCL_DEBUG=WARN\n";
  return s;
}

// A comment line when moerun's executors refuse the model outright (they run decoder-only models), else "".
std::string moerun_refusal(const ModelSpec& model) {
  return model.encoder_decoder()
             ? "# moerun refuses this plan: an encoder-decoder model (its train runner and CUDA replay run "
               "decoder-only models); simulate it with moeplan\n"
             : "";
}

}  // namespace

std::string moerun_text(const Plan& plan, const ModelSpec& model, const HardwareProfile& hw,
                        const std::string& plan_path, const std::string& run_dir,
                        const std::string& backend) {
  const NodeLayout n = node_layout(plan, hw);
  const MoerunLaunch l = moerun_launch(plan, hw, plan_path, run_dir, backend);
  return fmt::format(
      "# moerun plan {}: {} ({} node(s) x {} rank(s), {} backend)\n{}{}{}# start one rank per GPU with "
      "either "
      "line:\n{}\n{}\n",
      plan_path, one_line_summary(plan, model, hw), n.nodes, n.ranks_per_node, backend, moerun_refusal(model),
      l.plan_json, cuda_environment(backend, false), l.mpirun, l.srun);
}

std::string slurm_script(const Plan& plan, const ModelSpec& model, const HardwareProfile& hw,
                         const std::string& plan_path, const std::string& run_dir, const std::string& backend,
                         bool calibrate) {
  const NodeLayout n = node_layout(plan, hw);
  const std::string stem = stem_of(plan_path);
  std::string s = "#!/bin/bash\n";
  s += fmt::format("#SBATCH --job-name=moerun-{}\n", stem);
  s += fmt::format("#SBATCH --nodes={}\n", n.nodes);
  s += fmt::format("#SBATCH --ntasks-per-node={}\n", n.ranks_per_node);
  if (backend == "cuda") s += fmt::format("#SBATCH --gpus-per-node={}\n", n.ranks_per_node);
  s += "#SBATCH --exclusive\n";
  s += fmt::format("#SBATCH --output=moerun-{}-%j.out\n", stem);
  s += fmt::format("# moerun on plan {} ({} backend): {}\n", plan_path, backend,
                   one_line_summary(plan, model, hw));
  s += moerun_refusal(model);
  s += "set -euo pipefail\n";
  s += cuda_environment(backend, true);
  s += fmt::format("mkdir -p {}\n", shell_word(run_dir));
  const MoerunLaunch run = moerun_launch(plan, hw, plan_path, run_dir, backend);
  if (!calibrate) return s + run.srun + "\n";

  // Measure first, then predict on what was measured, run, and compare op by op.
  const std::string dir = shell_word(run_dir), bench_dir = shell_word(run_dir + "/bench");
  std::string base;
  if (backend == "cuda") {
    // The profile whose fields the bench cannot measure (NVLink and network line rates, ...): the plan's.
    std::string ref = plan.hardware.empty() ? hw.name : plan.hardware;
    const fs::path beside = fs::path(plan_path).parent_path() / ref;
    std::error_code ec;
    if (!fs::path(ref).is_absolute() && fs::is_regular_file(beside, ec))
      ref = beside.lexically_normal().string();
    base = " --base " + shell_word(ref);
  }
  s += fmt::format(
      "# moerun, moeplan and the plan's files are on every node; MOERUN_BENCH_FLAGS and MOERUN_RUN_FLAGS add "
      "flags to the two moerun commands (e.g. --max-bytes, --steps)\n"
      "# 1. measure the {} node(s): GEMM, grouped GEMM, attention and HBM tables; nccl-tests-format sweeps "
      "and "
      "an all-to-all-v with a hot receiver over groups of 2, 4, ... ranks and all {}, and over the plan's "
      "expert-parallel group at its busiest rank's load\n",
      n.nodes, plan.gpus);
  s += fmt::format("{} moerun bench --backend {}{} --plan {} --out {} ${{MOERUN_BENCH_FLAGS:-}}\n",
                   run.srun_prefix, backend, base, shell_word(plan_path), bench_dir);
  s += "# 2. a hardware profile fitted from those measurements, and its fit report\n";
  s += fmt::format("moeplan calibrate --bench {} -o {}/hardware.json --report >{}/calibrate.txt\n", bench_dir,
                   dir, dir);
  s += "# 3. the plan predicted on that profile (stops here if the plan does not fit what was measured)\n";
  s += fmt::format("moeplan simulate {} --hardware {}/hardware.json --json >{}/predicted.json\n",
                   shell_word(plan_path), dir, dir);
  s += "# 4. the plan run for real\n";
  s += run.srun + " ${MOERUN_RUN_FLAGS:-}\n";
  s += "# 5. predicted against measured, op by op\n";
  s += fmt::format("moeplan compare {}/predicted.json {}/report.json | tee {}/compare.txt\n", dir, dir, dir);
  return s;
}

MegatronArgs megatron_args(const Plan& plan, const ModelSpec& model, const HardwareProfile& /*hw*/) {
  if (const std::optional<ModelSpec> trained = trained_model(model, plan))
    return MegatronBuilder(plan, *trained).build();
  return MegatronBuilder(plan, model).build();
}

std::vector<std::string> megatron_flags(const Plan& plan, const ModelSpec& model, const HardwareProfile& hw) {
  return megatron_args(plan, model, hw).flags;
}

std::string megatron_text(const Plan& plan, const ModelSpec& model, const HardwareProfile& hw,
                          const std::string& plan_path) {
  const MegatronArgs a = megatron_args(plan, model, hw);
  const NodeLayout n = node_layout(plan, hw);
  const std::string commit(kMegatronCommit);
  std::string s = "#!/bin/bash\n";
  s += fmt::format("# Megatron-LM (Megatron-Core) launch for plan {}: {}\n", plan_path,
                   one_line_summary(plan, model, hw));
  s += fmt::format(
      "# tp {}, cp {} (sp {} x cp {}), ep {}, etp {}, pp {}, vpp {}, dp {}; {} micro-batch(es) of "
      "{} x {} tokens per step\n",
      plan.attention.tp, plan.attention.sp * plan.attention.cp, plan.attention.sp, plan.attention.cp,
      plan.experts.ep, plan.experts.etp, plan.pipeline.pp, plan.pipeline.vpp, plan.dp(),
      plan.dp() > 0 ? plan.num_micro_batches() : 0, plan.micro_batch, plan.seq_len);
  s += fmt::format(
      "# the flags are those of Megatron-LM commit {} (2026-08-22): set MEGATRON_LM to a checkout of it\n",
      commit);
  for (const std::string& r : a.not_expressible)
    s += fmt::format("# not expressible in Megatron-LM: {}\n", r);
  for (const std::string& r : a.notes) s += fmt::format("# note: {}\n", r);
  s += fmt::format(
      "# run once on each of the {} node(s): under Slurm, srun --nodes={} --ntasks-per-node=1 bash <this "
      "script>; elsewhere set NODE_RANK and MASTER_ADDR on each node\n",
      n.nodes, n.nodes);
  s += "set -euo pipefail\n";
  s += fmt::format("MEGATRON_LM=\"${{MEGATRON_LM:?set MEGATRON_LM to a Megatron-LM checkout at {}}}\"\n",
                   commit.substr(0, 12));
  for (const std::string& e : a.env) s += fmt::format("export {}\n", e);
  s += "NODE_RANK=\"${NODE_RANK:-${SLURM_NODEID:-0}}\"\n";
  if (n.nodes > 1) {
    s += "if [[ -z \"${MASTER_ADDR:-}\" && -n \"${SLURM_JOB_NODELIST:-}\" ]]; then\n";
    s += "  MASTER_ADDR=\"$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)\"\n";
    s += "fi\n";
    s += "MASTER_ADDR=\"${MASTER_ADDR:?set MASTER_ADDR to the address of the first node}\"\n";
  } else {
    s += "MASTER_ADDR=\"${MASTER_ADDR:-localhost}\"\n";
  }
  s += fmt::format(
      "torchrun --nnodes={} --nproc-per-node={} --node-rank=\"$NODE_RANK\" --master-addr=\"$MASTER_ADDR\" "
      "--master-port=\"${{MASTER_PORT:-29500}}\" \\\n",
      n.nodes, n.ranks_per_node);
  s += "  \"$MEGATRON_LM/pretrain_gpt.py\" \\\n";
  for (size_t i = 0; i < a.flags.size(); ++i)
    s += "  " + a.flags[i] + (i + 1 < a.flags.size() ? " \\\n" : "\n");
  return s;
}

Plan rebase_plan_paths(const Plan& plan, const std::string& from_plan_path, const std::string& to_plan_path) {
  const fs::path from_dir = fs::path(from_plan_path).parent_path();
  const fs::path to_dir = fs::path(to_plan_path).parent_path();
  auto rebase = [&](const std::string& ref) {
    if (ref.empty()) return ref;
    const fs::path p(ref);
    if (p.is_absolute()) return ref;
    const fs::path src = from_dir / p;
    std::error_code ec;
    if (!fs::is_regular_file(src, ec)) return ref;  // a built-in name
    const fs::path abs_src = fs::absolute(src, ec).lexically_normal();
    if (ec) return ref;
    const fs::path abs_to = fs::absolute(to_dir.empty() ? fs::path(".") : to_dir, ec).lexically_normal();
    if (ec) return abs_src.string();
    const fs::path rel = abs_src.lexically_relative(abs_to);
    return rel.empty() ? abs_src.string() : rel.string();
  };
  Plan out = plan;
  out.model = rebase(plan.model);
  out.hardware = rebase(plan.hardware);
  out.stack = rebase(plan.stack);
  const std::string& d = plan.routing.distribution;
  if (d != "uniform" && !d.starts_with("zipf:")) out.routing.distribution = rebase(d);
  return out;
}

}  // namespace moeplan::planner
