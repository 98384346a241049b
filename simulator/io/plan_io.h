// Plan files (DESIGN.md "Contracts"): strict reading with defaults, and writing in the same form.
#pragma once

#include <string>

#include "simulator/core/hardware.h"
#include "simulator/core/model_spec.h"
#include "simulator/core/plan.h"
#include "simulator/core/status.h"
#include "simulator/io/json_reader.h"

namespace moeplan::io {

Result<Plan> plan_from_json(const json& j, const std::string& label);
json plan_to_json(const Plan& p);
// The plan's "recompute" value: a string where the defaults say all, else the object form.
json recompute_to_json(const Plan& p);

// A plan file with the model and hardware it names (paths relative to the plan file, or built-in names).
struct LoadedPlan {
  Plan plan;
  ModelSpec model;
  HardwareProfile hardware;
  std::string path;
};
Result<LoadedPlan> load_plan(const std::string& path);

}  // namespace moeplan::io
