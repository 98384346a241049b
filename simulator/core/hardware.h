// HardwareProfile: one Hopper machine type and its cluster fabric, in SI units, with the source of every
// number and the measured tables (collectives, GEMM, attention, HBM) that calibrate the cost model.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "simulator/core/stated.h"

namespace moeplan {

template <class T>
struct Sourced {
  T value{};
  std::string
      source;  // citation: "hopper-hardware.md §2.1, S3 (...)", "[DERIVED] ...", "datasheet assumption: ..."
};

enum class Collective : uint8_t { kAllReduce, kAllGather, kReduceScatter, kAllToAll, kSendRecv };
enum class CollectiveAlgorithm { kRing, kNvls, kNvlsTree, kTree, kUnspecified };
enum class Scope { kIntraNode, kInterNode };
enum class BandwidthMetric { kBusBw, kAlgBw };  // nccl-tests conventions (busbw = algbw * factor(n))
enum class Topology { kRailOptimizedFatTree, kMultiPlaneFatTree, kFatTree };

struct CollectiveCurve {
  Collective collective = Collective::kAllReduce;
  CollectiveAlgorithm algorithm = CollectiveAlgorithm::kUnspecified;
  Scope scope = Scope::kIntraNode;
  int64_t ranks = 0;
  int64_t nodes = 0;
  BandwidthMetric metric = BandwidthMetric::kBusBw;
  std::string source;
  std::vector<std::pair<double, double>> points;  // (message bytes, bandwidth bytes/s), bytes increasing
};

// A large-message bus bandwidth quoted without its message size (vendor slides): usable as the asymptote
// only.
struct CollectivePlateau {
  Collective collective = Collective::kAllToAll;
  Scope scope = Scope::kIntraNode;
  int64_t ranks = 0;
  int64_t nodes = 0;
  double busbw_bytes_per_s = 0;
  std::string source;
};

struct GemmPoint {
  int64_t m = 0, n = 0, k = 0;
  double flops_per_s = 0;
};
struct GemmTable {
  std::string dtype;  // "bf16" | "fp8"
  std::string source;
  std::vector<GemmPoint> points;
};

struct GroupedGemmPoint {
  int64_t groups = 0, m_per_group = 0, n = 0, k = 0;
  double flops_per_s = 0;
};
// The kernel a grouped-GEMM measurement ran: its implementation class (see stack.h,
// grouped_gemm_kernel_classes: deepgemm, cutlass_grouped, cublas_loop, ...). `part` says which GEMMs of the
// layer were timed: "fwd", "dgrad" or "wgrad" alone (points give the forward shape), or "fwd+bwd" for all
// three in sequence, whose TFLOP/s is 3 x the forward FLOPs over the time.
struct GroupedGemmTable {
  std::string dtype;
  std::string kernel;
  std::string part = "fwd";
  std::string source;
  std::vector<GroupedGemmPoint> points;
};

struct AttentionTable {
  std::string dtype;
  std::string direction;  // "fwd" | "bwd"
  int64_t head_dim = 0;
  bool causal = true;
  std::string impl;  // "fa3" | "fa2" | "cudnn"
  std::string source;
  std::vector<std::pair<int64_t, double>> points;  // (seq_len, FLOP/s), seq increasing
};

// All-to-all-v with one hot receiver (moerun bench's alltoall_skew.csv): every rank of the group sends
// `bytes` (its whole send buffer, as nccl-tests sizes alltoall), hot_factor / ranks of it to group rank 0 and
// the rest evenly to the others, so rank 0 receives hot_factor x bytes: a routed dispatch whose busiest rank
// draws hot_factor times the mean.
struct AllToAllSkewPoint {
  int64_t bytes = 0;
  double hot_factor = 1;
  double seconds = 0;
};
struct AllToAllSkewTable {
  int64_t ranks = 0, nodes = 1;
  std::string source;
  std::vector<AllToAllSkewPoint> points;
};

struct HbmPoint {
  std::string kernel;  // STREAM kernel: copy, mul, add, triad, dot
  double bytes_per_s = 0;
  std::string source;
};

struct GpuSpec {
  std::string model;
  Sourced<int64_t> sm_count;
  std::map<std::string, Sourced<double>> peak_flops_per_s;  // by dtype: bf16, fp8, tf32, fp32 (dense)
  Sourced<double> hbm_capacity_bytes;
  Sourced<double> hbm_bw_peak_bytes_per_s;
  Sourced<double> hbm_bw_achieved_bytes_per_s;
  // The rate of tensor-core kernels (GEMMs, grouped GEMMs, attention) under a training step's sustained load,
  // as a share of the rate the calibration tables measured, by dtype ("bf16", "fp8"). The tables time short
  // bursts on a cool GPU; a GPU held near its power limit for minutes runs its tensor cores at lower clocks.
  // A dtype without an entry runs at the tables' rate (1, not stated).
  std::map<std::string, Stated<double>> sustained_rate;
};

struct NodeSpec {
  Sourced<int64_t> gpus_per_node;
  Sourced<double> nvlink_bw_uni_bytes_per_s;       // line rate per GPU per direction
  Sourced<double> nvlink_bw_achieved_bytes_per_s;  // achievable per GPU per direction
  Sourced<bool> nvls;
  Sourced<double> nvlink_latency_s;
};

struct ScaleOutSpec {
  Sourced<int64_t> nics_per_node;
  Sourced<double> nic_bw_bytes_per_s;  // line rate per NIC per direction
  Sourced<double> nic_bw_achieved_bytes_per_s;
  Sourced<Topology> topology;
  Sourced<double> net_latency_s;
};

struct Calibration {
  std::vector<CollectiveCurve> collectives;
  std::vector<CollectivePlateau> plateaus;
  std::vector<GemmTable> gemm;
  std::vector<GroupedGemmTable> grouped_gemm;
  std::vector<AttentionTable> attention;
  std::vector<HbmPoint> hbm;
  std::vector<AllToAllSkewTable> alltoall_skew;
};

struct HardwareProfile {
  std::string name;
  std::string description;
  std::map<std::string, std::string> sources;  // source id -> citation
  GpuSpec gpu;
  NodeSpec node;
  ScaleOutSpec scale_out;
  Calibration calibration;
};

}  // namespace moeplan
