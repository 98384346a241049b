// One run's ops by stream (see stream_index.h).
#include "simulator/predict/stream_index.h"

#include "simulator/core/hash.h"
#include "simulator/cost/cost_cache.h"

namespace moeplan {

StreamIndex::StreamIndex(const OpGraph& g, std::span<const uint64_t> keys) : StreamIndex(g, keys, nullptr) {}

StreamIndex StreamIndex::with_keys(const OpGraph& g, std::vector<uint64_t>& keys) {
  keys.clear();
  keys.reserve(g.ops.size());
  return StreamIndex(g, {}, &keys);
}

StreamIndex::StreamIndex(const OpGraph& g, std::span<const uint64_t> keys, std::vector<uint64_t>* keys_out)
    : begin(static_cast<size_t>(g.num_stages) * kNumStreams + 1, 0),
      ops(g.ops.size()),
      queue(g.ops.size()),
      pos(g.ops.size()),
      sig(g.ops.size()) {
  // Counted first, then placed: one array for every stream, each stream's ops in id order.
  for (size_t at = 0; at < g.ops.size(); ++at) {
    const Op& op = g.ops[at];
    prefetch_op_ahead(g.ops, at, keys.empty());  // hashing reads every field when no keys are given
    const auto i = static_cast<size_t>(op.id);
    queue[i] = static_cast<uint32_t>(op.stage) * kNumStreams + static_cast<uint32_t>(op.stream);
    ++begin[queue[i] + 1];
    const uint64_t key = keys.empty() ? cost::cost_fields_hash(op) : keys[i];
    if (keys_out) keys_out->push_back(key);
    sig[i] = hash_combine(hash_combine(key, static_cast<uint64_t>(static_cast<int64_t>(op.layer))),
                          static_cast<uint64_t>(op.chunk));
  }
  for (size_t q = 1; q < begin.size(); ++q) begin[q] += begin[q - 1];
  std::vector<uint32_t> next(begin.begin(), begin.end() - 1);
  for (size_t i = 0; i < g.ops.size(); ++i) {
    const uint32_t at = next[queue[i]]++;
    pos[i] = at - begin[queue[i]];
    ops[at] = static_cast<int32_t>(i);
  }
}

}  // namespace moeplan
