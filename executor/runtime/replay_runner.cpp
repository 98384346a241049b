// Replay of ops with work of their exact shapes (see replay_runner.h).
#include "executor/runtime/replay_runner.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <Eigen/Core>

#include "executor/kernels/cpu/attention.h"
#include "executor/runtime/stage_schedule.h"
#include "simulator/core/attention_calls.h"
#include "simulator/core/model_stats.h"
#include "simulator/core/status.h"

namespace moeplan::executor {
namespace {

using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MapMat = Eigen::Map<Mat>;
using MapArr = Eigen::Map<Eigen::ArrayXf>;

size_t sz(int64_t v) {
  MOEPLAN_ASSERT(v >= 0);
  return static_cast<size_t>(v);
}

}  // namespace

int64_t comm_values(const CommSpec& comm, int group_size) {
  const auto values = static_cast<int64_t>(std::ceil(comm.bytes / bytes_of(comm.dtype)));
  const int64_t g = std::max(1, group_size);
  return (values + g - 1) / g * g;
}

WireFormat wire_format_of(DType dtype) {
  switch (dtype) {
    case DType::kFp32:
      return WireFormat::kFp32;
    case DType::kBf16:
    case DType::kFp16:
      return WireFormat::kBf16;
    case DType::kFp8:
      return WireFormat::kFp8E4m3;
  }
  return WireFormat::kFp32;
}

std::span<float> ReplayRunner::Scratch::get(size_t slot, size_t n) {
  if (slots.size() <= slot) slots.resize(slot + 1);
  std::vector<float>& v = slots[slot];
  if (v.size() < n) {
    if (bytes() + 4.0 * static_cast<double>(n - v.size()) > kScratchCapBytes) {
      for (std::vector<float>& other : slots) std::vector<float>().swap(other);  // bound memory: start over
    }
    v.assign(n, 0.01f);
  }
  return {v.data(), n};
}

double ReplayRunner::Scratch::bytes() const {
  double b = 0;
  for (const auto& v : slots) b += 4.0 * static_cast<double>(v.capacity());
  return b;
}

ReplayRunner::ReplayRunner(const OpGraph& graph, GroupLookup groups, std::function<int(int)> pp_rank_of_stage)
    : graph_(graph),
      groups_(std::move(groups)),
      pp_rank_of_stage_(std::move(pp_rank_of_stage)),
      scratch_(sz(kNumStreams + graph.num_stages)) {
  Eigen::setNbThreads(1);  // one core per lane, as a GPU stream owns its SMs
  if (!pp_rank_of_stage_) pp_rank_of_stage_ = [](int stage) { return stage; };
}

double ReplayRunner::scratch_bytes() const {
  double b = 0;
  for (const Scratch& s : scratch_) b += s.bytes();
  return b;
}

void ReplayRunner::draw_routing(RoutingDrawSpec spec) {
  routing_.emplace(graph_.ops, std::move(spec));
}

void ReplayRunner::prepare_step() {
  if (routing_) routing_->draw_step();
}

ReplayRunner::RoutingStats ReplayRunner::routing_stats() const {
  return routing_ ? routing_->stats() : RoutingStats{};
}

void ReplayRunner::run(const Op& op) {
  Scratch& s = scratch_for(static_cast<size_t>(op.stream));
  if (const std::optional<double> scale = routing_ ? routing_->row_scale(op) : std::nullopt) {
    memory_bound(op.hbm_bytes * *scale, s);
    return;
  }
  switch (op.kind) {
    case OpKind::kGemm:
    case OpKind::kGroupedGemm:
      gemm(op, s);
      break;
    case OpKind::kAttention:
      attention(op, s);
      break;
    case OpKind::kMemoryBound:
      memory_bound(op.hbm_bytes, s);
      break;
    case OpKind::kOptimizer:
      optimizer(op, s);
      break;
    case OpKind::kCollective:
    case OpKind::kSendRecv:
      collective(op, s);
      break;
    case OpKind::kFusedGemmComm:
      gemm(op, s);
      collective(op, s);
      break;
  }
}

void ReplayRunner::gemm(const Op& op, Scratch& s) {
  const int64_t groups = std::max<int64_t>(1, op.gemm.groups);
  const int64_t n = op.gemm.n, k = op.gemm.k;
  if (op.gemm.m <= 0 || n <= 0 || k <= 0) return;
  // Rows per group: each local expert's drawn rows, or the lowered rows spread evenly.
  std::vector<int64_t> rows = routing_ ? routing_->expert_rows(op) : std::vector<int64_t>{};
  if (rows.empty()) rows.assign(sz(groups), (op.gemm.m + groups - 1) / groups);
  const int64_t total = std::accumulate(rows.begin(), rows.end(), int64_t{0});
  // [rows_g, k] activations per group, [k, n] weights per group, [rows_g, n] outputs per group.
  std::span<float> a = s.get(0, sz(std::max<int64_t>(1, total * k))), b = s.get(1, sz(groups * k * n)),
                   c = s.get(2, sz(std::max<int64_t>(1, total * n)));
  int64_t r0 = 0;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t m = rows[sz(g)];
    MapMat A(a.data() + r0 * k, m, k), B(b.data() + g * k * n, k, n), C(c.data() + r0 * n, m, n);
    r0 += m;
    if (m == 0) continue;
    // Each product's FLOPs from the operands it is given: 2 x rows x inner x columns.
    auto product_flops = [](const auto& x, const auto& y) {
      return 2.0 * static_cast<double>(x.rows()) * static_cast<double>(x.cols()) *
             static_cast<double>(y.cols());
    };
    switch (op.part) {
      case GemmPart::kNone:
        C.noalias() = A * B;
        gemm_work_.flops += product_flops(A, B);
        break;
      case GemmPart::kDgrad:  // dX [m, k] = dY [m, n] x W^T
        A.noalias() = C * B.transpose();
        gemm_work_.flops += product_flops(C, B.transpose());
        break;
      case GemmPart::kWgrad:  // dW [k, n] = X^T [k, m] x dY [m, n]
        B.noalias() = A.transpose() * C;
        gemm_work_.flops += product_flops(A.transpose(), C);
        break;
    }
    ++gemm_work_.products;
  }
}

void ReplayRunner::attention(const Op& op, Scratch& s) {
  // moerun's CPU attention kernel, the one `moerun bench` measures (attention.csv), once per sequence for
  // each call that does the op's work (attention_calls: context parallelism's local and remote
  // parts at their own key counts), with all of the call's heads at once: q [sq, h d]; k [skv, kvh d];
  // v [skv, kvh dv]; out, dout [sq, h dv]; lse [sq, h] (dv: the call's value head dim, MLA's 128 beside
  // its 192 for scores).
  for (const AttentionCall& c : attention_calls(op)) {
    const int64_t sq = c.seq_q, skv = c.seq_kv, h = c.heads, kvh = c.kv_heads, d = c.qk_dim;
    const int64_t dv = c.v_dim > 0 ? c.v_dim : d;
    MapMat q(s.get(0, sz(sq * h * d)).data(), sq, h * d), k(s.get(1, sz(skv * kvh * d)).data(), skv, kvh * d);
    MapMat v(s.get(2, sz(skv * kvh * dv)).data(), skv, kvh * dv),
        out(s.get(3, sz(sq * h * dv)).data(), sq, h * dv);
    MapMat dout(s.get(4, sz(sq * h * dv)).data(), sq, h * dv), lse(s.get(5, sz(sq * h)).data(), sq, h);
    // Causal: the diagonal aligned bottom-right (the queries are the last sq of skv positions); non-causal:
    // every key is at or before every query, as the bench's non-causal case.
    std::vector<int64_t> q_pos(sz(sq)), k_pos(sz(skv));
    for (int64_t j = 0; j < skv; ++j) k_pos[sz(j)] = j;
    for (int64_t i = 0; i < sq; ++i) q_pos[sz(i)] = c.causal ? skv - sq + i : skv;
    const cpu::AttnHeads heads{h, kvh, d, 0, 0, c.window, dv};
    lse.setConstant(std::log(static_cast<float>(skv)));  // a uniform softmax's log-sum-exp: finite P
    for (int64_t b = 0; b < c.batch; ++b) {
      ++attention_work_.kernel_calls;
      attention_work_.query_rows += q.rows();
      attention_work_.key_rows += k.rows();
      attention_work_.value_cols += v.cols();
      if (op.phase == Phase::kBackward) ++attention_work_.backward_calls;
      if (op.phase == Phase::kBackward) {
        const auto g = cpu::attn_core_backward<float>(q, k, v, out, lse, dout, q_pos, k_pos, heads);
        MOEPLAN_ASSERT(g.dq.rows() == sq);
      } else {
        const auto o = cpu::attn_core_forward<float>(q, k, v, q_pos, k_pos, heads);
        MOEPLAN_ASSERT(o.out.rows() == sq);
      }
    }
  }
}

void ReplayRunner::memory_bound(double bytes, Scratch& s) {
  // STREAM triad a = b + q c, the loop `moerun bench` measures for hbm.csv (and the profile's
  // hbm_bw_achieved_GBps), over fp32 as all replay data: counted as STREAM does (3 arrays), bytes / 12
  // elements.
  const auto n = static_cast<int64_t>(bytes / 12.0);
  if (n <= 0) return;
  float* a = s.get(0, sz(n)).data();
  const float* b = s.get(1, sz(n)).data();
  const float* c = s.get(2, sz(n)).data();
  const float q = 3.0f;
  for (int64_t i = 0; i < n; ++i) a[i] = b[i] + q * c[i];
}

void ReplayRunner::optimizer(const Op& op, Scratch& s) {
  const auto n = static_cast<int64_t>(op.hbm_bytes / kAdamStepBytesPerParam);
  if (n <= 0) return;
  MapArr p(s.get(0, sz(n)).data(), n), g(s.get(1, sz(n)).data(), n);
  MapArr m(s.get(2, sz(n)).data(), n), v(s.get(3, sz(n)).data(), n);
  constexpr float kB1 = 0.9f, kB2 = 0.95f, kLr = 1e-4f, kEps = 1e-8f;
  m = kB1 * m + (1 - kB1) * g;
  v = kB2 * v + (1 - kB2) * g.square();
  p -= kLr * m / (v.sqrt() + kEps);
}

void ReplayRunner::collective(const Op& op, Scratch& s) {
  Communicator* comm = groups_(op.comm.group);
  if (comm == nullptr || comm->size() <= 1) return;  // no peers: nothing crosses a wire
  const int size = comm->size();
  const WireFormat wire = wire_format_of(op.comm.dtype);
  const int64_t values = comm_values(op.comm, op.kind == OpKind::kSendRecv ? 1 : size);
  const int64_t share = values / size;
  switch (op.kind == OpKind::kSendRecv ? Collective::kSendRecv : op.comm.collective) {
    case Collective::kAllReduce:
      comm->all_reduce(s.get(10, sz(values)), wire);
      break;
    case Collective::kAllGather: {
      std::span<float> in = s.get(10, sz(share)), out = s.get(11, sz(values));
      comm->all_gather(in, out, wire);
      break;
    }
    case Collective::kReduceScatter: {
      std::span<float> in = s.get(10, sz(values)), out = s.get(11, sz(share));
      comm->reduce_scatter(in, out, wire);
      break;
    }
    case Collective::kAllToAll: {
      if (const auto x = routing_ ? routing_->exchange(op, comm_values(op.comm, 1)) : std::nullopt) {
        MOEPLAN_ASSERT(comm->rank() == routing_->spec().ep_rank && size == routing_->spec().ep);
        std::span<float> in = s.get(10, sz(std::max<int64_t>(1, x->send_total)));
        std::span<float> out = s.get(11, sz(std::max<int64_t>(1, x->recv_total)));
        comm->all_to_all_v(in.first(sz(x->send_total)), x->send, out.first(sz(x->recv_total)), x->recv, wire);
        break;
      }
      const std::vector<int64_t> counts(sz(size), share);
      std::span<float> in = s.get(10, sz(values)), out = s.get(11, sz(values));
      comm->all_to_all_v(in, counts, out, counts, wire);
      break;
    }
    case Collective::kSendRecv: {
      const int peer = pp_rank_of_stage_(pipeline_peer_stage(graph_, op));
      comm->send(s.get(10, sz(values)), peer, pipeline_tag(graph_, op), wire);
      break;
    }
  }
}

void ReplayRunner::receive(const Op& send) {
  Communicator* comm = groups_(CommGroup::kPp);
  MOEPLAN_ASSERT(comm != nullptr);
  Scratch& s = scratch_for(sz(kNumStreams + send.stage));
  const int64_t values = comm_values(send.comm, 1);
  comm->recv(s.get(0, sz(values)), pp_rank_of_stage_(send.stage), pipeline_tag(graph_, send),
             wire_format_of(send.comm.dtype));
}

}  // namespace moeplan::executor
