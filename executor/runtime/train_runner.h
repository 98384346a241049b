// TrainRunner: the numerical OpRunner. It performs each op of this rank's op graph for real on this rank's
// shard of the model (fp32, moerun's CPU kernels), so `moerun run --runner train` trains the plan's model and
// must compute the losses and parameter updates of the single-rank ReferenceModel (reference_model.h).
//
// Data: step s trains sequences [s B, (s + 1) B) (B = global batch); the g-th micro-batch of the step holds
// sequences s B + g mb + [0, mb); attention data-parallel rank r runs micro-batches g = r n + j, j = 0..n-1
// (n = micro-batches per rank), and inside a micro-batch tp rank i holds token rows [i t, (i + 1) t)
// (t = mb seq / tp, sequence-major). Loss scaling as the reference: 1 / tokens of the global batch for CE,
// 1 / micro-batches of the global batch for the aux loss.
//
// Parameters live in buckets, one per (layer, group): the layer's attention-side ("dense") parameters,
// tp-sharded Megatron-style and replicated over the attention replicas (gradient sync over kAttnReplica), the
// layer's routed experts (this EP rank's experts, sync over kExpertDp), and two "outside" buckets: the
// embedding, and the head (final norm, lm_head). A bucket's flat buffer is padded to a multiple of its group
// size; with ZeRO >= 1 and a group of more than one rank, group rank i owns shard i (its Adam moments and the
// update).
//
// Pipeline parallelism: a rank holds the buckets of its stage only, as the op graph places them: the layers
// of its virtual stages (chunk c of stage s is virtual stage v = c pp + s, layers_per_virtual_stage), the
// embedding where virtual stage 0 runs (stage 0) and the head where the last one runs (stage pp - 1). A
// pipeline send carries the activation entering the next virtual stage's first layer (forward) or the
// gradient of this virtual stage's first layer's input (backward), [t, h] per micro-batch, to the pp group
// rank of the neighbouring stage; the receive writes it into the same slot of the receiver's per-micro-batch
// state. Gradient sync, ZeRO gathers and the optimizer run per stage over groups inside the stage.
//
// Where the op graph has no op for a reduction that the numerics need, the runner performs it inside the op
// named below (the lowering only models the bytes that dominate the step; these are small):
//   router (tp > 1): the all-reduce (sum over tp) of the router statistics of the aux loss;
//   optimizer: the gradients of the outside buckets (all-reduce over the ranks of the stage, as tp then the
//     attention replicas: the embedding and the head are kept whole on every rank of their stage, replicated
//     over tp, each rank holding different tokens), and the tp all-reduce of the tp-replicated,
//     sequence-split parameters (norms, router) inside this rank's shard;
//   EP dispatch: the per-expert row counts travel in a small all-to-all before the rows; with all-gather
//     dispatch the routes (expert ids and gates) are all-gathered with the tokens in the dispatch op, and the
//     gates' gradients return in its backward reduce-scatter.
// Activations cross the wire in fp32 (the runner computes in fp32 whatever `precision` says, as the reference
// does); compression settings that change numerics are either honoured or refused (train_unsupported). FP8
// dispatch is honoured: the dispatched rows cross as e4m3 with a scale per 128 values and their gradients as
// bf16, the formats the lowering sizes the messages with.
//
// Recompute ops re-run their forward handler (all activations are kept, so they reproduce the same values).
// ZeRO-2/3: wgrads write a per-micro-batch gradient buffer that the i-th sync op of the step reduces;
// parameter all-gathers always communicate but replace the parameters only after an optimizer step.
//
// Threads: ops of different streams may run at once (inter-operator overlap: collectives on the comm stream,
// shared experts on the side stream). State is preallocated per (micro-batch, layer) and per bucket, so ops
// the graph leaves unordered touch different objects; the reductions performed inside ops use their own
// communicators (`internal`), never one a graph collective of another stream may be using.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "executor/comm/communicator.h"
#include "executor/runtime/op_runner.h"
#include "executor/runtime/replay_runner.h"
#include "simulator/core/model_spec.h"
#include "simulator/core/op_graph.h"
#include "simulator/core/plan.h"
#include "simulator/core/status.h"

namespace moeplan::executor {

// This rank's index in each group it belongs to (RankLayout's indices).
struct TrainPlace {
  int world_rank = 0;
  int stage = 0;  // pipeline stage, also this rank's index in the pp group
  int tp = 0, sp = 0, cp = 0, dp = 0, ep = 0, etp = 0, attn_replica = 0, expert_dp = 0;
};

// Empty when the train runner can execute `plan` of `model`, else one phrase naming what it cannot do.
std::string train_unsupported(const Plan& plan, const ModelSpec& model);

struct TrainLoss {
  double total = 0, ce = 0, aux = 0;
};

class TrainRunner final : public OpRunner {
 public:
  // `groups(g)`: this rank's communicator of group kind g, nullptr when the group has one rank;
  // `internal(g)`: its twin (ProcessGroups::internal) for the reductions the runner performs inside ops,
  // likewise nullptr for one rank, and for kNone the world's twin; `world`: all ranks. Asserts
  // train_unsupported(plan, model) is empty.
  TrainRunner(const OpGraph& graph, const Plan& plan, const ModelSpec& model, TrainPlace place,
              GroupLookup groups, GroupLookup internal, Communicator& world);
  ~TrainRunner() override;

  void run(const Op& op) override;
  void receive(const Op& send) override;

  // After a step's ops have run (collective over the world): the step's loss, summed over all ranks.
  TrainLoss finish_step();

  // Collective over the world. On world rank 0: writes every parameter tensor, whole, to `path`, atomically:
  //   "MOERUNP1" (8 bytes), uint64 little-endian n, n bytes of JSON {"format": "moerun-params-v1", "params":
  //   [{"name", "rows", "cols", "offset"}]} (offset in values), then float32 little-endian values, each
  //   tensor row-major. Names and order are ReferenceModel's.
  Result<bool> dump_params(const std::string& path);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moeplan::executor
