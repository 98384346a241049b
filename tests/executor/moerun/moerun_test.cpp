// Tests of `moerun run` as users start it, under mpiexec: a measured run whose ops join the predicted ones,
// a pipeline run, every rank's op times (a rank slowed in one op named as its slowest), routing drawn from
// the plan's distribution, bad inputs (exit 2, one line, no files), an illegal plan (exit 3), and faults (a
// crashed rank, a hung collective caught by the watchdog) that end the job with no report left behind.
#include <sys/wait.h>
#include <unistd.h>

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <tuple>

#include <nlohmann/json.hpp>

namespace {

namespace fs = std::filesystem;

struct Run {
  int exit_code = -1;
  std::string out, err;
  double seconds = 0;
};

std::string slurp(const fs::path& p) {
  std::ifstream f(p);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

fs::path temp(const std::string& name) {
  return fs::temp_directory_path() / ("moerun_test_" + std::to_string(::getpid()) + "_" + name);
}

// `env` is prepended to the command (e.g. "MOERUN_FAULT=..."); mpiexec's -x forwards it to every rank.
Run mpirun(int ranks, const std::string& args, const std::string& env = "") {
  static int counter = 0;
  const fs::path base = temp("run" + std::to_string(counter++));
  std::string cmd = "cd '" MOEPLAN_SOURCE_DIR "' && " + env +
                    " '" MPIEXEC "' --allow-run-as-root --oversubscribe -n " + std::to_string(ranks) +
                    (env.empty() ? "" : " -x MOERUN_FAULT") + " '" MOERUN_BIN "' " + args + " >'" +
                    base.string() + ".out' 2>'" + base.string() + ".err'";
  const auto t0 = std::chrono::steady_clock::now();
  const int status = std::system(cmd.c_str());
  Run r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(base.string() + ".out");
  r.err = slurp(base.string() + ".err");
  fs::remove(base.string() + ".out");
  fs::remove(base.string() + ".err");
  return r;
}

// A tiny-moe plan on 2 ranks: dp 2 with ep 2 (default) or pp 2.
fs::path write_plan(const std::string& name, bool pipeline, const std::string& extra = "") {
  const fs::path p = temp(name + ".json");
  std::ofstream(p)
      << "{\"model\": \"" MOEPLAN_SOURCE_DIR "/models/tiny-moe.json\", \"hardware\": \"" MOEPLAN_SOURCE_DIR
         "/hwprofiles/h100-sxm.json\", \"stack\": \"moerun\", \"gpus\": 2, \"seq_len\": 128, "
         "\"global_batch\": 4, "
         "\"micro_batch\": 1, \"attention\": {\"tp\": 1, \"sp\": 1, \"cp\": 1}, "
      << (pipeline ? "\"experts\": {\"ep\": 1}, \"pipeline\": {\"pp\": 2, \"vpp\": 1, \"schedule\": \"1f1b\"}"
                   : "\"experts\": {\"ep\": 2}, \"pipeline\": {\"pp\": 1}")
      << ", \"overlap\": {\"inter_op\": true, \"intra_op\": false, \"dp_comm\": true, \"pp_comm\": true}"
      << extra << "}";
  return p;
}

// Lines moerun printed (mpiexec adds its own report of the failed ranks after them).
int moerun_lines(const std::string& s) {
  int n = 0;
  std::istringstream in(s);
  for (std::string line; std::getline(in, line);) n += line.rfind("moerun:", 0) == 0 ? 1 : 0;
  return n;
}

void check_no_output(const fs::path& dir) {
  CHECK(!fs::exists(dir / "report.json"));
  CHECK(!fs::exists(dir / "trace.json"));
}

}  // namespace

TEST_SUITE("moerun") {
  TEST_CASE("a measured run writes a report whose ops join the predicted report on stage op and phase") {
    const fs::path plan = write_plan("join", false), out = temp("join_out");
    const Run r = mpirun(2, "run '" + plan.string() + "' --steps 2 --warmup 1 --out '" + out.string() + "'");
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    const auto measured = nlohmann::json::parse(slurp(out / "report.json"));
    CHECK(measured["measured"] == true);
    CHECK(measured["step_times_s"].size() == 2);
    CHECK(measured["step_time_s"].get<double>() > 0);
    CHECK(measured["memory"]["per_gpu_bytes"].get<double>() > 0);
    // Both ranks' own steps, each no longer than the slowest rank's mean step.
    REQUIRE(measured["ranks"]["step_s"].size() == 2);
    for (const auto& s : measured["ranks"]["step_s"]) {
      CHECK(s.get<double>() > 0);
      CHECK(s.get<double>() <= measured["step_time_s"].get<double>() * (1 + 1e-12));
    }
    CHECK(measured["ranks"]["skew"].get<double>() >= 1.0);
    CHECK(nlohmann::json::parse(slurp(out / "trace.json"))["traceEvents"].size() > 10);
    const std::string pred_path = temp("pred.json").string();
    REQUIRE(std::system(("'" MOEPLAN_BIN "' simulate '" + plan.string() + "' --json > '" + pred_path + "'")
                            .c_str()) == 0);
    const auto predicted = nlohmann::json::parse(slurp(pred_path));
    using Key = std::tuple<int, std::string, std::string>;
    auto keys = [](const nlohmann::json& ops) {
      std::set<Key> k;
      for (const auto& o : ops)
        k.insert({o["stage"].get<int>(), o["op"].get<std::string>(), o["phase"].get<std::string>()});
      return k;
    };
    CHECK(keys(measured["ops"]) == keys(predicted["ops"]));
    CHECK(measured["ops"].size() == predicted["ops"].size());
    fs::remove_all(out);
    fs::remove(plan);
    fs::remove(pred_path);
  }

  TEST_CASE(
      "a Megatron-stack plan with TP replays its vocabulary-parallel exchanges and joins the prediction") {
    // tiny-moe on megatron-core, tp 2: the replay runs every op the lowering states, the exchanges at both
    // ends of the model (embedding reduce-scatter, output-layer gathers and reduce-scatter, the loss's
    // reductions) included, and its report joins the prediction op for op.
    const fs::path plan = temp("vocab_tp.json"), out = temp("vocab_tp_out");
    std::ofstream(plan)
        << "{\"model\": \"" MOEPLAN_SOURCE_DIR
           "/models/tiny-moe.json\", \"hardware\": \"h100-sxm\", \"stack\": \"megatron-core\", "
           "\"gpus\": 2, \"seq_len\": 128, \"global_batch\": 2, \"micro_batch\": 1, "
           "\"attention\": {\"tp\": 2, \"sp\": 1, \"cp\": 1}, \"experts\": {\"ep\": 1}, "
           "\"pipeline\": {\"pp\": 1}, \"overlap\": {\"inter_op\": false, \"intra_op\": false, "
           "\"dp_comm\": true, \"pp_comm\": false}, \"recompute\": \"none\"}";
    const Run r = mpirun(
        2, "run '" + plan.string() + "' --runner replay --steps 1 --warmup 1 --out '" + out.string() + "'");
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    const auto measured = nlohmann::json::parse(slurp(out / "report.json"));
    std::set<std::string> names;
    for (const auto& o : measured["ops"]) names.insert(o["op"].get<std::string>());
    for (const char* n : {"embed_rs", "embed_ag", "head_ag", "head_rs", "input_ag", "loss_ag"})
      CHECK_MESSAGE(names.count(n) == 1, n);
    const std::string pred_path = temp("vocab_tp_pred.json").string();
    REQUIRE(std::system(("'" MOEPLAN_BIN "' simulate '" + plan.string() + "' --json > '" + pred_path + "'")
                            .c_str()) == 0);
    const auto predicted = nlohmann::json::parse(slurp(pred_path));
    CHECK(measured["ops"].size() == predicted["ops"].size());
    fs::remove_all(out);
    fs::remove(plan);
    fs::remove(pred_path);
  }

  TEST_CASE("a two-stage pipeline runs its sends and receives over MPI and reports both stages") {
    const fs::path plan = write_plan("pp", true), out = temp("pp_out");
    const Run r = mpirun(2, "run '" + plan.string() + "' --steps 1 --warmup 0 --out '" + out.string() + "'");
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    const auto j = nlohmann::json::parse(slurp(out / "report.json"));
    std::set<int> stages;
    for (const auto& o : j["ops"]) {
      stages.insert(o["stage"].get<int>());
      CHECK(o["total_s"].get<double>() >= 0);
    }
    CHECK(stages == std::set<int>{0, 1});
    CHECK(j["representative_ranks"] == nlohmann::json::array({0, 1}));
    fs::remove_all(out);
    fs::remove(plan);
  }

  TEST_CASE("every rank's op times reach the report: a rank slowed in one op is named as its slowest") {
    // Rank 1 sleeps 50 ms inside each of its two L1.expert_fc13 forwards (MOERUN_FAULT's slow hook); rank 0
    // runs it in microseconds. Both ranks are stage 0's.
    const fs::path plan = write_plan("slow", false), out = temp("slow_out");
    const Run r = mpirun(2, "run '" + plan.string() + "' --steps 1 --warmup 0 --out '" + out.string() + "'",
                         "MOERUN_FAULT=slow:rank=1:op=L1.expert_fc13:us=50000");
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    const auto j = nlohmann::json::parse(slurp(out / "report.json"));
    bool found = false;
    for (const auto& o : j["ops"]) {
      REQUIRE(o.contains("ranks"));
      const auto& k = o["ranks"];
      CHECK(k["min_s"].get<double>() <= k["mean_s"].get<double>() * (1 + 1e-12));
      CHECK(k["mean_s"].get<double>() <= k["max_s"].get<double>() * (1 + 1e-12));
      // The report's own times are the representative's (rank 0): the fastest or the slowest of the two.
      CHECK((o["total_s"].get<double>() == k["min_s"].get<double>() ||
             o["total_s"].get<double>() == k["max_s"].get<double>()));
      if (o["op"] == "L1.expert_fc13" && o["phase"] == "fwd") {
        found = true;
        CHECK(k["slowest_rank"] == 1);
        CHECK(k["fastest_rank"] == 0);
        CHECK(k["max_s"].get<double>() >= 2 * 0.050);
        CHECK(k["min_s"].get<double>() < 0.050);
      }
    }
    CHECK(found);
    const auto& compute = j["op_rank_skew"]["compute"];
    REQUIRE(!compute.empty());
    CHECK(compute[0]["op"] == "L1.expert_fc13");
    CHECK(compute[0]["phase"] == "fwd");
    CHECK(compute[0]["slowest_rank"] == 1);
    CHECK(compute[0]["spread_s"].get<double>() > 0.090);
    CHECK(r.out.find("widest compute spread: L1.expert_fc13 (fwd) on stage 0") != std::string::npos);
    // Rank 0 waits for it in the all-to-all that follows (the combine): there rank 0 is the slow one.
    const auto& comm = j["op_rank_skew"]["communication"];
    REQUIRE(!comm.empty());
    CHECK(comm[0]["slowest_rank"] == 0);
    CHECK(comm[0]["spread_s"].get<double>() > 0.050);
    // The ranks' own steps cannot say which rank was slow: rank 0 waits for rank 1 in the next all-to-all,
    // and both end with the gradient all-reduce, so either may end last.
    fs::remove_all(out);
    fs::remove(plan);
  }

  TEST_CASE("drawn routing: each EP rank runs the rows its experts drew, as busy as the routing model says") {
    // zipf:1.5 over tiny-moe's 8 experts, top 2, on EP 2: rank 0 holds experts 0-3, which every token picks
    // at least once (p_0 = 0.52 > 1/2) and 86 % of the picks in all; rank 1 gets the rest. 128 tokens per
    // rank and micro-batch, 2 micro-batches x 3 MoE layers x 3 steps = 18 draws.
    const fs::path plan = write_plan("zipf", false, ", \"routing\": {\"distribution\": \"zipf:1.5\"}");
    const fs::path out = temp("zipf_out");
    const Run r = mpirun(
        2, "run '" + plan.string() + "' --steps 2 --warmup 1 --routing-seed 7 --out '" + out.string() + "'");
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    const auto j = nlohmann::json::parse(slurp(out / "report.json"));
    const auto& routing = j["routing"];
    CHECK(routing["mode"] == "drawn");
    CHECK(routing["distribution"] == "zipf:1.5");
    CHECK(routing["seed"] == 7);
    CHECK(routing["draws"] == 18);
    const auto rows = routing["ep_rank_rows"].get<std::vector<double>>();
    REQUIRE(rows.size() == 2);
    CHECK(rows[0] + rows[1] == doctest::Approx(2 * 128 * 2));  // every rank's tokens, top 2 each
    CHECK(rows[0] > 3 * rows[1]);
    // The draws' busiest rank over the mean beside the routing model's expectation, which the prediction
    // uses (both about 1.73 here), over 18 draws.
    const double drawn = routing["busiest_over_mean"]["drawn"].get<double>();
    const double predicted = routing["busiest_over_mean"]["predicted"].get<double>();
    CHECK(predicted == doctest::Approx(j["expert_load_scale"].get<double>()));
    CHECK(drawn == doctest::Approx(predicted).epsilon(0.05));
    CHECK(r.out.find("routing drawn: busiest EP rank") != std::string::npos);

    // --routing lowered: every rank runs the graph's rows, and the report says so.
    const Run lowered = mpirun(
        2, "run '" + plan.string() + "' --steps 1 --warmup 0 --routing lowered --out '" + out.string() + "'");
    REQUIRE_MESSAGE(lowered.exit_code == 0, lowered.err);
    const auto k = nlohmann::json::parse(slurp(out / "report.json"));
    CHECK(k["routing"]["mode"] == "lowered");
    CHECK(k["routing"]["why"] == "--routing lowered");
    fs::remove_all(out);
    fs::remove(plan);
  }

  TEST_CASE("the sbatch script of launch --calibrate measures, fits, predicts, runs and compares") {
    // The script as `moeplan launch --for slurm --backend cpu --calibrate` writes it, run by bash in a
    // folder with moerun and moeplan on PATH and an `srun` that starts its command under mpiexec with the
    // ranks it asks for (no Slurm here). The bench runs --quick and the run two steps, through the script's
    // MOERUN_BENCH_FLAGS and MOERUN_RUN_FLAGS.
    const fs::path plan = write_plan("slurm", false), dir = temp("slurm_dir"), bin = dir / "bin";
    fs::create_directories(bin);
    fs::create_symlink(MOERUN_BIN, bin / "moerun");
    fs::create_symlink(MOEPLAN_BIN, bin / "moeplan");
    {
      std::ofstream srun(bin / "srun");
      srun << "#!/bin/bash\nnodes=1; per_node=1\n"
              "while [[ $1 == --* ]]; do\n"
              "  case $1 in --nodes=*) nodes=${1#*=} ;; --ntasks-per-node=*) per_node=${1#*=} ;; esac\n"
              "  shift\ndone\n"
              "exec '" MPIEXEC "' --allow-run-as-root --oversubscribe -n $((nodes * per_node)) \"$@\"\n";
    }
    fs::permissions(bin / "srun", fs::perms::owner_all, fs::perm_options::add);
    const std::string script = (dir / "job.sbatch").string();
    REQUIRE(std::system(("'" MOEPLAN_BIN "' launch '" + plan.string() +
                         "' --for slurm --backend cpu --calibrate --run-dir runs/r --out '" + script + "'")
                            .c_str()) == 0);
    const std::string text = slurp(script);
    CHECK(text.find("srun --mpi=pmix --nodes=1 --ntasks-per-node=2 moerun bench --backend cpu --plan " +
                    plan.string() + " --out runs/r/bench") != std::string::npos);
    CHECK(text.find("moeplan simulate") != std::string::npos);
    const std::string cmd = "cd '" + dir.string() + "' && PATH='" + bin.string() +
                            "':\"$PATH\" MOERUN_BENCH_FLAGS=--quick MOERUN_RUN_FLAGS='--steps 2 --warmup 1' "
                            "bash job.sbatch >job.out 2>job.err";
    const int status = std::system(cmd.c_str());
    const fs::path run = dir / "runs" / "r";
    REQUIRE_MESSAGE(WIFEXITED(status), slurp(dir / "job.err"));
    REQUIRE_MESSAGE(WEXITSTATUS(status) == 0, slurp(dir / "job.err"));
    // The bench also timed the plan's own exchange (ep 2 over both ranks): its bytes per rank, uniform.
    const std::string skew = slurp(run / "bench" / "alltoall_skew.csv");
    CHECK(std::count(skew.begin(), skew.end(), '\n') > 2 + 2 * 3);
    CHECK(slurp(run / "calibrate.txt").find("alltoall, hot receiver, 2 ranks / 1 node") != std::string::npos);
    // The prediction is on the measured profile, not the plan's H100.
    const auto hw = nlohmann::json::parse(slurp(run / "hardware.json"));
    const auto predicted = nlohmann::json::parse(slurp(run / "predicted.json"));
    CHECK(predicted["hardware"] == hw["name"]);
    CHECK(nlohmann::json::parse(slurp(run / "report.json"))["measured"] == true);
    CHECK(slurp(dir / "job.out").find(slurp(run / "compare.txt")) != std::string::npos);  // tee'd
    CHECK(slurp(run / "compare.txt").find("step") != std::string::npos);
    fs::remove_all(dir);
    fs::remove(plan);
  }

  TEST_CASE("bench --plan needs a world that holds the plan's expert-parallel group, else exits 2") {
    const fs::path plan = temp("wide.json"), out = temp("wide_out");
    std::ofstream(plan) << "{\"model\": \"" MOEPLAN_SOURCE_DIR
                           "/models/tiny-moe.json\", \"hardware\": \"h100-sxm\", "
                           "\"stack\": \"moerun\", \"gpus\": 4, \"seq_len\": 128, \"global_batch\": 4, "
                           "\"experts\": {\"ep\": 4}}";
    const Run r = mpirun(2, "bench --quick --plan '" + plan.string() + "' --out '" + out.string() + "'");
    CHECK(r.exit_code == 2);
    CHECK_MESSAGE(moerun_lines(r.err) == 1, r.err);
    CHECK(r.err.find("its expert-parallel group (4 ranks, 1 apart) needs 4 ranks; this bench has 2") !=
          std::string::npos);
    CHECK_FALSE(fs::exists(out / "profile.json"));
    fs::remove_all(out);
    fs::remove(plan);
  }

  TEST_CASE("a world size other than the plan's gpus exits 2 with one line and writes nothing") {
    const fs::path plan = write_plan("world", false), out = temp("world_out");
    const Run r = mpirun(3, "run '" + plan.string() + "' --out '" + out.string() + "'");
    CHECK(r.exit_code != 0);
    CHECK(r.err.find("moerun: world size 3 != plan gpus 2 (start with mpirun -np 2)\n") != std::string::npos);
    CHECK(moerun_lines(r.err) == 1);  // only rank 0 prints
    check_no_output(out);
    fs::remove(plan);
  }

  // Here (no driver) and in CI, and with builds without CUDA, --backend cuda must fail cleanly before any
  // step; with a GPU per rank it runs and says so in the report. The pipelined plan too: the CUDA replay
  // takes pipeline parallelism (it no longer exits 3 before looking for a device).
  TEST_CASE("--backend cuda runs on a GPU per rank, or exits 2 with one line and writes nothing") {
    for (const bool pipeline : {false, true}) {
      CAPTURE(pipeline);
      const fs::path plan = write_plan(pipeline ? "cuda_pp" : "cuda", pipeline), out = temp("cuda_out");
      const Run r = mpirun(
          2, "run '" + plan.string() + "' --backend cuda --steps 1 --warmup 0 --out '" + out.string() + "'");
      if (r.exit_code == 0) {
        const auto j = nlohmann::json::parse(slurp(out / "report.json"));
        CHECK(j["backend"] == "cuda");
      } else {
        CHECK_MESSAGE(r.exit_code == 2, r.err);
        CHECK_MESSAGE(moerun_lines(r.err) == 1, r.err);
        CHECK(r.err.rfind("moerun: ", 0) == 0);
        check_no_output(out);
      }
      fs::remove_all(out);
      fs::remove(plan);
    }
  }

  // Without a GPU per rank (here and in CI) or without CUDA, the GPU bench fails before making its folder;
  // with one it writes the calibration folder, profile.json last.
  TEST_CASE(
      "moerun bench --backend cuda writes its calibration folder on a GPU per rank, or exits 2 with one "
      "line and makes no folder") {
    const fs::path out = temp("cuda_bench_out");
    const Run r = mpirun(2, "bench --backend cuda --quick --out '" + out.string() + "'");
    if (r.exit_code == 0) {
      CHECK(fs::exists(out / "profile.json"));
      CHECK(fs::exists(out / "gemm.csv"));
    } else {
      CHECK(r.exit_code == 2);
      CHECK_MESSAGE(moerun_lines(r.err) == 1, r.err);
      CHECK(r.err.rfind("moerun: ", 0) == 0);
      CHECK(!fs::exists(out));
    }
    fs::remove_all(out);
  }

  TEST_CASE("--host-sync without --backend cuda exits 2 with one line and writes nothing") {
    const fs::path plan = write_plan("host_sync", false), out = temp("host_sync_out");
    const Run r = mpirun(
        2, "run '" + plan.string() + "' --host-sync --steps 1 --warmup 0 --out '" + out.string() + "'");
    CHECK(r.exit_code == 2);
    CHECK_MESSAGE(moerun_lines(r.err) == 1, r.err);
    CHECK(r.err.find("--host-sync needs --backend cuda") != std::string::npos);
    check_no_output(out);
    fs::remove(plan);
  }

  TEST_CASE(
      "--cuda-graph or --fused-kernels without --backend cuda, or --cuda-graph without two warm-up steps, "
      "exits 2 with one line") {
    const fs::path plan = write_plan("cuda_graph", false), out = temp("cuda_graph_out");
    struct Case {
      std::string args, says;
    };
    for (const Case& c :
         {Case{"--cuda-graph --warmup 2", "--cuda-graph needs --backend cuda"},
          Case{"--fused-kernels cutlass --warmup 1", "--fused-kernels needs --backend cuda"},
          Case{"--backend cuda --cuda-graph --host-sync --warmup 2", "--cuda-graph and --host-sync exclude"},
          Case{"--backend cuda --cuda-graph --warmup 1", "--cuda-graph needs --warmup 2 or more"}}) {
      const Run r =
          mpirun(2, "run '" + plan.string() + "' " + c.args + " --steps 1 --out '" + out.string() + "'");
      CHECK_MESSAGE(r.exit_code == 2, c.args);
      CHECK_MESSAGE(moerun_lines(r.err) == 1, r.err);
      CHECK_MESSAGE(r.err.find(c.says) != std::string::npos, r.err);
      check_no_output(out);
    }
    fs::remove(plan);
  }

  TEST_CASE("an unreadable plan exits 2 with one line naming the file") {
    const fs::path out = temp("missing_out");
    const Run r = mpirun(1, "run /nonexistent/plan.json --out '" + out.string() + "'");
    CHECK(r.exit_code == 2);
    CHECK_MESSAGE(moerun_lines(r.err) == 1, r.err);
    CHECK(r.err.rfind("moerun: /nonexistent/plan.json", 0) == 0);
    check_no_output(out);
  }

  TEST_CASE("a plan with a bad field exits 2 with one line naming the field") {
    const fs::path plan = write_plan("field", false, ", \"micro_batchez\": 1"), out = temp("field_out");
    const Run r = mpirun(2, "run '" + plan.string() + "' --out '" + out.string() + "'");
    CHECK(r.exit_code == 2);
    CHECK_MESSAGE(moerun_lines(r.err) == 1, r.err);
    CHECK(r.err.find("micro_batchez") != std::string::npos);
    check_no_output(out);
    fs::remove(plan);
  }

  TEST_CASE("an illegal plan exits 3 with the rules it breaks") {
    const fs::path plan = temp("illegal.json"), out = temp("illegal_out");
    std::ofstream(plan) << "{\"model\": \"" MOEPLAN_SOURCE_DIR
                           "/models/tiny-moe.json\", \"hardware\": \"" MOEPLAN_SOURCE_DIR
                           "/hwprofiles/h100-sxm.json\", \"gpus\": 3, \"seq_len\": 128, \"global_batch\": 3, "
                           "\"micro_batch\": 1, \"experts\": {\"ep\": 3}}";
    const Run r = mpirun(1, "run '" + plan.string() + "' --out '" + out.string() + "'");
    CHECK(r.exit_code == 3);
    CHECK(r.err.find("cannot run") != std::string::npos);
    check_no_output(out);
    fs::remove(plan);
  }

  TEST_CASE("a crashed rank ends the job within seconds, named, with no report") {
    const fs::path plan = write_plan("crash", false), out = temp("crash_out");
    const Run r = mpirun(2, "run '" + plan.string() + "' --steps 50 --out '" + out.string() + "'",
                         "MOERUN_FAULT=crash:rank=1:op=L1.dispatch_a2a");
    CHECK(r.exit_code != 0);
    CHECK_MESSAGE(r.err.find("moerun: rank 1: injected crash at op L1.dispatch_a2a") != std::string::npos,
                  r.err);
    CHECK(r.seconds < 60);
    check_no_output(out);
    fs::remove(plan);
  }

  TEST_CASE("a hung collective is named by the watchdog and the job aborts with no report") {
    const fs::path plan = write_plan("hang", false), out = temp("hang_out");
    const Run r = mpirun(2, "run '" + plan.string() + "' --watchdog-s 2 --out '" + out.string() + "'",
                         "MOERUN_FAULT=hang:rank=1:op=L1.dispatch_a2a");
    CHECK(r.exit_code != 0);
    CHECK_MESSAGE(
        r.err.find("op L1.dispatch_a2a (stage 0, micro-batch 0) has not completed after 2 s; aborting") !=
            std::string::npos,
        r.err);
    CHECK(r.seconds < 60);
    check_no_output(out);
    fs::remove(plan);
  }
}
