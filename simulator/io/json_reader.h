// Strict reading of JSON input: every read names its file and field, and every bad value becomes one line
// "FILE: field 'PATH': expected WHAT, got VALUE". Loaders throw InputError internally and return Result<T>.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "simulator/core/hardware.h"
#include "simulator/core/status.h"

namespace moeplan::io {

using nlohmann::json;

struct InputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The closest of `known` to `key` by edit distance, or "" when nothing is close.
std::string closest_match(std::string_view key, const std::vector<std::string>& known);

// Reads and parses a JSON file whose top level is an object. Errors: missing, unreadable, empty, malformed
// (with line and column), or not an object.
Result<json> parse_json_file(const std::string& path);
Result<json> parse_json_text(std::string_view text, const std::string& label);

// A JSON value at `path` inside `file`. The path is spelled out only for an error: a node keeps its parent's
// path and its own key or index, shared with its children, so reading a large profile (tens of thousands of
// table cells) formats nothing.
class JsonNode {
 public:
  JsonNode(const json& value, std::string file, std::string path = "");

  const json& raw() const { return *v_; }
  const std::string& file() const { return *file_; }
  std::string path() const;  // "a.b[3].c"; empty at the top level

  bool has(std::string_view key) const;  // present and not null
  JsonNode object(std::string_view key) const;
  std::optional<JsonNode> optional_object(std::string_view key) const;
  std::vector<JsonNode> array(std::string_view key) const;
  std::vector<JsonNode> elements() const;  // this node must be an array

  int64_t integer(std::string_view key, int64_t lo, int64_t hi) const;
  int64_t integer_or(std::string_view key, int64_t fallback, int64_t lo, int64_t hi) const;
  double number(std::string_view key, double lo, double hi) const;
  double number_or(std::string_view key, double fallback, double lo, double hi) const;
  bool boolean(std::string_view key) const;
  bool boolean_or(std::string_view key, bool fallback) const;
  std::string string(std::string_view key) const;
  std::string string_or(std::string_view key, std::string fallback) const;

  // This node itself as a value (array elements).
  int64_t as_integer(int64_t lo, int64_t hi) const;
  double as_number(double lo, double hi) const;

  template <class E>
  E choice(std::string_view key, std::initializer_list<std::pair<const char*, E>> options) const;
  template <class E>
  E choice_or(std::string_view key, E fallback,
              std::initializer_list<std::pair<const char*, E>> options) const;

  // Unknown keys in our own schemas are errors, with a "did you mean" suggestion.
  void only_keys(std::initializer_list<std::string_view> known) const;

  [[noreturn]] void fail(std::string_view key, std::string_view expected) const;
  [[noreturn]] void fail_here(std::string_view expected) const;
  std::string field(std::string_view key) const;

 private:
  // One step of a path: a key of an object or, with index >= 0, an element of an array.
  struct Step {
    std::shared_ptr<const Step> parent;
    std::string key;
    int64_t index = -1;
  };

  JsonNode(const json& value, std::shared_ptr<const std::string> file, std::shared_ptr<const Step> step)
      : v_(&value), file_(std::move(file)), step_(std::move(step)) {}

  const json& get(std::string_view key) const;  // required: fails when absent or null
  JsonNode child(std::string_view key) const;
  std::string describe(const json& v) const;

  const json* v_;
  std::shared_ptr<const std::string> file_;
  std::shared_ptr<const Step> step_;  // null at the top level
};

template <class E>
E JsonNode::choice(std::string_view key, std::initializer_list<std::pair<const char*, E>> options) const {
  const std::string s = string(key);
  std::string expected = "one of";
  for (const auto& [name, value] : options) {
    if (s == name) return value;
    expected += std::string(" \"") + name + "\"";
  }
  fail(key, expected);
}

template <class E>
E JsonNode::choice_or(std::string_view key, E fallback,
                      std::initializer_list<std::pair<const char*, E>> options) const {
  return has(key) ? choice(key, options) : fallback;
}

// {value, source} pairs of hardware and stack profiles: {"value": x, "source": "..."}, no other keys, the
// source a non-empty citation.
// The "source" string of `v`; blank is an error.
std::string source_of(const JsonNode& v);
// x in [lo, hi], scaled by `unit` into SI.
Sourced<double> sourced_number(const JsonNode& parent, std::string_view key, double lo, double hi,
                               double unit = 1.0);
Sourced<int64_t> sourced_integer(const JsonNode& parent, std::string_view key, int64_t lo, int64_t hi);
Sourced<bool> sourced_bool(const JsonNode& parent, std::string_view key);

// Runs `body` (which reads JSON through JsonNode and may throw InputError) and turns errors into a Result.
template <class F>
auto catch_input_errors(F&& body) -> Result<decltype(body())> {
  try {
    return body();
  } catch (const InputError& e) {
    return Error{e.what()};
  } catch (const json::exception& e) {
    return Error{std::string("unexpected JSON content: ") + e.what()};
  }
}

}  // namespace moeplan::io
