// Fits a stack profile (hwprofiles/stacks/*.json) to per-op traces of short real runs: grouped-GEMM
// efficiency against rows per expert, memory-bound efficiency, host/launch gaps per kernel, per local expert
// and per micro-batch, and the communication overlap the stack achieved. The traced run's step time is never
// a target.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "simulator/calibrate/stack/kernel_patterns.h"
#include "simulator/calibrate/stack/trace_reader.h"
#include "simulator/core/hardware.h"
#include "simulator/core/stack.h"
#include "simulator/core/status.h"
#include "simulator/core/units.h"

namespace moeplan::calibrate {

// Communication kernels must run concurrently with compute kernels for at least this share of their time
// before the fit claims inter-operator overlap (overlaps.inter_op). Half: below it most comm time is exposed,
// and the cost model would credit an overlap the stack mostly does not achieve.
inline constexpr double kInterOpOverlapThreshold = 0.5;

struct StackFitOptions {
  std::string name;         // the written stack's "name" (the file stem)
  std::string description;  // "" -> generated from the traces
  StackProfile base;        // what the traces cannot determine is kept from here, with its source
  std::string base_label;   // "hwprofiles/stacks/megatron-core.json", for the report and the sources
  KernelPatterns patterns;  // load_kernel_patterns()
  std::vector<int64_t> compute_streams;  // empty: per device, the stream with the most GEMM time
  // Kineto CPU ranges (user_annotation / record_function / NVTX) that delimit micro-batches and MoE layers;
  // ECMAScript, searched in the range name.
  std::string micro_batch_regex = "(?:^|[^A-Za-z])(forward_step|backward_step|[Mm]icro[-_ ]?[Bb]atch)";
  std::string forward_regex =
      "forward";  // which micro-batch ranges start a micro-batch (the rest continue one)
  std::string moe_layer_regex = "MoE|moe_layer|[Ee]xperts";
  // moerun traces carry flops, not shapes: each grouped GEMM's rows come from flops / (2 n k) with these.
  struct ExpertShape {
    int64_t local_experts = 0, hidden = 0, ffn_hidden = 0;
  } moerun_experts;
  DType moerun_dtype = DType::kBf16;
  double min_memory_bound_bytes = 1 << 20;  // smaller kernels are launch-ramp dominated: not fitted
};

// One parameter of the fit, in the file's units (µs for host costs).
struct ParamFit {
  std::string key;      // "host.launch_us_per_kernel", "grouped_gemm_efficiency", "overlaps.inter_op", ...
  bool fitted = false;  // false: kept from the base stack
  double value = 0;
  int64_t samples = 0;
  double lo = 0, hi = 0;  // spread: 10th and 90th percentile of the samples (or the fit's residual range)
  std::string how;        // the method, or why it was kept and the old source
};

struct CurvePoint {
  double rows_per_expert = 0, efficiency = 0;
  int64_t samples = 0;
  double lo = 0, hi = 0;  // 10th / 90th percentile of the efficiencies in the bin
};

struct StackFit {
  StackProfile stack;  // the fitted stack (calibrated = true), SI units
  std::vector<ParamFit> params;
  std::vector<CurvePoint> curve;      // empty when kept from the base
  double comm_overlap_fraction = -1;  // of all communication kernel time, -1 when no comm kernels
  double comm_overlap_fraction_ep =
      -1;                           // of EP/TP-type communication (all-to-all, send/recv; moerun: by group)
  std::vector<std::string> traces;  // "file (dialect, N kernels)"
  std::vector<std::string> notes;   // what was excluded and why
};

Result<StackFit> fit_stack(const std::vector<TraceFile>& traces, const HardwareProfile& hw,
                           const StackFitOptions& options);

// moeplan-stack-v1 text, loadable by io::load_stack: same fit, same bytes.
std::string stack_json(const StackFit& fit);

// The fit report: per parameter value, samples, spread, fitted or kept (with the old source).
nlohmann::json fit_report_json(const StackFit& fit);
std::string fit_report_text(const StackFit& fit);

}  // namespace moeplan::calibrate
