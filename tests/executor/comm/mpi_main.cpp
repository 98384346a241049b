// doctest entry point for tests run under mpiexec: every rank runs every test; the job fails when any rank
// fails (a pass flag reduced over the world), so ctest sees a failure on rank 3 as well as on rank 0.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <mpi.h>

#include <cstdio>

#include "executor/comm/mpi_communicator.h"

int main(int argc, char** argv) {
  auto level = moeplan::executor::init_mpi(&argc, &argv);
  if (!level) {
    std::fprintf(stderr, "%s\n", level.error().message.c_str());
    MPI_Finalize();
    return 2;
  }
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  doctest::Context context(argc, argv);
  if (rank != 0) context.setOption("no-version", true);
  const int failed_here = context.run() != 0 ? 1 : 0;
  int failed_anywhere = 0;
  MPI_Allreduce(&failed_here, &failed_anywhere, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (failed_here) std::fprintf(stderr, "rank %d: tests failed\n", rank);
  MPI_Finalize();
  return failed_anywhere;
}
