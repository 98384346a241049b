// Fit quality of a hardware profile: for every calibration table, what the cost model predicts for each of
// the table's own measurements, and whether the model respects the facts the Hopper sources state.
// `moeplan calibrate --report` prints it; the calibration tests check its targets.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "simulator/core/hardware.h"
#include "simulator/core/stack.h"

namespace moeplan::calibrate {

// Median and maximum |predicted / measured - 1| over a set of points.
struct ErrorStats {
  int64_t points = 0;
  double median = 0, max = 0;
};

struct TableFit {
  std::string kind;   // "collective", "gemm", "grouped_gemm", "attention", "hbm"
  std::string label;  // e.g. "all_reduce nvls 8 ranks / 1 node", "fp8 GEMM (S9 ...)"
  std::string model;  // how the cost model predicts this table ("interpolated, leave-one-out", ...)
  ErrorStats large;   // messages >= 1 MiB; GEMMs with at least one full wave of tiles; attention >= 1024 keys
  ErrorStats small;   // the rest
  // Per point: (size or shape, measured, predicted) in the table's own unit (GB/s busbw, TFLOP/s, GB/s).
  struct Point {
    std::string at;
    double measured = 0, predicted = 0;
  };
  std::vector<Point> points;
  std::string note;  // e.g. the alpha-beta fit beside an interpolated curve
  // Grouped GEMM tables, scored with the implementation their kernel class runs at efficiency 1 (the raw
  // shape model): the class, dtype, the GEMMs timed (fwd, dgrad, wgrad, fwd+bwd), the citation's leading id,
  // the error over all points and the efficiency a stack on this kernel would need, exp(mean log(measured /
  // predicted)).
  std::string kernel, dtype, part, source;
  ErrorStats all;
  double implied_efficiency = 0;
};

struct Fact {
  std::string statement;
  bool holds = false;
  std::string detail;
};

struct FitReport {
  std::string profile;
  std::vector<TableFit> tables;
  std::vector<Fact> facts;
};

FitReport fit_report(const HardwareProfile& hw, const StackProfile& stack);
// One grouped GEMM table against the raw shape model: the cost model's grouped GEMM as the table's kernel
// class runs it, at efficiency 1, with `stack`'s launch gaps and kernel floor set to zero.
TableFit grouped_gemm_fit(const GroupedGemmTable& g, const HardwareProfile& hw, const StackProfile& stack);
nlohmann::json fit_report_json(const FitReport& r);
std::string fit_report_text(const FitReport& r);

}  // namespace moeplan::calibrate
