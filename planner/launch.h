// Launch configurations for one plan: the plan file and the mpirun / srun lines or sbatch script that start
// moerun on it, and the Megatron-LM (Megatron-Core) argument list for the same plan and model. Pure: values
// in, text out; the only file-system function is rebase_plan_paths, which the CLI uses when it moves a plan.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "simulator/core/hardware.h"
#include "simulator/core/model_spec.h"
#include "simulator/core/plan.h"

namespace moeplan::planner {

// One rank per GPU: whole nodes, or part of one node when the plan needs fewer GPUs than a node has.
struct NodeLayout {
  int64_t nodes = 0;
  int64_t ranks_per_node = 0;
};
NodeLayout node_layout(const Plan& plan, const HardwareProfile& hw);

// Where `moerun run` writes its report when the caller names no directory: runs/<plan file stem>.
std::string default_run_dir(const std::string& plan_path);

// moerun: the plan file (pretty plan-file JSON) and the two ways to start it on `backend`: "cuda" (NCCL and
// the CUDA kernels; moerun gives local rank i the node's GPU i) or "cpu" (MPI ranks with Eigen kernels).
struct MoerunLaunch {
  std::string plan_json;  // plan_to_json, indented, final newline
  std::string mpirun;     // mpirun -np <gpus> --map-by ppr:<G>:node ... moerun run <plan> --backend B ...
  std::string srun;  // srun --mpi=pmix --nodes=<N> --ntasks-per-node=<G> [--gpus-per-node=<G>] moerun ...
  std::string srun_prefix;  // the srun line up to the moerun command, for other moerun commands on the ranks
};
MoerunLaunch moerun_launch(const Plan& plan, const HardwareProfile& hw, const std::string& plan_path,
                           const std::string& run_dir, const std::string& backend);
// The plan file and the command lines, as one text for a terminal (comment lines start with '#').
std::string moerun_text(const Plan& plan, const ModelSpec& model, const HardwareProfile& hw,
                        const std::string& plan_path, const std::string& run_dir, const std::string& backend);

// slurm: an sbatch script (#SBATCH nodes, tasks and GPUs per node, exclusive, job name, output file; the
// NCCL environment on the CUDA backend) that ends with the srun line of moerun_launch. With `calibrate`, the
// job first measures its own nodes (`moerun bench` on every rank; on CUDA with the plan's hardware profile
// as --base), fits a hardware profile from that (`moeplan calibrate`, into <run_dir>/hardware.json with the
// fit report in calibrate.txt), predicts the plan on it (predicted.json), runs the plan, and compares the two
// (compare.txt).
std::string slurm_script(const Plan& plan, const ModelSpec& model, const HardwareProfile& hw,
                         const std::string& plan_path, const std::string& run_dir, const std::string& backend,
                         bool calibrate = false);

// The Megatron-LM commit whose flags the launch uses (shared/reference/megatron-flags.md).
inline constexpr const char* kMegatronCommit = "d98e8a64ddf34856e74b24714e3bedb2f5a39553";

// Megatron-LM: flags that exist in Megatron-LM at kMegatronCommit (shared/reference/megatron_flags.txt) and
// satisfy the cross-flag rules of shared/reference/megatron-flags.md. A plan feature Megatron cannot express
// is kept as a reason in `not_expressible` instead of being dropped.
struct MegatronArgs {
  std::vector<std::string> flags;            // one flag with its values per entry, shell-quoted
  std::vector<std::string> not_expressible;  // each becomes "# not expressible in Megatron-LM: <reason>"
  std::vector<std::string> notes;            // how a flag was chosen where the mapping is not one to one
  std::vector<std::string> env;              // environment the launch needs, "NAME=value"
};
MegatronArgs megatron_args(const Plan& plan, const ModelSpec& model, const HardwareProfile& hw);
std::vector<std::string> megatron_flags(const Plan& plan, const ModelSpec& model, const HardwareProfile& hw);
// A bash script to run once per node: comment lines (the plan, the commit, the model constants, what is not
// expressible, notes), the environment, then the torchrun line starting $MEGATRON_LM/pretrain_gpt.py with one
// flag per line. Node rank and master address come from Slurm when it runs the script, else from
// NODE_RANK / MASTER_ADDR.
std::string megatron_text(const Plan& plan, const ModelSpec& model, const HardwareProfile& hw,
                          const std::string& plan_path);

// The plan with its model, hardware, stack and router-trace paths rewritten so that a copy written to
// `to_plan_path` names the same files as `from_plan_path` did. Paths that are not files next to the source
// plan (built-in names) stay as they are.
Plan rebase_plan_paths(const Plan& plan, const std::string& from_plan_path, const std::string& to_plan_path);

}  // namespace moeplan::planner
