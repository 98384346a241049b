// Reads a hardware profile (hwprofiles/*.json, "format": "moeplan-hwprofile-v1") into SI units; every number
// must carry a non-empty source. hwprofiles/README.md documents the schema.
#pragma once

#include <string>

#include "simulator/core/hardware.h"
#include "simulator/core/status.h"
#include "simulator/io/json_reader.h"

namespace moeplan::io {

Result<HardwareProfile> load_hardware(const std::string& ref, const std::string& base_dir = "");
Result<HardwareProfile> hardware_from_json(const json& j, const std::string& label);

}  // namespace moeplan::io
