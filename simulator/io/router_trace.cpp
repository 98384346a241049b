// Router-trace reading (strict keys, one count per expert) and routing.distribution parsing.
#include "simulator/io/router_trace.h"

#include <charconv>
#include <filesystem>
#include <optional>
#include <string_view>
#include <system_error>

#include <fmt/format.h>

#include "simulator/io/json_reader.h"

namespace moeplan::io {
namespace {

constexpr double kMaxCount = 1e15;  // tokens per expert; far above any recorded run
constexpr double kMaxZipf = 100.0;  // exclusive, as plan_io accepts

const char* const kTraceFormat = "moeplan-router-trace-v1";
const char* const kField = "routing.distribution";

// The zipf exponent of "zipf:<s>", or nothing when <s> is not a number in (0, 100).
std::optional<double> zipf_exponent(std::string_view text) {
  double s = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), s);
  if (ec != std::errc() || end != text.data() + text.size() || !(s > 0 && s < kMaxZipf)) return std::nullopt;
  return s;
}

}  // namespace

Result<std::vector<double>> load_router_trace(const std::string& path, int64_t expected_experts) {
  MOEPLAN_ASSERT(expected_experts >= 1);
  Result<json> j = parse_json_file(path);
  if (!j) return j.error();
  return catch_input_errors([&]() -> std::vector<double> {
    const JsonNode root(j.value(), path);
    root.only_keys({"format", "source", "expert_tokens"});
    if (root.string("format") != kTraceFormat) root.fail("format", fmt::format("\"{}\"", kTraceFormat));
    if (root.string("source").find_first_not_of(" \t") == std::string::npos) {
      root.fail("source", "a non-empty description of the run the counts come from");
    }
    const std::vector<JsonNode> cells = root.array("expert_tokens");
    if (static_cast<int64_t>(cells.size()) != expected_experts) {
      throw InputError(fmt::format("{}: field '{}': expected {} counts (one per routed expert), got {}", path,
                                   root.field("expert_tokens"), expected_experts, cells.size()));
    }
    std::vector<double> counts;
    counts.reserve(cells.size());
    double total = 0;
    for (const JsonNode& c : cells) {
      counts.push_back(c.as_number(0, kMaxCount));
      total += counts.back();
    }
    if (total <= 0) root.fail("expert_tokens", "at least one positive count");
    return counts;
  });
}

Result<workload::RoutingDistribution> routing_distribution(const std::string& spec, int64_t experts,
                                                           const std::string& base_dir) {
  MOEPLAN_ASSERT(experts >= 1);
  if (spec == "uniform") return workload::uniform_routing(experts);
  if (spec.starts_with("zipf:")) {
    const std::optional<double> s = zipf_exponent(std::string_view(spec).substr(5));
    if (!s) {
      return Error{fmt::format("field '{}': expected \"zipf:<s>\" with 0 < s < {}, got \"{}\"", kField,
                               kMaxZipf, spec)};
    }
    return workload::zipf_routing(experts, *s);
  }
  if (spec.empty()) {
    return Error{fmt::format(
        "field '{}': expected \"uniform\", \"zipf:<s>\" or a router-trace file, got \"\"", kField)};
  }
  std::filesystem::path p(spec);
  if (p.is_relative() && !base_dir.empty()) p = std::filesystem::path(base_dir) / p;
  Result<std::vector<double>> counts = load_router_trace(p.string(), experts);
  if (!counts) return Error{fmt::format("{} (router trace named by {})", counts.error().message, kField)};
  return workload::routing_from_counts(counts.value());
}

}  // namespace moeplan::io
