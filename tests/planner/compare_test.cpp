// compare: the op-by-op join of two step reports and its error attribution, against a closed form.
#include "planner/compare.h"

#include <doctest/doctest.h>

#include <string>

#include <nlohmann/json.hpp>

namespace {

using namespace moeplan;
using namespace moeplan::planner;
using nlohmann::json;

// A prediction of one stage, in µs: gemm 400, grouped_gemm 250, attention 100, memory_bound 50, optimizer 20,
// ep all-to-all 200 and dp reduce-scatter 100 (comm 300); exposed ep 150 + dp_attn 30 = 180; bubble 100 of a
// 1000 µs step.
json predicted_json() {
  auto op = [](const char* name, const char* phase, const char* kind, double us,
               const char* group = nullptr) {
    json o = {{"stage", 0},   {"op", name}, {"phase", phase},
              {"kind", kind}, {"count", 1}, {"total_s", us * 1e-6}};
    if (group) o["group"] = group;
    return o;
  };
  return {{"model", "tiny-moe"},
          {"gpus", 2},
          {"step_time_s", 1000e-6},
          {"ops",
           {op("L0.qkv", "fwd", "gemm", 400), op("L0.expert_fc1", "fwd", "grouped_gemm", 250),
            op("L0.attention", "fwd", "attention", 100), op("L0.rmsnorm", "fwd", "memory_bound", 50),
            op("optimizer", "optimizer", "optimizer", 20), op("L0.dispatch", "fwd", "collective", 200, "ep"),
            op("grad_rs", "bwd", "collective", 100, "dp_attn")}},
          {"breakdown",
           {{"stage", 0},
            {"compute", {{"gemm", 400e-6}, {"grouped_gemm", 250e-6}, {"attention", 100e-6}}},
            {"exposed_comm", {{"ep", 150e-6}, {"dp_attn", 30e-6}}},
            {"bubble", 100e-6},
            {"optimizer", 20e-6}}}};
}

StepReport predicted() {
  Result<StepReport> r = step_report(predicted_json(), "pred.json");
  REQUIRE_MESSAGE(r, r.error().message);
  return r.value();
}

}  // namespace

TEST_SUITE("planner/compare") {
  TEST_CASE("two reports join op by op and the contributors add up to the step-time difference") {
    // Measured copy of predicted_json(): the gemm op takes 600 instead of 400 µs and the step 1200. The
    // difference (-200 µs) is all compute efficiency of gemm: dT_gemm = -200, and the imbalance term
    // d(step - sum B) + d(B.gemm - T_gemm) = (1000 - 1000) - (1200 - 1200) + 0 = 0.
    json mj = predicted_json();
    mj["ops"][0]["total_s"] = 600e-6;
    mj["step_time_s"] = 1200e-6;
    mj["breakdown"]["compute"]["gemm"] = 600e-6;
    const auto m = step_report(mj, "meas.json");
    REQUIRE(m);
    const auto c = compare_reports(predicted(), m.value());
    REQUIRE_MESSAGE(c, c.error().message);
    CHECK(c.value().end_to_end_error == doctest::Approx(-200.0 / 1200));
    REQUIRE(!c.value().contributors.empty());
    CHECK(c.value().contributors[0].name == "compute efficiency: gemm");
    CHECK(c.value().contributors[0].delta_s == doctest::Approx(-200e-6));
    double sum = 0;
    for (const Contributor& x : c.value().contributors) sum += x.delta_s;
    CHECK(sum == doctest::Approx(-200e-6));
    CHECK(c.value().ops.size() == 7);
    CHECK(c.value().ops[0].measured.total_s == doctest::Approx(600e-6));
    // A different plan is refused with what differs.
    mj["gpus"] = 4;
    const auto other = compare_reports(predicted(), step_report(mj, "meas.json").value());
    REQUIRE_FALSE(other);
    CHECK(other.error().message == "pred.json and meas.json are reports of different plans: gpus 2 vs 4");
  }
}
