// The shipped Hopper profiles load, convert to SI once, and keep the facts their sources state.
#include <doctest/doctest.h>

#include <functional>
#include <string>

#include "simulator/core/units.h"
#include "simulator/io/builtin_catalog.h"
#include "simulator/io/hardware_loader.h"

using namespace moeplan;

namespace {
HardwareProfile load(const char* name) {
  auto h = io::load_hardware(name);
  REQUIRE_MESSAGE(h.ok(), (h.ok() ? "" : h.error().message));
  return h.value();
}
}  // namespace

TEST_SUITE("io") {
  TEST_CASE("the three Hopper profiles load with datasheet peaks in SI units") {
    for (const char* name : {"h100-sxm", "h800-sxm", "h200-sxm"}) {
      CAPTURE(name);
      const HardwareProfile h = load(name);
      CHECK(h.gpu.peak_flops_per_s.at("bf16").value == doctest::Approx(989e12).epsilon(0.01));
      CHECK(h.gpu.sm_count.value == 132);
      CHECK(h.node.gpus_per_node.value == 8);
      CHECK_FALSE(h.calibration.collectives.empty());
      CHECK_FALSE(h.calibration.gemm.empty());
      CHECK_FALSE(h.calibration.attention.empty());
    }
    // As the driver reports it (nvidia-smi: 143771 MiB and 81559 MiB), not the datasheet's 141 GB and 80 GB.
    CHECK(load("h200-sxm").gpu.hbm_capacity_bytes.value == doctest::Approx(143771.0 * 1024 * 1024));
    CHECK(load("h100-sxm").gpu.hbm_capacity_bytes.value == doctest::Approx(81559.0 * 1024 * 1024));
    CHECK(load("h100-sxm").gpu.hbm_capacity_bytes.value / kGiB == doctest::Approx(79.65).epsilon(1e-3));
  }

  TEST_CASE("H800 NVLink is about 160 GB/s achieved per direction, H100's 450 line rate") {
    CHECK(load("h800-sxm").node.nvlink_bw_achieved_bytes_per_s.value == doctest::Approx(160e9));
    CHECK(load("h100-sxm").node.nvlink_bw_uni_bytes_per_s.value == doctest::Approx(450e9));
  }

  TEST_CASE("the NVLS all-reduce curve of H100 reaches its sources' plateau") {
    const HardwareProfile h = load("h100-sxm");
    bool found = false;
    for (const auto& c : h.calibration.collectives) {
      if (c.collective != Collective::kAllReduce || c.algorithm != CollectiveAlgorithm::kNvls ||
          c.ranks != 8 || c.points.size() < 10) {
        continue;
      }
      found = true;
      CHECK(c.points.front().first == 1024);
      CHECK(c.points.back().second == doctest::Approx(478.87e9));  // 8 GiB, hopper-hardware.md §2.1
    }
    CHECK(found);
  }

  TEST_CASE("the sustained tensor-core rates are stated numbers: derived on the H200, assumed elsewhere") {
    // Measured on the H200 (a minute of back-to-back GEMMs against a cool GPU); carried to the H100 and
    // H800, so assumed there; every one with the range it may lie in.
    const HardwareProfile h200 = load("h200-sxm");
    CHECK(h200.gpu.sustained_rate.at("bf16").basis == Basis::kDerived);
    CHECK(h200.gpu.sustained_rate.at("bf16").value == doctest::Approx(0.86));
    for (const char* name : {"h100-sxm", "h800-sxm", "h200-sxm"}) {
      CAPTURE(name);
      const HardwareProfile h = load(name);
      for (const char* dtype : {"bf16", "fp8"}) {
        CAPTURE(dtype);
        const Stated<double>& r = h.gpu.sustained_rate.at(dtype);
        REQUIRE(r.range);
        CHECK(r.range->first <= r.value);
        CHECK(r.value <= r.range->second);
        CHECK(r.range->second == 1.0);  // the tables' own rate is the top
        if (std::string(name) != "h200-sxm") CHECK(r.basis == Basis::kAssumed);
      }
    }
  }

  TEST_CASE("a sustained rate above 1 or at 0 or assumed without a range or of an unknown dtype is refused") {
    auto j = io::read_input("h100-sxm", "hwprofiles", "", nullptr, nullptr);
    REQUIRE(j.ok());
    auto refused = [&](const std::function<void(nlohmann::json&)>& change) {
      nlohmann::json k = j.value();
      change(k);
      auto h = io::hardware_from_json(k, "p.json");
      REQUIRE_FALSE(h.ok());
      return h.error().message;
    };
    CHECK(refused([](nlohmann::json& k) { k["gpu"]["sustained_rate"]["bf16"]["value"] = 1.2; }) ==
          "p.json: field 'gpu.sustained_rate.bf16.value': expected an efficiency in (0, 1], got number 1.2");
    CHECK(refused([](nlohmann::json& k) {
            k["gpu"]["sustained_rate"]["bf16"].erase("range");
          }).starts_with("p.json: field 'gpu.sustained_rate.bf16.range': expected [low, high]"));
    CHECK(refused([](nlohmann::json& k) {
            k["gpu"]["sustained_rate"]["tf32"] = k["gpu"]["sustained_rate"]["bf16"];
          }).starts_with("p.json: field 'gpu.sustained_rate.tf32'"));
    // Optional: a profile without it runs at its tables' rates.
    nlohmann::json k = j.value();
    k["gpu"].erase("sustained_rate");
    auto h = io::hardware_from_json(k, "p.json");
    REQUIRE(h.ok());
    CHECK(h.value().gpu.sustained_rate.empty());
  }

  TEST_CASE("every scalar needs a source") {
    auto j = io::read_input("h100-sxm", "hwprofiles", "", nullptr, nullptr);
    REQUIRE(j.ok());
    j.value()["gpu"]["sm_count"]["source"] = "  ";
    auto h = io::hardware_from_json(j.value(), "p.json");
    REQUIRE_FALSE(h.ok());
    CHECK(h.error().message ==
          "p.json: field 'gpu.sm_count.source': expected a non-empty citation, got string \"  \"");
  }
}
