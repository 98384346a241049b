// Replay of ops on a GPU with the CUDA backend's kernels (see cuda_replay_runner.h).
#include "executor/runtime/cuda_replay_runner.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <map>
#include <tuple>
#include <vector>

#include "executor/kernels/cuda/attention.h"
#include "executor/kernels/cuda/check.h"
#include "executor/kernels/cuda/gemm.h"
#include "executor/kernels/cuda/grouped_gemm.h"
#include "executor/runtime/replay_runner.h"
#include "simulator/core/status.h"

namespace moeplan::executor {
namespace {

using cuda::DeviceBuffer;

size_t sz(int64_t v) {
  MOEPLAN_ASSERT(v >= 0);
  return static_cast<size_t>(v);
}

[[noreturn]] void refuse(const Op& op, const std::string& why) {
  std::fprintf(stderr, "moerun: the CUDA replay cannot run op %s (%s)\n", op_label(op).c_str(), why.c_str());
  std::abort();
}

}  // namespace

std::string cuda_unsupported(const Plan& plan) {
  if (plan.pipeline.pp > 1) return "pipeline parallelism (pp > 1) on the CUDA backend";
  return "";
}

// One op-graph stream's resources: its CUDA stream, scratch buffers and the kernel objects of the shapes it
// has run. Ops of one stream run one at a time on one host thread, so nothing here is shared between threads
// except the byte counters.
struct Lane {
  cudaStream_t stream = nullptr;
  std::vector<DeviceBuffer<char>> slots;
  DeviceBuffer<char> gemm_workspace;
  std::map<std::tuple<int, int64_t, int64_t, int64_t>, std::unique_ptr<cuda::Gemm>> gemms;
  struct Grouped {
    std::unique_ptr<cuda::GroupedGemm> kernel;
    DeviceBuffer<char> workspace;
    DeviceBuffer<int32_t> counts;
  };
  std::map<std::tuple<int, int, int64_t, int64_t, int64_t>, Grouped> grouped;
  std::unique_ptr<cuda::CudnnHandle> cudnn;
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t>, std::unique_ptr<cuda::FlashAttention>> attention;
};

struct CudaReplayRunner::Impl {
  DeviceGroupLookup groups;
  std::vector<Lane> lanes;
  std::atomic<double> bytes{0}, high_water{0};

  explicit Impl(DeviceGroupLookup gr) : groups(std::move(gr)), lanes(sz(kNumStreams)) {
    for (Lane& l : lanes) MOERUN_CUDA_CHECK(cudaStreamCreateWithFlags(&l.stream, cudaStreamNonBlocking));
  }
  ~Impl() {
    for (Lane& l : lanes) {
      const cudaStream_t s = l.stream;
      cudaStreamSynchronize(s);
      l = Lane{};  // kernel objects and buffers first, then the stream
      cudaStreamDestroy(s);
    }
  }

  void count(double delta) {
    const double now = bytes.fetch_add(delta) + delta;
    double hw = high_water.load();
    while (now > hw && !high_water.compare_exchange_weak(hw, now)) {
    }
  }

  // Scratch slot `i` of at least `n` bytes; fresh memory holds 0x3C bytes (bf16 and fp32 ~0.0115: finite,
  // nonzero data, as timings on zeros can flatter a kernel).
  void* slot(Lane& l, size_t i, size_t n) {
    if (l.slots.size() <= i) l.slots.resize(i + 1);
    DeviceBuffer<char>& b = l.slots[i];
    if (b.size() < n) {
      count(-static_cast<double>(b.size()));
      b = DeviceBuffer<char>(n);
      count(static_cast<double>(n));
      MOERUN_CUDA_CHECK(cudaMemsetAsync(b.data(), 0x3C, n, l.stream));
    }
    return b.data();
  }

  void gemm(const Op& op, Lane& l) {
    const int64_t m = op.gemm.m, n = op.gemm.n, k = op.gemm.k;
    if (m <= 0 || n <= 0 || k <= 0) return;
    if (op.gemm.groups > 1) return grouped(op, l);
    cuda::GemmProblem p;
    switch (op.part) {
      case GemmPart::kNone:  // Y [m, n] = X [m, k] W [k, n]
        p = {cuda::GemmOp::kForward, m, n, k, cuda::GemmType::kBf16, cuda::GemmType::kBf16, false};
        break;
      case GemmPart::kDgrad:  // dX [m, k] = dY [m, n] W^T
        p = {cuda::GemmOp::kDgrad, m, k, n, cuda::GemmType::kBf16, cuda::GemmType::kBf16, false};
        break;
      case GemmPart::kWgrad:  // dW [k, n] += X^T dY, fp32 main grad
        p = {cuda::GemmOp::kWgrad, k, n, m, cuda::GemmType::kBf16, cuda::GemmType::kF32, true};
        break;
    }
    auto& g = l.gemms[{static_cast<int>(p.op), p.m, p.n, p.k}];
    if (!g) {
      g = std::make_unique<cuda::Gemm>(p);
      if (!g->can_implement().empty()) refuse(op, g->can_implement());
      if (l.gemm_workspace.size() < g->workspace_size()) {
        count(static_cast<double>(g->workspace_size()) - static_cast<double>(l.gemm_workspace.size()));
        l.gemm_workspace = DeviceBuffer<char>(g->workspace_size());
      }
    }
    // A [m, k] or [k, m], B [k, n] or [n, k]: both m k and k n elements; C [m, n].
    const size_t c_bytes = sz(p.m * p.n) * (p.output == cuda::GemmType::kF32 ? 4 : 2);
    g->run({slot(l, 0, sz(p.m * p.k) * 2), slot(l, 1, sz(p.k * p.n) * 2), slot(l, 2, c_bytes)},
           l.gemm_workspace.data(), l.stream);
  }

  void grouped(const Op& op, Lane& l) {
    const int e = static_cast<int>(op.gemm.groups);
    const int64_t per = (op.gemm.m + e - 1) / e, rows = per * e, in = op.gemm.k, out = op.gemm.n;
    const cuda::ExpertGemmOp kind = op.part == GemmPart::kDgrad   ? cuda::ExpertGemmOp::kDgrad
                                    : op.part == GemmPart::kWgrad ? cuda::ExpertGemmOp::kWgrad
                                                                  : cuda::ExpertGemmOp::kForward;
    Lane::Grouped& g = l.grouped[{static_cast<int>(kind), e, in, out, per}];
    if (!g.kernel) {
      g.kernel = std::make_unique<cuda::GroupedGemm>(cuda::GroupedGemmProblem{kind, e, in, out});
      if (const std::string why = g.kernel->can_implement(); !why.empty()) refuse(op, why);
      g.workspace = DeviceBuffer<char>(g.kernel->workspace_size());
      const std::vector<int32_t> counts(sz(e), static_cast<int32_t>(per));  // uniform routing
      g.counts = DeviceBuffer<int32_t>(counts.size());
      MOERUN_CUDA_CHECK(cudaMemcpyAsync(g.counts.data(), counts.data(), counts.size() * sizeof(int32_t),
                                        cudaMemcpyHostToDevice, l.stream));
      count(static_cast<double>(g.workspace.size()));
      g.kernel->initialize(g.workspace.data(), l.stream);
    }
    // Forward: x [rows, in], w [E, in, out] -> y [rows, out]; dgrad: dy [rows, out], w -> dx [rows, in];
    // wgrad: x [rows, in], dy [rows, out] -> dw [E, in, out] fp32.
    const size_t w = sz(e * in * out) * 2;
    cuda::GroupedGemmOperands ops;
    switch (kind) {
      case cuda::ExpertGemmOp::kForward:
        ops = {g.counts.data(), slot(l, 0, sz(rows * in) * 2), slot(l, 1, w), slot(l, 2, sz(rows * out) * 2),
               rows};
        break;
      case cuda::ExpertGemmOp::kDgrad:
        ops = {g.counts.data(), slot(l, 0, sz(rows * out) * 2), slot(l, 1, w), slot(l, 2, sz(rows * in) * 2),
               rows};
        break;
      case cuda::ExpertGemmOp::kWgrad:
        ops = {g.counts.data(), slot(l, 0, sz(rows * in) * 2), slot(l, 1, sz(rows * out) * 2),
               slot(l, 2, w * 2), rows};
        break;
    }
    g.kernel->run(ops, l.stream);
  }

  void attention(const Op& op, Lane& l) {
    const AttentionShape& a = op.attn;
    if (a.batch <= 0 || a.seq_q <= 0 || a.heads <= 0 || a.qk_dim <= 0) return;
    if (!l.cudnn) l.cudnn = std::make_unique<cuda::CudnnHandle>();
    auto& f = l.attention[{a.batch, a.seq_q, a.heads, a.qk_dim}];
    if (!f) {
      cuda::AttentionShape s;
      s.batch = a.batch;
      s.seq = a.seq_q;
      s.q_heads = s.kv_heads = a.heads;
      s.head_dim = a.qk_dim;
      s.causal = true;
      f = std::make_unique<cuda::FlashAttention>(l.cudnn->get(), s);
      if (!f->unsupported().empty()) refuse(op, f->unsupported());
      count(static_cast<double>(f->workspace_bytes()));
    }
    const cuda::AttentionShape& s = f->shape();
    const size_t qb = sz(s.q_elems()) * 2, kb = sz(s.kv_elems()) * 2, st = sz(s.stats_elems()) * 4;
    auto* q = static_cast<cuda::bf16*>(slot(l, 0, qb));
    auto* k = static_cast<cuda::bf16*>(slot(l, 1, kb));
    auto* v = static_cast<cuda::bf16*>(slot(l, 2, kb));
    auto* o = static_cast<cuda::bf16*>(slot(l, 3, qb));
    auto* stats = static_cast<float*>(slot(l, 4, st));
    if (op.phase == Phase::kBackward) {
      auto* d_o = static_cast<cuda::bf16*>(slot(l, 5, qb));
      f->backward(q, k, v, o, d_o, stats, static_cast<cuda::bf16*>(slot(l, 6, qb)),
                  static_cast<cuda::bf16*>(slot(l, 7, kb)), static_cast<cuda::bf16*>(slot(l, 8, kb)),
                  l.stream);
    } else {
      f->forward(q, k, v, o, stats, l.stream);
    }
  }

  void copy(double hbm_bytes, Lane& l) {
    const auto n = static_cast<size_t>(hbm_bytes / 2.0);  // read n, write n
    if (n == 0) return;
    MOERUN_CUDA_CHECK(cudaMemcpyAsync(slot(l, 0, n), slot(l, 1, n), n, cudaMemcpyDeviceToDevice, l.stream));
  }

  void collective(const Op& op, Lane& l) {
    DeviceCommunicator* c = groups(op.comm.group);
    if (c == nullptr) return;  // a group of one rank moves nothing
    const int size = c->size();
    const int64_t values = comm_values(op.comm, size);
    const size_t eb = static_cast<size_t>(bytes_of(op.comm.dtype));
    void* buf = slot(l, 0, sz(values) * eb);
    void* out = slot(l, 1, sz(values) * eb);
    DType t = op.comm.dtype;
    switch (op.comm.collective) {
      case Collective::kAllReduce:
        if (t == DType::kFp8) t = DType::kBf16;  // nothing reduces fp8
        c->all_reduce(buf, sz(values), t, l.stream);
        break;
      case Collective::kAllGather:
        c->all_gather(buf, out, sz(values / size), t, l.stream);
        break;
      case Collective::kReduceScatter:
        if (t == DType::kFp8) t = DType::kBf16;
        c->reduce_scatter(buf, out, sz(values / size), t, l.stream);
        break;
      case Collective::kAllToAll: {
        const std::vector<int64_t> counts(sz(size), values / size);
        c->all_to_all_v(buf, counts, out, counts, t, l.stream);
        break;
      }
      case Collective::kSendRecv:
        refuse(op, "pipeline sends (cuda_unsupported refuses pp > 1)");
    }
  }
};

CudaReplayRunner::CudaReplayRunner(DeviceGroupLookup groups)
    : impl_(std::make_unique<Impl>(std::move(groups))) {}

CudaReplayRunner::~CudaReplayRunner() = default;

void CudaReplayRunner::run(const Op& op) {
  Impl& I = *impl_;
  Lane& l = I.lanes[static_cast<size_t>(op.stream)];
  switch (op.kind) {
    case OpKind::kGemm:
    case OpKind::kGroupedGemm:
      I.gemm(op, l);
      break;
    case OpKind::kAttention:
      I.attention(op, l);
      break;
    case OpKind::kMemoryBound:
    case OpKind::kOptimizer:
      I.copy(op.hbm_bytes, l);
      break;
    case OpKind::kCollective:
    case OpKind::kSendRecv:
      I.collective(op, l);
      break;
    case OpKind::kFusedGemmComm:  // the GEMM, then the collective: the fused kernels (kernels/cuda/fused/)
                                  // are not wired into the replay yet
      I.gemm(op, l);
      I.collective(op, l);
      break;
  }
  MOERUN_CUDA_CHECK(cudaGetLastError());
  MOERUN_CUDA_CHECK(cudaStreamSynchronize(l.stream));
}

void CudaReplayRunner::receive(const Op& send) {
  refuse(send, "pipeline receives (cuda_unsupported refuses pp > 1)");
}

double CudaReplayRunner::device_bytes() const {
  return impl_->bytes.load();
}

double CudaReplayRunner::device_high_water_bytes() const {
  return impl_->high_water.load();
}

}  // namespace moeplan::executor
