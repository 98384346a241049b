// Writers shared by prediction (moeplan simulate) and measurement (moerun run): the per-op summary that joins
// predicted and measured reports, the Chrome trace (one process per pipeline stage, one thread per stream)
// and atomic file writes.
#pragma once

#include <span>
#include <string>

#include <nlohmann/json.hpp>

#include "simulator/core/op_graph.h"
#include "simulator/core/status.h"

namespace moeplan {

// Per (stage, op label, phase): count and mean / total seconds, the join key for predicted vs measured.
// `timing` is indexed by op id.
nlohmann::json op_summary_json(const OpGraph& graph, std::span<const OpTiming> timing);

std::string chrome_trace(const OpGraph& graph, std::span<const OpTiming> timing);

// Writes `content` to `path` via a temporary file and a rename, so no reader ever sees half a file.
Result<bool> write_file_atomic(const std::string& path, const std::string& content);

}  // namespace moeplan
