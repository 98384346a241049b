// Lays out a stage's saved activations in stashes per micro-batch in flight (see activation_layout.h).
#include "executor/runtime/activation_layout.h"

#include <algorithm>
#include <set>
#include <tuple>

namespace moeplan::executor {

namespace {

constexpr int64_t kAlign = 256;

int64_t aligned(int64_t bytes) {
  return (bytes + kAlign - 1) / kAlign * kAlign;
}

bool is_gemm(const Op& op) {
  return (op.kind == OpKind::kGemm || op.kind == OpKind::kGroupedGemm) && op.gemm.m > 0 && op.gemm.n > 0 &&
         op.gemm.k > 0;
}

std::pair<int32_t, uint16_t> key_of(const Op& op) {
  return {op.layer, op.name};
}

// A GEMM forward's rows as the replay runs them: a grouped GEMM's rounded up to whole experts.
int64_t gemm_rows(const Op& op) {
  const int64_t g = op.gemm.groups;
  return g > 1 ? (op.gemm.m + g - 1) / g * g : op.gemm.m;
}

}  // namespace

bool is_rmsnorm(const Op& op) {
  if (op.kind != OpKind::kMemoryBound || op.gemm.m <= 0 || op.gemm.n <= 0) return false;
  switch (static_cast<OpName>(op.name)) {
    case OpName::kAttnNorm:
    case OpName::kFfnNorm:
    case OpName::kCrossNorm:
    case OpName::kFinalNorm:
    case OpName::kMtpFinalNorm:
    case OpName::kQkNorm:
      return true;
    default:
      return false;
  }
}

bool is_swiglu(const Op& op) {
  if (op.kind != OpKind::kMemoryBound || op.mem != MemOp::kGlu || op.gemm.m <= 0 || op.gemm.n <= 0)
    return false;
  const auto name = static_cast<OpName>(op.name);
  return name == OpName::kAct || name == OpName::kSharedAct || name == OpName::kExpertAct;
}

std::array<int64_t, 5> attention_saved_parts(const AttentionCall& c) {
  const int64_t kv_heads = c.kv_heads > 0 ? c.kv_heads : c.heads;
  const int64_t keys = c.seq_kv > 0 ? c.seq_kv : c.seq_q;
  const int64_t v_dim = c.v_dim > 0 ? c.v_dim : c.qk_dim;
  return {aligned(2 * c.batch * c.seq_q * c.heads * c.qk_dim),
          aligned(2 * c.batch * keys * kv_heads * c.qk_dim), aligned(2 * c.batch * keys * kv_heads * v_dim),
          aligned(2 * c.batch * c.seq_q * c.heads * v_dim), aligned(4 * c.batch * c.heads * c.seq_q)};
}

std::array<int64_t, 2> norm_saved_parts(int64_t rows, int64_t cols) {
  return {aligned(rows * cols * 2), aligned(rows * 4)};
}

int64_t attention_saved_bytes(const Op& op) {
  int64_t bytes = 0;
  for (const AttentionCall& c : attention_calls(op)) {
    for (const int64_t part : attention_saved_parts(c)) bytes += part;
  }
  return bytes;
}

int64_t saved_bytes(const Op& op) {
  if (op.phase != Phase::kForward || op.micro_batch < 0) return 0;
  if (is_gemm(op) && op.part == GemmPart::kNone) {
    // Grouped GEMMs keep bf16 rows (the replay's expert weight gradients are bf16).
    return aligned(gemm_rows(op) * op.gemm.k * (op.dtype == DType::kFp8 && op.gemm.groups <= 1 ? 1 : 2));
  }
  if (is_rmsnorm(op)) {
    const std::array<int64_t, 2> part = norm_saved_parts(op.gemm.m, op.gemm.n);
    return part[0] + part[1];
  }
  if (is_swiglu(op)) return aligned(op.gemm.m * op.gemm.n * 4);
  return op.kind == OpKind::kAttention ? attention_saved_bytes(op) : 0;
}

bool reads_saved(const Op& op) {
  if (op.phase != Phase::kBackward || op.micro_batch < 0) return false;
  return (is_gemm(op) && op.part == GemmPart::kWgrad) || op.kind == OpKind::kAttention || is_rmsnorm(op) ||
         is_swiglu(op);
}

namespace {

// What a forward op writes that a stashed consumer reads as it is (bf16): a norm's or SwiGLU's output, a bf16
// GEMM's output, the output of an attention of one call (its o part); 0 for any other op.
int64_t output_bytes(const Op& op) {
  if (op.phase != Phase::kForward || op.micro_batch < 0) return 0;
  if (is_rmsnorm(op) || is_swiglu(op)) return aligned(op.gemm.m * op.gemm.n * 2);
  if (is_gemm(op) && op.part == GemmPart::kNone && op.dtype != DType::kFp8)
    return aligned(gemm_rows(op) * op.gemm.n * 2);
  if (op.kind == OpKind::kAttention) {
    const std::vector<AttentionCall> calls = attention_calls(op);
    return calls.size() == 1 ? attention_saved_parts(calls.front())[3] : 0;
  }
  return 0;
}

// What a stashed forward keeps that its producer's output is, as written: a bf16 GEMM's input X, SwiGLU's
// input; 0 for any other op (an FP8 GEMM keeps its e4m3 cast, a norm its inverse RMS beside the input).
int64_t input_bytes(const Op& op) {
  if (is_gemm(op) && op.part == GemmPart::kNone && op.dtype != DType::kFp8) return saved_bytes(op);
  return is_swiglu(op) ? saved_bytes(op) : 0;
}

}  // namespace

int64_t ActivationLayout::place(const Key& key, int32_t micro_batch) const {
  Key owner = key;
  int64_t delta = 0;
  if (const auto a = aliases.find(key); a != aliases.end()) {
    owner = a->second.owner;
    delta = a->second.delta;
  }
  const auto slice = slices.find(owner);
  if (slice == slices.end()) return -1;
  const int16_t chunk = slice->second.chunk;
  const auto stash = stash_of.find({chunk, micro_batch});
  if (stash == stash_of.end()) return -1;
  const auto c = static_cast<size_t>(chunk);
  return chunk_base[c] + stash->second * stash_bytes[c] + slice->second.offset + delta;
}

int64_t ActivationLayout::offset_of(const Op& op) const {
  if (saved_bytes(op) <= 0 && !reads_saved(op)) return -1;
  return place(key_of(op), op.micro_batch);
}

int64_t ActivationLayout::bytes_of(const Op& op) const {
  if (offset_of(op) < 0) return 0;
  const auto a = aliases.find(key_of(op));
  return a != aliases.end() ? a->second.bytes : slices.at(key_of(op)).bytes;
}

int64_t ActivationLayout::output_offset(const Op& op) const {
  const auto o = outputs.find(key_of(op));
  return op.phase != Phase::kForward || o == outputs.end() ? -1 : place(o->second, op.micro_batch);
}

int64_t ActivationLayout::output_bytes_of(const Op& op) const {
  return output_offset(op) < 0 ? 0 : slices.at(outputs.at(key_of(op))).bytes;
}

ActivationLayout activation_layout(const OpGraph& graph, int stage) {
  using Key = ActivationLayout::Key;
  const std::span<const Op> ops = graph.ops;
  ActivationLayout out;
  // Forwards the stage recomputes keep nothing across the pipeline.
  std::set<Key> recomputed;
  int16_t chunks = 0;
  for (const Op& op : ops) {
    if (op.stage != stage) continue;
    chunks = std::max<int16_t>(chunks, static_cast<int16_t>(op.chunk + 1));
    if (op.phase == Phase::kRecompute) recomputed.insert(key_of(op));
  }
  for (const Op& op : ops) {
    const int64_t b = op.stage == stage ? saved_bytes(op) : 0;
    if (b <= 0 || recomputed.contains(key_of(op))) continue;
    SavedSlice& s = out.slices[key_of(op)];
    s.chunk = op.chunk;
    s.bytes = std::max(s.bytes, b);
  }
  // One tensor, one place: a stashed forward whose producer (a forward op of the same micro-batch that it
  // depends on directly) writes what it keeps as it is shares that tensor. Consumers of an attention read its
  // o in the attention's slice; any other producer writes into its first such consumer's slice, and its
  // other consumers read there. Each relation is read off its first micro-batch (every micro-batch lowers
  // alike).
  std::set<Key> seen;
  for (const Op& c : ops) {
    const Key ck = key_of(c);
    if (c.stage != stage || c.phase != Phase::kForward || !out.slices.contains(ck) || !seen.insert(ck).second)
      continue;
    const int64_t in = input_bytes(c);
    if (in <= 0) continue;
    for (const int32_t d : graph.deps_of(c)) {
      const Op& p = ops[static_cast<size_t>(d)];
      const Key pk = key_of(p);
      if (p.stage != stage || p.micro_batch != c.micro_batch || recomputed.contains(pk) ||
          output_bytes(p) != in)
        continue;
      if (p.kind == OpKind::kAttention) {
        if (!out.slices.contains(pk)) continue;
        const std::array<int64_t, 5> part = attention_saved_parts(attention_calls(p).front());
        out.aliases[ck] = {pk, part[0] + part[1] + part[2], in};
      } else if (const auto o = out.outputs.find(pk); o != out.outputs.end()) {
        out.aliases[ck] = {o->second, 0, in};
      } else {
        out.outputs[pk] = ck;
      }
      break;
    }
  }
  for (const auto& [key, alias] : out.aliases) out.slices.erase(key);
  out.stash_bytes.assign(static_cast<size_t>(chunks), 0);
  for (auto& [key, s] : out.slices) {
    int64_t& end = out.stash_bytes[static_cast<size_t>(s.chunk)];
    s.offset = end;
    end += s.bytes;
  }
  // Each micro-batch's span in graph order: from its first stashing forward to its last op that stashes or
  // reads; then the lowest free stash of its chunk from the start of its span to the end.
  auto chunk_of = [&out](const Key& k) {
    const auto a = out.aliases.find(k);
    const auto sl = out.slices.find(a != out.aliases.end() ? a->second.owner : k);
    return sl == out.slices.end() ? int16_t{-1} : sl->second.chunk;
  };
  std::map<std::pair<int16_t, int32_t>, std::pair<size_t, size_t>> span;
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    if (op.stage != stage) continue;
    // A producer writing into a consumer's place, a forward keeping its tensors, a backward reading them.
    const auto o = op.phase == Phase::kForward ? out.outputs.find(key_of(op)) : out.outputs.end();
    const bool writes = o != out.outputs.end();
    const int16_t chunk = writes ? chunk_of(o->second) : chunk_of(key_of(op));
    const bool stashes = writes || saved_bytes(op) > 0;
    if (chunk < 0 || (!stashes && !reads_saved(op))) continue;
    const std::pair<int16_t, int32_t> mb{chunk, op.micro_batch};
    const auto [it, fresh] = span.try_emplace(mb, i, i);
    if (fresh && !stashes) span.erase(it);  // a read before any write: nothing of it was stashed here
    if (!fresh) it->second.second = i;
  }
  std::vector<std::tuple<size_t, int, std::pair<int16_t, int32_t>>> events;  // index, 0 take / 1 free, mb
  for (const auto& [mb, s] : span) {
    events.emplace_back(s.first, 0, mb);
    events.emplace_back(s.second, 1, mb);
  }
  std::sort(events.begin(), events.end());
  std::vector<std::set<int32_t>> free(static_cast<size_t>(chunks));
  out.stashes.assign(static_cast<size_t>(chunks), 0);
  for (const auto& [index, kind, mb] : events) {
    const auto c = static_cast<size_t>(mb.first);
    if (kind == 1) {
      free[c].insert(out.stash_of.at(mb));
      continue;
    }
    int32_t stash = 0;
    if (free[c].empty()) {
      stash = static_cast<int32_t>(out.stashes[c]++);
    } else {
      stash = *free[c].begin();
      free[c].erase(free[c].begin());
    }
    out.stash_of[mb] = stash;
  }
  out.chunk_base.assign(static_cast<size_t>(chunks), 0);
  for (size_t c = 0; c < out.chunk_base.size(); ++c) {
    out.chunk_base[c] = out.bytes;
    out.bytes += out.stashes[c] * out.stash_bytes[c];
  }
  return out;
}

}  // namespace moeplan::executor
