// Ops the cost tests build on: a BF16 8192^3 GEMM (flops left at zero; the GEMM model counts them).
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

}  // namespace moeplan::test
