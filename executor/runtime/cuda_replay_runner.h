// CudaReplayRunner: the replay runner on a GPU - each op of this rank's stage performs work of its exact
// shape with the CUDA backend's kernels, so the measured op times of `moerun run --backend cuda` compare with
// the simulator's predictions op by op, as the CPU replay runner's do on CPUs:
//   GEMM: cuBLASLt bf16 (executor/kernels/cuda/gemm.h) in the op's part: forward [m, k] x [k, n], dgrad
//     [m, n] x [k, n]^T, wgrad [m, k]^T x [m, n] into fp32 (the main-grad buffer); each weight and its main
//     gradient at its own place in the stage's real-sized parameter buffers (param_layout.h), the forward's
//     input in its micro-batch's activation stash where the weight gradient reads it back, and a bf16
//     forward's output where the forward reading it keeps it (activation_layout.h), other operands in
//     scratch buffers the lane reuses;
//   grouped GEMM: CUTLASS's grouped kernel (grouped_gemm.h) over `groups` experts of ceil(m / groups) rows
//     each, or each local expert's drawn rows (draw_routing), the counts in device memory; an FP8 op's
//     forward and data gradient in e4m3 after the quantiser over its rows (weight gradients in bf16); the
//     forward's input rows in the activation stash, as for dense GEMMs;
//   attention: cuDNN flash attention (attention.h), forward or backward, for each call that does the op's
//     work (attention_calls): the op's heads and kv heads (GQA), qk and v dims (MLA), window and
//     causality; context parallelism's local part as a causal square of the rank's queries, its remote part
//     as a full block over the keys that make the op's FLOPs; q, k, v, o and the statistics in the
//     micro-batch's activation stash, the gradients in scratch buffers;
//   memory-bound ops whose lowering states the tensor they walk (op_graph.h): the project's kernel at that
//     shape where one exists (RMSNorm, SwiGLU, RoPE, moerun's fused cross-entropy, the router's forward);
//     every other memory-bound op, those over drawn expert rows and the optimizer: a device-to-device copy
//     moving hbm_bytes (half read, half written);
//   collectives: NCCL over the group's DeviceCommunicator with comm.bytes of comm.dtype;
//   pipeline sends and receives: NCCL's send and receive of comm.bytes over the two-rank communicator of
//     the send's directed link (nccl_groups.h), the sends on the pipeline stream, each source stage's
//     receives on a CUDA stream of their own, enqueued at once in the sender's order; an op that needs a
//     received message waits on the device for its receive;
//   fused GEMM + collective: the fused kernel of its kind (kernels/cuda/fused/fused_gemm_comm.h, or with
//     FusedKernels::kCutlassPush the CUTLASS kernel where the kind has one, fused/push_gemm.h) at the
//     op's GEMM shape, its rows spread evenly over experts and ranks, on the group's NCCL symmetric memory
//     (made at construction; groups of at most 8 ranks in one NVLink domain); bf16 rows even when the plan
//     dispatches in FP8 (the fused kernels have no FP8 path).
// Three modes. kEnqueue (the default): run() puts the op's work on its stream's CUDA stream between two CUDA
// events of its own and returns; a dependency on an op of another stream is a cudaStreamWaitEvent on that
// op's end event (after()), and the host waits once per step (end_step()); each op's interval is its events'
// times from the step's start event (interval()). kHostSync: run() also waits for the op, so ops run one at a
// time and each op's time is the events' interval around its own work (device_seconds); every op boundary
// then costs a host round trip (7.3-8.8 us per op measured on H200s). Either way an op's interval includes
// the host's enqueue of its work where the device waited for it. kGraph: as kEnqueue in the first step
// (which makes every kernel object and buffer); the second step's enqueues are captured as one CUDA graph
// (the compute stream begins the capture and forks the other streams from it; each op's timing events become
// the graph's event record nodes), which is instantiated and launched; later steps launch the graph
// (replays_step), with no host work per op. The graph holds every argument as captured, so a plan whose
// shapes or counts change between steps (routing drawn over more than one EP rank) and the fused kernels
// (their signal epochs are host arguments) must not use it; moerun refuses them. The receive streams join the
// capture as the other streams do.
// run(), receive(), after() and after_receive() come from the stage executor's lane threads, new threads
// whose current device is device 0: each first makes the runner's device (current at construction) current
// on its thread, as a kernel must launch into a stream of the current device.
// Before the first step (prepare_step) a sizing pass runs every op of the stage once on the calling thread,
// with no communication, so that every scratch buffer, workspace and kernel object exists before any NCCL
// kernel is in flight: cudaMalloc and cudaFree synchronise the device, and a rank whose host waits there
// behind a receive from a peer that waits the same way would hang both. A buffer that drawn routing makes
// grow later is allocated stream-ordered (cudaMallocAsync) and the one it replaces freed at the next step's
// start.
#pragma once

#include <array>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "executor/comm/device_communicator.h"
#include "executor/runtime/op_runner.h"
#include "executor/runtime/routing_draw.h"
#include "simulator/core/model_spec.h"
#include "simulator/core/plan.h"

namespace moeplan::executor {

// This rank's NCCL communicator of a group kind; nullptr when the group has one rank.
using DeviceGroupLookup = std::function<DeviceCommunicator*(CommGroup)>;
// The two-rank communicator of the directed pipeline link a send goes over (its sender is rank 0, its
// receiver rank 1), on both of its ranks; nullptr where there is none.
using PipelineLinkLookup = std::function<DeviceCommunicator*(const Op& send)>;

// Empty when the CUDA replay runner can execute `plan` of `model`, else one phrase naming what it cannot do.
std::string cuda_unsupported(const Plan& plan, const ModelSpec& model);

class CudaReplayRunner final : public OpRunner {
 public:
  // Uses the current CUDA device. Creates one CUDA stream per op-graph stream, and one per stage that sends
  // `stage` pipeline messages (over a link `links` has). `graph` outlives the runner; this rank runs the ops
  // of `stage`: their fused ops' groups get symmetric memory here, collectively (every rank of a group must
  // construct its runner), and a fused op the kernels cannot run aborts here, naming the op; the stage's
  // parameter buffers are made here too. `links` is needed with pipeline parallelism.
  enum class Mode { kEnqueue, kHostSync, kGraph };
  // Which kernels run the fused ops: the wmma tile kernels of fused_gemm_comm.h (measured: the moerun stack
  // prices them), or, for the kinds that have one, the CUTLASS kernels of fused/push_gemm.h (grouped GEMM +
  // reduce-scatter as PushGemmCombine, GEMM + all-to-all as PushGemmAllToAll, all-gather + grouped GEMM as
  // GatherGemm; all-to-all + GEMM stays wmma).
  enum class FusedKernels { kWmma, kCutlassPush };
  CudaReplayRunner(DeviceGroupLookup groups, const OpGraph& graph, int stage, Mode mode = Mode::kEnqueue,
                   PipelineLinkLookup links = {}, FusedKernels fused_kernels = FusedKernels::kWmma);
  ~CudaReplayRunner() override;

  void run(const Op& op) override;
  void receive(const Op& send) override;
  double device_seconds(const Op& op) const override;
  bool enqueues() const override;
  bool replays_step() const override;
  void after(const Op& op, const Op& dep) override;
  void after_receive(const Op& op, const Op& send) override;
  void begin_step() override;
  void end_step() override;
  OpTiming interval(const Op& op) const override;
  void prepare_step() override;

  // Runs the routed ops of `spec.stage`'s MoE layers on routing drawn each step (routing_draw.h), as the CPU
  // replay does: each local expert's drawn rows in the grouped GEMMs (the counts in device memory), the drawn
  // counts in the EP all-to-alls, memory-bound ops over the experts' rows scaled to the rows received. Not
  // for fused ops (their kernels spread rows evenly; moerun does not draw for such plans).
  void draw_routing(RoutingDrawSpec spec);
  RoutingDraws::Stats routing_stats() const;

  // Memory-bound and optimizer ops run on their own kernel rather than a copy, over all steps so far.
  int64_t kernel_memory_ops() const;
  // FP8 GEMM ops run as e4m3, all steps so far: dense ones (weight gradients too) and the grouped expert
  // GEMMs' forward and data gradient (expert weight gradients run in bf16).
  int64_t fp8_gemm_ops() const;
  // The stage's parameter buffers' bytes: bf16 weights, fp32 main gradients, e4m3 weight copies.
  std::array<double, 3> parameter_bytes() const;
  // The stage's activation stashes (activation_layout.h): their bytes, and how many its chunks hold.
  std::array<double, 2> activation_stashes() const;
  // Device bytes this runner holds now and at most (scratch buffers, workspaces, kernel objects).
  double device_bytes() const;
  double device_high_water_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moeplan::executor
