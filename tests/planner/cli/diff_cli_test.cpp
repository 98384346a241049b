// `moeplan diff` as a user meets it: two plans by field, --simulate and two reports by category, and one
// line with exit 2 for inputs of different kinds.
#include <doctest/doctest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "tests/planner/cli/run_moeplan.h"

using nlohmann::json;

namespace {

using namespace moeplan::test;  // Run, run_cli, lines, TempPlan

constexpr const char* kA = R"({"model": "tiny-moe", "hardware": "h100-sxm", "gpus": 8, "seq_len": 512,
  "global_batch": 8, "experts": {"ep": 4}, "pipeline": {"pp": 2}})";
constexpr const char* kB = R"({"model": "tiny-moe", "hardware": "h100-sxm", "gpus": 8, "seq_len": 512,
  "global_batch": 8, "experts": {"ep": 2}, "pipeline": {"pp": 2}, "recompute": "selective"})";

}  // namespace

TEST_SUITE("cli") {
  TEST_CASE("diff of two plans lists the differing fields, with defaults filled in") {
    const TempPlan a("moeplan_diff_a", kA), b("moeplan_diff_b", kB);
    const Run r = run_cli("diff " + a.quoted() + " " + b.quoted() + " --json");
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    const json j = json::parse(r.out);
    CHECK(j.at("kind") == "plans");
    CHECK(j.at("figures").is_null());
    std::vector<std::string> keys;
    for (const auto& f : j.at("plan_fields")) keys.push_back(f.at("key"));
    CHECK(keys == std::vector<std::string>{"experts.ep", "recompute"});
    const Run same = run_cli("diff " + a.quoted() + " " + a.quoted());
    CHECK(same.exit_code == 0);
    CHECK(same.out.find("plans: identical") != std::string::npos);
  }

  TEST_CASE("diff --simulate and diff of two reports give the same figures, by breakdown category") {
    const TempPlan a("moeplan_diff_sa", kA), b("moeplan_diff_sb", kB);
    const Run r = run_cli("diff --simulate " + a.quoted() + " " + b.quoted() + " --json");
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    const json j = json::parse(r.out);
    const Run sa = run_cli("simulate --json " + a.quoted()), sb = run_cli("simulate --json " + b.quoted());
    REQUIRE(sa.exit_code == 0);
    REQUIRE(sb.exit_code == 0);
    const TempPlan ra("moeplan_diff_ra", sa.out), rb("moeplan_diff_rb", sb.out);
    const Run rr = run_cli("diff " + ra.quoted() + " " + rb.quoted() + " --json");
    REQUIRE_MESSAGE(rr.exit_code == 0, rr.err);
    const json jr = json::parse(rr.out);
    CHECK(jr.at("kind") == "reports");
    CHECK(jr.at("figures") == j.at("figures"));
    CHECK(jr.at("plan_fields") == j.at("plan_fields"));
    bool grouped = false;
    for (const auto& f : j.at("figures")) {
      if (f.at("key") == "step_time_s") {
        CHECK(f.at("a").get<double>() == json::parse(sa.out).at("step_time_s").get<double>());
        CHECK(f.at("b").get<double>() == json::parse(sb.out).at("step_time_s").get<double>());
      }
      grouped = grouped || f.at("key") == "breakdown.compute.grouped_gemm";
    }
    CHECK(grouped);
    const Run text = run_cli("diff " + ra.quoted() + " " + rb.quoted());
    CHECK(text.out.find("breakdown.compute.grouped_gemm") != std::string::npos);
  }

  TEST_CASE("diff --simulate says which side's prediction is hypothetical, and why") {
    // B on the moerun stack with its overlaps, which that stack has only as design targets.
    const std::string b_plan = std::string(kA).substr(0, std::string(kA).size() - 1) +
                               R"(, "stack": "moerun", "overlap": {"inter_op": true}})";
    const TempPlan a("moeplan_diff_ha", kA), b("moeplan_diff_hb", b_plan);
    const Run r = run_cli("diff --simulate " + a.quoted() + " " + b.quoted() + " --json");
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    const json j = json::parse(r.out);
    CHECK(j.at("hypothetical").at("a") == false);
    CHECK(j.at("hypothetical").at("b") == true);
    const Run text = run_cli("diff --simulate " + a.quoted() + " " + b.quoted());
    REQUIRE(text.exit_code == 0);
    CHECK(text.out.find("HYPOTHETICAL (A)") == std::string::npos);
    CHECK(text.out.find("HYPOTHETICAL (B): its prediction credits capabilities") != std::string::npos);
    CHECK(text.out.find("overlap.inter_op is a target of stack moerun") != std::string::npos);
    const Run plans = run_cli("diff " + a.quoted() + " " + b.quoted() + " --json");
    REQUIRE(plans.exit_code == 0);
    CHECK(json::parse(plans.out).at("hypothetical").is_null());  // plans alone are not predicted
    // A report edited by hand, its provenance not an object: not hypothetical, and no crash.
    const Run sb = run_cli("simulate --json " + b.quoted());
    REQUIRE(sb.exit_code == 0);
    json edited = json::parse(sb.out);
    edited["provenance"] = 5;
    const TempPlan rb("moeplan_diff_hrb", sb.out), re("moeplan_diff_hre", edited.dump());
    const Run odd = run_cli("diff " + rb.quoted() + " " + re.quoted() + " --json");
    REQUIRE_MESSAGE(odd.exit_code == 0, odd.err);
    CHECK(json::parse(odd.out).at("hypothetical") == json({{"a", true}, {"b", false}}));
  }

  TEST_CASE("diff of a plan and a report exits 2 with one line") {
    const TempPlan a("moeplan_diff_pa", kA);
    const Run s = run_cli("simulate --json " + a.quoted());
    const TempPlan r("moeplan_diff_pr", s.out);
    const Run d = run_cli("diff " + a.quoted() + " " + r.quoted());
    CHECK(d.exit_code == 2);
    CHECK(lines(d.err) == 1);
    CHECK(d.err.find("one is a report and the other a plan") != std::string::npos);
  }
}
