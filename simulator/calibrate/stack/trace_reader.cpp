// Chrome-trace reading for stack calibration: dialect detection, strict checks of the fields every event
// needs (ph, name, ts, dur), and Kineto's id chain kernel -> runtime launch -> CPU op for shapes.
#include "simulator/calibrate/stack/trace_reader.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <unordered_map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace moeplan::calibrate {
namespace {

using nlohmann::json;

constexpr double kUsToS = 1e-6;  // Chrome trace times are µs

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

const json* arg(const json& ev, const char* key) {
  const auto a = ev.find("args");
  if (a == ev.end() || !a->is_object()) return nullptr;
  const auto v = a->find(key);
  return v == a->end() || v->is_null() ? nullptr : &*v;
}

int64_t int_arg(const json& ev, const char* key, int64_t fallback) {
  const json* v = arg(ev, key);
  if (v && v->is_number()) return static_cast<int64_t>(v->get<double>());
  return fallback;
}

double num_arg(const json& ev, const char* key, double fallback) {
  const json* v = arg(ev, key);
  return v && v->is_number() ? v->get<double>() : fallback;
}

std::string str_arg(const json& ev, const char* key) {
  const json* v = arg(ev, key);
  return v && v->is_string() ? v->get<std::string>() : std::string();
}

// pid / tid are integers in Kineto and moerun, strings in some converters ("stream 7"): trailing digits, else
// the order of first appearance of that string.
class IdMap {
 public:
  int64_t operator()(const json* v) {
    if (!v) return 0;
    if (v->is_number()) return static_cast<int64_t>(v->get<double>());
    if (!v->is_string()) return 0;
    const std::string s = v->get<std::string>();
    size_t i = s.size();
    while (i > 0 && std::isdigit(static_cast<unsigned char>(s[i - 1]))) --i;
    if (i < s.size() && s.size() - i < 15) return std::stoll(s.substr(i));
    auto [it, inserted] = seen_.emplace(s, static_cast<int64_t>(1'000'000 + seen_.size()));
    return it->second;
  }

 private:
  std::map<std::string, int64_t> seen_;
};

const json* field(const json& ev, const char* key) {
  const auto v = ev.find(key);
  return v == ev.end() || v->is_null() ? nullptr : &*v;
}

}  // namespace

const char* name_of(TraceDialect d) {
  switch (d) {
    case TraceDialect::kKineto:
      return "kineto";
    case TraceDialect::kNsys:
      return "nsys";
    case TraceDialect::kMoerun:
      return "moerun";
  }
  return "?";
}

Result<TraceFile> parse_trace(std::string_view text, const std::string& label) {
  if (text.find_first_not_of(" \t\r\n") == std::string_view::npos)
    return Error{fmt::format("{}: not a Chrome trace: the file is empty", label)};
  json j;
  try {
    j = json::parse(text.begin(), text.end());
  } catch (const json::parse_error& e) {
    // A parse that runs out of input means the file stopped mid-value (a profiler killed while writing).
    if (e.byte > text.size() ||
        std::string_view(e.what()).find("unexpected end of input") != std::string_view::npos)
      return Error{fmt::format("{}: truncated at byte {}", label, text.size())};
    return Error{fmt::format("{}: not a Chrome trace: malformed JSON at byte {}", label, e.byte)};
  }
  return parse_trace_json(j, label);
}

Result<TraceFile> parse_trace_json(const json& j, const std::string& label) {
  const json* events = nullptr;
  if (j.is_object()) {
    events = field(j, "traceEvents");
    if (!events || !events->is_array()) {
      std::string keys;
      for (auto it = j.begin(); it != j.end() && keys.size() < 80; ++it)
        keys += (keys.empty() ? "" : ", ") + it.key();
      return Error{
          fmt::format("{}: not a Chrome trace: no 'traceEvents' array (top-level keys: {})", label, keys)};
    }
  } else if (j.is_array()) {
    events = &j;  // the JSON Array Format of the Trace Event spec
  } else {
    return Error{fmt::format("{}: not a Chrome trace: top level is neither an object nor an array", label)};
  }

  // Pass 1: required fields and the dialect.
  bool moerun = false,
       kineto = j.is_object() && (j.contains("schemaVersion") || j.contains("deviceProperties"));
  for (size_t i = 0; i < events->size(); ++i) {
    const json& ev = (*events)[i];
    if (!ev.is_object()) return Error{fmt::format("{}: event {}: expected an object", label, i)};
    const json* ph = field(ev, "ph");
    if (!ph || !ph->is_string()) return Error{fmt::format("{}: event {}: 'ph' missing", label, i)};
    if (ph->get<std::string>() != "X") continue;
    for (const char* key : {"name", "ts", "dur"}) {
      const json* v = field(ev, key);
      if (!v) return Error{fmt::format("{}: event {}: '{}' missing", label, i, key)};
      const bool ok = std::string_view(key) == "name" ? v->is_string() : v->is_number();
      if (!ok)
        return Error{fmt::format("{}: event {}: '{}' is not a {}", label, i, key,
                                 key[0] == 'n' ? "string" : "number")};
    }
    if (ev.at("dur").get<double>() < 0)
      return Error{fmt::format("{}: event {}: 'dur' is negative", label, i)};
    if (arg(ev, "flops") && arg(ev, "hbm_bytes") && arg(ev, "phase")) moerun = true;
    const std::string cat = lower(ev.value("cat", ""));
    if (cat == "cpu_op" || cat == "cuda_runtime" || cat == "cuda_driver" || cat == "user_annotation" ||
        cat == "python_function")
      kineto = true;
  }

  TraceFile out;
  out.label = label;
  out.dialect = moerun ? TraceDialect::kMoerun : kineto ? TraceDialect::kKineto : TraceDialect::kNsys;

  // Pass 2: Kineto's id chain. correlation -> (External id, launch time); External id -> cpu_op event.
  std::unordered_map<int64_t, std::pair<int64_t, double>> launch_of;
  std::unordered_map<int64_t, size_t> cpu_op_of;
  IdMap pids, tids;
  std::map<std::string, int64_t> categories;
  for (size_t i = 0; i < events->size(); ++i) {
    const json& ev = (*events)[i];
    if (ev.at("ph").get<std::string>() != "X") continue;
    const std::string cat = lower(ev.value("cat", ""));
    ++categories[cat.empty() ? "(none)" : cat];
    const std::string name = ev.at("name").get<std::string>();
    const double ts = ev.at("ts").get<double>() * kUsToS, dur = ev.at("dur").get<double>() * kUsToS;
    if (cat == "cuda_runtime" || cat == "cuda_driver") {
      const int64_t corr = int_arg(ev, "correlation", -1);
      if (corr >= 0) launch_of[corr] = {int_arg(ev, "External id", -1), ts};
    } else if (cat == "cpu_op") {
      const int64_t ext = int_arg(ev, "External id", -1);
      if (ext >= 0) cpu_op_of[ext] = i;
    }
    if (cat == "user_annotation" || name.rfind("ProfilerStep#", 0) == 0) {
      out.ranges.push_back(
          {name, ts, ts + dur, pids(field(ev, "pid")), tids(field(ev, "tid")), ev.value("cat", "")});
    }
  }

  for (size_t i = 0; i < events->size(); ++i) {
    const json& ev = (*events)[i];
    if (ev.at("ph").get<std::string>() != "X") continue;
    const std::string cat = ev.value("cat", "");
    const std::string lcat = lower(cat);
    const bool is_kernel = moerun || lcat == "kernel" || lcat == "cuda_kernel" || lcat == "gpu_kernel";
    if (!is_kernel) continue;
    KernelEvent k;
    k.name = ev.at("name").get<std::string>();
    k.cat = cat;
    k.start_s = ev.at("ts").get<double>() * kUsToS;
    k.dur_s = ev.at("dur").get<double>() * kUsToS;
    k.event_index = static_cast<int64_t>(i);
    const int64_t pid = pids(field(ev, "pid")), tid = tids(field(ev, "tid"));
    k.device = moerun ? pid : int_arg(ev, "device", pid);
    k.stream = moerun ? tid : int_arg(ev, "stream", tid);
    if (const json* g = arg(ev, "grid"); g && g->is_array()) {
      k.grid_blocks = 1;
      for (const auto& x : *g) k.grid_blocks *= x.is_number() ? static_cast<int64_t>(x.get<double>()) : 1;
    }
    if (moerun) {
      k.flops = num_arg(ev, "flops", -1);
      k.hbm_bytes = num_arg(ev, "hbm_bytes", -1);
      k.micro_batch = int_arg(ev, "micro_batch", -1);
      k.chunk = int_arg(ev, "chunk", -1);
      k.phase = str_arg(ev, "phase");
      k.collective = str_arg(ev, "collective");
      k.group = str_arg(ev, "group");
    } else if (const int64_t corr = int_arg(ev, "correlation", -1); corr >= 0) {
      if (auto l = launch_of.find(corr); l != launch_of.end()) {
        k.launch_s = l->second.second;
        if (auto c = cpu_op_of.find(l->second.first); c != cpu_op_of.end()) {
          const json& op = (*events)[c->second];
          k.cpu_op = op.at("name").get<std::string>();
          if (const json* dims = arg(op, "Input Dims"); dims && dims->is_array()) {
            for (const auto& d : *dims) {
              std::vector<int64_t> shape;
              if (d.is_array()) {
                for (const auto& x : d)
                  shape.push_back(x.is_number() ? static_cast<int64_t>(x.get<double>()) : 0);
              }
              k.input_dims.push_back(std::move(shape));
            }
          }
          if (const json* types = arg(op, "Input type"); types && types->is_array()) {
            for (const auto& t : *types) k.input_types.push_back(t.is_string() ? t.get<std::string>() : "");
          }
        }
      }
    }
    out.kernels.push_back(std::move(k));
  }
  if (out.kernels.empty()) {
    std::string cats;
    int64_t x_events = 0;
    for (const auto& [c, n] : categories) x_events += n;
    for (const auto& [c, n] : categories) cats += fmt::format("{}{} {}", cats.empty() ? "" : ", ", n, c);
    return Error{
        fmt::format("{}: no GPU kernel events ({} complete events: {}); record CUDA activity (torch.profiler "
                    "ProfilerActivity.CUDA, nsys -t cuda)",
                    label, x_events, cats.empty() ? "none" : cats)};
  }
  std::sort(out.kernels.begin(), out.kernels.end(), [](const KernelEvent& a, const KernelEvent& b) {
    return std::tie(a.device, a.stream, a.start_s, a.event_index) <
           std::tie(b.device, b.stream, b.start_s, b.event_index);
  });
  std::sort(out.ranges.begin(), out.ranges.end(), [](const TraceRange& a, const TraceRange& b) {
    return std::tie(a.start_s, a.end_s, a.name) < std::tie(b.start_s, b.end_s, b.name);
  });
  return out;
}

Result<TraceFile> read_trace(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return Error{fmt::format("{}: cannot open (missing or unreadable)", path)};
  std::ostringstream ss;
  ss << f.rdbuf();
  return parse_trace(ss.str(), path);
}

}  // namespace moeplan::calibrate
