// Plan: one parallel layout, overlap, compression and recompute choice for one job (GPUs, sequence, batch),
// in the plan-file form of DESIGN.md ("Contracts"). validate() lists every rule the plan breaks for a model.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "simulator/core/hardware.h"
#include "simulator/core/model_spec.h"

namespace moeplan {

enum class Dispatch { kAllToAll, kAllGather, kDedup };
enum class Schedule { k1F1B, kInterleaved1F1B };
enum class GradSync { kFp32ReduceScatter, kBf16AllToAll };
enum class DispatchPrecision { kBf16, kFp8 };
enum class Precision { kBf16, kFp8 };
enum class Recompute { kNone, kSelective, kFull };

struct Plan {
  // Paths as written in the plan file (relative to it) or built-in names.
  std::string model;
  std::string hardware;
  std::string stack;  // empty: moerun's own stack

  int64_t gpus = 0;
  int64_t seq_len = 0;
  int64_t global_batch = 0;  // sequences per step
  int64_t micro_batch = 1;   // sequences per micro-batch

  struct Attention {
    int64_t tp = 1;  // Megatron tensor parallelism with sequence parallelism
    int64_t sp = 1;  // Ulysses sequence parallelism (all-to-all over heads)
    int64_t cp = 1;  // context parallelism (ring / all-gather of K/V)
  } attention;

  struct Experts {
    int64_t ep = 1;
    int64_t etp = 1;
    Dispatch dispatch = Dispatch::kAllToAll;
  } experts;

  struct Pipeline {
    int64_t pp = 1;
    int64_t vpp = 1;
    Schedule schedule = Schedule::k1F1B;
    std::vector<int64_t> layers_per_stage;  // per virtual stage; empty = as even as possible
  } pipeline;

  struct Data {
    int64_t zero = 1;  // 0..3 (1 = distributed optimizer)
  } data;

  struct Overlap {
    bool inter_op = false;
    bool intra_op = false;
    bool dp_comm = false;
    bool pp_comm = false;
  } overlap;

  struct Compression {
    GradSync grad_sync = GradSync::kFp32ReduceScatter;
    DispatchPrecision dispatch = DispatchPrecision::kBf16;
  } compression;

  Precision precision = Precision::kBf16;
  Recompute recompute = Recompute::kNone;

  struct Routing {
    std::string distribution = "uniform";  // "uniform", "zipf:<s>", or a router-trace file
    std::optional<double> capacity_factor;
  } routing;

  // Derived sizes.
  int64_t attention_mesh() const { return attention.tp * attention.sp * attention.cp; }
  int64_t expert_mesh() const { return experts.ep * experts.etp; }
  int64_t gpus_per_stage() const { return gpus / pipeline.pp; }
  int64_t dp() const { return gpus_per_stage() / attention_mesh(); }      // attention data parallelism
  int64_t expert_dp() const { return gpus_per_stage() / expert_mesh(); }  // expert data parallelism
  int64_t num_micro_batches() const { return global_batch / (micro_batch * dp()); }
};

struct Violation {
  std::string rule;    // short id, e.g. "heads_divisible"
  std::string reason;  // one sentence with the numbers
};

// Every rule the plan breaks for this model on this hardware; empty when the plan is legal. Memory fit is not
// a rule here: it is the cost model's verdict.
// Without reasons, each violation names its rule only (the planner counts rules over millions of plans).
std::vector<Violation> validate(const Plan& plan, const ModelSpec& model, const HardwareProfile& hw,
                                bool reasons = true);

// Names used in plan files and reports.
const char* name_of(Dispatch d);
const char* name_of(Schedule s);
const char* name_of(GradSync g);
const char* name_of(DispatchPrecision d);
const char* name_of(Precision p);
const char* name_of(Recompute r);

}  // namespace moeplan
