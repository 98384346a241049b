// moerun bench (see bench.h): each measurement runs on every rank at once after a barrier; per-rank figures
// are the mean over ranks of each rank's statistic; rank 0 writes the files, each to a temporary name then
// renamed.
#include "executor/bench/bench.h"

#include <fmt/chrono.h>
#include <fmt/format.h>
#include <unistd.h>
#include <Eigen/Core>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>
#include <utility>

#include "executor/comm/mpi_check.h"
#include "executor/comm/mpi_communicator.h"
#include "executor/kernels/cpu/attention.h"

namespace moeplan::executor {
namespace {

using Clock = std::chrono::steady_clock;
using MatF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  MOEPLAN_ASSERT(!v.empty());
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Machine {
  std::string host, cpu_model, date, openmpi, eigen;
  double mem_total_bytes = 0;
  int64_t llc_bytes = 0;
  unsigned cores = 0;
};

Machine describe_machine() {
  Machine m;
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  m.host = host;
  m.cpu_model = "unknown CPU";
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      m.cpu_model = line.substr(line.find(':') + 2);
      break;
    }
  }
  std::ifstream meminfo("/proc/meminfo");
  for (std::string line; std::getline(meminfo, line);) {
    if (line.rfind("MemTotal:", 0) == 0) m.mem_total_bytes = std::stod(line.substr(9)) * 1024.0;  // kB
  }
  const long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
  m.llc_bytes = llc > 0 ? llc : int64_t{32} << 20;
  m.cores = std::thread::hardware_concurrency();
  const std::time_t now = std::time(nullptr);
  m.date = fmt::format("{:%Y-%m-%d}", fmt::gmtime(now));
  char version[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0;
  MPI_Get_library_version(version, &len);
#ifdef OMPI_MAJOR_VERSION
  m.openmpi = fmt::format("{}.{}.{}", OMPI_MAJOR_VERSION, OMPI_MINOR_VERSION, OMPI_RELEASE_VERSION);
#else
  m.openmpi = std::string(version, static_cast<size_t>(std::max(len, 0)));
#endif
  m.eigen = fmt::format("{}.{}.{}", EIGEN_WORLD_VERSION, EIGEN_MAJOR_VERSION, EIGEN_MINOR_VERSION);
  return m;
}

// Runs `body` after a barrier until `min_seconds` and `min_reps` are reached (at most max_reps); returns the
// median seconds of one call. One untimed warm-up call first.
template <class F>
double time_median(MPI_Comm world, F&& body, double min_seconds, int min_reps = 3, int max_reps = 50) {
  body();
  MOEPLAN_MPI_CHECK(MPI_Barrier(world));
  std::vector<double> times;
  const auto start = Clock::now();
  while (static_cast<int>(times.size()) < min_reps ||
         (seconds_since(start) < min_seconds && static_cast<int>(times.size()) < max_reps)) {
    const auto t0 = Clock::now();
    body();
    times.push_back(seconds_since(t0));
  }
  return median(times);
}

// ---- GEMM: C[m, n] = A[m, k] B[k, n], fp32, one thread per rank; TFLOP/s = 2 m n k / time / 1e12. ----
struct GemmRow {
  int64_t m, n, k;
  double tflops;
};

double gemm_tflops(MPI_Comm world, int64_t m, int64_t n, int64_t k, double min_seconds) {
  MatF a = MatF::Random(m, k), b = MatF::Random(k, n), c(m, n);
  const double t = time_median(
      world, [&] { c.noalias() = a * b; }, min_seconds);
  return mean_over(world, 2.0 * static_cast<double>(m * n * k) / t / 1e12);
}

// ---- Grouped GEMM: one [m, k] x [k, n] GEMM per group (a loop of per-expert GEMMs). ----
double grouped_gemm_tflops(MPI_Comm world, int64_t groups, int64_t m, int64_t n, int64_t k,
                           double min_seconds) {
  std::vector<MatF> a, b, c;
  for (int64_t g = 0; g < groups; ++g) {
    a.push_back(MatF::Random(m, k));
    b.push_back(MatF::Random(k, n));
    c.emplace_back(m, n);
  }
  const double t = time_median(
      world,
      [&] {
        for (size_t g = 0; g < a.size(); ++g) c[g].noalias() = a[g] * b[g];
      },
      min_seconds);
  return mean_over(world, 2.0 * static_cast<double>(groups * m * n * k) / t / 1e12);
}

// ---- Attention: one head of moerun's CPU kernel (executor/kernels/cpu/attention.h), q, k, v [s, d]. ----
// FLOPs: forward 4 s^2 d (QK^T and PV), halved when causal; backward 2.5x forward (FlashAttention's
// convention).
double attention_tflops(MPI_Comm world, int64_t s, int64_t d, bool causal, bool backward,
                        double min_seconds) {
  using cpu::CRef;
  const MatF q = MatF::Random(s, d), k = MatF::Random(s, d), v = MatF::Random(s, d),
             dout = MatF::Random(s, d);
  std::vector<int64_t> k_pos(static_cast<size_t>(s)), q_pos(static_cast<size_t>(s));
  for (int64_t i = 0; i < s; ++i) {
    k_pos[static_cast<size_t>(i)] = i;
    q_pos[static_cast<size_t>(i)] = causal ? i : s;  // non-causal: every key is at or before every query
  }
  const cpu::AttnHeads heads{1, 1, d, 0, 0, 0};
  const auto fwd = cpu::attn_core_forward<float>(q, k, v, q_pos, k_pos, heads);
  double t = 0;
  if (backward) {
    t = time_median(
        world,
        [&] {
          const auto g = cpu::attn_core_backward<float>(q, k, v, fwd.out, fwd.lse, dout, q_pos, k_pos, heads);
          MOEPLAN_ASSERT(g.dq.rows() == s);
        },
        min_seconds);
  } else {
    t = time_median(
        world,
        [&] {
          const auto o = cpu::attn_core_forward<float>(q, k, v, q_pos, k_pos, heads);
          MOEPLAN_ASSERT(o.out.rows() == s);
        },
        min_seconds);
  }
  double flops = 4.0 * static_cast<double>(s * s * d) * (causal ? 0.5 : 1.0);
  if (backward) flops *= 2.5;
  return mean_over(world, flops / t / 1e12);
}

// ---- STREAM (McCalpin): double arrays; bytes counted as STREAM does: copy, scale 2 x 8 N; add, triad 3 x 8
// N. Best time over the repetitions (STREAM's statistic), every rank at once. ----
struct StreamResult {
  double copy = 0, mul = 0, add = 0, triad = 0;  // GB/s per rank
};

StreamResult stream(MPI_Comm world, int64_t n, int reps) {
  std::vector<double> a(static_cast<size_t>(n), 1.0), b(static_cast<size_t>(n), 2.0),
      c(static_cast<size_t>(n), 0.0);
  const double scalar = 3.0;
  auto best = [&](auto&& kernel) {
    double t_best = 1e30;
    for (int r = 0; r < reps; ++r) {
      MOEPLAN_MPI_CHECK(MPI_Barrier(world));
      const auto t0 = Clock::now();
      kernel();
      t_best = std::min(t_best, seconds_since(t0));
    }
    return t_best;
  };
  double* pa = a.data();
  double* pb = b.data();
  double* pc = c.data();
  const double nb = 8.0 * static_cast<double>(n);
  StreamResult s;
  s.copy = 2 * nb / best([&] {
             for (int64_t i = 0; i < n; ++i) pc[i] = pa[i];
           }) /
           1e9;
  s.mul = 2 * nb / best([&] {
            for (int64_t i = 0; i < n; ++i) pb[i] = scalar * pc[i];
          }) /
          1e9;
  s.add = 3 * nb / best([&] {
            for (int64_t i = 0; i < n; ++i) pc[i] = pa[i] + pb[i];
          }) /
          1e9;
  s.triad = 3 * nb / best([&] {
              for (int64_t i = 0; i < n; ++i) pa[i] = pb[i] + scalar * pc[i];
            }) /
            1e9;
  MOEPLAN_ASSERT(std::isfinite(pa[n / 2]));  // keep the stores observable
  return {mean_over(world, s.copy), mean_over(world, s.mul), mean_over(world, s.add),
          mean_over(world, s.triad)};
}

// ---- Collectives in nccl-tests' text format. ----
struct RankInfo {
  int pid = 0;
  char host[64] = {};
};

// Size conventions (nccl-tests PERFORMANCE.md): all_reduce: the buffer; all_gather: the total output
// (count x n); reduce_scatter: the total input (count x n); alltoall: one rank's whole send buffer; sendrecv:
// the message. Sizes are rounded down to whole fp32 values per rank (at least one).
struct CollCase {
  const char* name;  // file name stem and the "Collective test starting" name: <name>_perf
  const char* redop;
};

constexpr CollCase kCollectives[] = {{"all_reduce", "sum"},
                                     {"all_gather", "none"},
                                     {"reduce_scatter", "sum"},
                                     {"alltoall", "none"},
                                     {"sendrecv", "none"}};

// `warmup` calls of `once`, then the median over `iters` calls of the slowest rank's time (each call after a
// barrier), in seconds. Collective over `comm`.
template <class F>
double slowest_rank_median(MpiCommunicator& comm, F&& once, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i) once();
  std::vector<double> times;
  for (int i = 0; i < iters; ++i) {
    comm.barrier();
    const auto t0 = Clock::now();
    once();
    times.push_back(max_over(comm.comm(), seconds_since(t0)));
  }
  return median(times);
}

// One-way time of `name` at `bytes` on `comm`: median over iterations of the slowest rank's time.
// sendrecv is a ping-pong between group ranks 2i and 2i+1 (an odd last rank idles): half the round trip.
CollRow time_collective(MpiCommunicator& comm, const std::string& name, int64_t bytes, int warmup,
                        int iters) {
  const int n = comm.size(), me = comm.rank();
  const bool per_rank_split = name == "all_gather" || name == "reduce_scatter" || name == "alltoall";
  const int64_t values =
      per_rank_split ? std::max<int64_t>(1, bytes / 4 / n) : std::max<int64_t>(1, bytes / 4);
  CollRow row;
  row.count = per_rank_split ? values * n : values;
  row.bytes = row.count * 4;
  // in: [values] (all_reduce, all_gather, sendrecv) or [n, values]; out: [n, values] or [values].
  const auto v = static_cast<size_t>(values), nv = v * static_cast<size_t>(n);
  std::vector<float> in(name == "reduce_scatter" || name == "alltoall" ? nv : v, 1.0f);
  std::vector<float> out(name == "all_gather" || name == "alltoall" ? nv : v, 0.0f);
  const std::vector<int64_t> counts(static_cast<size_t>(n), values);
  const int peer = (me % 2 == 0) ? me + 1 : me - 1;
  auto once = [&] {
    if (name == "all_reduce") {
      comm.all_reduce(in, WireFormat::kFp32);
    } else if (name == "all_gather") {
      comm.all_gather(in, out, WireFormat::kFp32);
    } else if (name == "reduce_scatter") {
      comm.reduce_scatter(in, out, WireFormat::kFp32);
    } else if (name == "alltoall") {
      comm.all_to_all_v(in, counts, out, counts, WireFormat::kFp32);
    } else if (peer < n) {
      if (me % 2 == 0) {
        comm.send(in, peer, 1, WireFormat::kFp32);
        comm.recv(out, peer, 2, WireFormat::kFp32);
      } else {
        comm.recv(out, peer, 1, WireFormat::kFp32);
        comm.send(in, peer, 2, WireFormat::kFp32);
      }
    }
  };
  row.time_us = slowest_rank_median(comm, once, warmup, iters) * 1e6;
  if (name == "sendrecv") row.time_us /= 2;  // one way
  row.algbw = static_cast<double>(row.bytes) / (row.time_us * 1e-6) / 1e9;
  row.busbw = row.algbw * busbw_factor(name, n);
  return row;
}

// One all-to-all-v with a hot receiver on `comm`: median over iterations of the slowest rank's time, in
// seconds (as time_collective).
double time_alltoall_skew(MpiCommunicator& comm, const SkewCounts& c, int warmup, int iters) {
  int64_t in_n = 0, out_n = 0;
  for (int64_t v : c.send) in_n += v;
  for (int64_t v : c.recv) out_n += v;
  std::vector<float> in(static_cast<size_t>(in_n), 1.0f), out(static_cast<size_t>(out_n), 0.0f);
  return slowest_rank_median(
      comm, [&] { comm.all_to_all_v(in, c.send, out, c.recv, WireFormat::kFp32); }, warmup, iters);
}

std::string nccl_file(const std::string& name, const char* redop, int64_t min_bytes, int64_t max_bytes,
                      int warmup, int iters, const std::vector<int>& members,
                      const std::vector<RankInfo>& ranks, const Machine& m,
                      const std::vector<CollRow>& rows) {
  SweepText sweep{.collective = name,
                  .redop = redop,
                  .min_bytes = min_bytes,
                  .max_bytes = max_bytes,
                  .warmup = warmup,
                  .iters = iters,
                  .ranks = {},
                  .note = fmt::format(
                      "the Communicator (fp32 wire) over MPI; time = median over iterations of the slowest "
                      "rank; one variant per collective (all_reduce in place, the others out of place), "
                      "shown in both column groups{}",
                      name == "sendrecv" ? "; sendrecv = half a ping-pong between rank pairs" : "")};
  for (int r : members) {
    const RankInfo& info = ranks[static_cast<size_t>(r)];
    sweep.ranks.push_back({info.pid, info.host, m.cpu_model});
  }
  return nccl_tests_text(sweep, rows);
}

nlohmann::ordered_json sourced(double value, const std::string& source) {
  return {{"value", value}, {"source", source}};
}
nlohmann::ordered_json sourced_int(int64_t value, const std::string& source) {
  return {{"value", value}, {"source", source}};
}

}  // namespace

std::string nccl_float(double value, int width) {
  // nccl-tests prints 2 decimals, so a bandwidth below 0.005 GB/s (a loaded CPU machine) would read as zero
  // and carry nothing: such values keep two significant digits in e-notation, which nccl-tests readers parse.
  if (value > 0 && value < 0.005) return fmt::format("{:{}.1e}", value, width);
  int power = 0;
  for (double v = 1; value >= v; v *= 10) ++power;
  if (power < width - 2) return fmt::format("{:{}.2f}", value, width);
  if (power < width - 1) return fmt::format("{:{}.1f}", value, width);
  if (power < width + 1) return fmt::format("{:{}.0f}", value, width);
  return fmt::format("{:{}.1e}", value, width);
}

std::string nccl_tests_text(const SweepText& sweep, const std::vector<CollRow>& rows) {
  std::string s;
  s += fmt::format("# Collective test starting: {}_perf\n", sweep.collective);
  s += fmt::format(
      "# nThread 1 nGpus 1 minBytes {} maxBytes {} step: 2(factor) warmup iters: {} iters: {} agg iters: 1 "
      "validation: 0 graph: 0\n",
      sweep.min_bytes, sweep.max_bytes, sweep.warmup, sweep.iters);
  s += "#\n# Using devices\n";
  for (size_t r = 0; r < sweep.ranks.size(); ++r) {
    const SweepText::Rank& info = sweep.ranks[r];
    s += fmt::format("#  Rank {:2d} Group  0 Pid {:6d} on {:>10s} device  0 [0x00] {}\n", r, info.pid,
                     info.host, info.device);
  }
  s += fmt::format("#\n# moerun bench: {}\n", sweep.note);
  s += "#\n";
  s += fmt::format(
      "# {:>10s}  {:>12s}  {:>8s}  {:>6s}  {:>6s}           out-of-place                       in-place\n",
      "", "", "", "", "");
  s += fmt::format(
      "# {:>10s}  {:>12s}  {:>8s}  {:>6s}  {:>6s}  {:>7s}  {:>6s}  {:>6s} {:>6s}  {:>7s}  {:>6s}  {:>6s} "
      "{:>6s}\n",
      "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw",
      "#wrong");
  s += fmt::format(
      "# {:>10s}  {:>12s}  {:>8s}  {:>6s}  {:>6s}  {:>7s}  {:>6s}  {:>6s}  {:>5s}  {:>7s}  {:>6s}  {:>6s}  "
      "{:>5s}\n",
      "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
  double bus_sum = 0;
  for (const CollRow& r : rows) {
    const std::string body = fmt::format("  {:>7s}  {:>6s}  {:>6s}    N/A", nccl_float(r.time_us, 7),
                                         nccl_float(r.algbw, 6), nccl_float(r.busbw, 6));
    s += fmt::format("{:12d}  {:12d}  {:>8s}  {:>6s}  {:6d}{}{}\n", r.bytes, r.count, "float", sweep.redop,
                     -1, body, body);
    bus_sum += r.busbw;
  }
  s += "# Out of bounds values : 0 OK\n";
  s += fmt::format("# Avg bus bandwidth    : {:.6g} \n#\n",
                   rows.empty() ? 0.0 : bus_sum / static_cast<double>(rows.size()));
  return s;
}

Result<std::string> write_bench_file(const std::string& dir, const std::string& name,
                                     const std::string& text) {
  const std::filesystem::path path = std::filesystem::path(dir) / name;
  const std::filesystem::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp);
    out << text;
    if (!out) return Error{fmt::format("{}: cannot write", tmp.string())};
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return Error{fmt::format("{}: cannot rename: {}", path.string(), ec.message())};
  return name;
}

double busbw_factor(const std::string& collective, int n) {
  const double d = n;
  if (collective == "all_reduce") return 2.0 * (d - 1) / d;
  if (collective == "sendrecv") return 1.0;
  return (d - 1) / d;  // all_gather, reduce_scatter, alltoall
}

Result<BenchSummary> run_bench(const BenchOptions& options, MPI_Comm world) {
  const auto start = Clock::now();
  int me = 0, nranks = 1;
  MOEPLAN_MPI_CHECK(MPI_Comm_rank(world, &me));
  MOEPLAN_MPI_CHECK(MPI_Comm_size(world, &nranks));
  const Machine machine = describe_machine();
  // Every rank sees the same world size, so every rank returns this error (no rank waits on another).
  if (auto fits = check_plan_exchange(options.plan_exchange, nranks); !fits) return fits.error();

  // Rank 0 prepares the directory; every rank learns whether it can go on.
  std::string dir_error;
  if (me == 0) {
    std::error_code ec;
    std::filesystem::create_directories(options.out_dir, ec);
    if (options.out_dir.empty() || ec)
      dir_error = fmt::format("--out {}: cannot create the directory", options.out_dir);
  }
  int ok = dir_error.empty() ? 1 : 0;
  MOEPLAN_MPI_CHECK(MPI_Bcast(&ok, 1, MPI_INT, 0, world));
  if (!ok)
    return Error{me == 0 ? dir_error : fmt::format("--out {}: rank 0 cannot create it", options.out_dir)};

  Eigen::setNbThreads(1);
  const bool quick = options.quick;
  const double min_seconds = quick ? 0.005 : 0.1;
  BenchSummary summary;
  std::vector<std::string> files;
  Error write_error{};
  auto emit = [&](const std::string& name, const std::string& text) {
    if (me != 0) return;
    auto w = write_bench_file(options.out_dir, name, text);
    if (w.ok()) {
      files.push_back(name);
    } else if (write_error.message.empty()) {
      write_error = w.error();
    }
  };
  const std::string per_rank = fmt::format("{} MPI ranks at once, one thread each", nranks);

  // GEMM grid: m over 64..4096, (n, k) square and skinny shapes of the tiny and small models.
  {
    const std::vector<int64_t> ms = quick ? std::vector<int64_t>{64, 256, 1024}
                                          : std::vector<int64_t>{64, 128, 256, 512, 1024, 2048, 4096};
    const std::vector<std::pair<int64_t, int64_t>> nks =
        quick ? std::vector<std::pair<int64_t, int64_t>>{{64, 64}, {256, 256}, {1024, 1024}}
              : std::vector<std::pair<int64_t, int64_t>>{{64, 64},    {256, 256},   {1024, 1024}, {256, 1024},
                                                         {1024, 256}, {4096, 1024}, {1024, 4096}};
    std::string csv = fmt::format(
        "# source: measured by moerun bench (B1): Eigen {} fp32 GEMM C = A B, Eigen::setNbThreads(1), {}; "
        "median "
        "of >= 3 timed repetitions (>= {} s) after one warm-up, mean over ranks; TFLOP/s = 2 m n k / time / "
        "1e12\n"
        "# source: dtype bf16 because the CPU backend runs bf16 plans in fp32\n"
        "m,n,k,dtype,tflops\n",
        machine.eigen, per_rank, min_seconds);
    for (int64_t m : ms) {
      for (auto [n, k] : nks) {
        const double tf = gemm_tflops(world, m, n, k, min_seconds);
        summary.best_gemm_tflops = std::max(summary.best_gemm_tflops, tf);
        csv += fmt::format("{},{},{},bf16,{:.6g}\n", m, n, k, tf);
      }
    }
    emit("gemm.csv", csv);
  }
  {
    const std::vector<int64_t> gs = quick ? std::vector<int64_t>{2, 8} : std::vector<int64_t>{2, 4, 8, 16};
    const std::vector<int64_t> mpg =
        quick ? std::vector<int64_t>{16, 256} : std::vector<int64_t>{16, 64, 256, 1024};
    const int64_t n = 256, k = 256;
    std::string csv = fmt::format(
        "# source: measured by moerun bench (B1): a loop of per-expert Eigen {} fp32 GEMMs [m_per_group, k] "
        "x [k, "
        "n], one thread per rank, {}; median of >= 3 repetitions, mean over ranks; TFLOP/s = 2 groups m n k "
        "/ "
        "time / 1e12; dtype bf16 because the CPU backend runs bf16 plans in fp32\n"
        "groups,m_per_group,n,k,dtype,kernel,tflops\n",
        machine.eigen, per_rank);
    for (int64_t g : gs) {
      for (int64_t m : mpg) {
        csv += fmt::format("{},{},{},{},bf16,eigen_loop,{:.6g}\n", g, m, n, k,
                           grouped_gemm_tflops(world, g, m, n, k, min_seconds));
      }
    }
    emit("grouped_gemm.csv", csv);
  }
  {
    const std::vector<int64_t> seqs =
        quick ? std::vector<int64_t>{64, 256} : std::vector<int64_t>{64, 128, 256, 512, 1024, 2048};
    const std::vector<int64_t> dims = quick ? std::vector<int64_t>{16, 64} : std::vector<int64_t>{16, 32, 64};
    std::string csv = fmt::format(
        "# source: measured by moerun bench (B1): moerun's CPU attention kernel (executor/kernels/cpu "
        "attn_core_forward / attn_core_backward, Eigen fp32), one head, {}; median of >= 3 repetitions, mean "
        "over "
        "ranks; FLOPs: fwd 4 s^2 d per head, halved when causal; bwd 2.5 x fwd; dtype bf16 because the CPU "
        "backend "
        "runs bf16 plans in fp32\n"
        "seq_len,head_dim,causal,direction,dtype,impl,tflops\n",
        per_rank);
    for (int64_t s : seqs) {
      for (int64_t d : dims) {
        for (bool causal : {true, false}) {
          for (bool bwd : {false, true}) {
            csv += fmt::format("{},{},{},{},bf16,moerun-cpu,{:.6g}\n", s, d, causal, bwd ? "bwd" : "fwd",
                               attention_tflops(world, s, d, causal, bwd, min_seconds));
          }
        }
      }
    }
    emit("attention.csv", csv);
  }
  {
    // The arrays of all ranks together span at least 4x the last-level cache (STREAM's rule), within 1/8 of
    // RAM.
    const int64_t floor_values = quick ? int64_t{1} << 22 : int64_t{1} << 24;
    int64_t n = std::max<int64_t>(floor_values, 4 * machine.llc_bytes / (3 * 8 * nranks));
    n = std::min<int64_t>(n, static_cast<int64_t>(machine.mem_total_bytes / 8 / (3 * 8 * nranks)));
    if (quick) n = floor_values;
    const int reps = quick ? 3 : 10;
    const StreamResult r = stream(world, n, reps);
    summary.triad_GBps = r.triad;
    std::string csv = fmt::format(
        "# source: measured by moerun bench (B1): STREAM kernels on {} doubles per array ({:.0f} MiB) per "
        "rank, "
        "{}; best of {} repetitions (STREAM's statistic), mean over ranks; bytes counted as STREAM: copy and "
        "mul "
        "(scale) 16 B per element, add and triad 24 B\n"
        "kernel,bw_GBps\n",
        n, static_cast<double>(n) * 8 / (1 << 20), per_rank, reps);
    csv += fmt::format("copy,{:.6g}\nmul,{:.6g}\nadd,{:.6g}\ntriad,{:.6g}\n", r.copy, r.mul, r.add, r.triad);
    emit("hbm.csv", csv);
  }

  // Collectives over groups of the first g world ranks, g = 2, 4, ... below the world size, and the world.
  std::vector<RankInfo> ranks(static_cast<size_t>(nranks));
  {
    RankInfo mine;
    mine.pid = static_cast<int>(getpid());
    std::snprintf(mine.host, sizeof(mine.host), "%s", machine.host.c_str());
    MOEPLAN_MPI_CHECK(
        MPI_Allgather(&mine, sizeof(RankInfo), MPI_BYTE, ranks.data(), sizeof(RankInfo), MPI_BYTE, world));
  }
  const int64_t max_bytes = options.max_bytes > 0 ? options.max_bytes
                            : quick               ? int64_t{64} << 10
                                                  : int64_t{64} << 20;
  const int64_t min_bytes = 8;
  const int warmup = quick ? 1 : 2, iters = quick ? 3 : 10;
  std::vector<int> group_sizes;
  for (int g = 2; g < nranks; g *= 2) group_sizes.push_back(g);
  if (nranks >= 2) group_sizes.push_back(nranks);
  // Per-rank buffers of the all-to-all-v with a hot receiver: three sizes up to the sweeps' largest.
  const std::vector<int64_t> skew_bytes = alltoall_skew_sizes(
      quick ? std::vector<int64_t>{int64_t{4} << 10, int64_t{64} << 10}
            : std::vector<int64_t>{int64_t{64} << 10, int64_t{1} << 20, int64_t{16} << 20},
      max_bytes);
  std::string skew_csv = alltoall_skew_head(fmt::format(
      "measured by moerun bench (B1): the Communicator (fp32 wire) over MPI, {}; time = median over {} "
      "iterations of the slowest rank{}",
      per_rank, iters, plan_exchange_note(options.plan_exchange)));
  for (int g : group_sizes) {
    MPI_Comm sub = MPI_COMM_NULL;
    MOEPLAN_MPI_CHECK(MPI_Comm_split(world, me < g ? 0 : MPI_UNDEFINED, me, &sub));
    if (sub != MPI_COMM_NULL) {
      std::vector<int> members(static_cast<size_t>(g));
      for (int r = 0; r < g; ++r) members[static_cast<size_t>(r)] = r;
      MpiCommunicator comm(sub, group_name("bench", members));
      for (const CollCase& c : kCollectives) {
        std::vector<CollRow> rows;
        for (int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= 2) {
          rows.push_back(time_collective(comm, c.name, bytes, warmup, iters));
          const CollRow& row = rows.back();
          if (g == 2 && std::string(c.name) == "sendrecv") {
            if (bytes == min_bytes) summary.sendrecv_latency_us = row.time_us;
            summary.sendrecv_bw_GBps = row.algbw;  // the largest message wins
          }
          if (g == nranks && std::string(c.name) == "all_reduce") {
            if (bytes == int64_t{1} << 20) summary.all_reduce_busbw_1MiB = row.busbw;
            summary.all_reduce_busbw_max = row.busbw;
          }
        }
        emit(fmt::format("{}_perf.n{}.txt", c.name, g),
             nccl_file(c.name, c.redop, min_bytes, max_bytes, warmup, iters, members, ranks, machine, rows));
      }
      std::set<std::string> hosts;
      for (int r : members) hosts.insert(ranks[static_cast<size_t>(r)].host);
      for (int64_t bytes : skew_bytes) {
        for (double hot : kHotFactors) {
          if (hot > g) continue;
          const SkewCounts counts = skew_counts(g, comm.rank(), std::max<int64_t>(1, bytes / 4), hot);
          const double t = time_alltoall_skew(comm, counts, warmup, iters);
          skew_csv += alltoall_skew_row(g, static_cast<int>(hosts.size()), counts, t * 1e6);
        }
      }
    }
    MOEPLAN_MPI_CHECK(MPI_Barrier(world));
  }
  // The plan's own routed exchange: its EP group at its busiest rank's load, at the table's sizes and its
  // own.
  if (const PlanExchange& x = options.plan_exchange; x.size >= 2) {
    MPI_Comm sub = MPI_COMM_NULL;
    MOEPLAN_MPI_CHECK(MPI_Comm_split(world, in_plan_exchange(x, me) ? 0 : MPI_UNDEFINED, me, &sub));
    if (sub != MPI_COMM_NULL) {
      std::vector<int> members;
      std::set<std::string> hosts;
      for (int r = 0; r < nranks; ++r) {
        if (!in_plan_exchange(x, r)) continue;
        members.push_back(r);
        hosts.insert(ranks[static_cast<size_t>(r)].host);
      }
      MpiCommunicator comm(sub, group_name("bench-plan", members));
      for (const auto& [bytes, hot] : plan_exchange_rows(x, skew_bytes, max_bytes)) {
        const SkewCounts counts = skew_counts(x.size, comm.rank(), std::max<int64_t>(1, bytes / 4), hot);
        const double t = time_alltoall_skew(comm, counts, warmup, iters);
        skew_csv += alltoall_skew_row(x.size, static_cast<int>(hosts.size()), counts, t * 1e6);
      }
    }
    MOEPLAN_MPI_CHECK(MPI_Barrier(world));
  }
  if ((!group_sizes.empty() && !skew_bytes.empty()) || options.plan_exchange.size >= 2)
    emit("alltoall_skew.csv", skew_csv);

  // profile.json: the hardware-profile fields of hwprofiles/*.json, from the measurements above.
  if (me == 0) {
    const std::string b1 = "measured by moerun bench (B1): ";
    const std::string shm = "single machine: no network; shared-memory figures: ";
    const double bw = summary.sendrecv_bw_GBps, lat = summary.sendrecv_latency_us;
    const std::string bw_src = fmt::format(
        "{}one-way send/recv bandwidth at {} B (half a ping-pong between ranks 0 and 1), median of {} "
        "iterations "
        "(sendrecv_perf.n2.txt)",
        b1, max_bytes, iters);
    const std::string lat_src = fmt::format(
        "{}one-way latency of an 8 B send/recv (half a ping-pong between ranks 0 and 1), median of {} "
        "iterations "
        "(sendrecv_perf.n2.txt)",
        b1, iters);
    const std::string triad_src = fmt::format(
        "{}STREAM triad per rank with all {} ranks running, best of the repetitions in hbm.csv", b1, nranks);
    nlohmann::ordered_json j;
    j["format"] = "moeplan-calibration-sources-v1";
    j["name"] = options.name.empty() ? "cpu-" + machine.host : options.name;
    j["description"] = fmt::format("{}: {} MPI ranks (one core each) on {} cores, CPU backend",
                                   machine.cpu_model, nranks, machine.cores);
    j["sources"] = {{"B1", fmt::format("moerun bench on {}, {}, {} MPI ranks, OpenMPI {}, Eigen {}",
                                       machine.host, machine.date, nranks, machine.openmpi, machine.eigen)}};
    const std::string peak_src =
        "measured: best GEMM in gemm.csv; the CPU backend computes every dtype in fp32";
    const double peak = summary.best_gemm_tflops;
    j["gpu"] = {
        {"model", machine.cpu_model},
        {"sm_count", sourced_int(1, "one core per rank, so the cost model's wave quantisation is neutral")},
        {"peak_tflops",
         {{"bf16", sourced(peak, peak_src)},
          {"fp8", sourced(peak, peak_src)},
          {"tf32", sourced(peak, peak_src)},
          {"fp32", sourced(peak, peak_src)}}},
        {"hbm_capacity_GB", sourced(machine.mem_total_bytes / 1e9 / nranks,
                                    fmt::format("{}MemTotal of /proc/meminfo / {} ranks", b1, nranks))},
        {"hbm_bw_peak_GBps", sourced(summary.triad_GBps, triad_src)},
        {"hbm_bw_achieved_GBps", sourced(summary.triad_GBps, triad_src)}};
    j["node"] = {{"gpus_per_node", sourced_int(nranks, "one node: every MPI rank of this run")},
                 {"nvlink_bw_uni_GBps", sourced(bw, bw_src)},
                 {"nvlink_bw_achieved_GBps", sourced(bw, bw_src)},
                 {"nvls", {{"value", false}, {"source", "CPU ranks: no in-switch reduction"}}},
                 {"nvlink_latency_us", sourced(lat, lat_src)}};
    j["scale_out"] = {{"nics_per_node", sourced_int(nranks, shm + "one per rank")},
                      {"nic_bw_GBps", sourced(bw, shm + bw_src)},
                      {"nic_bw_achieved_GBps", sourced(bw, shm + bw_src)},
                      {"topology", {{"value", "fat_tree"}, {"source", shm + "no topology"}}},
                      {"net_latency_us", sourced(lat, shm + lat_src)}};
    j["measurements"] = files;
    emit("profile.json", j.dump(2) + "\n");
  }
  summary.files = files;
  summary.seconds = seconds_since(start);
  return share_bench_result(std::move(summary), write_error, world);
}

SkewCounts skew_counts(int n, int me, int64_t values, double hot_factor) {
  MOEPLAN_ASSERT(n >= 2 && me >= 0 && me < n && values >= 1);
  const double h = std::clamp(hot_factor, 1.0, static_cast<double>(n));
  // The others' share rounded down and rank 0 the rest: rank 0 gets at least h / n of the buffer (so at
  // least as much as any other rank, hot_factor >= 1 even for a buffer of one value), and each rank sends
  // exactly `values`.
  const auto cold = static_cast<int64_t>(std::floor(static_cast<double>(values) * (1.0 - h / n) / (n - 1)));
  const int64_t hot = values - cold * (n - 1);
  SkewCounts c;
  c.send.assign(static_cast<size_t>(n), cold);
  c.send[0] = hot;
  c.recv.assign(static_cast<size_t>(n), me == 0 ? hot : cold);  // every rank sends the same pattern
  c.sent = hot + cold * (n - 1);
  c.hot_factor = c.sent > 0 ? static_cast<double>(hot) * n / static_cast<double>(c.sent) : 1.0;
  return c;
}

std::vector<int64_t> alltoall_skew_sizes(std::vector<int64_t> sizes, int64_t max_bytes) {
  std::erase_if(sizes, [max_bytes](int64_t b) { return b > max_bytes; });
  return sizes;
}

std::string alltoall_skew_head(const std::string& what) {
  return fmt::format(
      "# source: {}; all-to-all-v with one hot receiver: each rank sends `bytes` (its whole send buffer, "
      "fp32), hot_factor / ranks of it to group rank 0 and the rest evenly to the other ranks, so rank 0 "
      "receives hot_factor x bytes (a routed dispatch whose busiest rank draws hot_factor times the mean)\n"
      "ranks,nodes,bytes,hot_factor,time_us\n",
      what);
}

std::string alltoall_skew_row(int ranks, int nodes, const SkewCounts& c, double time_us) {
  return fmt::format("{},{},{},{:.6g},{:.6g}\n", ranks, nodes, c.sent * 4, c.hot_factor, time_us);
}

std::vector<std::pair<int64_t, double>> plan_exchange_rows(const PlanExchange& x, std::vector<int64_t> sizes,
                                                           int64_t max_bytes) {
  sizes.push_back(std::max<int64_t>(4, std::min(x.bytes, max_bytes) / 4 * 4));
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  std::vector<std::pair<int64_t, double>> rows;
  for (int64_t b : sizes) {
    rows.emplace_back(b, 1.0);
    if (x.hot_factor > 1.0) rows.emplace_back(b, x.hot_factor);
  }
  return rows;
}

std::string plan_exchange_note(const PlanExchange& x) {
  if (x.size < 2) return "";
  return fmt::format(
      "; then the expert-parallel group of plan {} ({} ranks {} apart from world rank 0) at its hot factor "
      "{:.6g} and its {} bytes per rank",
      x.plan, x.size, x.stride, x.hot_factor, x.bytes);
}

bool in_plan_exchange(const PlanExchange& x, int r) {
  return x.size >= 2 && r % x.stride == 0 && r / x.stride < x.size;
}

Result<bool> check_plan_exchange(const PlanExchange& x, int nranks) {
  if (x.size < 2) return true;
  const int64_t needs = int64_t{x.size - 1} * x.stride + 1;
  if (needs > nranks) {
    return Error{fmt::format(
        "--plan {}: its expert-parallel group ({} ranks, {} apart) needs {} ranks; this bench has {}", x.plan,
        x.size, x.stride, needs, nranks)};
  }
  return true;
}

double mean_over(MPI_Comm comm, double x) {
  double sum = 0;
  int n = 1;
  MOEPLAN_MPI_CHECK(MPI_Allreduce(&x, &sum, 1, MPI_DOUBLE, MPI_SUM, comm));
  MOEPLAN_MPI_CHECK(MPI_Comm_size(comm, &n));
  return sum / n;
}

double max_over(MPI_Comm comm, double x) {
  double m = 0;
  MOEPLAN_MPI_CHECK(MPI_Allreduce(&x, &m, 1, MPI_DOUBLE, MPI_MAX, comm));
  return m;
}

Result<BenchSummary> share_bench_result(BenchSummary summary, const Error& write_error, MPI_Comm world) {
  int me = 0;
  MOEPLAN_MPI_CHECK(MPI_Comm_rank(world, &me));
  int write_ok = write_error.message.empty() ? 1 : 0;
  MOEPLAN_MPI_CHECK(MPI_Bcast(&write_ok, 1, MPI_INT, 0, world));
  if (!write_ok) return Error{me == 0 ? write_error.message : "rank 0 could not write the bench files"};
  double figures[6] = {summary.best_gemm_tflops,      summary.triad_GBps,
                       summary.sendrecv_latency_us,   summary.sendrecv_bw_GBps,
                       summary.all_reduce_busbw_1MiB, summary.all_reduce_busbw_max};
  MOEPLAN_MPI_CHECK(MPI_Bcast(figures, 6, MPI_DOUBLE, 0, world));
  summary.best_gemm_tflops = figures[0];
  summary.triad_GBps = figures[1];
  summary.sendrecv_latency_us = figures[2];
  summary.sendrecv_bw_GBps = figures[3];
  summary.all_reduce_busbw_1MiB = figures[4];
  summary.all_reduce_busbw_max = figures[5];
  return summary;
}

nlohmann::ordered_json sustained_rate_entry(double cool_tflops, double hot_tflops, double idle_s,
                                            double load_s, const std::string& source) {
  auto rate = [](double x) { return std::isfinite(x) && x > 0; };
  if (!rate(cool_tflops) || !rate(hot_tflops)) return nullptr;
  const double ratio = std::min(1.0, hot_tflops / cool_tflops);
  return {
      {"value", ratio},
      {"basis", "measured"},
      {"source", fmt::format("{}: sustained.csv, the reference GEMM at {:.1f} TFLOP/s after {:g} s of "
                             "back-to-back GEMMs against {:.1f} in a burst after {:g} s idle (capped at 1); "
                             "range up to 1: a step's kernel mix may leave the power budget unspent",
                             source, hot_tflops, load_s, cool_tflops, idle_s)},
      {"range", {ratio, 1.0}}};
}

}  // namespace moeplan::executor
