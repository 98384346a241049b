// Strict JSON reading: each failure is one line naming the file, the field and what was expected.
#include <doctest/doctest.h>

#include <string>

#include "simulator/io/json_reader.h"

using namespace moeplan::io;

namespace {

std::string error_of(const std::string& text, void (*read)(const JsonNode&)) {
  auto j = parse_json_text(text, "f.json");
  REQUIRE(j.ok());
  try {
    read(JsonNode(j.value(), "f.json"));
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_SUITE("io") {
  TEST_CASE("malformed and truncated JSON name the line and column") {
    auto bad = parse_json_text("{\n  \"a\": 1,\n  \"b\": ]\n}", "x.json");
    REQUIRE_FALSE(bad.ok());
    CHECK(bad.error().message == "x.json: line 3, column 8: malformed JSON");
    auto cut = parse_json_text("{\"a\": [1, 2", "y.json");
    REQUIRE_FALSE(cut.ok());
    CHECK(cut.error().message.find("truncated") != std::string::npos);
    auto empty = parse_json_text("  \n", "z.json");
    CHECK(empty.error().message == "z.json: file is empty, expected a JSON object");
    auto arr = parse_json_text("[1]", "w.json");
    CHECK(arr.error().message == "w.json: top level: expected a JSON object, got array");
  }

  TEST_CASE("a missing file is one clear line") {
    auto r = parse_json_file("/nonexistent/dir/model.json");
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().message == "/nonexistent/dir/model.json: cannot open file (missing or unreadable)");
  }

  TEST_CASE("typed reads reject wrong types, ranges and non-finite numbers") {
    CHECK(error_of(R"({"n": "8"})", [](const JsonNode& r) { (void)r.integer("n", 1, 10); }) ==
          "f.json: field 'n': expected an integer in [1, 10], got string \"8\"");
    CHECK(error_of(R"({"n": 0})", [](const JsonNode& r) { (void)r.integer("n", 1, 10); }) ==
          "f.json: field 'n': expected an integer in [1, 10], got number 0");
    CHECK(error_of(R"({"n": 2.5})", [](const JsonNode& r) { (void)r.integer("n", 1, 10); }).find("integer") !=
          std::string::npos);
    CHECK(parse_json_text(R"({"x": 1e999})", "f.json").error().message ==
          "f.json: a number is too large to represent (overflow)");
    CHECK(error_of(R"({"x": 2e9})", [](const JsonNode& r) { (void)r.number("x", 0, 1e9); }) ==
          "f.json: field 'x': expected a finite number in [0, 1000000000], got number 2000000000.0");
    CHECK(error_of(R"({"o": {"b": 1}})", [](const JsonNode& r) { (void)r.object("o").boolean("b"); }) ==
          "f.json: field 'o.b': expected true or false, got number 1");
    CHECK(error_of(R"({})", [](const JsonNode& r) { (void)r.string("name"); }) ==
          "f.json: field 'name': required but missing");
  }

  TEST_CASE("unknown keys are errors with a did-you-mean suggestion") {
    CHECK(error_of(R"({"gpsu": 8})", [](const JsonNode& r) {
            r.only_keys({"gpus", "seq_len"});
          }) == "f.json: field 'gpsu': unknown key (did you mean 'gpus'?)");
    CHECK(error_of(R"({"zzzzzzz": 8})", [](const JsonNode& r) {
            r.only_keys({"gpus", "seq_len"});
          }) == "f.json: field 'zzzzzzz': unknown key");
  }

  TEST_CASE("closest_match picks the nearest known name") {
    CHECK(closest_match("micro_bach", {"micro_batch", "global_batch"}) == "micro_batch");
    CHECK(closest_match("experts", {"expert", "pipeline"}) == "expert");
    CHECK(closest_match("qqqqqqqqqq", {"tp", "sp"}).empty());
  }
}
