// Memory per GPU of a plan as the stack allocates it: the parameter, gradient and optimizer buffers of
// Megatron-Core's distributed optimizer (or ZeRO 0/2/3), Transformer Engine's FP8 weight caches, the tensors
// each module saves for backward under each recompute choice times the micro-batch chunks in flight, the
// dispatcher's communication buffers, and the allocator's reserve and fragmentation from the stack profile,
// as a range.
#pragma once

#include <cstdint>
#include <vector>

#include "simulator/core/hardware.h"
#include "simulator/core/model_spec.h"
#include "simulator/core/model_stats.h"
#include "simulator/core/plan.h"
#include "simulator/core/stack.h"

namespace moeplan::cost {

// Bytes one decoder layer keeps for backward, per micro-batch on one rank, by the tensor's owner (the modules
// Megatron's --recompute-modules name). Notation: t = b*s/(tp*sp*cp) tokens of the rank's sequence shard,
// tg = t*tp after the TP all-gather, rows = t*k*load routed rows reaching the busiest rank's experts (x etp).
struct LayerActivations {
  double input = 0;           // the layer input [t, h] bf16 (saved by the first norm / LayerNormLinear)
  double attn_norm = 0;       // attention norm output: LayerNormLinear's ln_out shard, or MLA's separate norm
  double mla_latent = 0;      // MLA: q/kv down-projection outputs, their norm outputs, the rope key
  double qkv = 0;             // q, k, v as attention reads them (GQA: the mixed QKV buffer + roped q, k)
  double core_attn = 0;       // attention output (+ out-projection's FP8 copy) and fp32 softmax stats
  double mlp_residual = 0;    // the residual entering the MLP block [t, h] bf16
  double mlp_norm = 0;        // pre-MLP norm output (MoE: a separate module; dense: fc1's ln_out shard)
  double router = 0;          // router scores/probs/map [t, E], the permutation's row-id map
  double expert_fc1_in = 0;   // routed rows entering FC1 [rows, h] (FP8: the columnwise copy)
  double expert_fc1_out = 0;  // FC1 output [rows, 2F/etp] saved by the activation, and the rows' probs
  double expert_fc2_in = 0;   // activation output [rows, F/etp] saved by FC2
  double shared = 0;          // shared experts: fc1 output, activation output (+ FP8 copy of their input)
  double dense_mlp = 0;       // dense layers: fc1 output, activation output
  double other = 0;           // MegaScale-MoE's tensors with no Megatron module (all-to-all copies)
  double total() const {
    return input + attn_norm + mla_latent + qkv + core_attn + mlp_residual + mlp_norm + router +
           expert_fc1_in + expert_fc1_out + expert_fc2_in + shared + dense_mlp + other;
  }
};

// Bytes saved by `layer` for one micro-batch under the plan's recompute choice, as the stack keeps them:
// - Megatron-Core + TE (every stack but the fused moerun / MegaScale-MoE ones): the tensors TE's modules save
//   (megatron_stack_facts.md §4.3) minus what each selective module frees (§3.1); FP8 GEMMs save 1-byte
//   copies; memory-efficient permutation (probs applied in the activation) keeps no FC2 output.
// - moerun / MegaScale-MoE (dispatcher kFused) without recompute: the forward data flow of megascale-moe.md
//   §3.5 / Fig. 9. SAR (either stack): (2kf + 4 + 2/m) b s h / n elements (megascale-moe.md §6).
// - Full recompute: the layer input only (the caller groups layers for `recompute_num_layers`).
LayerActivations layer_activations(const ModelSpec& m, const Plan& p, const StackProfile& stack,
                                   const LayerSpec& layer, double expert_load_scale);

// The same for an explicit recompute choice (Megatron module bits for kSelective), for the savings of one
// module.
LayerActivations layer_activations_under(const ModelSpec& m, const Plan& p, const StackProfile& stack,
                                         const LayerSpec& layer, double expert_load_scale,
                                         Recompute recompute, uint16_t modules);

// Bytes the last virtual stage keeps per micro-batch beyond its layers: the final norm's input and output,
// the logits for the loss in fp32 ([tg, V/tp] x 4 B, as Megatron's estimator counts them), and per MTP module
// its embedding, the [t, 2h] concatenation the projection saves, its decoder layer and its own logits.
double head_activations(const ModelSpec& m, const Plan& p, const StackProfile& stack,
                        double expert_load_scale);

// Communication buffers the dispatcher allocates once per rank, in bytes:
// DeepEP: Megatron sizes one Buffer from the dispatch and combine configs' NVL and RDMA hints
//   (fused_a2a.py get_buffer; DeepEP csrc/config.hpp get_nvl/rdma_buffer_size_hint), for the ETP x EP group.
// HybridEP: worst-case expert buffers of T x ranks rows (hybrid_ep.cu allocate_buffer), T the rank's tokens.
// NCCL all-to-all / all-gather: none beyond NCCL's own (in the stack's reserve).
// Fused (moerun / MegaScale-MoE): send and receive windows of the largest exchange, and a DP bucket.
double dispatcher_buffer_bytes(const ModelSpec& m, const Plan& p, const StackProfile& stack,
                               const HardwareProfile& hw, double expert_load_scale,
                               const LayerKindCounts* counts = nullptr);

// Parameters of one layer kind on one rank: TP-sharded, replicated over TP (norms, router, MLA's duplicated
// down-projections and their norms: MLA:526-527,573-574), and routed experts over EP x ETP.
struct LocalParams {
  double sharded = 0, replicated = 0, experts = 0;
  double gemm = 0;  // GEMM weights among them, which TE casts to FP8 (not norms, router or embeddings)
  double dense() const { return sharded + replicated; }
};

// One layer kind's memory on a rank (layers of a kind are identical).
struct LayerMemory {
  LocalParams params;
  double saved = 0;    // saved activations under the plan's recompute (full: the layer input)
  double working = 0;  // without recompute: the backward's working set
};

// What one pipeline stage holds of the model, summed over its chunks' layers (and the embedding, output
// layer and MTP layers where it has them), before ZeRO shards it.
struct StageHolding {
  double sharded = 0, replicated = 0, experts = 0;  // parameters (LocalParams), with the stage's extras
  double gemm = 0;                                  // GEMM weights (TE's FP8 caches)
  double embeddings = 0;                            // vocabulary tables
  double largest_layer = 0;                         // dense + expert parameters of its largest layer
  double working = 0;                               // the largest backward working set of its layers
  int64_t layers = 0;                               // decoder and MTP layers
  int64_t longest_chunk = 0;                        // decoder layers of its longest chunk
};

// What memory_per_gpu computes before it applies the plan's ZeRO stage, gradient synchronisation and
// in-flight micro-batches: each layer kind's memory (by LayerKindCounts kind), the MTP layer's, the
// dispatcher's buffers, the head's activations, and what each stage holds. None of it depends on the
// plan's ZeRO stage, gradient synchronisation or overlap flags, so a search computes it once for the plans
// that differ only in those (its innermost choices) and passes it to memory_per_gpu.
struct MemoryParts {
  std::vector<LayerMemory> kinds;
  LayerMemory mtp;                   // zero without MTP layers
  double comm = 0;                   // dispatcher_buffer_bytes
  double head = 0;                   // head_activations
  std::vector<StageHolding> stages;  // by pipeline stage
  // By stage and chunk (stage * vpp + chunk): the activations one micro-batch leaves saved in the chunk's
  // layers (the head's on the last virtual stage).
  std::vector<double> chunk_bytes;
};

MemoryParts memory_parts(const ModelSpec& m, const Plan& p, const HardwareProfile& hw,
                         const StackProfile& stack, double expert_load_scale, const LayerKindCounts& counts);

struct MemoryBreakdown {
  int64_t stage = 0;       // the pipeline stage with the largest total
  double weights = 0;      // bf16 parameter buffer (+ TE's FP8 weight and transpose caches)
  double gradients = 0;    // the main-gradient buffer (fp32 or bf16)
  double optimizer = 0;    // fp32 main parameters + Adam m and v, sharded per ZeRO stage
  double activations = 0;  // saved tensors of the chunks in flight + one layer's backward working set
  double comm_buffers = 0;
  double reserve = 0;                        // central: mid-range of the two below
  double reserve_low = 0, reserve_high = 0;  // stack reserve + fragmentation x allocated, low and high ends
  int64_t in_flight = 0;                     // micro-batch chunks whose activations are live at the peak
  double capacity = 0;
  double allocated() const { return weights + gradients + optimizer + activations + comm_buffers; }
  double total() const { return allocated() + reserve; }
  double total_low() const { return allocated() + reserve_low; }
  double total_high() const { return allocated() + reserve_high; }
  // The fit test uses the low end: a plan is rejected only when even the smallest reserve and fragmentation
  // the stack states leave it over capacity; it is `tight` when it fits at the low end but not the high end.
  bool fits() const { return total_low() <= capacity; }
  bool tight() const { return fits() && total_high() > capacity; }
};

// Every pipeline stage's memory. `in_flight[s][c]`: micro-batches of chunk c (virtual stage c*pp + s) whose
// forward is done and backward is not, at stage s's activation peak (workload's in_flight_by_chunk); a
// stage's entry with another length is a total spread evenly over its chunks; missing: one of each.
std::vector<MemoryBreakdown> memory_per_stage(const ModelSpec& m, const Plan& p, const HardwareProfile& hw,
                                              const StackProfile& stack,
                                              const std::vector<std::vector<int64_t>>& in_flight,
                                              double expert_load_scale,
                                              const LayerKindCounts* counts = nullptr);

// The stage with the largest (central) total: what one GPU must hold.
// `counts`: the model's (computed here when absent; a search that prices many plans passes its own).
// `parts`: memory_parts of this plan, or of one that differs from it only in data.zero, compression.grad_sync
// and the overlap flags (computed here when absent).
MemoryBreakdown memory_per_gpu(const ModelSpec& m, const Plan& p, const HardwareProfile& hw,
                               const StackProfile& stack, const std::vector<std::vector<int64_t>>& in_flight,
                               double expert_load_scale, const LayerKindCounts* counts = nullptr,
                               const MemoryParts* parts = nullptr);

}  // namespace moeplan::cost
