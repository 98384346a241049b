// Parameter counts and FLOPs per token of a ModelSpec: what `moeplan inspect` prints and what MFU divides by.
#pragma once

#include <cstdint>
#include <vector>

#include "simulator/core/model_spec.h"
#include "simulator/core/units.h"

namespace moeplan {

// Parameters by component. "Active" counts what one token touches: routed experts scaled by top_k /
// num_experts.
struct ParamBreakdown {
  double embedding = 0;       // input token embedding [vocab, h]
  double output = 0;          // output projection [h, vocab] (+ bias); 0 when tied to the embedding
  double attention = 0;       // q/k/v/o projections, MLA low-rank projections and their norms, biases, sinks
  double dense_ffn = 0;       // FFN of the non-MoE layers
  double routed_experts = 0;  // all routed experts (total) or the top_k a token uses (active)
  double shared_experts = 0;  // shared experts and their gates
  double router = 0;          // router projection, its bias and score-correction bias
  double norms = 0;           // pre-attention, pre-FFN and final norms
  double total() const {
    return embedding + output + attention + dense_ffn + routed_experts + shared_experts + router + norms;
  }
};

struct ParamCounts {
  ParamBreakdown total;
  ParamBreakdown active;
  double mtp = 0;  // multi-token-prediction modules, not included in total or active (as DeepSeek counts)
};

ParamCounts count_params(const ModelSpec& m);

// Parameters of one decoder layer by component (routed_experts: all of them); embedding and output are 0.
ParamBreakdown layer_params(const ModelSpec& m, const LayerSpec& layer);
// MLA's down projections of one layer ([h, q_lora_rank], [h, kv_lora_rank + qk_rope_head_dim]); 0 without
// MLA.
double mla_down_params(const ModelSpec& m);

// The model's distinct kinds of layer (LayerSpec::same_kind) and how many of each the first l layers hold, so
// that the layers of any range are counted by kind without walking them.
class LayerKindCounts {
 public:
  explicit LayerKindCounts(const ModelSpec& m);
  const std::vector<LayerSpec>& kinds() const { return kinds_; }
  int64_t first_of(size_t k) const { return first_[k]; }  // the first layer of kind k
  size_t kind_of(int64_t layer) const;                    // the kind of a layer
  // Layers of kind k among layers [first, last).
  int64_t in(size_t k, int64_t first, int64_t last) const {
    return before_[k][static_cast<size_t>(last)] - before_[k][static_cast<size_t>(first)];
  }

 private:
  std::vector<LayerSpec> kinds_;
  std::vector<int64_t> first_;
  std::vector<std::vector<int64_t>> before_;  // before_[k][l]: layers of kind k among the first l
};

// FLOPs per token by kind, counting multiply and add as 2 FLOPs.
//   GEMMs:     2 * (weights the token multiplies: q/k/v/o or MLA projections, active experts, router, LM
//   head) attention: 2 * heads * (qk_dim + v_dim) * L, with L the mean number of keys a query attends to
//              (causal: (S+1)/2; with a sliding window W < S: (W(W+1)/2 + (S-W)W) / S)
//   training step = 3 * forward (dgrad and wgrad each cost one forward); recompute is not counted,
//   norms, activations and softmax are not counted (they are memory-bound and negligible in FLOPs).
struct FlopBreakdown {
  double attention_proj = 0;  // q/k/v/o (or MLA) projection GEMMs
  double attention_core = 0;  // QK^T and PV (and the DSA indexer's scores, the recurrent mixers' scans)
  double dense_ffn = 0;
  double routed_experts = 0;
  double shared_experts = 0;
  double router = 0;
  double lm_head = 0;
  double total() const {
    return attention_proj + attention_core + dense_ffn + routed_experts + shared_experts + router + lm_head;
  }
};

struct FlopsPerToken {
  FlopBreakdown forward;
  double train_step = 0;   // 3 * forward.total()
  double mtp_forward = 0;  // MTP modules' forward FLOPs, not included above
};

inline constexpr double kTrainFlopsPerForwardFlop = 3.0;

// Per token of the encoder's input for an encoder-decoder (its decoder layers and head scaled by
// decoder_seq_len(seq_len) / seq_len).
FlopsPerToken flops_per_token(const ModelSpec& m, int64_t seq_len);

// Encoder-decoder pretraining is T5's span corruption: 15 % of the tokens are noise, in spans of 3 on
// average, each span replaced by one sentinel in the input and spelled out in the target (T5's default
// objective, which the Switch Transformer pre-trains on). Assumed for every encoder-decoder: configs do not
// state it.
inline constexpr double kSpanNoiseDensity = 0.15;
inline constexpr double kSpanMeanLength = 3.0;
// Targets are padded to a multiple of this: Megatron-LM's T5 example runs --encoder-seq-length 512 with
// --decoder-seq-length 128 (examples/t5/train_t5_220m_distributed.sh) for T5's 114 targets.
inline constexpr int64_t kDecoderSeqMultiple = 64;

// T5's target length for an input of `encoder_seq_len` tokens under span corruption (its
// random_spans_helper: 114 for 512).
int64_t t5_target_len(int64_t encoder_seq_len);

// The decoder's length for an encoder of `encoder_seq_len` tokens: t5_target_len rounded up to
// kDecoderSeqMultiple (128 for 512).
int64_t decoder_seq_len(int64_t encoder_seq_len);

// The tokens per sequence a layer runs on: decoder_seq_len for an encoder-decoder's decoder layers, else
// seq_len.
int64_t layer_seq_len(const LayerSpec& layer, int64_t seq_len);

// Mean number of keys a query attends to under causal masking with an optional sliding window (0 = none).
double mean_attended_keys(int64_t seq_len, int64_t window);

// FLOPs per token of a layer's token mixer beyond its projections (FlopBreakdown::attention_core):
//   softmax attention: 2 * heads * (qk_dim + v_dim) * L (L as above; DSA: L of a top_k-token window, plus the
//                      indexer's 2 * index_heads * index_head_dim * L over all causal keys)
//   Gated DeltaNet, Mamba-2: value_heads (heads) x chunked_scan_flops(key dim (state), value dim (head),
//   chunk)
double mixer_core_flops(const ModelSpec& m, const LayerSpec& layer, int64_t seq_len);

// FLOPs per token and head of a chunked linear recurrence (chunked delta rule, Mamba-2 SSD) with key (state)
// dim dk, value dim dv and chunks of C tokens (derived, not measured): within the chunk, causal scores and
// their use as attention over (C+1)/2 keys, 2 (dk + dv) (C+1)/2; across chunks, reading the [dk, dv] state
// and adding the token's update to it, 4 dk dv. The delta rule's in-chunk triangular solve is left out.
double chunked_scan_flops(int64_t dk, int64_t dv, int64_t chunk);

// Bytes per parameter kept on GPUs during mixed-precision Adam training, before any ZeRO sharding.
struct TrainingBytesPerParam {
  double weights = 0;    // the copy the GEMMs read (bf16; plus an fp8 cache under fp8)
  double gradients = 0;  // fp32 main gradients (Megatron accumulates bf16 training grads in fp32)
  double optimizer = 0;  // fp32 master weights + Adam m + v (master omitted for fp32 training)
  double total() const { return weights + gradients + optimizer; }
};

TrainingBytesPerParam bytes_per_param(DType compute);

// HBM bytes the Adam step moves per parameter of a rank's shard: read the fp32 gradient (4), read and write
// the fp32 master weight (8), m (8) and v (8), write the bf16 weight (2). The lowering's optimizer op uses it
// (the search's screen prices that op), and moerun's replay recovers the shard's parameter count from it.
inline constexpr double kAdamStepBytesPerParam = 30.0;

}  // namespace moeplan
