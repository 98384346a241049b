// `moeplan calibrate` as a user meets it: a profile from a sources folder (the committed Hopper sources give
// the committed profiles), the fit report, a stack profile from a Kineto trace, and exit 2 with one line for
// bad input without writing anything.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/planner/cli/run_moeplan.h"

namespace fs = std::filesystem;
using namespace moeplan::test;

namespace {
std::string temp_path(const std::string& name) {
  return (fs::temp_directory_path() / (name + "_" + std::to_string(::getpid()) + ".json")).string();
}
}  // namespace

TEST_SUITE("cli") {
  TEST_CASE("calibrate builds the committed H100 profile from its sources") {
    const std::string out = temp_path("calibrated_h100");
    const Run r = run_cli("calibrate --sources hwprofiles/sources/h100-sxm -o '" + out + "'");
    CHECK(r.exit_code == 0);
    CHECK(r.out.find("h100-sxm: 20 collective curves") == 0);
    CHECK(slurp(out) == slurp(std::string(MOEPLAN_SOURCE_DIR) + "/hwprofiles/h100-sxm.json"));
    fs::remove(out);
  }

  TEST_CASE("calibrate reports the fit of a profile as JSON") {
    const Run r = run_cli("calibrate --hardware h800-sxm --json");
    REQUIRE(r.exit_code == 0);
    const auto j = nlohmann::json::parse(r.out);
    CHECK(j["profile"] == "h800-sxm");
    CHECK(j["tables"].size() > 20);
    for (const auto& f : j["facts"]) CHECK(f["holds"] == true);
  }

  TEST_CASE("calibrate fits a stack profile from a Kineto trace") {
    const std::string out = temp_path("fitted_stack");
    const Run r = run_cli(
        "calibrate --trace tests/simulator/calibrate/stack/data/kineto_small.json --hardware h100-sxm "
        "--stack megatron-core -o '" +
        out + "'");
    CHECK_MESSAGE(r.exit_code == 0, r.err);
    CHECK(slurp(out).find("\"format\": \"moeplan-stack-v2\"") != std::string::npos);
    fs::remove(out);
  }

  TEST_CASE("calibrate rejects bad input with one line and writes nothing") {
    const std::string out = temp_path("not_written");
    for (const std::string& args :
         {"calibrate --sources /nonexistent/folder -o '" + out + "'",
          "calibrate --trace tests/simulator/calibrate/stack/data/kineto_truncated.json --hardware h100-sxm "
          "-o '" +
              out + "'",
          "calibrate --trace models/tiny-moe.json --hardware h100-sxm -o '" + out + "'",
          "calibrate --trace tests/simulator/calibrate/stack/data/kineto_small.json -o '" + out + "'",
          std::string("calibrate")}) {
      CAPTURE(args);
      const Run r = run_cli(args);
      CHECK(r.exit_code == 2);
      CHECK(lines(r.err) == 1);
      CHECK_FALSE(fs::exists(out));
    }
  }
}
