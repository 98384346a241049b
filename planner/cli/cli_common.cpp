// Shared pieces of the `moeplan` subcommands that read inputs (see cli_common.h).
#include "planner/cli/cli_common.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include <fmt/format.h>

#include "simulator/io/json_reader.h"
#include "simulator/io/router_trace.h"
#include "simulator/io/stack_loader.h"

namespace moeplan::cli {

Result<PlanInputs> load_plan_inputs(const std::string& plan_path, const std::string& stack_override) {
  Result<io::LoadedPlan> loaded = io::load_plan(plan_path);
  if (!loaded) return loaded.error();
  PlanInputs in;
  in.loaded = std::move(loaded).value();
  in.dir = std::filesystem::path(in.loaded.path).parent_path().string();
  const Plan& plan = in.loaded.plan;
  const std::string stack_ref =
      !stack_override.empty() ? stack_override : (plan.stack.empty() ? kDefaultStack : plan.stack);
  Result<StackProfile> stack = io::load_stack(stack_ref, stack_override.empty() ? in.dir : "");
  if (!stack) return stack.error();
  in.stack = std::move(stack).value();
  Result<cost::RoutingDistribution> routing = io::routing_distribution(
      plan.routing.distribution, std::max<int64_t>(1, in.loaded.model.moe.num_experts), in.dir);
  if (!routing) return routing.error();
  in.routing = std::move(routing).value();
  return in;
}

Result<planner::SearchSpace> search_space(const std::string& precision, const std::vector<std::string>& fix) {
  planner::SearchSpace space;
  if (precision == "bf16") space.precisions = {Precision::kBf16};
  if (precision == "fp8") space.precisions = {Precision::kFp8};
  const std::vector<std::string> keys = planner::plan_keys();
  for (const std::string& f : fix) {
    const size_t eq = f.find('=');
    if (eq == std::string::npos || eq == 0) return Error{fmt::format("--fix {}: expected KEY=VALUE", f)};
    const std::string key = f.substr(0, eq), text = f.substr(eq + 1);
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) {
      const std::string guess = io::closest_match(key, keys);
      return Error{fmt::format("--fix {}: unknown plan key '{}'{}", f, key,
                               guess.empty() ? "" : fmt::format(" (did you mean '{}'?)", guess))};
    }
    nlohmann::json value = nlohmann::json::parse(text, nullptr, false);
    if (value.is_discarded()) value = text;  // a bare word is a string ("all_gather")
    space.fixed.emplace_back(key, value);
  }
  return space;
}

int does_not_fit(const cost::MemoryBreakdown& memory) {
  std::fprintf(stderr, "moeplan: the plan does not fit: %.1f GB per GPU (%.1f-%.1f) of %.1f GB\n",
               memory.total() / 1e9, memory.total_low() / 1e9, memory.total_high() / 1e9,
               memory.capacity / 1e9);
  return kExitInfeasible;
}

}  // namespace moeplan::cli
