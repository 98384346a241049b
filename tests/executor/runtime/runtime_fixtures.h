// Shared by the runtime tests: small tiny-moe plans lowered exactly as moerun lowers them.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "executor/runtime/run_inputs.h"

namespace moeplan::executor::test {

// A tiny-moe plan on `gpus` ranks; `fields` replaces the parallelism part of the plan.
inline std::string tiny_plan(int gpus, const std::string& fields, int seq_len = 256, int global_batch = 4) {
  return std::string("{\"model\": \"") + MOEPLAN_SOURCE_DIR + "/models/tiny-moe.json\", \"hardware\": \"" +
         MOEPLAN_SOURCE_DIR + "/hwprofiles/h100-sxm.json\", \"gpus\": " + std::to_string(gpus) +
         ", \"seq_len\": " + std::to_string(seq_len) + ", \"global_batch\": " + std::to_string(global_batch) +
         ", \"micro_batch\": 1, " + fields + "}";
}

inline RunInputs load_tiny(const std::string& name, const std::string& text) {
  const auto path =
      std::filesystem::temp_directory_path() / (name + "_" + std::to_string(::getpid()) + ".json");
  std::ofstream(path) << text;
  Result<RunInputs> in = load_run_inputs(path.string());
  std::filesystem::remove(path);
  if (!in) FAIL(in.error().message);
  return std::move(in).value();
}

inline const char* kPp2 =
    "\"attention\": {\"tp\": 1, \"sp\": 1, \"cp\": 1}, \"experts\": {\"ep\": 1, \"etp\": 1}, "
    "\"pipeline\": {\"pp\": 2, \"vpp\": 1, \"schedule\": \"1f1b\"}";
inline const char* kPp2Vpp2 =
    "\"attention\": {\"tp\": 1, \"sp\": 1, \"cp\": 1}, \"experts\": {\"ep\": 1, \"etp\": 1}, "
    "\"pipeline\": {\"pp\": 2, \"vpp\": 2, \"schedule\": \"interleaved_1f1b\"}";
inline const char* kDp2Ep2 =
    "\"attention\": {\"tp\": 1, \"sp\": 1, \"cp\": 1}, \"experts\": {\"ep\": 2, \"etp\": 1}, "
    "\"pipeline\": {\"pp\": 1, \"vpp\": 1, \"schedule\": \"1f1b\"}, "
    "\"overlap\": {\"inter_op\": true, \"intra_op\": false, \"dp_comm\": true, \"pp_comm\": true}";

}  // namespace moeplan::executor::test
