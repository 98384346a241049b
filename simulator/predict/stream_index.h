// One run's ops by stream: what the periodic steady state's op-by-op check (periodic.h) walks, built with
// the run's cost keys when the run is lowered.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "simulator/core/op_graph.h"

namespace moeplan {

// Each stream's ops (queue = stage * kNumStreams + stream) in program (id) order, in one array; where each op
// sits; and each op's signature, its cost fields (cost_fields_hash), layer and chunk, what two runs'
// versions of one op share.
struct StreamIndex {
  std::vector<uint32_t> begin;       // queue q's ops are ops[begin[q] .. begin[q + 1])
  std::vector<int32_t> ops;          // op ids
  std::vector<uint32_t> queue, pos;  // by op id
  std::vector<uint64_t> sig;         // by op id

  // `keys`: each op's cost_fields_hash (where empty, computed here, one op at a time, and not kept).
  StreamIndex(const OpGraph& g, std::span<const uint64_t> keys);
  // The index and, into `keys` (cleared first), each op's cost_fields_hash: one pass over the ops for both.
  static StreamIndex with_keys(const OpGraph& g, std::vector<uint64_t>& keys);
  std::span<const int32_t> of(size_t q) const { return {ops.data() + begin[q], begin[q + 1] - begin[q]}; }
  size_t queues() const { return begin.size() - 1; }

 private:
  StreamIndex(const OpGraph& g, std::span<const uint64_t> keys, std::vector<uint64_t>* keys_out);
};

}  // namespace moeplan
