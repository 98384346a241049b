// The simulator's one way through: plan -> op graph -> op costs -> timeline -> report numbers.
#include "simulator/predict/predict.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <deque>
#include <mutex>
#include <optional>
#include <unordered_map>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <fmt/format.h>

#include "simulator/core/model_stats.h"
#include "simulator/core/parallel.h"
#include "simulator/cost/cost_cache.h"
#include "simulator/engine/topology.h"
#include "simulator/predict/periodic.h"
#include "simulator/workload/lower.h"

namespace moeplan {

double StepBreakdown::total() const {
  double t = bubble + optimizer;
  for (const auto& [k, v] : compute) t += v;
  for (const auto& [k, v] : exposed_comm) t += v;
  return t;
}

// Sweep over the stage's timeline: each instant goes to the compute ops running (split evenly), else to the
// communication running (split evenly by group), else to the bubble; an idle stretch that ends with an op
// starting the moment the host issued it is the host's (host_wait, inside the bubble).
StepBreakdown stage_breakdown(const OpGraph& graph, const std::vector<cost::OpCost>& costs,
                              const engine::Timeline& timeline, int64_t stage) {
  return stage_breakdown(graph, costs, timeline, stage_ops(graph, stage));
}

StepBreakdown stage_breakdown(const OpGraph& graph, const std::vector<cost::OpCost>& costs,
                              const engine::Timeline& timeline, const std::vector<int32_t>& ids) {
  // Each edge carries what the sweep attributes its op's time to (its kind on the SMs, else its
  // communication group), read once per op here rather than once per span in the sweep.
  struct Edge {
    double t;
    int32_t op;
    bool start;
    bool sm;       // runs on the SMs (compute), else communication
    uint8_t slot;  // the OpKind (compute) or CommGroup (communication) its time goes to
  };
  struct Running {
    int32_t op;
    uint8_t slot;
  };
  // Edges in time order, ends before starts at one time, then by op: one order, whatever the input order.
  auto before = [](const Edge& a, const Edge& b) {
    return a.t != b.t ? a.t < b.t : (a.start != b.start ? !a.start : a.op < b.op);
  };
  // A stream runs its ops one after another in id order, so each stream's edges (start, end, next start,
  // ...) arrive in that order already: merged stream by stream instead of sorted (a timeline where they do
  // not, one built by hand, is sorted).
  std::array<std::vector<Edge>, kNumStreams> by_stream;
  for (auto& v : by_stream) v.reserve(2 * ids.size() / kNumStreams + 16);
  bool in_order = true;
  for (int32_t id : ids) {
    const auto i = static_cast<size_t>(id);
    const auto& tm = timeline.ops[i];
    if (tm.end <= tm.start) continue;
    const Op& op = graph.ops[i];
    const bool sm = costs[i].resource == cost::Resource::kSm;
    const auto slot =
        static_cast<uint8_t>(sm ? static_cast<uint8_t>(op.kind) : static_cast<uint8_t>(op.comm.group));
    std::vector<Edge>& v = by_stream[static_cast<size_t>(op.stream)];
    const Edge start{tm.start, id, true, sm, slot};
    in_order = in_order && (v.empty() || before(v.back(), start));
    v.push_back(start);
    v.push_back({tm.end, id, false, sm, slot});
  }
  std::vector<Edge> edges, merged;
  edges.reserve(2 * ids.size());
  merged.reserve(2 * ids.size());
  for (const auto& v : by_stream) {
    if (v.empty()) continue;
    merged.clear();
    std::merge(edges.begin(), edges.end(), v.begin(), v.end(), std::back_inserter(merged), before);
    edges.swap(merged);
  }
  if (!in_order) std::sort(edges.begin(), edges.end(), before);
  // Accumulate by op kind and comm group index, then name them.
  constexpr size_t kKinds = static_cast<size_t>(OpKind::kOptimizer) + 1;
  constexpr size_t kGroups = static_cast<size_t>(CommGroup::kPp) + 1;
  std::array<double, kKinds> by_kind{};
  std::array<double, kGroups> by_group{};
  double bubble = 0, host_wait = 0;
  std::vector<Running> compute, comm;
  double prev = 0;
  // `next`: the edge that ends the span (null at the end of the step).
  auto attribute = [&](double span, const Edge* next) {
    if (span <= 0) return;
    if (!compute.empty()) {
      const double share = span / static_cast<double>(compute.size());
      for (const Running& r : compute) by_kind[r.slot] += share;
    } else if (!comm.empty()) {
      const double share = span / static_cast<double>(comm.size());
      for (const Running& r : comm) by_group[r.slot] += share;
    } else {
      bubble += span;
      if (next && next->start && timeline.issued[static_cast<size_t>(next->op)] >= next->t) host_wait += span;
    }
  };
  for (const Edge& e : edges) {
    attribute(e.t - prev, &e);
    prev = e.t;
    auto& set = e.sm ? compute : comm;
    if (e.start) {
      set.push_back({e.op, e.slot});
    } else {
      set.erase(std::find_if(set.begin(), set.end(), [&](const Running& r) { return r.op == e.op; }));
    }
  }
  attribute(timeline.step_time - prev, nullptr);  // the stage idles until the slowest stage ends
  StepBreakdown b;
  b.bubble = bubble;
  b.host_wait = host_wait;
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
                              workload::plan_routing(model, plan, routing).memory_scale());
}

namespace {

// A routed all-to-all whose busiest rank receives more than the mean (priced by the hot-receiver rule).
bool is_hot_routed(const Op& op) {
  return (op.kind == OpKind::kCollective || op.kind == OpKind::kFusedGemmComm) && op.comm.hot_routed();
}

std::shared_ptr<LoweredGraph> lower_with_keys(const ModelSpec& model, const Plan& run,
                                              const LoweringOptions& lo, bool indexed) {
  auto out = std::make_shared<LoweredGraph>();
  out->graph = lower(model, run, lo);
  if (indexed) {
    out->index_with_keys();
  } else {
    out->cost_keys.reserve(out->graph.ops.size());
    const auto& ops = out->graph.ops;
    std::vector<int32_t>& hot = out->hot_routed.emplace();
    for (size_t i = 0; i < ops.size(); ++i) {
      prefetch_op_ahead(ops, i, /*whole=*/true);
      out->cost_keys.push_back(cost::cost_fields_hash(ops[i]));
      if (is_hot_routed(ops[i])) hot.push_back(static_cast<int32_t>(i));
    }
  }
  return out;
}

}  // namespace

const StreamIndex& LoweredGraph::streams() const {
  std::call_once(streams_once_, [&] { streams_.emplace(graph, cost_keys); });
  return *streams_;
}

void LoweredGraph::index_with_keys() {
  std::call_once(streams_once_, [&] { streams_.emplace(StreamIndex::with_keys(graph, cost_keys)); });
}

std::shared_ptr<const LoweredGraph> LoweringCache::find(const ModelSpec& model, const Plan& run,
                                                        const LoweringOptions& options) {
  for (const Entry& e : entries_) {
    if (e.model == &model && e.options == options && e.run == run) {
      ++reused_;
      return e.graph;
    }
  }
  return nullptr;
}

std::shared_ptr<const LoweredGraph> LoweringCache::get(const ModelSpec& model, const Plan& run,
                                                       const LoweringOptions& options, bool indexed) {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (auto hit = find(model, run, options)) return hit;
  }
  // Lowered outside the lock (threads lowering other plans go on); a thread that lowered the same graph
  // meanwhile wins, and this one's is dropped.
  std::shared_ptr<const LoweredGraph> graph = lower_with_keys(model, run, options, indexed);
  const std::lock_guard<std::mutex> lock(mutex_);
  if (auto hit = find(model, run, options)) return hit;
  ++lowered_;
  entries_.push_back({&model, run, options, graph});
  return graph;
}

int64_t LoweringCache::lowered() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return lowered_;
}

int64_t LoweringCache::reused() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return reused_;
}

namespace {

// One simulated run: the op graph of `run` with its ops' cost keys, each op's cost and the timeline. The
// graph is this run's own (`owned`) or shared through a LoweringCache.
struct Run {
  std::shared_ptr<LoweredGraph> owned;
  std::shared_ptr<const LoweredGraph> lowered;
  std::vector<cost::OpCost> costs;
  engine::Timeline timeline;

  const OpGraph& graph() const { return lowered->graph; }
  // Each op's cost key: what pricing looks up and the op-by-op check compares.
  const std::vector<uint64_t>& cost_keys() const { return lowered->cost_keys; }
  // `indexed`: the run will be checked op by op (see LoweredGraph::streams).
  void lower_from(const ModelSpec& model, const Plan& run, const LoweringOptions& lo, LoweringCache* cache,
                  bool indexed) {
    if (cache) {
      owned.reset();
      lowered = cache->get(model, run, lo, indexed);
    } else {
      owned = lower_with_keys(model, run, lo, indexed);
      lowered = owned;
    }
  }
};

// What every run of one plan shares: the cost model with its costs so far (once per distinct op), and the
// path between consecutive pipeline stages' ranks on the cluster graph (same node: NVLink; otherwise NIC,
// leaf, maybe spine), bounded by its slowest link.
class Pricing {
 public:
  Pricing(const Plan& run, const HardwareProfile& hw, const StackProfile& stack,
          std::shared_ptr<const cost::CostModel::HardwareFit> fit)
      : hw_(hw), stack_(stack), cm_(hw, stack, std::move(fit)), cache_(cm_) {
    if (run.pipeline.pp > 1) {
      const engine::Topology topo(hw, run.gpus);
      const int64_t per_stage = run.gpus / run.pipeline.pp;
      for (int64_t s = 0; s + 1 < run.pipeline.pp; ++s)
        paths_.push_back(topo.path(s * per_stage, (s + 1) * per_stage));
    }
  }

  Run simulate(const ModelSpec& model, const Plan& run, const LoweringOptions& lo, LoweringCache* cache) {
    Run r;
    r.lower_from(model, run, lo, cache, false);
    price(r);
    time(r);
    return r;
  }

  // Each op's cost, from the cache where an equal op was priced before (one caller at a time).
  void price(Run& r) {
    const OpGraph& g = r.graph();
    // Appended in id order (ops are stored by id), each written once.
    r.costs.clear();
    r.costs.reserve(g.ops.size());
    for (size_t i = 0; i < g.ops.size(); ++i) {
      prefetch_op_ahead(g.ops, i);
      const Op& op = g.ops[i];
      r.costs.push_back(op.kind == OpKind::kSendRecv && !paths_.empty()
                            ? send_cost(op, g.num_stages)
                            : cache_.cost(op, r.cost_keys()[static_cast<size_t>(op.id)]));
    }
  }

  // The run's timeline from its priced graph (runs may be timed at once).
  void time(Run& r) const {
    engine::EngineOptions eo;
    eo.hbm_bytes_per_s = hw_.gpu.hbm_bw_achieved_bytes_per_s.value;
    eo.overlap_compute_efficiency = stack_.overlap_compute_efficiency.value;
    r.timeline = engine::simulate(r.graph(), r.costs, eo);
  }

  // The cost model's inputs outside its measured ranges, over every run.
  std::vector<std::string> extrapolations() const { return cm_.extrapolations(); }

 private:
  // Forward sends go to stage + 1, backward sends to stage - 1 (the same link, reversed); interleaved chunks
  // wrap from the last stage to the first over the same kind of path.
  cost::OpCost send_cost(const Op& op, int64_t pp) const {
    const int64_t link = op.phase == Phase::kForward ? op.stage : op.stage - 1;
    const engine::Path& path = paths_[static_cast<size_t>(std::clamp<int64_t>(link, 0, pp - 2))];
    cost::OpCost c = cm_.cost(op);
    const bool remote = path.crosses_nodes();
    const double hop = remote ? hw_.scale_out.net_latency_s.value : hw_.node.nvlink_latency_s.value;
    c.seconds = stack_.launch_s_per_kernel.value + stack_.host_s_per_micro_batch.value / 2.0 +
                hop * static_cast<double>(path.links.size() - 1) +
                op.comm.bytes / path.bottleneck_bytes_per_s();
    c.resource = remote ? cost::Resource::kNic : cost::Resource::kNvlink;
    c.link_bytes_per_s = op.comm.bytes / c.seconds;
    c.sm_fraction = stack_.comm_sm_fraction.value;
    return c;
  }

  const HardwareProfile& hw_;
  const StackProfile& stack_;
  const cost::CostModel cm_;
  std::vector<engine::Path> paths_;
  cost::CostCache cache_;  // each distinct op priced once
};

// The group shapes of the graph's routed all-to-alls under skewed routing and what priced them (the rule of
// CostModel::collective_seconds: a table of the shape with a uniform row, else the busiest rank's bytes).
// `lowered`'s hot routed ops where it found them, else every op read again.
std::vector<Prediction::HotExchange> hot_exchanges_of(const LoweredGraph& lowered,
                                                      const HardwareProfile& hw) {
  const OpGraph& g = lowered.graph;
  std::vector<int32_t> every;
  if (!lowered.hot_routed) {
    for (size_t i = 0; i < g.ops.size(); ++i) {
      prefetch_op_ahead(g.ops, i);
      if (is_hot_routed(g.ops[i])) every.push_back(static_cast<int32_t>(i));
    }
  }
  std::vector<Prediction::HotExchange> out;
  for (int32_t id : lowered.hot_routed ? *lowered.hot_routed : every) {
    const CommSpec& c = g.ops[static_cast<size_t>(id)].comm;
    const cost::Placement pl = cost::place_group(c.group_size, c.stride, hw.node.gpus_per_node.value);
    if (pl.ranks <= 1) continue;
    auto row = std::find_if(out.begin(), out.end(), [&](const Prediction::HotExchange& e) {
      return e.ranks == pl.ranks && e.nodes == pl.nodes;
    });
    if (row == out.end()) {
      Prediction::HotExchange e{pl.ranks, pl.nodes, c.hot_factor, {}};
      const AllToAllSkewTable* t = cost::skew_table(hw.calibration.alltoall_skew, pl.ranks, pl.nodes);
      if (t && cost::hot_receiver_slowdown(*t, c.bytes / c.hot_factor, c.hot_factor))
        e.table_source = t->source;
      out.push_back(std::move(e));
    } else {
      row->hot_factor = std::max(row->hot_factor, c.hot_factor);
    }
  }
  return out;
}

StepFigures figures_of(const Run& r, int64_t stage, const PredictOptions& options) {
  StepFigures f;
  f.step_time = r.timeline.step_time;
  f.events = r.timeline.events;
  f.ops = static_cast<int64_t>(r.graph().ops.size());
  f.stage_end = r.timeline.stage_end;
  f.breakdown = stage_breakdown(r.graph(), r.costs, r.timeline, stage);
  if (options.critical_path) {
    f.critical_path = engine::critical_path(r.timeline);
    for (int32_t id : f.critical_path) {
      const auto i = static_cast<size_t>(id);
      const Op& op = r.graph().ops[i];
      const double dur = r.timeline.ops[i].end - r.timeline.ops[i].start;
      f.spread += r.costs[i].rel_error * dur;
      f.by_basis[static_cast<size_t>(r.costs[i].basis)] += dur;
      const bool is_comm = op.kind == OpKind::kCollective || op.kind == OpKind::kSendRecv;
      f.cp_seconds[is_comm ? std::string("comm_") + name_of(op.comm.group) : std::string(name_of(op.kind))] +=
          dur;
    }
    f.cp_ops = static_cast<int64_t>(f.critical_path.size());
  }
  if (options.op_summary) f.summary = op_summary(r.graph(), r.timeline.ops);
  return f;
}

// The micro-batches after which the steady phase repeats (Megatron's interleaved schedule cycles through the
// chunks in groups of pp micro-batches) and the smallest batch whose step has a steady phase past the fill
// (DualPipeV needs 2 pp micro-batches before its steady phase has one pair).
int64_t period_micro_batches(const Plan& p) {
  return p.pipeline.schedule == Schedule::kInterleaved1F1B ? p.pipeline.pp : 1;
}
int64_t first_window(const Plan& p) {
  const int64_t pp = p.pipeline.pp;
  return p.pipeline.schedule == Schedule::kDualPipeV ? 2 * pp + 1 : pp + period_micro_batches(p);
}

Plan with_micro_batches(Plan p, int64_t m) {
  p.global_batch = m * p.micro_batch * p.dp();
  return p;
}

// Tries the periodic steady state: the runs at m0 + d and m0 + 2d, checked op by op to be one period apart;
// where they are not, also the run at m0, with the three runs' figures' second differences checked instead,
// sliding on by one period while a figure does not repeat. Returns the figures of the whole step and, in
// `first`, the first run; or nothing, with the reason in sim.why_full, when the whole step is cheaper or the
// figures never repeat.
std::optional<StepFigures> extrapolate_step(const ModelSpec& model, const Plan& run,
                                            const LoweringOptions& lo, const HardwareProfile& hw,
                                            Pricing& pricing, const PredictOptions& options,
                                            StepSimulation& sim, Run& first, int64_t& critical_stage) {
  constexpr int kMaxSlides = 3;
  const int64_t m = run.num_micro_batches(), d = period_micro_batches(run);
  int64_t m0 = first_window(run);
  m0 += (m - m0) % d == 0 ? 0 : d - (m - m0) % d;
  // Two runs of m0 + d and m0 + 2d micro-batches save time over the whole step beyond 2 m0 + 3d of them; the
  // three-run check (its slides too) beyond 3 m0 + 6d.
  if (2 * m0 + 3 * d >= m) {
    sim.why_full = "the batch is too small for the periodic steady state to save time";
    return std::nullopt;
  }
  if (!validate(with_micro_batches(run, m0), model, hw).empty()) {
    sim.why_full = "the plan at fewer micro-batches is not legal";
    return std::nullopt;
  }
  // Runs at `from`, from + d, ... each lowered, priced and timed on one of up to options.threads threads.
  // Pricing shares the cost cache, so one run prices at a time, beside the others' lowering and timing (an
  // op's cost does not depend on which run priced it first).
  // `indexed`: the runs will be checked op by op (the first pair only).
  auto simulate_runs = [&](int64_t from, size_t n, bool indexed) {
    std::vector<Run> out(n);
    std::mutex pricing_mutex;
    parallel_for(n, options.threads, [&](size_t i) {
      out[i].lower_from(model, with_micro_batches(run, from + static_cast<int64_t>(i) * d), lo,
                        options.lowerings.get(), indexed);
      {
        const std::lock_guard<std::mutex> lock(pricing_mutex);
        pricing.price(out[i]);
      }
      pricing.time(out[i]);
    });
    for (const Run& r : out) sim.simulated_ops += static_cast<int64_t>(r.graph().ops.size());
    return out;
  };
  std::deque<Run> runs;
  auto figures = [&](int64_t stage) {
    std::vector<StepFigures> at(runs.size());
    parallel_for(runs.size(), options.threads,
                 [&](size_t i) { at[i] = figures_of(runs[i], stage, options); });
    return at;
  };
  // Every figure of the whole step, of the busiest stage (from each stage's compute time), from the runs'
  // figures (with two runs, the second stands in for the third).
  auto extrapolate = [&](PeriodicExtrapolation& x, int64_t& stage) {
    std::vector<double> busy = runs[0].timeline.stage_sm;
    x.times(busy, runs[1].timeline.stage_sm, runs.back().timeline.stage_sm, "stage compute");
    stage = std::max_element(busy.begin(), busy.end()) - busy.begin();
    std::vector<StepFigures> at = figures(stage);
    x.figures(at[0], at[1], at.back());
    return std::move(at[0]);
  };
  auto done = [&](StepFigures f, int64_t stage) {
    sim.extrapolated = true;
    sim.simulated_micro_batches = m0;
    sim.period_micro_batches = d;
    sim.periods_added = (m - m0) / d;
    sim.period_s = runs[1].timeline.step_time - runs[0].timeline.step_time;
    sim.runs = static_cast<int>(runs.size());
    critical_stage = stage;
    first = std::move(runs[0]);
    return f;
  };
  // The runs at m0 + d and m0 + 2d, one period apart op by op: every figure grows by what the period added.
  // (The later pair of the three holds more of the steady phase: the interleaved schedule's first run holds
  // less than a period of it.)
  for (Run& r : simulate_runs(m0 + d, 2, options.op_by_op)) runs.push_back(std::move(r));
  const InsertedPeriod inserted =
      options.op_by_op
          ? inserted_period(runs[0].graph(), runs[0].timeline, runs[0].lowered->streams(), runs[1].graph(),
                            runs[1].timeline, runs[1].lowered->streams(), runs[1].costs,
                            kInsertedPeriodTolerance * runs[1].timeline.step_time, options.threads)
          : InsertedPeriod{.failed = "the three-run check was asked for"};
  if (inserted.ok) {
    m0 += d;
    auto x = PeriodicExtrapolation::trusted((m - m0) / d);
    int64_t stage = 0;
    StepFigures f = extrapolate(x, stage);
    return done(std::move(f), stage);
  }
  sim.why_three_runs = fmt::format("the runs at {} and {} micro-batches are not one period apart: {}", m0 + d,
                                   m0 + 2 * d, inserted.failed);
  if (3 * m0 + 3 * d + kMaxSlides * d > m) {
    sim.why_full = "the batch is too small for the three-run check to save time, and " + sim.why_three_runs;
    return std::nullopt;
  }
  runs.push_front(std::move(simulate_runs(m0, 1, false).front()));
  for (int slide = 0;; ++slide) {
    auto x = PeriodicExtrapolation::checked((m - m0) / d, 1e-11 * runs[2].timeline.step_time);
    int64_t stage = 0;
    StepFigures f = extrapolate(x, stage);
    if (x.ok()) return done(std::move(f), stage);
    if (slide == kMaxSlides) {
      sim.why_full =
          fmt::format("the {} does not repeat from one period of the steady phase to the next", x.failed());
      return std::nullopt;
    }
    runs.pop_front();
    m0 += d;
    runs.push_back(std::move(simulate_runs(m0 + 2 * d, 1, false).front()));
  }
}

}  // namespace

std::string target_share_line(double low, double high) {
  std::string share = fmt::format("{:.0f}", 100 * low);
  if (const std::string h = fmt::format("{:.0f}", 100 * high); h != share) share += "-" + h;
  return share + "% of the critical path is priced by stack numbers that are targets";
}

Prediction predict(const ModelSpec& model, const Plan& plan, const HardwareProfile& hw,
                   const StackProfile& stack, const workload::RoutingDistribution& routing,
                   const PredictOptions& options) {
  // The MTP layers the plan trains, where it names them (io::load_plan applies them too).
  if (const std::optional<ModelSpec> trained = trained_model(model, plan))
    return predict(*trained, plan, hw, stack, routing, options);
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
  r.decoder_routing = sl.routing.decoder_load;
  const LoweringOptions& lo = sl.options;

  // The step: its periodic steady state extrapolated, or every micro-batch simulated.
  StepSimulation& sim = r.simulation;
  sim.micro_batches = run.num_micro_batches();
  Pricing pricing(run, hw, stack, options.hardware_fit);
  Run simulated;
  std::optional<StepFigures> step;
  if (options.whole_step) {
    sim.why_full = "the whole step was asked for";
  } else {
    step = extrapolate_step(model, run, lo, hw, pricing, options, sim, simulated, r.critical_stage);
  }
  if (!step) {
    simulated = pricing.simulate(model, run, lo, options.lowerings.get());
    sim.simulated_micro_batches = sim.micro_batches;
    sim.simulated_ops += static_cast<int64_t>(simulated.graph().ops.size());
    // The breakdown shown is the busiest stage's: the one whose ops' summed durations are largest (it sets
    // the pipeline's pace; the others wait for it in the bubble).
    const std::vector<double>& busy = simulated.timeline.stage_sm;
    r.critical_stage = std::max_element(busy.begin(), busy.end()) - busy.begin();
    step = figures_of(simulated, r.critical_stage, options);
  }
  StepFigures& f = *step;
  r.hot_exchanges = hot_exchanges_of(*simulated.lowered, hw);
  if (simulated.owned) {
    r.graph = std::move(simulated.owned->graph);
    r.costs = std::move(simulated.costs);
    r.timeline = std::move(simulated.timeline);
  }
  r.extrapolations = pricing.extrapolations();
  r.critical_path = std::move(f.critical_path);
  r.ops_in_step = f.ops;
  r.events = f.events;
  r.stage_end = std::move(f.stage_end);
  r.breakdown = std::move(f.breakdown);
  r.critical_path_seconds = std::move(f.cp_seconds);
  r.critical_path_ops = f.cp_ops;
  r.op_summary = std::move(f.summary);

  r.step_time_s = f.step_time;
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
      cost::memory_per_gpu(model, run, hw, stack, in_flight_by_chunk(model, run), sl.routing.memory_scale());

  // Uncertainty: each op on the critical path may be off by its curve's fit error (errors of one curve move
  // together, so they add): step in [T - sum e_i d_i, T + sum e_i d_i].
  r.tokens_per_s_low = r.tokens_per_s_high = r.tokens_per_s;
  if (options.critical_path) {
    const double spread = std::min(f.spread, 0.9 * r.step_time_s);
    r.tokens_per_s_low = r.tokens_per_step / (r.step_time_s + spread);
    r.tokens_per_s_high = r.tokens_per_step / (r.step_time_s - spread);
    // Provenance: the critical path's time by the basis of the stack numbers that priced each op.
    const auto& by_basis = f.by_basis;
    const double total = by_basis[0] + by_basis[1] + by_basis[2] + by_basis[3];
    if (total > 0) {
      r.provenance.measured = by_basis[0] / total;
      r.provenance.derived = by_basis[1] / total;
      r.provenance.assumed = by_basis[2] / total;
      r.provenance.target = by_basis[3] / total;
      if (by_basis[3] > 0) {
        r.provenance.targets.push_back(target_share_line(r.provenance.target, r.provenance.target));
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
  target_overlap(run.overlap.tp_comm, stack.overlaps.tp_comm, "tp_comm");
  target_overlap(run.overlap.shared_experts, stack.overlaps.shared_experts, "shared_experts");
  r.provenance.hypothetical = !r.provenance.targets.empty();
  return r;
}

void release_simulated_run(Prediction& p) {
  // Moved from empty ones: `v = {}` on a vector picks the initializer-list overload, which keeps the buffer.
  p.graph = OpGraph{};
  p.costs = std::vector<cost::OpCost>();
  p.timeline = engine::Timeline{};
  p.critical_path = std::vector<int32_t>();
}

void retain_freed_memory() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's largest: arrays below it come from the heap
  mallopt(M_MMAP_MAX, 0);               // and so do larger ones (a thread's arena still maps above 64 MB)
  mallopt(M_TRIM_THRESHOLD, 1 << 30);   // and freed heap stays mapped for the next prediction
#endif
}

}  // namespace moeplan
