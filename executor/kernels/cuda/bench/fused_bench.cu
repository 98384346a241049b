// Benchmark of the fused GEMM + communication kernels (fused/fused_gemm_comm.h, fused/push_gemm.h)
// with 1, 2, 4 and 8 virtual ranks on one GPU, at MoE and Ulysses shapes per rank. The reference rate is the
// library GEMM alone on one rank's shape (CUTLASS's grouped GEMM, cuBLASLt's dense GEMM): the ratio is what
// the fused kernel keeps of the unfused compute rate while it also moves its data. With virtual ranks the
// "communication" is copies within this GPU's memory, so these figures measure the kernels' tile pipeline and
// main loop, not NVLink. Correctness is the tests' job (tests/executor/kernels/cuda/fused_test.cpp); inputs
// here are hashed values.
#include <cuda_bf16.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "executor/kernels/cuda/bench/bench_util.h"
#include "executor/kernels/cuda/check.h"
#include "executor/kernels/cuda/fused/fused_gemm_comm.h"
#include "executor/kernels/cuda/fused/push_gemm.h"
#include "executor/kernels/cuda/gemm.h"
#include "executor/kernels/cuda/grouped_gemm.h"

namespace moeplan::cuda {
namespace {

using fused::Bf16;

__global__ void fill_hashed(Bf16* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    p[i] = __float2bfloat16_rn((static_cast<float>(h & 0xffff) / 65536.0f - 0.5f) * 0.1f);
  }
}

DeviceBuffer<Bf16> hashed(int64_t n, uint32_t seed) {
  DeviceBuffer<Bf16> d(static_cast<size_t>(n));
  fill_hashed<<<1024, 256>>>(d.data(), n, seed);
  MOERUN_CUDA_CHECK(cudaGetLastError());
  return d;
}

template <class T>
DeviceBuffer<T> upload(const std::vector<T>& h) {
  DeviceBuffer<T> d(h.size());
  d.upload(h.data(), h.size());
  return d;
}

// Balanced routing at one rank's shape: `rows` expert rows per rank, `experts` local experts with equal
// counts; row i of rank o comes from (goes to) global slot g = o rows + i on rank g % R, its row g / R.
struct Routing {
  DeviceBuffer<int32_t> counts, rank_of, row_of;
};
Routing balanced(int ranks, int owner, int experts, int64_t rows, int64_t rows_per_source) {
  std::vector<int32_t> counts(static_cast<size_t>(experts), static_cast<int32_t>(rows / experts)), rk, rw;
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t g = owner * rows + i;
    rk.push_back(static_cast<int32_t>(g % ranks));
    rw.push_back(static_cast<int32_t>((g / ranks) % rows_per_source));
  }
  return {upload(counts), upload(rk), upload(rw)};
}

constexpr int kVirtualRanks[] = {1, 2, 4, 8};

// ---- MoE: DeepSeek-V2-Lite-like experts (hidden 2048, expert FFN 1408), 4096 tokens x top-8 per rank ----
constexpr int64_t kTokens = 4096, kTopK = 8, kHidden = 2048, kFfn = 1408;
constexpr int kExperts = 8;
constexpr int64_t kRows = kTokens * kTopK;

double grouped_library_ms(int64_t in, int64_t out) {
  GroupedGemm g({ExpertGemmOp::kForward, kExperts, in, out});
  if (!g.can_implement().empty()) return 0;
  DeviceBuffer<char> ws(g.workspace_size());
  g.initialize(ws.data(), nullptr);
  auto a = hashed(kRows * in, 1), b = hashed(kExperts * in * out, 2);
  DeviceBuffer<Bf16> d(static_cast<size_t>(kRows * out));
  const Routing r = balanced(1, 0, kExperts, kRows, kTokens);
  return bench::median_ms([&](cudaStream_t s) {
    g.run({r.counts.data(), a.data(), b.data(), d.data(), kRows}, s);
  });
}

double dense_library_ms(int64_t m, int64_t n, int64_t k) {
  Gemm g({GemmOp::kForward, m, n, k, GemmType::kBf16, GemmType::kBf16, false});
  if (!g.can_implement().empty()) return 0;
  DeviceBuffer<char> ws(std::max<size_t>(g.workspace_size(), 1));
  auto a = hashed(m * k, 3), b = hashed(k * n, 4);
  DeviceBuffer<Bf16> d(static_cast<size_t>(m * n));
  return bench::median_ms([&](cudaStream_t s) { g.run({a.data(), b.data(), d.data()}, ws.data(), s); });
}

void report(const char* kernel, int ranks, const std::string& shape, double ms, double flops_per_rank,
            double ref_ms) {
  const double rate = ranks * flops_per_rank / (ms * 1e-3) / 1e12;
  const double ref = ref_ms > 0 ? flops_per_rank / (ref_ms * 1e-3) / 1e12 : 0;
  bench::print_result("fused", std::string(kernel) + " x" + std::to_string(ranks) + " virtual ranks", shape,
                      ms, rate, ref, "TFLOP/s", 0);
}

// A fused kernel's median time over two warm-up and five timed runs on its operands: built from its
// arguments, its workspace allocated and initialised first.
template <class Kernel, class Args, class Ops>
double time_fused(const Args& args, const Ops& ops) {
  Kernel k(args);
  DeviceBuffer<char> ws(k.workspace_size());
  k.initialize(ws.data(), nullptr);
  return bench::median_ms([&](cudaStream_t s) { k.run(ops, s); }, 2, 5);
}

void all_gather_grouped_gemm(double ref_ms) {
  const int64_t out = 2 * kFfn;
  for (int R : kVirtualRanks) {
    fused::AllGatherGroupedGemmArgs args;
    args.group = {R, R, 0};
    args.experts = kExperts;
    args.tokens = kTokens;
    args.hidden = kHidden;
    args.out = out;
    args.rows = kRows;
    if (const std::string why = fused::can_implement(args); !why.empty()) {
      std::printf("all-gather + grouped GEMM, %d ranks: cannot run: %s\n", R, why.c_str());
      continue;
    }
    fused::VirtualSignals sig(R);
    std::vector<DeviceBuffer<Bf16>> x, g, w, y;
    std::vector<Routing> routes;
    std::vector<fused::AllGatherGroupedGemmOperands> ops(static_cast<size_t>(R));
    for (int r = 0; r < R; ++r) {
      x.push_back(hashed(kTokens * kHidden, 10 + r));
      w.push_back(hashed(kExperts * kHidden * out, 20 + r));
      g.emplace_back(static_cast<size_t>(kRows * kHidden));
      y.emplace_back(static_cast<size_t>(kRows * out));
      routes.push_back(balanced(R, r, kExperts, kRows, kTokens));
    }
    for (int r = 0; r < R; ++r) {
      auto& o = ops[static_cast<size_t>(r)];
      o.rank = r;
      for (int p = 0; p < R; ++p) {
        o.x[p] = x[static_cast<size_t>(p)].data();
        o.signals[p] = sig.of(p);
      }
      o.counts = routes[static_cast<size_t>(r)].counts.data();
      o.src_rank = routes[static_cast<size_t>(r)].rank_of.data();
      o.src_row = routes[static_cast<size_t>(r)].row_of.data();
      o.gathered = g[static_cast<size_t>(r)].data();
      o.w = w[static_cast<size_t>(r)].data();
      o.y = y[static_cast<size_t>(r)].data();
    }
    const double ms = time_fused<fused::AllGatherGroupedGemm>(args, ops);
    report("all-gather + grouped GEMM", R, "rows 32768 x 2048 -> 2816, 8 experts/rank", ms,
           2.0 * kRows * kHidden * out, ref_ms);
  }
}

// The same job as the CUTLASS grouped kernel chunk by chunk, each token owner's rows gathered beside the
// chunks before them (fused::GatherGemm).
void gather_gemm(double ref_ms) {
  const int64_t out = 2 * kFfn;
  for (int R : kVirtualRanks) {
    fused::GatherGemmArgs args;
    args.ranks = R;
    args.virtual_ranks = R;
    args.experts = kExperts;
    args.tokens = kTokens;
    args.hidden = kHidden;
    args.out = out;
    args.rows = kRows;
    if (const std::string why = fused::can_implement(args); !why.empty()) {
      std::printf("CUTLASS gather GEMM, %d ranks: cannot run: %s\n", R, why.c_str());
      continue;
    }
    fused::VirtualSignals sig(R);
    const std::vector<int32_t> counts(static_cast<size_t>(R * R * kExperts),
                                      static_cast<int32_t>(kRows / kExperts / R));
    std::vector<int32_t> src(static_cast<size_t>(kRows));
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<int32_t>(i % kTokens);
    const DeviceBuffer<int32_t> dcounts = upload(counts), dsrc = upload(src);
    std::vector<DeviceBuffer<Bf16>> x, g, w, y;
    std::vector<fused::GatherGemmOperands> ops(static_cast<size_t>(R));
    for (int r = 0; r < R; ++r) {
      x.push_back(hashed(kTokens * kHidden, 50 + r));
      w.push_back(hashed(kExperts * kHidden * out, 60 + r));
      g.emplace_back(static_cast<size_t>(kRows * kHidden));
      y.emplace_back(static_cast<size_t>(kRows * out));
    }
    for (int r = 0; r < R; ++r) {
      auto& o = ops[static_cast<size_t>(r)];
      o.rank = r;
      for (int p = 0; p < R; ++p) {
        o.x[p] = x[static_cast<size_t>(p)].data();
        o.signals[p] = sig.of(p);
      }
      o.counts = dcounts.data();
      o.src_row = dsrc.data();
      o.gathered = g[static_cast<size_t>(r)].data();
      o.w = w[static_cast<size_t>(r)].data();
      o.y = y[static_cast<size_t>(r)].data();
    }
    const double ms = time_fused<fused::GatherGemm>(args, ops);
    report("CUTLASS gather GEMM", R, "rows 32768 x 2048 -> 2816, 8 experts/rank, a chunk per rank", ms,
           2.0 * kRows * kHidden * out, ref_ms);
  }
}

void grouped_gemm_reduce_scatter(double ref_ms) {
  for (int R : kVirtualRanks) {
    fused::GroupedGemmReduceScatterArgs args;
    args.group = {R, R, 0};
    args.experts = kExperts;
    args.in = kFfn;
    args.hidden = kHidden;
    args.rows = kRows;
    args.tokens = kTokens;
    args.top_k = kTopK;
    if (const std::string why = fused::can_implement(args); !why.empty()) {
      std::printf("grouped GEMM + reduce-scatter, %d ranks: cannot run: %s\n", R, why.c_str());
      continue;
    }
    fused::VirtualSignals sig(R);
    std::vector<DeviceBuffer<Bf16>> h, w, y, recv, out;
    std::vector<DeviceBuffer<float>> gates;
    std::vector<Routing> routes;
    std::vector<fused::GroupedGemmReduceScatterOperands> ops(static_cast<size_t>(R));
    for (int r = 0; r < R; ++r) {
      h.push_back(hashed(kRows * kFfn, 30 + r));
      w.push_back(hashed(kExperts * kFfn * kHidden, 40 + r));
      y.emplace_back(static_cast<size_t>(kRows * kHidden));
      recv.emplace_back(static_cast<size_t>(kTokens * kTopK * kHidden));
      out.emplace_back(static_cast<size_t>(kTokens * kHidden));
      gates.push_back(upload(std::vector<float>(static_cast<size_t>(kTokens * kTopK), 0.125f)));
      routes.push_back(balanced(R, r, kExperts, kRows, kTokens * kTopK));
    }
    for (int r = 0; r < R; ++r) {
      auto& o = ops[static_cast<size_t>(r)];
      o.rank = r;
      for (int p = 0; p < R; ++p) {
        o.recv[p] = recv[static_cast<size_t>(p)].data();
        o.signals[p] = sig.of(p);
      }
      o.counts = routes[static_cast<size_t>(r)].counts.data();
      o.dst_rank = routes[static_cast<size_t>(r)].rank_of.data();
      o.dst_slot = routes[static_cast<size_t>(r)].row_of.data();
      o.h = h[static_cast<size_t>(r)].data();
      o.w = w[static_cast<size_t>(r)].data();
      o.y = y[static_cast<size_t>(r)].data();
      o.gates = gates[static_cast<size_t>(r)].data();
      o.out = out[static_cast<size_t>(r)].data();
    }
    const double ms = time_fused<fused::GroupedGemmReduceScatter>(args, ops);
    report("grouped GEMM + reduce-scatter", R, "rows 32768 x 1408 -> 2048, top-8 combine", ms,
           2.0 * kRows * kFfn * kHidden, ref_ms);
  }
}

// The same shapes on the CUTLASS push GEMM + combine (fused/push_gemm.h): balanced counts (each
// expert's rows evenly from every token owner), each (token, choice) at its own receive row.
void push_gemm_combine(double ref_ms) {
  for (int R : kVirtualRanks) {
    fused::PushGemmCombineArgs args;
    args.ranks = R;
    args.virtual_ranks = R;
    args.experts = kExperts;
    args.in = kFfn;
    args.hidden = kHidden;
    args.rows = kRows;
    args.tokens = kTokens;
    args.top_k = kTopK;
    if (const std::string why = fused::can_implement(args); !why.empty()) {
      std::printf("CUTLASS push GEMM + combine, %d ranks: cannot run: %s\n", R, why.c_str());
      continue;
    }
    fused::VirtualSignals sig(R);
    std::vector<int32_t> counts(static_cast<size_t>(R * R * kExperts),
                                static_cast<int32_t>(kRows / kExperts / R));
    std::vector<int32_t> slots(static_cast<size_t>(kTokens * kTopK));
    for (size_t i = 0; i < slots.size(); ++i) slots[i] = static_cast<int32_t>(i);
    const DeviceBuffer<int32_t> dcounts = upload(counts), drecv_row = upload(slots);
    std::vector<DeviceBuffer<Bf16>> h, w, recv, out;
    std::vector<DeviceBuffer<float>> gates;
    std::vector<fused::PushGemmCombineOperands> ops(static_cast<size_t>(R));
    for (int r = 0; r < R; ++r) {
      h.push_back(hashed(kRows * kFfn, 30 + r));
      w.push_back(hashed(kExperts * kFfn * kHidden, 40 + r));
      recv.emplace_back(static_cast<size_t>(kTokens * kTopK * kHidden));
      out.emplace_back(static_cast<size_t>(kTokens * kHidden));
      gates.push_back(upload(std::vector<float>(static_cast<size_t>(kTokens * kTopK), 0.125f)));
    }
    for (int r = 0; r < R; ++r) {
      auto& o = ops[static_cast<size_t>(r)];
      o.rank = r;
      for (int p = 0; p < R; ++p) {
        o.recv[p] = recv[static_cast<size_t>(p)].data();
        o.signals[p] = sig.of(p);
      }
      o.counts = dcounts.data();
      o.recv_row = drecv_row.data();
      o.h = h[static_cast<size_t>(r)].data();
      o.w = w[static_cast<size_t>(r)].data();
      o.gates = gates[static_cast<size_t>(r)].data();
      o.out = out[static_cast<size_t>(r)].data();
    }
    const double ms = time_fused<fused::PushGemmCombine>(args, ops);
    report("CUTLASS push GEMM + combine", R, "rows 32768 x 1408 -> 2048, top-8 combine", ms,
           2.0 * kRows * kFfn * kHidden, ref_ms);
  }
}

// ---- Ulysses: hidden 4096, QKV 3 x 4096 columns, 4096 tokens per rank ----------------------------------
constexpr int64_t kSeq = 4096, kModel = 4096, kQkv = 3 * 4096;

void gemm_all_to_all(double ref_ms) {
  for (int R : kVirtualRanks) {
    fused::GemmAllToAllArgs args;
    args.group = {R, R, 0};
    args.tokens = kSeq;
    args.hidden = kModel;
    args.cols_per_rank = kQkv / R;
    if (const std::string why = fused::can_implement(args); !why.empty()) {
      std::printf("GEMM + all-to-all, %d ranks: cannot run: %s\n", R, why.c_str());
      continue;
    }
    fused::VirtualSignals sig(R);
    auto w = hashed(kModel * kQkv, 50);
    std::vector<DeviceBuffer<Bf16>> x, staged, out;
    std::vector<fused::GemmAllToAllOperands> ops(static_cast<size_t>(R));
    for (int r = 0; r < R; ++r) {
      x.push_back(hashed(kSeq * kModel, 60 + r));
      staged.emplace_back(static_cast<size_t>(kSeq * kQkv));
      out.emplace_back(static_cast<size_t>(kSeq * kQkv));
    }
    for (int r = 0; r < R; ++r) {
      auto& o = ops[static_cast<size_t>(r)];
      o.rank = r;
      o.x = x[static_cast<size_t>(r)].data();
      o.w = w.data();
      o.staged = staged[static_cast<size_t>(r)].data();
      for (int p = 0; p < R; ++p) {
        o.out[p] = out[static_cast<size_t>(p)].data();
        o.signals[p] = sig.of(p);
      }
    }
    const double ms = time_fused<fused::GemmAllToAll>(args, ops);
    report("GEMM + all-to-all", R, "4096 x 4096 -> 12288 (QKV)", ms, 2.0 * kSeq * kModel * kQkv, ref_ms);
  }
}

// The same shape on the CUTLASS push GEMM + all-to-all (fused/push_gemm.h).
void push_gemm_all_to_all(double ref_ms) {
  for (int R : kVirtualRanks) {
    fused::PushGemmAllToAllArgs args;
    args.ranks = R;
    args.virtual_ranks = R;
    args.tokens = kSeq;
    args.hidden = kModel;
    args.cols_per_rank = kQkv / R;
    if (const std::string why = fused::can_implement(args); !why.empty()) {
      std::printf("CUTLASS push GEMM + all-to-all, %d ranks: cannot run: %s\n", R, why.c_str());
      continue;
    }
    fused::VirtualSignals sig(R);
    auto w = hashed(kModel * kQkv, 50);
    std::vector<DeviceBuffer<Bf16>> x, out;
    std::vector<fused::PushGemmAllToAllOperands> ops(static_cast<size_t>(R));
    for (int r = 0; r < R; ++r) {
      x.push_back(hashed(kSeq * kModel, 60 + r));
      out.emplace_back(static_cast<size_t>(kSeq * kQkv));
    }
    for (int r = 0; r < R; ++r) {
      auto& o = ops[static_cast<size_t>(r)];
      o.rank = r;
      o.x = x[static_cast<size_t>(r)].data();
      o.w = w.data();
      for (int p = 0; p < R; ++p) {
        o.out[p] = out[static_cast<size_t>(p)].data();
        o.signals[p] = sig.of(p);
      }
    }
    const double ms = time_fused<fused::PushGemmAllToAll>(args, ops);
    report("CUTLASS push GEMM + all-to-all", R, "4096 x 4096 -> 12288 (QKV)", ms, 2.0 * kSeq * kModel * kQkv,
           ref_ms);
  }
}

void all_to_all_gemm(double ref_ms) {
  for (int R : kVirtualRanks) {
    fused::AllToAllGemmArgs args;
    args.group = {R, R, 0};
    args.tokens = kSeq;
    args.cols_per_rank = kModel / R;
    args.out = kModel;
    if (const std::string why = fused::can_implement(args); !why.empty()) {
      std::printf("all-to-all + GEMM, %d ranks: cannot run: %s\n", R, why.c_str());
      continue;
    }
    fused::VirtualSignals sig(R);
    auto w = hashed(kModel * kModel, 70);
    std::vector<DeviceBuffer<Bf16>> in, gathered, y;
    std::vector<fused::AllToAllGemmOperands> ops(static_cast<size_t>(R));
    for (int r = 0; r < R; ++r) {
      in.push_back(hashed(R * kSeq * (kModel / R), 80 + r));
      gathered.emplace_back(static_cast<size_t>(kSeq * kModel));
      y.emplace_back(static_cast<size_t>(kSeq * kModel));
    }
    for (int r = 0; r < R; ++r) {
      auto& o = ops[static_cast<size_t>(r)];
      o.rank = r;
      for (int p = 0; p < R; ++p) {
        o.in[p] = in[static_cast<size_t>(p)].data();
        o.signals[p] = sig.of(p);
      }
      o.gathered = gathered[static_cast<size_t>(r)].data();
      o.w = w.data();
      o.y = y[static_cast<size_t>(r)].data();
    }
    const double ms = time_fused<fused::AllToAllGemm>(args, ops);
    report("all-to-all + GEMM", R, "4096 x 4096 -> 4096 (output proj.)", ms, 2.0 * kSeq * kModel * kModel,
           ref_ms);
  }
}

}  // namespace
}  // namespace moeplan::cuda

int main() {
  using namespace moeplan::cuda;
  if (const std::string why = device_unavailable(); !why.empty()) {
    std::printf("skipped: no CUDA device (%s)\n", why.c_str());
    return 0;
  }
  const double gather_ref_ms = grouped_library_ms(kHidden, 2 * kFfn);
  all_gather_grouped_gemm(gather_ref_ms);
  gather_gemm(gather_ref_ms);
  grouped_gemm_reduce_scatter(grouped_library_ms(kFfn, kHidden));
  push_gemm_combine(grouped_library_ms(kFfn, kHidden));
  gemm_all_to_all(dense_library_ms(kSeq, kQkv, kModel));
  push_gemm_all_to_all(dense_library_ms(kSeq, kQkv, kModel));
  all_to_all_gemm(dense_library_ms(kSeq, kModel, kModel));
  return 0;
}
