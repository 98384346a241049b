// Rank layout of a plan's process groups and their MPI communicators (see process_groups.h).
#include "executor/comm/process_groups.h"

#include <fmt/format.h>

#include "executor/comm/mpi_check.h"

namespace moeplan::executor {
namespace {

struct SizeStride {
  int64_t size = 1;
  int64_t stride = 1;
};

SizeStride size_stride(const Plan& p, CommGroup g) {
  const int64_t tp = p.attention.tp, sp = p.attention.sp, cp = p.attention.cp;
  const int64_t ep = p.experts.ep, etp = p.experts.etp;
  const int64_t per_stage = p.gpus / p.pipeline.pp;
  const int64_t dp = per_stage / (tp * sp * cp);
  switch (g) {
    case CommGroup::kTp:
      return {tp, 1};
    case CommGroup::kSp:
      return {sp, tp};
    case CommGroup::kCp:
      return {cp, tp * sp};
    case CommGroup::kDp:
      return {dp, tp * sp * cp};
    case CommGroup::kAttnReplica:
      return {sp * cp * dp, tp};
    case CommGroup::kEtp:
      return {etp, 1};
    case CommGroup::kEp:
      return {ep, etp};
    case CommGroup::kExpertDp:
      return {per_stage / (ep * etp), ep * etp};
    case CommGroup::kPp:
      return {p.pipeline.pp, per_stage};
    case CommGroup::kNone:
      return {1, 1};
  }
  return {1, 1};
}

}  // namespace

std::string layout_error(const Plan& plan, int world_size) {
  if (plan.gpus != world_size) {
    return fmt::format("the plan needs {} ranks but the job has {} (start it with mpirun -n {})", plan.gpus,
                       world_size, plan.gpus);
  }
  const int64_t pp = plan.pipeline.pp;
  if (pp < 1 || plan.gpus % pp != 0) return fmt::format("pp = {} does not divide {} ranks", pp, plan.gpus);
  const int64_t per_stage = plan.gpus / pp;
  if (plan.attention_mesh() < 1 || per_stage % plan.attention_mesh() != 0) {
    return fmt::format("attention tp x sp x cp = {} does not divide the {} ranks of a stage",
                       plan.attention_mesh(), per_stage);
  }
  if (plan.expert_mesh() < 1 || per_stage % plan.expert_mesh() != 0) {
    return fmt::format("experts ep x etp = {} does not divide the {} ranks of a stage", plan.expert_mesh(),
                       per_stage);
  }
  return {};
}

RankLayout rank_layout(const Plan& plan, int world_rank) {
  MOEPLAN_ASSERT(layout_error(plan, static_cast<int>(plan.gpus)).empty());
  MOEPLAN_ASSERT(world_rank >= 0 && world_rank < plan.gpus);
  RankLayout layout;
  layout.world_rank = world_rank;
  layout.stage = static_cast<int>(world_rank / plan.gpus_per_stage());
  layout.groups[static_cast<size_t>(CommGroup::kNone)] = {0, {world_rank}};
  for (CommGroup g : kGroupKinds) {
    // Every group is one digit range of the mixed-radix rank: members differ only in (rank / stride) % size.
    const auto [size, stride] = size_stride(plan, g);
    const int64_t index = (world_rank / stride) % size;
    const int64_t first = world_rank - index * stride;
    GroupPlace& place = layout.groups[static_cast<size_t>(g)];
    place.index = static_cast<int>(index);
    for (int64_t i = 0; i < size; ++i) place.members.push_back(static_cast<int>(first + i * stride));
  }
  return layout;
}

Communicator& ProcessGroups::of(CommGroup g) {
  if (g == CommGroup::kNone) return *world_;
  return *groups_[static_cast<size_t>(g)];
}

Communicator& ProcessGroups::world() {
  return *world_;
}

Communicator& ProcessGroups::internal(CommGroup g) {
  return *internal_[static_cast<size_t>(g)];
}

NodePlace node_place(MPI_Comm world) {
  int world_rank = 0;
  MOEPLAN_MPI_CHECK(MPI_Comm_rank(world, &world_rank));
  MPI_Comm node = MPI_COMM_NULL;
  MOEPLAN_MPI_CHECK(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, world_rank, MPI_INFO_NULL, &node));
  NodePlace place;
  MOEPLAN_MPI_CHECK(MPI_Comm_rank(node, &place.local_rank));
  MOEPLAN_MPI_CHECK(MPI_Comm_size(node, &place.local_size));
  MOEPLAN_MPI_CHECK(MPI_Comm_free(&node));
  return place;
}

Result<int> device_for_rank(NodePlace place, int visible_devices) {
  if (visible_devices >= place.local_size) return place.local_rank;
  if (visible_devices == 1) return 0;
  return Error{fmt::format(
      "{} ranks on this node but {} visible CUDA devices: start one rank per GPU (e.g. --ntasks-per-node={})",
      place.local_size, visible_devices, visible_devices)};
}

std::string shared_device_error(const std::vector<std::string>& bus_ids) {
  for (size_t i = 0; i < bus_ids.size(); ++i) {
    for (size_t j = i + 1; j < bus_ids.size(); ++j) {
      if (bus_ids[i] == bus_ids[j]) {
        return fmt::format(
            "local ranks {} and {} both use the GPU at PCI bus id {}: --backend cuda needs one GPU per rank "
            "(bind one GPU per task, or start no more ranks per node than it has GPUs)",
            i, j, bus_ids[i]);
      }
    }
  }
  return "";
}

Result<ProcessGroups> make_process_groups(const Plan& plan, MPI_Comm world) {
  int rank = 0, size = 0;
  MOEPLAN_MPI_CHECK(MPI_Comm_rank(world, &rank));
  MOEPLAN_MPI_CHECK(MPI_Comm_size(world, &size));
  if (std::string why = layout_error(plan, size); !why.empty()) return Error{why};
  ProcessGroups groups;
  groups.layout_ = rank_layout(plan, rank);
  std::vector<int> all(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) all[static_cast<size_t>(r)] = r;
  MPI_Comm dup = MPI_COMM_NULL;
  MOEPLAN_MPI_CHECK(MPI_Comm_dup(world, &dup));
  groups.world_ = std::make_unique<MpiCommunicator>(dup, group_name("world", all));
  for (CommGroup g : kGroupKinds) {
    const GroupPlace& place = groups.layout_.of(g);
    // Color: the group's first world rank (unique per group); key: the rank within the group.
    MPI_Comm comm = MPI_COMM_NULL;
    MOEPLAN_MPI_CHECK(MPI_Comm_split(world, place.members.front(), place.index, &comm));
    auto c = std::make_unique<MpiCommunicator>(comm, group_name(name_of(g), place.members));
    MOEPLAN_ASSERT(c->rank() == place.index && c->size() == static_cast<int>(place.members.size()));
    groups.groups_[static_cast<size_t>(g)] = std::move(c);
  }
  for (size_t g = 0; g < groups.internal_.size(); ++g) {
    const MpiCommunicator& of =
        g == static_cast<size_t>(CommGroup::kNone) ? *groups.world_ : *groups.groups_[g];
    MPI_Comm twin = MPI_COMM_NULL;
    MOEPLAN_MPI_CHECK(MPI_Comm_dup(of.comm(), &twin));
    groups.internal_[g] = std::make_unique<MpiCommunicator>(twin, of.name() + ".internal");
  }
  return groups;
}

}  // namespace moeplan::executor
