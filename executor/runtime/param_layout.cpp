// Packs a stage's weights into one parameter buffer (see param_layout.h).
#include "executor/runtime/param_layout.h"

#include <algorithm>

namespace moeplan::executor {

bool has_weight(const Op& op) {
  return (op.kind == OpKind::kGemm || op.kind == OpKind::kGroupedGemm) && op.gemm.n > 0 && op.gemm.k > 0;
}

namespace {

int64_t weight_elements(const Op& op) {
  return std::max<int64_t>(1, op.gemm.groups) * op.gemm.k * op.gemm.n;
}

}  // namespace

const ParamSlice* ParamLayout::of(const Op& op) const {
  if (!has_weight(op)) return nullptr;
  const auto it = slices.find({op.layer, op.name});
  return it == slices.end() ? nullptr : &it->second;
}

ParamLayout param_layout(std::span<const Op> ops, int stage) {
  constexpr int64_t kAlign = 256;
  ParamLayout out;
  for (const Op& op : ops) {
    if (op.stage != stage || !has_weight(op)) continue;
    ParamSlice& s = out.slices[{op.layer, op.name}];
    s.elements = std::max(s.elements, weight_elements(op));
  }
  for (auto& [key, s] : out.slices) {
    s.offset = out.elements;
    out.elements += (s.elements + kAlign - 1) / kAlign * kAlign;
  }
  return out;
}

}  // namespace moeplan::executor
