// `moeplan compare` as a user meets it: a prediction joined with itself has no error; a copy with a known
// change has the error and the top contributor the change implies; ops on one side only are listed; bad input
// exits 2 with one line.
#include <doctest/doctest.h>

#include "tests/planner/cli/run_moeplan.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

namespace {

using namespace moeplan::test;  // Run, run_cli, lines, TempPlan
using nlohmann::json;

// tiny-moe on 2 ranks with expert parallelism: every category (gemm, grouped_gemm, attention, memory-bound,
// ep and dp communication) has ops.
const char* kPlan = R"({"model": "models/tiny-moe.json", "hardware": "hwprofiles/h100-sxm.json", "gpus": 2,
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
}
