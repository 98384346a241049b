// Builds a ModelSpec from a Hugging Face config.json (Mixtral, Phi-3.5-MoE, OLMoE, Qwen2/3-MoE, DeepSeek
// V1/V2/V3, Kimi K2, GPT-OSS, Hunyuan-Large, DBRX, Llama 4) or from moeplan's plain model form ("format":
// "moeplan-model-v1"). models/README.md lists the keys read for each family.
#pragma once

#include <string>

#include "simulator/core/model_spec.h"
#include "simulator/core/status.h"
#include "simulator/io/json_reader.h"

namespace moeplan::io {

// `ref`: a file path (relative to base_dir) or a built-in model name.
Result<ModelSpec> load_model(const std::string& ref, const std::string& base_dir = "");

// From parsed JSON; `label` names the file in messages, `name` becomes ModelSpec::name unless the file names
// one.
Result<ModelSpec> model_from_json(const json& j, const std::string& label, const std::string& name);

}  // namespace moeplan::io
