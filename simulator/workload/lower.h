// lower(model, plan) -> OpGraph: the ops of one training step, for one representative rank per pipeline
// stage, on streams, with dependencies, FLOPs, HBM bytes, shapes and communication. The simulator costs this
// graph; moerun executes it. The stack that runs the plan decides which kernels exist (the token dispatcher's
// steps and host waits, FP8 casts, the router's kernels), so the options carry those facts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "simulator/core/hardware.h"
#include "simulator/core/model_spec.h"
#include "simulator/core/op_graph.h"
#include "simulator/core/plan.h"
#include "simulator/core/stack.h"
#include "simulator/workload/routing.h"

namespace moeplan {

struct LoweringOptions {
  int64_t gpus_per_node = 8;       // for node-deduplicated dispatch volumes
  double expert_load_scale = 1.0;  // busiest EP rank's routed rows / the mean (>= 1; from the routing model)
  double dropped_fraction = 0.0;   // routed assignments dropped by the capacity factor
  // The same for an encoder-decoder's decoder layers (PlanRouting::decoder_load); decoder-only models set
  // them equal to the two above.
  double decoder_expert_load_scale = 1.0;
  double decoder_dropped_fraction = 0.0;
  bool embedding_and_head = true;  // the embedding (first virtual stage) and output layer + loss (last)
  bool data_parallel = true;       // gradient synchronisation, parameter gathers and the optimizer step
  // The stack's token dispatcher: which steps run around the exchange (Megatron: a count all-gather, a host
  // sync, a probs all-to-all, chunk sorts; DeepEP: layout and notify kernels, a host wait; HybridEP: a
  // routing-map all-gather and a preprocessing kernel). kFused is moerun's and MegaScale-MoE's: the plan's
  // exchange only, with no host wait.
  DispatcherKind dispatcher = DispatcherKind::kFused;
  bool dispatcher_host_sync = false;
  bool permute_fused = false;  // the permute is part of the dispatch kernel (HybridEP)
  int permute_host_waits = 0;  // host waits between a forward dispatch and the permute (DeepEP in Megatron)
  int permute_index_kernels = 0;           // kernels of that index conversion beyond its waits, forward
  int permute_index_backward_kernels = 0;  // and backward
  bool eager_output_bias = false;  // the experts' down-projection bias added per expert outside the GEMM
  bool eager_glu_clamp = false;    // a clamped GLU clamps in separate kernels and syncs the stream
  // Weight-gradient GEMMs accumulate into the parameters' main gradient buffer (Op::accum_bytes,
  // main_grad_bytes); not under ZeRO-2/3 (Megatron-FSDP runs without gradient-accumulation fusion).
  bool wgrad_into_main_grad = false;
  // ZeRO-3 as Megatron-FSDP runs it: a layer's pre-backward hook gathers its own parameters and prefetches
  // the next layer's in backward order, so that gather precedes the layer's post-backward reduce-scatter on
  // the shared communicator (custom_fsdp/fully_sharded_data_parallel.py _pre_backward at 1e057005,
  // PrefetchOrder.BACKWARD_PASS_ORDER; megatron_fsdp's runtime_schedule.md at d98e8a64). false: each layer's
  // gather is issued when its backward begins, behind the previous layer's reduce-scatter.
  bool zero3_backward_prefetch = false;
  // Kernels the framework launches per op where an op of the graph stands for several (PyTorch eager:
  // Megatron's router, megatron_router_kernels); moerun launches one kernel per op.
  bool eager_framework = false;
  // MLA's down projections under TP as the stack builds them (a plan's attention.mla_down_proj overrides).
  MlaDownProj mla_down_proj = MlaDownProj::kGathered;
  // Where the stack pads FP8 plans' expert rows to the FP8 alignment (a plan's experts.fp8_padding
  // overrides).
  Fp8Padding fp8_padding = Fp8Padding::kNone;

  bool operator==(const LoweringOptions&) const = default;  // every field
};

// Kernels Megatron-Core's router launches per layer and micro-batch beside its gating GEMM, forward and
// backward, for the model's router (score function, score-correction bias, group-limited top-k, scaling)
// with or without --moe-router-fusion; `partitioned`: the sequence is split over TP or CP, so the aux loss
// reduces over that group.
struct RouterKernels {
  int forward = 1;
  int backward = 1;
};
RouterKernels megatron_router_kernels(const MoeSpec& moe, bool fused, bool partitioned);

// The lowering facts of a stack, for a cluster with `gpus_per_node` GPUs per node (routing load stays the
// caller's: it needs the cost library's routing model).
LoweringOptions lowering_options(const HardwareProfile& hw, const StackProfile& stack);

OpGraph lower(const ModelSpec& model, const Plan& plan, const LoweringOptions& options);

// Bytes per element that a weight-gradient GEMM's epilogue reads and writes in the main gradient buffer under
// `plan` (Op::accum_bytes): main_grad_bytes where the stack fuses gradient accumulation, except under
// ZeRO-2/3 (Megatron-FSDP runs without it, `moeplan launch` says --no-gradient-accumulation-fusion); 0: the
// GEMM writes its own output once. Besides the data-parallel ops (gradient sync, ZeRO-3's gathers), the only
// way the ZeRO stage and the gradient sync change a layer's ops.
int wgrad_accum_bytes(const Plan& plan, const LoweringOptions& options);

// Bytes an FP8 recipe moves per element to quantise a BF16 GEMM operand for forward and its transposed use
// in backward (Hopper's FP8 GEMMs are TN only, so TE materialises the FP8 transpose): read 2, write the FP8
// copy and its transpose (1 + 1); current scaling (tensorwise) first reads the tensor once more for its amax;
// blockwise adds one fp32 scale per 128 values to each copy.
double fp8_cast_bytes_per_element(Fp8Recipe r);

// How a plan runs on a stack, built in one place for predict() and moerun, so the graph moerun executes is
// the graph the simulator prices: the plan with only the overlaps the stack achieves (with_stack_overlaps,
// its notices), the stack's lowering facts, and the busiest EP rank's routing load under `routing`.
struct StackLowering {
  Plan run;                          // the plan as the stack runs it: lower(model, run, options)
  std::vector<std::string> notices;  // overlaps asked for that the stack does not achieve
  workload::PlanRouting routing;
  LoweringOptions options;
};
StackLowering stack_lowering(const ModelSpec& model, const Plan& plan, const HardwareProfile& hw,
                             const StackProfile& stack, const workload::RoutingDistribution& routing);

// The routing facts of `r` in `o` (expert load scales and dropped fractions, the decoder's too).
void set_routing(LoweringOptions& o, const workload::PlanRouting& r);

// The pipeline order of one stage: forward and backward passes of (micro-batch, chunk), as Megatron-Core
// schedules them (1F1B: warm-up forwards, then one forward one backward, then cool-down backwards;
// interleaved 1F1B over virtual chunks). With `combined` (cross-micro-batch overlap, Megatron's combined
// 1F1B) one more warm-up forward runs first (interleaved only) and each steady-state forward is marked as
// interleaved with the backward that follows it. DualPipeV (DeepSeek's DualPipe repository, dualpipev.py
// step()): chunk 0 runs down the ranks and chunk 1 back up, in eight phases; its overlapped forward-backward
// pairs are marked `paired`, and its zero-bubble backwards compute input gradients only, their weight
// gradients running later as a `weights` task.
struct PipelineTask {
  bool forward = true;
  int32_t micro_batch = 0;
  int16_t chunk = 0;
  bool paired = false;  // forward only: runs interleaved, layer by layer, with the next task (a backward)
  bool input_grad_only = false;  // backward only: weight gradients deferred to a later weights task
  bool weights = false;          // the deferred weight gradients of the oldest input-gradient-only backward
};
std::vector<PipelineTask> pipeline_order(int64_t stage, int64_t stages, int64_t chunks, int64_t micro_batches,
                                         bool combined = false, Schedule schedule = Schedule::k1F1B);

// Largest number of micro-batch chunks whose forward is done and backward is not, over the stage's order:
// what sets activation memory.
int64_t peak_in_flight(const std::vector<PipelineTask>& order);

// Micro-batches of each chunk whose forward is done and backward is not, at the point of the stage's order
// where the live chunks weigh most, chunk c weighing `chunk_weight[c]` (e.g. its layers); ties go to the
// larger count. A forward paired with the next backward (combined 1F1B) runs layer by layer against it,
// forward layer i beside backward layer n-1-i (model_chunk_schedule_plan.py:500-630), so the pair holds the
// heavier of its two chunks, not both (plus a layer, the backward's working set the memory model adds
// anyway): the extra warm-up forward takes the place of the steady forward plain 1F1B holds before each
// backward, so the peak count is plain 1F1B's, held through the steady state rather than reached once per
// step.
std::vector<int64_t> peak_in_flight_by_chunk(const std::vector<PipelineTask>& order, int64_t chunks,
                                             const std::vector<double>& chunk_weight);

// The same for every stage of the plan (cost::memory_per_gpu's input): its schedule (combined 1F1B with
// overlap.cross_micro_batch), chunks weighted by their layers, the last one's MTP modules included.
std::vector<std::vector<int64_t>> in_flight_by_chunk(const ModelSpec& model, const Plan& plan);

// A collective over one of the plan's groups, with its size and the rank stride that places it on nodes.
CommSpec group_comm(const Plan& plan, Collective c, CommGroup g, double bytes, DType dtype);

// Layers of each virtual stage (pp * vpp entries, in virtual-stage order v = chunk * pp + stage).
std::vector<int64_t> layers_per_virtual_stage(const ModelSpec& model, const Plan& plan);

// The pipeline send of one micro-batch's activation (forward) or its gradient (backward) to the neighbouring
// stage: the micro-batch's tokens on this rank at the model width, in BF16, on the pipeline stream when the
// plan overlaps it and the compute stream otherwise. The op the lowering emits (its graph fields are the
// emitter's to set).
Op pipeline_send(const ModelSpec& model, const Plan& plan, bool forward);

// Node-deduplicated dispatch (DeepEP / HybridEP): per token, the expected number of distinct destination
// nodes (its own included), the chance its own node is one of them, and the number of distinct destination
// ranks, when E experts sit contiguously on `ranks` ranks of `per_node` GPUs each, the token picks top_k
// distinct experts uniformly within its best `group_top_k` of `groups` expert groups (groups = 1: anywhere).
// With q(S, g) = C(S - g, k) / C(S, k), the chance that a set of g experts gets none of k picks among S:
//   groups of whole nodes (c = groups / nodes per node):  P(node hit) = sum_j P(j of its c groups chosen) x
//   (1 - q(M E/G, j E/G)),  M = group_top_k (hypergeometric j);  groups spanning r nodes: each chosen group
//   covers r nodes, a node is hit with 1 - q(M E/G, E/N);  ranks likewise with E/R experts per rank.
// DeepEP's tests count RDMA bytes as tokens x distinct nodes (own node included) x hidden x bytes.
struct DedupVolumes {
  double nodes = 1;     // distinct destination nodes per token (own node included)
  double own_node = 1;  // probability that the token's own node is one of them
  double ranks = 1;     // distinct destination ranks per token
};
DedupVolumes dedup_volumes(int64_t experts, int64_t top_k, int64_t ranks, int64_t per_node, int64_t groups,
                           int64_t group_top_k);

// Expected bytes crossing the NIC for a node-deduplicated dispatch relative to a plain all-to-all: each token
// goes once to every remote node holding one of its top_k experts instead of once per expert.
//   plain:  k (N-1)/N copies leave the node; dedup: (N-1)(1 - C(E - E/N, k) / C(E, k)) copies.
double dedup_nic_scale(int64_t experts, int64_t top_k, int64_t nodes);

}  // namespace moeplan
