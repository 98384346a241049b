// The periodic steady state's arithmetic (predict() uses it; see StepSimulation in predict.h): the figures a
// prediction reports of one simulated run; the check that a run at m0 + d micro-batches is the run at m0 with
// one period of the steady phase inserted, op by op; and the extrapolation of the figures to m0 + k d, from
// those two runs or, where that check fails, from runs at m0, m0 + d and m0 + 2d after checking that the
// second period repeats the first.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "simulator/cost/cost_cache.h"
#include "simulator/engine/engine.h"
#include "simulator/io/op_trace.h"
#include "simulator/predict/predict.h"
#include "simulator/predict/stream_index.h"

namespace moeplan {

// What a prediction reports of one run, with the breakdown of stage `stage`.
struct StepFigures {
  double step_time = 0;
  int64_t events = 0, ops = 0;
  std::vector<double> stage_end;
  StepBreakdown breakdown;
  double spread = 0;                 // sum over the critical path of each op's fit error x its duration
  std::array<double, 4> by_basis{};  // the critical path's seconds by the basis of the numbers that priced it
  std::map<std::string, double> cp_seconds;
  int64_t cp_ops = 0;
  std::vector<OpSummaryRow> summary;
  std::vector<int32_t> critical_path;
};

// The tolerance of inserted_period()'s check in predict(), as a fraction of the later run's step. The two
// runs compute the same op's times at absolute times one period apart, so their rounding differs, and it adds
// up along the run: on Qwen3-235B's interleaved PP16 plans with DeepEP beside compute (a rate change at every
// compute kernel's start and end), ops of runs one period apart differed by up to 5e-10 of the step, while
// the steps extrapolated from those runs matched the whole-step simulation to 4e-10. A real change of
// schedule moves an op by far more: periodic_test refuses an op moved by 1 us at this tolerance.
inline constexpr double kInsertedPeriodTolerance = 1e-9;

// Whether run `b` (m0 + d micro-batches) is run `a` (m0) with one period of the steady phase inserted. Each
// stream of each stage must hold a's ops up to some position, then a block of ops that repeats the block
// before it, then the rest of a's ops (equal in every field that decides their cost, layer and chunk, with
// their dependencies where that reading puts them, or on the same op in both runs, such as the step's weight
// cast). Where the block starts is placed by the times. In time, each of a's ops must run in b at the same
// times or exactly one period later (b's step minus a's), and each inserted op exactly one period after
// the op a block before it; the predecessor that started each op must be the same op, or the op one block
// on. And on each stage, the host must issue one period's ops within the period (or wait for the device
// in it), so that it cannot fall behind over more periods. Then every further period inserts the same
// block, and each figure grows by what the first one added. Times agree to `tol` seconds; `failed` names
// the first op or stream that does not fit. `keys_a`, `keys_b`: each op's cost_fields_hash, where the
// caller has them from pricing (empty: computed here).
struct InsertedPeriod {
  bool ok = false;
  double period_s = 0;
  std::string failed;
};
InsertedPeriod inserted_period(const OpGraph& a, const engine::Timeline& ta, const OpGraph& b,
                               const engine::Timeline& tb, std::span<const cost::OpCost> costs_b, double tol,
                               std::span<const uint64_t> keys_a = {}, std::span<const uint64_t> keys_b = {});

// The same check from the runs' stream indices; `threads` share the walk over a's ops.
InsertedPeriod inserted_period(const OpGraph& a, const engine::Timeline& ta, const StreamIndex& sa,
                               const OpGraph& b, const engine::Timeline& tb, const StreamIndex& sb,
                               std::span<const cost::OpCost> costs_b, double tol, int threads = 1);

// Linear extrapolation of figures at m0 and m0 + d to m0 + k d, each call taking the figure at m0 + 2d too.
// checked(): the second period must repeat the first, times to `tol` seconds, counts and op summary rows
// exactly; failed() names the first figure that did not. trusted(): the runs were checked op by op
// (inserted_period), and the third is not checked (pass the second). The first argument of each call
// receives the result.
class PeriodicExtrapolation {
 public:
  static PeriodicExtrapolation checked(int64_t k, double tol) { return {k, tol}; }
  static PeriodicExtrapolation trusted(int64_t k) { return {k, -1.0}; }

  bool ok() const { return ok_; }
  const std::string& failed() const { return failed_; }

  void time(double& a, double b, double c, const char* what) {
    if (tol_ >= 0 && std::abs(c - 2 * b + a) > tol_) fail(what);
    a += static_cast<double>(k_) * (b - a);
  }
  void count(int64_t& a, int64_t b, int64_t c, const char* what) {
    if (tol_ >= 0 && c - 2 * b + a != 0) fail(what);
    a += k_ * (b - a);
  }
  void times(std::vector<double>& a, const std::vector<double>& b, const std::vector<double>& c,
             const char* what) {
    for (size_t i = 0; i < a.size(); ++i) time(a[i], b[i], c[i], what);
  }
  void times(std::map<std::string, double>& a, const std::map<std::string, double>& b,
             const std::map<std::string, double>& c, const char* what) {
    auto at = [](const std::map<std::string, double>& m, const std::string& key) {
      auto it = m.find(key);
      return it == m.end() ? 0.0 : it->second;
    };
    for (const auto* m : {&b, &c}) {
      for (const auto& [key, v] : *m) a.try_emplace(key, 0.0);
    }
    for (auto& [key, v] : a) time(v, at(b, key), at(c, key), what);
  }
  void figures(StepFigures& a, const StepFigures& b, const StepFigures& c) {
    time(a.step_time, b.step_time, c.step_time, "step time");
    count(a.events, b.events, c.events, "events");
    count(a.ops, b.ops, c.ops, "ops");
    times(a.stage_end, b.stage_end, c.stage_end, "stage end");
    times(a.breakdown.compute, b.breakdown.compute, c.breakdown.compute, "breakdown");
    times(a.breakdown.exposed_comm, b.breakdown.exposed_comm, c.breakdown.exposed_comm, "breakdown");
    time(a.breakdown.bubble, b.breakdown.bubble, c.breakdown.bubble, "bubble");
    time(a.breakdown.host_wait, b.breakdown.host_wait, c.breakdown.host_wait, "bubble");
    time(a.breakdown.optimizer, b.breakdown.optimizer, c.breakdown.optimizer, "optimizer");
    time(a.spread, b.spread, c.spread, "critical path");
    for (size_t i = 0; i < a.by_basis.size(); ++i)
      time(a.by_basis[i], b.by_basis[i], c.by_basis[i], "critical path");
    times(a.cp_seconds, b.cp_seconds, c.cp_seconds, "critical path");
    count(a.cp_ops, b.cp_ops, c.cp_ops, "critical path");
    if (a.summary.size() != b.summary.size() || b.summary.size() != c.summary.size())
      return fail("op summary");
    for (size_t i = 0; i < a.summary.size(); ++i) {
      OpSummaryRow& x = a.summary[i];
      const OpSummaryRow &y = b.summary[i], &z = c.summary[i];
      if (x.stage != y.stage || y.stage != z.stage || x.op != y.op || y.op != z.op || x.phase != y.phase ||
          y.phase != z.phase)
        return fail("op summary");
      count(x.count, y.count, z.count, "op summary");
      time(x.total_s, y.total_s, z.total_s, "op summary");
    }
  }

 private:
  PeriodicExtrapolation(int64_t k, double tol) : k_(k), tol_(tol) {}
  void fail(const char* what) {
    if (ok_) failed_ = what;
    ok_ = false;
  }
  int64_t k_;
  double tol_;
  bool ok_ = true;
  std::string failed_;
};

}  // namespace moeplan
