// Stack profile reading (`moeplan-stack-v2`): strict keys, {value, source, basis} triples for every scalar,
// µs and GiB to SI once, capability lists checked against the plan vocabulary.
#include "simulator/io/stack_loader.h"

#include <algorithm>
#include <cmath>
#include <functional>

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

// {"value": ..., "source": "...", "basis": "measured" | "derived" | "assumed" | "target"}, and for numbers
// "range": [low, high].
JsonNode stated_node(const JsonNode& parent, std::string_view key, bool ranged = false) {
  JsonNode v = parent.object(key);
  if (ranged) {
    v.only_keys({"value", "source", "basis", "range"});
  } else {
    v.only_keys({"value", "source", "basis"});
  }
  return v;
}

Basis basis_of(const JsonNode& v) {
  return v.choice<Basis>("basis", {{"measured", Basis::kMeasured},
                                   {"derived", Basis::kDerived},
                                   {"assumed", Basis::kAssumed},
                                   {"target", Basis::kTarget}});
}

// A number's "range": [low, high] holding its value, each end valid where the value is (`valid`, with
// `what` for the message); required where nobody measured the number (basis assumed or target).
void read_number_range(const JsonNode& v, Stated<double>& s, double unit,
                       const std::function<bool(const json&)>& valid, const std::string& what) {
  if (!v.has("range")) {
    if (s.basis == Basis::kAssumed || s.basis == Basis::kTarget)
      v.fail("range", fmt::format("[low, high]: where this {} number may lie", name_of(s.basis)));
    return;
  }
  const auto cells = v.array("range");
  if (cells.size() != 2 || !valid(cells[0].raw()) || !valid(cells[1].raw()))
    v.fail("range", "[low, high] with each end " + what);
  const double a = cells[0].raw().get<double>() * unit, b = cells[1].raw().get<double>() * unit;
  if (!(a <= s.value && s.value <= b)) v.fail("range", "[low, high] with low <= value <= high");
  s.range = std::pair{a, b};
}

Stated<double> stated_number(const JsonNode& parent, std::string_view key, double lo, double hi,
                             double unit = 1.0) {
  const JsonNode v = stated_node(parent, key, true);
  Stated<double> s{v.number("value", lo, hi) * unit, source_of(v), basis_of(v)};
  read_number_range(
      v, s, unit,
      [&](const json& x) { return x.is_number() && x.get<double>() >= lo && x.get<double>() <= hi; },
      fmt::format("a number in [{}, {}]", lo, hi));
  return s;
}

Stated<double> stated_fraction(const JsonNode& parent, std::string_view key, Interval in) {
  const JsonNode v = stated_node(parent, key, true);
  if (!v.has("value") || !inside(v.raw().at("value"), in)) v.fail("value", describe(in));
  Stated<double> s{v.raw().at("value").get<double>(), source_of(v), basis_of(v)};
  read_number_range(
      v, s, 1.0, [&](const json& x) { return inside(x, in); }, describe(in));
  return s;
}

Stated<int64_t> stated_integer(const JsonNode& parent, std::string_view key, int64_t lo, int64_t hi) {
  const JsonNode v = stated_node(parent, key);
  return {v.integer("value", lo, hi), source_of(v), basis_of(v)};
}

Stated<bool> stated_bool(const JsonNode& parent, std::string_view key) {
  const JsonNode v = stated_node(parent, key);
  return {v.boolean("value"), source_of(v), basis_of(v)};
}

template <class E>
Stated<E> stated_choice(const JsonNode& parent, std::string_view key,
                        std::initializer_list<std::pair<const char*, E>> options) {
  const JsonNode v = stated_node(parent, key);
  return {v.choice<E>("value", options), source_of(v), basis_of(v)};
}

// A [low, high] range in `value`.
std::pair<Stated<double>, Stated<double>> stated_range(const JsonNode& parent, std::string_view key,
                                                       double lo, double hi, double unit) {
  const JsonNode v = stated_node(parent, key);
  const auto cells = v.array("value");
  if (cells.size() != 2) v.fail("value", "[low, high]");
  const double a = cells[0].as_number(lo, hi), b = cells[1].as_number(lo, hi);
  if (b < a) v.fail("value", "[low, high] with low <= high");
  const std::string src = source_of(v);
  const Basis basis = basis_of(v);
  return {{a * unit, src, basis}, {b * unit, src, basis}};
}

// A list of strings, each one of `allowed`.
std::vector<std::string> string_list(const JsonNode& parent, std::string_view key,
                                     std::initializer_list<const char*> allowed) {
  std::vector<std::string> out;
  for (const JsonNode& e : parent.array(key)) {
    if (!e.raw().is_string()) e.fail_here("a string");
    const auto s = e.raw().get<std::string>();
    if (std::find_if(allowed.begin(), allowed.end(), [&](const char* a) { return s == a; }) ==
        allowed.end()) {
      std::string list;
      for (const char* a : allowed) list += std::string(list.empty() ? "" : ", ") + a;
      e.fail_here(fmt::format("one of {}", list));
    }
    out.push_back(s);
  }
  return out;
}

}  // namespace

Stated<double> stated_efficiency(const JsonNode& parent, std::string_view key) {
  return stated_fraction(parent, key, Interval::kEfficiency);
}

Result<StackProfile> stack_from_json(const json& j, const std::string& label) {
  return catch_input_errors([&]() -> StackProfile {
    const JsonNode root(j, label);
    if (root.has("format") && root.raw().at("format") == "moeplan-stack-v1") {
      root.fail(
          "format",
          "\"moeplan-stack-v2\" (v1 files priced grouped GEMMs by a rows-per-expert curve and cannot say "
          "what each number rests on; see hwprofiles/stacks/README.md for the v2 fields)");
    }
    root.only_keys({"format",
                    "name",
                    "description",
                    "calibrated",
                    "sources",
                    "host",
                    "grouped_gemm",
                    "memory_bound_efficiency",
                    "memory_bound_efficiency_by_kind",
                    "dispatcher",
                    "expert_mlp",
                    "wgrad_accumulation",
                    "attention_kernel",
                    "comm_sm_fraction",
                    "overlap_compute_efficiency",
                    "fused_gemm_efficiency",
                    "userbuffers_rs_speed",
                    "fp8_block_gemm_rate",
                    "recurrent_scan",
                    "overlaps",
                    "capabilities",
                    "memory"});
    if (root.string("format") != "moeplan-stack-v2") root.fail("format", "\"moeplan-stack-v2\"");
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
    host.only_keys({"launch_us_per_kernel", "issue_us_per_kernel", "us_per_local_expert",
                    "us_per_micro_batch", "sync_us", "min_kernel_us"});
    s.launch_s_per_kernel = stated_number(host, "launch_us_per_kernel", 0, 1e3, kMicro);
    s.host_s_per_kernel = stated_number(host, "issue_us_per_kernel", 0, 1e4, kMicro);
    s.host_s_per_local_expert = stated_number(host, "us_per_local_expert", 0, 1e3, kMicro);
    s.host_s_per_micro_batch = stated_number(host, "us_per_micro_batch", 0, 1e6, kMicro);
    s.host_sync_s = stated_number(host, "sync_us", 0, 1e5, kMicro);
    s.min_kernel_s = stated_number(host, "min_kernel_us", 0, 1e3, kMicro);

    const JsonNode g = root.object("grouped_gemm");
    g.only_keys({"implementation", "streams", "efficiency", "wgrad_efficiency"});
    s.grouped_gemm.impl =
        stated_choice<GroupedGemmImpl>(g, "implementation",
                                       {{"grouped_kernel", GroupedGemmImpl::kGroupedKernel},
                                        {"per_expert_streams", GroupedGemmImpl::kPerExpertStreams}});
    s.grouped_gemm.streams = stated_integer(g, "streams", 1, 64);
    s.grouped_gemm.efficiency = stated_fraction(g, "efficiency", Interval::kEfficiency);
    s.grouped_gemm.wgrad_efficiency = stated_fraction(g, "wgrad_efficiency", Interval::kEfficiency);

    s.memory_bound_efficiency = stated_fraction(root, "memory_bound_efficiency", Interval::kEfficiency);
    if (auto by_kind = root.optional_object("memory_bound_efficiency_by_kind")) {
      by_kind->only_keys({"glu", "loss_unfused", "loss_native", "cast"});
      for (const auto& k : StackProfile::memory_bound_kind_numbers()) {
        if (!by_kind->has(k.kind_key)) continue;
        const JsonNode directions = by_kind->object(k.kind_key);
        directions.only_keys({"forward", "backward"});
        if (directions.has(k.direction()))
          s.memory_bound_by_kind.*k.number =
              stated_fraction(directions, k.direction(), Interval::kEfficiency);
      }
    }

    const JsonNode d = root.object("dispatcher");
    d.only_keys({"kind", "host_sync", "sms", "nic_efficiency", "nvlink_efficiency", "permute_fused",
                 "permute_host_waits", "permute_index_kernels", "permute_index_backward_kernels", "by_nodes",
                 "overlap_efficiency"});
    s.dispatcher.kind = stated_choice<DispatcherKind>(d, "kind",
                                                      {{"nccl_all_to_all", DispatcherKind::kNcclAllToAll},
                                                       {"nccl_all_gather", DispatcherKind::kNcclAllGather},
                                                       {"deepep", DispatcherKind::kDeepEp},
                                                       {"hybridep", DispatcherKind::kHybridEp},
                                                       {"fused", DispatcherKind::kFused}});
    s.dispatcher.host_sync = stated_bool(d, "host_sync");
    s.dispatcher.sms = stated_integer(d, "sms", 0, 1024);
    s.dispatcher.nic_efficiency = stated_fraction(d, "nic_efficiency", Interval::kEfficiency);
    s.dispatcher.nvlink_efficiency = stated_fraction(d, "nvlink_efficiency", Interval::kEfficiency);
    s.dispatcher.permute_fused = stated_bool(d, "permute_fused");
    s.dispatcher.permute_host_waits = stated_integer(d, "permute_host_waits", 0, 16);
    s.dispatcher.permute_index_kernels = stated_integer(d, "permute_index_kernels", 0, 256);
    s.dispatcher.permute_index_backward_kernels = stated_integer(d, "permute_index_backward_kernels", 0, 256);
    if (d.has("overlap_efficiency"))
      s.dispatcher.overlap_efficiency = stated_fraction(d, "overlap_efficiency", Interval::kEfficiency);
    if (d.has("by_nodes")) {
      // {"value": [[nodes, nic_efficiency, dispatch_setup_us, combine_setup_us], ...], "basis", "source"}
      const JsonNode b = stated_node(d, "by_nodes");
      s.dispatcher.by_nodes_source = source_of(b);
      s.dispatcher.by_nodes_basis = basis_of(b);
      for (const JsonNode& row : b.array("value")) {
        const auto cells = row.elements();
        if (cells.size() != 4) row.fail_here("[nodes, nic_efficiency, dispatch_setup_us, combine_setup_us]");
        StackProfile::Dispatcher::ByNodes r{cells[0].as_number(1, 1e6), cells[1].as_number(1e-3, 1.0),
                                            cells[2].as_number(0, 1e6) * kMicro,
                                            cells[3].as_number(0, 1e6) * kMicro};
        if (!s.dispatcher.by_nodes.empty() && r.nodes <= s.dispatcher.by_nodes.back().nodes)
          cells[0].fail_here("node counts strictly increasing");
        s.dispatcher.by_nodes.push_back(r);
      }
      if (s.dispatcher.by_nodes.empty()) b.fail("value", "at least one row");
    }

    const JsonNode x = root.object("expert_mlp");
    x.only_keys({"eager_output_bias", "eager_glu_clamp"});
    s.expert_mlp.eager_output_bias = stated_bool(x, "eager_output_bias");
    s.expert_mlp.eager_glu_clamp = stated_bool(x, "eager_glu_clamp");

    if (auto w = root.optional_object("wgrad_accumulation")) {
      w->only_keys({"into_main_grad", "epilogue_overlap"});
      s.wgrad_accumulation.into_main_grad = stated_bool(*w, "into_main_grad");
      if (s.wgrad_accumulation.into_main_grad.value)
        s.wgrad_accumulation.epilogue_overlap = stated_number(*w, "epilogue_overlap", 0, 1);
    }

    s.attention_kernel = stated_choice<AttentionKernel>(
        root, "attention_kernel",
        {{"fa3", AttentionKernel::kFa3}, {"cudnn", AttentionKernel::kCudnn}, {"fa2", AttentionKernel::kFa2}});
    s.comm_sm_fraction = stated_fraction(root, "comm_sm_fraction", Interval::kShare);
    s.overlap_compute_efficiency = stated_fraction(root, "overlap_compute_efficiency", Interval::kEfficiency);
    if (root.has("fused_gemm_efficiency"))
      s.fused_gemm_efficiency = stated_fraction(root, "fused_gemm_efficiency", Interval::kEfficiency);
    if (root.has("userbuffers_rs_speed"))
      s.userbuffers_rs_speed = stated_number(root, "userbuffers_rs_speed", 0.1, 10.0);
    if (root.has("fp8_block_gemm_rate"))
      s.fp8_block_gemm_rate = stated_fraction(root, "fp8_block_gemm_rate", Interval::kEfficiency);
    if (auto rs = root.optional_object("recurrent_scan")) {
      rs->only_keys({"chunk_us"});
      s.recurrent_scan_chunk_s = stated_number(*rs, "chunk_us", 0.01, 1e3, kMicro);
    }

    const JsonNode o = root.object("overlaps");
    o.only_keys({"inter_op", "intra_op", "dp_comm", "pp_comm", "cross_micro_batch", "tp_comm",
                 "pp_comm_needs_vpp", "shared_experts"});
    s.overlaps = {stated_bool(o, "inter_op"), stated_bool(o, "intra_op"), stated_bool(o, "dp_comm"),
                  stated_bool(o, "pp_comm"), stated_bool(o, "cross_micro_batch")};
    if (o.has("tp_comm")) s.overlaps.tp_comm = stated_bool(o, "tp_comm");
    if (o.has("pp_comm_needs_vpp")) s.overlaps.pp_comm_needs_vpp = stated_bool(o, "pp_comm_needs_vpp");
    if (o.has("shared_experts")) s.overlaps.shared_experts = stated_bool(o, "shared_experts");

    const JsonNode c = root.object("capabilities");
    c.only_keys({"source", "dispatch", "recompute", "recompute_modules", "schedules", "precision",
                 "fp8_recipes", "grad_sync", "dispatch_precision", "mla_down_proj", "fp8_padding",
                 "param_gather", "cuda_graph_scopes"});
    auto& cap = s.capabilities;
    cap.source = source_of(c);
    cap.dispatch = string_list(c, "dispatch", {"all_to_all", "all_gather", "dedup"});
    cap.recompute = string_list(c, "recompute", {"none", "selective", "full", "sar"});
    cap.recompute_modules =
        string_list(c, "recompute_modules",
                    {"core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts"});
    cap.schedules = string_list(c, "schedules", {"1f1b", "interleaved_1f1b", "dualpipev"});
    cap.precision = string_list(c, "precision", {"bf16", "fp8"});
    cap.fp8_recipes = string_list(c, "fp8_recipes", {"delayed", "tensorwise", "blockwise", "mxfp8"});
    cap.grad_sync =
        string_list(c, "grad_sync", {"fp32_reduce_scatter", "bf16_reduce_scatter", "bf16_all_to_all"});
    cap.dispatch_precision = string_list(c, "dispatch_precision", {"bf16", "fp8"});
    cap.mla_down_proj = string_list(c, "mla_down_proj", {"duplicated", "column_parallel", "gathered"});
    if (cap.mla_down_proj.empty()) c.fail("mla_down_proj", "at least one layout, the stack's own first");
    cap.fp8_padding = string_list(c, "fp8_padding", {"experts", "dispatcher", "router", "none"});
    if (cap.fp8_padding.empty()) c.fail("fp8_padding", "at least one place, the stack's own first");
    cap.param_gather = string_list(c, "param_gather", {"bf16", "fp8"});
    if (c.has("cuda_graph_scopes")) {
      cap.cuda_graph_scopes = string_list(
          c, "cuda_graph_scopes", {"layer", "attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba"});
    }

    const JsonNode m = root.object("memory");
    m.only_keys({"reserve_GiB", "fragmentation"});
    std::tie(s.memory.reserve_bytes, s.memory.reserve_bytes_high) =
        stated_range(m, "reserve_GiB", 0, 1024, kGiB);
    std::tie(s.memory.fragmentation, s.memory.fragmentation_high) =
        stated_range(m, "fragmentation", 0, 0.9, 1.0);
    return s;
  });
}

nlohmann::ordered_json stack_to_json(const StackProfile& s) {
  using oj = nlohmann::ordered_json;
  auto round_to = [](double x, double step) { return std::round(x / step) * step; };
  auto num = [&](const Stated<double>& v, double unit) {
    oj o{{"value", round_to(v.value / unit, 1e-4)}, {"basis", name_of(v.basis)}, {"source", v.source}};
    if (v.range) {
      o["range"] = oj::array({round_to(v.range->first / unit, 1e-4), round_to(v.range->second / unit, 1e-4)});
    }
    return o;
  };
  auto integer = [](const Stated<int64_t>& v) {
    return oj{{"value", v.value}, {"basis", name_of(v.basis)}, {"source", v.source}};
  };
  auto flag = [](const Stated<bool>& v) {
    return oj{{"value", v.value}, {"basis", name_of(v.basis)}, {"source", v.source}};
  };
  auto name = [](const auto& v) {
    return oj{{"value", name_of(v.value)}, {"basis", name_of(v.basis)}, {"source", v.source}};
  };
  auto range = [&](const Stated<double>& lo, const Stated<double>& hi, double unit) {
    return oj{{"value", oj::array({round_to(lo.value / unit, 1e-4), round_to(hi.value / unit, 1e-4)})},
              {"basis", name_of(lo.basis)},
              {"source", lo.source}};
  };
  oj j;
  j["format"] = "moeplan-stack-v2";
  j["name"] = s.name;
  j["description"] = s.description;
  j["calibrated"] = s.calibrated;
  oj sources = oj::object();
  for (const auto& [id, c] : s.sources) sources[id] = c;
  j["sources"] = sources;
  j["host"] = oj{{"launch_us_per_kernel", num(s.launch_s_per_kernel, kMicro)},
                 {"issue_us_per_kernel", num(s.host_s_per_kernel, kMicro)},
                 {"us_per_local_expert", num(s.host_s_per_local_expert, kMicro)},
                 {"us_per_micro_batch", num(s.host_s_per_micro_batch, kMicro)},
                 {"sync_us", num(s.host_sync_s, kMicro)},
                 {"min_kernel_us", num(s.min_kernel_s, kMicro)}};
  j["grouped_gemm"] = oj{{"implementation", name(s.grouped_gemm.impl)},
                         {"streams", integer(s.grouped_gemm.streams)},
                         {"efficiency", num(s.grouped_gemm.efficiency, 1.0)},
                         {"wgrad_efficiency", num(s.grouped_gemm.wgrad_efficiency, 1.0)}};
  j["memory_bound_efficiency"] = num(s.memory_bound_efficiency, 1.0);
  oj by_kind = oj::object();
  for (const auto& k : StackProfile::memory_bound_kind_numbers()) {
    const Stated<double>& n = s.memory_bound_by_kind.*k.number;
    if (n.value <= 0) continue;
    by_kind[k.kind_key][k.direction()] = num(n, 1.0);
  }
  if (!by_kind.empty()) j["memory_bound_efficiency_by_kind"] = by_kind;
  j["dispatcher"] =
      oj{{"kind", name(s.dispatcher.kind)},
         {"host_sync", flag(s.dispatcher.host_sync)},
         {"sms", integer(s.dispatcher.sms)},
         {"nic_efficiency", num(s.dispatcher.nic_efficiency, 1.0)},
         {"nvlink_efficiency", num(s.dispatcher.nvlink_efficiency, 1.0)},
         {"permute_fused", flag(s.dispatcher.permute_fused)},
         {"permute_host_waits", integer(s.dispatcher.permute_host_waits)},
         {"permute_index_kernels", integer(s.dispatcher.permute_index_kernels)},
         {"permute_index_backward_kernels", integer(s.dispatcher.permute_index_backward_kernels)}};
  if (s.dispatcher.overlap_efficiency.source != kNotStated)
    j["dispatcher"]["overlap_efficiency"] = num(s.dispatcher.overlap_efficiency, 1.0);
  if (!s.dispatcher.by_nodes.empty()) {
    oj rows = oj::array();
    for (const auto& r : s.dispatcher.by_nodes) {
      rows.push_back(oj::array({r.nodes, r.nic_efficiency, round_to(r.dispatch_setup_s / kMicro, 1e-4),
                                round_to(r.combine_setup_s / kMicro, 1e-4)}));
    }
    j["dispatcher"]["by_nodes"] = oj{{"value", rows},
                                     {"basis", name_of(s.dispatcher.by_nodes_basis)},
                                     {"source", s.dispatcher.by_nodes_source}};
  }
  j["expert_mlp"] = oj{{"eager_output_bias", flag(s.expert_mlp.eager_output_bias)},
                       {"eager_glu_clamp", flag(s.expert_mlp.eager_glu_clamp)}};
  if (s.wgrad_accumulation.into_main_grad.value) {
    j["wgrad_accumulation"] = oj{{"into_main_grad", flag(s.wgrad_accumulation.into_main_grad)},
                                 {"epilogue_overlap", num(s.wgrad_accumulation.epilogue_overlap, 1.0)}};
  }
  j["attention_kernel"] = name(s.attention_kernel);
  j["comm_sm_fraction"] = num(s.comm_sm_fraction, 1.0);
  j["overlap_compute_efficiency"] = num(s.overlap_compute_efficiency, 1.0);
  if (s.fused_gemm_efficiency.source != kNotStated)
    j["fused_gemm_efficiency"] = num(s.fused_gemm_efficiency, 1.0);
  if (s.userbuffers_rs_speed.source != kNotStated)
    j["userbuffers_rs_speed"] = num(s.userbuffers_rs_speed, 1.0);
  if (s.fp8_block_gemm_rate.source != kNotStated) j["fp8_block_gemm_rate"] = num(s.fp8_block_gemm_rate, 1.0);
  if (s.recurrent_scan_chunk_s.source != kNotStated)
    j["recurrent_scan"] = oj{{"chunk_us", num(s.recurrent_scan_chunk_s, kMicro)}};
  j["overlaps"] = oj{{"inter_op", flag(s.overlaps.inter_op)},
                     {"intra_op", flag(s.overlaps.intra_op)},
                     {"dp_comm", flag(s.overlaps.dp_comm)},
                     {"pp_comm", flag(s.overlaps.pp_comm)},
                     {"cross_micro_batch", flag(s.overlaps.cross_micro_batch)}};
  if (s.overlaps.tp_comm.source != kNotStated) j["overlaps"]["tp_comm"] = flag(s.overlaps.tp_comm);
  if (s.overlaps.pp_comm_needs_vpp.source != kNotStated)
    j["overlaps"]["pp_comm_needs_vpp"] = flag(s.overlaps.pp_comm_needs_vpp);
  if (s.overlaps.shared_experts.source != kNotStated)
    j["overlaps"]["shared_experts"] = flag(s.overlaps.shared_experts);
  const auto& c = s.capabilities;
  j["capabilities"] = oj{{"source", c.source},
                         {"dispatch", c.dispatch},
                         {"recompute", c.recompute},
                         {"recompute_modules", c.recompute_modules},
                         {"schedules", c.schedules},
                         {"precision", c.precision},
                         {"fp8_recipes", c.fp8_recipes},
                         {"grad_sync", c.grad_sync},
                         {"dispatch_precision", c.dispatch_precision},
                         {"mla_down_proj", c.mla_down_proj},
                         {"fp8_padding", c.fp8_padding},
                         {"param_gather", c.param_gather},
                         {"cuda_graph_scopes", c.cuda_graph_scopes}};
  j["memory"] = oj{{"reserve_GiB", range(s.memory.reserve_bytes, s.memory.reserve_bytes_high, kGiB)},
                   {"fragmentation", range(s.memory.fragmentation, s.memory.fragmentation_high, 1.0)}};
  return j;
}

Result<StackProfile> load_stack(const std::string& ref, const std::string& base_dir) {
  std::string label;
  Result<json> j = read_input(ref, "hwprofiles/stacks", base_dir, &label, nullptr);
  if (!j) return j.error();
  return stack_from_json(j.value(), label);
}

}  // namespace moeplan::io
