// `moeplan explain` as a user meets it: six cumulative rows whose last one is `simulate`'s prediction of the
// same plan, the --json shape, exit 2 with one line for bad files and exit 3 for an illegal plan.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/planner/cli/run_moeplan.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using namespace moeplan::test;  // Run, run_cli, lines, TempPlan

// Mixtral-8x7B on 4 nodes with Ulysses attention, EP, two stages, inter-operator overlap and selective
// recompute: a few seconds of simulation for the six rows.
constexpr const char* kPlan =
    R"({"model": "mixtral-8x7b", "hardware": "h100-sxm", "stack": "moerun", "gpus": 32, "seq_len": 4096,
  "global_batch": 32, "attention": {"tp": 1, "sp": 2}, "experts": {"ep": 8}, "pipeline": {"pp": 2},
  "overlap": {"inter_op": true, "dp_comm": true, "pp_comm": true}, "recompute": "sar"})";

}  // namespace

TEST_SUITE("cli") {
  TEST_CASE("explain --json prints six rows and its last row is what simulate predicts for the plan") {
    const TempPlan plan("moeplan_explain_json", kPlan);
    const Run r = run_cli("explain --json " + plan.quoted());
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    CHECK(r.err.empty());
    const json j = json::parse(r.out);
    REQUIRE(j.is_object());
    CHECK(j.at("valid") == true);
    const json& rows = j.at("rows");
    REQUIRE(rows.size() == 6);
    for (const char* key :
         {"row", "technique", "in_plan", "note", "layout", "plan", "valid", "reason", "step_time_s",
          "tokens_per_s", "tokens_per_s_per_gpu", "mfu", "memory_per_gpu_bytes", "memory_fits",
          "exposed_comm_s", "comm_removed_s", "bubble_s", "hypothetical", "why_hypothetical"}) {
      CAPTURE(key);
      for (const json& row : rows) CHECK(row.contains(key));
    }
    CHECK(rows[0].at("plan").at("experts").at("ep") == 1);
    CHECK(rows[0].at("plan").at("overlap").at("inter_op") == false);
    CHECK(rows[0].at("comm_removed_s").is_null());
    CHECK(rows[3].at("in_plan") == false);  // no intra-operator overlap in this plan
    CHECK(rows[4].at("in_plan") == false);  // nor compression
    CHECK(rows[5].at("plan") == j.at("plan"));

    const Run sim = run_cli("simulate --json " + plan.quoted());
    REQUIRE(sim.exit_code == 0);
    const json s = json::parse(sim.out);
    CHECK(rows[5].at("step_time_s").get<double>() == s.at("step_time_s").get<double>());
    CHECK(rows[5].at("tokens_per_s").get<double>() == s.at("tokens_per_s").get<double>());
    // The moerun stack's overlaps are design targets: the rows that use them say so, as simulate does.
    CHECK(rows[0].at("hypothetical") == false);
    CHECK(rows[5].at("hypothetical") == s.at("provenance").at("hypothetical"));
    CHECK(rows[5].at("hypothetical") == true);
    CHECK(rows[5].at("why_hypothetical") == s.at("provenance").at("why_hypothetical"));
  }

  TEST_CASE("explain marks the rows that credit the stack's targets and lists why under the table") {
    const TempPlan plan("moeplan_explain_hypothetical", kPlan);
    const Run r = run_cli("explain " + plan.quoted());
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    size_t marked = 0;
    std::istringstream out(r.out);
    for (std::string l; std::getline(out, l);) {
      if (l.find("+ inter-operator overlap") != std::string::npos) CHECK(l.find("HYPOTHETICAL") != l.npos);
      if (l.find("baseline:") != std::string::npos) CHECK(l.find("HYPOTHETICAL") == l.npos);
      marked += l.find("  HYPOTHETICAL") != std::string::npos ? 1 : 0;
    }
    CHECK(marked >= 1);
    CHECK(
        r.out.find("HYPOTHETICAL: these predictions credit capabilities the moerun stack has not measured") !=
        std::string::npos);
    CHECK(r.out.find("overlap.inter_op is a target of stack moerun") != std::string::npos);
  }

  TEST_CASE("explain prints a table with one line per technique and marks those the plan does not use") {
    const TempPlan plan("moeplan_explain_text", kPlan);
    const Run r = run_cli("explain " + plan.quoted());
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    CHECK(r.out.find("baseline: TP attention + TP experts, no overlap") != std::string::npos);
    CHECK(r.out.find("+ intra-operator overlap (not in plan)") != std::string::npos);
    CHECK(r.out.find("+ selective recompute") != std::string::npos);
    CHECK(r.out.find("(not in plan)", r.out.find("+ selective recompute")) == std::string::npos);
    // Memory in GiB, as `plan` prints it, with the fits column explained.
    CHECK(r.out.find("mem GiB") != std::string::npos);
    CHECK(r.out.find("mem GB") == std::string::npos);
    CHECK(r.out.find("fits: yes, tight") != std::string::npos);
  }

  TEST_CASE("explain exits 2 with one line for a missing or malformed plan file, 3 for an illegal plan") {
    const Run missing = run_cli("explain /nonexistent/plan.json");
    CHECK(missing.exit_code == 2);
    CHECK(lines(missing.err) == 1);
    CHECK(missing.out.empty());

    const TempPlan typo("moeplan_explain_typo",
                        R"({"model": "mixtral-8x7b", "hardware": "h100-sxm", "gpus": 8, "seq_len": 4096,
                            "global_batch": 8, "experts": {"epp": 8}})");
    const Run bad = run_cli("explain " + typo.quoted());
    CHECK(bad.exit_code == 2);
    CHECK(lines(bad.err) == 1);
    CHECK(bad.err.find("epp") != std::string::npos);

    const TempPlan illegal("moeplan_explain_illegal",
                           R"({"model": "mixtral-8x7b", "hardware": "h100-sxm", "gpus": 8, "seq_len": 4096,
                               "global_batch": 8, "attention": {"tp": 3}})");
    const Run ill = run_cli("explain --json " + illegal.quoted());
    CHECK(ill.exit_code == 3);
    const json j = json::parse(ill.out);
    CHECK(j.at("valid") == false);
    CHECK(j.at("violations").size() >= 1);

    const Run no_arg = run_cli("explain");
    CHECK(no_arg.exit_code == 2);
    CHECK(lines(no_arg.err) == 1);
  }
}
