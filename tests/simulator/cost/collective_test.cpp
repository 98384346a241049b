// Collective costs: alpha-beta closed forms, the fit to nccl-tests sweeps, placement from rank order, and the
// facts the Hopper sources state (NVLS above ring on 8 GPUs; all-to-all across nodes bounded by one NIC per
// GPU).
#include <doctest/doctest.h>

#include <cmath>

#include "simulator/core/units.h"
#include "simulator/cost/collective.h"
#include "simulator/cost/cost_model.h"
#include "simulator/io/hardware_loader.h"
#include "simulator/io/stack_loader.h"
#include "simulator/workload/lower.h"

using namespace moeplan;

namespace {
struct Profiles {
  HardwareProfile hw;
  StackProfile stack;
};
Profiles load(const char* hw) {
  return {io::load_hardware(hw).value(), io::load_stack("moerun").value()};
}
CommSpec spec(Collective c, int32_t size, int32_t stride, double bytes) {
  CommSpec s;
  s.collective = c;
  s.group = CommGroup::kEp;
  s.group_size = size;
  s.stride = stride;
  s.bytes = bytes;
  return s;
}
}  // namespace

TEST_SUITE("cost") {
  TEST_CASE("ring all-gather time equals the alpha-beta form") {
    // H200 profile: all_gather ring over 8 GPUs measured at one size (361.4 GB/s busbw at 16 GiB); latency is
    // NCCL's NVLink per-step constant times n-1 steps. t = 7 * lat + bytes * 7/8 / busbw. The profile's sweep
    // over sizes at 8 ranks is left out here: with only the single point, it prices every size.
    auto p = load("h200-sxm");
    auto& cs = p.hw.calibration.collectives;
    std::erase_if(cs, [](const auto& c) {
      return c.collective == Collective::kAllGather && c.scope == Scope::kIntraNode && c.points.size() > 1;
    });
    const cost::CostModel cm(p.hw, p.stack);
    const double lat = p.hw.node.nvlink_latency_s.value;
    double busbw = 0;
    for (const auto& c : cs) {
      if (c.collective == Collective::kAllGather && c.scope == Scope::kIntraNode && c.ranks == 8)
        busbw = c.points.back().second;
    }
    REQUIRE(busbw > 0);
    for (double bytes : {1.0 * kMiB, 64.0 * kMiB, 1.0 * kGiB}) {
      const double t = cm.collective_seconds(spec(Collective::kAllGather, 8, 1, bytes), nullptr, nullptr);
      CHECK(t == doctest::Approx(7 * lat + bytes * 7.0 / 8.0 / busbw));
      CHECK(t == doctest::Approx(cost::alpha_beta_seconds(Collective::kAllGather, 8, bytes, 7 * lat, busbw)));
    }
  }

  TEST_CASE("one large-message point prices only messages at least its size where a sweep exists") {
    // H200 all_gather over 8 GPUs: a sweep 512 B - 512 MiB (G8) and the ring measured once at 16 GiB (361.4
    // GB/s busbw). Below 16 GiB the sweep alone prices (its 335 GB/s at 512 MiB is slower than the single
    // point's alpha-beta line there); from 16 GiB on the faster of the two does.
    const auto p = load("h200-sxm");
    const cost::CostModel full(p.hw, p.stack);
    auto sweep_only = p;
    std::erase_if(sweep_only.hw.calibration.collectives, [](const auto& c) {
      return c.collective == Collective::kAllGather && c.scope == Scope::kIntraNode && c.points.size() == 1;
    });
    const cost::CostModel swept(sweep_only.hw, sweep_only.stack);
    const double lat = p.hw.node.nvlink_latency_s.value, busbw = 361.4e9;
    for (double bytes : {1.0 * kMiB, 64.0 * kMiB, 512.0 * kMiB}) {
      const double t = full.collective_seconds(spec(Collective::kAllGather, 8, 1, bytes), nullptr, nullptr);
      CHECK(t == doctest::Approx(
                     swept.collective_seconds(spec(Collective::kAllGather, 8, 1, bytes), nullptr, nullptr)));
      CHECK(t > cost::alpha_beta_seconds(Collective::kAllGather, 8, bytes, 7 * lat, busbw));
    }
    const double big = 16.0 * kGiB;
    CHECK(full.collective_seconds(spec(Collective::kAllGather, 8, 1, big), nullptr, nullptr) ==
          doctest::Approx(cost::alpha_beta_seconds(Collective::kAllGather, 8, big, 7 * lat, busbw)));
  }

  TEST_CASE("the alpha-beta fit recovers latency and bandwidth from exact data") {
    // t = 20 us + bytes * 2(n-1)/n / 400 GB/s over 8 ranks, sampled as nccl-tests busbw.
    std::vector<std::pair<double, double>> pts;
    for (double b = 1024; b <= 8.0 * kGiB; b *= 4) {
      const double t = 20e-6 + b * 1.75 / 400e9;
      pts.emplace_back(b, b * 1.75 / t);
    }
    const auto fit = cost::fit_alpha_beta(Collective::kAllReduce, 8, pts);
    CHECK(fit.alpha_s == doctest::Approx(20e-6).epsilon(1e-6));
    CHECK(fit.busbw_bytes_per_s == doctest::Approx(400e9).epsilon(1e-6));
    CHECK(fit.max_rel_error < 1e-9);
  }

  TEST_CASE("groups are placed on nodes from rank order") {
    CHECK(cost::place_group(8, 1, 8).nodes == 1);  // tp = 8 innermost: one node
    CHECK(cost::place_group(4, 8, 8).nodes == 4);  // a group strided by a whole node: one rank per node
    const auto p = cost::place_group(8, 2, 8);     // stride 2: 4 per node, 2 nodes
    CHECK(p.per_node == 4);
    CHECK(p.nodes == 2);
    CHECK(cost::place_group(64, 1, 8).nodes == 8);
  }

  TEST_CASE("NVLS all-reduce beats the ring on 8 GPUs for large messages") {
    const auto p = load("h100-sxm");
    const cost::CostModel cm(p.hw, p.stack);
    const double bytes = 4.0 * kGiB;
    const double t = cm.collective_seconds(spec(Collective::kAllReduce, 8, 1, bytes), nullptr, nullptr);
    const double busbw = bytes * 1.75 / t;
    CHECK(busbw > 400e9);  // above the ~370 GB/s ring ceiling (hopper-hardware.md §2.2, §2.3)
  }

  TEST_CASE("all-to-all across nodes is capped by one NIC per GPU") {
    for (const char* hw : {"h100-sxm", "h800-sxm", "h200-sxm"}) {
      CAPTURE(hw);
      const auto p = load(hw);
      const cost::CostModel cm(p.hw, p.stack);
      for (int32_t n : {16, 32, 64, 256}) {
        const double bytes = 256.0 * kMiB;
        const double t = cm.collective_seconds(spec(Collective::kAllToAll, n, 1, bytes), nullptr, nullptr);
        // The (n-8)/n of the message leaving the node cannot beat one NIC's line rate.
        const double bound = bytes * static_cast<double>(n - 8) / static_cast<double>(n) /
                             p.hw.scale_out.nic_bw_bytes_per_s.value;
        CHECK(t >= bound);
        CHECK(t < 3 * bound);
      }
    }
  }

  TEST_CASE("an all-reduce over one rank per node runs at that rank's NIC, not at a whole-node curve") {
    // H100 profile: its inter-node all-reduce curves are over whole nodes (8 ranks per node). A group with
    // one rank on each of two nodes (stride 8: Megatron's embedding group between pipeline stages, a DP
    // group under tp 8) moves 2 (n-1)/n = 1 x its bytes through each rank's own 47 GB/s NIC: the ring's
    // closed form, the hierarchical model with g = 1. Over whole nodes the measured curve still prices it,
    // far faster.
    const auto p = load("h100-sxm");
    const cost::CostModel cm(p.hw, p.stack);
    const double bytes = 1.0 * kGiB;
    const double nic = p.hw.scale_out.nic_bw_achieved_bytes_per_s.value;
    const double lat = 2.0 * p.hw.scale_out.net_latency_s.value;
    const double t = cm.collective_seconds(spec(Collective::kAllReduce, 2, 8, bytes), nullptr, nullptr);
    CHECK(t == doctest::Approx(lat + bytes / nic).scale(0));
    const double t4 = cm.collective_seconds(spec(Collective::kAllReduce, 4, 8, bytes), nullptr, nullptr);
    CHECK(t4 == doctest::Approx(3.0 * lat + bytes * 1.5 / nic).scale(0));
    const double whole = cm.collective_seconds(spec(Collective::kAllReduce, 32, 1, bytes), nullptr, nullptr);
    CHECK(whole < t / 3);
  }

  TEST_CASE("H800's NVLink makes intra-node collectives slower than H100's") {
    const auto a = load("h100-sxm"), b = load("h800-sxm");
    const cost::CostModel ca(a.hw, a.stack), cb(b.hw, b.stack);
    for (Collective c : {Collective::kAllGather, Collective::kReduceScatter, Collective::kAllToAll}) {
      const double ta = ca.collective_seconds(spec(c, 8, 1, 256.0 * kMiB), nullptr, nullptr);
      const double tb = cb.collective_seconds(spec(c, 8, 1, 256.0 * kMiB), nullptr, nullptr);
      CHECK(tb > 1.8 * ta);
    }
  }

  TEST_CASE(
      "a hot receiver's slowdown is read from the all-to-all-v table, interpolated and held at its ends") {
    // Two sizes, 1 MiB and 4 MiB per rank, hot factors 1, 2 and 4:
    //   1 MiB: 100, 150, 300 us -> slowdown 1, 1.5, 3;  4 MiB: 200, 400, 800 us -> 1, 2, 4.
    AllToAllSkewTable t;
    t.ranks = 8;
    const auto mib = static_cast<int64_t>(kMiB);
    t.points = {{mib, 1, 100e-6},     {mib, 2, 150e-6},     {mib, 4, 300e-6},
                {4 * mib, 1, 200e-6}, {4 * mib, 2, 400e-6}, {4 * mib, 4, 800e-6}};
    auto at = [&](double bytes, double hot) { return cost::hot_receiver_slowdown(t, bytes, hot).value(); };
    CHECK(at(kMiB, 1).factor == 1.0);
    CHECK(at(kMiB, 2).factor == doctest::Approx(1.5));
    CHECK(at(kMiB, 3).factor == doctest::Approx(2.25));  // halfway between 1.5 and 3
    CHECK(at(4 * kMiB, 3).factor == doctest::Approx(3.0));
    CHECK_FALSE(at(4 * kMiB, 3).extrapolated);
    // 2 MiB is halfway in log bytes: at hot 2, (1.5 + 2) / 2.
    CHECK(at(2 * kMiB, 2).factor == doctest::Approx(1.75));
    CHECK_FALSE(at(2 * kMiB, 2).extrapolated);
    // Beyond the largest hot factor the extra bytes scale the time linearly: 4 MiB x8 -> 4 x 8 / 4.
    CHECK(at(4 * kMiB, 8).factor == doctest::Approx(8.0));
    CHECK(at(4 * kMiB, 8).extrapolated);
    // Outside the sizes: the nearest size's slowdown, marked as extrapolated.
    CHECK(at(64 * kMiB, 2).factor == doctest::Approx(2.0));
    CHECK(at(64 * kMiB, 2).extrapolated);
    CHECK(at(1024, 4).factor == doctest::Approx(3.0));
    CHECK(at(1024, 4).extrapolated);
    // A hot receiver measured faster than the uniform exchange (noise) counts as no slowdown.
    t.points[1].seconds = 90e-6;
    CHECK(at(kMiB, 2).factor == 1.0);
    // Sizes without a uniform row are not read; a table with none gives nothing.
    t.points = {{mib, 2, 150e-6}, {mib, 4, 300e-6}};
    CHECK_FALSE(cost::hot_receiver_slowdown(t, kMiB, 2).has_value());
  }

  TEST_CASE(
      "a routed all-to-all is priced at the mean rank's bytes times the measured slowdown of its group") {
    // h100-sxm, 8 ranks on one node, 16 MiB per rank on average and the busiest rank at 2x: without a table,
    // a uniform all-to-all of the busiest 32 MiB; with a table measuring 1.25x at hot factor 2 for this
    // group, 1.25 x the uniform 16 MiB one. A table for another group shape, or a plain exchange, changes
    // nothing.
    auto p = load("h100-sxm");
    const double b = 16.0 * kMiB;
    CommSpec hot = spec(Collective::kAllToAll, 8, 1, 2 * b);
    hot.hot_factor = 2.0;
    const CommSpec uniform = spec(Collective::kAllToAll, 8, 1, b);
    const double before = cost::CostModel(p.hw, p.stack).collective_seconds(hot, nullptr, nullptr);
    CHECK(before == doctest::Approx(
                        cost::CostModel(p.hw, p.stack)
                            .collective_seconds(spec(Collective::kAllToAll, 8, 1, 2 * b), nullptr, nullptr)));
    AllToAllSkewTable t;
    t.ranks = 8;
    t.points = {{static_cast<int64_t>(b), 1, 100e-6}, {static_cast<int64_t>(b), 2, 125e-6}};
    AllToAllSkewTable other = t;
    other.ranks = 4;
    other.points[1].seconds = 400e-6;
    p.hw.calibration.alltoall_skew = {other, t};
    const cost::CostModel cm(p.hw, p.stack);
    CHECK(cm.collective_seconds(hot, nullptr, nullptr) ==
          doctest::Approx(1.25 * cm.collective_seconds(uniform, nullptr, nullptr)));
    CHECK(cm.collective_seconds(uniform, nullptr, nullptr) ==
          doctest::Approx(
              cost::CostModel(load("h100-sxm").hw, p.stack).collective_seconds(uniform, nullptr, nullptr)));
    CommSpec across = hot;  // 8 ranks a node apart: 8 nodes, no table
    across.stride = 8;
    CommSpec across_plain = across;
    across_plain.hot_factor = 1.0;
    CHECK(cm.collective_seconds(across, nullptr, nullptr) ==
          doctest::Approx(cm.collective_seconds(across_plain, nullptr, nullptr)));
  }

  TEST_CASE("node-deduplicated dispatch sends fewer bytes over the NIC") {
    // DeepSeek-V3 on 8 nodes: 256 experts, top-8. Plain: 8*7/8 = 7 copies leave the node; dedup: at most 7.
    const double s = moeplan::dedup_nic_scale(256, 8, 8);
    CHECK(s < 1.0);
    CHECK(s > 0.5);
    CHECK(moeplan::dedup_nic_scale(256, 8, 1) == 1.0);
  }
}
