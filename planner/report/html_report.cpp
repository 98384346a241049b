// The HTML report pages (see html_report.h): the summary numbers are read from prediction_json (the --json
// report), the charts are SVG drawn here, the styling is one inline stylesheet.
#include "planner/report/html_report.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <iterator>
#include <set>

#include <fmt/format.h>

#include "simulator/core/units.h"
#include "simulator/io/plan_io.h"

namespace moeplan::report {
namespace {

using nlohmann::json;
using Out = fmt::memory_buffer;

template <typename... Args>
void emit(Out& out, fmt::format_string<Args...> f, Args&&... args) {
  fmt::format_to(std::back_inserter(out), f, std::forward<Args>(args)...);
}

// ---- Categories and colours -------------------------------------------------------------------------------
// Ops are coloured by what the step breakdown calls them: compute by op kind, communication by process group.
// Compute takes cool colours, communication warm ones; red and grey are kept for exposed communication and
// idle time. (Tableau 10/20 hues: distinct in print and for the common colour-vision deficiencies.)
struct Category {
  const char* name;
  const char* label;
  const char* colour;
};
constexpr std::array<Category, 16> kCategories = {{
    {"gemm", "GEMM", "#4e79a7"},
    {"grouped_gemm", "grouped GEMM (experts)", "#59a14f"},
    {"attention", "attention", "#76b7b2"},
    {"memory_bound", "memory-bound", "#edc948"},
    {"fused_gemm_comm", "fused GEMM + comm", "#b07aa1"},
    {"optimizer", "optimizer", "#9c755f"},
    {"tp", "TP comm", "#f28e2b"},
    {"sp", "SP comm", "#ffbe7d"},
    {"cp", "CP comm", "#d4a6c8"},
    {"ep", "EP comm", "#b6992d"},
    {"etp", "ETP comm", "#f1ce63"},
    {"dp", "DP comm", "#a0cbe8"},
    {"dp_attn", "DP comm (attention)", "#86bcb6"},
    {"dp_expert", "DP comm (experts)", "#8cd17d"},
    {"pp", "PP send/recv", "#79706e"},
    {"none", "other", "#bab0ac"},
}};
constexpr const char* kExposedColour = "#d62728";
constexpr size_t kFirstCommCategory = 6;

size_t category_index(const Op& op) {
  if (op.kind == OpKind::kCollective || op.kind == OpKind::kSendRecv) {
    return kFirstCommCategory +
           (op.comm.group == CommGroup::kNone ? 9 : static_cast<size_t>(op.comm.group) - 1);
  }
  switch (op.kind) {
    case OpKind::kFusedGemmComm:
      return 4;
    case OpKind::kOptimizer:
      return 5;
    default:
      return static_cast<size_t>(op.kind);  // gemm, grouped_gemm, attention, memory_bound: 0..3
  }
}

const Category& category(std::string_view name) {
  for (const auto& c : kCategories) {
    if (name == c.name) return c;
  }
  return kCategories.back();
}

// ---- Number formatting ------------------------------------------------------------------------------------

// 1234567.8 -> "1,234,568"
std::string grouped(double v) {
  std::string digits = fmt::format("{:.0f}", std::abs(v));
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return v < 0 ? "-" + out : out;
}

std::string gb(double bytes) {
  return fmt::format("{:.1f} GiB", bytes / (1024.0 * 1024.0 * 1024.0));
}

// Seconds with a unit that keeps three significant digits readable.
std::string duration(double s) {
  if (s >= 1) return fmt::format("{:.3f} s", s);
  if (s >= 1e-3) return fmt::format("{:.2f} ms", s * 1e3);
  return fmt::format("{:.1f} µs", s * 1e6);
}

std::string percent(double fraction, int decimals = 1) {
  return fmt::format("{:.{}f}%", 100 * fraction, decimals);
}

// ---- Page frame -------------------------------------------------------------------------------------------

constexpr const char* kStyle = R"css(
:root { --ink:#1f2328; --muted:#59636e; --line:#d8dee4; --bg:#f6f8fa; --accent:#0969da; --bad:#cf222e; --good:#1a7f37; }
* { box-sizing: border-box; }
body { margin: 0; background: var(--bg); color: var(--ink);
  font: 14px/1.45 system-ui, -apple-system, "Segoe UI", "DejaVu Sans", "Liberation Sans", sans-serif; }
main { max-width: 1220px; margin: 0 auto; padding: 24px 28px 40px; }
header h1 { font-size: 22px; margin: 0 0 2px; }
header p { margin: 0; color: var(--muted); }
section { background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: 16px 20px; margin-top: 16px; }
h2 { font-size: 16px; margin: 0 0 10px; }
h3 { font-size: 14px; margin: 14px 0 6px; }
p.note { color: var(--muted); font-size: 12.5px; margin: 6px 0 0; }
.kpis { display: grid; grid-template-columns: repeat(auto-fit, minmax(170px, 1fr)); gap: 10px; }
.kpi { border: 1px solid var(--line); border-radius: 6px; padding: 10px 12px; }
.kpi .k { color: var(--muted); font-size: 12px; text-transform: uppercase; letter-spacing: .04em; }
.kpi .v { font-size: 22px; font-weight: 600; font-variant-numeric: tabular-nums; }
.kpi .s { color: var(--muted); font-size: 12px; }
.badge { display: inline-block; padding: 1px 8px; border-radius: 10px; font-size: 12px; font-weight: 600; color: #fff; }
.badge.ok { background: var(--good); } .badge.bad { background: var(--bad); } .badge.warn { background: #9a6700; }
table { border-collapse: collapse; width: 100%; font-variant-numeric: tabular-nums; }
th, td { text-align: left; padding: 4px 10px 4px 0; border-bottom: 1px solid var(--line); vertical-align: top; }
th { color: var(--muted); font-weight: 600; font-size: 12px; }
td.n, th.n { text-align: right; }
table.settings td:first-child { color: var(--muted); width: 130px; }
code { font: 12.5px ui-monospace, "DejaVu Sans Mono", monospace; }
.legend { display: flex; flex-wrap: wrap; gap: 4px 16px; margin-top: 8px; font-size: 12.5px; }
span.sw { display: inline-block; width: 11px; height: 11px; border-radius: 2px; margin-right: 5px; vertical-align: -1px; }
span.sw.exposed { background: repeating-linear-gradient(45deg, #d62728 0 3px, #f4b6b6 3px 6px); }
span.sw.idle { background: repeating-linear-gradient(45deg, #a8a8a8 0 2px, #ececec 2px 5px); }
.grid2 { display: grid; grid-template-columns: 1fr 1fr; gap: 20px; margin-top: 14px; }
svg { display: block; width: 100%; height: auto; }
svg text { font-size: 12px; fill: var(--ink); }
svg text.muted { fill: var(--muted); }
details { margin-top: 8px; } summary { cursor: pointer; color: var(--accent); font-size: 12.5px; }
pre { background: var(--bg); border: 1px solid var(--line); border-radius: 6px; padding: 8px 12px; overflow-x: auto; }
ul.warn { margin: 4px 0 0 18px; padding: 0; color: var(--muted); font-size: 12.5px; }
footer { color: var(--muted); font-size: 12px; margin-top: 18px; }
)css";

void page_begin(Out& out, const std::string& title) {
  emit(out,
       "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
       "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
       "<title>{}</title>\n<style>{}</style>\n</head>\n<body>\n<main>\n",
       html_escape(title), kStyle);
}

void page_end(Out& out, const std::string& generator) {
  emit(out,
       "<footer>Generated by <code>{}</code>. Predictions of the moeplan simulator, not measurements. "
       "Self-contained page: nothing is fetched.</footer>\n</main>\n</body>\n</html>\n",
       html_escape(generator));
}

// ---- Plan settings ----------------------------------------------------------------------------------------

// The plan in words, then the plan file itself (complete, and ready to copy into `moeplan simulate`).
void plan_settings(Out& out, const Plan& plan) {
  const auto on = [](bool b) { return b ? "on" : "off"; };
  // Derived sizes as the plan's own accessors compute them, or "n/a" where a degree does not divide (an
  // illegal plan's page shows its settings too).
  const auto ratio = [](int64_t num, int64_t den) {
    return den > 0 && num % den == 0 ? std::to_string(num / den) : std::string("n/a");
  };
  const int64_t per_stage =
      plan.pipeline.pp > 0 && plan.gpus % plan.pipeline.pp == 0 ? plan.gpus_per_stage() : 0;
  const int64_t dp = per_stage > 0 && per_stage % plan.attention_mesh() == 0 ? plan.dp() : 0;
  const std::string micro_batches = ratio(plan.global_batch, plan.micro_batch * dp);
  const std::string attn_dp = ratio(per_stage, plan.attention_mesh());
  const std::string expert_dp = ratio(per_stage, plan.expert_mesh());
  std::string layers;
  for (int64_t n : plan.pipeline.layers_per_stage) layers += (layers.empty() ? "" : ", ") + std::to_string(n);
  const std::vector<std::pair<const char*, std::string>> rows = {
      {"job",
       fmt::format("{} GPUs · sequence {} · global batch {} · micro-batch {} · {} micro-batches per step",
                   plan.gpus, plan.seq_len, plan.global_batch, plan.micro_batch, micro_batches)},
      {"attention", fmt::format("TP {} · SP {} · CP {} · data parallel {}", plan.attention.tp,
                                plan.attention.sp, plan.attention.cp, attn_dp)},
      {"experts",
       fmt::format("EP {} · ETP {} · data parallel {} · dispatch {} ({})", plan.experts.ep, plan.experts.etp,
                   plan.expert_dp(), name_of(plan.experts.dispatch), name_of(plan.compression.dispatch))},
      {"pipeline", fmt::format("PP {} · virtual stages {} · {}{}", plan.pipeline.pp, plan.pipeline.vpp,
                               name_of(plan.pipeline.schedule),
                               layers.empty() ? "" : " · layers per virtual stage " + layers)},
      {"memory", fmt::format("ZeRO {} · recompute {} · precision {}", plan.data.zero, name_of(plan.recompute),
                             name_of(plan.precision))},
      {"overlap", fmt::format("inter-op {} · intra-op {} · DP comm {} · PP comm {} · gradient sync {}",
                              on(plan.overlap.inter_op), on(plan.overlap.intra_op), on(plan.overlap.dp_comm),
                              on(plan.overlap.pp_comm), name_of(plan.compression.grad_sync))},
      {"routing", fmt::format("{}{}", plan.routing.distribution,
                              plan.routing.capacity_factor
                                  ? fmt::format(" · capacity factor {}", *plan.routing.capacity_factor)
                                  : std::string())},
  };
  emit(out, "<table class=\"settings\">\n");
  for (const auto& [key, text] : rows) emit(out, "<tr><td>{}</td><td>{}</td></tr>\n", key, html_escape(text));
  emit(out, "</table>\n<details><summary>plan file</summary><pre><code>{}</code></pre></details>\n",
       html_escape(io::plan_to_json(plan).dump(2)));
}

// ---- Summary ----------------------------------------------------------------------------------------------

// One number card. `key` and the exact JSON value let a reader (and the tests) tie the card to --json.
void kpi(Out& out, const std::string& key, const json& value, const std::string& label,
         const std::string& shown, const std::string& sub) {
  emit(out,
       "<div class=\"kpi\" data-key=\"{}\" data-value=\"{}\"><div class=\"k\">{}</div><div "
       "class=\"v\">{}</div>"
       "<div class=\"s\">{}</div></div>\n",
       html_escape(key), html_escape(value.dump()), html_escape(label), shown, sub);
}

void summary(Out& out, const json& r) {
  const json& mem = r.at("memory");
  const double step = r.at("step_time_s").get<double>();
  const double per_gpu = mem.at("per_gpu_bytes").get<double>();
  const double cap = mem.at("capacity_bytes").get<double>();
  const bool fits = mem.at("fits").get<bool>();
  const json& range = r.at("tokens_per_s_range");
  emit(out, "<div class=\"kpis\">\n");
  kpi(out, "step_time_s", r.at("step_time_s"), "Step time", html_escape(duration(step)),
      fmt::format("{} tokens per step", grouped(r.at("tokens_per_step").get<double>())));
  kpi(out, "tokens_per_s", r.at("tokens_per_s"), "Tokens / s", grouped(r.at("tokens_per_s").get<double>()),
      fmt::format("range {} – {} (fit errors)", grouped(range.at(0).get<double>()),
                  grouped(range.at(1).get<double>())));
  kpi(out, "tokens_per_s_per_gpu", r.at("tokens_per_s_per_gpu"), "Tokens / s per GPU",
      fmt::format("{:.1f}", r.at("tokens_per_s_per_gpu").get<double>()),
      fmt::format("{} GPUs", r.at("gpus").get<int64_t>()));
  kpi(out, "mfu", r.at("mfu"), "MFU", percent(r.at("mfu").get<double>()),
      fmt::format("of dense {} peak ({} of BF16)", r.at("mfu_peak_dtype").get<std::string>(),
                  percent(r.at("mfu_bf16_equivalent").get<double>())));
  kpi(out, "memory.per_gpu_bytes", mem.at("per_gpu_bytes"), "Memory per GPU", gb(per_gpu),
      fmt::format("{} of {} HBM (stage {})", percent(per_gpu / cap, 0), gb(cap),
                  mem.at("stage").get<int64_t>()));
  kpi(out, "memory.fits", mem.at("fits"), "Fits in HBM",
      fits ? "<span class=\"badge ok\">fits</span>" : "<span class=\"badge bad\">does not fit</span>",
      fits ? fmt::format("{} headroom", gb(cap - per_gpu)) : fmt::format("{} over", gb(per_gpu - cap)));
  emit(out, "</div>\n");
  const json& routing = r.at("routing");
  if (routing.at("mean_rank_assignments").get<double>() > 0) {
    emit(out,
         "<p class=\"note\">Routing: the busiest expert-parallel rank gets {:.3f}× the mean load; {} of "
         "token-expert assignments dropped.</p>\n",
         routing.at("imbalance").get<double>(), percent(routing.at("dropped_fraction").get<double>(), 2));
  }
  if (!r.at("stack_calibrated").get<bool>()) {
    emit(out,
         "<p class=\"note\"><span class=\"badge warn\">uncalibrated</span> The {} stack profile holds "
         "assumptions from public measurements, not a fit to this cluster.</p>\n",
         html_escape(r.at("stack").get<std::string>()));
  }
  const json& prov = r.at("provenance");
  const json& share = prov.at("critical_path_share");
  emit(out,
       "<p class=\"note\">Critical path priced by stack numbers that are {} measured, {} derived, {} "
       "assumed, {} "
       "target.</p>\n",
       percent(share.at("measured").get<double>(), 0), percent(share.at("derived").get<double>(), 0),
       percent(share.at("assumed").get<double>(), 0), percent(share.at("target").get<double>(), 0));
  if (prov.at("hypothetical").get<bool>()) {
    emit(out,
         "<p class=\"note\"><span class=\"badge bad\">hypothetical</span> This prediction credits what "
         "the stack has not measured:</p>\n<ul class=\"warn\">\n");
    for (const auto& t : prov.at("why_hypothetical"))
      emit(out, "<li>{}</li>\n", html_escape(t.get<std::string>()));
    emit(out, "</ul>\n");
  }
  for (const auto& n : r.at("stack_notices")) {
    emit(out, "<p class=\"note\"><span class=\"badge warn\">stack</span> {}</p>\n",
         html_escape(n.get<std::string>()));
  }
  const json& extra = r.at("extrapolations");
  if (!extra.empty()) {
    emit(out, "<p class=\"note\">Outside the calibrated data ({}):</p>\n<ul class=\"warn\">\n", extra.size());
    for (const auto& e : extra) emit(out, "<li>{}</li>\n", html_escape(e.get<std::string>()));
    emit(out, "</ul>\n");
  }
}

// ---- Step-time breakdown ----------------------------------------------------------------------------------

struct Segment {
  std::string category;  // a kCategories name, or "exposed:<group>" / "bubble"
  std::string label;
  std::string fill;
  double seconds = 0;
};

// The breakdown in drawing order: compute, optimizer, exposed communication, idle. Same numbers as --json's
// "breakdown".
std::vector<Segment> breakdown_segments(const json& b) {
  std::vector<Segment> s;
  for (const auto& [k, v] : b.at("compute").items()) {
    const Category& c = category(k);
    s.push_back({k, c.label, c.colour, v.get<double>()});
  }
  if (b.at("optimizer").get<double>() > 0) {
    s.push_back({"optimizer", "optimizer", category("optimizer").colour, b.at("optimizer").get<double>()});
  }
  for (const auto& [k, v] : b.at("exposed_comm").items()) {
    const Category& c = category(k);
    s.push_back({"exposed:" + k, std::string("exposed ") + c.label, c.colour, v.get<double>()});
  }
  if (b.at("bubble").get<double>() > 0) {
    s.push_back(
        {"bubble", "idle (pipeline bubble, waits)", "url(#idle-hatch)", b.at("bubble").get<double>()});
  }
  return s;
}

constexpr const char* kHatchDefs =
    "<defs><pattern id=\"idle-hatch\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" "
    "patternTransform=\"rotate(45)\"><rect width=\"6\" height=\"6\" fill=\"#ececec\"/>"
    "<rect width=\"2.5\" height=\"6\" fill=\"#a8a8a8\"/></pattern>"
    "<pattern id=\"exposed-hatch\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" "
    "patternTransform=\"rotate(45)\"><rect width=\"6\" height=\"6\" fill=\"#f4b6b6\"/>"
    "<rect width=\"3\" height=\"6\" fill=\"#d62728\"/></pattern></defs>";

constexpr double kChartWidth = 1160;  // SVG user units; the page scales it to its column

// One stacked bar per row (a plan), scaled to the longest; under each group of segments a band saying
// compute / exposed communication / idle.
void breakdown_chart(Out& out, const std::vector<std::pair<std::string, json>>& rows) {
  const double label_w = rows.size() > 1 ? 60 : 0, right = 90;
  const double bar_h = 26, band_h = 14, row_h = bar_h + band_h + 18;
  double longest = 0;
  for (const auto& [name, b] : rows) {
    double t = 0;
    for (const auto& s : breakdown_segments(b)) t += s.seconds;
    longest = std::max(longest, t);
  }
  if (longest <= 0) longest = 1;
  const double plot_w = kChartWidth - label_w - right;
  const double height = row_h * static_cast<double>(rows.size()) + 4;
  emit(out,
       "<svg class=\"chart breakdown\" viewBox=\"0 0 {} {:.0f}\" role=\"img\" aria-label=\"step-time "
       "breakdown\">{}\n",
       kChartWidth, height, kHatchDefs);
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& [name, b] = rows[i];
    const double y = row_h * static_cast<double>(i) + 2;
    if (label_w > 0)
      emit(out, "<text x=\"0\" y=\"{:.1f}\">{}</text>\n", y + bar_h / 2 + 4, html_escape(name));
    double x = label_w, total = 0;
    const auto segs = breakdown_segments(b);
    for (const auto& s : segs) total += s.seconds;
    // Bands: runs of segments of one kind (compute + optimizer, exposed comm, idle).
    struct Band {
      double x0, x1;
      const char* what;
      const char* fill;
    };
    std::vector<Band> bands;
    for (const auto& s : segs) {
      const double w = plot_w * s.seconds / longest;
      const bool exposed = s.category.starts_with("exposed:");
      emit(out,
           "<rect x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{}\" fill=\"{}\" stroke=\"#fff\" "
           "stroke-width=\"0.6\"><title>{}: {} ({})</title></rect>\n",
           x, y, w, bar_h, s.fill, html_escape(s.label), duration(s.seconds), percent(s.seconds / total));
      if (w > 70) {
        emit(out,
             "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" style=\"font-size:11px\">{}</text>\n",
             x + w / 2, y + bar_h / 2 + 4, percent(s.seconds / total, 0));
      }
      const char* what = exposed ? "exposed comm" : (s.category == "bubble" ? "idle" : "compute");
      const char* fill = exposed ? kExposedColour : (s.category == "bubble" ? "#8c8c8c" : "#425466");
      if (!bands.empty() && std::string_view(bands.back().what) == what) {
        bands.back().x1 = x + w;
      } else {
        bands.push_back({x, x + w, what, fill});
      }
      x += w;
    }
    emit(out, "<text x=\"{:.1f}\" y=\"{:.1f}\">{}</text>\n", x + 6, y + bar_h / 2 + 4, duration(total));
    for (const auto& band : bands) {
      emit(out, "<rect x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"3\" fill=\"{}\"/>\n", band.x0,
           y + bar_h + 4, std::max(0.0, band.x1 - band.x0 - 1), band.fill);
      if (band.x1 - band.x0 > 8.0 * static_cast<double>(std::string_view(band.what).size())) {
        emit(out, "<text class=\"muted\" x=\"{:.1f}\" y=\"{:.1f}\" style=\"font-size:11px\">{}</text>\n",
             band.x0, y + bar_h + band_h + 4, band.what);
      }
    }
  }
  emit(out, "</svg>\n");
}

// A legend swatch of a breakdown part (the idle hatch as CSS, since an SVG pattern does not reach HTML).
std::string swatch(const Segment& s) {
  if (s.category == "bubble") return "<span class=\"sw idle\"></span>";
  return fmt::format("<span class=\"sw\" style=\"background:{}\"></span>", s.fill);
}

// The legend table of one breakdown: each part's seconds and share of the step.
void breakdown_table(Out& out, const json& b) {
  const auto segs = breakdown_segments(b);
  double total = 0;
  for (const auto& s : segs) total += s.seconds;
  emit(out,
       "<table><tr><th></th><th>part of the step (stage {})</th><th class=\"n\">time</th>"
       "<th class=\"n\">share</th></tr>\n",
       b.at("stage").get<int64_t>());
  for (const auto& s : segs) {
    emit(out,
         "<tr data-part=\"{}\" data-seconds=\"{}\"><td>{}</td><td>{}</td><td class=\"n\">{}</td><td "
         "class=\"n\">{}</td></tr>\n",
         html_escape(s.category), json(s.seconds).dump(), swatch(s), html_escape(s.label),
         duration(s.seconds), percent(s.seconds / total));
  }
  emit(out, "<tr><td></td><td><b>step</b></td><td class=\"n\"><b>{}</b></td><td class=\"n\">100%</td></tr>\n",
       duration(total));
  emit(out, "</table>\n");
}

// ---- Memory -----------------------------------------------------------------------------------------------

struct MemoryPart {
  const char* key;
  const char* label;
  const char* colour;
};
constexpr std::array<MemoryPart, 6> kMemoryParts = {{
    {"weights", "weights", "#4e79a7"},
    {"gradients", "gradients", "#f28e2b"},
    {"optimizer", "optimizer states", "#9c755f"},
    {"activations", "activations", "#59a14f"},
    {"comm_buffers", "comm buffers", "#b07aa1"},
    {"reserve", "reserve", "#bab0ac"},
}};

// One stacked bar per row (--json "memory"), against a line at HBM capacity.
void memory_chart(Out& out, const std::vector<std::pair<std::string, json>>& rows) {
  const double label_w = rows.size() > 1 ? 60 : 0, right = 150;
  const double bar_h = 24, row_h = 34, top = 20;
  double scale = 0, cap = 0;
  for (const auto& [name, m] : rows) {
    cap = std::max(cap, m.at("capacity_bytes").get<double>());
    scale = std::max({scale, m.at("per_gpu_bytes").get<double>(), m.at("capacity_bytes").get<double>()});
  }
  scale *= 1.04;
  const double plot_w = kChartWidth - label_w - right;
  const double height = top + row_h * static_cast<double>(rows.size()) + 6;
  emit(out,
       "<svg class=\"chart memory\" viewBox=\"0 0 {} {:.0f}\" role=\"img\" aria-label=\"memory per GPU\">\n",
       kChartWidth, height);
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& [name, m] = rows[i];
    const double y = top + row_h * static_cast<double>(i);
    if (label_w > 0)
      emit(out, "<text x=\"0\" y=\"{:.1f}\">{}</text>\n", y + bar_h / 2 + 4, html_escape(name));
    // The HBM as a track behind the bar.
    emit(out, "<rect x=\"{}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{}\" fill=\"#eef1f4\"/>\n", label_w, y,
         plot_w * m.at("capacity_bytes").get<double>() / scale, bar_h);
    double x = label_w;
    for (const auto& part : kMemoryParts) {
      const double bytes = m.at("components").at(part.key).get<double>();
      const double w = plot_w * bytes / scale;
      emit(out,
           "<rect x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{}\" fill=\"{}\" stroke=\"#fff\" "
           "stroke-width=\"0.6\"><title>{}: {}</title></rect>\n",
           x, y, w, bar_h, part.colour, part.label, gb(bytes));
      if (w > 64) {
        emit(out,
             "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" style=\"font-size:11px\">{}</text>\n",
             x + w / 2, y + bar_h / 2 + 4, gb(bytes));
      }
      x += w;
    }
    const bool fits = m.at("fits").get<bool>();
    emit(out, "<text x=\"{:.1f}\" y=\"{:.1f}\"{}>{} {}</text>\n", x + 6, y + bar_h / 2 + 4,
         fits ? "" : " style=\"fill:#cf222e;font-weight:600\"", gb(m.at("per_gpu_bytes").get<double>()),
         fits ? "" : "does not fit");
  }
  const double cx = label_w + plot_w * cap / scale;
  emit(
      out,
      "<line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1}\" y2=\"{2:.1f}\" stroke=\"#1f2328\" stroke-width=\"1.5\" "
      "stroke-dasharray=\"5 3\"/>\n<text x=\"{0:.1f}\" y=\"12\" text-anchor=\"middle\">HBM capacity "
      "{3}</text>\n",
      cx, top - 4, height - 2, gb(cap));
  emit(out, "</svg>\n<div class=\"legend\">");
  for (const auto& part : kMemoryParts) {
    emit(out, "<span><span class=\"sw\" style=\"background:{}\"></span>{}</span>", part.colour, part.label);
  }
  emit(out, "</div>\n");
}

// ---- Timeline ---------------------------------------------------------------------------------------------

// Every stage when there are at most `max_stages`; else the first, the last, the critical one and evenly
// spaced ones up to `max_stages` (fewer when rounding lands on one already drawn).
std::vector<int32_t> drawn_stages(int32_t n, int32_t critical, int64_t max_stages) {
  std::set<int32_t> s;
  if (n <= max_stages) {
    for (int32_t i = 0; i < n; ++i) s.insert(i);
  } else {
    s = {0, n - 1, std::clamp(critical, 0, n - 1)};
    const auto m = static_cast<int32_t>(std::max<int64_t>(max_stages, 3));
    for (int32_t i = 1; static_cast<int64_t>(s.size()) < m && i < m - 1; ++i) {
      s.insert(static_cast<int32_t>(std::lround(static_cast<double>(i) * (n - 1) / (m - 1))));
    }
  }
  return {s.begin(), s.end()};
}

// Ops of one row in start order, merged at `resolution` seconds: an op joins the rectangle before it when the
// gap between them is at most `resolution` and they share a category or one of them is narrower than it. The
// merged rectangle takes the category with the most seconds in it. Resolution 0: one rectangle per op.
void merge_ops(const Prediction& p, const std::vector<int32_t>& ids, int32_t row, double resolution,
               std::vector<TimelineRect>& out) {
  std::array<double, kCategories.size()> seconds{};
  TimelineRect cur;
  bool open = false;
  auto close = [&] {
    if (!open) return;
    cur.category =
        kCategories[static_cast<size_t>(std::max_element(seconds.begin(), seconds.end()) - seconds.begin())]
            .name;
    out.push_back(cur);
    seconds.fill(0);
    open = false;
  };
  for (int32_t id : ids) {
    const Op& op = p.graph.ops[static_cast<size_t>(id)];
    const auto& t = p.timeline.ops[static_cast<size_t>(id)];
    const size_t c = category_index(op);
    if (open && resolution > 0 && t.start - cur.end <= resolution) {
      const size_t cur_c =
          static_cast<size_t>(std::max_element(seconds.begin(), seconds.end()) - seconds.begin());
      if (c == cur_c || cur.end - cur.start < resolution || t.end - t.start < resolution) {
        cur.end = std::max(cur.end, t.end);
        cur.ops += 1;
        seconds[c] += t.end - t.start;
        continue;
      }
    }
    close();
    cur = {row, t.start, t.end, MarkKind::kOp, {}, id, 1};
    seconds[c] = t.end - t.start;
    open = true;
  }
  close();
}

// A start or end of one op of a stage, for the sweep that finds its exposed communication and idle time.
struct Edge {
  double t;
  bool compute, start;
};

// The stage's op starts and ends in time order (ends first at a tie), as stage_breakdown sweeps them.
std::vector<Edge> stage_edges(const Prediction& p, const std::vector<int32_t>& ids) {
  std::vector<Edge> edges;
  edges.reserve(2 * ids.size());
  for (int32_t id : ids) {
    const auto& t = p.timeline.ops[static_cast<size_t>(id)];
    const bool compute = p.costs[static_cast<size_t>(id)].resource == cost::Resource::kSm;
    edges.push_back({t.start, compute, true});
    edges.push_back({t.end, compute, false});
  }
  std::sort(edges.begin(), edges.end(), [](const Edge& a, const Edge& b) {
    return a.t != b.t ? a.t < b.t : (a.start != b.start && !a.start);
  });
  return edges;
}

// The stage's exposed-communication and idle intervals, classified as stage_breakdown does (predict.cpp):
// any compute kernel running -> compute; else any transfer -> exposed communication; else idle, up to the
// step's end. Intervals of one kind closer than `resolution` merge.
void stage_marks(const std::vector<Edge>& edges, double step_time, int32_t row, double resolution,
                 std::vector<TimelineRect>& out) {
  int64_t compute = 0, comm = 0;
  double prev = 0;
  auto mark = [&](double t0, double t1) {
    if (t1 <= t0 || compute > 0) return;
    const MarkKind kind = comm > 0 ? MarkKind::kExposedComm : MarkKind::kIdle;
    for (auto it = out.rbegin(); it != out.rend() && it->row == row; ++it) {
      if (it->kind != kind) continue;
      if (t0 - it->end <= resolution) {
        it->end = t1;
        return;
      }
      break;
    }
    out.push_back({row, t0, t1, kind, {}, -1, 0});
  };
  for (const Edge& e : edges) {
    mark(prev, e.t);
    prev = e.t;
    (e.compute ? compute : comm) += e.start ? 1 : -1;
  }
  mark(prev, step_time);
}

struct Layout {
  TimelineLayout t;
  std::vector<std::vector<std::vector<int32_t>>> by_row;  // [drawn stage][stream] op ids in start order
  std::vector<std::vector<Edge>> edges;                   // [drawn stage]
};

TimelineLayout layout_at(const Prediction& p, const Layout& base, double resolution) {
  TimelineLayout t = base.t;
  t.merge_resolution_s = resolution;
  for (size_t si = 0; si < t.stages.size(); ++si) {
    const int32_t stage = t.stages[si];
    for (int k = 0; k < kNumStreams; ++k) {
      const auto& ids = base.by_row[si][static_cast<size_t>(k)];
      if (ids.empty()) continue;
      const auto row = static_cast<int32_t>(t.rows.size());
      t.rows.push_back({stage, k, fmt::format("stage {} · {}", stage, name_of(static_cast<Stream>(k)))});
      merge_ops(p, ids, row, resolution, t.rects);
    }
    const auto row = static_cast<int32_t>(t.rows.size());
    t.rows.push_back({stage, -1, fmt::format("stage {} · exposed / idle", stage)});
    stage_marks(base.edges[si], p.timeline.step_time, row, resolution, t.rects);
  }
  return t;
}

// A tick step of 1, 2 or 5 times a power of ten giving about `n` ticks over `span`.
double nice_step(double span, int n) {
  const double raw = span / n;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double f : {1.0, 2.0, 5.0}) {
    if (f * mag >= raw) return f * mag;
  }
  return 10 * mag;
}

void timeline_chart(Out& out, const Prediction& p, const TimelineLayout& t) {
  const double label_w = 170, right = 10, top = 26, row_h = 15, mark_h = 11, stage_gap = 8;
  const double plot_w = kChartWidth - label_w - right;
  const double step = std::max(p.timeline.step_time, 1e-12);
  // Row tops: stream rows, then the stage's mark row, then a gap before the next stage.
  std::vector<double> y(t.rows.size());
  double cy = top;
  for (size_t i = 0; i < t.rows.size(); ++i) {
    if (i > 0 && t.rows[i].stage != t.rows[i - 1].stage) cy += stage_gap;
    y[i] = cy;
    cy += t.rows[i].stream < 0 ? mark_h + 3 : row_h + 2;
  }
  const double height = cy + 6;
  emit(out,
       "<svg class=\"chart timeline\" viewBox=\"0 0 {} {:.0f}\" role=\"img\" aria-label=\"step "
       "timeline\">{}\n",
       kChartWidth, height, kHatchDefs);
  // Time axis: ticks in ms below a second, else in s.
  const bool ms = step < 1;
  const double tick = nice_step(step, 10);
  const int decimals = std::max(0, -static_cast<int>(std::floor(std::log10(tick * (ms ? 1e3 : 1)) + 1e-9)));
  for (double x = 0; x <= step * (1 + 1e-9); x += tick) {
    const double px = label_w + plot_w * x / step;
    emit(out,
         "<line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1}\" y2=\"{2:.1f}\" stroke=\"#eaeef2\"/>"
         "<text class=\"muted\" x=\"{0:.1f}\" y=\"{3}\" text-anchor=\"middle\" "
         "style=\"font-size:11px\">{4:.{5}f}"
         "{6}</text>\n",
         px, top - 4, height - 4, top - 10, ms ? x * 1e3 : x, decimals, x == 0 ? (ms ? " ms" : " s") : "");
  }
  for (size_t i = 0; i < t.rows.size(); ++i) {
    const auto& r = t.rows[i];
    const bool critical = r.stage == p.critical_stage && r.stream == 0;
    emit(out, "<text x=\"0\" y=\"{:.1f}\"{}>{}</text>\n", y[i] + (r.stream < 0 ? mark_h : row_h) - 3,
         r.stream < 0 ? " class=\"muted\" style=\"font-size:11px\"" : "",
         html_escape(r.label) + (critical ? " ★" : ""));
  }
  for (const auto& r : t.rects) {
    const auto row = static_cast<size_t>(r.row);
    const double x = label_w + plot_w * r.start / step;
    const double w = std::max(plot_w * (r.end - r.start) / step, 0.6);
    if (r.kind == MarkKind::kOp) {
      const Op& op = p.graph.ops[static_cast<size_t>(r.first_op)];
      const std::string what =
          r.ops == 1 ? fmt::format("{} ({}, micro-batch {})", op_label(op), name_of(op.phase), op.micro_batch)
                     : fmt::format("{} ops merged, mostly {}, from {}", r.ops, category(r.category).label,
                                   op_label(op));
      emit(out,
           "<rect class=\"op\" data-ops=\"{}\" x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{}\" "
           "fill=\"{}\"><title>{}: {}</title></rect>\n",
           r.ops, x, y[row], w, row_h, category(r.category).colour, html_escape(what),
           duration(r.end - r.start));
    } else {
      const bool exposed = r.kind == MarkKind::kExposedComm;
      emit(out,
           "<rect class=\"{}\" x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{}\" fill=\"url(#{})\">"
           "<title>{}: {}</title></rect>\n",
           exposed ? "exposed" : "idle", x, y[row], w, mark_h, exposed ? "exposed-hatch" : "idle-hatch",
           exposed ? "exposed communication" : "idle (pipeline bubble or waiting)",
           duration(r.end - r.start));
    }
  }
  emit(out, "</svg>\n");
}

void timeline_section(Out& out, const Prediction& p, const HtmlOptions& options) {
  const TimelineLayout t = timeline_layout(p, options);
  emit(out, "<section id=\"timeline\">\n<h2>Step timeline</h2>\n");
  emit(out,
       "<p class=\"note\">One row per stream of one representative GPU per pipeline stage; below each stage, "
       "the time its GPU runs no compute kernel: exposed communication (red) or idle (grey, the pipeline "
       "bubble and waits). ★ marks the stage of the breakdown. Hover a rectangle for its op.</p>\n");
  timeline_chart(out, p, t);
  std::set<std::string> used;
  for (const auto& r : t.rects) {
    if (r.kind == MarkKind::kOp) used.insert(r.category);
  }
  emit(out, "<div class=\"legend\">");
  for (const auto& c : kCategories) {
    if (used.contains(c.name)) {
      emit(out, "<span><span class=\"sw\" style=\"background:{}\"></span>{}</span>", c.colour, c.label);
    }
  }
  emit(out,
       "<span><span class=\"sw exposed\"></span>exposed communication</span>"
       "<span><span class=\"sw idle\"></span>idle</span></div>\n");
  int64_t rects = 0;
  for (const auto& r : t.rects) rects += r.kind == MarkKind::kOp ? 1 : 0;
  std::string drawn;
  if (static_cast<int32_t>(t.stages.size()) < t.num_stages) {
    for (int32_t s : t.stages) drawn += (drawn.empty() ? "" : ", ") + std::to_string(s);
    emit(out,
         "<p class=\"note\">Showing {} of {} pipeline stages: {} (first, last, the breakdown's and evenly "
         "spaced ones).</p>\n",
         t.stages.size(), t.num_stages, drawn);
  }
  if (t.merge_resolution_s > 0) {
    emit(out,
         "<p class=\"note\" id=\"merged\">To keep the page light, the {0} ops drawn are merged into {1} "
         "rectangles at a resolution of {2}: neighbouring ops closer than that merge when they share a "
         "colour or "
         "one is shorter than {2}, and a merged rectangle takes the colour of most of its time; exposed and "
         "idle marks closer than {2} merge too. Exact per-op times: <code>moeplan simulate "
         "--trace</code>.</p>\n",
         grouped(static_cast<double>(t.ops_drawn)), grouped(static_cast<double>(rects)),
         duration(t.merge_resolution_s));
  } else {
    emit(out, "<p class=\"note\">{} ops, one rectangle each.</p>\n",
         grouped(static_cast<double>(t.ops_drawn)));
  }
  emit(out, "</section>\n");
}

void header(Out& out, const std::string& title, const std::string& sub) {
  emit(out, "<header><h1>{}</h1><p>{}</p></header>\n", html_escape(title), html_escape(sub));
}

// The sections of one simulated plan, from its --json report `r`.
void plan_sections(Out& out, const Prediction& p, const ReportContext& ctx, const json& r,
                   const HtmlOptions& options) {
  emit(out, "<section id=\"summary\">\n<h2>Summary</h2>\n");
  summary(out, r);
  emit(out, "</section>\n<section id=\"plan\">\n<h2>Plan</h2>\n");
  plan_settings(out, ctx.plan);
  emit(out, "</section>\n<section id=\"breakdown\">\n<h2>Where the step time goes</h2>\n");
  emit(out,
       "<p class=\"note\">Stage {} (the busiest): at each moment, time counts as compute when a compute "
       "kernel "
       "runs, as exposed communication when only transfers run, else as idle. The parts sum to the step "
       "time.</p>\n",
       r.at("breakdown").at("stage").get<int64_t>());
  breakdown_chart(out, {{"", r.at("breakdown")}});
  breakdown_table(out, r.at("breakdown"));
  emit(out, "</section>\n<section id=\"memory\">\n<h2>Memory per GPU</h2>\n");
  memory_chart(out, {{"", r.at("memory")}});
  emit(out,
       "<p class=\"note\">Stage {}, the largest; {} micro-batch chunks of activations in flight. Reserve: "
       "{}.</p>\n",
       r.at("memory").at("stage").get<int64_t>(), r.at("memory").at("in_flight_micro_batches").get<int64_t>(),
       html_escape(r.at("memory").at("reserve_rule").get<std::string>()));
  emit(out, "</section>\n");
  timeline_section(out, p, options);
  emit(out, "<p class=\"note\">MFU = {}.</p>\n", html_escape(r.at("mfu_formula").get<std::string>()));
}

json report_json(const Prediction& p, const ReportContext& ctx) {
  json r = prediction_json(p, ctx);
  r.erase("ops");  // per-op summary: not shown, and large for big graphs
  return r;
}

// A horizontal bar per plan of one value (tokens/s per GPU, MFU).
void value_bars(Out& out, const std::string& title, const std::vector<double>& values,
                const std::function<std::string(double)>& label) {
  const double label_w = 36, right = 80, bar_h = 18, row_h = 24, top = 22;
  double most = 0;
  for (double v : values) most = std::max(most, v);
  if (most <= 0) most = 1;
  const double width = kChartWidth / 2;
  const double plot_w = width - label_w - right;
  emit(out, "<svg class=\"chart bars\" viewBox=\"0 0 {} {:.0f}\" role=\"img\" aria-label=\"{}\">\n", width,
       top + row_h * static_cast<double>(values.size()), html_escape(title));
  emit(out, "<text x=\"0\" y=\"13\" style=\"font-weight:600\">{}</text>\n", html_escape(title));
  for (size_t i = 0; i < values.size(); ++i) {
    const double y = top + row_h * static_cast<double>(i);
    const double w = plot_w * values[i] / most;
    emit(out,
         "<text x=\"0\" y=\"{0:.1f}\">#{1}</text><rect x=\"{2}\" y=\"{3:.1f}\" width=\"{4:.2f}\" "
         "height=\"{5}\" "
         "fill=\"{6}\" rx=\"2\"/><text x=\"{7:.1f}\" y=\"{0:.1f}\">{8}</text>\n",
         y + bar_h - 4, i + 1, label_w, y, w, bar_h, i == 0 ? "#0969da" : "#8fb8e8", label_w + w + 6,
         label(values[i]));
  }
  emit(out, "</svg>\n");
}

}  // namespace

std::string html_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

TimelineLayout timeline_layout(const Prediction& p, const HtmlOptions& options) {
  Layout base;
  base.t.num_stages = p.graph.num_stages;
  base.t.stages =
      drawn_stages(p.graph.num_stages, static_cast<int32_t>(p.critical_stage), options.max_timeline_stages);
  std::vector<int32_t> index_of(static_cast<size_t>(p.graph.num_stages), -1);
  for (size_t i = 0; i < base.t.stages.size(); ++i)
    index_of[static_cast<size_t>(base.t.stages[i])] = static_cast<int32_t>(i);
  base.by_row.assign(base.t.stages.size(), std::vector<std::vector<int32_t>>(kNumStreams));
  for (const Op& op : p.graph.ops) {
    const int32_t si = index_of[static_cast<size_t>(op.stage)];
    const auto& t = p.timeline.ops[static_cast<size_t>(op.id)];
    if (si < 0 || t.end <= t.start) continue;
    base.by_row[static_cast<size_t>(si)][static_cast<size_t>(op.stream)].push_back(op.id);
    base.t.ops_drawn += 1;
  }
  for (auto& stage : base.by_row) {
    std::vector<int32_t> all;
    for (auto& ids : stage) {
      std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
        return p.timeline.ops[static_cast<size_t>(a)].start < p.timeline.ops[static_cast<size_t>(b)].start;
      });
      all.insert(all.end(), ids.begin(), ids.end());
    }
    base.edges.push_back(stage_edges(p, all));
  }
  // One rectangle per op when that fits the budget; else start at half a pixel of the chart and double.
  double resolution = 0;
  const double pixel = std::max(p.timeline.step_time, 1e-12) / kChartWidth;
  for (;;) {
    TimelineLayout t = layout_at(p, base, resolution);
    if (static_cast<int64_t>(t.rects.size()) <= options.max_timeline_rects ||
        resolution >= p.timeline.step_time) {
      return t;
    }
    resolution = resolution == 0 ? pixel / 2 : resolution * 2;
  }
}

std::string simulate_html(const Prediction& p, const ReportContext& ctx, const HtmlOptions& options) {
  Out out;
  const std::string title = fmt::format("{} on {} × {}", ctx.model.name, ctx.plan.gpus, ctx.hardware.name);
  page_begin(out, "moeplan · " + title);
  header(out, title,
         fmt::format("{} stack · {} · predicted by moeplan simulate", ctx.stack.name,
                     planner::describe(ctx.plan)));
  if (!p.violations.empty()) {
    emit(out,
         "<section id=\"violations\">\n<h2><span class=\"badge bad\">cannot run</span> {} rule(s) "
         "broken</h2>\n<ul>\n",
         p.violations.size());
    for (const auto& v : p.violations) {
      emit(out, "<li><code>{}</code>: {}</li>\n", html_escape(v.rule), html_escape(v.reason));
    }
    emit(out, "</ul>\n</section>\n<section id=\"plan\">\n<h2>Plan</h2>\n");
    plan_settings(out, ctx.plan);
    emit(out, "</section>\n");
  } else {
    plan_sections(out, p, ctx, report_json(p, ctx), options);
  }
  page_end(out, "moeplan simulate --html");
  return fmt::to_string(out);
}

std::string plan_html(const PlanSearchPage& page, const HtmlOptions& options) {
  const auto& r = page.result;
  Out out;
  const std::string title =
      fmt::format("Plans for {} on {} × {}", page.model.name, page.job.gpus, page.hardware.name);
  page_begin(out, "moeplan · " + title);
  header(out, title,
         fmt::format(
             "{} stack · sequence {} · global batch {} · {} plans enumerated, {} legal, {} fit, {} screened, "
             "{} simulated in {:.2f} s",
             page.stack.name, page.job.seq_len, page.job.global_batch, r.enumerated, r.legal, r.fitting,
             r.screened, r.simulated, r.elapsed_s));
  if (r.plans.empty()) {
    emit(out, "<section><h2><span class=\"badge bad\">no plan fits</span></h2></section>\n");
  } else {
    std::vector<json> reports;
    for (const auto& rp : r.plans) {
      reports.push_back(report_json(rp.prediction, {rp.plan, page.model, page.hardware, page.stack}));
    }
    emit(out, "<section id=\"top-plans\">\n<h2>Top {} plans by tokens/s</h2>\n<table>\n", r.plans.size());
    emit(out,
         "<tr><th class=\"n\">#</th><th>layout</th><th class=\"n\">tokens/s</th><th class=\"n\">per GPU</th>"
         "<th class=\"n\">per GPU range</th><th class=\"n\">MFU</th><th class=\"n\">MFU (BF16 peak)</th>"
         "<th class=\"n\">step</th><th class=\"n\">memory / GPU</th>"
         "<th class=\"n\">exposed comm</th><th class=\"n\">idle</th><th></th></tr>\n");
    for (size_t i = 0; i < reports.size(); ++i) {
      const json& j = reports[i];
      const json& b = j.at("breakdown");
      double comm = 0;
      for (const auto& [k, v] : b.at("exposed_comm").items()) comm += v.get<double>();
      const bool fits = j.at("memory").at("fits").get<bool>();
      const json& range = j.at("tokens_per_s_range");
      const double gpus = static_cast<double>(j.at("gpus").get<int64_t>());
      const bool tied = i > 0 && planner::tied_with_best(r.plans[0].prediction, r.plans[i].prediction);
      emit(out,
           "<tr data-rank=\"{}\" data-tokens-per-s=\"{}\"><td class=\"n\">{}</td><td><code>{}</code></td>"
           "<td class=\"n\">{}</td><td class=\"n\">{:.1f}</td><td class=\"n\">{:.0f} – {:.0f}</td>"
           "<td class=\"n\">{} ({})</td><td class=\"n\">{}</td><td class=\"n\">{}</td>"
           "<td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td></tr>\n",
           i + 1, html_escape(j.at("tokens_per_s").dump()), i + 1,
           html_escape(planner::describe(r.plans[i].plan)), grouped(j.at("tokens_per_s").get<double>()),
           j.at("tokens_per_s_per_gpu").get<double>(), range.at(0).get<double>() / gpus,
           range.at(1).get<double>() / gpus, percent(j.at("mfu").get<double>()),
           html_escape(j.at("mfu_peak_dtype").get<std::string>()),
           percent(j.at("mfu_bf16_equivalent").get<double>()), duration(j.at("step_time_s").get<double>()),
           gb(j.at("memory").at("per_gpu_bytes").get<double>()), duration(comm),
           duration(b.at("bubble").get<double>()),
           std::string(tied ? "<span class=\"badge warn\">tied with #1</span>" : "") +
               (fits ? "" : "<span class=\"badge bad\">does not fit</span>") +
               (j.at("provenance").at("hypothetical").get<bool>()
                    ? "<span class=\"badge bad\">hypothetical</span>"
                    : ""));
    }
    emit(out,
         "</table>\n<p class=\"note\">Per GPU range: tokens/s per GPU at the ends of the cost model's fit "
         "errors; <em>tied with #1</em>: the range overlaps the best plan's, so the model cannot order the "
         "two. "
         "MFU against the dense peak of the plan's precision (in brackets), then against the BF16 peak. "
         "Exposed comm: communication not hidden behind compute.</p>\n<p class=\"note\">{}</p>\n",
         html_escape(planner::layout_legend()));
    std::vector<double> per_gpu, mfu;
    for (const auto& j : reports) {
      per_gpu.push_back(j.at("tokens_per_s_per_gpu").get<double>());
      mfu.push_back(j.at("mfu").get<double>());
    }
    emit(out, "<div class=\"grid2\">\n");
    value_bars(out, "Tokens/s per GPU", per_gpu, [](double v) { return fmt::format("{:.1f}", v); });
    value_bars(out, "MFU", mfu, [](double v) { return percent(v); });
    emit(out, "</div>\n</section>\n");

    std::vector<std::pair<std::string, json>> breakdowns, memories;
    for (size_t i = 0; i < reports.size(); ++i) {
      breakdowns.emplace_back(fmt::format("#{}", i + 1), reports[i].at("breakdown"));
      memories.emplace_back(fmt::format("#{}", i + 1), reports[i].at("memory"));
    }
    emit(out, "<section id=\"compare\">\n<h2>Step time and memory of the top plans</h2>\n");
    breakdown_chart(out, breakdowns);
    emit(out, "<div class=\"legend\">");
    std::set<std::string> seen;
    for (const auto& j : reports) {
      for (const auto& s : breakdown_segments(j.at("breakdown"))) {
        if (!seen.insert(s.category).second) continue;
        emit(out, "<span>{}{}</span>", swatch(s), html_escape(s.label));
      }
    }
    emit(out, "</div>\n<h3>Memory per GPU</h3>\n");
    memory_chart(out, memories);
    emit(out, "</section>\n");

    if (!r.rejected.empty()) {
      emit(out,
           "<section id=\"rejected\">\n<h2>Rejected plans</h2>\n<table>\n"
           "<tr><th class=\"n\">plans</th><th>reason</th></tr>\n");
      for (const auto& [why, n] : r.rejected) {
        emit(out, "<tr><td class=\"n\">{}</td><td>{}</td></tr>\n", grouped(static_cast<double>(n)),
             html_escape(why));
      }
      emit(out, "</table>\n</section>\n");
    }
    if (page.best != nullptr) {
      emit(out,
           "<header style=\"margin-top:28px\"><h1>Plan #1 in detail</h1><p><code>{}</code></p></header>\n",
           html_escape(planner::describe(r.plans[0].plan)));
      const ReportContext ctx{r.plans[0].plan, page.model, page.hardware, page.stack};
      plan_sections(out, *page.best, ctx, report_json(*page.best, ctx), options);
    }
  }
  page_end(out, "moeplan plan --html");
  return fmt::to_string(out);
}

}  // namespace moeplan::report
