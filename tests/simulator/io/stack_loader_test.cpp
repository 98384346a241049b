// The shipped stack profiles load, convert µs to seconds once, keep efficiencies in (0, 1] and rows
// increasing, and every bad input is one line naming the field.
#include <doctest/doctest.h>

#include <string>

#include "simulator/core/stack.h"
#include "simulator/io/builtin_catalog.h"
#include "simulator/io/json_reader.h"
#include "simulator/io/stack_loader.h"

using namespace moeplan;

namespace {

const std::string kStacks = std::string(MOEPLAN_SOURCE_DIR) + "/hwprofiles/stacks/";

StackProfile load(const std::string& stem) {
  auto s = io::load_stack(kStacks + stem + ".json");
  REQUIRE_MESSAGE(s.ok(), (s.ok() ? "" : s.error().message));
  return s.value();
}

io::json moerun_json() {
  auto j = io::parse_json_file(kStacks + "moerun.json");
  REQUIRE_MESSAGE(j.ok(), (j.ok() ? "" : j.error().message));
  return j.value();
}

// The error message for `j` read as "s.json"; the test fails if it loads.
std::string error_of(const io::json& j) {
  auto s = io::stack_from_json(j, "s.json");
  REQUIRE_FALSE(s.ok());
  CHECK(s.error().message.find('\n') == std::string::npos);
  return s.error().message;
}

// A complete stack with round numbers: 1 µs per kernel, 2 µs per local expert, 30 µs per micro-batch.
io::json small_stack() {
  auto sourced = [](io::json v) { return io::json{{"value", v}, {"source", "test"}}; };
  return io::json{{"format", "moeplan-stack-v1"},
                  {"name", "small"},
                  {"calibrated", true},
                  {"host",
                   {{"launch_us_per_kernel", sourced(1)},
                    {"us_per_local_expert", sourced(2)},
                    {"us_per_micro_batch", sourced(30)}}},
                  {"grouped_gemm_efficiency", {{"source", "test"}, {"points", {{128, 0.5}, {1024, 0.9}}}}},
                  {"memory_bound_efficiency", sourced(0.75)},
                  {"dispatch_dedup", sourced(true)},
                  {"comm_sm_fraction", sourced(0)},
                  {"overlaps",
                   {{"inter_op", sourced(true)},
                    {"intra_op", sourced(false)},
                    {"dp_comm", sourced(true)},
                    {"pp_comm", sourced(false)}}}};
}

}  // namespace

TEST_SUITE("io") {
  TEST_CASE("the three shipped stacks load as uncalibrated assumptions with a source for every number") {
    for (const char* stem : {"moerun", "megatron-core", "megatron-core-deepep"}) {
      CAPTURE(stem);
      const StackProfile s = load(stem);
      CHECK(s.name == stem);
      CHECK_FALSE(s.calibrated);
      CHECK_FALSE(s.description.empty());
      CHECK_FALSE(s.sources.empty());
      CHECK_FALSE(s.grouped_gemm_efficiency_source.empty());
      for (const auto* src :
           {&s.launch_s_per_kernel.source, &s.host_s_per_local_expert.source,
            &s.host_s_per_micro_batch.source, &s.memory_bound_efficiency.source, &s.dispatch_dedup.source,
            &s.comm_sm_fraction.source, &s.overlaps.inter_op.source, &s.overlaps.intra_op.source,
            &s.overlaps.dp_comm.source, &s.overlaps.pp_comm.source}) {
        CHECK_FALSE(src->empty());
      }
      CHECK(s.memory_bound_efficiency.value > 0.0);
      CHECK(s.memory_bound_efficiency.value <= 1.0);
      CHECK(s.comm_sm_fraction.value >= 0.0);
      CHECK(s.comm_sm_fraction.value < 1.0);
    }
  }

  TEST_CASE(
      "grouped-GEMM efficiency lies between 0 and 1, rises with rows per expert and reaches 1 for large "
      "groups") {
    for (const char* stem : {"moerun", "megatron-core", "megatron-core-deepep"}) {
      CAPTURE(stem);
      const auto& curve = load(stem).grouped_gemm_efficiency;
      REQUIRE(curve.size() >= 2);
      for (size_t i = 0; i < curve.size(); ++i) {
        CAPTURE(i);
        CHECK(curve[i].second > 0.0);
        CHECK(curve[i].second <= 1.0);
        if (i > 0) {
          CHECK(curve[i].first > curve[i - 1].first);
          CHECK(curve[i].second >= curve[i - 1].second);
        }
      }
      CHECK(curve.back().second == doctest::Approx(1.0));
    }
  }

  TEST_CASE("host costs given in microseconds are held in seconds") {
    const auto s = io::stack_from_json(small_stack(), "small.json");
    REQUIRE_MESSAGE(s.ok(), (s.ok() ? "" : s.error().message));
    CHECK(s.value().launch_s_per_kernel.value == doctest::Approx(1e-6));
    CHECK(s.value().host_s_per_local_expert.value == doctest::Approx(2e-6));
    CHECK(s.value().host_s_per_micro_batch.value == doctest::Approx(30e-6));
    CHECK(s.value().calibrated);
    CHECK(s.value().comm_sm_fraction.value == 0.0);
    CHECK(s.value().grouped_gemm_efficiency.size() == 2);

    // moerun.json: launch_us_per_kernel 2.0, us_per_micro_batch 20.
    const StackProfile moerun = load("moerun");
    CHECK(moerun.launch_s_per_kernel.value == doctest::Approx(2e-6));
    CHECK(moerun.host_s_per_micro_batch.value == doctest::Approx(20e-6));
  }

  TEST_CASE(
      "only the DeepEP stack deduplicates dispatch per node, and only moerun fuses communication into "
      "GEMMs") {
    CHECK(load("megatron-core-deepep").dispatch_dedup.value);
    CHECK_FALSE(load("megatron-core").dispatch_dedup.value);
    CHECK_FALSE(load("moerun").dispatch_dedup.value);
    CHECK(load("moerun").overlaps.intra_op.value);
    CHECK_FALSE(load("megatron-core").overlaps.intra_op.value);
    CHECK(load("megatron-core").overlaps.dp_comm.value);
  }

  TEST_CASE("a relative stack path resolves against the base directory") {
    const auto s = io::load_stack("hwprofiles/stacks/megatron-core.json", MOEPLAN_SOURCE_DIR);
    REQUIRE_MESSAGE(s.ok(), (s.ok() ? "" : s.error().message));
    CHECK(s.value().name == "megatron-core");
  }

  TEST_CASE("built-in stacks load by name when the build embeds them") {
    // A standalone build without the generated catalog has no built-ins; the CMake build embeds
    // hwprofiles/stacks.
    if (io::builtin_names("hwprofiles/stacks").empty()) return;
    const auto s = io::load_stack("moerun");
    REQUIRE_MESSAGE(s.ok(), (s.ok() ? "" : s.error().message));
    CHECK(s.value().name == "moerun");
  }

  TEST_CASE("an unknown key is an error with a did-you-mean suggestion") {
    io::json j = moerun_json();
    j["comm_sm_fractoin"] = j["comm_sm_fraction"];
    CHECK(error_of(j) == "s.json: field 'comm_sm_fractoin': unknown key (did you mean 'comm_sm_fraction'?)");

    j = moerun_json();
    j["host"]["launch_us_per_kernal"] = j["host"]["launch_us_per_kernel"];
    CHECK(error_of(j) ==
          "s.json: field 'host.launch_us_per_kernal': unknown key (did you mean 'launch_us_per_kernel'?)");
  }

  TEST_CASE("an efficiency above 1 or at 0 is rejected, naming the point") {
    io::json j = moerun_json();
    j["grouped_gemm_efficiency"]["points"][1][1] = 1.5;
    CHECK(error_of(j) ==
          "s.json: field 'grouped_gemm_efficiency.points[1][1]': expected an efficiency in (0, 1], got "
          "number 1.5");

    j = moerun_json();
    j["grouped_gemm_efficiency"]["points"][0][1] = 0;
    CHECK(error_of(j) ==
          "s.json: field 'grouped_gemm_efficiency.points[0][1]': expected an efficiency in (0, 1], got "
          "number 0");

    j = moerun_json();
    j["memory_bound_efficiency"]["value"] = 1.5;
    CHECK(error_of(j) ==
          "s.json: field 'memory_bound_efficiency.value': expected an efficiency in (0, 1], got number 1.5");

    j = moerun_json();
    j["comm_sm_fraction"]["value"] = 1;
    CHECK(error_of(j) ==
          "s.json: field 'comm_sm_fraction.value': expected a fraction in [0, 1), got number 1");
  }

  TEST_CASE("rows per expert must increase strictly") {
    io::json j = moerun_json();
    j["grouped_gemm_efficiency"]["points"] = {{128, 0.4}, {64, 0.2}};
    CHECK(
        error_of(j) ==
        "s.json: field 'grouped_gemm_efficiency.points[1][0]': expected rows per expert strictly increasing "
        "(previous point has 128), got number 64");

    j["grouped_gemm_efficiency"]["points"] = {{128, 0.4, 7}};
    CHECK(error_of(j).find("'grouped_gemm_efficiency.points[0]': expected an array of 2 numbers") !=
          std::string::npos);

    j["grouped_gemm_efficiency"]["points"] = io::json::array();
    CHECK(
        error_of(j) ==
        "s.json: field 'grouped_gemm_efficiency.points': expected at least one [rows_per_expert, efficiency] "
        "point, got array []");
  }

  TEST_CASE("every number needs a non-empty source") {
    io::json j = moerun_json();
    j["overlaps"]["pp_comm"].erase("source");
    CHECK(error_of(j) == "s.json: field 'overlaps.pp_comm.source': required but missing");

    j = moerun_json();
    j["host"]["us_per_micro_batch"]["source"] = "  ";
    CHECK(error_of(j) ==
          "s.json: field 'host.us_per_micro_batch.source': expected a non-empty citation, got string \"  \"");

    j = moerun_json();
    j["grouped_gemm_efficiency"].erase("source");
    CHECK(error_of(j) == "s.json: field 'grouped_gemm_efficiency.source': required but missing");
  }

  TEST_CASE("the format tag, value types and host cost ranges are checked") {
    io::json j = moerun_json();
    j["format"] = "moeplan-hwprofile-v1";
    CHECK(error_of(j) ==
          "s.json: field 'format': expected \"moeplan-stack-v1\", got string \"moeplan-hwprofile-v1\"");

    j = moerun_json();
    j["dispatch_dedup"]["value"] = "yes";
    CHECK(error_of(j) == "s.json: field 'dispatch_dedup.value': expected true or false, got string \"yes\"");

    j = moerun_json();
    j["host"]["launch_us_per_kernel"]["value"] = -1;
    CHECK(error_of(j).find("'host.launch_us_per_kernel.value': expected a finite number in [0, 1000]") !=
          std::string::npos);

    j = moerun_json();
    j.erase("calibrated");
    CHECK(error_of(j) == "s.json: field 'calibrated': required but missing");
  }

  TEST_CASE("a missing stack file is an error naming the path") {
    const auto s = io::load_stack("/nonexistent/stack.json");
    REQUIRE_FALSE(s.ok());
    CHECK(s.error().message.find("/nonexistent/stack.json: no such file") != std::string::npos);
  }
}
