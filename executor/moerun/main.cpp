// moerun: executes a moeplan plan for real, one MPI rank per GPU (or CPU rank), and writes a measured report
// and Chrome trace in the schema of `moeplan simulate`. Subcommands: run and bench.
#include <mpi.h>

#include <cstdio>
#include <map>

#include "executor/comm/mpi_communicator.h"
#include "executor/moerun/moerun_cli.h"

int main(int argc, char** argv) {
  using namespace moeplan::executor;
  moeplan::Result<int> mpi = init_mpi(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (!mpi) {
    cli::bad_input(rank, mpi.error().message);
    MPI_Finalize();
    return cli::kExitBadInput;
  }

  CLI::App app{"moerun: runs a moeplan plan and measures it (start with mpirun, one rank per GPU)", "moerun"};
  app.require_subcommand(1);
  std::map<CLI::App*, cli::Runner> runners;
  CLI::App* run =
      app.add_subcommand("run", "Run training steps of a plan; write DIR/report.json and trace.json");
  runners[run] = cli::add_run(*run);
  CLI::App* bench = app.add_subcommand(
      "bench", "Measure this machine (GEMM, attention, memory, collectives) for `moeplan calibrate`");
  runners[bench] = cli::add_bench(*bench);

  int code = cli::kExitOk;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (rank == 0) {
      code = app.exit(e);
    } else {
      code = e.get_exit_code();
    }
    MPI_Finalize();
    return code == 0 ? 0 : cli::kExitBadInput;
  }
  for (auto& [sub, runner] : runners) {
    if (sub->parsed()) code = runner(rank, size);
  }
  MPI_Finalize();
  return code;
}
