// The step over the stack's ranged numbers (one prediction per number and end, then the two corners), and a
// ranking of plans checked at the same ends.
#include "simulator/predict/assumptions.h"

#include <algorithm>
#include <cmath>

#include "simulator/core/parallel.h"
#include "simulator/predict/predict.h"

namespace moeplan {

double AssumptionEffect::swing(double step) const {
  return std::max(std::abs(step_at_low - step), std::abs(step_at_high - step));
}

namespace {

// The ranged numbers of a stack: indices into StackProfile::numbers().
std::vector<size_t> ranged_numbers(StackProfile stack) {
  std::vector<size_t> out;
  const std::vector<StackProfile::Number> numbers = stack.numbers();
  for (size_t i = 0; i < numbers.size(); ++i) {
    if (numbers[i].number->range) out.push_back(i);
  }
  return out;
}

// The plan's step with `stack`'s numbers at `ranged` set to `values` (`fallback` if the plan is illegal).
double step_with(const ModelSpec& model, const Plan& plan, const HardwareProfile& hw,
                 const StackProfile& stack, const workload::RoutingDistribution& routing,
                 const std::vector<size_t>& ranged, const std::vector<double>& values, double fallback) {
  StackProfile s = stack;
  const std::vector<StackProfile::Number> ns = s.numbers();
  for (size_t j = 0; j < ranged.size(); ++j) ns[ranged[j]].number->value = values[j];
  const Prediction p =
      predict(model, plan, hw, s, routing, {.critical_path = false, .op_summary = false, .threads = 1});
  return p.violations.empty() ? p.step_time_s : fallback;
}

// Each ranged number alone at each end that differs from its value: (number's index in `ranged`, high end).
std::vector<std::pair<size_t, bool>> single_ends(const StackProfile& stack,
                                                 const std::vector<size_t>& ranged) {
  StackProfile s = stack;
  const std::vector<StackProfile::Number> ns = s.numbers();
  std::vector<std::pair<size_t, bool>> out;
  for (size_t j = 0; j < ranged.size(); ++j) {
    const Stated<double>& n = *ns[ranged[j]].number;
    if (n.range->first != n.value) out.emplace_back(j, false);
    if (n.range->second != n.value) out.emplace_back(j, true);
  }
  return out;
}

}  // namespace

AssumptionRange assumption_range(const ModelSpec& model, const Plan& plan, const HardwareProfile& hw,
                                 const StackProfile& stack, const workload::RoutingDistribution& routing,
                                 double step_time_s, int threads) {
  AssumptionRange out;
  out.step_time_s = out.fastest_s = out.slowest_s = step_time_s;
  const std::vector<size_t> ranged = ranged_numbers(stack);
  StackProfile probe = stack;
  const std::vector<StackProfile::Number> numbers = probe.numbers();
  std::vector<double> values;
  for (size_t i : ranged) {
    const Stated<double>& n = *numbers[i].number;
    values.push_back(n.value);
    out.effects.push_back({.path = numbers[i].path,
                           .basis = n.basis,
                           .unit = numbers[i].unit,
                           .value = n.value,
                           .low = n.range->first,
                           .high = n.range->second,
                           .step_at_low = step_time_s,
                           .step_at_high = step_time_s});
  }
  auto step_at = [&](const std::vector<double>& set) {
    return step_with(model, plan, hw, stack, routing, ranged, set, step_time_s);
  };

  // Each number alone at each end that differs from its value.
  const std::vector<std::pair<size_t, bool>> ends = single_ends(stack, ranged);
  std::vector<double> steps(ends.size());
  parallel_for(ends.size(), threads, [&](size_t i) {
    std::vector<double> set = values;
    const AssumptionEffect& e = out.effects[ends[i].first];
    set[ends[i].first] = ends[i].second ? e.high : e.low;
    steps[i] = step_at(set);
  });
  for (size_t i = 0; i < ends.size(); ++i) {
    AssumptionEffect& e = out.effects[ends[i].first];
    (ends[i].second ? e.step_at_high : e.step_at_low) = steps[i];
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
    if (i == 0 && moved_fast) corner[0] = step_at(fast);
    if (i == 1 && moved_slow) corner[1] = step_at(slow);
  });
  // The corners bound every single-number end as well (interactions can make a corner milder than one
  // number alone).
  out.fastest_s = corner[0];
  out.slowest_s = corner[1];
  for (const AssumptionEffect& e : out.effects) {
    out.fastest_s = std::min({out.fastest_s, e.step_at_low, e.step_at_high});
    out.slowest_s = std::max({out.slowest_s, e.step_at_low, e.step_at_high});
  }
  out.predictions = static_cast<int64_t>(ends.size()) + (moved_fast ? 1 : 0) + (moved_slow ? 1 : 0);
  std::stable_sort(out.effects.begin(), out.effects.end(),
                   [&](const auto& a, const auto& b) { return a.swing(step_time_s) > b.swing(step_time_s); });
  return out;
}

AssumptionRanking ranking_over_assumptions(const ModelSpec& model, const std::vector<Plan>& plans,
                                           const std::vector<double>& steps, const HardwareProfile& hw,
                                           const StackProfile& stack,
                                           const workload::RoutingDistribution& routing, int threads) {
  AssumptionRanking out;
  if (plans.size() < 2) return out;
  const std::vector<size_t> ranged = ranged_numbers(stack);
  StackProfile probe = stack;
  const std::vector<StackProfile::Number> numbers = probe.numbers();
  std::vector<double> values;
  for (size_t i : ranged) values.push_back(numbers[i].number->value);
  const std::vector<std::pair<size_t, bool>> ends = single_ends(stack, ranged);
  out.ends = static_cast<int64_t>(ends.size());
  // step[e * plans + p]: plan p with end e.
  std::vector<double> step(ends.size() * plans.size());
  parallel_for(step.size(), threads, [&](size_t i) {
    const size_t e = i / plans.size(), p = i % plans.size();
    std::vector<double> set = values;
    const Stated<double>& n = *numbers[ranged[ends[e].first]].number;
    set[ends[e].first] = ends[e].second ? n.range->second : n.range->first;
    step[i] = step_with(model, plans[p], hw, stack, routing, ranged, set, steps[p]);
  });
  for (size_t e = 0; e < ends.size(); ++e) {
    const double* at = &step[e * plans.size()];
    const size_t best = static_cast<size_t>(std::min_element(at, at + plans.size()) - at);
    if (best == 0 || at[best] >= at[0]) continue;
    const StackProfile::Number& n = numbers[ranged[ends[e].first]];
    out.overtakes.push_back({.path = n.path,
                             .at = ends[e].second ? n.number->range->second : n.number->range->first,
                             .unit = n.unit,
                             .plan = best,
                             .faster = 1.0 - at[best] / at[0]});
  }
  return out;
}

}  // namespace moeplan
