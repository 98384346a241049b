// `moeplan launch` as a user meets it: the Megatron script runs under bash and hands torchrun the plan's
// flags (a stand-in `torchrun` on PATH records its arguments; torchrun and Megatron-LM are not installed
// here), node rank and master address come from the environment or Slurm, and the moerun launches start the
// CUDA backend.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/planner/cli/run_moeplan.h"

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

using namespace moeplan::test;  // Run, run_cli, lines, slurp

// A directory with a bin/ holding executables that print their arguments one per line (torchrun) or a
// host list (scontrol), and an empty Megatron-LM checkout; removed at the end.
struct FakeCluster {
  fs::path dir = fs::temp_directory_path() / ("moeplan_launch_" + std::to_string(::getpid()));
  FakeCluster() {
    fs::create_directories(dir / "bin");
    fs::create_directories(dir / "megatron");
    write_exe("torchrun", "#!/bin/sh\nfor a in \"$@\"; do printf '%s\\n' \"$a\"; done\n");
    write_exe("scontrol", "#!/bin/sh\nprintf 'node-a\\nnode-b\\n'\n");
  }
  ~FakeCluster() { fs::remove_all(dir); }
  void write_exe(const std::string& name, const std::string& text) const {
    const fs::path p = dir / "bin" / name;
    std::ofstream(p) << text;
    fs::permissions(p, fs::perms::owner_all);
  }
  // Runs `bash script` with the environment `env` (NAME=value words) and no inherited Slurm variables.
  Run bash(const std::string& script, const std::string& env) const {
    const std::string out = (dir / "out.txt").string(), err = (dir / "err.txt").string();
    const std::string cmd = "env -u SLURM_NODEID -u SLURM_JOB_NODELIST -u MASTER_ADDR -u NODE_RANK PATH='" +
                            (dir / "bin").string() + "':\"$PATH\" " + env + " bash '" + script + "' >'" +
                            out + "' 2>'" + err + "'";
    const int status = std::system(cmd.c_str());
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(out), slurp(err)};
  }
};

std::vector<std::string> words_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

}  // namespace

TEST_SUITE("cli") {
  TEST_CASE("launch --for megatron writes a script that starts torchrun with every flag of the plan") {
    FakeCluster c;
    const Run plan = run_cli("plan --model mixtral-8x7b --gpus 16 --global-batch 64 --top 1 --out-dir '" +
                             c.dir.string() + "'");
    REQUIRE_MESSAGE(plan.exit_code == 0, plan.err);
    const std::string p1 = (c.dir / "plan1.json").string(), script = (c.dir / "launch.sh").string();
    const Run launch = run_cli("launch '" + p1 + "' --for megatron --out '" + script + "'");
    REQUIRE_MESSAGE(launch.exit_code == 0, launch.err);
    CHECK(launch.out.find("run it once per node: bash " + script) != std::string::npos);
    const Run j = run_cli("launch '" + p1 + "' --for megatron --json");
    REQUIRE(j.exit_code == 0);
    const json flags = json::parse(j.out).at("flags");
    CHECK(json::parse(j.out).at("megatron_commit").get<std::string>().size() == 40);

    // Node 1 of 2, master address given: torchrun gets the node layout, the program, then the flags in order.
    const std::string mlm = (c.dir / "megatron").string();
    const Run r = c.bash(script, "MEGATRON_LM='" + mlm + "' NODE_RANK=1 MASTER_ADDR=node-0");
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    const std::vector<std::string> argv = words_of(r.out);
    REQUIRE(argv.size() > 6);
    CHECK(argv[0] == "--nnodes=2");
    CHECK(argv[1] == "--nproc-per-node=8");
    CHECK(argv[2] == "--node-rank=1");
    CHECK(argv[3] == "--master-addr=node-0");
    CHECK(argv[4] == "--master-port=29500");
    CHECK(argv[5] == mlm + "/pretrain_gpt.py");
    std::vector<std::string> names;
    for (size_t i = 6; i < argv.size(); ++i) {
      if (argv[i].starts_with("--")) names.push_back(argv[i]);
    }
    REQUIRE(names.size() == flags.size());
    for (size_t i = 0; i < names.size(); ++i) {
      const std::string f = flags[i].get<std::string>();
      CHECK(f.substr(0, f.find(' ')) == names[i]);
    }
    for (const char* f : {"--rotary-base", "--norm-epsilon", "--train-iters", "--lr", "--log-throughput"}) {
      CAPTURE(f);
      CHECK(std::find(names.begin(), names.end(), f) != names.end());
    }

    // Under Slurm: the node rank and the master (first host of the job) come from it.
    const Run s = c.bash(script, "MEGATRON_LM='" + mlm + "' SLURM_NODEID=1 SLURM_JOB_NODELIST='node-[a-b]'");
    REQUIRE_MESSAGE(s.exit_code == 0, s.err);
    const std::vector<std::string> sv = words_of(s.out);
    REQUIRE(sv.size() > 3);
    CHECK(sv[2] == "--node-rank=1");
    CHECK(sv[3] == "--master-addr=node-a");

    // Without a Megatron-LM checkout, or a master address on two nodes, the script stops and says why.
    const Run no_mlm = c.bash(script, "MASTER_ADDR=node-0");
    CHECK(no_mlm.exit_code != 0);
    CHECK(no_mlm.err.find("set MEGATRON_LM to a Megatron-LM checkout") != std::string::npos);
    CHECK(no_mlm.out.empty());
    const Run no_master = c.bash(script, "MEGATRON_LM='" + mlm + "'");
    CHECK(no_master.exit_code != 0);
    CHECK(no_master.err.find("set MASTER_ADDR") != std::string::npos);
  }

  TEST_CASE("launch --for moerun and --for slurm start moerun on the CUDA backend, or on --backend cpu") {
    const Run m = run_cli("launch planner/examples/mixtral-8x22b-128xh100.json --for moerun --json");
    REQUIRE_MESSAGE(m.exit_code == 0, m.err);
    const json j = json::parse(m.out);
    CHECK(j.at("backend") == "cuda");
    CHECK(j.at("commands")
              .at("srun")
              .get<std::string>()
              .find("srun --mpi=pmix --nodes=16 --ntasks-per-node=8 --gpus-per-node=8 moerun run ") == 0);
    CHECK(j.at("commands").at("mpirun").get<std::string>().find("--backend cuda") != std::string::npos);

    const Run s = run_cli("launch planner/examples/mixtral-8x22b-128xh100.json --for slurm");
    REQUIRE(s.exit_code == 0);
    CHECK(s.out.find("--backend cuda") != std::string::npos);
    CHECK(s.out.find("export NCCL_DEBUG=WARN") != std::string::npos);

    const Run cpu = run_cli("launch planner/examples/tiny-moe-ep2.json --for slurm --backend cpu");
    REQUIRE(cpu.exit_code == 0);
    CHECK(cpu.out.find("--backend cpu") != std::string::npos);
    CHECK(cpu.out.find("--gpus-per-node") == std::string::npos);
  }
}
