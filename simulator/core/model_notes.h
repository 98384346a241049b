// What a prediction for a model approximates, and what its checkpoint holds that the counts leave out: one
// labelled line each, printed by inspect, plan and simulate so that nothing is priced silently.
#pragma once

#include <string>
#include <vector>

#include "simulator/core/model_spec.h"

namespace moeplan {

// Lines such as "Gated DeltaNet layers: ... (assumed)"; empty for a model of plain softmax-attention layers
// with nothing left out.
std::vector<std::string> model_notes(const ModelSpec& m);

}  // namespace moeplan
