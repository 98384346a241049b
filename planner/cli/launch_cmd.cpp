// `moeplan launch PLAN --for moerun|megatron|slurm`: the launch configuration of a legal plan, on stdout or
// written atomically to --out (for moerun, --out is where the plan file goes and the command lines name it).
#include <cstdio>

#include <fmt/format.h>

#include "planner/cli/cli_common.h"
#include "planner/launch.h"
#include "simulator/io/plan_io.h"
#include "simulator/predict/report.h"

namespace moeplan::cli {

Runner add_launch(CLI::App& app) {
  struct Options {
    std::string plan, target, out, run_dir, backend = "cuda";
    bool json = false, calibrate = false;
  };
  auto o = std::make_shared<Options>();
  app.add_option("plan", o->plan, "Plan file (JSON)")->required();
  app.add_option("--for", o->target,
                 "What to launch with: moerun (plan file + mpirun/srun lines), megatron "
                 "(Megatron-LM arguments) or slurm (sbatch script for moerun)")
      ->required()
      ->check(CLI::IsMember({"moerun", "megatron", "slurm"}));
  app.add_option("--out", o->out,
                 "Write to this file instead of stdout (moerun: the plan file the command lines run)");
  app.add_option("--run-dir", o->run_dir, "Directory moerun writes its report to (default runs/<plan name>)");
  app.add_option("--backend", o->backend,
                 "moerun and slurm: the backend moerun runs on (cuda: one GPU per local rank, NCCL; cpu: MPI "
                 "ranks with Eigen kernels)")
      ->capture_default_str()
      ->check(CLI::IsMember({"cuda", "cpu"}));
  app.add_flag("--calibrate", o->calibrate,
               "slurm: measure the job's nodes first (moerun bench), fit a hardware profile from that "
               "(moeplan calibrate), predict the plan on it, run it and compare op by op");
  app.add_flag("--json", o->json, "Print one JSON object");
  return [o]() {
    if (o->calibrate && o->target != "slurm") return bad_input("--calibrate: only with --for slurm");
    Result<io::LoadedPlan> loaded = io::load_plan(o->plan);
    if (!loaded) return bad_input(loaded.error().message);
    const auto& [plan, model, hw, path] = loaded.value();
    const std::vector<Violation> violations = validate(plan, model, hw);
    if (!violations.empty()) {
      std::string reasons;
      for (const auto& v : violations) reasons += fmt::format("; {}: {}", v.rule, v.reason);
      std::fprintf(stderr, "moeplan: %s: the plan cannot run, %zu rule(s) broken%s\n", path.c_str(),
                   violations.size(), reasons.c_str());
      return kExitInfeasible;
    }

    // full: the target's whole text; file: what --out receives; shown: what stdout gets without --json.
    nlohmann::json j = {{"target", o->target}};
    std::string full, file, shown;
    if (o->target == "moerun") {
      // The plan file moerun runs: a copy at --out (paths rebased to it), else the given plan itself.
      const std::string plan_path = o->out.empty() ? path : o->out;
      const Plan out_plan = o->out.empty() ? plan : planner::rebase_plan_paths(plan, path, o->out);
      const std::string run_dir = o->run_dir.empty() ? planner::default_run_dir(plan_path) : o->run_dir;
      const planner::MoerunLaunch l = planner::moerun_launch(out_plan, hw, plan_path, run_dir, o->backend);
      full = planner::moerun_text(out_plan, model, hw, plan_path, run_dir, o->backend);
      file = l.plan_json;
      shown = o->out.empty() ? full : fmt::format("# wrote {}\n{}\n{}\n", o->out, l.mpirun, l.srun);
      j["plan"] = io::plan_to_json(out_plan);
      j["commands"] = {{"mpirun", l.mpirun}, {"srun", l.srun}};
      j["backend"] = o->backend;
    } else if (o->target == "slurm") {
      const std::string run_dir = o->run_dir.empty() ? planner::default_run_dir(path) : o->run_dir;
      full = file = planner::slurm_script(plan, model, hw, path, run_dir, o->backend, o->calibrate);
      shown = o->out.empty() ? full : fmt::format("# wrote {}; submit it with: sbatch {}\n", o->out, o->out);
      j["backend"] = o->backend;
      j["calibrate"] = o->calibrate;
    } else {
      const planner::MegatronArgs a = planner::megatron_args(plan, model, hw);
      full = file = planner::megatron_text(plan, model, hw, path);
      shown =
          o->out.empty() ? full : fmt::format("# wrote {}; run it once per node: bash {}\n", o->out, o->out);
      j["megatron_commit"] = planner::kMegatronCommit;
      j["flags"] = a.flags;
      j["not_expressible"] = a.not_expressible;
      j["notes"] = a.notes;
      j["env"] = a.env;
    }
    j["text"] = full;

    if (!o->out.empty()) {
      Result<bool> w = write_file_atomic(o->out, file);
      if (!w) return bad_input(w.error().message);
      j["out"] = o->out;
    }
    if (o->json) {
      print_json(j);
    } else {
      fmt::print("{}", shown);
    }
    return kExitOk;
  };
}

}  // namespace moeplan::cli
