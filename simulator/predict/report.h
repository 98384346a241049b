// Writers for a prediction: the report JSON (the schema `moeplan simulate --json` prints and moerun's
// measured report shares) and a Chrome trace (one process per pipeline stage, one thread per stream) that
// opens in Perfetto.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "simulator/core/status.h"
#include "simulator/predict/predict.h"

namespace moeplan {

struct ReportContext {
  const Plan& plan;
  const ModelSpec& model;
  const HardwareProfile& hardware;
  const StackProfile& stack;
};

nlohmann::json prediction_json(const Prediction& p, const ReportContext& ctx);

// Per (stage, op label, phase): count and mean / total seconds, the join key for predicted vs measured.
nlohmann::json op_summary_json(const OpGraph& graph, const engine::Timeline& timeline);

std::string chrome_trace(const OpGraph& graph, const engine::Timeline& timeline);

// Writes `content` to `path` via a temporary file and a rename, so no reader ever sees half a file.
Result<bool> write_file_atomic(const std::string& path, const std::string& content);

}  // namespace moeplan
