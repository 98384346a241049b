// Pure cost functions for collectives: placement of a group on nodes, nccl-tests bus-bandwidth factors, the
// alpha-beta time and its least-squares fit to a measured sweep.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "simulator/core/hardware.h"

namespace moeplan::cost {

// How a group of `size` ranks whose consecutive members are `stride` ranks apart falls onto nodes of
// `gpus_per_node` GPUs, when ranks fill nodes in order (innermost parallel dimensions stay in a node).
struct Placement {
  int64_t ranks = 1;
  int64_t per_node = 1;  // group members sharing a node
  int64_t nodes = 1;     // nodes the group spans
};
Placement place_group(int64_t size, int64_t stride, int64_t gpus_per_node);

// nccl-tests bus-bandwidth factor: busbw = algbw * factor (all_reduce 2(n-1)/n; all_gather, reduce_scatter,
// all_to_all (n-1)/n; send_recv 1).
double busbw_factor(Collective c, int64_t n);

// Alpha-beta time of a collective moving a message of `bytes` (nccl-tests size) over n ranks:
//   t = alpha + bytes * busbw_factor(c, n) / busbw
double alpha_beta_seconds(Collective c, int64_t n, double bytes, double alpha_s, double busbw_bytes_per_s);

// Fit of t = alpha + u / beta (u = bytes * factor) to measured (bytes, busbw) points, minimising the squared
// relative error of t. Errors are the median |predicted / measured - 1| over messages >= 1 MiB and below.
struct AlphaBetaFit {
  double alpha_s = 0;
  double busbw_bytes_per_s = 0;
  double rel_error_large = 0;  // messages >= 1 MiB
  double rel_error_small = 0;  // messages < 1 MiB (0 when none)
  double max_rel_error = 0;
};
AlphaBetaFit fit_alpha_beta(Collective c, int64_t n, const std::vector<std::pair<double, double>>& points);

// A measured sweep as the cost model uses it. With at least kMinInterpolatedSizes sizes the bus bandwidth is
// interpolated linearly in (log bytes, log busbw) between measured sizes: NCCL changes protocol and channel
// count with the message size, which one alpha-beta line does not follow (on the 8-GPU NVLS all-reduce sweeps
// it errs by up to 21% at 8-16 MiB and by 10% at 8 GiB). Below the smallest size the time stays at the
// smallest size's time (the latency floor); above the largest the busbw stays at the largest size's.
// Interpolation is chosen when its leave-one-out error (each interior size predicted from the others) is
// no worse than that of the alpha-beta line refitted without the size; otherwise, and with fewer sizes, the
// alpha-beta fit is used. The errors are the chosen model's leave-one-out errors (in-sample below
// kMinInterpolatedSizes sizes), i.e. errors at sizes that were not measured.
inline constexpr size_t kMinInterpolatedSizes = 4;
struct CurveModel {
  AlphaBetaFit fit;                               // always computed (reported beside the interpolation)
  std::vector<std::pair<double, double>> points;  // (bytes, busbw bytes/s); empty: alpha-beta is used
  double rel_error_large = 0;                     // median over messages >= 1 MiB
  double rel_error_small = 0;                     // median over messages < 1 MiB
  double max_rel_error = 0;
  int64_t loo_points = 0;  // sizes the leave-one-out error covers (interior sizes)
  // Per interior size: (bytes, busbw bytes/s the chosen model predicts without that size).
  std::vector<std::pair<double, double>> loo_busbw;
  bool interpolated() const { return !points.empty(); }
};
CurveModel fit_curve(Collective c, int64_t n, const std::vector<std::pair<double, double>>& points);

// Time of `bytes` over n ranks from a curve measured at any rank count (busbw is per-size, the factor is
// n's).
double curve_seconds(const CurveModel& m, Collective c, int64_t n, double bytes);

// What a hot receiver costs, from a measured all-to-all-v table (moerun bench's alltoall_skew.csv): the time
// of the exchange whose busiest receiver draws `hot_factor` times the mean, over the time of the uniform
// exchange of the same `bytes` per rank, t(bytes, hot) / t(bytes, 1).
//   - Per measured size: linear in the hot factor between the measured ones (1 at hot factor 1). Beyond the
//     largest, the busiest rank's extra bytes scale the time linearly from there (extrapolated). A measured
//     ratio below 1 (a hot receiver faster than none: timing noise) counts as 1.
//   - Between measured sizes: linear in log bytes; outside them, the nearest size's ratio (extrapolated).
// Only sizes measured at hot factor 1 count; nullopt when none is.
struct HotReceiverSlowdown {
  double factor = 1;
  bool extrapolated = false;
};
std::optional<HotReceiverSlowdown> hot_receiver_slowdown(const AllToAllSkewTable& t, double bytes,
                                                         double hot_factor);
// The profile's hot-receiver table of a group shape (ranks over nodes), or nullptr.
const AllToAllSkewTable* skew_table(const std::vector<AllToAllSkewTable>& tables, int64_t ranks,
                                    int64_t nodes);

}  // namespace moeplan::cost
