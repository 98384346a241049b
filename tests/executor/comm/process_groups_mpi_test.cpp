// Process groups under mpiexec: for a plan sized to the job, every group's communicator has the members, rank
// and name rank_layout gives, and a collective over it sums exactly its members.
#include <doctest/doctest.h>
#include <mpi.h>

#include <numeric>

#include "executor/comm/process_groups.h"

namespace moeplan::executor {
namespace {

// A plan using as many dimensions as the world size allows.
Plan plan_for(int world) {
  Plan p;
  p.gpus = world;
  p.seq_len = 64;
  p.global_batch = 16;
  if (world % 8 == 0) {
    p.pipeline.pp = 2;  // 4 per stage: tp2 x dp2; etp2 x ep2
    p.attention.tp = 2;
    p.experts.ep = 2;
    p.experts.etp = 2;
  } else if (world % 4 == 0) {
    p.attention.tp = 2;  // tp2 x cp2; ep4
    p.attention.cp = 2;
    p.experts.ep = 4;
  } else if (world % 2 == 0) {
    p.attention.tp = 2;
    p.experts.ep = 2;
  } else {
    p.experts.ep = world;  // dp = world
  }
  return p;
}

}  // namespace

TEST_SUITE("executor.comm.mpi") {
  TEST_CASE("process groups built for a plan on this many ranks match rank_layout") {
    int world = 0, me = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    const Plan plan = plan_for(world);
    auto made = make_process_groups(plan, MPI_COMM_WORLD);
    REQUIRE(made.ok());
    ProcessGroups& groups = made.value();
    const RankLayout expected = rank_layout(plan, me);
    CHECK(groups.world().size() == world);
    for (CommGroup g : kGroupKinds) {
      CAPTURE(name_of(g));
      Communicator& c = groups.of(g);
      const GroupPlace& place = expected.of(g);
      CHECK(c.size() == static_cast<int>(place.members.size()));
      CHECK(c.rank() == place.index);
      CHECK(c.name() == group_name(name_of(g), place.members));
      // all_gather of world ranks lists the members in group order; all_reduce sums them.
      const std::vector<float> mine = {static_cast<float>(me)};
      std::vector<float> all(static_cast<size_t>(c.size()));
      c.all_gather(mine, all, WireFormat::kFp32);
      std::vector<float> members(place.members.begin(), place.members.end());
      CHECK(all == members);
      std::vector<float> sum = mine;
      c.all_reduce(sum, WireFormat::kFp32);
      CHECK(sum[0] == std::accumulate(members.begin(), members.end(), 0.0f));
    }
  }

  TEST_CASE("process groups refuse a plan for another world size") {
    int world = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    Plan plan = plan_for(world);
    plan.gpus = world + 1;
    auto made = make_process_groups(plan, MPI_COMM_WORLD);
    REQUIRE_FALSE(made.ok());
    CHECK(made.error().message.find("ranks") != std::string::npos);
  }
}

TEST_SUITE("executor.comm.mpi") {
  TEST_CASE("node_place: the ranks of one host are its local ranks 0..n-1, in world-rank order") {
    int rank = 0, world = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    const NodePlace place = node_place(MPI_COMM_WORLD);
    // mpiexec here starts every rank on this machine.
    CHECK(place.local_size == world);
    CHECK(place.local_rank == rank);
  }
}

}  // namespace moeplan::executor
