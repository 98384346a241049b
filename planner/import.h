// import: the plan of a Megatron-LM launch (pretrain_gpt.py flags, from a script or a pasted command line),
// so a user can predict the job they run today and ask the planner what to change. The inverse of
// megatron_args (launch.h): for every plan whose Megatron launch has no "not expressible" line, importing
// that launch gives the plan back.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "simulator/core/model_spec.h"
#include "simulator/core/plan.h"
#include "simulator/core/status.h"

namespace moeplan::planner {

// The words of a shell script or command line: comments dropped (a word starting with '#' ends its line),
// backslash-newline joined, single and double quotes removed. "--flag=value" stays one word.
std::vector<std::string> shell_words(const std::string& text);

struct ImportOptions {
  int64_t gpus = 0;   // 0: from torchrun --nnodes x --nproc-per-node or #SBATCH --nodes x --gpus-per-node
  std::string stack;  // empty: megatron-core, or its DeepEP / HybridEP variant from the dispatcher flags
  int64_t gpus_per_node = 8;  // for an #SBATCH or srun --nodes count without a per-node GPU count
};

struct Imported {
  nlohmann::json plan;              // the plan-file form, without model and hardware (the caller names them)
  std::vector<std::string> notes;   // how a flag was read where the mapping is not one to one
  std::vector<std::string> unread;  // flags the plan has no field for (performance-neutral or not modelled)
};

// The plan of the Megatron flags in `text`, checked against `model` (layers, hidden size, experts, top-k
// where the launch gives them). Errors are one line naming the flag and what was expected.
Result<Imported> import_megatron(const std::string& text, const ModelSpec& model,
                                 const ImportOptions& options);

}  // namespace moeplan::planner
