// Executes one rank's stage of the op graph for one training step: a worker thread per lane runs its tasks in
// order, each task starting once its dependencies have ended, and records when each op started and ended.
// With an enqueuing runner (OpRunner::enqueues, the CUDA replay) a task's end is its enqueue: the runner is
// told each dependency to order on the device, and the op times are the device's, read after the step. A
// runner that replays a captured step (OpRunner::replays_step) is only opened and closed.
#pragma once

#include <optional>
#include <vector>

#include "executor/runtime/fault.h"
#include "executor/runtime/op_runner.h"
#include "executor/runtime/stage_schedule.h"
#include "executor/runtime/watchdog.h"
#include "simulator/core/op_graph.h"

namespace moeplan::executor {

struct StepTiming {
  std::vector<OpTiming> ops;  // by op id, seconds from the step's start; ops of other stages stay {0, 0}
  double span_s = 0;          // the last task's end (this rank's step time)
};

class StageExecutor {
 public:
  // `watchdog` (optional) gets slots [watchdog_slot0, watchdog_slot0 + lanes); `fault` is this rank's
  // injected fault, if any. All references must outlive the executor.
  StageExecutor(const OpGraph& graph, const StageSchedule& schedule, OpRunner& runner, int world_rank,
                Watchdog* watchdog = nullptr, int watchdog_slot0 = 0, std::optional<Fault> fault = {});

  // Runs every task of the stage once; the step's clock starts after the runner's prepare_step().
  StepTiming run_step();

  int lanes() const { return static_cast<int>(schedule_.lanes.size()); }

 private:
  void inject(const Op& op);

  const OpGraph& graph_;
  const StageSchedule& schedule_;
  OpRunner& runner_;
  int world_rank_;
  Watchdog* watchdog_;
  int watchdog_slot0_;
  std::optional<Fault> fault_;
};

}  // namespace moeplan::executor
