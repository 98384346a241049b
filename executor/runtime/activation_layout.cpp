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

// RMSNorm (its backward reads the input and the inverse RMS per row) and SwiGLU (its backward reads the
// input [rows, 2 cols]), where the lowering states the tensor they walk.
bool is_norm(const Op& op) {
  if (op.kind != OpKind::kMemoryBound || op.gemm.m <= 0 || op.gemm.n <= 0) return false;
  switch (static_cast<OpName>(op.name)) {
    case OpName::kAttnNorm:
    case OpName::kFfnNorm:
    case OpName::kCrossNorm:
    case OpName::kFinalNorm:
    case OpName::kQkNorm:
      return true;
    default:
      return false;
  }
}

bool is_glu(const Op& op) {
  if (op.kind != OpKind::kMemoryBound || op.mem != MemOp::kGlu || op.gemm.m <= 0 || op.gemm.n <= 0)
    return false;
  const auto name = static_cast<OpName>(op.name);
  return name == OpName::kAct || name == OpName::kSharedAct || name == OpName::kExpertAct;
}

}  // namespace

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
    if (op.gemm.groups > 1) {
      const int64_t per = (op.gemm.m + op.gemm.groups - 1) / op.gemm.groups;
      return aligned(per * op.gemm.groups * op.gemm.k * 2);
    }
    return aligned(op.gemm.m * op.gemm.k * (op.dtype == DType::kFp8 ? 1 : 2));
  }
  if (is_norm(op)) {
    const std::array<int64_t, 2> part = norm_saved_parts(op.gemm.m, op.gemm.n);
    return part[0] + part[1];
  }
  if (is_glu(op)) return aligned(op.gemm.m * op.gemm.n * 4);
  return op.kind == OpKind::kAttention ? attention_saved_bytes(op) : 0;
}

bool reads_saved(const Op& op) {
  if (op.phase != Phase::kBackward || op.micro_batch < 0) return false;
  return (is_gemm(op) && op.part == GemmPart::kWgrad) || op.kind == OpKind::kAttention || is_norm(op) ||
         is_glu(op);
}

int64_t ActivationLayout::offset_of(const Op& op) const {
  if (saved_bytes(op) <= 0 && !reads_saved(op)) return -1;
  const auto slice = slices.find(key_of(op));
  if (slice == slices.end()) return -1;
  const int16_t chunk = slice->second.chunk;
  const auto stash = stash_of.find({chunk, op.micro_batch});
  if (stash == stash_of.end()) return -1;
  const auto c = static_cast<size_t>(chunk);
  return chunk_base[c] + stash->second * stash_bytes[c] + slice->second.offset;
}

int64_t ActivationLayout::bytes_of(const Op& op) const {
  return offset_of(op) < 0 ? 0 : slices.at(key_of(op)).bytes;
}

ActivationLayout activation_layout(std::span<const Op> ops, int stage) {
  ActivationLayout out;
  // Forwards the stage recomputes keep nothing across the pipeline.
  std::set<std::pair<int32_t, uint16_t>> recomputed;
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
  out.stash_bytes.assign(static_cast<size_t>(chunks), 0);
  for (auto& [key, s] : out.slices) {
    int64_t& end = out.stash_bytes[static_cast<size_t>(s.chunk)];
    s.offset = end;
    end += s.bytes;
  }
  // Each micro-batch's span in graph order: from its first stashing forward to its last op that stashes or
  // reads; then the lowest free stash of its chunk from the start of its span to the end.
  std::map<std::pair<int16_t, int32_t>, std::pair<size_t, size_t>> span;
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    if (op.stage != stage || !out.slices.contains(key_of(op))) continue;
    const bool stashes = saved_bytes(op) > 0;
    if (!stashes && !reads_saved(op)) continue;
    const std::pair<int16_t, int32_t> mb{out.slices.at(key_of(op)).chunk, op.micro_batch};
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
