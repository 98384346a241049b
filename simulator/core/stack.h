// StackProfile: the software that runs a plan (moerun, Megatron-Core + TE, + DeepEP/HybridEP), as the costs
// that differ from the best kernels: grouped-GEMM efficiency, memory-bound efficiency, host/launch costs,
// dispatcher bytes, SMs taken by communication and the overlaps the stack achieves. SI units.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "simulator/core/hardware.h"

namespace moeplan {

struct StackProfile {
  std::string name, description;
  std::map<std::string, std::string> sources;  // source id -> citation
  bool calibrated = false;                     // false: numbers are assumptions from public measurements
  Sourced<double> launch_s_per_kernel;         // host + launch gap per kernel on the critical path
  Sourced<double> host_s_per_local_expert;     // extra host/launch cost per local expert per grouped GEMM
  Sourced<double> host_s_per_micro_batch;      // per micro-batch per stage (schedule bookkeeping, p2p setup)
  // Grouped-GEMM efficiency relative to a dense GEMM of the same total shape: (rows per expert, efficiency in
  // (0, 1]), rows strictly increasing.
  std::vector<std::pair<double, double>> grouped_gemm_efficiency;
  std::string grouped_gemm_efficiency_source;
  Sourced<double> memory_bound_efficiency;  // fraction of achieved HBM bandwidth for permute, casts, norms
  Sourced<bool> dispatch_dedup;             // dispatcher sends one copy per destination node over RDMA
  Sourced<double> comm_sm_fraction;         // share of SMs comm kernels take while overlapping compute
  struct Overlaps {
    Sourced<bool> inter_op, intra_op, dp_comm, pp_comm;
  } overlaps;  // which the stack achieves
};

}  // namespace moeplan
