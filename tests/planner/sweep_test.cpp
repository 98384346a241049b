// Sweep keys: parsing (unknown keys with a suggestion, malformed values), what each key changes in the model,
// hardware, job or plan (bandwidth factors reach the cost model, latencies stay), and the rows of a sweep
// (a fixed pipeline plan gains throughput with batch; an illegal value is a row with a reason).
#include <doctest/doctest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "planner/sweep.h"
#include "simulator/cost/collective.h"
#include "simulator/cost/cost_model.h"
#include "simulator/io/hardware_loader.h"
#include "simulator/io/model_loader.h"
#include "simulator/io/stack_loader.h"

using namespace moeplan;
using nlohmann::json;

namespace {

const HardwareProfile& h100() {
  static const HardwareProfile hw = io::load_hardware("h100-sxm").value();
  return hw;
}

const StackProfile& moerun() {
  static const StackProfile s = io::load_stack("moerun").value();
  return s;
}

CommSpec comm(Collective c, int32_t ranks, double bytes) {
  CommSpec s;
  s.collective = c;
  s.group_size = ranks;
  s.stride = 1;
  s.bytes = bytes;
  return s;
}

double seconds(const HardwareProfile& hw, const CommSpec& c) {
  const cost::CostModel cm(hw, moerun());
  return cm.collective_seconds(c, nullptr, nullptr);
}

// tiny-moe (4 layers, 8 experts) on one H100 node, two pipeline stages, EP over 4 GPUs.
planner::SweepCase tiny_pipeline_case() {
  planner::SweepCase c;
  c.model = io::load_model("tiny-moe").value();
  c.hw = h100();
  c.stack = moerun();
  Plan p;
  p.model = "tiny-moe";
  p.hardware = "h100-sxm";
  p.gpus = 8;
  p.seq_len = 512;
  p.global_batch = 8;
  p.experts.ep = 4;
  p.pipeline.pp = 2;
  c.plan = p;
  return c;
}

}  // namespace

TEST_SUITE("planner") {
  TEST_CASE("nic_bw=2 doubles the bandwidth the cost model uses across nodes and keeps latencies") {
    const HardwareProfile& hw = h100();
    const HardwareProfile fast = planner::scale_nic_bandwidth(hw, 2.0);
    const cost::CostModel cm(hw, moerun()), cm2(fast, moerun());
    CHECK(cm2.nic_bytes_per_s_per_gpu() == doctest::Approx(2 * cm.nic_bytes_per_s_per_gpu()));
    CHECK(fast.scale_out.nic_bw_bytes_per_s.value ==
          doctest::Approx(2 * hw.scale_out.nic_bw_bytes_per_s.value));

    // Every measured inter-node curve: twice the fitted bus bandwidth, the same fitted latency.
    int inter_curves = 0;
    for (size_t i = 0; i < hw.calibration.collectives.size(); ++i) {
      const CollectiveCurve& a = hw.calibration.collectives[i];
      const CollectiveCurve& b = fast.calibration.collectives[i];
      if (a.scope != Scope::kInterNode) {
        CHECK(a.points == b.points);
        continue;
      }
      ++inter_curves;
      const cost::AlphaBetaFit fa = cost::fit_alpha_beta(a.collective, a.ranks, a.points);
      const cost::AlphaBetaFit fb = cost::fit_alpha_beta(b.collective, b.ranks, b.points);
      CHECK(fb.busbw_bytes_per_s == doctest::Approx(2 * fa.busbw_bytes_per_s).epsilon(0.03));
      CHECK(fb.alpha_s == doctest::Approx(fa.alpha_s).epsilon(0.05));
    }
    CHECK(inter_curves > 0);

    // All-to-all over 4 nodes (32 ranks, 1 GiB): t = net latency * (nodes - 1) + off-node bytes / (NIC * eff)
    // while NVLink is the faster path, so the part after the latency halves.
    const double lat = hw.scale_out.net_latency_s.value * 3;
    const CommSpec a2a = comm(Collective::kAllToAll, 32, 1 << 30);
    CHECK(seconds(fast, a2a) - lat == doctest::Approx((seconds(hw, a2a) - lat) / 2).epsilon(1e-9));
    // A large inter-node all-reduce (measured curve): bandwidth-bound, so about half the time.
    const CommSpec ar = comm(Collective::kAllReduce, 32, 4.0 * (1 << 30));
    CHECK(seconds(fast, ar) / seconds(hw, ar) == doctest::Approx(0.5).epsilon(0.03));
    // Inside a node nothing changes.
    const CommSpec intra = comm(Collective::kAllReduce, 8, 1 << 28);
    CHECK(seconds(fast, intra) == seconds(hw, intra));
  }

  TEST_CASE("nvlink_bw scales intra-node collectives only, and nics_per_node scales the NIC per GPU") {
    const HardwareProfile& hw = h100();
    const HardwareProfile slow = planner::scale_nvlink_bandwidth(hw, 0.5);
    CHECK(slow.node.nvlink_bw_achieved_bytes_per_s.value ==
          doctest::Approx(0.5 * hw.node.nvlink_bw_achieved_bytes_per_s.value));
    const CommSpec intra = comm(Collective::kAllReduce, 8, 4.0 * (1 << 30));
    CHECK(seconds(slow, intra) / seconds(hw, intra) == doctest::Approx(2.0).epsilon(0.03));
    const CommSpec a2a_intra = comm(Collective::kAllToAll, 8, 1 << 30);
    CHECK(seconds(slow, a2a_intra) > 1.9 * seconds(hw, a2a_intra));
    const CommSpec ar = comm(Collective::kAllReduce, 32, 4.0 * (1 << 30));
    CHECK(seconds(slow, ar) == seconds(hw, ar));  // measured inter-node curve: untouched

    const HardwareProfile half = planner::with_nics_per_node(hw, hw.scale_out.nics_per_node.value / 2);
    const cost::CostModel cm(hw, moerun()), cm2(half, moerun());
    CHECK(cm2.nic_bytes_per_s_per_gpu() == doctest::Approx(cm.nic_bytes_per_s_per_gpu() / 2));
    CHECK(seconds(half, ar) / seconds(hw, ar) == doctest::Approx(2.0).epsilon(0.03));
  }

  TEST_CASE("parse_vary rejects unknown keys with a suggestion and malformed values") {
    Result<planner::Vary> typo = planner::parse_vary("nic_bwx=1,2", false);
    REQUIRE_FALSE(typo.ok());
    CHECK(typo.error().message.find("did you mean 'nic_bw'") != std::string::npos);
    Result<planner::Vary> plan_typo = planner::parse_vary("experts.epp=2", false);
    REQUIRE_FALSE(plan_typo.ok());
    CHECK(plan_typo.error().message.find("did you mean 'experts.ep'") != std::string::npos);
    for (const char* bad : {"gpus", "gpus=", "=8", "gpus=8,x", "gpus=8,,16", "gpus=0", "gpus=2.5",
                            "nic_bw=-1", "nic_bw=fast", "nic_bw=inf", "experts.ep=abc",
                            "experts.dispatch=sideways", "overlap.inter_op=maybe", "model=mixtral-8x7b"}) {
      CAPTURE(bad);
      CHECK_FALSE(planner::parse_vary(bad, false).ok());
    }
    CHECK_FALSE(planner::parse_vary("routing.capacity_factor=1.25", false).ok());
    CHECK(planner::parse_vary("routing.capacity_factor=1.25", true).ok());

    const Result<planner::Vary> v = planner::parse_vary("experts.dispatch=all_gather,all_to_all", false);
    REQUIRE(v.ok());
    CHECK(v.value().key == "experts.dispatch");
    CHECK(v.value().values == std::vector<json>{"all_gather", "all_to_all"});
    const Result<planner::Vary> f = planner::parse_vary("nic_bw=0.5,1,2", false);
    REQUIRE(f.ok());
    CHECK(f.value().values == std::vector<json>{0.5, 1.0, 2.0});
    const Result<planner::Vary> n = planner::parse_vary("gpus=8,16", false);
    REQUIRE(n.ok());
    CHECK(n.value().values == std::vector<json>{8, 16});
  }

  TEST_CASE("apply_vary changes the model, the job or the plan, and reports values that cannot apply") {
    planner::SweepCase base = tiny_pipeline_case();
    // Model keys: top-k and the number of routed experts, each expert keeping its size.
    Result<planner::SweepCase> k = planner::apply_vary(base, "top_k", 4);
    REQUIRE(k.ok());
    CHECK(k.value().model.moe.top_k == 4);
    Result<planner::SweepCase> e = planner::apply_vary(base, "experts", 16);
    REQUIRE(e.ok());
    CHECK(e.value().model.moe.num_experts == 16);
    CHECK(e.value().model.moe.expert_ffn == base.model.moe.expert_ffn);
    Result<planner::SweepCase> too_many = planner::apply_vary(base, "top_k", 9);
    REQUIRE_FALSE(too_many.ok());
    CHECK(too_many.error().message.find("exceeds the 8 routed experts") != std::string::npos);

    // Job keys set the fixed plan's fields; plan keys set the plan.
    Result<planner::SweepCase> g = planner::apply_vary(base, "gpus", 16);
    REQUIRE(g.ok());
    CHECK(g.value().plan->gpus == 16);
    Result<planner::SweepCase> ep = planner::apply_vary(base, "experts.ep", 8);
    REQUIRE(ep.ok());
    CHECK(ep.value().plan->experts.ep == 8);
    // Optional plan fields are keys too: where FP8 pads the experts' rows, MLA's down-projection layout.
    Result<planner::SweepCase> pad = planner::apply_vary(base, "experts.fp8_padding", "router");
    REQUIRE(pad.ok());
    CHECK(pad.value().plan->experts.fp8_padding == Fp8Padding::kRouter);
    Result<planner::SweepCase> mla = planner::apply_vary(base, "attention.mla_down_proj", "column_parallel");
    REQUIRE(mla.ok());
    CHECK(mla.value().plan->attention.mla_down_proj == MlaDownProj::kColumnParallel);

    // Without a plan: the job, and a plan key replaces a --fix of the same key.
    base.plan.reset();
    base.space.fixed = {{"experts.ep", 2}, {"pipeline.pp", 2}};
    Result<planner::SweepCase> job = planner::apply_vary(base, "seq_len", 1024);
    REQUIRE(job.ok());
    CHECK(job.value().job.seq_len == 1024);
    Result<planner::SweepCase> pin = planner::apply_vary(base, "experts.ep", 4);
    REQUIRE(pin.ok());
    const auto& fixed = pin.value().space.fixed;
    CHECK(fixed.size() == 2);
    CHECK(std::count(fixed.begin(), fixed.end(), std::pair<std::string, json>{"experts.ep", 4}) == 1);
  }

  TEST_CASE("a fixed pipeline plan swept over the global batch gains tokens/s as the bubble amortises") {
    const planner::SweepCase base = tiny_pipeline_case();
    const Result<planner::Vary> v = planner::parse_vary("global_batch=8,16,32,64,6", true);
    REQUIRE(v.ok());
    const std::vector<planner::SweepRow> rows = planner::sweep(base, v.value(), {});
    REQUIRE(rows.size() == 5);
    for (size_t i = 0; i < 4; ++i) {
      CAPTURE(i);
      REQUIRE(rows[i].has_numbers());
      CHECK(rows[i].reason.empty());
      CHECK(rows[i].plan->global_batch == rows[i].value.get<int64_t>());
      if (i > 0) {
        CHECK(rows[i].prediction.tokens_per_s > rows[i - 1].prediction.tokens_per_s);
        // The bubble's share of the step shrinks as micro-batches are added.
        CHECK(rows[i].prediction.breakdown.bubble / rows[i].prediction.step_time_s <
              rows[i - 1].prediction.breakdown.bubble / rows[i - 1].prediction.step_time_s);
      }
    }
    // 6 sequences over dp 4: the plan becomes illegal, and the row says why instead of aborting.
    CHECK_FALSE(rows[4].has_numbers());
    CHECK(rows[4].reason.find("not divisible by micro_batch*dp") != std::string::npos);
  }

  TEST_CASE("a fixed plan's rows, sharing one fit of the hardware, predict what predict() does alone") {
    const planner::SweepCase base = tiny_pipeline_case();
    for (const char* vary : {"global_batch=8,16", "nvlink_bw=0.5,2", "pipeline.pp=1,2"}) {
      CAPTURE(vary);
      const Result<planner::Vary> v = planner::parse_vary(vary, true);
      REQUIRE(v.ok());
      const std::vector<planner::SweepRow> rows = planner::sweep(base, v.value(), {});
      REQUIRE(rows.size() == 2);
      for (const planner::SweepRow& r : rows) {
        REQUIRE(r.has_numbers());
        const planner::SweepCase c = planner::apply_vary(base, v.value().key, r.value).value();
        const Prediction alone =
            predict(c.model, *c.plan, c.hw, c.stack, workload::uniform_routing(c.model.moe.num_experts));
        CHECK(r.prediction.step_time_s == alone.step_time_s);
        CHECK(r.prediction.tokens_per_s_low == alone.tokens_per_s_low);
        CHECK(r.prediction.tokens_per_s_high == alone.tokens_per_s_high);
        CHECK(r.prediction.memory.total() == alone.memory.total());
      }
      // On one node NVLink carries the plan's traffic: the bandwidth values give different steps.
      if (v.value().key == "nvlink_bw")
        CHECK(rows[0].prediction.step_time_s > rows[1].prediction.step_time_s);
    }
  }

  TEST_CASE("a sweep without a plan re-plans each value with the search") {
    planner::SweepCase base = tiny_pipeline_case();
    base.plan.reset();
    base.job = {8, 512, 32};
    base.space.precisions = {Precision::kBf16};
    base.space.micro_batches = {1};
    base.space.zero_stages = {1};
    base.space.vpps = {1};
    const Result<planner::Vary> v = planner::parse_vary("gpus=8,16,12", false);
    REQUIRE(v.ok());
    const std::vector<planner::SweepRow> rows = planner::sweep(base, v.value(), {});
    REQUIRE(rows.size() == 3);
    for (size_t i = 0; i < 2; ++i) {
      CAPTURE(i);
      REQUIRE(rows[i].has_numbers());
      CHECK(rows[i].plan->gpus == rows[i].value.get<int64_t>());
      CHECK(rows[i].prediction.memory.fits());
    }
    // 12 GPUs are neither whole 8-GPU nodes nor less than one node.
    CHECK_FALSE(rows[2].has_numbers());
    CHECK(rows[2].reason.find("no legal plan") != std::string::npos);
    CHECK(rows[2].reason.find("whole_nodes") != std::string::npos);
  }

  TEST_CASE("gpu_scaling: efficiency against the first row with numbers, the knee before the first drop") {
    auto row = [](int64_t gpus, double per_gpu) {
      planner::SweepRow r;
      r.value = gpus;
      r.plan = Plan{};
      r.prediction.tokens_per_s_per_gpu = per_gpu;
      return r;
    };
    planner::SweepRow none;
    none.value = 4;
    none.reason = "no plan fits";
    const std::vector<planner::SweepRow> rows = {none,        row(8, 100), row(16, 95),
                                                 row(32, 81), row(64, 70), row(128, 85)};
    const planner::GpuScaling g = planner::gpu_scaling(rows);
    CHECK_FALSE(g.efficiency[0].has_value());
    CHECK(*g.efficiency[1] == doctest::Approx(1.0));
    CHECK(*g.efficiency[4] == doctest::Approx(0.70));
    REQUIRE(g.knee.has_value());
    CHECK(*g.knee == 3);  // 32 GPUs: the last before 64 falls under 80 %; a later recovery does not move it
    CHECK(g.knee_in_range);
    const planner::GpuScaling flat = planner::gpu_scaling({row(8, 100), row(16, 99)});
    CHECK(*flat.knee == 1);
    CHECK_FALSE(flat.knee_in_range);
  }
}
