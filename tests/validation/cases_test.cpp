// The validation set (tests/validation/cases/*.json) stays apart from calibration: no hardware or stack
// profile, nor any calibration source, cites a validation case; and every case is a well-formed plan with a
// published measurement and its source.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "simulator/io/json_reader.h"
#include "simulator/io/model_loader.h"
#include "simulator/io/plan_io.h"
#include "simulator/io/stack_loader.h"

using namespace moeplan;
namespace fs = std::filesystem;

namespace {

const fs::path kRoot = MOEPLAN_SOURCE_DIR;

std::vector<io::json> cases() {
  std::vector<io::json> out;
  for (const auto& e : fs::directory_iterator(kRoot / "tests/validation/cases")) {
    if (e.path().extension() != ".json") continue;
    auto j = io::parse_json_file(e.path().string());
    REQUIRE_MESSAGE(j.ok(), (j.ok() ? "" : j.error().message));
    out.push_back(j.value());
  }
  return out;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Every file a prediction's numbers come from: the hardware profiles, their calibration sources, the stacks.
std::vector<fs::path> profile_files() {
  std::vector<fs::path> out;
  for (const auto& e : fs::recursive_directory_iterator(kRoot / "hwprofiles")) {
    if (e.is_regular_file() && e.path().filename() != "README.md") out.push_back(e.path());
  }
  return out;
}

}  // namespace

TEST_SUITE("validation") {
  TEST_CASE("no profile or calibration source cites a validation case") {
    const std::vector<io::json> all = cases();
    REQUIRE(all.size() >= 10);
    std::vector<std::pair<fs::path, std::string>> texts;
    for (const fs::path& p : profile_files()) texts.emplace_back(p, slurp(p));
    for (const io::json& c : all) {
      const std::string id = c.at("id").get<std::string>();
      CAPTURE(id);
      REQUIRE(c.contains("source_keys"));
      REQUIRE(!c.at("source_keys").empty());
      for (const auto& key : c.at("source_keys")) {
        const std::string k = key.get<std::string>();
        CHECK(k.size() >= 8);  // specific enough to mean the source
        for (const auto& [path, text] : texts) {
          CHECK_MESSAGE(text.find(k) == std::string::npos,
                        path.string() << " cites validation source '" << k << "' of case " << id);
          CHECK_MESSAGE(text.find(id) == std::string::npos, path.string() << " names validation case " << id);
        }
      }
    }
  }

  TEST_CASE("every validation case is a plan moeplan reads, with a published measurement and its source") {
    for (const io::json& c : cases()) {
      const std::string id = c.at("id").get<std::string>();
      CAPTURE(id);
      CHECK_FALSE(c.at("source").get<std::string>().empty());
      CHECK_FALSE(c.at("software").get<std::string>().empty());
      REQUIRE(c.at("measured").contains("tokens_per_s_per_gpu"));
      CHECK(c.at("measured").at("tokens_per_s_per_gpu").get<double>() > 0);
      const auto plan = io::plan_from_json(c.at("plan"), id);
      REQUIRE_MESSAGE(plan.ok(), (plan.ok() ? "" : plan.error().message));
      CHECK(io::load_model(plan.value().model).ok());
      const auto stack = io::load_stack(plan.value().stack);
      REQUIRE_MESSAGE(stack.ok(), (stack.ok() ? "" : stack.error().message));
      // The case's stack can run it: no stack capability is broken.
      CHECK(validate_for_stack(plan.value(), stack.value()).empty());
    }
  }

  TEST_CASE(
      "a case's plan overlaps exactly where its launch says: --delay-wgrad-compute, --tp-comm-overlap") {
    int delayed = 0, userbuffers = 0;
    for (const io::json& c : cases()) {
      const std::string id = c.at("id").get<std::string>();
      CAPTURE(id);
      const auto plan = io::plan_from_json(c.at("plan"), id);
      REQUIRE(plan.ok());
      const io::json flags = c.value("launch_flags", io::json::object());
      auto stated = [&](const char* key) { return flags.contains(key) && flags.at(key).get<bool>(); };
      CHECK(plan.value().overlap.delay_wgrad == stated("delay_wgrad_compute"));
      CHECK(plan.value().overlap.tp_comm == stated("tp_comm_overlap"));
      delayed += flags.contains("delay_wgrad_compute") ? 1 : 0;
      userbuffers += stated("tp_comm_overlap") ? 1 : 0;
    }
    CHECK(delayed >= 5);
    CHECK(userbuffers >= 1);
  }

  TEST_CASE("a case's plan captures CUDA graphs exactly where its launch says, with the same scopes") {
    int graphed = 0;
    for (const io::json& c : cases()) {
      const std::string id = c.at("id").get<std::string>();
      CAPTURE(id);
      const auto plan = io::plan_from_json(c.at("plan"), id);
      REQUIRE(plan.ok());
      const io::json& stated = c.at("launch").at("cuda_graphs");
      if (stated.is_null()) {
        CHECK(plan.value().cuda_graphs == 0);
        continue;
      }
      // "transformer_engine scope [moe_router, moe_preprocess]"
      const std::string text = stated.get<std::string>();
      REQUIRE(text.rfind("transformer_engine scope [", 0) == 0);
      const size_t open = text.find('['), close = text.find(']');
      REQUIRE(close != std::string::npos);
      std::vector<std::string> scopes;
      std::string list = text.substr(open + 1, close - open - 1);
      for (size_t at = 0; at <= list.size();) {
        const size_t comma = std::min(list.find(',', at), list.size());
        std::string word = list.substr(at, comma - at);
        word.erase(0, word.find_first_not_of(' '));
        if (!word.empty()) scopes.push_back(word);
        at = comma + 1;
      }
      std::vector<std::string> planned = cuda_graph_scope_names(plan.value().cuda_graphs);
      std::sort(scopes.begin(), scopes.end());
      std::sort(planned.begin(), planned.end());
      CHECK(planned == scopes);
      ++graphed;
    }
    CHECK(graphed >= 2);
  }
}
