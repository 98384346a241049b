// The step over the stack's ranged numbers: one prediction per number and end, then the two corners.
#include "simulator/predict/assumptions.h"

#include <algorithm>
#include <cmath>

#include "simulator/core/parallel.h"
#include "simulator/predict/predict.h"

namespace moeplan {

double AssumptionEffect::swing(double step) const {
  return std::max(std::abs(step_at_low - step), std::abs(step_at_high - step));
}

AssumptionRange assumption_range(const ModelSpec& model, const Plan& plan, const HardwareProfile& hw,
                                 const StackProfile& stack, const workload::RoutingDistribution& routing,
                                 double step_time_s, int threads) {
  AssumptionRange out;
  out.step_time_s = out.fastest_s = out.slowest_s = step_time_s;
  StackProfile probe = stack;
  std::vector<size_t> ranged;  // indices into numbers()
  const std::vector<StackProfile::Number> numbers = probe.numbers();
  for (size_t i = 0; i < numbers.size(); ++i) {
    const Stated<double>& n = *numbers[i].number;
    if (!n.range) continue;
    ranged.push_back(i);
    out.effects.push_back({.path = numbers[i].path,
                           .basis = n.basis,
                           .unit = numbers[i].unit,
                           .value = n.value,
                           .low = n.range->first,
                           .high = n.range->second,
                           .step_at_low = step_time_s,
                           .step_at_high = step_time_s});
  }
  // The step with some numbers moved: `set[j]` is the value of ranged number j.
  auto step_with = [&](const std::vector<double>& set) {
    StackProfile s = stack;
    const std::vector<StackProfile::Number> ns = s.numbers();
    for (size_t j = 0; j < ranged.size(); ++j) ns[ranged[j]].number->value = set[j];
    const Prediction p =
        predict(model, plan, hw, s, routing, {.critical_path = false, .op_summary = false, .threads = 1});
    return p.violations.empty() ? p.step_time_s : step_time_s;
  };
  std::vector<double> values;
  for (const AssumptionEffect& e : out.effects) values.push_back(e.value);

  // Each number alone at each end that differs from its value.
  struct Probe {
    size_t effect;
    bool high;
  };
  std::vector<Probe> probes;
  for (size_t j = 0; j < out.effects.size(); ++j) {
    const AssumptionEffect& e = out.effects[j];
    if (e.low != e.value) probes.push_back({j, false});
    if (e.high != e.value) probes.push_back({j, true});
  }
  std::vector<double> steps(probes.size());
  parallel_for(probes.size(), threads, [&](size_t i) {
    std::vector<double> set = values;
    const AssumptionEffect& e = out.effects[probes[i].effect];
    set[probes[i].effect] = probes[i].high ? e.high : e.low;
    steps[i] = step_with(set);
  });
  for (size_t i = 0; i < probes.size(); ++i) {
    AssumptionEffect& e = out.effects[probes[i].effect];
    (probes[i].high ? e.step_at_high : e.step_at_low) = steps[i];
  }

  // The two corners: each number at the end that moved the step its way alone.
  std::vector<double> fast = values, slow = values;
  for (size_t j = 0; j < out.effects.size(); ++j) {
    const AssumptionEffect& e = out.effects[j];
    const double lo = std::min(e.step_at_low, e.step_at_high), hi = std::max(e.step_at_low, e.step_at_high);
    if (lo < step_time_s) fast[j] = e.step_at_low <= e.step_at_high ? e.low : e.high;
    if (hi > step_time_s) slow[j] = e.step_at_high >= e.step_at_low ? e.high : e.low;
  }
  std::vector<double> corner(2, step_time_s);
  const bool moved_fast = fast != values, moved_slow = slow != values;
  parallel_for(2, threads, [&](size_t i) {
    if (i == 0 && moved_fast) corner[0] = step_with(fast);
    if (i == 1 && moved_slow) corner[1] = step_with(slow);
  });
  // The corners bound every single-number end as well (interactions can make a corner milder than one
  // number alone).
  out.fastest_s = corner[0];
  out.slowest_s = corner[1];
  for (const AssumptionEffect& e : out.effects) {
    out.fastest_s = std::min({out.fastest_s, e.step_at_low, e.step_at_high});
    out.slowest_s = std::max({out.slowest_s, e.step_at_low, e.step_at_high});
  }
  out.predictions = static_cast<int64_t>(probes.size()) + (moved_fast ? 1 : 0) + (moved_slow ? 1 : 0);
  std::stable_sort(out.effects.begin(), out.effects.end(),
                   [&](const auto& a, const auto& b) { return a.swing(step_time_s) > b.swing(step_time_s); });
  return out;
}

}  // namespace moeplan
