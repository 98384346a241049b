// Plan enumeration, pruning, screening and ranking (see search.h).
#include "planner/search.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>
#include <type_traits>
#include <unordered_map>

#include <fmt/format.h>

#include "planner/pipeline_span.h"
#include "simulator/core/hash.h"
#include "simulator/core/model_stats.h"
#include "simulator/core/parallel.h"
#include "simulator/cost/cost_cache.h"
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

// A hash of a cache key: a tuple (or pair) of integers, enums, pointers and integer vectors.
struct KeyHash {
  template <class T>
  static size_t one(const T& x) {
    if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
      size_t h = x.size();
      for (int64_t v : x) h = hash_combine(h, std::hash<int64_t>{}(v));
      return h;
    } else {
      return std::hash<T>{}(x);
    }
  }
  template <class Tuple>
  size_t operator()(const Tuple& t) const {
    return std::apply(
        [](const auto&... x) {
          size_t h = 0;
          ((h = hash_combine(h, one(x))), ...);
          return h;
        },
        t);
  }
};

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

// A plan with every field the plan file writes only when set (switches on, non-default choices), so that
// each of them is a key; its JSON form.
const nlohmann::json& every_field() {
  static const nlohmann::json j = [] {
    Plan all;
    all.overlap.cross_micro_batch = true;
    all.overlap.delay_wgrad = true;
    all.overlap.tp_comm = true;
    all.overlap.shared_experts = true;
    all.experts.fused_index_conversion = true;
    all.experts.fp8_padding = Fp8Padding::kRouter;
    all.data.fp8_param_gather = true;
    all.attention.mla_down_proj = MlaDownProj::kDuplicated;
    all.precision = Precision::kFp8;
    all.routing.pad_to_capacity = true;
    return io::plan_to_json(all);
  }();
  return j;
}

// Value of a dotted key in the plan's JSON form; a switch the file leaves out when off is false.
const nlohmann::json* value_at(const nlohmann::json& j, const std::string& key) {
  static const nlohmann::json off = false;
  if (const nlohmann::json* v = json_at(j, key)) return v;
  const nlohmann::json* written = json_at(every_field(), key);
  return written && written->is_boolean() ? &off : nullptr;
}

bool matches_fixed(const Plan& p, const SearchSpace& space) {
  if (space.fixed.empty()) return true;
  const nlohmann::json j = io::plan_to_json(p);
  for (const auto& [key, value] : space.fixed) {
    const nlohmann::json* v = value_at(j, key);
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
  if (p.overlap.delay_wgrad) ov += "+dw";
  if (p.overlap.tp_comm) ov = ov == "none" ? "ub" : ov + "+ub";
  if (p.overlap.shared_experts) ov = ov == "none" ? "sh" : ov + "+sh";
  if (p.pipeline.schedule == Schedule::kDualPipeV) ov += " dualpipev";
  const char* disp = p.experts.dispatch == Dispatch::kAllToAll    ? "a2a"
                     : p.experts.dispatch == Dispatch::kAllGather ? "ag"
                                                                  : "dedup";
  // Where FP8 pads the experts' rows, when the plan names a way other than the stack's own.
  const char* pad = p.experts.fp8_padding == Fp8Padding::kRouter       ? " rpad"
                    : p.experts.fp8_padding == Fp8Padding::kExperts    ? " epad"
                    : p.experts.fp8_padding == Fp8Padding::kDispatcher ? " dpad"
                    : p.experts.fp8_padding == Fp8Padding::kNone       ? " nopad"
                                                                       : "";
  return fmt::format("tp{} sp{} cp{} | ep{} etp{} {} | pp{} v{} | dp{} mb{} z{} | {} | {} | {}{}{}{}{}{}",
                     p.attention.tp, p.attention.sp, p.attention.cp, p.experts.ep, p.experts.etp, disp,
                     p.pipeline.pp, p.pipeline.vpp, p.gpus > 0 ? p.dp() : 0, p.micro_batch, p.data.zero, rc,
                     ov, name_of(p.precision),
                     p.compression.grad_sync == GradSync::kBf16AllToAll        ? " g16"
                     : p.compression.grad_sync == GradSync::kBf16ReduceScatter ? " rs16"
                                                                               : "",
                     p.compression.dispatch == DispatchPrecision::kFp8 ? " d8" : "", pad,
                     p.data.fp8_param_gather ? " p8" : "", p.cuda_graphs != 0 ? " cg" : "");
}

std::optional<Plan> graphed_variant(const Plan& plan, const ModelSpec& model, const HardwareProfile& hw,
                                    const StackProfile& stack) {
  if (plan.cuda_graphs != 0 || stack.capabilities.cuda_graph_scopes.empty()) return std::nullopt;
  const RuleChecker::Facts facts = rule_facts(model);
  const uint8_t common =
      static_cast<uint8_t>(kGraphAttn | (facts.mamba ? kGraphMamba : 0) | (facts.dense_ffn ? kGraphMlp : 0));
  const uint8_t moe = model.is_moe() ? static_cast<uint8_t>(kGraphMoeRouter | kGraphMoePreprocess) : 0;
  for (const uint8_t extra : {moe, static_cast<uint8_t>(moe & kGraphMoeRouter), uint8_t{0}}) {
    Plan graphed = plan;
    graphed.cuda_graphs = static_cast<uint8_t>(common | extra);
    if (validate(graphed, model, hw, false).empty() && validate_for_stack(graphed, stack, false).empty())
      return graphed;
  }
  return std::nullopt;
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
         "xmb (one micro-batch's expert communication behind another's compute, Megatron's combined 1F1B), "
         "+dw (with its weight gradients delayed past the exchanges, --delay-wgrad-compute), ub (TP "
         "exchanges pipelined with their GEMMs by Transformer Engine's userbuffers, --tp-comm-overlap), sh "
         "(the "
         "shared experts on their own stream beside the dispatch, --moe-shared-expert-overlap)\n"
         "  | precision, then rs16 (gradients reduce-scattered in BF16), g16 (MegaScale-MoE's BF16 "
         "all-to-all "
         "gradient sync), d8 (FP8 dispatch), rpad / epad / dpad / nopad (FP8 pads each expert's rows to "
         "the GEMMs' alignment in the router, the experts or the dispatcher, or not at all, where the plan "
         "names a way other than the stack's own), p8 (FP8 parameters, all-gathered in FP8: "
         "--fp8-param-gather), cg (per-layer CUDA graphs, the plan's cuda_graphs)";
}

std::optional<nlohmann::json> plan_value(const Plan& plan, const std::string& key) {
  const nlohmann::json j = io::plan_to_json(plan);
  const nlohmann::json* v = value_at(j, key);
  if (!v) return std::nullopt;
  return *v;
}

std::vector<std::string> plan_keys() {
  std::vector<std::string> out;
  // Fields the plan file writes only when set are keys too.
  const nlohmann::json& j = every_field();
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
  std::optional<nlohmann::json> read = plan_value(check.value(), key);
  if (!read) return Error{context + ": " + key + " has no value in a plan"};
  return *read;
}

namespace {

// A list of at most N values on the stack: the enumeration's innermost choices, built for every plan.
template <class T, size_t N>
class SmallList {
 public:
  void push_back(T v) { items_[size_++] = v; }
  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }
  const T* begin() const { return items_.data(); }
  const T* end() const { return items_.data() + size_; }

 private:
  std::array<T, N> items_{};
  size_t size_ = 0;
};

}  // namespace

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
                // The share (stride, offset) that visits this mesh's plans: all of them go to one, so the
                // screen's per-layer timings of a mesh (keyed by tp, sp, cp, ep and etp among other fields)
                // are lowered by one thread, not by each. Split plan by plan, every thread lowered every
                // mesh: Internal-352B's screen on two threads took 1.94-2.19 s so, 1.60-1.77 s split by
                // mesh (README). A search pinned to one mesh screens on one thread; it is small.
                uint64_t share = 0;
                for (int64_t v : {tp, sp, cp, ep, etp}) share = hash_combine(share, static_cast<uint64_t>(v));
                // Only the dispatchers the stack has (its capabilities).
                const auto& cap = stack.capabilities;
                SmallList<Dispatch, 3> dispatches;
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
                          SmallList<bool, 2> intras;
                          intras.push_back(false);
                          if (stack.overlaps.intra_op.value && (sp > 1 || ep > 1)) intras.push_back(true);
                          for (bool intra : intras) {
                            SmallList<GradSync, 3> syncs;
                            for (GradSync gs : {GradSync::kFp32ReduceScatter, GradSync::kBf16ReduceScatter,
                                                GradSync::kBf16AllToAll}) {
                              if (gs != GradSync::kFp32ReduceScatter && dp == 1 &&
                                  per_stage / (ep * etp) == 1)
                                continue;
                              if (stack_has(cap.grad_sync, name_of(gs))) syncs.push_back(gs);
                            }
                            // Where FP8 pads each expert's rows: the stack's own way (the plan leaves the
                            // field out) and each other way it can run and the dispatcher allows. Under a
                            // deduplicating dispatcher the router's padding pads the received map, the rows
                            // the dispatcher's own padding pads (the lowering prices them alike): one of
                            // them.
                            SmallList<Fp8Padding, 4> paddings;
                            paddings.push_back(Fp8Padding::kStack);
                            if (prec == Precision::kFp8 && model.is_moe()) {
                              for (size_t i = 1; i < cap.fp8_padding.size(); ++i) {
                                const Fp8Padding f = fp8_padding_named(cap.fp8_padding[i]);
                                if (f == Fp8Padding::kStack || paddings.size() == 4) continue;
                                if (f == Fp8Padding::kRouter && disp == Dispatch::kAllGather) continue;
                                if (f == Fp8Padding::kRouter && disp == Dispatch::kDedup &&
                                    stack_has(cap.fp8_padding, name_of(Fp8Padding::kDispatcher)))
                                  continue;
                                paddings.push_back(f);
                              }
                            }
                            for (GradSync sync : syncs) {
                              for (Fp8Padding padding : paddings) {
                                const int64_t at = index++;
                                if (static_cast<int64_t>(share % static_cast<uint64_t>(stride)) != offset)
                                  continue;
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
                                // FP8 parameters where the stack gathers them: less memory and half the
                                // parameter all-gather, nothing lost (the distributed optimizer's rule).
                                p.data.fp8_param_gather = prec == Precision::kFp8 && zero >= 1 &&
                                                          stack_has(cap.param_gather, "fp8");
                                // Pipeline sends overlap only where there is a pipeline (a plan file and
                                // `import` say the same of one stage) and the stack overlaps them there.
                                p.overlap = {stack.overlaps.inter_op.value, intra,
                                             stack.overlaps.dp_comm.value,
                                             stack_overlaps_pipeline_sends(stack, pp, vpp)};
                                // Cross-micro-batch EP overlap where the stack has it and its rules allow it.
                                p.overlap.cross_micro_batch =
                                    stack.overlaps.cross_micro_batch.value && ep > 1 &&
                                    (pp == 1 || vpp > 1) && rc != Recompute::kFull &&
                                    disp != Dispatch::kAllGather && model.mtp_layers <= 1;
                                // With it, Megatron's --delay-wgrad-compute: the weight gradients behind the
                                // node that signals the backward exchange.
                                p.overlap.delay_wgrad = p.overlap.cross_micro_batch;
                                // TE's userbuffers under TP where the stack has them (MLA models run
                                // without: the lowering's rule).
                                p.overlap.tp_comm = stack.overlaps.tp_comm.value && tp > 1 &&
                                                    model.attention.kind != AttentionKind::kMla;
                                p.recompute = rc;
                                // The shared experts beside the all-to-all dispatch where the stack runs
                                // them so and its rules allow it (inter_op has them there already).
                                p.overlap.shared_experts =
                                    stack.overlaps.shared_experts.value && !p.overlap.inter_op &&
                                    model.is_moe() && model.moe.num_shared_experts > 0 &&
                                    disp == Dispatch::kAllToAll && !p.overlap.cross_micro_batch &&
                                    !(rc == Recompute::kSelective &&
                                      (p.recompute_modules & kRecomputeSharedExperts));
                                p.compression.grad_sync = sync;
                                p.compression.dispatch = prec == Precision::kFp8 && ep > 1 &&
                                                                 stack_has(cap.dispatch_precision, "fp8")
                                                             ? DispatchPrecision::kFp8
                                                             : DispatchPrecision::kBf16;
                                p.precision = prec;
                                if (prec == Precision::kFp8 && !cap.fp8_recipes.empty() &&
                                    !stack_has(cap.fp8_recipes, name_of(p.fp8_recipe)))
                                  p.fp8_recipe =
                                      cap.fp8_recipes.front() == "blockwise" ? Fp8Recipe::kBlockwise
                                      : cap.fp8_recipes.front() == "delayed" ? Fp8Recipe::kDelayed
                                                                             : Fp8Recipe::kTensorwise;
                                p.experts.fp8_padding = padding;
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

// Per-layout costs shared by every plan that differs only in pipeline, ZeRO and gradient compression: each
// kind of layer for one micro-batch (forward, recompute, backward) through the cost model and the engine,
// and the embedding + output layer. A layer's time is what one more layer adds, read from a run of two: the
// second layer's forward and backward. Inside a stage the host issues a layer's kernels while the previous
// one runs, so a graph's first layer, which waits on the host, is not a layer's cost.
struct LayerTimes {
  std::vector<double> layer;    // seconds per model layer: forward, recompute and backward of one micro-batch
  std::vector<double> forward;  // the forward's share of it
  std::vector<double> weights;  // the backward's weight-gradient GEMMs (DualPipeV holds them back)
  // Combined 1F1B (overlap.cross_micro_batch): seconds per model layer of a steady pair, one micro-batch's
  // forward beside another's backward, per micro-batch (`layer` where the plan does not pair them).
  std::vector<double> paired;
  double head = 0;          // embedding + output layer + loss, fwd + bwd
  double head_forward = 0;  // its forward
  // The embedding's part of it (its lookup and, under Megatron's TP, its exchange), which the pipeline's
  // first virtual stage runs; the rest runs on the last.
  double embedding_forward = 0, embedding_backward = 0;
  // Seconds per model layer of its own forward and backward collectives, by link (cost::Resource): beside a
  // data-parallel transfer on the same link, the engine gives each of the two half of it.
  std::vector<std::array<double, 3>> forward_comm, backward_comm;
};

// A layer's data-parallel ops as the lowering emits them, priced by the cost model: its gradient
// synchronisation (reduce-scatter or all-reduce, or MegaScale-MoE's cast, all-to-all and reduce), one
// all-gather of its parameters, and its share of the optimizer step (the step's op, bytes and FLOPs).
// Each with its drag: the compute progress lost beside it when it runs under the compute (its kernels hold
// SMs, and the compute beside runs at the stack's overlap efficiency: the engine's rule).
struct LayerDp {
  double sync = 0, sync_drag = 0;
  double gather = 0, gather_drag = 0;
  Op optimizer;
  // The link its synchronisation and its gather hold (their longest collective's).
  cost::Resource sync_on = cost::Resource::kSm, gather_on = cost::Resource::kSm;
};

// The step's data-parallel cost on one stage: the time it adds to each micro-batch (ZeRO-2/3) and after the
// last one.
struct StageDp {
  double per_micro_batch = 0;
  double tail = 0;
};

// How a pipeline splits the layers over its stages, with each stage's data-parallel totals.
struct StageShapes {
  std::vector<std::vector<int64_t>> layers;                     // each stage's layers, in model order
  std::vector<std::vector<std::pair<int64_t, int64_t>>> kinds;  // each stage's: (a layer of a kind, how many)
  std::vector<std::vector<std::pair<int64_t, int64_t>>> chunk_kinds;  // the same per virtual stage
  std::vector<double> sync, gather, sync_drag, gather_drag;  // sums over the stage's layers (and below)
  std::vector<double> optimizer;                             // the optimizer step over the stage's shard
  // The parts outside the layers (OutsideDp), in the sums above too: the syncs the data-parallel stream runs
  // before the layers' (the output layer's, the MTP embedding's) and after them (the embedding's), and the
  // gathers it runs before the layers' (once a step, under ZeRO-3 too), with their drag.
  std::vector<double> sync_before, sync_after, gather_first, gather_first_drag;
};

// A stage's data-parallel work for the parameters outside the layers (the embedding with the first virtual
// stage, the output layer with the last, an MTP module's embedding copy), as the lowering emits it.
struct OutsideDp {
  double sync_before = 0, sync_after = 0, sync_drag = 0;
  double gather = 0, gather_drag = 0;
  double optimizer_bytes = 0, optimizer_flops = 0;  // their share of the optimizer step
  double before_optimizer = 0;  // seconds on the compute stream before the step (the embedding's all-reduce)
};

class Screener {
 public:
  Screener(const ModelSpec& m, const HardwareProfile& hw, const StackProfile& st,
           const workload::RoutingDistribution& r, const LayerKindCounts& kinds)
      : m_(m),
        hw_(hw),
        st_(st),
        routing_(r),
        kinds_(kinds),
        cm_(hw, st),
        lowering_(lowering_options(hw, st)) {
    cm_.record_extrapolations(false);
  }

  // The screened step. With `reject_at`, a plan whose step cannot come under it is left before its
  // data-parallel walk (the costliest part of the screen), and where it can be told sooner before its
  // pipeline run: it returns a lower bound instead, at least `reject_at`. The bounds are each stage's own
  // passes back to back after the first forward reaches it, then the pipeline run without the data-parallel
  // time, which only adds (each stage's per-micro-batch share and the tail are >= 0); a bound must clear
  // `reject_at` by a relative 1e-9 so that the rounding of the sums the full screen adds (about 1e-15 per
  // term) cannot reverse the comparison.
  double step_time(const Plan& p, double reject_at = std::numeric_limits<double>::infinity(),
                   bool* bounded = nullptr) {
    const LayerTimes& lt = layer_times(p);
    const std::vector<LayerDp>& dp = layer_dp(p);
    const int64_t pp = p.pipeline.pp, vpp = p.pipeline.vpp;
    const StageShapes& shapes = stage_shapes(p, dp);
    const Schedule sched = p.pipeline.schedule;
    // DualPipeV's pairs run each side at its time alone unless the stack overlaps micro-batches (combined).
    const bool pairs = combined(p);
    const double m = d(p.num_micro_batches());
    // Pipeline sends, the lowering's op. Not overlapped, each runs on its stage's compute stream after the
    // pass that produced it, where the next virtual stage (forward) or the one before (backward) lies on
    // another stage. Overlapped, each costs the latency of its way there (`hop`).
    const double t_send = pp > 1 ? send_seconds(p) : 0.0;
    const double hop = p.overlap.pp_comm ? t_send : 0.0, on_stream = p.overlap.pp_comm ? 0.0 : t_send;
    const auto virtual_stages = static_cast<int64_t>(shapes.chunk_kinds.size());
    auto stage_of = [&](int64_t v) { return stage_of_virtual(v, pp, sched); };
    auto sends = [&](int64_t v, bool forward) {
      const int64_t next = forward ? v + 1 : v - 1;
      return next >= 0 && next < virtual_stages && stage_of(next) != stage_of(v) ? on_stream : 0.0;
    };
    // A virtual stage's forward and backward per micro-batch, alone and in a pair, and its weight gradients.
    auto times_of = [&](int64_t v) {
      VirtualStageTimes c;
      for (const auto& [x, n] : shapes.chunk_kinds[static_cast<size_t>(v)]) {
        const auto i = static_cast<size_t>(x);
        const double forward = d(n) * lt.forward[i], backward = d(n) * (lt.layer[i] - lt.forward[i]);
        const double paired = pairs && lt.layer[i] > 0 ? lt.paired[i] / lt.layer[i] : 1.0;
        c.forward += forward;
        c.backward += backward;
        c.paired_forward += forward * paired;
        c.paired_backward += backward * paired;
        c.weights += d(n) * lt.weights[i];
      }
      if (v == 0) {  // the embedding
        c.forward += lt.embedding_forward, c.paired_forward += lt.embedding_forward;
        c.backward += lt.embedding_backward, c.paired_backward += lt.embedding_backward;
      }
      if (v == virtual_stages - 1) {  // the output layer and loss
        const double forward = lt.head_forward - lt.embedding_forward;
        const double backward = lt.head - lt.head_forward - lt.embedding_backward;
        c.forward += forward, c.paired_forward += forward;
        c.backward += backward, c.paired_backward += backward;
      }
      const double send_forward = sends(v, true), send_backward = sends(v, false);
      c.forward += send_forward, c.paired_forward += send_forward;
      c.backward += send_backward, c.paired_backward += send_backward;
      return c;
    };
    // First a bound no run can beat (from each stage's sums and its first chunk alone): a stage starts once
    // the first micro-batch's forward has reached it, runs every pass of its own at least at the cheaper of
    // its times alone and paired (kind by kind), and (1F1B, interleaved) ends with the last micro-batch's
    // backward of its first chunk, which the stages before it then pass down (DualPipeV ends with weights).
    const bool drains = sched != Schedule::kDualPipeV;
    double quick = 0, reach = 0, drain = 0;
    for (int64_t s = 0; s < pp; ++s) {
      double own = 0;
      for (const auto& [x, n] : shapes.kinds[static_cast<size_t>(s)]) {
        const auto i = static_cast<size_t>(x);
        own += d(n) * std::min(lt.layer[i], pairs ? lt.paired[i] : lt.layer[i]);
      }
      if (s == 0) own += lt.embedding_forward + lt.embedding_backward;
      if (s == stage_of(virtual_stages - 1)) own += lt.head - lt.embedding_forward - lt.embedding_backward;
      for (int64_t c = 0; c < vpp; ++c) {
        const int64_t v = virtual_stage(c, s, pp, sched);
        own += sends(v, true) + sends(v, false);
      }
      quick = std::max(quick, reach + m * own + drain);
      const VirtualStageTimes first = times_of(s);
      reach += std::min(first.forward, first.paired_forward) + hop;
      if (drains) drain += std::min(first.backward, first.paired_backward) + hop;
    }
    if (quick >= reject_at * (1.0 + kRejectMargin)) {
      if (bounded) *bounded = true;
      return quick;
    }
    // The schedule run pass by pass as the lowering orders each stage (one stage that pairs nothing never
    // waits: the bound above is its run); then each stage's data-parallel work per micro-batch (ZeRO-2/3
    // traffic, and what overlapped traffic takes from its compute), once per micro-batch, and its
    // data-parallel tail after its last backward. (Stretching every pass by the per-micro-batch share
    // instead, the fill and drain too, put the screen further from the simulation: up to 8 % over it where
    // ZeRO-3 gathers per micro-batch, against 4 % this way.)
    std::vector<double> ends{quick};
    if (pp > 1 || pairs) {
      std::vector<VirtualStageTimes>& chunk = chunk_times_;
      chunk.clear();
      for (int64_t v = 0; v < virtual_stages; ++v) chunk.push_back(times_of(v));
      ends = span_.stage_ends({pp, vpp, p.num_micro_batches(), sched, pairs}, chunk, hop);
    }
    double bound = 0;
    for (double e : ends) bound = std::max(bound, e);
    if (bound >= reject_at * (1.0 + kRejectMargin)) {
      if (bounded) *bounded = true;
      return bound;
    }
    double step = 0;
    for (size_t s = 0; s < ends.size(); ++s) {
      const StageDp x = stage_dp(p, shapes, s, lt, dp);
      step = std::max(step, ends[s] + m * x.per_micro_batch + x.tail);
    }
    return step;
  }

 private:
  static constexpr double kRejectMargin = 1e-9;  // see step_time

  // f(layer) for each layer of the model, computed once per kind of layer (layers of one kind cost the same).
  template <class F>
  auto per_layer_kind(F&& f) const {
    using T = decltype(f(m_.layers.front()));
    std::vector<T> by_kind;
    for (const LayerSpec& s : kinds_.kinds()) by_kind.push_back(f(s));
    std::vector<T> out;
    out.reserve(m_.layers.size());
    for (int64_t l = 0; l < m_.num_layers(); ++l) out.push_back(by_kind[kinds_.kind_of(l)]);
    return out;
  }

  // Whether the stack runs the plan's forwards and backwards in combined 1F1B pairs.
  bool combined(const Plan& p) const {
    return p.overlap.cross_micro_batch && st_.overlaps.cross_micro_batch.value;
  }

  // What one more layer of a kind adds to a steady combined 1F1B pair (one micro-batch's forward beside the
  // previous one's backward, the expert-parallel communication of each under the other's compute) over what
  // it adds to the same forward and backward run apart: from one stage with one and two layers over two
  // and three micro-batches, where the third micro-batch adds one pair (or one forward and one backward)
  // and the second layer one layer of it.
  double paired_ratio(const LayerSpec& spec, const Plan& one, const LoweringOptions& lo) {
    auto step = [&](size_t layers, int64_t micro_batches, bool pair) {
      ModelSpec model = m_;
      model.layers.assign(layers, spec);
      Plan q = one;
      q.global_batch = micro_batches * q.micro_batch * q.dp();
      q.overlap.cross_micro_batch = pair;
      q.overlap.delay_wgrad = pair && one.overlap.delay_wgrad;
      return simulate(lower(model, q, lo));
    };
    auto layer_of_pair = [&](bool pair) {
      return (step(2, 3, pair) - step(2, 2, pair)) - (step(1, 3, pair) - step(1, 2, pair));
    };
    const double apart = layer_of_pair(false);
    return apart > 0 ? layer_of_pair(true) / apart : 1.0;
  }

  // One pipeline stage running one micro-batch: the plan the per-layer lowerings use.
  static Plan one_stage(const Plan& p) {
    Plan one = p;
    one.pipeline = {};
    one.gpus = p.gpus_per_stage();
    one.global_batch = p.micro_batch * one.dp();
    return one;
  }

  const LayerTimes& layer_times(const Plan& p) {
    const auto key =
        std::make_tuple(p.attention.tp, p.attention.sp, p.attention.cp, p.experts.ep, p.experts.etp,
                        static_cast<int>(p.experts.dispatch), p.micro_batch, static_cast<int>(p.recompute),
                        p.overlap.inter_op, p.overlap.intra_op, p.overlap.shared_experts, p.overlap.tp_comm,
                        static_cast<int>(p.precision) * 8 + static_cast<int>(p.fp8_recipe),
                        static_cast<int>(p.compression.dispatch), combined(p),
                        static_cast<int>(p.experts.fp8_padding), wgrad_accum_bytes(p, lowering_));
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
    LayerTimes lt;
    // One pipeline stage, one micro-batch, no data-parallel ops.
    const Plan one = one_stage(p);
    LoweringOptions lo = lowering_;
    lo.data_parallel = false;
    set_routing(lo, workload::plan_routing(m_, p, routing_));
    lo.embedding_and_head = false;
    const auto per_layer = per_layer_kind([&](const LayerSpec& s) {
      ModelSpec two_layers = m_;
      two_layers.layers = {s, s};
      return second_layer(lower(two_layers, one, lo));
    });
    for (const SecondLayer& x : per_layer) {
      lt.layer.push_back(x.whole);
      lt.forward.push_back(x.forward);
      lt.weights.push_back(x.weights);
      lt.forward_comm.push_back(x.forward_comm);
      lt.backward_comm.push_back(x.backward_comm);
    }
    lt.paired = lt.layer;
    if (combined(p)) {
      const std::vector<double> ratio =
          per_layer_kind([&](const LayerSpec& s) { return s.moe ? paired_ratio(s, one, lo) : 1.0; });
      for (size_t l = 0; l < ratio.size(); ++l) lt.paired[l] *= ratio[l];
    }
    ModelSpec no_layers = m_;
    no_layers.layers.clear();
    lo.embedding_and_head = true;
    const OpGraph head = lower(no_layers, one, lo);
    if (!head.ops.empty()) {
      const engine::Timeline t = run(head);
      lt.head = t.step_time;
      for (const Op& op : head.ops) {
        const OpTiming& x = t.ops[static_cast<size_t>(op.id)];
        if (op.phase == Phase::kForward) lt.head_forward = std::max(lt.head_forward, x.end);
        const auto name = static_cast<OpName>(op.name);
        if (name == OpName::kEmbedding || name == OpName::kEmbedRs || name == OpName::kEmbedAg)
          (op.phase == Phase::kForward ? lt.embedding_forward : lt.embedding_backward) += x.end - x.start;
      }
    }
    return cache_.emplace(key, std::move(lt)).first->second;
  }

  // The graph's timeline, each distinct op priced once per screener (the runs of one layout share most of
  // their ops, as predict()'s runs do; pipeline sends, which the screen's one-stage runs do not hold, each).
  engine::Timeline run(const OpGraph& g) {
    std::vector<cost::OpCost> costs(g.ops.size());
    for (const Op& op : g.ops) {
      // A send's cost in predict() also depends on its path, which the op does not hold.
      costs[static_cast<size_t>(op.id)] = op.kind == OpKind::kSendRecv ? cm_.cost(op) : op_costs_.cost(op);
    }
    engine::EngineOptions eo;
    eo.hbm_bytes_per_s = hw_.gpu.hbm_bw_achieved_bytes_per_s.value;
    eo.overlap_compute_efficiency = st_.overlap_compute_efficiency.value;
    return engine::simulate(g, costs, eo);
  }

  double simulate(const OpGraph& g) { return g.ops.empty() ? 0.0 : run(g).step_time; }

  // What the second of two layers adds, whole and forward: from the end of the first layer's forward to the
  // end of the second's backward (the first's backward follows either way), and to the end of its forward;
  // and its collectives' seconds by phase and link; and its weight-gradient GEMMs' seconds.
  struct SecondLayer {
    double whole = 0, forward = 0, weights = 0;
    std::array<double, 3> forward_comm{}, backward_comm{};
  };
  SecondLayer second_layer(const OpGraph& g) {
    const engine::Timeline t = run(g);
    double first_forward = 0, second_forward = 0, second = 0;
    SecondLayer out;
    for (const Op& op : g.ops) {
      const double end = t.ops[static_cast<size_t>(op.id)].end;
      if (op.layer == 0 && op.phase == Phase::kForward) first_forward = std::max(first_forward, end);
      if (op.layer != 1) continue;
      if (op.phase == Phase::kForward) second_forward = std::max(second_forward, end);
      second = std::max(second, end);
      if (op.part == GemmPart::kWgrad) out.weights += end - t.ops[static_cast<size_t>(op.id)].start;
      if (op.kind == OpKind::kCollective) {
        const cost::OpCost c = op_costs_.cost(op);
        auto& by_link = op.phase == Phase::kForward ? out.forward_comm : out.backward_comm;
        by_link[static_cast<size_t>(c.resource)] += c.seconds;
      }
    }
    out.whole = second - first_forward;
    out.forward = second_forward - first_forward;
    return out;
  }

  // The compute time a collective costs the work beside it: its seconds at the share of the SMs it takes.
  double drag_of(const cost::OpCost& c) const {
    return c.seconds *
           (1.0 - engine::compute_share_beside_comm(c.sm_fraction, st_.overlap_compute_efficiency.value));
  }

  // Each layer's data-parallel ops, from the lowering of that layer alone with its data-parallel work on.
  // They depend on the layout's groups, the ZeRO stage, the gradient sync and whether the parameters are FP8.
  const std::vector<LayerDp>& layer_dp(const Plan& p) {
    const auto key =
        std::make_tuple(p.attention.tp, p.attention.sp, p.attention.cp, p.experts.ep, p.experts.etp,
                        p.pipeline.pp, p.data.zero, static_cast<int>(p.compression.grad_sync), fp8_params(p));
    auto it = dp_cache_.find(key);
    if (it != dp_cache_.end()) return it->second;
    Plan one = one_stage(p);
    one.micro_batch = 1;
    one.global_batch = one.dp();
    one.recompute = Recompute::kNone;
    one.overlap.dp_comm = true;
    LoweringOptions lo = lowering_;
    lo.embedding_and_head = false;
    // Adds the op's seconds and drag; `on` becomes its link when it is the longest collective so far.
    auto add = [&](double& seconds, double& drag, cost::Resource& on, double& longest, const Op& op) {
      const cost::OpCost c = cm_.cost(op);
      seconds += c.seconds;
      if (op.kind != OpKind::kCollective) return;
      drag += drag_of(c);
      if (c.seconds > longest) longest = c.seconds, on = c.resource;
    };
    std::vector<LayerDp> out = per_layer_kind([&](const LayerSpec& s) {
      ModelSpec one_layer = m_;
      one_layer.layers = {s};
      LayerDp x;
      double longest_sync = 0, longest_gather = 0;
      for (const Op& op : lower(one_layer, one, lo).ops) {
        switch (static_cast<OpName>(op.name)) {
          case OpName::kGradCast:
          case OpName::kGradRs:
          case OpName::kGradA2a:
          case OpName::kGradReduce:
            add(x.sync, x.sync_drag, x.sync_on, longest_sync, op);
            break;
          case OpName::kParamAg:  // ZeRO-3 gathers again for the backward: one gather is the forward's
            if (op.phase != Phase::kBackward) add(x.gather, x.gather_drag, x.gather_on, longest_gather, op);
            break;
          case OpName::kOptimizerStep:
            x.optimizer = op;
            break;
          default:
            break;
        }
      }
      return x;
    });
    return dp_cache_.emplace(key, std::move(out)).first->second;
  }

  // Each stage's data-parallel work for the parameters outside the layers, from the lowering of the
  // pipeline's end stages (below) with one micro-batch: the ops of layer -1 (their gradient syncs, gathers
  // and the embedding's all-reduce between the end stages) and what they add to each stage's optimizer step.
  const std::vector<OutsideDp>& outside_dp(const Plan& p) {
    const auto key = std::make_tuple(p.attention.tp, p.attention.sp, p.attention.cp, p.pipeline.pp,
                                     p.gpus_per_stage(), static_cast<int>(p.pipeline.schedule), p.data.zero,
                                     static_cast<int>(p.compression.grad_sync), fp8_params(p));
    auto it = outside_cache_.find(key);
    if (it != outside_cache_.end()) return it->second;
    const int64_t pp = p.pipeline.pp;
    std::vector<OutsideDp> out(static_cast<size_t>(pp));
    const Schedule sched = p.pipeline.schedule;
    if (lowering_.dispatcher == DispatcherKind::kFused ||
        (sched != Schedule::k1F1B && sched != Schedule::kInterleaved1F1B)) {
      // moerun's stack lowers none (its executor syncs these tables inside the optimizer op); DualPipe's ends
      // share a rank: not lowered here (the search does not enumerate it).
      return outside_cache_.emplace(key, std::move(out)).first->second;
    }
    // At most two stages of one layer each (the first holds the embedding, the last the output layer, the
    // stages between neither), with the plan's GPUs per stage; the last of them stands for stage pp - 1. The
    // layers' experts do not matter here (all local); their optimizer work is taken away by lowering the same
    // without the embedding and output layer.
    const int64_t ends = std::min<int64_t>(pp, 2);
    Plan one = p;
    one.gpus = p.gpus_per_stage() * ends;
    one.pipeline = {};
    one.pipeline.pp = ends;
    one.pipeline.layers_per_stage.assign(static_cast<size_t>(ends), 1);
    one.experts = {};
    one.micro_batch = 1;
    one.global_batch = one.dp();
    one.recompute = Recompute::kNone;
    one.overlap.dp_comm = true;
    ModelSpec each = m_;
    each.layers.assign(static_cast<size_t>(ends), m_.layers.front());
    const OpGraph g = lower(each, one, lowering_);
    LoweringOptions layers_only = lowering_;
    layers_only.embedding_and_head = false;
    for (const Op& op : lower(each, one, layers_only).ops) {
      if (static_cast<OpName>(op.name) != OpName::kOptimizerStep) continue;
      OutsideDp& o = out[op.stage == 0 ? 0 : static_cast<size_t>(pp - 1)];
      o.optimizer_bytes -= op.hbm_bytes;
      o.optimizer_flops -= op.flops;
    }
    for (const Op& op : g.ops) {
      OutsideDp& o = out[op.stage == 0 ? 0 : static_cast<size_t>(pp - 1)];
      if (static_cast<OpName>(op.name) == OpName::kOptimizerStep) {
        o.optimizer_bytes += op.hbm_bytes;
        o.optimizer_flops += op.flops;
      }
      if (op.layer != -1) continue;
      const cost::OpCost c = cm_.cost(op);
      const double drag = drag_of(c);
      switch (static_cast<OpName>(op.name)) {
        case OpName::kGradRs: {
          // The embedding's waits for the embedding's backward, the last of the stage's backward.
          const auto deps = g.deps_of(op);
          const bool after = std::any_of(deps.begin(), deps.end(), [&](int32_t dep) {
            return static_cast<OpName>(g.ops[static_cast<size_t>(dep)].name) == OpName::kEmbedding;
          });
          (after ? o.sync_after : o.sync_before) += c.seconds;
          o.sync_drag += drag;
          break;
        }
        case OpName::kParamAg:
          o.gather += c.seconds;
          o.gather_drag += drag;
          break;
        case OpName::kEmbedGradAr:
          o.before_optimizer += c.seconds;
          break;
        default:
          break;
      }
    }
    return outside_cache_.emplace(key, std::move(out)).first->second;
  }

  // A stage's data-parallel time, as the lowering orders it on the in-order data-parallel stream.
  // - ZeRO-0/1: after the last micro-batch's backward, each layer's gradient synchronisation; ZeRO-1 then
  //   gathers the updated parameters.
  // - ZeRO-2: every micro-batch synchronises each layer's gradients after its backward.
  // - ZeRO-3: also gathers each layer's parameters before its forward and again before its backward.
  // - After the last micro-batch: the optimizer step over the stage's shard.
  // Overlapped, a layer's synchronisation starts when its backward ends (and the stream is free) while the
  // backward goes on with the layers before it, and a layer's pass waits for its gather; the step-level
  // gathers of ZeRO-1/2 run ahead of the first forward. Two micro-batches are walked so that the second one
  // gives the steady per-micro-batch time. Not overlapped, everything runs on the compute stream.
  StageDp stage_dp(const Plan& p, const StageShapes& shapes, size_t stage, const LayerTimes& lt,
                   const std::vector<LayerDp>& dp) const {
    StageDp out;
    const int64_t zero = p.data.zero;
    const std::vector<int64_t>& layers = shapes.layers[stage];
    const double sync = shapes.sync[stage], gather = shapes.gather[stage];
    // ZeRO-3 gathers the layers' parameters twice per micro-batch; the parts outside the layers once a step.
    const double first = shapes.gather_first[stage];
    const double per_pass = gather - first;
    if (!p.overlap.dp_comm) {
      if (zero >= 2) out.per_micro_batch = sync + (zero == 3 ? 2.0 * per_pass : 0.0);
      out.tail = (zero < 2 ? sync : 0.0) + (zero == 1 || zero == 2 ? gather : zero == 3 ? first : 0.0);
    } else {
      // ZeRO-3 under combined 1F1B: in a pair the data-parallel stream takes the forward's gather (the next
      // micro-batch's layer) before the backward's, as the lowering emits a pair (emit_pair); the walk is
      // then the first forward alone and each backward beside the next micro-batch's forward. The
      // schedule's warm-up forwards and cool-down backwards run alone: the steady share per micro-batch is
      // the two walks' in the proportion of the stage's backwards that the lowering's order pairs, and the
      // tail is the unpaired walk's (the last backwards are the cool-down's).
      const bool pairs = zero == 3 && p.overlap.cross_micro_batch;
      const StageDp apart = overlapped_walk(p, shapes, stage, lt, dp, false);
      out = apart;
      if (pairs) {
        const double share = paired_share(p, stage);
        const StageDp beside = overlapped_walk(p, shapes, stage, lt, dp, true);
        out.per_micro_batch = share * beside.per_micro_batch + (1.0 - share) * apart.per_micro_batch;
      }
      if (zero == 1 || zero == 2) {
        // The next step's first forward waits for each layer's gathered parameters, and its transfers share
        // the gathers' link while the stream still gathers the layers after it.
        // The parts outside the layers are gathered first (the embedding's before the first forward).
        double forward = 0, gathered = shapes.gather_first[stage], alone = 0;
        for (int64_t l : layers) {
          const auto i = static_cast<size_t>(l);
          gathered += dp[i].gather;
          forward = std::max(forward, gathered);
          if (gather > forward && lt.forward[i] > 0)  // the stream still gathers the layers after this one
            forward += std::min(gather - forward, lt.forward[i]) / lt.forward[i] *
                       lt.forward_comm[i][static_cast<size_t>(dp[i].gather_on)];
          forward += lt.forward[i];
          alone += lt.forward[i];
        }
        out.tail += forward - alone;
      } else if (zero == 3) {
        out.tail += first;  // the layers' first gathers queue behind them on the data-parallel stream
      }
    }
    out.tail += shapes.optimizer[stage];
    return out;
  }

  // stage_dp's walk of two micro-batches with overlapped data-parallel communication (see there): the
  // per-micro-batch share and the tail, without the step-level gathers and the optimizer step. `paired`:
  // each backward beside the next micro-batch's forward (ZeRO-3 under combined 1F1B; only its
  // per-micro-batch share is used).
  StageDp overlapped_walk(const Plan& p, const StageShapes& shapes, size_t stage, const LayerTimes& lt,
                          const std::vector<LayerDp>& dp, bool paired) const {
    StageDp out;
    const int64_t zero = p.data.zero;
    const std::vector<int64_t>& layers = shapes.layers[stage];
    const double sync = shapes.sync[stage], gather = shapes.gather[stage];
    const double sync_drag = shapes.sync_drag[stage], gather_drag = shapes.gather_drag[stage];
    const double per_pass = gather - shapes.gather_first[stage];
    const double per_pass_drag = gather_drag - shapes.gather_first_drag[stage];
    double work = 0;
    for (int64_t l : layers) work += lt.layer[static_cast<size_t>(l)];
    // compute: when the stage's compute stream is free; stream: when the data-parallel stream is
    double compute = 0, stream = 0, after_first = 0, stream_after_first = 0;
    double contention = 0;  // ZeRO-0/1: what sharing links with the synchronisation added to the backward
    const int passes = zero >= 2 ? 2 : 1;  // ZeRO-0/1: only the last backward synchronises
    for (int mb = 0; mb < passes; ++mb) {
      if (zero >= 2 && (!paired || mb == 0)) {  // ZeRO-0/1 walk the last backward alone
        for (int64_t l : layers) {
          const auto i = static_cast<size_t>(l);
          if (zero == 3) compute = std::max(compute, stream += dp[i].gather);
          compute += lt.forward[i];
        }
      }
      const LayerDp* syncing = nullptr;  // the layer whose synchronisation the stream runs
      // The output layer's (and an MTP copy's) gradients are complete before the layers' backward; under
      // ZeRO-3 the stream has the first layer's gather for its backward ahead of their synchronisation
      // (the lowering emits it before the layer's backward, the synchronisation after).
      const double head_ready = compute;
      bool head_pending = shapes.sync_before[stage] > 0;
      auto sync_head = [&] {
        stream = std::max(stream, head_ready) + shapes.sync_before[stage];
        head_pending = false;
      };
      // Megatron-FSDP (zero3_backward_prefetch): layer L-1's backward gather is issued with layer L's (L-1
      // in the same virtual stage), ahead of L's synchronisation; `prefetched`: when the gather so issued
      // ends, -1 where none.
      double prefetched = -1;
      auto partner = layers.begin();  // paired: the next micro-batch's forward layer beside this backward
      for (auto l = layers.rbegin(); l != layers.rend(); ++l) {
        const auto i = static_cast<size_t>(*l);
        // Paired: the forward's gather goes first on the stream; the pair's nodes alternate from its start,
        // so the pair waits for both gathers.
        size_t f = 0;
        if (paired) {
          f = static_cast<size_t>(*partner++);
          compute = std::max(compute, stream += dp[f].gather);
        }
        if (zero == 3) {
          compute = std::max(compute, prefetched >= 0 ? prefetched : stream += dp[i].gather);
          prefetched = -1;
          const auto next = std::next(l);
          if (lowering_.zero3_backward_prefetch && next != layers.rend() && *next == *l - 1 &&
              *l < m_.num_layers())
            prefetched = stream += dp[static_cast<size_t>(*next)].gather;
        }
        if (head_pending) sync_head();
        const double backward = lt.layer[i] - lt.forward[i];
        // The backward's own transfers on the link the synchronisation holds share it for as long as the
        // stream is busy beside them, each at half rate; both take that much longer.
        if (syncing && stream > compute && backward > 0) {
          const double shared = std::min(stream - compute, backward) / backward *
                                lt.backward_comm[i][static_cast<size_t>(syncing->sync_on)];
          compute += shared;
          stream += shared;
          contention += shared;
        }
        compute += backward;
        if (paired) compute += lt.forward[f];
        stream = std::max(stream, compute) + dp[i].sync;
        syncing = &dp[i];
      }
      if (head_pending) sync_head();
      if (shapes.sync_after[stage] > 0)  // the embedding's, after its backward
        stream = std::max(stream, compute) + shapes.sync_after[stage];
      if (mb == 0) after_first = compute, stream_after_first = stream;
    }
    // ZeRO-2/3: the second micro-batch is the steady one; its compute slows beside the stream's work, for
    // as much of it as it overlaps. The stream may fall behind the compute by more each micro-batch.
    if (zero >= 2) {
      const double busy = sync + (zero == 3 ? 2.0 * per_pass : 0.0);
      const double drag = sync_drag + (zero == 3 ? 2.0 * per_pass_drag : 0.0);
      const double cycle = compute - after_first + (busy > 0 ? drag * std::min(1.0, work / busy) : 0.0);
      const double stream_cycle = stream - stream_after_first, m = d(p.num_micro_batches() - 1);
      out.per_micro_batch = cycle - work;
      out.tail = std::max(0.0, stream_after_first + m * stream_cycle - (after_first + m * cycle));
      // The first micro-batch takes its own walk, not the steady one: no syncs queue ahead of its gathers.
      // And the last one's synchronisations that run after its backward slow no compute: that part of the
      // drag goes (as much of it as one micro-batch's work could hold). The data-parallel time stays >= 0
      // (each walk holds the stage's work, each micro-batch's share holds its drag), so the bound above
      // holds.
      out.tail += after_first - (compute - after_first);
      const double after_last = std::min(work, std::max(0.0, stream_after_first - after_first));
      if (busy > 0) out.tail -= drag * std::min(1.0, after_last / busy);
    } else {
      out.tail = stream - (compute - contention);  // the pace holds the backward without it
    }
    return out;
  }

  // The share of a stage's backwards that the lowering's combined 1F1B order runs beside a forward.
  double paired_share(const Plan& p, size_t stage) const {
    const auto key = std::make_tuple(static_cast<int64_t>(stage), p.pipeline.pp, p.pipeline.vpp,
                                     p.num_micro_batches(), static_cast<int>(p.pipeline.schedule));
    auto it = paired_share_.find(key);
    if (it != paired_share_.end()) return it->second;
    int64_t paired = 0, backwards = 0;
    for (const PipelineTask& t : pipeline_order(static_cast<int64_t>(stage), p.pipeline.pp, p.pipeline.vpp,
                                                p.num_micro_batches(), true, p.pipeline.schedule)) {
      paired += t.forward && t.paired;
      backwards += !t.forward && !t.weights;
    }
    const double share = backwards > 0 ? d(paired) / d(backwards) : 0.0;
    return paired_share_.emplace(key, share).first->second;
  }

  // The stages' layers (virtual stage v runs on stage stage_of_virtual(v): v % pp, or DualPipeV's V) and
  // their data-parallel totals, for a pipeline split, its schedule and a layer's data-parallel ops.
  const StageShapes& stage_shapes(const Plan& p, const std::vector<LayerDp>& dp) {
    const int64_t pp = p.pipeline.pp;
    auto key = std::make_tuple(&dp, pp, p.pipeline.vpp, static_cast<int>(p.pipeline.schedule),
                               p.pipeline.layers_per_stage);  // empty: even split
    auto it = shapes_.find(key);
    if (it != shapes_.end()) return it->second;
    const std::vector<int64_t> chunks = layers_per_virtual_stage(m_, p);
    const std::vector<OutsideDp>& outside = outside_dp(p);
    StageShapes out;
    out.layers.resize(static_cast<size_t>(pp));
    std::vector<std::vector<int64_t>> counts(static_cast<size_t>(pp),
                                             std::vector<int64_t>(kinds_.kinds().size(), 0));
    int64_t l = 0;
    for (size_t v = 0; v < chunks.size(); ++v) {
      const auto s = static_cast<size_t>(stage_of_virtual(static_cast<int64_t>(v), pp, p.pipeline.schedule));
      std::vector<std::pair<int64_t, int64_t>> in_chunk;
      for (size_t k = 0; k < kinds_.kinds().size(); ++k) {
        const int64_t n = kinds_.in(k, l, l + chunks[v]);
        counts[s][k] += n;
        if (n > 0) in_chunk.emplace_back(kinds_.first_of(k), n);
      }
      out.chunk_kinds.push_back(std::move(in_chunk));
      for (int64_t i = 0; i < chunks[v]; ++i) out.layers[s].push_back(l++);
    }
    for (const std::vector<int64_t>& stage : counts) {
      std::vector<std::pair<int64_t, int64_t>> kinds;
      for (size_t k = 0; k < stage.size(); ++k)
        if (stage[k] > 0) kinds.emplace_back(kinds_.first_of(k), stage[k]);
      out.kinds.push_back(std::move(kinds));
    }
    for (const std::vector<int64_t>& layers : out.layers) {
      double sync = 0, gather = 0, sync_drag = 0, gather_drag = 0;
      Op opt = layers.empty() ? Op{} : dp[static_cast<size_t>(layers.front())].optimizer;
      opt.hbm_bytes = opt.flops = 0;
      for (int64_t x : layers) {
        const LayerDp& layer = dp[static_cast<size_t>(x)];
        sync += layer.sync;
        gather += layer.gather;
        sync_drag += layer.sync_drag;
        gather_drag += layer.gather_drag;
        opt.hbm_bytes += layer.optimizer.hbm_bytes;
        opt.flops += layer.optimizer.flops;
      }
      const OutsideDp& o = outside[out.sync.size()];
      out.sync.push_back(sync + o.sync_before + o.sync_after);
      out.gather.push_back(gather + o.gather);
      out.sync_drag.push_back(sync_drag + o.sync_drag);
      out.gather_drag.push_back(gather_drag + o.gather_drag);
      out.sync_before.push_back(o.sync_before);
      out.sync_after.push_back(o.sync_after);
      out.gather_first.push_back(o.gather);
      out.gather_first_drag.push_back(o.gather_drag);
      opt.hbm_bytes += o.optimizer_bytes;
      opt.flops += o.optimizer_flops;
      out.optimizer.push_back((layers.empty() ? 0.0 : cm_.cost(opt).seconds) + o.before_optimizer);
    }
    return shapes_.emplace(std::move(key), std::move(out)).first->second;
  }

  // One pipeline send, priced (it depends on the layout's groups and the micro-batch only).
  double send_seconds(const Plan& p) {
    const auto key = std::make_tuple(p.attention.tp, p.attention.sp, p.attention.cp, p.experts.ep,
                                     p.experts.etp, p.pipeline.pp, p.micro_batch, p.overlap.pp_comm);
    auto it = sends_.find(key);
    if (it == sends_.end()) it = sends_.emplace(key, cm_.cost(pipeline_send(m_, p, true)).seconds).first;
    return it->second;
  }

  const ModelSpec& m_;
  const HardwareProfile& hw_;
  const StackProfile& st_;
  const workload::RoutingDistribution& routing_;
  const LayerKindCounts& kinds_;
  cost::CostModel cm_;
  const LoweringOptions lowering_;  // the stack's (the runs set the routing and their parts on a copy)
  std::unordered_map<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int, int64_t, int, bool, bool,
                                bool, bool, int, int, bool, int, int>,
                     LayerTimes, KeyHash>
      cache_;
  PipelineSpan span_;
  std::vector<VirtualStageTimes> chunk_times_;  // step_time's, kept to spare an allocation per plan
  cost::CostCache op_costs_{cm_};
  std::unordered_map<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, bool>,
                     std::vector<LayerDp>, KeyHash>
      dp_cache_;
  std::unordered_map<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int, int64_t, int, bool>,
                     std::vector<OutsideDp>, KeyHash>
      outside_cache_;
  std::unordered_map<std::tuple<const std::vector<LayerDp>*, int64_t, int64_t, int, std::vector<int64_t>>,
                     StageShapes, KeyHash>
      shapes_;
  std::unordered_map<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool>, double,
                     KeyHash>
      sends_;
  mutable std::unordered_map<std::tuple<int64_t, int64_t, int64_t, int64_t, int>, double, KeyHash>
      paired_share_;
};

}  // namespace

double screen_step_time(const ModelSpec& model, const Plan& plan, const HardwareProfile& hw,
                        const StackProfile& stack, const workload::RoutingDistribution& routing) {
  const LayerKindCounts kinds(model);
  Screener s(model, hw, stack, routing, kinds);
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
  // One pass over the space, split over the threads by index so that it is never held in memory whole:
  // enumeration, pruning (--fix pins, the legality rules, then the memory model) and the screen of each plan
  // that fits. A thread keeps only its best plans by estimate, as many as can become finalists (and every
  // screened plan when asked).
  const int threads = std::max(1, options.threads);
  const size_t best_kept = static_cast<size_t>(std::max<int64_t>({1, options.finalists, options.top}));
  // Fastest estimate first, ties in enumeration order.
  auto before = [](const Candidate& a, const Candidate& b) {
    return a.screen_step_s < b.screen_step_s || (a.screen_step_s == b.screen_step_s && a.index < b.index);
  };
  struct Pass {
    std::vector<Candidate> best;  // a max-heap under `before`: its front is the worst one kept
    std::vector<Candidate> screened;
    std::map<std::string, int64_t, std::less<>> rejected;  // by legality rule
    int64_t enumerated = 0, legal = 0, fitting = 0, too_big = 0, bounded = 0;
    std::optional<Plan> smallest;
    double smallest_bytes = 0;
    int64_t smallest_index = 0;
  };
  std::vector<Pass> passes(static_cast<size_t>(threads));
  const LayerKindCounts layer_kinds(model);
  const RuleChecker rules(model, hw);
  auto pass = [&](int t) {
    Pass& out = passes[static_cast<size_t>(t)];
    Screener screener(model, hw, stack, routing, layer_kinds);
    // Shared by many plans: in-flight chunks per (pp, vpp, m, combined 1F1B, layer split), routing scale per
    // (tokens, ep).
    std::unordered_map<std::tuple<int64_t, int64_t, int64_t, bool, std::vector<int64_t>>,
                       std::vector<std::vector<int64_t>>, KeyHash>
        flights;
    std::unordered_map<std::pair<int64_t, int64_t>, double, KeyHash> scales;
    // The memory model's parts of the last plan priced: the next plan reuses them when it differs only in
    // what they do not depend on (ZeRO stage, gradient synchronisation, overlap: the innermost choices).
    std::optional<Plan> parts_of;
    double parts_scale = 0;
    cost::MemoryParts parts;
    for_each_plan(
        model, hw, stack, job, space,
        [&](int64_t index, Plan&& p) {
          if (t == 0 && options.progress && index % 65536 == 0) options.progress(index);
          if (!matches_fixed(p, space)) return;
          ++out.enumerated;
          if (const char* rule = rules.first_broken_rule(p)) {
            auto it = out.rejected.find(std::string_view(rule));
            if (it == out.rejected.end()) it = out.rejected.emplace(rule, 0).first;
            ++it->second;
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
            sit = scales.emplace(sk, workload::plan_routing(model, p, routing).memory_scale()).first;
          if (parts_of) {
            parts_of->data.zero = run.data.zero;
            parts_of->compression.grad_sync = run.compression.grad_sync;
            parts_of->overlap = run.overlap;
          }
          if (!parts_of || *parts_of != run || parts_scale != sit->second) {
            parts = cost::memory_parts(model, run, hw, stack, sit->second, layer_kinds);
            parts_of = run;
            parts_scale = sit->second;
          }
          const cost::MemoryBreakdown mem =
              cost::memory_per_gpu(model, run, hw, stack, fit->second, sit->second, &layer_kinds, &parts);
          if (!out.smallest || mem.total_low() < out.smallest_bytes) {
            out.smallest = p;
            out.smallest_bytes = mem.total_low();
            out.smallest_index = index;
          }
          if (!mem.fits()) {
            ++out.too_big;
            return;
          }
          ++out.fitting;
          if (options.fit_only) return;
          // A plan slower than the worst one kept is dropped (ties too: its index is later), so once the
          // kept set is full the screen may stop at a bound that already reaches that plan's estimate.
          const bool full = !options.keep_screened && out.best.size() == best_kept;
          bool bounded = false;
          Candidate c{{},
                      screener.step_time(
                          p, full ? out.best.front().screen_step_s : std::numeric_limits<double>::infinity(),
                          &bounded),
                      mem.total_low(),
                      index};
          out.bounded += bounded ? 1 : 0;
          if (options.keep_screened) c.plan = p;
          if (out.best.size() == best_kept && !before(c, out.best.front())) {
            if (options.keep_screened) out.screened.push_back(std::move(c));
            return;
          }
          if (options.keep_screened) out.screened.push_back(c);
          c.plan = std::move(p);
          if (out.best.size() == best_kept) {
            std::pop_heap(out.best.begin(), out.best.end(), before);
            out.best.back() = std::move(c);
          } else {
            out.best.push_back(std::move(c));
          }
          std::push_heap(out.best.begin(), out.best.end(), before);
        },
        threads, t);
  };
  {
    std::vector<std::thread> workers;
    for (int t = 1; t < threads; ++t) workers.emplace_back(pass, t);
    pass(0);
    for (auto& w : workers) w.join();
  }
  auto seconds_since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };
  r.prune_and_screen_s = seconds_since(t0);
  r.capacity_bytes = hw.gpu.hbm_capacity_bytes.value;
  int64_t smallest_index = 0;
  std::vector<Candidate> best;
  for (Pass& p : passes) {
    // Smallest need, ties to the earliest plan in the enumeration (whatever the thread split).
    if (p.smallest && (!r.smallest_need_plan || p.smallest_bytes < r.smallest_need_bytes ||
                       (p.smallest_bytes == r.smallest_need_bytes && p.smallest_index < smallest_index))) {
      r.smallest_need_plan = std::move(p.smallest);
      r.smallest_need_bytes = p.smallest_bytes;
      smallest_index = p.smallest_index;
    }
    r.enumerated += p.enumerated;
    r.legal += p.legal;
    r.fitting += p.fitting;
    r.screened_to_bound += p.bounded;
    for (const auto& [why, n] : p.rejected) r.rejected[why] += n;
    if (p.too_big > 0) r.rejected["memory: does not fit"] += p.too_big;
    std::move(p.best.begin(), p.best.end(), std::back_inserter(best));
    std::move(p.screened.begin(), p.screened.end(), std::back_inserter(r.screened_candidates));
    p = {};
  }
  if (options.fit_only) {
    r.elapsed_s = seconds_since(t0);
    return r;
  }
  r.screened = r.fitting;
  // Whatever the thread split, the same order: by estimate, ties in enumeration order.
  std::sort(best.begin(), best.end(), before);
  std::sort(r.screened_candidates.begin(), r.screened_candidates.end(), before);

  // Full simulation of the finalists (see SearchOptions), graphs dropped as soon as their numbers are read.
  size_t finalists = 0;
  const double cutoff = best.empty() ? 0.0 : best.front().screen_step_s * (1.0 + options.finalist_window);
  while (finalists < best.size() && finalists < static_cast<size_t>(options.finalists) &&
         best[finalists].screen_step_s <= cutoff) {
    ++finalists;
  }
  finalists = std::min(best.size(), std::max(finalists, static_cast<size_t>(options.top)));
  const auto t_simulate = std::chrono::steady_clock::now();
  std::vector<RankedPlan> ranked(finalists);
  // Each finalist's step. Its per-op summary is left out: the kept plans are predicted again with it when
  // asked (keep_graphs), and the summary of a large step reads every op once more.
  const auto fit = cost::CostModel::fit_hardware(hw);
  const PredictOptions finalist_options{.critical_path = true, .op_summary = false, .hardware_fit = fit};
  parallel_for(finalists, threads, [&](size_t i) {
    ranked[i] = {best[i].plan, predict(model, best[i].plan, hw, stack, routing, finalist_options)};
    release_simulated_run(ranked[i].prediction);
  });
  r.simulated = static_cast<int64_t>(finalists);
  // CUDA graphs remove only the host's issue time: they can shorten a step by at most the time its GPU waits
  // for the host. So a finalist is simulated again with them only where that wait is above the option's share
  // of its step and the step without it would rank among the top (below the top-th fitting step so far).
  if (options.graph_host_share > 0 && !stack.capabilities.cuda_graph_scopes.empty()) {
    std::vector<double> fitting_steps;
    for (const RankedPlan& rp : ranked) {
      if (rp.prediction.violations.empty() && rp.prediction.memory.fits())
        fitting_steps.push_back(rp.prediction.step_time_s);
    }
    std::sort(fitting_steps.begin(), fitting_steps.end());
    const size_t top = static_cast<size_t>(std::max<int64_t>(1, options.top));
    const double bar =
        fitting_steps.size() >= top ? fitting_steps[top - 1] : std::numeric_limits<double>::infinity();
    std::vector<std::pair<size_t, Plan>> tried;
    for (size_t i = 0; i < finalists; ++i) {
      const Prediction& eager = ranked[i].prediction;
      if (!eager.violations.empty() ||
          eager.breakdown.host_wait <= options.graph_host_share * eager.step_time_s ||
          eager.step_time_s - eager.breakdown.host_wait >= bar)
        continue;
      if (std::optional<Plan> graphed = graphed_variant(ranked[i].plan, model, hw, stack))
        tried.emplace_back(i, std::move(*graphed));
    }
    std::vector<uint8_t> kept(tried.size(), 0);
    parallel_for(tried.size(), threads, [&](size_t j) {
      RankedPlan& rp = ranked[tried[j].first];
      const Plan& graphed = tried[j].second;
      Prediction g = predict(model, graphed, hw, stack, routing, finalist_options);
      release_simulated_run(g);
      if (g.violations.empty() && g.memory.fits() == rp.prediction.memory.fits() &&
          g.step_time_s < rp.prediction.step_time_s) {
        rp = {graphed, std::move(g)};
        kept[j] = 1;
      }
    });
    r.graph_tried = static_cast<int64_t>(tried.size());
    r.graph_kept = std::count(kept.begin(), kept.end(), uint8_t{1});
  }
  std::stable_sort(ranked.begin(), ranked.end(), [](const RankedPlan& a, const RankedPlan& b) {
    const bool fa = a.prediction.memory.fits(), fb = b.prediction.memory.fits();
    if (fa != fb) return fa;
    return a.prediction.step_time_s < b.prediction.step_time_s;
  });
  const size_t listed = std::min(ranked.size(), static_cast<size_t>(options.top));
  if (options.prefer_memory_margin && !ranked.empty()) {
    prefer_memory_margin_among_ties(ranked);
    for (size_t i = listed; i < ranked.size(); ++i) {
      const Prediction& p = ranked[i].prediction;
      if (!p.memory.fits() || p.step_time_s >= ranked.front().prediction.step_time_s) continue;
      ++r.faster_tight_unlisted;
      if (!r.fastest_tight_unlisted || p.step_time_s < r.fastest_tight_unlisted->prediction.step_time_s) {
        r.fastest_tight_unlisted = ranked[i];
        r.fastest_tight_rank = static_cast<int64_t>(i + 1);
      }
    }
  }
  ranked.resize(listed);
  r.simulate_s = seconds_since(t_simulate);
  if (options.keep_graphs) {
    // Again for the few kept, with their graphs (deterministic: the same numbers).
    parallel_for(ranked.size(), threads, [&](size_t i) {
      ranked[i].prediction =
          predict(model, ranked[i].plan, hw, stack, routing, {.critical_path = true, .hardware_fit = fit});
    });
  }
  r.plans = std::move(ranked);
  r.elapsed_s = seconds_since(t0);
  return r;
}

}  // namespace moeplan::planner
