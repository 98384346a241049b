// The cluster as a graph (Boost.Graph): GPUs, each node's NVSwitch, NICs (one rail each), leaf switches per
// rail and spine switches, with the achieved bandwidth of each link. A transfer's path is the shortest path
// between two GPUs; its bottleneck link bounds the transfer. Rail-optimised: GPU g of every node uses NIC g
// mod nics; a cross-rail transfer first hops over NVLink to the GPU on the right rail (NCCL's PXN).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "simulator/core/hardware.h"

namespace moeplan::engine {

enum class LinkKind : uint8_t { kNvlink, kNic, kFabric };

struct Link {
  LinkKind kind;
  double bytes_per_s;
};

struct Path {
  std::vector<std::string> hops;  // vertex names from source to destination GPU
  std::vector<Link> links;
  double bottleneck_bytes_per_s() const;
  bool crosses_nodes() const;
};

class Topology {
 public:
  // `gpus` GPUs in nodes of the profile's size; leaves of `leaf_ports / 2` nodes per rail (half the ports
  // face down), one spine tier above them.
  Topology(const HardwareProfile& hw, int64_t gpus, int64_t leaf_ports = 64);
  ~Topology();
  Topology(const Topology&) = delete;
  Topology& operator=(const Topology&) = delete;

  int64_t num_vertices() const;
  Path path(int64_t gpu_a, int64_t gpu_b) const;

 private:
  struct Impl;
  Impl* impl_;
};

}  // namespace moeplan::engine
