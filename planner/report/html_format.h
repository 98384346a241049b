// Shared by the HTML report's page (html_report.cpp) and its SVG charts (svg_charts.cpp): the output buffer,
// the colours of the breakdown's categories, and number formatting. Internal to planner/report.
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <iterator>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "simulator/core/op_graph.h"

namespace moeplan::report::html {

using Out = fmt::memory_buffer;

template <typename... Args>
void emit(Out& out, fmt::format_string<Args...> f, Args&&... args) {
  fmt::format_to(std::back_inserter(out), f, std::forward<Args>(args)...);
}

// ---- Categories and colours -------------------------------------------------------------------------------
// Ops are coloured by what the step breakdown calls them: compute by op kind, communication by process group.
// Compute takes cool colours, communication warm ones; red and grey are kept for exposed communication and
// idle time. (Tableau 10/20 hues: distinct in print and for the common colour-vision deficiencies.)
struct Category {
  const char* name;
  const char* label;
  const char* colour;
};
constexpr std::array<Category, 16> kCategories = {{
    {"gemm", "GEMM", "#4e79a7"},
    {"grouped_gemm", "grouped GEMM (experts)", "#59a14f"},
    {"attention", "attention", "#76b7b2"},
    {"memory_bound", "memory-bound", "#edc948"},
    {"fused_gemm_comm", "fused GEMM + comm", "#b07aa1"},
    {"optimizer", "optimizer", "#9c755f"},
    {"tp", "TP comm", "#f28e2b"},
    {"sp", "SP comm", "#ffbe7d"},
    {"cp", "CP comm", "#d4a6c8"},
    {"ep", "EP comm", "#b6992d"},
    {"etp", "ETP comm", "#f1ce63"},
    {"dp", "DP comm", "#a0cbe8"},
    {"dp_attn", "DP comm (attention)", "#86bcb6"},
    {"dp_expert", "DP comm (experts)", "#8cd17d"},
    {"pp", "PP send/recv", "#79706e"},
    {"none", "other", "#bab0ac"},
}};
constexpr const char* kExposedColour = "#d62728";
constexpr size_t kFirstCommCategory = 6;

inline size_t category_index(const Op& op) {
  if (op.kind == OpKind::kCollective || op.kind == OpKind::kSendRecv) {
    return kFirstCommCategory +
           (op.comm.group == CommGroup::kNone ? 9 : static_cast<size_t>(op.comm.group) - 1);
  }
  switch (op.kind) {
    case OpKind::kFusedGemmComm:
      return 4;
    case OpKind::kOptimizer:
      return 5;
    default:
      return static_cast<size_t>(op.kind);  // gemm, grouped_gemm, attention, memory_bound: 0..3
  }
}

inline const Category& category(std::string_view name) {
  for (const auto& c : kCategories) {
    if (name == c.name) return c;
  }
  return kCategories.back();
}

// ---- Number formatting ------------------------------------------------------------------------------------

// 1234567.8 -> "1,234,568"
inline std::string grouped(double v) {
  std::string digits = fmt::format("{:.0f}", std::abs(v));
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return v < 0 ? "-" + out : out;
}

inline std::string gb(double bytes) {
  return fmt::format("{:.1f} GiB", bytes / (1024.0 * 1024.0 * 1024.0));
}

// Seconds with a unit that keeps three significant digits readable.
inline std::string duration(double s) {
  if (s >= 1) return fmt::format("{:.3f} s", s);
  if (s >= 1e-3) return fmt::format("{:.2f} ms", s * 1e3);
  return fmt::format("{:.1f} µs", s * 1e6);
}

inline std::string percent(double fraction, int decimals = 1) {
  return fmt::format("{:.{}f}%", 100 * fraction, decimals);
}

constexpr double kChartWidth = 1160;  // SVG user units; the page scales it to its column

}  // namespace moeplan::report::html
