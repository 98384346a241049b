// Discrete-event execution of an op graph: streams run their ops in order, cross-stream edges are events, and
// ops that run at the same time on one rank share its resources (flow level): concurrent transfers on a link
// split its bandwidth, concurrent kernels split the SMs, and compute beside communication kernels loses the
// SMs they take and the HBM bandwidth they use. Deterministic: the same inputs give the same timeline.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "simulator/core/op_graph.h"
#include "simulator/cost/cost_model.h"

namespace moeplan::engine {

struct EngineOptions {
  double comm_sm_fraction = 0;  // SMs communication kernels take from concurrent compute (stack profile)
  double hbm_bytes_per_s = 0;   // achieved HBM bandwidth, shared by memory-bound kernels and transfers
};

struct OpTiming {
  double start = 0, end = 0;
};

struct Timeline {
  std::vector<OpTiming> ops;      // by op id
  std::vector<double> stage_end;  // when each stage's last op ends
  double step_time = 0;           // the latest end
  int64_t events = 0;             // op starts + completions processed
};

// `costs[i]` is op i's standalone cost. Asserts that the graph has no cycle (every op runs).
Timeline simulate(const OpGraph& graph, std::span<const cost::OpCost> costs, const EngineOptions& options);

// The chain of ops that sets the step time: from the op that ends last, back through the dependency or stream
// predecessor that ended latest before each op started (Boost.Graph topological order + longest path, with
// each op weighted by its simulated duration). Returned in execution order.
std::vector<int32_t> critical_path(const OpGraph& graph, const Timeline& timeline);

}  // namespace moeplan::engine
