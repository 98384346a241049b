// Calibration sources: the measurements a hardware profile is built from, in the formats users already have
// (nccl-tests output as the tools print it, CSV tables of GEMM / attention / HBM rates) plus one
// profile.json that holds the scalars with their citations and lists the measurement files in order.
// `moeplan calibrate` turns such a folder (committed under hwprofiles/sources/, or written by moerun bench)
// into a hardware profile; hwprofiles/sources/README.md documents the formats.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "simulator/core/hardware.h"
#include "simulator/core/status.h"

namespace moeplan::calibrate {

// One nccl-tests run: the rows of its table and what its header says about the run.
struct NcclTestsLog {
  Collective collective = Collective::kAllReduce;
  std::string algorithm = "unspecified";  // from a "# moeplan-algorithm:" line; nccl-tests does not print it
  int64_t ranks = 0;                      // "#  Rank" lines, else "# moeplan-ranks:"
  int64_t nodes = 0;                      // distinct hosts of the rank lines, else "# moeplan-nodes:"
  std::string source;                     // "# moeplan-source:" lines, else "nccl-tests output <file>"
  struct Row {
    int64_t bytes = 0;
    double time_us = 0, algbw_GBps = 0, busbw_GBps = 0;
    bool in_place = false;  // the out-of-place columns were N/A, so these are the in-place ones
  };
  std::vector<Row> rows;  // sizes strictly increasing, size-0 rows dropped
};

// Parses nccl-tests output (all_reduce_perf, all_gather_perf, reduce_scatter_perf, alltoall_perf,
// sendrecv_perf), tolerating mpirun's "[1,0]<stdout>:" prefixes, NCCL INFO lines and versions with or
// without the root column. `label` names the file in errors: "<label>: line N: ...".
Result<NcclTestsLog> parse_nccl_tests(std::string_view text, const std::string& label);

// A CSV table: a header line of column names, then rows; "# source: ..." lines before the header give the
// table's citation. Cells are kept as text; `lines` holds each row's line number for errors.
struct CsvTable {
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;
  std::vector<int> lines;
  std::string source;
};
Result<CsvTable> parse_csv(std::string_view text, const std::string& label);

// Reads DIR/profile.json and every measurement file it lists, and returns the hardware profile document
// ("format": "moeplan-hwprofile-v1"), checked by the hardware loader.
Result<nlohmann::ordered_json> build_profile(const std::string& dir);

// The profile document as text: two-space indentation, every {value, source} pair and every point list on one
// line, numbers in their shortest round-trip form. Same document, same bytes.
std::string profile_text(const nlohmann::ordered_json& profile);

}  // namespace moeplan::calibrate
