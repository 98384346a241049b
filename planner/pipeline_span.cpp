// The screen's pipeline (see pipeline_span.h).
#include "planner/pipeline_span.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <deque>
#include <optional>

#include "simulator/core/status.h"

namespace moeplan::planner {

const std::vector<std::vector<PipelineTask>>& PipelineSpan::orders(const PipelineShape& shape) {
  const auto key = std::make_tuple(shape.stages, shape.chunks, shape.micro_batches, shape.combined,
                                   static_cast<int>(shape.schedule));
  auto it = orders_.find(key);
  if (it != orders_.end()) return it->second;
  std::vector<std::vector<PipelineTask>> out;
  for (int64_t s = 0; s < shape.stages; ++s)
    out.push_back(
        pipeline_order(s, shape.stages, shape.chunks, shape.micro_batches, shape.combined, shape.schedule));
  return orders_.emplace(key, std::move(out)).first->second;
}

std::vector<double> PipelineSpan::run(const PipelineShape& shape, const std::vector<VirtualStageTimes>& times,
                                      double hop) {
  const int64_t pp = shape.stages, m = shape.micro_batches, last = pp * shape.chunks - 1;
  const Schedule sched = shape.schedule;
  const auto& order = orders(shape);
  const auto cells = static_cast<size_t>((last + 1) * m);
  forward_end_.assign(cells, -1.0);
  backward_end_.assign(cells, -1.0);
  task_end_.resize(static_cast<size_t>(pp));
  deferred_.resize(static_cast<size_t>(pp));
  for (int64_t s = 0; s < pp; ++s) {
    task_end_[static_cast<size_t>(s)].assign(order[static_cast<size_t>(s)].size(), 0.0);
    deferred_[static_cast<size_t>(s)].clear();
  }
  next_.assign(static_cast<size_t>(pp), 0);
  free_.assign(static_cast<size_t>(pp), 0.0);
  ++runs_;
  micro_batches_run_ += m;
  auto cell = [&](int64_t v, int64_t mb) { return static_cast<size_t>(v * m + mb); };
  auto vstage = [&](int64_t s, const PipelineTask& t) { return virtual_stage(t.chunk, s, pp, sched); };
  // When the task may start as far as its inputs go (negative while one is not done): a forward waits for
  // the previous virtual stage's forward of its micro-batch, a backward for the next one's backward (the last
  // virtual stage's for its own forward), with `hop` between stages; a weights task for nothing but its
  // stage.
  auto ready = [&](int64_t s, const PipelineTask& t) {
    if (t.weights) return 0.0;
    const int64_t v = vstage(s, t);
    if (t.forward) {
      if (v == 0) return 0.0;
      const double end = forward_end_[cell(v - 1, t.micro_batch)];
      return end < 0 ? -1.0 : end + (stage_of_virtual(v - 1, pp, sched) != s ? hop : 0.0);
    }
    if (v == last) return forward_end_[cell(v, t.micro_batch)];
    const double end = backward_end_[cell(v + 1, t.micro_batch)];
    return end < 0 ? -1.0 : end + (stage_of_virtual(v + 1, pp, sched) != s ? hop : 0.0);
  };
  auto at = [&](int64_t s, const PipelineTask& t) -> const VirtualStageTimes& {
    return times[static_cast<size_t>(vstage(s, t))];
  };
  // A pass's own time: a backward that holds its weight gradients back runs without them; a weights task
  // runs those of the oldest such backward on its stage.
  auto alone = [&](int64_t s, const PipelineTask& t) {
    std::deque<double>& held = deferred_[static_cast<size_t>(s)];
    if (t.weights) {
      if (held.empty()) return 0.0;
      const double w = held.front();
      held.pop_front();
      return w;
    }
    const VirtualStageTimes& x = at(s, t);
    if (t.forward) return x.forward;
    if (!t.input_grad_only) return x.backward;
    held.push_back(x.weights);
    return x.backward - x.weights;
  };
  auto done = [&](int64_t s, const PipelineTask& t, double end) {
    if (!t.weights) (t.forward ? forward_end_ : backward_end_)[cell(vstage(s, t), t.micro_batch)] = end;
  };
  size_t remaining = 0;
  for (const auto& o : order) remaining += o.size();
  while (remaining > 0) {
    bool progress = false;
    for (int64_t s = 0; s < pp; ++s) {
      const auto& o = order[static_cast<size_t>(s)];
      size_t& k = next_[static_cast<size_t>(s)];
      double& free = free_[static_cast<size_t>(s)];
      while (k < o.size()) {
        const PipelineTask& t = o[k];
        const double r = ready(s, t);
        if (r < 0) break;
        if (t.paired && k + 1 < o.size() && !o[k + 1].forward && !o[k + 1].weights) {
          // A pair: the forward and the backward beside it, layer by layer, start together and end together.
          const PipelineTask& b = o[k + 1];
          const double rb = ready(s, b);
          if (rb < 0) break;
          free = std::max({free, r, rb}) + at(s, t).paired_forward + at(s, b).paired_backward;
          done(s, t, free);
          done(s, b, free);
          task_end_[static_cast<size_t>(s)][k] = task_end_[static_cast<size_t>(s)][k + 1] = free;
          k += 2;
          remaining -= 2;
        } else {
          free = std::max(free, r) + alone(s, t);
          done(s, t, free);
          task_end_[static_cast<size_t>(s)][k] = free;
          ++k;
          --remaining;
        }
        progress = true;
      }
    }
    MOEPLAN_ASSERT(progress);  // the lowering's orders never wait on each other in a cycle
  }
  return free_;
}

std::vector<double> PipelineSpan::stage_ends(const PipelineShape& shape,
                                             const std::vector<VirtualStageTimes>& times, double hop,
                                             bool whole) {
  MOEPLAN_ASSERT(static_cast<int64_t>(times.size()) == shape.stages * shape.chunks);
  runs_ = micro_batches_run_ = 0;
  key_.clear();
  for (int64_t x : {shape.stages, shape.chunks, shape.micro_batches, static_cast<int64_t>(shape.schedule),
                    static_cast<int64_t>(shape.combined), static_cast<int64_t>(whole)})
    key_.push_back(static_cast<uint64_t>(x));
  auto bits = [&](double x) { key_.push_back(std::bit_cast<uint64_t>(x)); };
  bits(hop);
  for (const VirtualStageTimes& t : times)
    bits(t.forward), bits(t.backward), bits(t.paired_forward), bits(t.paired_backward), bits(t.weights);
  if (auto it = memo_.find(key_); it != memo_.end()) return it->second;
  if (memo_.size() >= kMemoEntries) memo_.clear();
  std::vector<double> out = settle(shape, times, hop, whole);
  memo_.emplace(key_, out);
  return out;
}

std::vector<double> PipelineSpan::settle(const PipelineShape& shape,
                                         const std::vector<VirtualStageTimes>& times, double hop,
                                         bool whole) {
  // Each stage's order is its warm-up forwards, then forward-backward pairs, then its cool-down backwards;
  // the pairs repeat a pattern of `period` micro-batches (one; `stages` when interleaved, which walks the
  // chunks a group at a time), `pattern` pairs. A run of `probe` micro-batches (as many as the step, modulo
  // the period) is the step's run up to the end of its own pairs: each task waits only for earlier tasks of
  // its stage and for tasks of the same micro-batch on the neighbouring virtual stages, which are the same
  // tasks in both. Count each stage's pairs from the step's end of pairs backwards (stage s warms up two
  // forwards fewer than stage s - 1 when interleaved, one when not, so the k-th pair from the end is the same
  // moment of the schedule on every stage): no task waits on a task more than two patterns back (a forward's
  // input comes from the same pair on the stage before, or `stages` pairs back where a chunk wraps to the
  // first stage; a backward's from at most 2 pairs back on the stage after, 3 * stages - 2 where it wraps,
  // and a pattern is `stages` * chunks >= 2 * stages pairs when interleaved). So where every task of the
  // probe's last kWindow = 2 patterns ends the same time after its counterpart a pattern before, on every
  // stage, each later pattern repeats the last one that much later, up to the step's end of pairs, and the
  // cool-down is the probe's, later by as much.
  constexpr int64_t kWindow = 2;
  const int64_t pp = shape.stages, m = shape.micro_batches, v = shape.chunks;
  const int64_t period = v > 1 ? pp : 1, pattern = period * v;
  // kWindow + 1 patterns of pairs on the first stage, which warms up longest (pipeline_order's warm-up).
  const int64_t warmup = (v > 1 ? 2 * (pp - 1) + (v - 1) * pp : pp - 1) + (shape.combined ? 1 : 0);
  const int64_t need = (kWindow + 1) * period + (warmup + v - 1) / v;
  // A probe of `need` micro-batches first; where it has not settled yet, probes of twice as many, and so
  // on, before the whole step. DualPipeV's phases are not warm-up, pairs and cool-down: it runs whole.
  for (int64_t least = need; !whole && shape.schedule != Schedule::kDualPipeV;) {
    const int64_t probe = m - period * std::max<int64_t>(0, (m - least) / period);
    if (probe >= m) break;
    PipelineShape at = shape;
    at.micro_batches = probe;
    std::vector<double> out = run(at, times, hop);
    const std::optional<double> step = repeat(orders(at), kWindow, pattern);
    if (step) {
      const double periods = static_cast<double>(m - probe) / static_cast<double>(period);
      for (double& e : out) e += periods * *step;
      return out;
    }
    least = 2 * probe;
  }
  return run(shape, times, hop);
}

std::optional<double> PipelineSpan::repeat(const std::vector<std::vector<PipelineTask>>& order,
                                           int64_t window, int64_t pattern) const {
  double step = -1;  // one pattern's time
  for (size_t s = 0; s < order.size(); ++s) {
    const auto& o = order[s];
    const std::vector<double>& e = task_end_[s];
    int64_t first = 0;  // the first pair's place: past the stage's warm-up forwards
    while (first < static_cast<int64_t>(o.size()) && o[static_cast<size_t>(first)].forward) ++first;
    --first;
    const int64_t pairs = (static_cast<int64_t>(o.size()) - 2 * first) / 2;
    if (first < 0 || pairs < (window + 1) * pattern) return std::nullopt;
    for (int64_t q = pairs - window * pattern; q < pairs; ++q) {
      for (int64_t t = 0; t < 2; ++t) {
        const double now = e[static_cast<size_t>(first + 2 * q + t)];
        const double before = e[static_cast<size_t>(first + 2 * (q - pattern) + t)];
        if (step < 0) step = now - before;
        if (std::abs(now - before - step) > 1e-12 * now) return std::nullopt;
      }
    }
  }
  return step;
}

}  // namespace moeplan::planner
