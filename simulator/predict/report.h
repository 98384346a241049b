// Writers for a prediction: the report JSON (the schema `moeplan simulate --json` prints and moerun's
// measured report shares) and a Chrome trace (one process per pipeline stage, one thread per stream) that
// opens in Perfetto.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "simulator/core/status.h"
#include "simulator/io/op_trace.h"
#include "simulator/predict/assumptions.h"
#include "simulator/predict/predict.h"

namespace moeplan {

struct ReportContext {
  const Plan& plan;
  const ModelSpec& model;
  const HardwareProfile& hardware;
  const StackProfile& stack;
};

nlohmann::json prediction_json(const Prediction& p, const ReportContext& ctx);

// The step over the stack's ranged numbers (simulate --json's "assumptions"): the step and tokens/s/GPU
// ranges, and each number with its range (in the stack file's unit) and the step at either end.
nlohmann::json assumptions_json(const AssumptionRange& a, double tokens_per_step, int64_t gpus);

}  // namespace moeplan
