// Shared pieces of the `moeplan` subcommands: exit codes, one-line errors, number formatting.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "planner/search.h"
#include "simulator/core/stack.h"
#include "simulator/cost/memory.h"
#include "simulator/io/op_trace.h"
#include "simulator/io/plan_io.h"
#include "simulator/predict/assumptions.h"
#include "simulator/workload/routing.h"

namespace moeplan::cli {

// DESIGN.md: 0 success; 2 bad input or arguments; 3 a plan that cannot run; anything else is a bug.
inline constexpr int kExitOk = 0;
inline constexpr int kExitBadInput = 2;
inline constexpr int kExitInfeasible = 3;

// Prints "moeplan: error: <message>" as one line on stderr and returns kExitBadInput.
int bad_input(const std::string& message);

// 1.23 B, 456.7 M, 12.3 K
std::string human_count(double n);
// 1.23 TiB, 74.50 GiB, 512.0 MiB (binary: HBM as the driver reports it)
std::string human_bytes(double b);

// Writes a JSON object to stdout, indented, with a final newline.
void print_json(const nlohmann::json& j);

// The stack a plan runs on when neither the plan nor --stack names one: the one users run today.
inline constexpr const char* kDefaultStack = "megatron-core";
// The stack `calibrate --trace` refits when --stack names none: moerun's own, whose traces it reads.
inline constexpr const char* kDefaultTraceStack = "moerun";
// The default job of `plan` and `sweep`: a well-known public MoE on a common Hopper cluster.
inline constexpr const char* kDefaultModel = "mixtral-8x22b";
inline constexpr const char* kDefaultHardware = "h100-sxm";
inline constexpr int64_t kDefaultGpus = 128;
inline constexpr int64_t kDefaultSeq = 4096;
inline constexpr int64_t kDefaultBatch = 256;

// A plan file with everything needed to simulate it: the plan, its model and hardware, the stack (--stack
// overrides the plan's, and --hardware the plan's hardware profile, e.g. one `moeplan calibrate` fitted on
// the cluster; a path in the plan is relative to the plan file, an override to the working directory) and its
// routing distribution.
struct PlanInputs {
  io::LoadedPlan loaded;
  StackProfile stack;
  workload::RoutingDistribution routing;
  std::string dir;  // the plan file's folder (relative paths in the plan start there)
};
Result<PlanInputs> load_plan_inputs(const std::string& plan_path, const std::string& stack_override,
                                    const std::string& hardware_override = "");

// The search space of `plan`-style options: --precision bf16|fp8|any and --fix KEY=VALUE pins (a bare word is
// a string); an unknown key is an error with a "did you mean".
Result<planner::SearchSpace> search_space(const std::string& precision, const std::vector<std::string>& fix);

// The ops a written Chrome trace shows: --trace-micro-batches N (-1: as many as keep the file near 100 MB,
// kMaxTraceEvents; 0: all) of the --trace-stages LIST (""; every stage). `note` gets a line for the user when
// the default left micro-batches out. Errors name the option.
inline constexpr int64_t kMaxTraceEvents = 400000;
Result<TraceSelection> trace_selection(const OpGraph& graph, int64_t micro_batches, const std::string& stages,
                                       std::string* note);

// Prints "moeplan: the plan does not fit: X GB per GPU of Y GB" on stderr and returns kExitInfeasible.
int does_not_fit(const cost::MemoryBreakdown& memory);

// A number in its stack file's unit ("25 us", "0.7").
std::string in_file_unit(double si, double unit);
// The step over the stack's unmeasured numbers and the (up to four) numbers it moves with most.
void print_assumptions(const AssumptionRange& a, double tokens_per_step, int64_t gpus);

// What makes predictions hypothetical (each reason once, in order of first use): "HYPOTHETICAL: these
// predictions credit capabilities the STACK stack has not measured:" and one line per reason; nothing when
// none is. For a table's footer (plan, sweep, explain); `simulate` prints its one prediction's own.
void print_hypothetical(const std::vector<const Prediction*>& predictions, const std::string& stack);

// Each subcommand registers its options and sets `run` to the function that executes it.
using Runner = std::function<int()>;
Runner add_inspect(CLI::App& app);
Runner add_validate(CLI::App& app);
Runner add_simulate(CLI::App& app);
Runner add_launch(CLI::App& app);
Runner add_plan(CLI::App& app);
Runner add_explain(CLI::App& app);
Runner add_sweep(CLI::App& app);
Runner add_calibrate(CLI::App& app);
Runner add_compare(CLI::App& app);
Runner add_diff(CLI::App& app);
Runner add_import(CLI::App& app);

}  // namespace moeplan::cli
