#include "simulator/cost/gemm_grid.h"

#include <algorithm>
#include <cmath>

namespace moeplan::cost {
namespace {

// The distinct values of one dimension, sorted. A table has tens of thousands of points over a few dozen
// values per axis, in runs: each value is looked up among those already seen (a sort of every point's value
// was most of a profile's fit).
std::vector<int64_t> axis(const std::vector<GemmPoint>& pts, int64_t GemmPoint::*dim) {
  std::vector<int64_t> v;
  int64_t last = 0;
  for (const auto& p : pts) {
    const int64_t x = p.*dim;
    if (!v.empty() && x == last) continue;
    last = x;
    const auto it = std::lower_bound(v.begin(), v.end(), x);
    if (it == v.end() || *it != x) v.insert(it, x);
  }
  return v;
}

size_t index_of(const std::vector<int64_t>& v, int64_t x) {
  return static_cast<size_t>(std::lower_bound(v.begin(), v.end(), x) - v.begin());
}

// The bracket of x on a sorted axis (lo index, weight of the upper value in log space); nullopt outside.
std::optional<std::pair<size_t, double>> bracket(const std::vector<int64_t>& v, int64_t x) {
  if (x < v.front() || x > v.back()) return std::nullopt;
  const size_t hi = index_of(v, x);
  if (v[hi] == x) return std::pair<size_t, double>{hi == 0 ? 0 : hi - 1, hi == 0 ? 0.0 : 1.0};
  const size_t lo = hi - 1;
  const double w = std::log(static_cast<double>(x) / static_cast<double>(v[lo])) /
                   std::log(static_cast<double>(v[hi]) / static_cast<double>(v[lo]));
  return std::pair<size_t, double>{lo, w};
}

}  // namespace

std::optional<GemmGrid> GemmGrid::from_table(const GemmTable& t) {
  GemmGrid g;
  g.m_ = axis(t.points, &GemmPoint::m);
  g.n_ = axis(t.points, &GemmPoint::n);
  g.k_ = axis(t.points, &GemmPoint::k);
  if (g.m_.size() < 2 || g.n_.size() < 2 || g.k_.size() < 2) return std::nullopt;
  if (g.m_.size() * g.n_.size() * g.k_.size() != t.points.size()) return std::nullopt;
  g.dtype_ = t.dtype;
  g.source_ = t.source;
  g.log_s_.assign(t.points.size(), std::nan(""));
  for (const auto& p : t.points) {
    if (p.flops_per_s <= 0) return std::nullopt;
    const double s =
        2.0 * static_cast<double>(p.m) * static_cast<double>(p.n) * static_cast<double>(p.k) / p.flops_per_s;
    g.log_s_[g.at(index_of(g.m_, p.m), index_of(g.n_, p.n), index_of(g.k_, p.k))] = std::log(s);
  }
  // A repeated shape leaves another one unset: not a full product.
  if (std::any_of(g.log_s_.begin(), g.log_s_.end(), [](double x) { return std::isnan(x); }))
    return std::nullopt;
  return g;
}

std::optional<double> GemmGrid::seconds(int64_t m, int64_t n, int64_t k) const {
  const auto bm = bracket(m_, m), bn = bracket(n_, n), bk = bracket(k_, k);
  if (!bm || !bn || !bk) return std::nullopt;
  double log_s = 0;
  for (int c = 0; c < 8; ++c) {
    const size_t dm = c & 1, dn = (c >> 1) & 1, dk = (c >> 2) & 1;
    const double w = (dm ? bm->second : 1 - bm->second) * (dn ? bn->second : 1 - bn->second) *
                     (dk ? bk->second : 1 - bk->second);
    if (w == 0) continue;
    log_s += w * log_s_[at(bm->first + dm, bn->first + dn, bk->first + dk)];
  }
  return std::exp(log_s);
}

std::optional<double> GemmGrid::seconds_without(size_t im, size_t in, size_t ik) const {
  if (im == 0 || im + 1 >= m_.size()) return std::nullopt;
  const double lo = std::log(static_cast<double>(m_[im - 1])), hi = std::log(static_cast<double>(m_[im + 1]));
  const double w = (std::log(static_cast<double>(m_[im])) - lo) / (hi - lo);
  return std::exp((1 - w) * log_s_[at(im - 1, in, ik)] + w * log_s_[at(im + 1, in, ik)]);
}

double GemmGrid::measured_seconds(size_t im, size_t in, size_t ik) const {
  return std::exp(log_s_[at(im, in, ik)]);
}

}  // namespace moeplan::cost
