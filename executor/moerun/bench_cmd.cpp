// `moerun bench --out DIR`: measures this machine for `moeplan calibrate` (GEMM, grouped GEMM, attention,
// STREAM, collectives; see executor/bench/bench.h), every rank at once under mpirun.
#include <fmt/format.h>
#include <mpi.h>

#include <memory>

#include "executor/bench/bench.h"
#include "executor/moerun/moerun_cli.h"
#include "executor/runtime/run_inputs.h"
#if MOERUN_WITH_CUDA
#include "executor/bench/cuda_bench.h"
#endif

namespace moeplan::executor::cli {
namespace {

// The plan's routed all-to-all as its lowering states it (the first expert-parallel all-to-all that is not
// DeepEP's or HybridEP's own exchange): its group and its busiest rank's load. size 0 when it has none.
Result<PlanExchange> plan_exchange(const std::string& path) {
  Result<RunInputs> in = load_run_inputs(path);
  if (!in) return in.error();
  PlanExchange x;
  x.plan = path;
  if (!in.value().violations.empty()) {
    const Violation& v = in.value().violations.front();
    return Error{fmt::format("--plan {}: the plan breaks {}: {}", path, v.rule, v.reason)};
  }
  for (const Op& op : in.value().graph.ops) {
    if (op.kind != OpKind::kCollective && op.kind != OpKind::kFusedGemmComm) continue;
    const CommSpec& c = op.comm;
    if (c.collective != Collective::kAllToAll || c.group != CommGroup::kEp || c.node_dedup) continue;
    x.size = c.group_size;
    x.stride = c.stride;
    x.hot_factor = c.hot_factor;
    x.bytes = static_cast<int64_t>(c.bytes / c.hot_factor);
    break;
  }
  return x;
}

}  // namespace

Runner add_bench(CLI::App& app) {
  struct Options {
    BenchOptions bench;
    std::string backend = "cpu";
    std::string base = "h100-sxm";
    std::string plan;
    double sustain_s = 60;
  };
  auto options = std::make_shared<Options>();
  app.add_option("--out", options->bench.out_dir, "directory for profile.json, *.csv and *_perf.n*.txt")
      ->required();
  app.add_flag("--quick", options->bench.quick, "few shapes, small arrays, small collectives");
  app.add_option("--name", options->bench.name, "profile name (default: cpu-<hostname> or gpu-<hostname>)");
  app.add_option(
         "--max-bytes", options->bench.max_bytes,
         "largest collective message in bytes (CPU: default 64 MiB, 64 KiB with --quick; CUDA: 1 GiB, "
         "1 MiB with --quick)")
      ->check(CLI::Range(int64_t{8}, int64_t{1} << 30));
  app.add_option(
         "--backend", options->backend,
         "cpu: Eigen kernels and MPI; cuda: cuBLASLt, CUTLASS, cuDNN and NCCL, one GPU per local rank")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option(
      "--base", options->base,
      "cuda: the hardware profile (file or built-in name) whose fields the bench cannot measure are "
      "kept, with their sources (default h100-sxm)");
  app.add_option(
         "--sustain-s", options->sustain_s,
         "cuda: seconds of back-to-back GEMMs between the two bursts of the sustained-rate measurement "
         "(gpu.sustained_rate in profile.json; default 60, 3 with --quick; 0 skips it)")
      ->check(CLI::Range(0.0, 3600.0));
  app.add_option("--plan", options->plan,
                 "also time the plan's own routed all-to-all (its expert-parallel group, at its busiest "
                 "rank's load and bytes) in alltoall_skew.csv");
  return [options](int world_rank, int /*world_size*/) {
    if (!options->plan.empty()) {
      Result<PlanExchange> x = plan_exchange(options->plan);
      if (!x) return bad_input(world_rank, x.error().message);
      options->bench.plan_exchange = x.value();
      if (x.value().size < 2 && world_rank == 0) {
        fmt::print(
            "moerun bench: --plan {}: no routed all-to-all the table prices (expert parallelism 1, or "
            "DeepEP / HybridEP / all-gather dispatch); the standard groups only\n",
            options->plan);
      }
    }
    Result<BenchSummary> result = Error{"unset"};
    if (options->backend == "cuda") {
#if MOERUN_WITH_CUDA
      result = run_cuda_bench({options->bench, options->base, options->sustain_s}, MPI_COMM_WORLD);
#else
      return bad_input(world_rank, "--backend cuda: this moerun was built without CUDA (nvcc not found)");
#endif
    } else {
      result = run_bench(options->bench, MPI_COMM_WORLD);
    }
    if (!result) return bad_input(world_rank, result.error().message);
    const BenchSummary& s = result.value();
    if (world_rank == 0) {
      fmt::print(
          "moerun bench: {:.1f} s; best GEMM {:.4f} TFLOP/s per rank; {} {:.2f} GB/s per rank; send/recv "
          "{:.2f} us (8 B), {:.2f} GB/s (largest); all_reduce busbw {:.2f} GB/s at 1 MiB, {:.2f} GB/s at the "
          "largest size; {} files in {}\n",
          s.seconds, s.best_gemm_tflops, options->backend == "cuda" ? "HBM copy" : "triad", s.triad_GBps,
          s.sendrecv_latency_us, s.sendrecv_bw_GBps, s.all_reduce_busbw_1MiB, s.all_reduce_busbw_max,
          s.files.size(), options->bench.out_dir);
    }
    return kExitOk;
  };
}

}  // namespace moeplan::executor::cli
