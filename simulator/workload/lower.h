// lower(model, plan) -> OpGraph: the ops of one training step, for one representative rank per pipeline
// stage, on streams, with dependencies, FLOPs, HBM bytes, shapes and communication. The simulator costs this
// graph; moerun executes it.
#pragma once

#include <cstdint>
#include <vector>

#include "simulator/core/model_spec.h"
#include "simulator/core/op_graph.h"
#include "simulator/core/plan.h"

namespace moeplan {

struct LoweringOptions {
  int64_t gpus_per_node = 8;       // for node-deduplicated dispatch volumes
  double expert_load_scale = 1.0;  // busiest EP rank's routed rows / the mean (>= 1; from the routing model)
  double dropped_fraction = 0.0;   // routed assignments dropped by the capacity factor
  bool embedding_and_head = true;  // the embedding (first virtual stage) and output layer + loss (last)
  bool data_parallel = true;       // gradient synchronisation, parameter gathers and the optimizer step
};

OpGraph lower(const ModelSpec& model, const Plan& plan, const LoweringOptions& options);

// The pipeline order of one stage: forward and backward passes of (micro-batch, chunk), as Megatron-Core
// schedules them (1F1B: warm-up forwards, then one forward one backward, then cool-down backwards;
// interleaved 1F1B over virtual chunks).
struct PipelineTask {
  bool forward = true;
  int32_t micro_batch = 0;
  int16_t chunk = 0;
};
std::vector<PipelineTask> pipeline_order(int64_t stage, int64_t stages, int64_t chunks,
                                         int64_t micro_batches);

// Largest number of micro-batch chunks whose forward is done and backward is not, over the stage's order:
// what sets activation memory.
int64_t peak_in_flight(const std::vector<PipelineTask>& order);

// A collective over one of the plan's groups, with its size and the rank stride that places it on nodes.
CommSpec group_comm(const Plan& plan, Collective c, CommGroup g, double bytes, DType dtype);

// Layers of each virtual stage (pp * vpp entries, in virtual-stage order v = chunk * pp + stage).
std::vector<int64_t> layers_per_virtual_stage(const ModelSpec& model, const Plan& plan);

// Expected bytes crossing the NIC for a node-deduplicated dispatch relative to a plain all-to-all: each token
// goes once to every remote node holding one of its top_k experts instead of once per expert.
//   plain:  k (N-1)/N copies leave the node; dedup: (N-1)(1 - C(E - E/N, k) / C(E, k)) copies.
double dedup_nic_scale(int64_t experts, int64_t top_k, int64_t nodes);

}  // namespace moeplan
