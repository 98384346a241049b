// Pure cost functions for collectives: placement of a group on nodes, nccl-tests bus-bandwidth factors, the
// alpha-beta time and its least-squares fit to a measured sweep.
#pragma once

#include <cstdint>
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

}  // namespace moeplan::cost
