// The labelled approximation lines of model_notes.h, one per layer kind the cost model does not price with a
// calibrated kernel and one per part of the checkpoint the counts leave out.
#include "simulator/core/model_notes.h"

#include <sstream>

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
        "Gated DeltaNet layers: in/out projections priced as GEMMs (measured tables); the chunked delta-rule "
        "scan priced as memory-bound over its q/k/v/gate inputs, output and per-chunk ",
        g.value_heads, "x", g.key_head_dim, "x", g.value_head_dim,
        " fp32 states (assumed: no calibrated kernel), its FLOPs (chunk ", g.chunk,
        ", derived) counted for MFU; context parallelism is refused for these layers");
  }
  if (m.has_mixer(MixerKind::kMamba2)) {
    const auto& s = m.mamba;
    line(
        "Mamba-2 layers: in/out projections priced as GEMMs (measured tables); the SSD scan priced as "
        "memory-bound over its x/B/C/dt inputs, output and per-chunk ",
        s.heads, "x", s.state_size, "x", s.head_dim,
        " fp32 states (assumed: no calibrated kernel), its FLOPs (chunk ", s.chunk,
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
  if (!m.checkpoint_quantization.empty()) {
    line(
        "checkpoint quantization (quantization_config): ", m.checkpoint_quantization,
        "; training is planned in the plan's precision from the config's shapes, not from the stored format");
  }
  if (!m.not_counted.empty()) line("not counted or simulated: ", m.not_counted);
  return out;
}

}  // namespace moeplan
