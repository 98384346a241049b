// Golden `moeplan simulate --json` reports for fixed model x hardware x plan cases (SimGrid TESH, ASTRA-sim
// refs): any change to a prediction shows up here as a named field. Regenerate with MOEPLAN_UPDATE_GOLDEN=1
// (see tests/golden/README.md).
#include <doctest/doctest.h>

#include "tests/planner/cli/run_moeplan.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using namespace moeplan::test;  // Run, slurp, run_cli, lines

constexpr double kRelativeTolerance = 1e-9;
constexpr size_t kMaxDiffsShown = 20;

// Fields of the report left out of the golden files: "ops" is the per-op summary (thousands of rows).
const std::vector<std::string> kStrippedFields = {"ops"};

const char* type_of(const json& j) {
  if (j.is_number()) return "number";  // integer and floating point compare as numbers
  return j.type_name();
}

// Appends one line per difference between `got` and `want` to `diffs`, each naming its JSON pointer.
// Numbers match within kRelativeTolerance; strings, booleans, nulls and array lengths exactly; objects must
// have the same key sets.
void compare(const json& got, const json& want, const std::string& where, std::vector<std::string>& diffs) {
  const std::string at = where.empty() ? "/" : where;
  if (std::string(type_of(got)) != type_of(want)) {
    diffs.push_back(at + ": " + type_of(got) + " " + got.dump() + ", golden has " + type_of(want) + " " +
                    want.dump());
    return;
  }
  if (got.is_number()) {
    const double a = got.get<double>(), b = want.get<double>();
    if (a != b && !(std::abs(a - b) <= kRelativeTolerance * std::max(std::abs(a), std::abs(b)))) {
      diffs.push_back(at + ": " + got.dump() + ", golden " + want.dump());
    }
  } else if (got.is_object()) {
    for (const auto& [k, v] : got.items()) {
      if (!want.contains(k)) diffs.push_back(where + "/" + k + ": not in the golden file");
    }
    for (const auto& [k, v] : want.items()) {
      if (!got.contains(k)) {
        diffs.push_back(where + "/" + k + ": in the golden file, missing from the report");
      } else {
        compare(got.at(k), v, where + "/" + k, diffs);
      }
    }
  } else if (got.is_array()) {
    if (got.size() != want.size()) {
      diffs.push_back(at + ": " + std::to_string(got.size()) + " elements, golden " +
                      std::to_string(want.size()));
      return;
    }
    for (size_t i = 0; i < got.size(); ++i) compare(got[i], want[i], where + "/" + std::to_string(i), diffs);
  } else if (got != want) {
    diffs.push_back(at + ": " + got.dump() + ", golden " + want.dump());
  }
}

bool updating() {
  const char* v = std::getenv("MOEPLAN_UPDATE_GOLDEN");
  return v != nullptr && std::string(v) == "1";
}

}  // namespace

TEST_SUITE("cli") {
  TEST_CASE("simulate --json matches the golden report of every case in tests/golden") {
    // tests/golden/plans/<case>.json -> tests/golden/<case>.json: the report without kStrippedFields.
    const fs::path root = fs::path(MOEPLAN_SOURCE_DIR) / "tests" / "golden";
    std::vector<std::string> cases;
    for (const auto& e : fs::directory_iterator(root / "plans")) {
      if (e.path().extension() == ".json") cases.push_back(e.path().stem().string());
    }
    std::sort(cases.begin(), cases.end());
    CHECK(cases.size() >= 3);

    for (const std::string& name : cases) {
      CAPTURE(name);
      const Run r = run_cli("simulate --json 'tests/golden/plans/" + name + ".json'");
      // A case that stops fitting still prints its report (exit 3); the diff then shows memory.fits.
      REQUIRE_MESSAGE((r.exit_code == 0 || r.exit_code == 3), r.err);
      json report = json::parse(r.out);
      REQUIRE(report.at("valid") == true);
      for (const auto& field : kStrippedFields) report.erase(field);

      const fs::path golden = root / (name + ".json");
      if (updating()) {
        std::ofstream(golden) << report.dump(2) << "\n";
        MESSAGE("MOEPLAN_UPDATE_GOLDEN=1: rewrote " << golden.string());
        continue;
      }
      REQUIRE_MESSAGE(fs::exists(golden), golden.string()
                                              << " is missing; run the test with MOEPLAN_UPDATE_GOLDEN=1 to "
                                                 "write it");
      std::ifstream f(golden);
      const json want = json::parse(f);
      std::vector<std::string> diffs;
      compare(report, want, "", diffs);
      std::ostringstream shown;
      for (size_t i = 0; i < std::min(diffs.size(), kMaxDiffsShown); ++i) shown << "\n  " << diffs[i];
      if (diffs.size() > kMaxDiffsShown) shown << "\n  ... " << diffs.size() - kMaxDiffsShown << " more";
      CHECK_MESSAGE(diffs.empty(), diffs.size()
                                       << " difference(s) from " << golden.string() << ":" << shown.str()
                                       << "\nif the change is intended, rerun with "
                                          "MOEPLAN_UPDATE_GOLDEN=1 and review the diff");
    }

    // Every golden report has its plan (a renamed or deleted plan leaves no stale golden file behind).
    for (const auto& e : fs::directory_iterator(root)) {
      if (e.path().extension() != ".json") continue;
      CAPTURE(e.path().string());
      CHECK(std::find(cases.begin(), cases.end(), e.path().stem().string()) != cases.end());
    }
  }
}
