// GemmGrid: a GEMM table measured on the full product of its m, n and k values (e.g. a library's shape
// sweep), read as a lookup: a shape inside it is priced by interpolating log(time) linearly in log m, log n
// and log k between the eight measured corners around it, and reproduces every measured shape exactly.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "simulator/core/hardware.h"

namespace moeplan::cost {

class GemmGrid {
 public:
  // The grid of a table, or nullopt when its shapes are not the full product of at least two values per
  // dimension (a list of shapes, not a sweep).
  static std::optional<GemmGrid> from_table(const GemmTable& t);

  const std::string& dtype() const { return dtype_; }
  const std::string& source() const { return source_; }
  size_t points() const { return log_s_.size(); }
  // Seconds of one [m x k]·[k x n] GEMM, or nullopt outside the measured ranges.
  std::optional<double> seconds(int64_t m, int64_t n, int64_t k) const;
  // The same shape, interpolated with the measured point at (im, in, ik) left out: from its two neighbours
  // along m (interior points along m only; nullopt at the ends). Scores the interpolation against data it
  // did not see.
  std::optional<double> seconds_without(size_t im, size_t in, size_t ik) const;
  const std::vector<int64_t>& m() const { return m_; }
  const std::vector<int64_t>& n() const { return n_; }
  const std::vector<int64_t>& k() const { return k_; }
  double measured_seconds(size_t im, size_t in, size_t ik) const;

 private:
  size_t at(size_t im, size_t in, size_t ik) const { return (im * n_.size() + in) * k_.size() + ik; }

  std::string dtype_, source_;
  std::vector<int64_t> m_, n_, k_;  // sorted axis values
  std::vector<double> log_s_;       // log seconds, by at()
};

}  // namespace moeplan::cost
