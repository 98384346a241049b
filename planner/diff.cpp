// diff (see diff.h).
#include "planner/diff.h"

#include <set>

namespace moeplan::planner {
namespace {

using nlohmann::json;

void walk(const json& a, const json& b, const std::string& prefix, std::vector<FieldDiff>& out) {
  if (a.is_object() && b.is_object()) {
    std::set<std::string> keys;
    for (auto it = a.begin(); it != a.end(); ++it) keys.insert(it.key());
    for (auto it = b.begin(); it != b.end(); ++it) keys.insert(it.key());
    for (const std::string& k : keys) {
      const std::string key = prefix.empty() ? k : prefix + "." + k;
      walk(a.contains(k) ? a.at(k) : json(), b.contains(k) ? b.at(k) : json(), key, out);
    }
    return;
  }
  if (a != b) out.push_back({prefix, a, b});
}

// The value at `path` in a report, or null when a step of it is missing.
const json* at_path(const json& j, const std::vector<std::string>& path) {
  const json* at = &j;
  for (const std::string& k : path) {
    if (!at->is_object() || !at->contains(k)) return nullptr;
    at = &at->at(k);
  }
  return at;
}

double number_at(const json& j, const std::vector<std::string>& path) {
  const json* at = at_path(j, path);
  return at && at->is_number() ? at->get<double>() : 0;
}

// The union of the numeric keys of the object at `path` in either report, sorted.
std::vector<std::string> keys_at(const json& a, const json& b, const std::vector<std::string>& path) {
  std::set<std::string> keys;
  for (const json* r : {&a, &b}) {
    const json* at = at_path(*r, path);
    if (!at || !at->is_object()) continue;
    for (auto it = at->begin(); it != at->end(); ++it) {
      if (it->is_number()) keys.insert(it.key());
    }
  }
  return {keys.begin(), keys.end()};
}

}  // namespace

std::vector<FieldDiff> diff_fields(const json& a, const json& b) {
  std::vector<FieldDiff> out;
  walk(a, b, "", out);
  return out;
}

std::vector<FigureDiff> diff_reports(const json& a, const json& b) {
  std::vector<FigureDiff> out;
  auto add = [&](const std::string& key, const std::string& unit, const std::vector<std::string>& path) {
    out.push_back({key, unit, number_at(a, path), number_at(b, path)});
  };
  add("step_time_s", "s", {"step_time_s"});
  add("tokens_per_s", "tokens/s", {"tokens_per_s"});
  add("tokens_per_s_per_gpu", "tokens/s", {"tokens_per_s_per_gpu"});
  add("mfu", "fraction", {"mfu"});
  add("memory.per_gpu_bytes", "bytes", {"memory", "per_gpu_bytes"});
  for (const char* group : {"compute", "exposed_comm"}) {
    for (const std::string& k : keys_at(a, b, {"breakdown", group})) {
      add(std::string("breakdown.") + group + "." + k, "s", {"breakdown", group, k});
    }
  }
  add("breakdown.bubble", "s", {"breakdown", "bubble"});
  add("breakdown.host_wait", "s", {"breakdown", "host_wait"});
  add("breakdown.optimizer", "s", {"breakdown", "optimizer"});
  for (const std::string& k : keys_at(a, b, {"memory", "components"})) {
    add("memory.components." + k, "bytes", {"memory", "components", k});
  }
  return out;
}

}  // namespace moeplan::planner
