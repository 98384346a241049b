// The step over the stack's ranged numbers (one prediction per number and end, then the two corners), and a
// ranking of plans checked at the same ends.
#include "simulator/predict/assumptions.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string_view>

#include "simulator/core/parallel.h"
#include "simulator/predict/predict.h"

namespace moeplan {

double AssumptionEffect::swing(double step) const {
  return std::max(std::abs(step_at_low - step), std::abs(step_at_high - step));
}

namespace {

// The numbers of a prediction that state a range: the stack's, then the hardware profile's (its sustained
// tensor-core rates), read once: their values, and each end that differs from its value (the number's index
// here, and whether it is the high end).
struct Ranged {
  struct Number {
    const char* path;  // as the file names it
    const Stated<double>* number;
    double unit;
    size_t stack_index;  // into StackProfile::numbers() (a stack number)
    const char* dtype;   // the key under gpu.sustained_rate (a hardware number), else null
  };
  const StackProfile& stack;
  const HardwareProfile& hw;
  StackProfile probe;  // numbers() hands out mutable pointers: read through a copy
  std::vector<Number> numbers;
  std::vector<double> values;
  std::vector<std::pair<size_t, bool>> ends;

  Ranged(const Ranged&) = delete;
  Ranged& operator=(const Ranged&) = delete;
  // `fp8`: whether an FP8 GEMM is priced (the FP8 rate prices nothing in a BF16 plan).
  Ranged(const StackProfile& s, const HardwareProfile& h, bool fp8) : stack(s), hw(h), probe(s) {
    const std::vector<StackProfile::Number> ns = probe.numbers();
    for (size_t i = 0; i < ns.size(); ++i) {
      if (ns[i].number->range) numbers.push_back({ns[i].path, ns[i].number, ns[i].unit, i, nullptr});
    }
    struct Rate {
      const char* dtype;
      const char* path;
    };
    for (const Rate& r : {Rate{"bf16", "gpu.sustained_rate.bf16"}, Rate{"fp8", "gpu.sustained_rate.fp8"}}) {
      const auto it = hw.gpu.sustained_rate.find(r.dtype);
      if ((!fp8 && r.dtype == std::string_view("fp8")) || it == hw.gpu.sustained_rate.end() ||
          !it->second.range)
        continue;
      numbers.push_back({r.path, &it->second, 1.0, 0, r.dtype});
    }
    for (size_t j = 0; j < numbers.size(); ++j) {
      const Stated<double>& n = *numbers[j].number;
      if (n.range->first != n.value) ends.emplace_back(j, false);
      if (n.range->second != n.value) ends.emplace_back(j, true);
      values.push_back(n.value);
    }
  }
  const Number& number(size_t j) const { return numbers[j]; }
  double end_value(const std::pair<size_t, bool>& e) const {
    const auto& r = *number(e.first).number->range;
    return e.second ? r.second : r.first;
  }
  // The plan's step with the ranged numbers set to `set` (`fallback` if the plan is illegal).
  // `fit`: the cost model's fit of `hw`, the same for every setting (it reads no stack number and no
  // sustained rate); `lowerings`: the op graphs of settings that lower the plan alike, shared.
  double step_with(const ModelSpec& model, const Plan& plan,
                   const std::shared_ptr<const cost::CostModel::HardwareFit>& fit,
                   const std::shared_ptr<LoweringCache>& lowerings,
                   const workload::RoutingDistribution& routing, const std::vector<double>& set,
                   double fallback) const {
    StackProfile s = stack;
    const std::vector<StackProfile::Number> ns = s.numbers();
    // The hardware profile is copied only where one of its numbers moves.
    std::optional<HardwareProfile> moved;
    for (size_t j = 0; j < numbers.size(); ++j) {
      const Number& n = numbers[j];
      if (!n.dtype) {
        ns[n.stack_index].number->value = set[j];
      } else if (set[j] != values[j]) {
        if (!moved) moved = hw;
        moved->gpu.sustained_rate.at(n.dtype).value = set[j];
      }
    }
    const Prediction p = predict(model, plan, moved ? *moved : hw, s, routing,
                                 {.critical_path = false,
                                  .op_summary = false,
                                  .threads = 1,
                                  .hardware_fit = fit,
                                  .lowerings = lowerings});
    return p.violations.empty() ? p.step_time_s : fallback;
  }
  // The values with end `e` alone moved.
  std::vector<double> with_end(const std::pair<size_t, bool>& e) const {
    std::vector<double> set = values;
    set[e.first] = end_value(e);
    return set;
  }
};

// The stack with the numbers that price nothing of `model` left unstated: the recurrent scan's chain time
// where the model has no Gated DeltaNet layer.
StackProfile priced_for(const StackProfile& stack, const ModelSpec& model) {
  StackProfile own = stack;
  if (!model.has_mixer(MixerKind::kLinearAttention)) own.recurrent_scan_chunk_s = {0.0, kNotStated};
  return own;
}

// The same for one plan of the model: also left unstated, the userbuffers' reduce-scatter speed of a plan
// without them, the block-scaled GEMM rate of a plan without block scaling, and the casts' rate of a plan
// that casts nothing (a BF16 plan, unless it casts its gradients for MegaScale-MoE's all-to-all). Ranged
// leaves the FP8 sustained rate out of a BF16 plan.
StackProfile priced_for(const StackProfile& stack, const ModelSpec& model, const Plan& plan) {
  StackProfile own = priced_for(stack, model);
  if (!plan.overlap.tp_comm) own.userbuffers_rs_speed = {1.0, kNotStated};
  if (plan.precision != Precision::kFp8 || plan.fp8_recipe != Fp8Recipe::kBlockwise)
    own.fp8_block_gemm_rate = {1.0, kNotStated};
  if (plan.precision != Precision::kFp8 && plan.compression.grad_sync != GradSync::kBf16AllToAll)
    own.memory_bound_by_kind.cast_forward = own.memory_bound_by_kind.cast_backward = {0.0, kNotStated};
  return own;
}

}  // namespace

AssumptionRange assumption_range(const ModelSpec& model, const Plan& plan, const HardwareProfile& hw,
                                 const StackProfile& stack, const workload::RoutingDistribution& routing,
                                 double step_time_s, int threads) {
  AssumptionRange out;
  out.step_time_s = out.fastest_s = out.slowest_s = step_time_s;
  // A number that prices nothing the plan runs is left out (priced_for).
  const StackProfile own = priced_for(stack, model, plan);
  const Ranged ranged(own, hw, plan.precision == Precision::kFp8);
  for (size_t j = 0; j < ranged.numbers.size(); ++j) {
    const Ranged::Number& num = ranged.number(j);
    const Stated<double>& n = *num.number;
    out.effects.push_back({.path = num.path,
                           .basis = n.basis,
                           .unit = num.unit,
                           .value = n.value,
                           .low = n.range->first,
                           .high = n.range->second,
                           .step_at_low = step_time_s,
                           .step_at_high = step_time_s});
  }
  const auto fit = cost::CostModel::fit_hardware(hw);
  const auto lowerings = std::make_shared<LoweringCache>();
  auto step_at = [&](const std::vector<double>& set) {
    return ranged.step_with(model, plan, fit, lowerings, routing, set, step_time_s);
  };

  // Each number alone at each end that differs from its value.
  const auto& ends = ranged.ends;
  std::vector<double> steps(ends.size());
  parallel_for(ends.size(), threads, [&](size_t i) { steps[i] = step_at(ranged.with_end(ends[i])); });
  for (size_t i = 0; i < ends.size(); ++i) {
    AssumptionEffect& e = out.effects[ends[i].first];
    (ends[i].second ? e.step_at_high : e.step_at_low) = steps[i];
  }

  // The two corners: each number at the end that moved the step its way alone.
  const std::vector<double>& values = ranged.values;
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
  // The first and the plans it is compared with: those not already faster as given (the others were ranked
  // after it for another reason, not by these numbers).
  std::vector<size_t> counted{0};
  for (size_t p = 1; p < plans.size(); ++p) {
    (steps[p] < steps[0] ? out.faster_as_given : counted).push_back(p);
  }
  const StackProfile own = priced_for(stack, model);
  const Ranged ranged(own, hw, std::any_of(plans.begin(), plans.end(), [](const Plan& p) {
                        return p.precision == Precision::kFp8;
                      }));
  const auto& ends = ranged.ends;
  out.ends = static_cast<int64_t>(ends.size());
  if (counted.size() < 2) return out;
  // step[e * counted + k]: plan counted[k] with end e.
  const size_t n = counted.size();
  std::vector<double> step(ends.size() * n);
  const auto fit = cost::CostModel::fit_hardware(hw);
  // Plan by plan, so that only one plan's op graphs are held at a time (its ends share them). An end of a
  // number that prices nothing the plan runs (priced_for) leaves its step as given, unpredicted.
  for (size_t k = 0; k < n; ++k) {
    const size_t p = counted[k];
    const StackProfile own_p = priced_for(stack, model, plans[p]);
    const Ranged priced(own_p, hw, plans[p].precision == Precision::kFp8);
    std::vector<size_t> runs;
    for (size_t e = 0; e < ends.size(); ++e) {
      const std::string_view path = ranged.number(ends[e].first).path;
      const bool prices = std::any_of(priced.numbers.begin(), priced.numbers.end(),
                                      [&](const Ranged::Number& x) { return path == x.path; });
      if (prices) {
        runs.push_back(e);
      } else {
        step[e * n + k] = steps[p];
      }
    }
    const auto lowerings = std::make_shared<LoweringCache>();
    parallel_for(runs.size(), threads, [&](size_t i) {
      const size_t e = runs[i];
      step[e * n + k] =
          ranged.step_with(model, plans[p], fit, lowerings, routing, ranged.with_end(ends[e]), steps[p]);
    });
    out.predictions += static_cast<int64_t>(runs.size());
  }
  for (size_t e = 0; e < ends.size(); ++e) {
    const double* at = &step[e * n];
    const size_t best = static_cast<size_t>(std::min_element(at, at + n) - at);
    if (best == 0 || at[best] >= at[0]) continue;
    const Ranged::Number& num = ranged.number(ends[e].first);
    out.overtakes.push_back({.path = num.path,
                             .at = ranged.end_value(ends[e]),
                             .unit = num.unit,
                             .plan = counted[best],
                             .faster = 1.0 - at[best] / at[0]});
  }
  return out;
}

}  // namespace moeplan
