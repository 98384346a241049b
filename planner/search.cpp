// Plan enumeration, pruning, screening and ranking (see search.h).
#include "planner/search.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <map>
#include <mutex>
#include <set>
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

// Value of a dotted key in a plan's JSON form, or null when absent (or an object).
const nlohmann::json* json_at(const nlohmann::json& j, const std::string& key) {
  const nlohmann::json* cur = &j;
  size_t start = 0;
  while (true) {
    const size_t dot = key.find('.', start);
    const std::string part = key.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (!cur->is_object() || !cur->contains(part)) return nullptr;
    cur = &(*cur)[part];
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return cur->is_object() ? nullptr : cur;
}

bool matches_fixed(const Plan& p, const SearchSpace& space) {
  if (space.fixed.empty()) return true;
  const nlohmann::json j = io::plan_to_json(p);
  for (const auto& [key, value] : space.fixed) {
    const nlohmann::json* v = json_at(j, key);
    if (!v || *v != value) return false;
  }
  return true;
}

}  // namespace

std::string describe(const Plan& p) {
  const char* rc = p.recompute == Recompute::kNone        ? "none"
                   : p.recompute == Recompute::kSelective ? "sel"
                   : p.recompute == Recompute::kSar       ? "sar"
                                                          : "full";
  std::string ov = p.overlap.intra_op ? "intra" : (p.overlap.inter_op ? "inter" : "none");
  if (p.overlap.cross_micro_batch) ov = ov == "none" ? "xmb" : ov + "+xmb";
  if (p.pipeline.schedule == Schedule::kDualPipeV) ov += " dualpipev";
  const char* disp = p.experts.dispatch == Dispatch::kAllToAll    ? "a2a"
                     : p.experts.dispatch == Dispatch::kAllGather ? "ag"
                                                                  : "dedup";
  return fmt::format("tp{} sp{} cp{} | ep{} etp{} {} | pp{} v{} | dp{} mb{} z{} | {} | {} | {}{}{}",
                     p.attention.tp, p.attention.sp, p.attention.cp, p.experts.ep, p.experts.etp, disp,
                     p.pipeline.pp, p.pipeline.vpp, p.gpus > 0 ? p.dp() : 0, p.micro_batch, p.data.zero, rc,
                     ov, name_of(p.precision),
                     p.compression.grad_sync == GradSync::kBf16AllToAll        ? " g16"
                     : p.compression.grad_sync == GradSync::kBf16ReduceScatter ? " rs16"
                                                                               : "",
                     p.compression.dispatch == DispatchPrecision::kFp8 ? " d8" : "");
}

bool tied_with_best(const Prediction& best, const Prediction& p) {
  return p.tokens_per_s_high >= best.tokens_per_s_low;
}

void prefer_memory_margin_among_ties(std::vector<RankedPlan>& ranked) {
  if (ranked.empty() || !ranked.front().prediction.memory.fits()) return;
  const Prediction best = ranked.front().prediction;
  const auto tied_end = std::find_if(ranked.begin(), ranked.end(), [&](const RankedPlan& r) {
    return !r.prediction.memory.fits() || !tied_with_best(best, r.prediction);
  });
  std::stable_partition(ranked.begin(), tied_end,
                        [](const RankedPlan& r) { return !r.prediction.memory.tight(); });
}

std::string layout_legend() {
  return "layout: attention tp (tensor, with Megatron's sequence parallelism) sp (Ulysses sequence) cp "
         "(context)\n"
         "  | experts ep (expert) etp (expert tensor) and dispatcher: a2a all-to-all, ag all-gather, dedup "
         "node-deduplicated (DeepEP / HybridEP)\n"
         "  | pp pipeline stages, v virtual stages per GPU | dp data-parallel replicas of the attention "
         "(GPUs / (tp sp cp pp)), mb sequences per micro-batch, z ZeRO stage (1 = distributed optimizer)\n"
         "  | recompute: none, sel (selective modules), full (whole layers), sar (MegaScale-MoE's selective "
         "rematerialization)\n"
         "  | overlap: inter (communication on its own streams), intra (fused GEMM + communication kernels), "
         "xmb (one micro-batch's expert communication behind another's compute, Megatron's combined 1F1B)\n"
         "  | precision, then rs16 (gradients reduce-scattered in BF16), g16 (MegaScale-MoE's BF16 "
         "all-to-all "
         "gradient sync), d8 (FP8 dispatch)";
}

std::optional<nlohmann::json> plan_value(const Plan& plan, const std::string& key) {
  const nlohmann::json j = io::plan_to_json(plan);
  const nlohmann::json* v = json_at(j, key);
  if (!v) return std::nullopt;
  return *v;
}

std::vector<std::string> plan_keys() {
  std::vector<std::string> out;
  // Fields the plan file writes only when set are keys too.
  Plan all;
  all.overlap.cross_micro_batch = true;
  all.precision = Precision::kFp8;
  const nlohmann::json j = io::plan_to_json(all);
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it->is_object()) {
      for (auto jt = it->begin(); jt != it->end(); ++jt) out.push_back(it.key() + "." + jt.key());
    } else {
      out.push_back(it.key());
    }
  }
  return out;
}

void set_plan_key(nlohmann::json& plan, const std::string& key, const nlohmann::json& value) {
  const size_t dot = key.find('.');
  if (dot == std::string::npos) {
    plan[key] = value;
  } else {
    plan[key.substr(0, dot)][key.substr(dot + 1)] = value;
  }
}

Result<nlohmann::json> plan_key_value(const std::string& key, const std::string& text,
                                      const std::string& context) {
  nlohmann::json value = nlohmann::json::parse(text, nullptr, false);
  if (value.is_discarded()) value = text;  // a bare word is a string ("all_gather")
  // A plan with every required field set, holding the value.
  Plan base;
  base.model = "model";
  base.hardware = "hardware";
  base.gpus = base.seq_len = base.global_batch = 1;
  nlohmann::json j = io::plan_to_json(base);
  set_plan_key(j, key, value);
  Result<Plan> check = io::plan_from_json(j, context);
  if (!check) return check.error();
  return *plan_value(check.value(), key);
}

int64_t for_each_plan(const ModelSpec& model, const HardwareProfile& hw, const StackProfile& stack,
                      const Job& job, const SearchSpace& space, const PlanVisitor& visit, int64_t stride,
                      int64_t offset) {
  int64_t index = 0;
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
                // Only the dispatchers the stack has (its capabilities).
                const auto& cap = stack.capabilities;
                std::vector<Dispatch> dispatches;
                if (stack_has(cap.dispatch, "all_to_all")) dispatches.push_back(Dispatch::kAllToAll);
                if (ep > 1 && stack_has(cap.dispatch, "all_gather"))
                  dispatches.push_back(Dispatch::kAllGather);
                if (ep * etp > g && stack.dispatch_dedup() && stack_has(cap.dispatch, "dedup"))
                  dispatches.push_back(Dispatch::kDedup);
                // A stack with node-deduplicated dispatch only (DeepEP, HybridEP) still runs EP 1 or one
                // node's EP group through the same flex dispatcher.
                if (dispatches.empty()) dispatches.push_back(Dispatch::kDedup);
                for (Dispatch disp : dispatches) {
                  for (int64_t mb : space.micro_batches) {
                    if (job.global_batch % (mb * dp) != 0) continue;
                    const int64_t m = job.global_batch / (mb * dp);
                    if (vpp > 1 && m % pp != 0) continue;
                    for (int64_t zero : space.zero_stages) {
                      for (Recompute rc : space.recomputes) {
                        if (!stack_has(cap.recompute, name_of(rc))) continue;
                        for (Precision prec : space.precisions) {
                          if (!stack_has(cap.precision, name_of(prec))) continue;
                          // Overlap: the most the stack achieves (the invariant "overlap never loses" holds),
                          // with and without the fused intra-operator kernels where they apply.
                          std::vector<bool> intras{false};
                          if (stack.overlaps.intra_op.value && (sp > 1 || ep > 1)) intras.push_back(true);
                          for (bool intra : intras) {
                            std::vector<GradSync> syncs;
                            for (GradSync gs : {GradSync::kFp32ReduceScatter, GradSync::kBf16ReduceScatter,
                                                GradSync::kBf16AllToAll}) {
                              if (gs != GradSync::kFp32ReduceScatter && dp == 1 &&
                                  per_stage / (ep * etp) == 1)
                                continue;
                              if (stack_has(cap.grad_sync, name_of(gs))) syncs.push_back(gs);
                            }
                            for (GradSync sync : syncs) {
                              const int64_t at = index++;
                              if (at % stride != offset) continue;
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
                              // Cross-micro-batch EP overlap where the stack has it and its rules allow it.
                              p.overlap.cross_micro_batch =
                                  stack.overlaps.cross_micro_batch.value && ep > 1 && (pp == 1 || vpp > 1) &&
                                  rc != Recompute::kFull && disp != Dispatch::kAllGather &&
                                  model.mtp_layers <= 1;
                              p.compression.grad_sync = sync;
                              p.compression.dispatch = prec == Precision::kFp8 && ep > 1 &&
                                                               stack_has(cap.dispatch_precision, "fp8")
                                                           ? DispatchPrecision::kFp8
                                                           : DispatchPrecision::kBf16;
                              p.precision = prec;
                              if (prec == Precision::kFp8 && !cap.fp8_recipes.empty() &&
                                  !stack_has(cap.fp8_recipes, name_of(p.fp8_recipe)))
                                p.fp8_recipe = cap.fp8_recipes.front() == "blockwise" ? Fp8Recipe::kBlockwise
                                               : cap.fp8_recipes.front() == "delayed"
                                                   ? Fp8Recipe::kDelayed
                                                   : Fp8Recipe::kTensorwise;
                              p.recompute = rc;
                              visit(at, std::move(p));
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
  return index;
}

std::vector<Plan> enumerate_plans(const ModelSpec& model, const HardwareProfile& hw,
                                  const StackProfile& stack, const Job& job, const SearchSpace& space) {
  std::vector<Plan> out;
  for_each_plan(model, hw, stack, job, space, [&](int64_t, Plan&& p) { out.push_back(std::move(p)); });
  return out;
}

namespace {

// Per-layout costs shared by every plan that differs only in pipeline, ZeRO and gradient compression: one
// layer of each kind for one micro-batch (forward, recompute, backward) through the cost model and the
// engine, and the embedding + output layer.
struct LayerTimes {
  std::vector<double> layer;  // seconds per model layer (computed once per distinct kind of layer)
  double head = 0;            // embedding + output layer + loss, fwd + bwd
  double expert_load_scale = 1;
};

class Screener {
 public:
  Screener(const ModelSpec& m, const HardwareProfile& hw, const StackProfile& st,
           const workload::RoutingDistribution& r)
      : m_(m), hw_(hw), st_(st), routing_(r), cm_(hw, st) {
    cm_.record_extrapolations(false);
  }

  double step_time(const Plan& p) {
    const LayerTimes& lt = layer_times(p);
    const int64_t pp = p.pipeline.pp, vpp = p.pipeline.vpp;
    const auto layers = layers_per_virtual_stage(m_, p);
    std::vector<double> stage(static_cast<size_t>(pp), 0.0);
    int64_t l = 0;
    for (int64_t v = 0; v < pp * vpp; ++v) {
      for (int64_t i = 0; i < layers[static_cast<size_t>(v)]; ++i, ++l) {
        stage[static_cast<size_t>(v % pp)] += lt.layer[static_cast<size_t>(l)];
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
    const int64_t m = p.num_micro_batches();
    const auto tail_key =
        std::make_tuple(p.attention.tp, p.attention.sp, p.attention.cp, p.experts.ep, p.experts.etp, pp, vpp,
                        p.data.zero, static_cast<int>(p.compression.grad_sync), p.overlap.dp_comm, m);
    auto dp = tails_.find(tail_key);
    if (dp == tails_.end()) dp = tails_.emplace(tail_key, data_parallel(p, layers)).first;
    // 1F1B with v chunks: m micro-batches at the slowest stage's pace, plus the others' fill and drain / v.
    // ZeRO-2/3 synchronise (and gather) every micro-batch on the data-parallel stream: beside the stage's
    // compute when overlapped (the slower of the two sets the pace), after it otherwise.
    double slowest = 0, sum = 0, per_mb = 0;
    for (size_t s = 0; s < stage.size(); ++s) {
      slowest = std::max(slowest, stage[s]);
      sum += stage[s];
      per_mb = std::max(per_mb, dp->second[s].per_micro_batch);
    }
    const double pace = per_mb <= 0         ? slowest
                        : p.overlap.dp_comm ? std::max(slowest, per_mb)
                                            : slowest + per_mb;
    // Then the step's data-parallel tail: overlapped, the gradient synchronisation hides behind the last
    // micro-batch's backward (about 2/3 of its time) and the parameter gathers behind the first forward
    // (1/3), except their first layer's; otherwise all of it is exposed.
    double tail = 0;
    for (size_t s = 0; s < stage.size(); ++s) {
      const StageDp& x = dp->second[s];
      double t = x.optimizer;
      if (p.overlap.dp_comm) {
        t += std::max(x.sync_first, x.sync - stage[s] * 2.0 / 3.0);
        if (x.gather > 0) t += std::max(x.gather_first, x.gather - stage[s] / 3.0);
      } else {
        t += x.sync + x.gather;
      }
      tail = std::max(tail, t);
    }
    return d(m) * pace + (sum - slowest) / d(vpp) + tail;
  }

 private:
  const LayerTimes& layer_times(const Plan& p) {
    const auto key = std::make_tuple(p.attention.tp, p.attention.sp, p.attention.cp, p.experts.ep,
                                     p.experts.etp, static_cast<int>(p.experts.dispatch), p.micro_batch,
                                     static_cast<int>(p.recompute), p.overlap.inter_op, p.overlap.intra_op,
                                     static_cast<int>(p.precision) * 8 + static_cast<int>(p.fp8_recipe),
                                     static_cast<int>(p.compression.dispatch));
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
    LayerTimes lt;
    // One pipeline stage, one micro-batch, no data-parallel ops.
    Plan one = p;
    one.pipeline = {};
    one.gpus = p.gpus_per_stage();
    one.global_batch = p.micro_batch * one.dp();
    LoweringOptions lo = lowering_options(hw_, st_);
    lo.data_parallel = false;
    const workload::PlanRouting pr = workload::plan_routing(m_, p, routing_);
    lt.expert_load_scale = lo.expert_load_scale = pr.scale;
    lo.dropped_fraction = pr.load.dropped_fraction;
    // (moe, window, kv_projection, mixer, ffn)
    std::map<std::tuple<bool, int64_t, bool, MixerKind, bool>, double> by_kind;
    for (const LayerSpec& s : m_.layers) {
      const auto k = std::make_tuple(s.moe, s.window, s.kv_projection, s.mixer, s.ffn);
      auto kind = by_kind.find(k);
      if (kind == by_kind.end()) {
        ModelSpec one_layer = m_;
        one_layer.layers = {s};
        lo.embedding_and_head = false;
        kind = by_kind.emplace(k, simulate(lower(one_layer, one, lo))).first;
      }
      lt.layer.push_back(kind->second);
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
    eo.hbm_bytes_per_s = hw_.gpu.hbm_bw_achieved_bytes_per_s.value;
    eo.overlap_compute_efficiency = st_.overlap_compute_efficiency.value;
    return g.ops.empty() ? 0.0 : engine::simulate(g, costs, eo).step_time;
  }

  // Data-parallel work per stage: once per step the gradient synchronisation, the parameter all-gather
  // (ZeRO >= 1) and the optimizer; for ZeRO-2/3 also per micro-batch (gradient reduce-scatter, and ZeRO-3's
  // forward and backward parameter gathers). Layer by layer as the lowering emits them, with the stage's
  // first layer apart: its gradients are synchronised last and its parameters gathered first.
  struct StageDp {
    double optimizer = 0;
    double sync = 0, sync_first = 0;      // whole stage, its first layer
    double gather = 0, gather_first = 0;  // ZeRO-1/2 step-level parameter all-gather
    double per_micro_batch = 0;           // ZeRO-2/3
  };
  std::vector<StageDp> data_parallel(const Plan& p, const std::vector<int64_t>& layers) {
    const int64_t pp = p.pipeline.pp;
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
      double t = 0;
      for (auto [params, group] :
           {std::pair{dense, CommGroup::kAttnReplica}, std::pair{experts, CommGroup::kExpertDp}}) {
        if (params > 0)
          t += cm_.collective_seconds(
              group_comm(p, Collective::kAllGather, group, params * 2.0, DType::kBf16), nullptr, nullptr);
      }
      return t;
    };
    std::vector<StageDp> out(static_cast<size_t>(pp));
    std::vector<double> shard(static_cast<size_t>(pp), 0.0);
    // sync, gather of a layer, per layer kind
    std::map<std::tuple<bool, int64_t, bool, MixerKind, bool>, std::pair<double, double>> by_kind;
    int64_t l = 0;
    for (int64_t v = 0; v < pp * p.pipeline.vpp; ++v) {
      StageDp& st = out[static_cast<size_t>(v % pp)];
      for (int64_t i = 0; i < layers[static_cast<size_t>(v)]; ++i, ++l) {
        const LayerSpec& spec = m_.layers[static_cast<size_t>(l)];
        const ParamBreakdown lp = layer_params(m_, spec);
        const double dense = (lp.total() - lp.routed_experts) / d(p.attention.tp);
        const double experts = lp.routed_experts / d(p.experts.ep * p.experts.etp);
        const auto k = std::make_tuple(spec.moe, spec.window, spec.kv_projection, spec.mixer, spec.ffn);
        auto it = by_kind.find(k);
        if (it == by_kind.end())
          it = by_kind.emplace(k, std::pair{sync(dense, experts), gather(dense, experts)}).first;
        const auto [ls, lg] = it->second;
        if (v < pp && i == 0) st.sync_first = ls, st.gather_first = lg;
        st.sync += ls;
        if (p.data.zero == 1 || p.data.zero == 2) st.gather += lg;
        if (p.data.zero >= 2) st.per_micro_batch += ls + (p.data.zero == 3 ? 2.0 * lg : 0.0);
        shard[static_cast<size_t>(v % pp)] +=
            p.data.zero == 0
                ? dense + experts
                : dense / d(p.attention.sp * p.attention.cp * p.dp()) + experts / d(p.expert_dp());
      }
    }
    for (size_t s = 0; s < out.size(); ++s)
      out[s].optimizer = cm_.memory_bound_seconds(shard[s] * kAdamStepBytesPerParam);
    return out;
  }

  const ModelSpec& m_;
  const HardwareProfile& hw_;
  const StackProfile& st_;
  const workload::RoutingDistribution& routing_;
  cost::CostModel cm_;
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int, int64_t, int, bool, bool, int, int>,
           LayerTimes>
      cache_;
  // The data-parallel work depends on the layout, pipeline, ZeRO stage, gradient sync and micro-batch
  // count only: shared by the plans that differ in precision, recompute, dispatch or intra-op overlap.
  std::map<
      std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, bool, int64_t>,
      std::vector<StageDp>>
      tails_;
};

// The op graph, costs and timeline of a prediction, released (its numbers stay).
void drop_graph(Prediction& p) {
  p.graph = {};
  p.costs = {};
  p.timeline = {};
  p.critical_path = {};  // op ids into the dropped graph: prediction_json would read past its end
}

}  // namespace

double screen_step_time(const ModelSpec& model, const Plan& plan, const HardwareProfile& hw,
                        const StackProfile& stack, const workload::RoutingDistribution& routing) {
  Screener s(model, hw, stack, routing);
  return s.step_time(plan);
}

std::string explain_unmatched_fix(const ModelSpec& model, const HardwareProfile& hw,
                                  const StackProfile& stack, const Job& job, const SearchSpace& space) {
  SearchSpace open = space;
  open.fixed.clear();
  std::vector<std::set<std::string>> seen(space.fixed.size());
  for_each_plan(model, hw, stack, job, open, [&](int64_t, Plan&& p) {
    const nlohmann::json j = io::plan_to_json(p);
    for (size_t i = 0; i < space.fixed.size(); ++i) {
      if (seen[i].size() > 64) continue;
      const nlohmann::json* v = json_at(j, space.fixed[i].first);
      if (v) seen[i].insert(v->dump());
    }
  });
  for (size_t i = 0; i < space.fixed.size(); ++i) {
    const auto& [key, value] = space.fixed[i];
    if (seen[i].contains(value.dump())) continue;
    std::string values;
    for (const std::string& v : seen[i]) values += (values.empty() ? "" : ", ") + v;
    if (values.empty()) values = "none";
    return fmt::format(
        "--fix {}={}: no plan of the search space for this job has this value (the values it has: {}); a "
        "layout the search does not enumerate can be written as a plan file and simulated",
        key, value.dump(), values);
  }
  return "--fix: each pin matches some plan of the search space, but no plan has them all together";
}

SearchResult search(const ModelSpec& model, const HardwareProfile& hw, const StackProfile& stack,
                    const workload::RoutingDistribution& routing, const Job& job, const SearchSpace& space,
                    const SearchOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  SearchResult r;
  // Enumeration and pruning (--fix pins, the legality rules, then the memory model), the space split over
  // the threads by index so that it is never held in memory whole.
  const int threads = std::max(1, options.threads);
  struct Pruned {
    std::vector<Candidate> kept;
    std::map<std::string, int64_t> rejected;
    int64_t enumerated = 0, legal = 0;
    std::optional<Plan> smallest;
    double smallest_bytes = 0;
    int64_t smallest_index = 0;
  };
  std::vector<Pruned> pruned(static_cast<size_t>(threads));
  auto prune = [&](int t) {
    Pruned& out = pruned[static_cast<size_t>(t)];
    // Shared by many plans: in-flight chunks per (pp, vpp, m, combined 1F1B, layer split), routing scale per
    // (tokens, ep).
    std::map<std::tuple<int64_t, int64_t, int64_t, bool, std::vector<int64_t>>,
             std::vector<std::vector<int64_t>>>
        flights;
    std::map<std::pair<int64_t, int64_t>, double> scales;
    for_each_plan(
        model, hw, stack, job, space,
        [&](int64_t index, Plan&& p) {
          if (!matches_fixed(p, space)) return;
          ++out.enumerated;
          const auto v = validate(p, model, hw, /*reasons=*/false);
          if (!v.empty()) {
            ++out.rejected[v.front().rule];
            return;
          }
          ++out.legal;
          // The plan as the stack runs it (predict() does the same): a schedule overlap it lacks is off.
          const Plan run = with_stack_overlaps(p, stack, nullptr);
          const auto fk = std::make_tuple(run.pipeline.pp, run.pipeline.vpp, run.num_micro_batches(),
                                          run.overlap.cross_micro_batch, run.pipeline.layers_per_stage);
          auto fit = flights.find(fk);
          if (fit == flights.end()) fit = flights.emplace(fk, in_flight_by_chunk(model, run)).first;
          const auto sk = std::make_pair(p.micro_batch * p.seq_len / p.attention_mesh(), p.experts.ep);
          auto sit = scales.find(sk);
          if (sit == scales.end())
            sit = scales.emplace(sk, workload::plan_routing(model, p, routing).scale).first;
          const cost::MemoryBreakdown mem =
              cost::memory_per_gpu(model, run, hw, stack, fit->second, sit->second);
          if (!out.smallest || mem.total_low() < out.smallest_bytes) {
            out.smallest = p;
            out.smallest_bytes = mem.total_low();
            out.smallest_index = index;
          }
          if (!mem.fits()) {
            ++out.rejected["memory: does not fit"];
            return;
          }
          out.kept.push_back({std::move(p), 0.0, mem.total_low(), index});
        },
        threads, t);
  };
  {
    std::vector<std::thread> workers;
    for (int t = 1; t < threads; ++t) workers.emplace_back(prune, t);
    prune(0);
    for (auto& w : workers) w.join();
  }
  std::vector<Candidate> fitting;
  r.capacity_bytes = hw.gpu.hbm_capacity_bytes.value;
  int64_t smallest_index = 0;
  for (Pruned& p : pruned) {
    // Smallest need, ties to the earliest plan in the enumeration (whatever the thread split).
    if (p.smallest && (!r.smallest_need_plan || p.smallest_bytes < r.smallest_need_bytes ||
                       (p.smallest_bytes == r.smallest_need_bytes && p.smallest_index < smallest_index))) {
      r.smallest_need_plan = std::move(p.smallest);
      r.smallest_need_bytes = p.smallest_bytes;
      smallest_index = p.smallest_index;
    }
    r.enumerated += p.enumerated;
    r.legal += p.legal;
    for (const auto& [why, n] : p.rejected) r.rejected[why] += n;
    for (auto& c : p.kept) fitting.push_back(std::move(c));
    p.kept = {};
  }
  // The enumeration's order, whatever the thread interleaving.
  std::sort(fitting.begin(), fitting.end(),
            [](const Candidate& a, const Candidate& b) { return a.index < b.index; });
  r.fitting = static_cast<int64_t>(fitting.size());
  if (options.fit_only) {
    r.elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return r;
  }

  // Screening on `threads` threads, each with its own layer-time cache; the calling thread works too and
  // reports progress between plans.
  std::atomic<int64_t> next{0}, done{0};
  auto screen = [&](bool report) {
    Screener s(model, hw, stack, routing);
    const auto total = static_cast<int64_t>(fitting.size());
    for (int64_t i = next++; i < total; i = next++) {
      fitting[static_cast<size_t>(i)].screen_step_s = s.step_time(fitting[static_cast<size_t>(i)].plan);
      const int64_t finished = ++done;
      if (report && options.progress && finished % 256 == 0) options.progress(finished, total);
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(screen, false);
  screen(true);
  for (auto& t : pool) t.join();
  r.screened = static_cast<int64_t>(fitting.size());
  // Fastest estimate first (ties in enumeration order); the plans themselves stay where they are.
  std::vector<uint32_t> by_estimate(fitting.size());
  for (size_t i = 0; i < fitting.size(); ++i) by_estimate[i] = static_cast<uint32_t>(i);
  std::stable_sort(by_estimate.begin(), by_estimate.end(), [&](uint32_t a, uint32_t b) {
    return fitting[a].screen_step_s < fitting[b].screen_step_s;
  });

  // Full simulation of the finalists (see SearchOptions), graphs dropped as soon as their numbers are read.
  size_t finalists = 0;
  const double cutoff =
      fitting.empty() ? 0.0 : fitting[by_estimate.front()].screen_step_s * (1.0 + options.finalist_window);
  while (finalists < fitting.size() && finalists < static_cast<size_t>(options.finalists) &&
         fitting[by_estimate[finalists]].screen_step_s <= cutoff) {
    ++finalists;
  }
  finalists = std::min(fitting.size(), std::max(finalists, static_cast<size_t>(options.top)));
  std::vector<RankedPlan> ranked(finalists);
  std::atomic<size_t> fin{0};
  auto simulate_finalists = [&] {
    for (size_t i = fin++; i < finalists; i = fin++) {
      const Plan& plan = fitting[by_estimate[i]].plan;
      ranked[i] = {plan, predict(model, plan, hw, stack, routing, {.critical_path = true})};
      drop_graph(ranked[i].prediction);
    }
  };
  pool.clear();
  for (int t = 1; t < threads; ++t) pool.emplace_back(simulate_finalists);
  simulate_finalists();
  for (auto& t : pool) t.join();
  r.simulated = static_cast<int64_t>(finalists);
  std::stable_sort(ranked.begin(), ranked.end(), [](const RankedPlan& a, const RankedPlan& b) {
    const bool fa = a.prediction.memory.fits(), fb = b.prediction.memory.fits();
    if (fa != fb) return fa;
    return a.prediction.step_time_s < b.prediction.step_time_s;
  });
  ranked.resize(std::min(ranked.size(), static_cast<size_t>(options.top)));
  if (options.keep_graphs) {
    // Again for the few kept, with their graphs (deterministic: the same numbers).
    std::atomic<size_t> again{0};
    auto resimulate = [&] {
      for (size_t i = again++; i < ranked.size(); i = again++)
        ranked[i].prediction = predict(model, ranked[i].plan, hw, stack, routing, {.critical_path = true});
    };
    pool.clear();
    for (int t = 1; t < threads; ++t) pool.emplace_back(resimulate);
    resimulate();
    for (auto& t : pool) t.join();
  }
  r.plans = std::move(ranked);
  if (options.keep_screened) {
    r.screened_candidates.reserve(fitting.size());
    for (uint32_t i : by_estimate) r.screened_candidates.push_back(std::move(fitting[i]));
  }
  r.elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace moeplan::planner
