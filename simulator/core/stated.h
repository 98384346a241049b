// Stated<T>: a number with its source, its basis (measured, derived, assumed, target) and, where nobody
// measured it, the range it may lie in. Stack profiles state every number so; hardware profiles state so the
// numbers that are not plain measurements (the GPU's sustained rate under a training step's load).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

namespace moeplan {

// Where a stack or hardware number comes from. A prediction that rests on assumed or target numbers says so.
enum class Basis : uint8_t {
  kMeasured,  // measured on this software (a kernel or collective benchmark, a per-op trace)
  kDerived,   // computed from measurements with a stated formula
  kAssumed,   // no measurement: reasoning only
  kTarget,    // a capability planned but not built or not yet measured (moerun's design targets)
};
const char* name_of(Basis b);

// The source of an optional number a stack file leaves out (its default holds).
inline constexpr const char* kNotStated = "not stated";

template <class T>
struct Stated {
  Stated() = default;
  Stated(T v, std::string src, Basis b = Basis::kAssumed) : value(v), source(std::move(src)), basis(b) {}

  T value{};
  std::string source;
  Basis basis = Basis::kAssumed;
  // Where a number nobody measured may lie, [low, high] around `value` (its evidence in `source`): the
  // prediction's step time is also given over these (simulator/predict/assumptions.h). Stack files state one
  // for every assumed or target number of these kinds; unset for a measured or tightly derived one.
  std::optional<std::pair<T, T>> range;
};

}  // namespace moeplan
