// moerun_bench: runs `moerun bench` under mpirun until the moerun CLI calls run_bench itself.
//   mpiexec -n 2 moerun_bench --out DIR [--quick] [--name N] [--max-bytes B]
#include <fmt/format.h>
#include <mpi.h>
#include <CLI/CLI.hpp>

#include "executor/bench/bench.h"
#include "executor/comm/mpi_communicator.h"

int main(int argc, char** argv) {
  using namespace moeplan::executor;
  auto level = init_mpi(&argc, &argv);
  if (!level) {
    fmt::print(stderr, "moerun bench: {}\n", level.error().message);
    MPI_Finalize();
    return 2;
  }
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  CLI::App app{"moerun bench: measure this machine for `moeplan calibrate`"};
  BenchOptions options;
  app.add_option("--out", options.out_dir, "directory for profile.json, *.csv and *_perf.n*.txt")->required();
  app.add_flag("--quick", options.quick, "few shapes, small arrays, collectives up to 64 KiB");
  app.add_option("--name", options.name, "profile name (default: cpu-<hostname>)");
  app.add_option("--max-bytes", options.max_bytes,
                 "largest collective message in bytes (default 64 MiB, 64 KiB with --quick)")
      ->check(CLI::Range(int64_t{8}, int64_t{1} << 30));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = e.get_exit_code();
    if (rank == 0) app.exit(e);
    MPI_Finalize();
    return rc == 0 ? 0 : 2;
  }
  auto result = run_bench(options, MPI_COMM_WORLD);
  if (!result) {
    if (rank == 0) fmt::print(stderr, "moerun bench: {}\n", result.error().message);
    MPI_Finalize();
    return 2;
  }
  const BenchSummary& s = result.value();
  if (rank == 0) {
    fmt::print(
        "moerun bench: {:.1f} s; best GEMM {:.4f} TFLOP/s per rank; triad {:.2f} GB/s per rank; send/recv "
        "{:.2f} us "
        "(8 B), {:.2f} GB/s (largest); all_reduce busbw {:.2f} GB/s at 1 MiB, {:.2f} GB/s at the largest "
        "size; "
        "{} files in {}\n",
        s.seconds, s.best_gemm_tflops, s.triad_GBps, s.sendrecv_latency_us, s.sendrecv_bw_GBps,
        s.all_reduce_busbw_1MiB, s.all_reduce_busbw_max, s.files.size(), options.out_dir);
  }
  MPI_Finalize();
  return 0;
}
