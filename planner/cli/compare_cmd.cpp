// `moeplan compare PREDICTED MEASURED`: joins two step reports of one plan (`moeplan simulate --json`,
// `moerun run`'s report.json; either side may be either) op by op and by category, and names what the
// end-to-end step-time error is made of, so a prediction can be checked against a run.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <tuple>

#include <fmt/format.h>

#include "planner/cli/cli_common.h"
#include "simulator/io/json_reader.h"

namespace moeplan::cli {
namespace {

using json = nlohmann::json;

// One row of a report's `ops`: (stage, op label, phase) -> seconds per step.
struct OpRow {
  std::string kind, group;
  int64_t count = 0;
  double total_s = 0;
};
using OpKey = std::tuple<int64_t, std::string, std::string>;

struct Report {
  std::string path;
  json j;
  double step_s = 0;      // median of step_times_s when present (a measured report), else step_time_s
  std::string step_rule;  // which of the two
  std::map<OpKey, OpRow> ops;
};

bool is_comm_kind(const std::string& kind) {
  return kind == "collective" || kind == "send_recv";
}

// The category an op's time is judged in: its kind, or comm_<group> for communication.
std::string category_of(const OpRow& r) {
  return is_comm_kind(r.kind) ? "comm_" + r.group : r.kind;
}

double number_or(const json& j, const char* key, double fallback) {
  const auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : fallback;
}

Result<Report> read_report(const std::string& path) {
  Result<json> parsed = io::parse_json_file(path);
  if (!parsed) return parsed.error();
  Report r{path, std::move(parsed).value(), 0, "", {}};
  const json& j = r.j;
  if (!j.is_object()) return Error{fmt::format("{}: not a moeplan report (expected a JSON object)", path)};
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
      std::sort(steps.begin(), steps.end());
      const size_t n = steps.size();
      r.step_s = n % 2 == 1 ? steps[n / 2] : 0.5 * (steps[n / 2 - 1] + steps[n / 2]);
      r.step_rule = fmt::format("median of {} step_times_s", n);
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
std::string plan_mismatch(const Report& a, const Report& b) {
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

double rel(double predicted, double measured) {
  return measured != 0 ? (predicted - measured) / measured
                       : (predicted == 0 ? 0.0 : std::numeric_limits<double>::infinity());
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
std::map<std::string, double> stage_totals(const Report& r, int64_t stage) {
  std::map<std::string, double> t;
  for (const auto& [key, row] : r.ops) {
    if (std::get<0>(key) == stage) t[category_of(row)] += row.total_s;
  }
  return t;
}

struct Contributor {
  std::string name;  // "compute efficiency: gemm", "collective bandwidth: ep", ...
  double delta_s = 0;
  double share = 0;  // delta_s / measured step time
};

// The step-time difference split so that the parts add up to it exactly. With B a report's breakdown of its
// breakdown stage and T that stage's op seconds per category:
//   compute efficiency (kind k)     dT_k                         (op time of the kind)
//   collective bandwidth (group g)  dT_comm_g                    (time inside the group's collectives)
//   exposed overlap (group g)       d(B.exposed_g - T_comm_g)    (comm time not hidden behind compute)
//   bubble                          dB.bubble
//   imbalance                       d(step - sum B) + sum_k d(B.compute_k + [k = optimizer] B.optimizer -
//   T_k)
//     (time the stage's own op times do not explain: waits for the slowest rank, compute ops overlapping)
std::vector<Contributor> contributors(const Report& p, const Report& m) {
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

struct Joined {
  OpKey key;
  OpRow p, m;
};

std::string key_text(const OpKey& k) {
  return fmt::format("stage {} {} ({})", std::get<0>(k), std::get<1>(k), std::get<2>(k));
}

json key_json(const OpKey& k, const OpRow& r) {
  return {{"stage", std::get<0>(k)}, {"op", std::get<1>(k)}, {"phase", std::get<2>(k)},
          {"kind", r.kind},          {"count", r.count},     {"total_s", r.total_s}};
}

int run_compare(const std::string& predicted_path, const std::string& measured_path, bool as_json, int top) {
  Result<Report> pr = read_report(predicted_path);
  if (!pr) return bad_input(pr.error().message);
  Result<Report> mr = read_report(measured_path);
  if (!mr) return bad_input(mr.error().message);
  const Report& p = pr.value();
  const Report& m = mr.value();
  const std::string mismatch = plan_mismatch(p, m);
  if (!mismatch.empty())
    return bad_input(
        fmt::format("{} and {} are reports of different plans: {}", predicted_path, measured_path, mismatch));

  std::vector<Joined> joined;
  std::vector<std::pair<OpKey, OpRow>> only_p, only_m;
  for (const auto& [k, row] : p.ops) {
    const auto it = m.ops.find(k);
    if (it == m.ops.end()) {
      only_p.emplace_back(k, row);
    } else {
      joined.push_back({k, row, it->second});
    }
  }
  for (const auto& [k, row] : m.ops) {
    if (!p.ops.count(k)) only_m.emplace_back(k, row);
  }
  // Per category over all stages: seconds per step of the joined ops.
  std::map<std::string, std::pair<double, double>> cat;
  for (const Joined& x : joined) {
    auto& c = cat[category_of(x.m)];
    c.first += x.p.total_s;
    c.second += x.m.total_s;
  }
  std::stable_sort(joined.begin(), joined.end(), [](const Joined& a, const Joined& b) {
    return std::abs(a.p.total_s - a.m.total_s) > std::abs(b.p.total_s - b.m.total_s);
  });
  const std::vector<Contributor> contrib = contributors(p, m);
  const double e2e = rel(p.step_s, m.step_s);

  if (as_json) {
    json j;
    j["predicted"] = {{"file", predicted_path}, {"step_time_s", p.step_s}, {"step_time_rule", p.step_rule}};
    j["measured"] = {{"file", measured_path}, {"step_time_s", m.step_s}, {"step_time_rule", m.step_rule}};
    j["end_to_end_error"] = e2e;
    j["error_rule"] = "(predicted - measured) / measured, of step time";
    json cats = json::array();
    for (const auto& [name, v] : cat)
      cats.push_back({{"category", name},
                      {"predicted_s", v.first},
                      {"measured_s", v.second},
                      {"error", rel(v.first, v.second)}});
    j["categories"] = cats;
    json ops = json::array();
    for (const Joined& x : joined) {
      json o = key_json(x.key, x.m);
      o.erase("total_s");
      o["predicted_s"] = x.p.total_s;
      o["measured_s"] = x.m.total_s;
      o["predicted_count"] = x.p.count;
      o["error"] = rel(x.p.total_s, x.m.total_s);
      ops.push_back(std::move(o));
    }
    j["ops"] = ops;
    json c = json::array();
    for (const Contributor& x : contrib)
      c.push_back({{"contributor", x.name}, {"delta_s", x.delta_s}, {"share_of_measured_step", x.share}});
    j["contributors"] = c;
    j["top_contributor"] = contrib.empty() ? json(nullptr) : json(contrib.front().name);
    json op_only = json::array(), mo_only = json::array();
    for (const auto& [k, r] : only_p) op_only.push_back(key_json(k, r));
    for (const auto& [k, r] : only_m) mo_only.push_back(key_json(k, r));
    j["only_in_predicted"] = op_only;
    j["only_in_measured"] = mo_only;
    print_json(j);
    return kExitOk;
  }

  fmt::print("predicted {} : step {:.4f} s ({})\n", predicted_path, p.step_s, p.step_rule);
  fmt::print("measured  {} : step {:.4f} s ({})\n", measured_path, m.step_s, m.step_rule);
  fmt::print("end-to-end error of step time: {:+.1f}% ((predicted - measured) / measured)\n\n", 100 * e2e);
  fmt::print("{:<28} {:>12} {:>12} {:>8}   (seconds per step, all stages, joined ops)\n", "category",
             "predicted", "measured", "error");
  for (const auto& [name, v] : cat)
    fmt::print("{:<28} {:12.5f} {:12.5f} {:+7.1f}%\n", name, v.first, v.second, 100 * rel(v.first, v.second));
  fmt::print("\nlargest contributors to the step-time difference ({:+.4f} s):\n", p.step_s - m.step_s);
  for (size_t i = 0; i < contrib.size() && static_cast<int>(i) < top; ++i)
    fmt::print("  {:<36} {:+10.5f} s {:+7.1f}% of the measured step\n", contrib[i].name, contrib[i].delta_s,
               100 * contrib[i].share);
  fmt::print("\nops with the largest differences ({} joined):\n", joined.size());
  fmt::print("  {:<52} {:>6} {:>11} {:>11} {:>8}\n", "op", "count", "predicted", "measured", "error");
  for (size_t i = 0; i < joined.size() && static_cast<int>(i) < top; ++i) {
    const Joined& x = joined[i];
    fmt::print("  {:<52} {:>6} {:11.5f} {:11.5f} {:+7.1f}%\n", key_text(x.key), x.m.count, x.p.total_s,
               x.m.total_s, 100 * rel(x.p.total_s, x.m.total_s));
  }
  if (!only_p.empty() || !only_m.empty()) fmt::print("\nops on one side only:\n");
  for (const auto& [k, r] : only_p)
    fmt::print("  only predicted: {} ({} x, {:.5f} s)\n", key_text(k), r.count, r.total_s);
  for (const auto& [k, r] : only_m)
    fmt::print("  only measured:  {} ({} x, {:.5f} s)\n", key_text(k), r.count, r.total_s);
  return kExitOk;
}

}  // namespace

Runner add_compare(CLI::App& app) {
  struct Options {
    std::string predicted, measured;
    bool json = false;
    int top = 8;
  };
  auto o = std::make_shared<Options>();
  app.add_option("predicted", o->predicted, "Report JSON (moeplan simulate --json, or a moerun report.json)")
      ->required();
  app.add_option("measured", o->measured,
                 "Report JSON the first is judged against (moerun's report.json, or another prediction)")
      ->required();
  app.add_option("--top", o->top, "Rows of the contributor and op tables")->check(CLI::Range(1, 1000));
  app.add_flag("--json", o->json, "Print one JSON object");
  return [o]() { return run_compare(o->predicted, o->measured, o->json, o->top); };
}

}  // namespace moeplan::cli
