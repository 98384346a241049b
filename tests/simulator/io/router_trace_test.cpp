// Router traces load strictly (one count per expert, counts >= 0, known keys only), and every
// routing.distribution spec becomes a distribution or one line naming the file and field.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "simulator/io/router_trace.h"

using namespace moeplan;

namespace {

namespace fs = std::filesystem;

// A scratch folder for trace files, removed with the fixture.
struct TraceDir {
  // Per process: ctest runs test cases in parallel processes.
  fs::path dir = fs::temp_directory_path() / ("moeplan_router_trace_test_" + std::to_string(::getpid()));
  TraceDir() { fs::create_directories(dir); }
  ~TraceDir() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  std::string write(const std::string& name, const std::string& text) const {
    const fs::path p = dir / name;
    std::ofstream(p) << text;
    return p.string();
  }
};

std::string error_of(const Result<std::vector<double>>& r) {
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find('\n') == std::string::npos);
  return r.error().message;
}

std::string error_of(const Result<workload::RoutingDistribution>& r) {
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message.find('\n') == std::string::npos);
  return r.error().message;
}

}  // namespace

TEST_SUITE("io") {
  TEST_CASE("a router trace loads its counts and normalises into a distribution") {
    const TraceDir t;
    const std::string path = t.write("trace.json", R"({"format": "moeplan-router-trace-v1",
      "source": "step 1200 of a 4-expert test run", "expert_tokens": [10, 30, 0, 60]})");
    auto counts = io::load_router_trace(path, 4);
    REQUIRE_MESSAGE(counts.ok(), (counts.ok() ? "" : counts.error().message));
    CHECK(counts.value() == std::vector<double>{10, 30, 0, 60});

    // Relative to the plan's folder, or absolute.
    for (const std::string& spec : {std::string("trace.json"), path}) {
      auto d = io::routing_distribution(spec, 4, t.dir.string());
      REQUIRE_MESSAGE(d.ok(), (d.ok() ? "" : d.error().message));
      CHECK(d.value().expert_probability == std::vector<double>{0.1, 0.3, 0.0, 0.6});
    }
  }

  TEST_CASE("uniform and zipf specs need no file") {
    auto u = io::routing_distribution("uniform", 8, "");
    REQUIRE(u.ok());
    CHECK(u.value().expert_probability == std::vector<double>(8, 0.125));
    auto z = io::routing_distribution("zipf:1.5", 8, "");
    REQUIRE(z.ok());
    CHECK(z.value().expert_probability == workload::zipf_routing(8, 1.5).expert_probability);
    CHECK(error_of(io::routing_distribution("zipf:abc", 8, "")) ==
          "field 'routing.distribution': expected \"zipf:<s>\" with 0 < s < 100, got \"zipf:abc\"");
    CHECK(error_of(io::routing_distribution("zipf:0", 8, "")).find("0 < s < 100") != std::string::npos);
    CHECK(
        error_of(io::routing_distribution("", 8, "")) ==
        "field 'routing.distribution': expected \"uniform\", \"zipf:<s>\" or a router-trace file, got \"\"");
  }

  TEST_CASE("a missing trace file is one line naming the file and the field that named it") {
    const TraceDir t;
    const std::string missing = (t.dir / "nope.json").string();
    CHECK(error_of(io::routing_distribution("nope.json", 8, t.dir.string())) ==
          missing +
              ": cannot open file (missing or unreadable) (router trace named by routing.distribution)");
    CHECK(error_of(io::load_router_trace(missing, 8)) ==
          missing + ": cannot open file (missing or unreadable)");
  }

  TEST_CASE("a trace with the wrong expert count says how many it needs") {
    const TraceDir t;
    const std::string path = t.write("short.json", R"({"format": "moeplan-router-trace-v1", "source": "run",
      "expert_tokens": [1, 2, 3]})");
    CHECK(error_of(io::load_router_trace(path, 8)) ==
          path + ": field 'expert_tokens': expected 8 counts (one per routed expert), got 3");
  }

  TEST_CASE("negative, non-numeric and all-zero counts are rejected") {
    const TraceDir t;
    const std::string negative = t.write("neg.json", R"({"format": "moeplan-router-trace-v1", "source": "run",
      "expert_tokens": [4, -5, 1, 0]})");
    CHECK(error_of(io::load_router_trace(negative, 4)) ==
          negative +
              ": field 'expert_tokens[1]': expected a finite number in [0, 1000000000000000], got number -5");
    const std::string text = t.write("text.json", R"({"format": "moeplan-router-trace-v1", "source": "run",
      "expert_tokens": [4, "5", 1, 0]})");
    CHECK(error_of(io::load_router_trace(text, 4)).find("field 'expert_tokens[1]'") != std::string::npos);
    const std::string zero = t.write("zero.json", R"({"format": "moeplan-router-trace-v1", "source": "run",
      "expert_tokens": [0, 0]})");
    CHECK(error_of(io::load_router_trace(zero, 2)) ==
          zero + ": field 'expert_tokens': expected at least one positive count, got array [0,0]");
  }

  TEST_CASE("unknown keys, a wrong format and an empty source are errors") {
    const TraceDir t;
    const std::string typo = t.write("typo.json", R"({"format": "moeplan-router-trace-v1", "source": "run",
      "expert_token": [1, 2]})");
    CHECK(error_of(io::load_router_trace(typo, 2)) ==
          typo + ": field 'expert_token': unknown key (did you mean 'expert_tokens'?)");
    const std::string format = t.write("format.json", R"({"format": "router-trace", "source": "run",
      "expert_tokens": [1, 2]})");
    CHECK(error_of(io::load_router_trace(format, 2)) ==
          format + ": field 'format': expected \"moeplan-router-trace-v1\", got string \"router-trace\"");
    const std::string source = t.write("source.json", R"({"format": "moeplan-router-trace-v1", "source": " ",
      "expert_tokens": [1, 2]})");
    CHECK(error_of(io::load_router_trace(source, 2)).find("field 'source'") != std::string::npos);
    // Through routing_distribution the same line gains the field that named the trace.
    CHECK(error_of(io::routing_distribution("typo.json", 2, t.dir.string())) ==
          typo +
              ": field 'expert_token': unknown key (did you mean 'expert_tokens'?) (router trace named by "
              "routing.distribution)");
  }
}
