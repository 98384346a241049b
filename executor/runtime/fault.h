// Fault injection for the fault-handling tests (a test hook, not a feature): MOERUN_FAULT, read at start-up,
//   crash:rank=R:op=LABEL  rank R aborts (SIGABRT) when it reaches the first op labelled LABEL;
//   hang:rank=R:op=LABEL   rank R stops at that op without running it (its collective never starts), so the
//                          other ranks block in it until the watchdog ends the job;
//   slow:rank=R:op=LABEL:us=N  rank R sleeps N microseconds inside every op labelled LABEL, before running it
//                          (the op's measured time grows by N us there: a straggler the report must name).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "simulator/core/status.h"

namespace moeplan::executor {

struct Fault {
  enum class Kind { kCrash, kHang, kSlow };
  Kind kind = Kind::kCrash;
  int rank = 0;
  std::string op;        // op_label of the op where it happens
  int64_t delay_us = 0;  // kSlow: the sleep inside each such op
};

// Empty or unset: no fault. A malformed value is an error naming MOERUN_FAULT.
Result<std::optional<Fault>> parse_fault(const char* text);

}  // namespace moeplan::executor
