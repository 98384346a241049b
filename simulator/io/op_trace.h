// Writers shared by prediction (moeplan simulate) and measurement (moerun run): the per-op summary that joins
// predicted and measured reports, the Chrome trace (one process per pipeline stage, one thread per stream)
// and atomic file writes.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "simulator/core/op_graph.h"
#include "simulator/core/status.h"

namespace moeplan {

// Per (stage, op label, phase): count and mean / total seconds, the join key for predicted vs measured.
struct OpSummaryRow {
  int stage = 0;
  std::string op;  // op_label
  Phase phase = Phase::kForward;
  OpKind kind = OpKind::kGemm;
  bool comm = false;  // a collective, transfer or fused GEMM+collective: group, collective and bytes apply
  CommGroup group = CommGroup::kNone;
  Collective collective = Collective::kAllReduce;
  double bytes = 0;
  int64_t count = 0;
  double total_s = 0;
};

// The rows in (stage, label, phase) order; `timing` is indexed by op id.
std::vector<OpSummaryRow> op_summary(const OpGraph& graph, std::span<const OpTiming> timing);
nlohmann::json op_summary_json(std::span<const OpSummaryRow> rows);
nlohmann::json op_summary_json(const OpGraph& graph, std::span<const OpTiming> timing);

// Which ops a Chrome trace shows, so a step of a very large job stays a file Perfetto loads: the first
// `micro_batches` micro-batches (0: all; ops of no micro-batch, such as the optimizer step, always show) of
// the listed pipeline stages (empty: all).
struct TraceSelection {
  int64_t micro_batches = 0;
  std::vector<int> stages;
  bool selects_all() const { return micro_batches <= 0 && stages.empty(); }
};

// The events the selection keeps, about 250 bytes each in the file.
int64_t trace_events(const OpGraph& graph, const TraceSelection& selection);

// The most micro-batches whose trace stays within `max_events` ops (at least 1), for the default selection of
// a step too large to show whole; 0 when the whole step fits.
int64_t trace_micro_batches_within(const OpGraph& graph, const std::vector<int>& stages, int64_t max_events);

// A selection from the command line: `micro_batches` as given, `stages` a list like "0,3-5" of stages below
// `num_stages`; errors name the option and what was expected.
Result<TraceSelection> parse_trace_selection(int64_t micro_batches, const std::string& stages,
                                             int num_stages);

// The trace of the selected ops; a selection that is not everything is stated in its otherData.
std::string chrome_trace(const OpGraph& graph, std::span<const OpTiming> timing,
                         const TraceSelection& selection = {});

// Writes `content` to `path` via a temporary file and a rename, so no reader ever sees half a file.
Result<bool> write_file_atomic(const std::string& path, const std::string& content);

}  // namespace moeplan
