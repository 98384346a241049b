// Predicted against measured (see compare.h): report reading, the op-by-op and by-category joins, and the
// attribution of the step-time error.
#include "planner/compare.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <limits>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "simulator/core/units.h"
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

bool is_trace_shaped(const json& j) {
  return j.is_array() || (j.is_object() && j.contains("traceEvents"));
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

// ---- Interval arithmetic over kernels ([start, end) in seconds) ----

using Interval = std::pair<double, double>;

std::vector<Interval> merged(std::vector<Interval> v) {
  std::sort(v.begin(), v.end());
  std::vector<Interval> out;
  for (const Interval& x : v) {
    if (!out.empty() && x.first <= out.back().second) {
      out.back().second = std::max(out.back().second, x.second);
    } else {
      out.push_back(x);
    }
  }
  return out;
}

// |union ∩ [a, b)| of a merged union.
double length_within(const std::vector<Interval>& u, double a, double b) {
  double total = 0;
  for (const Interval& x : u) total += std::max(0.0, std::min(b, x.second) - std::max(a, x.first));
  return total;
}

// The intersection of two merged unions, merged.
std::vector<Interval> intersect(const std::vector<Interval>& x, const std::vector<Interval>& y) {
  std::vector<Interval> out;
  size_t i = 0, j = 0;
  while (i < x.size() && j < y.size()) {
    const double a = std::max(x[i].first, y[j].first), b = std::min(x[i].second, y[j].second);
    if (a < b) out.emplace_back(a, b);
    if (x[i].second < y[j].second) {
      ++i;
    } else {
      ++j;
    }
  }
  return out;
}

// Row order of the trace comparison: compute kinds as the prediction names them, other, then communication.
int category_rank(const std::string& c) {
  static const std::vector<std::string> kOrder = {
      "gemm", "grouped_gemm", "attention", "memory_bound", "fused_gemm_comm", "optimizer", "other"};
  const auto it = std::find(kOrder.begin(), kOrder.end(), c);
  if (it != kOrder.end()) return static_cast<int>(it - kOrder.begin());
  return is_comm_category(c) ? 100 : 50;
}

// Categories a trace of this dialect can show (a missing one measured zero); the others are unknown.
bool measurable(const std::string& c, calibrate::TraceDialect d) {
  if (d == calibrate::TraceDialect::kMoerun) return true;
  return c == "gemm" || c == "grouped_gemm" || c == "attention" || c == "memory_bound" || c == "other" ||
         c == "comm";
}

json optional_json(const std::optional<double>& v) {
  return v ? json(*v) : json(nullptr);
}

std::string seconds_cell(const std::optional<double>& v) {
  return v ? fmt::format("{:12.5f}", *v) : "-";
}

std::string error_cell(const std::optional<double>& e) {
  return e ? fmt::format("{:+7.1f}%", 100 * *e) : std::string("n/a");
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
  if (is_trace_shaped(j))
    return Error{fmt::format(
        "{}: a Chrome trace, not a moeplan report; the prediction goes first and the trace second, as the "
        "measurement",
        path)};
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
    if (o.contains("ranks")) {
      const json& k = o["ranks"];
      if (!k.is_object() || !k.contains("min_s") || !k.contains("max_s") || !k["min_s"].is_number() ||
          !k["max_s"].is_number() || (k.contains("slowest_rank") && !k["slowest_rank"].is_number_integer()))
        return Error{
            fmt::format("{}: ops: an entry's ranks needs numbers min_s and max_s (and an integer "
                        "slowest_rank)",
                        path)};
      row.ranks =
          OpRow::Ranks{k["min_s"].get<double>(), k["max_s"].get<double>(), k.value("slowest_rank", -1)};
    }
    r.ops[{o["stage"].get<int64_t>(), o["op"].get<std::string>(), o["phase"].get<std::string>()}] = row;
  }
  return r;
}

Result<StepReport> read_step_report(const std::string& path) {
  Result<json> j = read_any_json(path);
  if (!j) return j.error();
  return step_report(j.value(), path);
}

Result<MeasuredInput> read_measured(const std::string& path) {
  Result<json> j = read_any_json(path);
  if (!j) return j.error();
  const json& v = j.value();
  if (is_trace_shaped(v)) {
    Result<calibrate::TraceFile> t = calibrate::parse_trace_json(v, path);
    if (!t) return t.error();
    return MeasuredInput{std::move(t).value()};
  }
  if (v.is_object() && !v.contains("step_time_s") && !v.contains("ops") && !v.contains("breakdown"))
    return Error{
        fmt::format("{}: not a moeplan report (no step_time_s, ops or breakdown) nor a Chrome trace (no "
                    "traceEvents array); expected `moeplan simulate --json` output, moerun's report.json, or "
                    "a PyTorch profiler / Nsight Systems Chrome-trace JSON",
                    path)};
  Result<StepReport> r = step_report(v, path);
  if (!r) return r.error();
  return MeasuredInput{std::move(r).value()};
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

double MemoryComparison::allocated_error() const {
  return relative_error(predicted_allocated, measured_bytes);
}

namespace {

// The memory part of a comparison, where the prediction states its per-GPU bytes (and reserve) and the
// measurement its high-water mark.
std::optional<MemoryComparison> memory_comparison(const json& p, const json& m) {
  const json* pm = p.contains("memory") && p["memory"].is_object() ? &p["memory"] : nullptr;
  const json* mm = m.contains("memory") && m["memory"].is_object() ? &m["memory"] : nullptr;
  if (pm == nullptr || mm == nullptr) return std::nullopt;
  const double predicted = number_or(*pm, "per_gpu_bytes", -1);
  const double measured = number_or(*mm, "measured_high_water_bytes", -1);
  if (predicted <= 0 || measured <= 0) return std::nullopt;
  MemoryComparison c;
  c.predicted_bytes = c.predicted_low = c.predicted_high = predicted;
  if (const auto r = pm->find("per_gpu_bytes_range");
      r != pm->end() && r->is_array() && r->size() == 2 && (*r)[0].is_number() && (*r)[1].is_number()) {
    c.predicted_low = (*r)[0].get<double>();
    c.predicted_high = (*r)[1].get<double>();
  }
  const double reserve = pm->contains("components") && (*pm)["components"].is_object()
                             ? number_or((*pm)["components"], "reserve", 0)
                             : 0.0;
  c.predicted_allocated = predicted - reserve;
  c.measured_bytes = measured;
  if (const auto src = mm->find("source"); src != mm->end() && src->is_string()) c.measured_source = *src;
  return c;
}

}  // namespace

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
  c.memory = memory_comparison(p.j, m.j);
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
    if (x.measured.ranks) {
      o["measured_ranks"] = {{"min_s", x.measured.ranks->min_s},
                             {"max_s", x.measured.ranks->max_s},
                             {"slowest_rank", x.measured.ranks->slowest_rank}};
    }
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
  if (c.memory) {
    const MemoryComparison& x = *c.memory;
    j["memory"] = {
        {"predicted_per_gpu_bytes", x.predicted_bytes},
        {"predicted_per_gpu_bytes_range", {x.predicted_low, x.predicted_high}},
        {"predicted_allocated_bytes", x.predicted_allocated},
        {"measured_high_water_bytes", x.measured_bytes},
        {"measured_source", x.measured_source},
        {"allocated_error", x.allocated_error()},
        {"rule",
         "(predicted allocations - measured high-water) / measured high-water; the predicted "
         "allocations are the busiest stage's weights, gradients, optimizer state, activations and "
         "communication buffers, without the stack's reserve (CUDA context, libraries, "
         "fragmentation), which a GPU replay's high-water does not hold"}};
  }
  return j;
}

std::string report_comparison_text(const ReportComparison& c, int top) {
  fmt::memory_buffer b;
  auto out = std::back_inserter(b);
  fmt::format_to(out, "predicted {} : step {:.4f} s ({})\n", c.predicted_path, c.predicted_step_s,
                 c.predicted_step_rule);
  fmt::format_to(out, "measured  {} : step {:.4f} s ({})\n", c.measured_path, c.measured_step_s,
                 c.measured_step_rule);
  fmt::format_to(out, "end-to-end error of step time: {:+.1f}% ((predicted - measured) / measured)\n",
                 100 * c.end_to_end_error);
  if (c.memory) {
    const MemoryComparison& x = *c.memory;
    fmt::format_to(out,
                   "memory per GPU: measured {:.2f} GiB ({}); predicted {:.2f} GiB allocated + {:.2f} GiB "
                   "reserve = {:.2f} GiB (range {:.2f}-{:.2f}); allocations {:+.1f}% of the measured\n",
                   x.measured_bytes / kGiB, x.measured_source.empty() ? "high-water" : x.measured_source,
                   x.predicted_allocated / kGiB, (x.predicted_bytes - x.predicted_allocated) / kGiB,
                   x.predicted_bytes / kGiB, x.predicted_low / kGiB, x.predicted_high / kGiB,
                   100 * x.allocated_error());
  }
  fmt::format_to(out, "\n");
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
  // A measurement of every rank (moerun's "ranks") adds the least and the most over the stage's ranks.
  const bool ranks =
      std::any_of(c.ops.begin(), c.ops.end(), [](const JoinedOp& x) { return x.measured.ranks; });
  fmt::format_to(out, "  {:<52} {:>6} {:>11} {:>11} {:>8}{}\n", "op", "count", "predicted", "measured",
                 "error", ranks ? "   measured over ranks (slowest)" : "");
  for (size_t i = 0; i < c.ops.size() && i < rows; ++i) {
    const JoinedOp& x = c.ops[i];
    const std::string spread = x.measured.ranks
                                   ? fmt::format("   {:.5f}-{:.5f} (rank {})", x.measured.ranks->min_s,
                                                 x.measured.ranks->max_s, x.measured.ranks->slowest_rank)
                                   : std::string();
    fmt::format_to(out, "  {:<52} {:>6} {:11.5f} {:11.5f} {:+7.1f}%{}\n", key_text(x.key), x.measured.count,
                   x.predicted.total_s, x.measured.total_s,
                   100 * relative_error(x.predicted.total_s, x.measured.total_s), spread);
  }
  if (ranks) {
    fmt::format_to(
        out,
        "  (measured: the stage's lowest rank; over ranks: the least and the most seconds per step "
        "over the stage's ranks)\n");
  }
  if (!c.only_predicted.empty() || !c.only_measured.empty()) fmt::format_to(out, "\nops on one side only:\n");
  for (const auto& [k, r] : c.only_predicted)
    fmt::format_to(out, "  only predicted: {} ({} x, {:.5f} s)\n", key_text(k), r.count, r.total_s);
  for (const auto& [k, r] : c.only_measured)
    fmt::format_to(out, "  only measured:  {} ({} x, {:.5f} s)\n", key_text(k), r.count, r.total_s);
  return fmt::to_string(b);
}

// ---- Report against a Chrome trace
// -------------------------------------------------------------------------

std::string trace_category(const calibrate::KernelEvent& k, calibrate::TraceDialect dialect,
                           const calibrate::KernelPatterns& patterns) {
  using calibrate::KernelKind;
  if (dialect == calibrate::TraceDialect::kMoerun) {
    // moerun and `moeplan simulate --trace`: cat is the op kind, and communication carries its group.
    if (is_comm_kind(k.cat)) return k.group.empty() ? "comm" : "comm_" + k.group;
    for (const char* kind :
         {"gemm", "grouped_gemm", "attention", "memory_bound", "fused_gemm_comm", "optimizer"})
      if (k.cat == kind) return kind;
    return "other";
  }
  switch (patterns.classify(k.name)) {
    case KernelKind::kGemm:
      return "gemm";
    case KernelKind::kGroupedGemm:
      return "grouped_gemm";
    case KernelKind::kAttention:
      return "attention";
    case KernelKind::kNccl:
      return "comm";
    case KernelKind::kPermute:
    case KernelKind::kNorm:
    case KernelKind::kCast:
    case KernelKind::kElementwise:
      return "memory_bound";
    case KernelKind::kOther:
      return "other";
  }
  return "other";
}

Result<TraceMeasurement> measure_trace(const calibrate::TraceFile& t,
                                       const calibrate::KernelPatterns& patterns, const TraceOptions& o) {
  if (o.steps < 1) return Error{fmt::format("{}: steps must be at least 1, got {}", t.label, o.steps)};
  TraceMeasurement m;
  m.path = t.label;
  m.dialect = t.dialect;
  m.comm_groups_known = t.dialect == calibrate::TraceDialect::kMoerun;
  std::set<int64_t> devices;
  for (const auto& k : t.kernels) devices.insert(k.device);
  m.devices.assign(devices.begin(), devices.end());
  if (m.devices.empty()) return Error{fmt::format("{}: no GPU kernel events", t.label)};
  m.device = o.device >= 0 ? o.device : m.devices.front();
  if (!devices.count(m.device))
    return Error{
        fmt::format("{}: no kernels on device {} (devices with kernels: {}); expected --device one of them",
                    t.label, m.device, fmt::join(m.devices, ", "))};

  // The device's kernels by category.
  std::map<std::string, std::vector<Interval>> by_cat;
  std::vector<Interval> all;
  double first = std::numeric_limits<double>::infinity(), last = -first;
  for (const auto& k : t.kernels) {
    if (k.device != m.device) continue;
    by_cat[trace_category(k, t.dialect, patterns)].emplace_back(k.start_s, k.start_s + k.dur_s);
    all.emplace_back(k.start_s, k.start_s + k.dur_s);
    first = std::min(first, k.start_s);
    last = std::max(last, k.start_s + k.dur_s);
  }

  // Steps: CPU-side ProfilerStep#N ranges of the process with the most of them (ties: the lowest pid).
  std::map<int64_t, std::vector<const calibrate::TraceRange*>> steps_by_pid;
  for (const auto& r : t.ranges) {
    if (r.name.rfind("ProfilerStep#", 0) == 0 && r.cat != "gpu_user_annotation")
      steps_by_pid[r.pid].push_back(&r);
  }
  const std::vector<const calibrate::TraceRange*>* steps = nullptr;
  for (const auto& [pid, rs] : steps_by_pid) {
    if (!steps || rs.size() > steps->size()) steps = &rs;
  }
  if (steps) {
    const size_t n = steps->size();
    const size_t from = n >= 3 ? 1 : 0, to = n >= 3 ? n - 1 : n;  // ranges are sorted by start
    std::vector<double> durations;
    for (size_t i = from; i < to; ++i) durations.push_back((*steps)[i]->end_s - (*steps)[i]->start_s);
    m.steps = static_cast<int64_t>(durations.size());
    m.step_s = median(durations);
    m.window_start_s = (*steps)[from]->start_s;
    m.window_end_s = (*steps)[to - 1]->end_s;
    m.step_rule = n >= 3
                      ? fmt::format(
                            "median of {} ProfilerStep ranges; the first and last of {} dropped as "
                            "partial",
                            m.steps, n)
                      : fmt::format("median of {} ProfilerStep range{}; too few to drop the first and last",
                                    n, n == 1 ? "" : "s");
  } else {
    m.steps = o.steps;
    m.window_start_s = first;
    m.window_end_s = last;
    m.step_s = (last - first) / static_cast<double>(o.steps);
    m.step_rule = fmt::format("span of device {}'s kernels / {} step{} (no ProfilerStep ranges)", m.device,
                              o.steps, o.steps == 1 ? "" : "s");
  }
  const double w0 = m.window_start_s, w1 = m.window_end_s;
  if (!(w1 > w0)) return Error{fmt::format("{}: the measured window is empty ({} to {} s)", t.label, w0, w1)};

  const double per_step = 1.0 / static_cast<double>(m.steps);
  std::vector<Interval> comm, compute;
  int64_t in_window = 0;
  for (auto& [cat, v] : by_cat) {
    int64_t count = 0;
    for (const Interval& x : v) count += x.first >= w0 && x.first < w1 ? 1 : 0;
    in_window += count;
    if (count > 0) m.kernels[cat] = count;
    auto& side = is_comm_category(cat) ? comm : compute;
    side.insert(side.end(), v.begin(), v.end());
    const double busy = length_within(merged(v), w0, w1);
    if (busy > 0) m.busy_s[cat] = busy * per_step;
  }
  if (in_window == 0)
    return Error{
        fmt::format("{}: no kernel of device {} starts within the ProfilerStep ranges ({:.6f} to {:.6f} s)",
                    t.label, m.device, w0, w1)};
  const auto comm_u = merged(comm), compute_u = merged(compute);
  m.comm_s = length_within(comm_u, w0, w1) * per_step;
  m.exposed_comm_s = m.comm_s - length_within(intersect(comm_u, compute_u), w0, w1) * per_step;
  const double busy_all = length_within(merged(all), w0, w1);
  m.busy_all_s = busy_all * per_step;
  m.idle_share = 1 - busy_all / (w1 - w0);
  return m;
}

std::optional<double> CategoryRow::error() const {
  if (!predicted_s || !measured_s || !(*measured_s > 0)) return std::nullopt;
  return relative_error(*predicted_s, *measured_s);
}

TraceComparison compare_with_trace(const StepReport& p, const TraceMeasurement& m) {
  TraceComparison c;
  c.predicted_path = p.path;
  c.predicted_step_s = p.step_s;
  c.predicted_step_rule = p.step_rule;
  const Breakdown b = breakdown_of(p.j["breakdown"]);
  c.stage = b.stage;
  int64_t max_stage = 0;
  for (const auto& [key, row] : p.ops) max_stage = std::max(max_stage, std::get<0>(key));
  c.stages = max_stage + 1;
  c.predicted_idle_share = b.bubble / p.step_s;
  c.measured = m;
  c.end_to_end_error = relative_error(p.step_s, m.step_s);

  // Predicted seconds per category on the breakdown stage.
  std::map<std::string, double> predicted;
  for (const auto& [key, row] : p.ops) {
    if (std::get<0>(key) != c.stage) continue;
    if (is_comm_kind(row.kind)) {
      c.predicted_comm_by_group[row.group] += row.total_s;
      predicted[m.comm_groups_known ? category_of(row) : "comm"] += row.total_s;
    } else {
      predicted[row.kind] += row.total_s;
    }
  }
  std::set<std::string> names;
  for (const auto& [k, v] : predicted) names.insert(k);
  for (const auto& [k, v] : m.busy_s) names.insert(k);
  std::vector<std::string> order(names.begin(), names.end());
  std::stable_sort(order.begin(), order.end(), [](const std::string& x, const std::string& y) {
    return category_rank(x) < category_rank(y);
  });
  for (const std::string& name : order) {
    CategoryRow row{name, std::nullopt, std::nullopt};
    if (name != "other") row.predicted_s = predicted.count(name) ? predicted.at(name) : 0.0;
    if (m.busy_s.count(name)) {
      row.measured_s = m.busy_s.at(name);
    } else if (measurable(name, m.dialect)) {
      row.measured_s = 0.0;
    }
    c.categories.push_back(row);
  }
  double exposed = 0;
  for (const auto& [g, v] : b.exposed) exposed += v;
  c.exposed_comm = {"exposed comm", exposed, m.exposed_comm_s};

  const bool named_by_kernel = m.dialect != calibrate::TraceDialect::kMoerun;
  if (named_by_kernel && !c.predicted_comm_by_group.empty()) {
    std::vector<std::string> parts;
    for (const auto& [g, v] : c.predicted_comm_by_group) parts.push_back(fmt::format("{} {:.5f} s", g, v));
    c.notes.push_back(
        fmt::format("communication is one category 'comm': a kernel's name (ncclDevKernel_..., deep_ep::...) "
                    "does not say "
                    "which group it served; predicted comm is the sum over groups ({})",
                    fmt::join(parts, ", ")));
  }
  if (named_by_kernel && predicted.count("optimizer"))
    c.notes.push_back(
        "the optimizer has no category of its own in a trace: its kernels (multi_tensor_apply, ...) are "
        "elementwise and count under memory_bound");
  if (named_by_kernel && predicted.count("fused_gemm_comm"))
    c.notes.push_back(
        "fused GEMM + communication kernels are not told apart by name: they count under gemm, grouped_gemm "
        "or "
        "other in the trace");
  if (c.stages > 1 && named_by_kernel)
    c.notes.push_back(
        fmt::format("predicted rows are stage {} of {} (the prediction's breakdown stage); the trace's "
                    "device {} may have "
                    "run another stage",
                    c.stage, c.stages, m.device));
  if (c.stages > 1 && !named_by_kernel && m.device != c.stage)
    c.notes.push_back(
        fmt::format("predicted rows are stage {} of {} (the prediction's breakdown stage) but device {} of a "
                    "moerun trace is "
                    "stage {}: pass --device {}",
                    c.stage, c.stages, m.device, m.device, c.stage));
  return c;
}

json trace_comparison_json(const TraceComparison& c) {
  const TraceMeasurement& m = c.measured;
  json j;
  j["predicted"] = {{"file", c.predicted_path},
                    {"step_time_s", c.predicted_step_s},
                    {"step_time_rule", c.predicted_step_rule},
                    {"stage", c.stage},
                    {"stages", c.stages}};
  j["measured"] = {{"file", m.path},
                   {"kind", "chrome_trace"},
                   {"dialect", calibrate::name_of(m.dialect)},
                   {"device", m.device},
                   {"devices", m.devices},
                   {"step_time_s", m.step_s},
                   {"step_time_rule", m.step_rule},
                   {"steps", m.steps},
                   {"window_s", {m.window_start_s, m.window_end_s}},
                   {"kernels", m.kernels},
                   {"busy_s", m.busy_all_s},
                   {"comm_s", m.comm_s}};
  j["end_to_end_error"] = c.end_to_end_error;
  j["error_rule"] = "(predicted - measured) / measured";
  j["rules"] = {
      {"predicted", "seconds per step of the stage's ops of the category (op times summed)"},
      {"measured",
       "seconds per step of the union of the category's kernels on the device (kernels on several streams "
       "at once count once), within the measured window"},
      {"exposed_comm", "communication time with no other kernel running (predicted: breakdown.exposed_comm)"},
      {"idle_share", "share of the step with no kernel running (predicted: breakdown.bubble)"}};
  json cats = json::array();
  for (const CategoryRow& r : c.categories)
    cats.push_back({{"category", r.category},
                    {"predicted_s", optional_json(r.predicted_s)},
                    {"measured_s", optional_json(r.measured_s)},
                    {"error", optional_json(r.error())}});
  j["categories"] = cats;
  j["exposed_comm"] = {{"predicted_s", optional_json(c.exposed_comm.predicted_s)},
                       {"measured_s", optional_json(c.exposed_comm.measured_s)},
                       {"error", optional_json(c.exposed_comm.error())}};
  j["idle_share"] = {{"predicted", c.predicted_idle_share}, {"measured", m.idle_share}};
  j["predicted_comm_by_group"] = json(c.predicted_comm_by_group);
  j["comm_groups_known"] = m.comm_groups_known;
  j["notes"] = c.notes;
  return j;
}

std::string trace_comparison_text(const TraceComparison& c) {
  const TraceMeasurement& m = c.measured;
  fmt::memory_buffer b;
  auto out = std::back_inserter(b);
  fmt::format_to(out, "predicted {} : step {:.6f} s ({}); rows are stage {}\n", c.predicted_path,
                 c.predicted_step_s, c.predicted_step_rule, c.stage);
  fmt::format_to(out, "measured  {} : step {:.6f} s ({}); {} trace, device {}\n", m.path, m.step_s,
                 m.step_rule, calibrate::name_of(m.dialect), m.device);
  fmt::format_to(out, "end-to-end error of step time: {:+.1f}% ((predicted - measured) / measured)\n\n",
                 100 * c.end_to_end_error);
  fmt::format_to(out, "{:<28} {:>12} {:>12} {:>8}   (seconds per step)\n", "category", "predicted",
                 "measured", "error");
  auto row = [&](const CategoryRow& r) {
    fmt::format_to(out, "{:<28} {:>12} {:>12} {:>8}\n", r.category, seconds_cell(r.predicted_s),
                   seconds_cell(r.measured_s), error_cell(r.error()));
  };
  for (const CategoryRow& r : c.categories) row(r);
  row(c.exposed_comm);
  fmt::format_to(out,
                 "{:<28} {:>11.1f}% {:>11.1f}%            (share of the step: bubble, host-bound gaps)\n",
                 "idle (no kernel running)", 100 * c.predicted_idle_share, 100 * m.idle_share);
  fmt::format_to(
      out,
      "\npredicted: the stage's op seconds per step; measured: the union of the category's kernels on "
      "device {} (kernels on several streams at once count once) per step; exposed comm: "
      "communication with no other kernel running\n",
      m.device);
  if (!c.notes.empty()) fmt::format_to(out, "notes:\n");
  for (const std::string& n : c.notes) fmt::format_to(out, "  - {}\n", n);
  return fmt::to_string(b);
}

}  // namespace moeplan::planner
