// Costs of ops keyed by the fields that decide them: a step repeats each op once per micro-batch and a
// plan's runs share most of their ops, so each distinct op is priced once (predict()'s runs, the screen's
// per-layer runs).
#pragma once

#include <cstdint>
#include <unordered_map>

#include "simulator/core/op_graph.h"
#include "simulator/cost/cost_model.h"

namespace moeplan::cost {

// A hash of the fields that decide an op's cost: ops equal in them cost the same. A pipeline send's cost
// also depends on the path between its stages, which the op does not hold.
uint64_t cost_fields_hash(const Op& op);

class CostCache {
 public:
  explicit CostCache(const CostModel& model) : model_(model) {}
  // The op's cost; `key` is its cost_fields_hash.
  const OpCost& cost(const Op& op, uint64_t key) {
    auto it = costs_.find(key);
    if (it == costs_.end()) it = costs_.emplace(key, model_.cost(op)).first;
    return it->second;
  }
  const OpCost& cost(const Op& op) { return cost(op, cost_fields_hash(op)); }

 private:
  const CostModel& model_;
  std::unordered_map<uint64_t, OpCost> costs_;
};

}  // namespace moeplan::cost
