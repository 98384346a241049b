// Stack profile reading: strict keys, {value, source} pairs for every scalar, µs to seconds once, and a
// grouped-GEMM efficiency curve with rows strictly increasing and efficiencies in (0, 1].
#include "simulator/io/stack_loader.h"

#include <fmt/format.h>

#include "simulator/core/units.h"
#include "simulator/io/builtin_catalog.h"

namespace moeplan::io {
namespace {

// Efficiencies lie in (0, 1]: zero would make a cost infinite. Shares of the SMs lie in [0, 1): comm kernels
// may take none (copy engines), but never all of them.
enum class Interval { kEfficiency, kShare };

const char* describe(Interval in) {
  return in == Interval::kEfficiency ? "an efficiency in (0, 1]" : "a fraction in [0, 1)";
}

bool inside(const json& v, Interval in) {
  if (!v.is_number()) return false;
  const auto x = v.get<double>();
  return in == Interval::kEfficiency ? x > 0.0 && x <= 1.0 : x >= 0.0 && x < 1.0;
}

Sourced<double> sourced_fraction(const JsonNode& parent, std::string_view key, Interval in) {
  const JsonNode v = parent.object(key);
  v.only_keys({"value", "source"});
  if (!v.has("value") || !inside(v.raw().at("value"), in)) v.fail("value", describe(in));
  return {v.raw().at("value").get<double>(), source_of(v)};
}

// {"source": "...", "points": [[rows_per_expert, efficiency], ...]}
void read_grouped_gemm(const JsonNode& g, StackProfile& s) {
  g.only_keys({"source", "points"});
  s.grouped_gemm_efficiency_source = source_of(g);
  for (const auto& p : g.array("points")) {
    const auto cells = p.elements();
    if (cells.size() != 2) p.fail_here("an array of 2 numbers [rows_per_expert, efficiency]");
    const double rows = cells[0].as_number(1, 1e9);
    if (!s.grouped_gemm_efficiency.empty() && rows <= s.grouped_gemm_efficiency.back().first) {
      cells[0].fail_here(fmt::format("rows per expert strictly increasing (previous point has {})",
                                     s.grouped_gemm_efficiency.back().first));
    }
    if (!inside(cells[1].raw(), Interval::kEfficiency)) cells[1].fail_here(describe(Interval::kEfficiency));
    s.grouped_gemm_efficiency.emplace_back(rows, cells[1].raw().get<double>());
  }
  if (s.grouped_gemm_efficiency.empty()) g.fail("points", "at least one [rows_per_expert, efficiency] point");
}

}  // namespace

Result<StackProfile> stack_from_json(const json& j, const std::string& label) {
  return catch_input_errors([&]() -> StackProfile {
    const JsonNode root(j, label);
    root.only_keys({"format", "name", "description", "calibrated", "sources", "host",
                    "grouped_gemm_efficiency", "memory_bound_efficiency", "dispatch_dedup",
                    "comm_sm_fraction", "overlaps"});
    if (root.string("format") != "moeplan-stack-v1") root.fail("format", "\"moeplan-stack-v1\"");
    StackProfile s;
    s.name = root.string("name");
    s.description = root.string_or("description", "");
    s.calibrated = root.boolean("calibrated");
    if (auto src = root.optional_object("sources")) {
      for (auto it = src->raw().begin(); it != src->raw().end(); ++it) {
        std::string citation = src->string(it.key());
        if (citation.find_first_not_of(" \t") == std::string::npos)
          src->fail(it.key(), "a non-empty citation");
        s.sources[it.key()] = std::move(citation);
      }
    }

    const JsonNode host = root.object("host");
    host.only_keys({"launch_us_per_kernel", "us_per_local_expert", "us_per_micro_batch"});
    s.launch_s_per_kernel = sourced_number(host, "launch_us_per_kernel", 0, 1e3, kMicro);
    s.host_s_per_local_expert = sourced_number(host, "us_per_local_expert", 0, 1e3, kMicro);
    s.host_s_per_micro_batch = sourced_number(host, "us_per_micro_batch", 0, 1e6, kMicro);

    read_grouped_gemm(root.object("grouped_gemm_efficiency"), s);
    s.memory_bound_efficiency = sourced_fraction(root, "memory_bound_efficiency", Interval::kEfficiency);
    s.dispatch_dedup = sourced_bool(root, "dispatch_dedup");
    s.comm_sm_fraction = sourced_fraction(root, "comm_sm_fraction", Interval::kShare);

    const JsonNode o = root.object("overlaps");
    o.only_keys({"inter_op", "intra_op", "dp_comm", "pp_comm"});
    s.overlaps = {sourced_bool(o, "inter_op"), sourced_bool(o, "intra_op"), sourced_bool(o, "dp_comm"),
                  sourced_bool(o, "pp_comm")};
    return s;
  });
}

Result<StackProfile> load_stack(const std::string& ref, const std::string& base_dir) {
  std::string label;
  Result<json> j = read_input(ref, "hwprofiles/stacks", base_dir, &label, nullptr);
  if (!j) return j.error();
  return stack_from_json(j.value(), label);
}

}  // namespace moeplan::io
