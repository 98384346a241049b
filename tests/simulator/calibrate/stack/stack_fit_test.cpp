// The stack fit recovers known parameters from synthetic Kineto and moerun traces generated from them with
// small noise, and writes a stack file that the loader accepts, byte-identical for the same input.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "simulator/calibrate/stack/stack_fit.h"
#include "simulator/core/op_graph.h"
#include "simulator/cost/cost_model.h"
#include "simulator/io/hardware_loader.h"
#include "simulator/io/op_trace.h"
#include "simulator/io/stack_loader.h"

using namespace moeplan;
using namespace moeplan::calibrate;

namespace {

// The true stack the synthetic runs obey.
constexpr double kLaunchUs = 4.0;     // every gap between compute kernels
constexpr double kPerExpertUs = 3.0;  // extra gap before a grouped GEMM, per local expert
constexpr double kPerMicroBatchUs =
    50;                              // per micro-batch: 25 us extra at each of its 2 boundaries (fwd, bwd)
constexpr double kMemEff = 0.65;     // permute / norm bytes / time beyond the fixed part, over achieved HBM
constexpr double kFixedUs = 4.0;     // the fixed part of each such kernel: the base stack's min_kernel_us
constexpr double kOverlap = 0.7;     // share of each all-to-all that runs under a compute kernel
constexpr int64_t kCommBlocks = 24;  // grid of the all-to-all kernels
const std::vector<double> kRows = {64, 128, 256, 512, 1024, 2048, 4096};
double true_eff(double rows) {
  return 0.9 * rows / (rows + 300.0);
}  // grouped GEMM vs dense, in (0, 1)

// Deterministic noise in [-1, 1] (an LCG: the same bytes on every platform).
struct Noise {
  uint64_t x = 12345;
  double operator()() {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<double>(x >> 11) / static_cast<double>(1ULL << 53) * 2.0 - 1.0;
  }
};

const HardwareProfile& h100() {
  static const HardwareProfile hw = io::load_hardware("hwprofiles/h100-sxm.json").value();
  return hw;
}

// A stack that loses nothing, with the given grouped-GEMM implementation on one stream.
StackProfile neutral_with(GroupedGemmImpl impl) {
  StackProfile p;
  p.memory_bound_efficiency.value = 1.0;
  p.grouped_gemm.impl.value = impl;
  p.grouped_gemm.streams.value = 1;
  p.grouped_gemm.efficiency.value = 1.0;
  p.grouped_gemm.wgrad_efficiency.value = 1.0;
  return p;
}

// The cost model's grouped-kernel time at the dense rate (what the fit divides by the measured time).
double dense_seconds(const GemmShape& s) {
  static const StackProfile neutral = neutral_with(GroupedGemmImpl::kGroupedKernel);
  static const cost::CostModel model(h100(), neutral);
  return model.grouped_gemm_seconds(s, DType::kBf16, nullptr);
}

// One synthetic kernel on the timeline (µs).
struct K {
  std::string name, cpu_op;
  double start = 0, dur = 0;
  int stream = 7;
  std::vector<std::vector<int64_t>> dims;
  std::vector<std::string> types;
  // moerun view
  OpName op = OpName::kAttnNorm;
  OpKind kind = OpKind::kMemoryBound;
  int layer = -1, micro_batch = -1;
  Phase phase = Phase::kForward;
  double flops = 0, bytes = 0;
};
struct Range {
  std::string name;
  double start, end;
};

struct Timeline {
  std::vector<K> kernels;
  std::vector<Range> ranges;
};

// 4 micro-batches x (forward_step, backward_step) x 4 MoE layers. Per layer on the compute stream: norm,
// dense GEMM (the all-to-all on stream 20 starts with it and ends kOverlap of the way in... past it),
// permute, grouped fc13, act, grouped fc2, unpermute. `experts_vary`: local experts 4/8/16/32 by layer
// (Kineto), else 8.
Timeline make_timeline(bool experts_vary) {
  Noise noise;
  Timeline tl;
  const int64_t hidden = 1024, ffn = 512;
  const double hbm = h100().gpu.hbm_bw_achieved_bytes_per_s.value;
  double t = 1000;
  int layer_count = 0;
  for (int mb = 0; mb < 4; ++mb) {
    for (Phase ph : {Phase::kForward, Phase::kBackward}) {
      if (!tl.kernels.empty()) t += kPerMicroBatchUs / 2;  // the boundary's extra host time
      const double seg_start = t - 1.0;
      for (int l = 0; l < 4; ++l, ++layer_count) {
        const int64_t experts = experts_vary ? (int64_t{4} << l) : 8;
        const double rows = kRows[static_cast<size_t>(layer_count) % kRows.size()];
        const int64_t m = static_cast<int64_t>(rows) * experts, tokens = m / 2;  // top-2
        const double layer_start = t - 0.5;
        auto gap = [&](double extra) { t += kLaunchUs + 0.2 * noise() + extra; };
        auto mem = [&](const char* name, OpName op, std::vector<std::vector<int64_t>> dims,
                       std::vector<std::string> types) {
          double bytes = 0;
          for (size_t i = 0; i < dims.size(); ++i) {
            double n = 1;
            for (int64_t x : dims[i]) n *= static_cast<double>(x);
            bytes += n * (types[i] == "long int" ? 8.0 : 2.0);
          }
          bytes += static_cast<double>(dims[0][0] * dims[0][1]) * 2.0;
          const double dur = kFixedUs + bytes / (hbm * kMemEff) * 1e6 * (1 + 0.02 * noise());
          tl.kernels.push_back(
              {name, "aten::op", t, dur, 7, dims, types, op, OpKind::kMemoryBound, l, mb, ph, 0, bytes});
          t += dur;
        };
        auto grouped = [&](OpName op, int64_t n, int64_t k) {
          const GemmShape s{m, n, k, experts};
          const double dur = dense_seconds(s) / true_eff(rows) * 1e6 * (1 + 0.02 * noise());
          tl.kernels.push_back({"void cutlass::device_kernel<GemmUniversal<GroupProblemShape<int>>>",
                                "aten::_grouped_mm",
                                t,
                                dur,
                                7,
                                {{m, k}, {experts, k, n}, {experts}},
                                {"c10::BFloat16", "c10::BFloat16", "int"},
                                op,
                                OpKind::kGroupedGemm,
                                l,
                                mb,
                                ph,
                                2.0 * static_cast<double>(m * n * k),
                                0});
          t += dur;
        };
        mem("void transformer_engine::normalization::rmsnorm_fwd_tuned_kernel<T>", OpName::kFfnNorm,
            {{tokens, hidden}, {hidden}}, {"c10::BFloat16", "c10::BFloat16"});
        gap(0);
        const double gemm_dur = 80 + 5 * noise();
        tl.kernels.push_back({"nvjet_tst_128x256_64x4_1x2_h_bz_coopA_TNT",
                              "aten::mm",
                              t,
                              gemm_dur,
                              7,
                              {{tokens, hidden}, {hidden, hidden}},
                              {"c10::BFloat16", "c10::BFloat16"},
                              OpName::kOutProj,
                              OpKind::kGemm,
                              l,
                              mb,
                              ph,
                              2.0 * static_cast<double>(tokens * hidden * hidden),
                              0});
        // The all-to-all starts with the GEMM; kOverlap of it runs under the GEMM, the rest is exposed.
        const double a2a = gemm_dur / kOverlap;
        tl.kernels.push_back({"ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)",
                              "",
                              t,
                              a2a,
                              20,
                              {},
                              {},
                              OpName::kDispatchA2a,
                              OpKind::kCollective,
                              l,
                              mb,
                              ph,
                              0,
                              0});
        t += a2a;  // the compute stream waits for the all-to-all
        gap(0);
        mem("void moe_permute_kernel<__nv_bfloat16, 8>", OpName::kPermute, {{tokens, hidden}, {tokens * 2}},
            {"c10::BFloat16", "long int"});
        gap(kPerExpertUs * static_cast<double>(experts));
        grouped(OpName::kExpertFc13, 2 * ffn, hidden);
        gap(0);
        tl.kernels.push_back({"void at::native::vectorized_elementwise_kernel<4, silu>",
                              "aten::silu",
                              t,
                              10,
                              7,
                              {},
                              {},
                              OpName::kExpertAct,
                              OpKind::kMemoryBound,
                              l,
                              mb,
                              ph,
                              0,
                              1000});
        t += 10;
        gap(kPerExpertUs * static_cast<double>(experts));
        grouped(OpName::kExpertFc2, hidden, ffn);
        gap(0);
        mem("void moe_unpermute_kernel<__nv_bfloat16, float, true, 8>", OpName::kUnpermute,
            {{tokens * 2, hidden}, {tokens * 2}}, {"c10::BFloat16", "long int"});
        tl.ranges.push_back({"MoELayer", layer_start, t});
        if (l < 3) gap(0);
      }
      tl.ranges.push_back({ph == Phase::kForward ? "forward_step" : "backward_step", seg_start, t});
      t += kLaunchUs;
    }
  }
  tl.ranges.push_back({"ProfilerStep#1", 0, t + 10});
  return tl;
}

std::string kineto_text(const Timeline& tl) {
  std::string out = R"({"schemaVersion": 1, "traceEvents": [)";
  int64_t id = 0;
  auto sep = [&] { out += id++ == 0 ? "\n" : ",\n"; };
  for (const auto& r : tl.ranges) {
    sep();
    out += fmt::format(
        R"({{"ph":"X","cat":"user_annotation","name":"{}","pid":1,"tid":1,"ts":{:.3f},"dur":{:.3f}}})",
        r.name, r.start, r.end - r.start);
  }
  for (size_t i = 0; i < tl.kernels.size(); ++i) {
    const K& k = tl.kernels[i];
    const int64_t corr = 5000 + static_cast<int64_t>(i), ext = 9000 + static_cast<int64_t>(i);
    sep();
    out += fmt::format(
        R"({{"ph":"X","cat":"kernel","name":"{}","pid":0,"tid":{},"ts":{:.3f},"dur":{:.3f},"args":{{"device":0,"stream":{},"correlation":{}{}}}}})",
        k.name, k.stream, k.start, k.dur, k.stream, corr,
        k.stream == 20 ? fmt::format(R"(,"grid":[{},1,1])", kCommBlocks) : "");
    if (k.cpu_op.empty()) continue;
    sep();
    out += fmt::format(
        R"({{"ph":"X","cat":"cuda_runtime","name":"cudaLaunchKernel","pid":1,"tid":1,"ts":{:.3f},"dur":0.2,"args":{{"correlation":{},"External id":{}}}}})",
        k.start - 0.4, corr, ext);
    std::string dims, types;
    for (const auto& d : k.dims) dims += fmt::format("{}[{}]", dims.empty() ? "" : ",", fmt::join(d, ","));
    for (const auto& ty : k.types) types += fmt::format(R"({}"{}")", types.empty() ? "" : ",", ty);
    sep();
    out += fmt::format(
        R"({{"ph":"X","cat":"cpu_op","name":"{}","pid":1,"tid":1,"ts":{:.3f},"dur":0.3,"args":{{"External id":{},"Input Dims":[{}],"Input type":[{}]}}}})",
        k.cpu_op, k.start - 0.45, ext, dims, types);
  }
  return out + "\n]}\n";
}

// The moerun view of the same timeline, written by moeplan's own chrome_trace.
std::string moerun_text(const Timeline& tl) {
  OpGraph g;
  std::vector<OpTiming> timing;
  for (const K& k : tl.kernels) {
    Op op;
    op.id = static_cast<int32_t>(g.ops.size());
    op.name = static_cast<uint16_t>(k.op);
    op.kind = k.kind;
    op.phase = k.phase;
    op.stream = k.stream == 20 ? Stream::kComm : Stream::kCompute;
    op.layer = k.layer;
    op.micro_batch = k.micro_batch;
    op.flops = k.flops;
    op.hbm_bytes = k.bytes;
    if (k.kind == OpKind::kCollective) {
      op.comm.collective = Collective::kAllToAll;
      op.comm.group = CommGroup::kEp;
      op.comm.bytes = 1e6;
    }
    g.ops.push_back(op);
    timing.push_back({k.start * 1e-6, (k.start + k.dur) * 1e-6});
  }
  return chrome_trace(g, timing);
}

StackFitOptions options() {
  StackFitOptions o;
  o.name = "synthetic";
  o.base = io::load_stack("hwprofiles/stacks/megatron-core.json").value();
  o.base_label = "hwprofiles/stacks/megatron-core.json";
  o.patterns = load_kernel_patterns().value();
  return o;
}

const ParamFit& param(const StackFit& f, const std::string& key) {
  for (const auto& p : f.params) {
    if (p.key == key) return p;
  }
  FAIL("no parameter " << key);
  return f.params.front();
}

StackFit fit_of(const std::string& text, const std::string& label, const StackFitOptions& o) {
  const auto t = parse_trace(text, label);
  REQUIRE_MESSAGE(t.ok(), (t.ok() ? "" : t.error().message));
  const auto f = fit_stack({t.value()}, h100(), o);
  REQUIRE_MESSAGE(f.ok(), (f.ok() ? "" : f.error().message));
  return f.value();
}

}  // namespace

TEST_SUITE("calibrate") {
  // System: H100 SXM profile; the synthetic run above with 2 % noise on kernel times and ±0.2 µs on gaps.
  // Tolerances: host costs ±0.3 µs (per kernel), ±5 % (per expert, per micro-batch); efficiencies ±4 %;
  // overlap ±0.01; SM fraction exact (grid 24 / 132 SMs).
  TEST_CASE(
      "a synthetic Kineto trace gives back the launch gaps, efficiencies and overlap it was made from") {
    const Timeline tl = make_timeline(true);
    const StackFit f = fit_of(kineto_text(tl), "synthetic.pt.trace.json", options());
    MESSAGE(fit_report_text(f));
    CHECK(param(f, "host.launch_us_per_kernel").fitted);
    CHECK(param(f, "host.launch_us_per_kernel").value == doctest::Approx(kLaunchUs).epsilon(0.075));
    CHECK(param(f, "host.us_per_local_expert").value == doctest::Approx(kPerExpertUs).epsilon(0.05));
    CHECK(param(f, "host.us_per_micro_batch").value == doctest::Approx(kPerMicroBatchUs).epsilon(0.05));
    CHECK(param(f, "memory_bound_efficiency").value == doctest::Approx(kMemEff).epsilon(0.04));
    REQUIRE(f.curve.size() == kRows.size());
    for (size_t i = 0; i < kRows.size(); ++i) {
      CAPTURE(kRows[i]);
      CHECK(f.curve[i].rows_per_expert == kRows[i]);
      CHECK(f.curve[i].efficiency == doctest::Approx(true_eff(kRows[i])).epsilon(0.04));
    }
    // The stack's one efficiency is the median over all kernels: inside the range of the true ones.
    CHECK(param(f, "grouped_gemm.efficiency").fitted);
    CHECK(f.stack.grouped_gemm.efficiency.basis == Basis::kMeasured);
    CHECK(f.stack.grouped_gemm.efficiency.value >= true_eff(kRows.front()) * 0.96);
    CHECK(f.stack.grouped_gemm.efficiency.value <= true_eff(kRows.back()) * 1.04);
    CHECK(f.comm_overlap_fraction == doctest::Approx(kOverlap).epsilon(0.01));
    CHECK(f.stack.overlaps.inter_op.value);  // 0.7 >= kInterOpOverlapThreshold; the base says false
    CHECK(f.stack.comm_sm_fraction.value == doctest::Approx(24.0 / 132.0).epsilon(0.001));
    // Kept from the base, with the old source named.
    CHECK_FALSE(param(f, "dispatcher.nic_efficiency").fitted);
    CHECK(f.stack.dispatcher.nic_efficiency.source.find("kept from hwprofiles/stacks/megatron-core.json") ==
          0);
    CHECK(f.stack.overlaps.dp_comm.value == true);
  }

  TEST_CASE("a synthetic moerun trace written by chrome_trace gives back the same parameters") {
    const Timeline tl = make_timeline(false);
    StackFitOptions o = options();
    o.base = io::load_stack("hwprofiles/stacks/moerun.json").value();  // one grouped kernel, as generated
    o.moerun_experts = {8, 1024, 512};
    const StackFit f = fit_of(moerun_text(tl), "moerun.trace.json", o);
    MESSAGE(fit_report_text(f));
    CHECK(f.traces.front().find("(moerun, ") != std::string::npos);
    CHECK(param(f, "host.launch_us_per_kernel").value == doctest::Approx(kLaunchUs).epsilon(0.075));
    CHECK(param(f, "host.us_per_local_expert").value == doctest::Approx(kPerExpertUs).epsilon(0.05));
    CHECK(param(f, "host.us_per_micro_batch").value == doctest::Approx(kPerMicroBatchUs).epsilon(0.05));
    CHECK(param(f, "memory_bound_efficiency").value == doctest::Approx(kMemEff).epsilon(0.04));
    REQUIRE(f.curve.size() == kRows.size());
    for (size_t i = 0; i < kRows.size(); ++i) {
      CAPTURE(kRows[i]);
      CHECK(f.curve[i].efficiency == doctest::Approx(true_eff(kRows[i])).epsilon(0.04));
    }
    CHECK(f.comm_overlap_fraction_ep == doctest::Approx(kOverlap).epsilon(0.01));
    CHECK_FALSE(param(f, "comm_sm_fraction").fitted);  // moerun traces carry no grid
  }

  TEST_CASE(
      "a moerun trace of one GEMM per expert is fitted against that implementation, not a grouped kernel") {
    // The same kernels, the base stack now running one GEMM per expert on one stream (moerun's CPU replay):
    // each fitted point is the per-expert model's time over the measured time, i.e. the generating
    // efficiency times the per-expert model over the grouped-kernel model at that row count.
    const Timeline tl = make_timeline(false);
    StackFitOptions o = options();
    o.base = io::load_stack("hwprofiles/stacks/moerun.json").value();
    o.base.grouped_gemm.impl.value = GroupedGemmImpl::kPerExpertStreams;
    o.base.grouped_gemm.streams.value = 1;
    o.moerun_experts = {8, 1024, 512};
    const StackFit f = fit_of(moerun_text(tl), "moerun.trace.json", o);
    const StackProfile per_expert = neutral_with(GroupedGemmImpl::kPerExpertStreams);
    const StackProfile grouped = neutral_with(GroupedGemmImpl::kGroupedKernel);
    const cost::CostModel model(h100(), per_expert), kernel_model(h100(), grouped);
    REQUIRE(f.curve.size() == kRows.size());
    int differ = 0;
    for (size_t i = 0; i < kRows.size(); ++i) {
      CAPTURE(kRows[i]);
      // The point is a median over fc13 and fc2, forward and dgrad: it lies within their ratios' range.
      const auto m = static_cast<int64_t>(kRows[i]) * 8;
      double lo = 1e9, hi = 0;
      for (const GemmShape& shape : {GemmShape{m, 1024, 1024, 8}, GemmShape{m, 1024, 512, 8}}) {
        for (GemmPart part : {GemmPart::kNone, GemmPart::kDgrad}) {
          const double ratio = model.grouped_gemm_seconds(shape, DType::kBf16, nullptr, part) /
                               kernel_model.grouped_gemm_seconds(shape, DType::kBf16, nullptr, part);
          lo = std::min(lo, ratio);
          hi = std::max(hi, ratio);
        }
      }
      const double e = f.curve[i].efficiency, t = true_eff(kRows[i]);
      CHECK(e >= std::min(1.0, t * lo) * 0.96);
      CHECK(e <= std::min(1.0, t * hi) * 1.04);
      differ += std::abs(e - t) > 0.1 * t;
    }
    CHECK(differ > 0);  // the two implementations price some of these row counts differently
    CHECK(param(f, "grouped_gemm.efficiency").how.find("one GEMM per expert") != std::string::npos);
  }

  TEST_CASE("without the expert shape a moerun trace keeps the base grouped-GEMM efficiency and says so") {
    const StackFit f = fit_of(moerun_text(make_timeline(false)), "moerun.trace.json", options());
    CHECK_FALSE(param(f, "grouped_gemm.efficiency").fitted);
    CHECK_FALSE(param(f, "host.us_per_local_expert").fitted);
    CHECK(f.stack.grouped_gemm.efficiency.value == options().base.grouped_gemm.efficiency.value);
    CHECK(f.stack.grouped_gemm.efficiency.source.find("kept from") == 0);
  }

  TEST_CASE("the written stack loads with the stack loader and is byte-identical for the same input") {
    const std::string text = kineto_text(make_timeline(true));
    const StackFit a = fit_of(text, "synthetic.pt.trace.json", options());
    const StackFit b = fit_of(text, "synthetic.pt.trace.json", options());
    const std::string ja = stack_json(a);
    CHECK(ja == stack_json(b));
    const std::string path = "/tmp/moeplan_stack_fit_test_synthetic.json";
    {
      FILE* fp = std::fopen(path.c_str(), "wb");
      REQUIRE(fp);
      std::fwrite(ja.data(), 1, ja.size(), fp);
      std::fclose(fp);
    }
    const auto s = io::load_stack(path);
    std::remove(path.c_str());
    REQUIRE_MESSAGE(s.ok(), (s.ok() ? "" : s.error().message));
    CHECK(s.value().calibrated);
    CHECK(s.value().name == "synthetic");
    CHECK(s.value().launch_s_per_kernel.value == doctest::Approx(a.stack.launch_s_per_kernel.value));
    CHECK(s.value().grouped_gemm.efficiency.value == doctest::Approx(a.stack.grouped_gemm.efficiency.value));
    CHECK(s.value().grouped_gemm.efficiency.basis == Basis::kMeasured);
    CHECK(s.value().sources.count("TRACES") == 1);
    CHECK(s.value().sources.count("MLM") == 1);  // kept sources cite the Megatron-LM source
  }

  TEST_CASE("a trace without communication keeps the base overlaps and SM fraction") {
    const auto t = parse_trace(
        R"({"traceEvents":[{"ph":"X","cat":"kernel","name":"nvjet_tst_a","pid":0,"tid":7,"ts":10,"dur":5,"args":{"stream":7}},
                          {"ph":"X","cat":"kernel","name":"nvjet_tst_b","pid":0,"tid":7,"ts":18,"dur":5,"args":{"stream":7}}]})",
        "n.json");
    REQUIRE(t.ok());
    const auto f = fit_stack({t.value()}, h100(), options());
    REQUIRE(f.ok());
    CHECK_FALSE(param(f.value(), "overlaps.inter_op").fitted);
    CHECK(param(f.value(), "host.launch_us_per_kernel").value == doctest::Approx(3.0));  // the one 3 µs gap
    CHECK_FALSE(param(f.value(), "host.us_per_micro_batch").fitted);
    CHECK(f.value().stack.overlaps.inter_op.value == false);
  }
}
