// Event loop over streams with processor sharing of each rank's SMs, NVLink port and NIC (see engine.h).
#include "simulator/engine/engine.h"

#include <algorithm>
#include <functional>
#include <limits>

#include <boost/graph/compressed_sparse_row_graph.hpp>
#include <boost/graph/topological_sort.hpp>

#include "simulator/core/status.h"

namespace moeplan::engine {
namespace {

// Ops end when their remaining work falls below this fraction of their standalone time (rounding of the
// rate arithmetic), or below an absolute femtosecond.
constexpr double kDoneFraction = 1e-12;
constexpr double kDoneAbsolute = 1e-15;

// What the event loop touches per op, together in one place (one cache line per op; the host's issue time
// lives in the timeline).
struct alignas(64) OpState {
  double remaining = 0;  // standalone seconds of work left
  double rate = 0;       // share of the op's resource it gets now (work-seconds per second)
  double seconds = 0;    // standalone cost
  double link_bytes_per_s = 0;
  double sm_fraction = 0;                 // communication: SMs its kernels hold
  uint32_t queue = 0;                     // stage * kNumStreams + stream
  int32_t pending = 0;                    // unfinished dependencies
  uint32_t dep_begin = 0, dep_count = 0;  // into OpGraph::deps
  int16_t stage = 0;
  uint8_t kind = 0;  // 0: compute-bound on SMs, 1: memory-bound on SMs (also shares HBM), 2: NVLink, 3: NIC
  uint8_t started = 0;
  uint8_t host_sync = 0;
};

static_assert(sizeof(OpState) == 64);

// A tournament tree over the stages' next event times: the earliest in O(1), a stage's new time in
// O(log stages), ties to the lowest stage. One event per op start or end asks for it, and a pipeline of 16
// stages scanned every time took over a third of the event loop.
class EarliestStage {
 public:
  void reset(const std::vector<double>& times) {
    leaves_ = 1;
    while (leaves_ < times.size()) leaves_ *= 2;
    // Padding leaves never come first: no event, and a stage number above every real one.
    time_.assign(2 * leaves_, std::numeric_limits<double>::infinity());
    stage_.assign(2 * leaves_, 0);
    for (size_t s = 0; s < leaves_; ++s) {
      stage_[leaves_ + s] = static_cast<uint32_t>(s);
      if (s < times.size()) time_[leaves_ + s] = times[s];
    }
    for (size_t i = leaves_ - 1; i >= 1; --i) pull(i);
  }
  size_t first() const { return stage_[1]; }
  void set(size_t s, double t) {
    time_[leaves_ + s] = t;
    for (size_t i = (leaves_ + s) / 2; i >= 1; i /= 2) pull(i);
  }

 private:
  // The earlier child (the lower stage on ties), without branches: which wins is unpredictable.
  void pull(size_t i) {
    const size_t l = 2 * i, r = 2 * i + 1;
    const bool right = time_[r] < time_[l] || (time_[r] == time_[l] && stage_[r] < stage_[l]);
    const size_t w = right ? r : l;
    time_[i] = time_[w];
    stage_[i] = stage_[w];
  }
  size_t leaves_ = 1;
  std::vector<double> time_;
  std::vector<uint32_t> stage_;
};

class Simulation {
 public:
  Simulation(const OpGraph& g, std::span<const cost::OpCost> costs, const EngineOptions& o) : g_(g), o_(o) {
    const size_t n = g.ops.size();
    const auto stages = static_cast<size_t>(g.num_stages);
    const size_t queues = stages * kNumStreams;
    MOEPLAN_ASSERT(costs.size() == n);
    op_.resize(n);
    timeline_.ops.resize(n);
    timeline_.issued.assign(n, o.host ? kNever : 0.0);  // until the host gets there
    timeline_.gated_by.assign(n, -1);
    host_s_.resize(n);
    beside_compute_.resize(n);
    sync_s_.resize(n);
    timeline_.stage_end.assign(stages, 0);
    timeline_.stage_sm.assign(stages, 0);
    // One pass over the ops (large structs) fills their compact states; the rest reads those. Successors
    // (reverse dependencies), the streams' ops and the stages' ops, each in id order, as CSR.
    std::vector<uint32_t> succ_count(n + 1, 0);
    for (int32_t dep : g.deps) ++succ_count[static_cast<size_t>(dep) + 1];
    std::vector<uint32_t> queue_count(queues + 1, 0);
    std::vector<uint32_t> stage_count(stages + 1, 0);
    for (size_t i = 0; i < n; ++i) {
      prefetch_op_ahead(g.ops, i);
      const Op& op = g.ops[i];
      MOEPLAN_ASSERT(static_cast<size_t>(op.id) == i);  // ops are stored by id
      OpState& st = op_[i];
      const auto& c = costs[i];
      st.seconds = c.seconds;
      st.link_bytes_per_s = c.link_bytes_per_s;
      st.sm_fraction = c.sm_fraction;
      st.host_sync = o.host && op.host_sync ? 1 : 0;
      host_s_[i] = c.host_seconds;
      beside_compute_[i] = c.rate_beside_compute;
      sync_s_[i] = c.host_sync_seconds;
      st.stage = op.stage;
      st.queue =
          static_cast<uint32_t>(static_cast<size_t>(op.stage) * kNumStreams + static_cast<size_t>(op.stream));
      st.kind = c.resource == cost::Resource::kNvlink                                ? 2
                : c.resource == cost::Resource::kNic                                 ? 3
                : (op.kind == OpKind::kMemoryBound || op.kind == OpKind::kOptimizer) ? 1
                                                                                     : 0;
      st.pending = static_cast<int32_t>(op.dep_count);
      st.dep_begin = op.dep_begin;
      st.dep_count = op.dep_count;
      ++queue_count[st.queue + 1];
      ++stage_count[static_cast<size_t>(op.stage) + 1];
    }
    for (size_t i = 1; i <= n; ++i) succ_count[i] += succ_count[i - 1];
    for (size_t q = 1; q <= queues; ++q) queue_count[q] += queue_count[q - 1];
    for (size_t k = 1; k <= stages; ++k) stage_count[k] += stage_count[k - 1];
    succ_begin_ = succ_count;
    succ_.resize(g.deps.size());
    queue_end_.assign(queue_count.begin() + 1, queue_count.end());
    head_.assign(queue_count.begin(), queue_count.end() - 1);
    queue_begin_ = head_;
    queue_ops_.resize(n);
    // Each stage's ops in program (id) order, for its host thread.
    stage_ops_.resize(n);
    host_cursor_.assign(stage_count.begin(), stage_count.end() - 1);
    host_end_.assign(stage_count.begin() + 1, stage_count.end());
    host_prev_.assign(n, -1);
    std::vector<int32_t> last_of_stage(stages, -1);
    for (size_t i = 0; i < n; ++i) {
      const OpState& st = op_[i];
      const auto id = static_cast<int32_t>(i);
      for (uint32_t k = st.dep_begin; k < st.dep_begin + st.dep_count; ++k)
        succ_[succ_count[static_cast<size_t>(g.deps[k])]++] = id;
      queue_ops_[queue_count[st.queue]++] = id;
      const auto s = static_cast<size_t>(st.stage);
      stage_ops_[stage_count[s]++] = id;
      host_prev_[i] = last_of_stage[s];
      last_of_stage[s] = id;
    }
    active_.resize(stages);
    stage_updated_.assign(stages, 0);
    stage_next_.assign(stages, kNever);
    next_.reset(stage_next_);
    dirty_flag_.assign(stages, 0);
    host_clock_.assign(stages, 0.0);
    waiting_.resize(stages);
  }

  Timeline run() {
    if (o_.host) {
      for (size_t s = 0; s < host_clock_.size(); ++s) advance_host(s);
    }
    for (size_t q = 0; q < head_.size(); ++q) try_start_head(q);
    reschedule_dirty();
    size_t done = 0;
    std::vector<int32_t> finished;
    for (;;) {
      // The stage whose next event comes first (the lowest stage on ties).
      const size_t s = next_.first();
      const double first = stage_next_[s];
      if (first == kNever) break;
      now_ = first;
      advance(s);
      if (!waiting_[s].empty() && waiting_[s].front().first <= now_) {
        // An issue event: start the stream heads whose issue time has come.
        start_issued(s);
        reschedule_dirty();
        continue;
      }
      finished.clear();
      int32_t soonest = -1;
      double soonest_t = kNever;
      for (int32_t id : active_[s]) {
        const OpState& st = op_[static_cast<size_t>(id)];
        const double left = st.remaining / st.rate;
        // Done, or so close that the time would not move (floating-point rounding).
        if (st.remaining <= std::max(kDoneAbsolute, kDoneFraction * st.seconds) || now_ + left <= now_) {
          finished.push_back(id);
        } else if (left < soonest_t) {
          soonest_t = left, soonest = id;
        }
      }
      if (finished.empty()) {
        // The completion fired for this op but rounding left a sliver: it ends now.
        MOEPLAN_ASSERT(soonest >= 0);
        finished.push_back(soonest);
      }
      if (finished.size() > 1) std::sort(finished.begin(), finished.end());
      for (int32_t id : finished) finish(id);
      done += finished.size();
      reschedule_dirty();
    }
    MOEPLAN_ASSERT(done == g_.ops.size());  // a cycle or a dangling dependency would leave ops unrun
    for (size_t i = 0; i < op_.size(); ++i) {
      const auto s = static_cast<size_t>(op_[i].stage);
      const OpTiming& t = timeline_.ops[i];
      timeline_.stage_end[s] = std::max(timeline_.stage_end[s], t.end);
      if (op_[i].kind <= 1) timeline_.stage_sm[s] += t.end - t.start;
    }
    timeline_.step_time = *std::max_element(timeline_.stage_end.begin(), timeline_.stage_end.end());
    return std::move(timeline_);
  }

 private:
  static constexpr double kNever = std::numeric_limits<double>::infinity();

  // Brings the stage's running ops up to now at their current rates.
  void advance(size_t s) {
    const double dt = now_ - stage_updated_[s];
    if (dt > 0) {
      for (int32_t id : active_[s]) {
        OpState& st = op_[static_cast<size_t>(id)];
        st.remaining = std::max(0.0, st.remaining - st.rate * dt);
      }
    }
    stage_updated_[s] = now_;
  }

  void mark_dirty(size_t s) {
    if (!dirty_flag_[s]) dirty_flag_[s] = 1, dirty_.push_back(static_cast<int32_t>(s));
  }

  void try_start_head(size_t q) {
    if (head_[q] >= queue_end_[q]) return;
    const int32_t id = queue_ops_[head_[q]];
    OpState& st = op_[static_cast<size_t>(id)];
    if (st.pending > 0 || st.started) return;
    const auto s = static_cast<size_t>(st.stage);
    const double issued = timeline_.issued[static_cast<size_t>(id)];
    if (issued > now_) {
      // Ready on the device but not yet issued by the host: wait for the issue time (or for the host to
      // get there, kNever, re-tried when it does).
      if (issued < kNever)
        add_waiting(s, issued, q);
      else
        blocked_heads_.push_back(static_cast<uint32_t>(q));
      return;
    }
    advance(s);  // the others' progress so far is at the old rates
    st.started = 1;
    // The stream's next op and this op's successors are touched when it ends: fetch their lines now (a large
    // graph's states are out of cache).
    if (prefetch_) {
      if (head_[q] + 1 < queue_end_[q]) {
        const auto nx = static_cast<size_t>(queue_ops_[head_[q] + 1]);
        __builtin_prefetch(&op_[nx]);
        __builtin_prefetch(&timeline_.issued[nx]);
        __builtin_prefetch(&timeline_.ops[nx], 1);
        __builtin_prefetch(&timeline_.gated_by[nx], 1);
      }
      for (uint32_t k = succ_begin_[static_cast<size_t>(id)]; k < succ_begin_[static_cast<size_t>(id) + 1];
           ++k)
        __builtin_prefetch(&op_[static_cast<size_t>(succ_[k])]);
    }
    st.remaining = std::max(0.0, st.seconds);
    timeline_.ops[static_cast<size_t>(id)].start = now_;
    record_gate(id, st, q);
    active_[s].push_back(id);
    mark_dirty(s);
    ++timeline_.events;
  }

  // The predecessor that ended last before the op started (it started the moment that one ended); ties go
  // to the lowest id so that the chain is deterministic.
  void record_gate(int32_t id, const OpState& st, size_t q) {
    int32_t gate = -1;
    double latest = -1;
    auto consider = [&](int32_t u) {
      const double end = timeline_.ops[static_cast<size_t>(u)].end;
      if (end > latest || (end == latest && u < gate)) latest = end, gate = u;
    };
    if (head_[q] > queue_begin_[q]) consider(queue_ops_[head_[q] - 1]);
    for (uint32_t k = st.dep_begin; k < st.dep_begin + st.dep_count; ++k) consider(g_.deps[k]);
    // Held back by the host: the chain continues through the op the host issued before it.
    const double issued = timeline_.issued[static_cast<size_t>(id)];
    if (issued > 0 && issued > latest && id > 0) {
      const auto prev = host_prev_[static_cast<size_t>(id)];
      if (prev >= 0) gate = prev;
    }
    timeline_.gated_by[static_cast<size_t>(id)] = gate;
  }

  void finish(int32_t id) {
    const auto i = static_cast<size_t>(id);
    const OpState& st = op_[i];
    const auto s = static_cast<size_t>(st.stage);
    timeline_.ops[i].end = now_;
    if (st.host_sync) {
      // The host resumes after the device finished this op and the round trip back.
      host_clock_[s] = std::max(host_clock_[s], now_ + sync_s_[i]);
      advance_host(s);
      // Heads that were waiting for the host to get to them may be issued now.
      std::vector<uint32_t> blocked;
      blocked.swap(blocked_heads_);
      for (uint32_t q : blocked) try_start_head(q);
    }
    ++timeline_.events;
    auto& act = active_[s];
    act.erase(std::find(act.begin(), act.end(), id));
    mark_dirty(s);
    const size_t q = st.queue;
    ++head_[q];
    try_start_head(q);
    for (uint32_t k = succ_begin_[i]; k < succ_begin_[i + 1]; ++k) {
      OpState& next = op_[static_cast<size_t>(succ_[k])];
      if (--next.pending == 0) try_start_head(next.queue);
    }
  }

  void reschedule_dirty() {
    for (int32_t s : dirty_) {
      dirty_flag_[static_cast<size_t>(s)] = 0;
      update_rates(static_cast<size_t>(s));
      refresh_next(static_cast<size_t>(s));
      next_.set(static_cast<size_t>(s), stage_next_[static_cast<size_t>(s)]);
    }
    dirty_.clear();
  }

  // Shares of the rank's resources among its running ops, and the stage's next completion.
  void update_rates(size_t stage) {
    const auto& act = active_[stage];
    stage_next_[stage] = kNever;
    if (act.empty()) return;
    int n_sm = 0, n_nv = 0, n_nic = 0;
    double nv_bytes = 0, nic_bytes = 0, comm_sms = 0;
    for (int32_t id : act) {
      const OpState& st = op_[static_cast<size_t>(id)];
      switch (st.kind) {
        case 2:
          ++n_nv, nv_bytes += st.link_bytes_per_s, comm_sms += st.sm_fraction;
          break;
        case 3:
          ++n_nic, nic_bytes += st.link_bytes_per_s, comm_sms += st.sm_fraction;
          break;
        default:
          ++n_sm;
      }
    }
    // Transfers read and write HBM at their share of the link: 2 x bytes/s each.
    const double comm_hbm = (n_nv ? 2.0 * nv_bytes / n_nv : 0.0) + (n_nic ? 2.0 * nic_bytes / n_nic : 0.0);
    // Communication kernels hold their SMs while they run, and the compute beside them runs slower still.
    const bool comm_running = n_nv + n_nic > 0;
    const double sm_share =
        compute_share_beside_comm(comm_sms, comm_running && n_sm > 0 ? o_.overlap_compute_efficiency : 1.0);
    const double hbm_share =
        o_.hbm_bytes_per_s > 0 ? std::max(0.2, 1.0 - comm_hbm / o_.hbm_bytes_per_s) : 1.0;
    // The same share for every kernel on the SMs (computed once: the same value as per op).
    const double sm_rate = n_sm > 0 ? sm_share / n_sm : 0.0;
    const double memory_rate = sm_rate * hbm_share;
    double next = kNever;
    for (int32_t id : act) {
      OpState& st = op_[static_cast<size_t>(id)];
      double rate;
      switch (st.kind) {
        case 0:
          rate = sm_rate;
          break;
        case 1:
          rate = memory_rate;
          break;
        default:  // a transfer: its link's share, slowed while compute runs beside it
          rate = (n_sm > 0 ? beside_compute_[static_cast<size_t>(id)] : 1.0) / (st.kind == 2 ? n_nv : n_nic);
          break;
      }
      st.rate = rate;
      next = std::min(next, st.remaining / rate);
    }
    stage_next_[stage] = now_ + next;
  }

  // The stage's next event: a completion or an issue time it waits for.
  void refresh_next(size_t stage) {
    if (!waiting_[stage].empty())
      stage_next_[stage] = std::min(stage_next_[stage], waiting_[stage].front().first);
  }

  // Issue the stage's ops in program order until the next host sync, from its host clock.
  void advance_host(size_t s) {
    double clock = host_clock_[s];
    while (host_cursor_[s] < host_end_[s]) {
      const auto id = static_cast<size_t>(stage_ops_[host_cursor_[s]++]);
      clock += host_s_[id];
      timeline_.issued[id] = clock;
      if (op_[id].host_sync) break;
    }
    host_clock_[s] = clock;
  }

  void add_waiting(size_t s, double t, size_t q) {
    auto& w = waiting_[s];
    w.emplace_back(t, static_cast<uint32_t>(q));
    std::push_heap(w.begin(), w.end(), std::greater<>());
    mark_dirty(s);
  }

  void start_issued(size_t s) {
    auto& w = waiting_[s];
    while (!w.empty() && w.front().first <= now_) {
      std::pop_heap(w.begin(), w.end(), std::greater<>());
      const uint32_t q = w.back().second;
      w.pop_back();
      try_start_head(q);
    }
    mark_dirty(s);
  }

  const OpGraph& g_;
  const EngineOptions& o_;
  const bool prefetch_ = g_.ops.size() >= kOpPrefetchMinOps;
  double now_ = 0;
  std::vector<OpState> op_;
  std::vector<uint32_t> succ_begin_;
  std::vector<int32_t> succ_;
  std::vector<int32_t> queue_ops_;                        // each stream's ops in order, stream after stream
  std::vector<uint32_t> queue_begin_, head_, queue_end_;  // per stream: where its ops are in queue_ops_
  std::vector<std::vector<int32_t>> active_;              // per stage: the ops running
  std::vector<double> stage_updated_;                     // when the stage's running ops were last advanced
  std::vector<double> stage_next_;                        // the stage's next completion (kNever when idle)
  EarliestStage next_;                                    // the stage with the earliest stage_next_
  std::vector<uint8_t> dirty_flag_;
  std::vector<int32_t> dirty_;
  // Host threads, one per stage.
  std::vector<double> host_s_, sync_s_;           // by op: issue cost, round trip after a host sync
  std::vector<double> beside_compute_;            // by op: a transfer's rate beside compute (cost's)
  std::vector<int32_t> stage_ops_;                // each stage's ops in id order, stage after stage
  std::vector<int32_t> host_prev_;                // by op: the op its stage's host issued before it
  std::vector<uint32_t> host_cursor_, host_end_;  // per stage: the next op its host issues
  std::vector<double> host_clock_;                // per stage: when its host issued its last op
  std::vector<std::vector<std::pair<double, uint32_t>>> waiting_;  // per stage: (issue time, stream) heap
  std::vector<uint32_t> blocked_heads_;  // stream heads waiting for a host still blocked at a sync
  Timeline timeline_;
};

}  // namespace

Timeline simulate(const OpGraph& graph, std::span<const cost::OpCost> costs, const EngineOptions& options) {
  return Simulation(graph, costs, options).run();
}

std::vector<int32_t> longest_path(const OpGraph& graph, const Timeline& timeline) {
  // 32-bit vertex and edge indices: op graphs stay far below 2^32 ops, and half the memory is half the time.
  using Graph = boost::compressed_sparse_row_graph<boost::directedS, boost::no_property, boost::no_property,
                                                   boost::no_property, uint32_t, uint32_t>;
  const size_t n = graph.ops.size();
  if (n == 0) return {};
  // Edges: dependencies and stream order (an op follows the previous op of its stream).
  std::vector<std::pair<uint32_t, uint32_t>> edges;
  edges.reserve(graph.deps.size() + n);
  std::vector<int32_t> last_on_stream(static_cast<size_t>(graph.num_stages) * kNumStreams, -1);
  for (const Op& op : graph.ops) {
    const auto v = static_cast<uint32_t>(op.id);
    for (int32_t dep : graph.deps_of(op)) edges.emplace_back(static_cast<uint32_t>(dep), v);
    auto& prev = last_on_stream[static_cast<size_t>(op.stage) * kNumStreams + static_cast<size_t>(op.stream)];
    if (prev >= 0) edges.emplace_back(static_cast<uint32_t>(prev), v);
    prev = op.id;
  }
  const Graph dag(boost::edges_are_unsorted_multi_pass, edges.begin(), edges.end(), static_cast<uint32_t>(n));
  std::vector<uint32_t> order;
  order.reserve(n);
  boost::topological_sort(dag, std::back_inserter(order));  // reverse topological order
  // Longest path by simulated duration, walking the topological order forwards.
  std::vector<double> length(n, 0);
  std::vector<int32_t> from(n, -1);
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const uint32_t u = *it;
    const double here = length[u] + (timeline.ops[u].end - timeline.ops[u].start);
    for (auto [e, end] = boost::out_edges(u, dag); e != end; ++e) {
      const uint32_t v = boost::target(*e, dag);
      if (here > length[v] || (here == length[v] && from[v] >= 0 && static_cast<int32_t>(u) < from[v])) {
        length[v] = here;
        from[v] = static_cast<int32_t>(u);
      }
    }
  }
  size_t last = 0;
  double best = -1;
  for (size_t u = 0; u < n; ++u) {
    const double total = length[u] + (timeline.ops[u].end - timeline.ops[u].start);
    if (total > best) best = total, last = u;
  }
  std::vector<int32_t> path;
  for (int32_t u = static_cast<int32_t>(last); u >= 0; u = from[static_cast<size_t>(u)]) path.push_back(u);
  std::reverse(path.begin(), path.end());
  return path;
}

std::vector<int32_t> critical_path(const Timeline& timeline) {
  const auto& ops = timeline.ops;
  if (ops.empty()) return {};
  size_t last = 0;
  for (size_t u = 1; u < ops.size(); ++u) {
    if (ops[u].end > ops[last].end) last = u;
  }
  std::vector<int32_t> path;
  for (int32_t u = static_cast<int32_t>(last); u >= 0; u = timeline.gated_by[static_cast<size_t>(u)])
    path.push_back(u);
  std::reverse(path.begin(), path.end());
  return path;
}

}  // namespace moeplan::engine
