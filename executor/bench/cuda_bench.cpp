// moerun bench --backend cuda (see cuda_bench.h). Every rank selects its GPU (one per local rank), measures
// the same shapes at once, and rank 0 writes the files through write_bench_file.
#include "executor/bench/cuda_bench.h"

#include <cuda_runtime.h>
#include <fmt/chrono.h>
#include <fmt/format.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "executor/comm/mpi_check.h"
#include "executor/comm/nccl_communicator.h"
#include "executor/comm/process_groups.h"
#include "executor/kernels/cuda/attention.h"
#include "executor/kernels/cuda/check.h"
#include "executor/kernels/cuda/gemm.h"
#include "executor/kernels/cuda/grouped_gemm.h"
#include "simulator/io/builtin_catalog.h"

namespace moeplan::executor {
namespace {

using cuda::DeviceBuffer;
using ojson = nlohmann::ordered_json;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Fills `bytes` of device memory with random bytes drawn from `pick` (a host block copied over and over).
template <class Pick>
void fill(void* device, size_t bytes, uint32_t seed, Pick pick) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> block(std::min<size_t>(bytes, size_t{16} << 20));
  for (size_t i = 0; i < block.size(); i += 2) {
    const uint16_t v = pick(rng);
    std::memcpy(block.data() + i, &v, std::min<size_t>(2, block.size() - i));
  }
  auto* p = static_cast<uint8_t*>(device);
  for (size_t at = 0; at < bytes; at += block.size()) {
    MOERUN_CUDA_CHECK(
        cudaMemcpy(p + at, block.data(), std::min(block.size(), bytes - at), cudaMemcpyHostToDevice));
  }
}

// bf16 values uniform in (-1, 1): the top half of a float's bits.
void fill_bf16(void* device, size_t bytes, uint32_t seed) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  fill(device, bytes, seed, [&u](std::mt19937& rng) {
    const float f = u(rng);
    uint32_t bits = 0;
    std::memcpy(&bits, &f, sizeof bits);
    return static_cast<uint16_t>(bits >> 16);
  });
}

// e4m3 bytes of magnitude below 2 (exponent field <= 7), never NaN (0x7f, 0xff).
void fill_e4m3(void* device, size_t bytes, uint32_t seed) {
  fill(device, bytes, seed, [](std::mt19937& rng) {
    const auto r = static_cast<uint32_t>(rng());
    return static_cast<uint16_t>(r & 0xbfbf);
  });
}

// The median over `batches` of the time per call of `reps` calls between two events on `stream`, after
// `warmup` untimed calls and then `ready()` (nothing, or a barrier that lines the ranks up).
template <class F, class Ready>
double seconds_per_call(cudaStream_t stream, F&& body, int reps, int batches, int warmup, Ready&& ready) {
  cudaEvent_t start = nullptr, stop = nullptr;
  MOERUN_CUDA_CHECK(cudaEventCreate(&start));
  MOERUN_CUDA_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < warmup; ++i) body();
  MOERUN_CUDA_CHECK(cudaStreamSynchronize(stream));
  ready();
  std::vector<double> t;
  for (int b = 0; b < batches; ++b) {
    MOERUN_CUDA_CHECK(cudaEventRecord(start, stream));
    for (int i = 0; i < reps; ++i) body();
    MOERUN_CUDA_CHECK(cudaEventRecord(stop, stream));
    MOERUN_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    MOERUN_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    t.push_back(static_cast<double>(ms) * 1e-3 / reps);
  }
  MOERUN_CUDA_CHECK(cudaEventDestroy(start));
  MOERUN_CUDA_CHECK(cudaEventDestroy(stop));
  return median(t);
}

// The same after two warm-up calls, for a rank's own kernels.
template <class F>
double seconds_per_call(cudaStream_t stream, F&& body, int reps, int batches) {
  return seconds_per_call(stream, std::forward<F>(body), reps, batches, 2, [] {});
}

struct Device {
  int index = 0;
  cudaDeviceProp prop{};
  std::string host, date;
  int runtime = 0, nccl = 0;
};

// One cuBLASLt GEMM with its operands on this rank (uniform random inputs), to time in bursts or to keep the
// GPU busy.
class GemmRunner {
 public:
  explicit GemmRunner(const cuda::GemmProblem& p) : p_(p), gemm_(p) {
    if (!gemm_.can_implement().empty()) return;
    const bool fp8 = p.input == cuda::GemmType::kE4m3;
    const size_t in_bytes = fp8 ? 1 : 2;
    a_ = DeviceBuffer<uint8_t>(static_cast<size_t>(p.m * p.k) * in_bytes);
    b_ = DeviceBuffer<uint8_t>(static_cast<size_t>(p.k * p.n) * in_bytes);
    c_ = DeviceBuffer<uint8_t>(static_cast<size_t>(p.m * p.n) * 2);
    ws_ = DeviceBuffer<uint8_t>(std::max<size_t>(1, gemm_.workspace_size()));
    scales_ = DeviceBuffer<float>(2);
    const float ones[2] = {1.0f, 1.0f};
    scales_.upload(ones, 2);
    if (fp8) {
      fill_e4m3(a_.data(), a_.bytes(), 1);
      fill_e4m3(b_.data(), b_.bytes(), 2);
    } else {
      fill_bf16(a_.data(), a_.bytes(), 1);
      fill_bf16(b_.data(), b_.bytes(), 2);
    }
    ops_ = {a_.data(), b_.data(), c_.data(), fp8 ? scales_.data() : nullptr,
            fp8 ? scales_.data() + 1 : nullptr};
  }
  // Empty when the GEMM runs; otherwise cuBLASLt's reason.
  const std::string& refusal() const { return gemm_.can_implement(); }
  void run(cudaStream_t stream) const { gemm_.run(ops_, ws_.data(), stream); }
  // TFLOP/s: the median over `batches` of `reps` calls between two events.
  double tflops(cudaStream_t stream, int reps, int batches) const {
    const double t = seconds_per_call(
        stream, [&] { run(stream); }, reps, batches);
    return 2.0 * static_cast<double>(p_.m) * static_cast<double>(p_.n) * static_cast<double>(p_.k) / t / 1e12;
  }
  // Back to back for `seconds` of wall time (20 calls between host waits).
  void run_for(cudaStream_t stream, double seconds) const {
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < until) {
      for (int i = 0; i < 20; ++i) run(stream);
      MOERUN_CUDA_CHECK(cudaStreamSynchronize(stream));
    }
  }

 private:
  cuda::GemmProblem p_;
  cuda::Gemm gemm_;
  DeviceBuffer<uint8_t> a_, b_, c_, ws_;
  DeviceBuffer<float> scales_;
  cuda::GemmOperands ops_{};
};

// A GEMM's rate on this rank; 0 when cuBLASLt has no algorithm for it (the reason on stderr from rank 0).
double gemm_tflops(const cuda::GemmProblem& p, cudaStream_t stream, int me, int reps, int batches) {
  const GemmRunner gemm(p);
  if (!gemm.refusal().empty()) {
    if (me == 0) fmt::print(stderr, "moerun bench: gemm {}x{}x{}: {}\n", p.m, p.n, p.k, gemm.refusal());
    return 0;
  }
  return gemm.tflops(stream, reps, batches);
}

// The reference GEMM of the sustained-rate measurement: 8192^3, BF16 (C = A B) or FP8 (e4m3, TN), BF16 out.
cuda::GemmProblem reference_gemm(cuda::GemmType in) {
  cuda::GemmProblem p;
  p.op = in == cuda::GemmType::kE4m3 ? cuda::GemmOp::kDgrad : cuda::GemmOp::kForward;
  p.m = p.n = p.k = 8192;
  p.input = in;
  p.output = cuda::GemmType::kBf16;
  return p;
}

double grouped_tflops(int experts, int64_t m, int64_t n, int64_t k, cudaStream_t stream, int me, int reps,
                      int batches) {
  cuda::GroupedGemm g({cuda::ExpertGemmOp::kForward, experts, k, n});
  if (!g.can_implement().empty()) {
    if (me == 0) fmt::print(stderr, "moerun bench: grouped gemm: {}\n", g.can_implement());
    return 0;
  }
  const int64_t rows = m * experts;
  DeviceBuffer<uint8_t> x(static_cast<size_t>(rows * k) * 2), w(static_cast<size_t>(experts * k * n) * 2);
  DeviceBuffer<uint8_t> y(static_cast<size_t>(rows * n) * 2), ws(std::max<size_t>(1, g.workspace_size()));
  fill_bf16(x.data(), x.bytes(), 3);
  fill_bf16(w.data(), w.bytes(), 4);
  DeviceBuffer<int32_t> counts(static_cast<size_t>(experts));
  const std::vector<int32_t> host(static_cast<size_t>(experts), static_cast<int32_t>(m));
  counts.upload(host.data(), host.size());
  g.initialize(ws.data(), stream);
  const cuda::GroupedGemmOperands ops{counts.data(), x.data(), w.data(), y.data(), rows};
  const double t = seconds_per_call(
      stream, [&] { g.run(ops, stream); }, reps, batches);
  return cuda::grouped_gemm_flops(g.problem(), rows) / t / 1e12;
}

// Attention FLOPs as the CPU bench and the profile's tables count them: forward 4 s^2 d per head and
// sequence, halved when causal; backward 2.5 x forward.
double attention_tflops(cudnnHandle_t handle, int64_t seq, int64_t d, bool causal, bool backward,
                        cudaStream_t stream, int me, int reps, int batches) {
  cuda::AttentionShape s;
  s.batch = std::max<int64_t>(1, 16384 / seq);
  s.seq = seq;
  s.q_heads = s.kv_heads = 16;
  s.head_dim = d;
  s.causal = causal;
  cuda::FlashAttention fa(handle, s);
  if (!fa.unsupported().empty()) {
    if (me == 0) fmt::print(stderr, "moerun bench: attention s{} d{}: {}\n", seq, d, fa.unsupported());
    return 0;
  }
  DeviceBuffer<cuda::bf16> q(static_cast<size_t>(s.q_elems())), k(static_cast<size_t>(s.k_elems())),
      v(static_cast<size_t>(s.v_elems())), o(static_cast<size_t>(s.o_elems())),
      d_o(static_cast<size_t>(s.o_elems())), dq(static_cast<size_t>(s.q_elems())),
      dk(static_cast<size_t>(s.k_elems())), dv(static_cast<size_t>(s.v_elems()));
  DeviceBuffer<float> stats(static_cast<size_t>(s.stats_elems()));
  for (auto* b : {&q, &k, &v, &d_o}) fill_bf16(b->data(), b->bytes(), 5);
  fa.forward(q.data(), k.data(), v.data(), o.data(), stats.data(), stream);
  const double t = seconds_per_call(
      stream,
      [&] {
        if (backward) {
          fa.backward(q.data(), k.data(), v.data(), o.data(), d_o.data(), stats.data(), dq.data(), dk.data(),
                      dv.data(), stream);
        } else {
          fa.forward(q.data(), k.data(), v.data(), o.data(), stats.data(), stream);
        }
      },
      reps, batches);
  double flops = 4.0 * static_cast<double>(seq * seq * d) * static_cast<double>(s.batch * s.q_heads);
  if (causal) flops /= 2;
  if (backward) flops *= 2.5;
  return flops / t / 1e12;
}

// One collective at `bytes` (nccl-tests' size conventions, fp32 values) on `comm`: the slowest rank's mean
// time per iteration of `iters` back-to-back iterations after `warmup`, as nccl-tests times it.
CollRow time_collective(NcclCommunicator& comm, MPI_Comm mpi, const std::string& name, int64_t bytes,
                        int warmup, int iters, cudaStream_t stream) {
  const int n = comm.size(), me = comm.rank();
  const bool split = name == "all_gather" || name == "reduce_scatter" || name == "alltoall";
  const int64_t values = split ? std::max<int64_t>(1, bytes / 4 / n) : std::max<int64_t>(1, bytes / 4);
  CollRow row;
  row.count = split ? values * n : values;
  row.bytes = row.count * 4;
  const auto v = static_cast<size_t>(values), nv = v * static_cast<size_t>(n);
  DeviceBuffer<float> in(name == "reduce_scatter" || name == "alltoall" ? nv : v);
  DeviceBuffer<float> out(name == "all_gather" || name == "alltoall" ? nv : v);
  MOERUN_CUDA_CHECK(cudaMemset(in.data(), 0, in.bytes()));
  const std::vector<int64_t> counts(static_cast<size_t>(n), values);
  const int peer = (me % 2 == 0) ? me + 1 : me - 1;
  auto once = [&] {
    if (name == "all_reduce") {
      comm.all_reduce(in.data(), v, DType::kFp32, stream);
    } else if (name == "all_gather") {
      comm.all_gather(in.data(), out.data(), v, DType::kFp32, stream);
    } else if (name == "reduce_scatter") {
      comm.reduce_scatter(in.data(), out.data(), v, DType::kFp32, stream);
    } else if (name == "alltoall") {
      comm.all_to_all_v(in.data(), counts, out.data(), counts, DType::kFp32, stream);
    } else if (peer < n) {  // sendrecv: a ping-pong between ranks 2i and 2i + 1
      if (me % 2 == 0) {
        comm.send(in.data(), v, DType::kFp32, peer, stream);
        comm.recv(out.data(), v, DType::kFp32, peer, stream);
      } else {
        comm.recv(out.data(), v, DType::kFp32, peer, stream);
        comm.send(in.data(), v, DType::kFp32, peer, stream);
      }
    }
  };
  double t = seconds_per_call(stream, once, iters, 1, warmup, [mpi] { MOEPLAN_MPI_CHECK(MPI_Barrier(mpi)); });
  if (name == "sendrecv") t /= 2;  // one way
  row.time_us = max_over(mpi, t) * 1e6;
  row.algbw = static_cast<double>(row.bytes) / (row.time_us * 1e-6) / 1e9;
  row.busbw = row.algbw * busbw_factor(name, n);
  return row;
}

// One all-to-all-v with a hot receiver on `comm`: the slowest rank's mean time per call, in seconds (as
// time_collective).
double time_alltoall_skew(NcclCommunicator& comm, MPI_Comm mpi, const SkewCounts& c, int warmup, int iters,
                          cudaStream_t stream) {
  int64_t in_n = 0, out_n = 0;
  for (int64_t v : c.send) in_n += v;
  for (int64_t v : c.recv) out_n += v;
  DeviceBuffer<float> in(static_cast<size_t>(std::max<int64_t>(1, in_n)));
  DeviceBuffer<float> out(static_cast<size_t>(std::max<int64_t>(1, out_n)));
  MOERUN_CUDA_CHECK(cudaMemset(in.data(), 0, in.bytes()));
  auto once = [&] { comm.all_to_all_v(in.data(), c.send, out.data(), c.recv, DType::kFp32, stream); };
  const double t =
      seconds_per_call(stream, once, iters, 1, warmup, [mpi] { MOEPLAN_MPI_CHECK(MPI_Barrier(mpi)); });
  return max_over(mpi, t);
}

// The base profile's field with every "source" inside it saying where it came from.
ojson from_base(ojson field, const std::string& base) {
  if (field.is_object()) {
    for (auto& [k, v] : field.items()) {
      if (k == "source" && v.is_string()) {
        v = fmt::format("from the base profile {}, not measured by this bench: {}", base,
                        v.get<std::string>());
      } else {
        v = from_base(v, base);
      }
    }
  } else if (field.is_array()) {
    for (auto& v : field) v = from_base(v, base);
  }
  return field;
}

}  // namespace

Result<BenchSummary> run_cuda_bench(const CudaBenchOptions& options, MPI_Comm world) {
  const auto start = std::chrono::steady_clock::now();
  int me = 0, nranks = 1;
  MOEPLAN_MPI_CHECK(MPI_Comm_rank(world, &me));
  MOEPLAN_MPI_CHECK(MPI_Comm_size(world, &nranks));
  const BenchOptions& o = options.bench;
  // Every rank sees the same world size, so every rank returns this error (no rank waits on another).
  if (auto fits = check_plan_exchange(o.plan_exchange, nranks); !fits) return fits.error();

  // Each rank's GPU: one per local rank.
  std::string error;
  Device dev;
  int devices = 0;
  const cudaError_t counted = cudaGetDeviceCount(&devices);
  const NodePlace place = node_place(world);
  Result<int> index = Error{fmt::format("no CUDA device: {}", cudaGetErrorString(counted))};
  if (counted == cudaSuccess) index = device_for_rank(place, devices);
  {
    int dev_ok = index ? 1 : 0, all_dev = 0;
    MOEPLAN_MPI_CHECK(MPI_Allreduce(&dev_ok, &all_dev, 1, MPI_INT, MPI_MIN, world));
    if (!all_dev) {
      error = index ? "another rank found no GPU of its own (one GPU per local rank is needed)"
                    : index.error().message;
    }
  }
  // Then the base profile and the output folder, on rank 0 (no folder is made when a rank has no GPU);
  // every rank learns whether to go on.
  ojson base;
  std::string base_label;
  if (me == 0 && error.empty()) {
    std::string stem;
    auto read = io::read_input(options.base, "hwprofiles", ".", &base_label, &stem);
    if (!read) {
      error = fmt::format("--base {}: {}", options.base, read.error().message);
    } else {
      base = ojson::parse(read.value().dump());
      for (const char* k : {"gpu", "node", "scale_out"}) {
        if (!base.contains(k)) error = fmt::format("--base {}: field '{}': missing", base_label, k);
      }
    }
    if (error.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(o.out_dir, ec);
      if (o.out_dir.empty() || ec) error = fmt::format("--out {}: cannot create the directory", o.out_dir);
    }
  }
  const int ok = error.empty() ? 1 : 0;
  int all_ok = 0;
  MOEPLAN_MPI_CHECK(MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, world));
  if (!all_ok) return Error{error.empty() ? "rank 0 could not start the bench" : error};
  dev.index = index.value();
  MOERUN_CUDA_CHECK(cudaSetDevice(dev.index));
  MOERUN_CUDA_CHECK(cudaGetDeviceProperties(&dev.prop, dev.index));
  MOERUN_CUDA_CHECK(cudaRuntimeGetVersion(&dev.runtime));
  ncclGetVersion(&dev.nccl);
  {
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    dev.host = host;
    dev.date = fmt::format("{:%Y-%m-%d}", fmt::gmtime(std::time(nullptr)));
  }

  const bool quick = o.quick;
  const int reps = quick ? 3 : 10, batches = quick ? 3 : 7;
  cudaStream_t stream = nullptr;
  MOERUN_CUDA_CHECK(cudaStreamCreate(&stream));
  BenchSummary summary;
  std::vector<std::string> files;
  Error write_error{};
  auto emit = [&](const std::string& name, const std::string& text) {
    if (me != 0) return;
    auto w = write_bench_file(o.out_dir, name, text);
    if (w.ok()) {
      files.push_back(name);
    } else if (write_error.message.empty()) {
      write_error = w.error();
    }
  };
  const std::string who =
      fmt::format("{} on {} ({} ranks, one GPU each, all at once; CUDA runtime {}, NCCL {})", dev.prop.name,
                  dev.host, nranks, dev.runtime, dev.nccl);
  const std::string g1 = "measured by moerun bench --backend cuda (G1)";

  {  // GEMMs
    const std::vector<int64_t> ms = quick ? std::vector<int64_t>{256, 1024}
                                          : std::vector<int64_t>{256, 512, 1024, 2048, 4096, 8192, 16384};
    const std::vector<std::pair<int64_t, int64_t>> nks =
        quick ? std::vector<std::pair<int64_t, int64_t>>{{1024, 1024}}
              : std::vector<std::pair<int64_t, int64_t>>{{4096, 4096}, {8192, 8192},  {4096, 7168},
                                                         {7168, 2048}, {14336, 4096}, {4096, 14336}};
    std::string csv = fmt::format(
        "# source: {}: cuBLASLt via executor/kernels/cuda/gemm.h, {}; bf16: C = A B, bf16 in and out, fp32 "
        "accumulation; fp8: e4m3 A [m, k] x B [n, k]^T (Hopper's TN layout), per-tensor scales, bf16 out; "
        "inputs uniform random; median over {} batches of {} calls between CUDA events, mean over ranks; "
        "TFLOP/s = 2 m n k / time / 1e12\n"
        "m,n,k,dtype,tflops\n",
        g1, who, batches, reps);
    for (const cuda::GemmType in : {cuda::GemmType::kBf16, cuda::GemmType::kE4m3}) {
      for (int64_t m : ms) {
        for (auto [n, k] : nks) {
          cuda::GemmProblem p;
          p.op = in == cuda::GemmType::kE4m3 ? cuda::GemmOp::kDgrad : cuda::GemmOp::kForward;
          p.m = m;
          p.n = n;
          p.k = k;
          p.input = in;
          p.output = cuda::GemmType::kBf16;
          const double tf = mean_over(world, gemm_tflops(p, stream, me, reps, batches));
          if (tf <= 0) continue;
          if (in == cuda::GemmType::kBf16) summary.best_gemm_tflops = std::max(summary.best_gemm_tflops, tf);
          csv +=
              fmt::format("{},{},{},{},{:.6g}\n", m, n, k, in == cuda::GemmType::kE4m3 ? "fp8" : "bf16", tf);
        }
      }
    }
    emit("gemm.csv", csv);
  }
  {  // grouped GEMMs
    const std::vector<int> es = quick ? std::vector<int>{8} : std::vector<int>{4, 8, 16, 32};
    const std::vector<int64_t> mpg =
        quick ? std::vector<int64_t>{128} : std::vector<int64_t>{128, 512, 2048, 8192};
    const std::vector<std::pair<int64_t, int64_t>> nks =
        quick ? std::vector<std::pair<int64_t, int64_t>>{{1024, 1024}}
              : std::vector<std::pair<int64_t, int64_t>>{
                    {4096, 7168}, {7168, 2048}, {3072, 4096}, {4096, 1536}};
    std::string csv = fmt::format(
        "# source: {}: CUTLASS's SM90 grouped GEMM via executor/kernels/cuda/grouped_gemm.h (device-side "
        "counts), {}; x [groups m_per_group, k] x w [groups, k, n], bf16, m_per_group rows per expert; "
        "median "
        "over {} batches of {} calls between CUDA events (each call includes the setup kernel), mean over "
        "ranks; TFLOP/s = 2 groups m n k / time / 1e12\n"
        "groups,m_per_group,n,k,dtype,kernel,tflops\n",
        g1, who, batches, reps);
    for (int e : es) {
      for (int64_t m : mpg) {
        for (auto [n, k] : nks) {
          const double tf = mean_over(world, grouped_tflops(e, m, n, k, stream, me, reps, batches));
          if (tf > 0) csv += fmt::format("{},{},{},{},bf16,cutlass_grouped,{:.6g}\n", e, m, n, k, tf);
        }
      }
    }
    emit("grouped_gemm.csv", csv);
  }
  {  // attention
    const std::vector<int64_t> seqs =
        quick ? std::vector<int64_t>{512, 1024} : std::vector<int64_t>{512, 1024, 2048, 4096, 8192, 16384};
    std::string csv = fmt::format(
        "# source: {}: cuDNN's fused flash attention (SDPA) via executor/kernels/cuda/attention.h, {}; bf16, "
        "16 heads, 16384 / seq_len sequences; median over {} batches of {} calls between CUDA events, mean "
        "over ranks; FLOPs: fwd 4 s^2 d per head, halved when causal; bwd 2.5 x fwd\n"
        "seq_len,head_dim,causal,direction,dtype,impl,tflops\n",
        g1, who, batches, reps);
    cuda::CudnnHandle handle;
    for (int64_t d : {int64_t{64}, int64_t{128}}) {
      for (bool causal : {false, true}) {
        for (bool bwd : {false, true}) {
          for (int64_t s : seqs) {
            const double tf = mean_over(
                world, attention_tflops(handle.get(), s, d, causal, bwd, stream, me, reps, batches));
            if (tf > 0)
              csv += fmt::format("{},{},{},{},bf16,cudnn,{:.6g}\n", s, d, causal, bwd ? "bwd" : "fwd", tf);
          }
        }
      }
    }
    emit("attention.csv", csv);
  }
  double copy_GBps = 0;
  {  // HBM: device-to-device copies
    const size_t bytes = quick ? size_t{64} << 20 : size_t{1} << 30;
    DeviceBuffer<uint8_t> a(bytes), b(bytes);
    MOERUN_CUDA_CHECK(cudaMemset(a.data(), 1, bytes));
    const double t = seconds_per_call(
        stream,
        [&] {
          MOERUN_CUDA_CHECK(cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice, stream));
        },
        reps, batches);
    copy_GBps = mean_over(world, 2.0 * static_cast<double>(bytes) / t / 1e9);
    summary.triad_GBps = copy_GBps;
    emit("hbm.csv",
         fmt::format("# source: {}: cudaMemcpyAsync device to device of {} MiB, {}; median over {} "
                     "batches of {} copies, mean over ranks; bytes = read + written (2 x size)\n"
                     "kernel,bw_GBps\ncopy,{:.6g}\n",
                     g1, bytes >> 20, who, batches, reps, copy_GBps));
  }

  // Collectives over the first g ranks (g = 2, 4, ... below the world size, and the world).
  if (nranks >= 2) {
    ncclUniqueId id{};
    int made = 1;
    if (me == 0) {
      auto u = nccl_unique_id();
      made = u ? 1 : 0;
      if (u) id = u.value();
    }
    MOEPLAN_MPI_CHECK(MPI_Bcast(&made, 1, MPI_INT, 0, world));
    if (!made) return Error{"ncclGetUniqueId failed on rank 0"};
    MOEPLAN_MPI_CHECK(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, world));
    auto nccl_world = NcclCommunicator::init(id, nranks, me, "bench-world");
    if (!nccl_world) return Error{nccl_world.error().message};
    struct RankInfo {
      int pid = 0;
      char host[64] = {};
      char device[64] = {};
    };
    RankInfo mine;
    mine.pid = static_cast<int>(getpid());
    // Truncated to the fixed fields MPI carries.
    auto put = [](char* field, size_t size, const std::string& text) {
      const size_t n = std::min(size - 1, text.size());
      std::memcpy(field, text.data(), n);
      field[n] = '\0';
    };
    put(mine.host, sizeof(mine.host), dev.host);
    put(mine.device, sizeof(mine.device), std::string(dev.prop.name));
    std::vector<RankInfo> ranks(static_cast<size_t>(nranks));
    MOEPLAN_MPI_CHECK(
        MPI_Allgather(&mine, sizeof(RankInfo), MPI_BYTE, ranks.data(), sizeof(RankInfo), MPI_BYTE, world));
    const int64_t max_bytes = o.max_bytes > 0 ? o.max_bytes : quick ? int64_t{1} << 20 : int64_t{1} << 30;
    const int64_t min_bytes = 8;
    const int warmup = quick ? 2 : 5, iters = quick ? 5 : 20;
    std::vector<int> sizes;
    for (int g = 2; g < nranks; g *= 2) sizes.push_back(g);
    sizes.push_back(nranks);
    // Per-rank buffers of the all-to-all-v with a hot receiver: three sizes up to the sweeps' largest.
    const std::vector<int64_t> skew_bytes = alltoall_skew_sizes(
        quick ? std::vector<int64_t>{int64_t{64} << 10, int64_t{1} << 20}
              : std::vector<int64_t>{int64_t{1} << 20, int64_t{16} << 20, int64_t{256} << 20},
        max_bytes);
    std::string skew_csv = alltoall_skew_head(fmt::format(
        "{}: moerun's NCCL communicator (fp32), NCCL {}; time = the slowest rank's mean over {} back-to-back "
        "calls between CUDA events{}",
        g1, dev.nccl, iters, plan_exchange_note(o.plan_exchange)));
    for (int g : sizes) {
      const int color = me < g ? 0 : 1;
      auto sub = nccl_world.value()->split(color, me, fmt::format("bench-{}", g));
      if (!sub) return Error{sub.error().message};
      MPI_Comm mpi = MPI_COMM_NULL;
      MOEPLAN_MPI_CHECK(MPI_Comm_split(world, color, me, &mpi));
      if (color == 0) {
        for (const char* name : {"all_reduce", "all_gather", "reduce_scatter", "alltoall", "sendrecv"}) {
          std::vector<CollRow> rows;
          for (int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= 2) {
            rows.push_back(time_collective(*sub.value(), mpi, name, bytes, warmup, iters, stream));
            const CollRow& r = rows.back();
            if (g == 2 && std::string(name) == "sendrecv") {
              if (bytes == min_bytes) summary.sendrecv_latency_us = r.time_us;
              summary.sendrecv_bw_GBps = r.algbw;
            }
            if (g == nranks && std::string(name) == "all_reduce") {
              if (bytes == int64_t{1} << 20) summary.all_reduce_busbw_1MiB = r.busbw;
              summary.all_reduce_busbw_max = r.busbw;
            }
          }
          SweepText sweep{
              .collective = name,
              .redop =
                  std::string(name) == "all_reduce" || std::string(name) == "reduce_scatter" ? "sum" : "none",
              .min_bytes = min_bytes,
              .max_bytes = max_bytes,
              .warmup = warmup,
              .iters = iters,
              .ranks = {},
              .note = fmt::format(
                  "moerun's NCCL communicator (fp32), NCCL {}; time = the slowest rank's mean over "
                  "{} back-to-back iterations between CUDA events; one variant per collective, "
                  "shown in both column groups{}",
                  dev.nccl, iters,
                  std::string(name) == "sendrecv" ? "; sendrecv = half a ping-pong between rank pairs" : "")};
          for (int r = 0; r < g; ++r) {
            const RankInfo& info = ranks[static_cast<size_t>(r)];
            sweep.ranks.push_back({info.pid, info.host, info.device});
          }
          emit(fmt::format("{}_perf.n{}.txt", name, g), nccl_tests_text(sweep, rows));
        }
        std::set<std::string> hosts;
        for (int r = 0; r < g; ++r) hosts.insert(ranks[static_cast<size_t>(r)].host);
        for (int64_t bytes : skew_bytes) {
          for (double hot : kHotFactors) {
            if (hot > g) continue;
            const SkewCounts counts = skew_counts(g, me, std::max<int64_t>(1, bytes / 4), hot);
            const double t = time_alltoall_skew(*sub.value(), mpi, counts, warmup, iters, stream);
            skew_csv += alltoall_skew_row(g, static_cast<int>(hosts.size()), counts, t * 1e6);
          }
        }
      }
      MOEPLAN_MPI_CHECK(MPI_Comm_free(&mpi));
      MOEPLAN_MPI_CHECK(MPI_Barrier(world));
    }
    // The plan's own routed exchange: its EP group at its busiest rank's load, at the table's sizes and its
    // own.
    if (const PlanExchange& x = o.plan_exchange; x.size >= 2) {
      const int color = in_plan_exchange(x, me) ? 0 : 1;
      auto sub = nccl_world.value()->split(color, me, "bench-plan");
      if (!sub) return Error{sub.error().message};
      MPI_Comm mpi = MPI_COMM_NULL;
      MOEPLAN_MPI_CHECK(MPI_Comm_split(world, color, me, &mpi));
      if (color == 0) {
        std::set<std::string> hosts;
        for (int r = 0; r < nranks; ++r)
          if (in_plan_exchange(x, r)) hosts.insert(ranks[static_cast<size_t>(r)].host);
        for (const auto& [bytes, hot] : plan_exchange_rows(x, skew_bytes, max_bytes)) {
          const SkewCounts counts = skew_counts(x.size, me / x.stride, std::max<int64_t>(1, bytes / 4), hot);
          const double t = time_alltoall_skew(*sub.value(), mpi, counts, warmup, iters, stream);
          skew_csv += alltoall_skew_row(x.size, static_cast<int>(hosts.size()), counts, t * 1e6);
        }
      }
      MOEPLAN_MPI_CHECK(MPI_Comm_free(&mpi));
      MOEPLAN_MPI_CHECK(MPI_Barrier(world));
    }
    if (!skew_bytes.empty() || o.plan_exchange.size >= 2) emit("alltoall_skew.csv", skew_csv);
  }
  // The tensor-core rate under sustained load (gpu.sustained_rate): the tables above time short bursts, and a
  // GPU held near its power limit lowers its clocks. On every rank at once (a node's GPUs heat together):
  // after `idle_s` without work, the reference GEMMs (BF16, FP8) in short bursts; then the first of them back
  // to back for `load_s`; then the same bursts again. Last in the bench, so no table above is timed on a GPU
  // this loop heated.
  // dtype -> (cool, hot) TFLOP/s, mean over ranks.
  std::map<std::string, std::pair<double, double>> sustained;
  const double idle_s = quick ? 1.0 : 10.0,
               load_s = quick ? std::min(3.0, options.sustain_s) : options.sustain_s;
  if (load_s > 0) {
    std::vector<std::pair<std::string, std::unique_ptr<GemmRunner>>> refs;
    for (const cuda::GemmType in : {cuda::GemmType::kBf16, cuda::GemmType::kE4m3}) {
      auto gemm = std::make_unique<GemmRunner>(reference_gemm(in));
      const int runs = gemm->refusal().empty() ? 1 : 0;
      int all_run = 0;
      MOEPLAN_MPI_CHECK(MPI_Allreduce(&runs, &all_run, 1, MPI_INT, MPI_MIN, world));
      if (all_run) refs.emplace_back(in == cuda::GemmType::kE4m3 ? "fp8" : "bf16", std::move(gemm));
    }
    if (!refs.empty()) {
      MOEPLAN_MPI_CHECK(MPI_Barrier(world));
      std::this_thread::sleep_for(std::chrono::duration<double>(idle_s));
      for (const auto& [dtype, g] : refs) sustained[dtype].first = mean_over(world, g->tflops(stream, 10, 3));
      refs.front().second->run_for(stream, load_s);
      for (const auto& [dtype, g] : refs)
        sustained[dtype].second = mean_over(world, g->tflops(stream, 10, 3));
    }
  }
  if (!sustained.empty()) {
    std::string csv = fmt::format(
        "# source: {}: {}; the reference GEMMs (8192^3; bf16: C = A B; fp8: e4m3 TN, per-tensor scales; "
        "bf16 out) timed in bursts (median of 3 batches of 10 calls between CUDA events) after {:g} s "
        "without work (cool), then again after {:g} s of back-to-back calls of the first (hot); mean over "
        "ranks, all ranks at once; ratio = hot / cool: gpu.sustained_rate in profile.json\n"
        "dtype,cool_tflops,hot_tflops,ratio\n",
        g1, who, idle_s, load_s);
    for (const auto& [dtype, r] : sustained)
      csv += fmt::format("{},{:.6g},{:.6g},{:.4f}\n", dtype, r.first, r.second, r.second / r.first);
    // Not a table calibrate reads (it is not listed among the measurements): profile.json carries its ratio.
    if (me == 0) {
      auto w = write_bench_file(o.out_dir, "sustained.csv", csv);
      if (!w.ok() && write_error.message.empty()) write_error = w.error();
    }
  }
  MOERUN_CUDA_CHECK(cudaStreamDestroy(stream));

  // profile.json: the base's fields, with what was measured here in their place.
  if (me == 0) {
    ojson j;
    j["format"] = "moeplan-calibration-sources-v1";
    j["name"] = o.name.empty() ? "gpu-" + dev.host : o.name;
    j["description"] =
        fmt::format("{}: moerun bench --backend cuda; fields not measured here from {}", who, base_label);
    j["sources"] = base.contains("sources") ? base["sources"] : ojson::object();
    j["sources"]["G1"] =
        fmt::format("moerun bench --backend cuda on {}, {}, {} ranks, {}", dev.host, dev.date, nranks, who);
    ojson gpu = from_base(base["gpu"], base_label);
    gpu["model"] = dev.prop.name;
    gpu["sm_count"] = {{"value", dev.prop.multiProcessorCount},
                       {"source", g1 + ": cudaDeviceProp::multiProcessorCount"}};
    gpu["hbm_capacity_MiB"] = {{"value", static_cast<double>(dev.prop.totalGlobalMem) / (1 << 20)},
                               {"source", g1 + ": cudaDeviceProp::totalGlobalMem / 2^20"}};
    gpu["hbm_bw_achieved_GBps"] = {{"value", copy_GBps},
                                   {"source", g1 + ": the device-to-device copy in hbm.csv"}};
    // The sustained share of the burst rate, measured; its range reaches the burst rate, since a training
    // step's mix of kernels may run cooler than back-to-back GEMMs.
    for (const auto& [dtype, r] : sustained) {
      ojson entry = sustained_rate_entry(r.first, r.second, idle_s, load_s, g1);
      if (!entry.is_null()) gpu["sustained_rate"][dtype] = std::move(entry);
    }
    j["gpu"] = gpu;
    j["node"] = from_base(base["node"], base_label);
    j["scale_out"] = from_base(base["scale_out"], base_label);
    j["measurements"] = files;
    emit("profile.json", j.dump(2) + "\n");
  }
  summary.files = files;
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return share_bench_result(std::move(summary), write_error, world);
}

}  // namespace moeplan::executor
