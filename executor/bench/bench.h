// moerun bench: measures this machine (GEMM, grouped GEMM, attention, memory bandwidth, collectives over the
// Communicator) with all MPI ranks running at once, and writes the files `moeplan calibrate` fits a hardware
// profile from: profile.json, gemm.csv, grouped_gemm.csv, attention.csv, hbm.csv and one nccl-tests-format
// <collective>_perf.n<ranks>.txt per collective and group size.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "simulator/core/status.h"

namespace moeplan::executor {

// A plan's own routed exchange (`moerun bench --plan`): its EP group, `size` ranks `stride` apart from world
// rank 0, whose busiest rank draws `hot_factor` times the mean of `bytes` per rank. The bench times it in the
// all-to-all-v table besides the standard groups. size 0: none.
struct PlanExchange {
  int size = 0, stride = 1;
  double hot_factor = 1;
  int64_t bytes = 0;  // the mean rank's send buffer
  std::string plan;   // the plan file (plan_exchange_note names it in the table's source line)
};

struct BenchOptions {
  std::string out_dir;    // created if missing; rank 0 writes into it
  std::string name;       // profile name; empty: "cpu-" + hostname
  bool quick = false;     // few shapes, small arrays, collectives up to 64 KiB (for tests)
  int64_t max_bytes = 0;  // largest collective message (nccl-tests size), bytes; 0: 64 MiB (quick: 64 KiB)
  PlanExchange plan_exchange;
};

struct BenchSummary {
  double best_gemm_tflops = 0;       // per rank, fp32
  double triad_GBps = 0;             // per rank, all ranks at once (the CUDA bench: its HBM copy)
  double sendrecv_latency_us = 0;    // one way, 8 B (half a ping-pong)
  double sendrecv_bw_GBps = 0;       // one way, largest message
  double all_reduce_busbw_1MiB = 0;  // world group; 0 when not measured
  double all_reduce_busbw_max = 0;   // world group, largest message
  double seconds = 0;                // wall time of the whole bench
  std::vector<std::string> files;    // written, in order (profile.json last)
};

// Collective over `world`: every rank must call it. Errors (an unwritable out_dir) are returned on every
// rank.
Result<BenchSummary> run_bench(const BenchOptions& options, MPI_Comm world);

// nccl-tests' number formatting (util.cu getFloatStr): width columns, 2 decimals while they fit, then fewer,
// then exponent notation; a positive value below 0.005 in exponent notation too (not read back as zero).
std::string nccl_float(double value, int width);

// nccl-tests' bus bandwidth factor for n ranks: all_reduce 2(n-1)/n; all_gather, reduce_scatter, alltoall
// (n-1)/n; sendrecv 1.
double busbw_factor(const std::string& collective, int n);

// ---- Shared by the CPU and GPU benches (cuda_bench.h) ----

// One size of a collective sweep, as nccl-tests prints it.
struct CollRow {
  int64_t bytes = 0, count = 0;
  double time_us = 0, algbw = 0, busbw = 0;
};

// One sweep's nccl-tests text: the header `moeplan calibrate` reads (collective, sizes, one "#  Rank" line
// per group rank with its host), a note on what was measured, and the rows in both column groups.
struct SweepText {
  std::string collective;  // all_reduce, all_gather, reduce_scatter, alltoall, sendrecv
  std::string redop;       // sum or none
  int64_t min_bytes = 0, max_bytes = 0;
  int warmup = 0, iters = 0;
  struct Rank {
    int pid = 0;
    std::string host, device;
  };
  std::vector<Rank> ranks;  // the group's ranks in order
  std::string note;         // one line, after "# moerun bench: "
};
std::string nccl_tests_text(const SweepText& sweep, const std::vector<CollRow>& rows);

// All-to-all-v with one hot receiver (alltoall_skew.csv; AllToAllSkewTable in simulator/core/hardware.h):
// every rank sends `values` fp32 values, hot_factor / n of them to group rank 0 and the rest evenly to the
// others (their shares rounded down, rank 0's rounded up), so rank 0 receives `hot_factor` x `values`, with
// hot_factor recomputed from the rounded counts. Hot factors are cut to [1, n].
inline constexpr double kHotFactors[] = {1.0, 1.5, 2.0, 4.0};
struct SkewCounts {
  std::vector<int64_t> send, recv;  // values to / from each group rank
  int64_t sent = 0;                 // values each rank sends in all (the `values` asked for)
  double hot_factor = 1;            // rank 0 receives hot_factor x sent
};
SkewCounts skew_counts(int n, int me, int64_t values, double hot_factor);
// The buffer sizes of the table that fit under `max_bytes`, in order.
std::vector<int64_t> alltoall_skew_sizes(std::vector<int64_t> sizes, int64_t max_bytes);
// The table's head: its "# source:" line (what ran and how it was timed), then the columns.
std::string alltoall_skew_head(const std::string& what);
std::string alltoall_skew_row(int ranks, int nodes, const SkewCounts& c, double time_us);
// The plan exchange's rows, (buffer bytes, hot factor): each of the table's `sizes` and the plan's own bytes
// (cut to max_bytes, rounded down to whole fp32 values), at hot factor 1 and at the plan's.
std::vector<std::pair<int64_t, double>> plan_exchange_rows(const PlanExchange& x, std::vector<int64_t> sizes,
                                                           int64_t max_bytes);
// What the table's source line adds for a plan exchange ("" without one).
std::string plan_exchange_note(const PlanExchange& x);
// Whether world rank `r` belongs to the plan exchange's group, and an error when a world of `nranks` ranks
// cannot hold the group.
bool in_plan_exchange(const PlanExchange& x, int r);
Result<bool> check_plan_exchange(const PlanExchange& x, int nranks);

// The mean and the largest of `x` over the ranks of `comm` (every rank gets it; collective over `comm`).
double mean_over(MPI_Comm comm, double x);
double max_over(MPI_Comm comm, double x);

// The end of a bench, collective over `world`: rank 0's write error (empty message: none) becomes every
// rank's result, else every rank returns rank 0's headline figures.
Result<BenchSummary> share_bench_result(BenchSummary summary, const Error& write_error, MPI_Comm world);

// profile.json's gpu.sustained_rate entry of one dtype from the CUDA bench's measurement: the reference GEMM
// at `cool_tflops` in a burst after `idle_s` without work and at `hot_tflops` after `load_s` of back-to-back
// GEMMs. The ratio (capped at 1) is measured; its range reaches 1, since a training step's mix of kernels may
// leave more of the power budget than back-to-back GEMMs. Null when either rate is not positive and finite.
nlohmann::ordered_json sustained_rate_entry(double cool_tflops, double hot_tflops, double idle_s,
                                            double load_s, const std::string& source);

// Writes `text` to dir/name through a temporary file, so a reader never sees half a file.
Result<std::string> write_bench_file(const std::string& dir, const std::string& name,
                                     const std::string& text);

}  // namespace moeplan::executor
