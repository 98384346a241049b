// `moeplan inspect`: what a model costs before any plan (parameters, FLOPs, bytes per parameter), or what a
// hardware profile says about the machine.
#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "planner/cli/cli_common.h"
#include "simulator/core/model_notes.h"
#include "simulator/core/model_stats.h"
#include "simulator/io/hardware_loader.h"
#include "simulator/io/model_loader.h"

namespace moeplan::cli {
namespace {

constexpr const char* kFlopFormula =
    "FLOPs per token count multiply-add as 2. GEMMs: 2 x (weights the token multiplies: attention "
    "projections, "
    "top-k routed experts, shared experts, router, LM head). Attention: 2 x heads x (qk_dim + v_dim) x L, L "
    "= mean "
    "keys attended (causal: (S+1)/2; sliding window W: (W(W+1)/2 + (S-W)W)/S). Training step = 3 x forward "
    "(dgrad + wgrad); recompute, norms, activations and softmax are not counted.";

nlohmann::json breakdown_json(const ParamBreakdown& b) {
  return {{"embedding", b.embedding},
          {"output", b.output},
          {"attention", b.attention},
          {"dense_ffn", b.dense_ffn},
          {"routed_experts", b.routed_experts},
          {"shared_experts", b.shared_experts},
          {"router", b.router},
          {"norms", b.norms},
          {"total", b.total()}};
}

nlohmann::json flops_json(const FlopBreakdown& f) {
  return {{"attention_proj", f.attention_proj},
          {"attention_core", f.attention_core},
          {"dense_ffn", f.dense_ffn},
          {"routed_experts", f.routed_experts},
          {"shared_experts", f.shared_experts},
          {"router", f.router},
          {"lm_head", f.lm_head},
          {"total", f.total()}};
}

// Whether some layer is not attention + FFN (Qwen3-Next, Nemotron-H).
bool hybrid(const ModelSpec& m) {
  return std::any_of(m.layers.begin(), m.layers.end(),
                     [](const LayerSpec& l) { return l.mixer != MixerKind::kAttention || !l.ffn; });
}

// Layers by (mixer, FFN) kind, for hybrid models: {"attention + MoE": 12, "Mamba-2": 23, ...}.
nlohmann::json layer_kinds(const ModelSpec& m) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& l : m.layers) {
    std::string mixer;
    switch (l.mixer) {
      case MixerKind::kAttention:
        mixer = "attention";
        break;
      case MixerKind::kLinearAttention:
        mixer = "Gated DeltaNet";
        break;
      case MixerKind::kMamba2:
        mixer = "Mamba-2";
        break;
      case MixerKind::kNone:
        break;
    }
    const std::string ffn = !l.ffn ? "" : (l.moe ? "MoE" : "dense FFN");
    const std::string key = mixer.empty() ? ffn : (ffn.empty() ? mixer : mixer + " + " + ffn);
    out[key] = out.value(key, int64_t{0}) + 1;
  }
  return out;
}

// Encoder and decoder layers of an encoder-decoder.
std::pair<int64_t, int64_t> stack_layers(const ModelSpec& m) {
  const auto enc = std::count_if(m.layers.begin(), m.layers.end(),
                                 [](const LayerSpec& l) { return l.role == LayerRole::kEncoder; });
  return {enc, m.num_layers() - enc};
}

const char* attention_name(const ModelSpec& m) {
  return m.attention.kind == AttentionKind::kMla
             ? "MLA"
             : (m.attention.num_kv_heads == m.attention.num_heads ? "MHA" : "GQA");
}

int inspect_model(const std::string& ref, int64_t seq_len, bool as_json) {
  Result<ModelSpec> loaded = io::load_model(ref);
  if (!loaded) return bad_input(loaded.error().message);
  const ModelSpec& m = loaded.value();
  const ParamCounts p = count_params(m);
  const FlopsPerToken f = flops_per_token(m, seq_len);
  const double active_no_input_emb = p.active.total() - p.active.embedding;

  if (as_json) {
    nlohmann::json bpp;
    for (DType t : {DType::kBf16, DType::kFp8, DType::kFp32}) {
      const TrainingBytesPerParam b = bytes_per_param(t);
      bpp[std::string(name_of(t))] = {{"weights", b.weights},
                                      {"gradients", b.gradients},
                                      {"optimizer", b.optimizer},
                                      {"total", b.total()},
                                      {"model_bytes", b.total() * p.total.total()}};
    }
    nlohmann::json j = {
        {"model", m.name},
        {"family", m.family},
        {"layers", m.num_layers()},
        {"moe_layers", m.num_moe_layers()},
        {"hidden", m.hidden},
        {"attention", attention_name(m)},
        {"heads", m.attention.num_heads},
        {"kv_heads", m.attention.num_kv_heads},
        {"experts", m.moe.num_experts},
        {"top_k", m.moe.top_k},
        {"shared_experts", m.moe.num_shared_experts},
        {"vocab", m.vocab},
        {"params_total", p.total.total()},
        {"params_active", p.active.total()},
        {"params_active_excluding_input_embedding", active_no_input_emb},
        {"params_mtp", p.mtp},
        {"params_total_with_mtp", p.total.total() + p.mtp},
        {"params", {{"total", breakdown_json(p.total)}, {"active", breakdown_json(p.active)}}},
        {"seq_len", seq_len},
        {"flops_per_token_forward", f.forward.total()},
        {"flops_per_token_train", f.train_step},
        {"flops_forward_breakdown", flops_json(f.forward)},
        {"flops_per_token_mtp_forward", f.mtp_forward},
        {"bytes_per_param", bpp},
        {"flop_formula", kFlopFormula},
    };
    // Only for models that have them, so the reports of plain models stay as they were.
    if (!m.checkpoint_quantization.empty()) j["checkpoint_quantization"] = m.checkpoint_quantization;
    if (!m.source.empty()) j["source"] = m.source;
    if (m.rope_theta > 0) j["rope_theta"] = m.rope_theta;
    if (m.norm_eps > 0) j["norm_eps"] = m.norm_eps;
    if (!m.rope_scaling.empty()) j["rope_scaling"] = m.rope_scaling;
    if (hybrid(m)) j["layer_kinds"] = layer_kinds(m);
    if (m.encoder_decoder()) {
      const auto [enc, dec] = stack_layers(m);
      j["encoder_layers"] = enc;
      j["decoder_layers"] = dec;
      j["decoder_seq_len"] = decoder_seq_len(seq_len);
      j["relative_position_buckets"] = m.relative_buckets;
    }
    if (const auto notes = model_notes(m); !notes.empty()) j["notes"] = notes;
    print_json(j);
    return kExitOk;
  }

  const auto [enc, dec] = stack_layers(m);
  const std::string stacks =
      m.encoder_decoder() ? fmt::format("{} encoder + {} decoder, ", enc, dec) : std::string();
  fmt::print("{} ({}): {} layers ({}{} MoE), hidden {}, {} attention with {} heads ({} KV), vocab {}{}\n",
             m.name, m.family, m.num_layers(), stacks, m.num_moe_layers(), m.hidden, attention_name(m),
             m.attention.num_heads, m.attention.num_kv_heads, m.vocab,
             m.tied_embeddings ? ", tied embeddings" : "");
  if (m.is_moe()) {
    fmt::print("experts: {} routed, top-{}, expert FFN {}; {} shared (FFN {})\n", m.moe.num_experts,
               m.moe.top_k, m.moe.expert_ffn, m.moe.num_shared_experts, m.moe.shared_expert_ffn);
  }
  if (!m.source.empty()) fmt::print("source: {}\n", m.source);
  if (hybrid(m)) {
    const nlohmann::json by_kind = layer_kinds(m);
    std::string kinds;
    for (auto it = by_kind.begin(); it != by_kind.end(); ++it)
      kinds += fmt::format("{}{} {}", kinds.empty() ? "" : ", ", it.value().get<int64_t>(), it.key());
    fmt::print("layers by kind: {}\n", kinds);
  }
  if (m.position == PositionKind::kRelativeBias) {
    fmt::print("relative position bias ({} buckets), norm epsilon {:g}\n", m.relative_buckets, m.norm_eps);
  } else if (m.rope_theta > 0 || m.norm_eps > 0) {
    fmt::print("rotary base {}, norm epsilon {}{}\n",
               m.rope_theta > 0 ? fmt::format("{:g}", m.rope_theta) : "not stated",
               m.norm_eps > 0 ? fmt::format("{:g}", m.norm_eps) : "not stated",
               m.rope_scaling.empty() ? "" : ", rope_scaling " + m.rope_scaling);
  }
  for (const auto& n : model_notes(m)) fmt::print("note: {}\n", n);
  fmt::print("\n{:<22}{:>14}{:>14}\n", "parameters", "total", "active");
  const auto row = [](const char* name, double t, double a) {
    fmt::print("  {:<20}{:>14}{:>14}\n", name, human_count(t), human_count(a));
  };
  row("embedding", p.total.embedding, p.active.embedding);
  row("output", p.total.output, p.active.output);
  row("attention", p.total.attention, p.active.attention);
  row("dense FFN", p.total.dense_ffn, p.active.dense_ffn);
  row("routed experts", p.total.routed_experts, p.active.routed_experts);
  row("shared experts", p.total.shared_experts, p.active.shared_experts);
  row("router", p.total.router, p.active.router);
  row("norms", p.total.norms, p.active.norms);
  row("total", p.total.total(), p.active.total());
  fmt::print("  active without the input embedding: {}\n", human_count(active_no_input_emb));
  if (p.mtp > 0) {
    fmt::print("  MTP modules (not in the totals): {}; total with MTP {}\n", human_count(p.mtp),
               human_count(p.total.total() + p.mtp));
  }
  const std::string at = m.encoder_decoder()
                             ? fmt::format("input token at encoder length {} ({} decoder targets)", seq_len,
                                           decoder_seq_len(seq_len))
                             : fmt::format("token at seq {} (causal)", seq_len);
  fmt::print("\nFLOPs per {}: forward {:.2f} GFLOP, training step {:.2f} GFLOP\n", at,
             f.forward.total() / 1e9, f.train_step / 1e9);
  fmt::print(
      "  attention projections {:.2f}, attention core {:.2f}, dense FFN {:.2f}, routed experts {:.2f},\n"
      "  shared experts {:.2f}, router {:.3f}, LM head {:.2f} (GFLOP, forward)\n",
      f.forward.attention_proj / 1e9, f.forward.attention_core / 1e9, f.forward.dense_ffn / 1e9,
      f.forward.routed_experts / 1e9, f.forward.shared_experts / 1e9, f.forward.router / 1e9,
      f.forward.lm_head / 1e9);
  fmt::print("\ntraining bytes per parameter (mixed-precision Adam, before ZeRO sharding):\n");
  for (DType t : {DType::kBf16, DType::kFp8, DType::kFp32}) {
    const TrainingBytesPerParam b = bytes_per_param(t);
    fmt::print("  {:<5} weights {:g} + gradients {:g} + optimizer {:g} = {:g} B/param -> {} for the model\n",
               name_of(t), b.weights, b.gradients, b.optimizer, b.total(),
               human_bytes(b.total() * p.total.total()));
  }
  return kExitOk;
}

int inspect_hardware(const std::string& ref, bool as_json) {
  Result<HardwareProfile> loaded = io::load_hardware(ref);
  if (!loaded) return bad_input(loaded.error().message);
  const HardwareProfile& h = loaded.value();
  const auto& g = h.gpu;
  const auto& c = h.calibration;
  if (as_json) {
    nlohmann::json peaks, sustained = nlohmann::json::object();
    for (const auto& [dtype, v] : g.peak_flops_per_s) peaks[dtype] = v.value;
    for (const auto& [dtype, v] : g.sustained_rate) {
      sustained[dtype] = {{"value", v.value}, {"basis", name_of(v.basis)}};
      if (v.range) sustained[dtype]["range"] = {v.range->first, v.range->second};
    }
    print_json({{"name", h.name},
                {"gpu", g.model},
                {"peak_flops_per_s", peaks},
                {"sustained_rate", sustained},
                {"hbm_capacity_bytes", g.hbm_capacity_bytes.value},
                {"hbm_bw_achieved_bytes_per_s", g.hbm_bw_achieved_bytes_per_s.value},
                {"gpus_per_node", h.node.gpus_per_node.value},
                {"nvlink_bw_achieved_bytes_per_s", h.node.nvlink_bw_achieved_bytes_per_s.value},
                {"nics_per_node", h.scale_out.nics_per_node.value},
                {"nic_bw_achieved_bytes_per_s", h.scale_out.nic_bw_achieved_bytes_per_s.value},
                {"calibration_tables",
                 {{"collectives", c.collectives.size()},
                  {"gemm", c.gemm.size()},
                  {"grouped_gemm", c.grouped_gemm.size()},
                  {"attention", c.attention.size()},
                  {"hbm", c.hbm.size()}}}});
    return kExitOk;
  }
  fmt::print("{}: {}\n", h.name, h.description);
  fmt::print("GPU {}: {} SMs, BF16 {:.0f} TFLOP/s", g.model, g.sm_count.value,
             g.peak_flops_per_s.at("bf16").value / 1e12);
  if (g.peak_flops_per_s.contains("fp8"))
    fmt::print(", FP8 {:.0f} TFLOP/s", g.peak_flops_per_s.at("fp8").value / 1e12);
  fmt::print(", HBM {} at {:.0f} GB/s achieved ({:.0f} peak)\n", human_bytes(g.hbm_capacity_bytes.value),
             g.hbm_bw_achieved_bytes_per_s.value / 1e9, g.hbm_bw_peak_bytes_per_s.value / 1e9);
  // The tables time bursts; a training step runs its tensor cores at the sustained share of those rates.
  for (const auto& [dtype, v] : g.sustained_rate) {
    fmt::print("sustained {} tensor-core rate: {:.3g} of the tables' ({}", dtype, v.value, name_of(v.basis));
    if (v.range) fmt::print(", range {:.3g}-{:.3g}", v.range->first, v.range->second);
    fmt::print(")\n");
  }
  fmt::print("node: {} GPUs, NVLink {:.0f} GB/s per direction ({:.0f} achieved){}\n",
             h.node.gpus_per_node.value, h.node.nvlink_bw_uni_bytes_per_s.value / 1e9,
             h.node.nvlink_bw_achieved_bytes_per_s.value / 1e9, h.node.nvls.value ? ", NVLS" : "");
  fmt::print("scale-out: {} NICs per node at {:.0f} GB/s ({:.0f} achieved)\n",
             h.scale_out.nics_per_node.value, h.scale_out.nic_bw_bytes_per_s.value / 1e9,
             h.scale_out.nic_bw_achieved_bytes_per_s.value / 1e9);
  fmt::print("calibration tables: {} collective curves, {} GEMM, {} grouped GEMM, {} attention, {} HBM\n",
             c.collectives.size(), c.gemm.size(), c.grouped_gemm.size(), c.attention.size(), c.hbm.size());
  return kExitOk;
}

}  // namespace

Runner add_inspect(CLI::App& app) {
  struct Options {
    std::string model;
    std::string hardware;
    int64_t seq_len = 4096;
    bool json = false;
  };
  auto o = std::make_shared<Options>();
  app.add_option("--model,-m", o->model,
                 fmt::format("Model: a config.json path or a built-in name (default {})", kDefaultModel));
  app.add_option("--hardware", o->hardware, "Inspect a hardware profile instead: a path or a built-in name");
  app.add_option("--seq-len,-s", o->seq_len, "Sequence length for attention FLOPs, tokens")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  app.add_flag("--json", o->json, "Print one JSON object");
  app.footer(kFlopFormula);
  return [o]() {
    if (!o->hardware.empty()) {
      if (!o->model.empty()) return bad_input("inspect takes --model or --hardware, not both");
      return inspect_hardware(o->hardware, o->json);
    }
    return inspect_model(o->model.empty() ? kDefaultModel : o->model, o->seq_len, o->json);
  };
}

}  // namespace moeplan::cli
