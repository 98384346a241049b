// Names of the stack vocabulary, as stack files and reports write them.
#include "simulator/core/stack.h"

#include <algorithm>

namespace moeplan {

const char* name_of(Basis b) {
  switch (b) {
    case Basis::kMeasured:
      return "measured";
    case Basis::kDerived:
      return "derived";
    case Basis::kAssumed:
      return "assumed";
    case Basis::kTarget:
      return "target";
  }
  return "?";
}

const char* name_of(GroupedGemmImpl g) {
  return g == GroupedGemmImpl::kGroupedKernel ? "grouped_kernel" : "per_expert_streams";
}

const char* name_of(DispatcherKind d) {
  switch (d) {
    case DispatcherKind::kNcclAllToAll:
      return "nccl_all_to_all";
    case DispatcherKind::kNcclAllGather:
      return "nccl_all_gather";
    case DispatcherKind::kDeepEp:
      return "deepep";
    case DispatcherKind::kHybridEp:
      return "hybridep";
    case DispatcherKind::kFused:
      return "fused";
  }
  return "?";
}

const char* name_of(AttentionKernel a) {
  switch (a) {
    case AttentionKernel::kFa3:
      return "fa3";
    case AttentionKernel::kCudnn:
      return "cudnn";
    case AttentionKernel::kFa2:
      return "fa2";
  }
  return "?";
}

bool stack_has(const std::vector<std::string>& list, const std::string& value) {
  return list.empty() || std::find(list.begin(), list.end(), value) != list.end();
}

}  // namespace moeplan
