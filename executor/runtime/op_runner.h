// OpRunner: what executing one op of the op graph means. The replay runner performs work of each op's exact
// shape; a numerical training runner can replace it behind the same interface.
#pragma once

#include "simulator/core/op_graph.h"

namespace moeplan::executor {

class OpRunner {
 public:
  virtual ~OpRunner() = default;
  // Performs `op` (an op of this rank's stage); returns when its work is complete.
  virtual void run(const Op& op) = 0;
  // The receiving half of a pipeline send: `send` is the kSendRecv op of the neighbouring stage whose
  // message this rank receives. Returns when the message has arrived.
  virtual void receive(const Op& send) = 0;
  // Called once per step before the step's clock starts (work that is not the step's, e.g. drawing its
  // routing).
  virtual void prepare_step() {}
  // The device's time for `op`, which run() has just finished on the calling thread (CUDA events around its
  // work on its stream), or a negative value when the runner has no device clock and the host's interval
  // around run() is the op's time (the CPU runners).
  virtual double device_seconds(const Op& op) const {
    (void)op;
    return -1;
  }

  // ---- Runners that enqueue (the CUDA replay without a host wait per op) ----
  // An enqueuing runner's run() returns once the op's work is on its device stream. The executor then tells
  // it, before run(op), every op `op` depends on (after(op, dep): the runner orders them on the device,
  // e.g. a stream waiting on the dependency's event), opens each step with begin_step(), and after the
  // stage's last enqueue calls end_step(), which returns when the device has finished the step; interval(op)
  // then gives each op's device interval in seconds from begin_step().
  virtual bool enqueues() const { return false; }
  // An enqueuing runner that holds the whole step already (a captured CUDA graph): the executor then calls
  // begin_step() and end_step() only, which replay it, and reads the ops' intervals as after any step. Asked
  // once per step, before begin_step().
  virtual bool replays_step() const { return false; }
  virtual void after(const Op& op, const Op& dep) {
    (void)op;
    (void)dep;
  }
  // As after(), for a dependency on the receive of the neighbouring stage's `send` (which receive() has
  // enqueued).
  virtual void after_receive(const Op& op, const Op& send) {
    (void)op;
    (void)send;
  }
  virtual void begin_step() {}
  virtual void end_step() {}
  virtual OpTiming interval(const Op& op) const {
    (void)op;
    return {};
  }
};

}  // namespace moeplan::executor
