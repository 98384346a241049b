// Fit report of the Hopper profiles: the cost model predicts the measured NVLS all-reduce sweeps at sizes it
// did not see within the 10% for messages >= 1 MiB, and respects the facts the sources state; grouped
// GEMM tables are scored with their kernel class's implementation at efficiency 1.
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "simulator/calibrate/fit_report.h"
#include "simulator/core/units.h"
#include "simulator/cost/collective.h"
#include "simulator/cost/cost_model.h"
#include "simulator/io/hardware_loader.h"
#include "simulator/io/stack_loader.h"

using namespace moeplan;

namespace {

// A 4-SM GPU with a 100 TFLOPS BF16 peak, HBM fast enough never to bind, and one dense BF16 GEMM measured
// at 50 TFLOPS: 512 x 1024 x 1024 is 4 x 4 tiles of 128 x 256, four full waves, so the dense model runs at
// efficiency 0.5 and, with one shape, no depth term (k0 = 0): a GEMM of T tiles takes
//   2 m n k / (100e12 x 0.5 x T / (4 ceil(T / 4))).
HardwareProfile four_sm_gpu() {
  HardwareProfile hw;
  hw.name = "four-sm";
  hw.gpu.sm_count.value = 4;
  hw.gpu.peak_flops_per_s["bf16"].value = 100e12;
  hw.gpu.hbm_bw_peak_bytes_per_s.value = 1e18;
  hw.gpu.hbm_bw_achieved_bytes_per_s.value = 1e18;
  hw.calibration.gemm.push_back({"bf16", "test", {{512, 1024, 1024, 50e12}}});
  return hw;
}

GroupedGemmTable table(const std::string& kernel, const std::string& part, GroupedGemmPoint p) {
  GroupedGemmTable t;
  t.dtype = "bf16";
  t.kernel = kernel;
  t.part = part;
  t.source = "G9 (test)";
  t.points = {p};
  return t;
}

}  // namespace

TEST_SUITE("calibrate") {
  TEST_CASE("a grouped kernel's table is scored on the padded rows of one launch at efficiency 1") {
    // 8 experts of 64 rows, n = 256, k = 1024: each expert's rows pad to one 128-row tile, 8 tiles are two
    // full waves on 4 SMs, so t = 2 x 8 x 128 x 256 x 1024 / (100e12 x 0.5) and the useful rate is half of 50
    // TFLOPS: 25. Measured 20: error |20/25 - 1| = 0.2, implied efficiency 0.8.
    const auto hw = four_sm_gpu();
    const auto fit = calibrate::grouped_gemm_fit(table("cutlass_grouped", "fwd", {8, 64, 256, 1024, 20e12}),
                                                 hw, io::load_stack("moerun").value());
    REQUIRE(fit.points.size() == 1);
    CHECK(fit.points[0].predicted == doctest::Approx(25.0));
    CHECK(fit.all.median == doctest::Approx(0.2));
    CHECK(fit.all.max == doctest::Approx(0.2));
    CHECK(fit.implied_efficiency == doctest::Approx(0.8));
    CHECK(fit.kernel == "cutlass_grouped");
    CHECK(fit.source == "G9");
    CHECK(fit.model.find("grouped_kernel") != std::string::npos);
  }

  TEST_CASE(
      "a per-expert loop's table is scored one expert GEMM after another, concurrent up to its streams") {
    // 8 experts of 64 x 128 x 1024: one tile each, a quarter of the 4 SMs, so one expert runs at 50 x 1/4 =
    // 12.5 TFLOPS. cuBLAS's loop (1 stream) runs them one after another: 12.5 TFLOPS; TE's GroupedLinear (4
    // streams) runs min(4, 4 SMs / 1 narrow 64 x 128 tile) = 4 at once: 50 TFLOPS. Launch gaps are not
    // charged.
    const auto hw = four_sm_gpu();
    const auto stack = io::load_stack("megatron-core").value();
    const auto loop =
        calibrate::grouped_gemm_fit(table("cublas_loop", "fwd", {8, 64, 128, 1024, 25e12}), hw, stack);
    CHECK(loop.points[0].predicted == doctest::Approx(12.5));
    CHECK(loop.implied_efficiency == doctest::Approx(2.0));
    CHECK(loop.all.max == doctest::Approx(1.0));
    CHECK(loop.model.find("per_expert_streams (1 stream)") != std::string::npos);
    const auto te =
        calibrate::grouped_gemm_fit(table("te_grouped_linear", "fwd", {8, 64, 128, 1024, 50e12}), hw, stack);
    CHECK(te.points[0].predicted == doctest::Approx(50.0));
    CHECK(te.implied_efficiency == doctest::Approx(1.0));
    CHECK(te.all.max == doctest::Approx(0.0));
    // An expert of 128 x 256 already covers the 4 SMs in narrow tiles (2 x 2): the streams add nothing, and
    // it runs at the loop's 12.5 TFLOPS.
    const auto wide = calibrate::grouped_gemm_fit(
        table("te_grouped_linear", "fwd", {8, 128, 256, 1024, 12.5e12}), hw, stack);
    CHECK(wide.points[0].predicted == doctest::Approx(12.5));
  }

  TEST_CASE("TE's multi-stream grouped GEMM measured on H100 (G9) is predicted within 6 % per shape") {
    // TransformerEngine PR #2045's benchmark of general_grouped_gemm (TE 2.7): 8 experts of 4096 rows and 16
    // of 2048, n = 768, k = 2048, 627.9 and 553.9 TFLOPS. Each expert runs at its lone cuBLAS rate from the
    // measured grids; the model that let experts side by side reach the rate of a GPU-filling GEMM was 21 %
    // too fast on the second.
    const auto hw = io::load_hardware("h100-sxm").value();
    const auto report = calibrate::fit_report(hw, io::load_stack("megatron-core").value());
    int found = 0;
    for (const auto& t : report.tables) {
      if (t.kind != "grouped_gemm" || t.source != "G9") continue;
      ++found;
      CHECK(t.points.size() == 2);
      CHECK(t.all.max < 0.06);
    }
    CHECK(found == 1);
  }

  TEST_CASE("a fwd+bwd table is predicted as its forward, dgrad and wgrad GEMMs in sequence") {
    // One expert, 128 rows, n = 256, k = 512. Forward [128 x 256], depth 512: 1 tile, rate 50/4. Dgrad
    // [128 x 512], depth 256: 2 tiles, rate 50/2. Wgrad [512 x 256], depth 128: 4 tiles, rate 50. Equal FLOPs
    // F each, so the rate is 3F / (F/12.5 + F/25 + F/50) = 3 x 50 / 7 TFLOPS; measured 30 implies 30 x 7 /
    // 150.
    const auto hw = four_sm_gpu();
    const auto fit = calibrate::grouped_gemm_fit(
        table("cutlass_grouped", "fwd+bwd", {1, 128, 256, 512, 30e12}), hw, io::load_stack("moerun").value());
    CHECK(fit.points[0].predicted == doctest::Approx(150.0 / 7));
    CHECK(fit.implied_efficiency == doctest::Approx(30.0 * 7 / 150));
    const auto dgrad = calibrate::grouped_gemm_fit(
        table("cutlass_grouped", "dgrad", {1, 128, 256, 512, 25e12}), hw, io::load_stack("moerun").value());
    CHECK(dgrad.points[0].predicted == doctest::Approx(25.0));
    CHECK(dgrad.implied_efficiency == doctest::Approx(1.0));
  }

  TEST_CASE("every Hopper grouped GEMM table names its kernel and the report shows the implied efficiency") {
    for (const char* name : {"h100-sxm", "h200-sxm", "h800-sxm"}) {
      CAPTURE(name);
      const auto hw = io::load_hardware(name).value();
      const auto r = calibrate::fit_report(hw, io::load_stack("moerun").value());
      size_t grouped = 0;
      for (const auto& t : r.tables) {
        if (t.kind != "grouped_gemm") continue;
        ++grouped;
        CAPTURE(t.label);
        CHECK(find_grouped_gemm_kernel(t.kernel) != nullptr);
        CHECK(t.all.points > 0);
        CHECK(t.implied_efficiency > 0);
      }
      CHECK(grouped == hw.calibration.grouped_gemm.size());
      const std::string text = calibrate::fit_report_text(r);
      CHECK(text.find("Grouped GEMM per table") != std::string::npos);
      CHECK(text.find("cublas_loop") != std::string::npos);
      CHECK(calibrate::fit_report_json(r)["tables"].back().contains("kind"));
    }
  }

  TEST_CASE("an all-to-all with a hot receiver is priced as a uniform one of the busiest rank's bytes") {
    // Two 8-GPU points of 16 MiB per rank: even (measured at the price of a uniform 16 MiB all-to-all), and
    // rank 0 receiving twice the mean (measured at twice the price of a uniform 32 MiB one).
    HardwareProfile hw = io::load_hardware("h100-sxm").value();
    const StackProfile stack = io::load_stack("moerun").value();
    const cost::CostModel cm(hw, stack);
    auto price = [&cm](double bytes) {
      CommSpec s;
      s.collective = Collective::kAllToAll;
      s.group = CommGroup::kEp;
      s.group_size = 8;
      s.stride = 1;
      s.bytes = bytes;
      return cm.collective_seconds(s, nullptr, nullptr);
    };
    const double b = 16.0 * kMiB;
    REQUIRE(price(2 * b) > price(b));
    AllToAllSkewTable skew;
    skew.ranks = 8;
    skew.source = "test";
    skew.points = {{static_cast<int64_t>(b), 1.0, price(b)},
                   {static_cast<int64_t>(b), 2.0, 2 * price(2 * b)}};
    hw.calibration.alltoall_skew = {skew};
    const auto r = calibrate::fit_report(hw, stack);
    const calibrate::TableFit* t = nullptr;
    for (const auto& x : r.tables)
      if (x.kind == "alltoall_skew") t = &x;
    REQUIRE(t != nullptr);
    CHECK(t->label == "alltoall, hot receiver, 8 ranks / 1 node");
    REQUIRE(t->points.size() == 2);
    CHECK(t->points[0].measured == doctest::Approx(t->points[0].predicted));
    CHECK(t->points[1].measured == doctest::Approx(t->points[1].predicted / 2));
    CHECK(t->points[1].at == "16 MiB x2");
    CHECK(t->large.points == 2);
    CHECK(t->large.max == doctest::Approx(0.5));  // |priced / measured - 1| at the hot point
    CHECK(t->note == "measured / priced time (geometric mean) at x1: 1.00, x2: 2.00");
    CHECK(calibrate::fit_report_text(r).find("alltoall, hot receiver") != std::string::npos);
  }

  TEST_CASE("the 8-GPU NVLS all-reduce sweeps are predicted within 10 percent at sizes left out") {
    for (const char* name : {"h100-sxm", "h200-sxm"}) {
      CAPTURE(name);
      const auto r = calibrate::fit_report(io::load_hardware(name).value(), io::load_stack("moerun").value());
      bool seen = false;
      for (const auto& t : r.tables) {
        if (t.label != "all_reduce nvls 8 ranks / 1 node" || t.large.points < 10) continue;
        seen = true;
        CHECK(t.model.find("leave-one-out") != std::string::npos);
        CHECK(t.large.median <= 0.10);
        CHECK(t.large.max <= 0.15);
      }
      CHECK(seen);
    }
  }

  TEST_CASE("every Hopper profile respects the facts its sources state") {
    for (const char* name : {"h100-sxm", "h200-sxm", "h800-sxm"}) {
      CAPTURE(name);
      const auto r = calibrate::fit_report(io::load_hardware(name).value(), io::load_stack("moerun").value());
      REQUIRE(r.facts.size() >= 2);
      for (const auto& f : r.facts) {
        CAPTURE(f.statement);
        CAPTURE(f.detail);
        CHECK(f.holds);
      }
      const bool h800 = std::string(name) == "h800-sxm";
      bool has_160 = false;
      for (const auto& f : r.facts) has_160 |= f.statement.find("160 GB/s") != std::string::npos;
      CHECK(has_160 == h800);
    }
  }

  TEST_CASE(
      "leave-one-out picks the alpha-beta line for alpha-beta data and interpolation for a protocol switch") {
    // 8 ranks, all_reduce. Exact alpha-beta data (20 us, 400 GB/s): the line predicts left-out sizes exactly.
    std::vector<std::pair<double, double>> line, two_regimes;
    for (double b = 4096; b <= 4.0 * kGiB; b *= 2) {
      const double u = b * 1.75;
      line.emplace_back(b, u / (20e-6 + u / 400e9));
      // A low-latency protocol up to 1 MiB (5 us, 40 GB/s), then a high-bandwidth one (40 us, 450 GB/s):
      // the time is the faster of the two, which no single line follows.
      const double t = std::min(5e-6 + u / 40e9, 40e-6 + u / 450e9);
      two_regimes.emplace_back(b, u / t);
    }
    const auto a = cost::fit_curve(Collective::kAllReduce, 8, line);
    CHECK_FALSE(a.interpolated());
    CHECK(a.max_rel_error < 1e-6);
    const auto b = cost::fit_curve(Collective::kAllReduce, 8, two_regimes);
    CHECK(b.interpolated());
    const auto ab = cost::fit_alpha_beta(Collective::kAllReduce, 8, two_regimes);
    CHECK(b.rel_error_small < ab.rel_error_small);
    // The curve reproduces its own sizes and keeps the latency floor below the smallest one.
    const double t0 = cost::curve_seconds(b, Collective::kAllReduce, 8, 4096);
    CHECK(t0 == doctest::Approx(4096 * 1.75 / two_regimes.front().second));
    CHECK(cost::curve_seconds(b, Collective::kAllReduce, 8, 16) == doctest::Approx(t0));
  }

  TEST_CASE("the fit report lists every calibration table with its points") {
    const auto hw = io::load_hardware("h200-sxm").value();
    const auto r = calibrate::fit_report(hw, io::load_stack("moerun").value());
    const auto& c = hw.calibration;
    const size_t tables = c.collectives.size() + c.gemm.size() + c.grouped_gemm.size() + c.attention.size() +
                          (c.hbm.empty() ? 0 : 1);
    CHECK(r.tables.size() == tables);
    const auto j = calibrate::fit_report_json(r);
    CHECK(j["tables"].size() == tables);
    CHECK(j["profile"] == "h200-sxm");
    CHECK(calibrate::fit_report_text(r).find("Facts the sources state:") != std::string::npos);
  }
}
