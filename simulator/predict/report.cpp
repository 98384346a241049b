// Report JSON and Chrome trace of a prediction (see report.h).
#include "simulator/predict/report.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <tuple>

#include <fmt/format.h>

#include "simulator/core/units.h"
#include "simulator/cost/memory.h"

namespace moeplan {

nlohmann::json op_summary_json(const OpGraph& graph, const engine::Timeline& timeline) {
  struct Acc {
    int64_t count = 0;
    double total = 0;
    const Op* op = nullptr;
  };
  std::map<std::tuple<int, std::string, int>, Acc> acc;
  for (const Op& op : graph.ops) {
    auto& a = acc[{op.stage, op_label(op), static_cast<int>(op.phase)}];
    const auto& t = timeline.ops[static_cast<size_t>(op.id)];
    a.count += 1;
    a.total += t.end - t.start;
    a.op = &op;
  }
  nlohmann::json out = nlohmann::json::array();
  for (const auto& [key, a] : acc) {
    nlohmann::json j = {{"stage", std::get<0>(key)},
                        {"op", std::get<1>(key)},
                        {"phase", name_of(a.op->phase)},
                        {"kind", name_of(a.op->kind)},
                        {"count", a.count},
                        {"total_s", a.total},
                        {"mean_s", a.total / static_cast<double>(a.count)}};
    if (a.op->kind == OpKind::kCollective || a.op->kind == OpKind::kSendRecv ||
        a.op->kind == OpKind::kFusedGemmComm) {
      j["group"] = name_of(a.op->comm.group);
      j["collective"] = name_of(a.op->comm.collective);
      j["bytes"] = a.op->comm.bytes;
    }
    out.push_back(std::move(j));
  }
  return out;
}

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
  j["mfu_formula"] =
      "model FLOPs per step / (step time x GPUs x dense BF16 peak); model FLOPs per step = "
      "flops_per_token_train "
      "(moeplan inspect: 3 x forward GEMM and attention FLOPs, recompute not counted) x global_batch x "
      "seq_len";
  j["model_flops_per_step"] = p.model_flops_per_step;
  const auto& m = p.memory;
  j["memory"] = {
      {"per_gpu_bytes", m.total()},
      {"capacity_bytes", m.capacity},
      {"fits", m.fits()},
      {"stage", m.stage},
      {"in_flight_micro_batches", m.in_flight},
      {"components",
       {{"weights", m.weights},
        {"gradients", m.gradients},
        {"optimizer", m.optimizer},
        {"activations", m.activations},
        {"comm_buffers", m.comm_buffers},
        {"reserve", m.reserve}}},
      {"reserve_rule", fmt::format("{:.0f} GiB fixed (CUDA context, NCCL, cuBLAS workspaces) + {:.0f}% "
                                   "fragmentation (assumptions)",
                                   cost::kReserveFixedBytes / kGiB, cost::kFragmentation * 100)}};
  nlohmann::json comp, comm;
  for (const auto& [k, v] : p.breakdown.compute) comp[k] = v;
  for (const auto& [k, v] : p.breakdown.exposed_comm) comm[k] = v;
  j["breakdown"] = {{"stage", p.critical_stage},
                    {"compute", comp.is_null() ? nlohmann::json::object() : comp},
                    {"exposed_comm", comm.is_null() ? nlohmann::json::object() : comm},
                    {"bubble", p.breakdown.bubble},
                    {"optimizer", p.breakdown.optimizer}};
  j["routing"] = {{"imbalance", p.routing.imbalance()},
                  {"busiest_rank_assignments", p.routing.busiest_rank_assignments},
                  {"mean_rank_assignments", p.routing.mean_rank_assignments},
                  {"dropped_fraction", p.routing.dropped_fraction}};
  j["extrapolations"] = p.extrapolations;
  j["stack_calibrated"] = ctx.stack.calibrated;
  j["ops_in_graph"] = p.graph.ops.size();
  j["micro_batches"] = p.graph.micro_batches;
  // What the critical path is made of: seconds by op kind (communication by group).
  std::map<std::string, double> along;
  for (int32_t id : p.critical_path) {
    const Op& op = p.graph.ops[static_cast<size_t>(id)];
    const auto& t = p.timeline.ops[static_cast<size_t>(id)];
    const bool is_comm = op.kind == OpKind::kCollective || op.kind == OpKind::kSendRecv;
    along[is_comm ? std::string("comm_") + name_of(op.comm.group) : std::string(name_of(op.kind))] +=
        t.end - t.start;
  }
  j["critical_path_seconds"] = along;
  j["critical_path_ops"] = p.critical_path.size();
  j["ops"] = op_summary_json(p.graph, p.timeline);
  return j;
}

std::string chrome_trace(const OpGraph& graph, const engine::Timeline& timeline) {
  fmt::memory_buffer out;
  fmt::format_to(std::back_inserter(out), "{{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n");
  bool first = true;
  auto sep = [&] {
    if (!first) fmt::format_to(std::back_inserter(out), ",\n");
    first = false;
  };
  for (int s = 0; s < graph.num_stages; ++s) {
    sep();
    fmt::format_to(std::back_inserter(out),
                   R"({{"ph":"M","name":"process_name","pid":{},"args":{{"name":"stage {}"}}}})", s, s);
    for (int k = 0; k < kNumStreams; ++k) {
      sep();
      fmt::format_to(std::back_inserter(out),
                     R"({{"ph":"M","name":"thread_name","pid":{},"tid":{},"args":{{"name":"{}"}}}})", s, k,
                     name_of(static_cast<Stream>(k)));
    }
  }
  for (const Op& op : graph.ops) {
    const auto& t = timeline.ops[static_cast<size_t>(op.id)];
    sep();
    fmt::format_to(
        std::back_inserter(out),
        R"({{"ph":"X","name":"{}","cat":"{}","pid":{},"tid":{},"ts":{:.3f},"dur":{:.3f},"args":{{"phase":"{}","micro_batch":{},"chunk":{},"flops":{:.6g},"hbm_bytes":{:.6g})",
        op_label(op), name_of(op.kind), op.stage, static_cast<int>(op.stream), t.start * 1e6,
        (t.end - t.start) * 1e6, name_of(op.phase), op.micro_batch, op.chunk, op.flops, op.hbm_bytes);
    if (op.kind == OpKind::kCollective || op.kind == OpKind::kSendRecv || op.kind == OpKind::kFusedGemmComm) {
      fmt::format_to(std::back_inserter(out), R"(,"group":"{}","collective":"{}","bytes":{:.6g})",
                     name_of(op.comm.group), name_of(op.comm.collective), op.comm.bytes);
    }
    fmt::format_to(std::back_inserter(out), "}}}}");
  }
  fmt::format_to(std::back_inserter(out), "\n]}}\n");
  return fmt::to_string(out);
}

Result<bool> write_file_atomic(const std::string& path, const std::string& content) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return Error{fmt::format("{}: cannot write (directory missing or not writable)", path)};
    f.write(content.data(), static_cast<std::streamsize>(content.size()));
    f.flush();
    if (!f) {
      std::remove(tmp.c_str());
      return Error{fmt::format("{}: write failed (disk full?)", path)};
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::remove(tmp.c_str());
    return Error{fmt::format("{}: cannot rename into place: {}", path, ec.message())};
  }
  return true;
}

}  // namespace moeplan
