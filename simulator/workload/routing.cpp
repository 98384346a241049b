// Expected busiest expert/rank load and capacity drops under random routing: normal approximations of the
// per-unit loads, and the expected maximum of independent normals by quadrature of its CDF.
#include "simulator/workload/routing.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numbers>

#include "simulator/core/model_stats.h"
#include "simulator/core/status.h"

namespace moeplan::workload {
namespace {

constexpr double kSpan = 8.0;         // a unit's support: mean +- 8 sd, Phi(-8) = 6.2e-16
constexpr double kNegligibleZ = 8.3;  // 1 - Phi(8.3) = 5.2e-17: such a factor of F rounds to 1
constexpr double kTableEdge = 8.5;    // the Phi table covers [-8.5, 8.5]; Phi(-8.5) = 9.5e-18 reads as 0
constexpr int kTableSteps = 64;       // table cells per unit of z (h = 1/64)
constexpr int kGaussNodes = 16;       // Gauss-Legendre nodes per panel
constexpr double kPanelWidth = 3.0;   // panel width, in unit_scale of the sharpest live unit
constexpr int kMaxPanels = 24;        // bounds the cost: nodes = 16 * panels, each a pass over the units
constexpr double kDeadF = 1e-17;      // F below this leaves 1 - F == 1 in double
constexpr double kTailMass = 1e-8;    // sum_i count_i Q(z_i) at the upper end: the cut tail is ~1e-9 sd

const double kInvSqrt2 = 1.0 / std::numbers::sqrt2;
const double kInvSqrt2Pi = std::numbers::inv_sqrtpi / std::numbers::sqrt2;

// Standard normal density phi(z) = exp(-z^2/2)/sqrt(2 pi), CDF Phi(z) = erfc(-z/sqrt 2)/2 and upper tail
// Q(z) = 1 - Phi(z) = erfc(z/sqrt 2)/2 (exact in the tail, unlike 1 - Phi).
double normal_pdf(double z) {
  return kInvSqrt2Pi * std::exp(-0.5 * z * z);
}
double normal_cdf(double z) {
  return 0.5 * std::erfc(-z * kInvSqrt2);
}
double normal_upper_tail(double z) {
  return 0.5 * std::erfc(z * kInvSqrt2);
}

// z with Q(z) = q, 0 < q < 1/2: Newton on log Q (d/dz log Q = -phi/Q) from z0 = sqrt(-2 ln q).
double upper_tail_inverse(double q) {
  double z = std::sqrt(-2.0 * std::log(q));
  for (int it = 0; it < 50; ++it) {
    const double tail = normal_upper_tail(z);
    const double step = (std::log(tail) - std::log(q)) * tail / normal_pdf(z);
    z += step;
    if (std::abs(step) < 1e-12) break;
  }
  return z;
}

// Phi on cells of h = 1/64 over [-8.5, 8.5]: the cubic Hermite interpolant with the exact slope phi at both
// cell ends, kept as a polynomial in t = (z - z_i)/h.
// Error <= max|Phi^(4)| h^4/384 = 0.55 * 2.4e-7/384 = 3.4e-10 (measured 8.6e-11). A read costs ~3 ns against
// ~25 ns for std::erfc, and the integrand reads units x nodes.
class CdfTable {
 public:
  CdfTable() {
    for (size_t i = 0; i < cell_.size(); ++i) {
      const double z = -kTableEdge + static_cast<double>(i) * kH;
      const double f0 = normal_cdf(z), d0 = normal_pdf(z) * kH;
      const double f1 = normal_cdf(z + kH), d1 = normal_pdf(z + kH) * kH;
      cell_[i] = {f0, d0, 3 * (f1 - f0) - 2 * d0 - d1, 2 * (f0 - f1) + d0 + d1};
    }
    cell_.back() = {normal_cdf(kTableEdge), 0, 0, 0};  // read only at z >= 8.5: Phi = 1 - 9.5e-18
  }
  double operator()(double z) const { return at_cell((z + kTableEdge) * kTableSteps); }
  // Phi(z) from the cell coordinate u = (z + 8.5) * 64.
  double at_cell(double u) const {
    u = std::min(std::max(u, 0.0), static_cast<double>(kCells));
    const auto i = static_cast<size_t>(u);
    const double t = u - static_cast<double>(i);
    const Cell& c = cell_[i];
    return c.c0 + t * (c.c1 + t * (c.c2 + t * c.c3));
  }

 private:
  static constexpr double kH = 1.0 / kTableSteps;
  static constexpr size_t kCells = static_cast<size_t>(2 * kTableEdge * kTableSteps);
  struct Cell {
    double c0, c1, c2, c3;  // Phi(z_i + t h) = c0 + c1 t + c2 t^2 + c3 t^3, t in [0, 1]
  };
  std::array<Cell, kCells + 1> cell_{};
};

const CdfTable& cdf_table() {
  static const CdfTable table;
  return table;
}

// Gauss-Legendre nodes x_j (ascending) and weights w_j on [-1, 1]: roots of P_n by Newton from
// cos(pi (j + 3/4)/(n + 1/2)), w_j = 2 / ((1 - x_j^2) P_n'(x_j)^2).
struct GaussLegendre {
  std::array<double, kGaussNodes> x{};
  std::array<double, kGaussNodes> w{};
  GaussLegendre() {
    constexpr double n = kGaussNodes;
    for (size_t j = 0; j < x.size(); ++j) {
      double r = std::cos(std::numbers::pi * (static_cast<double>(j) + 0.75) / (n + 0.5));
      double dp = 1.0;
      for (int it = 0; it < 100; ++it) {
        // Legendre recurrence: (m+1) P_{m+1} = (2m+1) r P_m - m P_{m-1}.
        double p0 = 1.0, p1 = r;
        for (double m = 1; m < n; ++m) {
          const double p2 = ((2 * m + 1) * r * p1 - m * p0) / (m + 1);
          p0 = p1;
          p1 = p2;
        }
        dp = n * (r * p1 - p0) / (r * r - 1.0);
        const double step = p1 / dp;
        r -= step;
        if (std::abs(step) < 1e-16) break;
      }
      x[x.size() - 1 - j] = r;  // ascending
      w[x.size() - 1 - j] = 2.0 / ((1.0 - r * r) * dp * dp);
    }
  }
};

const GaussLegendre& gauss_legendre() {
  static const GaussLegendre rule;
  return rule;
}

// `count` independent copies of N(mean, sd^2); sd = 0 is a constant.
struct NormalUnit {
  double mean = 0;
  double sd = 0;
  int64_t count = 1;
};

// c^n by squaring: log2(n) multiplies, relative error ~ 2 log2(n) eps (std::pow costs ~50 ns).
double integer_power(double c, int64_t n) {
  double r = 1.0;
  for (; n > 0; n >>= 1, c *= c) {
    if (n & 1) r *= c;
  }
  return r;
}

// The x-scale on which a unit shapes F: its sd, narrowed for a group of c copies (whose max has sd
// ~ 1.28 sd / sqrt(2 ln c)).
double unit_scale(const NormalUnit& u) {
  return u.sd / std::sqrt(1.0 + std::log(static_cast<double>(u.count)));
}

// F(x) = prod_i Phi((x - mean_i)/sd_i)^count_i at a batch of ascending points. Units come sorted by mean,
// largest first, and a batch stops once F < 1e-17 at its highest point (1 - F is then 1 at all of them), so
// reads on the low side of the range stop after a few factors. Units with z >= 8.3 at the lowest point are
// skipped.
class MaxCdf {
 public:
  explicit MaxCdf(const std::vector<NormalUnit>& units) {
    for (const NormalUnit& u : units) {
      mean_.push_back(u.mean);
      inv_sd_.push_back(1.0 / u.sd);
      count_.push_back(u.count);
    }
  }
  template <size_t N>
  std::array<double, N> operator()(const std::array<double, N>& x) const {
    const CdfTable& cdf = cdf_table();
    std::array<double, N> f;
    f.fill(1.0);
    for (size_t i = 0; i < mean_.size() && f[N - 1] >= kDeadF; ++i) {
      const double m = mean_[i], s = inv_sd_[i];
      if ((x[0] - m) * s >= kNegligibleZ) continue;
      // Cell coordinate of x: ((x - m) s + 8.5) * 64 = x * scale + shift.
      const double scale = s * kTableSteps, shift = (kTableEdge - m * s) * kTableSteps;
      if (count_[i] == 1) {
#pragma GCC unroll 16
        for (size_t j = 0; j < N; ++j) f[j] *= cdf.at_cell(x[j] * scale + shift);
      } else {
        for (size_t j = 0; j < N; ++j) f[j] *= integer_power(cdf.at_cell(x[j] * scale + shift), count_[i]);
      }
    }
    for (double& v : f) v = v < kDeadF ? 0.0 : v;
    return f;
  }
  double operator()(double x) const {
    return (*this)(std::array<double, 1>{x})[0];
  }

 private:
  std::vector<double> mean_, inv_sd_;
  std::vector<int64_t> count_;
};

// Merges runs of equal neighbours into one unit with their total count.
void merge_equal(std::vector<NormalUnit>& units) {
  size_t kept = 0;
  for (const NormalUnit& u : units) {
    if (kept > 0 && u.mean == units[kept - 1].mean && u.sd == units[kept - 1].sd) {
      units[kept - 1].count += u.count;
    } else {
      units[kept++] = u;
    }
  }
  units.resize(kept);
}

// E[min(cap, max_i X_i)] for independent X_i ~ N(mean_i, sd_i^2), count_i copies each. M = max_i X_i has CDF
// F(x) = prod_i Phi((x - mean_i)/sd_i)^count_i, and when M >= a almost surely
//   E[min(cap, M)] = a + int_a^cap (1 - F(x)) dx.
// lo = max(constant units, max_i(mean_i - 8 sd_i)): F(lo) <= Phi(-8) = 6e-16.
// Units with (lo - mean)/sd >= 8.3 are 1 on [lo, inf) and dropped; equal units merge into one with a count.
// a: the end of a walk up from lo while F < 1e-17 (1 - F == 1 below it).
// b = max_i(mean_i + z* sd_i) with N Q(z*) = 1e-8, N = sum_i count_i: there 1 - F(b) <= sum_i count_i Q(z_i)
// <= 1e-8, and the cut tail int_b^inf (1 - F) is ~1e-8 sd / z*.
// Between a and min(cap, b): composite 16-node Gauss-Legendre, each panel 3 unit_scale of the sharpest unit
// still live at its start (mean_i + z* sd_i above it), at most 24 panels.
// Measured against a 200k-point Simpson reference with std::erfc: |error| <= 2e-7 sd over iid n = 1..1e6,
// 256 distinct overlapping units, mixed sds, zipf loads and caps.
double expected_capped_max(std::vector<NormalUnit> units, double cap) {
  MOEPLAN_ASSERT(!units.empty());
  double lo = -std::numeric_limits<double>::infinity();
  double support_top = -std::numeric_limits<double>::infinity();
  for (const NormalUnit& u : units) {
    lo = std::max(lo, u.mean - kSpan * u.sd);
    support_top = std::max(support_top, u.mean + kSpan * u.sd);
  }
  if (cap <= lo) return cap;
  if (support_top <= lo) return lo;  // every random unit lies below a constant one

  std::erase_if(units, [lo](const NormalUnit& u) { return u.sd <= 0 || lo - u.mean >= kNegligibleZ * u.sd; });
  merge_equal(units);  // neighbours first: uniform routing leaves one unit before the sort
  std::sort(units.begin(), units.end(), [](const NormalUnit& x, const NormalUnit& y) {
    return x.mean != y.mean ? x.mean > y.mean : x.sd > y.sd;
  });
  merge_equal(units);
  MOEPLAN_ASSERT(!units.empty());  // the unit that set support_top > lo survives
  double n = 0;
  for (const NormalUnit& u : units) n += static_cast<double>(u.count);

  const double z_top = upper_tail_inverse(kTailMass / n);
  std::vector<double> live_until(units.size()), scale(units.size());
  double hi = lo;
  for (size_t i = 0; i < units.size(); ++i) {
    live_until[i] = units[i].mean + z_top * units[i].sd;
    scale[i] = kPanelWidth * unit_scale(units[i]);
    hi = std::max(hi, live_until[i]);
  }
  const double top = std::min(cap, hi);
  // Panel width at x: kPanelWidth * the smallest unit_scale among units live above x.
  auto width_at = [&](double x) {
    double w = top - x;
    for (size_t i = 0; i < units.size(); ++i) {
      if (live_until[i] > x) w = std::min(w, scale[i]);
    }
    return w;
  };

  const MaxCdf f(units);
  // Walk up from lo a panel at a time while F is dead (such reads stop after a few factors), then halve the
  // last step twice.
  double a = lo;
  double step = 0;
  for (int i = 0; i < kMaxPanels && a < top; ++i) {
    step = width_at(a);
    if (f(std::min(top, a + step)) > 0) break;
    a = std::min(top, a + step);
  }
  if (a >= top) return top;  // F < 1e-17 up to the cap: min(cap, M) = cap
  for (int i = 0; i < 2; ++i) {
    step *= 0.5;
    if (a + step < top && f(a + step) == 0) a += step;
  }

  std::vector<double> edge{a};
  while (edge.back() < top && edge.size() <= kMaxPanels) {
    edge.push_back(std::min(top, edge.back() + width_at(edge.back())));
  }
  // A short last panel joins the one before (at most 1.5 widths).
  if (edge.size() > 2 &&
      edge[edge.size() - 1] - edge[edge.size() - 2] < 0.5 * (edge[edge.size() - 2] - edge[edge.size() - 3])) {
    edge.erase(edge.end() - 2);
  }
  if (edge.back() < top) {  // more scales than the panel budget: equal panels instead
    edge.resize(kMaxPanels + 1);
    for (size_t p = 0; p < edge.size(); ++p) edge[p] = a + (top - a) * static_cast<double>(p) / kMaxPanels;
  }
  const GaussLegendre& rule = gauss_legendre();
  double integral = 0;
  for (size_t p = 0; p + 1 < edge.size(); ++p) {
    const double mid = 0.5 * (edge[p] + edge[p + 1]);
    const double half = 0.5 * (edge[p + 1] - edge[p]);
    std::array<double, kGaussNodes> x;
    for (size_t j = 0; j < x.size(); ++j) x[j] = mid + half * rule.x[j];
    const std::array<double, kGaussNodes> fx = f(x);
    double panel = 0;
    for (size_t j = 0; j < x.size(); ++j) panel += rule.w[j] * (1.0 - fx[j]);
    integral += half * panel;
  }
  return a + integral;
}

// Dropped load and moments of the kept load for L ~ N(mean, sd^2) over capacity C, with z = (C - mean)/sd and
// Y ~ N(0, 1): min(L, C) = mean + sd * min(Y, z),
//   m1 = E[min(Y, z)]   = z Q(z) - phi(z)
//   m2 = E[min(Y, z)^2] = Phi(z) - z phi(z) + z^2 Q(z)
//   dropped E[(L - C)+] = -sd * m1 = sd phi(z) + (mean - C) Q(z),  kept variance = sd^2 (m2 - m1^2).
struct Clipped {
  double dropped = 0;
  double kept_variance = 0;
};

Clipped clip(double mean, double sd, double capacity) {
  if (sd <= 0) return {std::max(0.0, mean - capacity), 0.0};
  const double z = (capacity - mean) / sd;
  const double q = normal_upper_tail(z), phi = normal_pdf(z);
  const double m1 = z * q - phi;
  const double m2 = (1.0 - q) - z * phi + z * z * q;
  return {-sd * m1, sd * sd * std::max(0.0, m2 - m1 * m1)};
}

// clip() over a run of units, reusing the last result while (mean, sd) repeat (uniform routing).
class ClipCache {
 public:
  explicit ClipCache(double capacity) : capacity_(capacity) {}
  const Clipped& operator()(double mean, double sd) {
    if (!valid_ || mean != mean_ || sd != sd_) {
      last_ = clip(mean, sd, capacity_);
      mean_ = mean;
      sd_ = sd;
      valid_ = true;
    }
    return last_;
  }

 private:
  double capacity_;
  bool valid_ = false;
  double mean_ = 0, sd_ = 0;
  Clipped last_;
};

}  // namespace

RoutingDistribution uniform_routing(int64_t experts) {
  MOEPLAN_ASSERT(experts >= 1);
  return {std::vector<double>(static_cast<size_t>(experts), 1.0 / static_cast<double>(experts))};
}

RoutingDistribution zipf_routing(int64_t experts, double s) {
  MOEPLAN_ASSERT(experts >= 1 && std::isfinite(s) && s >= 0);
  std::vector<double> w(static_cast<size_t>(experts));
  for (size_t e = 0; e < w.size(); ++e) w[e] = std::pow(static_cast<double>(e + 1), -s);
  return routing_from_counts(w);
}

RoutingDistribution routing_from_counts(const std::vector<double>& counts) {
  MOEPLAN_ASSERT(!counts.empty());
  double sum = 0;
  for (double c : counts) {
    MOEPLAN_ASSERT(std::isfinite(c) && c >= 0);
    sum += c;
  }
  MOEPLAN_ASSERT(sum > 0 && std::isfinite(sum));
  RoutingDistribution d{counts};
  for (double& p : d.expert_probability) p /= sum;
  return d;
}

RoutingLoad routing_load(const RoutingDistribution& dist, double tokens, int64_t top_k, int64_t ep,
                         std::optional<double> capacity_factor, bool per_rank_capacity) {
  const auto experts = static_cast<int64_t>(dist.expert_probability.size());
  MOEPLAN_ASSERT(experts >= 1 && ep >= 1 && experts % ep == 0);
  MOEPLAN_ASSERT(top_k >= 1 && top_k <= experts);
  MOEPLAN_ASSERT(std::isfinite(tokens) && tokens >= 0);
  MOEPLAN_ASSERT(!capacity_factor || (std::isfinite(*capacity_factor) && *capacity_factor > 0));
  const auto per_rank = static_cast<size_t>(experts / ep);
  const double a = tokens * static_cast<double>(top_k);

  RoutingLoad load;
  load.assignments = a;
  load.mean_rank_assignments = a / static_cast<double>(ep);
  load.mean_expert_rows = a / static_cast<double>(experts);
  if (a == 0) return load;

  // Per token: expert e is one of the k distinct picks with probability q_e = min(1, k p_e) (variance
  // q_e (1 - q_e)); the number of picks on rank r has mean k P_r and the hypergeometric variance
  // k P_r (1 - P_r) (E - k)/(E - 1). T independent tokens sum them. Drops use these marginal sds; maxima
  // use sd / sqrt(1 - w), w the unit's share p_e or P_r (the units sum to T k: see the header).
  const double e_count = static_cast<double>(experts), k = static_cast<double>(top_k);
  const double without_replacement = experts > 1 ? (e_count - k) / (e_count - 1.0) : 0.0;
  auto max_sd = [](double variance, double share) {
    return std::sqrt(share < 1.0 ? variance / (1.0 - share) : variance);
  };
  std::vector<NormalUnit> expert(static_cast<size_t>(experts));
  std::vector<double> expert_sd(expert.size());  // marginal: sqrt(T q_e (1 - q_e))
  std::vector<NormalUnit> rank(static_cast<size_t>(ep));
  std::vector<double> rank_sd(rank.size());  // marginal
  for (size_t r = 0; r < rank.size(); ++r) {
    double p_rank = 0;
    for (size_t e = r * per_rank; e < (r + 1) * per_rank; ++e) {
      const double p = std::clamp(dist.expert_probability[e], 0.0, 1.0);
      const double q = std::min(1.0, k * p);
      const double variance = tokens * q * (1.0 - q);
      expert[e] = {tokens * q, max_sd(variance, p), 1};
      expert_sd[e] = std::sqrt(variance);
      p_rank += p;
    }
    if (per_rank == 1) {  // the rank is its expert
      rank[r] = expert[r];
      rank_sd[r] = expert_sd[r];
      continue;
    }
    p_rank = std::min(1.0, p_rank);
    const double variance = a * p_rank * (1.0 - p_rank) * without_replacement;
    rank[r] = {a * p_rank, max_sd(variance, p_rank), 1};
    rank_sd[r] = std::sqrt(variance);
  }
  const double inf = std::numeric_limits<double>::infinity();

  if (!capacity_factor) {
    load.busiest_rank_assignments = expected_capped_max(rank, inf);
    load.busiest_expert_rows =
        per_rank == 1 ? load.busiest_rank_assignments : expected_capped_max(expert, inf);
    return load;
  }

  double dropped = 0;
  if (per_rank_capacity) {
    // C_rank = cf*T*k/ep on each rank's load. A rank that drops D_r of its mean mu_r keeps the fraction
    // kappa_r = 1 - D_r/mu_r of every expert's rows (drops spread over its experts in proportion to their
    // load).
    const double c_rank = *capacity_factor * load.mean_rank_assignments;
    ClipCache clip_rank(c_rank);
    for (size_t r = 0; r < rank.size(); ++r) {
      const double d = clip_rank(rank[r].mean, rank_sd[r]).dropped;
      dropped += d;
      const double kept = rank[r].mean > 0 ? 1.0 - d / rank[r].mean : 1.0;
      for (size_t e = r * per_rank; e < (r + 1) * per_rank; ++e) {
        expert[e].mean *= kept;
        expert[e].sd *= kept;
      }
    }
    load.busiest_rank_assignments = expected_capped_max(rank, c_rank);
    load.busiest_expert_rows =
        per_rank == 1 ? load.busiest_rank_assignments : expected_capped_max(expert, c_rank);
  } else {
    // C = cf*T*k/E on each expert's load. A rank's kept load sum_e min(L_e, C) is taken as normal with mean
    // sum_e (mu_e - D_e) and variance sigma_r^2 * sum_e Var(min(L_e, C)) / sum_e sigma_e^2 (the clipped
    // experts' variance, keeping the rank's covariance structure), and is at most (E/ep)*C. Drops and kept
    // variances use the marginal sds.
    const double c_expert = *capacity_factor * load.mean_expert_rows;
    std::vector<NormalUnit> rank_kept = rank;
    ClipCache clip_expert(c_expert);
    for (size_t r = 0; r < rank.size(); ++r) {
      double d_rank = 0, var_kept = 0, var_raw = 0;
      for (size_t e = r * per_rank; e < (r + 1) * per_rank; ++e) {
        const Clipped& c = clip_expert(expert[e].mean, expert_sd[e]);
        d_rank += c.dropped;
        var_kept += c.kept_variance;
        var_raw += expert_sd[e] * expert_sd[e];
      }
      dropped += d_rank;
      rank_kept[r].mean = rank[r].mean - d_rank;
      rank_kept[r].sd = var_raw > 0 ? rank[r].sd * std::sqrt(var_kept / var_raw) : 0.0;
    }
    load.busiest_expert_rows = expected_capped_max(expert, c_expert);
    // One expert per rank: the rank is the expert.
    load.busiest_rank_assignments =
        per_rank == 1 ? load.busiest_expert_rows
                      : expected_capped_max(rank_kept, static_cast<double>(per_rank) * c_expert);
  }
  load.dropped_fraction = std::clamp(dropped / a, 0.0, 1.0);
  return load;
}

double expected_max_std_normal(int64_t n) {
  MOEPLAN_ASSERT(n >= 1);
  return expected_capped_max({NormalUnit{0.0, 1.0, n}}, std::numeric_limits<double>::infinity());
}

int64_t routed_tokens_per_rank(const Plan& plan, int64_t seq) {
  return plan.micro_batch * seq / plan.attention_mesh();
}

PlanRouting plan_routing(const ModelSpec& model, const Plan& plan, const RoutingDistribution& dist) {
  PlanRouting r;
  if (!model.is_moe()) return r;
  // The load of `seq` tokens per sequence and its busiest rank's rows over the mean of the kept ones.
  auto load_of = [&](int64_t seq, RoutingLoad& load, double& scale) {
    const int64_t t = routed_tokens_per_rank(plan, seq);
    load = routing_load(dist, static_cast<double>(t * plan.experts.ep), model.moe.top_k, plan.experts.ep,
                        plan.routing.capacity_factor, false);
    const double kept_mean = load.mean_rank_assignments * (1.0 - load.dropped_fraction);
    scale = kept_mean > 0 ? std::max(1.0, load.busiest_rank_assignments / kept_mean) : 1.0;
  };
  load_of(plan.seq_len, r.load, r.scale);
  // Padded to capacity, every source sends each expert exactly its capacity: no rank is busier.
  if (plan.routing.pad_to_capacity) r.scale = 1.0;
  if (model.encoder_decoder()) {
    load_of(decoder_seq_len(plan.seq_len), r.decoder_load, r.decoder_scale);
    if (plan.routing.pad_to_capacity) r.decoder_scale = 1.0;
  } else {
    r.decoder_load = r.load;
    r.decoder_scale = r.scale;
  }
  return r;
}

}  // namespace moeplan::workload
