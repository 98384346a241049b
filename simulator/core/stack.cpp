// Names of the stack vocabulary, as stack files and reports write them.
#include "simulator/core/stack.h"

#include <algorithm>

#include "simulator/core/op_graph.h"

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

const std::vector<GroupedGemmKernelClass>& grouped_gemm_kernel_classes() {
  using enum GroupedGemmImpl;
  static const std::vector<GroupedGemmKernelClass> classes = {
      {"deepgemm", kGroupedKernel, 1, "DeepGEMM m-grouped FP8 kernel, contiguous or masked: one launch"},
      {"deepgemm_per_group", kPerExpertStreams, 2,
       "DeepGEMM's SM90 k-grouped wgrad before its rewrite: one kernel per group on 2 streams"},
      {"cutlass_grouped", kGroupedKernel, 1, "CUTLASS grouped GEMM (SM80 or SM90 ptr-array): one launch"},
      {"torch_grouped_mm", kGroupedKernel, 1, "torch._grouped_mm, a CUTLASS-based grouped kernel"},
      {"cublas_batched", kGroupedKernel, 1, "cublasGemmGroupedBatchedEx: one call over all experts"},
      {"cublas_loop", kPerExpertStreams, 1, "one cuBLAS GEMM per expert on one stream"},
      {"te_grouped_linear", kPerExpertStreams, 4,
       "TE GroupedLinear on Hopper: cuBLASLt per expert, 4 streams"},
      {"eigen_loop", kPerExpertStreams, 1, "moerun bench on the CPU: one Eigen GEMM per expert, one thread"},
  };
  return classes;
}

const GroupedGemmKernelClass* find_grouped_gemm_kernel(const std::string& name) {
  for (const auto& c : grouped_gemm_kernel_classes()) {
    if (name == c.name) return &c;
  }
  return nullptr;
}

std::string grouped_gemm_kernel_names() {
  std::string names;
  for (const auto& c : grouped_gemm_kernel_classes())
    names += (names.empty() ? "" : ", ") + std::string(c.name);
  return names;
}

std::vector<const std::string*> StackProfile::number_sources() const {
  std::vector<const std::string*> out = {&launch_s_per_kernel.source,
                                         &host_s_per_kernel.source,
                                         &host_s_per_local_expert.source,
                                         &host_s_per_micro_batch.source,
                                         &host_sync_s.source,
                                         &min_kernel_s.source,
                                         &grouped_gemm.impl.source,
                                         &grouped_gemm.streams.source,
                                         &grouped_gemm.efficiency.source,
                                         &grouped_gemm.wgrad_efficiency.source,
                                         &memory_bound_efficiency.source,
                                         &dispatcher.kind.source,
                                         &dispatcher.host_sync.source,
                                         &dispatcher.sms.source,
                                         &dispatcher.nic_efficiency.source,
                                         &dispatcher.nvlink_efficiency.source,
                                         &dispatcher.permute_fused.source,
                                         &dispatcher.permute_host_waits.source,
                                         &dispatcher.permute_index_kernels.source,
                                         &dispatcher.permute_index_backward_kernels.source,
                                         &dispatcher.overlap_efficiency.source,
                                         &expert_mlp.eager_output_bias.source,
                                         &expert_mlp.eager_glu_clamp.source,
                                         &wgrad_accumulation.into_main_grad.source,
                                         &wgrad_accumulation.epilogue_overlap.source,
                                         &attention_kernel.source,
                                         &comm_sm_fraction.source,
                                         &overlap_compute_efficiency.source,
                                         &fused_gemm_efficiency.source,
                                         &userbuffers_rs_speed.source,
                                         &fp8_block_gemm_rate.source,
                                         &recurrent_scan_chunk_s.source,
                                         &overlaps.inter_op.source,
                                         &overlaps.intra_op.source,
                                         &overlaps.dp_comm.source,
                                         &overlaps.pp_comm.source,
                                         &overlaps.cross_micro_batch.source,
                                         &overlaps.tp_comm.source,
                                         &overlaps.pp_comm_needs_vpp.source,
                                         &overlaps.shared_experts.source,
                                         &capabilities.source,
                                         &memory.reserve_bytes.source,
                                         &memory.reserve_bytes_high.source,
                                         &memory.fragmentation.source,
                                         &memory.fragmentation_high.source};
  if (!dispatcher.by_nodes.empty()) out.push_back(&dispatcher.by_nodes_source);
  return out;
}

std::vector<StackProfile::Number> StackProfile::numbers() {
  constexpr double us = 1e-6;
  std::vector<Number> out{{"host.launch_us_per_kernel", &launch_s_per_kernel, us},
                          {"host.issue_us_per_kernel", &host_s_per_kernel, us},
                          {"host.us_per_local_expert", &host_s_per_local_expert, us},
                          {"host.us_per_micro_batch", &host_s_per_micro_batch, us},
                          {"host.sync_us", &host_sync_s, us},
                          {"host.min_kernel_us", &min_kernel_s, us},
                          {"grouped_gemm.efficiency", &grouped_gemm.efficiency, 1.0},
                          {"grouped_gemm.wgrad_efficiency", &grouped_gemm.wgrad_efficiency, 1.0},
                          {"memory_bound_efficiency", &memory_bound_efficiency, 1.0},
                          {"dispatcher.nic_efficiency", &dispatcher.nic_efficiency, 1.0},
                          {"dispatcher.nvlink_efficiency", &dispatcher.nvlink_efficiency, 1.0},
                          {"comm_sm_fraction", &comm_sm_fraction, 1.0},
                          {"overlap_compute_efficiency", &overlap_compute_efficiency, 1.0}};
  if (wgrad_accumulation.into_main_grad.value)
    out.push_back({"wgrad_accumulation.epilogue_overlap", &wgrad_accumulation.epilogue_overlap, 1.0});
  if (dispatch_dedup()) out.push_back({"dispatcher.overlap_efficiency", &dispatcher.overlap_efficiency, 1.0});
  if (fused_gemm_efficiency.source != kNotStated)
    out.push_back({"fused_gemm_efficiency", &fused_gemm_efficiency, 1.0});
  if (overlaps.tp_comm.value && userbuffers_rs_speed.source != kNotStated)
    out.push_back({"userbuffers_rs_speed", &userbuffers_rs_speed, 1.0});
  if (recurrent_scan_chunk_s.source != kNotStated)
    out.push_back({"recurrent_scan.chunk_us", &recurrent_scan_chunk_s, us});
  if (fp8_block_gemm_rate.source != kNotStated)
    out.push_back({"fp8_block_gemm_rate", &fp8_block_gemm_rate, 1.0});
  for (const KindNumber& k : memory_bound_kind_numbers()) {
    Stated<double>& n = memory_bound_by_kind.*k.number;
    if (n.value > 0) out.push_back({k.path, &n, 1.0});
  }
  return out;
}

const std::vector<StackProfile::KindNumber>& StackProfile::memory_bound_kind_numbers() {
  using B = MemoryBoundByKind;
  static const std::vector<KindNumber> kinds = {
      {"glu", false, "memory_bound_efficiency_by_kind.glu.forward", MemOp::kGlu, &B::glu_forward},
      {"glu", true, "memory_bound_efficiency_by_kind.glu.backward", MemOp::kGlu, &B::glu_backward},
      {"loss_unfused", false, "memory_bound_efficiency_by_kind.loss_unfused.forward", MemOp::kLossUnfused,
       &B::loss_unfused_forward},
      {"loss_unfused", true, "memory_bound_efficiency_by_kind.loss_unfused.backward", MemOp::kLossUnfused,
       &B::loss_unfused_backward},
      {"loss_native", false, "memory_bound_efficiency_by_kind.loss_native.forward", MemOp::kLossNative,
       &B::loss_native_forward},
      {"loss_native", true, "memory_bound_efficiency_by_kind.loss_native.backward", MemOp::kLossNative,
       &B::loss_native_backward},
      {"cast", false, "memory_bound_efficiency_by_kind.cast.forward", MemOp::kCast, &B::cast_forward},
      {"cast", true, "memory_bound_efficiency_by_kind.cast.backward", MemOp::kCast, &B::cast_backward}};
  return kinds;
}

const Stated<double>& StackProfile::memory_bound_efficiency_of(MemOp kind, Phase phase) const {
  const bool backward = phase == Phase::kBackward;
  for (const KindNumber& k : memory_bound_kind_numbers()) {
    const Stated<double>& n = memory_bound_by_kind.*k.number;
    if (k.kind == kind && k.backward == backward && n.value > 0) return n;
  }
  return memory_bound_efficiency;
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
