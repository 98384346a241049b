// `moeplan plan` as a user meets it: the default job on the stack users run, each plan's range and whether it
// is tied with the best, MFU against the plan's own precision, the legend and the next command, --fix pins
// that are checked (or honoured) before a search, what to do when nothing fits, and time-to-train.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tests/planner/cli/run_moeplan.h"

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

using namespace moeplan::test;  // Run, run_cli, lines

// A small job that plans in well under a second.
constexpr const char* kTinyJob = "--model tiny-moe --hardware h100-sxm --gpus 8 --seq-len 512";

json plan_json(const std::string& args) {
  const Run r = run_cli("plan " + std::string(kTinyJob) + " " + args + " --json");  // args give the batch
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  return json::parse(r.out);
}

}  // namespace

TEST_SUITE("cli") {
  TEST_CASE(
      "plan with no arguments ranks the default job on the Megatron-Core stack, with legend and next step") {
    const Run r = run_cli("plan");
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    CHECK(r.out.find("mixtral-8x22b on 128 x h100-sxm (megatron-core stack") != std::string::npos);
    CHECK(r.out.find("HYPOTHETICAL") == std::string::npos);  // Megatron-Core's numbers are not targets
    for (const char* s :
         {"range", "vs #1", "best", "exp.com", "mem GiB", "layout: attention tp", "dp data-parallel",
          "next: moeplan plan ... --out-dir", "--for megatron", "of 79.65 GiB per GPU"}) {
      CAPTURE(s);
      CHECK(r.out.find(s) != std::string::npos);
    }
    // Plans listed after #1 with more tokens/s ("+" against #1: listed later for memory) are the ones the
    // ranking's check names as faster as given, and only those.
    std::string faster;
    const std::regex row(R"(^\s*(\d+)\s+tp\d.*\s\+\d+\.\d%=?\s)");
    std::istringstream lines(r.out);
    for (std::string line; std::getline(lines, line);) {
      std::smatch m;
      if (std::regex_search(line, m, row)) faster += (faster.empty() ? "#" : ", #") + m[1].str();
    }
    CAPTURE(faster);
    CHECK((r.out.find("faster than #1 as given") != std::string::npos) == !faster.empty());
    // Among the rows tied with #1, those with memory margin come first, chosen from every finalist: no tight
    // tied row before a tied row with margin. The default job's fastest finalists are tight and tie with
    // plans that fit wholly, so the list starts with those, and a line says how many faster tight plans were
    // left out, naming the fastest with the --top that lists it.
    const std::regex tied_row(R"(^\s*(\d+)\s+tp\d.*(best|%=).*$)");
    bool tight_seen = false;
    int tied_rows = 0;
    std::istringstream table(r.out);
    for (std::string line; std::getline(table, line);) {
      if (!std::regex_match(line, tied_row)) continue;
      CAPTURE(line);
      ++tied_rows;
      const bool tight = line.find("(tight") != std::string::npos;
      CHECK_FALSE((tight_seen && !tight));
      tight_seen = tight_seen || tight;
    }
    CHECK(tied_rows > 0);
    const std::regex unlisted(
        R"((\d+) faster plans? tied with #1 but tight (is|are) not listed; the fastest, at #(\d+) )"
        R"(\(--top (\d+) lists it\): (tp\d[^,]*),)");
    std::smatch u;
    REQUIRE(std::regex_search(r.out, u, unlisted));
    CHECK(std::stoi(u[1].str()) > 0);
    CHECK(u[3].str() == u[4].str());
    CHECK(std::stoi(u[3].str()) > 5);
    // --json says the same.
    const Run as_json = run_cli("plan --no-assumptions --json");
    REQUIRE_MESSAGE(as_json.exit_code == 0, as_json.err);
    const json j = json::parse(as_json.out);
    CHECK(j.at("faster_tight_unlisted").get<int>() == std::stoi(u[1].str()));
    const json& fastest = j.at("fastest_tight_unlisted");
    CHECK(fastest.at("rank").get<int>() == std::stoi(u[3].str()));
    CHECK(fastest.at("layout").get<std::string>() == u[5].str());
    CHECK(fastest.at("memory_per_gpu_bytes_range")[1].get<double>() >
          j.at("hbm_capacity_bytes").get<double>());
    // Listed with that --top: the named plan at that place, tight. A tight plan shows its memory range: the
    // low end fits the 79.65 GiB, the high end does not, and the "mem GiB" column (the middle) lies between.
    const Run longer = run_cli("plan --no-assumptions --top " + u[4].str());
    REQUIRE_MESSAGE(longer.exit_code == 0, longer.err);
    const std::regex numbered(R"(^\s*)" + u[3].str() + R"(\s+(tp\d.*\S)\s+\d+\s+\d+-\d+\s)");
    const std::regex tight(R"(\s(\d+\.\d)\s+\S+\s+\S+\s+\(tight: (\d+\.\d)-(\d+\.\d) GiB\))");
    int tight_rows = 0;
    bool named_listed = false;
    std::istringstream rows(longer.out);
    for (std::string line; std::getline(rows, line);) {
      std::smatch m;
      if (std::regex_search(line, m, numbered)) {
        CAPTURE(line);
        named_listed = true;
        CHECK(m[1].str() == u[5].str());
        CHECK(line.find("(tight") != std::string::npos);
      }
      if (!std::regex_search(line, m, tight)) continue;
      CAPTURE(line);
      ++tight_rows;
      const double mid = std::stod(m[1].str()), low = std::stod(m[2].str()), high = std::stod(m[3].str());
      CHECK(low <= 79.65);
      CHECK(high > 79.6);
      CHECK(low <= mid);
      CHECK(mid <= high);
    }
    CHECK(named_listed);
    CHECK(tight_rows > 0);
    // Every "(tight" in the table carries its range.
    size_t labels = 0;
    for (size_t at = longer.out.find("(tight"); at != std::string::npos;
         at = longer.out.find("(tight", at + 1))
      ++labels;
    CHECK(static_cast<size_t>(tight_rows) == labels);
    if (!faster.empty())
      CHECK(r.out.find(faster + (faster.find(',') == std::string::npos ? " is" : " are") +
                       " faster than #1 as given") != std::string::npos);
  }

  TEST_CASE(
      "plan says what #1 rests on: its step over the unmeasured numbers and whether another overtakes") {
    const json j = plan_json("--global-batch 32 --top 4");
    const json& a = j.at("assumptions");
    const double step = j.at("plans")[0].at("predicted").at("step_time_s");
    CHECK(a.at("step_time_s_range")[0].get<double>() <= step);
    CHECK(a.at("step_time_s_range")[1].get<double>() >= step);
    const json& rank = j.at("ranking_over_assumptions");
    CHECK(rank.at("ends").get<int>() >= 10);
    // Each counted plan at each end, less the ends of numbers a plan does not price.
    CHECK(rank.at("predictions").get<int>() > 0);
    CHECK(rank.at("predictions").get<int>() <= 4 * rank.at("ends").get<int>());
    // Plans listed after #1 although faster as given (for memory) are named, and never counted as overtaking.
    std::vector<int> faster_as_given;
    for (const json& p : rank.at("faster_as_given")) {
      const int at = p.get<int>();
      CHECK(at >= 2);
      CHECK(at <= 4);
      CHECK(j.at("plans")[static_cast<size_t>(at - 1)].at("predicted").at("step_time_s").get<double>() <
            step);
      faster_as_given.push_back(at);
    }
    for (const json& t : rank.at("overtakes")) {
      CHECK(t.at("rank").get<int>() >= 2);
      CHECK(t.at("rank").get<int>() <= 4);
      CHECK(std::find(faster_as_given.begin(), faster_as_given.end(), t.at("rank").get<int>()) ==
            faster_as_given.end());
      CHECK(t.at("faster_than_first").get<double>() > 0);
    }
    // The text says the same as the JSON.
    const Run text = run_cli("plan " + std::string(kTinyJob) + " --global-batch 32 --top 4");
    REQUIRE(text.exit_code == 0);
    CHECK(text.out.find("#1 over the stack's and the hardware's unmeasured numbers") != std::string::npos);
    const size_t plans = j.at("plans").size(), compared = plans - faster_as_given.size();
    CHECK((text.out.find("faster than #1 as given, listed after it for memory") != std::string::npos) ==
          !faster_as_given.empty());
    const size_t overtaken = rank.at("overtakes").size();
    if (compared >= 2 && overtaken == 0) {
      CHECK(text.out.find(fmt::format("#1 stays the fastest of the {} listed", compared)) !=
            std::string::npos);
    }
    if (overtaken > 0) {
      CHECK(text.out.find(fmt::format("overtakes it at {} of the {} ends", overtaken,
                                      rank.at("ends").get<int>())) != std::string::npos);
    }
    // An overtaking's margin is printed with the digits it needs: never "0.0%", which reads as a tie.
    const std::regex margin(R"(#\d is (under 0\.01|\d+\.\d+)% faster)");
    std::istringstream lines(text.out);
    for (std::string line; std::getline(lines, line);) {
      std::smatch m;
      if (!std::regex_search(line, m, margin)) continue;
      CAPTURE(line);
      if (m[1].str() != "under 0.01") CHECK(std::stod(m[1].str()) > 0);
    }
    CHECK_FALSE(plan_json("--global-batch 32 --top 4 --no-assumptions").contains("assumptions"));
  }

  TEST_CASE("plan --json: ranges, ties with the best and MFU against the plan's precision") {
    const json j = plan_json("--global-batch 32 --top 8");
    CHECK(j.at("stack") == "megatron-core");
    CHECK(j.at("stack_calibrated") == false);
    const auto& plans = j.at("plans");
    REQUIRE(plans.size() >= 2);
    const json& best = plans[0].at("predicted");
    CHECK(plans[0].at("tied_with_best") == true);
    int tied = 0;
    for (const auto& p : plans) {
      const json& q = p.at("predicted");
      const double low = q.at("tokens_per_s_range")[0], high = q.at("tokens_per_s_range")[1];
      CHECK(low < q.at("tokens_per_s").get<double>());
      CHECK(high > q.at("tokens_per_s").get<double>());
      const bool overlaps = high >= best.at("tokens_per_s_range")[0].get<double>();
      CHECK(p.at("tied_with_best") == overlaps);
      tied += overlaps ? 1 : 0;
      // H100: FP8 dense peak 1979 TFLOP/s, BF16 989.4 (hwprofiles/h100-sxm.json).
      const std::string dtype = q.at("mfu_peak_dtype");
      CHECK(dtype == p.at("plan").at("precision"));
      const double ratio = q.at("mfu_bf16_equivalent").get<double>() / q.at("mfu").get<double>();
      CHECK(ratio == doctest::Approx(dtype == "fp8" ? 1979.0 / 989.4 : 1.0).epsilon(1e-3));
    }
    MESSAGE(tied << " of " << plans.size() << " plans tied with the best");
  }

  TEST_CASE("plan --list-keys lists every plan key --fix takes, optional ones included") {
    const Run r = run_cli("plan --list-keys");
    REQUIRE(r.exit_code == 0);
    for (const char* k :
         {"experts.ep", "pipeline.vpp", "micro_batch", "overlap.cross_micro_batch", "fp8_recipe",
          "routing.fused_router", "cross_entropy", "experts.fp8_padding", "attention.mla_down_proj",
          "overlap.tp_comm", "overlap.shared_experts", "routing.pad_to_capacity"}) {
      CAPTURE(k);
      CHECK(r.out.find(std::string(k) + "\n") != std::string::npos);
    }
  }

  TEST_CASE("a --fix value outside the search's lists is honoured, not silently matched by nothing") {
    // The search enumerates micro-batches 1, 2 and 4; 8 is taken as asked.
    const json j = plan_json("--fix micro_batch=8 --global-batch 64 --top 3");
    REQUIRE(!j.at("plans").empty());
    for (const auto& p : j.at("plans")) CHECK(p.at("plan").at("micro_batch") == 8);
  }

  TEST_CASE("--fix takes false for a switch the plan file leaves out when off") {
    // overlap.cross_micro_batch is written only when on; false pins the plans without it (it used to read
    // nothing and match no plan).
    const json off = plan_json("--global-batch 32 --top 3 --fix overlap.cross_micro_batch=false");
    REQUIRE(!off.at("plans").empty());
    for (const auto& p : off.at("plans"))
      CHECK_FALSE(p.at("plan").at("overlap").contains("cross_micro_batch"));
  }

  TEST_CASE("a --fix value no plan of the space has exits 2 naming the values the space has") {
    const Run r = run_cli("plan " + std::string(kTinyJob) + " --global-batch 32 --fix experts.ep=3");
    CHECK(r.exit_code == 2);
    CHECK(lines(r.err) == 1);
    CHECK(r.err.find("--fix experts.ep=3: no plan of the search space") != std::string::npos);
    CHECK(r.err.find("the values it has: 1, 2, 4, 8") != std::string::npos);
  }

  TEST_CASE("when nothing fits, plan says the smallest need found and a GPU count that fits") {
    // Mixtral-8x22B (141 B parameters) cannot be trained on one node.
    const Run r = run_cli("plan --gpus 8 --global-batch 64 --json");
    CHECK(r.exit_code == 3);
    const json j = json::parse(r.out);
    CHECK(j.at("plans").empty());
    const double need = j.at("smallest_memory_need").at("memory_per_gpu_bytes_low");
    CHECK(need > j.at("hbm_capacity_bytes").get<double>());
    const Run text = run_cli("plan --gpus 8 --global-batch 64");
    CHECK(text.exit_code == 3);
    CHECK(text.out.find("no plan fits: the smallest memory need found is") != std::string::npos);
    CHECK(text.out.find("GPUs (") != std::string::npos);
    CHECK(text.out.find("plans that fit: moeplan plan --gpus") != std::string::npos);
  }

  TEST_CASE("--tokens gives time-to-train and GPU-hours from each plan's rate and range") {
    const json j = plan_json("--global-batch 32 --tokens 1e12 --gpu-hour-cost 2.5 --top 2");
    for (const auto& p : j.at("plans")) {
      const json& q = p.at("predicted");
      const json& t = p.at("time_to_train");
      const double hours = 1e12 / q.at("tokens_per_s").get<double>() / 3600;
      CHECK(t.at("hours").get<double>() == doctest::Approx(hours));
      CHECK(t.at("gpu_hours").get<double>() == doctest::Approx(hours * 8));
      CHECK(t.at("cost").get<double>() == doctest::Approx(hours * 8 * 2.5));
      CHECK(t.at("hours_range")[0].get<double>() < hours);
      CHECK(t.at("hours_range")[1].get<double>() > hours);
    }
    const Run r = run_cli("plan " + std::string(kTinyJob) + " --global-batch 32 --gpu-hour-cost 2");
    CHECK(r.exit_code == 2);
    CHECK(r.err.find("--gpu-hour-cost needs --tokens") != std::string::npos);
  }

  TEST_CASE("plans saved by --out-dir name their inputs so they load from any folder") {
    // A model file given relative to the working directory (not a built-in), saved plans in another folder.
    const fs::path dir = fs::temp_directory_path() / ("moeplan_outdir_" + std::to_string(::getpid()));
    fs::create_directories(dir / "models" / "mine");
    fs::copy_file(fs::path(MOEPLAN_SOURCE_DIR) / "models" / "tiny-moe.json",
                  dir / "models" / "mine" / "my-moe.json", fs::copy_options::overwrite_existing);
    const std::string model =
        fs::relative(dir / "models" / "mine" / "my-moe.json", MOEPLAN_SOURCE_DIR).string();
    const Run r =
        run_cli("plan --model '" + model + "' --hardware h100-sxm --gpus 8 --seq-len 512 --global-batch 32 " +
                "--top 2 --out-dir '" + (dir / "plans").string() + "'");
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    const json saved = json::parse(slurp((dir / "plans" / "plan1.json").string()));
    CHECK(saved.at("model") == "../models/mine/my-moe.json");
    CHECK(saved.at("hardware") == "h100-sxm");
    const Run sim = run_cli("simulate '" + (dir / "plans" / "plan1.json").string() + "' --json");
    CHECK_MESSAGE(sim.exit_code == 0, sim.err);
    fs::remove_all(dir);
  }

  TEST_CASE("a saved plan's report holds the per-op summary that simulate gives for it") {
    // The search predicts its finalists without the summary; the plans it keeps for --out-dir are predicted
    // again with it.
    const fs::path dir = fs::temp_directory_path() / ("moeplan_outdir_ops_" + std::to_string(::getpid()));
    const Run r = run_cli("plan " + std::string(kTinyJob) + " --global-batch 32 --top 2 --out-dir '" +
                          (dir / "plans").string() + "'");
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    for (const char* name : {"plan1", "plan2"}) {
      CAPTURE(name);
      const json report = json::parse(slurp((dir / "plans" / (std::string(name) + ".report.json")).string()));
      const Run sim = run_cli("simulate '" + (dir / "plans" / (std::string(name) + ".json")).string() +
                              "' --json --no-assumptions");
      REQUIRE_MESSAGE(sim.exit_code == 0, sim.err);
      const json simulated = json::parse(sim.out);
      REQUIRE(!report.at("ops").empty());
      REQUIRE(report.at("ops").size() == simulated.at("ops").size());
      for (size_t i = 0; i < report.at("ops").size(); ++i) {
        CHECK(report.at("ops")[i].at("op") == simulated.at("ops")[i].at("op"));
        CHECK(report.at("ops")[i].at("count") == simulated.at("ops")[i].at("count"));
        CHECK(report.at("ops")[i].at("total_s").get<double>() ==
              doctest::Approx(simulated.at("ops")[i].at("total_s").get<double>()).epsilon(1e-9));
      }
    }
    fs::remove_all(dir);
  }
}
