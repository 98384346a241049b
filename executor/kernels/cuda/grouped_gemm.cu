// GroupedGemm (grouped_gemm.h) on CUTLASS 4.2's SM90 pointer-array grouped GEMM, the API of CUTLASS's
// example 57 (hopper_grouped_gemm) with the problem shapes on the device only (host shapes = nullptr): the
// kernel is persistent (one CTA per SM) and its tile scheduler reads each group's (M, N, K) from device
// memory. This file is built for sm_90a alone (wgmma and TMA-descriptor updates exist only there).
//
// One kernel per expert op, because each needs its own operand majorness (a compile-time property of the TMA
// and wgmma layouts); D is always row-major. In CUTLASS's terms A is [M, K] and B is [N, K]:
//   kForward: M = m_e, N = out, K = in;  A = x_e [m_e, in] K-major;   B(n, k) = W_e[k, n]: N-major
//   kDgrad:   M = m_e, N = in,  K = out; A = dy_e [m_e, out] K-major; B(n, k) = W_e[n, k]: K-major
//   kWgrad:   M = in,  N = out, K = m_e; A(i, t) = x_e[t, i]: M-major; B(j, t) = dy_e[t, j]: N-major
// wgrad's reduction dimension is the expert's token count, so it too is just a per-group K in the device
// shapes. FP8 (e4m3 A and B, forward and dgrad): Hopper's FP8 wgmma reads both operands K-major, so the
// forward's B is the expert's transposed weight Wt_e [out, in] (B(n, k) = Wt_e[n, k]: K-major), the layout of
// the dgrad kernel; dgrad's operands are K-major already. Both accumulate in fp32 with promotion (CUTLASS's
// FP8 mainloop adds the tensor cores' limited-precision partial sums into fp32 registers every few k-blocks,
// as cuBLASLt does by default and DeepSeek-V3's recipe does) and write bf16.
#include "executor/kernels/cuda/grouped_gemm.h"

#include <cuda_bf16.h>

#include <cstdio>
#include <cstdlib>
#include <cub/block/block_scan.cuh>
#include <type_traits>

#include "executor/kernels/cuda/check.h"
#include "executor/kernels/cuda/grouped_gemm_kernels.cuh"

namespace moeplan::cuda {
namespace {

using namespace grouped_detail;

// The setup kernel is one block of kSetupThreads threads with kExpertsPerThread experts each.
constexpr int kSetupThreads = 256, kExpertsPerThread = 4;
constexpr int kMaxExperts = kSetupThreads * kExpertsPerThread;

// Expert e's shape, pointers and strides (see the table at the top of the file), given its row count m and
// first row `offset`. An empty expert gets M = 0, which the tile scheduler skips (no tiles): for wgrad that
// keeps K = 0 out of the mainloop, which would leave the accumulators unzeroed, and no zero-extent TMA
// descriptor is ever built.
template <class K, ExpertGemmOp kOp>
__device__ void write_expert_args(const GroupArrays<K>& g, const GroupedGemmOperands& ops, int e, int64_t m,
                                  int64_t offset, int64_t in, int64_t out) {
  const auto* a = static_cast<const typename K::ElementA*>(ops.a);
  const auto* b = static_cast<const typename K::ElementA*>(ops.b);
  auto* d = static_cast<typename K::ElementD*>(ops.d);
  const int64_t weight = static_cast<int64_t>(e) * in * out;
  const int mi = static_cast<int>(m), ini = static_cast<int>(in), outi = static_cast<int>(out);
  if constexpr (kOp == ExpertGemmOp::kForward) {
    g.shapes[e] = GroupShape{mi, outi, ini};
    g.ptr_a[e] = a + offset * in;
    g.ptr_b[e] = b + weight;
    g.ptr_d[e] = d + offset * out;
    g.stride_a[e] = packed_stride<typename K::StrideA>(m, in);
    g.stride_b[e] = packed_stride<typename K::StrideB>(out, in);
    g.stride_c[e] = packed_stride<typename K::StrideC>(m, out);  // unread (no source), kept defined
    g.stride_d[e] = packed_stride<typename K::StrideD>(m, out);
  } else if constexpr (kOp == ExpertGemmOp::kDgrad) {
    g.shapes[e] = GroupShape{mi, ini, outi};
    g.ptr_a[e] = a + offset * out;
    g.ptr_b[e] = b + weight;
    g.ptr_d[e] = d + offset * in;
    g.stride_a[e] = packed_stride<typename K::StrideA>(m, out);
    g.stride_b[e] = packed_stride<typename K::StrideB>(in, out);
    g.stride_c[e] = packed_stride<typename K::StrideC>(m, in);  // unread (no source), kept defined
    g.stride_d[e] = packed_stride<typename K::StrideD>(m, in);
  } else {
    g.shapes[e] = m > 0 ? GroupShape{ini, outi, mi} : GroupShape{0, outi, 0};
    g.ptr_a[e] = a + offset * in;
    g.ptr_b[e] = b + offset * out;
    g.ptr_c[e] = d + weight;
    g.ptr_d[e] = d + weight;
    g.stride_a[e] = packed_stride<typename K::StrideA>(in, m);
    g.stride_b[e] = packed_stride<typename K::StrideB>(out, m);
    g.stride_c[e] = packed_stride<typename K::StrideC>(in, out);
    g.stride_d[e] = packed_stride<typename K::StrideD>(in, out);
  }
}

// One block: an exclusive scan of the counts into row offsets (thread t holds experts [4t, 4t + 4), the
// blocked arrangement cub's BlockScan expects), then each thread writes its experts' arguments. Counts that
// are negative or sum past the row buffers are a bug upstream: the kernel traps (the stream then reports
// cudaErrorIllegalInstruction) rather than let the GEMM read or write out of bounds.
template <class K, ExpertGemmOp kOp>
__global__ void __launch_bounds__(kSetupThreads)
    expert_setup_kernel(GroupArrays<K> g, GroupedGemmOperands ops, int num_experts, int64_t in, int64_t out) {
  using BlockScan = cub::BlockScan<int64_t, kSetupThreads>;
  __shared__ typename BlockScan::TempStorage scan_storage;
  const int first = static_cast<int>(threadIdx.x) * kExpertsPerThread;
  int64_t m[kExpertsPerThread], offset[kExpertsPerThread];
  bool negative = false;
  for (int i = 0; i < kExpertsPerThread; ++i) {
    m[i] = first + i < num_experts ? static_cast<int64_t>(ops.counts[first + i]) : 0;
    negative |= m[i] < 0;
  }
  int64_t total = 0;
  BlockScan(scan_storage).ExclusiveSum(m, offset, total);
  if (negative || total > ops.rows) __trap();
  for (int i = 0; i < kExpertsPerThread; ++i)
    if (first + i < num_experts) write_expert_args<K, kOp>(g, ops, first + i, m[i], offset[i], in, out);
}

}  // namespace

struct GroupedGemm::Impl {
  virtual ~Impl() = default;
  virtual std::string kernel_image() const = 0;
  virtual size_t workspace_size(int sm_count) const = 0;
  virtual void initialize(void* workspace, int device, int sm_count, cudaStream_t stream) = 0;
  virtual void run(const GroupedGemmOperands& ops, cudaStream_t stream) = 0;
};

namespace {

template <class K, ExpertGemmOp kOp>
struct ExpertGemmImpl final : GroupedGemm::Impl {
  GroupedGemmProblem problem;
  typename K::Gemm gemm;
  GroupArrays<K> arrays{};
  bool initialized = false;

  explicit ExpertGemmImpl(const GroupedGemmProblem& p) : problem(p) {}

  typename K::Gemm::Arguments arguments(const GroupArrays<K>& g, int device, int sm_count) const {
    cutlass::KernelHardwareInfo hw;
    hw.device_id = device;
    hw.sm_count = sm_count;
    typename K::Gemm::Arguments args{};
    args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
    args.problem_shape = {problem.num_experts, g.shapes, nullptr};
    args.mainloop = {g.ptr_a, g.stride_a, g.ptr_b, g.stride_b};
    if constexpr (!cute::is_void_v<typename K::ElementC>) args.epilogue.ptr_C = g.ptr_c;  // C aliases D
    args.epilogue.dC = g.stride_c;
    args.epilogue.ptr_D = g.ptr_d;
    args.epilogue.dD = g.stride_d;
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = cute::is_void_v<typename K::ElementC> ? 0.0f : 1.0f;  // wgrad accumulates
    args.hw_info = hw;
    return args;
  }

  std::string kernel_image() const override {
    cudaFuncAttributes attr{};
    const cudaError_t err = cudaFuncGetAttributes(&attr, cutlass::device_kernel<typename K::Kernel>);
    if (err != cudaSuccess) {
      cudaGetLastError();
      return std::string("no sm_90a image of the grouped GEMM kernel for this device (") +
             cudaGetErrorName(err) + ")";
    }
    return {};
  }

  size_t workspace_size(int sm_count) const override {
    // The CUTLASS part depends only on the SM count and the group count, not on the pointers.
    const GroupArrays<K> none{};
    return align_up(group_arrays_bytes<K>(problem.num_experts)) +
           K::Gemm::get_workspace_size(arguments(none, 0, sm_count));
  }

  void initialize(void* workspace, int device, int sm_count, cudaStream_t stream) override {
    arrays = carve_group_arrays<K>(workspace, problem.num_experts);
    void* cutlass_ws = static_cast<char*>(workspace) + align_up(group_arrays_bytes<K>(problem.num_experts));
    const auto args = arguments(arrays, device, sm_count);
    cutlass::Status st = gemm.can_implement(args);
    if (st != cutlass::Status::kSuccess) {
      std::fprintf(stderr, "moerun: grouped GEMM: CUTLASS can_implement: %s\n", status_name(st));
      std::abort();
    }
    st = gemm.initialize(args, cutlass_ws, stream);
    if (st != cutlass::Status::kSuccess) {
      std::fprintf(stderr, "moerun: grouped GEMM: CUTLASS initialize: %s\n", status_name(st));
      std::abort();
    }
    MOERUN_CUDA_CHECK(cudaGetLastError());
    initialized = true;
  }

  void run(const GroupedGemmOperands& ops, cudaStream_t stream) override {
    if (!initialized) {
      std::fprintf(stderr, "moerun: GroupedGemm::run before initialize\n");
      std::abort();
    }
    expert_setup_kernel<K, kOp>
        <<<1, kSetupThreads, 0, stream>>>(arrays, ops, problem.num_experts, problem.in, problem.out);
    MOERUN_CUDA_CHECK(cudaGetLastError());
    const cutlass::Status st = gemm.run(stream);
    if (st != cutlass::Status::kSuccess) {
      std::fprintf(stderr, "moerun: grouped GEMM: CUTLASS run: %s\n", status_name(st));
      std::abort();
    }
    MOERUN_CUDA_CHECK(cudaGetLastError());
  }
};

std::unique_ptr<GroupedGemm::Impl> make_impl(const GroupedGemmProblem& p) {
  if (p.fp8) {
    // FP8 is forward and dgrad only (can_implement says so); a wgrad problem keeps a bf16 kernel object.
    if (p.op == ExpertGemmOp::kForward)
      return std::make_unique<ExpertGemmImpl<Fp8Kernel, ExpertGemmOp::kForward>>(p);
    if (p.op == ExpertGemmOp::kDgrad)
      return std::make_unique<ExpertGemmImpl<Fp8Kernel, ExpertGemmOp::kDgrad>>(p);
  }
  switch (p.op) {
    case ExpertGemmOp::kForward:
      return std::make_unique<ExpertGemmImpl<ForwardKernel, ExpertGemmOp::kForward>>(p);
    case ExpertGemmOp::kDgrad:
      return std::make_unique<ExpertGemmImpl<DgradKernel, ExpertGemmOp::kDgrad>>(p);
    case ExpertGemmOp::kWgrad:
      return std::make_unique<ExpertGemmImpl<WgradKernel, ExpertGemmOp::kWgrad>>(p);
  }
  std::abort();
}

}  // namespace

GroupedGemm::GroupedGemm(const GroupedGemmProblem& problem) : problem_(problem), impl_(make_impl(problem)) {}
GroupedGemm::~GroupedGemm() = default;

std::string GroupedGemm::can_implement() const {
  const GroupedGemmProblem& p = problem_;
  if (p.num_experts < 1 || p.num_experts > kMaxExperts) return "1 <= experts <= 1024";
  if (p.in <= 0 || p.out <= 0 || p.in % 8 != 0 || p.out % 8 != 0)
    return "in and out must be positive multiples of 8 (16-byte TMA rows)";
  if (p.fp8 && p.op == ExpertGemmOp::kWgrad) return "the FP8 grouped GEMM is forward and data gradient only";
  if (p.fp8 && (p.in % 16 != 0 || p.out % 16 != 0))
    return "FP8: in and out must be multiples of 16 (16-byte TMA rows of e4m3)";
  if (p.in > (int64_t{1} << 30) || p.out > (int64_t{1} << 30))
    return "in and out must fit CUTLASS's int shapes";
  int device = 0, sm_count = 0;
  if (std::string why = sm90_device("the grouped GEMM", device, sm_count); !why.empty()) return why;
  return impl_->kernel_image();
}

size_t GroupedGemm::workspace_size() const {
  int device = 0, sm_count = 0;
  if (std::string why = sm90_device("the grouped GEMM", device, sm_count); !why.empty()) {
    std::fprintf(stderr, "moerun: GroupedGemm::workspace_size: %s\n", why.c_str());
    std::abort();
  }
  return impl_->workspace_size(sm_count);
}

void GroupedGemm::initialize(void* workspace, cudaStream_t stream) {
  if (std::string why = can_implement(); !why.empty()) {
    std::fprintf(stderr, "moerun: GroupedGemm::initialize on a problem it cannot implement: %s\n",
                 why.c_str());
    std::abort();
  }
  if (reinterpret_cast<uintptr_t>(workspace) % kAlign != 0) {
    std::fprintf(stderr, "moerun: GroupedGemm::initialize needs a 256-byte aligned workspace\n");
    std::abort();
  }
  int device = 0, sm_count = 0;
  sm90_device("the grouped GEMM", device, sm_count);
  impl_->initialize(workspace, device, sm_count, stream);
}

void GroupedGemm::run(const GroupedGemmOperands& ops, cudaStream_t stream) {
  for (const void* p :
       {static_cast<const void*>(ops.counts), ops.a, ops.b, static_cast<const void*>(ops.d)}) {
    if (p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 != 0) {
      std::fprintf(stderr, "moerun: GroupedGemm::run needs non-null 16-byte aligned operands (got %p)\n", p);
      std::abort();
    }
  }
  impl_->run(ops, stream);
}

}  // namespace moeplan::cuda
