// Router traces (per-expert token counts recorded from a real run) and the plan's routing.distribution
// string, turned into the routing distribution that the imbalance model reads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "simulator/core/status.h"
#include "simulator/workload/routing.h"

namespace moeplan::io {

// {"format": "moeplan-router-trace-v1", "source": "...", "expert_tokens": [c0, c1, ...]}: one count per
// routed expert (>= 0, not all zero), a non-empty source. Unknown keys are errors. Errors are one line,
// "FILE: field 'X': expected ..., got ...".
Result<std::vector<double>> load_router_trace(const std::string& path, int64_t expected_experts);

// A plan's routing.distribution: "uniform", "zipf:<s>" (0 < s < 100), or a router-trace path (relative to
// base_dir unless absolute).
Result<workload::RoutingDistribution> routing_distribution(const std::string& spec, int64_t experts,
                                                           const std::string& base_dir);

}  // namespace moeplan::io
