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
  // The device's time for `op`, which run() has just finished on the calling thread (CUDA events around its
  // work on its stream), or a negative value when the runner has no device clock and the host's interval
  // around run() is the op's time (the CPU runners).
  virtual double device_seconds(const Op& op) const {
    (void)op;
    return -1;
  }
};

}  // namespace moeplan::executor
