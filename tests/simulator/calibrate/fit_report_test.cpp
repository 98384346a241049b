// Fit report of the Hopper profiles: the cost model predicts the measured NVLS all-reduce sweeps at sizes it
// did not see within the 10% for messages >= 1 MiB, and respects the facts the sources state.
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "simulator/calibrate/fit_report.h"
#include "simulator/core/units.h"
#include "simulator/cost/collective.h"
#include "simulator/io/hardware_loader.h"
#include "simulator/io/stack_loader.h"

using namespace moeplan;

TEST_SUITE("calibrate") {
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
