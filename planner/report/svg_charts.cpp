// The HTML report's charts as inline SVG (see svg_charts.h): stacked step-breakdown and memory bars, the step
// timeline with its op merging, and value bars.
#include "planner/report/svg_charts.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <set>

#include "planner/report/html_report.h"

namespace moeplan::report {
namespace html {

using nlohmann::json;

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

}  // namespace html

namespace {

using namespace html;

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

}  // namespace

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

namespace html {

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

}  // namespace html
}  // namespace moeplan::report
