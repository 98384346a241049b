// `moeplan compare` as a user meets it: a prediction joined with itself has no error; a copy with a known
// change has the error and the top contributor the change implies; ops on one side only are listed; a Chrome
// trace as the measurement is joined by category; bad input exits 2 with one line.
#include <doctest/doctest.h>

#include "tests/planner/cli/run_moeplan.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace {

using namespace moeplan::test;  // Run, run_cli, lines, TempPlan
using nlohmann::json;

// tiny-moe on 2 ranks with expert parallelism: every category (gemm, grouped_gemm, attention, memory-bound,
// ep and dp communication) has ops.
const char* kPlan =
    R"({"model": "models/tiny-moe.json", "hardware": "hwprofiles/h100-sxm.json", "stack": "moerun", "gpus": 2,
  "seq_len": 256, "global_batch": 4, "micro_batch": 1, "experts": {"ep": 2, "etp": 1, "dispatch": "all_to_all"}})";

// A report file under the temp dir, removed when it goes out of scope.
struct TempReport {
  std::filesystem::path path;
  TempReport(const std::string& name, const json& j)
      : path(std::filesystem::temp_directory_path() / (name + "_" + std::to_string(::getpid()) + ".json")) {
    std::ofstream(path) << j.dump(1);
  }
  ~TempReport() { std::filesystem::remove(path); }
  std::string quoted() const { return "'" + path.string() + "'"; }
};

json predicted_report() {
  std::string text = kPlan;
  const std::string dir = MOEPLAN_SOURCE_DIR;
  for (const std::string rel : {"models/", "hwprofiles/"}) {
    const auto at = text.find("\"" + rel);
    text.replace(at + 1, rel.size(), dir + "/" + rel);
  }
  TempPlan plan("compare_plan", text);
  const Run r = run_cli("simulate " + plan.quoted() + " --json");
  REQUIRE(r.exit_code == 0);
  return json::parse(r.out);
}

json compare_json(const TempReport& a, const TempReport& b) {
  const Run r = run_cli("compare " + a.quoted() + " " + b.quoted() + " --json");
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  return json::parse(r.out);
}

// A synthetic PyTorch-profiler trace of two devices, four ProfilerSteps (tests/planner/compare_test.cpp works
// out its figures: device 0 per step gemm 402.5 µs, grouped_gemm 200, attention 100, memory_bound 60, other
// 10, comm 320 of which 170 exposed; step 1050 µs; idle 215 / 2100).
const char* kKinetoTrace = "tests/planner/data/kineto_moe_steps.json";

// A prediction of one stage in µs: gemm 400, grouped_gemm 250, attention 100, memory_bound 50, ep all-to-all
// 300; exposed ep 180; bubble 100 of a 1000 µs step.
json small_prediction() {
  auto op = [](const char* name, const char* kind, double us) {
    return json{{"stage", 0},   {"op", name}, {"phase", "fwd"},
                {"kind", kind}, {"count", 1}, {"total_s", us * 1e-6}};
  };
  json dispatch = op("L0.dispatch", "collective", 300);
  dispatch["group"] = "ep";
  return {{"model", "tiny-moe"},
          {"gpus", 2},
          {"step_time_s", 1000e-6},
          {"ops",
           {op("L0.qkv", "gemm", 400), op("L0.expert_fc1", "grouped_gemm", 250),
            op("L0.attention", "attention", 100), op("L0.rmsnorm", "memory_bound", 50), dispatch}},
          {"breakdown",
           {{"stage", 0},
            {"compute", json::object()},
            {"exposed_comm", {{"ep", 180e-6}}},
            {"bubble", 100e-6},
            {"optimizer", 0}}}};
}

}  // namespace

TEST_SUITE("planner/cli/compare") {
  TEST_CASE("a prediction compared with itself has zero error in every op and contributor") {
    const TempReport p("compare_self", predicted_report());
    const json c = compare_json(p, p);
    CHECK(c["end_to_end_error"].get<double>() == 0.0);
    CHECK(c["only_in_predicted"].empty());
    CHECK(c["only_in_measured"].empty());
    REQUIRE(!c["ops"].empty());
    for (const json& op : c["ops"]) CHECK(op["error"].get<double>() == 0.0);
    for (const json& x : c["contributors"]) CHECK(x["delta_s"].get<double>() == doctest::Approx(0.0));
  }

  TEST_CASE("gemm ops twice as slow in the measurement make compute efficiency of gemm the top contributor") {
    // Measured copy: every gemm op takes 2x; the step and the breakdown's gemm time grow by the added seconds
    // of the breakdown stage. Expected error = (step - (step + added)) / (step + added).
    const json p = predicted_report();
    json m = p;
    const int64_t stage = p["breakdown"]["stage"].get<int64_t>();
    double added = 0;
    for (json& op : m["ops"]) {
      if (op["kind"] != "gemm") continue;
      if (op["stage"].get<int64_t>() == stage) added += op["total_s"].get<double>();
      op["total_s"] = 2 * op["total_s"].get<double>();
      op["mean_s"] = 2 * op["mean_s"].get<double>();
    }
    REQUIRE(added > 0);
    const double step = p["step_time_s"].get<double>();
    m["step_time_s"] = step + added;
    m["breakdown"]["compute"]["gemm"] = m["breakdown"]["compute"]["gemm"].get<double>() + added;
    const TempReport pf("compare_p", p), mf("compare_m", m);
    const json c = compare_json(pf, mf);
    CHECK(c["end_to_end_error"].get<double>() == doctest::Approx(-added / (step + added)));
    CHECK(c["top_contributor"] == "compute efficiency: gemm");
    CHECK(c["contributors"][0]["delta_s"].get<double>() == doctest::Approx(-added));
    for (const json& cat : c["categories"]) {
      if (cat["category"] == "gemm") CHECK(cat["error"].get<double>() == doctest::Approx(-0.5));
    }
  }

  TEST_CASE("slower expert all-to-alls that stay exposed make the ep bandwidth the top contributor") {
    // Measured copy: each ep collective takes 3x and none of the added time is hidden.
    const json p = predicted_report();
    json m = p;
    const int64_t stage = p["breakdown"]["stage"].get<int64_t>();
    double added = 0;
    for (json& op : m["ops"]) {
      if (op.value("group", "") != "ep") continue;
      if (op["stage"].get<int64_t>() == stage) added += 2 * op["total_s"].get<double>();
      op["total_s"] = 3 * op["total_s"].get<double>();
    }
    REQUIRE(added > 0);
    m["step_time_s"] = p["step_time_s"].get<double>() + added;
    m["breakdown"]["exposed_comm"]["ep"] = m["breakdown"]["exposed_comm"].value("ep", 0.0) + added;
    const TempReport pf("compare_p2", p), mf("compare_m2", m);
    const json c = compare_json(pf, mf);
    CHECK(c["top_contributor"] == "collective bandwidth: ep");
    CHECK(c["contributors"][0]["delta_s"].get<double>() == doctest::Approx(-added));
    for (const json& x : c["contributors"]) {
      if (x["contributor"] == "exposed overlap: ep")
        CHECK(x["delta_s"].get<double>() == doctest::Approx(0.0));
    }
  }

  TEST_CASE("an op on one side only is listed and the text names it") {
    const json p = predicted_report();
    json m = p;
    const json dropped = m["ops"][0];
    m["ops"].erase(0);
    const TempReport pf("compare_p3", p), mf("compare_m3", m);
    const json c = compare_json(pf, mf);
    REQUIRE(c["only_in_predicted"].size() == 1);
    CHECK(c["only_in_predicted"][0]["op"] == dropped["op"]);
    CHECK(c["only_in_measured"].empty());
    const Run text = run_cli("compare " + pf.quoted() + " " + mf.quoted());
    CHECK(text.exit_code == 0);
    CHECK(text.out.find("only predicted: stage " + std::to_string(dropped["stage"].get<int>()) + " " +
                        dropped["op"].get<std::string>()) != std::string::npos);
    CHECK(text.out.find("end-to-end error of step time: +0.0%") != std::string::npos);
  }

  TEST_CASE("bad input exits 2 with one line naming the problem") {
    const json p = predicted_report();
    const TempReport pf("compare_bad_p", p);
    json other = p;
    other["plan"]["seq_len"] = 512;
    const TempReport of("compare_bad_plan", other);
    json gpus = p;
    gpus["gpus"] = 4;
    const TempReport gf("compare_bad_gpus", gpus);

    const Run missing = run_cli("compare " + pf.quoted() + " /nonexistent/report.json");
    CHECK(missing.exit_code == 2);
    CHECK(lines(missing.err) == 1);
    CHECK(missing.err.find("/nonexistent/report.json: cannot open") != std::string::npos);

    const Run not_report = run_cli("compare models/tiny-moe.json " + pf.quoted());
    CHECK(not_report.exit_code == 2);
    CHECK(lines(not_report.err) == 1);
    CHECK(not_report.err.find("models/tiny-moe.json: not a moeplan report") != std::string::npos);

    const Run plan = run_cli("compare " + pf.quoted() + " " + of.quoted());
    CHECK(plan.exit_code == 2);
    CHECK(lines(plan.err) == 1);
    CHECK(plan.err.find("different plans: plan.seq_len 256 vs 512") != std::string::npos);

    const Run g = run_cli("compare " + pf.quoted() + " " + gf.quoted());
    CHECK(g.exit_code == 2);
    CHECK(g.err.find("different plans: gpus 2 vs 4") != std::string::npos);
  }

  TEST_CASE("a prediction against a Kineto trace is joined by category with the errors worked out by hand") {
    // Errors (predicted - measured) / measured: gemm 400 vs 402.5, grouped_gemm 250 vs 200 (+25%), attention
    // 0, memory_bound 50 vs 60, comm 300 vs 320 (-6.25%), exposed comm 180 vs 170, step 1000 vs 1050 µs.
    const TempReport p("compare_trace_p", small_prediction());
    const Run r = run_cli("compare " + p.quoted() + " " + kKinetoTrace + " --json");
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    const json c = json::parse(r.out);
    CHECK(c["measured"]["kind"] == "chrome_trace");
    CHECK(c["measured"]["dialect"] == "kineto");
    CHECK(c["measured"]["device"] == 0);
    CHECK(c["measured"]["steps"] == 2);
    CHECK(c["measured"]["step_time_s"].get<double>() == doctest::Approx(1050e-6));
    CHECK(c["end_to_end_error"].get<double>() == doctest::Approx(-50.0 / 1050));
    std::map<std::string, json> rows;
    for (const json& x : c["categories"]) rows[x["category"].get<std::string>()] = x;
    CHECK(rows.size() == 6);
    CHECK(rows["gemm"]["error"].get<double>() == doctest::Approx(-2.5 / 402.5));
    CHECK(rows["grouped_gemm"]["error"].get<double>() == doctest::Approx(0.25));
    CHECK(rows["attention"]["error"].get<double>() == doctest::Approx(0.0));
    CHECK(rows["memory_bound"]["error"].get<double>() == doctest::Approx(-1.0 / 6));
    CHECK(rows["comm"]["error"].get<double>() == doctest::Approx(-0.0625));
    CHECK(rows["other"]["predicted_s"].is_null());
    CHECK(c["exposed_comm"]["error"].get<double>() == doctest::Approx(10.0 / 170));
    CHECK(c["idle_share"]["predicted"].get<double>() == doctest::Approx(0.1));
    CHECK(c["idle_share"]["measured"].get<double>() == doctest::Approx(215.0 / 2100));
    CHECK(c["notes"].size() == 1);

    const Run text = run_cli("compare " + p.quoted() + " " + kKinetoTrace);
    CHECK(text.exit_code == 0);
    CHECK(text.out.find("end-to-end error of step time: -4.8%") != std::string::npos);
    CHECK(text.out.find("comm                              0.00030      0.00032    -6.3%") !=
          std::string::npos);
    CHECK(text.out.find("one category 'comm'") != std::string::npos);
    CHECK(text.out.find("idle (no kernel running)") != std::string::npos);

    // Device 1 ran one GEMM [1000, 1500) µs: 250 µs per step of the 2 kept steps.
    const Run d1 = run_cli("compare " + p.quoted() + " " + kKinetoTrace + " --device 1 --json");
    REQUIRE_MESSAGE(d1.exit_code == 0, d1.err);
    for (const json& x : json::parse(d1.out)["categories"]) {
      if (x["category"] == "gemm") CHECK(x["measured_s"].get<double>() == doctest::Approx(250e-6));
    }
  }

  TEST_CASE("a prediction against its own simulated trace has no error in any category") {
    // `simulate --trace` writes the predicted timeline as a moerun-dialect Chrome trace (one step, ops by
    // stage and stream, communication with its group): joined back, each category's union equals its op
    // seconds and the exposed communication equals the breakdown's, up to the trace's rounding of times to 1
    // ns.
    std::string text = kPlan;
    const std::string dir = MOEPLAN_SOURCE_DIR;
    for (const std::string rel : {"models/", "hwprofiles/"}) {
      const auto at = text.find("\"" + rel);
      text.replace(at + 1, rel.size(), dir + "/" + rel);
    }
    TempPlan plan("compare_trace_plan", text);
    const TempReport trace("compare_sim_trace", json::object());
    const Run sim = run_cli("simulate " + plan.quoted() + " --json --trace " + trace.quoted());
    REQUIRE(sim.exit_code == 0);
    const TempReport p("compare_sim_p", json::parse(sim.out));
    const Run r = run_cli("compare " + p.quoted() + " " + trace.quoted() + " --json");
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    const json c = json::parse(r.out);
    CHECK(c["measured"]["dialect"] == "moerun");
    CHECK(c["comm_groups_known"] == true);
    // The kernel span misses only the host's issue time before the first op: where the trace's window
    // starts (3 µs of a ~2 ms step on the moerun stack).
    const double missed =
        c["predicted"]["step_time_s"].get<double>() - c["measured"]["step_time_s"].get<double>();
    CHECK(c["measured"]["window_s"][0].get<double>() > 0);
    CHECK(missed == doctest::Approx(c["measured"]["window_s"][0].get<double>()).epsilon(1e-3));
    CHECK(std::abs(c["end_to_end_error"].get<double>()) < 2e-3);
    bool ep = false;
    for (const json& x : c["categories"]) {
      ep = ep || x["category"] == "comm_ep";
      if (x["measured_s"].get<double>() > 0) CHECK(std::abs(x["error"].get<double>()) < 1e-3);
    }
    CHECK(ep);
    CHECK(std::abs(c["exposed_comm"]["error"].get<double>()) < 1e-3);
  }

  TEST_CASE("a bad trace or a bad trace option exits 2 with one line naming the file") {
    const TempReport p("compare_trace_bad_p", small_prediction());
    const TempReport neither("compare_trace_neither", json{{"hidden_size", 1024}});
    const TempReport no_kernels("compare_trace_no_kernels", json::parse(R"({"traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 5}]})"));
    struct Case {
      std::string args, expected;
    };
    const std::vector<Case> cases = {
        {p.quoted() + " " + kKinetoTrace + " --device 5",
         "kineto_moe_steps.json: no kernels on device 5 (devices with kernels: 0, 1)"},
        {p.quoted() + " tests/simulator/calibrate/stack/data/kineto_truncated.json",
         "kineto_truncated.json: line 8, column 72: the JSON ends early"},
        {p.quoted() + " " + neither.quoted(),
         "not a moeplan report (no step_time_s, ops or breakdown) nor a Chrome trace"},
        {p.quoted() + " " + no_kernels.quoted(), "compare_trace_no_kernels_"},
        {std::string(kKinetoTrace) + " " + p.quoted(),
         "kineto_moe_steps.json: a Chrome trace, not a moeplan report"},
        {p.quoted() + " " + kKinetoTrace + " --steps 0", "--steps"},
    };
    for (const Case& x : cases) {
      CAPTURE(x.args);
      const Run r = run_cli("compare " + x.args);
      CHECK(r.exit_code == 2);
      CHECK(lines(r.err) == 1);
      CHECK(r.err.find(x.expected) != std::string::npos);
      CHECK(r.out.empty());
    }
    const Run nk = run_cli("compare " + p.quoted() + " " + no_kernels.quoted());
    CHECK(nk.err.find("no GPU kernel events") != std::string::npos);
  }
}
