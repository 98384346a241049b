// Predicted against measured (see compare.h): report reading, the op-by-op join and the attribution of the
// step-time error.
#include "planner/compare.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <limits>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "simulator/io/json_reader.h"

namespace moeplan::planner {
namespace {

using json = nlohmann::json;

bool is_comm_kind(const std::string& kind) {
  return kind == "collective" || kind == "send_recv";
}

double number_or(const json& j, const char* key, double fallback) {
  const auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : fallback;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The file's JSON, any top level (a Chrome trace may be an array); errors worded as the strict loaders word
// them.
Result<json> read_any_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Error{fmt::format("{}: cannot open file (missing or unreadable)", path)};
  std::ostringstream buf;
  buf << in.rdbuf();
  if (in.bad()) return Error{fmt::format("{}: read error", path)};
  const std::string text = buf.str();
  try {
    return json::parse(text);
  } catch (const json::exception&) {
    Result<json> strict = io::parse_json_text(text, path);
    if (!strict) return strict.error();
    return Error{fmt::format("{}: not JSON", path)};
  }
}

// The plan without the fields that name where it runs (a prediction on a calibrated profile of the machine
// the plan ran on is a prediction of the same plan).
json plan_identity(const json& plan) {
  if (!plan.is_object()) return plan;
  json p = plan;
  p.erase("hardware");
  p.erase("stack");
  return p;
}

// "" when both reports describe the same job; otherwise what differs.
std::string plan_mismatch(const StepReport& a, const StepReport& b) {
  for (const char* key : {"model", "gpus"}) {
    const json va = a.j.value(key, json()), vb = b.j.value(key, json());
    if (va != vb) return fmt::format("{} {} vs {}", key, va.dump(), vb.dump());
  }
  const json pa = plan_identity(a.j.value("plan", json())), pb = plan_identity(b.j.value("plan", json()));
  if (pa.is_null() || pb.is_null()) return "";  // a report without its plan: model and gpus must do
  if (pa != pb) {
    for (auto it = pa.begin(); it != pa.end(); ++it) {
      if (!pb.contains(it.key()) || pb[it.key()] != it.value())
        return fmt::format("plan.{} {} vs {}", it.key(), it.value().dump(),
                           pb.value(it.key(), json()).dump());
    }
    return "plan fields differ";
  }
  return "";
}

// Breakdown seconds of one report: compute by kind, exposed comm by group, bubble, optimizer.
struct Breakdown {
  int64_t stage = 0;
  std::map<std::string, double> compute, exposed;
  double bubble = 0, optimizer = 0;
  double sum() const {
    double s = bubble + optimizer;
    for (const auto& [k, v] : compute) s += v;
    for (const auto& [k, v] : exposed) s += v;
    return s;
  }
};

Breakdown breakdown_of(const json& b) {
  Breakdown out;
  out.stage = b.value("stage", int64_t{0});
  auto read = [](const json& m, std::map<std::string, double>& into) {
    if (!m.is_object()) return;
    for (auto it = m.begin(); it != m.end(); ++it) {
      if (it.value().is_number()) into[it.key()] = it.value().get<double>();
    }
  };
  if (b.contains("compute")) read(b["compute"], out.compute);
  if (b.contains("exposed_comm")) read(b["exposed_comm"], out.exposed);
  out.bubble = number_or(b, "bubble", 0);
  out.optimizer = number_or(b, "optimizer", 0);
  return out;
}

// Seconds per step of each category's ops on `stage`.
std::map<std::string, double> stage_totals(const StepReport& r, int64_t stage) {
  std::map<std::string, double> t;
  for (const auto& [key, row] : r.ops) {
    if (std::get<0>(key) == stage) t[category_of(row)] += row.total_s;
  }
  return t;
}

std::string key_text(const OpKey& k) {
  return fmt::format("stage {} {} ({})", std::get<0>(k), std::get<1>(k), std::get<2>(k));
}

json key_json(const OpKey& k, const OpRow& r) {
  return {{"stage", std::get<0>(k)}, {"op", std::get<1>(k)}, {"phase", std::get<2>(k)},
          {"kind", r.kind},          {"count", r.count},     {"total_s", r.total_s}};
}

}  // namespace

// ---- Step reports
// ------------------------------------------------------------------------------------------

double relative_error(double predicted, double measured) {
  return measured != 0 ? (predicted - measured) / measured
                       : (predicted == 0 ? 0.0 : std::numeric_limits<double>::infinity());
}

std::string category_of(const OpRow& r) {
  return is_comm_kind(r.kind) ? "comm_" + r.group : r.kind;
}

Result<StepReport> step_report(const json& j, const std::string& path) {
  if (!j.is_object()) return Error{fmt::format("{}: not a moeplan report (expected a JSON object)", path)};
  StepReport r{path, j, 0, "", {}};
  if (j.contains("valid") && j["valid"].is_boolean() && !j["valid"].get<bool>())
    return Error{fmt::format("{}: a report of an invalid plan (valid: false) has no step to compare", path)};
  for (const char* key : {"step_time_s", "ops", "breakdown"}) {
    if (!j.contains(key))
      return Error{
          fmt::format("{}: not a moeplan report (no \"{}\"; expected the output of `moeplan simulate "
                      "--json` or moerun's report.json)",
                      path, key)};
  }
  if (!j["step_time_s"].is_number() || !j["ops"].is_array() || !j["breakdown"].is_object())
    return Error{fmt::format(
        "{}: not a moeplan report (step_time_s must be a number, ops an array, breakdown an object)", path)};
  r.step_s = j["step_time_s"].get<double>();
  r.step_rule = "step_time_s";
  if (j.contains("step_times_s") && j["step_times_s"].is_array() && !j["step_times_s"].empty()) {
    std::vector<double> steps;
    for (const json& s : j["step_times_s"]) {
      if (s.is_number()) steps.push_back(s.get<double>());
    }
    if (!steps.empty()) {
      r.step_s = median(steps);
      r.step_rule = fmt::format("median of {} step_times_s", steps.size());
    }
  }
  if (!(r.step_s > 0)) return Error{fmt::format("{}: step_time_s must be positive", path)};
  for (const json& o : j["ops"]) {
    if (!o.is_object() || !o.contains("stage") || !o.contains("op") || !o.contains("phase") ||
        !o.contains("total_s") || !o["stage"].is_number_integer() || !o["op"].is_string() ||
        !o["phase"].is_string() || !o["total_s"].is_number())
      return Error{fmt::format("{}: ops: each entry needs stage, op, phase and total_s", path)};
    OpRow row;
    row.kind = o.value("kind", std::string());
    row.group = o.value("group", std::string());
    row.count = o.value("count", int64_t{1});
    row.total_s = o["total_s"].get<double>();
    r.ops[{o["stage"].get<int64_t>(), o["op"].get<std::string>(), o["phase"].get<std::string>()}] = row;
  }
  return r;
}

Result<StepReport> read_step_report(const std::string& path) {
  Result<json> j = read_any_json(path);
  if (!j) return j.error();
  return step_report(j.value(), path);
}

// ---- Report against report
// ---------------------------------------------------------------------------------

std::vector<Contributor> contributors(const StepReport& p, const StepReport& m) {
  const Breakdown bp = breakdown_of(p.j["breakdown"]), bm = breakdown_of(m.j["breakdown"]);
  const auto tp = stage_totals(p, bp.stage), tm = stage_totals(m, bm.stage);
  std::map<std::string, double> delta;
  double imbalance = (p.step_s - bp.sum()) - (m.step_s - bm.sum());
  std::set<std::string> cats;
  for (const auto& [k, v] : tp) cats.insert(k);
  for (const auto& [k, v] : tm) cats.insert(k);
  for (const auto& [k, v] : bp.exposed) cats.insert("comm_" + k);
  for (const auto& [k, v] : bm.exposed) cats.insert("comm_" + k);
  auto at = [](const std::map<std::string, double>& mp, const std::string& k) {
    const auto it = mp.find(k);
    return it == mp.end() ? 0.0 : it->second;
  };
  for (const std::string& cat : cats) {
    const double dt = at(tp, cat) - at(tm, cat);
    if (cat.rfind("comm_", 0) == 0) {
      const std::string g = cat.substr(5);
      delta["collective bandwidth: " + g] += dt;
      delta["exposed overlap: " + g] += (at(bp.exposed, g) - at(tp, cat)) - (at(bm.exposed, g) - at(tm, cat));
    } else {
      delta["compute efficiency: " + cat] += dt;
      const double bpk = at(bp.compute, cat) + (cat == "optimizer" ? bp.optimizer : 0.0);
      const double bmk = at(bm.compute, cat) + (cat == "optimizer" ? bm.optimizer : 0.0);
      imbalance += (bpk - at(tp, cat)) - (bmk - at(tm, cat));
    }
  }
  // Breakdown categories with no ops of their own on the stage (e.g. fused kinds) stay in the imbalance term.
  for (const auto& [k, v] : bp.compute) {
    if (!cats.count(k)) imbalance += v;
  }
  for (const auto& [k, v] : bm.compute) {
    if (!cats.count(k)) imbalance -= v;
  }
  if (!cats.count("optimizer")) imbalance += bp.optimizer - bm.optimizer;
  delta["bubble"] = bp.bubble - bm.bubble;
  delta["imbalance"] = imbalance;
  std::vector<Contributor> out;
  for (const auto& [name, d] : delta) out.push_back({name, d, d / m.step_s});
  std::stable_sort(out.begin(), out.end(), [](const Contributor& a, const Contributor& b) {
    return std::abs(a.delta_s) > std::abs(b.delta_s);
  });
  return out;
}

Result<ReportComparison> compare_reports(const StepReport& p, const StepReport& m) {
  const std::string mismatch = plan_mismatch(p, m);
  if (!mismatch.empty())
    return Error{fmt::format("{} and {} are reports of different plans: {}", p.path, m.path, mismatch)};
  ReportComparison c;
  c.predicted_path = p.path;
  c.measured_path = m.path;
  c.predicted_step_s = p.step_s;
  c.measured_step_s = m.step_s;
  c.predicted_step_rule = p.step_rule;
  c.measured_step_rule = m.step_rule;
  for (const auto& [k, row] : p.ops) {
    const auto it = m.ops.find(k);
    if (it == m.ops.end()) {
      c.only_predicted.emplace_back(k, row);
    } else {
      c.ops.push_back({k, row, it->second});
    }
  }
  for (const auto& [k, row] : m.ops) {
    if (!p.ops.count(k)) c.only_measured.emplace_back(k, row);
  }
  // Per category over all stages: seconds per step of the joined ops.
  std::map<std::string, std::pair<double, double>> cat;
  for (const JoinedOp& x : c.ops) {
    auto& v = cat[category_of(x.measured)];
    v.first += x.predicted.total_s;
    v.second += x.measured.total_s;
  }
  for (const auto& [name, v] : cat) c.categories.push_back({name, v.first, v.second});
  std::stable_sort(c.ops.begin(), c.ops.end(), [](const JoinedOp& a, const JoinedOp& b) {
    return std::abs(a.predicted.total_s - a.measured.total_s) >
           std::abs(b.predicted.total_s - b.measured.total_s);
  });
  c.contributors = contributors(p, m);
  c.end_to_end_error = relative_error(p.step_s, m.step_s);
  return c;
}

json report_comparison_json(const ReportComparison& c) {
  json j;
  j["predicted"] = {{"file", c.predicted_path},
                    {"step_time_s", c.predicted_step_s},
                    {"step_time_rule", c.predicted_step_rule}};
  j["measured"] = {{"file", c.measured_path},
                   {"step_time_s", c.measured_step_s},
                   {"step_time_rule", c.measured_step_rule}};
  j["end_to_end_error"] = c.end_to_end_error;
  j["error_rule"] = "(predicted - measured) / measured, of step time";
  json cats = json::array();
  for (const CategoryTotals& v : c.categories)
    cats.push_back({{"category", v.category},
                    {"predicted_s", v.predicted_s},
                    {"measured_s", v.measured_s},
                    {"error", relative_error(v.predicted_s, v.measured_s)}});
  j["categories"] = cats;
  json ops = json::array();
  for (const JoinedOp& x : c.ops) {
    json o = key_json(x.key, x.measured);
    o.erase("total_s");
    o["predicted_s"] = x.predicted.total_s;
    o["measured_s"] = x.measured.total_s;
    o["predicted_count"] = x.predicted.count;
    o["error"] = relative_error(x.predicted.total_s, x.measured.total_s);
    ops.push_back(std::move(o));
  }
  j["ops"] = ops;
  json contrib = json::array();
  for (const Contributor& x : c.contributors)
    contrib.push_back({{"contributor", x.name}, {"delta_s", x.delta_s}, {"share_of_measured_step", x.share}});
  j["contributors"] = contrib;
  j["top_contributor"] = c.contributors.empty() ? json(nullptr) : json(c.contributors.front().name);
  json op_only = json::array(), mo_only = json::array();
  for (const auto& [k, r] : c.only_predicted) op_only.push_back(key_json(k, r));
  for (const auto& [k, r] : c.only_measured) mo_only.push_back(key_json(k, r));
  j["only_in_predicted"] = op_only;
  j["only_in_measured"] = mo_only;
  return j;
}

std::string report_comparison_text(const ReportComparison& c, int top) {
  fmt::memory_buffer b;
  auto out = std::back_inserter(b);
  fmt::format_to(out, "predicted {} : step {:.4f} s ({})\n", c.predicted_path, c.predicted_step_s,
                 c.predicted_step_rule);
  fmt::format_to(out, "measured  {} : step {:.4f} s ({})\n", c.measured_path, c.measured_step_s,
                 c.measured_step_rule);
  fmt::format_to(out, "end-to-end error of step time: {:+.1f}% ((predicted - measured) / measured)\n\n",
                 100 * c.end_to_end_error);
  fmt::format_to(out, "{:<28} {:>12} {:>12} {:>8}   (seconds per step, all stages, joined ops)\n", "category",
                 "predicted", "measured", "error");
  for (const CategoryTotals& v : c.categories)
    fmt::format_to(out, "{:<28} {:12.5f} {:12.5f} {:+7.1f}%\n", v.category, v.predicted_s, v.measured_s,
                   100 * relative_error(v.predicted_s, v.measured_s));
  fmt::format_to(out, "\nlargest contributors to the step-time difference ({:+.4f} s):\n",
                 c.predicted_step_s - c.measured_step_s);
  const size_t rows = static_cast<size_t>(std::max(top, 0));
  for (size_t i = 0; i < c.contributors.size() && i < rows; ++i)
    fmt::format_to(out, "  {:<36} {:+10.5f} s {:+7.1f}% of the measured step\n", c.contributors[i].name,
                   c.contributors[i].delta_s, 100 * c.contributors[i].share);
  fmt::format_to(out, "\nops with the largest differences ({} joined):\n", c.ops.size());
  fmt::format_to(out, "  {:<52} {:>6} {:>11} {:>11} {:>8}\n", "op", "count", "predicted", "measured",
                 "error");
  for (size_t i = 0; i < c.ops.size() && i < rows; ++i) {
    const JoinedOp& x = c.ops[i];
    fmt::format_to(out, "  {:<52} {:>6} {:11.5f} {:11.5f} {:+7.1f}%\n", key_text(x.key), x.measured.count,
                   x.predicted.total_s, x.measured.total_s,
                   100 * relative_error(x.predicted.total_s, x.measured.total_s));
  }
  if (!c.only_predicted.empty() || !c.only_measured.empty()) fmt::format_to(out, "\nops on one side only:\n");
  for (const auto& [k, r] : c.only_predicted)
    fmt::format_to(out, "  only predicted: {} ({} x, {:.5f} s)\n", key_text(k), r.count, r.total_s);
  for (const auto& [k, r] : c.only_measured)
    fmt::format_to(out, "  only measured:  {} ({} x, {:.5f} s)\n", key_text(k), r.count, r.total_s);
  return fmt::to_string(b);
}

}  // namespace moeplan::planner
