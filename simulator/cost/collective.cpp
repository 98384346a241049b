// Collective cost formulas (see collective.h).
#include "simulator/cost/collective.h"

#include <algorithm>
#include <cmath>

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

}  // namespace moeplan::cost
