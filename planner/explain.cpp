// The cumulative technique ablation of one plan (see explain.h).
#include "planner/explain.h"

#include <algorithm>
#include <functional>
#include <initializer_list>
#include <utility>

#include <fmt/format.h>

#include "simulator/core/units.h"
#include "simulator/io/plan_io.h"

namespace moeplan::planner {
namespace {

// The first rule among `rules` that the plan breaks, as "rule: reason"; empty when none is broken.
std::string broken(const Plan& p, const ModelSpec& model, const HardwareProfile& hw,
                   std::initializer_list<const char*> rules) {
  for (const Violation& v : validate(p, model, hw)) {
    if (std::find(rules.begin(), rules.end(), v.rule) != rules.end()) return v.reason;
  }
  return "";
}

// Rules that depend on how the attention mesh splits into tp and sp (its size is the plan's).
constexpr std::initializer_list<const char*> kAttentionRules = {
    "heads_divisible",           "kv_heads_vs_tp", "hidden_divisible_by_tp",
    "dense_ffn_divisible_by_tp", "seq_divisible",  "mixer_heads_divisible"};
// Rules that depend on how the expert mesh splits into ep and etp (its size is the plan's).
constexpr std::initializer_list<const char*> kExpertRules = {
    "experts_divisible_by_ep", "expert_ffn_divisible_by_etp", "shared_ffn_divisible_by_etp",
    "dense_model_no_ep"};

std::string joined_reasons(const std::vector<Violation>& vs) {
  std::string out;
  for (const Violation& v : vs) out += (out.empty() ? "" : "; ") + v.reason;
  return out;
}

}  // namespace

double exposed_comm_seconds(const Prediction& p) {
  double t = 0;
  for (const auto& [group, s] : p.breakdown.exposed_comm) t += s;
  return t;
}

Plan explain_baseline(const ModelSpec& model, const Plan& plan, const HardwareProfile& hw,
                      std::string* note) {
  Plan b = plan;
  b.overlap = {};
  b.compression = {};  // FP32 reduce-scatter gradient sync, BF16 dispatch
  b.cuda_graphs = 0;   // the host issues every kernel
  b.recompute = plan.recompute == Recompute::kNone ? Recompute::kNone : Recompute::kFull;
  std::vector<std::string> notes;

  // Attention: all of tp*sp as Megatron TP; else the largest TP share of the same mesh that is legal.
  const int64_t attn = plan.attention.tp * plan.attention.sp;
  for (int64_t tp = attn; tp >= plan.attention.tp; --tp) {
    if (attn % tp != 0) continue;
    b.attention = {tp, attn / tp, plan.attention.cp};
    if (tp == plan.attention.tp || broken(b, model, hw, kAttentionRules).empty()) break;
  }

  if (b.attention.tp != attn) {
    Plan full = b;
    full.attention = {attn, 1, plan.attention.cp};
    notes.push_back(fmt::format("attention tp{} sp{} ({})", b.attention.tp, b.attention.sp,
                                broken(full, model, hw, kAttentionRules)));
  }

  // Experts: ep = 1 and all of ep*etp as expert TP, at most one node; else the largest legal ETP share. The
  // dispatch stays the plan's, which its stack runs (a DeepEP stack has no plain all-to-all).
  const int64_t mesh = plan.experts.ep * plan.experts.etp;
  const int64_t per_node = std::max<int64_t>(1, hw.node.gpus_per_node.value);
  const Dispatch dispatch = plan.experts.dispatch;
  b.experts = {1, mesh, dispatch};
  std::string first_why =
      mesh > per_node ? fmt::format("etp{} exceeds the {} GPUs of a node", mesh, per_node) : "";
  if (first_why.empty()) first_why = broken(b, model, hw, kExpertRules);
  if (!first_why.empty()) {
    bool found = false;
    for (int64_t etp = std::min(mesh, per_node); etp >= 1 && !found; --etp) {
      if (mesh % etp != 0) continue;
      Plan t = b;
      t.experts = {mesh / etp, etp, dispatch};
      if (broken(t, model, hw, kExpertRules).empty()) {
        b.experts = t.experts;
        found = true;
      }
    }
    notes.push_back(found ? fmt::format("experts ep{} etp{} ({})", b.experts.ep, b.experts.etp, first_why)
                          : fmt::format("no legal ETP split of ep*etp = {} ({})", mesh, first_why));
  }
  if (note) {
    note->clear();
    for (const std::string& n : notes) *note += (note->empty() ? "" : "; ") + n;
  }
  return b;
}

std::vector<ExplainRow> explain(const ModelSpec& model, const Plan& plan, const HardwareProfile& hw,
                                const StackProfile& stack, const workload::RoutingDistribution& routing) {
  // Each step copies one technique's fields from the plan onto the previous row's plan.
  const std::vector<std::pair<const char*, std::function<void(Plan&)>>> steps = {
      {"+ SP attention / EP experts",
       [&](Plan& p) {
         p.attention = plan.attention;
         p.experts = plan.experts;
       }},
      {"+ inter-operator overlap",
       [&](Plan& p) {
         p.overlap.inter_op = plan.overlap.inter_op;
         p.overlap.dp_comm = plan.overlap.dp_comm;
         p.overlap.pp_comm = plan.overlap.pp_comm;
         // Across micro-batches too: Megatron's combined 1F1B and its delayed weight gradients.
         p.overlap.cross_micro_batch = plan.overlap.cross_micro_batch;
         p.overlap.delay_wgrad = plan.overlap.delay_wgrad;
         p.overlap.shared_experts = plan.overlap.shared_experts;
       }},
      {"+ intra-operator overlap",
       [&](Plan& p) {
         p.overlap.intra_op = plan.overlap.intra_op;
         // TE's userbuffers split each TP linear into chunks beside their exchanges: inside the operator.
         p.overlap.tp_comm = plan.overlap.tp_comm;
       }},
      {"+ compression", [&](Plan& p) { p.compression = plan.compression; }},
      {"+ selective recompute", [&](Plan& p) { p.recompute = plan.recompute; }},
      // Only where the plan captures CUDA graphs (a row of its own, after its recompute: their rules read
      // it).
      {"+ CUDA graphs", [&](Plan& p) { p.cuda_graphs = plan.cuda_graphs; }},
  };

  std::vector<ExplainRow> rows;
  ExplainRow base;
  base.technique = "baseline: TP attention + TP experts, no overlap";
  base.plan = explain_baseline(model, plan, hw, &base.note);

  // Megatron's combined 1F1B cannot run with full recompute: when the plan overlaps across micro-batches and
  // the baseline recomputes whole layers, the plan's recompute comes before the overlap rows, so that every
  // row runs (else rows 3-5 would all be illegal).
  constexpr size_t kRecomputeStep = 4;  // steps[4]: the plan's recompute
  constexpr size_t kGraphsStep = 5;     // steps[5]: the plan's CUDA graphs
  std::vector<size_t> order = {0, 1, 2, 3, kRecomputeStep};
  std::string recompute_note;
  if (plan.overlap.cross_micro_batch && base.plan.recompute == Recompute::kFull &&
      plan.recompute != Recompute::kFull) {
    order = {0, kRecomputeStep, 1, 2, 3};
    recompute_note =
        "the plan's recompute comes before the overlap rows: overlap.cross_micro_batch cannot run with full "
        "recompute";
  }

  if (plan.cuda_graphs != 0) order.push_back(kGraphsStep);
  rows.push_back(std::move(base));
  for (size_t s : order) {
    const auto& [technique, apply] = steps[s];
    ExplainRow r;
    r.technique = technique;
    if (s == kRecomputeStep) r.note = recompute_note;
    r.plan = rows.back().plan;
    apply(r.plan);
    rows.push_back(std::move(r));
  }

  const auto fit = cost::CostModel::fit_hardware(hw);  // one fit of the profile for every row
  for (size_t i = 0; i < rows.size(); ++i) {
    ExplainRow& r = rows[i];
    if (i > 0 && io::plan_to_json(r.plan) == io::plan_to_json(rows[i - 1].plan)) {
      // The plan does not use this technique: the row repeats the previous one.
      r.in_plan = false;
      r.prediction = rows[i - 1].prediction;
      r.reason = rows[i - 1].reason;
      r.exposed_comm_s = rows[i - 1].exposed_comm_s;
      if (rows[i - 1].valid()) r.comm_removed_s = 0.0;
      continue;
    }
    r.prediction = predict(model, r.plan, hw, stack, routing, {.hardware_fit = fit});
    release_simulated_run(r.prediction);
    if (!r.valid()) {
      r.reason = joined_reasons(r.prediction.violations);
      continue;
    }
    r.exposed_comm_s = exposed_comm_seconds(r.prediction);
    if (!r.prediction.memory.fits()) {
      r.reason = fmt::format("does not fit: {:.1f}-{:.1f} GiB per GPU of {:.1f} GiB",
                             r.prediction.memory.total_low() / kGiB, r.prediction.memory.total_high() / kGiB,
                             r.prediction.memory.capacity / kGiB);
    }
    if (i > 0 && rows[i - 1].valid()) r.comm_removed_s = rows[i - 1].exposed_comm_s - r.exposed_comm_s;
  }
  return rows;
}

}  // namespace moeplan::planner
