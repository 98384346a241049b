// The fused attention kernel calls that do an attention op's work, for executors that run the op graph
// (moerun's replays on CPUs and GPUs). The lowering states each attention op's shape (op_graph.h); this says
// which kernels at which shapes carry out exactly the work its FLOPs count. Pure functions, no I/O.
#pragma once

#include <cstdint>
#include <vector>

#include "simulator/core/op_graph.h"

namespace moeplan {

// An attention op's backward FLOPs over its forward's: flash-attention's backward recomputes the scores.
inline constexpr double kAttentionBackwardFlops = 2.5;

// One fused attention call: `seq_q` queries of each of `batch` sequences against `seq_kv` keys, `heads`
// query heads sharing `kv_heads` K/V heads, scores over `qk_dim`, values of `v_dim`. Causal calls align the
// diagonal bottom-right: query i (0-based) sees key j iff j <= i + seq_kv - seq_q, and with a window w only
// the w nearest of those (i + seq_kv - seq_q - j < w). Non-causal calls see every key.
struct AttentionCall {
  int64_t batch = 0, seq_q = 0, seq_kv = 0, heads = 0, kv_heads = 0, qk_dim = 0, v_dim = 0;
  int64_t window = 0;  // 0: no window
  bool causal = true;

  // Query-key pairs the mask lets through, per sequence and head.
  double visible_pairs() const;
  // Forward FLOPs: two matrix products over the visible pairs (scores over qk_dim, values over v_dim).
  double forward_flops() const;
};

// The calls that run `op` (an OpKind::kAttention op) as its lowering states it:
// - without context parallelism: one call at the op's shape (window and causality included);
// - under context parallelism (causal, seq_q < seq_kv: the rank's queries are 2 of the sequence's 2 cp
//   chunks, chunk r and chunk 2 cp - 1 - r, load-balanced as Megatron and Transformer Engine split them):
//   - the local part (OpName::kAttnCoreLocal, the rank's queries against its own keys) is one causal call
//     of seq_q queries over seq_q keys. Chunk r sees its own chunk causally, chunk 2 cp - 1 - r sees chunk r
//     whole and itself causally: 2 c^2 + c pairs for chunks of c tokens, as a causal square of 2 c;
//   - the rest (the queries against the other ranks' keys) is, without a window, cp - 1 non-causal calls of
//     seq_q queries over c keys: chunk r sees r chunks before it whole, chunk 2 cp - 1 - r sees 2 cp - 2 - r
//     besides chunk r, 2 (cp - 1) c^2 pairs in all. Transformer Engine's ring (AttnFuncWithCPAndKVP2P) runs
//     them so, one unmasked block of 2 c x c (or c x 2 c) pairs per step from another rank. With a window,
//     one non-causal call over the keys that make its FLOPs the op's.
// Empty when the op states no shape. K/V heads: the op's (0: one per query head), or the largest count that
// divides both it and the query heads.
std::vector<AttentionCall> attention_calls(const Op& op);

}  // namespace moeplan
