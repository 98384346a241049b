// `moeplan simulate` as a user meets it: the --json report contract of DESIGN.md on every shipped example,
// exit 3 for illegal and non-fitting plans and for plans the stack cannot run (and no trace for an illegal
// one), the Chrome trace's structure, and exit 2 with one line for bad arguments.
#include <doctest/doctest.h>

#include "tests/planner/cli/run_moeplan.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using namespace moeplan::test;  // Run, slurp, run_cli, lines

// A fresh directory under the system temp dir, removed when the test case ends.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& name)
      : path(fs::temp_directory_path() / (name + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

std::vector<fs::path> example_plans() {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(fs::path(MOEPLAN_SOURCE_DIR) / "planner" / "examples")) {
    if (e.path().extension() == ".json") out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

double sum_values(const json& object) {
  double s = 0;
  for (const auto& [k, v] : object.items()) s += v.get<double>();
  return s;
}

}  // namespace

TEST_SUITE("cli") {
  TEST_CASE(
      "simulate --json on every example plan prints the contract's keys and a breakdown that sums to the "
      "step time") {
    const auto plans = example_plans();
    CHECK(plans.size() >= 3);
    for (const auto& plan : plans) {
      CAPTURE(plan.string());
      const Run r = run_cli("simulate --json '" + plan.string() + "'");
      // 0, or 3 only when the plan does not fit; the reason is then on stderr.
      REQUIRE((r.exit_code == 0 || r.exit_code == 3));
      if (r.exit_code == 3) {
        CHECK_MESSAGE(r.err.find("does not fit") != std::string::npos, r.err);
      } else {
        CHECK(r.err.empty());
      }
      const json j = json::parse(r.out);  // throws on anything but one JSON value
      REQUIRE(j.is_object());
      CHECK(j.at("valid") == true);

      const double step = j.at("step_time_s").get<double>();
      const double tps = j.at("tokens_per_s").get<double>();
      CHECK(step > 0);
      CHECK(tps > 0);
      // tokens/s/GPU x GPUs = tokens/s
      CHECK(j.at("tokens_per_s_per_gpu").get<double>() * j.at("gpus").get<double>() == doctest::Approx(tps));
      CHECK(j.at("mfu").get<double>() > 0);
      CHECK(j.at("mfu").get<double>() <= 1);

      const json& memory = j.at("memory");
      CHECK(memory.at("per_gpu_bytes").get<double>() > 0);
      REQUIRE(memory.at("fits").is_boolean());
      CHECK(memory.at("fits").get<bool>() == (r.exit_code == 0));

      const json& range = j.at("tokens_per_s_range");
      REQUIRE(range.is_array());
      REQUIRE(range.size() == 2);
      CHECK(range[0].get<double>() <= tps);
      CHECK(tps <= range[1].get<double>());

      const json& extrapolations = j.at("extrapolations");
      REQUIRE(extrapolations.is_array());
      for (const auto& e : extrapolations) CHECK(e.is_string());

      // step_time_s = sum(compute) + sum(exposed_comm) + bubble + optimizer
      const json& b = j.at("breakdown");
      REQUIRE(b.at("compute").is_object());
      REQUIRE(b.at("exposed_comm").is_object());
      const double parts = sum_values(b.at("compute")) + sum_values(b.at("exposed_comm")) +
                           b.at("bubble").get<double>() + b.at("optimizer").get<double>();
      CHECK(parts == doctest::Approx(step).epsilon(1e-6));
    }
  }

  // The plans executor/cuda/device_check.sh replays and compares on a lent GPU: a broken one would only show
  // there, after device time is spent.
  TEST_CASE("every plan the device check replays simulates as a legal plan that fits") {
    int plans = 0;
    for (const auto& e : fs::directory_iterator(fs::path(MOEPLAN_SOURCE_DIR) / "executor/cuda")) {
      const std::string name = e.path().filename().string();
      if (name.rfind("device_plan", 0) != 0 || e.path().extension() != ".json") continue;
      CAPTURE(name);
      ++plans;
      const Run r = run_cli("simulate executor/cuda/" + name + " --json");
      REQUIRE_MESSAGE(r.exit_code == 0, r.err);
      const json j = json::parse(r.out);
      CHECK(j.at("valid") == true);
      CHECK(j.at("memory").at("fits") == true);
    }
    CHECK(plans >= 4);  // unfused, fused, FP8 and two-stage plans
  }

  TEST_CASE("simulate's MFU names its peak: the plan's precision, and BF16's beside an FP8 one") {
    const Run bf16 = run_cli("simulate planner/examples/mixtral-8x22b-128xh100.json");
    REQUIRE(bf16.exit_code == 0);
    CHECK(bf16.out.find("% of the BF16 peak\n") != std::string::npos);
    const std::string root = MOEPLAN_SOURCE_DIR;
    const TempPlan fp8_plan("simulate_fp8", R"({"model": ")" + root + R"(/models/mixtral-8x22b.json",
        "hardware": "h100-sxm", "stack": "megatron-core", "gpus": 128, "seq_len": 4096, "global_batch": 256,
        "micro_batch": 1, "attention": {"tp": 2}, "experts": {"ep": 8}, "pipeline": {"pp": 8},
        "precision": "fp8", "fp8_recipe": "tensorwise"})");
    const Run fp8 = run_cli("simulate " + fp8_plan.quoted());
    REQUIRE_MESSAGE(fp8.exit_code == 0, fp8.err);
    CHECK(fp8.out.find("% of the FP8 peak, ") != std::string::npos);
    CHECK(fp8.out.find("% of the BF16 peak\n") != std::string::npos);
  }

  TEST_CASE("the host-bound line shows where the breakdown's precision shows it and never as zero") {
    // The shipped examples: DeepSeek-V3 waits 0.38 s for its host; the others a few microseconds, which the
    // four-decimal breakdown would print as 0.0000.
    int shown = 0;
    for (const fs::path& plan : example_plans()) {
      CAPTURE(plan.string());
      const Run text = run_cli("simulate --no-assumptions " + plan.string());
      const Run js = run_cli("simulate --no-assumptions --json " + plan.string());
      REQUIRE(text.exit_code == 0);
      REQUIRE(js.exit_code == 0);
      const double wait = json::parse(js.out).at("breakdown").at("host_wait").get<double>();
      const size_t at = text.out.find("    of which host-bound ");
      CHECK((at != std::string::npos) == (wait >= 0.5e-4));
      if (at == std::string::npos) continue;
      ++shown;
      const double printed = std::stod(text.out.substr(at + 24, 12));
      CHECK(printed > 0);
      CHECK(printed == doctest::Approx(wait).epsilon(1e-3));
    }
    CHECK(shown >= 1);
  }

  TEST_CASE("a plan's CUDA graphs are named under the breakdown, and the plan file keeps them") {
    TempDir dir("moeplan_simulate_graphs");
    json plan =
        json::parse(slurp(fs::path(MOEPLAN_SOURCE_DIR) / "planner/examples/mixtral-8x22b-128xh100.json"));
    plan["stack"] = "megatron-core";
    plan["model"] = "mixtral-8x22b";
    plan["hardware"] = "h100-sxm";
    const Run eager_run = [&] {
      std::ofstream(dir.file("eager.json")) << plan.dump();
      return run_cli("simulate --no-assumptions " + dir.file("eager.json"));
    }();
    plan["cuda_graphs"] = {"attn", "moe_router"};
    std::ofstream(dir.file("graphed.json")) << plan.dump();
    const Run text = run_cli("simulate --no-assumptions " + dir.file("graphed.json"));
    const Run js = run_cli("simulate --no-assumptions --json " + dir.file("graphed.json"));
    REQUIRE_MESSAGE(text.exit_code == 0, text.err);
    REQUIRE(eager_run.exit_code == 0);
    CHECK(text.out.find("CUDA graphs per layer (attn, moe_router)") != std::string::npos);
    CHECK(eager_run.out.find("CUDA graphs") == std::string::npos);
    CHECK(json::parse(js.out).at("plan").at("cuda_graphs") == json::array({"attn", "moe_router"}));
  }

  TEST_CASE("simulate gives the step over the unmeasured numbers, and --no-assumptions skips it") {
    const std::string plan = "planner/examples/mixtral-8x22b-128xh100.json";
    const Run text = run_cli("simulate " + plan);
    REQUIRE(text.exit_code == 0);
    CHECK(text.out.find(
              "over the stack's and the hardware's unmeasured numbers (each at either end of its stated "
              "range): step ") != std::string::npos);
    const Run js = run_cli("simulate --json " + plan);
    REQUIRE(js.exit_code == 0);
    const json j = json::parse(js.out);
    const json& a = j.at("assumptions");
    const double step = j.at("step_time_s").get<double>();
    CHECK(a.at("step_time_s_range").at(0).get<double>() <= step);
    CHECK(a.at("step_time_s_range").at(1).get<double>() >= step);
    REQUIRE_FALSE(a.at("numbers").empty());
    for (const json& n : a.at("numbers")) {
      CAPTURE(n.dump());
      CHECK(n.at("range").at(0).get<double>() <= n.at("value").get<double>());
      CHECK(n.at("value").get<double>() <= n.at("range").at(1).get<double>());
      for (const json& s : n.at("step_time_s_at_ends")) {
        CHECK(s.get<double>() >= a.at("step_time_s_range").at(0).get<double>());
        CHECK(s.get<double>() <= a.at("step_time_s_range").at(1).get<double>());
      }
    }
    const Run skip = run_cli("simulate --json --no-assumptions " + plan);
    REQUIRE(skip.exit_code == 0);
    CHECK_FALSE(json::parse(skip.out).contains("assumptions"));
    CHECK(json::parse(skip.out).at("step_time_s") == j.at("step_time_s"));
  }

  TEST_CASE("an illegal plan exits 3, prints its broken rules and writes no trace") {
    // mixtral-8x7b has 8 routed experts; ep 3 does not divide them.
    const TempDir dir("moeplan_simulate_illegal");
    std::ofstream(dir.file("illegal.json"))
        << R"({"model": "mixtral-8x7b", "hardware": "h100-sxm", "gpus": 48,
      "seq_len": 4096, "global_batch": 96, "attention": {"tp": 2}, "experts": {"ep": 3}, "pipeline": {"pp": 2}})";
    const std::string trace = dir.file("trace.json");

    const Run text = run_cli("simulate '" + dir.file("illegal.json") + "' --trace '" + trace + "'");
    CHECK(text.exit_code == 3);
    CHECK(text.out.find("cannot run") != std::string::npos);
    CHECK_MESSAGE(text.out.find("experts_divisible_by_ep") != std::string::npos, text.out);
    CHECK_FALSE(fs::exists(trace));
    CHECK_FALSE(fs::exists(trace + ".tmp"));

    const Run js = run_cli("simulate --json '" + dir.file("illegal.json") + "' --trace '" + trace + "'");
    CHECK(js.exit_code == 3);
    const json j = json::parse(js.out);
    CHECK(j.at("valid") == false);
    REQUIRE(j.at("violations").is_array());
    REQUIRE(!j.at("violations").empty());
    bool named = false;
    for (const auto& v : j.at("violations")) {
      CHECK(v.at("reason").is_string());
      named = named || v.at("rule") == "experts_divisible_by_ep";
    }
    CHECK(named);
    CHECK_FALSE(fs::exists(trace));
    CHECK_FALSE(fs::exists(trace + ".tmp"));
  }

  TEST_CASE("a plan that does not fit exits 3 with one stderr line naming the per-GPU memory") {
    // mixtral-8x22b (~141B parameters) on one node of 8 H100s with only ep 8 sharding the experts, no ZeRO
    // and no recompute: fp32 Adam states alone exceed 80 GiB per GPU.
    const TempDir dir("moeplan_simulate_no_fit");
    std::ofstream(dir.file("big.json")) << R"({"model": "mixtral-8x22b", "hardware": "h100-sxm", "gpus": 8,
      "seq_len": 4096, "global_batch": 64, "attention": {"tp": 1}, "experts": {"ep": 8}, "pipeline": {"pp": 1},
      "data": {"zero": 0}, "recompute": "none"})";

    const Run text = run_cli("simulate '" + dir.file("big.json") + "'");
    CHECK(text.exit_code == 3);
    CHECK(lines(text.err) == 1);
    CHECK_MESSAGE(text.err.find("does not fit") != std::string::npos, text.err);
    CHECK(text.out.find("DOES NOT FIT") != std::string::npos);

    const Run js = run_cli("simulate --json '" + dir.file("big.json") + "'");
    CHECK(js.exit_code == 3);
    CHECK(lines(js.err) == 1);
    const json j = json::parse(js.out);
    const json& memory = j.at("memory");
    CHECK(memory.at("fits") == false);
    const double per_gpu = memory.at("per_gpu_bytes").get<double>();
    CHECK(per_gpu > memory.at("capacity_bytes").get<double>());
    const std::string named = fmt::format("{:.1f} GiB per GPU", per_gpu / (1024.0 * 1024.0 * 1024.0));
    CHECK_MESSAGE(js.err.find(named) != std::string::npos, "expected '" << named << "' in: " << js.err);
    CHECK(js.err == text.err);
  }

  TEST_CASE(
      "--trace writes a Chrome trace with a process per stage, threads per stream and the graph's op "
      "labels") {
    // Four stages and eight micro-batches: a trace small enough to parse quickly.
    const TempDir dir("moeplan_simulate_trace");
    std::ofstream(dir.file("plan.json")) << R"({"model": "mixtral-8x7b", "hardware": "h100-sxm", "gpus": 32,
      "seq_len": 4096, "global_batch": 32, "attention": {"tp": 2}, "experts": {"ep": 8}, "pipeline": {"pp": 4},
      "overlap": {"dp_comm": true, "pp_comm": true}})";
    const std::string trace = dir.file("trace.json");
    const Run r = run_cli("simulate --json '" + dir.file("plan.json") + "' --trace '" + trace + "'");
    REQUIRE(r.exit_code == 0);
    const json report = json::parse(r.out);
    const int stages = report.at("plan").at("pipeline").at("pp").get<int>();
    REQUIRE(stages > 1);

    REQUIRE(fs::exists(trace));
    CHECK_FALSE(fs::exists(trace + ".tmp"));
    std::ifstream f(trace);
    const json t = json::parse(f);
    REQUIRE(t.at("traceEvents").is_array());

    std::map<int, int> process_names;              // pid -> count
    std::map<int, std::set<std::string>> threads;  // pid -> stream names
    std::set<std::pair<int, int>> named_threads;   // (pid, tid)
    std::set<std::pair<int, int>> used_threads;    // (pid, tid) of X events
    std::set<std::string> op_names;
    int64_t complete = 0;
    double end_us = 0;
    for (const json& e : t.at("traceEvents")) {
      const std::string ph = e.at("ph").get<std::string>();
      if (ph == "M" && e.at("name") == "process_name") {
        process_names[e.at("pid").get<int>()] += 1;
      } else if (ph == "M" && e.at("name") == "thread_name") {
        const int pid = e.at("pid").get<int>();
        const int tid = e.at("tid").get<int>();
        CHECK(named_threads.insert({pid, tid}).second);
        threads[pid].insert(e.at("args").at("name").get<std::string>());
      } else if (ph == "X") {
        ++complete;
        const std::string name = e.at("name").get<std::string>();
        const int pid = e.at("pid").get<int>();
        const double ts = e.at("ts").get<double>();
        const double dur = e.at("dur").get<double>();
        if (name.empty() || ts < 0 || dur < 0 || pid < 0 || pid >= stages) {
          FAIL_CHECK("malformed X event: " << e.dump());
        }
        used_threads.insert({pid, e.at("tid").get<int>()});
        op_names.insert(name);
        end_us = std::max(end_us, ts + dur);
      }
    }

    // One process_name per stage, pids 0..stages-1.
    CHECK(static_cast<int>(process_names.size()) == stages);
    for (const auto& [pid, count] : process_names) {
      CAPTURE(pid);
      CHECK(pid >= 0);
      CHECK(pid < stages);
      CHECK(count == 1);
    }
    // Every stage names the same streams, compute among them.
    REQUIRE(static_cast<int>(threads.size()) == stages);
    for (const auto& [pid, names] : threads) {
      CAPTURE(pid);
      CHECK(names == threads.begin()->second);
      CHECK(names.contains("compute"));
      CHECK(names.size() >= 2);
    }
    // Every X event sits on a named thread.
    for (const auto& [pid, tid] : used_threads) {
      CAPTURE(pid);
      CAPTURE(tid);
      CHECK(named_threads.contains({pid, tid}));
    }
    // One X event per op of the graph, named by its label; the last one ends with the step.
    CHECK(complete == report.at("ops_in_graph").get<int64_t>());
    CHECK(op_names.contains("L0.qkv_proj"));
    CHECK(op_names.contains("L0.attn_norm"));
    CHECK(end_us * 1e-6 == doctest::Approx(report.at("step_time_s").get<double>()).epsilon(1e-6));
  }

  TEST_CASE("a large batch is predicted from the periodic steady state, and --whole-step simulates it all") {
    // Internal-352B on 1,440 GPUs at 240 micro-batches: the report says how the step was simulated, the text
    // says what was added, and the whole step gives the same figures.
    TempDir dir("moeplan_periodic");
    json plan = json::parse(
        slurp(std::string(MOEPLAN_SOURCE_DIR) + "/planner/examples/internal-352b-1440xh800.json"));
    plan["global_batch"] = 2880;
    for (const char* key : {"model", "hardware"})
      plan[key] = std::string(MOEPLAN_SOURCE_DIR) + "/" + plan[key].get<std::string>();
    const std::string path = dir.file("plan.json");
    std::ofstream(path) << plan.dump();
    const Run fast = run_cli("simulate " + path + " --json");
    const Run whole = run_cli("simulate " + path + " --json --whole-step");
    const Run text = run_cli("simulate " + path);
    REQUIRE(fast.exit_code == 0);
    REQUIRE(whole.exit_code == 0);
    const json a = json::parse(fast.out), b = json::parse(whole.out);
    CHECK(a.at("simulation").at("extrapolated").get<bool>());
    CHECK(a.at("simulation").at("simulated_micro_batches").get<int>() < 240);
    CHECK_FALSE(b.at("simulation").at("extrapolated").get<bool>());
    CHECK(b.at("simulation").at("why_whole_step").get<std::string>() == "the whole step was asked for");
    CHECK(a.at("micro_batches") == 240);
    CHECK(a.at("ops_in_graph") == b.at("ops_in_graph"));
    CHECK(a.at("step_time_s").get<double>() ==
          doctest::Approx(b.at("step_time_s").get<double>()).epsilon(1e-9));
    CHECK(a.at("ops").size() == b.at("ops").size());
    CHECK(text.out.find("micro-batches: the steady phase repeats every 1 micro-batch") != std::string::npos);
    // The text states the check's tolerance, not "exactly": the runs' rounding differs by up to 1e-9.
    CHECK(text.out.find("checked op by op to 1e-09 of the step") != std::string::npos);
    CHECK(text.out.find("up to rounding") != std::string::npos);
    CHECK(text.out.find("exactly") == std::string::npos);
  }

  TEST_CASE("simulate with an unknown --stack or a missing plan file exits 2 with one line") {
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"simulate planner/examples/mixtral-8x22b-128xh100.json --stack no-such-stack", "no-such-stack"},
        {"simulate tests/no-such-plan.json", "no-such-plan.json"},
    };
    for (const auto& [args, named] : cases) {
      CAPTURE(args);
      const Run r = run_cli(args);
      CHECK(r.exit_code == 2);
      CHECK(lines(r.err) == 1);
      CHECK(r.err.rfind("moeplan: error: ", 0) == 0);
      CHECK_MESSAGE(r.err.find(named) != std::string::npos, r.err);
      CHECK(r.out.empty());
    }
  }

  TEST_CASE("a plan asking for what its stack cannot run exits 3 naming the stack's rule") {
    // Megatron-Core has no MegaScale-MoE SAR (its recompute is selective by module, or full); the same plan
    // under moerun runs.
    const TempDir dir("moeplan_simulate_stack");
    std::ofstream(dir.file("sar.json")) << R"({"model": "mixtral-8x7b", "hardware": "h100-sxm", "gpus": 16,
      "seq_len": 4096, "global_batch": 32, "attention": {"tp": 2}, "experts": {"ep": 8}, "pipeline": {"pp": 2},
      "recompute": "sar"})";
    const Run text = run_cli("simulate '" + dir.file("sar.json") + "' --stack megatron-core");
    CHECK(text.exit_code == 3);
    CHECK_MESSAGE(text.out.find("stack_recompute") != std::string::npos, text.out);
    const Run js = run_cli("simulate --json '" + dir.file("sar.json") + "' --stack megatron-core");
    CHECK(js.exit_code == 3);
    const json j = json::parse(js.out);
    CHECK(j.at("valid") == false);
    REQUIRE(j.at("violations").size() == 1);
    CHECK(j.at("violations")[0].at("rule") == "stack_recompute");
    const Run moerun = run_cli("simulate --json '" + dir.file("sar.json") + "' --stack moerun");
    CHECK(json::parse(moerun.out).at("valid") == true);
  }
}
