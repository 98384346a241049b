// Reads a stack profile (hwprofiles/stacks/*.json, "format": "moeplan-stack-v1") into SI units; every number
// must carry a non-empty source. hwprofiles/stacks/README.md documents the schema.
#pragma once

#include <string>

#include "simulator/core/stack.h"
#include "simulator/core/status.h"
#include "simulator/io/json_reader.h"

namespace moeplan::io {

// `ref`: a file (relative to `base_dir` when relative) or a built-in name ("moerun") or repository path
// ("hwprofiles/stacks/moerun.json").
Result<StackProfile> load_stack(const std::string& ref, const std::string& base_dir = "");
Result<StackProfile> stack_from_json(const json& j, const std::string& label);

}  // namespace moeplan::io
