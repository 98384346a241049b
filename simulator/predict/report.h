// Writers for a prediction: the report JSON (the schema `moeplan simulate --json` prints and moerun's
// measured report shares) and a Chrome trace (one process per pipeline stage, one thread per stream) that
// opens in Perfetto.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "simulator/core/status.h"
#include "simulator/io/op_trace.h"
#include "simulator/predict/predict.h"

namespace moeplan {

struct ReportContext {
  const Plan& plan;
  const ModelSpec& model;
  const HardwareProfile& hardware;
  const StackProfile& stack;
};

nlohmann::json prediction_json(const Prediction& p, const ReportContext& ctx);

}  // namespace moeplan
