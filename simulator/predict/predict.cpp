// The simulator's one way through: plan -> op graph -> op costs -> timeline -> report numbers.
#include "simulator/predict/predict.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <initializer_list>
#include <unordered_map>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <fmt/format.h>

#include "simulator/core/model_stats.h"
#include "simulator/engine/topology.h"
#include "simulator/workload/lower.h"

namespace moeplan {
namespace {

// Ops with equal cost-relevant fields cost the same; a step repeats each op once per micro-batch, so the
// costs are computed once per distinct op.
struct CostKey {
  uint64_t h;
  bool operator==(const CostKey& o) const { return h == o.h; }
};
struct CostKeyHash {
  size_t operator()(const CostKey& k) const { return static_cast<size_t>(k.h); }
};

uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  return h;
}
uint64_t bits(double x) {
  uint64_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

CostKey cost_key(const Op& op) {
  uint64_t h = 1469598103934665603ULL;
  h = mix(h, static_cast<uint64_t>(op.kind) | (static_cast<uint64_t>(op.dtype) << 8) |
                 (static_cast<uint64_t>(op.part) << 16) | (static_cast<uint64_t>(op.phase) << 24) |
                 (static_cast<uint64_t>(op.mem) << 32) | (static_cast<uint64_t>(op.name) << 40));
  h = mix(h, bits(op.flops));
  h = mix(h, bits(op.hbm_bytes));
  for (int64_t v : std::initializer_list<int64_t>{op.gemm.m, op.gemm.n, op.gemm.k, op.gemm.groups,
                                                  op.attn.seq_kv, op.attn.window, op.attn.qk_dim,
                                                  op.attn.causal, op.comm.group_size, op.comm.stride}) {
    h = mix(h, static_cast<uint64_t>(v));
  }
  h = mix(h, static_cast<uint64_t>(op.comm.collective) | (static_cast<uint64_t>(op.comm.group) << 8));
  h = mix(h, bits(op.comm.bytes));
  h = mix(h, bits(op.comm.nic_bytes_scale));
  h = mix(h, bits(op.aux_bytes));
  h = mix(h, static_cast<uint64_t>(op.kernels) | (static_cast<uint64_t>(op.host_sync) << 16) |
                 (static_cast<uint64_t>(op.comm.node_dedup) << 17) |
                 (static_cast<uint64_t>(op.stream) << 24));
  return {h};
}

}  // namespace

double StepBreakdown::total() const {
  double t = bubble + optimizer;
  for (const auto& [k, v] : compute) t += v;
  for (const auto& [k, v] : exposed_comm) t += v;
  return t;
}

// Sweep over the stage's timeline: each instant goes to the compute ops running (split evenly), else to the
// communication running (split evenly by group), else to the bubble.
StepBreakdown stage_breakdown(const OpGraph& graph, const std::vector<cost::OpCost>& costs,
                              const engine::Timeline& timeline, int64_t stage) {
  std::vector<int32_t> ids;
  for (const Op& op : graph.ops) {
    if (op.stage == stage) ids.push_back(op.id);
  }
  return stage_breakdown(graph, costs, timeline, ids);
}

StepBreakdown stage_breakdown(const OpGraph& graph, const std::vector<cost::OpCost>& costs,
                              const engine::Timeline& timeline, const std::vector<int32_t>& stage_ops) {
  struct Edge {
    double t;
    int32_t op;
    bool start;
  };
  std::vector<Edge> edges;
  edges.reserve(2 * stage_ops.size());
  for (int32_t id : stage_ops) {
    const auto& tm = timeline.ops[static_cast<size_t>(id)];
    if (tm.end <= tm.start) continue;
    edges.push_back({tm.start, id, true});
    edges.push_back({tm.end, id, false});
  }
  std::sort(edges.begin(), edges.end(), [](const Edge& a, const Edge& b) {
    return a.t != b.t ? a.t < b.t : (a.start != b.start ? !a.start : a.op < b.op);
  });
  // Accumulate by op kind and comm group index, then name them.
  constexpr size_t kKinds = static_cast<size_t>(OpKind::kOptimizer) + 1;
  constexpr size_t kGroups = static_cast<size_t>(CommGroup::kPp) + 1;
  std::array<double, kKinds> by_kind{};
  std::array<double, kGroups> by_group{};
  double bubble = 0;
  std::vector<int32_t> compute, comm;
  double prev = 0;
  auto attribute = [&](double span) {
    if (span <= 0) return;
    if (!compute.empty()) {
      const double share = span / static_cast<double>(compute.size());
      for (int32_t id : compute)
        by_kind[static_cast<size_t>(graph.ops[static_cast<size_t>(id)].kind)] += share;
    } else if (!comm.empty()) {
      const double share = span / static_cast<double>(comm.size());
      for (int32_t id : comm)
        by_group[static_cast<size_t>(graph.ops[static_cast<size_t>(id)].comm.group)] += share;
    } else {
      bubble += span;
    }
  };
  for (const Edge& e : edges) {
    attribute(e.t - prev);
    prev = e.t;
    auto& set = costs[static_cast<size_t>(e.op)].resource == cost::Resource::kSm ? compute : comm;
    if (e.start) {
      set.push_back(e.op);
    } else {
      set.erase(std::find(set.begin(), set.end(), e.op));
    }
  }
  attribute(timeline.step_time - prev);  // the stage idles until the slowest stage ends
  StepBreakdown b;
  b.bubble = bubble;
  for (size_t k = 0; k < kKinds; ++k) {
    if (by_kind[k] <= 0) continue;
    if (static_cast<OpKind>(k) == OpKind::kOptimizer) {
      b.optimizer = by_kind[k];
    } else {
      b.compute[name_of(static_cast<OpKind>(k))] = by_kind[k];
    }
  }
  for (size_t g = 0; g < kGroups; ++g) {
    if (by_group[g] > 0) b.exposed_comm[name_of(static_cast<CommGroup>(g))] = by_group[g];
  }
  return b;
}

cost::MemoryBreakdown predict_memory(const ModelSpec& model, const Plan& plan, const HardwareProfile& hw,
                                     const StackProfile& stack,
                                     const workload::RoutingDistribution& routing) {
  const Plan run = with_stack_overlaps(plan, stack, nullptr);
  return cost::memory_per_gpu(model, run, hw, stack, in_flight_by_chunk(model, run),
                              workload::plan_routing(model, plan, routing).scale);
}

Prediction predict(const ModelSpec& model, const Plan& plan, const HardwareProfile& hw,
                   const StackProfile& stack, const workload::RoutingDistribution& routing,
                   const PredictOptions& options) {
  Prediction r;
  r.violations = validate(plan, model, hw);
  for (Violation& v : validate_for_stack(plan, stack)) r.violations.push_back(std::move(v));
  if (!r.violations.empty()) return r;
  // The plan as the stack runs it (overlaps the stack does not achieve get no credit), its lowering facts and
  // the busiest EP rank's share of one micro-batch's token-expert assignments: the same lowering moerun runs.
  StackLowering sl = stack_lowering(model, plan, hw, stack, routing);
  r.effective_plan = std::move(sl.run);
  for (std::string& n : sl.notices) r.notices.push_back(std::move(n));
  const Plan& run = r.effective_plan;
  r.routing = sl.routing.load;
  const LoweringOptions& lo = sl.options;
  r.graph = lower(model, run, lo);

  // Costs, once per distinct op. Pipeline sends take the path between the stages' ranks on the cluster
  // graph (same node: NVLink; otherwise NIC, leaf, maybe spine), bounded by its slowest link.
  const cost::CostModel cm(hw, stack);
  std::vector<engine::Path> paths;
  if (run.pipeline.pp > 1) {
    const engine::Topology topo(hw, run.gpus);
    const int64_t per_stage = run.gpus / run.pipeline.pp;
    for (int64_t s = 0; s + 1 < run.pipeline.pp; ++s)
      paths.push_back(topo.path(s * per_stage, (s + 1) * per_stage));
  }
  std::unordered_map<CostKey, cost::OpCost, CostKeyHash> cache;
  r.costs.resize(r.graph.ops.size());
  for (const Op& op : r.graph.ops) {
    auto& c = r.costs[static_cast<size_t>(op.id)];
    if (op.kind == OpKind::kSendRecv && !paths.empty()) {
      // Forward sends go to stage + 1, backward sends to stage - 1 (the same link, reversed); interleaved
      // chunks wrap from the last stage to the first over the same kind of path.
      const int64_t link = op.phase == Phase::kForward ? op.stage : op.stage - 1;
      const engine::Path& path =
          paths[static_cast<size_t>(std::clamp<int64_t>(link, 0, run.pipeline.pp - 2))];
      c = cm.cost(op);
      const bool remote = path.crosses_nodes();
      const double hop = remote ? hw.scale_out.net_latency_s.value : hw.node.nvlink_latency_s.value;
      c.seconds = stack.launch_s_per_kernel.value + stack.host_s_per_micro_batch.value / 2.0 +
                  hop * static_cast<double>(path.links.size() - 1) +
                  op.comm.bytes / path.bottleneck_bytes_per_s();
      c.resource = remote ? cost::Resource::kNic : cost::Resource::kNvlink;
      c.link_bytes_per_s = op.comm.bytes / c.seconds;
      c.sm_fraction = stack.comm_sm_fraction.value;
      continue;
    }
    const CostKey key = cost_key(op);
    auto it = cache.find(key);
    if (it == cache.end()) it = cache.emplace(key, cm.cost(op)).first;
    c = it->second;
  }
  engine::EngineOptions eo;
  eo.hbm_bytes_per_s = hw.gpu.hbm_bw_achieved_bytes_per_s.value;
  eo.overlap_compute_efficiency = stack.overlap_compute_efficiency.value;
  r.timeline = engine::simulate(r.graph, r.costs, eo);
  r.extrapolations = cm.extrapolations();

  r.step_time_s = r.timeline.step_time;
  r.tokens_per_step = static_cast<double>(plan.global_batch * plan.seq_len);
  r.tokens_per_s = r.tokens_per_step / r.step_time_s;
  r.tokens_per_s_per_gpu = r.tokens_per_s / static_cast<double>(plan.gpus);
  r.model_flops_per_step = flops_per_token(model, plan.seq_len).train_step * r.tokens_per_step;
  // MFU against the dense peak of the precision the plan computes in (FP8 plans: the FP8 peak, when the
  // profile has one), and against the BF16 peak for comparison across precisions.
  const double gpu_seconds = r.step_time_s * static_cast<double>(plan.gpus);
  r.mfu_bf16 = r.model_flops_per_step / (gpu_seconds * hw.gpu.peak_flops_per_s.at("bf16").value);
  r.mfu_peak_dtype = mfu_peak_dtype(plan, hw);
  r.mfu = r.model_flops_per_step / (gpu_seconds * hw.gpu.peak_flops_per_s.at(r.mfu_peak_dtype).value);

  // Memory: activations of the chunks in flight at each stage's peak under its schedule.
  r.memory =
      cost::memory_per_gpu(model, run, hw, stack, in_flight_by_chunk(model, run), lo.expert_load_scale);

  // The breakdown shown is the busiest stage's: the one whose ops' summed durations are largest (it sets the
  // pipeline's pace; the others wait for it in the bubble).
  std::vector<double> busy(static_cast<size_t>(run.pipeline.pp), 0.0);
  std::vector<std::vector<int32_t>> stage_ops(static_cast<size_t>(run.pipeline.pp));
  for (const Op& op : r.graph.ops) {
    const auto i = static_cast<size_t>(op.id);
    stage_ops[static_cast<size_t>(op.stage)].push_back(op.id);
    if (r.costs[i].resource == cost::Resource::kSm)
      busy[static_cast<size_t>(op.stage)] += r.timeline.ops[i].end - r.timeline.ops[i].start;
  }
  r.critical_stage = std::max_element(busy.begin(), busy.end()) - busy.begin();
  r.breakdown =
      stage_breakdown(r.graph, r.costs, r.timeline, stage_ops[static_cast<size_t>(r.critical_stage)]);

  // Uncertainty: each op on the critical path may be off by its curve's fit error (errors of one curve move
  // together, so they add): step in [T - sum e_i d_i, T + sum e_i d_i].
  r.tokens_per_s_low = r.tokens_per_s_high = r.tokens_per_s;
  if (options.critical_path) {
    r.critical_path = engine::critical_path(r.timeline);
    double spread = 0;
    for (int32_t id : r.critical_path) {
      const auto& tm = r.timeline.ops[static_cast<size_t>(id)];
      spread += r.costs[static_cast<size_t>(id)].rel_error * (tm.end - tm.start);
    }
    spread = std::min(spread, 0.9 * r.step_time_s);
    r.tokens_per_s_low = r.tokens_per_step / (r.step_time_s + spread);
    r.tokens_per_s_high = r.tokens_per_step / (r.step_time_s - spread);
    // Provenance: the critical path's time by the basis of the stack numbers that priced each op.
    std::array<double, 4> by_basis{};
    double total = 0;
    for (int32_t id : r.critical_path) {
      const auto& tm = r.timeline.ops[static_cast<size_t>(id)];
      const double dur = tm.end - tm.start;
      by_basis[static_cast<size_t>(r.costs[static_cast<size_t>(id)].basis)] += dur;
      total += dur;
    }
    if (total > 0) {
      r.provenance.measured = by_basis[0] / total;
      r.provenance.derived = by_basis[1] / total;
      r.provenance.assumed = by_basis[2] / total;
      r.provenance.target = by_basis[3] / total;
      if (by_basis[3] > 0) {
        r.provenance.targets.push_back(
            fmt::format("{:.0f}% of the critical path is priced by stack numbers that are targets",
                        100 * r.provenance.target));
      }
    }
  }
  // An overlap the plan uses and the stack only has as a target credits unmeasured hiding.
  auto target_overlap = [&](bool used, const Stated<bool>& has, const char* key) {
    if (used && has.value && has.basis == Basis::kTarget) {
      r.provenance.targets.push_back(
          fmt::format("overlap.{} is a target of stack {}, not measured: {}", key, stack.name, has.source));
    }
  };
  target_overlap(run.overlap.inter_op, stack.overlaps.inter_op, "inter_op");
  target_overlap(run.overlap.intra_op, stack.overlaps.intra_op, "intra_op");
  target_overlap(run.overlap.dp_comm, stack.overlaps.dp_comm, "dp_comm");
  target_overlap(run.overlap.pp_comm, stack.overlaps.pp_comm, "pp_comm");
  target_overlap(run.overlap.cross_micro_batch, stack.overlaps.cross_micro_batch, "cross_micro_batch");
  r.provenance.hypothetical = !r.provenance.targets.empty();
  return r;
}

void retain_freed_memory() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's largest: arrays below it come from the heap
  mallopt(M_TRIM_THRESHOLD, 1 << 30);   // and freed heap stays mapped for the next prediction
#endif
}

}  // namespace moeplan
