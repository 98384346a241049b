// moerun bench --backend cuda: measures this node's GPUs with the kernels moerun runs, one GPU per MPI rank,
// and writes the folder `moeplan calibrate --sources` turns into a hardware profile:
//   gemm.csv          cuBLASLt GEMMs (executor/kernels/cuda/gemm.h), BF16 and FP8 (e4m3, TN), m x n x k;
//   grouped_gemm.csv  CUTLASS's grouped GEMM (grouped_gemm.h) over E experts of m rows each, [m, k] x [k, n];
//   attention.csv     cuDNN flash attention (attention.h), forward and backward, causal and full, per head
//   dim; hbm.csv           device-to-device copies (cudaMemcpyAsync) of 1 GiB: read + write bytes over time;
//   <collective>_perf.n<g>.txt  nccl-tests-format sweeps of moerun's NCCL communicator over the first g ranks
//                     (g = 2, 4, ... and the world): all_reduce, all_gather, reduce_scatter, alltoall,
//                     sendrecv;
//   profile.json      the base profile's gpu, node and scale_out fields, with what this bench measured put in
//                     their place (sm_count, HBM capacity and achieved bandwidth) and every other field's
//                     source saying it comes from the base.
// Timing: CUDA events around a batch of launches on one stream after warm-up, the median of the batches; each
// rank's figure, then the mean over ranks (collectives: the slowest rank's time per iteration, as
// nccl-tests). Compiled with the CUDA backend only; it has never run on a GPU (issue 17).
#pragma once

#include <mpi.h>

#include <string>

#include "executor/bench/bench.h"
#include "simulator/core/status.h"

namespace moeplan::executor {

struct CudaBenchOptions {
  BenchOptions bench;  // out_dir, name (default "gpu-" + hostname), quick, max_bytes
  // The hardware profile whose fields this bench cannot measure are kept (with their sources): a file or a
  // built-in name (h100-sxm, h200-sxm, h800-sxm).
  std::string base = "h100-sxm";
  // Seconds of back-to-back GEMMs before the sustained rate's second burst (gpu.sustained_rate); 0 skips the
  // measurement. --quick: 3.
  double sustain_s = 60;
};

// Collective over `world`; each rank must see a CUDA device (one per local rank, as `moerun run`).
Result<BenchSummary> run_cuda_bench(const CudaBenchOptions& options, MPI_Comm world);

}  // namespace moeplan::executor
