// Routing draws for the replay (see routing_draw.h).
#include "executor/runtime/routing_draw.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

#include "simulator/core/status.h"

namespace moeplan::executor {
namespace {

size_t sz(int64_t v) {
  MOEPLAN_ASSERT(v >= 0);
  return static_cast<size_t>(v);
}

// splitmix64 (Steele, Lea and Flood 2014): the state advances by the golden-ratio increment and each output
// is the state through a bijective mixer, so consecutive outputs, and seeds that differ in one bit, are
// uncorrelated.
uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

class SplitMix {
 public:
  explicit SplitMix(uint64_t seed) : state_(seed) {}
  uint64_t next() { return mix64(state_ += 0x9e3779b97f4a7c15ULL); }
  // Uniform on [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  // Uniform on {0, ..., n - 1}: floor(n u); its bias, under n 2^-53, is far below any count drawn here.
  size_t below(size_t n) { return std::min(n - 1, static_cast<size_t>(uniform() * static_cast<double>(n))); }

 private:
  uint64_t state_;
};

// Ops whose work is the expert rows of a MoE layer (see RoutingDraws).
bool routed_gemm(OpName n) {
  switch (n) {
    case OpName::kExpertFc13:
    case OpName::kExpertFc2:
    case OpName::kA2aFc13:
    case OpName::kFc2A2a:
    case OpName::kAgScatterFc13:
    case OpName::kFc2GatherRs:
      return true;
    default:
      return false;
  }
}
bool towards_experts(OpName n) {
  return n == OpName::kDispatchA2a || n == OpName::kProbsA2a || n == OpName::kA2aFc13;
}
bool from_experts(OpName n) {
  return n == OpName::kCombineA2a || n == OpName::kFc2A2a;
}
bool bytes_per_row(OpName n) {
  switch (n) {
    case OpName::kExpertAct:
    case OpName::kExpertGluClamp:
    case OpName::kExpertBias:
    case OpName::kScatter:
    case OpName::kGather:
    case OpName::kSortChunks:
    case OpName::kUnsortChunks:
      return true;
    default:
      return false;
  }
}

}  // namespace

int64_t DrawnRouting::sent(int64_t src, int64_t dst) const {
  const int64_t s = experts_per_rank();
  const auto first = rows.begin() + static_cast<std::ptrdiff_t>(src * experts + dst * s);
  return std::accumulate(first, first + static_cast<std::ptrdiff_t>(s), int64_t{0});
}

int64_t DrawnRouting::expert_rows(int64_t r, int64_t g) const {
  const int64_t e = r * experts_per_rank() + g;
  int64_t n = 0;
  for (int64_t src = 0; src < ep; ++src) n += rows[sz(src * experts + e)];
  return n;
}

int64_t DrawnRouting::received(int64_t r) const {
  int64_t n = 0;
  for (int64_t src = 0; src < ep; ++src) n += sent(src, r);
  return n;
}

double DrawnRouting::busiest_over_mean() const {
  int64_t most = 0, total = 0;
  for (int64_t r = 0; r < ep; ++r) {
    const int64_t n = received(r);
    most = std::max(most, n);
    total += n;
  }
  return total > 0 ? static_cast<double>(most) * static_cast<double>(ep) / static_cast<double>(total) : 1.0;
}

std::vector<double> inclusion_probabilities(const workload::RoutingDistribution& dist, int64_t top_k) {
  const std::vector<double>& p = dist.expert_probability;
  MOEPLAN_ASSERT(top_k >= 1 && static_cast<size_t>(top_k) <= p.size());
  // pi_e = min(1, c p_e) with sum pi_e = k: experts whose c p_e reaches 1 are capped one at a time, largest
  // first, and c is found again over the rest (c = (k - capped) / (sum of the rest's p)).
  std::vector<size_t> order(p.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&p](size_t a, size_t b) { return p[a] > p[b]; });
  std::vector<double> pi(p.size(), 0.0);
  const auto k = static_cast<double>(top_k);
  double rest = 0;
  for (double v : p) rest += std::max(0.0, v);
  size_t capped = 0;
  while (capped < order.size() && rest > 0 &&
         (k - static_cast<double>(capped)) * std::max(0.0, p[order[capped]]) / rest >= 1.0) {
    rest -= std::max(0.0, p[order[capped]]);
    pi[order[capped]] = 1.0;
    ++capped;
  }
  const double c = rest > 0 ? (k - static_cast<double>(capped)) / rest : 0.0;
  for (size_t i = capped; i < order.size(); ++i) pi[order[i]] = std::min(1.0, c * std::max(0.0, p[order[i]]));
  // Fewer than k experts with any probability (a router trace with idle experts): a token still picks k
  // distinct experts, so the picks left over go to the others in proportion to their room below 1.
  double sum = 0, room = 0;
  for (double v : pi) {
    sum += v;
    room += 1.0 - v;
  }
  if (k - sum > 1e-12 && room > 0) {
    const double deficit = k - sum;
    for (double& v : pi) v += deficit * (1.0 - v) / room;
  }
  return pi;
}

DrawnRouting draw_routing(const std::vector<double>& inclusion, int64_t tokens_per_rank, int64_t ep,
                          uint64_t seed) {
  const auto experts = static_cast<int64_t>(inclusion.size());
  MOEPLAN_ASSERT(experts >= 1 && ep >= 1 && experts % ep == 0 && tokens_per_rank >= 0);
  const double sum = std::accumulate(inclusion.begin(), inclusion.end(), 0.0);
  const auto k = static_cast<int64_t>(std::llround(sum));
  MOEPLAN_ASSERT(k >= 1 && k <= experts && std::abs(sum - static_cast<double>(k)) < 1e-6);
  bool uniform = true;
  for (double v : inclusion) uniform = uniform && std::abs(v - inclusion[0]) < 1e-12;

  DrawnRouting out;
  out.ep = ep;
  out.experts = experts;
  out.rows.assign(sz(ep * experts), 0);
  SplitMix rng(seed);
  std::vector<size_t> perm(sz(experts));
  std::iota(perm.begin(), perm.end(), size_t{0});
  for (int64_t src = 0; src < ep; ++src) {
    int64_t* row = out.rows.data() + src * experts;
    for (int64_t t = 0; t < tokens_per_rank; ++t) {
      if (uniform) {
        // A uniformly random k-subset: the first k places of a partial Fisher-Yates shuffle. perm stays a
        // permutation between tokens, and the shuffle's first k places are uniform whatever it was before.
        for (size_t i = 0; i < sz(k); ++i) {
          std::swap(perm[i], perm[i + rng.below(perm.size() - i)]);
          ++row[perm[i]];
        }
        continue;
      }
      // Systematic sampling over a random order: lay the experts' pi_e end to end on [0, k) in a shuffled
      // order and pick the experts under u, u + 1, ..., u + k - 1 (u uniform on [0, 1)). Each pi_e <= 1, so
      // no expert is picked twice, and expert e is picked with probability exactly pi_e.
      for (size_t i = perm.size() - 1; i > 0; --i) std::swap(perm[i], perm[rng.below(i + 1)]);
      double point = rng.uniform(), edge = 0;
      int64_t picked = 0;
      for (size_t i = 0; i < perm.size() && picked < k; ++i) {
        edge += inclusion[perm[i]];
        while (picked < k && point < edge) {
          ++row[perm[i]];
          ++picked;
          point += 1.0;
        }
      }
      // Rounding in the running sum can leave the last point just past the last edge: it is the last expert.
      for (; picked < k; ++picked) ++row[perm.back()];
    }
  }
  return out;
}

uint64_t routing_seed(uint64_t run_seed, int64_t ep_group, int64_t layer, int64_t micro_batch, int64_t step) {
  uint64_t h = mix64(run_seed + 0x9e3779b97f4a7c15ULL);
  for (int64_t v : {ep_group, layer, micro_batch, step}) h = mix64(h ^ mix64(static_cast<uint64_t>(v) + 1));
  return h;
}

std::string routing_draw_unsupported(const ModelSpec& model, const Plan& plan,
                                     const LoweringOptions& lowering) {
  if (!model.is_moe()) return "a model without routed experts";
  if (plan.routing.capacity_factor) return "a capacity factor (dropped tokens are not drawn)";
  if (model.encoder_decoder()) return "an encoder-decoder (its decoder layers route fewer tokens)";
  if (plan.experts.etp > 1) return "expert tensor parallelism (etp > 1)";
  if (plan.experts.dispatch == Dispatch::kDedup &&
      (lowering.dispatcher == DispatcherKind::kDeepEp || lowering.dispatcher == DispatcherKind::kHybridEp))
    return "DeepEP / HybridEP's node-deduplicated dispatch";
  return {};
}

int64_t routed_tokens_per_rank(const Plan& plan) {
  return workload::routed_tokens_per_rank(plan, plan.seq_len);
}

RoutingDraws::RoutingDraws(std::span<const Op> ops, RoutingDrawSpec spec) : spec_(std::move(spec)) {
  MOEPLAN_ASSERT(spec_.ep >= 1 && spec_.lowered_rows > 0 && !spec_.inclusion.empty());
  MOEPLAN_ASSERT(static_cast<int64_t>(spec_.inclusion.size()) % spec_.ep == 0);
  for (const Op& op : ops) {
    if (op.stage == spec_.stage && op.layer >= 0 && op.micro_batch >= 0 &&
        routed_gemm(static_cast<OpName>(op.name)))
      keys_.emplace_back(op.layer, op.micro_batch);
  }
  std::sort(keys_.begin(), keys_.end());
  keys_.erase(std::unique(keys_.begin(), keys_.end()), keys_.end());
  draws_.resize(keys_.size());
  sums_.ep_rank_rows.assign(sz(spec_.ep), 0.0);
}

void RoutingDraws::draw_step() {
  for (size_t i = 0; i < keys_.size(); ++i) {
    const auto [layer, micro_batch] = keys_[i];
    draws_[i] = draw_routing(spec_.inclusion, spec_.tokens_per_rank, spec_.ep,
                             routing_seed(spec_.run_seed, spec_.ep_group, layer, micro_batch, steps_));
    ++sums_.draws;
    sums_.busiest_over_mean += draws_[i].busiest_over_mean();
    for (int64_t p = 0; p < spec_.ep; ++p)
      sums_.ep_rank_rows[sz(p)] += static_cast<double>(draws_[i].received(p));
  }
  ++steps_;
}

RoutingDraws::Stats RoutingDraws::stats() const {
  Stats out = sums_;
  if (out.draws == 0) return out;
  const auto n = static_cast<double>(out.draws);
  out.busiest_over_mean /= n;
  for (double& v : out.ep_rank_rows) v /= n;
  return out;
}

int64_t RoutingDraws::index_of(const Op& op) const {
  if (steps_ == 0 || op.stage != spec_.stage || op.layer < 0) return -1;
  const std::pair<int32_t, int32_t> key{op.layer, op.micro_batch};
  const auto it = std::lower_bound(keys_.begin(), keys_.end(), key);
  return it == keys_.end() || *it != key ? -1 : static_cast<int64_t>(it - keys_.begin());
}

const DrawnRouting* RoutingDraws::of(const Op& op) const {
  const int64_t i = index_of(op);
  return i < 0 ? nullptr : &draws_[sz(i)];
}

int64_t RoutingDraws::draw_index(const Op& op) const {
  if (!routed_gemm(static_cast<OpName>(op.name)) || std::max<int64_t>(1, op.gemm.groups) != local_experts())
    return -1;
  return index_of(op);
}

std::vector<int64_t> RoutingDraws::expert_rows(const Op& op) const {
  const int64_t i = draw_index(op);
  if (i < 0) return {};
  std::vector<int64_t> rows(sz(local_experts()));
  for (int64_t g = 0; g < local_experts(); ++g) rows[sz(g)] = draws_[sz(i)].expert_rows(spec_.ep_rank, g);
  return rows;
}

std::optional<RoutingDraws::Exchange> RoutingDraws::exchange(const Op& op, int64_t op_values) const {
  const auto name = static_cast<OpName>(op.name);
  if (op.comm.collective != Collective::kAllToAll || op.comm.group != CommGroup::kEp ||
      (!towards_experts(name) && !from_experts(name)))
    return std::nullopt;
  const DrawnRouting* d = of(op);
  if (d == nullptr) return std::nullopt;
  const bool towards = towards_experts(name) == (op.phase != Phase::kBackward);
  const int64_t me = spec_.ep_rank;
  const int64_t per_row =
      std::max<int64_t>(1, std::llround(static_cast<double>(op_values) / spec_.lowered_rows));
  Exchange x{std::vector<int64_t>(sz(spec_.ep)), std::vector<int64_t>(sz(spec_.ep))};
  for (int64_t p = 0; p < spec_.ep; ++p) {
    x.send[sz(p)] = per_row * (towards ? d->sent(me, p) : d->sent(p, me));
    x.recv[sz(p)] = per_row * (towards ? d->sent(p, me) : d->sent(me, p));
    x.send_total += x.send[sz(p)];
    x.recv_total += x.recv[sz(p)];
  }
  return x;
}

std::optional<double> RoutingDraws::row_scale(const Op& op) const {
  if (op.kind != OpKind::kMemoryBound || !bytes_per_row(static_cast<OpName>(op.name))) return std::nullopt;
  const DrawnRouting* d = of(op);
  if (d == nullptr) return std::nullopt;
  return static_cast<double>(d->received(spec_.ep_rank)) / spec_.lowered_rows;
}

}  // namespace moeplan::executor
