// Collective cost formulas (see collective.h).
#include "simulator/cost/collective.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "simulator/core/units.h"

namespace moeplan::cost {

Placement place_group(int64_t size, int64_t stride, int64_t gpus_per_node) {
  Placement p;
  p.ranks = std::max<int64_t>(1, size);
  if (stride >= gpus_per_node) {
    p.per_node = 1;
  } else {
    p.per_node = std::min(p.ranks, std::max<int64_t>(1, gpus_per_node / std::max<int64_t>(1, stride)));
  }
  p.nodes = (p.ranks + p.per_node - 1) / p.per_node;
  return p;
}

double busbw_factor(Collective c, int64_t n) {
  const auto r = static_cast<double>(n);
  switch (c) {
    case Collective::kAllReduce:
      return 2.0 * (r - 1.0) / r;
    case Collective::kAllGather:
    case Collective::kReduceScatter:
    case Collective::kAllToAll:
      return (r - 1.0) / r;
    case Collective::kSendRecv:
      return 1.0;
  }
  return 1.0;
}

double alpha_beta_seconds(Collective c, int64_t n, double bytes, double alpha_s, double busbw_bytes_per_s) {
  if (n <= 1 && c != Collective::kSendRecv) return 0.0;
  return alpha_s + bytes * busbw_factor(c, n) / busbw_bytes_per_s;
}

AlphaBetaFit fit_alpha_beta(Collective c, int64_t n, const std::vector<std::pair<double, double>>& points) {
  AlphaBetaFit fit;
  const double f = busbw_factor(c, n);
  // Weighted least squares of t_i = alpha + gamma u_i with weights 1/t_i^2 (relative error).
  double s_w = 0, s_u = 0, s_uu = 0, s_t = 0, s_ut = 0;
  for (const auto& [bytes, busbw] : points) {
    const double u = bytes * f, t = u / busbw, w = 1.0 / (t * t);
    s_w += w, s_u += w * u, s_uu += w * u * u, s_t += w * t, s_ut += w * u * t;
  }
  double alpha = 0, gamma = 0;
  const double det = s_w * s_uu - s_u * s_u;
  if (points.size() >= 2 && det > 0) {
    alpha = (s_uu * s_t - s_u * s_ut) / det;
    gamma = (s_w * s_ut - s_u * s_t) / det;
  }
  if (points.size() < 2 || det <= 0 || alpha < 0 || gamma <= 0) {
    alpha = 0;  // a single point, or a fit that wants negative latency: bandwidth only
    gamma = s_ut / s_uu;
  }
  fit.alpha_s = alpha;
  fit.busbw_bytes_per_s = 1.0 / gamma;
  std::vector<double> large, small;
  for (const auto& [bytes, busbw] : points) {
    const double u = bytes * f, t = u / busbw;
    const double err = std::abs((alpha + gamma * u) / t - 1.0);
    (bytes >= kMiB ? large : small).push_back(err);
    fit.max_rel_error = std::max(fit.max_rel_error, err);
  }
  auto median = [](std::vector<double>& v) {
    if (v.empty()) return 0.0;
    std::nth_element(v.begin(), v.begin() + static_cast<long>(v.size() / 2), v.end());
    return v[v.size() / 2];
  };
  fit.rel_error_large = median(large);
  fit.rel_error_small = median(small);
  return fit;
}

namespace {

double median_of(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::nth_element(v.begin(), v.begin() + static_cast<long>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

// busbw at `bytes` by linear interpolation in (log bytes, log busbw); `pts` sorted by bytes, bytes inside.
double log_interpolate(const std::vector<std::pair<double, double>>& pts, double bytes) {
  auto hi =
      std::upper_bound(pts.begin(), pts.end(), bytes, [](double b, const auto& p) { return b < p.first; });
  if (hi == pts.end()) return pts.back().second;
  if (hi == pts.begin()) return pts.front().second;
  const auto lo = hi - 1;
  const double w = std::log(bytes / lo->first) / std::log(hi->first / lo->first);
  return std::exp(std::log(lo->second) + w * (std::log(hi->second) - std::log(lo->second)));
}

}  // namespace

CurveModel fit_curve(Collective c, int64_t n, const std::vector<std::pair<double, double>>& points) {
  CurveModel m;
  m.fit = fit_alpha_beta(c, n, points);
  m.rel_error_large = m.fit.rel_error_large;
  m.rel_error_small = m.fit.rel_error_small;
  m.max_rel_error = m.fit.max_rel_error;
  if (points.size() < kMinInterpolatedSizes) return m;
  // Both models predict each interior size from the others; the one with the lower median error wins
  // (over sizes >= 1 MiB when there are any). Dense sweeps favour interpolation, sparse smooth ones (e.g.
  // digitized curves with 4x steps) favour the two-parameter line.
  const double f = busbw_factor(c, n);
  std::vector<double> interp_large, interp_small, line_large, line_small;
  std::vector<std::pair<double, double>> interp_pred, line_pred;
  double interp_max = 0, line_max = 0;
  for (size_t i = 1; i + 1 < points.size(); ++i) {
    std::vector<std::pair<double, double>> rest = points;
    rest.erase(rest.begin() + static_cast<long>(i));
    const auto [bytes, busbw] = points[i];
    interp_pred.emplace_back(bytes, log_interpolate(rest, bytes));
    const AlphaBetaFit line = fit_alpha_beta(c, n, rest);
    line_pred.emplace_back(bytes,
                           bytes * f / alpha_beta_seconds(c, n, bytes, line.alpha_s, line.busbw_bytes_per_s));
    const double e_interp = std::abs(busbw / interp_pred.back().second - 1.0);
    const double e_line = std::abs(busbw / line_pred.back().second - 1.0);
    (bytes >= kMiB ? interp_large : interp_small).push_back(e_interp);
    (bytes >= kMiB ? line_large : line_small).push_back(e_line);
    interp_max = std::max(interp_max, e_interp);
    line_max = std::max(line_max, e_line);
  }
  const bool by_large = !interp_large.empty();
  const double interp_score = median_of(by_large ? interp_large : interp_small);
  const double line_score = median_of(by_large ? line_large : line_small);
  m.loo_points = static_cast<int64_t>(interp_large.size() + interp_small.size());
  if (interp_score <= line_score) {
    m.points = points;
    m.loo_busbw = std::move(interp_pred);
    m.rel_error_large = median_of(interp_large);
    m.rel_error_small = median_of(interp_small);
    m.max_rel_error = interp_max;
  } else {
    m.loo_busbw = std::move(line_pred);
    m.rel_error_large = median_of(line_large);
    m.rel_error_small = median_of(line_small);
    m.max_rel_error = line_max;
  }
  return m;
}

double curve_seconds(const CurveModel& m, Collective c, int64_t n, double bytes) {
  if (!m.interpolated()) return alpha_beta_seconds(c, n, bytes, m.fit.alpha_s, m.fit.busbw_bytes_per_s);
  if (n <= 1 && c != Collective::kSendRecv) return 0.0;
  const double f = busbw_factor(c, n);
  const auto& first = m.points.front();
  if (bytes <= first.first) return first.first * f / first.second;  // latency floor
  return bytes * f / log_interpolate(m.points, bytes);
}

namespace {

// One measured size's slowdown at `hot` from its (hot factor, seconds) points, hot factor 1 among them.
HotReceiverSlowdown slowdown_at_size(std::vector<std::pair<double, double>> pts, double hot) {
  std::sort(pts.begin(), pts.end());
  const double uniform = pts.front().second;  // hot factor 1 sorts first (the loader holds hot >= 1)
  auto ratio = [&](size_t i) { return std::max(1.0, pts[i].second / uniform); };
  if (hot <= 1.0) return {1.0, false};
  const size_t last = pts.size() - 1;
  if (hot >= pts[last].first) {
    const double at = last == 0 ? 1.0 : ratio(last);
    return {at * hot / pts[last].first, hot > pts[last].first * (1 + 1e-9)};
  }
  size_t hi = 1;
  while (pts[hi].first < hot) ++hi;
  const double w = (hot - pts[hi - 1].first) / (pts[hi].first - pts[hi - 1].first);
  const double lo_ratio = hi - 1 == 0 ? 1.0 : ratio(hi - 1);
  return {lo_ratio + (ratio(hi) - lo_ratio) * w, false};
}

}  // namespace

const AllToAllSkewTable* skew_table(const std::vector<AllToAllSkewTable>& tables, int64_t ranks,
                                    int64_t nodes) {
  for (const AllToAllSkewTable& t : tables) {
    if (t.ranks == ranks && t.nodes == nodes) return &t;
  }
  return nullptr;
}

std::optional<HotReceiverSlowdown> hot_receiver_slowdown(const AllToAllSkewTable& t, double bytes,
                                                         double hot_factor) {
  // Per size, the mean time at each hot factor (repeated rows are averaged).
  std::map<int64_t, std::map<double, std::pair<double, int>>> by_size;
  for (const AllToAllSkewPoint& p : t.points) {
    auto& [sum, n] = by_size[p.bytes][std::round(p.hot_factor * 1e6) / 1e6];
    sum += p.seconds;
    ++n;
  }
  std::vector<std::pair<double, std::vector<std::pair<double, double>>>> sizes;  // (bytes, (hot, s))
  for (const auto& [size, by_hot] : by_size) {
    if (by_hot.begin()->first != 1.0) continue;  // no uniform exchange measured at this size
    std::vector<std::pair<double, double>> pts;
    for (const auto& [hot, acc] : by_hot) pts.emplace_back(hot, acc.first / acc.second);
    sizes.emplace_back(static_cast<double>(size), std::move(pts));
  }
  if (sizes.empty()) return std::nullopt;
  if (bytes <= sizes.front().first || sizes.size() == 1) {
    HotReceiverSlowdown s = slowdown_at_size(sizes.front().second, hot_factor);
    s.extrapolated |= bytes < sizes.front().first * (1 - 1e-9) || bytes > sizes.front().first * (1 + 1e-9);
    return s;
  }
  if (bytes >= sizes.back().first) {
    HotReceiverSlowdown s = slowdown_at_size(sizes.back().second, hot_factor);
    s.extrapolated |= bytes > sizes.back().first * (1 + 1e-9);
    return s;
  }
  size_t hi = 1;
  while (sizes[hi].first < bytes) ++hi;
  const HotReceiverSlowdown a = slowdown_at_size(sizes[hi - 1].second, hot_factor);
  const HotReceiverSlowdown b = slowdown_at_size(sizes[hi].second, hot_factor);
  const double w = std::log(bytes / sizes[hi - 1].first) / std::log(sizes[hi].first / sizes[hi - 1].first);
  return HotReceiverSlowdown{a.factor + (b.factor - a.factor) * w, a.extrapolated || b.extrapolated};
}

}  // namespace moeplan::cost
