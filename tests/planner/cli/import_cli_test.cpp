// `moeplan import --megatron` as a user meets it: a script written by `launch --for megatron` comes back as
// the same plan (checked with `moeplan diff`), pasted flags work too, and bad launches exit 2 with one line.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/planner/cli/run_moeplan.h"

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

using namespace moeplan::test;  // Run, run_cli, lines, TempPlan, slurp

}  // namespace

TEST_SUITE("cli") {
  TEST_CASE("launch --for megatron, then import, gives the plan back (moeplan diff: identical)") {
    const fs::path dir = fs::temp_directory_path() / ("moeplan_import_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    const Run plan = run_cli("plan --model mixtral-8x7b --gpus 32 --global-batch 128 --top 1 --out-dir '" +
                             dir.string() + "'");
    REQUIRE_MESSAGE(plan.exit_code == 0, plan.err);
    const std::string p1 = (dir / "plan1.json").string(), script = (dir / "launch.sh").string(),
                      back = (dir / "back.json").string();
    const Run launch = run_cli("launch '" + p1 + "' --for megatron");
    REQUIRE_MESSAGE(launch.exit_code == 0, launch.err);
    CHECK(launch.out.find("not expressible") == std::string::npos);
    std::ofstream(script) << launch.out;
    const Run imp = run_cli("import --megatron '" + script + "' --model mixtral-8x7b -o '" + back + "'");
    REQUIRE_MESSAGE(imp.exit_code == 0, imp.err);
    CHECK(imp.out.find("wrote " + back) != std::string::npos);
    const Run d = run_cli("diff '" + p1 + "' '" + back + "'");
    CHECK(d.exit_code == 0);
    CHECK_MESSAGE(d.out.find("plans: identical") != std::string::npos, d.out);
    fs::remove_all(dir);
  }

  TEST_CASE("import takes pasted flags and prints the plan, and bad launches exit 2 with one line") {
    const Run r = run_cli(
        "import --model mixtral-8x7b --gpus 16 --megatron '--tensor-model-parallel-size 2 "
        "--expert-model-parallel-size 8 --moe-token-dispatcher-type alltoall --seq-length 4096 "
        "--micro-batch-size 1 --global-batch-size 64 --use-distributed-optimizer --bf16'");
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    const json p = json::parse(r.out);
    CHECK(p.at("attention").at("tp") == 2);
    CHECK(p.at("experts").at("dispatch") == "all_to_all");
    CHECK(p.at("data").at("zero") == 1);
    CHECK(p.at("stack") == "megatron-core");
    for (const auto& [args, text] :
         {std::pair{"import --model mixtral-8x7b --megatron nosuchfile.sh", "no such file, and no --flags"},
          std::pair{"import --model mixtral-8x7b --megatron '--seq-length 4096'", "give --gpus N"},
          std::pair{"import --model mixtral-8x7b --gpus 8 --megatron '--seq-length 4096 --num-layers 12'",
                    "--num-layers 12: the model mixtral-8x7b has 32"},
          std::pair{"import --model mixtral-8x7b --gpus 8 --megatron '--seq-length x'",
                    "--seq-length: expected an integer"}}) {
      CAPTURE(args);
      const Run b = run_cli(args);
      CHECK(b.exit_code == 2);
      CHECK(lines(b.err) == 1);
      CHECK_MESSAGE(b.err.find(text) != std::string::npos, b.err);
    }
  }
}
