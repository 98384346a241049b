// The `moeplan` binary as a user meets it: exit codes, one-line errors for every file of the bad-input
// corpus, and `inspect --json` for every shipped model.
#include <doctest/doctest.h>

#include "tests/planner/cli/run_moeplan.h"

#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace fs = std::filesystem;

namespace {

using namespace moeplan::test;  // Run, slurp, run_cli, lines

}  // namespace

TEST_SUITE("cli") {
  TEST_CASE("inspect prints a moeplan model file's source, where its numbers come from") {
    const Run r = run_cli("inspect --model internal-352b");
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    CHECK(r.out.find("1 shared (FFN 14336)") != std::string::npos);
    CHECK(r.out.find("source: MegaScale-MoE") != std::string::npos);
    CHECK(r.out.find("shared expert of the routed experts' size (14336) is inferred") != std::string::npos);
    const Run j = run_cli("inspect --model internal-352b --json");
    REQUIRE(j.exit_code == 0);
    CHECK(nlohmann::json::parse(j.out).at("source").get<std::string>().starts_with("MegaScale-MoE"));
    // An HF config has no source line.
    CHECK(run_cli("inspect --model mixtral-8x7b").out.find("source:") == std::string::npos);
  }

  TEST_CASE("inspect with no arguments prints the default model") {
    const Run r = run_cli("inspect");
    CHECK(r.exit_code == 0);
    CHECK(r.out.find("mixtral-8x22b") != std::string::npos);
    CHECK(r.err.empty());
  }

  TEST_CASE("inspect --json prints one object with the contract's keys for every shipped model") {
    for (const auto& entry : fs::directory_iterator(fs::path(MOEPLAN_SOURCE_DIR) / "models")) {
      if (entry.path().extension() != ".json") continue;
      CAPTURE(entry.path().string());
      const Run r = run_cli("inspect --json --seq-len 4096 --model '" + entry.path().string() + "'");
      REQUIRE(r.exit_code == 0);
      const auto j = nlohmann::json::parse(r.out);
      CHECK(j.at("params_total").get<double>() > 0);
      CHECK(j.at("params_active").get<double>() <= j.at("params_total").get<double>());
      CHECK(j.at("flops_per_token_train").get<double>() ==
            doctest::Approx(3 * j.at("flops_per_token_forward").get<double>()));
    }
  }

  TEST_CASE("inspect, plan and simulate state a model's approximations and its checkpoint's quantization") {
    // inspect: layers by kind for hybrids, the quantization as stated, one note per approximation.
    const Run qn = run_cli("inspect --json --model qwen3-next-80b-a3b");
    REQUIRE(qn.exit_code == 0);
    const auto j = nlohmann::json::parse(qn.out);
    CHECK(j.at("layer_kinds").at("Gated DeltaNet + MoE") == 36);
    CHECK(j.at("layer_kinds").at("attention + MoE") == 12);
    CHECK(j.at("notes").size() == 1);
    CHECK_FALSE(j.contains("checkpoint_quantization"));
    const Run v32 = run_cli("inspect --model deepseek-v3.2");
    REQUIRE(v32.exit_code == 0);
    CHECK(v32.out.find("note: checkpoint quantization (quantization_config): fp8, fmt e4m3") !=
          std::string::npos);
    CHECK(v32.out.find("note: DSA sparse attention:") != std::string::npos);
    // A plain model's report keeps its keys (golden outputs stay as they were).
    const auto plain = nlohmann::json::parse(run_cli("inspect --json --model mixtral-8x7b").out);
    CHECK_FALSE(plain.contains("notes"));
    CHECK_FALSE(plain.contains("layer_kinds"));
    // plan: the same lines, before the ranking and in its JSON.
    const std::string job =
        "plan --model nemotron-3-nano-30b-a3b --hardware h100-sxm --gpus 8 --seq-len 4096 --global-batch 64 "
        "--fix pipeline.pp=1 --fix attention.tp=1 --fix experts.ep=8 --top 1";
    const Run text = run_cli(job);
    REQUIRE(text.exit_code == 0);
    CHECK(text.out.find("\nmodel: Mamba-2 layers: in/out projections priced as GEMMs") != std::string::npos);
    const auto pj = nlohmann::json::parse(run_cli(job + " --json").out);
    REQUIRE(pj.at("model_notes").size() == 1);
    CHECK(pj.at("model_notes")[0].get<std::string>().find("(assumed: no calibrated kernel)") !=
          std::string::npos);
    CHECK(pj.at("plans").size() == 1);
    // simulate: its best plan, text and JSON.
    const fs::path plan = fs::temp_directory_path() / "moeplan_cli_test_nemotron_plan.json";
    {
      nlohmann::json p = pj.at("plans")[0].at("plan");
      p["model"] = (fs::path(MOEPLAN_SOURCE_DIR) / "models" / "nemotron-3-nano-30b-a3b.json").string();
      p["hardware"] = (fs::path(MOEPLAN_SOURCE_DIR) / "hwprofiles" / "h100-sxm.json").string();
      p.erase("stack");
      std::ofstream(plan) << p.dump();
    }
    const Run sim = run_cli("simulate '" + plan.string() + "'");
    CHECK(sim.exit_code == 0);
    CHECK(sim.out.find("\nmodel: Mamba-2 layers:") != std::string::npos);
    const Run sj = run_cli("simulate --json '" + plan.string() + "'");
    REQUIRE(sj.exit_code == 0);
    CHECK(nlohmann::json::parse(sj.out).at("model_notes").size() == 1);
    fs::remove(plan);
  }

  TEST_CASE("a Switch Transformer is inspected, planned on one pipeline stage, simulated and not launched") {
    const Run r = run_cli("inspect --json --model switch-base-64 --seq-len 512");
    REQUIRE(r.exit_code == 0);
    const auto j = nlohmann::json::parse(r.out);
    CHECK(j.at("encoder_layers") == 12);
    CHECK(j.at("decoder_layers") == 12);
    CHECK(j.at("decoder_seq_len") == 128);
    CHECK(j.at("params_total").get<double>() == 3'790'748'928.0);
    CHECK(j.at("notes").size() == 3);
    // plan: the encoder-decoder rules reject pipelines and sequence splits; every listed plan is pp 1.
    const std::string job =
        "plan --model switch-base-64 --hardware h100-sxm --gpus 16 --seq-len 512 --global-batch 128 --top 3";
    const auto pj = nlohmann::json::parse(run_cli(job + " --json").out);
    REQUIRE(pj.at("plans").size() == 3);
    for (const auto& plan : pj.at("plans")) {
      CHECK(plan.at("plan").at("pipeline").at("pp") == 1);
      CHECK(plan.at("plan").at("attention").at("sp") == 1);
      CHECK(plan.at("plan").at("attention").at("cp") == 1);
    }
    const Run text = run_cli(job);
    REQUIRE(text.exit_code == 0);
    CHECK(text.out.find("encoder_decoder_pp") != std::string::npos);
    CHECK(text.out.find("\nmodel: encoder-decoder: a sequence is the encoder's input") != std::string::npos);
    // simulate its best plan; Megatron-LM has no launch for it, and moerun's executors refuse it.
    const fs::path plan = fs::temp_directory_path() / "moeplan_cli_test_switch_plan.json";
    std::ofstream(plan) << pj.at("plans")[0].at("plan").dump();
    const Run sim = run_cli("simulate --json '" + plan.string() + "'");
    REQUIRE(sim.exit_code == 0);
    const auto sj = nlohmann::json::parse(sim.out);
    CHECK(sj.at("tokens_per_s").get<double>() > 0);
    const Run launch = run_cli("launch --for megatron '" + plan.string() + "'");
    CHECK(launch.out.find("# not expressible in Megatron-LM: an encoder-decoder") != std::string::npos);
    for (const char* target : {"moerun", "slurm"}) {
      const Run l = run_cli(std::string("launch --for ") + target + " '" + plan.string() + "'");
      CHECK(l.out.find("# moerun refuses this plan: an encoder-decoder model") != std::string::npos);
    }
    fs::remove(plan);
  }

  TEST_CASE("inspect --hardware summarises a profile") {
    const Run r = run_cli("inspect --hardware h800-sxm --json");
    REQUIRE(r.exit_code == 0);
    const auto j = nlohmann::json::parse(r.out);
    CHECK(j.at("gpus_per_node") == 8);
  }

  TEST_CASE("simulate, explain, validate and sweep --plan take --hardware over the plan's profile") {
    // A calibrated profile replaces the plan's for what a plan file is checked or predicted on: each command
    // names the profile it used; a missing one is one line and exit 2.
    const TempPlan plan("moeplan_hardware_override",
                        R"({"model": "tiny-moe", "hardware": "h100-sxm", "stack": "moerun", "gpus": 8,
                            "seq_len": 512, "global_batch": 16, "experts": {"ep": 4}})");
    const std::vector<std::string> commands = {"simulate --no-assumptions --json", "explain --json",
                                               "validate --json",
                                               "sweep --vary global_batch=16 --json --plan"};
    for (const std::string& cmd : commands) {
      CAPTURE(cmd);
      for (const char* hw : {"", "h800-sxm"}) {
        const Run r = run_cli(cmd + " " + plan.quoted() + (*hw ? std::string(" --hardware ") + hw : ""));
        REQUIRE_MESSAGE(r.exit_code == 0, r.err);
        CHECK(nlohmann::json::parse(r.out).at("hardware") == (*hw ? hw : "h100-sxm"));
      }
      const Run bad = run_cli(cmd + " " + plan.quoted() + " --hardware /nonexistent/profile.json");
      CHECK(bad.exit_code == 2);
      CHECK(lines(bad.err) == 1);
      CHECK(bad.err.find("/nonexistent/profile.json") != std::string::npos);
    }
  }

  TEST_CASE("bad arguments exit 2 with one line") {
    for (const char* args : {"", "frobnicate", "inspect --seq-len 0", "inspect --model", "inspect --bogus",
                             "inspect --model mixtral-8x7b --hardware h100-sxm", "validate"}) {
      CAPTURE(args);
      const Run r = run_cli(args);
      CHECK(r.exit_code == 2);
      CHECK(lines(r.err) == 1);
      CHECK(r.err.rfind("moeplan: error: ", 0) == 0);
      CHECK(r.out.empty());
    }
  }

  TEST_CASE("every file of the bad-input corpus exits 2 with one line naming the file and the field") {
    // tests/bad_input/expected.tsv: <file> TAB <text the message must contain>
    const fs::path root = fs::path(MOEPLAN_SOURCE_DIR) / "tests" / "bad_input";
    std::map<std::string, std::string> expected;
    std::ifstream tsv(root / "expected.tsv");
    std::string line;
    while (std::getline(tsv, line)) {
      if (line.empty() || line[0] == '#') continue;
      const auto tab = line.find('\t');
      REQUIRE(tab != std::string::npos);
      expected[line.substr(0, tab)] = line.substr(tab + 1);
    }
    int seen = 0;
    for (const auto& entry : fs::recursive_directory_iterator(root)) {
      if (!entry.is_regular_file() || entry.path().filename() == "expected.tsv" ||
          entry.path().filename() == "args.tsv" || entry.path().filename() == "README.md" ||
          fs::relative(entry.path(), root).string().starts_with("args/")) {
        continue;
      }
      const std::string rel = fs::relative(entry.path(), root).string();
      CAPTURE(rel);
      REQUIRE_MESSAGE(expected.contains(rel), "corpus file without an entry in expected.tsv");
      const std::string kind = rel.substr(0, rel.find('/'));
      const std::string file = "tests/bad_input/" + rel;
      std::string args;
      if (kind == "models") args = "inspect --model '" + file + "'";
      if (kind == "hwprofiles") args = "inspect --hardware '" + file + "'";
      if (kind == "plans") args = "validate '" + file + "'";
      REQUIRE_MESSAGE(!args.empty(), "corpus folders are models/, hwprofiles/ and plans/");
      const Run r = run_cli(args);
      CHECK(r.exit_code == 2);
      CHECK(lines(r.err) == 1);
      CHECK(r.out.empty());
      CHECK_MESSAGE(r.err.find(expected[rel]) != std::string::npos, r.err);
      CHECK_MESSAGE(r.err.find(entry.path().filename().string()) != std::string::npos, r.err);
      ++seen;
    }
    CHECK(seen == static_cast<int>(expected.size()));
    CHECK(seen >= 30);  // the corpus exists and covers every loader
    MESSAGE(seen << " bad-input files checked");
  }

  TEST_CASE("every command line of the bad-input corpus exits 2 with one line before any work") {
    // tests/bad_input/args.tsv: <arguments> TAB <text the message must contain>
    std::ifstream tsv(fs::path(MOEPLAN_SOURCE_DIR) / "tests" / "bad_input" / "args.tsv");
    std::string line;
    int seen = 0;
    while (std::getline(tsv, line)) {
      if (line.empty() || line[0] == '#') continue;
      const auto tab = line.find('\t');
      REQUIRE(tab != std::string::npos);
      const std::string args = line.substr(0, tab), text = line.substr(tab + 1);
      CAPTURE(args);
      const Run r = run_cli(args);
      CHECK(r.exit_code == 2);
      CHECK(lines(r.err) == 1);
      CHECK(r.out.empty());
      CHECK_MESSAGE(r.err.find(text) != std::string::npos, r.err);
      ++seen;
    }
    CHECK(seen >= 12);
  }

  TEST_CASE("validate exits 3 for a legal plan that does not fit in memory, naming the need and the HBM") {
    const std::string dir =
        fs::temp_directory_path() / ("moeplan_validate_mem_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    // Mixtral-8x22B on one node: about 141 B parameters over 8 GPUs.
    std::ofstream(dir + "/big.json") << R"({"model": "mixtral-8x22b", "hardware": "h100-sxm", "gpus": 8,
      "seq_len": 4096, "global_batch": 64, "experts": {"ep": 8}, "attention": {"tp": 8}})";
    const Run r = run_cli("validate '" + dir + "/big.json'");
    CHECK(r.exit_code == 3);
    CHECK(r.out.find("does not fit in memory") != std::string::npos);
    CHECK(r.out.find("of 79.65 GiB") != std::string::npos);
    const Run j = run_cli("validate --json '" + dir + "/big.json'");
    CHECK(j.exit_code == 3);
    const auto v = nlohmann::json::parse(j.out);
    CHECK(v.at("valid") == false);
    CHECK(v.at("violations").empty());
    CHECK(v.at("memory").at("fits") == false);
    CHECK(v.at("memory").at("per_gpu_bytes").get<double>() >
          v.at("memory").at("capacity_bytes").get<double>());
    fs::remove_all(dir);
  }

  TEST_CASE("validate exits 3 with every broken rule, 0 for a legal plan") {
    const std::string dir = fs::temp_directory_path() / ("moeplan_validate_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    {
      std::ofstream(dir + "/bad.json") << R"({"model": "mixtral-8x22b", "hardware": "h100-sxm", "gpus": 128,
        "seq_len": 4096, "global_batch": 256, "attention": {"tp": 5}, "experts": {"ep": 16}})";
      std::ofstream(dir + "/good.json") << R"({"model": "mixtral-8x22b", "hardware": "h100-sxm", "gpus": 128,
        "seq_len": 4096, "global_batch": 256, "attention": {"tp": 2}, "experts": {"ep": 8},
        "pipeline": {"pp": 8}})";
    }
    const Run bad = run_cli("validate --json '" + dir + "/bad.json'");
    CHECK(bad.exit_code == 3);
    const auto j = nlohmann::json::parse(bad.out);
    CHECK(j.at("valid") == false);
    CHECK(j.at("violations").size() >= 3);
    const Run good = run_cli("validate '" + dir + "/good.json'");
    CHECK(good.exit_code == 0);
    CHECK(good.out.find("valid") != std::string::npos);
    fs::remove_all(dir);
  }
}
