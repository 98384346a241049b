// `moeplan`: plans, predicts and verifies MoE training. One subcommand per job; each owns its options.
#include <cstdio>
#include <iostream>
#include <map>

#include <fmt/format.h>

#include "planner/cli/cli_common.h"
#include "simulator/core/units.h"
#include "simulator/predict/predict.h"

namespace moeplan::cli {

int bad_input(const std::string& message) {
  std::string line = message;
  for (char& c : line) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  std::fprintf(stderr, "moeplan: error: %s\n", line.c_str());
  return kExitBadInput;
}

std::string human_count(double n) {
  if (n >= 1e12) return fmt::format("{:.2f} T", n / 1e12);
  if (n >= 1e9) return fmt::format("{:.2f} B", n / 1e9);
  if (n >= 1e6) return fmt::format("{:.1f} M", n / 1e6);
  if (n >= 1e3) return fmt::format("{:.1f} K", n / 1e3);
  return fmt::format("{:.0f}", n);
}

std::string human_bytes(double b) {
  if (b >= 1024 * kGiB) return fmt::format("{:.2f} TiB", b / (1024 * kGiB));
  if (b >= kGiB) return fmt::format("{:.2f} GiB", b / kGiB);
  if (b >= kMiB) return fmt::format("{:.1f} MiB", b / kMiB);
  return fmt::format("{:.0f} B", b);
}

void print_json(const nlohmann::json& j) {
  std::cout << j.dump(2) << "\n";
}

}  // namespace moeplan::cli

int main(int argc, char** argv) {
  using namespace moeplan::cli;
  moeplan::retain_freed_memory();
  CLI::App app{"moeplan: plan, predict and verify the training of Mixture-of-Experts models on GPU clusters"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "moeplan 0.1.0");
  std::map<const CLI::App*, Runner> runners;
  auto add = [&](const char* name, const char* help, Runner (*make)(CLI::App&)) {
    CLI::App* sub = app.add_subcommand(name, help);
    runners[sub] = make(*sub);
  };
  add("plan",
      "Search the plan space: the best layouts for a model, cluster and job, ranked by simulated tokens/s",
      add_plan);
  add("inspect",
      "Parameters, FLOPs per token and training bytes per parameter of a model, or a hardware profile",
      add_inspect);
  add("validate", "Check a plan file against its model and hardware: every broken rule with its reason",
      add_validate);
  add("simulate", "Predict one training step of a plan: step time, tokens/s, MFU, memory, breakdown, trace",
      add_simulate);
  add("explain",
      "What each technique of a plan contributes: a cumulative table from a TP-only baseline without "
      "overlap, compression or selective recompute",
      add_explain);
  add("sweep",
      "What-if over one variable (GPUs, sequence, top-k, NIC/NVLink bandwidth, a plan key): re-plan or "
      "re-simulate a plan per value",
      add_sweep);
  add("launch",
      "Launch configuration of a plan: moerun plan file + mpirun/srun lines, sbatch script, or Megatron-LM "
      "arguments",
      add_launch);
  add("calibrate",
      "Build a hardware profile from nccl-tests logs, kernel tables or a moerun bench folder (or a stack "
      "profile from traces) and report how well the cost model predicts each measurement",
      add_calibrate);
  add("compare",
      "Join a prediction with a measured report of the same plan (op by op) or with a Chrome trace of a real "
      "run (by op category); name what the step-time error is made of",
      add_compare);

  add("import",
      "The plan of a Megatron-LM launch (script or pasted flags), as a plan file to simulate, validate or "
      "diff",
      add_import);
  add("diff",
      "Two plans or two reports side by side: the plan fields that differ, the headline figures and every "
      "breakdown category",
      add_diff);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return bad_input(std::string(e.what()) + " (see moeplan --help)");
  }
  for (const auto& [sub, run] : runners) {
    if (sub->parsed()) return run();
  }
  return bad_input("no subcommand given (see moeplan --help)");
}
