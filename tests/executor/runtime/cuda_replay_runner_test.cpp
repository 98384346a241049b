// The CUDA replay runner's up-front refusals (executor/runtime/cuda_replay_runner.h, cuda_unsupported): what
// `moerun run --backend cuda` turns into exit 3 with the reason before any GPU work. No device needed.
#include "executor/runtime/cuda_replay_runner.h"

#include <doctest/doctest.h>

#include <string>

namespace moeplan::executor {

TEST_SUITE("executor_runtime") {
  TEST_CASE(
      "the CUDA replay refuses fused kernels beyond one NVLink domain, encoder-decoders and more than one "
      "MTP "
      "module, and takes pipeline parallelism") {
    Plan p;
    ModelSpec model;
    auto cuda_unsupported = [&](const Plan& plan) { return executor::cuda_unsupported(plan, model); };
    CHECK(cuda_unsupported(p).empty());
    p.pipeline.pp = 2;
    CHECK(cuda_unsupported(p).empty());
    p.pipeline.vpp = 2;
    p.pipeline.schedule = Schedule::kInterleaved1F1B;
    CHECK(cuda_unsupported(p).empty());
    p.pipeline = {};

    // Ulysses sp and EP groups of up to 8 ranks fuse; 16 do not, unless intra-operator overlap is off.
    p.overlap.intra_op = true;
    p.attention.sp = 8;
    p.experts.ep = 8;
    CHECK(cuda_unsupported(p).empty());
    p.attention.sp = 16;
    CHECK(cuda_unsupported(p).find("16 ranks") != std::string::npos);
    p.attention.sp = 1;
    p.experts.ep = 16;
    CHECK(cuda_unsupported(p).find("16 ranks") != std::string::npos);
    p.experts.etp = 2;  // the lowering fuses no expert collectives under ETP
    CHECK(cuda_unsupported(p).empty());
    p.experts.etp = 1;
    p.overlap.intra_op = false;
    CHECK(cuda_unsupported(p).empty());

    // One MTP module replays; two would share their norms' and projection's places in the stash.
    model.mtp_layers = 1;
    CHECK(cuda_unsupported(p).empty());
    p.mtp_layers = 2;
    CHECK(cuda_unsupported(p).find("2 MTP modules") != std::string::npos);
    p.mtp_layers = 1;
    CHECK(cuda_unsupported(p).empty());
    model.mtp_layers = 0;
    p.mtp_layers.reset();

    // An encoder-decoder's attention would replay as square causal self-attention.
    model.layers = {LayerSpec{.role = LayerRole::kEncoder}, LayerSpec{.role = LayerRole::kDecoder}};
    CHECK(cuda_unsupported(p).find("encoder-decoder") != std::string::npos);
  }
}

}  // namespace moeplan::executor
