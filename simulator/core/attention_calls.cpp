#include "simulator/core/attention_calls.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace moeplan {
namespace {

double d(int64_t x) {
  return static_cast<double>(x);
}

}  // namespace

double AttentionCall::visible_pairs() const {
  if (seq_q <= 0 || seq_kv <= 0) return 0;
  if (!causal) return d(seq_q) * d(seq_kv);
  // Query i sees min(i + seq_kv - seq_q + 1, w) keys, w the window (or all keys): over the queries that see
  // any, the counts run lo, lo + 1, ..., seq_kv, each capped at w.
  const int64_t w = window > 0 ? std::min(window, seq_kv) : seq_kv;
  const int64_t lo = std::max<int64_t>(1, seq_kv - seq_q + 1), hi = seq_kv;
  const int64_t top = std::min(hi, w);  // the last uncapped count
  const double uncapped = top >= lo ? (d(lo) + d(top)) * d(top - lo + 1) / 2.0 : 0.0;
  return uncapped + d(hi - std::max(top, lo - 1)) * d(w);
}

double AttentionCall::forward_flops() const {
  return 2.0 * d(batch) * d(heads) * d(qk_dim + v_dim) * visible_pairs();
}

std::vector<AttentionCall> attention_calls(const Op& op) {
  const AttentionShape& a = op.attn;
  if (op.kind != OpKind::kAttention || a.batch <= 0 || a.seq_q <= 0 || a.seq_kv <= 0 || a.heads <= 0 ||
      a.qk_dim <= 0) {
    return {};
  }
  AttentionCall c;
  c.batch = a.batch;
  c.seq_q = a.seq_q;
  c.seq_kv = a.seq_kv;
  c.heads = a.heads;
  c.kv_heads = a.kv_heads > 0 ? a.kv_heads : a.heads;
  // Each K/V head serves a whole group of query heads; a count that does not divide them runs as the
  // largest one that does and divides it.
  if (c.heads % c.kv_heads != 0) c.kv_heads = std::gcd(c.heads, c.kv_heads);
  c.qk_dim = a.qk_dim;
  c.v_dim = a.v_dim > 0 ? a.v_dim : a.qk_dim;
  c.window = a.window;
  c.causal = a.causal;
  if (!a.causal || a.seq_q >= a.seq_kv) return {c};

  // Context parallelism: the rank's own keys, or the other ranks'.
  if (static_cast<OpName>(op.name) == OpName::kAttnCoreLocal) {
    c.seq_kv = c.seq_q;
    return {c};
  }
  const double forward = op.phase == Phase::kBackward ? op.flops / kAttentionBackwardFlops : op.flops;
  const double per_key = 2.0 * d(c.batch) * d(c.heads) * d(c.qk_dim + c.v_dim) * d(c.seq_q);
  const int64_t keys = std::llround(forward / per_key);
  c.causal = false;
  if (keys <= 0) return {};
  // Without a window: one full block of a chunk's keys per other rank, Transformer Engine's ring step.
  const int64_t cp = a.seq_kv / a.seq_q, chunk = a.seq_q / 2;
  if (c.window == 0 && cp >= 2 && a.seq_kv == cp * a.seq_q && a.seq_q % 2 == 0 && keys == (cp - 1) * chunk) {
    c.seq_kv = chunk;
    return std::vector<AttentionCall>(static_cast<size_t>(cp - 1), c);
  }
  c.window = 0;
  c.seq_kv = keys;
  return {c};
}

}  // namespace moeplan
