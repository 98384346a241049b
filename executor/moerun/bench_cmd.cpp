// `moerun bench --out DIR`: measures this machine for `moeplan calibrate` (GEMM, grouped GEMM, attention,
// STREAM, collectives; see executor/bench/bench.h), every rank at once under mpirun.
#include <fmt/format.h>
#include <mpi.h>

#include <memory>

#include "executor/bench/bench.h"
#include "executor/moerun/moerun_cli.h"

namespace moeplan::executor::cli {

Runner add_bench(CLI::App& app) {
  auto options = std::make_shared<BenchOptions>();
  app.add_option("--out", options->out_dir, "directory for profile.json, *.csv and *_perf.n*.txt")
      ->required();
  app.add_flag("--quick", options->quick, "few shapes, small arrays, collectives up to 64 KiB");
  app.add_option("--name", options->name, "profile name (default: cpu-<hostname>)");
  app.add_option("--max-bytes", options->max_bytes,
                 "largest collective message in bytes (default 64 MiB, 64 KiB with --quick)")
      ->check(CLI::Range(int64_t{8}, int64_t{1} << 30));
  return [options](int world_rank, int /*world_size*/) {
    Result<BenchSummary> result = run_bench(*options, MPI_COMM_WORLD);
    if (!result) return bad_input(world_rank, result.error().message);
    const BenchSummary& s = result.value();
    if (world_rank == 0) {
      fmt::print(
          "moerun bench: {:.1f} s; best GEMM {:.4f} TFLOP/s per rank; triad {:.2f} GB/s per rank; send/recv "
          "{:.2f} us (8 B), {:.2f} GB/s (largest); all_reduce busbw {:.2f} GB/s at 1 MiB, {:.2f} GB/s at the "
          "largest size; {} files in {}\n",
          s.seconds, s.best_gemm_tflops, s.triad_GBps, s.sendrecv_latency_us, s.sendrecv_bw_GBps,
          s.all_reduce_busbw_1MiB, s.all_reduce_busbw_max, s.files.size(), options->out_dir);
    }
    return kExitOk;
  };
}

}  // namespace moeplan::executor::cli
