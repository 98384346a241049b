// One step of one stage on lane threads (see stage_executor.h). Dependencies are per-task atomic flags waited
// on with C++20 atomic wait / notify.
#include "executor/runtime/stage_executor.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include <fmt/format.h>

namespace moeplan::executor {

StageExecutor::StageExecutor(const OpGraph& graph, const StageSchedule& schedule, OpRunner& runner,
                             int world_rank, Watchdog* watchdog, int watchdog_slot0,
                             std::optional<Fault> fault)
    : graph_(graph),
      schedule_(schedule),
      runner_(runner),
      world_rank_(world_rank),
      watchdog_(watchdog),
      watchdog_slot0_(watchdog_slot0),
      fault_(std::move(fault)) {}

void StageExecutor::inject(const Op& op) {
  if (!fault_ || op_label(op) != fault_->op) return;
  if (fault_->kind == Fault::Kind::kCrash) {
    std::fprintf(stderr, "moerun: rank %d: injected crash at op %s (MOERUN_FAULT)\n", world_rank_,
                 fault_->op.c_str());
    std::fflush(stderr);
    std::abort();
  }
  if (fault_->kind == Fault::Kind::kSlow) {
    std::this_thread::sleep_for(std::chrono::microseconds(fault_->delay_us));
    return;
  }
  std::fprintf(stderr, "moerun: rank %d: injected hang at op %s (MOERUN_FAULT)\n", world_rank_,
               fault_->op.c_str());
  std::fflush(stderr);
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));  // ended by the watchdog's abort
}

StepTiming StageExecutor::run_step() {
  using Clock = std::chrono::steady_clock;
  const size_t n = schedule_.tasks.size();
  auto done = std::make_unique<std::atomic<uint8_t>[]>(n);
  for (size_t i = 0; i < n; ++i) done[i].store(0, std::memory_order_relaxed);
  StepTiming out;
  out.ops.assign(graph_.ops.size(), OpTiming{});
  std::vector<double> task_end(n, 0.0);
  const bool enqueues = runner_.enqueues();
  runner_.prepare_step();
  const Clock::time_point t0 = Clock::now();
  auto seconds = [t0] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  // A runner that replays a captured step runs it between begin_step() and end_step(); no lane enqueues.
  const bool replays = enqueues && runner_.replays_step();
  if (enqueues) runner_.begin_step();

  auto lane_main = [&](int lane) {
    const int slot = watchdog_slot0_ + lane;
    for (int32_t ti : schedule_.lanes[static_cast<size_t>(lane)]) {
      const StageTask& task = schedule_.tasks[static_cast<size_t>(ti)];
      for (int32_t d : task.deps) {
        std::atomic<uint8_t>& flag = done[static_cast<size_t>(d)];
        while (flag.load(std::memory_order_acquire) == 0) flag.wait(0, std::memory_order_acquire);
      }
      const Op& op = graph_.ops[static_cast<size_t>(task.op)];
      // An enqueuing runner's dependency has only been enqueued: the runner orders the two on the device.
      if (enqueues && !task.receive) {
        for (int32_t d : task.deps) {
          const StageTask& dep = schedule_.tasks[static_cast<size_t>(d)];
          const Op& dep_op = graph_.ops[static_cast<size_t>(dep.op)];
          if (dep.receive) {
            runner_.after_receive(op, dep_op);
          } else {
            runner_.after(op, dep_op);
          }
        }
      }
      if (watchdog_ != nullptr) {
        const int stage = schedule_.stage;
        const bool receive = task.receive;
        watchdog_->begin(slot, [&op, stage, receive] {
          return receive
                     ? fmt::format("op {} receive (stage {}, micro-batch {})", op_label(op), stage,
                                   op.micro_batch)
                     : fmt::format("op {} (stage {}, micro-batch {})", op_label(op), stage, op.micro_batch);
        });
      }
      const double start = seconds();
      if (task.receive) {
        runner_.receive(op);
      } else {
        inject(op);
        runner_.run(op);
      }
      const double end = seconds();
      if (watchdog_ != nullptr) watchdog_->end(slot);
      if (!task.receive && !enqueues) {
        // A device clock times the op on its stream: its interval ends when the host saw it end and lasts as
        // long as the device says, without the host's wait for completion (the enqueue is still in it).
        const double device = runner_.device_seconds(op);
        const double begin = device >= 0 && device < end - start ? end - device : start;
        out.ops[static_cast<size_t>(op.id)] = {begin, end};
      }
      task_end[static_cast<size_t>(ti)] = end;
      done[static_cast<size_t>(ti)].store(1, std::memory_order_release);
      done[static_cast<size_t>(ti)].notify_all();
    }
  };
  if (!replays) {
    std::vector<std::thread> threads;
    threads.reserve(schedule_.lanes.size());
    for (size_t lane = 0; lane < schedule_.lanes.size(); ++lane)
      threads.emplace_back(lane_main, static_cast<int>(lane));
    for (std::thread& t : threads) t.join();
  }
  if (!enqueues) {
    for (double e : task_end) out.span_s = std::max(out.span_s, e);
  } else {
    // Everything is enqueued; the step ends when the device has run it. Op times come from the device.
    if (watchdog_ != nullptr)
      watchdog_->begin(watchdog_slot0_,
                       [] { return std::string("the end of the step (waiting for the device)"); });
    runner_.end_step();
    if (watchdog_ != nullptr) watchdog_->end(watchdog_slot0_);
    out.span_s = seconds();
    for (const StageTask& task : schedule_.tasks) {
      if (!task.receive)
        out.ops[static_cast<size_t>(task.op)] = runner_.interval(graph_.ops[static_cast<size_t>(task.op)]);
    }
  }
  return out;
}

}  // namespace moeplan::executor
