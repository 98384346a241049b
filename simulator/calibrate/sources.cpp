// Reading calibration sources and writing the hardware profile they make (see sources.h).
#include "simulator/calibrate/sources.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "simulator/core/op_graph.h"
#include "simulator/core/stack.h"

#include "simulator/io/hardware_loader.h"
#include "simulator/io/json_reader.h"

namespace moeplan::calibrate {
namespace {

using ojson = nlohmann::ordered_json;

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::vector<std::string_view> split_lines(std::string_view text) {
  std::vector<std::string_view> lines;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    lines.push_back(line);
    start = end + 1;
  }
  return lines;
}

std::vector<std::string_view> split_ws(std::string_view s) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
    size_t j = i;
    while (j < s.size() && !std::isspace(static_cast<unsigned char>(s[j]))) ++j;
    if (j > i) out.push_back(s.substr(i, j - i));
    i = j;
  }
  return out;
}

// mpirun --tag-output writes "[1,0]<stdout>:" before each line.
std::string_view strip_mpi_prefix(std::string_view line) {
  if (line.size() > 2 && line[0] == '[') {
    const size_t close = line.find("]<std");
    if (close != std::string_view::npos) {
      const size_t colon = line.find(">:", close);
      if (colon != std::string_view::npos) return line.substr(colon + 2);
    }
  }
  return line;
}

std::optional<int64_t> to_int(std::string_view s) {
  int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

std::optional<double> to_double(std::string_view s) {
  if (s.empty()) return std::nullopt;
  const std::string str(s);
  char* end = nullptr;
  const double v = std::strtod(str.c_str(), &end);
  if (end != str.c_str() + str.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

// "# key: value" -> value when the line starts with "# key:".
std::optional<std::string_view> meta(std::string_view line, std::string_view key) {
  if (line.empty() || line[0] != '#') return std::nullopt;
  std::string_view rest = trim(line.substr(1));
  if (rest.substr(0, key.size()) != key) return std::nullopt;
  rest.remove_prefix(key.size());
  if (rest.empty() || rest[0] != ':') return std::nullopt;
  return trim(rest.substr(1));
}

struct NcclBinary {
  const char* binary;
  Collective collective;
};
constexpr NcclBinary kBinaries[] = {{"all_reduce_perf", Collective::kAllReduce},
                                    {"all_gather_perf", Collective::kAllGather},
                                    {"reduce_scatter_perf", Collective::kReduceScatter},
                                    {"alltoall_perf", Collective::kAllToAll},
                                    {"sendrecv_perf", Collective::kSendRecv}};

std::optional<Collective> collective_of_binary(std::string_view s) {
  for (const auto& b : kBinaries) {
    if (s.find(b.binary) != std::string_view::npos) return b.collective;
  }
  return std::nullopt;
}

std::string read_file(const std::string& path, bool* ok) {
  std::ifstream f(path, std::ios::binary);
  *ok = static_cast<bool>(f);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A CSV cell as a JSON number: an integer when it is one, else a double; nullopt when it is not a number.
std::optional<ojson> number_cell(std::string_view s) {
  if (auto i = to_int(s)) return ojson(*i);
  if (auto d = to_double(s)) return ojson(*d);
  return std::nullopt;
}

}  // namespace

Result<NcclTestsLog> parse_nccl_tests(std::string_view text, const std::string& label) {
  NcclTestsLog log;
  std::optional<Collective> collective;
  std::optional<int64_t> meta_ranks, meta_nodes;
  std::vector<std::string> sources;
  std::set<int64_t> rank_ids;
  std::set<std::string> hosts;
  std::vector<std::string_view> columns;
  int header_line = 0;
  bool summary = false;
  int time1 = -1, time2 = -1;
  const auto lines = split_lines(text);
  for (size_t li = 0; li < lines.size(); ++li) {
    const int n = static_cast<int>(li) + 1;
    const std::string_view line = trim(strip_mpi_prefix(lines[li]));
    if (line.empty()) continue;
    if (line[0] == '#') {
      if (auto v = meta(line, "Collective test starting")) {
        collective = collective_of_binary(*v);
        if (!collective) {
          return Error{
              fmt::format("{}: line {}: '{}' is not one of the nccl-tests binaries moeplan models "
                          "(all_reduce_perf, all_gather_perf, reduce_scatter_perf, alltoall_perf, "
                          "sendrecv_perf)",
                          label, n, *v)};
        }
      } else if (auto m0 = meta(line, "moeplan-source")) {
        sources.emplace_back(*m0);
      } else if (auto m1 = meta(line, "moeplan-algorithm")) {
        log.algorithm = std::string(*m1);
      } else if (auto m2 = meta(line, "moeplan-collective")) {
        collective = collective_of_binary(std::string(*m2) + "_perf");
        if (!collective) collective = collective_of_binary(*m2);
        if (!collective) return Error{fmt::format("{}: line {}: unknown collective '{}'", label, n, *m2)};
      } else if (auto m3 = meta(line, "moeplan-ranks")) {
        meta_ranks = to_int(*m3);
        if (!meta_ranks || *meta_ranks < 1)
          return Error{fmt::format("{}: line {}: moeplan-ranks: expected a positive integer", label, n)};
      } else if (auto m4 = meta(line, "moeplan-nodes")) {
        meta_nodes = to_int(*m4);
        if (!meta_nodes || *meta_nodes < 1)
          return Error{fmt::format("{}: line {}: moeplan-nodes: expected a positive integer", label, n)};
      } else if (line.rfind("# Avg bus bandwidth", 0) == 0) {
        summary = true;
      } else {
        const auto tok = split_ws(line.substr(1));
        if (tok.size() >= 9 && tok[0] == "Rank" && tok[2] == "Group" && tok[6] == "on") {
          const auto r = to_int(tok[1]);
          if (!r) return Error{fmt::format("{}: line {}: rank line without a rank number", label, n)};
          rank_ids.insert(*r);
          hosts.emplace(tok[7]);
        } else if (tok.size() >= 8 && tok[0] == "size" && tok[1] == "count" && tok[2] == "type") {
          columns = tok;
          header_line = n;
          for (size_t c = 0; c < columns.size(); ++c) {
            if (columns[c] == "time") (time1 < 0 ? time1 : time2) = static_cast<int>(c);
          }
          if (time1 < 0 || static_cast<size_t>(time1) + 2 >= columns.size() ||
              columns[static_cast<size_t>(time1) + 1] != "algbw" ||
              columns[static_cast<size_t>(time1) + 2] != "busbw") {
            return Error{
                fmt::format("{}: line {}: table header without 'time algbw busbw' columns", label, n)};
          }
        }
      }
      continue;
    }
    if (!header_line) continue;  // NCCL INFO lines and anything else before the table
    const auto tok = split_ws(line);
    if (!to_int(tok[0])) continue;  // "host:pid:tid [0] NCCL INFO ...", warnings
    if (tok.size() != columns.size()) {
      return Error{
          fmt::format("{}: line {}: {} fields where the header on line {} has {} (truncated or "
                      "foreign line)",
                      label, n, tok.size(), header_line, columns.size())};
    }
    NcclTestsLog::Row row;
    row.bytes = *to_int(tok[0]);
    auto group = [&](int t, NcclTestsLog::Row* out) {
      if (t < 0) return false;
      const auto time = to_double(tok[static_cast<size_t>(t)]);
      const auto alg = to_double(tok[static_cast<size_t>(t) + 1]);
      const auto bus = to_double(tok[static_cast<size_t>(t) + 2]);
      if (!time || !alg || !bus) return false;
      out->time_us = *time, out->algbw_GBps = *alg, out->busbw_GBps = *bus;
      return true;
    };
    if (!group(time1, &row)) {
      row.in_place = true;
      if (!group(time2, &row)) {
        return Error{fmt::format(
            "{}: line {}: neither the out-of-place nor the in-place columns hold numbers", label, n)};
      }
    }
    if (row.bytes == 0) continue;
    if (row.bytes < 0 || row.time_us <= 0 || row.busbw_GBps < 0) {
      return Error{fmt::format("{}: line {}: expected a positive size and time", label, n)};
    }
    if (!log.rows.empty() && row.bytes <= log.rows.back().bytes) {
      return Error{fmt::format("{}: line {}: sizes must increase ({} after {})", label, n, row.bytes,
                               log.rows.back().bytes)};
    }
    log.rows.push_back(row);
  }
  if (!header_line) {
    return Error{fmt::format("{}: not nccl-tests output: no '#  size  count  type ...' table header", label)};
  }
  if (log.rows.empty()) {
    return Error{
        fmt::format("{}: truncated: the table header on line {} has no result rows", label, header_line)};
  }
  if (!summary) {
    return Error{fmt::format("{}: truncated: no '# Avg bus bandwidth' line after the last row ({} B)", label,
                             log.rows.back().bytes)};
  }
  if (!collective) collective = collective_of_binary(label);
  if (!collective) {
    return Error{
        fmt::format("{}: cannot tell the collective: no '# Collective test starting:' line; name the "
                    "file after the nccl-tests binary (e.g. all_reduce_perf.txt)",
                    label)};
  }
  log.collective = *collective;
  if (!rank_ids.empty()) {
    log.ranks = static_cast<int64_t>(rank_ids.size());
    log.nodes = static_cast<int64_t>(hosts.size());
    if (meta_ranks && *meta_ranks != log.ranks) {
      return Error{fmt::format("{}: moeplan-ranks says {} but the output lists {} ranks", label, *meta_ranks,
                               log.ranks)};
    }
    if (meta_nodes) log.nodes = *meta_nodes;  // hosts can hide behind one name (containers)
  } else {
    if (!meta_ranks) {
      return Error{
          fmt::format("{}: cannot tell the number of ranks: no '#  Rank' lines and no "
                      "'# moeplan-ranks:' line",
                      label)};
    }
    log.ranks = *meta_ranks;
    log.nodes = meta_nodes.value_or(1);
  }
  if (log.nodes > log.ranks) return Error{fmt::format("{}: more nodes than ranks", label)};
  if (sources.empty()) {
    log.source = fmt::format("nccl-tests output {}", label);
  } else {
    for (size_t i = 0; i < sources.size(); ++i) log.source += (i ? " " : "") + sources[i];
  }
  return log;
}

Result<CsvTable> parse_csv(std::string_view text, const std::string& label) {
  CsvTable t;
  std::vector<std::string> sources;
  const auto lines = split_lines(text);
  for (size_t li = 0; li < lines.size(); ++li) {
    const int n = static_cast<int>(li) + 1;
    const std::string_view line = trim(lines[li]);
    if (line.empty()) continue;
    if (line[0] == '#') {
      if (auto v = meta(line, "source")) sources.emplace_back(*v);
      continue;
    }
    std::vector<std::string> cells;
    std::string cell;
    bool quoted = false, was_quoted = false;
    for (size_t i = 0; i < line.size(); ++i) {
      const char ch = line[i];
      if (quoted) {
        if (ch == '"' && i + 1 < line.size() && line[i + 1] == '"') {
          cell += '"', ++i;
        } else if (ch == '"') {
          quoted = false;
        } else {
          cell += ch;
        }
      } else if (ch == '"' && trim(cell).empty()) {
        quoted = was_quoted = true, cell.clear();
      } else if (ch == ',') {
        cells.push_back(was_quoted ? cell : std::string(trim(cell)));
        cell.clear(), was_quoted = false;
      } else {
        cell += ch;
      }
    }
    if (quoted) return Error{fmt::format("{}: line {}: unterminated quoted cell", label, n)};
    cells.push_back(was_quoted ? cell : std::string(trim(cell)));
    if (t.header.empty()) {
      t.header = cells;
      continue;
    }
    if (cells.size() != t.header.size()) {
      return Error{fmt::format("{}: line {}: {} cells where the header has {}", label, n, cells.size(),
                               t.header.size())};
    }
    t.rows.push_back(std::move(cells));
    t.lines.push_back(n);
  }
  if (t.header.empty()) return Error{fmt::format("{}: empty table: no header line", label)};
  if (t.rows.empty()) return Error{fmt::format("{}: the table has a header but no rows", label)};
  for (size_t i = 0; i < sources.size(); ++i) t.source += (i ? " " : "") + sources[i];
  return t;
}

namespace {

// Which table a CSV holds, by its columns (any order).
struct TableKind {
  const char* name;
  std::vector<std::string> columns;
};
const std::vector<TableKind>& table_kinds() {
  static const std::vector<TableKind> kinds = {
      {"gemm", {"m", "n", "k", "dtype", "tflops"}},
      {"grouped_gemm", {"groups", "m_per_group", "n", "k", "dtype", "kernel", "tflops"}},
      {"grouped_gemm", {"groups", "m_per_group", "n", "k", "dtype", "kernel", "part", "tflops"}},
      {"attention", {"seq_len", "head_dim", "causal", "direction", "dtype", "impl", "tflops"}},
      {"hbm", {"kernel", "bw_GBps"}},
      {"hbm", {"kernel", "bw_GBps", "source"}},
      {"alltoall_skew", {"ranks", "nodes", "bytes", "hot_factor", "time_us"}}};
  return kinds;
}

struct Tables {
  ojson collectives = ojson::array(), gemm = ojson::array(), grouped_gemm = ojson::array(),
        attention = ojson::array(), hbm = ojson::array(), alltoall_skew = ojson::array();
};

// An all-to-all-v table with a hot receiver: one entry per (ranks, nodes), points [bytes, hot_factor,
// time_us] in the file's order.
Result<bool> add_alltoall_skew(const CsvTable& t, const std::string& label, Tables* out) {
  std::map<std::string, size_t> col;
  for (size_t i = 0; i < t.header.size(); ++i) col[t.header[i]] = i;
  std::map<std::pair<int64_t, int64_t>, size_t> group_of;
  for (size_t r = 0; r < t.rows.size(); ++r) {
    auto cell = [&](const char* c) { return std::string_view(t.rows[r][col.at(c)]); };
    const auto ranks = to_int(cell("ranks")), nodes = to_int(cell("nodes")), bytes = to_int(cell("bytes"));
    const auto hot = to_double(cell("hot_factor")), time_us = to_double(cell("time_us"));
    if (!ranks || *ranks < 2) {
      return Error{fmt::format("{}: line {}: column 'ranks': expected an integer >= 2, got '{}'", label,
                               t.lines[r], cell("ranks"))};
    }
    if (!nodes || *nodes < 1 || *nodes > *ranks) {
      return Error{fmt::format("{}: line {}: column 'nodes': expected an integer from 1 to ranks, got '{}'",
                               label, t.lines[r], cell("nodes"))};
    }
    if (!bytes || *bytes <= 0) {
      return Error{fmt::format("{}: line {}: column 'bytes': expected a positive integer, got '{}'", label,
                               t.lines[r], cell("bytes"))};
    }
    if (!hot || !(*hot >= 1) || *hot > static_cast<double>(*ranks)) {
      return Error{
          fmt::format("{}: line {}: column 'hot_factor': expected a number from 1 to ranks, got '{}'", label,
                      t.lines[r], cell("hot_factor"))};
    }
    if (!time_us || !(*time_us > 0)) {
      return Error{fmt::format("{}: line {}: column 'time_us': expected a positive number, got '{}'", label,
                               t.lines[r], cell("time_us"))};
    }
    auto it = group_of.find({*ranks, *nodes});
    if (it == group_of.end()) {
      out->alltoall_skew.push_back(
          ojson{{"ranks", *ranks}, {"nodes", *nodes}, {"source", t.source}, {"points", ojson::array()}});
      it = group_of.emplace(std::pair{*ranks, *nodes}, out->alltoall_skew.size() - 1).first;
    }
    out->alltoall_skew[it->second]["points"].push_back(ojson::array({*bytes, *hot, *time_us}));
  }
  return true;
}

Result<bool> add_csv(const CsvTable& t, const std::string& label, Tables* out) {
  std::set<std::string> have(t.header.begin(), t.header.end());
  const TableKind* kind = nullptr;
  for (const auto& k : table_kinds()) {
    if (std::set<std::string>(k.columns.begin(), k.columns.end()) == have) kind = &k;
  }
  if (!kind && have == std::set<std::string>{"groups", "m_per_group", "n", "k", "dtype", "tflops"}) {
    return Error{fmt::format(
        "{}: a grouped GEMM table needs a 'kernel' column naming the kernel's implementation class ({})",
        label, grouped_gemm_kernel_names())};
  }
  if (!kind) {
    return Error{fmt::format(
        "{}: columns {} match no table kind (gemm: m,n,k,dtype,tflops; grouped_gemm: "
        "groups,m_per_group,n,k,dtype,kernel[,part],tflops; attention: seq_len,head_dim,causal,direction,"
        "dtype,impl,tflops; hbm: kernel,bw_GBps[,source]; alltoall_skew: ranks,nodes,bytes,hot_factor,"
        "time_us)",
        label, fmt::join(t.header, ","))};
  }
  std::map<std::string, size_t> col;
  for (size_t i = 0; i < t.header.size(); ++i) col[t.header[i]] = i;
  const std::string name = kind->name;
  if (name != "hbm" && t.source.empty()) {
    return Error{
        fmt::format("{}: no '# source: ...' line before the header (every table cites its source)", label)};
  }
  if (name == "alltoall_skew") return add_alltoall_skew(t, label, out);
  auto num = [&](size_t r, const char* c) -> Result<ojson> {
    const std::string& s = t.rows[r][col.at(c)];
    auto v = number_cell(s);
    if (!v || v->get<double>() <= 0) {
      return Error{fmt::format("{}: line {}: column '{}': expected a positive number, got '{}'", label,
                               t.lines[r], c, s)};
    }
    return *v;
  };
  // Rows with the same non-numeric keys form one table, in order of first appearance.
  std::vector<std::string> key_cols;
  if (name == "gemm") key_cols = {"dtype"};
  if (name == "grouped_gemm")
    key_cols = col.contains("part") ? std::vector<std::string>{"dtype", "kernel", "part"}
                                    : std::vector<std::string>{"dtype", "kernel"};
  if (name == "attention") key_cols = {"dtype", "direction", "head_dim", "causal", "impl"};
  std::map<std::string, size_t> group_of;
  ojson* target = name == "gemm"           ? &out->gemm
                  : name == "grouped_gemm" ? &out->grouped_gemm
                  : name == "attention"    ? &out->attention
                                           : &out->hbm;
  for (size_t r = 0; r < t.rows.size(); ++r) {
    if (name == "hbm") {
      auto bw = num(r, "bw_GBps");
      if (!bw) return bw.error();
      std::string src = col.contains("source") ? t.rows[r][col.at("source")] : t.source;
      if (src.empty()) {
        return Error{
            fmt::format("{}: line {}: no source for this row (a 'source' column or a '# source:' line)",
                        label, t.lines[r])};
      }
      target->push_back(
          ojson{{"kernel", t.rows[r][col.at("kernel")]}, {"bw_GBps", bw.value()}, {"source", src}});
      continue;
    }
    std::string key;
    for (const auto& k : key_cols) key += t.rows[r][col.at(k)] + "|";
    auto it = group_of.find(key);
    if (it == group_of.end()) {
      ojson e;
      e["dtype"] = t.rows[r][col.at("dtype")];
      if (name == "attention") {
        const std::string& dir = t.rows[r][col.at("direction")];
        const std::string& causal = t.rows[r][col.at("causal")];
        auto hd = to_int(t.rows[r][col.at("head_dim")]);
        if (!hd || *hd <= 0) {
          return Error{
              fmt::format("{}: line {}: column 'head_dim': expected a positive integer", label, t.lines[r])};
        }
        if (causal != "true" && causal != "false") {
          return Error{fmt::format("{}: line {}: column 'causal': expected true or false, got '{}'", label,
                                   t.lines[r], causal)};
        }
        e["direction"] = dir;
        e["head_dim"] = *hd;
        e["causal"] = causal == "true";
        e["impl"] = t.rows[r][col.at("impl")];
      }
      if (name == "grouped_gemm") {
        const std::string& kernel = t.rows[r][col.at("kernel")];
        if (!find_grouped_gemm_kernel(kernel)) {
          return Error{fmt::format("{}: line {}: column 'kernel': expected one of {}, got '{}'", label,
                                   t.lines[r], grouped_gemm_kernel_names(), kernel)};
        }
        const std::string part = col.contains("part") ? t.rows[r][col.at("part")] : "fwd";
        if (part != "fwd" && part != "dgrad" && part != "wgrad" && part != "fwd+bwd") {
          return Error{
              fmt::format("{}: line {}: column 'part': expected fwd, dgrad, wgrad or fwd+bwd, got '{}'",
                          label, t.lines[r], part)};
        }
        e["kernel"] = kernel;
        e["part"] = part;
      }
      e["source"] = t.source;
      e["points"] = ojson::array();
      target->push_back(std::move(e));
      it = group_of.emplace(key, target->size() - 1).first;
    }
    ojson point = ojson::array();
    std::vector<const char*> cols;
    if (name == "gemm") cols = {"m", "n", "k", "tflops"};
    if (name == "grouped_gemm") cols = {"groups", "m_per_group", "n", "k", "tflops"};
    if (name == "attention") cols = {"seq_len", "tflops"};
    for (const char* c : cols) {
      auto v = num(r, c);
      if (!v) return v.error();
      if (std::string(c) != "tflops" && !v.value().is_number_integer()) {
        return Error{fmt::format("{}: line {}: column '{}': expected an integer", label, t.lines[r], c)};
      }
      point.push_back(v.value());
    }
    (*target)[it->second]["points"].push_back(std::move(point));
  }
  return true;
}

}  // namespace

Result<ojson> build_profile(const std::string& dir) {
  const std::string spec_path = (std::filesystem::path(dir) / "profile.json").string();
  bool ok = false;
  const std::string spec_text = read_file(spec_path, &ok);
  if (!ok) return Error{fmt::format("{}: cannot read (is {} a calibration sources folder?)", spec_path, dir)};
  {
    auto checked = io::parse_json_text(spec_text, spec_path);  // the one-line parse error, with line/column
    if (!checked) return checked.error();
  }
  const ojson spec = ojson::parse(spec_text);
  static const std::set<std::string> kKeys = {"format", "name",      "description", "sources",     "gpu",
                                              "node",   "scale_out", "plateaus",    "measurements"};
  for (const auto& [k, v] : spec.items()) {
    if (!kKeys.contains(k)) return Error{fmt::format("{}: field '{}': unknown key", spec_path, k)};
  }
  if (!spec.contains("format") || spec["format"] != "moeplan-calibration-sources-v1") {
    return Error{fmt::format("{}: field 'format': expected \"moeplan-calibration-sources-v1\"", spec_path)};
  }
  for (const char* k : {"name", "description", "sources", "gpu", "node", "scale_out", "measurements"}) {
    if (!spec.contains(k)) return Error{fmt::format("{}: field '{}': missing", spec_path, k)};
  }
  if (!spec["measurements"].is_array()) {
    return Error{fmt::format("{}: field 'measurements': expected an array of file names", spec_path)};
  }
  Tables tables;
  for (const auto& m : spec["measurements"]) {
    if (!m.is_string()) {
      return Error{fmt::format("{}: field 'measurements': expected file names, got {}", spec_path, m.dump())};
    }
    const std::string rel = m.get<std::string>();
    const std::string path = (std::filesystem::path(dir) / rel).string();
    const std::string text = read_file(path, &ok);
    if (!ok) return Error{fmt::format("{}: cannot read (listed in {})", path, spec_path)};
    if (rel.ends_with(".csv")) {
      auto t = parse_csv(text, path);
      if (!t) return t.error();
      if (auto s = add_csv(t.value(), path, &tables); !s) return s.error();
      continue;
    }
    auto log = parse_nccl_tests(text, path);
    if (!log) return log.error();
    const NcclTestsLog& l = log.value();
    ojson c;
    c["collective"] = name_of(l.collective);
    c["algorithm"] = l.algorithm;
    c["scope"] = l.nodes > 1 ? "inter_node" : "intra_node";
    c["ranks"] = l.ranks;
    c["nodes"] = l.nodes;
    c["metric"] = "busbw_GBps";
    c["source"] = l.source;
    c["points"] = ojson::array();
    for (const auto& r : l.rows) {
      if (r.busbw_GBps <= 0) continue;  // below the printed precision: carries no bandwidth
      c["points"].push_back(ojson::array({r.bytes, r.busbw_GBps}));
    }
    tables.collectives.push_back(std::move(c));
  }
  ojson profile;
  profile["format"] = "moeplan-hwprofile-v1";
  for (const char* k : {"name", "description", "sources", "gpu", "node", "scale_out"}) profile[k] = spec[k];
  ojson cal;
  cal["collectives"] = tables.collectives;
  cal["gemm"] = tables.gemm;
  cal["grouped_gemm"] = tables.grouped_gemm;
  cal["attention"] = tables.attention;
  cal["hbm"] = tables.hbm;
  if (!tables.alltoall_skew.empty()) cal["alltoall_skew"] = tables.alltoall_skew;
  cal["plateaus"] = spec.contains("plateaus") ? spec["plateaus"] : ojson::array();
  profile["calibration"] = cal;
  // The result must be a valid profile: the hardware loader's checks, with the sources folder as the label.
  auto loaded = io::hardware_from_json(nlohmann::json::parse(profile.dump()), dir);
  if (!loaded) return loaded.error();
  return profile;
}

namespace {

bool scalar(const ojson& v) {
  return !v.is_object() && !v.is_array();
}

void compact(const ojson& v, std::string* out) {
  if (v.is_object()) {
    *out += '{';
    bool first = true;
    for (const auto& [k, c] : v.items()) {
      if (!first) *out += ", ";
      first = false;
      *out += ojson(k).dump(-1, ' ', false) + ": ";
      compact(c, out);
    }
    *out += '}';
  } else if (v.is_array()) {
    *out += '[';
    for (size_t i = 0; i < v.size(); ++i) {
      if (i) *out += ", ";
      compact(v[i], out);
    }
    *out += ']';
  } else {
    *out += v.dump(-1, ' ', false);
  }
}

// One line for: {value, source} pairs, small records inside arrays, and arrays of numbers or of points.
bool one_line(const ojson& v, bool in_array) {
  if (v.is_object()) {
    for (const auto& [k, c] : v.items()) {
      if (!scalar(c)) return false;
    }
    return v.contains("value") || in_array;
  }
  if (v.is_array()) {
    for (const auto& e : v) {
      if (e.is_object()) return false;
      if (e.is_array()) {
        for (const auto& x : e) {
          if (!scalar(x)) return false;
        }
      }
    }
    return true;
  }
  return true;
}

void pretty(const ojson& v, int indent, bool in_array, std::string* out) {
  if (one_line(v, in_array)) {
    compact(v, out);
    return;
  }
  const std::string pad(static_cast<size_t>(indent) + 2, ' ');
  if (v.is_object()) {
    *out += "{\n";
    bool first = true;
    for (const auto& [k, c] : v.items()) {
      if (!first) *out += ",\n";
      first = false;
      *out += pad + ojson(k).dump(-1, ' ', false) + ": ";
      pretty(c, indent + 2, false, out);
    }
    *out += "\n" + std::string(static_cast<size_t>(indent), ' ') + "}";
    return;
  }
  *out += "[\n";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) *out += ",\n";
    *out += pad;
    pretty(v[i], indent + 2, true, out);
  }
  *out += "\n" + std::string(static_cast<size_t>(indent), ' ') + "]";
}

}  // namespace

std::string profile_text(const ojson& profile) {
  std::string out;
  pretty(profile, 0, false, &out);
  out += '\n';
  return out;
}

}  // namespace moeplan::calibrate
