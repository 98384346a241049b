// moerun's fused GEMM + communication kernels (executor/kernels/cuda/fused/fused_gemm_comm.h) against the
// unfused sequence computed by the CPU kernels: gather rows, then the experts' GEMM (expert_gemm_forward);
// the experts' GEMM, then scatter and the gate-weighted combine; a GEMM, then the Ulysses all-to-all; the
// all-to-all, then a GEMM. Each runs with 1, 2, 4 and 8 virtual ranks on one GPU (every rank's peers are
// buffers on this device), which exercises the tile and chunk signalling between CTAs and between ranks,
// and twice in a row, which exercises the epochs that let the signal arrays go without resets. One case runs
// a kernel on a real NCCL symmetric window (a one-rank group: NCCL refuses two ranks on one GPU) where
// NCCL allows one (2.28.7 on); before that it checks that the window is refused with NCCL's reason.
//
// Precision ladder (as gemm_test.cpp): the reference is the CPU kernel in double on the bf16 inputs; the GPU
// must stay within 3x the error of a naive version that rounds what the kernel rounds (its bf16 outputs,
// and for the combine its bf16 expert rows) plus 1e-4 max|reference|. Moved rows must be bit-exact. Outputs
// are poisoned with NaN before each run, so a row or tile a kernel skips fails.
#include <cuda_bf16.h>
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "executor/comm/nccl_communicator.h"
#include "executor/comm/symmetric_memory.h"
#include "executor/kernels/cpu/init.h"
#include "executor/kernels/cpu/moe.h"
#include "executor/kernels/cuda/check.h"
#include "executor/kernels/cuda/fused/fused_gemm_comm.h"
#include "executor/kernels/cuda/fused/push_gemm.h"
#include "tests/executor/kernels/cuda/bf16_ladder.h"

namespace moeplan::cuda::fused {
namespace {

using test::download_bf16;
using test::MatD;
using test::round_bf16;
using test::upload_bf16;

MatD random_bf16(int64_t rows, int64_t cols, uint64_t seed) {
  return test::random_bf16(rows, cols, seed, 0xf5e);
}

// The ladder at 3x the naive error plus 1e-4 max|reference| (see the header comment).
void check_ladder(const MatD& got, const MatD& ref, const MatD& naive, const std::string& what) {
  test::check_ladder(got, ref, naive, 3.0, 1e-4, what);
}

template <class T>
DeviceBuffer<T> upload(const std::vector<T>& h) {
  DeviceBuffer<T> d(std::max<size_t>(h.size(), 1));
  if (!h.empty()) d.upload(h.data(), h.size());
  return d;
}

// Waits for a fused kernel. A signalling bug hangs rather than fails: after 30 s the test aborts, which
// doctest reports as a crashed case (and the device check reruns the binary without it).
void finish(const char* what) {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    const cudaError_t st = cudaStreamQuery(nullptr);
    if (st == cudaSuccess) return;
    if (st != cudaErrorNotReady) MOERUN_CUDA_CHECK(st);
    if (std::chrono::steady_clock::now() - start > std::chrono::seconds(30)) {
      std::fprintf(stderr, "fused kernel hung (over 30 s): %s\n", what);
      std::abort();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void poison(Bf16* p, size_t n) {
  MOERUN_CUDA_CHECK(cudaMemset(p, 0xFF, n * sizeof(Bf16)));
}

// MoE routing over R ranks with E local experts each: token t of rank q picks two distinct global experts;
// expert g lives on rank g / E. For each owner rank, its rows sorted by (local expert, source rank, token,
// choice), the order the permute kernels use.
constexpr int kTopK = 2;
struct Routing {
  struct Row {
    int src_rank;
    int64_t token;
    int choice;
  };
  std::vector<std::vector<Row>> rows;        // [owner rank] its expert-sorted rows
  std::vector<std::vector<int32_t>> counts;  // [owner rank][local expert]
  std::vector<std::vector<int64_t>> counts64;
};

Routing route(int ranks, int experts, int64_t tokens) {
  const int global = ranks * experts;
  Routing r;
  r.rows.resize(static_cast<size_t>(ranks));
  r.counts.assign(static_cast<size_t>(ranks), std::vector<int32_t>(static_cast<size_t>(experts), 0));
  std::vector<std::vector<std::vector<Routing::Row>>> by_expert(
      static_cast<size_t>(ranks), std::vector<std::vector<Routing::Row>>(static_cast<size_t>(experts)));
  for (int q = 0; q < ranks; ++q)
    for (int64_t t = 0; t < tokens; ++t) {
      // Skewed: a third of the tokens crowd onto global expert 0, as a hot expert would.
      const int g0 = t % 3 == 0 ? 0 : static_cast<int>((t * 7 + q * 3) % global);
      const int g1 = static_cast<int>((g0 + 1 + (t * 5 + q) % (global - 1)) % global);
      const int picks[kTopK] = {g0, g1};
      for (int j = 0; j < kTopK; ++j) {
        const int owner = picks[j] / experts, local = picks[j] % experts;
        by_expert[static_cast<size_t>(owner)][static_cast<size_t>(local)].push_back({q, t, j});
      }
    }
  r.counts64.resize(static_cast<size_t>(ranks));
  for (int o = 0; o < ranks; ++o)
    for (int e = 0; e < experts; ++e) {
      auto& v = by_expert[static_cast<size_t>(o)][static_cast<size_t>(e)];
      std::stable_sort(v.begin(), v.end(),
                       [](const Routing::Row& a, const Routing::Row& b) { return a.src_rank < b.src_rank; });
      r.rows[static_cast<size_t>(o)].insert(r.rows[static_cast<size_t>(o)].end(), v.begin(), v.end());
      r.counts[static_cast<size_t>(o)][static_cast<size_t>(e)] = static_cast<int32_t>(v.size());
      r.counts64[static_cast<size_t>(o)].push_back(static_cast<int64_t>(v.size()));
    }
  return r;
}

// The group's counts [expert owner q][token owner r][local expert e] of `routing` (push_gemm.h).
std::vector<int32_t> group_counts(const Routing& routing, int ranks, int experts) {
  std::vector<int32_t> counts(static_cast<size_t>(ranks * ranks * experts), 0);
  for (int q = 0; q < ranks; ++q) {
    size_t i = 0;
    for (int e = 0; e < experts; ++e)
      for (int32_t k = 0; k < routing.counts[static_cast<size_t>(q)][static_cast<size_t>(e)]; ++k, ++i)
        ++counts[static_cast<size_t>(
            (q * ranks + routing.rows[static_cast<size_t>(q)][i].src_rank) * experts + e)];
  }
  return counts;
}

constexpr int kRanks[] = {1, 2, 4, 8};
constexpr int kRuns = 2;  // the second run reuses the signal arrays with the next epoch

// The experts' second GEMM and the combine of `routing`, on the CPU: each expert owner's rows h and weights
// w (seeds `seed` + rank and `seed` + 100 + rank), its expert rows y = h_e W_e, each token owner's gates
// (seed + 200 + rank, as doubles and as the floats the GPU reads), and each token owner's output
// out[t] = sum_j gate(t, j) y_owner[row of (t, j)]: `ref` exact, `naive` with the rows and the output rounded
// to bf16 as the kernels round them.
struct CombineCase {
  std::vector<MatD> h, w, y, gates, ref, naive;
  std::vector<std::vector<float>> gate_values;

  // Each token owner's combined output on the device against `ref`, on the ladder of `naive`.
  void check(const std::vector<DeviceBuffer<Bf16>>& out) const {
    for (size_t q = 0; q < ref.size(); ++q)
      check_ladder(download_bf16(out[q].data(), ref[q].rows(), ref[q].cols()), ref[q], naive[q],
                   "combined output of rank " + std::to_string(q));
  }
};
CombineCase combine_case(const Routing& routing, int ranks, int experts, int64_t tokens, int64_t in,
                         int64_t hidden, uint64_t seed) {
  CombineCase c;
  for (int r = 0; r < ranks; ++r) {
    const int64_t n = static_cast<int64_t>(routing.rows[static_cast<size_t>(r)].size());
    c.h.push_back(random_bf16(n, in, seed + r));
    c.w.push_back(random_bf16(experts * in, hidden, seed + 100 + r));
    c.y.push_back(executor::cpu::expert_gemm_forward<double>(c.h.back(), c.w.back(),
                                                             routing.counts64[static_cast<size_t>(r)]));
    MatD g(tokens, kTopK);
    std::vector<float> gf;
    for (int64_t t = 0; t < tokens; ++t)
      for (int j = 0; j < kTopK; ++j) {
        g(t, j) = static_cast<double>(
            static_cast<float>(0.25 + 0.5 * std::abs(executor::cpu::init_normal(seed + 200 + r, 1, t, j))));
        gf.push_back(static_cast<float>(g(t, j)));
      }
    c.gates.push_back(g);
    c.gate_values.push_back(gf);
  }
  c.ref.assign(static_cast<size_t>(ranks), MatD::Zero(tokens, hidden));
  c.naive = c.ref;
  for (int o = 0; o < ranks; ++o) {
    const auto& rows = routing.rows[static_cast<size_t>(o)];
    for (size_t i = 0; i < rows.size(); ++i) {
      const auto& row = rows[i];
      const double g = c.gates[static_cast<size_t>(row.src_rank)](row.token, row.choice);
      const auto y_row = c.y[static_cast<size_t>(o)].row(static_cast<int64_t>(i));
      c.ref[static_cast<size_t>(row.src_rank)].row(row.token) += g * y_row;
      c.naive[static_cast<size_t>(row.src_rank)].row(row.token) += g * round_bf16(y_row);
    }
  }
  for (MatD& m : c.naive) m = round_bf16(m);
  return c;
}

// The experts' first GEMM of `routing` on R virtual ranks, for either gather kernel: each rank's tokens x and
// weights w (seeds `seed` + rank and `seed` + 100 + rank) on the CPU and the device, its gathered and output
// buffers, and the check of a run against the CPU's gather then expert GEMM (gathered rows bit-exact, y on
// the ladder).
struct GatherCase {
  const Routing& routing;
  int64_t tokens, hidden, out, cap;
  std::vector<MatD> x, w;
  std::vector<DeviceBuffer<Bf16>> dx, dw, dg, dy;

  GatherCase(const Routing& r, int ranks, int64_t tokens_, int64_t hidden_, int64_t out_, uint64_t seed)
      : routing(r), tokens(tokens_), hidden(hidden_), out(out_), cap(tokens_ * ranks * kTopK) {
    for (int q = 0; q < ranks; ++q) {
      x.push_back(random_bf16(tokens, hidden, seed + q));
      w.push_back(random_bf16(static_cast<int64_t>(r.counts[0].size()) * hidden, out, seed + 100 + q));
      dx.push_back(upload_bf16(x.back()));
      dw.push_back(upload_bf16(w.back()));
      dg.emplace_back(static_cast<size_t>(cap * hidden));
      dy.emplace_back(static_cast<size_t>(cap * out));
    }
  }
  // Rank q's operands common to both kernels (their x, signals, gathered, w and y).
  template <class Operands>
  void wire(Operands& o, int q, const VirtualSignals& sig) {
    o.rank = q;
    for (int p = 0; p < static_cast<int>(x.size()); ++p) {
      o.x[p] = dx[static_cast<size_t>(p)].data();
      o.signals[p] = sig.of(p);
    }
    o.gathered = dg[static_cast<size_t>(q)].data();
    o.w = dw[static_cast<size_t>(q)].data();
    o.y = dy[static_cast<size_t>(q)].data();
  }
  void poison_outputs() {
    for (size_t q = 0; q < dg.size(); ++q) {
      poison(dg[q].data(), dg[q].size());
      poison(dy[q].data(), dy[q].size());
    }
  }
  void check() const {
    for (size_t q = 0; q < x.size(); ++q) {
      const auto& rows = routing.rows[q];
      const int64_t n = static_cast<int64_t>(rows.size());
      MatD gathered(n, hidden);
      for (int64_t i = 0; i < n; ++i)
        gathered.row(i) = x[static_cast<size_t>(rows[static_cast<size_t>(i)].src_rank)].row(
            rows[static_cast<size_t>(i)].token);
      const MatD got_g = download_bf16(dg[q].data(), n, hidden);
      CHECK((n == 0 || (got_g - gathered).cwiseAbs().maxCoeff() == 0.0));
      const MatD ref = executor::cpu::expert_gemm_forward<double>(gathered, w[q], routing.counts64[q]);
      check_ladder(download_bf16(dy[q].data(), n, out), ref, round_bf16(ref),
                   "y of rank " + std::to_string(q));
    }
  }
};

}  // namespace

TEST_SUITE("gpu") {
  TEST_CASE("fused all-gather + grouped GEMM equals gather then expert GEMM on 1, 2, 4 and 8 virtual ranks") {
    MOERUN_SKIP_WITHOUT_DEVICE();
    constexpr int64_t kTokens = 96, kHidden = 264, kOut = 520;
    constexpr int kExperts = 3;
    for (int R : kRanks) {
      INFO("ranks " << R);
      const Routing routing = route(R, kExperts, kTokens);
      GatherCase c(routing, R, kTokens, kHidden, kOut, 100);
      std::vector<DeviceBuffer<int32_t>> dcounts, dsrc_rank, dsrc_row;
      for (int r = 0; r < R; ++r) {
        std::vector<int32_t> sr, sw;
        for (const auto& row : routing.rows[static_cast<size_t>(r)]) {
          sr.push_back(row.src_rank);
          sw.push_back(static_cast<int32_t>(row.token));
        }
        dcounts.push_back(upload(routing.counts[static_cast<size_t>(r)]));
        dsrc_rank.push_back(upload(sr));
        dsrc_row.push_back(upload(sw));
      }
      VirtualSignals sig(R);
      AllGatherGroupedGemmArgs args;
      args.group = {R, R, 0};
      args.experts = kExperts;
      args.tokens = kTokens;
      args.hidden = kHidden;
      args.out = kOut;
      args.rows = c.cap;
      REQUIRE_MESSAGE(can_implement(args).empty(), can_implement(args));
      AllGatherGroupedGemm k(args);
      DeviceBuffer<char> ws(k.workspace_size());
      k.initialize(ws.data(), nullptr);
      std::vector<AllGatherGroupedGemmOperands> ops(static_cast<size_t>(R));
      for (int r = 0; r < R; ++r) {
        auto& o = ops[static_cast<size_t>(r)];
        c.wire(o, r, sig);
        o.counts = dcounts[static_cast<size_t>(r)].data();
        o.src_rank = dsrc_rank[static_cast<size_t>(r)].data();
        o.src_row = dsrc_row[static_cast<size_t>(r)].data();
      }
      for (int run = 0; run < kRuns; ++run) {
        INFO("run " << run);
        c.poison_outputs();
        k.run(ops, nullptr);
        finish("virtual ranks");
        c.check();
      }
    }
  }

  TEST_CASE(
      "fused grouped GEMM + reduce-scatter equals expert GEMM then scatter and combine on 1, 2, 4 and 8 "
      "virtual ranks") {
    MOERUN_SKIP_WITHOUT_DEVICE();
    constexpr int64_t kTokens = 96, kIn = 136, kHidden = 264;
    constexpr int kExperts = 3;
    for (int R : kRanks) {
      INFO("ranks " << R);
      const Routing routing = route(R, kExperts, kTokens);
      const int64_t cap = kTokens * R * kTopK;
      const CombineCase c = combine_case(routing, R, kExperts, kTokens, kIn, kHidden, 300);
      std::vector<DeviceBuffer<Bf16>> dh, dw, dy, drecv, dout;
      std::vector<DeviceBuffer<float>> dgates;
      std::vector<DeviceBuffer<int32_t>> dcounts, ddst_rank, ddst_slot;
      for (int r = 0; r < R; ++r) {
        dh.push_back(upload_bf16(c.h[static_cast<size_t>(r)]));
        dw.push_back(upload_bf16(c.w[static_cast<size_t>(r)]));
        dy.emplace_back(static_cast<size_t>(cap * kHidden));
        drecv.emplace_back(static_cast<size_t>(kTokens * kTopK * kHidden));
        dout.emplace_back(static_cast<size_t>(kTokens * kHidden));
        dgates.push_back(upload(c.gate_values[static_cast<size_t>(r)]));
        std::vector<int32_t> dr, ds;
        for (const auto& row : routing.rows[static_cast<size_t>(r)]) {
          dr.push_back(row.src_rank);
          ds.push_back(static_cast<int32_t>(row.token * kTopK + row.choice));
        }
        dcounts.push_back(upload(routing.counts[static_cast<size_t>(r)]));
        ddst_rank.push_back(upload(dr));
        ddst_slot.push_back(upload(ds));
      }
      VirtualSignals sig(R);
      GroupedGemmReduceScatterArgs args;
      args.group = {R, R, 0};
      args.experts = kExperts;
      args.in = kIn;
      args.hidden = kHidden;
      args.rows = cap;
      args.tokens = kTokens;
      args.top_k = kTopK;
      REQUIRE_MESSAGE(can_implement(args).empty(), can_implement(args));
      GroupedGemmReduceScatter k(args);
      DeviceBuffer<char> ws(k.workspace_size());
      k.initialize(ws.data(), nullptr);
      std::vector<GroupedGemmReduceScatterOperands> ops(static_cast<size_t>(R));
      for (int r = 0; r < R; ++r) {
        auto& o = ops[static_cast<size_t>(r)];
        o.rank = r;
        for (int p = 0; p < R; ++p) {
          o.recv[p] = drecv[static_cast<size_t>(p)].data();
          o.signals[p] = sig.of(p);
        }
        o.counts = dcounts[static_cast<size_t>(r)].data();
        o.dst_rank = ddst_rank[static_cast<size_t>(r)].data();
        o.dst_slot = ddst_slot[static_cast<size_t>(r)].data();
        o.h = dh[static_cast<size_t>(r)].data();
        o.w = dw[static_cast<size_t>(r)].data();
        o.y = dy[static_cast<size_t>(r)].data();
        o.gates = dgates[static_cast<size_t>(r)].data();
        o.out = dout[static_cast<size_t>(r)].data();
      }
      for (int run = 0; run < kRuns; ++run) {
        INFO("run " << run);
        for (int r = 0; r < R; ++r) {
          poison(dy[static_cast<size_t>(r)].data(), dy[static_cast<size_t>(r)].size());
          poison(drecv[static_cast<size_t>(r)].data(), drecv[static_cast<size_t>(r)].size());
          poison(dout[static_cast<size_t>(r)].data(), dout[static_cast<size_t>(r)].size());
        }
        MOERUN_CUDA_CHECK(cudaDeviceSynchronize());
        k.run(ops, nullptr);
        finish("virtual ranks");
        c.check(dout);
      }
    }
  }

  TEST_CASE(
      "the CUTLASS push GEMM + combine equals expert GEMM then scatter and combine on 1, 2, 4 and 8 virtual "
      "ranks") {
    MOERUN_SKIP_WITHOUT_DEVICE();
    constexpr int64_t kTokens = 96, kIn = 136, kHidden = 264;
    constexpr int kExperts = 3;
    for (int R : kRanks) {
      INFO("ranks " << R);
      const Routing routing = route(R, kExperts, kTokens);
      const int64_t cap = kTokens * R * kTopK;
      // The group's counts and each token owner's receive rows.
      const std::vector<int32_t> counts = group_counts(routing, R, kExperts);
      std::vector<std::vector<int32_t>> recv_row(
          static_cast<size_t>(R), std::vector<int32_t>(static_cast<size_t>(kTokens * kTopK), -1));
      for (int q = 0; q < R; ++q) {
        size_t i = 0;
        for (int e = 0; e < kExperts; ++e) {
          std::vector<int64_t> next(static_cast<size_t>(R));
          for (int r = 0; r < R; ++r)
            next[static_cast<size_t>(r)] = push_receive_row(counts.data(), R, kExperts, r, q, e);
          for (int32_t k = 0; k < routing.counts[static_cast<size_t>(q)][static_cast<size_t>(e)]; ++k, ++i) {
            const auto& row = routing.rows[static_cast<size_t>(q)][i];
            recv_row[static_cast<size_t>(row.src_rank)][static_cast<size_t>(row.token * kTopK + row.choice)] =
                static_cast<int32_t>(next[static_cast<size_t>(row.src_rank)]++);
          }
        }
      }
      for (const auto& rows : recv_row)
        for (int32_t x : rows) REQUIRE(x >= 0);  // every (token, choice) has its row
      const CombineCase c = combine_case(routing, R, kExperts, kTokens, kIn, kHidden, 1300);
      std::vector<DeviceBuffer<Bf16>> dh, dw, drecv, dout;
      std::vector<DeviceBuffer<float>> dgates;
      std::vector<DeviceBuffer<int32_t>> drecv_row;
      const DeviceBuffer<int32_t> dcounts = upload(counts);
      for (int r = 0; r < R; ++r) {
        dh.push_back(upload_bf16(c.h[static_cast<size_t>(r)]));
        dw.push_back(upload_bf16(c.w[static_cast<size_t>(r)]));
        drecv.emplace_back(static_cast<size_t>(kTokens * kTopK * kHidden));
        dout.emplace_back(static_cast<size_t>(kTokens * kHidden));
        dgates.push_back(upload(c.gate_values[static_cast<size_t>(r)]));
        drecv_row.push_back(upload(recv_row[static_cast<size_t>(r)]));
      }
      VirtualSignals sig(R);
      PushGemmCombineArgs args;
      args.ranks = R;
      args.virtual_ranks = R;
      args.experts = kExperts;
      args.in = kIn;
      args.hidden = kHidden;
      args.rows = cap;
      args.tokens = kTokens;
      args.top_k = kTopK;
      REQUIRE_MESSAGE(can_implement(args).empty(), can_implement(args));
      PushGemmCombine k(args);
      DeviceBuffer<char> ws(k.workspace_size());
      k.initialize(ws.data(), nullptr);
      std::vector<PushGemmCombineOperands> ops(static_cast<size_t>(R));
      for (int r = 0; r < R; ++r) {
        auto& o = ops[static_cast<size_t>(r)];
        o.rank = r;
        for (int p = 0; p < R; ++p) {
          o.recv[p] = drecv[static_cast<size_t>(p)].data();
          o.signals[p] = sig.of(p);
        }
        o.counts = dcounts.data();
        o.recv_row = drecv_row[static_cast<size_t>(r)].data();
        o.h = dh[static_cast<size_t>(r)].data();
        o.w = dw[static_cast<size_t>(r)].data();
        o.gates = dgates[static_cast<size_t>(r)].data();
        o.out = dout[static_cast<size_t>(r)].data();
      }
      for (int run = 0; run < kRuns; ++run) {
        INFO("run " << run);
        for (int r = 0; r < R; ++r) {
          poison(drecv[static_cast<size_t>(r)].data(), drecv[static_cast<size_t>(r)].size());
          poison(dout[static_cast<size_t>(r)].data(), dout[static_cast<size_t>(r)].size());
        }
        MOERUN_CUDA_CHECK(cudaDeviceSynchronize());
        k.run(ops, nullptr);
        finish("push GEMM, virtual ranks");
        c.check(dout);
      }
    }
  }

  TEST_CASE(
      "the CUTLASS gather GEMM equals gather then expert GEMM on 1, 2, 4 and 8 virtual ranks, chunk by "
      "chunk") {
    MOERUN_SKIP_WITHOUT_DEVICE();
    constexpr int64_t kTokens = 96, kHidden = 264, kOut = 520;
    constexpr int kExperts = 3;
    for (int R : kRanks) {
      INFO("ranks " << R);
      const Routing routing = route(R, kExperts, kTokens);
      GatherCase c(routing, R, kTokens, kHidden, kOut, 2100);
      const DeviceBuffer<int32_t> dcounts = upload(group_counts(routing, R, kExperts));
      std::vector<DeviceBuffer<int32_t>> dsrc_row;
      for (int r = 0; r < R; ++r) {
        std::vector<int32_t> src;  // rows in (expert, token owner) order: the gather GEMM's layout
        for (const auto& row : routing.rows[static_cast<size_t>(r)])
          src.push_back(static_cast<int32_t>(row.token));
        dsrc_row.push_back(upload(src));
      }
      VirtualSignals sig(R);
      GatherGemmArgs args;
      args.ranks = R;
      args.virtual_ranks = R;
      args.experts = kExperts;
      args.tokens = kTokens;
      args.hidden = kHidden;
      args.out = kOut;
      args.rows = c.cap;
      REQUIRE_MESSAGE(can_implement(args).empty(), can_implement(args));
      GatherGemm k(args);
      DeviceBuffer<char> ws(k.workspace_size());
      k.initialize(ws.data(), nullptr);
      std::vector<GatherGemmOperands> ops(static_cast<size_t>(R));
      for (int r = 0; r < R; ++r) {
        auto& o = ops[static_cast<size_t>(r)];
        c.wire(o, r, sig);
        o.counts = dcounts.data();
        o.src_row = dsrc_row[static_cast<size_t>(r)].data();
      }
      for (int run = 0; run < kRuns; ++run) {
        INFO("run " << run);
        c.poison_outputs();
        MOERUN_CUDA_CHECK(cudaDeviceSynchronize());
        k.run(ops, nullptr);
        finish("gather GEMM, virtual ranks");
        c.check();
      }
    }
  }

  TEST_CASE(
      "fused GEMM + all-to-all equals the QKV GEMM then the Ulysses all-to-all on 1, 2, 4 and 8 virtual "
      "ranks") {
    MOERUN_SKIP_WITHOUT_DEVICE();
    constexpr int64_t kTokens = 200, kHidden = 264, kCols = 72;  // 72-wide rank columns: tiles straddle ranks
    for (int R : kRanks) {
      INFO("ranks " << R);
      const int64_t n = R * kCols;
      const MatD w = random_bf16(kHidden, n, 600);
      auto dw = upload_bf16(w);
      std::vector<MatD> x;
      std::vector<DeviceBuffer<Bf16>> dx, dstaged, dout;
      for (int r = 0; r < R; ++r) {
        x.push_back(random_bf16(kTokens, kHidden, 700 + r));
        dx.push_back(upload_bf16(x.back()));
        dstaged.emplace_back(static_cast<size_t>(kTokens * n));
        dout.emplace_back(static_cast<size_t>(R * kTokens * kCols));
      }
      VirtualSignals sig(R);
      GemmAllToAllArgs args;
      args.group = {R, R, 0};
      args.tokens = kTokens;
      args.hidden = kHidden;
      args.cols_per_rank = kCols;
      REQUIRE_MESSAGE(can_implement(args).empty(), can_implement(args));
      GemmAllToAll k(args);
      DeviceBuffer<char> ws(k.workspace_size());
      k.initialize(ws.data(), nullptr);
      std::vector<GemmAllToAllOperands> ops(static_cast<size_t>(R));
      for (int r = 0; r < R; ++r) {
        auto& o = ops[static_cast<size_t>(r)];
        o.rank = r;
        o.x = dx[static_cast<size_t>(r)].data();
        o.w = dw.data();
        o.staged = dstaged[static_cast<size_t>(r)].data();
        for (int p = 0; p < R; ++p) {
          o.out[p] = dout[static_cast<size_t>(p)].data();
          o.signals[p] = sig.of(p);
        }
      }
      for (int run = 0; run < kRuns; ++run) {
        INFO("run " << run);
        for (int r = 0; r < R; ++r)
          poison(dout[static_cast<size_t>(r)].data(), dout[static_cast<size_t>(r)].size());
        MOERUN_CUDA_CHECK(cudaDeviceSynchronize());
        k.run(ops, nullptr);
        finish("virtual ranks");
        for (int p = 0; p < R; ++p) {
          MatD ref(R * kTokens, kCols);
          for (int q = 0; q < R; ++q)
            ref.middleRows(q * kTokens, kTokens) = x[static_cast<size_t>(q)] * w.middleCols(p * kCols, kCols);
          check_ladder(download_bf16(dout[static_cast<size_t>(p)].data(), R * kTokens, kCols), ref,
                       round_bf16(ref), "heads of rank " + std::to_string(p));
        }
      }
    }
  }

  TEST_CASE(
      "the CUTLASS push GEMM + all-to-all equals the QKV GEMM then the Ulysses all-to-all on 1, 2, 4 and 8 "
      "virtual ranks") {
    MOERUN_SKIP_WITHOUT_DEVICE();
    constexpr int64_t kTokens = 200, kHidden = 264, kCols = 72;  // ragged rows and column blocks
    for (int R : kRanks) {
      INFO("ranks " << R);
      const int64_t n = R * kCols;
      const MatD w = random_bf16(kHidden, n, 1600);
      auto dw = upload_bf16(w);
      std::vector<MatD> x;
      std::vector<DeviceBuffer<Bf16>> dx, dout;
      for (int r = 0; r < R; ++r) {
        x.push_back(random_bf16(kTokens, kHidden, 1700 + r));
        dx.push_back(upload_bf16(x.back()));
        dout.emplace_back(static_cast<size_t>(R * kTokens * kCols));
      }
      VirtualSignals sig(R);
      PushGemmAllToAllArgs args;
      args.ranks = R;
      args.virtual_ranks = R;
      args.tokens = kTokens;
      args.hidden = kHidden;
      args.cols_per_rank = kCols;
      REQUIRE_MESSAGE(can_implement(args).empty(), can_implement(args));
      PushGemmAllToAll k(args);
      DeviceBuffer<char> ws(k.workspace_size());
      k.initialize(ws.data(), nullptr);
      std::vector<PushGemmAllToAllOperands> ops(static_cast<size_t>(R));
      for (int r = 0; r < R; ++r) {
        auto& o = ops[static_cast<size_t>(r)];
        o.rank = r;
        o.x = dx[static_cast<size_t>(r)].data();
        o.w = dw.data();
        for (int p = 0; p < R; ++p) {
          o.out[p] = dout[static_cast<size_t>(p)].data();
          o.signals[p] = sig.of(p);
        }
      }
      for (int run = 0; run < kRuns; ++run) {
        INFO("run " << run);
        for (int r = 0; r < R; ++r)
          poison(dout[static_cast<size_t>(r)].data(), dout[static_cast<size_t>(r)].size());
        MOERUN_CUDA_CHECK(cudaDeviceSynchronize());
        k.run(ops, nullptr);
        finish("push GEMM + all-to-all, virtual ranks");
        for (int p = 0; p < R; ++p) {
          MatD ref(R * kTokens, kCols);
          for (int q = 0; q < R; ++q)
            ref.middleRows(q * kTokens, kTokens) = x[static_cast<size_t>(q)] * w.middleCols(p * kCols, kCols);
          check_ladder(download_bf16(dout[static_cast<size_t>(p)].data(), R * kTokens, kCols), ref,
                       round_bf16(ref), "heads of rank " + std::to_string(p));
        }
      }
    }
  }

  TEST_CASE(
      "fused all-to-all + GEMM equals the Ulysses all-to-all then the output GEMM on 1, 2, 4 and 8 virtual "
      "ranks") {
    MOERUN_SKIP_WITHOUT_DEVICE();
    constexpr int64_t kTokens = 200, kCols = 64, kOut = 136;
    for (int R : kRanks) {
      INFO("ranks " << R);
      const MatD w = random_bf16(R * kCols, kOut, 800);
      auto dw = upload_bf16(w);
      std::vector<MatD> in;
      std::vector<DeviceBuffer<Bf16>> din, dgathered, dy;
      for (int r = 0; r < R; ++r) {
        in.push_back(random_bf16(R * kTokens, kCols, 900 + r));
        din.push_back(upload_bf16(in.back()));
        dgathered.emplace_back(static_cast<size_t>(kTokens * R * kCols));
        dy.emplace_back(static_cast<size_t>(kTokens * kOut));
      }
      VirtualSignals sig(R);
      AllToAllGemmArgs args;
      args.group = {R, R, 0};
      args.tokens = kTokens;
      args.cols_per_rank = kCols;
      args.out = kOut;
      REQUIRE_MESSAGE(can_implement(args).empty(), can_implement(args));
      AllToAllGemm k(args);
      DeviceBuffer<char> ws(k.workspace_size());
      k.initialize(ws.data(), nullptr);
      std::vector<AllToAllGemmOperands> ops(static_cast<size_t>(R));
      for (int r = 0; r < R; ++r) {
        auto& o = ops[static_cast<size_t>(r)];
        o.rank = r;
        for (int p = 0; p < R; ++p) {
          o.in[p] = din[static_cast<size_t>(p)].data();
          o.signals[p] = sig.of(p);
        }
        o.gathered = dgathered[static_cast<size_t>(r)].data();
        o.w = dw.data();
        o.y = dy[static_cast<size_t>(r)].data();
      }
      for (int run = 0; run < kRuns; ++run) {
        INFO("run " << run);
        for (int r = 0; r < R; ++r)
          poison(dy[static_cast<size_t>(r)].data(), dy[static_cast<size_t>(r)].size());
        MOERUN_CUDA_CHECK(cudaDeviceSynchronize());
        k.run(ops, nullptr);
        finish("virtual ranks");
        for (int r = 0; r < R; ++r) {
          MatD a(kTokens, R * kCols);
          for (int p = 0; p < R; ++p)
            a.middleCols(p * kCols, kCols) = in[static_cast<size_t>(p)].middleRows(r * kTokens, kTokens);
          const MatD ref = a * w;
          check_ladder(download_bf16(dy[static_cast<size_t>(r)].data(), kTokens, kOut), ref, round_bf16(ref),
                       "y of rank " + std::to_string(r));
        }
      }
    }
  }

  TEST_CASE("fused GEMM + all-to-all runs on an NCCL symmetric window of a one-rank group") {
    MOERUN_SKIP_WITHOUT_DEVICE();
    auto id = executor::nccl_unique_id();
    REQUIRE(id.ok());
    auto world = executor::NcclCommunicator::init(id.value(), 1, 0, "sp[0]");
    REQUIRE_MESSAGE(world.ok(), (world.ok() ? "" : world.error().message));
    constexpr int64_t kTokens = 200, kHidden = 264, kCols = 72;
    const size_t out_bytes = kTokens * kCols * sizeof(Bf16), sig_bytes = kSignalSlots * sizeof(uint32_t);
    auto sym = executor::SymmetricMemory::create(*world.value(), out_bytes + 4096 + sig_bytes);
    if (!executor::SymmetricMemory::nccl_supports_one_rank_per_node()) {
      // NCCL before 2.28.7 gives no communicator with one rank on its node symmetric memory (see
      // symmetric_memory.cu): create must say so, as an error, and this GPU has no second rank to try.
      MESSAGE("symmetric window not run: " << executor::SymmetricMemory::nccl_requirement());
      REQUIRE_FALSE(sym.ok());
      const std::string& why = sym.error().message;
      INFO(why);
      CHECK(why.find("ncclDevCommCreate") != std::string::npos);
      CHECK(why.find("does not support symmetric memory") != std::string::npos);
      CHECK(why.find("2.28.7") != std::string::npos);
      return;
    }
    REQUIRE_MESSAGE(sym.ok(), (sym.ok() ? "" : sym.error().message));
    executor::SymmetricMemory& mem = *sym.value();
    CHECK(mem.peer(0) == mem.local());
    auto* out = static_cast<Bf16*>(mem.local());
    auto* signals =
        reinterpret_cast<uint32_t*>(static_cast<char*>(mem.local()) + (out_bytes + 4095) / 4096 * 4096);

    const MatD x = random_bf16(kTokens, kHidden, 1000), w = random_bf16(kHidden, kCols, 1001);
    auto dx = upload_bf16(x), dw = upload_bf16(w);
    DeviceBuffer<Bf16> staged(static_cast<size_t>(kTokens * kCols));
    GemmAllToAllArgs args;
    args.group = {1, 1, 0};
    args.tokens = kTokens;
    args.hidden = kHidden;
    args.cols_per_rank = kCols;
    REQUIRE_MESSAGE(can_implement(args).empty(), can_implement(args));
    GemmAllToAll k(args);
    DeviceBuffer<char> ws(k.workspace_size());
    k.initialize(ws.data(), nullptr);
    GemmAllToAllOperands o;
    o.rank = 0;
    o.x = dx.data();
    o.w = dw.data();
    o.staged = staged.data();
    o.out[0] = out;
    o.signals[0] = signals;
    const MatD ref = x * w;
    for (int run = 0; run < kRuns; ++run) {
      poison(out, static_cast<size_t>(kTokens * kCols));
      k.run(std::span<const GemmAllToAllOperands>(&o, 1), nullptr);
      finish("symmetric window");
      check_ladder(download_bf16(out, kTokens, kCols), ref, round_bf16(ref), "symmetric window");
    }
  }
}

TEST_CASE(
    "the CUTLASS push and gather GEMMs refuse the shapes they cannot run with a reason, with or without a "
    "device") {
  PushGemmCombineArgs a;
  a.ranks = 4;
  a.virtual_ranks = 4;
  a.experts = 8;
  a.in = 1408;
  a.hidden = 2048;
  a.rows = 32768;
  a.tokens = 4096;
  a.top_k = 8;
  // A valid shape: empty here only with an sm_90 device; otherwise the device is the reason.
  const std::string valid = can_implement(a);
  if (!valid.empty()) CHECK(valid.find("multiple") == std::string::npos);
  auto refused = [&](PushGemmCombineArgs b, const char* why) {
    const std::string got = can_implement(b);
    CAPTURE(got);
    CHECK(got.find(why) != std::string::npos);
  };
  PushGemmCombineArgs b = a;
  b.in = 1404;
  refused(b, "multiples of 8");
  b = a;
  b.ranks = 9;
  b.virtual_ranks = 1;
  refused(b, "ranks <= 8");
  b = a;
  b.virtual_ranks = 2;
  refused(b, "virtual_ranks");
  b = a;
  b.experts = 129;
  b.ranks = 8;
  b.virtual_ranks = 1;
  refused(b, "1024 groups");
  b = a;
  b.top_k = 0;
  refused(b, "positive");
  PushGemmAllToAllArgs u;
  u.ranks = 4;
  u.virtual_ranks = 4;
  u.tokens = 4096;
  u.hidden = 4096;
  u.cols_per_rank = 3072;
  if (const std::string got = can_implement(u); !got.empty())
    CHECK(got.find("multiple") == std::string::npos);
  u.cols_per_rank = 3070;
  CHECK(can_implement(u).find("multiples of 8") != std::string::npos);
  u.cols_per_rank = 3072;
  u.ranks = 0;
  CHECK(can_implement(u).find("ranks <= 8") != std::string::npos);
  GatherGemmArgs g;
  g.ranks = 8;
  g.virtual_ranks = 1;
  g.experts = 32;
  g.tokens = 4096;
  g.hidden = 4096;
  g.out = 3072;
  g.rows = 32768;
  if (const std::string got = can_implement(g); !got.empty())
    CHECK(got.find("multiple") == std::string::npos);
  GatherGemmArgs h = g;
  h.out = 3070;
  CHECK(can_implement(h).find("multiples of 8") != std::string::npos);
  h = g;
  h.experts = 129;
  CHECK(can_implement(h).find("1024 groups") != std::string::npos);
  h = g;
  h.virtual_ranks = 3;
  CHECK(can_implement(h).find("virtual_ranks") != std::string::npos);
  h = g;
  h.tokens = 0;
  CHECK(can_implement(h).find("positive") != std::string::npos);
}

}  // namespace moeplan::cuda::fused
