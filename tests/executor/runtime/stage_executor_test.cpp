// Tests of one stage's step on lane threads (executor/runtime/stage_executor.h), single process: a runner
// that sleeps a fixed time per op stands in for real work, so ordering and overlap are visible in the
// timings.
#include "executor/runtime/stage_executor.h"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

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

// An enqueuing runner, as the CUDA replay is by default: run() only queues the op on its stream, after()
// records the cross-stream waits the runner is told of, and end_step() plays the queues as a device would:
// each stream in its own order, an op starting once its stream is free and every op it was told to wait for
// has ended, each taking 100 us. Without the executor's after() calls, an op would start before an op of
// another stream that it depends on.
class QueueRunner final : public OpRunner {
 public:
  explicit QueueRunner(const OpGraph& g) : graph_(g), waits_(g.ops.size()), interval_(g.ops.size()) {}
  bool enqueues() const override { return true; }
  // With `capture`, the runner keeps its queues after the first step and replays them (as a CUDA graph).
  bool capture = false;
  bool replays_step() const override { return capture && steps_ > 0; }
  void prepare_step() override { log.push_back("prepare"); }
  void begin_step() override {
    std::lock_guard<std::mutex> lock(mutex_);
    log.push_back("begin");
  }
  void after(const Op& op, const Op& dep) override {
    std::lock_guard<std::mutex> lock(mutex_);
    told[static_cast<size_t>(op.id)].insert(dep.id);
    if (dep.stream != op.stream) waits_[static_cast<size_t>(op.id)].push_back(dep.id);
  }
  // A receive's wait: named like any dependency (by the neighbour's send), counted apart.
  void after_receive(const Op& op, const Op& send) override {
    std::lock_guard<std::mutex> lock(mutex_);
    told[static_cast<size_t>(op.id)].insert(send.id);
    ++receive_waits;
  }
  void run(const Op& op) override {
    std::lock_guard<std::mutex> lock(mutex_);
    // Every dependency was named before the op was queued.
    for (int32_t d : graph_.deps_of(op)) CHECK(told[static_cast<size_t>(op.id)].count(d) == 1);
    queue_[static_cast<int>(op.stream)].push_back(op.id);
    log.push_back("run");
  }
  void receive(const Op&) override {}
  void end_step() override {
    std::lock_guard<std::mutex> lock(mutex_);
    log.push_back("end");
    if (steps_++ > 0 && capture) return;  // the captured step: the same intervals again
    played_.clear();
    std::vector<size_t> next(kNumStreams, 0);
    double free_at[kNumStreams] = {};
    for (bool moved = true; moved;) {  // play each stream's head once what it waits for has ended
      moved = false;
      for (int st = 0; st < kNumStreams; ++st) {
        if (next[st] == queue_[st].size()) continue;
        const int32_t id = queue_[st][next[st]];
        double start = free_at[st];
        bool ready = true;
        for (int32_t w : waits_[static_cast<size_t>(id)]) {
          ready = ready && played_.count(w) == 1;
          if (ready) start = std::max(start, interval_[static_cast<size_t>(w)].end);
        }
        if (!ready) continue;
        interval_[static_cast<size_t>(id)] = {start, start + 100e-6};
        free_at[st] = start + 100e-6;
        played_.insert(id);
        ++next[st];
        moved = true;
      }
    }
  }
  OpTiming interval(const Op& op) const override { return interval_[static_cast<size_t>(op.id)]; }

  std::vector<std::string> log;
  std::map<size_t, std::set<int32_t>> told;
  int receive_waits = 0;

 private:
  const OpGraph& graph_;
  std::mutex mutex_;
  std::vector<std::vector<int32_t>> waits_;
  std::vector<int32_t> queue_[kNumStreams];
  std::set<int32_t> played_;
  std::vector<OpTiming> interval_;
  int steps_ = 0;
};

}  // namespace

TEST_SUITE("executor_runtime") {
  TEST_CASE(
      "an enqueuing runner hears every dependency before the op, and the device's intervals are the op "
      "times") {
    const RunInputs in = test::load_tiny("exec_dp2", test::tiny_plan(2, test::kDp2Ep2));
    const OpGraph& g = in.graph;
    const StageSchedule s = schedule_stage(g, 0);
    QueueRunner runner(g);
    StageExecutor ex(g, s, runner, 0);
    const StepTiming t = ex.run_step();
    // One step: prepared, then opened once before any op, closed once after the last.
    REQUIRE(runner.log.size() == g.ops.size() + 3);
    CHECK(runner.log[0] == "prepare");
    CHECK(runner.log[1] == "begin");
    CHECK(runner.log.back() == "end");
    int cross_stream = 0;
    for (const Op& op : g.ops) {
      const OpTiming& o = t.ops[static_cast<size_t>(op.id)];
      CHECK(o.end - o.start == doctest::Approx(100e-6));
      for (int32_t d : g.deps_of(op)) {
        CHECK(o.start >= t.ops[static_cast<size_t>(d)].end);
        cross_stream += g.ops[static_cast<size_t>(d)].stream != op.stream;
      }
    }
    CHECK(cross_stream > 0);  // the case exercises device-side waits
  }

  TEST_CASE("a runner that replays a captured step is only prepared, opened and closed after the first") {
    const RunInputs in = test::load_tiny("exec_capture", test::tiny_plan(2, test::kDp2Ep2));
    const OpGraph& g = in.graph;
    const StageSchedule s = schedule_stage(g, 0);
    QueueRunner runner(g);
    runner.capture = true;
    StageExecutor ex(g, s, runner, 0);
    const StepTiming first = ex.run_step();
    REQUIRE(runner.log.size() == g.ops.size() + 3);
    runner.log.clear();
    const StepTiming second = ex.run_step();
    CHECK(runner.log == std::vector<std::string>{"prepare", "begin", "end"});  // no op enqueued again
    int timed = 0;
    for (const Op& op : g.ops) {
      const OpTiming& a = first.ops[static_cast<size_t>(op.id)];
      const OpTiming& b = second.ops[static_cast<size_t>(op.id)];
      CHECK(b.start == a.start);
      CHECK(b.end == a.end);
      timed += b.end > b.start;
    }
    CHECK(timed > 0);  // the replayed step's ops keep their device intervals
  }

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

  TEST_CASE("an enqueuing runner hears of each pipeline receive before the op that consumes it") {
    const RunInputs in = test::load_tiny("exec_pp2_queue", test::tiny_plan(2, test::kPp2Vpp2, 256, 8));
    const OpGraph& g = in.graph;
    for (int stage = 0; stage < 2; ++stage) {
      const StageSchedule s = schedule_stage(g, stage);
      QueueRunner runner(g);  // its run() checks that every dependency, a receive's too, was named first
      StageExecutor ex(g, s, runner, 0);
      ex.run_step();
      int foreign = 0;
      for (const Op& op : g.ops) {
        if (op.stage != stage) continue;
        for (int32_t d : g.deps_of(op)) foreign += g.ops[static_cast<size_t>(d)].stage != stage;
      }
      CHECK(runner.receive_waits == foreign);
      CHECK(foreign > 0);
    }
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
