// Per-op summary, Chrome trace and atomic file writes (see op_trace.h).
#include "simulator/io/op_trace.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <tuple>

#include <fmt/format.h>

namespace moeplan {

nlohmann::json op_summary_json(const OpGraph& graph, std::span<const OpTiming> timing) {
  struct Acc {
    int64_t count = 0;
    double total = 0;
    const Op* op = nullptr;
  };
  std::map<std::tuple<int, std::string, int>, Acc> acc;
  for (const Op& op : graph.ops) {
    auto& a = acc[{op.stage, op_label(op), static_cast<int>(op.phase)}];
    const auto& t = timing[static_cast<size_t>(op.id)];
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

std::string chrome_trace(const OpGraph& graph, std::span<const OpTiming> timing) {
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
    const auto& t = timing[static_cast<size_t>(op.id)];
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
