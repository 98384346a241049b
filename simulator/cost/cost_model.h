// CostModel: the time one op takes on its own, for a (hardware, stack) pair. Compute follows a roofline with
// efficiency fitted to the profile's GEMM and attention tables; collectives follow alpha-beta curves fitted
// to the profile's nccl-tests sweeps, placed on nodes from rank order. Each cost carries the fit error of the
// curve it used, and inputs outside the calibrated data are recorded as extrapolations.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "simulator/core/hardware.h"
#include "simulator/core/op_graph.h"
#include "simulator/core/stack.h"
#include "simulator/cost/collective.h"
#include "simulator/cost/gemm_grid.h"

namespace moeplan::cost {

// The resource an op occupies on its rank while it runs (the engine shares each among concurrent ops).
enum class Resource : uint8_t { kSm, kNvlink, kNic };

struct OpCost {
  double seconds = 0;
  double rel_error = 0;  // relative fit error of the calibrated curve(s) used
  Resource resource = Resource::kSm;
  double link_bytes_per_s = 0;  // communication: the rate at which it moves bytes through HBM (interference)
  double sm_fraction = 0;       // communication: the share of the SMs its kernels hold while it runs
  // Communication: the op's rate while compute kernels run on its GPU, as a fraction of its rate alone (the
  // stack's dispatcher kernels beside compute; 1 for the collective libraries' kernels).
  double rate_beside_compute = 1.0;
  double host_seconds = 0;  // CPU time to issue the op's kernels (exposed where the host cannot run ahead)
  double host_sync_seconds = 0;    // host_sync ops: the host's round trip after the op ends on the device
  Basis basis = Basis::kMeasured;  // the weakest basis of the stack numbers that priced it
};

// Uncertainty assumed where a number has no fit behind it (a single measured point, a datasheet value or an
// assumed stack parameter): stated in each use, never fitted.
inline constexpr double kAssumedRelError = 0.15;

class CostModel {
 public:
  // What the model fits from the hardware profile's measurements alone (the GEMM grids, the fitted GEMM
  // models, the collective curves): a few milliseconds, the same for every stack. Callers that price many
  // plans or stacks on one profile fit it once (fit_hardware) and hand it to each model.
  struct HardwareFit;
  static std::shared_ptr<const HardwareFit> fit_hardware(const HardwareProfile& hw);

  // `fit`: fit_hardware() of this same profile object, unchanged since (checked by address); null: the model
  // fits the profile itself.
  CostModel(const HardwareProfile& hw, const StackProfile& stack,
            std::shared_ptr<const HardwareFit> fit = {});

  OpCost cost(const Op& op) const;

  // Components (also used by tests and the memory model).
  // A GEMM of `s` (as the forward pass sees it) for `part`: dgrad runs [m x n]·[n x k], wgrad
  // [k x m]·[m x n] (reduction over the rows).
  double gemm_seconds(const GemmShape& s, DType dtype, double* rel_error,
                      GemmPart part = GemmPart::kNone) const;
  // The grouped GEMM of one MoE layer's local experts as the stack runs it (see the .cpp).
  double grouped_gemm_seconds(const GemmShape& s, DType dtype, double* rel_error,
                              GemmPart part = GemmPart::kNone) const;
  // `seconds` of a weight-gradient GEMM with its accumulation into the main gradient buffer (see the .cpp).
  double accumulating(const Op& op, double seconds) const;
  // A GEMM with its TP exchange pipelined by Transformer Engine's userbuffers (CommSpec::userbuffers; see
  // the .cpp).
  double userbuffers_seconds(const Op& op, double* rel_error) const;
  // 1 / the stack's fp8_block_gemm_rate for a block-scaled FP8 GEMM (Op::block_scaled), else 1.
  double block_scaling(const Op& op) const;
  double attention_seconds(const Op& op, double* rel_error) const;
  double memory_bound_seconds(double bytes) const;
  double collective_seconds(const CommSpec& c, double* rel_error, Resource* resource) const;
  // DeepEP / HybridEP's exchange: the RDMA leg at the dispatcher's NIC efficiency beside the NVLink leg at
  // its NVLink efficiency.
  double node_dedup_seconds(const CommSpec& c, Resource* resource) const;
  // The stack's measured dispatcher row for an exchange over `nodes` nodes (interpolated, held at the ends);
  // {0, nic_efficiency, 0, 0} when the stack has no table.
  StackProfile::Dispatcher::ByNodes dispatcher_at(double nodes) const;
  Placement placement(const CommSpec& c) const;

  const HardwareProfile& hardware() const { return hw_; }
  const StackProfile& stack() const { return stack_; }
  std::vector<std::string> extrapolations() const;
  // Whether extrapolations are recorded (on by default). The planner's screen never reports them and turns
  // recording off, which also saves formatting a note per call.
  void record_extrapolations(bool on) { recording_ = on; }

  // Per-GPU NIC bandwidth: achieved per NIC x NICs per node / GPUs per node.
  double nic_bytes_per_s_per_gpu() const;

 private:
  struct GemmModel {
    double efficiency = 0;  // of the dtype's dense peak, after wave quantisation and the K-depth term
    double k0 = 0;          // per-tile fixed cost in reduction depth: a K-deep tile runs at K / (K + k0)
    double rel_error = kAssumedRelError;
    int64_t min_dim = 0, max_dim = 0;
    size_t points = 0;
  };
  struct Curve {
    Collective collective;
    CollectiveAlgorithm algorithm;
    Scope scope;
    int64_t ranks, nodes;
    CurveModel model;
    double min_bytes, max_bytes;
    bool single_point;
  };
  GemmModel fit_gemm(const std::string& dtype, double k0) const;
  GemmModel fit_gemm(const std::string& dtype) const;
  // A dense GEMM from the profile's measured grids of its dtype (the geometric mean of those that hold the
  // shape), or nullopt when none does.
  std::optional<double> grid_seconds(const char* dtype, int64_t m, int64_t n, int64_t k) const;
  // The dense peak of a dtype (BF16's where the profile states none).
  double peak_flops(const char* dtype) const;
  // The GPU's sustained tensor-core rate of a dtype key as a share of the tables': the hardware profile's
  // stated number (null where it states none), and its value (1 there).
  const Stated<double>* sustained_rate(const char* dtype) const;
  double sustained(const char* dtype) const;
  // The fitted dense model of a dtype, BF16's where the dtype has no table.
  const GemmModel& fitted(const char* dtype) const;
  double wave_efficiency(int64_t rows_per_group, int64_t n, int64_t groups) const;
  // One GEMM launch of `groups` problems of [rows x n x k] on the dense model (rows padded to the tile when
  // `pad_rows`), at `efficiency` of the fitted rate.
  double tiled_seconds(int64_t rows, int64_t n, int64_t k, int64_t groups, const GemmModel& g, double peak,
                       double efficiency, bool pad_rows) const;
  double intra_node_seconds(Collective c, int64_t n, double bytes, double* rel_error) const;
  double inter_node_seconds(const CommSpec& c, const Placement& p, double* rel_error) const;
  const CollectivePlateau* plateau(Collective c, Scope s) const;
  template <class... Args>
  void note(fmt::format_string<Args...> text, Args&&... args) const {
    if (recording_) add_note(fmt::format(text, std::forward<Args>(args)...));
  }
  void add_note(std::string what) const;

  const HardwareProfile& hw_;
  const StackProfile& stack_;
  std::shared_ptr<const HardwareFit> fit_;
  mutable std::mutex mu_;
  mutable std::set<std::string> extrapolations_;
  bool recording_ = true;
};

}  // namespace moeplan::cost
