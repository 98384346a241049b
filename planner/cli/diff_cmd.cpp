// `moeplan diff A B`: two plans or two reports side by side. Plans: the fields that differ (with --simulate,
// both are predicted and their reports compared too). Reports (`simulate --json`, `plan --out-dir`): the plan
// fields that differ, then the headline figures and every breakdown category with the change from A to B.
#include <cmath>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "planner/cli/cli_common.h"
#include "planner/diff.h"
#include "simulator/io/json_reader.h"
#include "simulator/io/plan_io.h"
#include "simulator/predict/report.h"

namespace moeplan::cli {
namespace {

// A report has the prediction's figures; a plan file has none.
bool is_report(const nlohmann::json& j) {
  return j.is_object() && j.contains("step_time_s");
}

std::string value_text(const nlohmann::json& v) {
  if (v.is_null()) return "-";
  if (v.is_string()) return v.get<std::string>();
  return v.dump();
}

std::string figure_text(double v, const std::string& unit) {
  if (unit == "bytes") return human_bytes(v);
  if (unit == "fraction") return fmt::format("{:.1f}%", 100 * v);
  if (unit == "tokens/s") return fmt::format("{:.1f}", v);
  return fmt::format("{:.4f}", v);
}

// A plan file's JSON in its complete form (defaults filled in), so that an omitted default is no difference.
Result<nlohmann::json> plan_form(const nlohmann::json& j, const std::string& path) {
  Result<Plan> p = io::plan_from_json(j, path);
  if (!p) return p.error();
  return io::plan_to_json(p.value());
}

// A report of the plan file at `path` (predicted with its own stack, or `stack` when given).
Result<nlohmann::json> simulated(const std::string& path, const std::string& stack) {
  Result<PlanInputs> in = load_plan_inputs(path, stack);
  if (!in) return in.error();
  const auto& [plan, model, hw, file] = in.value().loaded;
  const Prediction p = predict(model, plan, hw, in.value().stack, in.value().routing);
  if (!p.violations.empty()) {
    return Error{fmt::format("{}: the plan cannot run: {}", path, p.violations.front().reason)};
  }
  nlohmann::json j = prediction_json(p, {plan, model, hw, in.value().stack});
  j["plan"] = io::plan_to_json(plan);
  return j;
}

// Whether a report's prediction is hypothetical and why (a report without provenance, written before it
// existed or edited by hand: no).
bool hypothetical(const nlohmann::json& report) {
  const auto p = report.find("provenance");
  if (p == report.end() || !p->is_object()) return false;
  const auto h = p->find("hypothetical");
  return h != p->end() && h->is_boolean() && h->get<bool>();
}

std::vector<std::string> why_hypothetical(const nlohmann::json& report) {
  std::vector<std::string> out;
  if (!hypothetical(report)) return out;
  const auto why = report.at("provenance").find("why_hypothetical");
  if (why == report.at("provenance").end() || !why->is_array()) return out;
  for (const nlohmann::json& t : *why) {
    if (t.is_string()) out.push_back(t.get<std::string>());
  }
  return out;
}

}  // namespace

Runner add_diff(CLI::App& app) {
  struct Options {
    std::string a, b, stack;
    bool simulate = false, json = false;
  };
  auto o = std::make_shared<Options>();
  app.add_option("a", o->a, "Plan file or report (simulate --json, plan --out-dir's planN.report.json)")
      ->required();
  app.add_option("b", o->b, "Plan file or report, of the same kind as A")->required();
  app.add_flag("--simulate", o->simulate, "With two plan files: predict both and compare the reports too");
  app.add_option("--stack", o->stack, "With --simulate: the stack both run on (default: each plan's)");
  app.add_flag("--json", o->json, "Print one JSON object {kind, plan_fields, figures}");
  return [o]() {
    nlohmann::json doc[2];
    const std::string paths[2] = {o->a, o->b};
    for (int i = 0; i < 2; ++i) {
      Result<nlohmann::json> j = io::parse_json_file(paths[i]);
      if (!j) return bad_input(j.error().message);
      if (!j.value().is_object())
        return bad_input(fmt::format("{}: expected a plan or report object", paths[i]));
      doc[i] = std::move(j).value();
    }
    const bool reports = is_report(doc[0]);
    if (reports != is_report(doc[1])) {
      return bad_input(
          fmt::format("{} and {}: one is a report and the other a plan; give two of a kind", o->a, o->b));
    }
    if (reports && o->simulate) return bad_input("--simulate: A and B are reports already");
    nlohmann::json plans[2], full[2];
    for (int i = 0; i < 2; ++i) {
      if (reports) {
        if (doc[i].contains("valid") && !doc[i].at("valid").get<bool>()) {
          return bad_input(fmt::format("{}: a report of a plan that cannot run (valid: false)", paths[i]));
        }
        plans[i] = doc[i].value("plan", nlohmann::json::object());
        full[i] = doc[i];
      } else {
        Result<nlohmann::json> p = plan_form(doc[i], paths[i]);
        if (!p) return bad_input(p.error().message);
        plans[i] = std::move(p).value();
        if (o->simulate) {
          Result<nlohmann::json> r = simulated(paths[i], o->stack);
          if (!r) return bad_input(r.error().message);
          full[i] = std::move(r).value();
        }
      }
    }
    const std::vector<planner::FieldDiff> fields = planner::diff_fields(plans[0], plans[1]);
    const bool figures = reports || o->simulate;
    const std::vector<planner::FigureDiff> rows =
        figures ? planner::diff_reports(full[0], full[1]) : std::vector<planner::FigureDiff>{};
    if (o->json) {
      nlohmann::json f = nlohmann::json::array(), g = nlohmann::json::array();
      for (const auto& d : fields) f.push_back({{"key", d.key}, {"a", d.a}, {"b", d.b}});
      for (const auto& r : rows) {
        g.push_back({{"key", r.key},
                     {"unit", r.unit},
                     {"a", r.a},
                     {"b", r.b},
                     {"change", r.change()},
                     {"relative", r.relative()}});
      }
      print_json({{"a", o->a},
                  {"b", o->b},
                  {"kind", reports ? "reports" : "plans"},
                  {"plan_fields", f},
                  {"figures", figures ? g : nlohmann::json(nullptr)},
                  {"hypothetical",
                   figures ? nlohmann::json({{"a", hypothetical(full[0])}, {"b", hypothetical(full[1])}})
                           : nlohmann::json(nullptr)}});
      return kExitOk;
    }
    fmt::print("A: {}\nB: {}\n\n", o->a, o->b);
    if (fields.empty()) {
      fmt::print("plans: identical\n");
    } else {
      size_t w = 5;
      for (const auto& d : fields) w = std::max(w, d.key.size());
      fmt::print("{:<{}}  {:>24}  {:>24}\n", "plan field", w, "A", "B");
      for (const auto& d : fields)
        fmt::print("{:<{}}  {:>24}  {:>24}\n", d.key, w, value_text(d.a), value_text(d.b));
    }
    if (figures) {
      size_t w = 6;
      for (const auto& r : rows) w = std::max(w, r.key.size());
      fmt::print("\n{:<{}}  {:>14}  {:>14}  {:>14}  {:>8}\n", "figure", w, "A", "B", "B - A", "B / A");
      for (const auto& r : rows) {
        if (r.a == 0 && r.b == 0) continue;
        fmt::print("{:<{}}  {:>14}  {:>14}  {:>14}  {:>8}\n", r.key, w, figure_text(r.a, r.unit),
                   figure_text(r.b, r.unit),
                   (r.change() < 0 ? "-" : "+") + figure_text(std::fabs(r.change()), r.unit),
                   r.a != 0 ? fmt::format("{:+.1f}%", 100 * r.relative()) : "new");
      }
      fmt::print(
          "\nbreakdown.*: seconds of the busiest stage per step (compute by kind, communication not hidden, "
          "pipeline bubble,\noptimizer); memory.components.*: the largest stage's bytes per GPU.\n");
      for (int i = 0; i < 2; ++i) {
        if (!hypothetical(full[i])) continue;
        fmt::print("\nHYPOTHETICAL ({}): its prediction credits capabilities its stack has not measured:\n",
                   i == 0 ? "A" : "B");
        for (const std::string& t : why_hypothetical(full[i])) fmt::print("  - {}\n", t);
      }
    }
    return kExitOk;
  };
}

}  // namespace moeplan::cli
