// MOEPLAN_MPI_CHECK: every MPI call of the CPU backend goes through it, so a failure names the call,
// file:line and MPI's error string, then aborts the whole job (a failing rank must not leave the others
// hanging).
#pragma once

#include <mpi.h>

#include <cstdio>

#define MOEPLAN_MPI_CHECK(call)                                                               \
  do {                                                                                        \
    const int moeplan_mpi_rc = (call);                                                        \
    if (moeplan_mpi_rc != MPI_SUCCESS) {                                                      \
      char moeplan_mpi_msg[MPI_MAX_ERROR_STRING] = {};                                        \
      int moeplan_mpi_len = 0;                                                                \
      MPI_Error_string(moeplan_mpi_rc, moeplan_mpi_msg, &moeplan_mpi_len);                    \
      std::fprintf(stderr, "moerun: MPI error: %s at %s:%d: %s\n", #call, __FILE__, __LINE__, \
                   moeplan_mpi_msg);                                                          \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                           \
    }                                                                                         \
  } while (0)
