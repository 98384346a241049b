// Memory per GPU of a plan: weights, gradients and optimizer states per ZeRO stage, activations per
// micro-batch times those in flight under the pipeline schedule (with recompute savings), communication
// buffers, a reserve.
#pragma once

#include <cstdint>
#include <vector>

#include "simulator/core/hardware.h"
#include "simulator/core/model_spec.h"
#include "simulator/core/plan.h"

namespace moeplan::cost {

// Activation elements one layer keeps per micro-batch on one rank, by tensor, for backward.
struct LayerActivations {
  double attention = 0;  // hidden, norm output, q/k/v (+ rope, all-to-all copies), attention output, residual
  double moe = 0;        // norm output, gathered/permuted tokens, expert FC1/FC3/FC2 activations, outputs
  double dense_ffn = 0;
  double total() const { return attention + moe + dense_ffn; }
};

// Elements (not bytes) saved by layer `layer` for one micro-batch. Full: every tensor of the forward data
// flow that backward reads (megascale-moe.md §3.5 for SP + EP). Selective (MegaScale-MoE's SAR): only FC1/FC3
// outputs, attention inputs (q/k/v after the all-to-all) and output, the layer input and the residual; the
// rest is recomputed. Full recompute: the layer input only.
LayerActivations layer_activation_elements(const ModelSpec& m, const Plan& p, const LayerSpec& layer,
                                           double expert_load_scale);

struct MemoryBreakdown {
  int64_t stage = 0;  // the pipeline stage with the largest total
  double weights = 0, gradients = 0, optimizer = 0, activations = 0, comm_buffers = 0, reserve = 0;
  int64_t in_flight = 0;  // micro-batch chunks whose activations are live at the peak
  double capacity = 0;
  double total() const { return weights + gradients + optimizer + activations + comm_buffers + reserve; }
  bool fits() const { return total() <= capacity; }
};

// Fixed reserve: CUDA context, NCCL and cuBLAS workspaces (assumption: 2 GiB), plus allocator fragmentation
// (assumption: 5% of everything else). Stated in the report, not fitted.
inline constexpr double kReserveFixedBytes = 2.0 * 1024 * 1024 * 1024;
inline constexpr double kFragmentation = 0.05;

// `in_flight` per stage: peak live micro-batch chunks of that stage's pipeline order.
MemoryBreakdown memory_per_gpu(const ModelSpec& m, const Plan& p, const HardwareProfile& hw,
                               const std::vector<int64_t>& in_flight, double expert_load_scale);

}  // namespace moeplan::cost
