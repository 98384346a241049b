// Plan enumeration, pruning, screening and ranking (see search.h).
#include "planner/search.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

#include <fmt/format.h>

#include "simulator/core/model_stats.h"
#include "simulator/cost/cost_model.h"
#include "simulator/cost/memory.h"
#include "simulator/engine/engine.h"
#include "simulator/io/plan_io.h"
#include "simulator/workload/lower.h"

namespace moeplan::planner {
namespace {

double d(int64_t x) {
  return static_cast<double>(x);
}

std::vector<int64_t> divisors(int64_t n, int64_t cap) {
  std::vector<int64_t> out;
  for (int64_t k = 1; k <= std::min(n, cap); ++k) {
    if (n % k == 0) out.push_back(k);
  }
  return out;
}

// Uneven split when the layers do not divide: the first and last virtual stages (which also hold the
// embedding and the output layer + loss) take the smaller shares.
std::vector<int64_t> uneven_split(int64_t layers, int64_t chunks) {
  std::vector<int64_t> out(static_cast<size_t>(chunks), layers / chunks);
  int64_t rem = layers % chunks;
  for (int64_t i = 1; i + 1 < chunks && rem > 0; ++i, --rem) ++out[static_cast<size_t>(i)];
  for (size_t i = 0; rem > 0; ++i, --rem) ++out[i];
  return out;
}

bool matches_fixed(const Plan& p, const SearchSpace& space) {
  if (space.fixed.empty()) return true;
  for (const auto& [key, value] : space.fixed) {
    const auto v = plan_value(p, key);
    if (!v || *v != value) return false;
  }
  return true;
}

}  // namespace

std::string describe(const Plan& p) {
  const char* rc =
      p.recompute == Recompute::kNone ? "none" : (p.recompute == Recompute::kSelective ? "sel" : "full");
  const char* ov = p.overlap.intra_op ? "intra" : (p.overlap.inter_op ? "inter" : "none");
  const char* disp = p.experts.dispatch == Dispatch::kAllToAll    ? "a2a"
                     : p.experts.dispatch == Dispatch::kAllGather ? "ag"
                                                                  : "dedup";
  return fmt::format("tp{} sp{} cp{} | ep{} etp{} {} | pp{} v{} | mb{} z{} | {} | {} | {}{}{}",
                     p.attention.tp, p.attention.sp, p.attention.cp, p.experts.ep, p.experts.etp, disp,
                     p.pipeline.pp, p.pipeline.vpp, p.micro_batch, p.data.zero, rc, ov, name_of(p.precision),
                     p.compression.grad_sync == GradSync::kBf16AllToAll ? " g16" : "",
                     p.compression.dispatch == DispatchPrecision::kFp8 ? " d8" : "");
}

std::optional<nlohmann::json> plan_value(const Plan& plan, const std::string& key) {
  const nlohmann::json j = io::plan_to_json(plan);
  const nlohmann::json* cur = &j;
  size_t start = 0;
  while (true) {
    const size_t dot = key.find('.', start);
    const std::string part = key.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (!cur->is_object() || !cur->contains(part)) return std::nullopt;
    cur = &(*cur)[part];
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  if (cur->is_object()) return std::nullopt;
  return *cur;
}

std::vector<std::string> plan_keys() {
  std::vector<std::string> out;
  const nlohmann::json j = io::plan_to_json(Plan{});
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it->is_object()) {
      for (auto jt = it->begin(); jt != it->end(); ++jt) out.push_back(it.key() + "." + jt.key());
    } else {
      out.push_back(it.key());
    }
  }
  return out;
}

std::vector<Plan> enumerate_plans(const ModelSpec& model, const HardwareProfile& hw,
                                  const StackProfile& stack, const Job& job, const SearchSpace& space) {
  std::vector<Plan> out;
  const int64_t n = job.gpus, g = hw.node.gpus_per_node.value, layers = model.num_layers();
  const int64_t experts = model.moe.num_experts;
  // Context parallelism pays off for long sequences only; below 16k tokens it is not enumerated.
  const std::vector<int64_t> cps =
      job.seq_len >= 16384 ? std::vector<int64_t>{1, 2, 4, 8} : std::vector<int64_t>{1};
  for (int64_t pp : divisors(n, layers)) {
    const int64_t per_stage = n / pp;
    for (int64_t vpp : space.vpps) {
      if ((vpp > 1 && pp == 1) || layers < pp * vpp) continue;
      for (int64_t tp : divisors(per_stage, g)) {
        for (int64_t sp : divisors(per_stage / tp, g / tp)) {
          for (int64_t cp : cps) {
            if ((per_stage / (tp * sp)) % cp != 0) continue;
            const int64_t dp = per_stage / (tp * sp * cp);
            const std::vector<int64_t> eps =
                experts > 0 ? divisors(per_stage, experts) : std::vector<int64_t>{1};
            for (int64_t ep : eps) {
              if (experts > 0 && experts % ep != 0) continue;
              for (int64_t etp : experts > 0 ? divisors(per_stage / ep, g) : std::vector<int64_t>{1}) {
                if (etp > 8) continue;
                std::vector<Dispatch> dispatches{Dispatch::kAllToAll};
                if (ep > 1) dispatches.push_back(Dispatch::kAllGather);
                if (ep * etp > g && stack.dispatch_dedup.value) dispatches.push_back(Dispatch::kDedup);
                for (Dispatch disp : dispatches) {
                  for (int64_t mb : space.micro_batches) {
                    if (job.global_batch % (mb * dp) != 0) continue;
                    const int64_t m = job.global_batch / (mb * dp);
                    if (vpp > 1 && m % pp != 0) continue;
                    for (int64_t zero : space.zero_stages) {
                      for (Recompute rc : space.recomputes) {
                        for (Precision prec : space.precisions) {
                          // Overlap: the most the stack achieves (the invariant "overlap never loses" holds),
                          // with and without the fused intra-operator kernels where they apply.
                          std::vector<bool> intras{false};
                          if (stack.overlaps.intra_op.value && (sp > 1 || ep > 1)) intras.push_back(true);
                          for (bool intra : intras) {
                            std::vector<GradSync> syncs{GradSync::kFp32ReduceScatter};
                            if (dp > 1 || per_stage / (ep * etp) > 1)
                              syncs.push_back(GradSync::kBf16AllToAll);
                            for (GradSync sync : syncs) {
                              Plan p;
                              p.gpus = n;
                              p.seq_len = job.seq_len;
                              p.global_batch = job.global_batch;
                              p.micro_batch = mb;
                              p.attention = {tp, sp, cp};
                              p.experts = {ep, etp, disp};
                              p.pipeline.pp = pp;
                              p.pipeline.vpp = vpp;
                              p.pipeline.schedule = vpp > 1 ? Schedule::kInterleaved1F1B : Schedule::k1F1B;
                              if (layers % (pp * vpp) != 0)
                                p.pipeline.layers_per_stage = uneven_split(layers, pp * vpp);
                              p.data.zero = zero;
                              p.overlap = {stack.overlaps.inter_op.value, intra, stack.overlaps.dp_comm.value,
                                           stack.overlaps.pp_comm.value};
                              p.compression.grad_sync = sync;
                              p.compression.dispatch = prec == Precision::kFp8 && ep > 1
                                                           ? DispatchPrecision::kFp8
                                                           : DispatchPrecision::kBf16;
                              p.precision = prec;
                              p.recompute = rc;
                              out.push_back(std::move(p));
                            }
                          }
                        }
                      }
                    }
                  }
                }
              }
            }
          }
        }
      }
    }
  }
  return out;
}

namespace {

// Per-layout costs shared by every plan that differs only in pipeline, ZeRO and gradient compression: one
// layer of each kind for one micro-batch (forward, recompute, backward) through the cost model and the
// engine, and the embedding + output layer.
struct LayerTimes {
  std::map<std::tuple<bool, int64_t, bool>, double> layer;  // (moe, window, kv_projection) -> seconds
  double head = 0;                                          // embedding + output layer + loss, fwd + bwd
  double expert_load_scale = 1;
};

class Screener {
 public:
  Screener(const ModelSpec& m, const HardwareProfile& hw, const StackProfile& st,
           const cost::RoutingDistribution& r)
      : m_(m), hw_(hw), st_(st), routing_(r), cm_(hw, st) {}

  double step_time(const Plan& p) {
    const LayerTimes& lt = layer_times(p);
    const int64_t pp = p.pipeline.pp, vpp = p.pipeline.vpp;
    const auto layers = layers_per_virtual_stage(m_, p);
    std::vector<double> stage(static_cast<size_t>(pp), 0.0);
    int64_t l = 0;
    for (int64_t v = 0; v < pp * vpp; ++v) {
      for (int64_t i = 0; i < layers[static_cast<size_t>(v)]; ++i, ++l) {
        const LayerSpec& s = m_.layers[static_cast<size_t>(l)];
        stage[static_cast<size_t>(v % pp)] += lt.layer.at({s.moe, s.window, s.kv_projection});
      }
    }
    stage.back() += lt.head;
    // Pipeline sends: exposed when not overlapped (forward activation and backward gradient per micro-batch).
    if (pp > 1) {
      const double bytes = d(p.micro_batch * p.seq_len / p.attention_mesh()) * d(m_.hidden) * 2.0;
      const CommSpec send = group_comm(p, Collective::kSendRecv, CommGroup::kPp, bytes, DType::kBf16);
      const double t_send = cm_.collective_seconds(send, nullptr, nullptr) + st_.host_s_per_micro_batch.value;
      for (auto& t : stage) t += (p.overlap.pp_comm ? 0.1 : 2.0) * t_send * d(vpp);
    }
    // 1F1B with v chunks: m micro-batches at the slowest stage's pace, plus the others' fill and drain / v.
    const int64_t m = p.num_micro_batches();
    const double slowest = *std::max_element(stage.begin(), stage.end());
    double sum = 0;
    for (double t : stage) sum += t;
    double step = d(m) * slowest + (sum - slowest) / d(vpp);
    step += data_parallel_tail(p, layers);
    return step;
  }

 private:
  const LayerTimes& layer_times(const Plan& p) {
    const auto key = std::make_tuple(p.attention.tp, p.attention.sp, p.attention.cp, p.experts.ep,
                                     p.experts.etp, static_cast<int>(p.experts.dispatch), p.micro_batch,
                                     static_cast<int>(p.recompute), p.overlap.inter_op, p.overlap.intra_op,
                                     static_cast<int>(p.precision), static_cast<int>(p.compression.dispatch));
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
    LayerTimes lt;
    // One pipeline stage, one micro-batch, no data-parallel ops.
    Plan one = p;
    one.pipeline = {};
    one.gpus = p.gpus_per_stage();
    one.global_batch = p.micro_batch * one.dp();
    LoweringOptions lo;
    lo.gpus_per_node = hw_.node.gpus_per_node.value;
    lo.data_parallel = false;
    const cost::PlanRouting pr = cost::plan_routing(m_, p, routing_);
    lt.expert_load_scale = lo.expert_load_scale = pr.scale;
    lo.dropped_fraction = pr.load.dropped_fraction;
    for (const LayerSpec& s : m_.layers) {
      const auto k = std::make_tuple(s.moe, s.window, s.kv_projection);
      if (lt.layer.contains(k)) continue;
      ModelSpec one_layer = m_;
      one_layer.layers = {s};
      lo.embedding_and_head = false;
      lt.layer[k] = simulate(lower(one_layer, one, lo));
    }
    ModelSpec no_layers = m_;
    no_layers.layers.clear();
    lo.embedding_and_head = true;
    lt.head = simulate(lower(no_layers, one, lo));
    return cache_.emplace(key, std::move(lt)).first->second;
  }

  double simulate(const OpGraph& g) {
    std::vector<cost::OpCost> costs(g.ops.size());
    for (const Op& op : g.ops) costs[static_cast<size_t>(op.id)] = cm_.cost(op);
    engine::EngineOptions eo;
    eo.comm_sm_fraction = st_.comm_sm_fraction.value;
    eo.hbm_bytes_per_s = hw_.gpu.hbm_bw_achieved_bytes_per_s.value;
    return g.ops.empty() ? 0.0 : engine::simulate(g, costs, eo).step_time;
  }

  // Gradient synchronisation not hidden behind backward, the optimizer, and parameter gathers not hidden
  // behind forward, for the stage holding the most parameters.
  double data_parallel_tail(const Plan& p, const std::vector<int64_t>& layers) {
    const int64_t pp = p.pipeline.pp;
    std::vector<std::pair<double, double>> per_stage(static_cast<size_t>(pp), {0.0, 0.0});  // dense, experts
    double first_dense = 0, first_experts = 0;
    int64_t l = 0;
    for (int64_t v = 0; v < pp * p.pipeline.vpp; ++v) {
      for (int64_t i = 0; i < layers[static_cast<size_t>(v)]; ++i, ++l) {
        const ParamBreakdown lp = layer_params(m_, m_.layers[static_cast<size_t>(l)]);
        const double dense = (lp.total() - lp.routed_experts) / d(p.attention.tp);
        const double experts = lp.routed_experts / d(p.experts.ep * p.experts.etp);
        per_stage[static_cast<size_t>(v % pp)].first += dense;
        per_stage[static_cast<size_t>(v % pp)].second += experts;
        if (l == 0) first_dense = dense, first_experts = experts;
      }
    }
    auto sync = [&](double dense, double experts) {
      double t = 0;
      for (auto [params, group] :
           {std::pair{dense, CommGroup::kAttnReplica}, std::pair{experts, CommGroup::kExpertDp}}) {
        if (params <= 0) continue;
        if (p.compression.grad_sync == GradSync::kBf16AllToAll) {
          t += cm_.collective_seconds(group_comm(p, Collective::kAllToAll, group, params * 2.0, DType::kBf16),
                                      nullptr, nullptr) +
               cm_.memory_bound_seconds(params * 8.0);
        } else {
          const Collective c = p.data.zero == 0 ? Collective::kAllReduce : Collective::kReduceScatter;
          t += cm_.collective_seconds(group_comm(p, c, group, params * 4.0, DType::kFp32), nullptr, nullptr);
        }
      }
      return t;
    };
    auto gather = [&](double dense, double experts) {
      if (p.data.zero == 0) return 0.0;
      return cm_.collective_seconds(
                 group_comm(p, Collective::kAllGather, CommGroup::kAttnReplica, dense * 2.0, DType::kBf16),
                 nullptr, nullptr) +
             cm_.collective_seconds(
                 group_comm(p, Collective::kAllGather, CommGroup::kExpertDp, experts * 2.0, DType::kBf16),
                 nullptr, nullptr);
    };
    double worst = 0;
    for (const auto& [dense, experts] : per_stage) {
      const double shard =
          p.data.zero == 0 ? dense + experts
                           : dense / d(p.attention.sp * p.attention.cp * p.dp()) + experts / d(p.expert_dp());
      double t = cm_.memory_bound_seconds(shard * 30.0);
      if (p.overlap.dp_comm) {
        t += sync(first_dense, first_experts) + gather(first_dense, first_experts);  // one layer each exposed
      } else {
        t += sync(dense, experts) + gather(dense, experts);
      }
      if (p.data.zero >= 2) {
        // Per micro-batch reduce-scatters (ZeRO-2/3) and gathers (forward and backward, ZeRO-3), mostly
        // hidden when overlapped.
        const double per_mb = (p.data.zero == 3 ? 2.0 * gather(dense, experts) : 0.0) + sync(dense, experts);
        t += (p.overlap.dp_comm ? 0.1 : 1.0) * per_mb * d(p.num_micro_batches());
      }
      worst = std::max(worst, t);
    }
    return worst;
  }

  const ModelSpec& m_;
  const HardwareProfile& hw_;
  const StackProfile& st_;
  const cost::RoutingDistribution& routing_;
  cost::CostModel cm_;
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int, int64_t, int, bool, bool, int, int>,
           LayerTimes>
      cache_;
};

// Peak live micro-batch chunks per stage under the plan's schedule (closed form for 1F1B).
std::vector<int64_t> in_flight(const Plan& p) {
  std::vector<int64_t> out;
  const int64_t pp = p.pipeline.pp, m = p.num_micro_batches();
  for (int64_t s = 0; s < pp; ++s) {
    out.push_back(p.pipeline.vpp == 1 ? std::min(pp - s, m)
                                      : peak_in_flight(pipeline_order(s, pp, p.pipeline.vpp, m)));
  }
  return out;
}

}  // namespace

double screen_step_time(const ModelSpec& model, const Plan& plan, const HardwareProfile& hw,
                        const StackProfile& stack, const cost::RoutingDistribution& routing) {
  Screener s(model, hw, stack, routing);
  return s.step_time(plan);
}

SearchResult search(const ModelSpec& model, const HardwareProfile& hw, const StackProfile& stack,
                    const cost::RoutingDistribution& routing, const Job& job, const SearchSpace& space,
                    const SearchOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  SearchResult r;
  std::vector<Plan> all = enumerate_plans(model, hw, stack, job, space);
  // Pruning: --fix pins, the legality rules, then the memory model; split over the threads.
  const int threads = std::max(1, options.threads);
  std::vector<std::vector<Candidate>> kept(static_cast<size_t>(threads));
  std::vector<std::map<std::string, int64_t>> rejected(static_cast<size_t>(threads));
  std::vector<std::array<int64_t, 2>> counts(static_cast<size_t>(threads), {0, 0});  // enumerated, legal
  auto prune = [&](int t) {
    for (size_t i = static_cast<size_t>(t); i < all.size(); i += static_cast<size_t>(threads)) {
      Plan& p = all[i];
      if (!matches_fixed(p, space)) continue;
      ++counts[static_cast<size_t>(t)][0];
      const auto v = validate(p, model, hw);
      if (!v.empty()) {
        ++rejected[static_cast<size_t>(t)][v.front().rule];
        continue;
      }
      ++counts[static_cast<size_t>(t)][1];
      const double scale = cost::plan_routing(model, p, routing).scale;
      const cost::MemoryBreakdown mem = cost::memory_per_gpu(model, p, hw, in_flight(p), scale);
      if (!mem.fits()) {
        ++rejected[static_cast<size_t>(t)]["memory: does not fit"];
        continue;
      }
      kept[static_cast<size_t>(t)].push_back({std::move(p), 0.0, mem.total()});
    }
  };
  {
    std::vector<std::thread> workers;
    for (int t = 1; t < threads; ++t) workers.emplace_back(prune, t);
    prune(0);
    for (auto& w : workers) w.join();
  }
  std::vector<Candidate> fitting;
  for (int t = 0; t < threads; ++t) {
    r.enumerated += counts[static_cast<size_t>(t)][0];
    r.legal += counts[static_cast<size_t>(t)][1];
    for (const auto& [why, n] : rejected[static_cast<size_t>(t)]) r.rejected[why] += n;
    for (auto& c : kept[static_cast<size_t>(t)]) fitting.push_back(std::move(c));
  }
  // A deterministic order whatever the thread interleaving.
  std::stable_sort(fitting.begin(), fitting.end(), [](const Candidate& a, const Candidate& b) {
    return describe(a.plan) < describe(b.plan);
  });
  all.clear();
  r.fitting = static_cast<int64_t>(fitting.size());

  // Screening on `threads` threads, each with its own layer-time cache.
  std::atomic<int64_t> next{0}, done{0};
  auto work = [&] {
    Screener s(model, hw, stack, routing);
    for (int64_t i = next++; i < static_cast<int64_t>(fitting.size()); i = next++) {
      fitting[static_cast<size_t>(i)].screen_step_s = s.step_time(fitting[static_cast<size_t>(i)].plan);
      ++done;
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < std::max(1, options.threads); ++t) pool.emplace_back(work);
  {
    // The calling thread works too and reports progress between plans.
    Screener s(model, hw, stack, routing);
    for (int64_t i = next++; i < static_cast<int64_t>(fitting.size()); i = next++) {
      fitting[static_cast<size_t>(i)].screen_step_s = s.step_time(fitting[static_cast<size_t>(i)].plan);
      ++done;
      if (options.progress && (done % 256 == 0)) options.progress(done, static_cast<int64_t>(fitting.size()));
    }
  }
  for (auto& t : pool) t.join();
  r.screened = static_cast<int64_t>(fitting.size());
  std::stable_sort(fitting.begin(), fitting.end(),
                   [](const Candidate& a, const Candidate& b) { return a.screen_step_s < b.screen_step_s; });

  // Full simulation of the finalists.
  const size_t finalists =
      std::min(fitting.size(), static_cast<size_t>(std::max(options.finalists, options.top)));
  std::vector<RankedPlan> ranked(finalists);
  std::atomic<size_t> fin{0};
  auto simulate_finalists = [&] {
    for (size_t i = fin++; i < finalists; i = fin++) {
      ranked[i] = {fitting[i].plan,
                   predict(model, fitting[i].plan, hw, stack, routing, {.critical_path = true})};
    }
  };
  pool.clear();
  for (int t = 1; t < std::max(1, options.threads); ++t) pool.emplace_back(simulate_finalists);
  simulate_finalists();
  for (auto& t : pool) t.join();
  r.simulated = static_cast<int64_t>(finalists);
  std::stable_sort(ranked.begin(), ranked.end(), [](const RankedPlan& a, const RankedPlan& b) {
    const bool fa = a.prediction.memory.fits(), fb = b.prediction.memory.fits();
    if (fa != fb) return fa;
    return a.prediction.step_time_s < b.prediction.step_time_s;
  });
  ranked.resize(std::min(ranked.size(), static_cast<size_t>(options.top)));
  r.plans = std::move(ranked);
  if (options.keep_screened) r.screened_candidates = std::move(fitting);
  r.elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace moeplan::planner
