// Report JSON and Chrome trace of a prediction (see report.h).
#include "simulator/predict/report.h"

#include <map>
#include <tuple>

#include <fmt/format.h>

#include "simulator/core/units.h"
#include "simulator/cost/memory.h"
#include "simulator/io/op_trace.h"

namespace moeplan {

nlohmann::json prediction_json(const Prediction& p, const ReportContext& ctx) {
  nlohmann::json j;
  j["plan"] = nullptr;  // filled by the caller in plan-file form
  j["model"] = ctx.model.name;
  j["hardware"] = ctx.hardware.name;
  j["stack"] = ctx.stack.name;
  j["gpus"] = ctx.plan.gpus;
  if (!p.violations.empty()) {
    nlohmann::json v = nlohmann::json::array();
    for (const auto& x : p.violations) v.push_back({{"rule", x.rule}, {"reason", x.reason}});
    j["valid"] = false;
    j["violations"] = v;
    return j;
  }
  j["valid"] = true;
  j["step_time_s"] = p.step_time_s;
  j["tokens_per_step"] = p.tokens_per_step;
  j["tokens_per_s"] = p.tokens_per_s;
  j["tokens_per_s_per_gpu"] = p.tokens_per_s_per_gpu;
  j["tokens_per_s_range"] = {p.tokens_per_s_low, p.tokens_per_s_high};
  j["mfu"] = p.mfu;
  j["mfu_peak_dtype"] = p.mfu_peak_dtype;
  j["mfu_bf16_equivalent"] = p.mfu_bf16;
  j["mfu_formula"] =
      "model FLOPs per step / (step time x GPUs x the dense peak of mfu_peak_dtype, the precision the plan "
      "computes in); mfu_bf16_equivalent divides by the dense BF16 peak instead. Model FLOPs per step = "
      "flops_per_token_train (moeplan inspect: 3 x forward GEMM and attention FLOPs, recompute not counted) "
      "x "
      "global_batch x seq_len";
  j["model_flops_per_step"] = p.model_flops_per_step;
  const auto& m = p.memory;
  const auto& sm = ctx.stack.memory;
  j["memory"] = {
      {"per_gpu_bytes", m.total()},
      {"per_gpu_bytes_range", {m.total_low(), m.total_high()}},
      {"capacity_bytes", m.capacity},
      {"fits", m.fits()},
      {"tight", m.tight()},
      {"fit_rule",
       "fits when the low end (the stack's smallest reserve and fragmentation) is within capacity; "
       "tight when the high end is not"},
      {"stage", m.stage},
      {"in_flight_micro_batches", m.in_flight},
      {"components",
       {{"weights", m.weights},
        {"gradients", m.gradients},
        {"optimizer", m.optimizer},
        {"activations", m.activations},
        {"comm_buffers", m.comm_buffers},
        {"reserve", m.reserve}}},
      {"reserve_range", {m.reserve_low, m.reserve_high}},
      {"reserve_rule",
       fmt::format("{:.1f}-{:.1f} GiB fixed (CUDA context, NCCL, library workspaces) + {:.0f}-{:.0f}% "
                   "fragmentation of allocated memory (stack {}: {})",
                   sm.reserve_bytes.value / kGiB, sm.reserve_bytes_high.value / kGiB,
                   sm.fragmentation.value * 100, sm.fragmentation_high.value * 100, ctx.stack.name,
                   name_of(sm.reserve_bytes.basis))}};
  nlohmann::json comp, comm;
  for (const auto& [k, v] : p.breakdown.compute) comp[k] = v;
  for (const auto& [k, v] : p.breakdown.exposed_comm) comm[k] = v;
  j["breakdown"] = {{"stage", p.critical_stage},
                    {"compute", comp.is_null() ? nlohmann::json::object() : comp},
                    {"exposed_comm", comm.is_null() ? nlohmann::json::object() : comm},
                    {"bubble", p.breakdown.bubble},
                    {"host_wait", p.breakdown.host_wait},
                    {"optimizer", p.breakdown.optimizer}};
  j["routing"] = {{"imbalance", p.routing.imbalance()},
                  {"busiest_rank_assignments", p.routing.busiest_rank_assignments},
                  {"mean_rank_assignments", p.routing.mean_rank_assignments},
                  {"dropped_fraction", p.routing.dropped_fraction}};
  if (ctx.model.encoder_decoder()) {
    j["routing"]["decoder"] = {{"imbalance", p.decoder_routing.imbalance()},
                               {"busiest_rank_assignments", p.decoder_routing.busiest_rank_assignments},
                               {"mean_rank_assignments", p.decoder_routing.mean_rank_assignments},
                               {"dropped_fraction", p.decoder_routing.dropped_fraction}};
  }
  j["routing"]["hot_alltoalls"] = nlohmann::json::array();
  for (const auto& e : p.hot_exchanges) {
    j["routing"]["hot_alltoalls"].push_back(
        {{"ranks", e.ranks},
         {"nodes", e.nodes},
         {"hot_factor", e.hot_factor},
         {"priced_from", e.table_source.empty() ? "busiest_rank_uniform" : "measured_table"},
         {"table_source",
          e.table_source.empty() ? nlohmann::json(nullptr) : nlohmann::json(e.table_source)}});
  }
  j["extrapolations"] = p.extrapolations;
  j["stack_calibrated"] = ctx.stack.calibrated;
  j["provenance"] = {
      {"critical_path_share",
       {{"measured", p.provenance.measured},
        {"derived", p.provenance.derived},
        {"assumed", p.provenance.assumed},
        {"target", p.provenance.target}}},
      {"hypothetical", p.provenance.hypothetical},
      {"why_hypothetical", p.provenance.targets},
      {"rule",
       "share of the critical path's time priced by stack and hardware numbers of each basis (the weakest "
       "basis among the "
       "numbers that priced an op); hypothetical when a target prices any of it or an overlap the plan uses "
       "is "
       "a target of the stack"}};
  j["stack_notices"] = p.notices;
  j["ops_in_graph"] = p.ops_in_step;
  j["micro_batches"] = p.simulation.micro_batches;
  const StepSimulation& sim = p.simulation;
  j["simulation"] = {{"extrapolated", sim.extrapolated},
                     {"simulated_micro_batches", sim.simulated_micro_batches},
                     {"period_micro_batches", sim.period_micro_batches},
                     {"periods_added", sim.periods_added},
                     {"period_s", sim.period_s},
                     {"runs", sim.runs},
                     {"why_three_runs", sim.why_three_runs},
                     {"simulated_ops", sim.simulated_ops},
                     {"why_whole_step", sim.why_full}};
  // What the critical path is made of: seconds by op kind (communication by group).
  j["critical_path_seconds"] = p.critical_path_seconds;
  j["critical_path_ops"] = p.critical_path_ops;
  j["ops"] = op_summary_json(p.op_summary);
  return j;
}

nlohmann::json assumptions_json(const AssumptionRange& a, double tokens_per_step, int64_t gpus) {
  const double g = static_cast<double>(gpus);
  nlohmann::json numbers = nlohmann::json::array();
  for (const AssumptionEffect& e : a.effects) {
    numbers.push_back({{"number", e.path},
                       {"basis", name_of(e.basis)},
                       {"value", e.value / e.unit},
                       {"range", {e.low / e.unit, e.high / e.unit}},
                       {"step_time_s_at_ends", {e.step_at_low, e.step_at_high}}});
  }
  return {
      {"step_time_s_range", {a.fastest_s, a.slowest_s}},
      {"tokens_per_s_per_gpu_range", {tokens_per_step / a.slowest_s / g, tokens_per_step / a.fastest_s / g}},
      {"rule",
       "every stack or hardware number with a stated range set to each end alone, then all of them together "
       "at the ends that shortened (lengthened) the step alone; the range is the widest of these"},
      {"predictions", a.predictions},
      {"numbers", numbers}};
}

}  // namespace moeplan
