// Event loop over streams with processor sharing of each rank's SMs, NVLink port and NIC (see engine.h).
#include "simulator/engine/engine.h"

#include <algorithm>
#include <limits>
#include <queue>

#include <boost/graph/compressed_sparse_row_graph.hpp>
#include <boost/graph/topological_sort.hpp>

#include "simulator/core/status.h"

namespace moeplan::engine {
namespace {

// The next completion on one stage (rank); stale when the stage's version moved on.
struct Event {
  double time;
  int32_t stage;
  uint32_t version;
  bool operator>(const Event& o) const { return time != o.time ? time > o.time : stage > o.stage; }
};

// Ops end when their remaining work falls below this fraction of their standalone time (rounding of the
// rate arithmetic), or below an absolute femtosecond.
constexpr double kDoneFraction = 1e-12;
constexpr double kDoneAbsolute = 1e-15;

class Simulation {
 public:
  Simulation(const OpGraph& g, std::span<const cost::OpCost> costs, const EngineOptions& o)
      : g_(g), costs_(costs), o_(o) {
    const size_t n = g.ops.size();
    const auto stages = static_cast<size_t>(g.num_stages);
    MOEPLAN_ASSERT(costs.size() == n);
    pending_.resize(n);
    remaining_.resize(n);
    rate_.assign(n, 0);
    started_.assign(n, 0);
    timeline_.ops.resize(n);
    timeline_.stage_end.assign(stages, 0);
    // Successors (reverse dependencies) as CSR.
    std::vector<uint32_t> count(n + 1, 0);
    for (int32_t dep : g.deps) ++count[static_cast<size_t>(dep) + 1];
    for (size_t i = 1; i <= n; ++i) count[i] += count[i - 1];
    succ_begin_ = count;
    succ_.resize(g.deps.size());
    std::vector<uint32_t> fill(count.begin(), count.end() - 1);
    stage_.resize(n);
    queue_.resize(n);
    kind_.resize(n);
    for (const Op& op : g.ops) {
      const auto i = static_cast<size_t>(op.id);
      stage_[i] = op.stage;
      queue_[i] =
          static_cast<uint32_t>(static_cast<size_t>(op.stage) * kNumStreams + static_cast<size_t>(op.stream));
      // 0: compute-bound on SMs, 1: memory-bound on SMs (also shares HBM), 2: NVLink, 3: NIC
      const auto& c = costs[i];
      kind_[i] = c.resource == cost::Resource::kNvlink                                ? 2
                 : c.resource == cost::Resource::kNic                                 ? 3
                 : (op.kind == OpKind::kMemoryBound || op.kind == OpKind::kOptimizer) ? 1
                                                                                      : 0;
      pending_[i] = static_cast<int32_t>(op.dep_count);
      for (int32_t dep : g.deps_of(op)) succ_[fill[static_cast<size_t>(dep)]++] = op.id;
    }
    // Streams: ops in id order.
    queues_.resize(stages * kNumStreams);
    for (const Op& op : g.ops) queues_[queue_[static_cast<size_t>(op.id)]].push_back(op.id);
    heads_.assign(queues_.size(), 0);
    active_.resize(stages);
    stage_updated_.assign(stages, 0);
    stage_version_.assign(stages, 0);
    dirty_flag_.assign(stages, 0);
  }

  Timeline run() {
    for (size_t q = 0; q < queues_.size(); ++q) try_start_head(q);
    reschedule_dirty();
    size_t done = 0;
    std::vector<int32_t> finished;
    while (!events_.empty()) {
      const Event e = events_.top();
      events_.pop();
      const auto s = static_cast<size_t>(e.stage);
      if (e.version != stage_version_[s]) continue;
      now_ = e.time;
      advance(s);
      finished.clear();
      int32_t soonest = -1;
      double soonest_t = std::numeric_limits<double>::infinity();
      for (int32_t id : active_[s]) {
        const auto i = static_cast<size_t>(id);
        const double left = remaining_[i] / rate_[i];
        // Done, or so close that the time would not move (floating-point rounding).
        if (remaining_[i] <= std::max(kDoneAbsolute, kDoneFraction * costs_[i].seconds) ||
            now_ + left <= now_) {
          finished.push_back(id);
        } else if (left < soonest_t) {
          soonest_t = left, soonest = id;
        }
      }
      if (finished.empty()) {
        // The event fired for this op but rounding left a sliver: it ends now.
        MOEPLAN_ASSERT(soonest >= 0);
        finished.push_back(soonest);
      }
      std::sort(finished.begin(), finished.end());
      for (int32_t id : finished) finish(id);
      done += finished.size();
      reschedule_dirty();
    }
    MOEPLAN_ASSERT(done == g_.ops.size());  // a cycle or a dangling dependency would leave ops unrun
    for (size_t i = 0; i < stage_.size(); ++i) {
      auto& end = timeline_.stage_end[static_cast<size_t>(stage_[i])];
      end = std::max(end, timeline_.ops[i].end);
    }
    timeline_.step_time = *std::max_element(timeline_.stage_end.begin(), timeline_.stage_end.end());
    return std::move(timeline_);
  }

 private:
  // Brings the stage's running ops up to now at their current rates.
  void advance(size_t s) {
    const double dt = now_ - stage_updated_[s];
    if (dt > 0) {
      for (int32_t id : active_[s]) {
        const auto i = static_cast<size_t>(id);
        remaining_[i] = std::max(0.0, remaining_[i] - rate_[i] * dt);
      }
    }
    stage_updated_[s] = now_;
  }

  void mark_dirty(size_t s) {
    if (!dirty_flag_[s]) dirty_flag_[s] = 1, dirty_.push_back(static_cast<int32_t>(s));
  }

  void try_start_head(size_t q) {
    if (heads_[q] >= queues_[q].size()) return;
    const int32_t id = queues_[q][heads_[q]];
    const auto i = static_cast<size_t>(id);
    if (pending_[i] > 0 || started_[i]) return;
    const auto s = static_cast<size_t>(stage_[i]);
    advance(s);  // the others' progress so far is at the old rates
    started_[i] = 1;
    timeline_.ops[i].start = now_;
    remaining_[i] = std::max(0.0, costs_[i].seconds);
    active_[s].push_back(id);
    mark_dirty(s);
    ++timeline_.events;
  }

  void finish(int32_t id) {
    const auto i = static_cast<size_t>(id);
    const auto s = static_cast<size_t>(stage_[i]);
    timeline_.ops[i].end = now_;
    ++timeline_.events;
    auto& act = active_[s];
    act.erase(std::find(act.begin(), act.end(), id));
    mark_dirty(s);
    const size_t q = queue_[i];
    ++heads_[q];
    try_start_head(q);
    for (uint32_t k = succ_begin_[i]; k < succ_begin_[i + 1]; ++k) {
      const auto j = static_cast<size_t>(succ_[k]);
      if (--pending_[j] == 0) try_start_head(queue_[j]);
    }
  }

  void reschedule_dirty() {
    for (int32_t s : dirty_) {
      dirty_flag_[static_cast<size_t>(s)] = 0;
      update_rates(static_cast<size_t>(s));
    }
    dirty_.clear();
  }

  // Shares of the rank's resources among its running ops, and the stage's next completion.
  void update_rates(size_t stage) {
    const auto& act = active_[stage];
    ++stage_version_[stage];
    if (act.empty()) return;
    int n_sm = 0, n_nv = 0, n_nic = 0;
    double nv_bytes = 0, nic_bytes = 0;
    for (int32_t id : act) {
      const auto i = static_cast<size_t>(id);
      switch (kind_[i]) {
        case 2:
          ++n_nv, nv_bytes += costs_[i].link_bytes_per_s;
          break;
        case 3:
          ++n_nic, nic_bytes += costs_[i].link_bytes_per_s;
          break;
        default:
          ++n_sm;
      }
    }
    // Transfers read and write HBM at their share of the link: 2 x bytes/s each.
    const double comm_hbm = (n_nv ? 2.0 * nv_bytes / n_nv : 0.0) + (n_nic ? 2.0 * nic_bytes / n_nic : 0.0);
    const bool comm_running = n_nv + n_nic > 0;
    const double sm_share = comm_running ? 1.0 - o_.comm_sm_fraction : 1.0;
    const double hbm_share =
        o_.hbm_bytes_per_s > 0 ? std::max(0.2, 1.0 - comm_hbm / o_.hbm_bytes_per_s) : 1.0;
    double next = std::numeric_limits<double>::infinity();
    for (int32_t id : act) {
      const auto i = static_cast<size_t>(id);
      double rate;
      switch (kind_[i]) {
        case 0:
          rate = sm_share / n_sm;
          break;
        case 1:
          rate = sm_share / n_sm * hbm_share;
          break;
        case 2:
          rate = 1.0 / n_nv;
          break;
        default:
          rate = 1.0 / n_nic;
          break;
      }
      rate_[i] = rate;
      next = std::min(next, remaining_[i] / rate);
    }
    events_.push({now_ + next, static_cast<int32_t>(stage), stage_version_[stage]});
  }

  const OpGraph& g_;
  std::span<const cost::OpCost> costs_;
  const EngineOptions& o_;
  double now_ = 0;
  std::vector<int32_t> pending_;
  std::vector<double> remaining_, rate_;
  std::vector<uint8_t> started_;
  std::vector<int16_t> stage_;
  std::vector<uint32_t> queue_;
  std::vector<uint8_t> kind_;
  std::vector<uint32_t> succ_begin_;
  std::vector<int32_t> succ_;
  std::vector<std::vector<int32_t>> queues_;
  std::vector<size_t> heads_;
  std::vector<std::vector<int32_t>> active_;
  std::vector<double> stage_updated_;
  std::vector<uint32_t> stage_version_;
  std::vector<uint8_t> dirty_flag_;
  std::vector<int32_t> dirty_;
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events_;
  Timeline timeline_;
};

}  // namespace

Timeline simulate(const OpGraph& graph, std::span<const cost::OpCost> costs, const EngineOptions& options) {
  return Simulation(graph, costs, options).run();
}

std::vector<int32_t> critical_path(const OpGraph& graph, const Timeline& timeline) {
  using Graph = boost::compressed_sparse_row_graph<boost::directedS>;
  const size_t n = graph.ops.size();
  if (n == 0) return {};
  // Edges: dependencies and stream order (an op follows the previous op of its stream).
  std::vector<std::pair<size_t, size_t>> edges;
  edges.reserve(graph.deps.size() + n);
  std::vector<int32_t> last_on_stream(static_cast<size_t>(graph.num_stages) * kNumStreams, -1);
  for (const Op& op : graph.ops) {
    for (int32_t dep : graph.deps_of(op))
      edges.emplace_back(static_cast<size_t>(dep), static_cast<size_t>(op.id));
    auto& prev = last_on_stream[static_cast<size_t>(op.stage) * kNumStreams + static_cast<size_t>(op.stream)];
    if (prev >= 0) edges.emplace_back(static_cast<size_t>(prev), static_cast<size_t>(op.id));
    prev = op.id;
  }
  const Graph dag(boost::edges_are_unsorted_multi_pass, edges.begin(), edges.end(), n);
  std::vector<size_t> order;
  order.reserve(n);
  boost::topological_sort(dag, std::back_inserter(order));  // reverse topological order
  // Longest path by simulated duration, walking the topological order forwards.
  std::vector<double> length(n, 0);
  std::vector<int32_t> from(n, -1);
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const size_t u = *it;
    const double here = length[u] + (timeline.ops[u].end - timeline.ops[u].start);
    for (auto [e, end] = boost::out_edges(u, dag); e != end; ++e) {
      const size_t v = boost::target(*e, dag);
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

}  // namespace moeplan::engine
