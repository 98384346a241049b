// Tests of one stage's step on lane threads (executor/runtime/stage_executor.h), single process: a runner
// that sleeps a fixed time per op stands in for real work, so ordering and overlap are visible in the
// timings.
#include "executor/runtime/stage_executor.h"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>

#include "tests/executor/runtime/runtime_fixtures.h"

namespace moeplan::executor {
namespace {

class SleepRunner final : public OpRunner {
 public:
  void run(const Op& op) override {
    ops.fetch_add(1);
    {
      std::lock_guard<std::mutex> lock(mutex);
      threads[static_cast<int>(op.stream)].insert(std::this_thread::get_id());
    }
    std::this_thread::sleep_for(std::chrono::microseconds(op.kind == OpKind::kCollective ? 300 : 100));
  }
  void receive(const Op&) override { receives.fetch_add(1); }
  std::atomic<int> ops{0}, receives{0};
  std::mutex mutex;
  std::set<std::thread::id> threads[kNumStreams];  // the threads that ran each stream's ops
};

// Sleeps 1 ms per op and reports a device clock's `device` seconds for it, as the CUDA runner does with
// events around the op's work.
class DeviceClockRunner final : public OpRunner {
 public:
  explicit DeviceClockRunner(double device) : device_(device) {}
  void run(const Op&) override { std::this_thread::sleep_for(std::chrono::milliseconds(1)); }
  void receive(const Op&) override {}
  double device_seconds(const Op&) const override { return device_; }

 private:
  double device_;
};

}  // namespace

TEST_SUITE("executor_runtime") {
  TEST_CASE("an op timed by a device clock lasts the device's time and ends when the host saw it end") {
    const RunInputs in = test::load_tiny("exec_dp2", test::tiny_plan(2, test::kDp2Ep2));
    const OpGraph& g = in.graph;
    const StageSchedule s = schedule_stage(g, 0);
    DeviceClockRunner runner(250e-6);
    StageExecutor ex(g, s, runner, 0);
    const StepTiming t = ex.run_step();
    for (const Op& op : g.ops) {
      const OpTiming& o = t.ops[static_cast<size_t>(op.id)];
      CHECK(o.end - o.start == doctest::Approx(250e-6).epsilon(1e-6));
      for (int32_t d : g.deps_of(op)) CHECK(o.start >= t.ops[static_cast<size_t>(d)].end);
    }
    // The step is still the host's: every op's 1 ms sleep is in it.
    CHECK(t.span_s >= 1e-3 * static_cast<double>(g.ops.size()) / kNumStreams);
  }

  TEST_CASE("a device time longer than the host's interval around the op is not believed") {
    const RunInputs in = test::load_tiny("exec_dp2", test::tiny_plan(2, test::kDp2Ep2));
    const OpGraph& g = in.graph;
    const StageSchedule s = schedule_stage(g, 0);
    DeviceClockRunner runner(10.0);  // far longer than the 1 ms the op took
    StageExecutor ex(g, s, runner, 0);
    const StepTiming t = ex.run_step();
    for (const Op& op : g.ops) {
      const OpTiming& o = t.ops[static_cast<size_t>(op.id)];
      CHECK(o.end - o.start >= 1e-3);
      CHECK(o.end - o.start < 1.0);
    }
  }

  TEST_CASE("each op starts after all of its dependencies end and ops of one stream never overlap") {
    const RunInputs in = test::load_tiny("exec_dp2", test::tiny_plan(2, test::kDp2Ep2));
    const OpGraph& g = in.graph;
    const StageSchedule s = schedule_stage(g, 0);
    SleepRunner runner;
    StageExecutor ex(g, s, runner, 0);
    const StepTiming t = ex.run_step();
    CHECK(runner.ops.load() == static_cast<int>(g.ops.size()));
    double last_end[kNumStreams] = {};
    for (const Op& op : g.ops) {  // graph order is each stream's issue order
      const OpTiming& o = t.ops[static_cast<size_t>(op.id)];
      CHECK(o.end >= o.start);
      for (int32_t d : g.deps_of(op)) CHECK(o.start >= t.ops[static_cast<size_t>(d)].end);
      CHECK(o.start >= last_end[static_cast<int>(op.stream)]);
      last_end[static_cast<int>(op.stream)] = o.end;
      CHECK(o.end <= t.span_s);
    }
    // Collectives beside compute: each stream has its own thread.
    const auto& compute = runner.threads[static_cast<int>(Stream::kCompute)];
    const auto& comm = runner.threads[static_cast<int>(Stream::kComm)];
    REQUIRE(compute.size() == 1);
    REQUIRE(comm.size() == 1);
    CHECK(*compute.begin() != *comm.begin());
  }

  TEST_CASE("a pipeline stage runs its receives and waits for them before the ops that consume them") {
    const RunInputs in = test::load_tiny("exec_pp2", test::tiny_plan(2, test::kPp2));
    const OpGraph& g = in.graph;
    for (int stage = 0; stage < 2; ++stage) {
      const StageSchedule s = schedule_stage(g, stage);
      SleepRunner runner;
      StageExecutor ex(g, s, runner, 0);
      const StepTiming t = ex.run_step();
      int expected_receives = 0;
      for (const StageTask& task : s.tasks) expected_receives += task.receive ? 1 : 0;
      CHECK(runner.receives.load() == expected_receives);
      CHECK(expected_receives == static_cast<int>(g.micro_batches));  // one per micro-batch and direction
      for (const Op& op : g.ops) {
        if (op.stage != stage) CHECK(t.ops[static_cast<size_t>(op.id)].end == 0.0);
      }
    }
  }
}

}  // namespace moeplan::executor
