// Reads and writes stack profiles (hwprofiles/stacks/*.json, "format": "moeplan-stack-v2") in SI units
// inside; every number carries a non-empty source and its basis. hwprofiles/stacks/README.md documents the
// schema.
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
// The file form (µs, GiB), keys in schema order; stack_from_json reads it back to the same profile.
nlohmann::ordered_json stack_to_json(const StackProfile& s);

// {"value", "source", "basis", "range"} under `key`: an efficiency in (0, 1], its range required where the
// basis is assumed or target (the hardware loader reads its stated numbers so too).
Stated<double> stated_efficiency(const JsonNode& parent, std::string_view key);

}  // namespace moeplan::io
