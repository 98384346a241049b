// The CUTLASS 4.2 SM90 pointer-array grouped GEMM kernels moerun builds on (CUTLASS's example 57 with the
// problem shapes on the device only) and the per-group argument arrays they read from a workspace: the
// experts' GEMMs (grouped_gemm.cu) and the grouped GEMM that pushes its rows into peers' buffers
// (fused/push_gemm.cu). Included by sm_90a .cu files only.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "executor/kernels/cuda/check.h"

#if !defined(CUTLASS_ARCH_MMA_MODIFIABLE_TMA_SM90_SUPPORTED)
#error "the SM90 grouped GEMM needs CUDA >= 12.3 (device-side TMA descriptor updates)"
#endif

namespace moeplan::cuda::grouped_detail {

using ProblemShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;  // (M, N, K) per group
using GroupShape = ProblemShape::UnderlyingProblemShape;
using Bf16 = cutlass::bfloat16_t;
using E4m3 = cutlass::float_e4m3_t;

// 128x256x64 tiles under the cooperative schedule (two consumer warpgroups, 64x256 each, the widest wgmma
// N; FP8: 128x128x128, the same 128 bytes of K per stage, as its promoted accumulation holds a second set of
// accumulators and 64x256 of each would spill registers) and 2x1 clusters that multicast each B tile to both
// CTAs. Chosen, not tuned: gemm_bench measures it against cuBLASLt. Zero-filled TMA loads and clipped TMA
// stores handle every ragged edge.
using ClusterShape = cute::Shape<cute::_2, cute::_1, cute::_1>;

template <class LayoutA_, class LayoutB_, class ElementC_, class ElementD_, class ElementAB = Bf16>
struct ExpertKernel {
  using LayoutA = LayoutA_;
  using LayoutB = LayoutB_;
  using ElementA = ElementAB;
  using ElementC = ElementC_;  // void: no source (D = A B); else D = A B + C with C aliasing D
  using ElementD = ElementD_;
  static constexpr bool kFp8 = std::is_same_v<ElementAB, E4m3>;
  static constexpr int kAlignAB = 128 / cutlass::sizeof_bits<ElementAB>::value;
  using TileShape = cute::conditional_t<kFp8, cute::Shape<cute::_128, cute::_128, cute::_128>,
                                        cute::Shape<cute::_128, cute::_256, cute::_64>>;

  static constexpr int kAlignD = 128 / cutlass::sizeof_bits<ElementD>::value;  // 16-byte TMA rows
  static constexpr int kAlignC =
      cute::is_void_v<ElementC> ? kAlignD : 128 / cutlass::sizeof_bits<ElementC>::value;

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, ElementC, cutlass::layout::RowMajor*,
      kAlignC, ElementD, cutlass::layout::RowMajor*, kAlignD,
      cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
      cutlass::epilogue::fusion::LinearCombination<ElementD, float, ElementC, float>>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementAB, LayoutA*, kAlignAB, ElementAB, LayoutB*,
      kAlignAB, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideC = typename Kernel::InternalStrideC;
  using StrideD = typename Kernel::InternalStrideD;
  using NonVoidC = cute::conditional_t<cute::is_void_v<ElementC>, ElementD, ElementC>;
};

using ForwardKernel = ExpertKernel<cutlass::layout::RowMajor, cutlass::layout::RowMajor, void, Bf16>;
using DgradKernel = ExpertKernel<cutlass::layout::RowMajor, cutlass::layout::ColumnMajor, void, Bf16>;
using WgradKernel = ExpertKernel<cutlass::layout::ColumnMajor, cutlass::layout::RowMajor, float, float>;
// FP8 forward and dgrad share one kernel (both K-major; see the top of the file).
using Fp8Kernel = ExpertKernel<cutlass::layout::RowMajor, cutlass::layout::ColumnMajor, void, Bf16, E4m3>;

// Packed stride of a [rows, cols] operand whose contiguous mode is the one CUTLASS's stride type fixes to _1:
// (cols, _1, _0) for a row-contiguous stride type, (_1, rows, _0) for a column-contiguous one.
template <class Stride>
__device__ Stride packed_stride(int64_t rows, int64_t cols) {
  Stride s{};
  if constexpr (cute::is_static_v<std::remove_cvref_t<decltype(cute::get<0>(s))>>) {
    cute::get<1>(s) = rows;
  } else {
    cute::get<0>(s) = cols;
  }
  return s;
}

// Per-group arguments the CUTLASS kernel reads, laid out in the caller's workspace.
template <class K>
struct GroupArrays {
  GroupShape* shapes;
  const typename K::ElementA** ptr_a;
  const typename K::ElementA** ptr_b;
  const typename K::NonVoidC** ptr_c;
  typename K::ElementD** ptr_d;
  typename K::StrideA* stride_a;
  typename K::StrideB* stride_b;
  typename K::StrideC* stride_c;
  typename K::StrideD* stride_d;
};

constexpr size_t kAlign = 256;
constexpr size_t align_up(size_t n) {
  return (n + kAlign - 1) / kAlign * kAlign;
}

template <class K>
inline size_t group_arrays_bytes(int e) {
  const auto n = static_cast<size_t>(e);
  return align_up(n * sizeof(GroupShape)) + 4 * align_up(n * sizeof(void*)) +
         align_up(n * sizeof(typename K::StrideA)) + align_up(n * sizeof(typename K::StrideB)) +
         align_up(n * sizeof(typename K::StrideC)) + align_up(n * sizeof(typename K::StrideD));
}

template <class K>
GroupArrays<K> carve_group_arrays(void* workspace, int e) {
  auto* p = static_cast<char*>(workspace);
  const auto n = static_cast<size_t>(e);
  auto take = [&](size_t bytes) {
    char* q = p;
    p += align_up(bytes);
    return q;
  };
  GroupArrays<K> g{};
  g.shapes = reinterpret_cast<GroupShape*>(take(n * sizeof(GroupShape)));
  g.ptr_a = reinterpret_cast<const typename K::ElementA**>(take(n * sizeof(void*)));
  g.ptr_b = reinterpret_cast<const typename K::ElementA**>(take(n * sizeof(void*)));
  g.ptr_c = reinterpret_cast<const typename K::NonVoidC**>(take(n * sizeof(void*)));
  g.ptr_d = reinterpret_cast<typename K::ElementD**>(take(n * sizeof(void*)));
  g.stride_a = reinterpret_cast<typename K::StrideA*>(take(n * sizeof(typename K::StrideA)));
  g.stride_b = reinterpret_cast<typename K::StrideB*>(take(n * sizeof(typename K::StrideB)));
  g.stride_c = reinterpret_cast<typename K::StrideC*>(take(n * sizeof(typename K::StrideC)));
  g.stride_d = reinterpret_cast<typename K::StrideD*>(take(n * sizeof(typename K::StrideD)));
  return g;
}

// The current device and its SM count, or why `what` (built for sm_90a alone) cannot run on it.
inline std::string sm90_device(const char* what, int& device, int& sm_count) {
  if (std::string why = device_unavailable(); !why.empty()) return why;
  MOERUN_CUDA_CHECK(cudaGetDevice(&device));
  int major = 0, minor = 0;
  MOERUN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  MOERUN_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  MOERUN_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device));
  if (major != 9 || minor != 0)
    return std::string(what) + " is built for sm_90a (Hopper) only; this device is sm_" +
           std::to_string(major) + std::to_string(minor);
  return {};
}

inline const char* status_name(cutlass::Status s) {
  return cutlassGetStatusString(s);
}

}  // namespace moeplan::cuda::grouped_detail
