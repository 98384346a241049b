// StackProfile: the software that runs a plan (moerun, Megatron-Core + TE, + DeepEP/HybridEP, MegaScale-MoE),
// as it is built: which kernels run for the expert GEMMs, the dispatcher and attention, what the host does
// per kernel and where it waits for the device, the SMs communication kernels hold, which overlaps and plan
// features the software has, and its memory reserve. SI units. Every number says whether it was measured,
// derived from measurements, assumed, or is a target not yet built.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "simulator/core/hardware.h"
#include "simulator/core/stated.h"

namespace moeplan {

// How a stack runs the grouped expert GEMMs of one MoE layer.
enum class GroupedGemmImpl : uint8_t {
  kGroupedKernel,     // one kernel over all local experts, tiles scheduled across experts (CUTLASS grouped,
                      // DeepGEMM, cuBLASLt grouped): waves quantise over the whole launch
  kPerExpertStreams,  // one GEMM launch per expert, round-robin over `streams` streams (TE GroupedLinear on
                      // Hopper: multi-stream cuBLASLt): waves quantise per expert, streams overlap launches
};
const char* name_of(GroupedGemmImpl g);

// The implementation class of a measured grouped-GEMM kernel (GroupedGemmTable::kernel in a hardware
// profile): how it runs a layer's experts, i.e. the implementation a stack built on that kernel declares. The
// fit report prices each measurement with its class's implementation.
struct GroupedGemmKernelClass {
  const char* name;
  GroupedGemmImpl impl;
  int64_t streams;   // per-expert launches: the streams they spread over
  const char* what;  // one line: the kernel and how it runs
};
// deepgemm, deepgemm_per_group, cutlass_grouped, torch_grouped_mm, cublas_batched, cublas_loop,
// te_grouped_linear, eigen_loop.
const std::vector<GroupedGemmKernelClass>& grouped_gemm_kernel_classes();
const GroupedGemmKernelClass* find_grouped_gemm_kernel(const std::string& name);
std::string grouped_gemm_kernel_names();  // "deepgemm, deepgemm_per_group, ...", for error messages

// The token dispatcher: what crosses the wire, which kernels run, and where the host waits.
enum class DispatcherKind : uint8_t {
  kNcclAllToAll,   // Megatron alltoall: permute, NCCL all-to-all-v of one row per (token, expert) pair,
                   // probs all-to-all; ETP all-gather / reduce-scatter after the EP exchange
  kNcclAllGather,  // Megatron allgather: all-gather of tokens over ETP x EP, local permute, reduce-scatter
  kDeepEp,         // DeepEP normal kernels: one copy per destination node over RDMA, NVLink fan-out to ranks,
                   // combine reduces within the node first; SMs taken from compute
  kHybridEp,       // HybridEP: as DeepEP, dispatch fused with the permute
  kFused,          // moerun / MegaScale-MoE: NVLink all-to-all or all-gather kernels of the plan's dispatch,
                   // fused into the GEMMs when the plan asks for intra-operator overlap
};
const char* name_of(DispatcherKind d);

enum class AttentionKernel : uint8_t { kFa3, kCudnn, kFa2 };
const char* name_of(AttentionKernel a);

enum class MemOp : uint8_t;  // simulator/core/op_graph.h
enum class Phase : uint8_t;  // simulator/core/op_graph.h

struct StackProfile {
  std::string name, description;
  std::map<std::string, std::string> sources;  // source id -> citation
  bool calibrated = false;                     // false: numbers are assumptions from public measurements

  // Host. The GPU-side gap between dependent kernels is paid on the device; the CPU's time to issue a kernel
  // only shows where the host cannot run ahead: after it waits for the device, or where kernels are shorter
  // than their issue time.
  Stated<double> launch_s_per_kernel;      // device-side gap per kernel on the critical path of a stream
  Stated<double> host_s_per_kernel;        // CPU time to issue one kernel (framework + launch API)
  Stated<double> host_s_per_local_expert;  // extra host/launch cost per local expert per grouped GEMM
  Stated<double> host_s_per_micro_batch;   // per micro-batch per stage (schedule bookkeeping, p2p setup)
  Stated<double> host_sync_s;              // a device-to-host round trip where the host waits for counts
  Stated<double> min_kernel_s;             // the shortest a kernel takes on the device (launch ramp and tail)

  // Expert GEMMs.
  struct GroupedGemm {
    Stated<GroupedGemmImpl> impl;
    Stated<int64_t> streams;          // per-expert launches: streams they round-robin over (TE: 4)
    Stated<double> efficiency;        // the kernel's rate over the dense GEMM model at the same tiles
    Stated<double> wgrad_efficiency;  // the same for the weight-gradient GEMMs (K = rows per expert)
  } grouped_gemm;

  Stated<double> memory_bound_efficiency;  // fraction of achieved HBM bandwidth for permute, casts, norms
  // Memory-bound kernels measured apart from the rest: their own fraction of the achieved HBM bandwidth over
  // the bytes the lowering counts for them, forward and backward (recomputation runs the forward). Value 0:
  // not stated, memory_bound_efficiency prices them.
  struct MemoryBoundByKind {
    Stated<double> glu_forward, glu_backward;                    // MemOp::kGlu
    Stated<double> loss_unfused_forward, loss_unfused_backward;  // MemOp::kLossUnfused
    Stated<double> loss_native_forward, loss_native_backward;    // MemOp::kLossNative
    // MemOp::kCast: FP8 quantisation kernels (the weights' casts, and those an FP8 GEMM runs on its operand,
    // Op::aux_bytes)
    Stated<double> cast_forward, cast_backward;
  } memory_bound_by_kind;
  // Each of them: its key under memory_bound_efficiency_by_kind, its kind and phase, and where it is held.
  struct KindNumber {
    const char* kind_key;  // "glu": its key under memory_bound_efficiency_by_kind
    bool backward;         // under "backward" (else "forward")
    const char* path;      // "memory_bound_efficiency_by_kind.glu.backward"
    MemOp kind;
    Stated<double> MemoryBoundByKind::*number;
    const char* direction() const { return backward ? "backward" : "forward"; }
  };
  static const std::vector<KindNumber>& memory_bound_kind_numbers();
  // The efficiency (and its number) that prices a memory-bound kernel of this kind in this phase.
  const Stated<double>& memory_bound_efficiency_of(MemOp kind, Phase phase) const;

  struct Dispatcher {
    Stated<DispatcherKind> kind;
    Stated<bool> host_sync;            // the host waits for the received-token counts before each dispatch
    Stated<int64_t> sms;               // SMs the dispatch/combine kernels hold while they run
    Stated<double> nic_efficiency;     // its RDMA leg's rate over the NIC's line rate
    Stated<double> nvlink_efficiency;  // its NVLink leg's rate over the profile's achieved NVLink bandwidth
    Stated<bool> permute_fused;        // permute / unpermute fused into the dispatch and combine kernels
    // Host waits between a forward dispatch and the permute by expert: reads of a size the GPU computed
    // (DeepEP's indices-to-multihot conversion in Megatron-Core without experimental features).
    Stated<int64_t> permute_host_waits;
    // Kernels of that conversion beyond its waits, forward and backward (0: none).
    Stated<int64_t> permute_index_kernels;
    Stated<int64_t> permute_index_backward_kernels;
    // Its dispatch and combine kernels run at this fraction of their rate alone while compute kernels run on
    // the same GPU (HBM, L2 and issue slots shared with them). Stated by the node-deduplicating dispatchers.
    Stated<double> overlap_efficiency{1.0, kNotStated};
    // Measured per node count of the exchange (optional): the RDMA leg's efficiency (replacing
    // nic_efficiency) and the fixed cost of a forward dispatch (routing metadata, preprocessing, host wait)
    // and of a forward combine beyond their kernels. Nodes increasing; interpolated, held at the ends.
    struct ByNodes {
      double nodes = 0, nic_efficiency = 0, dispatch_setup_s = 0, combine_setup_s = 0;
    };
    std::vector<ByNodes> by_nodes;
    std::string by_nodes_source;
    Basis by_nodes_basis = Basis::kAssumed;
  } dispatcher;
  // Convenience: one copy per destination node over RDMA (DeepEP, HybridEP).
  bool dispatch_dedup() const {
    return dispatcher.kind.value == DispatcherKind::kDeepEp ||
           dispatcher.kind.value == DispatcherKind::kHybridEp;
  }

  // What the framework runs around the expert GEMMs for model features the GEMMs do not take in.
  struct ExpertMlp {
    // The down projection's bias is added outside the GEMM, per local expert, weighted by the routing probs:
    // two elementwise kernels per expert and a concatenation forward, four per expert and a concatenation
    // backward (Megatron-Core's TEGroupedMLP._apply_bias).
    Stated<bool> eager_output_bias;
    // A clamped GLU (GPT-OSS) clamps its halves and concatenates them in separate kernels before the fused
    // activation, and makes its offset a device tensor from a Python float: a host-to-device copy that
    // synchronises the stream, in the forward and in every recomputation of the activation.
    Stated<bool> eager_glu_clamp;
  } expert_mlp;

  // How weight-gradient GEMMs write their result. With Megatron's gradient-accumulation fusion, TE's linear
  // layers pass the parameter's main gradient buffer as the GEMM output with accumulate on (D = A·B + C): the
  // epilogue reads and writes the buffer (fp32 when gradients are reduced in fp32) where a plain GEMM writes
  // its BF16 output once. `epilogue_overlap` is the share of that extra traffic hidden behind the main loop:
  // 1 prices the GEMM at the larger of its measured time and all its bytes at the HBM rate, 0 adds the extra
  // bytes' time to the measured time.
  struct WgradAccumulation {
    Stated<bool> into_main_grad;
    Stated<double> epilogue_overlap{1.0, kNotStated};
  } wgrad_accumulation;

  Stated<AttentionKernel> attention_kernel;
  Stated<double> comm_sm_fraction;  // share of SMs comm kernels take while overlapping compute
  // Compute running beside communication kernels runs at this fraction of its rate on the SMs left to it
  // (HBM, L2 and power shared with the transfers).
  Stated<double> overlap_compute_efficiency;
  // moerun's fused GEMM + communication kernels (OpKind::kFusedGemmComm) run their own main loop, not the
  // library GEMM's: their tiles compute at this fraction of the library rate on the SMs left to them. 1 (the
  // library rate) where a stack does not state it.
  Stated<double> fused_gemm_efficiency{1.0, kNotStated};
  // Transformer Engine's userbuffers (overlaps.tp_comm): the pipelined reduce-scatter after a row-parallel
  // GEMM's chunk runs TE's own kernel on 16 SMs, priced as the profile's NCCL reduce-scatter of the chunk's
  // bytes divided by this. 1 where a stack does not state it.
  Stated<double> userbuffers_rs_speed{1.0, kNotStated};
  // FP8 GEMMs under block scaling (--fp8-recipe blockwise: 1x128 activation and 128x128 weight scales,
  // applied inside the main loop) run at this fraction of the hardware profile's FP8 GEMM rate, which
  // per-tensor scaled kernels measured (Op::block_scaled). 1 where a stack does not state it.
  Stated<double> fp8_block_gemm_rate{1.0, kNotStated};
  // FLA's chunked gated delta rule (Gated DeltaNet under Megatron-Core): the time one chain of its recurrence
  // takes per chunk, for the scan ops whose walked shape states chunks, chains and passes (lower.cpp). Not
  // stated (0): the scan is priced by its bytes alone.
  Stated<double> recurrent_scan_chunk_s{0.0, kNotStated};

  struct Overlaps {
    Stated<bool> inter_op, intra_op, dp_comm, pp_comm, cross_micro_batch;
    // Transformer Engine's userbuffers (Plan::Overlap::tp_comm); optional in a profile.
    Stated<bool> tp_comm{false, kNotStated};
    // Pipeline sends overlap only with a virtual pipeline (vpp > 1): Megatron switches p2p overlap off
    // without one and sends blocking. Optional in a profile (false: every schedule overlaps them).
    Stated<bool> pp_comm_needs_vpp{false, kNotStated};
    // The shared experts on their own stream beside the dispatch (Plan::Overlap::shared_experts); optional.
    Stated<bool> shared_experts{false, kNotStated};
  } overlaps;  // which the stack achieves

  // Plan features the stack can run. A plan asking for one it lacks is refused with the reason (overlaps
  // above are switched off instead: no credit, and the report says so).
  struct Capabilities {
    std::vector<std::string> dispatch;            // plan experts.dispatch values
    std::vector<std::string> recompute;           // none, selective, full, sar
    std::vector<std::string> recompute_modules;   // Megatron module names
    std::vector<std::string> schedules;           // 1f1b, interleaved_1f1b
    std::vector<std::string> precision;           // bf16, fp8
    std::vector<std::string> fp8_recipes;         // delayed, tensorwise, blockwise, mxfp8
    std::vector<std::string> grad_sync;           // fp32_reduce_scatter, bf16_reduce_scatter, bf16_all_to_all
    std::vector<std::string> dispatch_precision;  // bf16, fp8
    // MLA's down-projection layouts under TP (plan attention.mla_down_proj): the first is the one the stack
    // builds at its own commits, the others those a plan may name for older builds.
    std::vector<std::string> mla_down_proj;  // duplicated, column_parallel, gathered
    // Where FP8 plans pad each expert's rows to the FP8 alignment (plan experts.fp8_padding): the first is
    // what the stack does by default, the others what a plan may turn on.
    std::vector<std::string> fp8_padding;  // experts, dispatcher, router, none
    // The dtypes a plan's parameters may be all-gathered in (plan data.fp8_param_gather: fp8).
    std::vector<std::string> param_gather;  // bf16, fp8
    // The parts of a layer a plan may capture as per-layer CUDA graphs (plan cuda_graphs): layer, attn, mlp,
    // moe, moe_router, moe_preprocess, mamba; empty: none.
    std::vector<std::string> cuda_graph_scopes;
    std::string source;
  } capabilities;

  // Memory the software keeps beyond tensors: CUDA context, NCCL and library workspaces, and the caching
  // allocator's fragmentation, as a range (low, high) of bytes and of fraction.
  struct Memory {
    Stated<double> reserve_bytes;       // fixed
    Stated<double> reserve_bytes_high;  // upper end of the range
    Stated<double> fragmentation;       // fraction of allocated tensors
    Stated<double> fragmentation_high;
  } memory;

  // The source of every number above, for tools that look for a citation among them.
  std::vector<const std::string*> number_sources() const;

  // The real-valued numbers that price a step (not memory's ranges), each by its path in a stack file, for
  // tools that vary them; `unit` converts the file's unit to SI ("host.issue_us_per_kernel": 1e-6).
  struct Number {
    const char* path;
    Stated<double>* number;
    double unit;
  };
  std::vector<Number> numbers();
};

// Whether the stack lists `value` among `list` (an empty list means the capability was not stated: allowed).
bool stack_has(const std::vector<std::string>& list, const std::string& value);

}  // namespace moeplan
