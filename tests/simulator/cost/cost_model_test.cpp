// The cost model's fused GEMM + collective ops (simulator/cost/cost_model.cpp) in closed form: with a
// negligible collective, a fused op costs its GEMM computed on the SMs its kernel leaves to tiles (the SM
// count less the kernel's communication SMs and kFusedSmsLeftForCollectives), and the kernel is the one
// moerun runs for the op (simulator/core/fused_ops.h): the output projection gathers forward and scatters in
// dgrad. Expert GEMMs by the stack's implementation (one grouped kernel, or per-expert launches on streams)
// on a hand-built GPU whose dense GEMM model is known exactly; DeepEP / HybridEP exchanges against their
// legs and DeepEP's measured times; the stack's attention kernel; the kernel floor.
#include <doctest/doctest.h>

#include <cmath>

#include "simulator/core/fused_kernels.h"
#include "simulator/core/fused_ops.h"
#include "simulator/cost/cost_cache.h"
#include "simulator/cost/cost_model.h"
#include "simulator/io/hardware_loader.h"
#include "simulator/io/stack_loader.h"
#include "tests/simulator/cost/test_ops.h"

using namespace moeplan;

namespace {

using test::gemm_op;

// The same GEMM fused with a 1 KiB all-to-all over 8 ranks (microseconds beside a ~1 ms GEMM).
Op fused_op(OpName name, GemmPart part) {
  Op op = gemm_op();
  op.kind = OpKind::kFusedGemmComm;
  op.name = static_cast<uint16_t>(name);
  op.part = part;
  op.comm.collective = Collective::kAllToAll;
  op.comm.group = CommGroup::kSp;
  op.comm.group_size = 8;
  op.comm.stride = 1;
  op.comm.bytes = 1024;
  return op;
}

// doctest::Approx compares relatively only with scale 0 (its default scale 1 makes the tolerance absolute for
// values far below 1, such as seconds of one kernel).
doctest::Approx rel(double value) {
  return doctest::Approx(value).scale(0);
}

// A GPU of 8 SMs at 1 PFLOP/s BF16 whose dense GEMMs run at t = 2 m n k / (peak x 0.5 x wave x K / (K +
// 256)): three exact measurements at full waves (1024 x 256 outputs = 8 tiles of 128 x 256) from which the
// fit recovers efficiency 0.5 and k0 = 256. HBM never binds.
constexpr double kToyPeak = 1e15, kToyEfficiency = 0.5, kToyK0 = 256;
HardwareProfile toy_gpu() {
  HardwareProfile hw;
  hw.name = "toy";
  hw.gpu.sm_count.value = 8;
  hw.gpu.peak_flops_per_s["bf16"].value = kToyPeak;
  hw.gpu.hbm_bw_achieved_bytes_per_s.value = 1e30;
  hw.node.gpus_per_node.value = 8;
  GemmTable t;
  t.dtype = "bf16";
  for (int64_t k : {256, 1024, 4096}) {
    const double kd = static_cast<double>(k);
    t.points.push_back({1024, 256, k, kToyPeak * kToyEfficiency * kd / (kd + kToyK0)});
  }
  hw.calibration.gemm.push_back(t);
  return hw;
}
double depth(double k) {
  return k / (k + kToyK0);
}
// The toy GPU's dense rate at a wave efficiency and reduction depth.
double toy_rate(double wave, double k) {
  return kToyPeak * kToyEfficiency * wave * depth(k);
}
// A measured grid of the toy GPU at `speed` x its fitted full-wave rate: m {128, 512} x n {256, 1024} x
// k {1024, 4096}.
GemmTable toy_grid(double speed) {
  GemmTable t;
  t.dtype = "bf16";
  for (int64_t m : {128, 512}) {
    for (int64_t n : {256, 1024}) {
      for (int64_t k : {1024, 4096})
        t.points.push_back({m, n, k, speed * toy_rate(1.0, static_cast<double>(k))});
    }
  }
  return t;
}

// A stack running each grouped GEMM as one grouped kernel at the given efficiencies.
StackProfile grouped_kernel_stack(double efficiency, double wgrad_efficiency) {
  StackProfile s;
  s.grouped_gemm.impl.value = GroupedGemmImpl::kGroupedKernel;
  s.grouped_gemm.efficiency.value = efficiency;
  s.grouped_gemm.wgrad_efficiency.value = wgrad_efficiency;
  return s;
}

}  // namespace

TEST_SUITE("cost") {
  TEST_CASE(
      "a weight gradient accumulated into the main gradient reads and writes the buffer in its epilogue") {
    // On the toy GPU with 10 TB/s of HBM (its GEMM fit still compute-bound): a wgrad over 128 rows into a
    // 4096 x 1024 weight. The measured-style GEMM writes 2 B per output element; accumulating into an fp32
    // buffer reads and writes 4 B each, 6 B more. Hidden share h of those: max(t + (1 - h) x extra / HBM,
    // (inputs + buffer) / HBM).
    HardwareProfile hw = toy_gpu();
    const double hbm = 1e13;
    hw.gpu.hbm_bw_achieved_bytes_per_s.value = hbm;
    StackProfile stack = grouped_kernel_stack(1.0, 1.0);
    Op op = gemm_op();
    op.gemm = {128, 1024, 4096, 1};
    op.part = GemmPart::kWgrad;
    const double out = 4096.0 * 1024.0, inputs = (128.0 * 4096.0 + 128.0 * 1024.0) * 2.0;
    for (double h : {0.0, 0.5, 1.0}) {
      CAPTURE(h);
      stack.wgrad_accumulation.epilogue_overlap.value = h;
      const cost::CostModel cm(hw, stack);
      const double t = cm.gemm_seconds(op.gemm, op.dtype, nullptr, GemmPart::kWgrad);
      op.accum_bytes = 0;
      CHECK(cm.cost(op).seconds == rel(t));
      op.accum_bytes = 4;
      CHECK(cm.cost(op).seconds == rel(std::max(t + (1 - h) * 6.0 * out / hbm, (inputs + 8.0 * out) / hbm)));
      op.accum_bytes = 2;  // a BF16 buffer: read and write 2 B each, 2 B more than the plain GEMM
      CHECK(cm.cost(op).seconds == rel(std::max(t + (1 - h) * 2.0 * out / hbm, (inputs + 4.0 * out) / hbm)));
      // A grouped GEMM's buffer is every local expert's weight.
      Op g = op;
      g.kind = OpKind::kGroupedGemm;
      g.gemm = {4 * 128, 1024, 4096, 4};
      g.accum_bytes = 0;
      const double tg = cm.cost(g).seconds;
      g.accum_bytes = 4;
      CHECK(cm.cost(g).seconds ==
            rel(std::max(tg + (1 - h) * 4 * 6.0 * out / hbm, (4 * inputs + 4 * 8.0 * out) / hbm)));
    }
    // The forward and dgrad write activations, not the buffer: unchanged whatever accum_bytes says.
    const cost::CostModel cm(hw, stack);
    op.part = GemmPart::kDgrad;
    op.accum_bytes = 0;
    const double dgrad = cm.cost(op).seconds;
    op.accum_bytes = 4;
    CHECK(cm.cost(op).seconds == rel(dgrad));
  }

  TEST_CASE("a fused op's GEMM runs on the SMs its kernel leaves to tiles, at the stack's fused efficiency") {
    const HardwareProfile hw = io::load_hardware("h200-sxm").value();
    const StackProfile stack = io::load_stack("moerun").value();
    const double efficiency = stack.fused_gemm_efficiency.value;  // measured: moerun's kernels are slow
    CHECK(stack.fused_gemm_efficiency.basis == Basis::kMeasured);
    CHECK(efficiency < 0.5);
    const cost::CostModel cm(hw, stack);
    const double launch = stack.launch_s_per_kernel.value, sms = static_cast<double>(hw.gpu.sm_count.value);
    const double gemm = cm.cost(gemm_op()).seconds - launch;
    REQUIRE(gemm > 1e-4);
    struct Case {
      OpName name;
      GemmPart part;
      int64_t comm_sms;
    };
    const Case cases[] = {
        {OpName::kQkvProjA2a, GemmPart::kNone, kGemmAllToAll.comm_sms},   // GEMM + all-to-all
        {OpName::kQkvProjA2a, GemmPart::kDgrad, kAllToAllGemm.comm_sms},  // its transpose
        {OpName::kA2aOutProj, GemmPart::kNone, kAllToAllGemm.comm_sms},   // all-to-all + GEMM
        {OpName::kA2aOutProj, GemmPart::kDgrad, kGemmAllToAll.comm_sms},  // its transpose
    };
    for (const Case& c : cases) {
      INFO(kOpNames[static_cast<size_t>(c.name)] << (c.part == GemmPart::kDgrad ? " dgrad" : ""));
      const double left = sms - static_cast<double>(c.comm_sms + kFusedSmsLeftForCollectives);
      const Op op = fused_op(c.name, c.part);
      CHECK(cm.cost(op).seconds - launch == rel(gemm * sms / left / efficiency).epsilon(1e-3));
      CHECK(cm.cost(op).basis == Basis::kTarget);  // the overlap itself has not run across GPUs
    }
    // A stack that does not state it runs fused tiles at the library rate.
    StackProfile library = stack;
    library.fused_gemm_efficiency = Stated<double>{1.0, kNotStated};
    const cost::CostModel at_library(hw, library);
    const double left = sms - static_cast<double>(kAllToAllGemm.comm_sms + kFusedSmsLeftForCollectives);
    CHECK(at_library.cost(fused_op(OpName::kA2aOutProj, GemmPart::kNone)).seconds - launch ==
          rel(gemm * sms / left).epsilon(1e-3));
    CHECK(kGemmAllToAll.comm_sms !=
          kAllToAllGemm.comm_sms);  // else the cases above could not tell them apart
  }

  // ---- expert GEMMs by shape ----

  TEST_CASE("TE's userbuffers: a ring exchange under the GEMM's row chunks, a reduce-scatter after each") {
    // H100, Megatron-Core: an 8192-row GEMM whose input is all-gathered over tp 4 runs tp chunks of 2048
    // rows, each beside the copy-engine transfer of the next rank's chunk: T = 3 max(g, p) + g. Its
    // reduce-scatter counterpart runs 4 row chunks on the SMs less TE's 16 communication SMs, at the stack's
    // overlap efficiency, each chunk's reduce-scatter after it: T = g + 3 max(g, r) + r. At the tables' rate
    // (no sustained rate), so that each op's basis is the stack's.
    HardwareProfile hw = io::load_hardware("h100-sxm").value();
    const HardwareProfile sustained = hw;
    hw.gpu.sustained_rate.clear();
    const StackProfile stack = io::load_stack("megatron-core").value();
    REQUIRE(stack.overlaps.tp_comm.value);
    const cost::CostModel cm(hw, stack);
    const double launch = stack.launch_s_per_kernel.value, sms = static_cast<double>(hw.gpu.sm_count.value);
    auto ub_op = [](int64_t k, Collective c) {
      Op op = gemm_op();
      op.gemm.k = k;
      op.kind = OpKind::kFusedGemmComm;
      op.comm.collective = c;
      op.comm.group = CommGroup::kTp;
      op.comm.group_size = 4;
      op.comm.stride = 1;
      op.comm.bytes = 8192.0 * 8192.0 * 2.0;  // the gathered [8192, 8192] bf16 input (or the output)
      op.comm.userbuffers = true;
      return op;
    };
    CommSpec step;
    step.collective = Collective::kSendRecv;
    step.stride = 1;
    step.bytes = 8192.0 * 8192.0 * 2.0 / 4.0;
    double err = 0;
    const double p = cm.collective_seconds(step, &err, nullptr);
    for (int64_t k : {8192, 512}) {  // compute-bound, then exchange-bound
      CAPTURE(k);
      const Op ag = ub_op(k, Collective::kAllGather);
      const double g = cm.gemm_seconds({2048, 8192, k, 1}, DType::kBf16, &err);
      const double t = cm.cost(ag).seconds - launch;
      CHECK(t == rel(3.0 * std::max(g, p) + g));
      // Never slower than the unfused gather, then the GEMM; never faster than either alone.
      Op whole = ag;
      whole.kind = OpKind::kGemm;
      Op gather;
      gather.kind = OpKind::kCollective;
      gather.comm = ag.comm;
      gather.comm.userbuffers = false;
      const double gemm = cm.cost(whole).seconds - launch, exchange = cm.cost(gather).seconds - launch;
      CHECK(t < gemm + exchange);
      CHECK(t >= std::max(4.0 * g, 3.0 * p));
      if (k == 8192) CHECK(p < g);  // the exchange hides: four chunk GEMMs
      if (k == 512) CHECK(p > g);   // the GEMM hides: three transfers and the last chunk's GEMM

      const Op rs = ub_op(k, Collective::kReduceScatter);
      const double g4 = cm.gemm_seconds({2048, 8192, k, 1}, DType::kBf16, &err) * sms / (sms - 16.0) /
                        stack.overlap_compute_efficiency.value;
      CommSpec chunk = rs.comm;
      chunk.userbuffers = false;
      chunk.bytes = rs.comm.bytes / 4.0;
      const double r = cm.collective_seconds(chunk, &err, nullptr);
      CHECK(cm.cost(rs).seconds - launch == rel(g4 + 3.0 * std::max(g4, r) + r));
      // TE's method is read from source; its reduce-scatter kernel's speed is assumed.
      CHECK(cm.cost(ag).basis == Basis::kDerived);
      CHECK(cm.cost(rs).basis == Basis::kAssumed);
      // The H100's sustained rate is assumed (carried from an H200): a GEMM under it rests on it.
      const cost::CostModel hot(sustained, stack);
      CHECK(hot.cost(ag).basis == Basis::kAssumed);
      // At twice NCCL's speed, each chunk's reduce-scatter takes half the time.
      StackProfile fast = stack;
      fast.userbuffers_rs_speed.value = 2.0;
      const cost::CostModel quick(hw, fast);
      CHECK(quick.cost(rs).seconds - launch == rel(g4 + 3.0 * std::max(g4, r / 2.0) + r / 2.0));
      CHECK(quick.cost(ag).seconds == cm.cost(ag).seconds);
    }
    // Beside a GEMM, a userbuffers collective (the backward's bulk overlaps) holds TE's 16 SMs, an NCCL one
    // the stack's share.
    Op bulk;
    bulk.kind = OpKind::kCollective;
    bulk.comm = ub_op(8192, Collective::kAllGather).comm;
    CHECK(cm.cost(bulk).sm_fraction == rel(16.0 / sms));
    bulk.comm.userbuffers = false;
    CHECK(cm.cost(bulk).sm_fraction == rel(stack.comm_sm_fraction.value));
  }

  TEST_CASE("a grouped kernel of G experts costs one launch of G x tiles with rows padded to 128") {
    // G = 4 experts of 100 rows, [100 x 1024] x [1024 x 256] each, grouped-kernel efficiency 0.8. Rows pad to
    // one 128-row tile, so the launch is 4 tiles on 8 SMs (wave 0.5):
    //   t = 2 x 4 x 128 x 256 x 1024 / (peak x 0.5 x 0.8 x 0.5 x 1024 / 1280),
    // the dense model's time for [512 x 1024] x [1024 x 256] over 0.8. With G = 6 the 6 tiles share one wave
    // (0.75), where per-expert waves would each be 1/8 full.
    const HardwareProfile hw = toy_gpu();
    const StackProfile stack = grouped_kernel_stack(0.8, 0.8);
    const cost::CostModel cm(hw, stack);
    const double t4 = cm.grouped_gemm_seconds({400, 256, 1024, 4}, DType::kBf16, nullptr);
    CHECK(t4 == rel(2.0 * 4 * 128 * 256 * 1024 / (toy_rate(0.5, 1024) * 0.8)));
    CHECK(t4 == rel(cm.gemm_seconds({512, 256, 1024, 1}, DType::kBf16, nullptr) / 0.8));
    const double t6 = cm.grouped_gemm_seconds({600, 256, 1024, 6}, DType::kBf16, nullptr);
    CHECK(t6 == rel(2.0 * 6 * 128 * 256 * 1024 / (toy_rate(0.75, 1024) * 0.8)));
  }

  TEST_CASE("a grouped kernel's dgrad and wgrad run the transposed shapes, wgrad reducing over the rows") {
    // The same 4 experts of [100 x 1024] x [1024 x 256]. dgrad: [100 x 256] x [256 x 1024] per expert, rows
    // padded to 128, 4 x 4 = 16 tiles (2 full waves), depth 256:
    //   t = 2 x 4 x 128 x 1024 x 256 / (peak x 0.5 x 0.8 x 1 x 256/512);
    // wgrad: [1024 x 100] x [100 x 256] per expert, 8 row tiles each (32 tiles, 4 full waves), depth the 100
    // rows, at the wgrad efficiency 0.6:
    //   t = 2 x 4 x 1024 x 256 x 100 / (peak x 0.5 x 0.6 x 1 x 100/356).
    const HardwareProfile hw = toy_gpu();
    const StackProfile stack = grouped_kernel_stack(0.8, 0.6);
    const cost::CostModel cm(hw, stack);
    const GemmShape s{400, 256, 1024, 4};
    CHECK(cm.grouped_gemm_seconds(s, DType::kBf16, nullptr, GemmPart::kDgrad) ==
          rel(2.0 * 4 * 128 * 1024 * 256 / (toy_rate(1.0, 256) * 0.8)));
    CHECK(cm.grouped_gemm_seconds(s, DType::kBf16, nullptr, GemmPart::kWgrad) ==
          rel(2.0 * 4 * 1024 * 256 * 100 / (toy_rate(1.0, 100) * 0.6)));
  }

  TEST_CASE("without padding or partial waves each part of a grouped GEMM runs its FLOPs at the dense rate") {
    // 8 experts of 128 rows, n = 1024, k = 512: forward 8 x 4 tiles, dgrad 8 x 2, wgrad 8 x 4 x 4: all full
    // waves, no padding; each part's time x rate at its depth (k, n, rows) gives back 2 x 1024 x 1024 x 512.
    const HardwareProfile hw = toy_gpu();
    const StackProfile stack = grouped_kernel_stack(1.0, 1.0);
    const cost::CostModel cm(hw, stack);
    const GemmShape s{1024, 1024, 512, 8};
    const double flops = 2.0 * 1024 * 1024 * 512;
    CHECK(cm.grouped_gemm_seconds(s, DType::kBf16, nullptr) * toy_rate(1, 512) == rel(flops));
    CHECK(cm.grouped_gemm_seconds(s, DType::kBf16, nullptr, GemmPart::kDgrad) * toy_rate(1, 1024) ==
          rel(flops));
    CHECK(cm.grouped_gemm_seconds(s, DType::kBf16, nullptr, GemmPart::kWgrad) * toy_rate(1, 128) ==
          rel(flops));
  }

  TEST_CASE("per-expert launches on S streams take ceil(G / conc) expert times, conc = min(S, SMs / tiles)") {
    // TE GroupedLinear on Hopper: one dense GEMM per expert, round-robin over 4 streams; efficiency 0.8 over
    // the dense model. Whether an expert leaves SMs for the next is counted in cuBLAS's narrowest tiles,
    // 64 x 128, and the launch gap (1 us) shows once: the next expert's GEMM is queued on its own stream.
    //   100 x 256 per expert: 2 x 2 = 4 narrow tiles, conc = min(4, 8 / 4) = 2; 6 experts take 3 rounds of
    //     t1 = 2 x 100 x 256 x 1024 / (peak x 0.5 x 1/8 x 1024/1280) / 0.8;
    //   300 x 512 per expert: 5 x 4 = 20 narrow tiles, conc = 1; 6 experts take 6 rounds of
    //     t1 = 2 x 300 x 512 x 1024 / (peak x 0.5 x 6/8 x 1024/1280) / 0.8.
    // On one stream every expert waits for the gap after the one before.
    const HardwareProfile hw = toy_gpu();
    StackProfile stack;
    stack.grouped_gemm.impl.value = GroupedGemmImpl::kPerExpertStreams;
    stack.grouped_gemm.streams.value = 4;
    stack.grouped_gemm.efficiency.value = 0.8;
    stack.launch_s_per_kernel.value = 1e-6;
    const cost::CostModel cm(hw, stack);
    const double one_small = 2.0 * 100 * 256 * 1024 / (toy_rate(1.0 / 8, 1024) * 0.8);
    CHECK(cm.grouped_gemm_seconds({600, 256, 1024, 6}, DType::kBf16, nullptr) == rel(3 * one_small + 1e-6));
    const double one_large = 2.0 * 300 * 512 * 1024 / (toy_rate(6.0 / 8, 1024) * 0.8);
    CHECK(cm.grouped_gemm_seconds({1800, 512, 1024, 6}, DType::kBf16, nullptr) == rel(6 * one_large + 1e-6));
    StackProfile one_stream = stack;
    one_stream.grouped_gemm.streams.value = 1;
    const cost::CostModel loop(hw, one_stream);
    CHECK(loop.grouped_gemm_seconds({600, 256, 1024, 6}, DType::kBf16, nullptr) ==
          rel(6 * (one_small + 1e-6)));
    // A per-expert kernel never takes less than the stack's shortest kernel.
    stack.min_kernel_s.value = 1e-3;
    const cost::CostModel floored(hw, stack);
    CHECK(floored.grouped_gemm_seconds({600, 256, 1024, 6}, DType::kBf16, nullptr) == rel(3 * 1e-3 + 1e-6));
  }

  // ---- measured GEMM grids ----

  TEST_CASE(
      "a shape inside a measured grid is priced by the grid, any other by the model fitted without it") {
    // A grid that measured the toy GPU at twice its fitted rate: m {128, 512} x n {256, 1024} x k {1024,
    // 4096}.
    HardwareProfile hw = toy_gpu();
    hw.calibration.gemm.push_back(toy_grid(2.0));
    const cost::CostModel with_grid(hw, StackProfile{});
    const HardwareProfile plain = toy_gpu();
    const cost::CostModel without(plain, StackProfile{});
    CHECK(with_grid.gemm_seconds({512, 1024, 1024, 1}, DType::kBf16, nullptr) ==
          rel(2.0 * 512 * 1024 * 1024 / (2.0 * toy_rate(1.0, 1024))));
    // Outside the grid (m = 2048) the fitted model prices it, unchanged by the grid's points.
    CHECK(with_grid.gemm_seconds({2048, 1024, 1024, 1}, DType::kBf16, nullptr) ==
          rel(without.gemm_seconds({2048, 1024, 1024, 1}, DType::kBf16, nullptr)));
    // The wgrad of a forward [512 x 1024] x [1024 x 256] runs [1024 x 512] x [512 x 256]: outside (k = 512).
    CHECK(with_grid.gemm_seconds({512, 256, 1024, 1}, DType::kBf16, nullptr, GemmPart::kWgrad) ==
          rel(without.gemm_seconds({512, 256, 1024, 1}, DType::kBf16, nullptr, GemmPart::kWgrad)));
  }

  TEST_CASE(
      "two grids of a dtype price a shape at their geometric mean, and their disagreement is its error") {
    HardwareProfile hw = toy_gpu();
    hw.calibration.gemm.push_back(toy_grid(1.0));
    hw.calibration.gemm.push_back(toy_grid(1.21));
    const cost::CostModel cm(hw, StackProfile{});
    double err = 0;
    const double t = cm.gemm_seconds({128, 256, 4096, 1}, DType::kBf16, &err);
    CHECK(t == rel(2.0 * 128 * 256 * 4096 / (1.1 * toy_rate(1.0, 4096))));
    CHECK(err == rel(1.21 - 1.0));
  }

  TEST_CASE("experts side by side on streams run no faster than one GEMM that fills the GPU") {
    // The grid measured one 128 x 256 x 1024 expert at the full rate (the library's small tiles fill the
    // GPU), while the tile model gives it 1 of 8 SMs, so 4 streams would run 4 at once. Eight experts take
    // 8 expert times, not 2 rounds.
    HardwareProfile hw = toy_gpu();
    hw.calibration.gemm.push_back(toy_grid(1.0));
    StackProfile stack;
    stack.grouped_gemm.impl.value = GroupedGemmImpl::kPerExpertStreams;
    stack.grouped_gemm.streams.value = 4;
    stack.grouped_gemm.efficiency.value = 1.0;
    const cost::CostModel cm(hw, stack);
    const double one = 2.0 * 128 * 256 * 1024 / toy_rate(1.0, 1024);
    CHECK(cm.gemm_seconds({128, 256, 1024, 1}, DType::kBf16, nullptr) == rel(one));
    CHECK(cm.grouped_gemm_seconds({1024, 256, 1024, 8}, DType::kBf16, nullptr) == rel(8 * one));
  }

  // ---- DeepEP / HybridEP ----

  TEST_CASE("a node-deduplicated exchange takes the longer of its RDMA and NVLink legs") {
    // H800 nodes (8 GPUs, 8 x 50 GB/s NICs, 160 GB/s achieved NVLink), DeepEP (NIC 0.88, NVLink 0.85), EP64
    // on 8 nodes, B received bytes, s of them leaving the node over RDMA:
    //   t = nvlink latency + net latency + max(B s / (0.88 x 50 GB/s), B (7/8) / (0.85 x 160 GB/s)).
    const HardwareProfile hw = io::load_hardware("h800-sxm").value();
    const StackProfile stack = io::load_stack("megatron-core-deepep").value();
    const cost::CostModel cm(hw, stack);
    const double lat = hw.node.nvlink_latency_s.value + hw.scale_out.net_latency_s.value;
    CommSpec c;
    c.collective = Collective::kAllToAll;
    c.group = CommGroup::kEp;
    c.node_dedup = true;
    c.group_size = 64;
    c.bytes = 1e9;
    for (double s : {0.05, 0.5}) {
      CAPTURE(s);
      c.nic_bytes_scale = s;
      cost::Resource r{};
      const double t = cm.node_dedup_seconds(c, &r);
      CHECK(t == rel(lat + std::max(1e9 * s / (0.88 * 50e9), 1e9 * 7 / 8 / (0.85 * 160e9))));
      CHECK(r == cost::Resource::kNic);
    }
    // Inside one node only the NVLink leg remains.
    c.group_size = 8;
    cost::Resource r{};
    CHECK(cm.node_dedup_seconds(c, &r) == rel(hw.node.nvlink_latency_s.value + 1e9 * 7 / 8 / (0.85 * 160e9)));
    CHECK(r == cost::Resource::kNvlink);
  }

  TEST_CASE("DeepEP's internode exchange matches DeepEP's measured times on H800 within 10%") {
    // DeepEP README (V1 normal kernels, H800 with one CX7 400G per GPU, T = 4096, H = 7168, k = 8, E = 256)
    // as kernel_facts.md §1.8 converts it: FP8 dispatch EP16 / EP32 / EP64 = 1403 / 1887 / 2154 us, BF16
    // combine EP32 / EP64 = 3723 / 4262 us. Volumes per token from §1.7: D_rank rows received, D_node - P_own
    // rows leaving the node (bytes H (1 + 4/128) for FP8, 2H for BF16).
    const HardwareProfile hw = io::load_hardware("h800-sxm").value();
    const StackProfile stack = io::load_stack("megatron-core-deepep").value();
    const cost::CostModel cm(hw, stack);
    struct Case {
      int32_t ranks;
      double d_node, p_own, d_rank, row_bytes, measured_s;
    };
    const double h = 7168, fp8 = h * (1 + 4.0 / 128), bf16 = 2 * h;
    const Case cases[] = {
        {16, 1.993, 0.997, 6.523, fp8, 1403e-6},  {32, 3.614, 0.904, 7.267, fp8, 1887e-6},
        {64, 3.629, 0.454, 7.359, fp8, 2154e-6},  {32, 3.614, 0.904, 7.267, bf16, 3723e-6},
        {64, 3.629, 0.454, 7.359, bf16, 4262e-6},
    };
    for (const Case& k : cases) {
      CAPTURE(k.ranks);
      CAPTURE(k.row_bytes);
      CommSpec c;
      c.collective = Collective::kAllToAll;
      c.group = CommGroup::kEp;
      c.node_dedup = true;
      c.group_size = k.ranks;
      c.bytes = 4096 * k.d_rank * k.row_bytes;
      c.nic_bytes_scale = (k.d_node - k.p_own) / k.d_rank;
      CHECK(cm.node_dedup_seconds(c, nullptr) == rel(k.measured_s).epsilon(0.10));
    }
  }

  TEST_CASE(
      "a node-deduplicated exchange holds the dispatcher's SMs and runs at its rate beside compute, and NCCL "
      "collectives hold the stack's share at full rate") {
    // DeepEP runs on 20 of the H800's 132 SMs; HybridEP on 32; the engine takes them from concurrent compute.
    // Beside compute their kernels run at the dispatcher's overlap efficiency (below 1 in both profiles);
    // NCCL's at full rate.
    const HardwareProfile hw = io::load_hardware("h800-sxm").value();
    Op op = test::ep_all_to_all_op(16, 1e8);
    op.comm.nic_bytes_scale = 0.2;
    for (auto [name, sms] :
         {std::pair{"megatron-core-deepep", 20}, std::pair{"megatron-core-hybridep", 32}}) {
      CAPTURE(name);
      const StackProfile stack = io::load_stack(name).value();
      const cost::CostModel cm(hw, stack);
      op.comm.node_dedup = true;
      CHECK(cm.cost(op).sm_fraction == rel(sms / 132.0));
      CHECK(stack.dispatcher.overlap_efficiency.value < 1.0);
      CHECK(cm.cost(op).rate_beside_compute == stack.dispatcher.overlap_efficiency.value);
      op.comm.node_dedup = false;
      CHECK(cm.cost(op).sm_fraction == rel(stack.comm_sm_fraction.value));
      CHECK(cm.cost(op).rate_beside_compute == 1.0);
    }
  }

  // ---- attention kernel, kernel floor ----

  TEST_CASE("a causal backward derived from the cuDNN tables is within 5 % of cuDNN 9.19's measured one") {
    // Where a kernel has no causal backward table, the cost model derives it as the non-causal backward x the
    // forward's causal / non-causal ratio. cudnn-frontend's H200 run of cuDNN 9.19.1 (results/
    // h200_919_only_cudnn/llama3.1_20260227_034703.csv, the source of the head-dim-128 cuDNN tables) timed
    // the causal backward too (the profile's table): 370, 474, 541, 579 and 581 TFLOP/s at 2048-32768 keys.
    // Without that table, the derivation from the run's other three tables gives 385, 493, 554, 587 and 568.
    HardwareProfile hw = io::load_hardware("h100-sxm").value();
    const size_t tables = hw.calibration.attention.size();
    std::erase_if(hw.calibration.attention, [](const AttentionTable& t) {
      return t.impl == "cudnn" && t.direction == "bwd" && t.causal && t.head_dim == 128;
    });
    REQUIRE(hw.calibration.attention.size() == tables - 1);
    const double sustained = hw.gpu.sustained_rate.at("bf16").value;
    const cost::CostModel cm(hw, io::load_stack("megatron-core").value());
    const std::pair<int32_t, double> measured[] = {
        {2048, 370}, {4096, 474}, {8192, 541}, {16384, 579}, {32768, 581}};
    for (const auto& [keys, tflops] : measured) {
      CAPTURE(keys);
      Op op;
      op.kind = OpKind::kAttention;
      op.phase = Phase::kBackward;
      op.attn = {1, keys, keys, 64, 128, 128, 0, true};
      op.flops = 1e12;
      const double derived = 1e12 / (cm.attention_seconds(op, nullptr) * sustained) / 1e12;
      CHECK(std::abs(derived / tflops - 1.0) < 0.05);
    }
  }

  TEST_CASE("attention is priced from one kernel's tables: a table only one kernel has prices no other") {
    // The H100 profile, whose cuDNN alone has a causal backward table (head dim 128), plus a cuDNN-only
    // causal forward at head dim 192 (600 TFLOP/s at every length); 4096 keys, where every table has a point.
    const HardwareProfile plain = io::load_hardware("h100-sxm").value();
    HardwareProfile hw = plain;
    AttentionTable extra;
    extra.dtype = "bf16";
    extra.direction = "fwd";
    extra.head_dim = 192;
    extra.causal = true;
    extra.impl = "cudnn";
    extra.points = {{512, 600e12}, {32768, 600e12}};
    hw.calibration.attention.push_back(extra);
    const double sustained = hw.gpu.sustained_rate.at("bf16").value;
    auto at_4096 = [&](const char* impl, const char* dir, bool causal, int64_t hd) {
      for (const AttentionTable& t : plain.calibration.attention) {
        if (t.impl == impl && t.direction == dir && t.causal == causal && t.head_dim == hd)
          for (const auto& [keys, rate] : t.points)
            if (keys == 4096) return rate;
      }
      FAIL("no table point");
      return 0.0;
    };
    auto seconds = [](const HardwareProfile& h, AttentionKernel kernel, Phase phase, int32_t hd) {
      StackProfile stack = io::load_stack("megatron-core").value();
      stack.attention_kernel.value = kernel;
      const cost::CostModel cm(h, stack);
      Op op;
      op.kind = OpKind::kAttention;
      op.phase = phase;
      op.attn = {1, 4096, 4096, 32, hd, hd, 0, true};
      op.flops = 1e12;
      return cm.attention_seconds(op, nullptr);
    };
    // FA3 is priced from its own tables: its forward at 192 as without the cuDNN row there, its causal
    // backward at 128 derived from its non-causal backward and forward ratio, not cuDNN's table.
    CHECK(seconds(hw, AttentionKernel::kFa3, Phase::kForward, 192) ==
          rel(seconds(plain, AttentionKernel::kFa3, Phase::kForward, 192)));
    const double fa3_derived = at_4096("fa3", "bwd", false, 128) * at_4096("fa3", "fwd", true, 128) /
                               at_4096("fa3", "fwd", false, 128);
    CHECK(seconds(hw, AttentionKernel::kFa3, Phase::kBackward, 128) == rel(1e12 / (fa3_derived * sustained)));
    // cuDNN takes its own tables at the head dims they hold...
    CHECK(seconds(hw, AttentionKernel::kCudnn, Phase::kForward, 192) == rel(1e12 / (600e12 * sustained)));
    CHECK(seconds(hw, AttentionKernel::kCudnn, Phase::kBackward, 128) ==
          rel(1e12 / (at_4096("cudnn", "bwd", true, 128) * sustained)));
    // ...and at head dim 64, below its causal backward's one head dim, derives that backward at 64.
    const double cudnn_derived_64 = at_4096("cudnn", "bwd", false, 64) * at_4096("cudnn", "fwd", true, 64) /
                                    at_4096("cudnn", "fwd", false, 64);
    CHECK(seconds(hw, AttentionKernel::kCudnn, Phase::kBackward, 64) ==
          rel(1e12 / (cudnn_derived_64 * sustained)));
  }

  TEST_CASE("the stack's attention kernel picks its row of the profile's attention tables") {
    // H100 profile, causal forward, head dim 128, 4096 keys: cuDNN 591 (cuDNN 9.19 on an H200), FA3 579, FA2
    // 319 TFLOPS, at the profile's sustained BF16 rate of those burst-timed tables. A kernel the profile
    // lacks falls back to FA3.
    const HardwareProfile hw = io::load_hardware("h100-sxm").value();
    const double sustained = hw.gpu.sustained_rate.at("bf16").value;
    Op op;
    op.kind = OpKind::kAttention;
    op.attn = {1, 4096, 4096, 32, 128, 128, 0, true};
    op.flops = 1e12;
    struct Case {
      AttentionKernel kernel;
      double tflops;
    };
    for (const Case& c : {Case{AttentionKernel::kCudnn, 591}, Case{AttentionKernel::kFa3, 579},
                          Case{AttentionKernel::kFa2, 319}}) {
      CAPTURE(name_of(c.kernel));
      StackProfile stack = io::load_stack("megatron-core").value();
      stack.attention_kernel.value = c.kernel;
      const cost::CostModel cm(hw, stack);
      CHECK(cm.attention_seconds(op, nullptr) == rel(1e12 / (c.tflops * 1e12 * sustained)));
    }
    HardwareProfile no_fa2 = hw;
    std::erase_if(no_fa2.calibration.attention, [](const AttentionTable& t) { return t.impl == "fa2"; });
    StackProfile stack = io::load_stack("megatron-core").value();
    stack.attention_kernel.value = AttentionKernel::kFa2;
    const cost::CostModel cm(no_fa2, stack);
    CHECK(cm.attention_seconds(op, nullptr) == rel(1e12 / (579e12 * sustained)));
  }

  TEST_CASE("tensor-core kernels run at the GPU's sustained share of the tables' rates and the rest do not") {
    // H100: BF16 at 0.86 and FP8 at 0.98 of the burst-timed tables. A compute-bound GEMM (from a grid and
    // beyond the grids), a grouped GEMM either way a stack runs it (per-expert launches, a grouped kernel)
    // and attention take 1 / rate as long; memory-bound kernels and collectives do not move.
    const HardwareProfile hot = io::load_hardware("h100-sxm").value();
    HardwareProfile burst = hot;
    burst.gpu.sustained_rate.clear();
    const double bf16 = hot.gpu.sustained_rate.at("bf16").value, fp8 = hot.gpu.sustained_rate.at("fp8").value;
    CHECK(bf16 < fp8);
    CHECK(fp8 < 1.0);
    for (const char* name : {"megatron-core", "moerun"}) {
      CAPTURE(name);
      const StackProfile stack = io::load_stack(name).value();
      const cost::CostModel h(hot, stack), b(burst, stack);
      for (const GemmShape& s : {GemmShape{4096, 4096, 4096, 1}, GemmShape{65536, 8192, 8192, 1}}) {
        CAPTURE(s.m);
        CHECK(h.gemm_seconds(s, DType::kBf16, nullptr) ==
              rel(b.gemm_seconds(s, DType::kBf16, nullptr) / bf16));
        CHECK(h.gemm_seconds(s, DType::kFp8, nullptr) == rel(b.gemm_seconds(s, DType::kFp8, nullptr) / fp8));
      }
      // Per-expert launches add one launch gap on several streams; the grouped kernel none.
      const double gap = stack.grouped_gemm.impl.value == GroupedGemmImpl::kPerExpertStreams
                             ? stack.launch_s_per_kernel.value
                             : 0;
      const GemmShape experts{8 * 4096, 4096, 4096, 8};
      for (GemmPart part : {GemmPart::kNone, GemmPart::kDgrad, GemmPart::kWgrad}) {
        CHECK(h.grouped_gemm_seconds(experts, DType::kBf16, nullptr, part) - gap ==
              rel((b.grouped_gemm_seconds(experts, DType::kBf16, nullptr, part) - gap) / bf16));
      }
      Op attn;
      attn.kind = OpKind::kAttention;
      attn.attn = {1, 4096, 4096, 32, 128, 128, 0, true};
      attn.flops = 1e12;
      CHECK(h.attention_seconds(attn, nullptr) == rel(b.attention_seconds(attn, nullptr) / bf16));
      Op mem;
      mem.kind = OpKind::kMemoryBound;
      mem.hbm_bytes = 1e9;
      CHECK(h.cost(mem).seconds == b.cost(mem).seconds);
      CHECK(h.cost(mem).basis == b.cost(mem).basis);
      const Op a2a = test::ep_all_to_all_op(8, 256e6);
      CHECK(h.cost(a2a).seconds == b.cost(a2a).seconds);
    }
    // A GEMM's basis is the weaker of its own and the sustained rate's: derived on the H200 (measured there),
    // assumed on the H100 (carried from it).
    const StackProfile stack = io::load_stack("megatron-core").value();
    const HardwareProfile h200 = io::load_hardware("h200-sxm").value();
    CHECK(cost::CostModel(h200, stack).cost(gemm_op()).basis == Basis::kDerived);
    CHECK(cost::CostModel(hot, stack).cost(gemm_op()).basis == Basis::kAssumed);
    CHECK(cost::CostModel(burst, stack).cost(gemm_op()).basis == Basis::kMeasured);
  }

  TEST_CASE("a memory-bound kernel takes the stack's fixed kernel time plus its bytes at the memory rate") {
    // Megatron-Core: 4 us per kernel on the device and a 1.3 us launch gap. A 3-kernel memory-bound op moving
    // 1 KB costs 3 x (4 + 1.3) us and its bytes; one moving 1 GB costs its bytes at 0.64 x achieved HBM plus
    // 3 x (4 + 1.3) us.
    const HardwareProfile hw = io::load_hardware("h100-sxm").value();
    const StackProfile stack = io::load_stack("megatron-core").value();
    const cost::CostModel cm(hw, stack);
    Op op;
    op.kind = OpKind::kMemoryBound;
    op.kernels = 3;
    const double bw = 0.64 * hw.gpu.hbm_bw_achieved_bytes_per_s.value;
    op.hbm_bytes = 1e3;
    CHECK(cm.cost(op).seconds == rel(1e3 / bw + 3 * (4e-6 + 1.3e-6)));
    op.hbm_bytes = 1e9;
    CHECK(cm.cost(op).seconds == rel(1e9 / bw + 3 * (4e-6 + 1.3e-6)));
  }

  TEST_CASE("a memory-bound kind the stack measured apart runs at its own rate, the rest at the default") {
    // Megatron-Core states its SwiGLU's and its two cross-entropies' rates forward and backward (0.64 / 0.22,
    // 0.97 / 0.94, 0.67 / 1 of achieved HBM); recomputation runs the forward's. Every other memory-bound
    // kind, and a stack that states none, keeps memory_bound_efficiency (0.64).
    const HardwareProfile hw = io::load_hardware("h100-sxm").value();
    StackProfile stack = io::load_stack("megatron-core").value();
    const double hbm = hw.gpu.hbm_bw_achieved_bytes_per_s.value, fixed = 4e-6 + 1.3e-6;
    Op op;
    op.kind = OpKind::kMemoryBound;
    op.hbm_bytes = 1e9;
    auto seconds = [&](MemOp kind, Phase phase) {
      op.mem = kind;
      op.phase = phase;
      return cost::CostModel(hw, stack).cost(op).seconds;
    };
    CHECK(seconds(MemOp::kGlu, Phase::kForward) == rel(1e9 / (0.64 * hbm) + fixed));
    CHECK(seconds(MemOp::kGlu, Phase::kBackward) == rel(1e9 / (0.22 * hbm) + fixed));
    CHECK(seconds(MemOp::kGlu, Phase::kRecompute) == rel(1e9 / (0.64 * hbm) + fixed));
    CHECK(seconds(MemOp::kLossUnfused, Phase::kForward) == rel(1e9 / (0.97 * hbm) + fixed));
    CHECK(seconds(MemOp::kLossUnfused, Phase::kBackward) == rel(1e9 / (0.94 * hbm) + fixed));
    CHECK(seconds(MemOp::kLossNative, Phase::kForward) == rel(1e9 / (0.67 * hbm) + fixed));
    CHECK(seconds(MemOp::kLossNative, Phase::kBackward) == rel(1e9 / hbm + fixed));
    CHECK(seconds(MemOp::kLoss, Phase::kBackward) == rel(1e9 / (0.64 * hbm) + fixed));
    CHECK(seconds(MemOp::kNorm, Phase::kBackward) == rel(1e9 / (0.64 * hbm) + fixed));
    op.mem = MemOp::kLossUnfused;
    CHECK(cost::CostModel(hw, stack).cost(op).basis == Basis::kDerived);
    stack.memory_bound_by_kind = {};
    CHECK(seconds(MemOp::kGlu, Phase::kBackward) == rel(1e9 / (0.64 * hbm) + fixed));
  }

  TEST_CASE("Megatron's SwiGLU and cross-entropy as lowered match their H100 measurements within 5 percent") {
    // Liger-Kernel's H100 runs of Megatron-Core's own kernels (LK, LKCE in the stacks). Cross-entropy at TP
    // 1, 8,192 tokens, V = 131,072: unfused forward 15.81 ms, backward alone 5.43 ms; native forward 11.81
    // ms, backward alone 6.42 ms. SwiGLU at 8,192 tokens, ffn 32,768: forward 0.859 ms, backward alone 4.22
    // ms less out.sum()'s read of the output (0.18 ms). Bytes as the lowering counts them (lower_test.cpp
    // checks them): loss unfused 42 / 14 B per logit, native 22 / 18; SwiGLU 6 / 10 B per output element.
    const HardwareProfile hw = io::load_hardware("h100-sxm").value();
    const cost::CostModel cm(hw, io::load_stack("megatron-core").value());
    auto ms = [&](MemOp kind, Phase phase, double bytes, uint16_t kernels) {
      Op op;
      op.kind = OpKind::kMemoryBound;
      op.mem = kind;
      op.phase = phase;
      op.kernels = kernels;
      op.hbm_bytes = bytes;
      return cm.cost(op).seconds * 1e3;
    };
    const double logits = 8192.0 * 131072.0, act = 8192.0 * 32768.0;
    CHECK(std::abs(ms(MemOp::kLossUnfused, Phase::kForward, 42 * logits, 6) / 15.81 - 1) < 0.05);
    CHECK(std::abs(ms(MemOp::kLossUnfused, Phase::kBackward, 14 * logits, 3) / 5.43 - 1) < 0.05);
    CHECK(std::abs(ms(MemOp::kLossNative, Phase::kForward, 22 * logits, 3) / 11.81 - 1) < 0.05);
    CHECK(std::abs(ms(MemOp::kLossNative, Phase::kBackward, 18 * logits, 3) / 6.42 - 1) < 0.05);
    CHECK(std::abs(ms(MemOp::kGlu, Phase::kForward, 6 * act, 1) / 0.859 - 1) < 0.05);
    CHECK(std::abs(ms(MemOp::kGlu, Phase::kBackward, 10 * act, 1) / (4.22 - 0.18) - 1) < 0.05);
  }

  TEST_CASE("FLA's chunked delta rule as lowered matches its H100 forward times within 8 percent") {
    // FI3866 (the Megatron stacks' sources): FLA's chunk_gated_delta_rule forward on an H100, 8 value heads
    // of 128, one sequence of 2,048 to 65,536 tokens: 0.086, 0.144, 0.259, 0.508, 0.997, 1.954 ms. The op as
    // the lowering states it (lower_test.cpp): 5,150 bytes per token and value head in six kernels, the
    // chunks of 64, 16 chains (8 heads x 2 value blocks), walked once.
    const HardwareProfile hw = io::load_hardware("h100-sxm").value();
    const cost::CostModel cm(hw, io::load_stack("megatron-core").value());
    auto scan = [](double tokens, Phase phase) {
      Op op;
      op.kind = OpKind::kMemoryBound;
      op.mem = MemOp::kActivation;
      op.name = static_cast<uint16_t>(OpName::kMixerScan);
      op.phase = phase;
      op.kernels = 6;
      op.hbm_bytes = tokens * 8 * 5150.0;
      op.gemm = {static_cast<int64_t>(tokens / 64), 16, 1, 1};
      return op;
    };
    const double tokens[] = {2048, 4096, 8192, 16384, 32768, 65536};
    const double measured_ms[] = {0.086, 0.144, 0.259, 0.508, 0.997, 1.954};
    for (size_t i = 0; i < 6; ++i) {
      CAPTURE(tokens[i]);
      CHECK(std::abs(cm.cost(scan(tokens[i], Phase::kForward)).seconds * 1e3 / measured_ms[i] - 1) < 0.08);
    }
    // Its bytes alone would be 30 % short at 65,536 tokens: the chain over the chunks is what takes the time.
    const double bytes_ms =
        scan(65536, Phase::kForward).hbm_bytes / (hw.gpu.hbm_bw_achieved_bytes_per_s.value * 0.64) * 1e3;
    CHECK(bytes_ms < 0.75 * 1.954);
    // Two walks backward take twice the chain; chains beyond the SMs run in waves.
    Op twice = scan(65536, Phase::kBackward);
    twice.gemm.k = 2;
    const double fixed = 6 * (4.0 + 1.3) * 1e-6;
    CHECK(cm.cost(twice).seconds - fixed ==
          doctest::Approx(2 * (cm.cost(scan(65536, Phase::kForward)).seconds - fixed)));
    Op wide = scan(65536, Phase::kForward);
    wide.gemm.n = 133;
    wide.hbm_bytes = 1;
    CHECK(cm.cost(wide).seconds - fixed == doctest::Approx(2 * 1024 * 1.88e-6));
    // A stack that states no chain time prices the scan by its bytes.
    const cost::CostModel plain(hw, io::load_stack("moerun").value());
    Op bytes_only = scan(65536, Phase::kForward);
    bytes_only.gemm = {};
    CHECK(plain.cost(scan(65536, Phase::kForward)).seconds ==
          doctest::Approx(plain.cost(bytes_only).seconds));
  }

  TEST_CASE("FP8 quantisation kernels add their bytes and a fixed time each, and host launches") {
    // Megatron-Core on H100: 4 us per kernel, 1.3 us launch gap, 25 us host per kernel, 10 us host per local
    // expert launch, TE's FP8 casts at the achieved HBM rate (memory_bound_efficiency_by_kind.cast, 1; other
    // memory-bound work at 0.64 of it). A current-scaling GEMM quantises its input in 3 kernels (amax, scale,
    // cast): the GEMM, then 3 x 4 us and the input's bytes, then 4 launch gaps. A grouped GEMM over 8 experts
    // quantises per expert: 24 kernels, 8 x (1 + 3) host launches; its wgrad quantises nothing.
    const HardwareProfile hw = io::load_hardware("h100-sxm").value();
    const StackProfile stack = io::load_stack("megatron-core").value();
    REQUIRE(stack.memory_bound_efficiency_of(MemOp::kCast, Phase::kForward).value == 1.0);
    REQUIRE(stack.memory_bound_efficiency_of(MemOp::kCast, Phase::kBackward).value == 1.0);
    REQUIRE(stack.memory_bound_efficiency.value == 0.64);
    const cost::CostModel cm(hw, stack);
    const double bw = hw.gpu.hbm_bw_achieved_bytes_per_s.value;
    Op op = gemm_op();
    op.kernels = 4;
    op.aux_kernels = 3;
    op.aux_bytes = 1e3;
    const double gemm = cm.gemm_seconds(op.gemm, op.dtype, nullptr);
    CHECK(cm.cost(op).seconds == rel(gemm + 1e3 / bw + 3 * 4e-6 + 4 * 1.3e-6));
    CHECK(cm.cost(op).host_seconds == rel(4 * 25e-6));
    op.aux_bytes = 1e9;
    CHECK(cm.cost(op).seconds == rel(gemm + 1e9 / bw + 3 * 4e-6 + 4 * 1.3e-6));

    Op g = gemm_op();
    g.kind = OpKind::kGroupedGemm;
    g.gemm = {8 * 512, 4096, 4096, 8};
    g.kernels = 1;
    g.aux_kernels = 3;
    g.aux_bytes = 1e3;
    const double grouped = cm.grouped_gemm_seconds(g.gemm, g.dtype, nullptr);
    CHECK(cm.cost(g).seconds == rel(grouped + 1e3 / bw + 24 * 4e-6 + 1.3e-6));
    CHECK(cm.cost(g).host_seconds == rel(25e-6 + 8 * 4 * 10e-6));
    g.part = GemmPart::kWgrad;
    g.aux_kernels = 0;
    g.aux_bytes = 0;
    CHECK(cm.cost(g).host_seconds == rel(25e-6 + 8 * 10e-6));

    // A stack that states no rate for its casts prices them at its memory-bound efficiency.
    StackProfile plain = stack;
    plain.memory_bound_by_kind.cast_forward = plain.memory_bound_by_kind.cast_backward = {};
    const cost::CostModel generic(hw, plain);
    CHECK(generic.cost(op).seconds == rel(gemm + 1e9 / (0.64 * bw) + 3 * 4e-6 + 4 * 1.3e-6));
  }

  TEST_CASE("a block-scaled FP8 GEMM runs at the stack's block rate of the per-tensor FP8 rate") {
    // Megatron-Core on H100 states fp8_block_gemm_rate 0.81 (derived from TE's H200 GEMM profile): a GEMM, a
    // grouped GEMM and a userbuffers GEMM + all-gather with block-scaled operands take 1 / 0.81 of their GEMM
    // time, launches and quantisation kernels unchanged, and rest on the rate's basis. A stack that does not
    // state it (moerun) runs them at the per-tensor rate, and so does every op without block scales.
    const HardwareProfile hw = io::load_hardware("h100-sxm").value();
    const StackProfile stack = io::load_stack("megatron-core").value();
    REQUIRE(stack.fp8_block_gemm_rate.value == 0.81);
    REQUIRE(stack.fp8_block_gemm_rate.basis == Basis::kDerived);
    const cost::CostModel cm(hw, stack);
    Op dense = gemm_op();
    dense.dtype = DType::kFp8;
    dense.kernels = 2;
    dense.aux_kernels = 1;
    dense.aux_bytes = 1e8;
    Op block = dense;
    block.block_scaled = true;
    const double gemm = cm.gemm_seconds(dense.gemm, DType::kFp8, nullptr);
    CHECK(cm.cost(block).seconds - cm.cost(dense).seconds == rel(gemm * (1.0 / 0.81 - 1.0)));
    CHECK(cm.cost(block).host_seconds == cm.cost(dense).host_seconds);
    Op grouped = dense;
    grouped.kind = OpKind::kGroupedGemm;
    grouped.gemm = {8 * 4096, 4096, 4096, 8};
    Op grouped_block = grouped;
    grouped_block.block_scaled = true;
    const double g = cm.grouped_gemm_seconds(grouped.gemm, DType::kFp8, nullptr);
    CHECK(cm.cost(grouped_block).seconds - cm.cost(grouped).seconds == rel(g * (1.0 / 0.81 - 1.0)));
    Op ub = dense;
    ub.kind = OpKind::kFusedGemmComm;
    ub.aux_bytes = 0;
    ub.aux_kernels = 0;
    ub.comm.collective = Collective::kAllGather;
    ub.comm.group = CommGroup::kTp;
    ub.comm.group_size = 4;
    ub.comm.stride = 1;
    ub.comm.bytes = 1e3;  // a negligible exchange: four chunk GEMMs back to back
    ub.comm.userbuffers = true;
    Op ub_block = ub;
    ub_block.block_scaled = true;
    const double chunk = cm.gemm_seconds({2048, 8192, 8192, 1}, DType::kFp8, nullptr);
    CHECK(cm.cost(ub_block).seconds - cm.cost(ub).seconds == rel(4.0 * chunk * (1.0 / 0.81 - 1.0)));
    // The cost cache tells the two apart.
    CHECK(cost::cost_fields_hash(block) != cost::cost_fields_hash(dense));
    // At the tables' own rate (no sustained rate) a bare GEMM rests on measurements; block-scaled, on the
    // derived rate.
    HardwareProfile tables = hw;
    tables.gpu.sustained_rate.clear();
    const cost::CostModel at_tables(tables, stack);
    Op bare = gemm_op();
    bare.dtype = DType::kFp8;
    CHECK(at_tables.cost(bare).basis == Basis::kMeasured);
    bare.block_scaled = true;
    CHECK(at_tables.cost(bare).basis == Basis::kDerived);

    const StackProfile unstated = io::load_stack("moerun").value();
    REQUIRE(unstated.fp8_block_gemm_rate.source == kNotStated);
    const cost::CostModel plain(hw, unstated);
    CHECK(plain.cost(block).seconds == plain.cost(dense).seconds);
    CHECK(plain.cost(block).basis == plain.cost(dense).basis);
  }

  TEST_CASE("an op inside a CUDA graph issues nothing from the host, a replay's first op carries its copy") {
    // Megatron-Core on H100: 25 us of host per framework call, 1.3 us launch gap, 4 us shortest kernel,
    // memory-bound work at 0.64 of achieved HBM. A graphed GEMM keeps its device time and loses its host
    // time, grouped GEMMs their per-expert launches too; the first op of a replay pays two host calls (the
    // copy of the inputs into the static buffers, the replay) and the copy, one memory-bound kernel.
    const HardwareProfile hw = io::load_hardware("h100-sxm").value();
    const StackProfile stack = io::load_stack("megatron-core").value();
    const cost::CostModel cm(hw, stack);
    const double bw = 0.64 * hw.gpu.hbm_bw_achieved_bytes_per_s.value;
    Op op = gemm_op();
    op.kernels = 2;
    const cost::OpCost eager = cm.cost(op);
    CHECK(eager.host_seconds == rel(2 * 25e-6));
    op.graphed = true;
    CHECK(cm.cost(op).host_seconds == 0.0);
    CHECK(cm.cost(op).seconds == rel(eager.seconds));
    op.graph_copy_bytes = 64e6f;
    CHECK(cm.cost(op).host_seconds == rel(2 * 25e-6));
    CHECK(cm.cost(op).seconds == rel(eager.seconds + 64e6 / bw + 4e-6 + 1.3e-6));
    // The cost key tells graphed ops and replays apart.
    Op plain = gemm_op();
    plain.kernels = 2;
    CHECK(cost::cost_fields_hash(plain) != cost::cost_fields_hash(op));
    Op inside = plain;
    inside.graphed = true;
    CHECK(cost::cost_fields_hash(plain) != cost::cost_fields_hash(inside));
    CHECK(cost::cost_fields_hash(inside) != cost::cost_fields_hash(op));

    Op g = gemm_op();
    g.kind = OpKind::kGroupedGemm;
    g.gemm = {8 * 512, 4096, 4096, 8};
    CHECK(cm.cost(g).host_seconds == rel(25e-6 + 8 * 10e-6));
    g.graphed = true;
    CHECK(cm.cost(g).host_seconds == 0.0);
  }
}
