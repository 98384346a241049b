// The labelled approximation lines of model_notes.h, one per layer kind the cost model does not price with a
// calibrated kernel and one per part of the checkpoint the counts leave out.
#include "simulator/core/model_notes.h"

#include <sstream>

#include "simulator/core/model_stats.h"

namespace moeplan {

std::vector<std::string> model_notes(const ModelSpec& m) {
  std::vector<std::string> out;
  auto line = [&](auto&&... parts) {
    std::ostringstream s;
    (s << ... << parts);
    out.push_back(s.str());
  };
  if (m.has_mixer(MixerKind::kLinearAttention)) {
    const auto& g = m.linear_attention;
    line(
        "Gated DeltaNet layers: in/out projections priced as GEMMs (measured tables); on the Megatron-Core "
        "stacks the chunked delta-rule scan as FLA's kernels run it, their bytes (derived from FLA's source) "
        "or their chain over the chunks (recurrent_scan.chunk_us, derived from FLA's H100 times), whichever "
        "is longer, with Megatron's layout copies, l2norm and gate kernels around it; on other stacks "
        "memory-bound over its q/k/v/gate inputs, output and per-chunk ",
        g.value_heads, "x", g.key_head_dim, "x", g.value_head_dim,
        " fp32 states (assumed: no calibrated kernel); its FLOPs (chunk ", g.chunk,
        ", derived) counted for MFU; context parallelism is refused for these layers");
  }
  if (m.has_mixer(MixerKind::kMamba2)) {
    const auto& s = m.mamba;
    line(
        "Mamba-2 layers: in/out projections priced as GEMMs (measured tables); on the Megatron-Core stacks "
        "the SSD scan and conv as mamba_ssm's and causal_conv1d's kernels run them, memory-bound over the "
        "bytes each kernel moves (derived from their source; the rate assumed: no measured kernel); on other "
        "stacks memory-bound over its x/B/C/dt inputs, output and per-chunk ",
        s.heads, "x", s.state_size, "x", s.head_dim,
        " fp32 states (assumed: no calibrated kernel); its FLOPs (chunk ", s.chunk,
        ", derived) counted for MFU; context parallelism is refused for these layers");
  }
  if (m.attention.indexer.heads > 0) {
    const auto& x = m.attention.indexer;
    line("DSA sparse attention: the core attends the indexer's top ", x.top_k,
         " keys per query, priced as a ", x.top_k,
         "-token window (the same key count, derived); the lightning "
         "indexer's projections and its ",
         x.heads, "-head x ", x.head_dim,
         " QK scores over every causal key priced as bf16 GEMMs (derived), "
         "its top-k selection as memory-bound (assumed); the gather of its keys across sequence shards is "
         "not priced");
  }
  if (m.encoder_decoder()) {
    line(
        "encoder-decoder: a sequence is the encoder's input (tokens/s and MFU count those tokens); the "
        "decoder "
        "runs on T5 span-corruption targets (15 % noise in spans of 3: 114 for 512 inputs), padded to a "
        "multiple of ",
        kDecoderSeqMultiple,
        " (assumed: the config does not state the objective); cross-attention reads the encoder output "
        "gathered over tp; plans keep pp = sp = cp = 1 (the pipeline split between the stacks and sequence "
        "splits of cross-attention are not modelled)");
  }
  if (m.position == PositionKind::kRelativeBias) {
    line(
        "T5 relative position bias: expanded to [heads, s, s] in each stack's first layer (memory-bound, "
        "derived); its read inside every attention kernel is not priced (no measurement of biased fused "
        "attention)");
  }
  if (m.family == "switch_transformers") {
    line("expert_capacity is not read: plans route dropless, as Megatron-Core's default does");
  }
  if (!m.checkpoint_quantization.empty()) {
    line(
        "checkpoint quantization (quantization_config): ", m.checkpoint_quantization,
        "; training is planned in the plan's precision from the config's shapes, not from the stored format");
  }
  if (!m.not_counted.empty()) line("not counted or simulated: ", m.not_counted);
  return out;
}

}  // namespace moeplan
