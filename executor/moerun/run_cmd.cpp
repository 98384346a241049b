// `moerun run PLAN --out DIR`: every rank lowers the plan with the simulator's lower(), runs its pipeline
// stage's ops for warm-up + measured steps (each step starts after a world barrier), and rank 0 writes the
// measured report and trace, atomically, after the last step. A watchdog ends the job when an op hangs.
// `--runner train` replaces the replay runner by the numerical training runner (train_runner.h): every step,
// warm-up steps included, trains, and the report gains the step losses.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <optional>

#include <fmt/format.h>

#include "executor/comm/mpi_check.h"
#include "executor/comm/process_groups.h"
#include "executor/moerun/moerun_cli.h"
#include "executor/runtime/fault.h"
#include "executor/runtime/measured_report.h"
#include "executor/runtime/replay_runner.h"
#include "executor/runtime/run_inputs.h"
#include "executor/runtime/stage_executor.h"
#include "executor/runtime/stage_schedule.h"
#include "executor/runtime/train_runner.h"
#include "executor/runtime/watchdog.h"
#include "simulator/io/op_trace.h"
#if MOERUN_WITH_CUDA
#include "executor/comm/nccl_groups.h"
#include "executor/kernels/cuda/check.h"
#include "executor/runtime/cuda_replay_runner.h"
#endif

namespace moeplan::executor::cli {

int bad_input(int world_rank, const std::string& message) {
  if (world_rank == 0) std::fprintf(stderr, "moerun: %s\n", message.c_str());
  return kExitBadInput;
}

namespace {

constexpr int kTimingTag = 7301;  // world-communicator tag of the per-stage timing transfer to rank 0

struct RunOptions {
  std::string plan, out;
  std::string runner = "replay";  // "replay" (shape-faithful work) or "train" (real training steps)
  std::string backend = "cpu";    // "cpu" (MPI + Eigen) or "cuda" (NCCL + the CUDA kernels)
  std::string dump_params;        // train: every parameter tensor after the last step, gathered on rank 0
  int steps = 5, warmup = 2;
  double watchdog_s = 120;
  bool host_sync = false;  // cuda: the host waits for each op (its time then excludes queueing behind others)
  bool cuda_graph = false;  // cuda: the step captured as a CUDA graph in the second step, replayed after
  std::string fused_kernels = "wmma";  // cuda: the fused ops' kernels, "wmma" or "cutlass" (push kernels)
  std::string routing = "drawn";       // replay: "drawn" from the plan's distribution each step, or "lowered"
  uint64_t routing_seed = 1;
};

// How the replay routes: the report's "routing" (its draw statistics are added after the steps, on rank 0)
// and, when it draws, what the runner draws from.
struct RoutingSetup {
  nlohmann::json report;
  std::optional<RoutingDrawSpec> spec;
};

RoutingSetup setup_routing(const RunOptions& o, const RunInputs& in, const RankLayout& layout, bool train,
                           bool on_gpu) {
  const Plan& plan = in.loaded.plan;
  const ModelSpec& model = in.loaded.model;
  RoutingSetup out;
  if (train) {
    out.report = {{"mode", "router"}, {"why", "the train runner routes with its model's own router"}};
    return out;
  }
  std::string why = routing_draw_unsupported(model, plan, in.lowering);
  if (why.empty() && on_gpu && plan.overlap.intra_op)
    why = "the CUDA backend's fused GEMM + communication kernels (they spread rows evenly)";
  if (why.empty() && o.cuda_graph && plan.experts.ep > 1)
    why = "--cuda-graph over more than one EP rank (a graph fixes the all-to-all counts and rows at capture)";
  if (why.empty() && o.routing == "lowered") why = "--routing lowered";
  if (!why.empty()) {
    out.report = {
        {"mode", "lowered"},
        {"why", why},
        {"rule", "every rank runs the rows the graph carries: the busiest EP rank's (expert_load_scale)"}};
    return out;
  }
  RoutingDrawSpec spec;
  spec.inclusion = inclusion_probabilities(in.routing, model.moe.top_k);
  spec.tokens_per_rank = routed_tokens_per_rank(plan);
  spec.ep = plan.experts.ep;
  spec.ep_rank = layout.of(CommGroup::kEp).index;
  spec.ep_group = layout.of(CommGroup::kEp).members.front();
  spec.stage = layout.stage;
  spec.run_seed = o.routing_seed;
  spec.lowered_rows =
      static_cast<double>(spec.tokens_per_rank * model.moe.top_k) * in.lowering.expert_load_scale;
  out.report = {
      {"mode", "drawn"},
      {"distribution", plan.routing.distribution},
      {"seed", o.routing_seed},
      {"tokens_per_rank", spec.tokens_per_rank},
      {"lowered_rows", spec.lowered_rows},
      {"rule",
       "each step, every EP group draws each MoE layer's and micro-batch's routing from the plan's "
       "distribution (seeded by group, layer, micro-batch and step, so its ranks agree); the expert GEMMs "
       "run each local expert's drawn rows and the EP all-to-alls the drawn counts. busiest_over_mean: "
       "the mean over draws of rank 0's EP group's busiest rank's rows over the mean rank's, beside the "
       "routing model's expected value that the prediction uses (expert_load_scale)"}};
  out.spec = spec;
  return out;
}

// Whether the graph has fused GEMM + communication ops that run on moerun's fused kernels.
bool plan_has_fused_ops(const OpGraph& g) {
  return std::any_of(g.ops.begin(), g.ops.end(),
                     [](const Op& op) { return op.kind == OpKind::kFusedGemmComm && !op.comm.userbuffers; });
}

// Flattened [start, end] pairs of `ops` for the ops of `stage` (in graph order).
std::vector<double> pack_stage(const OpGraph& g, int stage, const std::vector<OpTiming>& ops) {
  std::vector<double> v;
  for (const Op& op : g.ops) {
    if (op.stage != stage) continue;
    v.push_back(ops[static_cast<size_t>(op.id)].start);
    v.push_back(ops[static_cast<size_t>(op.id)].end);
  }
  return v;
}

void unpack_stage(const OpGraph& g, int stage, const std::vector<double>& v, std::vector<OpTiming>& ops) {
  size_t i = 0;
  for (const Op& op : g.ops) {
    if (op.stage != stage) continue;
    ops[static_cast<size_t>(op.id)] = {v[i], v[i + 1]};
    i += 2;
  }
}

// Every rank's own seconds per op summary row (its stage's rows; op times by op id), reduced over the world
// to rank 0: for each row, the least, the mean and the most over the `per_stage` ranks of the row's stage,
// with the ranks that took the least and the most. Rows of other stages enter the minimum as +inf and the
// maximum as -inf, so only the stage's own ranks count. Collective over the world; empty except on rank 0.
std::vector<OpRankSpread> gather_op_ranks(const OpGraph& g, const std::vector<OpTiming>& ops, int stage,
                                          int per_stage, int rank) {
  struct ValueRank {  // MPI_DOUBLE_INT's layout
    double value;
    int rank;
  };
  const std::vector<OpSummaryRow> rows = op_summary(g, ops);
  const size_t n = rows.size();
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::vector<ValueRank> lo(n), hi(n), lo_all(rank == 0 ? n : 0), hi_all(rank == 0 ? n : 0);
  std::vector<double> sum(n, 0.0), sum_all(rank == 0 ? n : 0);
  for (size_t i = 0; i < n; ++i) {
    const bool mine = rows[i].stage == stage;
    lo[i] = {mine ? rows[i].total_s : kInf, rank};
    hi[i] = {mine ? rows[i].total_s : -kInf, rank};
    sum[i] = mine ? rows[i].total_s : 0.0;
  }
  const int count = static_cast<int>(n);
  MOEPLAN_MPI_CHECK(
      MPI_Reduce(lo.data(), lo_all.data(), count, MPI_DOUBLE_INT, MPI_MINLOC, 0, MPI_COMM_WORLD));
  MOEPLAN_MPI_CHECK(
      MPI_Reduce(hi.data(), hi_all.data(), count, MPI_DOUBLE_INT, MPI_MAXLOC, 0, MPI_COMM_WORLD));
  MOEPLAN_MPI_CHECK(MPI_Reduce(sum.data(), sum_all.data(), count, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD));
  std::vector<OpRankSpread> out;
  if (rank != 0) return out;
  out.resize(n);
  for (size_t i = 0; i < n; ++i) {
    out[i] = {.min_s = lo_all[i].value,
              .mean_s = sum_all[i] / static_cast<double>(per_stage),
              .max_s = hi_all[i].value,
              .fastest_rank = lo_all[i].rank,
              .slowest_rank = hi_all[i].rank};
  }
  return out;
}

#if MOERUN_WITH_CUDA
// One GPU per local rank (device_for_rank), then a check across the node that no two ranks share one; ""
// when the device is set. Collective over the world.
std::string select_device(int rank) {
  const NodePlace place = node_place(MPI_COMM_WORLD);
  int devices = 0;
  MOERUN_CUDA_CHECK(cudaGetDeviceCount(&devices));
  const Result<int> device = device_for_rank(place, devices);
  // Every rank takes part in the gather below, so a rank without a device sends an empty id.
  char bus_id[32] = {};
  if (device) {
    MOERUN_CUDA_CHECK(cudaSetDevice(device.value()));
    MOERUN_CUDA_CHECK(cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, device.value()));
  }
  MPI_Comm node = MPI_COMM_NULL;
  MOEPLAN_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
  std::vector<char> all(sizeof bus_id * static_cast<size_t>(place.local_size));
  MOEPLAN_MPI_CHECK(
      MPI_Allgather(bus_id, sizeof bus_id, MPI_CHAR, all.data(), sizeof bus_id, MPI_CHAR, node));
  MOEPLAN_MPI_CHECK(MPI_Comm_free(&node));
  if (!device) return "--backend cuda: " + device.error().message;
  std::vector<std::string> ids;
  for (int r = 0; r < place.local_size; ++r) ids.emplace_back(all.data() + r * sizeof bus_id);
  const std::string shared = shared_device_error(ids);
  return shared.empty() ? "" : "--backend cuda: " + shared;
}
#endif

int run_plan(const RunOptions& o, int rank, int world) {
  Result<std::optional<Fault>> fault = parse_fault(std::getenv("MOERUN_FAULT"));
  if (!fault) return bad_input(rank, fault.error().message);
  Result<RunInputs> loaded = load_run_inputs(o.plan);
  if (!loaded) return bad_input(rank, loaded.error().message);
  const RunInputs& in = loaded.value();
  const Plan& plan = in.loaded.plan;
  if (!in.violations.empty()) {
    if (rank == 0) {
      std::fprintf(stderr, "moerun: %s: the plan cannot run, %zu rule(s) broken:\n", in.loaded.path.c_str(),
                   in.violations.size());
      for (const auto& v : in.violations)
        std::fprintf(stderr, "  %s: %s\n", v.rule.c_str(), v.reason.c_str());
    }
    return kExitInfeasible;
  }
  if (world != plan.gpus) {
    return bad_input(rank, fmt::format("world size {} != plan gpus {} (start with mpirun -np {})", world,
                                       plan.gpus, plan.gpus));
  }
  const bool train = o.runner == "train";
  if (!train && !o.dump_params.empty()) return bad_input(rank, "--dump-params needs --runner train");
  const bool on_gpu = o.backend == "cuda";
  if (o.host_sync && !on_gpu) return bad_input(rank, "--host-sync needs --backend cuda");
  if (o.cuda_graph && !on_gpu) return bad_input(rank, "--cuda-graph needs --backend cuda");
  if (o.cuda_graph && o.host_sync) return bad_input(rank, "--cuda-graph and --host-sync exclude each other");
  if (o.fused_kernels != "wmma" && !on_gpu) return bad_input(rank, "--fused-kernels needs --backend cuda");
  if (o.cuda_graph && o.warmup < 2)
    return bad_input(rank,
                     "--cuda-graph needs --warmup 2 or more (the first step makes the kernels, the second is "
                     "captured, so the measured steps replay the graph)");
  if (o.cuda_graph && plan.overlap.intra_op) {
    if (rank == 0)
      std::fprintf(stderr,
                   "moerun: %s: --cuda-graph does not support the fused GEMM + communication kernels "
                   "(intra-operator overlap: their signal epochs are host arguments a graph would fix)\n",
                   in.loaded.path.c_str());
    return kExitInfeasible;
  }
#if MOERUN_WITH_CUDA
  if (on_gpu) {
    if (train) {
      if (rank == 0)
        std::fprintf(stderr, "moerun: --backend cuda has the replay runner only (--runner replay)\n");
      return kExitInfeasible;
    }
    if (const std::string why = cuda_unsupported(plan, in.loaded.model); !why.empty()) {
      if (rank == 0)
        std::fprintf(stderr, "moerun: %s: the CUDA replay does not support %s\n", in.loaded.path.c_str(),
                     why.c_str());
      return kExitInfeasible;
    }
    if (const std::string why = cuda::device_unavailable(); !why.empty())
      return bad_input(rank, fmt::format("--backend cuda: no CUDA device ({})", why));
    // Every rank learns whether any rank failed; the lowest failing rank says why.
    const std::string why = select_device(rank);
    int first_bad = why.empty() ? world : rank;
    MOEPLAN_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &first_bad, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
    if (first_bad < world) {
      if (rank == first_bad) std::fprintf(stderr, "moerun: rank %d: %s\n", rank, why.c_str());
      return kExitBadInput;
    }
  }
#else
  if (on_gpu) return bad_input(rank, "--backend cuda: this moerun was built without CUDA (MOEPLAN_CUDA=OFF)");
#endif
  if (train) {
    std::string why = train_unsupported(plan, in.loaded.model);
    if (why.empty() && in.lowering.dispatcher != DispatcherKind::kFused)
      why = "the token dispatcher of stack " + plan.stack + " (it trains moerun's fused dispatch)";
    if (!why.empty()) {
      if (rank == 0)
        std::fprintf(stderr, "moerun: %s: the train runner does not support %s\n", in.loaded.path.c_str(),
                     why.c_str());
      return kExitInfeasible;
    }
  }
  Result<ProcessGroups> made = make_process_groups(plan, MPI_COMM_WORLD);
  if (!made) return bad_input(rank, made.error().message);
  ProcessGroups& groups = made.value();
  const OpGraph& graph = in.graph;
  const int stage = groups.layout().stage;
  const StageSchedule schedule = schedule_stage(graph, stage);
  const GroupLookup lookup = [&groups](CommGroup g) -> Communicator* {
    if (g == CommGroup::kNone) return nullptr;
    Communicator& c = groups.of(g);
    return c.size() > 1 ? &c : nullptr;
  };
#if MOERUN_WITH_CUDA
  std::optional<NcclGroups> nccl;  // declared before the runner: outlives its symmetric windows
#endif
  std::unique_ptr<OpRunner> runner_ptr;
  TrainRunner* trainer = nullptr;
  ReplayRunner* replay = nullptr;
  if (train) {
    const RankLayout& lay = groups.layout();
    TrainPlace place;
    place.world_rank = rank;
    place.stage = stage;
    place.tp = lay.of(CommGroup::kTp).index;
    place.sp = lay.of(CommGroup::kSp).index;
    place.cp = lay.of(CommGroup::kCp).index;
    place.dp = lay.of(CommGroup::kDp).index;
    place.ep = lay.of(CommGroup::kEp).index;
    place.etp = lay.of(CommGroup::kEtp).index;
    place.attn_replica = lay.of(CommGroup::kAttnReplica).index;
    place.expert_dp = lay.of(CommGroup::kExpertDp).index;
    const GroupLookup internal = [&groups](CommGroup g) -> Communicator* {
      Communicator& c = groups.internal(g);
      return g == CommGroup::kNone || c.size() > 1 ? &c : nullptr;
    };
    auto t =
        std::make_unique<TrainRunner>(graph, plan, in.loaded.model, place, lookup, internal, groups.world());
    trainer = t.get();
    runner_ptr = std::move(t);
  } else if (!on_gpu) {
    auto r = std::make_unique<ReplayRunner>(graph, lookup);
    replay = r.get();
    runner_ptr = std::move(r);
  }
#if MOERUN_WITH_CUDA
  // The GPU backend: NCCL communicators of the same groups (MPI carries the unique id), the CUDA replay.
  CudaReplayRunner* gpu_runner = nullptr;
  if (on_gpu) {
    const std::vector<std::pair<int, int>> links = pipeline_links(graph);
    Result<NcclGroups> made_nccl = make_nccl_groups(groups.layout(), MPI_COMM_WORLD, links);
    if (!made_nccl) return bad_input(rank, made_nccl.error().message);
    nccl.emplace(std::move(made_nccl.value()));
    const DeviceGroupLookup device_lookup = [&nccl](CommGroup g) -> DeviceCommunicator* {
      if (g == CommGroup::kNone) return nullptr;
      NcclCommunicator& c = nccl->of(g);
      return c.size() > 1 ? &c : nullptr;
    };
    const PipelineLinkLookup link_lookup = [&nccl, &graph](const Op& send) -> DeviceCommunicator* {
      return nccl->link(send.stage, pipeline_peer_stage(graph, send));
    };
    auto r = std::make_unique<CudaReplayRunner>(device_lookup, graph, stage,
                                                o.host_sync    ? CudaReplayRunner::Mode::kHostSync
                                                : o.cuda_graph ? CudaReplayRunner::Mode::kGraph
                                                               : CudaReplayRunner::Mode::kEnqueue,
                                                link_lookup,
                                                o.fused_kernels == "cutlass"
                                                    ? CudaReplayRunner::FusedKernels::kCutlassPush
                                                    : CudaReplayRunner::FusedKernels::kWmma);
    gpu_runner = r.get();
    runner_ptr = std::move(r);
  }
#endif
  OpRunner& runner = *runner_ptr;
  RoutingSetup routing_setup = setup_routing(o, in, groups.layout(), train, on_gpu);
  nlohmann::json& routing = routing_setup.report;
  std::function<RoutingDraws::Stats()> routing_stats;
  if (routing_setup.spec && replay != nullptr) {
    replay->draw_routing(*routing_setup.spec);
    routing_stats = [replay] { return replay->routing_stats(); };
  }
#if MOERUN_WITH_CUDA
  if (routing_setup.spec && gpu_runner != nullptr) {
    gpu_runner->draw_routing(*routing_setup.spec);
    routing_stats = [gpu_runner] { return gpu_runner->routing_stats(); };
  }
#endif

  // Slots: one per lane, then one for this command's own world-communicator work.
  const int lanes = static_cast<int>(schedule.lanes.size());
  Watchdog watchdog(o.watchdog_s, lanes + 1, [rank](const std::string& what, double s) {
    std::fprintf(stderr, "moerun: rank %d: %s has not completed after %g s; aborting\n", rank, what.c_str(),
                 s);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  });
  const int own_slot = lanes;
  std::optional<Fault> my_fault;
  if (fault.value() && fault.value()->rank == rank) my_fault = fault.value();
  StageExecutor executor(graph, schedule, runner, rank, &watchdog, 0, my_fault);

  // Steps: warm-up, then measured. Each rank keeps its stage's timings of the measured steps.
  std::vector<StepTiming> measured;
  std::vector<double> losses;  // train: one per step run, warm-up steps included
  for (int step = 0; step < o.warmup + o.steps; ++step) {
    watchdog.begin(own_slot, [step] { return fmt::format("world barrier before step {}", step); });
    MOEPLAN_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    watchdog.end(own_slot);
    StepTiming t = executor.run_step();
    if (trainer != nullptr) {
      watchdog.begin(own_slot, [step] { return fmt::format("summing the loss of step {}", step); });
      losses.push_back(trainer->finish_step().total);
      watchdog.end(own_slot);
    }
    if (step >= o.warmup) measured.push_back(std::move(t));
  }

  watchdog.begin(own_slot, [] { return std::string("gathering the measured timings on rank 0"); });
  // Step time: the slowest rank's span, per measured step.
  std::vector<double> spans, step_times(measured.size());
  for (const StepTiming& t : measured) spans.push_back(t.span_s);
  MOEPLAN_MPI_CHECK(MPI_Allreduce(spans.data(), step_times.data(), static_cast<int>(spans.size()), MPI_DOUBLE,
                                  MPI_MAX, MPI_COMM_WORLD));
  // The trace shows the measured step of median time (same index on every rank).
  std::vector<size_t> order(step_times.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return step_times[a] < step_times[b]; });
  const size_t median = order[order.size() / 2];
  // Mean start / end of each op over the measured steps.
  std::vector<OpTiming> mean(graph.ops.size());
  for (const StepTiming& t : measured) {
    for (size_t i = 0; i < mean.size(); ++i) {
      mean[i].start += t.ops[i].start / static_cast<double>(measured.size());
      mean[i].end += t.ops[i].end / static_cast<double>(measured.size());
    }
  }
  double hwm = process_high_water_bytes(), hwm_max = 0;
#if MOERUN_WITH_CUDA
  if (gpu_runner != nullptr) hwm = gpu_runner->device_high_water_bytes();  // device memory, not host RSS
#endif
  MOEPLAN_MPI_CHECK(MPI_Reduce(&hwm, &hwm_max, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD));
  // Every rank's own mean step (skew and stragglers in the report), gathered on rank 0.
  double my_step = 0;
  for (const double s : spans) my_step += s / static_cast<double>(spans.size());
  std::vector<double> rank_steps(rank == 0 ? static_cast<size_t>(world) : 0);
  MOEPLAN_MPI_CHECK(MPI_Gather(&my_step, 1, MPI_DOUBLE, rank_steps.data(), 1, MPI_DOUBLE, 0, MPI_COMM_WORLD));
  // Each stage's representative rank (its lowest world rank) sends its timings to rank 0.
  const int per_stage = static_cast<int>(plan.gpus / plan.pipeline.pp);
  const std::vector<OpRankSpread> op_ranks = gather_op_ranks(graph, mean, stage, per_stage, rank);
  std::vector<int> representatives;
  for (int s = 0; s < graph.num_stages; ++s) representatives.push_back(s * per_stage);
  std::vector<OpTiming> all_mean(graph.ops.size()), all_trace(graph.ops.size());
  if (rank == 0) {
    unpack_stage(graph, 0, pack_stage(graph, 0, mean), all_mean);
    unpack_stage(graph, 0, pack_stage(graph, 0, measured[median].ops), all_trace);
    for (int s = 1; s < graph.num_stages; ++s) {
      for (auto* target : {&all_mean, &all_trace}) {
        std::vector<double> v(pack_stage(graph, s, mean).size());
        MOEPLAN_MPI_CHECK(MPI_Recv(v.data(), static_cast<int>(v.size()), MPI_DOUBLE, representatives[s],
                                   kTimingTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
        unpack_stage(graph, s, v, *target);
      }
    }
  } else if (rank == representatives[static_cast<size_t>(stage)]) {
    for (const auto* source : {&mean, &measured[median].ops}) {
      std::vector<double> v = pack_stage(graph, stage, *source);
      MOEPLAN_MPI_CHECK(
          MPI_Send(v.data(), static_cast<int>(v.size()), MPI_DOUBLE, 0, kTimingTag, MPI_COMM_WORLD));
    }
  }
  int code = kExitOk;
  if (trainer != nullptr && !o.dump_params.empty()) {
    Result<bool> d = trainer->dump_params(o.dump_params);
    if (!d) code = bad_input(rank, d.error().message);
  }
  watchdog.end(own_slot);

  if (rank == 0 && code == kExitOk) {
    MeasuredRun run;
    run.warmup = o.warmup;
    run.step_times_s = step_times;
    run.ops = all_mean;
    run.representative_ranks = representatives;
    run.backend = o.backend;
    run.high_water_bytes = hwm_max;
    run.world_size = world;
    run.rank_step_s = rank_steps;
    run.op_ranks = op_ranks;
    nlohmann::json report = measured_report_json(in, run);
    report["runner"] = o.runner;
    report["backend"] = o.backend;
    if (on_gpu)
      report["cuda_ops"] =
          o.host_sync    ? "host-sync: the host waits for each op"
          : o.cuda_graph ? "graph: the second step captured as a CUDA graph, launched once per step after"
                         : "enqueued: one host wait per step";
    if (on_gpu && plan_has_fused_ops(in.graph))
      report["cuda_fused_kernels"] =
          o.fused_kernels == "cutlass"
              ? "cutlass: the CUTLASS kernels for grouped GEMM + reduce-scatter, GEMM + all-to-all and "
                "all-gather + grouped GEMM, the wmma tile kernel for all-to-all + GEMM"
              : "wmma: the fused tile kernels (fused_gemm_comm.h)";
#if MOERUN_WITH_CUDA
    if (gpu_runner != nullptr) {
      // Rank 0's count; every rank of a stage runs the same ops.
      report["cuda_memory_bound"] = {
          {"kernel_ops_per_step",
           static_cast<double>(gpu_runner->kernel_memory_ops()) / static_cast<double>(o.warmup + o.steps)},
          {"rule",
           "memory-bound ops whose lowering states their tensor run the project's kernels at that shape "
           "(RMSNorm, SwiGLU, RoPE, the fused cross-entropy, the router's forward, the token permute and "
           "unpermute), and the optimizer the project's Adam step over the shard's parameters (fp32 master "
           "weights, gradients and moments, the bf16 weight copy); the others copy their bytes device to "
           "device"}};
      const std::array<double, 3> params = gpu_runner->parameter_bytes();
      report["cuda_parameters"] = {
          {"weight_bytes", params[0]},
          {"main_grad_bytes", params[1]},
          {"fp8_weight_bytes", params[2]},
          {"rule",
           "each GEMM reads its weight and accumulates its weight gradient at the weight's own place in the "
           "stage's real-sized parameter buffers (bf16 weights, fp32 main gradients, e4m3 copies for FP8 "
           "GEMMs), which the optimizer steps"}};
      const std::array<double, 2> acts = gpu_runner->activation_stashes();
      report["cuda_activations"] = {
          {"stash_bytes", acts[0]},
          {"stashes", acts[1]},
          {"rule",
           "each forward GEMM's input (bf16, or e4m3 for an FP8 dense GEMM), each attention's q, k, v, "
           "output and softmax statistics, each RMSNorm's input and inverse RMS and each SwiGLU's input lie "
           "in their micro-batch's stash, which the backward of that micro-batch reads; a stage holds a "
           "stash per micro-batch of each chunk in flight (forward run, backward not), reused as "
           "micro-batches finish. A tensor two forwards keep is kept once: a norm, SwiGLU or bf16 GEMM "
           "writes its output where the forward reading it keeps it, and the output projection reads the "
           "attention's output in the attention's place. Routing, permutes, RoPE and the loss keep theirs "
           "in scratch buffers each stream reuses and recomputed forwards keep nothing, so the device "
           "high-water holds the parameters, gradients, optimizer state and those activations"}};
      report["cuda_fp8_gemms"] = {
          {"ops_per_step",
           static_cast<double>(gpu_runner->fp8_gemm_ops()) / static_cast<double>(o.warmup + o.steps)},
          {"rule",
           "an FP8 plan's dense GEMMs run as cuBLASLt e4m3 GEMMs (TN, per-tensor scales; weight gradients "
           "into the fp32 main gradient) and its grouped expert GEMMs' forward and data gradient as "
           "CUTLASS's e4m3 grouped GEMM, each after the project's quantiser over its input (128-value "
           "blocks) and a copy of the rest of the recipe's cast bytes; expert weight gradients and shapes "
           "the kernels refuse run in bf16"}};
    }
#endif
    if (train) report["losses"] = losses;
    if (routing["mode"] == "drawn" && routing_stats) {
      const RoutingDraws::Stats st = routing_stats();
      routing["draws"] = st.draws;
      routing["busiest_over_mean"] = {{"drawn", st.busiest_over_mean},
                                      {"predicted", in.lowering.expert_load_scale}};
      routing["ep_rank_rows"] = st.ep_rank_rows;
    }
    report["routing"] = routing;
    std::error_code ec;
    std::filesystem::create_directories(o.out, ec);
    Result<bool> w = write_file_atomic((std::filesystem::path(o.out) / "trace.json").string(),
                                       chrome_trace(graph, all_trace));
    if (w)
      w = write_file_atomic((std::filesystem::path(o.out) / "report.json").string(), report.dump(2) + "\n");
    if (!w) {
      code = bad_input(rank, w.error().message);
    } else {
      const nlohmann::json& ranks = report["ranks"];
      // The compute op whose ranks differ most, when any do: where a rank is slow.
      std::string widest;
      if (report.contains("op_rank_skew") && !report["op_rank_skew"]["compute"].empty()) {
        const nlohmann::json& row = report["op_rank_skew"]["compute"][0];
        widest = fmt::format(
            " | widest compute spread: {} ({}) on stage {}, {:.3f} ms per step (rank {} slowest)",
            row["op"].get<std::string>(), row["phase"].get<std::string>(), row["stage"].get<int>(),
            1e3 * row["spread_s"].get<double>(), row["slowest_rank"].get<int>());
      }
      // Drawn routing: how much busier the busiest EP rank was than the mean, beside the prediction's.
      std::string drawn;
      if (routing["mode"] == "drawn" && routing.contains("busiest_over_mean")) {
        drawn = fmt::format(" | routing drawn: busiest EP rank {:.3f}x the mean (predicted {:.3f}x)",
                            routing["busiest_over_mean"]["drawn"].get<double>(),
                            routing["busiest_over_mean"]["predicted"].get<double>());
      }
      std::printf(
          "moerun: %s: step %.4f s (mean of %d steps after %d warm-up) | %.0f tokens/s | rank skew %.3f "
          "(slowest rank %d, %zu straggler(s))%s%s | %s\n",
          in.loaded.path.c_str(), report["step_time_s"].get<double>(), o.steps, o.warmup,
          report["tokens_per_s"].get<double>(), ranks["skew"].get<double>(), ranks["slowest_rank"].get<int>(),
          ranks["stragglers"].size(), widest.c_str(), drawn.c_str(),
          (std::filesystem::path(o.out) / "report.json").c_str());
    }
  }
  MOEPLAN_MPI_CHECK(MPI_Bcast(&code, 1, MPI_INT, 0, MPI_COMM_WORLD));
  return code;
}

}  // namespace

Runner add_run(CLI::App& app) {
  auto o = std::make_shared<RunOptions>();
  app.add_option("plan", o->plan, "Plan file (JSON)")->required();
  app.add_option("--steps", o->steps, "Measured training steps")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  app.add_option("--warmup", o->warmup, "Warm-up steps before the measured ones")
      ->capture_default_str()
      ->check(CLI::Range(0, 100000));
  app.add_option("--out", o->out, "Directory for report.json and trace.json (written after the last step)")
      ->required();
  app.add_option("--runner", o->runner,
                 "replay: work of each op's shape; train: real training steps of the plan's model (fp32), "
                 "losses in report.json")
      ->capture_default_str()
      ->check(CLI::IsMember({"replay", "train"}));
  app.add_option("--backend", o->backend,
                 "cpu: MPI ranks with Eigen kernels; cuda: one GPU per rank, NCCL and the CUDA kernels "
                 "(replay runner)")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_flag(
      "--host-sync", o->host_sync,
      "With --backend cuda: the host waits for each op before the next (one op at a time on the GPU, "
      "each op's time its own); by default ops are enqueued on their streams with events for "
      "dependencies and the host waits once per step");
  app.add_flag("--cuda-graph", o->cuda_graph,
               "With --backend cuda: capture the second step as a CUDA graph and launch it once per later "
               "step (no host work per op; needs --warmup 2 or more; not with fused kernels; routing is "
               "drawn only on one EP rank)");
  app.add_option(
         "--fused-kernels", o->fused_kernels,
         "With --backend cuda: the fused GEMM + communication ops' kernels: wmma (the tile kernels the "
         "moerun stack is priced from) or cutlass (CUTLASS's grouped kernel: with the peers' buffers as "
         "its outputs for grouped GEMM + reduce-scatter and GEMM + all-to-all, chunk by chunk behind "
         "the gathers for all-gather + grouped GEMM)")
      ->capture_default_str()
      ->check(CLI::IsMember({"wmma", "cutlass"}));
  app.add_option("--dump-params", o->dump_params,
                 "With --runner train: write every parameter tensor after the last step to this file "
                 "(format in executor/runtime/train_runner.h)");
  app.add_option("--routing", o->routing,
                 "Replay: drawn: each step draws every EP group's routing from the plan's distribution, so "
                 "each rank runs the expert rows it received; lowered: every rank runs the busiest rank's "
                 "rows, as the op graph carries them")
      ->capture_default_str()
      ->check(CLI::IsMember({"drawn", "lowered"}));
  app.add_option("--routing-seed", o->routing_seed, "Replay with --routing drawn: the run's seed")
      ->capture_default_str();
  app.add_option("--watchdog-s", o->watchdog_s,
                 "Seconds an op (or barrier) may run before the job is aborted with its name")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  return [o](int rank, int world) { return run_plan(*o, rank, world); };
}

}  // namespace moeplan::executor::cli
