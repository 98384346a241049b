// Which of moerun's four fused GEMM + communication kernels runs a kFusedGemmComm op, so that the cost model
// prices the op with that kernel's parameters (fused_kernels.h) and the CUDA backend launches that kernel
// (executor/runtime/fused_ops.h, executor/kernels/cuda/fused/).
//
// The forward ops that gather before their GEMM (dispatch + fc13, all-to-all + output projection) run the
// gathering kernels; their dgrad (the transposed kernel: its collective reverses) scatters after its GEMM,
// and the other way round for the rest.
#pragma once

#include "simulator/core/fused_kernels.h"
#include "simulator/core/op_graph.h"

namespace moeplan {

enum class FusedKind {
  kGatherGrouped,   // all-gather + scatter + grouped GEMM
  kGroupedScatter,  // grouped GEMM + gather + reduce-scatter
  kGemmA2a,         // GEMM + all-to-all
  kA2aGemm,         // all-to-all + GEMM
};

inline FusedKind fused_kind(const Op& op) {
  const auto name = static_cast<OpName>(op.name);
  const bool grouped = name == OpName::kAgScatterFc13 || name == OpName::kA2aFc13 ||
                       name == OpName::kFc2GatherRs || name == OpName::kFc2A2a;
  const bool gathers_forward =
      name == OpName::kAgScatterFc13 || name == OpName::kA2aFc13 || name == OpName::kA2aOutProj;
  const bool gathers = gathers_forward == (op.part != GemmPart::kDgrad);
  return grouped ? (gathers ? FusedKind::kGatherGrouped : FusedKind::kGroupedScatter)
                 : (gathers ? FusedKind::kA2aGemm : FusedKind::kGemmA2a);
}

inline const FusedKernelParams& fused_params(FusedKind k) {
  switch (k) {
    case FusedKind::kGatherGrouped:
      return kAllGatherGroupedGemm;
    case FusedKind::kGroupedScatter:
      return kGroupedGemmReduceScatter;
    case FusedKind::kGemmA2a:
      return kGemmAllToAll;
    case FusedKind::kA2aGemm:
      return kAllToAllGemm;
  }
  return kGemmAllToAll;
}

}  // namespace moeplan
