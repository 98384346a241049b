// Where each weight of a stage lies in one contiguous parameter buffer, as Megatron's DDP keeps a stage's
// parameters and their main gradients (param_and_grad_buffer.py): the GPU replay's GEMMs read their weight
// and accumulate their weight gradient at the weight's own place in real-sized buffers, not in scratch
// buffers that every op shares (which stay hot in L2 and hold none of the stage's parameter memory).
// A weight is a GEMM op's B operand: [k, n] of a dense GEMM, [groups, k, n] of a grouped one, named by the
// op's layer and name (its forward, recomputed forward, data- and weight-gradient ops share them). Fused GEMM
// + communication ops keep their own memory and are not placed.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <utility>

#include "simulator/core/op_graph.h"

namespace moeplan::executor {

struct ParamSlice {
  int64_t offset = 0;    // in elements from the buffer's start
  int64_t elements = 0;  // k n (dense) or groups k n (grouped)
};

struct ParamLayout {
  std::map<std::pair<int32_t, uint16_t>, ParamSlice> slices;  // by (layer, op name), in that order
  int64_t elements = 0;                                       // the buffer's size: every slice, packed

  // The weight of a GEMM op of the stage, or nullptr for an op without one.
  const ParamSlice* of(const Op& op) const;
};

// Whether an op's B operand is a weight that the layout places.
bool has_weight(const Op& op);

// The weights of `stage`'s ops, packed in (layer, name) order, each slice 256-byte aligned at 1 byte per
// element (so at 2 and 4 bytes too). Ops of one weight with different shapes get the largest.
ParamLayout param_layout(std::span<const Op> ops, int stage);

}  // namespace moeplan::executor
