// Measured report (see measured_report.h).
#include "executor/runtime/measured_report.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <numeric>
#include <sstream>
#include <string>

#include <fmt/format.h>

#include "simulator/core/model_stats.h"
#include "simulator/core/status.h"
#include "simulator/io/op_trace.h"
#include "simulator/io/plan_io.h"

namespace moeplan::executor {

double process_high_water_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmHWM:", 0) != 0) continue;
    std::istringstream s(line.substr(6));
    double kib = 0;
    s >> kib;
    return kib * 1024.0;
  }
  return 0;
}

nlohmann::json measured_breakdown_json(const OpGraph& graph, std::span<const OpTiming> ops, int stage,
                                       double step_time_s) {
  struct Edge {
    double t;
    bool start;
    int32_t op;
  };
  std::vector<Edge> edges;
  for (const Op& op : graph.ops) {
    if (op.stage != stage) continue;
    const OpTiming& t = ops[static_cast<size_t>(op.id)];
    edges.push_back({t.start, true, op.id});
    edges.push_back({t.end, false, op.id});
  }
  std::sort(edges.begin(), edges.end(), [](const Edge& a, const Edge& b) {
    return a.t != b.t ? a.t < b.t : a.start < b.start;  // ends before starts at equal times
  });
  auto is_comm = [](const Op& op) { return op.kind == OpKind::kCollective || op.kind == OpKind::kSendRecv; };
  std::vector<int32_t> compute, comm;
  std::map<std::string, double> by_kind, by_group;
  double bubble = 0, optimizer = 0, prev = 0;
  auto attribute = [&](double span) {
    if (span <= 0) return;
    if (!compute.empty()) {
      const double share = span / static_cast<double>(compute.size());
      for (int32_t id : compute) {
        const Op& op = graph.ops[static_cast<size_t>(id)];
        if (op.kind == OpKind::kOptimizer) {
          optimizer += share;
        } else {
          by_kind[name_of(op.kind)] += share;
        }
      }
    } else if (!comm.empty()) {
      const double share = span / static_cast<double>(comm.size());
      for (int32_t id : comm) by_group[name_of(graph.ops[static_cast<size_t>(id)].comm.group)] += share;
    } else {
      bubble += span;
    }
  };
  for (const Edge& e : edges) {
    attribute(e.t - prev);
    prev = std::max(prev, e.t);
    auto& set = is_comm(graph.ops[static_cast<size_t>(e.op)]) ? comm : compute;
    if (e.start) {
      set.push_back(e.op);
    } else {
      set.erase(std::find(set.begin(), set.end(), e.op));
    }
  }
  attribute(step_time_s - prev);  // the stage idles until the slowest rank ends
  return {{"stage", stage},
          {"compute", by_kind.empty() ? nlohmann::json::object() : nlohmann::json(by_kind)},
          {"exposed_comm", by_group.empty() ? nlohmann::json::object() : nlohmann::json(by_group)},
          {"bubble", bubble},
          {"optimizer", optimizer}};
}

nlohmann::json rank_skew_json(const std::vector<double>& rank_step_s) {
  nlohmann::json j;
  j["step_s"] = rank_step_s;
  if (rank_step_s.empty()) return j;
  const auto [lo, hi] = std::minmax_element(rank_step_s.begin(), rank_step_s.end());
  j["fastest_rank"] = lo - rank_step_s.begin();
  j["slowest_rank"] = hi - rank_step_s.begin();
  j["skew"] = *lo > 0 ? *hi / *lo : 1.0;
  std::vector<double> sorted = rank_step_s;
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  const double median = n % 2 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
  j["median_step_s"] = median;
  std::vector<int> stragglers;
  for (size_t r = 0; r < n; ++r) {
    if (rank_step_s[r] > median * (1 + kStragglerMargin)) stragglers.push_back(static_cast<int>(r));
  }
  j["stragglers"] = stragglers;
  j["straggler_rule"] = fmt::format("a rank whose mean step exceeds the median rank's by more than {:g}%",
                                    100 * kStragglerMargin);
  return j;
}

nlohmann::json op_rank_skew_json(std::span<const OpSummaryRow> rows, std::span<const OpRankSpread> spreads,
                                 size_t top) {
  MOEPLAN_ASSERT(rows.size() == spreads.size());
  // The widest rows of one side (communication or not), widest first; ties in row order.
  auto widest = [&](bool comm) {
    std::vector<size_t> order;
    for (size_t i = 0; i < rows.size(); ++i) {
      if (rows[i].comm == comm && spreads[i].max_s > spreads[i].min_s) order.push_back(i);
    }
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return spreads[a].max_s - spreads[a].min_s > spreads[b].max_s - spreads[b].min_s;
    });
    if (order.size() > top) order.resize(top);
    nlohmann::json out = nlohmann::json::array();
    for (size_t i : order) {
      const OpRankSpread& s = spreads[i];
      out.push_back({{"stage", rows[i].stage},
                     {"op", rows[i].op},
                     {"phase", name_of(rows[i].phase)},
                     {"min_s", s.min_s},
                     {"max_s", s.max_s},
                     {"spread_s", s.max_s - s.min_s},
                     {"ratio", s.min_s > 0 ? s.max_s / s.min_s : 0.0},
                     {"fastest_rank", s.fastest_rank},
                     {"slowest_rank", s.slowest_rank}});
    }
    return out;
  };
  return {{"compute", widest(false)},
          {"communication", widest(true)},
          {"rule",
           "per op (label and phase on a stage, its seconds summed over the step, mean over measured steps), "
           "the least and the most over the stage's ranks; the rows whose ranks differ most, widest first. A "
           "rank slow in compute shows in \"compute\"; the others then wait for it inside the next "
           "collective, so a collective's spread is mostly that wait (its slowest rank is the one that "
           "arrived first)"}};
}

nlohmann::json measured_report_json(const RunInputs& in, const MeasuredRun& run) {
  const Plan& plan = in.loaded.plan;
  const OpGraph& g = in.graph;
  const auto& steps = run.step_times_s;
  const double step =
      steps.empty() ? 0
                    : std::accumulate(steps.begin(), steps.end(), 0.0) / static_cast<double>(steps.size());
  nlohmann::json j;
  j["measured"] = true;
  j["plan"] = io::plan_to_json(plan);
  j["model"] = in.loaded.model.name;
  const bool gpu = run.backend == "cuda";
  j["hardware"] = fmt::format("{} (moerun, {} backend; plan hardware {})", gpu ? "gpu" : "cpu", run.backend,
                              in.loaded.hardware.name);
  j["stack"] = gpu ? "moerun" : "moerun-cpu-replay";
  j["gpus"] = plan.gpus;
  j["world_size"] = run.world_size;
  j["valid"] = true;
  j["step_time_s"] = step;
  j["step_time_rule"] = "mean over measured steps of the slowest rank's step (world barrier to its last op)";
  j["step_times_s"] = steps;
  j["steps"] = steps.size();
  j["warmup"] = run.warmup;
  const double tokens = static_cast<double>(plan.global_batch * plan.seq_len);
  j["tokens_per_step"] = tokens;
  j["tokens_per_s"] = step > 0 ? tokens / step : 0.0;
  j["tokens_per_s_per_gpu"] = step > 0 ? tokens / step / static_cast<double>(plan.gpus) : 0.0;
  const double model_flops = flops_per_token(in.loaded.model, plan.seq_len).train_step * tokens;
  j["model_flops_per_step"] = model_flops;
  const auto& peaks = in.loaded.hardware.gpu.peak_flops_per_s;
  const auto mfu_against = [&](const std::string& dtype) {
    const auto peak = peaks.find(dtype);
    return step > 0 && peak != peaks.end()
               ? model_flops / (step * static_cast<double>(plan.gpus) * peak->second.value)
               : 0.0;
  };
  const std::string peak_dtype = mfu_peak_dtype(plan, in.loaded.hardware);
  j["mfu"] = mfu_against(peak_dtype);
  j["mfu_peak_dtype"] = peak_dtype;
  j["mfu_bf16_equivalent"] = mfu_against("bf16");
  j["mfu_formula"] =
      "model FLOPs per step / (step time x GPUs x the plan hardware's dense peak of mfu_peak_dtype), as the "
      "predicted report; on CPU ranks this is far below 1 by construction";
  double graph_flops = 0;
  for (const Op& op : g.ops) graph_flops += op.flops;
  j["graph_flops_per_step"] = graph_flops;  // every stage's representative rank, recompute included
  j["achieved_flops_per_s_per_rank"] = step > 0 ? graph_flops / g.num_stages / step : 0.0;
  j["memory"] = {
      {"per_gpu_bytes", run.high_water_bytes},
      {"measured_high_water_bytes", run.high_water_bytes},
      {"source", gpu ? "max over ranks of the device memory the CUDA replay allocated (its "
                       "high-water mark; CUDA context and library handles not counted)"
                     : "max over ranks of VmHWM (/proc/self/status): resident set high-water mark"}};
  // Breakdown of the stage with the most compute, as the predicted report's.
  int busiest = 0;
  double most = -1;
  for (int s = 0; s < g.num_stages; ++s) {
    double busy = 0;
    for (const Op& op : g.ops) {
      if (op.stage == s && op.kind != OpKind::kCollective && op.kind != OpKind::kSendRecv)
        busy += run.ops[static_cast<size_t>(op.id)].end - run.ops[static_cast<size_t>(op.id)].start;
    }
    if (busy > most) {
      most = busy;
      busiest = s;
    }
  }
  j["breakdown"] = measured_breakdown_json(g, run.ops, busiest, step);
  j["representative_ranks"] = run.representative_ranks;
  if (!run.rank_step_s.empty()) j["ranks"] = rank_skew_json(run.rank_step_s);
  j["op_times_rule"] =
      "each stage's ops from its representative rank (the stage's lowest world rank); start and end are "
      "means over the measured steps; an op row's \"ranks\" is the same row on every rank of its stage";
  j["ops_in_graph"] = g.ops.size();
  j["micro_batches"] = g.micro_batches;
  j["expert_load_scale"] = in.lowering.expert_load_scale;
  const std::vector<OpSummaryRow> rows = op_summary(g, run.ops);
  j["ops"] = op_summary_json(rows);
  if (!run.op_ranks.empty()) {
    MOEPLAN_ASSERT(run.op_ranks.size() == rows.size());
    for (size_t i = 0; i < rows.size(); ++i) {
      const OpRankSpread& s = run.op_ranks[i];
      j["ops"][i]["ranks"] = {{"min_s", s.min_s},
                              {"mean_s", s.mean_s},
                              {"max_s", s.max_s},
                              {"fastest_rank", s.fastest_rank},
                              {"slowest_rank", s.slowest_rank}};
    }
    j["op_rank_skew"] = op_rank_skew_json(rows, run.op_ranks);
  }
  return j;
}

}  // namespace moeplan::executor
