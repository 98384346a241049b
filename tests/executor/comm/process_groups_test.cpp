// Process groups without MPI: rank_layout partitions the world into groups of the right sizes, and for every
// communication op the lowering emits, the rank's group of that kind is exactly the lowering's
// {first + i * stride : i < group_size} (pp: the lowering's 2-rank send spans adjacent stages at the same
// stride).
#include "executor/comm/process_groups.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <initializer_list>
#include <map>
#include <set>

#include "simulator/io/model_loader.h"
#include "simulator/workload/lower.h"

namespace moeplan::executor {
namespace {

Plan make_plan(int64_t gpus, int64_t tp, int64_t sp, int64_t cp, int64_t ep, int64_t etp, int64_t pp) {
  Plan p;
  p.model = "tiny-moe";
  p.hardware = "h100-sxm";
  p.gpus = gpus;
  p.seq_len = 64;
  p.global_batch = 32;
  p.micro_batch = 1;
  p.attention = {tp, sp, cp};
  p.experts.ep = ep;
  p.experts.etp = etp;
  p.pipeline.pp = pp;
  p.data.zero = 1;
  return p;
}

// Groups of each kind partition the world; each has the size the plan's degrees give.
void check_partition(const Plan& plan) {
  std::vector<RankLayout> all;
  for (int r = 0; r < plan.gpus; ++r) all.push_back(rank_layout(plan, r));
  const int64_t per_stage = plan.gpus / plan.pipeline.pp;
  const std::map<CommGroup, int64_t> sizes = {{CommGroup::kTp, plan.attention.tp},
                                              {CommGroup::kSp, plan.attention.sp},
                                              {CommGroup::kCp, plan.attention.cp},
                                              {CommGroup::kDp, per_stage / plan.attention_mesh()},
                                              {CommGroup::kAttnReplica, per_stage / plan.attention.tp},
                                              {CommGroup::kEtp, plan.experts.etp},
                                              {CommGroup::kEp, plan.experts.ep},
                                              {CommGroup::kExpertDp, per_stage / plan.expert_mesh()},
                                              {CommGroup::kPp, plan.pipeline.pp}};
  for (CommGroup g : kGroupKinds) {
    CAPTURE(name_of(g));
    std::set<std::vector<int>> groups;
    for (const RankLayout& l : all) {
      const GroupPlace& place = l.of(g);
      CHECK(static_cast<int64_t>(place.members.size()) == sizes.at(g));
      CHECK(place.members[static_cast<size_t>(place.index)] == l.world_rank);
      // Every member sees the same group.
      for (int m : place.members) CHECK(all[static_cast<size_t>(m)].of(g).members == place.members);
      groups.insert(place.members);
    }
    std::vector<int> seen(static_cast<size_t>(plan.gpus), 0);
    for (const auto& members : groups) {
      for (int m : members) ++seen[static_cast<size_t>(m)];
    }
    for (int count : seen) CHECK(count == 1);
    CHECK(static_cast<int64_t>(groups.size()) * sizes.at(g) == plan.gpus);
  }
}

// Every communication op of lower(model, plan): the group of that kind matches the op's size and stride, for
// every world rank (the lowering describes one representative rank; all ranks of a stage are alike).
int check_against_lowering(const Plan& plan) {
  const ModelSpec model = io::load_model("tiny-moe").value();
  const OpGraph graph = lower(model, plan, {});
  int checked = 0;
  for (const Op& op : graph.ops) {
    if (op.comm.group == CommGroup::kNone) continue;
    ++checked;
    for (int r = 0; r < plan.gpus; ++r) {
      const RankLayout layout = rank_layout(plan, r);
      const GroupPlace& place = layout.of(op.comm.group);
      CAPTURE(op_label(op));
      CAPTURE(r);
      const int first = place.members.front();
      if (op.comm.group == CommGroup::kPp) {
        CHECK(op.comm.group_size == 2);
        CHECK(static_cast<int64_t>(place.members.size()) == plan.pipeline.pp);
      } else {
        CHECK(static_cast<int>(place.members.size()) == op.comm.group_size);
      }
      for (size_t i = 0; i < place.members.size(); ++i) {
        CHECK(place.members[i] == first + static_cast<int>(i) * op.comm.stride);
      }
    }
  }
  return checked;
}

bool members_are(const GroupPlace& place, std::initializer_list<int> expected) {
  return std::equal(place.members.begin(), place.members.end(), expected.begin(), expected.end());
}

}  // namespace

TEST_SUITE("executor.comm") {
  TEST_CASE("tp2 dp2 groups partition four ranks as the lowering strides them") {
    const Plan p = make_plan(4, 2, 1, 1, 2, 1, 1);
    check_partition(p);
    CHECK(check_against_lowering(p) > 0);
    const RankLayout l = rank_layout(p, 3);
    CHECK(members_are(l.of(CommGroup::kTp), {2, 3}));
    CHECK(members_are(l.of(CommGroup::kDp), {1, 3}));
    CHECK(l.of(CommGroup::kTp).index == 1);
    CHECK(l.of(CommGroup::kDp).index == 1);
  }

  TEST_CASE("tp2 sp2 cp2 groups match the lowering on eight ranks") {
    const Plan p = make_plan(8, 2, 2, 2, 2, 1, 1);
    check_partition(p);
    CHECK(check_against_lowering(p) > 0);
    const RankLayout l = rank_layout(p, 5);  // tp 1, sp 0, cp 1
    CHECK(members_are(l.of(CommGroup::kSp), {5, 7}));
    CHECK(members_are(l.of(CommGroup::kCp), {1, 5}));
    CHECK(members_are(l.of(CommGroup::kAttnReplica), {1, 3, 5, 7}));
  }

  TEST_CASE("ep4 etp2 pp2 groups match the lowering on sixteen ranks") {
    const Plan p = make_plan(16, 1, 1, 1, 4, 2, 2);
    check_partition(p);
    CHECK(check_against_lowering(p) > 0);
    const RankLayout l = rank_layout(p, 11);  // stage 1, local 3: etp 1, ep 1
    CHECK(l.stage == 1);
    CHECK(members_are(l.of(CommGroup::kEtp), {10, 11}));
    CHECK(members_are(l.of(CommGroup::kEp), {9, 11, 13, 15}));
    CHECK(members_are(l.of(CommGroup::kPp), {3, 11}));
    CHECK(l.of(CommGroup::kDp).members.size() == 8);
  }

  TEST_CASE("a sixteen-rank mix of every dimension matches the lowering including bf16 gradient all-to-all") {
    Plan p = make_plan(16, 2, 1, 2, 2, 2, 2);
    p.compression.grad_sync = GradSync::kBf16AllToAll;
    p.experts.dispatch = Dispatch::kAllGather;
    check_partition(p);
    CHECK(check_against_lowering(p) > 0);
    const RankLayout l = rank_layout(p, 13);  // stage 1, local 5: tp 1, cp 0, dp 1; etp 1, ep 0, edp 1
    CHECK(members_are(l.of(CommGroup::kDp), {9, 13}));
    CHECK(members_are(l.of(CommGroup::kExpertDp), {9, 13}));
    CHECK(members_are(l.of(CommGroup::kEp), {13, 15}));
  }

  TEST_CASE("a plan whose meshes do not divide the world is refused with a reason") {
    CHECK(layout_error(make_plan(4, 2, 1, 1, 2, 1, 1), 4).empty());
    CHECK(layout_error(make_plan(4, 2, 1, 1, 2, 1, 1), 8).find("mpirun -n 4") != std::string::npos);
    CHECK(layout_error(make_plan(6, 4, 1, 1, 2, 1, 1), 6).find("attention") != std::string::npos);
    CHECK(layout_error(make_plan(6, 1, 1, 1, 4, 1, 1), 6).find("experts") != std::string::npos);
  }
}

TEST_SUITE("executor.comm: one GPU per local rank") {
  TEST_CASE("a node showing enough devices gives each local rank its own") {
    for (int r = 0; r < 8; ++r) {
      const Result<int> d = device_for_rank({r, 8}, 8);
      REQUIRE(d);
      CHECK(d.value() == r);
    }
    CHECK(device_for_rank({3, 4}, 8).value() == 3);  // fewer ranks than GPUs: the first four
  }
  TEST_CASE("a launcher that binds one GPU per task shows each rank device 0") {
    CHECK(device_for_rank({5, 8}, 1).value() == 0);
  }
  TEST_CASE("more ranks than devices on a node is refused with both counts") {
    const Result<int> d = device_for_rank({2, 8}, 4);
    REQUIRE_FALSE(d);
    CHECK(d.error().message.find("8 ranks on this node but 4 visible CUDA devices") != std::string::npos);
  }
  TEST_CASE("two local ranks on one PCI bus id are named, and distinct ids pass") {
    CHECK(shared_device_error({"0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0"}).empty());
    const std::string e = shared_device_error({"0000:18:00.0", "0000:2a:00.0", "0000:18:00.0"});
    CHECK(e.find("local ranks 0 and 2") != std::string::npos);
    CHECK(e.find("0000:18:00.0") != std::string::npos);
  }
}

}  // namespace moeplan::executor
