// Parameters of moerun's fused tile-level GEMM + communication kernels, read by both the cost model (to
// predict the kernel) and the CUDA backend (to launch it), so the prediction models the kernel that runs.
#pragma once

#include <cstdint>

namespace moeplan {

struct FusedKernelParams {
  int64_t tile_m = 128;         // rows of one output tile
  int64_t tile_n = 256;         // columns of one output tile
  int64_t comm_sms = 0;         // SMs given to communication (0: copy engines move the data)
  int64_t chunks_per_peer = 4;  // row blocks per source/destination rank: the tile pipeline's granularity
};

// GEMM + all-to-all (QKV projection: communication SMs push finished tiles to their heads' ranks) and
// all-to-all + GEMM (output projection, copy engines fetch remote tiles): MegaScale-MoE §4.2 gives
// communication a small number of SMs for the former.
inline constexpr FusedKernelParams kGemmAllToAll{128, 256, 8, 4};
inline constexpr FusedKernelParams kAllToAllGemm{128, 256, 0, 4};
// All-gather + scatter + grouped GEMM and grouped GEMM + gather + reduce-scatter for experts (COMET
// layer0/1). Both move rows with SMs: which rows an expert gathers (and where its results go) is known only
// on the device, from the router, so copy engines, which the host must size, cannot move them without a
// host synchronisation.
inline constexpr FusedKernelParams kAllGatherGroupedGemm{128, 256, 16, 4};
inline constexpr FusedKernelParams kGroupedGemmReduceScatter{128, 256, 16, 4};

// SMs a fused kernel leaves idle when it runs beside other work in a training step: NCCL's kernels on the
// other streams must find an SM while a fused kernel waits on a peer that is itself inside that NCCL
// collective, or the two ranks wait on each other for ever. The cost model computes fused kernels' tiles on
// the SMs left after these and the communication SMs.
inline constexpr int64_t kFusedSmsLeftForCollectives = 4;

}  // namespace moeplan
