// `moeplan import --megatron ARGS_OR_SCRIPT --model M`: the plan of a Megatron-LM launch (a script file, or
// the flags pasted as one argument), written as a plan file, so the job a user runs today can be simulated
// and compared with what the planner would change.
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "planner/cli/cli_common.h"
#include "planner/import.h"
#include "planner/launch.h"
#include "planner/search.h"
#include "simulator/io/hardware_loader.h"
#include "simulator/io/json_reader.h"
#include "simulator/io/model_loader.h"
#include "simulator/io/op_trace.h"
#include "simulator/io/plan_io.h"

namespace moeplan::cli {

Runner add_import(CLI::App& app) {
  struct Options {
    std::string megatron, model, hardware = kDefaultHardware, stack, out;
    int64_t gpus = 0;
  };
  auto o = std::make_shared<Options>();
  app.add_option("--megatron", o->megatron,
                 "A Megatron-LM launch: a script file, or the pretrain_gpt.py flags as one quoted argument")
      ->required();
  app.add_option("--model,-m", o->model, "The model the launch trains: a config.json path or a built-in name")
      ->required();
  app.add_option("--hardware", o->hardware, "Hardware profile: a path or a built-in name")
      ->capture_default_str();
  app.add_option("--gpus", o->gpus,
                 "GPUs (default: torchrun --nnodes x --nproc-per-node, or #SBATCH --nodes)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option(
      "--stack", o->stack,
      "Stack profile (default: megatron-core, or its DeepEP / HybridEP variant from the dispatcher)");
  app.add_option("--out,-o", o->out, "Write the plan file here (default: print it)");
  return [o]() {
    std::string text = o->megatron;
    std::error_code ec;
    if (std::filesystem::is_regular_file(o->megatron, ec)) {
      std::ifstream in(o->megatron, std::ios::binary);
      std::ostringstream buf;
      buf << in.rdbuf();
      if (!in && !in.eof()) return bad_input(fmt::format("{}: cannot read file", o->megatron));
      text = buf.str();
    } else if (o->megatron.find("--") == std::string::npos) {
      return bad_input(fmt::format("--megatron {}: no such file, and no --flags in it", o->megatron));
    }
    Result<ModelSpec> model = io::load_model(o->model);
    if (!model) return bad_input(model.error().message);
    Result<HardwareProfile> hw = io::load_hardware(o->hardware);
    if (!hw) return bad_input(hw.error().message);
    planner::ImportOptions options;
    options.gpus = o->gpus;
    options.stack = o->stack;
    options.gpus_per_node = hw.value().node.gpus_per_node.value;
    Result<planner::Imported> imported = planner::import_megatron(text, model.value(), options);
    if (!imported) return bad_input("--megatron: " + imported.error().message);
    nlohmann::json j = imported.value().plan;
    j["model"] = o->model;
    j["hardware"] = o->hardware;
    Result<Plan> read = io::plan_from_json(j, "--megatron");
    if (!read) return bad_input(read.error().message);
    // Inputs named as the loader resolves them from the plan file's folder.
    const Plan plan = planner::rebase_plan_paths(read.value(), "", o->out.empty() ? "plan.json" : o->out);
    const std::string body = io::plan_to_json(plan).dump(2) + "\n";
    if (o->out.empty()) {
      fmt::print("{}", body);
    } else {
      Result<bool> w = write_file_atomic(o->out, body);
      if (!w) return bad_input(w.error().message);
      fmt::print("wrote {}: {}\n", o->out, planner::describe(plan));
    }
    for (const std::string& n : imported.value().notes) fmt::print(stderr, "note: {}\n", n);
    if (!imported.value().unread.empty()) {
      fmt::print(stderr, "note: flags with no plan field, not read: {}\n",
                 fmt::join(imported.value().unread, " "));
    }
    for (const Violation& v : validate(plan, model.value(), hw.value())) {
      fmt::print(stderr, "warning: the plan breaks {}: {}\n", v.rule, v.reason);
    }
    return kExitOk;
  };
}

}  // namespace moeplan::cli
