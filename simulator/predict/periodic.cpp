// The op-by-op check that a run is another with one period inserted (see periodic.h).
#include "simulator/predict/periodic.h"

#include <algorithm>

#include <fmt/format.h>

#include "simulator/core/parallel.h"

namespace moeplan {

InsertedPeriod inserted_period(const OpGraph& a, const engine::Timeline& ta, const OpGraph& b,
                               const engine::Timeline& tb, std::span<const cost::OpCost> costs_b, double tol,
                               std::span<const uint64_t> keys_a, std::span<const uint64_t> keys_b) {
  return inserted_period(a, ta, StreamIndex(a, keys_a), b, tb, StreamIndex(b, keys_b), costs_b, tol);
}

InsertedPeriod inserted_period(const OpGraph& a, const engine::Timeline& ta, const StreamIndex& sa,
                               const OpGraph& b, const engine::Timeline& tb, const StreamIndex& sb,
                               std::span<const cost::OpCost> costs_b, double tol, int threads) {
  InsertedPeriod r;
  r.period_s = tb.step_time - ta.step_time;
  auto fail = [&](std::string why) {
    r.failed = std::move(why);
    return r;
  };
  if (a.num_stages != b.num_stages || !(r.period_s > tol)) return fail("the step");
  const size_t queues = sa.queues();
  auto stream_name = [](size_t q) {
    return fmt::format("stage {} stream {}", q / kNumStreams, q % kNumStreams);
  };
  auto near = [&](double x, double y) { return std::abs(x - y) <= tol; };
  auto name = [](const OpGraph& g, int32_t id) {
    const Op& op = g.ops[static_cast<size_t>(id)];
    return fmt::format("{} (stage {}, micro-batch {})", op_label(op), op.stage, op.micro_batch);
  };
  // Per stream: a's ops before `cut` run in b at the same place and times; a block of `len` ops follows,
  // repeating the block before it one period later; a's ops from `cut` follow it, one period later. Where
  // the steady phase starts the cut is not fixed by the ops (every block looks alike), so the times place
  // it: the last op of the period before the insertion may run beside an op of the inserted one.
  std::vector<uint32_t> cut(queues), len(queues);
  for (size_t q = 0; q < queues; ++q) {
    const std::span<const int32_t> xa = sa.of(q), xb = sb.of(q);
    if (xb.size() < xa.size()) return fail(stream_name(q));
    const size_t n = xb.size() - xa.size();
    len[q] = static_cast<uint32_t>(n);
    size_t c = 0;
    while (c < xa.size() && sa.sig[static_cast<size_t>(xa[c])] == sb.sig[static_cast<size_t>(xb[c])] &&
           near(tb.ops[static_cast<size_t>(xb[c])].start, ta.ops[static_cast<size_t>(xa[c])].start) &&
           near(tb.ops[static_cast<size_t>(xb[c])].end, ta.ops[static_cast<size_t>(xa[c])].end))
      ++c;
    cut[q] = static_cast<uint32_t>(c);
    if (c < n) return fail(stream_name(q));  // no period before the inserted one
    for (size_t x = c; x < xa.size(); ++x) {
      const OpTiming &u = ta.ops[static_cast<size_t>(xa[x])], &v = tb.ops[static_cast<size_t>(xb[x + n])];
      if (sa.sig[static_cast<size_t>(xa[x])] != sb.sig[static_cast<size_t>(xb[x + n])] ||
          !near(v.start, u.start + r.period_s) || !near(v.end, u.end + r.period_s))
        return fail(name(a, xa[x]));
    }
  }
  // b's version of a's op `y`: the same op before the cut, the op one block on after it (and for an op one
  // period on, always the op one block on).
  auto version = [&](int32_t y, bool one_on) -> int32_t {
    if (y < 0) return -1;
    const auto j = static_cast<size_t>(y);
    const uint32_t q = sa.queue[j], x = sa.pos[j];
    return sb.of(q)[one_on || x >= cut[q] ? x + len[q] : x];
  };
  // The op a block on from b's op `v` in its stream (-1 past the end).
  auto later = [&](int32_t v) -> int32_t {
    if (v < 0) return -1;
    const auto i = static_cast<size_t>(v);
    const uint32_t q = sb.queue[i];
    const size_t x = sb.pos[i] + len[q];
    return x < sb.of(q).size() ? sb.of(q)[x] : -1;
  };
  // b's op at the place of a's op `y` in its stream.
  auto same_place = [&](int32_t y) -> int32_t {
    return y < 0 ? -1 : sb.of(sa.queue[static_cast<size_t>(y)])[sa.pos[static_cast<size_t>(y)]];
  };
  // The dependencies of a's ops, and the op that started each: where the cut puts them. A dependency may
  // also be the same op in both runs (one that every period waits for, such as the step's weight cast). An
  // op at the same times in both runs may also have them at the same place in its stream: the op there
  // may be a copy in b of one that a runs a period later (a send the op did not wait for, which ran beside
  // the next period's ops in b and alone in a).
  auto fits = [&](const Op& op) {
    const auto u = static_cast<size_t>(op.id);
    const bool moved = sa.pos[u] >= cut[sa.queue[u]];
    const int32_t v = version(op.id, false);
    const Op& w = b.ops[static_cast<size_t>(v)];
    if (w.dep_count != op.dep_count) return false;
    for (uint32_t k = 0; k < op.dep_count; ++k) {
      const int32_t d = a.deps[op.dep_begin + k], got = b.deps[w.dep_begin + k];
      if (got != version(d, moved) && got != version(d, false) && (moved || got != same_place(d)))
        return false;
    }
    const int32_t g = ta.gated_by[u], got = tb.gated_by[static_cast<size_t>(v)];
    return got == version(g, moved) || (!moved && got == same_place(g));
  };
  // In id order over `threads` slices; the first op that does not fit is named.
  const size_t slices = static_cast<size_t>(std::max(1, threads));
  std::vector<size_t> first_misfit(slices, a.ops.size());
  parallel_for(slices, threads, [&](size_t s) {
    for (size_t i = a.ops.size() * s / slices, end = a.ops.size() * (s + 1) / slices; i < end; ++i) {
      prefetch_op_ahead(a.ops, i);
      if (!fits(a.ops[i])) {
        first_misfit[s] = i;
        return;
      }
    }
  });
  if (const size_t i = *std::min_element(first_misfit.begin(), first_misfit.end()); i < a.ops.size())
    return fail(name(a, a.ops[i].id));
  // The inserted ops: the ops a block before them, one period later, depending on the ops one block on (or
  // the same ones) and started by the op one block on.
  std::vector<double> host_s(static_cast<size_t>(b.num_stages), 0.0);
  std::vector<uint8_t> waits(static_cast<size_t>(b.num_stages), 0);
  for (size_t q = 0; q < queues; ++q) {
    for (size_t x = cut[q]; x < cut[q] + len[q]; ++x) {
      const int32_t id = sb.of(q)[x], prev = sb.of(q)[x - len[q]];
      const auto i = static_cast<size_t>(id), p = static_cast<size_t>(prev);
      if (!near(tb.ops[i].start, tb.ops[p].start + r.period_s) ||
          !near(tb.ops[i].end, tb.ops[p].end + r.period_s))
        return fail(name(b, id));
      const Op &op = b.ops[i], &before = b.ops[p];
      if (sb.sig[static_cast<size_t>(id)] != sb.sig[static_cast<size_t>(prev)] ||
          op.dep_count != before.dep_count)
        return fail(name(b, id));
      for (uint32_t k = 0; k < op.dep_count; ++k) {
        const int32_t d = b.deps[before.dep_begin + k], got = b.deps[op.dep_begin + k];
        if (got != later(d) && got != d) return fail(name(b, id));
      }
      if (tb.gated_by[i] != later(tb.gated_by[p])) return fail(name(b, id));
      host_s[q / kNumStreams] += costs_b[i].host_seconds;
      if (op.host_sync) waits[q / kNumStreams] = 1;
    }
  }
  // A host that issues a period's ops slower than the device runs them falls further behind each period.
  for (size_t s = 0; s < host_s.size(); ++s) {
    if (!waits[s] && host_s[s] > r.period_s + tol) return fail(fmt::format("the host of stage {}", s));
  }
  r.ok = true;
  return r;
}

}  // namespace moeplan
