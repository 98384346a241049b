// Strict JSON reading with one-line errors naming file, field and expectation.
#include "simulator/io/json_reader.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

namespace moeplan::io {

std::string closest_match(std::string_view key, const std::vector<std::string>& known) {
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const auto& k : known) {
    // Levenshtein distance, one row at a time.
    std::vector<size_t> row(k.size() + 1);
    for (size_t j = 0; j <= k.size(); ++j) row[j] = j;
    for (size_t i = 1; i <= key.size(); ++i) {
      size_t diag = row[0];
      row[0] = i;
      for (size_t j = 1; j <= k.size(); ++j) {
        const size_t up = row[j];
        row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (key[i - 1] == k[j - 1] ? 0u : 1u)});
        diag = up;
      }
    }
    if (row[k.size()] < best_d) {
      best_d = row[k.size()];
      best = k;
    }
  }
  // Close means at most a third of the key's letters differ.
  return best_d <= std::max<size_t>(2, key.size() / 3) ? best : "";
}

Result<json> parse_json_text(std::string_view text, const std::string& label) {
  if (text.find_first_not_of(" \t\r\n") == std::string_view::npos) {
    return Error{fmt::format("{}: file is empty, expected a JSON object", label)};
  }
  try {
    json j = json::parse(text.begin(), text.end());
    if (!j.is_object()) {
      return Error{fmt::format("{}: top level: expected a JSON object, got {}", label, j.type_name())};
    }
    return j;
  } catch (const json::parse_error& e) {
    // Line and column of the byte where parsing stopped.
    const size_t at = std::min(e.byte == 0 ? size_t{0} : e.byte - 1, text.size());
    const size_t line =
        1 + static_cast<size_t>(std::count(text.begin(), text.begin() + static_cast<long>(at), '\n'));
    const size_t line_start = text.rfind('\n', at == 0 ? 0 : at - 1);
    const size_t col = line_start == std::string_view::npos ? at + 1 : at - line_start;
    const bool truncated = e.byte >= text.size();
    return Error{fmt::format("{}: line {}, column {}: {}", label, line, col,
                             truncated ? "the JSON ends early (truncated file?)" : "malformed JSON")};
  } catch (const json::out_of_range&) {
    return Error{fmt::format("{}: a number is too large to represent (overflow)", label)};
  }
}

Result<json> parse_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Error{fmt::format("{}: cannot open file (missing or unreadable)", path)};
  std::ostringstream buf;
  buf << in.rdbuf();
  if (in.bad()) return Error{fmt::format("{}: read error", path)};
  return parse_json_text(buf.str(), path);
}

JsonNode::JsonNode(const json& value, std::string file, std::string path)
    : v_(&value),
      file_(std::make_shared<const std::string>(std::move(file))),
      step_(path.empty() ? nullptr : std::make_shared<const Step>(Step{nullptr, std::move(path)})) {}

std::string JsonNode::path() const {
  std::vector<const Step*> steps;
  for (const Step* s = step_.get(); s != nullptr; s = s->parent.get()) steps.push_back(s);
  std::string out;
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    const Step& s = **it;
    if (s.index >= 0) {
      out += fmt::format("[{}]", s.index);
    } else if (!s.key.empty()) {
      if (!out.empty()) out += '.';
      out += s.key;
    }
  }
  return out;
}

std::string JsonNode::field(std::string_view key) const {
  std::string p = path();
  if (p.empty()) return std::string(key);
  if (key.empty()) return p;
  return p + "." + std::string(key);
}

std::string JsonNode::describe(const json& v) const {
  std::string s = v.dump();
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return fmt::format("{} {}", v.type_name(), s);
}

void JsonNode::fail(std::string_view key, std::string_view expected) const {
  std::string got = "nothing (missing)";
  if (v_->is_object() && v_->contains(key)) got = describe((*v_)[std::string(key)]);
  throw InputError(fmt::format("{}: field '{}': expected {}, got {}", *file_, field(key), expected, got));
}

void JsonNode::fail_here(std::string_view expected) const {
  const std::string p = path();
  throw InputError(fmt::format("{}: field '{}': expected {}, got {}", *file_, p.empty() ? "(top level)" : p,
                               expected, describe(*v_)));
}

bool JsonNode::has(std::string_view key) const {
  if (!v_->is_object()) return false;
  auto it = v_->find(key);
  return it != v_->end() && !it->is_null();
}

const json& JsonNode::get(std::string_view key) const {
  if (!v_->is_object()) fail_here("a JSON object");
  auto it = v_->find(key);
  if (it == v_->end() || it->is_null()) {
    throw InputError(fmt::format("{}: field '{}': required but missing", *file_, field(key)));
  }
  return *it;
}

JsonNode JsonNode::child(std::string_view key) const {
  return JsonNode(get(key), file_, std::make_shared<const Step>(Step{step_, std::string(key)}));
}

JsonNode JsonNode::object(std::string_view key) const {
  JsonNode c = child(key);
  if (!c.raw().is_object()) fail(key, "a JSON object");
  return c;
}

std::optional<JsonNode> JsonNode::optional_object(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  return object(key);
}

std::vector<JsonNode> JsonNode::elements() const {
  if (!v_->is_array()) fail_here("a JSON array");
  std::vector<JsonNode> out;
  out.reserve(v_->size());
  for (size_t i = 0; i < v_->size(); ++i) {
    out.push_back(JsonNode(
        (*v_)[i], file_, std::make_shared<const Step>(Step{step_, std::string(), static_cast<int64_t>(i)})));
  }
  return out;
}

std::vector<JsonNode> JsonNode::array(std::string_view key) const {
  JsonNode c = child(key);
  if (!c.raw().is_array()) fail(key, "a JSON array");
  return c.elements();
}

int64_t JsonNode::as_integer(int64_t lo, int64_t hi) const {
  const auto bad = [&] { fail_here(fmt::format("an integer in [{}, {}]", lo, hi)); };
  if (!v_->is_number_integer()) bad();
  int64_t x = 0;
  if (v_->is_number_unsigned()) {
    const auto u = v_->get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) bad();
    x = static_cast<int64_t>(u);
  } else {
    x = v_->get<int64_t>();
  }
  if (x < lo || x > hi) bad();
  return x;
}

double JsonNode::as_number(double lo, double hi) const {
  const auto bad = [&] { fail_here(fmt::format("a finite number in [{}, {}]", lo, hi)); };
  if (!v_->is_number()) bad();
  const auto x = v_->get<double>();
  if (!std::isfinite(x) || x < lo || x > hi) bad();
  return x;
}

int64_t JsonNode::integer(std::string_view key, int64_t lo, int64_t hi) const {
  return child(key).as_integer(lo, hi);
}

int64_t JsonNode::integer_or(std::string_view key, int64_t fallback, int64_t lo, int64_t hi) const {
  return has(key) ? integer(key, lo, hi) : fallback;
}

double JsonNode::number(std::string_view key, double lo, double hi) const {
  return child(key).as_number(lo, hi);
}

double JsonNode::number_or(std::string_view key, double fallback, double lo, double hi) const {
  return has(key) ? number(key, lo, hi) : fallback;
}

bool JsonNode::boolean(std::string_view key) const {
  const json& v = get(key);
  if (!v.is_boolean()) fail(key, "true or false");
  return v.get<bool>();
}

bool JsonNode::boolean_or(std::string_view key, bool fallback) const {
  return has(key) ? boolean(key) : fallback;
}

std::string JsonNode::string(std::string_view key) const {
  const json& v = get(key);
  if (!v.is_string()) fail(key, "a string");
  return v.get<std::string>();
}

std::string JsonNode::string_or(std::string_view key, std::string fallback) const {
  return has(key) ? string(key) : fallback;
}

void JsonNode::only_keys(std::initializer_list<std::string_view> known) const {
  if (!v_->is_object()) fail_here("a JSON object");
  for (auto it = v_->begin(); it != v_->end(); ++it) {
    if (std::find(known.begin(), known.end(), it.key()) != known.end()) continue;
    std::vector<std::string> names(known.begin(), known.end());
    const std::string guess = closest_match(it.key(), names);
    throw InputError(fmt::format("{}: field '{}': unknown key{}", *file_, field(it.key()),
                                 guess.empty() ? "" : fmt::format(" (did you mean '{}'?)", guess)));
  }
}

std::string source_of(const JsonNode& v) {
  std::string s = v.string("source");
  if (s.find_first_not_of(" \t") == std::string::npos) v.fail("source", "a non-empty citation");
  return s;
}

Sourced<double> sourced_number(const JsonNode& parent, std::string_view key, double lo, double hi,
                               double unit) {
  const JsonNode v = parent.object(key);
  v.only_keys({"value", "source"});
  return {v.number("value", lo, hi) * unit, source_of(v)};
}

Sourced<int64_t> sourced_integer(const JsonNode& parent, std::string_view key, int64_t lo, int64_t hi) {
  const JsonNode v = parent.object(key);
  v.only_keys({"value", "source"});
  return {v.integer("value", lo, hi), source_of(v)};
}

Sourced<bool> sourced_bool(const JsonNode& parent, std::string_view key) {
  const JsonNode v = parent.object(key);
  v.only_keys({"value", "source"});
  return {v.boolean("value"), source_of(v)};
}

}  // namespace moeplan::io
