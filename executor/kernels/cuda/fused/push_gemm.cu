// PushGemmCombine and PushGemmAllToAll (push_gemm.h): CUTLASS's SM90 grouped kernel with each group's output
// pointed at the rank that needs it, between signal kernels; then the combine's gate-weighted sum, or the
// wait for every peer's rows. GatherGemm: the same kernel once per token owner's chunk of rows, each after
// that chunk's gather on a side stream. Built for sm_90a alone (the grouped kernel's wgmma and device-side
// TMA descriptor updates).
//
// Memory ordering between GPUs (or virtual ranks): a kernel's stores are complete when the next kernel on
// its stream starts, so a signal kernel that fences at system scope and stores with release semantics after
// the push GEMM publishes every row that GEMM wrote, on this GPU or a peer's; a waiting kernel loads the
// flag with acquire semantics and the kernel after it (the GEMM, or the combine's reads, through L2) sees
// what the peer did before its signal.
#include "executor/kernels/cuda/fused/push_gemm.h"

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
// bf16 A [m, k] K-major, B = a row-major weight [k, n] read N-major, D bf16 row-major: the experts' forward
// kernel (grouped_gemm.cu's table). Its groups: the combine's (expert, token owner) blocks; the all-to-all's
// column blocks, whose B rows are as long as the whole weight's.
using Kernel = gd::ForwardKernel;
using Arrays = gd::GroupArrays<Kernel>;

constexpr int kMaxGroups = 1024;
constexpr int kSetupThreads = 256;
constexpr int kCombineThreads = 256;
constexpr int kVector = 8;  // bf16 values per 16-byte load and store of the combine

// Every virtual rank's signal arrays (peer p's at [v][p]) and rank, and the run's epoch, by value
// (__grid_constant__: no upload per run).
struct SignalLaunch {
  uint32_t* signals[kMaxRanks][kMaxRanks] = {};
  int rank[kMaxRanks] = {};
  int ranks = 0;
  uint32_t epoch = 0;
  int slot = 0;  // kSignalReady or kSignalDone
};

template <class Operands>
SignalLaunch signal_launch(std::span<const Operands> ops, int ranks, uint32_t epoch) {
  SignalLaunch L;
  for (size_t v = 0; v < ops.size(); ++v) {
    L.rank[v] = ops[v].rank;
    for (int p = 0; p < ranks; ++p) L.signals[v][p] = ops[v].signals[p];
  }
  L.ranks = ranks;
  L.epoch = epoch;
  return L;
}

// Virtual rank blockIdx.x tells every peer, at `slot` + its rank in the peer's array: value `epoch`.
__global__ void signal_kernel(const __grid_constant__ SignalLaunch L) {
  const int v = static_cast<int>(blockIdx.x);
  if (threadIdx.x == 0) {
    __threadfence_system();
    for (int p = 0; p < L.ranks; ++p) detail::st_release_sys(L.signals[v][p] + L.slot + L.rank[v], L.epoch);
  }
}

// Virtual rank `first` + blockIdx.x waits until every peer has set `slot` + the peer's rank in its array to
// `epoch`; the kernel after it on the stream starts after that.
__global__ void wait_kernel(const __grid_constant__ SignalLaunch L, int first) {
  const int v = first + static_cast<int>(blockIdx.x);
  if (threadIdx.x == 0)
    for (int p = 0; p < L.ranks; ++p) detail::wait_sys(L.signals[v][L.rank[v]] + L.slot + p, L.epoch);
}

// Counts [R][R][E] that are negative, or that give expert owner q more rows than its buffers hold, are a bug
// upstream: trap rather than let a GEMM write out of bounds, on this GPU or a peer's.
__device__ void check_counts(const int32_t* c, int R, int E, int q, int64_t rows) {
  for (int64_t i = 0; i < int64_t{R} * R * E; ++i)
    if (c[i] < 0) __trap();
  if (push_source_row(c, R, E, q, 0, E) > rows) __trap();
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
    check_counts(c, R, E, q, L.rows);
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

// The all-to-all's R groups: rank p's columns of x W [tokens, cols] (B = W's column block p, its rows
// R cols long), stored in rank p's output at this rank's rows.
struct AllToAllSetupLaunch {
  Arrays g;
  PushGemmAllToAllOperands ops;
  int ranks = 0;
  int64_t tokens = 0, hidden = 0, cols = 0;
};

__global__ void all_to_all_setup_kernel(const __grid_constant__ AllToAllSetupLaunch L) {
  const auto* x = reinterpret_cast<const gd::Bf16*>(L.ops.x);
  const auto* w = reinterpret_cast<const gd::Bf16*>(L.ops.w);
  for (int p = static_cast<int>(threadIdx.x); p < L.ranks; p += static_cast<int>(blockDim.x)) {
    auto* d = reinterpret_cast<gd::Bf16*>(L.ops.out[p]);
    L.g.shapes[p] =
        gd::GroupShape{static_cast<int>(L.tokens), static_cast<int>(L.cols), static_cast<int>(L.hidden)};
    L.g.ptr_a[p] = x;
    L.g.ptr_b[p] = w + int64_t{p} * L.cols;
    L.g.ptr_d[p] = d + int64_t{L.ops.rank} * L.tokens * L.cols;
    L.g.stride_a[p] = gd::packed_stride<Kernel::StrideA>(L.tokens, L.hidden);
    L.g.stride_b[p] = gd::packed_stride<Kernel::StrideB>(int64_t{L.ranks} * L.cols, L.hidden);
    L.g.stride_c[p] = gd::packed_stride<Kernel::StrideC>(L.tokens, L.cols);  // unread (no source)
    L.g.stride_d[p] = gd::packed_stride<Kernel::StrideD>(L.tokens, L.cols);
  }
}

// The combine: every virtual rank's operands, by value.
struct CombineLaunch {
  PushGemmCombineOperands ops[kMaxRanks];
  int ranks = 0;
  int64_t tokens = 0, top_k = 0, hidden = 0;
};

// Virtual rank blockIdx.y (after a wait kernel has seen every peer's rows in its receive buffer): out[t] =
// sum_j gates[t, j] recv[recv_row[t top_k + j]], 8 columns per thread, in fp32, rounded to bf16 once. Its
// CTAs do not spin: a grid of spinning CTAs could hold the SMs an NCCL kernel on another stream needs to
// let a peer get to its signal.
__global__ void __launch_bounds__(kCombineThreads) combine_kernel(const __grid_constant__ CombineLaunch L) {
  const PushGemmCombineOperands& o = L.ops[blockIdx.y];
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

// Virtual rank `v` waits until peer `p` has set `slot` + p in v's array to `epoch`.
__global__ void wait_peer_kernel(const __grid_constant__ SignalLaunch L, int v, int p) {
  if (threadIdx.x == 0) detail::wait_sys(L.signals[v][L.rank[v]] + L.slot + p, L.epoch);
}

// GatherGemm's group arrays of one virtual rank: chunk r's E groups, group e = the rows of token owner r at
// local expert e (push_source_row's block (e, r)) of gathered and y, and W_e. Counts that are negative or
// overflow the row buffers are a bug upstream: trap.
struct GatherSetupLaunch {
  Arrays g[kMaxRanks];  // by chunk (token owner)
  GatherGemmOperands ops;
  int ranks = 0, experts = 0;
  int64_t hidden = 0, out = 0, rows = 0;
};

__global__ void __launch_bounds__(kSetupThreads)
    gather_setup_kernel(const __grid_constant__ GatherSetupLaunch L) {
  const int R = L.ranks, E = L.experts, q = L.ops.rank;
  const int32_t* c = L.ops.counts;
  if (threadIdx.x == 0) check_counts(c, R, E, q, L.rows);
  __syncthreads();
  const auto* g = reinterpret_cast<const gd::Bf16*>(L.ops.gathered);
  const auto* w = reinterpret_cast<const gd::Bf16*>(L.ops.w);
  auto* y = reinterpret_cast<gd::Bf16*>(L.ops.y);
  for (int i = static_cast<int>(threadIdx.x); i < R * E; i += static_cast<int>(blockDim.x)) {
    const int r = i / E, e = i % E;
    const Arrays& a = L.g[r];
    const int64_t m = push_count(c, R, E, q, r, e), row = push_source_row(c, R, E, q, r, e);
    a.shapes[e] = gd::GroupShape{static_cast<int>(m), static_cast<int>(L.out), static_cast<int>(L.hidden)};
    a.ptr_a[e] = g + row * L.hidden;
    a.ptr_b[e] = w + int64_t{e} * L.hidden * L.out;
    a.ptr_d[e] = y + row * L.out;
    a.stride_a[e] = gd::packed_stride<Kernel::StrideA>(m, L.hidden);
    a.stride_b[e] = gd::packed_stride<Kernel::StrideB>(L.out, L.hidden);
    a.stride_c[e] = gd::packed_stride<Kernel::StrideC>(m, L.out);  // unread (no source), kept defined
    a.stride_d[e] = gd::packed_stride<Kernel::StrideD>(m, L.out);
  }
}

// Chunk r of virtual rank q's rows: block (blockIdx.y, r) of gathered from token owner r's x, 16 bytes per
// thread, read through L2 (__ldcg: the owner wrote x before its signal, this GPU's L1 holds nothing of it).
struct GatherLaunch {
  GatherGemmOperands ops;
  int ranks = 0, experts = 0, r = 0;
  int64_t tokens = 0, hidden = 0;
};

__global__ void __launch_bounds__(kCombineThreads) gather_kernel(const __grid_constant__ GatherLaunch L) {
  const int R = L.ranks, E = L.experts, q = L.ops.rank, e = static_cast<int>(blockIdx.y);
  const int64_t m = push_count(L.ops.counts, R, E, q, L.r, e);
  const int64_t first = push_source_row(L.ops.counts, R, E, q, L.r, e);
  const int64_t vectors = L.hidden / kVector;
  const __nv_bfloat16* x = L.ops.x[L.r];
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < m * vectors;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = first + i / vectors, col = (i % vectors) * kVector;
    const int64_t src = L.ops.src_row[row];
    if (src < 0 || src >= L.tokens) __trap();
    *reinterpret_cast<uint4*>(L.ops.gathered + row * L.hidden + col) =
        __ldcg(reinterpret_cast<const uint4*>(x + src * L.hidden + col));
  }
}

// The device, then the sm_90a images of the CUTLASS kernel and of `setup`.
template <class Setup>
std::string device_and_images(Setup setup) {
  int device = 0, sm_count = 0;
  if (std::string why = gd::sm90_device("the push GEMMs", device, sm_count); !why.empty()) return why;
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
  return image(setup);
}

std::string ranks_rule(int ranks, int virtual_ranks) {
  if (ranks < 1 || ranks > kMaxRanks) return "1 <= ranks <= 8 (one NVLink domain)";
  if (virtual_ranks != 1 && virtual_ranks != ranks) return "virtual_ranks must be 1 or ranks";
  return {};
}

int groups_of(const PushGemmCombineArgs& a) {
  return a.ranks * a.experts;
}

[[noreturn]] void fail(const char* what, const std::string& why) {
  std::fprintf(stderr, "moerun: %s: %s\n", what, why.c_str());
  std::abort();
}

}  // namespace

// CUTLASS grouped kernels (one per virtual rank; GatherGemm's, one per chunk of each), each on its part of
// the workspace: its group arrays, then CUTLASS's own workspace. `sms_left`: SMs the kernels' persistent grid
// leaves to other kernels (0: it spans every SM).
struct PushGemmCombine::Impl {
  std::vector<std::unique_ptr<Kernel::Gemm>> gemms;
  std::vector<Arrays> arrays;
  int device = 0, sm_count = 0, groups = 0, sms_left = 0;
  uint32_t epoch = 0;
  bool initialized = false;

  int grid_sms() const { return std::max(1, sm_count - sms_left); }

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

  size_t per_rank_bytes() const {
    const Arrays none{};
    return gd::align_up(gd::group_arrays_bytes<Kernel>(groups)) +
           gd::align_up(Kernel::Gemm::get_workspace_size(arguments(none, groups, 0, grid_sms())));
  }

  size_t workspace_size(int kernels, int n_groups) {
    gd::sm90_device("the push GEMMs", device, sm_count);
    groups = n_groups;
    return static_cast<size_t>(kernels) * per_rank_bytes();
  }

  void initialize(void* workspace, int kernels, int n_groups, cudaStream_t stream) {
    if (reinterpret_cast<uintptr_t>(workspace) % gd::kAlign != 0)
      fail("push GEMM initialize", "the workspace must be 256-byte aligned");
    gd::sm90_device("the push GEMMs", device, sm_count);
    groups = n_groups;
    const size_t per_rank = per_rank_bytes();
    gemms.clear();
    arrays.clear();
    for (int v = 0; v < kernels; ++v) {
      char* base = static_cast<char*>(workspace) + static_cast<size_t>(v) * per_rank;
      arrays.push_back(gd::carve_group_arrays<Kernel>(base, groups));
      void* cutlass_ws = base + gd::align_up(gd::group_arrays_bytes<Kernel>(groups));
      const auto a = arguments(arrays.back(), groups, device, grid_sms());
      auto gemm = std::make_unique<Kernel::Gemm>();
      cutlass::Status st = gemm->can_implement(a);
      if (st != cutlass::Status::kSuccess) fail("push GEMM: CUTLASS can_implement", gd::status_name(st));
      st = gemm->initialize(a, cutlass_ws, stream);
      if (st != cutlass::Status::kSuccess) fail("push GEMM: CUTLASS initialize", gd::status_name(st));
      gemms.push_back(std::move(gemm));
    }
    MOERUN_CUDA_CHECK(cudaGetLastError());
    initialized = true;
  }

  void run_gemm(int v, cudaStream_t stream) {
    const cutlass::Status st = gemms[static_cast<size_t>(v)]->run(stream);
    if (st != cutlass::Status::kSuccess) fail("push GEMM: CUTLASS run", gd::status_name(st));
    MOERUN_CUDA_CHECK(cudaGetLastError());
  }
};

namespace {

// The steps both kernels share around their GEMMs (see push_gemm.h): every rank's buffer free; per rank, once
// every peer's is, `setup(v)` and its GEMM; every rank's rows in place.
template <class Setup>
void push_steps(PushGemmCombine::Impl& m, SignalLaunch L, int virtual_ranks, cudaStream_t stream,
                Setup&& setup) {
  const auto V = static_cast<unsigned>(virtual_ranks);
  L.slot = kSignalReady;
  signal_kernel<<<V, 32, 0, stream>>>(L);
  MOERUN_CUDA_CHECK(cudaGetLastError());
  for (int v = 0; v < virtual_ranks; ++v) {
    wait_kernel<<<1, 32, 0, stream>>>(L, v);
    MOERUN_CUDA_CHECK(cudaGetLastError());
    setup(v);
    MOERUN_CUDA_CHECK(cudaGetLastError());
    m.run_gemm(v, stream);
  }
  L.slot = kSignalDone;
  signal_kernel<<<V, 32, 0, stream>>>(L);
  MOERUN_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

// ---- PushGemmCombine -------------------------------------------------------------------------------------
std::string can_implement(const PushGemmCombineArgs& a) {
  if (std::string why = ranks_rule(a.ranks, a.virtual_ranks); !why.empty()) return why;
  if (a.experts < 1 || groups_of(a) > kMaxGroups) return "1 <= experts and experts x ranks <= 1024 groups";
  if (a.in <= 0 || a.hidden <= 0 || a.in % 8 != 0 || a.hidden % 8 != 0)
    return "in and hidden must be positive multiples of 8 (16-byte TMA rows)";
  if (a.in > (int64_t{1} << 30) || a.hidden > (int64_t{1} << 30)) return "in and hidden must fit int shapes";
  if (a.tokens <= 0 || a.top_k <= 0 || a.rows < 0) return "tokens and top_k must be positive, rows >= 0";
  if (a.rows > std::numeric_limits<int>::max() || a.tokens * a.top_k > std::numeric_limits<int>::max())
    return "rows must fit CUTLASS's int shapes";
  return device_and_images(push_setup_kernel);
}

PushGemmCombine::PushGemmCombine(const PushGemmCombineArgs& args)
    : args_(args), impl_(std::make_unique<Impl>()) {}
PushGemmCombine::~PushGemmCombine() = default;

size_t PushGemmCombine::workspace_size() const {
  if (std::string why = can_implement(args_); !why.empty()) fail("PushGemmCombine::workspace_size", why);
  return impl_->workspace_size(args_.virtual_ranks, groups_of(args_));
}

void PushGemmCombine::initialize(void* workspace, cudaStream_t stream) {
  if (std::string why = can_implement(args_); !why.empty()) fail("PushGemmCombine::initialize", why);
  impl_->initialize(workspace, args_.virtual_ranks, groups_of(args_), stream);
}

void PushGemmCombine::run(std::span<const PushGemmCombineOperands> ranks, cudaStream_t stream) {
  Impl& m = *impl_;
  const PushGemmCombineArgs& a = args_;
  if (!m.initialized || static_cast<int>(ranks.size()) != a.virtual_ranks)
    fail("PushGemmCombine::run", "needs initialize() and one operand set per virtual rank");
  const uint32_t epoch = ++m.epoch;
  SignalLaunch L = signal_launch(ranks, a.ranks, epoch);
  push_steps(m, L, a.virtual_ranks, stream, [&](int v) {
    SetupLaunch S;
    S.g = m.arrays[static_cast<size_t>(v)];
    S.ops = ranks[static_cast<size_t>(v)];
    S.ranks = a.ranks;
    S.experts = a.experts;
    S.in = a.in;
    S.hidden = a.hidden;
    S.rows = a.rows;
    S.recv_rows = a.tokens * a.top_k;
    push_setup_kernel<<<1, kSetupThreads, 0, stream>>>(S);
  });
  // Each token owner, once every peer's rows are in its buffer (one spinning CTA per rank): the
  // gate-weighted sum.
  L.slot = kSignalDone;
  wait_kernel<<<static_cast<unsigned>(a.virtual_ranks), 32, 0, stream>>>(L, 0);
  MOERUN_CUDA_CHECK(cudaGetLastError());
  CombineLaunch C;
  for (int v = 0; v < a.virtual_ranks; ++v) C.ops[v] = ranks[static_cast<size_t>(v)];
  C.ranks = a.ranks;
  C.tokens = a.tokens;
  C.top_k = a.top_k;
  C.hidden = a.hidden;
  const int64_t vectors = a.tokens * (a.hidden / kVector);
  const auto blocks = static_cast<unsigned>(std::clamp<int64_t>(
      (vectors + kCombineThreads - 1) / kCombineThreads, 1, std::max(1, 4 * m.sm_count / a.virtual_ranks)));
  combine_kernel<<<dim3(blocks, static_cast<unsigned>(a.virtual_ranks)), kCombineThreads, 0, stream>>>(C);
  MOERUN_CUDA_CHECK(cudaGetLastError());
}

// ---- PushGemmAllToAll ------------------------------------------------------------------------------------
std::string can_implement(const PushGemmAllToAllArgs& a) {
  if (std::string why = ranks_rule(a.ranks, a.virtual_ranks); !why.empty()) return why;
  if (a.hidden <= 0 || a.cols_per_rank <= 0 || a.hidden % 8 != 0 || a.cols_per_rank % 8 != 0)
    return "hidden and cols_per_rank must be positive multiples of 8 (16-byte TMA rows)";
  if (a.tokens <= 0 || a.tokens > std::numeric_limits<int>::max() || a.hidden > (int64_t{1} << 30) ||
      a.cols_per_rank * a.ranks > (int64_t{1} << 30))
    return "tokens must be positive and the shapes must fit CUTLASS's int shapes";
  return device_and_images(all_to_all_setup_kernel);
}

PushGemmAllToAll::PushGemmAllToAll(const PushGemmAllToAllArgs& args)
    : args_(args), impl_(std::make_unique<PushGemmCombine::Impl>()) {}
PushGemmAllToAll::~PushGemmAllToAll() = default;

size_t PushGemmAllToAll::workspace_size() const {
  if (std::string why = can_implement(args_); !why.empty()) fail("PushGemmAllToAll::workspace_size", why);
  return impl_->workspace_size(args_.virtual_ranks, args_.ranks);
}

void PushGemmAllToAll::initialize(void* workspace, cudaStream_t stream) {
  if (std::string why = can_implement(args_); !why.empty()) fail("PushGemmAllToAll::initialize", why);
  impl_->initialize(workspace, args_.virtual_ranks, args_.ranks, stream);
}

void PushGemmAllToAll::run(std::span<const PushGemmAllToAllOperands> ranks, cudaStream_t stream) {
  PushGemmCombine::Impl& m = *impl_;
  const PushGemmAllToAllArgs& a = args_;
  if (!m.initialized || static_cast<int>(ranks.size()) != a.virtual_ranks)
    fail("PushGemmAllToAll::run", "needs initialize() and one operand set per virtual rank");
  SignalLaunch L = signal_launch(ranks, a.ranks, ++m.epoch);
  push_steps(m, L, a.virtual_ranks, stream, [&](int v) {
    AllToAllSetupLaunch S;
    S.g = m.arrays[static_cast<size_t>(v)];
    S.ops = ranks[static_cast<size_t>(v)];
    S.ranks = a.ranks;
    S.tokens = a.tokens;
    S.hidden = a.hidden;
    S.cols = a.cols_per_rank;
    all_to_all_setup_kernel<<<1, 32, 0, stream>>>(S);
  });
  // Every peer's rows in this rank's output before anything after the run on the stream.
  L.slot = kSignalDone;
  wait_kernel<<<static_cast<unsigned>(a.virtual_ranks), 32, 0, stream>>>(L, 0);
  MOERUN_CUDA_CHECK(cudaGetLastError());
}

// ---- GatherGemm -----------------------------------------------------------------------------------------
std::string can_implement(const GatherGemmArgs& a) {
  if (std::string why = ranks_rule(a.ranks, a.virtual_ranks); !why.empty()) return why;
  if (a.experts < 1 || a.experts * a.ranks > kMaxGroups)
    return "1 <= experts and experts x ranks <= 1024 groups";
  if (a.hidden <= 0 || a.out <= 0 || a.hidden % 8 != 0 || a.out % 8 != 0)
    return "hidden and out must be positive multiples of 8 (16-byte TMA rows)";
  if (a.hidden > (int64_t{1} << 30) || a.out > (int64_t{1} << 30))
    return "hidden and out must fit int shapes";
  if (a.tokens <= 0 || a.rows < 0 || a.rows > std::numeric_limits<int>::max())
    return "tokens must be positive and rows must fit CUTLASS's int shapes";
  if (std::string why = device_and_images(gather_setup_kernel); !why.empty()) return why;
  int device = 0, sm_count = 0;
  gd::sm90_device("the push GEMMs", device, sm_count);
  if (a.gather_sms < 1 || 2 * a.gather_sms > sm_count) return "1 <= gather_sms <= half the GPU's SMs";
  return {};
}

GatherGemm::GatherGemm(const GatherGemmArgs& args)
    : args_(args), impl_(std::make_unique<PushGemmCombine::Impl>()) {}

GatherGemm::~GatherGemm() {
  for (cudaEvent_t e : gathered_) cudaEventDestroy(e);
  if (fork_) cudaEventDestroy(fork_);
  if (join_) cudaEventDestroy(join_);
  if (side_) cudaStreamDestroy(side_);
}

size_t GatherGemm::workspace_size() const {
  if (std::string why = can_implement(args_); !why.empty()) fail("GatherGemm::workspace_size", why);
  impl_->sms_left = args_.gather_sms;
  return impl_->workspace_size(args_.virtual_ranks * args_.ranks, args_.experts);
}

void GatherGemm::initialize(void* workspace, cudaStream_t stream) {
  if (std::string why = can_implement(args_); !why.empty()) fail("GatherGemm::initialize", why);
  impl_->sms_left = args_.gather_sms;
  impl_->initialize(workspace, args_.virtual_ranks * args_.ranks, args_.experts, stream);
  if (!side_) {
    MOERUN_CUDA_CHECK(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
    MOERUN_CUDA_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
    MOERUN_CUDA_CHECK(cudaEventCreateWithFlags(&join_, cudaEventDisableTiming));
    gathered_.resize(static_cast<size_t>(args_.virtual_ranks * args_.ranks));
    for (cudaEvent_t& e : gathered_) MOERUN_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
}

void GatherGemm::run(std::span<const GatherGemmOperands> ranks, cudaStream_t stream) {
  PushGemmCombine::Impl& m = *impl_;
  const GatherGemmArgs& a = args_;
  if (!m.initialized || static_cast<int>(ranks.size()) != a.virtual_ranks)
    fail("GatherGemm::run", "needs initialize() and one operand set per virtual rank");
  const int R = a.ranks;
  SignalLaunch L = signal_launch(ranks, R, ++m.epoch);
  // Every rank's x is ready (the caller wrote it before the run, on this stream); each rank's chunks' group
  // arrays.
  L.slot = kSignalReady;
  signal_kernel<<<static_cast<unsigned>(a.virtual_ranks), 32, 0, stream>>>(L);
  MOERUN_CUDA_CHECK(cudaGetLastError());
  for (int v = 0; v < a.virtual_ranks; ++v) {
    GatherSetupLaunch S;
    for (int r = 0; r < R; ++r) S.g[r] = m.arrays[static_cast<size_t>(v * R + r)];
    S.ops = ranks[static_cast<size_t>(v)];
    S.ranks = R;
    S.experts = a.experts;
    S.hidden = a.hidden;
    S.out = a.out;
    S.rows = a.rows;
    gather_setup_kernel<<<1, kSetupThreads, 0, stream>>>(S);
    MOERUN_CUDA_CHECK(cudaGetLastError());
  }
  MOERUN_CUDA_CHECK(cudaEventRecord(fork_, stream));
  MOERUN_CUDA_CHECK(cudaStreamWaitEvent(side_, fork_, 0));
  // Chunk by chunk, the own rows first: the gather on the side stream, the chunk's GEMM on the caller's once
  // it is done. The gathers' CTAs run on the SMs the GEMMs leave.
  const auto blocks = static_cast<unsigned>(std::max(1, 2 * a.gather_sms / a.experts));
  for (int v = 0; v < a.virtual_ranks; ++v) {
    for (int k = 0; k < R; ++k) {
      const int r = (ranks[static_cast<size_t>(v)].rank + k) % R;
      wait_peer_kernel<<<1, 32, 0, side_>>>(L, v, r);
      MOERUN_CUDA_CHECK(cudaGetLastError());
      GatherLaunch G;
      G.ops = ranks[static_cast<size_t>(v)];
      G.ranks = R;
      G.experts = a.experts;
      G.r = r;
      G.tokens = a.tokens;
      G.hidden = a.hidden;
      gather_kernel<<<dim3(blocks, static_cast<unsigned>(a.experts)), kCombineThreads, 0, side_>>>(G);
      MOERUN_CUDA_CHECK(cudaGetLastError());
      cudaEvent_t done = gathered_[static_cast<size_t>(v * R + r)];
      MOERUN_CUDA_CHECK(cudaEventRecord(done, side_));
      MOERUN_CUDA_CHECK(cudaStreamWaitEvent(stream, done, 0));
      m.run_gemm(v * R + r, stream);
    }
  }
  // Every peer's x read: tell them; then wait until every peer has read this rank's.
  L.slot = kSignalDone;
  signal_kernel<<<static_cast<unsigned>(a.virtual_ranks), 32, 0, side_>>>(L);
  MOERUN_CUDA_CHECK(cudaGetLastError());
  MOERUN_CUDA_CHECK(cudaEventRecord(join_, side_));
  MOERUN_CUDA_CHECK(cudaStreamWaitEvent(stream, join_, 0));
  wait_kernel<<<static_cast<unsigned>(a.virtual_ranks), 32, 0, stream>>>(L, 0);
  MOERUN_CUDA_CHECK(cudaGetLastError());
}

}  // namespace moeplan::cuda::fused
