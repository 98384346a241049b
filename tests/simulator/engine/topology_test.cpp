// The cluster graph: transfers inside a node take NVLink through the NVSwitch; across nodes they leave
// through the NIC of their rail, cross a leaf (and the spine between leaves), and NVLink bounds nothing
// there.
#include <doctest/doctest.h>

#include "simulator/engine/topology.h"
#include "simulator/io/hardware_loader.h"

using namespace moeplan;

TEST_SUITE("engine") {
  TEST_CASE("a transfer inside a node goes GPU -> NVSwitch -> GPU at NVLink speed") {
    const HardwareProfile hw = io::load_hardware("h100-sxm").value();
    const engine::Topology topo(hw, 16);
    const auto p = topo.path(1, 6);
    CHECK(p.hops == std::vector<std::string>{"gpu1", "node0.nvswitch", "gpu6"});
    CHECK_FALSE(p.crosses_nodes());
    CHECK(p.bottleneck_bytes_per_s() == doctest::Approx(hw.node.nvlink_bw_achieved_bytes_per_s.value));
  }

  TEST_CASE("same-rail GPUs of two nodes meet at their rail's leaf, bounded by the NIC") {
    const HardwareProfile hw = io::load_hardware("h100-sxm").value();
    const engine::Topology topo(hw, 16);
    const auto p = topo.path(3, 11);  // GPU 3 of node 0 and GPU 3 of node 1
    CHECK(p.hops == std::vector<std::string>{"gpu3", "node0.nic3", "rail3.leaf0", "node1.nic3", "gpu11"});
    CHECK(p.crosses_nodes());
    CHECK(p.bottleneck_bytes_per_s() == doctest::Approx(hw.scale_out.nic_bw_achieved_bytes_per_s.value));
  }

  TEST_CASE(
      "a cross-rail transfer hops over NVLink to the right rail first, and distant nodes cross the spine") {
    const HardwareProfile hw = io::load_hardware("h800-sxm").value();
    const engine::Topology topo(hw, 8 * 64, 64);  // 64 nodes, 32 nodes per leaf: two leaves per rail
    const auto p = topo.path(0, 8 * 40 + 5);      // node 0 GPU 0 -> node 40 GPU 5
    CHECK(p.crosses_nodes());
    CHECK(std::find(p.hops.begin(), p.hops.end(), "spine") != p.hops.end());
    CHECK(p.hops.front() == "gpu0");
    CHECK(p.hops.back() == "gpu325");
    CHECK(p.bottleneck_bytes_per_s() <= hw.node.nvlink_bw_achieved_bytes_per_s.value);
  }
}
