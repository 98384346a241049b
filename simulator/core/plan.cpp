// The legality rules of a plan (degrees, divisibility, schedule constraints), each with its reason.
#include "simulator/core/plan.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>

#include "simulator/core/model_stats.h"

namespace moeplan {
namespace {

// The broken rules, with their reasons, by name only, or only the first one's name.
class Rules {
 public:
  enum class Keep { kReasons, kNames, kFirst };
  explicit Rules(Keep keep) : keep_(keep) {}
  template <class... Args>
  void check(bool ok, const char* rule, const Args&... parts) {
    if (ok || first) return;
    switch (keep_) {
      case Keep::kFirst:
        first = rule;
        return;
      case Keep::kNames:
        out.push_back({rule, {}});
        return;
      case Keep::kReasons:
        break;
    }
    std::ostringstream s;
    (s << ... << parts);
    out.push_back({rule, s.str()});
  }
  bool reasons() const { return keep_ == Keep::kReasons; }
  std::vector<Violation> out;
  const char* first = nullptr;  // kFirst only

 private:
  Keep keep_;
};

bool divides(int64_t d, int64_t n) {
  return d > 0 && n % d == 0;
}

std::string list_text(const std::vector<int64_t>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + "]";
}

}  // namespace

bool fp8_params(const Plan& plan) {
  return plan.precision == Precision::kFp8 && plan.data.fp8_param_gather;
}

double main_grad_bytes(const Plan& plan) {
  return plan.compression.grad_sync == GradSync::kBf16ReduceScatter ? 2.0 : 4.0;
}

const char* mfu_peak_dtype(const Plan& plan, const HardwareProfile& hw) {
  return plan.precision == Precision::kFp8 && hw.gpu.peak_flops_per_s.contains("fp8") ? "fp8" : "bf16";
}

std::vector<int64_t> uneven_split(int64_t layers, int64_t chunks) {
  std::vector<int64_t> out(static_cast<size_t>(chunks), layers / chunks);
  int64_t rem = layers % chunks;
  for (int64_t i = 1; i + 1 < chunks && rem > 0; ++i, --rem) ++out[static_cast<size_t>(i)];
  for (size_t i = 0; rem > 0; ++i, --rem) ++out[i];
  return out;
}

RuleChecker::Facts rule_facts(const ModelSpec& m) {
  const bool dense_ffn =
      std::any_of(m.layers.begin(), m.layers.end(), [](const LayerSpec& l) { return l.ffn && !l.moe; });
  return {m.has_mixer(MixerKind::kLinearAttention), m.has_mixer(MixerKind::kMamba2), m.encoder_decoder(),
          dense_ffn};
}

std::optional<ModelSpec> trained_model(const ModelSpec& model, const Plan& plan) {
  if (!plan.mtp_layers || *plan.mtp_layers == model.mtp_layers) return std::nullopt;
  ModelSpec trained = model;
  trained.mtp_layers = *plan.mtp_layers;
  return trained;
}

namespace {

// Per-layer CUDA graphs, as Megatron-Core allows them (TransformerConfig.__post_init__ at core_v0.16.0,
// transformer_config.py:1715-1820, and TransformerLayer's capture).
void check_cuda_graphs(Rules& r, const Plan& p, const ModelSpec& m, const RuleChecker::Facts& facts) {
  const uint8_t g = p.cuda_graphs;
  const bool whole_layer = (g & kGraphLayer) != 0;
  r.check((g & ~kAllCudaGraphScopes) == 0, "cuda_graphs_scopes", "cuda_graphs names an unknown scope");
  r.check(!whole_layer || g == kGraphLayer, "cuda_graphs_layer_alone",
          "cuda_graphs \"layer\" captures whole layers and takes no other scope (Megatron: the full scope "
          "cannot be used with other scopes)");
  r.check(!((g & kGraphMoe) && (g & kGraphMoeRouter)), "cuda_graphs_moe_or_router",
          "cuda_graphs cannot hold both moe and moe_router (transformer_config.py:1743-1746)");
  r.check(!(g & kGraphMoePreprocess) || (g & kGraphMoeRouter), "cuda_graphs_preprocess_needs_router",
          "cuda_graphs moe_preprocess is captured with the router and needs moe_router "
          "(transformer_config.py:1747-1750)");
  r.check(!(g & (kGraphMoe | kGraphMoeRouter | kGraphMoePreprocess)) || m.is_moe(),
          "cuda_graphs_moe_needs_moe", "cuda_graphs moe, moe_router and moe_preprocess need MoE layers (",
          m.name, " has none)");
  r.check(!(g & kGraphMlp) || facts.dense_ffn, "cuda_graphs_mlp_needs_dense_layers",
          "cuda_graphs mlp captures the MLP of dense layers, and ", m.name,
          " has none (transformer_config.py:1756-1763)");
  r.check(!(g & kGraphMamba) || facts.mamba, "cuda_graphs_mamba_needs_mamba",
          "cuda_graphs mamba captures Mamba mixers, and ", m.name, " has none");
  // A whole MoE in a graph needs its shapes fixed: drop-and-pad (no counts copied to the host).
  r.check(
      !((g & kGraphMoe) || (whole_layer && m.is_moe())) || p.routing.pad_to_capacity,
      "cuda_graphs_moe_needs_padding",
      "cuda_graphs that capture the whole MoE (moe, or layer on an MoE model) need routing.pad_to_capacity "
      "(Megatron: moe cuda graph is only supported with drop-padding MoE, transformer_config.py:1764-1771)");
  // The all-to-all dispatcher's preprocess copies counts to the host under a capacity factor without
  // padding, or with the router's FP8 padding (transformer_config.py:1772-1779).
  r.check(!(g & kGraphMoePreprocess) || p.experts.dispatch != Dispatch::kAllToAll ||
              p.routing.pad_to_capacity ||
              (!p.routing.capacity_factor && p.experts.fp8_padding != Fp8Padding::kRouter),
          "cuda_graphs_preprocess_host_copies",
          "cuda_graphs moe_preprocess cannot capture the all-to-all dispatcher's preprocess under a capacity "
          "factor without padding or with the router's FP8 padding: it copies counts to the host "
          "(transformer_config.py:1772-1779)");
  r.check(p.recompute != Recompute::kFull && p.recompute != Recompute::kSar, "cuda_graphs_no_full_recompute",
          "cuda_graphs per layer cannot run with full recompute (Megatron: full recompute only with a whole-"
          "iteration graph, which moeplan does not model)");
  r.check(
      !(p.recompute == Recompute::kSelective && (p.recompute_modules & kRecomputeMoe) &&
        (g & kGraphMoeRouter)),
      "cuda_graphs_moe_recompute_router",
      "cuda_graphs moe_router cannot run with the moe recompute module (transformer_config.py:1788-1795)");
  r.check(!(p.overlap.cross_micro_batch && (whole_layer || (g & kGraphMoe))), "cuda_graphs_cross_micro_batch",
          "overlap.cross_micro_batch needs the dispatch outside the graphs: capture attn, moe_router and "
          "moe_preprocess instead of the whole layer or MoE (transformer_layer.py _te_cuda_graph_replay: EP "
          "overlap must be disabled when CUDA graph captures the whole MLP/MoE part)");
}

void check_rules(Rules& r, const Plan& p, const ModelSpec& m, const HardwareProfile& hw,
                 const RuleChecker::Facts& facts) {
  const auto& a = p.attention;
  const auto& e = p.experts;
  const auto& pp = p.pipeline;

  // Meshes: pp stages, each split into the attention mesh x dp and (folded) into the expert mesh x expert-dp.
  r.check(divides(pp.pp, p.gpus), "gpus_divisible_by_pp", "gpus (", p.gpus, ") is not divisible by pp (",
          pp.pp, ")");
  const bool stage_ok = divides(pp.pp, p.gpus);
  const int64_t per_stage = stage_ok ? p.gpus / pp.pp : 0;
  r.check(!stage_ok || divides(p.attention_mesh(), per_stage), "attention_mesh_divides_stage", "tp*sp*cp (",
          a.tp, "*", a.sp, "*", a.cp, " = ", p.attention_mesh(), ") does not divide the ", per_stage,
          " GPUs of a pipeline stage");
  r.check(!stage_ok || divides(p.expert_mesh(), per_stage), "expert_mesh_divides_stage", "ep*etp (", e.ep,
          "*", e.etp, " = ", p.expert_mesh(), ") does not divide the ", per_stage,
          " GPUs of a pipeline stage");

  // Attention: heads split over tp and sp; KV heads split over tp (or replicated when fewer than tp*sp).
  const auto& att = m.attention;
  r.check(divides(a.tp * a.sp, att.num_heads), "heads_divisible", "attention heads (", att.num_heads,
          ") are not divisible by tp*sp (", a.tp * a.sp, ")");
  const int64_t kv_split = a.tp * a.sp;
  r.check(divides(kv_split, att.num_kv_heads) || divides(att.num_kv_heads, kv_split), "kv_heads_vs_tp",
          "KV heads (", att.num_kv_heads, ") neither divide nor are divisible by tp*sp (", kv_split, ")");
  r.check(divides(a.tp, m.hidden), "hidden_divisible_by_tp", "hidden size (", m.hidden,
          ") is not divisible by tp (", a.tp, ")");
  r.check(m.dense_ffn == 0 || divides(a.tp, m.dense_ffn), "dense_ffn_divisible_by_tp", "dense FFN size (",
          m.dense_ffn, ") is not divisible by tp (", a.tp, ")");

  // Recurrent mixers (Gated DeltaNet, Mamba-2): their heads split over tp*sp like attention heads (Mamba's
  // B/C groups too); a chunk of the sequence needs the state of the chunks before it, which context
  // parallelism would pass between ranks in order, and no stack here does that.
  const bool delta_net = facts.delta_net, mamba = facts.mamba;
  if (delta_net) {
    const auto& g = m.linear_attention;
    r.check(divides(a.tp * a.sp, g.key_heads) && divides(a.tp * a.sp, g.value_heads), "mixer_heads_divisible",
            "Gated DeltaNet heads (", g.key_heads, " key, ", g.value_heads,
            " value) are not divisible by tp*sp (", a.tp * a.sp, ")");
  }
  if (mamba) {
    r.check(divides(a.tp * a.sp, m.mamba.heads) && divides(a.tp * a.sp, m.mamba.groups),
            "mixer_heads_divisible", "Mamba-2 heads (", m.mamba.heads, ") and groups (", m.mamba.groups,
            ") are not divisible by tp*sp (", a.tp * a.sp, ")");
  }
  r.check(
      a.cp == 1 || !(delta_net || mamba), "recurrent_mixer_no_cp", "cp = ", a.cp,
      ": the model's Gated DeltaNet / Mamba-2 layers carry state along the sequence, and context parallelism "
      "of them is not modelled");

  // Encoder-decoder (Switch Transformer): the lowering models its two stacks on one pipeline stage, with the
  // decoder's targets split over tp only. Megatron-Core's T5 splits the pipeline between the stacks and
  // supports neither context parallelism nor Ulysses; neither is modelled here.
  if (facts.encoder_decoder) {
    r.check(
        p.pipeline.pp == 1, "encoder_decoder_pp", "pp = ", p.pipeline.pp,
        ": pipeline stages of an encoder-decoder (split between its encoder and decoder) are not modelled");
    r.check(a.sp == 1 && a.cp == 1, "encoder_decoder_sequence_split", "sp = ", a.sp, ", cp = ", a.cp,
            ": Ulysses and context parallelism of cross-attention are not modelled (tp's sequence "
            "parallelism is)");
    const int64_t targets = decoder_seq_len(p.seq_len);
    r.check(divides(a.tp, targets), "decoder_seq_divisible", "decoder length (", targets, " targets for ",
            p.seq_len, " input tokens) is not divisible by tp (", a.tp, ")");
  }

  // Sequence: SP (Megatron, over tp) and Ulysses split it; CP splits it into 2*cp load-balanced chunks.
  const int64_t seq_split = a.tp * a.sp * a.cp * (a.cp > 1 ? 2 : 1);
  r.check(divides(seq_split, p.seq_len), "seq_divisible", "sequence length (", p.seq_len,
          ") is not divisible by tp*sp*cp", (a.cp > 1 ? "*2" : ""), " (", seq_split, ")");

  // Experts.
  if (m.is_moe()) {
    r.check(divides(e.ep, m.moe.num_experts), "experts_divisible_by_ep", "routed experts (",
            m.moe.num_experts, ") are not divisible by ep (", e.ep, ")");
    r.check(divides(e.etp, m.moe.expert_ffn), "expert_ffn_divisible_by_etp", "expert FFN size (",
            m.moe.expert_ffn, ") is not divisible by etp (", e.etp, ")");
    r.check(m.moe.num_shared_experts == 0 || divides(e.etp, m.moe.shared_expert_ffn),
            "shared_ffn_divisible_by_etp", "shared-expert FFN size (", m.moe.shared_expert_ffn,
            ") is not divisible by etp (", e.etp, ")");
  } else {
    r.check(e.ep == 1 && e.etp == 1, "dense_model_no_ep",
            "the model has no routed experts, so ep and etp must be 1");
  }

  // Pipeline: layers per (virtual) stage.
  const int64_t chunks = pp.pp * pp.vpp;
  if (pp.layers_per_stage.empty()) {
    const bool even = divides(chunks, m.num_layers());
    r.check(even, "layers_divisible", "layers (", m.num_layers(), ") are not divisible by pp*vpp (", chunks,
            "); give pipeline.layers_per_stage for an uneven split",
            !even && r.reasons() && chunks > 0 && chunks <= m.num_layers()
                ? ", e.g. " + list_text(uneven_split(m.num_layers(), chunks)) +
                      " (smaller first and last chunks, which hold the embedding and the loss)"
                : std::string());
  } else {
    const auto n = static_cast<int64_t>(pp.layers_per_stage.size());
    const int64_t sum = std::accumulate(pp.layers_per_stage.begin(), pp.layers_per_stage.end(), int64_t{0});
    r.check(n == chunks, "layers_per_stage_length", "pipeline.layers_per_stage has ", n,
            " entries, expected pp*vpp = ", chunks);
    r.check(sum == m.num_layers(), "layers_per_stage_sum", "pipeline.layers_per_stage sums to ", sum,
            ", expected the model's ", m.num_layers(), " layers");
  }
  r.check(pp.vpp == 1 || pp.schedule != Schedule::k1F1B, "vpp_needs_interleaved", "vpp = ", pp.vpp,
          " needs schedule interleaved_1f1b");
  r.check(pp.schedule != Schedule::kDualPipeV || (pp.vpp == 2 && pp.pp >= 2), "dualpipev_shape",
          "dualpipev runs two virtual stages per rank in a V and needs pp >= 2 and vpp = 2 (pp = ", pp.pp,
          ", vpp = ", pp.vpp, ")");
  r.check(pp.schedule != Schedule::kInterleaved1F1B || (pp.vpp > 1 && pp.pp > 1), "interleaved_needs_vpp",
          "interleaved_1f1b needs pp > 1 and vpp > 1 (pp = ", pp.pp, ", vpp = ", pp.vpp, ")");

  // Batch: global batch = micro_batch * dp * micro-batches.
  if (stage_ok && divides(p.attention_mesh(), per_stage)) {
    const int64_t dp = p.dp();
    r.check(divides(p.micro_batch * dp, p.global_batch), "batch_divisible", "global batch (", p.global_batch,
            ") is not divisible by micro_batch*dp (", p.micro_batch, "*", dp, " = ", p.micro_batch * dp, ")");
    if (divides(p.micro_batch * dp, p.global_batch) && pp.schedule == Schedule::kInterleaved1F1B) {
      r.check(divides(pp.pp, p.num_micro_batches()), "interleaved_micro_batches",
              "interleaved_1f1b needs the ", p.num_micro_batches(), " micro-batches to be a multiple of pp (",
              pp.pp, ")");
    }
    if (divides(p.micro_batch * dp, p.global_batch) && pp.schedule == Schedule::kDualPipeV) {
      r.check(p.num_micro_batches() >= 2 * pp.pp, "dualpipev_micro_batches",
              "dualpipev needs at least 2 pp = ", 2 * pp.pp, " micro-batches (the plan has ",
              p.num_micro_batches(), ")");
    }
  }

  // Recompute.
  if (p.recompute == Recompute::kSelective) {
    r.check(p.recompute_modules != 0 && (p.recompute_modules & ~kAllRecomputeModules) == 0,
            "recompute_modules", "selective recompute needs at least one of Megatron's recompute modules");
    r.check(!(p.recompute_modules & kRecomputeMlaUpProj) || att.kind == AttentionKind::kMla,
            "recompute_mla_up_proj_needs_mla", "recompute module mla_up_proj needs MLA attention (", m.name,
            " has none)");
    r.check(!(p.recompute_modules & kRecomputeSharedExperts) || m.moe.num_shared_experts > 0,
            "recompute_shared_experts_needs_shared", "recompute module shared_experts needs shared experts (",
            m.name, " has none)");
    r.check(!(p.recompute_modules & (kRecomputeMoe | kRecomputeMoeAct)) || m.is_moe(),
            "recompute_moe_needs_moe", "recompute modules moe and moe_act need MoE layers");
    r.check(p.precision != Precision::kFp8 || p.fp8_recipe != Fp8Recipe::kDelayed ||
                !(p.recompute_modules & (kRecomputeMoeAct | kRecomputeLayernorm)),
            "recompute_fp8_delayed",
            "the delayed FP8 recipe cannot recompute moe_act or layernorm (Megatron); use tensorwise or "
            "blockwise");
  }
  r.check(p.attention.mla_down_proj == MlaDownProj::kStack || att.kind == AttentionKind::kMla,
          "mla_down_proj_needs_mla", "attention.mla_down_proj names a layout of MLA's down projections, and ",
          m.name, " has no MLA attention");
  if (p.data.fp8_param_gather) {
    r.check(p.precision == Precision::kFp8, "fp8_param_gather_needs_fp8",
            "data.fp8_param_gather keeps the GEMM weights in FP8, and the plan is not an FP8 plan");
    // Megatron: --fp8-param-gather only with the distributed optimizer or FSDP (arguments.py:655-656 at
    // core_v0.16.0).
    r.check(p.data.zero >= 1, "fp8_param_gather_needs_sharding",
            "data.fp8_param_gather needs the distributed optimizer (data.zero >= 1); Megatron refuses it at "
            "zero 0");
  }
  if (p.experts.fp8_padding != Fp8Padding::kStack) {
    r.check(
        p.precision == Precision::kFp8 && m.is_moe(), "fp8_padding_needs_fp8_moe",
        "experts.fp8_padding names where FP8 pads the experts' rows, and the plan is not an FP8 plan of an "
        "MoE model");
    // Megatron refuses router padding under the allgather dispatcher (transformer_config.py:2655-2659 at
    // d98e8a64).
    r.check(p.experts.fp8_padding != Fp8Padding::kRouter || p.experts.dispatch != Dispatch::kAllGather,
            "fp8_router_padding_dispatch",
            "experts.fp8_padding \"router\" needs a dispatcher other than all_gather (Megatron refuses it)");
  }
  if (p.recompute == Recompute::kFull) {
    int64_t largest_chunk = 0;
    if (pp.layers_per_stage.empty()) {
      largest_chunk = chunks > 0 ? (m.num_layers() + chunks - 1) / chunks : 0;
    } else {
      for (int64_t n : pp.layers_per_stage) largest_chunk = std::max(largest_chunk, n);
    }
    r.check(p.recompute_num_layers >= 1 && p.recompute_num_layers <= std::max<int64_t>(1, largest_chunk),
            "recompute_num_layers", "recompute_num_layers is ", p.recompute_num_layers,
            ", expected 1 to the layers of the largest pipeline chunk (", largest_chunk, ")");
  }

  // Cross-micro-batch overlap (Megatron's combined 1F1B, TransformerConfig's rules).
  if (p.overlap.cross_micro_batch) {
    r.check(m.is_moe() && e.ep > 1, "cross_micro_batch_needs_ep",
            "overlap.cross_micro_batch overlaps expert-parallel communication and needs ep > 1 (ep = ", e.ep,
            ")");
    r.check(p.recompute != Recompute::kFull, "cross_micro_batch_no_full_recompute",
            "overlap.cross_micro_batch cannot run with full recompute");
    r.check(!(p.recompute == Recompute::kSelective && (p.recompute_modules & kRecomputeMoe)),
            "cross_micro_batch_no_moe_recompute",
            "overlap.cross_micro_batch cannot run with the moe recompute module");
    r.check(
        p.experts.dispatch != Dispatch::kAllGather, "cross_micro_batch_needs_a2a_dispatch",
        "overlap.cross_micro_batch needs the all-to-all or node-deduplicated dispatch (Megatron's alltoall "
        "or flex dispatcher), not all_gather");
    r.check(m.mtp_layers <= 1, "cross_micro_batch_mtp_layers",
            "overlap.cross_micro_batch allows at most one MTP layer (", m.name, " has ", m.mtp_layers, ")");
    r.check(pp.pp == 1 || pp.vpp > 1, "cross_micro_batch_needs_vpp",
            "overlap.cross_micro_batch with pp > 1 needs a virtual pipeline (vpp > 1); pp = ", pp.pp);
  }
  // TE's userbuffers pipeline TP exchanges over NVLink (Megatron: --tp-comm-overlap needs TP with
  // sequence parallelism, which the lowering always has; TE bootstraps the buffers within a node).
  r.check(!p.overlap.tp_comm || p.attention.tp > 1, "tp_comm_needs_tp",
          "overlap.tp_comm overlaps tensor-parallel exchanges and needs attention.tp > 1 (tp = ",
          p.attention.tp, ")");
  // Padding each expert's input to its capacity (Megatron's rules: TransformerConfig at core_v0.16.0).
  if (p.routing.pad_to_capacity) {
    r.check(
        p.routing.capacity_factor.has_value(), "pad_to_capacity_needs_capacity_factor",
        "routing.pad_to_capacity pads each expert's rows to the capacity and needs routing.capacity_factor "
        "(transformer_config.py:1131-1135)");
    r.check(p.experts.dispatch == Dispatch::kAllToAll, "pad_to_capacity_needs_all_to_all",
            "routing.pad_to_capacity is modelled for the all-to-all dispatch only (DeepEP refuses it, "
            "transformer_config.py:1074-1081), not ",
            name_of(p.experts.dispatch));
  }
  // The shared experts beside the dispatch (Megatron's rules: TransformerConfig at core_v0.16.0).
  if (p.overlap.shared_experts) {
    r.check(m.is_moe() && m.moe.num_shared_experts > 0, "shared_experts_overlap_needs_shared_experts",
            "overlap.shared_experts overlaps the shared experts with the dispatch, and ", m.name,
            " has no shared experts");
    r.check(p.experts.dispatch != Dispatch::kAllGather, "shared_experts_overlap_needs_a2a_dispatch",
            "overlap.shared_experts needs the all-to-all or node-deduplicated dispatch (Megatron: "
            "--moe-shared-expert-overlap with the alltoall dispatcher, transformer_config.py:1090-1095 at "
            "core_v0.16.0, and the flex dispatcher since ebfa13852f, core_v0.18.0), not all_gather");
    r.check(!p.overlap.cross_micro_batch, "shared_experts_overlap_not_cross_micro_batch",
            "overlap.shared_experts cannot run with overlap.cross_micro_batch (Megatron: disable "
            "--moe-shared-expert-overlap with --overlap-moe-expert-parallel-comm, "
            "transformer_config.py:1886-1888)");
    r.check(!(p.recompute == Recompute::kSelective && (p.recompute_modules & kRecomputeSharedExperts)),
            "shared_experts_overlap_no_shared_recompute",
            "overlap.shared_experts cannot run with the shared_experts recompute module "
            "(transformer_config.py:1233-1239)");
  }
  if (p.cuda_graphs != 0) check_cuda_graphs(r, p, m, facts);
  r.check(
      !p.overlap.delay_wgrad || p.overlap.cross_micro_batch, "delay_wgrad_needs_cross_micro_batch",
      "overlap.delay_wgrad delays weight gradients within the combined 1F1B and needs "
      "overlap.cross_micro_batch (Megatron: --delay-wgrad-compute needs --overlap-moe-expert-parallel-comm)");

  r.check(p.data.zero >= 0 && p.data.zero <= 3, "zero_stage", "data.zero is ", p.data.zero,
          ", expected 0..3");
  // Cluster shape: whole nodes, or a part of one node.
  const int64_t g = hw.node.gpus_per_node.value;
  r.check(g <= 0 || p.gpus < g || p.gpus % g == 0, "whole_nodes", "gpus (", p.gpus,
          ") is neither a multiple of the ", g, " GPUs per node nor less than one node");
}

}  // namespace

std::vector<Violation> validate(const Plan& p, const ModelSpec& m, const HardwareProfile& hw, bool reasons) {
  Rules r(reasons ? Rules::Keep::kReasons : Rules::Keep::kNames);
  check_rules(r, p, m, hw, rule_facts(m));
  return r.out;
}

const char* first_broken_rule(const Plan& p, const ModelSpec& m, const HardwareProfile& hw) {
  return RuleChecker(m, hw).first_broken_rule(p);
}

RuleChecker::RuleChecker(const ModelSpec& model, const HardwareProfile& hw)
    : model_(model), hw_(hw), facts_(rule_facts(model)) {}

const char* RuleChecker::first_broken_rule(const Plan& p) const {
  Rules r(Rules::Keep::kFirst);
  check_rules(r, p, model_, hw_, facts_);
  return r.first;
}

std::vector<Violation> validate_for_stack(const Plan& p, const StackProfile& stack, bool reasons) {
  Rules r(reasons ? Rules::Keep::kReasons : Rules::Keep::kNames);
  const auto& c = stack.capabilities;
  auto check = [&](const std::vector<std::string>& list, const std::string& value, const char* rule,
                   const char* what) {
    r.check(
        stack_has(list, value), rule, "stack ", stack.name, " cannot run ", what, " \"", value,
        "\" (it has: ",
        [&] {
          std::string out;
          for (const auto& v : list) out += (out.empty() ? "" : ", ") + v;
          return out;
        }(),
        ")");
  };
  check(c.dispatch, name_of(p.experts.dispatch), "stack_dispatch", "experts.dispatch");
  check(c.recompute, name_of(p.recompute), "stack_recompute", "recompute");
  if (p.recompute == Recompute::kSelective) {
    for (const std::string& m : recompute_module_names(p.recompute_modules))
      check(c.recompute_modules, m, "stack_recompute_modules", "recompute module");
  }
  check(c.schedules, name_of(p.pipeline.schedule), "stack_schedule", "pipeline.schedule");
  check(c.precision, name_of(p.precision), "stack_precision", "precision");
  if (p.precision == Precision::kFp8)
    check(c.fp8_recipes, name_of(p.fp8_recipe), "stack_fp8_recipe", "fp8_recipe");
  check(c.grad_sync, name_of(p.compression.grad_sync), "stack_grad_sync", "compression.grad_sync");
  check(c.dispatch_precision, name_of(p.compression.dispatch), "stack_dispatch_precision",
        "compression.dispatch");
  if (p.attention.mla_down_proj != MlaDownProj::kStack)
    check(c.mla_down_proj, name_of(p.attention.mla_down_proj), "stack_mla_down_proj",
          "attention.mla_down_proj");
  if (p.experts.fp8_padding != Fp8Padding::kStack)
    check(c.fp8_padding, name_of(p.experts.fp8_padding), "stack_fp8_padding", "experts.fp8_padding");
  if (p.data.fp8_param_gather) check(c.param_gather, "fp8", "stack_param_gather", "parameters gathered in");
  // A stack lists the CUDA-graph scopes it captures; none listed, it captures none.
  for (const std::string& s : cuda_graph_scope_names(p.cuda_graphs)) {
    if (c.cuda_graph_scopes.empty()) {
      r.check(false, "stack_cuda_graphs", "stack ", stack.name, " cannot run CUDA graphs of scope \"", s,
              "\" (it captures none)");
    } else {
      check(c.cuda_graph_scopes, s, "stack_cuda_graphs", "CUDA graphs of scope");
    }
  }
  return r.out;
}

Fp8Padding fp8_padding_named(const std::string& name) {
  for (Fp8Padding f :
       {Fp8Padding::kNone, Fp8Padding::kExperts, Fp8Padding::kDispatcher, Fp8Padding::kRouter}) {
    if (name == name_of(f)) return f;
  }
  return Fp8Padding::kStack;
}

Fp8Padding stack_fp8_padding(const StackProfile& stack) {
  if (stack.capabilities.fp8_padding.empty()) return Fp8Padding::kNone;
  const Fp8Padding own = fp8_padding_named(stack.capabilities.fp8_padding.front());
  return own == Fp8Padding::kStack ? Fp8Padding::kNone : own;
}

Fp8Padding fp8_padding_of(const Plan& plan, Fp8Padding stack_own) {
  if (plan.precision != Precision::kFp8) return Fp8Padding::kNone;
  return plan.experts.fp8_padding != Fp8Padding::kStack ? plan.experts.fp8_padding : stack_own;
}

Fp8Padding fp8_padding_of(const Plan& plan, const StackProfile& stack) {
  return fp8_padding_of(plan, stack_fp8_padding(stack));
}

int fp8_row_alignment(const Plan& plan) {
  return plan.fp8_recipe == Fp8Recipe::kMxfp8 ? 32 : 16;
}

double expected_alignment_pad(double mean, int align) {
  if (align <= 1 || mean <= 0) return 0.0;
  const auto a = static_cast<double>(align);
  // The count's residues mod a differ from uniform by at most exp(-mean (1 - cos(2 pi / a))), about
  // exp(-2 pi^2 mean / a^2) (the Poisson characteristic function at 2 pi / a): below 3e-9 once mean >= a^2,
  // where each residue pads its share of (a - 1) / 2.
  if (mean >= a * a) return (a - 1.0) / 2.0;
  // Otherwise summed over the counts within 12 standard deviations of the mode (and a further alignment
  // above it), the probabilities by recurrence from the mode's.
  const auto mode = static_cast<int64_t>(std::floor(mean));
  const auto pad = [align](int64_t c) { return static_cast<double>((align - c % align) % align); };
  const double reach = 12.0 * std::sqrt(mean) + 1.0;
  const double p_mode = std::exp(static_cast<double>(mode) * std::log(mean) - mean -
                                 std::lgamma(static_cast<double>(mode) + 1.0));
  double total = p_mode * pad(mode), mass = p_mode, prob = p_mode;
  for (int64_t c = mode + 1; static_cast<double>(c - mode) <= reach + a; ++c) {
    prob *= mean / static_cast<double>(c);
    total += prob * pad(c);
    mass += prob;
  }
  prob = p_mode;
  for (int64_t c = mode; c > 0 && static_cast<double>(mode - c) <= reach; --c) {
    prob *= static_cast<double>(c) / mean;
    total += prob * pad(c - 1);
    mass += prob;
  }
  return total / mass;
}

double alignment_pad_rows(double rows, double groups, int align) {
  return groups > 0 ? groups * expected_alignment_pad(rows / groups, align) : 0.0;
}

double capacity_padded_rows_factor(const Plan& plan, double tokens, int64_t top_k, int64_t experts) {
  const double a = tokens * static_cast<double>(top_k), e = static_cast<double>(experts);
  if (!plan.routing.pad_to_capacity || !plan.routing.capacity_factor || a <= 0 || e <= 0) return 1.0;
  return e * std::ceil(a / e * *plan.routing.capacity_factor) / a;
}

MlaDownProj stack_mla_down_proj(const StackProfile& stack) {
  if (stack.capabilities.mla_down_proj.empty()) return MlaDownProj::kGathered;
  const std::string& own = stack.capabilities.mla_down_proj.front();
  for (MlaDownProj m : {MlaDownProj::kDuplicated, MlaDownProj::kColumnParallel, MlaDownProj::kGathered}) {
    if (own == name_of(m)) return m;
  }
  return MlaDownProj::kGathered;
}

MlaDownProj mla_down_proj_of(const Plan& plan, MlaDownProj stack_own) {
  return plan.attention.mla_down_proj != MlaDownProj::kStack ? plan.attention.mla_down_proj : stack_own;
}

MlaDownProj mla_down_proj_of(const Plan& plan, const StackProfile& stack) {
  return mla_down_proj_of(plan, stack_mla_down_proj(stack));
}

Plan with_stack_overlaps(const Plan& plan, const StackProfile& stack, std::vector<std::string>* notices) {
  Plan p = plan;
  auto drop = [&](bool& flag, const Stated<bool>& has, const char* key) {
    if (!flag || has.value) return;
    flag = false;
    if (notices) {
      notices->push_back(std::string("overlap.") + key + " asked for, but stack " + stack.name +
                         " does not achieve it, so it gets no credit: " + has.source);
    }
  };
  drop(p.overlap.inter_op, stack.overlaps.inter_op, "inter_op");
  drop(p.overlap.intra_op, stack.overlaps.intra_op, "intra_op");
  drop(p.overlap.dp_comm, stack.overlaps.dp_comm, "dp_comm");
  drop(p.overlap.pp_comm, stack.overlaps.pp_comm, "pp_comm");
  if (p.overlap.pp_comm && p.pipeline.pp > 1 &&
      !stack_overlaps_pipeline_sends(stack, p.pipeline.pp, p.pipeline.vpp)) {
    p.overlap.pp_comm = false;
    if (notices) {
      notices->push_back("overlap.pp_comm asked for, but stack " + stack.name +
                         " overlaps pipeline sends only with a virtual pipeline (vpp > 1), so they run "
                         "blocking on the compute stream: " +
                         stack.overlaps.pp_comm_needs_vpp.source);
    }
  }
  drop(p.overlap.cross_micro_batch, stack.overlaps.cross_micro_batch, "cross_micro_batch");
  drop(p.overlap.tp_comm, stack.overlaps.tp_comm, "tp_comm");
  drop(p.overlap.shared_experts, stack.overlaps.shared_experts, "shared_experts");
  if (!p.overlap.cross_micro_batch) p.overlap.delay_wgrad = false;  // it lives inside the combined 1F1B
  return p;
}

bool stack_overlaps_pipeline_sends(const StackProfile& stack, int64_t pp, int64_t vpp) {
  return stack.overlaps.pp_comm.value && pp > 1 && (!stack.overlaps.pp_comm_needs_vpp.value || vpp > 1);
}

const char* name_of(Dispatch d) {
  switch (d) {
    case Dispatch::kAllToAll:
      return "all_to_all";
    case Dispatch::kAllGather:
      return "all_gather";
    case Dispatch::kDedup:
      return "dedup";
  }
  return "?";
}
const char* name_of(Schedule s) {
  switch (s) {
    case Schedule::k1F1B:
      return "1f1b";
    case Schedule::kInterleaved1F1B:
      return "interleaved_1f1b";
    case Schedule::kDualPipeV:
      return "dualpipev";
  }
  return "?";
}
const char* name_of(GradSync g) {
  switch (g) {
    case GradSync::kFp32ReduceScatter:
      return "fp32_reduce_scatter";
    case GradSync::kBf16AllToAll:
      return "bf16_all_to_all";
    case GradSync::kBf16ReduceScatter:
      return "bf16_reduce_scatter";
  }
  return "?";
}
const char* name_of(DispatchPrecision d) {
  return d == DispatchPrecision::kBf16 ? "bf16" : "fp8";
}
const char* name_of(Precision p) {
  return p == Precision::kBf16 ? "bf16" : "fp8";
}
const char* name_of(CrossEntropy c) {
  switch (c) {
    case CrossEntropy::kTe:
      return "te";
    case CrossEntropy::kNative:
      return "native";
    case CrossEntropy::kUnfused:
      return "unfused";
  }
  return "?";
}
const char* name_of(MlaDownProj m) {
  switch (m) {
    case MlaDownProj::kStack:
      return "stack";
    case MlaDownProj::kDuplicated:
      return "duplicated";
    case MlaDownProj::kColumnParallel:
      return "column_parallel";
    case MlaDownProj::kGathered:
      return "gathered";
  }
  return "?";
}
const char* name_of(Fp8Padding f) {
  switch (f) {
    case Fp8Padding::kStack:
      return "stack";
    case Fp8Padding::kNone:
      return "none";
    case Fp8Padding::kExperts:
      return "experts";
    case Fp8Padding::kDispatcher:
      return "dispatcher";
    case Fp8Padding::kRouter:
      return "router";
  }
  return "?";
}
const char* name_of(Recompute r) {
  switch (r) {
    case Recompute::kNone:
      return "none";
    case Recompute::kSelective:
      return "selective";
    case Recompute::kFull:
      return "full";
    case Recompute::kSar:
      return "sar";
  }
  return "?";
}
const char* name_of(RecomputeMethod m) {
  return m == RecomputeMethod::kUniform ? "uniform" : "block";
}
const char* name_of(Fp8Recipe r) {
  switch (r) {
    case Fp8Recipe::kDelayed:
      return "delayed";
    case Fp8Recipe::kTensorwise:
      return "tensorwise";
    case Fp8Recipe::kBlockwise:
      return "blockwise";
    case Fp8Recipe::kMxfp8:
      return "mxfp8";
  }
  return "?";
}
const char* name_of(RecomputeModule m) {
  switch (m) {
    case kRecomputeCoreAttn:
      return "core_attn";
    case kRecomputeMoeAct:
      return "moe_act";
    case kRecomputeLayernorm:
      return "layernorm";
    case kRecomputeMlaUpProj:
      return "mla_up_proj";
    case kRecomputeMlp:
      return "mlp";
    case kRecomputeMoe:
      return "moe";
    case kRecomputeSharedExperts:
      return "shared_experts";
  }
  return "?";
}
const char* name_of(CudaGraphScope s) {
  switch (s) {
    case kGraphLayer:
      return "layer";
    case kGraphAttn:
      return "attn";
    case kGraphMlp:
      return "mlp";
    case kGraphMoe:
      return "moe";
    case kGraphMoeRouter:
      return "moe_router";
    case kGraphMoePreprocess:
      return "moe_preprocess";
    case kGraphMamba:
      return "mamba";
  }
  return "?";
}
std::vector<std::string> cuda_graph_scope_names(uint8_t scopes) {
  std::vector<std::string> out;
  for (unsigned bit = 1; bit & kAllCudaGraphScopes; bit <<= 1) {
    if (scopes & bit) out.emplace_back(name_of(static_cast<CudaGraphScope>(bit)));
  }
  return out;
}
std::vector<std::string> recompute_module_names(uint16_t modules) {
  std::vector<std::string> out;
  for (uint16_t bit = 1; bit & kAllRecomputeModules; bit = static_cast<uint16_t>(bit << 1)) {
    if (modules & bit) out.emplace_back(name_of(static_cast<RecomputeModule>(bit)));
  }
  return out;
}

}  // namespace moeplan
