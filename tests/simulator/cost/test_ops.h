// Ops the cost tests build on: a BF16 8192^3 GEMM (flops left at zero; the GEMM model counts them) and an
// expert-parallel all-to-all.
#pragma once

#include "simulator/core/op_graph.h"

namespace moeplan::test {

inline Op gemm_op() {
  Op op;
  op.kind = OpKind::kGemm;
  op.dtype = DType::kBf16;
  op.gemm = {8192, 8192, 8192, 1};
  return op;
}

inline Op ep_all_to_all_op(int32_t ranks, double bytes) {
  Op op;
  op.kind = OpKind::kCollective;
  op.comm.collective = Collective::kAllToAll;
  op.comm.group = CommGroup::kEp;
  op.comm.group_size = ranks;
  op.comm.bytes = bytes;
  return op;
}

}  // namespace moeplan::test
