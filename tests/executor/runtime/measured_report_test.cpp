// Tests of the measured report (executor/runtime/measured_report.h): predicted keys, measured extras, a
// breakdown that adds up, and the op summary's join keys.
#include "executor/runtime/measured_report.h"

#include <doctest/doctest.h>

#include <set>
#include <string>
#include <tuple>

#include "executor/runtime/stage_executor.h"
#include "tests/executor/runtime/runtime_fixtures.h"

namespace moeplan::executor {
namespace {

class NullRunner final : public OpRunner {
 public:
  void run(const Op&) override {}
  void receive(const Op&) override {}
};

}  // namespace

TEST_SUITE("executor_runtime") {
  TEST_CASE("per-rank steps give the skew, the slowest rank and the stragglers over the median") {
    const nlohmann::json j = rank_skew_json({1.0, 1.02, 1.3, 0.98});
    CHECK(j["fastest_rank"] == 3);
    CHECK(j["slowest_rank"] == 2);
    CHECK(j["skew"].get<double>() == doctest::Approx(1.3 / 0.98));
    CHECK(j["median_step_s"].get<double>() == doctest::Approx(1.01));
    CHECK(j["stragglers"] == nlohmann::json::array({2}));  // 1.02 is within 5% of the median
    CHECK(rank_skew_json({2.0, 2.0})["stragglers"].empty());
    CHECK(rank_skew_json({2.0, 2.0})["skew"] == 1.0);
  }

  TEST_CASE(
      "op rows over every rank of their stage list the widest first, compute apart from communication, and "
      "leave out rows with no spread") {
    std::vector<OpSummaryRow> rows(4);
    const char* names[] = {"L0.qkv_proj", "L0.expert_fc13", "L0.dispatch_a2a", "L0.attn_core"};
    for (size_t i = 0; i < rows.size(); ++i) rows[i].op = names[i];
    rows[2].phase = Phase::kBackward;
    rows[2].comm = true;
    rows[3].stage = 1;
    const std::vector<OpRankSpread> spreads = {
        {.min_s = 1.0, .mean_s = 1.0, .max_s = 1.0, .fastest_rank = 0, .slowest_rank = 0},   // no spread
        {.min_s = 2.0, .mean_s = 2.5, .max_s = 3.0, .fastest_rank = 0, .slowest_rank = 1},   // 1 s
        {.min_s = 0.5, .mean_s = 1.5, .max_s = 2.5, .fastest_rank = 1, .slowest_rank = 0},   // 2 s
        {.min_s = 0.1, .mean_s = 0.3, .max_s = 0.5, .fastest_rank = 2, .slowest_rank = 3}};  // 0.4 s
    const nlohmann::json j = op_rank_skew_json(rows, spreads);
    const auto& w = j["compute"];
    REQUIRE(w.size() == 2);
    CHECK(w[0]["op"] == "L0.expert_fc13");
    CHECK(w[0]["spread_s"].get<double>() == doctest::Approx(1.0));
    CHECK(w[0]["ratio"].get<double>() == doctest::Approx(1.5));
    CHECK(w[0]["slowest_rank"] == 1);
    CHECK(w[0]["fastest_rank"] == 0);
    CHECK(w[1]["op"] == "L0.attn_core");
    CHECK(w[1]["stage"] == 1);
    CHECK(w[1]["slowest_rank"] == 3);
    // The all-to-all is communication: listed apart.
    const auto& c = j["communication"];
    REQUIRE(c.size() == 1);
    CHECK(c[0]["op"] == "L0.dispatch_a2a");
    CHECK(c[0]["phase"] == "bwd");
    CHECK(c[0]["spread_s"].get<double>() == doctest::Approx(2.0));
    CHECK(c[0]["ratio"].get<double>() == doctest::Approx(5.0));
    CHECK(op_rank_skew_json(rows, spreads, 1)["compute"].size() == 1);
  }

  TEST_CASE(
      "the measured report carries the predicted keys, every step and ops joinable by stage op and phase") {
    const RunInputs in = test::load_tiny("report_pp2", test::tiny_plan(2, test::kPp2));
    NullRunner runner;
    MeasuredRun run;
    run.warmup = 1;
    run.ops.assign(in.graph.ops.size(), {});
    for (int stage = 0; stage < 2; ++stage) {
      const StageSchedule s = schedule_stage(in.graph, stage);
      StageExecutor ex(in.graph, s, runner, stage);
      const StepTiming t = ex.run_step();
      for (const Op& op : in.graph.ops) {
        if (op.stage == stage) run.ops[static_cast<size_t>(op.id)] = t.ops[static_cast<size_t>(op.id)];
      }
      run.step_times_s.push_back(t.span_s + 0.5);
    }
    run.representative_ranks = {0, 1};
    run.high_water_bytes = process_high_water_bytes();
    const nlohmann::json j = measured_report_json(in, run);
    for (const char* key : {"step_time_s", "tokens_per_step", "tokens_per_s", "tokens_per_s_per_gpu", "mfu",
                            "memory", "breakdown", "ops", "step_times_s", "steps", "warmup"})
      CHECK_MESSAGE(j.contains(key), key);
    CHECK(j["measured"] == true);
    CHECK(j["steps"] == 2);
    CHECK(j["step_time_s"].get<double>() > 0.5);
    CHECK(j["tokens_per_step"].get<double>() == 4.0 * 256);
    CHECK(j["memory"]["per_gpu_bytes"].get<double>() > 0);
    std::set<std::tuple<int, std::string, std::string>> keys;
    for (const auto& o : j["ops"])
      CHECK(keys.insert({o["stage"].get<int>(), o["op"].get<std::string>(), o["phase"].get<std::string>()})
                .second);
    CHECK(keys.size() == j["ops"].size());
    // The breakdown accounts for the whole step.
    const auto& b = j["breakdown"];
    double sum = b["bubble"].get<double>() + b["optimizer"].get<double>();
    for (const auto& [k, v] : b["compute"].items()) sum += v.get<double>();
    for (const auto& [k, v] : b["exposed_comm"].items()) sum += v.get<double>();
    CHECK(sum == doctest::Approx(j["step_time_s"].get<double>()).epsilon(1e-6));
    // Not gathered: no op row carries its ranks.
    CHECK(!j.contains("op_rank_skew"));
    CHECK(!j["ops"][0].contains("ranks"));
    // Gathered: each op row carries its row of every rank, in the summary's order.
    const std::vector<OpSummaryRow> rows = op_summary(in.graph, run.ops);
    MeasuredRun spread = run;
    for (const OpSummaryRow& r : rows)
      spread.op_ranks.push_back({.min_s = r.total_s,
                                 .mean_s = r.total_s * 1.5,
                                 .max_s = r.total_s * 2,
                                 .fastest_rank = r.stage,
                                 .slowest_rank = r.stage + 2});
    const nlohmann::json k = measured_report_json(in, spread);
    REQUIRE(k["ops"].size() == rows.size());
    for (size_t i = 0; i < rows.size(); ++i) {
      CHECK(k["ops"][i]["op"] == rows[i].op);
      CHECK(k["ops"][i]["ranks"]["max_s"].get<double>() == doctest::Approx(2 * rows[i].total_s));
      CHECK(k["ops"][i]["ranks"]["slowest_rank"] == rows[i].stage + 2);
    }
    CHECK(k["op_rank_skew"]["compute"].size() + k["op_rank_skew"]["communication"].size() <= 10);
    CHECK(!k["op_rank_skew"]["compute"].empty());

    // What ran says what the hardware, stack and memory figure are: host memory on CPU ranks, the replay's
    // device memory on the CUDA backend.
    CHECK(j["hardware"].get<std::string>().rfind("cpu (moerun, cpu backend", 0) == 0);
    CHECK(j["stack"] == "moerun-cpu-replay");
    CHECK(j["memory"]["source"].get<std::string>().find("VmHWM") != std::string::npos);
    run.backend = "cuda";
    const nlohmann::json g = measured_report_json(in, run);
    CHECK(g["hardware"].get<std::string>().rfind("gpu (moerun, cuda backend", 0) == 0);
    CHECK(g["stack"] == "moerun");
    CHECK(g["memory"]["source"].get<std::string>().find("device memory") != std::string::npos);
  }
}

}  // namespace moeplan::executor
