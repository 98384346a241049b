// PushGemmCombine (push_gemm_combine.h): the experts' second GEMM on CUTLASS's SM90 grouped kernel with each
// (local expert, token owner) block's output pointed at the token owner's receive buffer, between signal
// kernels, then the gate-weighted combine. Built for sm_90a alone (the grouped kernel's wgmma and device-side
// TMA descriptor updates).
//
// Memory ordering between GPUs (or virtual ranks): a kernel's stores are complete when the next kernel on
// its stream starts, so a signal kernel that fences at system scope and stores with release semantics after
// the push GEMM publishes every row that GEMM wrote, on this GPU or a peer's; a waiting kernel loads the
// flag with acquire semantics and the kernel after it (the GEMM, or the combine's reads, through L2) sees
// what the peer did before its signal.
#include "executor/kernels/cuda/fused/push_gemm_combine.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "executor/kernels/cuda/check.h"
#include "executor/kernels/cuda/fused/tile_mma.cuh"
#include "executor/kernels/cuda/grouped_gemm_kernels.cuh"

namespace moeplan::cuda::fused {
namespace {

namespace gd = grouped_detail;
// bf16 A = h's block [m, in] K-major, B = W_e [in, hidden] read N-major, D bf16 row-major: the experts'
// forward kernel (grouped_gemm.cu's table), its groups the (expert, token owner) blocks.
using Kernel = gd::ForwardKernel;
using Arrays = gd::GroupArrays<Kernel>;

constexpr int kMaxGroups = 1024;
constexpr int kSetupThreads = 256;
constexpr int kCombineThreads = 256;
constexpr int kVector = 8;  // bf16 values per 16-byte load and store of the combine

// Every virtual rank's operands and the run's epoch, by value (__grid_constant__: no upload per run).
struct RanksLaunch {
  PushGemmCombineOperands ops[kMaxRanks];
  int ranks = 0;
  int64_t tokens = 0, top_k = 0, hidden = 0;
  uint32_t epoch = 0;
  int slot = 0;  // kSignalReady or kSignalDone
};

// Virtual rank blockIdx.x tells every peer, at `slot` + its rank in the peer's array: value `epoch`.
__global__ void signal_kernel(const __grid_constant__ RanksLaunch L) {
  const PushGemmCombineOperands& o = L.ops[blockIdx.x];
  if (threadIdx.x == 0) {
    __threadfence_system();
    for (int p = 0; p < L.ranks; ++p) detail::st_release_sys(o.signals[p] + L.slot + o.rank, L.epoch);
  }
}

// Virtual rank v waits until every peer has set `slot` + the peer's rank in v's array to `epoch`; the kernel
// after it on the stream starts after that.
__global__ void wait_kernel(const __grid_constant__ RanksLaunch L, int v) {
  const PushGemmCombineOperands& o = L.ops[v];
  if (threadIdx.x == 0)
    for (int p = 0; p < L.ranks; ++p) detail::wait_sys(o.signals[o.rank] + L.slot + p, L.epoch);
}

struct SetupLaunch {
  Arrays g;
  PushGemmCombineOperands ops;
  int ranks = 0, experts = 0;
  int64_t in = 0, hidden = 0, rows = 0, recv_rows = 0;
};

// Group i = e R + r: the rows of token owner r at this rank's local expert e (M = their count, which the tile
// scheduler skips when 0), W_e, and the block's place in r's receive buffer. Counts that are negative or
// overflow h or a receive buffer are a bug upstream: the kernel traps rather than let the GEMM write out of
// bounds, on this GPU or a peer's.
__global__ void __launch_bounds__(kSetupThreads) push_setup_kernel(const __grid_constant__ SetupLaunch L) {
  const int R = L.ranks, E = L.experts, q = L.ops.rank;
  const int32_t* c = L.ops.counts;
  if (threadIdx.x == 0) {
    for (int64_t i = 0; i < int64_t{R} * R * E; ++i)
      if (c[i] < 0) __trap();
    if (push_source_row(c, R, E, q, 0, E) > L.rows) __trap();
    for (int r = 0; r < R; ++r)
      if (push_receive_row(c, R, E, r, R, 0) > L.recv_rows) __trap();
  }
  __syncthreads();
  const auto* h = reinterpret_cast<const gd::Bf16*>(L.ops.h);
  const auto* w = reinterpret_cast<const gd::Bf16*>(L.ops.w);
  for (int i = static_cast<int>(threadIdx.x); i < R * E; i += static_cast<int>(blockDim.x)) {
    const int e = i / R, r = i % R;
    const int64_t m = push_count(c, R, E, q, r, e);
    const int64_t a_row = push_source_row(c, R, E, q, r, e);
    const int64_t d_row = push_receive_row(c, R, E, r, q, e);
    auto* d = reinterpret_cast<gd::Bf16*>(L.ops.recv[r]);
    L.g.shapes[i] = gd::GroupShape{static_cast<int>(m), static_cast<int>(L.hidden), static_cast<int>(L.in)};
    L.g.ptr_a[i] = h + a_row * L.in;
    L.g.ptr_b[i] = w + int64_t{e} * L.in * L.hidden;
    L.g.ptr_d[i] = d + d_row * L.hidden;
    L.g.stride_a[i] = gd::packed_stride<Kernel::StrideA>(m, L.in);
    L.g.stride_b[i] = gd::packed_stride<Kernel::StrideB>(L.hidden, L.in);
    L.g.stride_c[i] = gd::packed_stride<Kernel::StrideC>(m, L.hidden);  // unread (no source), kept defined
    L.g.stride_d[i] = gd::packed_stride<Kernel::StrideD>(m, L.hidden);
  }
}

// Virtual rank blockIdx.y: once every peer's rows are in its receive buffer, out[t] = sum_j gates[t, j]
// recv[recv_row[t top_k + j]], 8 columns per thread, in fp32, rounded to bf16 once.
__global__ void __launch_bounds__(kCombineThreads) combine_kernel(const __grid_constant__ RanksLaunch L) {
  const PushGemmCombineOperands& o = L.ops[blockIdx.y];
  if (threadIdx.x == 0)
    for (int p = 0; p < L.ranks; ++p) detail::wait_sys(o.signals[o.rank] + kSignalDone + p, L.epoch);
  __syncthreads();
  const int64_t vectors = L.hidden / kVector, n = L.tokens * vectors, slots = L.tokens * L.top_k;
  const __nv_bfloat16* recv = o.recv[o.rank];
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = i / vectors, col = (i % vectors) * kVector;
    float acc[kVector] = {};
    for (int64_t j = 0; j < L.top_k; ++j) {
      const int64_t row = o.recv_row[t * L.top_k + j];
      if (row < 0 || row >= slots) __trap();
      const float g = o.gates[t * L.top_k + j];
      const uint4 v = __ldcg(reinterpret_cast<const uint4*>(recv + row * L.hidden + col));
      const auto* x = reinterpret_cast<const __nv_bfloat16*>(&v);
      for (int k = 0; k < kVector; ++k) acc[k] += g * __bfloat162float(x[k]);
    }
    detail::store8(o.out + t * L.hidden + col, acc);
  }
}

// The current device and its SM count, or why there is none this kernel runs on.
std::string current_device(int& device, int& sm_count) {
  if (std::string why = device_unavailable(); !why.empty()) return why;
  MOERUN_CUDA_CHECK(cudaGetDevice(&device));
  int major = 0, minor = 0;
  MOERUN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  MOERUN_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  MOERUN_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device));
  if (major != 9 || minor != 0)
    return "the push GEMM is built for sm_90a (Hopper) only; this device is sm_" + std::to_string(major) +
           std::to_string(minor);
  return {};
}

int groups_of(const PushGemmCombineArgs& a) {
  return a.ranks * a.experts;
}

}  // namespace

std::string can_implement(const PushGemmCombineArgs& a) {
  if (a.ranks < 1 || a.ranks > kMaxRanks) return "1 <= ranks <= 8 (one NVLink domain)";
  if (a.virtual_ranks != 1 && a.virtual_ranks != a.ranks) return "virtual_ranks must be 1 or ranks";
  if (a.experts < 1 || groups_of(a) > kMaxGroups) return "1 <= experts and experts x ranks <= 1024 groups";
  if (a.in <= 0 || a.hidden <= 0 || a.in % 8 != 0 || a.hidden % 8 != 0)
    return "in and hidden must be positive multiples of 8 (16-byte TMA rows)";
  if (a.in > (int64_t{1} << 30) || a.hidden > (int64_t{1} << 30)) return "in and hidden must fit int shapes";
  if (a.tokens <= 0 || a.top_k <= 0 || a.rows < 0) return "tokens and top_k must be positive, rows >= 0";
  if (a.rows > std::numeric_limits<int>::max() || a.tokens * a.top_k > std::numeric_limits<int>::max())
    return "rows must fit CUTLASS's int shapes";
  int device = 0, sm_count = 0;
  if (std::string why = current_device(device, sm_count); !why.empty()) return why;
  auto image = [](auto kernel) -> std::string {
    cudaFuncAttributes attr{};
    if (const cudaError_t err = cudaFuncGetAttributes(&attr, kernel); err != cudaSuccess) {
      cudaGetLastError();
      return std::string("no sm_90a image of the push GEMM's kernels for this device (") +
             cudaGetErrorName(err) + ")";
    }
    return {};
  };
  if (std::string why = image(cutlass::device_kernel<Kernel::Kernel>); !why.empty()) return why;
  return image(push_setup_kernel);
}

struct PushGemmCombine::Impl {
  std::vector<std::unique_ptr<Kernel::Gemm>> gemms;  // per virtual rank, on its part of the workspace
  std::vector<Arrays> arrays;
  int device = 0, sm_count = 0;
  uint32_t epoch = 0;
  bool initialized = false;

  static Kernel::Gemm::Arguments arguments(const Arrays& g, int groups, int device, int sm_count) {
    cutlass::KernelHardwareInfo hw;
    hw.device_id = device;
    hw.sm_count = sm_count;
    Kernel::Gemm::Arguments args{};
    args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
    args.problem_shape = {groups, g.shapes, nullptr};
    args.mainloop = {g.ptr_a, g.stride_a, g.ptr_b, g.stride_b};
    args.epilogue.dC = g.stride_c;
    args.epilogue.ptr_D = g.ptr_d;
    args.epilogue.dD = g.stride_d;
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = 0.0f;
    args.hw_info = hw;
    return args;
  }

  size_t per_rank_bytes(int groups) const {
    const Arrays none{};
    return gd::align_up(gd::group_arrays_bytes<Kernel>(groups)) +
           gd::align_up(Kernel::Gemm::get_workspace_size(arguments(none, groups, 0, sm_count)));
  }
};

PushGemmCombine::PushGemmCombine(const PushGemmCombineArgs& args)
    : args_(args), impl_(std::make_unique<Impl>()) {}
PushGemmCombine::~PushGemmCombine() = default;

size_t PushGemmCombine::workspace_size() const {
  if (std::string why = can_implement(args_); !why.empty()) {
    std::fprintf(stderr, "moerun: PushGemmCombine::workspace_size: %s\n", why.c_str());
    std::abort();
  }
  current_device(impl_->device, impl_->sm_count);
  return static_cast<size_t>(args_.virtual_ranks) * impl_->per_rank_bytes(groups_of(args_));
}

void PushGemmCombine::initialize(void* workspace, cudaStream_t stream) {
  if (std::string why = can_implement(args_); !why.empty()) {
    std::fprintf(stderr, "moerun: PushGemmCombine::initialize on a problem it cannot implement: %s\n",
                 why.c_str());
    std::abort();
  }
  if (reinterpret_cast<uintptr_t>(workspace) % gd::kAlign != 0) {
    std::fprintf(stderr, "moerun: PushGemmCombine::initialize needs a 256-byte aligned workspace\n");
    std::abort();
  }
  Impl& m = *impl_;
  current_device(m.device, m.sm_count);
  const int groups = groups_of(args_);
  const size_t per_rank = m.per_rank_bytes(groups);
  m.gemms.clear();
  m.arrays.clear();
  for (int v = 0; v < args_.virtual_ranks; ++v) {
    char* base = static_cast<char*>(workspace) + static_cast<size_t>(v) * per_rank;
    m.arrays.push_back(gd::carve_group_arrays<Kernel>(base, groups));
    void* cutlass_ws = base + gd::align_up(gd::group_arrays_bytes<Kernel>(groups));
    const auto a = Impl::arguments(m.arrays.back(), groups, m.device, m.sm_count);
    auto gemm = std::make_unique<Kernel::Gemm>();
    cutlass::Status st = gemm->can_implement(a);
    if (st != cutlass::Status::kSuccess) {
      std::fprintf(stderr, "moerun: push GEMM: CUTLASS can_implement: %s\n", gd::status_name(st));
      std::abort();
    }
    st = gemm->initialize(a, cutlass_ws, stream);
    if (st != cutlass::Status::kSuccess) {
      std::fprintf(stderr, "moerun: push GEMM: CUTLASS initialize: %s\n", gd::status_name(st));
      std::abort();
    }
    m.gemms.push_back(std::move(gemm));
  }
  MOERUN_CUDA_CHECK(cudaGetLastError());
  m.initialized = true;
}

void PushGemmCombine::run(std::span<const PushGemmCombineOperands> ranks, cudaStream_t stream) {
  Impl& m = *impl_;
  const PushGemmCombineArgs& a = args_;
  if (!m.initialized || static_cast<int>(ranks.size()) != a.virtual_ranks) {
    std::fprintf(stderr,
                 "moerun: PushGemmCombine::run needs initialize() and one operand set per virtual rank\n");
    std::abort();
  }
  RanksLaunch L;
  L.ranks = a.ranks;
  L.tokens = a.tokens;
  L.top_k = a.top_k;
  L.hidden = a.hidden;
  L.epoch = ++m.epoch;
  for (int v = 0; v < a.virtual_ranks; ++v) L.ops[v] = ranks[static_cast<size_t>(v)];
  const auto V = static_cast<unsigned>(a.virtual_ranks);
  // Every rank's receive buffer is free: its previous combine ran before this on its stream.
  L.slot = kSignalReady;
  signal_kernel<<<V, 32, 0, stream>>>(L);
  MOERUN_CUDA_CHECK(cudaGetLastError());
  // Each rank, once every peer's buffer is free: its groups' arguments, then the push GEMM.
  for (int v = 0; v < a.virtual_ranks; ++v) {
    wait_kernel<<<1, 32, 0, stream>>>(L, v);
    MOERUN_CUDA_CHECK(cudaGetLastError());
    SetupLaunch S;
    S.g = m.arrays[static_cast<size_t>(v)];
    S.ops = L.ops[v];
    S.ranks = a.ranks;
    S.experts = a.experts;
    S.in = a.in;
    S.hidden = a.hidden;
    S.rows = a.rows;
    S.recv_rows = a.tokens * a.top_k;
    push_setup_kernel<<<1, kSetupThreads, 0, stream>>>(S);
    MOERUN_CUDA_CHECK(cudaGetLastError());
    const cutlass::Status st = m.gemms[static_cast<size_t>(v)]->run(stream);
    if (st != cutlass::Status::kSuccess) {
      std::fprintf(stderr, "moerun: push GEMM: CUTLASS run: %s\n", gd::status_name(st));
      std::abort();
    }
    MOERUN_CUDA_CHECK(cudaGetLastError());
  }
  // Every rank's rows are in place at their token owners; each token owner combines.
  L.slot = kSignalDone;
  signal_kernel<<<V, 32, 0, stream>>>(L);
  MOERUN_CUDA_CHECK(cudaGetLastError());
  const int64_t vectors = a.tokens * (a.hidden / kVector);
  const auto blocks =
      static_cast<unsigned>(std::clamp<int64_t>((vectors + kCombineThreads - 1) / kCombineThreads, 1,
                                                std::max<int64_t>(1, 4 * m.sm_count / a.virtual_ranks)));
  combine_kernel<<<dim3(blocks, V), kCombineThreads, 0, stream>>>(L);
  MOERUN_CUDA_CHECK(cudaGetLastError());
}

}  // namespace moeplan::cuda::fused
