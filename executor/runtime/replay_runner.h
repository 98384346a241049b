// ReplayRunner: performs each op with real work of its exact shape on this CPU rank, so measured op times are
// comparable with the simulator's predictions for the same op graph. fp32 everywhere in memory:
//   GEMM [m, k] x [k, n] (dgrad [m, n] x [n, k]^T, wgrad [k, m]^T x [m, n]); grouped: `groups` GEMMs of
//   ceil(m / groups) rows, each with its own [k, n] weight; attention: moerun's CPU
//   attention kernel (executor/kernels/cpu/attention.h, the one `moerun bench` measures) per sequence and
//   per call that does the op's work (attention_calls: its heads and K/V heads, value head dim, mask and key
//   count; context parallelism's parts), backward from a stored output and log-sum-exp; memory-bound ops move
//   hbm_bytes as STREAM triad, the bench's loop, over fp32 (hbm_bytes / 12 elements); the optimizer an Adam
//   update over hbm_bytes / 30 parameters; collectives and pipeline sends over the group's Communicator with
//   comm.bytes / bytes_of(comm.dtype) fp32 values and the wire format matching comm.dtype (bf16 and fp16 ->
//   kBf16, fp8 -> kFp8E4m3), so the bytes crossing the wire are the op's bytes; a fused GEMM + collective
//   runs its GEMM, then its collective (no tile-level overlap on the CPU).
// Routing: the graph's routed ops carry the busiest EP rank's rows (the prediction's expert_load_scale), so
// by default every rank runs them. With draw_routing(), each step draws the EP group's routing from the
// plan's distribution (routing_draw.h) before the step's clock starts, and the routed ops of each MoE layer
// and micro-batch run what the draw gives this rank: each local expert's GEMM its own rows, the EP
// all-to-alls (dispatch, probs and combine, fused or not) the counts the ranks exchange, and the memory-bound
// ops over the experts' rows (activation, bias, scatter, gather, chunk sorts) their bytes scaled by the rows
// received over the lowered rows.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "executor/comm/communicator.h"
#include "executor/runtime/op_runner.h"
#include "executor/runtime/routing_draw.h"

namespace moeplan::executor {

// This rank's communicator of a group kind; nullptr when the rank has no peers in it (group size 1).
using GroupLookup = std::function<Communicator*(CommGroup)>;

class ReplayRunner final : public OpRunner {
 public:
  // `pp_rank_of_stage(s)`: the pp group's rank of pipeline stage s (identity when groups rank by stage).
  ReplayRunner(const OpGraph& graph, GroupLookup groups, std::function<int(int)> pp_rank_of_stage = {});

  void run(const Op& op) override;
  void receive(const Op& send) override;
  // Draws this step's routing (with draw_routing), before the step's clock starts.
  void prepare_step() override;

  // Runs the routed ops of `spec.stage`'s MoE layers on routing drawn each step (see the header).
  void draw_routing(RoutingDrawSpec spec);

  // The draws' statistics so far (see RoutingDraws::stats); empty without draw_routing().
  using RoutingStats = RoutingDraws::Stats;
  RoutingStats routing_stats() const;

  // Bytes held in scratch buffers now (bounded by kScratchCapBytes per lane).
  double scratch_bytes() const;

  // What the attention kernel was given so far: its calls (one per sequence and call of attention_calls),
  // those that ran the backward kernel, and the query rows, key rows and value columns (K/V heads x value
  // head dim) of all calls, summed.
  struct AttentionWork {
    int64_t kernel_calls = 0;
    int64_t backward_calls = 0;
    int64_t query_rows = 0;
    int64_t key_rows = 0;
    int64_t value_cols = 0;
  };
  AttentionWork attention_work() const { return attention_work_; }

  // The matrix products the GEMM ops ran so far (one per group with rows) and their FLOPs, 2 x rows x inner
  // x columns of the operands each was given.
  struct GemmWork {
    int64_t products = 0;
    double flops = 0;
  };
  GemmWork gemm_work() const { return gemm_work_; }

  static constexpr double kScratchCapBytes = 1.0 * (1u << 30);

 private:
  // Scratch buffers of one lane (ops of one stream run one at a time, so a lane's buffers are never shared).
  struct Scratch {
    std::vector<std::vector<float>> slots;
    std::span<float> get(size_t slot, size_t n);
    double bytes() const;
  };
  Scratch& scratch_for(size_t lane) { return scratch_[lane]; }

  void gemm(const Op& op, Scratch& s);
  void attention(const Op& op, Scratch& s);
  void memory_bound(double bytes, Scratch& s);
  void optimizer(const Op& op, Scratch& s);
  void collective(const Op& op, Scratch& s);

  const OpGraph& graph_;
  GroupLookup groups_;
  std::function<int(int)> pp_rank_of_stage_;
  std::vector<Scratch> scratch_;         // kNumStreams lanes + one per source stage of pipeline receives
  std::optional<RoutingDraws> routing_;  // set by draw_routing()
  AttentionWork attention_work_;
  GemmWork gemm_work_;
};

// Values of a communication buffer: comm.bytes / bytes_of(comm.dtype), rounded up to a multiple of
// `group_size` so that every rank's share is whole.
int64_t comm_values(const CommSpec& comm, int group_size);
WireFormat wire_format_of(DType dtype);

}  // namespace moeplan::executor
