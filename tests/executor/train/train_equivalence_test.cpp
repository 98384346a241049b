// Equivalence of `moerun run --runner train` with the single-rank ReferenceModel: each parallel layout trains
// tiny-moe for 3 steps under mpiexec and must reproduce the reference's step losses and final parameters.
// tiny-moe has 4 layers (L0 dense, L1-L3 MoE): pp 2 puts L0-L1 and the embedding on stage 0, L2-L3 and the
// head on stage 1; pp 2 with vpp 2 gives each of the 4 virtual stages one layer (stage 0: L0, L2; stage 1:
// L1, L3), so every micro-batch crosses the stages three times each way.
//
// Tolerances (fp32 everywhere; the parallel run differs from the reference only in summation order):
//   losses: 1e-5 relative per step. Different fp32 summation orders move a loss of ~6 by a few 1e-7
//     (reference_model.h); 1e-5 leaves a 10x margin and still catches any missing or doubled term (a missing
//     micro-batch moves the loss by ~1/n_micro, a wrong aux scale by ~1e-3).
//   parameters after 3 Adam steps: per tensor, ||run - ref||_2 / ||ref||_2 <= 1e-5. Entry-wise checks are not
//     meaningful after Adam (it turns 1e-10 gradient noise of tiny gradients into ~5e-5 of an entry), while
//     the 2-norm of the tensor sees the ~2e-6 the reference documents; a missing gradient sync shows as
//     ~1e-3.
//   BF16 gradient all-to-all: each rank's gradient is rounded once to bf16 (2^-9 relative, half a bf16 ulp)
//     before the fp32 reduce, so a gradient sum is off by up to 2^-9 (|g_0| + |g_1|), which is not small
//     relative to the sum where the ranks' parts cancel; Adam (~lr * sign(g) in its first steps) then turns
//     such an entry's error into up to 2 lr per step. No closed form bounds the fraction of such entries, so
//     these bounds are measured, with margin: the correct run gives 5.5e-6 (losses) and 1.0e-2 (parameters,
//     an expert tensor); dropping one rank's chunk from the reduce gives 4.2e-4 and 1.1e-1. Bounds 5e-5 and
//     3e-2 sit between the two.
// Negative control: the same dump compared with a reference initialised from another seed must fail both
// bounds, so the comparison can detect a wrong run.
#include <sys/wait.h>
#include <unistd.h>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "executor/comm/wire_format.h"
#include "executor/kernels/cpu/reference_model.h"
#include "simulator/io/model_loader.h"

namespace {

namespace fs = std::filesystem;
using moeplan::executor::WireFormat;
using moeplan::executor::cpu::ReferenceConfig;
using moeplan::executor::cpu::ReferenceModel;

constexpr int kSteps = 3;
constexpr int kSeqLen = 32;
constexpr int kGlobalBatch = 8;
constexpr int kMicroBatch = 2;
constexpr double kLossTol = 1e-5;
constexpr double kParamTol = 1e-5;
constexpr double kBf16LossTol = 5e-5;
constexpr double kBf16ParamTol = 3e-2;

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

fs::path temp(const std::string& name) {
  return fs::temp_directory_path() / ("moerun_train_test_" + std::to_string(::getpid()) + "_" + name);
}

struct Dump {
  std::map<std::string, std::vector<float>> params;  // whole tensors, row-major
};

Dump read_dump(const fs::path& p) {
  const std::string s = slurp(p);
  Dump d;
  REQUIRE(s.size() > 16);
  REQUIRE(s.compare(0, 8, "MOERUNP1") == 0);
  uint64_t n = 0;
  std::memcpy(&n, s.data() + 8, sizeof n);
  const auto header = nlohmann::json::parse(s.substr(16, n));
  const char* values = s.data() + 16 + n;
  for (const auto& e : header["params"]) {
    const auto count = static_cast<size_t>(e["rows"].get<int64_t>() * e["cols"].get<int64_t>());
    std::vector<float> v(count);
    std::memcpy(v.data(), values + e["offset"].get<int64_t>() * 4, count * 4);
    d.params[e["name"].get<std::string>()] = std::move(v);
  }
  return d;
}

struct TrainRun {
  int exit_code = -1;
  std::string err;
  std::vector<double> losses;
  Dump dump;
};

// Runs the plan with `fields` (its parallelism part) on `ranks` ranks under mpiexec.
TrainRun run_train(const std::string& name, int ranks, const std::string& fields) {
  const fs::path plan = temp(name + ".json"), out = temp(name + "_out"), dump = temp(name + ".params");
  std::ofstream(plan) << "{\"model\": \"" MOEPLAN_SOURCE_DIR
                         "/models/tiny-moe.json\", \"hardware\": \"" MOEPLAN_SOURCE_DIR
                         "/hwprofiles/h100-sxm.json\", \"gpus\": "
                      << ranks << ", \"seq_len\": " << kSeqLen << ", \"global_batch\": " << kGlobalBatch
                      << ", \"micro_batch\": " << kMicroBatch << ", " << fields << "}";
  const std::string err = temp(name + ".err").string();
  const std::string cmd = "'" MPIEXEC "' --allow-run-as-root --oversubscribe -n " + std::to_string(ranks) +
                          " '" MOERUN_BIN "' run '" + plan.string() + "' --runner train --steps " +
                          std::to_string(kSteps) + " --warmup 0 --out '" + out.string() +
                          "' --dump-params '" + dump.string() + "' >/dev/null 2>'" + err + "'";
  const int status = std::system(cmd.c_str());
  TrainRun r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.err = slurp(err);
  if (r.exit_code == 0) {
    const auto report = nlohmann::json::parse(slurp(out / "report.json"));
    r.losses = report["losses"].get<std::vector<double>>();
    r.dump = read_dump(dump);
  }
  fs::remove(plan);
  fs::remove(err);
  fs::remove(dump);
  fs::remove_all(out);
  return r;
}

struct Reference {
  std::vector<double> losses;
  std::map<std::string, std::vector<float>> params;
};

Reference reference(uint64_t param_seed, ReferenceConfig cfg = {}) {
  auto m = moeplan::io::load_model("tiny-moe");
  REQUIRE(m.ok());
  cfg.param_seed = param_seed;
  ReferenceModel<float> ref(m.value(), cfg);
  Reference r;
  for (int s = 0; s < kSteps; ++s) {
    std::vector<int64_t> seqs(kGlobalBatch);
    for (int i = 0; i < kGlobalBatch; ++i) seqs[static_cast<size_t>(i)] = int64_t{s} * kGlobalBatch + i;
    r.losses.push_back(static_cast<double>(ref.train_step(seqs, kMicroBatch, kSeqLen)));
  }
  for (const auto& i : ref.params()) {
    const auto p = ref.param(i.name);
    r.params[i.name] = std::vector<float>(p.data(), p.data() + p.size());
  }
  return r;
}

const Reference& reference_default() {
  static const Reference r = reference(moeplan::executor::cpu::kDefaultParamSeed);
  return r;
}

// The reference of an FP8 dispatch over `ep` ranks: what the parallel run's all-to-all does to the permuted
// rows. Each EP peer's segment (the rows of its experts, contiguous in expert-major order) is packed alone,
// so FP8 blocks of 128 values start at each segment's first value; gradients come back as bf16
// (element-wise).
ReferenceConfig fp8_dispatch_reference(int64_t ep, int64_t experts) {
  ReferenceConfig cfg;
  const int64_t per_rank = experts / ep;
  cfg.dispatch_fwd = [=](float* rows, int64_t cols, std::span<const int64_t> offsets) {
    for (int64_t p = 0; p < ep; ++p) {
      const int64_t r0 = offsets[static_cast<size_t>(p * per_rank)];
      const int64_t r1 = offsets[static_cast<size_t>((p + 1) * per_rank)];
      moeplan::executor::round_trip(
          WireFormat::kFp8E4m3, std::span<float>(rows + r0 * cols, static_cast<size_t>((r1 - r0) * cols)));
    }
  };
  cfg.dispatch_bwd = [](float* rows, int64_t cols, std::span<const int64_t> offsets) {
    moeplan::executor::round_trip(WireFormat::kBf16,
                                  std::span<float>(rows, static_cast<size_t>(offsets.back() * cols)));
  };
  return cfg;
}

struct Diff {
  double loss = 0, param = 0;  // max relative differences
  std::string worst_param;
};

Diff compare(const TrainRun& run, const Reference& ref) {
  Diff d;
  REQUIRE(run.losses.size() == ref.losses.size());
  for (size_t i = 0; i < ref.losses.size(); ++i)
    d.loss = std::max(d.loss, std::abs(run.losses[i] - ref.losses[i]) / std::abs(ref.losses[i]));
  REQUIRE(run.dump.params.size() == ref.params.size());
  for (const auto& [name, want] : ref.params) {
    const auto it = run.dump.params.find(name);
    REQUIRE_MESSAGE(it != run.dump.params.end(), name);
    REQUIRE(it->second.size() == want.size());
    double num = 0, den = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      const double e = static_cast<double>(it->second[i]) - static_cast<double>(want[i]);
      num += e * e;
      den += static_cast<double>(want[i]) * static_cast<double>(want[i]);
    }
    const double rel = std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
    if (rel > d.param) {
      d.param = rel;
      d.worst_param = name;
    }
  }
  return d;
}

void check_layout(const std::string& name, int ranks, const std::string& fields, double loss_tol = kLossTol,
                  double param_tol = kParamTol) {
  const TrainRun run = run_train(name, ranks, fields);
  REQUIRE_MESSAGE(run.exit_code == 0, run.err);
  const Diff d = compare(run, reference_default());
  MESSAGE(name << " (" << ranks << " ranks): max loss rel diff " << d.loss << ", max param 2-norm rel diff "
               << d.param << " (" << d.worst_param << ")");
  CHECK(d.loss <= loss_tol);
  CHECK(d.param <= param_tol);
}

constexpr const char* kNoOverlap =
    "\"overlap\": {\"inter_op\": false, \"intra_op\": false, \"dp_comm\": true, \"pp_comm\": false}";
constexpr const char* kOverlap =
    "\"overlap\": {\"inter_op\": true, \"intra_op\": false, \"dp_comm\": true, \"pp_comm\": false}";
const std::string kDp2 = std::string("\"attention\": {\"tp\": 1}, \"experts\": {\"ep\": 1}, ") + kNoOverlap;
const std::string kEp2 = std::string("\"attention\": {\"tp\": 1}, \"experts\": {\"ep\": 2}, ") + kNoOverlap;
const std::string kTp2 = std::string("\"attention\": {\"tp\": 2}, \"experts\": {\"ep\": 1}, ") + kNoOverlap;
constexpr const char* kPp2 = "\"pipeline\": {\"pp\": 2, \"vpp\": 1, \"schedule\": \"1f1b\"}";
constexpr const char* kPp2Vpp2 = "\"pipeline\": {\"pp\": 2, \"vpp\": 2, \"schedule\": \"interleaved_1f1b\"}";

}  // namespace

TEST_SUITE("train") {
  TEST_CASE("dp 2 with ZeRO-1 reduce-scatter and all-gather trains like the reference") {
    check_layout("dp2_zero1", 2, kDp2 + ", \"data\": {\"zero\": 1}");
  }

  TEST_CASE("dp 2 without ZeRO all-reduces gradients and trains like the reference") {
    check_layout("dp2_zero0", 2, kDp2 + ", \"data\": {\"zero\": 0}");
  }

  TEST_CASE("ep 2 with all-to-all dispatch trains like the reference") {
    check_layout("ep2", 2, kEp2 + ", \"data\": {\"zero\": 1}");
  }

  TEST_CASE("tp 2 with sequence parallelism trains like the reference") {
    check_layout("tp2", 2, kTp2 + ", \"data\": {\"zero\": 1}");
  }

  TEST_CASE("dp 2 with ZeRO-2 per-micro-batch reduce-scatter trains like the reference") {
    check_layout("dp2_zero2", 2, kDp2 + ", \"data\": {\"zero\": 2}");
  }

  TEST_CASE("ep 2 with ZeRO-3 parameter gathers trains like the reference") {
    check_layout("ep2_zero3", 2, kEp2 + ", \"data\": {\"zero\": 3}");
  }

  TEST_CASE("dp 2 with BF16 gradient all-to-all and a local fp32 reduce trains within the bf16 bound") {
    check_layout("dp2_bf16", 2,
                 kDp2 + ", \"data\": {\"zero\": 1}, \"compression\": {\"grad_sync\": \"bf16_all_to_all\"}",
                 kBf16LossTol, kBf16ParamTol);
  }

  TEST_CASE("ep 2 with full recompute trains like the reference") {
    check_layout("ep2_full_recompute", 2, kEp2 + ", \"data\": {\"zero\": 1}, \"recompute\": \"full\"");
  }

  TEST_CASE("tp 2 with selective recompute trains like the reference") {
    check_layout("tp2_selective", 2, kTp2 + ", \"data\": {\"zero\": 1}, \"recompute\": \"selective\"");
  }

  TEST_CASE("tp 2 with ep 2 and dp 2 on 4 ranks trains like the reference") {
    check_layout("tp2_ep2_dp2", 4,
                 std::string("\"attention\": {\"tp\": 2}, \"experts\": {\"ep\": 2}, ") + kNoOverlap +
                     ", \"data\": {\"zero\": 1}");
  }

  TEST_CASE("sp 2 with Ulysses all-to-alls around attention trains like the reference") {
    check_layout("sp2", 2,
                 std::string("\"attention\": {\"tp\": 1, \"sp\": 2}, \"experts\": {\"ep\": 1}, ") +
                     kNoOverlap + ", \"data\": {\"zero\": 1}");
  }

  TEST_CASE("tp 2 with sp 2 and ep 2 on 4 ranks trains like the reference") {
    check_layout("tp2_sp2_ep2", 4,
                 std::string("\"attention\": {\"tp\": 2, \"sp\": 2}, \"experts\": {\"ep\": 2}, ") +
                     kNoOverlap + ", \"data\": {\"zero\": 1}");
  }

  TEST_CASE("cp 2 with load-balanced chunks and a k v all-gather trains like the reference") {
    check_layout("cp2", 2,
                 std::string("\"attention\": {\"tp\": 1, \"cp\": 2}, \"experts\": {\"ep\": 1}, ") +
                     kNoOverlap + ", \"data\": {\"zero\": 1}");
  }

  TEST_CASE("sp 2 with cp 2 and ep 2 on 4 ranks trains like the reference") {
    check_layout("sp2_cp2_ep2", 4,
                 std::string("\"attention\": {\"tp\": 1, \"sp\": 2, \"cp\": 2}, \"experts\": {\"ep\": 2}, ") +
                     kNoOverlap + ", \"data\": {\"zero\": 1}");
  }

  TEST_CASE(
      "etp 2 with expert shards and a variable all-gather of the dispatched rows trains like the reference") {
    check_layout("etp2", 2,
                 std::string("\"attention\": {\"tp\": 1}, \"experts\": {\"ep\": 1, \"etp\": 2}, ") +
                     kNoOverlap + ", \"data\": {\"zero\": 1}");
  }

  TEST_CASE("etp 2 with ep 2 on 4 ranks trains like the reference") {
    check_layout("etp2_ep2", 4,
                 std::string("\"attention\": {\"tp\": 1}, \"experts\": {\"ep\": 2, \"etp\": 2}, ") +
                     kNoOverlap + ", \"data\": {\"zero\": 1}");
  }

  // Inter-operator overlap: collectives run on the comm stream's thread and shared experts on the side
  // stream's, concurrently with the compute stream, so these also check that no two threads race.
  TEST_CASE("ep 2 with inter-operator overlap on comm and side streams trains like the reference") {
    check_layout("ep2_overlap", 2,
                 std::string("\"attention\": {\"tp\": 1}, \"experts\": {\"ep\": 2}, ") + kOverlap +
                     ", \"data\": {\"zero\": 2}");
  }

  TEST_CASE("tp 2 with sp 2 and ep 2 and inter-operator overlap on 4 ranks trains like the reference") {
    check_layout("tp2_sp2_ep2_overlap", 4,
                 std::string("\"attention\": {\"tp\": 2, \"sp\": 2}, \"experts\": {\"ep\": 2}, ") + kOverlap +
                     ", \"data\": {\"zero\": 1}");
  }

  TEST_CASE("sp 2 with cp 2 and inter-operator overlap on 4 ranks trains like the reference") {
    check_layout("sp2_cp2_overlap", 4,
                 std::string("\"attention\": {\"tp\": 1, \"sp\": 2, \"cp\": 2}, \"experts\": {\"ep\": 1}, ") +
                     kOverlap + ", \"data\": {\"zero\": 1}");
  }

  TEST_CASE("ep 2 with all-gather dispatch and reduce-scatter combine trains like the reference") {
    check_layout("ep2_allgather", 2,
                 std::string("\"attention\": {\"tp\": 1}, \"experts\": {\"ep\": 2, \"dispatch\": "
                             "\"all_gather\"}, ") +
                     kNoOverlap + ", \"data\": {\"zero\": 1}");
  }

  // FP8 dispatch really rounds on the wire: the run matches, at fp32 tolerance, a reference that rounds the
  // same rows the same way, and its parameters miss the unrounded reference's by far more than that
  // tolerance.
  TEST_CASE("ep 2 with FP8 dispatch trains like a reference that rounds the dispatched rows to e4m3") {
    const TrainRun run =
        run_train("ep2_fp8", 2, kEp2 + ", \"data\": {\"zero\": 1}, \"compression\": {\"dispatch\": \"fp8\"}");
    REQUIRE_MESSAGE(run.exit_code == 0, run.err);
    const Diff d =
        compare(run, reference(moeplan::executor::cpu::kDefaultParamSeed, fp8_dispatch_reference(2, 8)));
    MESSAGE("ep2_fp8 against the rounding reference: loss " << d.loss << ", param " << d.param << " ("
                                                            << d.worst_param << ")");
    CHECK(d.loss <= kLossTol);
    CHECK(d.param <= kParamTol);
    const Diff plain = compare(run, reference_default());
    MESSAGE("ep2_fp8 against the unrounded reference: loss " << plain.loss << ", param " << plain.param);
    CHECK(plain.param >
          100 * kParamTol);  // measured: 1.8e-2 (the loss moves only ~6e-6: tiny-moe's is mostly CE)
  }

  // 4 micro-batches per step through 2 stages: no data parallelism, so the stages' optimizers update their
  // own layers and the loss sums the last stage's cross-entropy and both stages' aux losses.
  TEST_CASE("pp 2 with 1F1B trains like the reference") {
    check_layout("pp2_1f1b", 2, kDp2 + ", " + kPp2 + ", \"data\": {\"zero\": 1}");
  }

  // Sends on their own lane (pp_comm overlap), which Megatron-Core requires for a virtual pipeline at pp = 2
  // (planner/launch.cpp).
  TEST_CASE("pp 2 with interleaved 1F1B (vpp 2) trains like the reference") {
    check_layout(
        "pp2_vpp2", 2,
        std::string("\"attention\": {\"tp\": 1}, \"experts\": {\"ep\": 1}, \"overlap\": {\"inter_op\": "
                    "false, \"intra_op\": false, \"dp_comm\": true, \"pp_comm\": true}, ") +
            kPp2Vpp2 + ", \"data\": {\"zero\": 1}");
  }

  // Each stage's ZeRO-1 reduce-scatter, optimizer shard and all-gather run over its own dp pair; the
  // embedding and head gradients are summed over their stage only.
  TEST_CASE("pp 2 with dp 2 and ZeRO-1 on 4 ranks trains like the reference") {
    check_layout("pp2_dp2", 4, kDp2 + ", " + kPp2 + ", \"data\": {\"zero\": 1}");
  }

  // Uneven split (stage 0: L0; stage 1: L1-L3 and the head) with tp 2 and ep 2 inside each stage: the head's
  // gradients are summed over the tp pair of the last stage.
  TEST_CASE("pp 2 with an uneven layer split, tp 2 and ep 2 on 4 ranks trains like the reference") {
    check_layout(
        "pp2_uneven_tp2_ep2", 4,
        std::string("\"attention\": {\"tp\": 2}, \"experts\": {\"ep\": 2}, ") + kNoOverlap +
            ", \"pipeline\": {\"pp\": 2, \"vpp\": 1, \"schedule\": \"1f1b\", \"layers_per_stage\": [1, 3]}, "
            "\"data\": {\"zero\": 1}");
  }

  TEST_CASE("a wrong reference is detected as a mismatch by the same comparison") {
    const TrainRun run = run_train("negative", 2, kEp2 + ", \"data\": {\"zero\": 1}");
    REQUIRE_MESSAGE(run.exit_code == 0, run.err);
    const Diff good = compare(run, reference_default());
    CHECK(good.loss <= kLossTol);
    const Diff bad = compare(run, reference(moeplan::executor::cpu::kDefaultParamSeed + 1));
    MESSAGE("against another seed: loss rel diff " << bad.loss << ", param rel diff " << bad.param);
    CHECK(bad.loss > kLossTol);
    CHECK(bad.param > kParamTol);
  }

  TEST_CASE("a layout the train runner cannot do exits 3 with one line naming it") {
    const fs::path plan = temp("unsupported.json"), out = temp("unsupported_out");
    std::ofstream(plan) << "{\"model\": \"" MOEPLAN_SOURCE_DIR
                           "/models/tiny-moe.json\", \"hardware\": \"" MOEPLAN_SOURCE_DIR
                           "/hwprofiles/h100-sxm.json\", \"gpus\": 2, \"seq_len\": 32, \"global_batch\": 8, "
                           "\"micro_batch\": 2, \"attention\": {\"tp\": 1}, "
                           "\"experts\": {\"ep\": 2, \"dispatch\": \"dedup\"}}";
    const fs::path err = temp("unsupported.err");
    const std::string cmd = "'" MPIEXEC "' --allow-run-as-root --oversubscribe -n 2 '" MOERUN_BIN "' run '" +
                            plan.string() + "' --runner train --steps 1 --out '" + out.string() + "' 2>'" +
                            err.string() + "' >/dev/null";
    const int status = std::system(cmd.c_str());
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 3);
    const std::string text = slurp(err);
    CHECK(text.find("moerun: ") == 0);
    CHECK(text.find("the train runner does not support deduplicated all-to-all dispatch") !=
          std::string::npos);
    CHECK(!fs::exists(out / "report.json"));
    fs::remove(plan);
    fs::remove(err);
  }
}
