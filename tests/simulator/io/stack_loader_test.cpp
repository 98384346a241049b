// The shipped stack profiles load with a source and basis for every number, convert µs and GiB to SI once,
// write back to the same profile, and every bad input is one line naming the field.
#include <doctest/doctest.h>

#include <algorithm>
#include <regex>
#include <string>

#include "simulator/core/stack.h"
#include "simulator/io/builtin_catalog.h"
#include "simulator/io/hardware_loader.h"
#include "simulator/io/json_reader.h"
#include "simulator/io/stack_loader.h"
#include "simulator/workload/lower.h"

using namespace moeplan;

namespace {

const std::string kStacks = std::string(MOEPLAN_SOURCE_DIR) + "/hwprofiles/stacks/";

StackProfile load(const std::string& stem) {
  auto s = io::load_stack(kStacks + stem + ".json");
  REQUIRE_MESSAGE(s.ok(), (s.ok() ? "" : s.error().message));
  return s.value();
}

io::json moerun_json() {
  auto j = io::parse_json_file(kStacks + "moerun.json");
  REQUIRE_MESSAGE(j.ok(), (j.ok() ? "" : j.error().message));
  return j.value();
}

// How many times the stack lists the number at `path` among its numbers (StackProfile::numbers).
int times_listed(StackProfile s, const std::string& path) {
  int listed = 0;
  for (const auto& n : s.numbers()) listed += path == n.path ? 1 : 0;
  return listed;
}

// The error message for `j` read as "s.json"; the test fails if it loads.
std::string error_of(const io::json& j) {
  auto s = io::stack_from_json(j, "s.json");
  REQUIRE_FALSE(s.ok());
  CHECK(s.error().message.find('\n') == std::string::npos);
  return s.error().message;
}

const char* const kStackNames[] = {"moerun", "megatron-core", "megatron-core-deepep",
                                   "megatron-core-hybridep", "megascale-moe"};

}  // namespace

TEST_SUITE("io") {
  TEST_CASE("the shipped stacks load as uncalibrated, with a source and a basis for every number") {
    for (const char* stem : kStackNames) {
      CAPTURE(stem);
      const StackProfile s = load(stem);
      CHECK(s.name == stem);
      CHECK_FALSE(s.calibrated);
      CHECK_FALSE(s.description.empty());
      CHECK_FALSE(s.sources.empty());
      for (const auto* src : {&s.launch_s_per_kernel.source,
                              &s.host_s_per_kernel.source,
                              &s.host_s_per_local_expert.source,
                              &s.host_s_per_micro_batch.source,
                              &s.host_sync_s.source,
                              &s.grouped_gemm.impl.source,
                              &s.grouped_gemm.efficiency.source,
                              &s.grouped_gemm.wgrad_efficiency.source,
                              &s.memory_bound_efficiency.source,
                              &s.dispatcher.kind.source,
                              &s.dispatcher.sms.source,
                              &s.dispatcher.permute_host_waits.source,
                              &s.dispatcher.permute_index_kernels.source,
                              &s.dispatcher.permute_index_backward_kernels.source,
                              &s.expert_mlp.eager_output_bias.source,
                              &s.expert_mlp.eager_glu_clamp.source,
                              &s.attention_kernel.source,
                              &s.comm_sm_fraction.source,
                              &s.overlaps.inter_op.source,
                              &s.overlaps.intra_op.source,
                              &s.overlaps.dp_comm.source,
                              &s.overlaps.pp_comm.source,
                              &s.overlaps.cross_micro_batch.source,
                              &s.capabilities.source,
                              &s.memory.reserve_bytes.source,
                              &s.memory.fragmentation.source}) {
        CHECK_FALSE(src->empty());
      }
      // Megatron-Core's TEGroupedMLP adds expert biases and clamps GLUs in eager PyTorch; the others do not.
      const bool megatron = std::string(stem).starts_with("megatron-core");
      CHECK(s.expert_mlp.eager_output_bias.value == megatron);
      CHECK(s.expert_mlp.eager_glu_clamp.value == megatron);
      CHECK(s.memory_bound_efficiency.value > 0.0);
      CHECK(s.memory_bound_efficiency.value <= 1.0);
      CHECK(s.comm_sm_fraction.value >= 0.0);
      CHECK(s.comm_sm_fraction.value < 1.0);
      CHECK(s.memory.reserve_bytes.value <= s.memory.reserve_bytes_high.value);
      CHECK(s.memory.fragmentation.value <= s.memory.fragmentation_high.value);
    }
  }

  TEST_CASE("every source a shipped stack lists is cited by one of its numbers") {
    for (const char* stem : kStackNames) {
      CAPTURE(stem);
      auto j = io::parse_json_file(kStacks + std::string(stem) + ".json");
      REQUIRE(j.ok());
      io::json body = j.value();
      const io::json sources = body.at("sources");
      body.erase("sources");
      const std::string text = body.dump();
      for (const auto& [id, citation] : sources.items()) {
        CAPTURE(id);
        const std::regex word("(^|[^A-Za-z0-9])" + id + "([^A-Za-z0-9]|$)");
        CHECK(std::regex_search(text, word));
      }
    }
  }

  TEST_CASE("a written stack reads back to the same profile") {
    for (const char* stem : kStackNames) {
      CAPTURE(stem);
      const StackProfile a = load(stem);
      const auto b = io::stack_from_json(io::json::parse(io::stack_to_json(a).dump()), "back.json");
      REQUIRE_MESSAGE(b.ok(), (b.ok() ? "" : b.error().message));
      const StackProfile& s = b.value();
      CHECK(s.name == a.name);
      CHECK(s.launch_s_per_kernel.value == doctest::Approx(a.launch_s_per_kernel.value));
      CHECK(s.host_s_per_kernel.value == doctest::Approx(a.host_s_per_kernel.value));
      CHECK(s.grouped_gemm.impl.value == a.grouped_gemm.impl.value);
      CHECK(s.grouped_gemm.efficiency.value == doctest::Approx(a.grouped_gemm.efficiency.value));
      CHECK(s.grouped_gemm.efficiency.basis == a.grouped_gemm.efficiency.basis);
      CHECK(s.dispatcher.kind.value == a.dispatcher.kind.value);
      CHECK(s.dispatcher.sms.value == a.dispatcher.sms.value);
      CHECK(s.attention_kernel.value == a.attention_kernel.value);
      CHECK(s.capabilities.recompute == a.capabilities.recompute);
      CHECK(s.memory.reserve_bytes_high.value == doctest::Approx(a.memory.reserve_bytes_high.value));
      for (const auto& k : StackProfile::memory_bound_kind_numbers()) {
        CAPTURE(k.path);
        CHECK((s.memory_bound_by_kind.*k.number).value ==
              doctest::Approx((a.memory_bound_by_kind.*k.number).value));
        CHECK((s.memory_bound_by_kind.*k.number).basis == (a.memory_bound_by_kind.*k.number).basis);
      }
      CHECK(s.sources == a.sources);
      StackProfile a_copy = a, s_copy = s;
      const auto an = a_copy.numbers(), sn = s_copy.numbers();
      REQUIRE(an.size() == sn.size());
      for (size_t i = 0; i < an.size(); ++i) {
        CAPTURE(an[i].path);
        REQUIRE(an[i].number->range.has_value() == sn[i].number->range.has_value());
        if (!an[i].number->range) continue;
        CHECK(sn[i].number->range->first == doctest::Approx(an[i].number->range->first));
        CHECK(sn[i].number->range->second == doctest::Approx(an[i].number->range->second));
      }
    }
  }

  TEST_CASE(
      "every unmeasured number of a shipped stack states a range around its value, in the file's unit") {
    for (const char* stem : kStackNames) {
      CAPTURE(stem);
      StackProfile s = load(stem);
      auto j = io::parse_json_file(kStacks + std::string(stem) + ".json");
      REQUIRE(j.ok());
      int ranged = 0;
      for (const StackProfile::Number& n : s.numbers()) {
        CAPTURE(n.path);
        // The path names the number in the file: its value there, in the file's unit, is the profile's.
        const io::json* node = &j.value();
        std::string rest = n.path;
        for (size_t dot = 0; dot != std::string::npos;) {
          dot = rest.find('.');
          const std::string key = rest.substr(0, dot);
          if (node->contains(key)) node = &node->at(key);
          rest = dot == std::string::npos ? "" : rest.substr(dot + 1);
        }
        REQUIRE(node->contains("value"));
        CHECK(node->at("value").get<double>() * n.unit == doctest::Approx(n.number->value));
        const Basis b = n.number->basis;
        if (b == Basis::kAssumed || b == Basis::kTarget) REQUIRE(n.number->range.has_value());
        if (!n.number->range) continue;
        ++ranged;
        CHECK(n.number->range->first <= n.number->value);
        CHECK(n.number->value <= n.number->range->second);
        CHECK(node->at("range").at(0).get<double>() * n.unit == doctest::Approx(n.number->range->first));
        // The source says where the range comes from.
        CHECK(n.number->source.find("ange [") != std::string::npos);
      }
      CHECK(ranged >= 3);
    }
  }

  TEST_CASE("host costs given in microseconds and the reserve in GiB are held in seconds and bytes") {
    // moerun.json: issue 3 us per kernel, 20 us per micro-batch; megatron-core: reserve 2-4 GiB.
    const StackProfile moerun = load("moerun");
    CHECK(moerun.host_s_per_kernel.value == doctest::Approx(3e-6));
    CHECK(moerun.host_s_per_micro_batch.value == doctest::Approx(20e-6));
    const StackProfile mc = load("megatron-core");
    CHECK(mc.memory.reserve_bytes.value == doctest::Approx(2.0 * 1024 * 1024 * 1024));
    CHECK(mc.memory.reserve_bytes_high.value == doctest::Approx(4.0 * 1024 * 1024 * 1024));
    CHECK(mc.host_sync_s.value == doctest::Approx(20e-6));
  }

  TEST_CASE("the stacks say what runs: dispatcher, expert GEMMs, attention kernel, host waits") {
    const StackProfile mc = load("megatron-core"), deepep = load("megatron-core-deepep"),
                       hybrid = load("megatron-core-hybridep"), moerun = load("moerun"),
                       megascale = load("megascale-moe");
    CHECK(mc.dispatcher.kind.value == DispatcherKind::kNcclAllToAll);
    CHECK(mc.dispatcher.host_sync.value);
    CHECK(mc.grouped_gemm.impl.value == GroupedGemmImpl::kPerExpertStreams);
    CHECK(mc.grouped_gemm.streams.value == 4);
    CHECK(mc.attention_kernel.value == AttentionKernel::kCudnn);
    CHECK_FALSE(mc.dispatch_dedup());
    CHECK(deepep.dispatch_dedup());
    CHECK(deepep.dispatcher.sms.value == 20);
    CHECK_FALSE(deepep.dispatcher.permute_fused.value);
    CHECK(hybrid.dispatch_dedup());
    CHECK(hybrid.dispatcher.permute_fused.value);
    CHECK(moerun.grouped_gemm.impl.value == GroupedGemmImpl::kGroupedKernel);
    CHECK_FALSE(moerun.dispatcher.host_sync.value);
    CHECK(moerun.overlaps.intra_op.basis == Basis::kTarget);  // built, never run on a GPU
    CHECK(moerun.grouped_gemm.efficiency.basis == Basis::kMeasured);
    CHECK(megascale.overlaps.intra_op.value);
    CHECK(mc.overlaps.cross_micro_batch.value);
    CHECK_FALSE(moerun.overlaps.cross_micro_batch.value);
    CHECK(mc.overlaps.tp_comm.value);  // TE's userbuffers
    CHECK(mc.overlaps.tp_comm.basis == Basis::kDerived);
    CHECK(hybrid.overlaps.tp_comm.value);
    CHECK_FALSE(moerun.overlaps.tp_comm.value);
    CHECK_FALSE(megascale.overlaps.tp_comm.value);
    CHECK(mc.userbuffers_rs_speed.value == 1.0);
    CHECK(mc.userbuffers_rs_speed.basis == Basis::kAssumed);
    CHECK(mc.userbuffers_rs_speed.range == std::pair{0.5, 2.0});
    CHECK(moerun.userbuffers_rs_speed.source == kNotStated);
    // A number the step is predicted again over: the Megatron stacks', not moerun's.
    auto listed = [](StackProfile s) {
      for (const auto& n : s.numbers())
        if (std::string(n.path) == "userbuffers_rs_speed") return true;
      return false;
    };
    CHECK(listed(mc));
    CHECK_FALSE(listed(moerun));
    CHECK(stack_has(mc.capabilities.recompute_modules, "mla_up_proj"));
    CHECK_FALSE(stack_has(mc.capabilities.recompute, "sar"));
    CHECK(stack_has(megascale.capabilities.recompute, "sar"));
    CHECK_FALSE(stack_has(moerun.capabilities.dispatch, "dedup"));
  }

  TEST_CASE("a relative stack path resolves against the base directory") {
    const auto s = io::load_stack("hwprofiles/stacks/megatron-core.json", MOEPLAN_SOURCE_DIR);
    REQUIRE_MESSAGE(s.ok(), (s.ok() ? "" : s.error().message));
    CHECK(s.value().name == "megatron-core");
  }

  TEST_CASE("built-in stacks load by name when the build embeds them") {
    // A standalone build without the generated catalog has no built-ins; the CMake build embeds
    // hwprofiles/stacks.
    if (io::builtin_names("hwprofiles/stacks").empty()) return;
    const auto s = io::load_stack("moerun");
    REQUIRE_MESSAGE(s.ok(), (s.ok() ? "" : s.error().message));
    CHECK(s.value().name == "moerun");
  }

  TEST_CASE("an unknown key is an error with a did-you-mean suggestion") {
    io::json j = moerun_json();
    j["comm_sm_fractoin"] = j["comm_sm_fraction"];
    CHECK(error_of(j) == "s.json: field 'comm_sm_fractoin': unknown key (did you mean 'comm_sm_fraction'?)");

    j = moerun_json();
    j["host"]["launch_us_per_kernal"] = j["host"]["launch_us_per_kernel"];
    CHECK(error_of(j) ==
          "s.json: field 'host.launch_us_per_kernal': unknown key (did you mean 'launch_us_per_kernel'?)");
  }

  TEST_CASE("memory-bound kinds measured apart are optional, named, and efficiencies like the rest") {
    const StackProfile mc = load("megatron-core");
    CHECK(mc.memory_bound_by_kind.loss_unfused_forward.value == doctest::Approx(0.97));
    CHECK(mc.memory_bound_by_kind.glu_backward.range.has_value());
    CHECK(mc.memory_bound_by_kind.loss_native_backward.basis == Basis::kDerived);
    CHECK(load("moerun").memory_bound_by_kind.glu_forward.value == 0);  // not stated: the default prices it
    CHECK(io::stack_to_json(load("moerun")).count("memory_bound_efficiency_by_kind") == 0);

    io::json j = moerun_json();
    j["memory_bound_efficiency_by_kind"]["loss_fused"]["forward"] = j["memory_bound_efficiency"];
    CHECK(error_of(j) ==
          "s.json: field 'memory_bound_efficiency_by_kind.loss_fused': unknown key (did you mean "
          "'loss_unfused'?)");

    j = moerun_json();
    j["memory_bound_efficiency_by_kind"]["glu"]["backwards"] = j["memory_bound_efficiency"];
    CHECK(error_of(j) ==
          "s.json: field 'memory_bound_efficiency_by_kind.glu.backwards': unknown key (did you "
          "mean 'backward'?)");

    j = moerun_json();
    j["memory_bound_efficiency_by_kind"]["loss_native"]["backward"] = j["memory_bound_efficiency"];
    j["memory_bound_efficiency_by_kind"]["loss_native"]["backward"]["value"] = 0;
    CHECK(error_of(j) ==
          "s.json: field 'memory_bound_efficiency_by_kind.loss_native.backward.value': expected "
          "an efficiency in (0, 1], got number 0");
  }

  TEST_CASE("the weight-gradient accumulation into the main gradient is optional and round-trips") {
    const StackProfile mc = load("megatron-core");
    CHECK(mc.wgrad_accumulation.into_main_grad.value);
    CHECK(mc.wgrad_accumulation.into_main_grad.basis == Basis::kDerived);
    // From a cuBLAS 13 sweep on one H200: derived for the stack's own builds, with the shapes' spread.
    CHECK(mc.wgrad_accumulation.epilogue_overlap.basis == Basis::kDerived);
    CHECK(mc.wgrad_accumulation.epilogue_overlap.value == 0.34);
    REQUIRE(mc.wgrad_accumulation.epilogue_overlap.range.has_value());
    CHECK(mc.wgrad_accumulation.epilogue_overlap.range->first == 0.0);
    CHECK(mc.wgrad_accumulation.epilogue_overlap.range->second == 0.7);
    CHECK(times_listed(mc, "wgrad_accumulation.epilogue_overlap") == 1);

    const StackProfile mr = load("moerun");  // not stated: each weight gradient is written once
    CHECK_FALSE(mr.wgrad_accumulation.into_main_grad.value);
    CHECK(io::stack_to_json(mr).count("wgrad_accumulation") == 0);
    StackProfile mr_copy = mr;
    for (const auto& n : mr_copy.numbers())
      CHECK(std::string(n.path) != "wgrad_accumulation.epilogue_overlap");

    io::json j = moerun_json();
    j["wgrad_accumulation"]["into_main_grad"] = {{"value", true}, {"basis", "derived"}, {"source", "s"}};
    j["wgrad_accumulation"]["epilogue_overlap"] = {{"value", 1.5}, {"basis", "derived"}, {"source", "s"}};
    CHECK(
        error_of(j) ==
        "s.json: field 'wgrad_accumulation.epilogue_overlap.value': expected a finite number in [0, 1], got "
        "number 1.5");
  }

  TEST_CASE(
      "the block-scaled FP8 GEMM rate is TE's H200 GEMM profile under the lowering's quantisation bytes") {
    // TE's GEMM profiling guide (docs/examples/gemm_profiling at 1609c890e), H200 NVL, the 12 GEMMs of one
    // layer: the per-tensor scaled kernels alone 16.785 ms; with their quantisation, delayed scaling (one
    // cast per operand) 18.978 ms, current scaling 20.285 ms, block scaling 22.882 ms. Priced at the bytes
    // per element the lowering counts for each recipe's quantisation, block scaling's GEMM kernels take what
    // is left of its 22.882 ms; the rate is the per-tensor kernels' time over theirs. The range's upper end
    // is block quantisation as costly as current scaling's.
    const double kernels = 16.785, delayed = 18.978, current = 20.285, block = 22.882;
    const double per_byte = (delayed - kernels) / fp8_cast_bytes_per_element(Fp8Recipe::kDelayed);
    const double rate = kernels / (block - per_byte * fp8_cast_bytes_per_element(Fp8Recipe::kBlockwise));
    const double upper = kernels / (block - (current - kernels));
    CHECK(rate == doctest::Approx(0.8126).epsilon(1e-3));
    for (const char* name : {"megatron-core", "megatron-core-deepep", "megatron-core-hybridep"}) {
      CAPTURE(name);
      const StackProfile s = load(name);
      CHECK(s.fp8_block_gemm_rate.value == doctest::Approx(rate).epsilon(0.005));
      CHECK(s.fp8_block_gemm_rate.basis == Basis::kDerived);
      REQUIRE(s.fp8_block_gemm_rate.range.has_value());
      CHECK(s.fp8_block_gemm_rate.range->second == doctest::Approx(upper).epsilon(0.005));
      CHECK(times_listed(s, "fp8_block_gemm_rate") == 1);
      const auto back = io::stack_from_json(io::stack_to_json(s), "back.json");
      REQUIRE(back.ok());
      CHECK(back.value().fp8_block_gemm_rate.value == s.fp8_block_gemm_rate.value);
    }
    // moerun and MegaScale-MoE run their own FP8 kernels: not stated, the per-tensor rate.
    for (const char* name : {"moerun", "megascale-moe"}) {
      CAPTURE(name);
      const StackProfile s = load(name);
      CHECK(s.fp8_block_gemm_rate.source == kNotStated);
      CHECK(s.fp8_block_gemm_rate.value == 1.0);
      CHECK(io::stack_to_json(s).count("fp8_block_gemm_rate") == 0);
    }
  }

  TEST_CASE(
      "TE's FP8 casts run at the achieved HBM rate: a fit to the quantisation in TE's H200 GEMM profile") {
    // TE's GEMM profiling guide (1609c890e, H200 NVL): each timed te.Linear forward casts its input with the
    // transposed copy (the lowering's bytes per element) and its weight without it (one FP8 byte fewer); the
    // layer's 12 GEMMs (15,872 tokens, hidden 4,096, intermediate 16,384) take 20.285 ms under current
    // scaling (3 kernels per cast) and 18.978 ms under delayed scaling (1), 16.785 ms for the kernels alone.
    // A fixed time per kernel plus bytes at a rate fits both; the rate is at least the H200 profile's
    // achieved HBM bandwidth, so the Megatron stacks state the casts at efficiency 1.
    const double m = 15872, h = 4096, f = 16384, q = 3 * h;
    const double shapes[12][3] = {{m, h, q}, {m, h, h}, {m, h, f}, {m, f, h}, {m, q, h}, {m, h, h},
                                  {m, f, h}, {m, h, f}, {h, m, q}, {h, m, h}, {h, m, f}, {f, m, h}};
    auto bytes = [&](Fp8Recipe r) {
      const double input = fp8_cast_bytes_per_element(r), weight = input - 1;
      double total = 0;
      for (const auto& s : shapes) total += s[0] * s[1] * input + s[1] * s[2] * weight;
      return total;
    };
    const double b_cur = bytes(Fp8Recipe::kTensorwise), b_del = bytes(Fp8Recipe::kDelayed);
    const double k_cur = 12 * 2 * 3, k_del = 12 * 2 * 1;
    const double t_cur = (20.285 - 16.785) * 1e-3, t_del = (18.978 - 16.785) * 1e-3;
    // b_cur / rate + k_cur c = t_cur and b_del / rate + k_del c = t_del.
    const double inv_rate = (t_cur * k_del - t_del * k_cur) / (b_cur * k_del - b_del * k_cur);
    const double fixed = (t_cur - b_cur * inv_rate) / k_cur;
    CHECK(b_cur == doctest::Approx(13.91e9).epsilon(1e-3));
    CHECK(b_del == doctest::Approx(8.94e9).epsilon(1e-3));
    CHECK(fixed > 0);
    CHECK(fixed < 4e-6);
    const HardwareProfile h200 = io::load_hardware("h200-sxm").value();
    const double share = 1.0 / inv_rate / h200.gpu.hbm_bw_achieved_bytes_per_s.value;
    CHECK(share == doctest::Approx(1.01).epsilon(0.01));
    for (const char* name : {"megatron-core", "megatron-core-deepep", "megatron-core-hybridep"}) {
      CAPTURE(name);
      const StackProfile s = load(name);
      for (Phase ph : {Phase::kForward, Phase::kBackward}) {
        const Stated<double>& e = s.memory_bound_efficiency_of(MemOp::kCast, ph);
        CHECK(e.value == std::min(1.0, share));
        CHECK(e.basis == Basis::kDerived);
      }
    }
  }

  TEST_CASE("the fused kernels' GEMM efficiency is optional, listed where stated, and round-trips") {
    const StackProfile mr = load("moerun");
    CHECK(mr.fused_gemm_efficiency.basis == Basis::kMeasured);
    CHECK(mr.fused_gemm_efficiency.value == 0.13);
    CHECK(times_listed(mr, "fused_gemm_efficiency") == 1);
    const auto back = io::stack_from_json(io::stack_to_json(mr), "back.json");
    REQUIRE(back.ok());
    CHECK(back.value().fused_gemm_efficiency.value == 0.13);
    CHECK(back.value().fused_gemm_efficiency.source == mr.fused_gemm_efficiency.source);

    const StackProfile ms = load("megascale-moe");  // not stated: the library rate, not listed, not written
    CHECK(ms.fused_gemm_efficiency.value == 1.0);
    CHECK(ms.fused_gemm_efficiency.source == kNotStated);
    CHECK(io::stack_to_json(ms).count("fused_gemm_efficiency") == 0);
    StackProfile ms_copy = ms;
    for (const auto& n : ms_copy.numbers()) CHECK(std::string(n.path) != "fused_gemm_efficiency");

    io::json j = moerun_json();
    j["fused_gemm_efficiency"]["value"] = 0;
    CHECK(error_of(j) ==
          "s.json: field 'fused_gemm_efficiency.value': expected an efficiency in (0, 1], got number 0");
  }

  TEST_CASE(
      "the dispatcher's rate beside compute is optional, listed with the dispatchers that state it, and "
      "round-trips") {
    const StackProfile dep = load("megatron-core-deepep");
    CHECK(dep.dispatcher.overlap_efficiency.basis == Basis::kDerived);
    REQUIRE(dep.dispatcher.overlap_efficiency.range.has_value());
    CHECK(dep.dispatcher.overlap_efficiency.range->first <= dep.dispatcher.overlap_efficiency.value);
    CHECK(dep.dispatcher.overlap_efficiency.value <= dep.dispatcher.overlap_efficiency.range->second);
    CHECK(load("megatron-core-hybridep").dispatcher.overlap_efficiency.basis == Basis::kAssumed);
    CHECK(times_listed(dep, "dispatcher.overlap_efficiency") == 1);
    const auto back = io::stack_from_json(io::stack_to_json(dep), "back.json");
    REQUIRE(back.ok());
    CHECK(back.value().dispatcher.overlap_efficiency.value ==
          doctest::Approx(dep.dispatcher.overlap_efficiency.value));
    CHECK(back.value().dispatcher.overlap_efficiency.source == dep.dispatcher.overlap_efficiency.source);

    const StackProfile mc = load("megatron-core");  // NCCL's all-to-all: not stated, full rate
    CHECK(mc.dispatcher.overlap_efficiency.value == 1.0);
    CHECK(io::stack_to_json(mc)["dispatcher"].count("overlap_efficiency") == 0);
    StackProfile mc_copy = mc;
    for (const auto& n : mc_copy.numbers()) CHECK(std::string(n.path) != "dispatcher.overlap_efficiency");

    io::json j = moerun_json();
    j["dispatcher"]["overlap_efficiency"] = {{"value", 0}, {"basis", "derived"}, {"source", "s"}};
    CHECK(error_of(j) ==
          "s.json: field 'dispatcher.overlap_efficiency.value': expected an efficiency in (0, 1], got number "
          "0");
  }

  TEST_CASE("an efficiency above 1 or at 0, or an SM share of 1, is rejected, naming the field") {
    io::json j = moerun_json();
    j["grouped_gemm"]["efficiency"]["value"] = 1.5;
    CHECK(error_of(j) ==
          "s.json: field 'grouped_gemm.efficiency.value': expected an efficiency in (0, 1], got number 1.5");

    j = moerun_json();
    j["memory_bound_efficiency"]["value"] = 0;
    CHECK(error_of(j) ==
          "s.json: field 'memory_bound_efficiency.value': expected an efficiency in (0, 1], got number 0");

    j = moerun_json();
    j["comm_sm_fraction"]["value"] = 1;
    CHECK(error_of(j) ==
          "s.json: field 'comm_sm_fraction.value': expected a fraction in [0, 1), got number 1");
  }

  TEST_CASE("every number needs a non-empty source and one of the four bases") {
    io::json j = moerun_json();
    j["overlaps"]["pp_comm"].erase("source");
    CHECK(error_of(j) == "s.json: field 'overlaps.pp_comm.source': required but missing");

    j = moerun_json();
    j["host"]["us_per_micro_batch"]["source"] = "  ";
    CHECK(error_of(j) ==
          "s.json: field 'host.us_per_micro_batch.source': expected a non-empty citation, got string \"  \"");

    j = moerun_json();
    j["grouped_gemm"]["efficiency"]["basis"] = "guessed";
    CHECK(error_of(j) ==
          "s.json: field 'grouped_gemm.efficiency.basis': expected one of \"measured\" \"derived\" "
          "\"assumed\" \"target\", got string \"guessed\"");

    j = moerun_json();
    j["dispatcher"]["kind"].erase("basis");
    CHECK(error_of(j) == "s.json: field 'dispatcher.kind.basis': required but missing");
  }

  TEST_CASE("capabilities and ranges are checked against the plan vocabulary") {
    io::json j = moerun_json();
    j["capabilities"]["recompute"] = {"none", "selectiv"};
    CHECK(error_of(j).find("'capabilities.recompute[1]': expected one of none, selective, full, sar") !=
          std::string::npos);

    j = moerun_json();
    j["capabilities"]["fp8_padding"] = io::json::array();
    CHECK(error_of(j) ==
          "s.json: field 'capabilities.fp8_padding': expected at least one place, the stack's own first, got "
          "array []");
    j["capabilities"]["fp8_padding"] = {"gemm"};
    CHECK(error_of(j).find(
              "'capabilities.fp8_padding[0]': expected one of experts, dispatcher, router, none") !=
          std::string::npos);

    j = moerun_json();
    j["capabilities"]["mla_down_proj"] = io::json::array();
    CHECK(error_of(j) ==
          "s.json: field 'capabilities.mla_down_proj': expected at least one layout, the "
          "stack's own first, got array []");
    j["capabilities"]["mla_down_proj"] = {"split"};
    CHECK(error_of(j).find("'capabilities.mla_down_proj[0]': expected one of duplicated, column_parallel, "
                           "gathered") != std::string::npos);

    j = moerun_json();
    j["memory"]["reserve_GiB"]["value"] = {4, 2};
    CHECK(error_of(j) ==
          "s.json: field 'memory.reserve_GiB.value': expected [low, high] with low <= high, got array [4,2]");

    j = moerun_json();
    j["grouped_gemm"]["implementation"]["value"] = "cublas";
    CHECK(error_of(j).find("'grouped_gemm.implementation.value': expected one of \"grouped_kernel\"") !=
          std::string::npos);
  }

  TEST_CASE("an unmeasured number without a range, or a range that misses its value, is rejected") {
    io::json j = moerun_json();
    j["comm_sm_fraction"].erase("range");
    CHECK(error_of(j) ==
          "s.json: field 'comm_sm_fraction.range': expected [low, high]: where this assumed number may lie, "
          "got nothing (missing)");

    j = moerun_json();
    j["host"]["us_per_micro_batch"]["range"] = {30, 40};
    CHECK(
        error_of(j) ==
        "s.json: field 'host.us_per_micro_batch.range': expected [low, high] with low <= value <= high, got "
        "array [30,40]");

    j = moerun_json();
    j["comm_sm_fraction"]["range"] = {0.1, 1.0};
    CHECK(error_of(j) ==
          "s.json: field 'comm_sm_fraction.range': expected [low, high] with each end a fraction in [0, 1), "
          "got array [0.1,1.0]");

    // A measured number may state one; a flag may not.
    j = moerun_json();
    j["grouped_gemm"]["efficiency"]["range"] = {0.9, 1.0};
    const auto ok = io::stack_from_json(j, "s.json");
    REQUIRE(ok.ok());
    CHECK(ok.value().grouped_gemm.efficiency.range == std::pair{0.9, 1.0});
    j = moerun_json();
    j["dispatcher"]["host_sync"]["range"] = {0, 1};
    CHECK(error_of(j).find("'dispatcher.host_sync.range'") != std::string::npos);
  }

  TEST_CASE("the format tag, value types and host cost ranges are checked") {
    io::json j = moerun_json();
    j["format"] = "moeplan-hwprofile-v1";
    CHECK(error_of(j) ==
          "s.json: field 'format': expected \"moeplan-stack-v2\", got string \"moeplan-hwprofile-v1\"");

    j = moerun_json();
    j["format"] = "moeplan-stack-v1";
    CHECK(error_of(j).find("field 'format': expected \"moeplan-stack-v2\" (v1 files priced grouped GEMMs") !=
          std::string::npos);

    j = moerun_json();
    j["dispatcher"]["host_sync"]["value"] = "yes";
    CHECK(error_of(j) ==
          "s.json: field 'dispatcher.host_sync.value': expected true or false, got string \"yes\"");

    j = moerun_json();
    j["host"]["launch_us_per_kernel"]["value"] = -1;
    CHECK(error_of(j).find("'host.launch_us_per_kernel.value': expected a finite number in [0, 1000]") !=
          std::string::npos);

    j = moerun_json();
    j.erase("calibrated");
    CHECK(error_of(j) == "s.json: field 'calibrated': required but missing");
  }

  TEST_CASE("a missing stack file is an error naming the path") {
    const auto s = io::load_stack("/nonexistent/stack.json");
    REQUIRE_FALSE(s.ok());
    CHECK(s.error().message.find("/nonexistent/stack.json: no such file") != std::string::npos);
  }
}
