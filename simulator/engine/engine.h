// Discrete-event execution of an op graph: streams run their ops in order, cross-stream edges are events, and
// ops that run at the same time on one rank share its resources (flow level): concurrent transfers on a link
// split its bandwidth, concurrent kernels split the SMs, and compute beside communication kernels loses the
// SMs they take (each communication op's sm_fraction) and the HBM bandwidth they use, while a transfer beside
// compute runs at its cost's rate_beside_compute. A host thread per stage
// issues the ops in program order and waits at host syncs, so host-bound stretches and the stall after a
// device-to-host sync show. Deterministic: the same inputs give the same timeline.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "simulator/core/op_graph.h"
#include "simulator/cost/cost_model.h"

namespace moeplan::engine {

struct EngineOptions {
  double hbm_bytes_per_s = 0;  // achieved HBM bandwidth, shared by memory-bound kernels and transfers
  // Compute beside running communication kernels: this fraction of its rate on the SMs they leave.
  double overlap_compute_efficiency = 1.0;
  // The host: one thread per stage issues the stage's ops in program order (op id order), each after its
  // cost's host_seconds; at an op marked host_sync it waits until the op ends on the device (plus the cost's
  // host_sync_seconds). An op starts only once issued. Off: every op is issued at time zero.
  bool host = true;
};

struct Timeline {
  std::vector<OpTiming> ops;      // by op id
  std::vector<double> issued;     // by op id: when the host issued it (its start is never earlier)
  std::vector<int32_t> gated_by;  // by op id: the predecessor whose end started it (-1: nothing before it)
  std::vector<double> stage_end;  // when each stage's last op ends
  std::vector<double> stage_sm;   // per stage: the summed durations of its ops on the SMs
  double step_time = 0;           // the latest end
  int64_t events = 0;             // op starts + completions processed
};

// The share of a rank's SM rate that compute keeps beside running communication kernels holding `comm_sms`
// of the SMs together (they hold at most 90 % of them): the rest of the SMs, at the stack's overlap
// efficiency (shared HBM, L2 and power).
inline double compute_share_beside_comm(double comm_sms, double overlap_compute_efficiency) {
  return (1.0 - std::min(0.9, comm_sms)) * overlap_compute_efficiency;
}

// `costs[i]` is op i's standalone cost. Asserts that the graph has no cycle (every op runs).
Timeline simulate(const OpGraph& graph, std::span<const cost::OpCost> costs, const EngineOptions& options);

// The chain of ops that sets the step time, in execution order: from the op that ends last, back through
// the predecessor (dependency or previous op on its stream) that ended latest before each op started, as the
// engine recorded it. Every op starts the moment its last predecessor ends, so this chain is a longest path
// of the op graph weighted by simulated durations (longest_path computes that from the graph).
std::vector<int32_t> critical_path(const Timeline& timeline);

// The longest path of the op graph, with its stream-order edges, weighted by each op's simulated duration
// (Boost.Graph topological sort, then one relaxation pass). The independent check of critical_path; it
// costs a pass over the graph that critical_path does not.
std::vector<int32_t> longest_path(const OpGraph& graph, const Timeline& timeline);

}  // namespace moeplan::engine
