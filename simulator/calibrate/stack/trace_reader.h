// Reads per-op Chrome traces of short real runs (PyTorch profiler / Kineto, Nsight Systems converted to
// Chrome JSON, moerun's own traces) into GPU kernel intervals with the shapes and ranges the stack fit needs.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "simulator/core/status.h"

namespace moeplan::calibrate {

enum class TraceDialect : uint8_t {
  kKineto,  // PyTorch profiler: kernel / cuda_runtime / cpu_op / user_annotation events joined by ids
  kNsys,    // Nsight Systems exported to Chrome JSON: kernel events only, stream from args or tid
  kMoerun,  // moeplan / moerun op_trace chrome_trace: one process per stage, one thread per stream
};
const char* name_of(TraceDialect d);

// One GPU kernel (or moerun op), times in seconds from the trace's origin.
struct KernelEvent {
  std::string name;  // kernel name (Kineto/Nsys) or op label "L3.expert_fc13.dgrad" (moerun)
  std::string cat;   // event category as written: "kernel", or moerun's op kind ("grouped_gemm", ...)
  double start_s = 0, dur_s = 0;
  int64_t device = 0;       // pid (Kineto: args.device when present)
  int64_t stream = 0;       // args.stream, else tid (moerun: the Stream enum value)
  int64_t event_index = 0;  // index in traceEvents, for messages
  int64_t grid_blocks = 0;  // product of args.grid (0 when absent): SMs a communication kernel occupies
  // From the CPU op that launched it (Kineto: correlation -> cuda_runtime -> External id -> cpu_op).
  std::string cpu_op;                            // "aten::mm", "" when unknown
  std::vector<std::vector<int64_t>> input_dims;  // cpu_op "Input Dims"
  std::vector<std::string> input_types;          // cpu_op "Input type": "c10::BFloat16", "float", ...
  double launch_s = -1;                          // cuda_runtime launch time, -1 when unknown
  // moerun op args (-1 / "" when absent).
  double flops = -1, hbm_bytes = -1;
  int64_t micro_batch = -1, chunk = -1;
  std::string phase, collective, group;
};

// A named CPU-side range (Kineto user_annotation such as "ProfilerStep#3", "forward_step", "MoELayer").
// Kineto also writes each ProfilerStep#N as a "gpu_user_annotation" on the device's streams (first to last
// kernel of the step there); `cat` tells the two apart.
struct TraceRange {
  std::string name;
  double start_s = 0, end_s = 0;
  int64_t pid = 0, tid = 0;
  std::string cat;  // event category as written: "user_annotation", "gpu_user_annotation", ...
};

struct TraceFile {
  std::string label;  // file name, for messages and sources
  TraceDialect dialect = TraceDialect::kKineto;
  std::vector<KernelEvent> kernels;  // sorted by (device, stream, start)
  std::vector<TraceRange> ranges;    // sorted by start
};

// Errors, one line each: "<file>: not a Chrome trace: ...", "<file>: truncated at byte N",
// "<file>: event 123: 'dur' missing", "<file>: no GPU kernel events (...)".
Result<TraceFile> read_trace(const std::string& path);
Result<TraceFile> parse_trace(std::string_view text, const std::string& label);
// The same from JSON already parsed (a caller that looked at the content first): an object with
// "traceEvents" or an array of events.
Result<TraceFile> parse_trace_json(const nlohmann::json& j, const std::string& label);

}  // namespace moeplan::calibrate
