// Hardware profile reading: strict keys, {value, source} pairs for every scalar, sorted calibration tables.
#include "simulator/io/hardware_loader.h"

#include <fmt/format.h>

#include "simulator/core/stack.h"
#include "simulator/core/units.h"
#include "simulator/io/builtin_catalog.h"
#include "simulator/io/stack_loader.h"

namespace moeplan::io {
namespace {

GpuSpec read_gpu(const JsonNode& g) {
  g.only_keys({"model", "sm_count", "peak_tflops", "hbm_capacity_MiB", "hbm_capacity_GB", "hbm_bw_peak_GBps",
               "hbm_bw_achieved_GBps", "sustained_rate"});
  GpuSpec s;
  s.model = g.string("model");
  s.sm_count = sourced_integer(g, "sm_count", 1, 10000);
  const JsonNode peaks = g.object("peak_tflops");
  peaks.only_keys({"bf16", "fp8", "tf32", "fp32"});
  for (const char* dtype : {"bf16", "fp8", "tf32", "fp32"}) {
    if (peaks.has(dtype)) s.peak_flops_per_s[dtype] = sourced_number(peaks, dtype, 1e-3, 1e6, kTera);
  }
  if (!s.peak_flops_per_s.contains("bf16")) peaks.fail("bf16", "the dense BF16 peak (every plan needs it)");
  // Capacity as the driver reports it (NVML's memory.total, in MiB: what `nvidia-smi` prints), or in
  // decimal GB for a profile that only has a datasheet figure. Exactly one of the two.
  if (g.has("hbm_capacity_MiB") == g.has("hbm_capacity_GB")) {
    g.fail("hbm_capacity_MiB",
           "exactly one of hbm_capacity_MiB (as nvidia-smi reports it) or hbm_capacity_GB");
  }
  s.hbm_capacity_bytes = g.has("hbm_capacity_MiB") ? sourced_number(g, "hbm_capacity_MiB", 1, 1e8, kMiB)
                                                   : sourced_number(g, "hbm_capacity_GB", 1e-3, 1e5, kGB);
  s.hbm_bw_peak_bytes_per_s = sourced_number(g, "hbm_bw_peak_GBps", 1, 1e6, kGB);
  s.hbm_bw_achieved_bytes_per_s = sourced_number(g, "hbm_bw_achieved_GBps", 1, 1e6, kGB);
  if (s.hbm_bw_achieved_bytes_per_s.value > s.hbm_bw_peak_bytes_per_s.value) {
    g.object("hbm_bw_achieved_GBps").fail("value", "at most hbm_bw_peak_GBps");
  }
  // Optional: the tensor-core rate under sustained load as a share of the tables' (burst) rate, by dtype.
  if (g.has("sustained_rate")) {
    const JsonNode rates = g.object("sustained_rate");
    rates.only_keys({"bf16", "fp8"});
    for (const char* dtype : {"bf16", "fp8"}) {
      if (rates.has(dtype)) s.sustained_rate[dtype] = stated_efficiency(rates, dtype);
    }
  }
  return s;
}

NodeSpec read_node(const JsonNode& n) {
  n.only_keys(
      {"gpus_per_node", "nvlink_bw_uni_GBps", "nvlink_bw_achieved_GBps", "nvls", "nvlink_latency_us"});
  NodeSpec s;
  s.gpus_per_node = sourced_integer(n, "gpus_per_node", 1, 1024);
  s.nvlink_bw_uni_bytes_per_s = sourced_number(n, "nvlink_bw_uni_GBps", 1e-3, 1e6, kGB);
  s.nvlink_bw_achieved_bytes_per_s = sourced_number(n, "nvlink_bw_achieved_GBps", 1e-3, 1e6, kGB);
  if (s.nvlink_bw_achieved_bytes_per_s.value > s.nvlink_bw_uni_bytes_per_s.value) {
    n.object("nvlink_bw_achieved_GBps").fail("value", "at most nvlink_bw_uni_GBps");
  }
  s.nvls = sourced_bool(n, "nvls");
  s.nvlink_latency_s = sourced_number(n, "nvlink_latency_us", 0, 1e6, kMicro);
  return s;
}

ScaleOutSpec read_scale_out(const JsonNode& n) {
  n.only_keys({"nics_per_node", "nic_bw_GBps", "nic_bw_achieved_GBps", "topology", "net_latency_us"});
  ScaleOutSpec s;
  s.nics_per_node = sourced_integer(n, "nics_per_node", 0, 1024);
  s.nic_bw_bytes_per_s = sourced_number(n, "nic_bw_GBps", 1e-3, 1e5, kGB);
  s.nic_bw_achieved_bytes_per_s = sourced_number(n, "nic_bw_achieved_GBps", 1e-3, 1e5, kGB);
  if (s.nic_bw_achieved_bytes_per_s.value > s.nic_bw_bytes_per_s.value) {
    n.object("nic_bw_achieved_GBps").fail("value", "at most nic_bw_GBps");
  }
  const JsonNode t = n.object("topology");
  t.only_keys({"value", "source"});
  s.topology = {t.choice<Topology>("value", {{"rail_optimized_fat_tree", Topology::kRailOptimizedFatTree},
                                             {"multi_plane_fat_tree", Topology::kMultiPlaneFatTree},
                                             {"fat_tree", Topology::kFatTree}}),
                source_of(t)};
  s.net_latency_s = sourced_number(n, "net_latency_us", 0, 1e6, kMicro);
  return s;
}

// A point row: a JSON array of exactly `n` numbers.
std::vector<JsonNode> row(const JsonNode& p, size_t n) {
  auto cells = p.elements();
  if (cells.size() != n) p.fail_here(fmt::format("an array of {} numbers", n));
  return cells;
}

Collective read_collective_kind(const JsonNode& c) {
  return c.choice<Collective>("collective", {{"all_reduce", Collective::kAllReduce},
                                             {"all_gather", Collective::kAllGather},
                                             {"reduce_scatter", Collective::kReduceScatter},
                                             {"all_to_all", Collective::kAllToAll},
                                             {"send_recv", Collective::kSendRecv}});
}

// ranks, nodes and scope must agree: one node exactly when intra_node.
void read_span(const JsonNode& c, Scope& scope, int64_t& ranks, int64_t& nodes) {
  scope = c.choice<Scope>("scope", {{"intra_node", Scope::kIntraNode}, {"inter_node", Scope::kInterNode}});
  ranks = c.integer("ranks", 2, 1 << 20);
  nodes = c.integer("nodes", 1, 1 << 20);
  if (nodes > ranks) c.fail("nodes", fmt::format("at most ranks ({})", ranks));
  if ((scope == Scope::kIntraNode) != (nodes == 1)) c.fail("nodes", "1 exactly when scope is intra_node");
}

CollectivePlateau read_plateau(const JsonNode& c) {
  c.only_keys({"collective", "scope", "ranks", "nodes", "busbw_GBps", "source"});
  CollectivePlateau p;
  p.collective = read_collective_kind(c);
  read_span(c, p.scope, p.ranks, p.nodes);
  p.busbw_bytes_per_s = c.number("busbw_GBps", 1e-3, 1e5) * kGB;
  p.source = source_of(c);
  return p;
}

CollectiveCurve read_collective(const JsonNode& c) {
  c.only_keys({"collective", "algorithm", "scope", "ranks", "nodes", "metric", "source", "points"});
  CollectiveCurve k;
  k.collective = read_collective_kind(c);
  k.algorithm =
      c.choice<CollectiveAlgorithm>("algorithm", {{"ring", CollectiveAlgorithm::kRing},
                                                  {"nvls", CollectiveAlgorithm::kNvls},
                                                  {"nvls_tree", CollectiveAlgorithm::kNvlsTree},
                                                  {"tree", CollectiveAlgorithm::kTree},
                                                  {"unspecified", CollectiveAlgorithm::kUnspecified}});
  read_span(c, k.scope, k.ranks, k.nodes);
  k.metric = c.choice<BandwidthMetric>(
      "metric", {{"busbw_GBps", BandwidthMetric::kBusBw}, {"algbw_GBps", BandwidthMetric::kAlgBw}});
  k.source = source_of(c);
  for (const auto& p : c.array("points")) {
    const auto cells = row(p, 2);
    const double bytes = static_cast<double>(cells[0].as_integer(1, int64_t{1} << 50));
    const double bw = cells[1].as_number(0, 1e5) * kGB;
    if (!k.points.empty() && bytes <= k.points.back().first) p.fail_here("message sizes strictly increasing");
    k.points.emplace_back(bytes, bw);
  }
  if (k.points.empty()) c.fail("points", "at least one [bytes, bandwidth] point");
  return k;
}

std::string read_dtype(const JsonNode& c) {
  return c.choice<std::string>("dtype", {{"bf16", "bf16"}, {"fp8", "fp8"}, {"fp16", "fp16"}});
}

Calibration read_calibration(const JsonNode& c) {
  c.only_keys({"collectives", "plateaus", "gemm", "grouped_gemm", "attention", "hbm", "alltoall_skew"});
  Calibration cal;
  if (c.has("collectives")) {
    for (const auto& e : c.array("collectives")) cal.collectives.push_back(read_collective(e));
  }
  if (c.has("plateaus")) {
    for (const auto& e : c.array("plateaus")) cal.plateaus.push_back(read_plateau(e));
  }
  if (c.has("gemm")) {
    for (const auto& e : c.array("gemm")) {
      e.only_keys({"dtype", "source", "points"});
      GemmTable t{read_dtype(e), source_of(e), {}};
      for (const auto& p : e.array("points")) {
        const auto cells = row(p, 4);
        t.points.push_back({cells[0].as_integer(1, 1 << 30), cells[1].as_integer(1, 1 << 30),
                            cells[2].as_integer(1, 1 << 30), cells[3].as_number(0, 1e5) * kTera});
      }
      cal.gemm.push_back(std::move(t));
    }
  }
  if (c.has("grouped_gemm")) {
    for (const auto& e : c.array("grouped_gemm")) {
      e.only_keys({"dtype", "kernel", "part", "source", "points"});
      GroupedGemmTable t;
      t.dtype = read_dtype(e);
      t.kernel = e.string("kernel");
      if (!find_grouped_gemm_kernel(t.kernel)) {
        e.fail("kernel", "the kernel's implementation class, one of " + grouped_gemm_kernel_names());
      }
      t.part = e.choice_or<std::string>(
          "part", "fwd", {{"fwd", "fwd"}, {"dgrad", "dgrad"}, {"wgrad", "wgrad"}, {"fwd+bwd", "fwd+bwd"}});
      t.source = source_of(e);
      for (const auto& p : e.array("points")) {
        const auto cells = row(p, 5);
        t.points.push_back({cells[0].as_integer(1, 1 << 20), cells[1].as_integer(1, 1 << 30),
                            cells[2].as_integer(1, 1 << 30), cells[3].as_integer(1, 1 << 30),
                            cells[4].as_number(0, 1e5) * kTera});
      }
      cal.grouped_gemm.push_back(std::move(t));
    }
  }
  if (c.has("attention")) {
    for (const auto& e : c.array("attention")) {
      e.only_keys({"dtype", "direction", "head_dim", "causal", "impl", "source", "points"});
      AttentionTable t;
      t.dtype = read_dtype(e);
      t.direction = e.choice<std::string>("direction", {{"fwd", "fwd"}, {"bwd", "bwd"}});
      t.head_dim = e.integer("head_dim", 1, 4096);
      t.causal = e.boolean("causal");
      // The kernel that was measured: fa3, fa2, cudnn, or another implementation's name (moerun bench writes
      // "moerun-cpu"). The cost model prefers fa3 where it has a choice.
      t.impl = e.string("impl");
      if (t.impl.empty() ||
          t.impl.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_-") != std::string::npos)
        e.fail("impl", "an implementation name in lower case (fa3, fa2, cudnn, ...)");
      t.source = source_of(e);
      for (const auto& p : e.array("points")) {
        const auto cells = row(p, 2);
        const int64_t seq = cells[0].as_integer(1, int64_t{1} << 30);
        if (!t.points.empty() && seq <= t.points.back().first)
          p.fail_here("sequence lengths strictly increasing");
        t.points.emplace_back(seq, cells[1].as_number(0, 1e5) * kTera);
      }
      cal.attention.push_back(std::move(t));
    }
  }
  if (c.has("hbm")) {
    for (const auto& e : c.array("hbm")) {
      e.only_keys({"kernel", "bw_GBps", "source"});
      cal.hbm.push_back(
          {e.choice<std::string>(
               "kernel",
               {{"copy", "copy"}, {"mul", "mul"}, {"add", "add"}, {"triad", "triad"}, {"dot", "dot"}}),
           e.number("bw_GBps", 1, 1e6) * kGB, source_of(e)});
    }
  }
  if (c.has("alltoall_skew")) {
    for (const auto& e : c.array("alltoall_skew")) {
      e.only_keys({"ranks", "nodes", "source", "points"});
      AllToAllSkewTable t;
      t.ranks = e.integer("ranks", 2, int64_t{1} << 20);
      t.nodes = e.integer("nodes", 1, t.ranks);
      t.source = source_of(e);
      for (const auto& p : e.array("points")) {
        const auto cells = row(p, 3);
        const int64_t bytes = cells[0].as_integer(1, int64_t{1} << 40);
        const double hot = cells[1].as_number(1, static_cast<double>(t.ranks));
        t.points.push_back({bytes, hot, cells[2].as_number(0, 1e9) * 1e-6});
        if (t.points.back().seconds <= 0) p.fail_here("[bytes, hot_factor, time_us] with a positive time");
      }
      if (t.points.empty()) e.fail("points", "at least one [bytes, hot_factor, time_us] point");
      cal.alltoall_skew.push_back(std::move(t));
    }
  }
  return cal;
}

}  // namespace

Result<HardwareProfile> hardware_from_json(const json& j, const std::string& label) {
  return catch_input_errors([&]() -> HardwareProfile {
    const JsonNode root(j, label);
    root.only_keys({"format", "name", "description", "sources", "gpu", "node", "scale_out", "calibration"});
    if (root.string("format") != "moeplan-hwprofile-v1") root.fail("format", "\"moeplan-hwprofile-v1\"");
    HardwareProfile h;
    h.name = root.string("name");
    h.description = root.string_or("description", "");
    if (auto s = root.optional_object("sources")) {
      for (auto it = s->raw().begin(); it != s->raw().end(); ++it) h.sources[it.key()] = s->string(it.key());
    }
    h.gpu = read_gpu(root.object("gpu"));
    h.node = read_node(root.object("node"));
    h.scale_out = read_scale_out(root.object("scale_out"));
    if (auto c = root.optional_object("calibration")) h.calibration = read_calibration(*c);
    return h;
  });
}

Result<HardwareProfile> load_hardware(const std::string& ref, const std::string& base_dir) {
  std::string label;
  Result<json> j = read_input(ref, "hwprofiles", base_dir, &label, nullptr);
  if (!j) return j.error();
  return hardware_from_json(j.value(), label);
}

}  // namespace moeplan::io
