// `moeplan sweep` as a user meets it: CSV with a header and one line per value, the --json shape, re-planning
// per value, rows with reasons for values that leave nothing to run, and exit 2 with one line for unknown
// keys and malformed values.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/planner/cli/run_moeplan.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using namespace moeplan::test;  // Run, run_cli, lines, TempPlan

// tiny-moe on one node: two pipeline stages, EP over 4 GPUs, dp 4 (fast to simulate).
constexpr const char* kTinyPipeline = R"({"model": "tiny-moe", "hardware": "h100-sxm", "gpus": 8,
  "seq_len": 512, "global_batch": 8, "experts": {"ep": 4}, "pipeline": {"pp": 2}})";

// A small re-planning job: tiny-moe, short sequences, one precision, micro-batch and ZeRO stage.
constexpr const char* kTinyJob =
    "--model tiny-moe --hardware h100-sxm --seq-len 512 --global-batch 32 --precision bf16 "
    "--fix micro_batch=1 --fix data.zero=1";

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

std::vector<std::string> split_csv(const std::string& line) {
  std::vector<std::string> out;
  std::string cell;
  bool quoted = false;
  for (char c : line) {
    if (c == '"') {
      quoted = !quoted;
    } else if (c == ',' && !quoted) {
      out.push_back(cell);
      cell.clear();
    } else {
      cell += c;
    }
  }
  out.push_back(cell);
  return out;
}

}  // namespace

TEST_SUITE("cli") {
  TEST_CASE("sweep --plan --csv over the global batch prints a header and one line per value") {
    const TempPlan plan("moeplan_sweep_csv", kTinyPipeline);
    const Run r = run_cli("sweep --plan " + plan.quoted() + " --vary global_batch=8,16,32,6 --csv");
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    const std::vector<std::string> rows = split_lines(r.out);
    REQUIRE(rows.size() == 5);
    const std::vector<std::string> header = split_csv(rows[0]);
    CHECK(header.front() == "global_batch");
    CHECK(header.size() == 12);
    CHECK(header[2] == "tokens_per_s");
    CHECK(header[10] == "hypothetical");
    double last = 0;
    for (size_t i = 1; i <= 3; ++i) {
      const std::vector<std::string> cells = split_csv(rows[i]);
      REQUIRE(cells.size() == 12);
      const double tokens = std::stod(cells[2]);
      CHECK(tokens > last);  // the pipeline bubble amortises over more micro-batches
      last = tokens;
      CHECK(cells[10] == "false");  // Megatron-Core's numbers are not targets
      CHECK(cells.back().empty());
    }
    const std::vector<std::string> illegal = split_csv(rows[4]);
    REQUIRE(illegal.size() == 12);
    CHECK(illegal[0] == "6");
    CHECK(illegal[2].empty());
    CHECK(illegal.back().find("not divisible") != std::string::npos);
  }

  TEST_CASE("sweep --plan --json over NIC bandwidth has the vary key, the values and one row each") {
    const TempPlan plan("moeplan_sweep_json", kTinyPipeline);
    const Run r = run_cli("sweep --plan " + plan.quoted() + " --vary nic_bw=0.5,1,2 --json");
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    const json j = json::parse(r.out);
    CHECK(j.at("vary").at("key") == "nic_bw");
    CHECK(j.at("vary").at("values") == json::array({0.5, 1.0, 2.0}));
    CHECK(j.at("mode") == "fixed_plan");
    REQUIRE(j.at("rows").size() == 3);
    for (const json& row : j.at("rows")) {
      CHECK(row.at("reason").is_null());
      CHECK(row.at("plan").at("gpus") == 8);
      for (const char* key : {"step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "mfu",
                              "memory_per_gpu_bytes", "memory_fits", "exposed_comm_s", "bubble_s"}) {
        CHECK(row.at("predicted").contains(key));
      }
    }
  }

  TEST_CASE("sweep marks predictions that credit the stack's targets, in the table, CSV and JSON") {
    // The moerun stack has its overlaps only as design targets; this plan overlaps on its own streams.
    const TempPlan plan("moeplan_sweep_hypothetical",
                        R"({"model": "tiny-moe", "hardware": "h100-sxm", "stack": "moerun", "gpus": 8,
      "seq_len": 512, "global_batch": 8, "experts": {"ep": 4}, "pipeline": {"pp": 2},
      "overlap": {"inter_op": true}})");
    const std::string cmd = "sweep --plan " + plan.quoted() + " --vary global_batch=8,16";
    const Run text = run_cli(cmd);
    REQUIRE_MESSAGE(text.exit_code == 0, text.err);
    CHECK(text.out.find("(moerun stack, uncalibrated)") != std::string::npos);
    const std::vector<std::string> out = split_lines(text.out);
    CHECK(std::count_if(out.begin(), out.end(),
                        [](const std::string& l) { return l.ends_with("  HYPOTHETICAL"); }) == 2);
    CHECK(text.out.find(
              "HYPOTHETICAL: these predictions credit capabilities the moerun stack has not measured") !=
          std::string::npos);
    CHECK(text.out.find("overlap.inter_op is a target of stack moerun") != std::string::npos);

    const Run csv = run_cli(cmd + " --csv");
    REQUIRE(csv.exit_code == 0);
    const std::vector<std::string> rows = split_lines(csv.out);
    REQUIRE(rows.size() == 3);
    for (size_t i = 1; i < rows.size(); ++i) CHECK(split_csv(rows[i]).at(10) == "true");

    const Run js = run_cli(cmd + " --json");
    REQUIRE(js.exit_code == 0);
    for (const json& row : json::parse(js.out).at("rows")) {
      CHECK(row.at("predicted").at("hypothetical") == true);
      CHECK_FALSE(row.at("predicted").at("why_hypothetical").empty());
    }
  }

  TEST_CASE("sweep --plan over pipeline.pp and pipeline.vpp re-derives the layer split and the schedule") {
    // tiny-moe has 4 layers: pp 1, 2 and 4 divide them evenly.
    const TempPlan plan("moeplan_sweep_pp", kTinyPipeline);
    const Run r = run_cli("sweep --plan " + plan.quoted() + " --vary pipeline.pp=1,2,4 --json");
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    for (const json& row : json::parse(r.out).at("rows")) {
      CHECK_MESSAGE(row.at("reason").is_null(), row.dump());
      CHECK(!row.at("plan").at("pipeline").contains("layers_per_stage"));
    }
    // Mixtral-8x7B's 32 layers over pp 2 x vpp 3 = 6 chunks: uneven, split with smaller first and last
    // chunks.
    const TempPlan mixtral("moeplan_sweep_vpp",
                           R"({"model": "mixtral-8x7b", "hardware": "h100-sxm", "gpus": 16,
      "seq_len": 4096, "global_batch": 64, "experts": {"ep": 8}, "attention": {"tp": 2}, "pipeline": {"pp": 2}})");
    const Run v = run_cli("sweep --plan " + mixtral.quoted() + " --vary pipeline.vpp=1,3 --json");
    REQUIRE_MESSAGE(v.exit_code == 0, v.err);
    const json rows = json::parse(v.out).at("rows");
    REQUIRE(rows.size() == 2);
    CHECK(rows[0].at("plan").at("pipeline").at("schedule") == "1f1b");
    CHECK_MESSAGE(rows[1].at("reason").is_null(), rows[1].dump());
    CHECK(rows[1].at("plan").at("pipeline").at("schedule") == "interleaved_1f1b");
    CHECK(rows[1].at("plan").at("pipeline").at("layers_per_stage") == json::array({5, 6, 6, 5, 5, 5}));
  }

  TEST_CASE("sweep over gpus without a plan re-plans each value") {
    const Run r = run_cli(std::string("sweep ") + kTinyJob + " --vary gpus=8,16 --json");
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    const json j = json::parse(r.out);
    CHECK(j.at("mode") == "replan");
    REQUIRE(j.at("rows").size() == 2);
    CHECK(j.at("rows")[0].at("plan").at("gpus") == 8);
    CHECK(j.at("rows")[1].at("plan").at("gpus") == 16);
    CHECK(j.at("rows")[1].at("plan").at("model") == "tiny-moe");
    CHECK(j.at("rows")[1].at("predicted").at("memory_fits") == true);
    CHECK(j.at("rows")[0].at("scaling_efficiency") == 1.0);
    const double e = j.at("rows")[1].at("predicted").at("tokens_per_s_per_gpu").get<double>() /
                     j.at("rows")[0].at("predicted").at("tokens_per_s_per_gpu").get<double>();
    CHECK(j.at("rows")[1].at("scaling_efficiency").get<double>() == doctest::Approx(e));
    CHECK(j.at("knee").at("threshold") == 0.8);
    const Run text = run_cli(std::string("sweep ") + kTinyJob + " --vary gpus=8,16");
    CHECK(text.out.find("scaling (tokens/s per GPU against the first row): 8 GPUs 100%") !=
          std::string::npos);
  }

  TEST_CASE("sweep with a value that leaves no plan prints a row with the reason and exits 0") {
    const Run r = run_cli(std::string("sweep ") + kTinyJob + " --gpus 8 --vary experts.ep=3,4");
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    const std::vector<std::string> rows = split_lines(r.out);
    bool saw_reason = false, saw_plan = false;
    for (const std::string& line : rows) {
      if (line.rfind("3 ", 0) == 0) {
        saw_reason = line.find("no plan in the search space has") != std::string::npos &&
                     line.find("experts.ep=3") != std::string::npos;
      }
      if (line.rfind("4 ", 0) == 0) saw_plan = line.find("ep4") != std::string::npos;
    }
    CHECK_MESSAGE(saw_reason, r.out);
    CHECK_MESSAGE(saw_plan, r.out);
  }

  TEST_CASE("sweep exits 2 with one line for an unknown key, a malformed value or conflicting options") {
    const Run typo = run_cli("sweep --vary nic_bwx=1,2");
    CHECK(typo.exit_code == 2);
    CHECK(lines(typo.err) == 1);
    CHECK(typo.err.find("did you mean 'nic_bw'") != std::string::npos);
    CHECK(typo.out.empty());

    for (const char* args :
         {"sweep --vary gpus=8,abc", "sweep --vary nic_bw=-1", "sweep --vary experts.ep=x",
          "sweep --vary gpus", "sweep", "sweep --vary gpus=8 --csv --json",
          "sweep --plan planner/examples/mixtral-8x22b-128xh100.json --gpus 8 --vary gpus=8",
          "sweep --plan /nonexistent/plan.json --vary gpus=8"}) {
      CAPTURE(args);
      const Run r = run_cli(args);
      CHECK(r.exit_code == 2);
      CHECK(lines(r.err) == 1);
    }
  }
}
