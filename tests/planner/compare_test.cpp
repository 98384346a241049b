// compare: reading reports and traces by content, the measurement of a trace per category (unions of kernel
// intervals, exposed communication, idle share, step time from ProfilerStep ranges or the kernels' span), the
// join with a prediction by category and the op-by-op join's error attribution, each against a closed form.
#include "planner/compare.h"

#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <variant>

#include <nlohmann/json.hpp>

#include "simulator/core/units.h"

namespace {

using namespace moeplan;
using namespace moeplan::planner;
using nlohmann::json;

const std::string kTrace = std::string(MOEPLAN_SOURCE_DIR) + "/tests/planner/data/kineto_moe_steps.json";

calibrate::KernelPatterns patterns() {
  auto p = calibrate::load_kernel_patterns();
  REQUIRE_MESSAGE(p, p.error().message);
  return p.value();
}

TraceMeasurement measure_file(const TraceOptions& o = {}) {
  Result<calibrate::TraceFile> t = calibrate::read_trace(kTrace);
  REQUIRE_MESSAGE(t, t.error().message);
  Result<TraceMeasurement> m = measure_trace(t.value(), patterns(), o);
  REQUIRE_MESSAGE(m, m.error().message);
  return m.value();
}

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

const CategoryRow& row(const TraceComparison& c, const std::string& name) {
  for (const CategoryRow& r : c.categories) {
    if (r.category == name) return r;
  }
  FAIL("no row " << name);
  return c.categories.front();
}

calibrate::KernelEvent kernel(const char* name, double start_us, double dur_us, int64_t device = 0,
                              int64_t stream = 7) {
  calibrate::KernelEvent k;
  k.name = name;
  k.cat = "kernel";
  k.start_s = start_us * 1e-6;
  k.dur_s = dur_us * 1e-6;
  k.device = device;
  k.stream = stream;
  return k;
}

// A file under the temp dir, removed when it goes out of scope.
struct TempFile {
  std::filesystem::path path;
  TempFile(const std::string& name, const std::string& text)
      : path(std::filesystem::temp_directory_path() / (name + "_" + std::to_string(::getpid()) + ".json")) {
    std::ofstream(path) << text;
  }
  ~TempFile() { std::filesystem::remove(path); }
};

}  // namespace

TEST_SUITE("planner/compare") {
  TEST_CASE("a Kineto trace is measured per category as the union of its kernels within the kept steps") {
    // tests/planner/data/kineto_moe_steps.json, device 0, times in µs. CPU ProfilerStep#10..#13 are [0,
    // 1000), [1000, 2000), [2000, 3100), [3100, 3600); #10 and #13 are dropped as partial, so the window is
    // [1000, 3100) = 2100 µs holding 2 steps, and the step is the median of 1000 and 1100 = 1050 µs (the
    // gpu_user_annotation copy of #11 is not a step). Steps #11 and #12 run the same kernels, #12 1000 µs
    // later:
    //   gemm [1010,1210) sm90_xmma + [1150,1200) on stream 13 (inside it: union 200) + nvjet [1650,1850) 200,
    //        and the step-10 GEMM [800,1005) adds 5 µs inside the window: (2 x 400 + 5) / 2 = 402.5
    //   memory_bound rmsnorm 20 + triton permute 20 + elementwise add 20 = 60;  attention cudnn sdpa 100;
    //   grouped_gemm cutlass GroupProblemShape 200;  other (unknown name) 10
    //   comm deep_ep dispatch [1350,1400) 50 + combine [1600,1650) 50 + reduce-scatter [1700,1900) and
    //        all-gather [1880,1920) (union 220) = 320
    //   exposed comm: dispatch 50 + combine 50 + [1850,1920) 70 (the nvjet GEMM hides [1700,1850)) = 170
    //   busy: [1010,1920) 910 + [1930,1960) 30 per step, + 5: 1885 of 2100 -> idle 215 / 2100
    const TraceMeasurement m = measure_file();
    CHECK(m.dialect == calibrate::TraceDialect::kKineto);
    CHECK(m.device == 0);
    CHECK(m.devices == std::vector<int64_t>{0, 1});
    CHECK(m.steps == 2);
    CHECK(m.step_s == doctest::Approx(1050e-6));
    CHECK(m.step_rule == "median of 2 ProfilerStep ranges; the first and last of 4 dropped as partial");
    CHECK(m.window_start_s == doctest::Approx(1000e-6));
    CHECK(m.window_end_s == doctest::Approx(3100e-6));
    CHECK(m.busy_s.at("gemm") == doctest::Approx(402.5e-6));
    CHECK(m.busy_s.at("memory_bound") == doctest::Approx(60e-6));
    CHECK(m.busy_s.at("attention") == doctest::Approx(100e-6));
    CHECK(m.busy_s.at("grouped_gemm") == doctest::Approx(200e-6));
    CHECK(m.busy_s.at("other") == doctest::Approx(10e-6));
    CHECK(m.busy_s.at("comm") == doctest::Approx(320e-6));
    CHECK(m.busy_s.size() == 6);
    CHECK(m.comm_s == doctest::Approx(320e-6));
    CHECK(m.exposed_comm_s == doctest::Approx(170e-6));
    CHECK(m.busy_all_s == doctest::Approx(942.5e-6));
    CHECK(m.idle_share == doctest::Approx(215.0 / 2100));
    // Kernels that start in the window: per step 3 GEMMs, 3 memory-bound, 4 communication, 1 of each other.
    CHECK(m.kernels == std::map<std::string, int64_t>{{"attention", 2},
                                                      {"comm", 8},
                                                      {"gemm", 6},
                                                      {"grouped_gemm", 2},
                                                      {"memory_bound", 6},
                                                      {"other", 2}});
    CHECK_FALSE(m.comm_groups_known);
  }

  TEST_CASE("the join with a prediction by category gives the errors of the closed form") {
    // predicted_json() against the measurement above (µs per step), error = (predicted - measured) /
    // measured:
    //   gemm 400 vs 402.5 -> -2.5/402.5;  grouped_gemm 250 vs 200 -> +25%;  attention 100 vs 100 -> 0;
    //   memory_bound 50 vs 60 -> -1/6;  optimizer 20 vs (no category in a trace);  other (none) vs 10;
    //   comm 200 + 100 = 300 vs 320 -> -6.25%;  exposed comm 180 vs 170 -> +10/170;
    //   step 1000 vs 1050 -> -50/1050;  idle 100/1000 vs 215/2100.
    const TraceComparison c = compare_with_trace(predicted(), measure_file());
    std::vector<std::string> names;
    for (const CategoryRow& r : c.categories) names.push_back(r.category);
    CHECK(names == std::vector<std::string>{"gemm", "grouped_gemm", "attention", "memory_bound", "optimizer",
                                            "other", "comm"});
    CHECK(*row(c, "gemm").error() == doctest::Approx(-2.5 / 402.5));
    CHECK(*row(c, "grouped_gemm").error() == doctest::Approx(0.25));
    CHECK(*row(c, "attention").error() == doctest::Approx(0.0));
    CHECK(*row(c, "memory_bound").error() == doctest::Approx(-1.0 / 6));
    CHECK(*row(c, "optimizer").predicted_s == doctest::Approx(20e-6));
    CHECK_FALSE(row(c, "optimizer").measured_s);
    CHECK_FALSE(row(c, "optimizer").error());
    CHECK_FALSE(row(c, "other").predicted_s);
    CHECK(*row(c, "other").measured_s == doctest::Approx(10e-6));
    CHECK(*row(c, "comm").predicted_s == doctest::Approx(300e-6));
    CHECK(*row(c, "comm").error() == doctest::Approx(-0.0625));
    CHECK(*c.exposed_comm.error() == doctest::Approx(10.0 / 170));
    CHECK(c.end_to_end_error == doctest::Approx(-50.0 / 1050));
    CHECK(c.predicted_idle_share == doctest::Approx(0.1));
    CHECK(c.predicted_comm_by_group.size() == 2);
    CHECK(c.predicted_comm_by_group.at("dp_attn") == doctest::Approx(100e-6));
    CHECK(c.predicted_comm_by_group.at("ep") == doctest::Approx(200e-6));
    // What the join cannot tell apart is said: comm groups, and the optimizer's kernels.
    REQUIRE(c.notes.size() == 2);
    CHECK(c.notes[0].find("one category 'comm'") != std::string::npos);
    CHECK(c.notes[0].find("dp_attn 0.00010 s, ep 0.00020 s") != std::string::npos);
    CHECK(c.notes[1].find("optimizer") != std::string::npos);

    const json j = trace_comparison_json(c);
    CHECK(j["measured"]["dialect"] == "kineto");
    CHECK(j["categories"][4]["measured_s"].is_null());
    CHECK(j["exposed_comm"]["measured_s"].get<double>() == doctest::Approx(170e-6));
    CHECK(j["idle_share"]["measured"].get<double>() == doctest::Approx(215.0 / 2100));
    const std::string text = trace_comparison_text(c);
    CHECK(text.find("end-to-end error of step time: -4.8%") != std::string::npos);
    CHECK(text.find("grouped_gemm                      0.00025      0.00020   +25.0%") != std::string::npos);
    CHECK(text.find("exposed comm") != std::string::npos);
  }

  TEST_CASE(
      "another device is measured on request, and a device without kernels is an error naming those with") {
    // Device 1 has one GEMM [1000, 1500): inside the window of 2 steps, 250 µs per step, idle 1600/2100.
    const TraceMeasurement m = measure_file({.device = 1});
    CHECK(m.busy_s.at("gemm") == doctest::Approx(250e-6));
    CHECK(m.busy_s.size() == 1);
    CHECK(m.idle_share == doctest::Approx(1600.0 / 2100));
    const auto t = calibrate::read_trace(kTrace);
    REQUIRE(t);
    const auto bad = measure_trace(t.value(), patterns(), {.device = 3});
    REQUIRE_FALSE(bad);
    CHECK(bad.error().message.find(
              "kineto_moe_steps.json: no kernels on device 3 (devices with kernels: 0, 1)") !=
          std::string::npos);
  }

  TEST_CASE("without ProfilerStep ranges the step is the kernels' span divided by the steps given") {
    // An Nsight-style trace of device 0: a GEMM [0, 1000) on stream 7 and an all-reduce [500, 1500) on stream
    // 20, said to hold 2 steps. Span 1500 -> step 750; per step gemm 500, comm 500, exposed [1000,1500) 250;
    // every instant has a kernel: idle 0.
    calibrate::TraceFile t;
    t.label = "nsys.json";
    t.dialect = calibrate::TraceDialect::kNsys;
    t.kernels = {kernel("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_TNT", 0, 1000),
                 kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 500, 1000, 0, 20)};
    const auto m = measure_trace(t, patterns(), {.steps = 2});
    REQUIRE_MESSAGE(m, m.error().message);
    CHECK(m.value().step_s == doctest::Approx(750e-6));
    CHECK(m.value().step_rule == "span of device 0's kernels / 2 steps (no ProfilerStep ranges)");
    CHECK(m.value().busy_s.at("gemm") == doctest::Approx(500e-6));
    CHECK(m.value().busy_s.at("comm") == doctest::Approx(500e-6));
    CHECK(m.value().exposed_comm_s == doctest::Approx(250e-6));
    CHECK(m.value().idle_share == doctest::Approx(0.0));
  }

  TEST_CASE("fewer than three ProfilerStep ranges are all kept") {
    // Two steps [0, 400) and [400, 1000): median 500, window [0, 1000); one GEMM [100, 300) -> 100 per step.
    calibrate::TraceFile t;
    t.label = "two_steps.json";
    t.kernels = {kernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", 100, 200)};
    t.ranges = {{"ProfilerStep#1", 0, 400e-6, 1, 1, "user_annotation"},
                {"ProfilerStep#2", 400e-6, 1000e-6, 1, 1, "user_annotation"}};
    const auto m = measure_trace(t, patterns(), {});
    REQUIRE_MESSAGE(m, m.error().message);
    CHECK(m.value().step_s == doctest::Approx(500e-6));
    CHECK(m.value().step_rule == "median of 2 ProfilerStep ranges; too few to drop the first and last");
    CHECK(m.value().busy_s.at("gemm") == doctest::Approx(100e-6));
    CHECK(m.value().idle_share == doctest::Approx(0.8));
  }

  TEST_CASE("a moerun trace keeps communication groups apart and is joined group by group") {
    // moerun's trace of stage 0: a gemm op [0, 400), an ep all-to-all [400, 600) and a dp reduce-scatter
    // [300, 500) on another stream; 1 step of 600. Per group: comm_ep 200, comm_dp_attn 200; exposed: the
    // union of both [300, 600) less the gemm's [300, 400) = 200. Predicted (predicted_json): comm_ep 200,
    // comm_dp_attn 100 -> errors 0 and -50%; exposed 180 vs 200 -> -10%.
    calibrate::TraceFile t;
    t.label = "trace.json";
    t.dialect = calibrate::TraceDialect::kMoerun;
    auto op = [](const char* kind, double start, double dur, int64_t stream, const char* group) {
      calibrate::KernelEvent k = kernel("L0.op", start, dur, 0, stream);
      k.cat = kind;
      k.group = group;
      return k;
    };
    t.kernels = {op("gemm", 0, 400, 0, ""), op("collective", 400, 200, 1, "ep"),
                 op("collective", 300, 200, 2, "dp_attn")};
    const auto m = measure_trace(t, patterns(), {});
    REQUIRE_MESSAGE(m, m.error().message);
    CHECK(m.value().comm_groups_known);
    CHECK(m.value().busy_s.at("comm_ep") == doctest::Approx(200e-6));
    CHECK(m.value().busy_s.at("comm_dp_attn") == doctest::Approx(200e-6));
    CHECK(m.value().exposed_comm_s == doctest::Approx(200e-6));
    const TraceComparison c = compare_with_trace(predicted(), m.value());
    CHECK(*row(c, "comm_ep").error() == doctest::Approx(0.0));
    CHECK(*row(c, "comm_dp_attn").error() == doctest::Approx(-0.5));
    CHECK(*c.exposed_comm.error() == doctest::Approx(-0.1));
    // Every op kind has a category in a moerun trace: the optimizer was measured as zero.
    CHECK(*row(c, "optimizer").measured_s == 0.0);
    CHECK(c.notes.empty());
  }

  TEST_CASE("the measured side is told apart by content: report, trace object, event array, or neither") {
    const TempFile report("compare_report", predicted_json().dump());
    const TempFile array(
        "compare_array",
        R"([{"ph": "X", "cat": "kernel", "name": "nvjet_tst_64x8", "pid": 0, "tid": 7, "ts": 0,
                             "dur": 5}])");
    const TempFile neither("compare_neither", R"({"hidden_size": 1024})");
    const auto r = read_measured(report.path.string());
    REQUIRE(r);
    CHECK(std::holds_alternative<StepReport>(r.value()));
    const auto a = read_measured(array.path.string());
    REQUIRE_MESSAGE(a, a.error().message);
    CHECK(std::get<calibrate::TraceFile>(a.value()).kernels.size() == 1);
    const auto t = read_measured(kTrace);
    REQUIRE(t);
    CHECK(std::holds_alternative<calibrate::TraceFile>(t.value()));
    const auto n = read_measured(neither.path.string());
    REQUIRE_FALSE(n);
    CHECK(n.error().message.find(
              "not a moeplan report (no step_time_s, ops or breakdown) nor a Chrome trace") !=
          std::string::npos);
    // A trace cannot be the prediction.
    const auto p = read_step_report(kTrace);
    REQUIRE_FALSE(p);
    CHECK(p.error().message.find("a Chrome trace, not a moeplan report") != std::string::npos);
  }

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
    // A measurement of every rank carries each op's spread over the ranks into the comparison.
    json rj = mj;
    rj["ops"][0]["ranks"] = {{"min_s", 550e-6}, {"mean_s", 600e-6}, {"max_s", 650e-6}, {"slowest_rank", 1}};
    const auto r = compare_reports(predicted(), step_report(rj, "meas.json").value());
    REQUIRE(r);
    REQUIRE(r.value().ops[0].measured.ranks.has_value());
    CHECK(r.value().ops[0].measured.ranks->max_s == doctest::Approx(650e-6));
    CHECK(r.value().ops[0].measured.ranks->slowest_rank == 1);
    const json rjson = report_comparison_json(r.value());
    CHECK(rjson["ops"][0]["measured_ranks"]["min_s"].get<double>() == doctest::Approx(550e-6));
    CHECK(!rjson["ops"][1].contains("measured_ranks"));
    const std::string text = report_comparison_text(r.value(), 10);
    CHECK(text.find("measured over ranks (slowest)") != std::string::npos);
    CHECK(text.find("0.00055-0.00065 (rank 1)") != std::string::npos);
    CHECK(report_comparison_text(c.value(), 10).find("over ranks") == std::string::npos);
    // A malformed "ranks" is an error naming the file.
    rj["ops"][0]["ranks"] = {{"min_s", "x"}, {"max_s", 1.0}};
    const auto bad = step_report(rj, "meas.json");
    REQUIRE_FALSE(bad);
    CHECK(bad.error().message.rfind("meas.json: ops:", 0) == 0);
    // A different plan is refused with what differs.
    mj["gpus"] = 4;
    const auto other = compare_reports(predicted(), step_report(mj, "meas.json").value());
    REQUIRE_FALSE(other);
    CHECK(other.error().message == "pred.json and meas.json are reports of different plans: gpus 2 vs 4");
  }

  TEST_CASE("memory compares the predicted allocations, without the reserve, with the measured high-water") {
    json pj = predicted_json(), mj = predicted_json();
    const auto compared = [&] {
      const auto c =
          compare_reports(step_report(pj, "pred.json").value(), step_report(mj, "meas.json").value());
      REQUIRE_MESSAGE(c, c.error().message);
      return c.value();
    };
    // Neither side states memory: no comparison, and the text has no memory line.
    CHECK(!compared().memory);
    CHECK(report_comparison_text(compared(), 5).find("memory per GPU") == std::string::npos);
    // 45 GiB allocated + 5 GiB reserve predicted, 40 GiB measured: the allocations are 12.5 % over.
    pj["memory"] = {{"per_gpu_bytes", 50 * kGiB},
                    {"per_gpu_bytes_range", {48 * kGiB, 53 * kGiB}},
                    {"components", {{"weights", 20 * kGiB}, {"reserve", 5 * kGiB}}}};
    CHECK(!compared().memory);  // the measurement states none yet
    mj["memory"] = {{"per_gpu_bytes", 40 * kGiB},
                    {"measured_high_water_bytes", 40 * kGiB},
                    {"source", "device high-water"}};
    const ReportComparison c = compared();
    REQUIRE(c.memory);
    CHECK(c.memory->predicted_allocated == doctest::Approx(45 * kGiB));
    CHECK(c.memory->predicted_low == doctest::Approx(48 * kGiB));
    CHECK(c.memory->allocated_error() == doctest::Approx(0.125));
    const json j = report_comparison_json(c);
    CHECK(j["memory"]["allocated_error"].get<double>() == doctest::Approx(0.125));
    CHECK(j["memory"]["measured_high_water_bytes"].get<double>() == doctest::Approx(40 * kGiB));
    const std::string text = report_comparison_text(c, 5);
    CAPTURE(text);
    CHECK(text.find("memory per GPU: measured 40.00 GiB (device high-water); predicted 45.00 GiB allocated + "
                    "5.00 GiB reserve = 50.00 GiB (range 48.00-53.00); allocations +12.5% of the measured") !=
          std::string::npos);
    // A prediction without its components compares its whole per-GPU figure.
    pj["memory"].erase("components");
    CHECK(compared().memory->allocated_error() == doctest::Approx(0.25));
  }
}
