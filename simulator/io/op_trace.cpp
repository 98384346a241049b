// Per-op summary, Chrome trace and atomic file writes (see op_trace.h).
#include "simulator/io/op_trace.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <tuple>

#include <fmt/format.h>

namespace moeplan {

std::vector<OpSummaryRow> op_summary(const OpGraph& graph, std::span<const OpTiming> timing) {
  // Grouped by an integer key first (labels are built once per row, not once per op), then ordered by
  // (stage, label, phase).
  auto key = [](const Op& op) {
    return (static_cast<uint64_t>(static_cast<uint16_t>(op.stage)) << 48) |
           (static_cast<uint64_t>(static_cast<uint32_t>(op.layer + 1) & 0xffffff) << 24) |
           (static_cast<uint64_t>(op.name) << 8) | (static_cast<uint64_t>(op.part) << 4) |
           static_cast<uint64_t>(op.phase);
  };
  // Key -> row by open addressing: a step has hundreds of rows and up to millions of ops, so the lookup is
  // the loop's cost. The table stays at most half full.
  constexpr uint64_t kEmpty = ~0ULL;
  std::vector<uint64_t> keys(1024, kEmpty);
  std::vector<uint32_t> row_at(keys.size());
  auto slot_of = [&](uint64_t k) {
    size_t i = static_cast<size_t>((k * 0x9e3779b97f4a7c15ULL) >> 40) & (keys.size() - 1);
    while (keys[i] != kEmpty && keys[i] != k) i = (i + 1) & (keys.size() - 1);
    return i;
  };
  std::vector<OpSummaryRow> rows;
  std::vector<size_t> last_op;  // per row: its last op (index in graph.ops), whose kind and message it shows
  const size_t n = graph.ops.size();
  for (size_t at = 0; at < n; ++at) {
    const Op& op = graph.ops[at];
    prefetch_op_ahead(graph.ops, at);
    const uint64_t k = key(op);
    size_t i = slot_of(k);
    if (keys[i] == kEmpty) {
      if (2 * (rows.size() + 1) > keys.size()) {
        std::vector<uint64_t> old_keys(2 * keys.size(), kEmpty);
        std::vector<uint32_t> old_rows(old_keys.size());
        old_keys.swap(keys);
        old_rows.swap(row_at);
        for (size_t j = 0; j < old_keys.size(); ++j) {
          if (old_keys[j] == kEmpty) continue;
          const size_t slot = slot_of(old_keys[j]);
          keys[slot] = old_keys[j];
          row_at[slot] = old_rows[j];
        }
        i = slot_of(k);
      }
      keys[i] = k;
      row_at[i] = static_cast<uint32_t>(rows.size());
      OpSummaryRow r;
      r.stage = op.stage;
      r.op = op_label(op);
      r.phase = op.phase;
      rows.push_back(std::move(r));
      last_op.push_back(at);
    }
    const uint32_t row = row_at[i];
    OpSummaryRow& r = rows[row];
    const auto& t = timing[static_cast<size_t>(op.id)];
    r.count += 1;
    r.total_s += t.end - t.start;
    last_op[row] = at;
  }
  // The kind and message of each row's last op (read once per row: an op's message lies beyond the fields
  // the loop reads).
  for (size_t row = 0; row < rows.size(); ++row) {
    const Op& op = graph.ops[last_op[row]];
    OpSummaryRow& r = rows[row];
    r.kind = op.kind;
    r.comm =
        op.kind == OpKind::kCollective || op.kind == OpKind::kSendRecv || op.kind == OpKind::kFusedGemmComm;
    r.group = op.comm.group;
    r.collective = op.comm.collective;
    r.bytes = op.comm.bytes;
  }
  std::sort(rows.begin(), rows.end(), [](const OpSummaryRow& a, const OpSummaryRow& b) {
    return std::tie(a.stage, a.op, a.phase) < std::tie(b.stage, b.op, b.phase);
  });
  return rows;
}

nlohmann::json op_summary_json(std::span<const OpSummaryRow> rows) {
  nlohmann::json out = nlohmann::json::array();
  for (const OpSummaryRow& r : rows) {
    nlohmann::json j = {{"stage", r.stage},
                        {"op", r.op},
                        {"phase", name_of(r.phase)},
                        {"kind", name_of(r.kind)},
                        {"count", r.count},
                        {"total_s", r.total_s},
                        {"mean_s", r.total_s / static_cast<double>(r.count)}};
    if (r.comm) {
      j["group"] = name_of(r.group);
      j["collective"] = name_of(r.collective);
      j["bytes"] = r.bytes;
    }
    out.push_back(std::move(j));
  }
  return out;
}

nlohmann::json op_summary_json(const OpGraph& graph, std::span<const OpTiming> timing) {
  return op_summary_json(op_summary(graph, timing));
}

namespace {

bool stage_selected(const TraceSelection& sel, int stage) {
  return sel.stages.empty() || std::find(sel.stages.begin(), sel.stages.end(), stage) != sel.stages.end();
}

bool selected(const TraceSelection& sel, const Op& op) {
  return stage_selected(sel, op.stage) && (sel.micro_batches <= 0 || op.micro_batch < sel.micro_batches);
}

int micro_batches_of(const OpGraph& graph) {
  int n = 0;
  for (const Op& op : graph.ops) n = std::max(n, op.micro_batch + 1);
  return n;
}

}  // namespace

int64_t trace_events(const OpGraph& graph, const TraceSelection& selection) {
  return std::count_if(graph.ops.begin(), graph.ops.end(),
                       [&](const Op& op) { return selected(selection, op); });
}

int64_t trace_micro_batches_within(const OpGraph& graph, const std::vector<int>& stages, int64_t max_events) {
  // Ops per micro-batch index (and of none) on the selected stages; keep the longest prefix that fits.
  TraceSelection sel{.micro_batches = 0, .stages = stages};
  std::vector<int64_t> per_mb;
  int64_t fixed = 0;
  for (const Op& op : graph.ops) {
    if (!stage_selected(sel, op.stage)) continue;
    if (op.micro_batch < 0) {
      ++fixed;
      continue;
    }
    const auto mb = static_cast<size_t>(op.micro_batch);
    if (per_mb.size() <= mb) per_mb.resize(mb + 1, 0);
    ++per_mb[mb];
  }
  int64_t total = fixed;
  for (const int64_t n : per_mb) total += n;
  if (total <= max_events) return 0;
  int64_t kept = fixed, count = 0;
  for (const int64_t n : per_mb) {
    if (count > 0 && kept + n > max_events) break;
    kept += n;
    ++count;
  }
  return std::max<int64_t>(1, count);
}

Result<TraceSelection> parse_trace_selection(int64_t micro_batches, const std::string& stages,
                                             int num_stages) {
  if (micro_batches < 0)
    return Error{fmt::format("--trace-micro-batches {}: expected a count >= 1 (0: all)", micro_batches)};
  TraceSelection sel;
  sel.micro_batches = micro_batches;
  if (stages.empty()) return sel;
  auto bad = [&](const std::string& why) {
    return Error{fmt::format("--trace-stages {}: {} (stages are 0..{})", stages, why, num_stages - 1)};
  };
  auto number = [](const std::string& w, int& v) {
    const auto [end, ec] = std::from_chars(w.data(), w.data() + w.size(), v);
    return ec == std::errc() && end == w.data() + w.size() && v >= 0;
  };
  size_t start = 0;
  while (start <= stages.size()) {
    const size_t comma = std::min(stages.find(',', start), stages.size());
    const std::string item = stages.substr(start, comma - start);
    const size_t dash = item.find('-');
    int lo = 0, hi = 0;
    if (dash == std::string::npos ? !number(item, lo)
                                  : !number(item.substr(0, dash), lo) || !number(item.substr(dash + 1), hi)) {
      return bad(fmt::format("'{}' is not a stage or a range a-b", item));
    }
    if (dash == std::string::npos) hi = lo;
    if (hi < lo) return bad(fmt::format("the range '{}' runs backwards", item));
    if (hi >= num_stages) return bad(fmt::format("stage {} does not exist", hi));
    for (int s = lo; s <= hi; ++s) {
      if (std::find(sel.stages.begin(), sel.stages.end(), s) == sel.stages.end()) sel.stages.push_back(s);
    }
    start = comma + 1;
  }
  std::sort(sel.stages.begin(), sel.stages.end());
  return sel;
}

std::string chrome_trace(const OpGraph& graph, std::span<const OpTiming> timing,
                         const TraceSelection& selection) {
  fmt::memory_buffer out;
  fmt::format_to(std::back_inserter(out), "{{\"displayTimeUnit\":\"ms\",");
  if (!selection.selects_all()) {
    fmt::format_to(
        std::back_inserter(out),
        "\"otherData\":{{\"selection\":\"{}, {}; the step has {} micro-batch(es) and {} stage(s)\"}},",
        selection.micro_batches > 0 ? fmt::format("micro-batches 0..{}", selection.micro_batches - 1)
                                    : std::string("every micro-batch"),
        selection.stages.empty() ? std::string("every stage")
                                 : fmt::format("stages {}", fmt::join(selection.stages, ",")),
        micro_batches_of(graph), graph.num_stages);
  }
  fmt::format_to(std::back_inserter(out), "\"traceEvents\":[\n");
  bool first = true;
  auto sep = [&] {
    if (!first) fmt::format_to(std::back_inserter(out), ",\n");
    first = false;
  };
  for (int s = 0; s < graph.num_stages; ++s) {
    if (!stage_selected(selection, s)) continue;
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
    if (!selected(selection, op)) continue;
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
