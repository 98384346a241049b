// NCCL communicators of a plan's groups (see nccl_groups.h).
#include "executor/comm/nccl_groups.h"

#include "executor/comm/mpi_check.h"

#include <fmt/format.h>

namespace moeplan::executor {

NcclCommunicator& NcclGroups::of(CommGroup g) {
  if (g == CommGroup::kNone) return *world_;
  return *groups_[static_cast<size_t>(g)];
}

NcclCommunicator* NcclGroups::link(int from, int to) {
  const auto it = links_.find({from, to});
  return it == links_.end() ? nullptr : it->second.get();
}

void NcclGroups::abort_all() {
  for (auto& [ends, l] : links_)
    if (l) l->abort();
  for (auto& g : groups_)
    if (g) g->abort();
  if (world_) world_->abort();
}

Result<NcclGroups> make_nccl_groups(const RankLayout& layout, MPI_Comm world,
                                    std::span<const std::pair<int, int>> links) {
  int rank = 0, size = 0;
  MOEPLAN_MPI_CHECK(MPI_Comm_rank(world, &rank));
  MOEPLAN_MPI_CHECK(MPI_Comm_size(world, &size));
  ncclUniqueId id{};
  int ok = 1;
  if (rank == 0) {
    Result<ncclUniqueId> made = nccl_unique_id();
    ok = made ? 1 : 0;
    if (made) id = made.value();
  }
  MOEPLAN_MPI_CHECK(MPI_Bcast(&ok, 1, MPI_INT, 0, world));
  if (!ok) return Error{"ncclGetUniqueId failed on world rank 0"};
  MOEPLAN_MPI_CHECK(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, world));
  NcclGroups groups;
  std::vector<int> all(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) all[static_cast<size_t>(r)] = r;
  auto w = NcclCommunicator::init(id, size, rank, group_name("world", all));
  if (!w) return Error{w.error().message};
  groups.world_ = std::move(w.value());
  for (CommGroup g : kGroupKinds) {
    const GroupPlace& place = layout.of(g);
    auto c = groups.world_->split(place.members.front(), place.index, group_name(name_of(g), place.members));
    if (!c) return Error{c.error().message};
    MOEPLAN_ASSERT(c.value()->rank() == place.index &&
                   c.value()->size() == static_cast<int>(place.members.size()));
    groups.groups_[static_cast<size_t>(g)] = std::move(c.value());
  }
  // The pipeline group's rank is the stage: every rank of the group takes part in every link's split.
  const GroupPlace& pp = layout.of(CommGroup::kPp);
  MOEPLAN_ASSERT(pp.index == layout.stage);
  for (const auto& [from, to] : links) {
    MOEPLAN_ASSERT(from != to && from >= 0 && to >= 0 && from < static_cast<int>(pp.members.size()) &&
                   to < static_cast<int>(pp.members.size()));
    const bool end = layout.stage == from || layout.stage == to;
    const std::vector<int> ends = {pp.members[static_cast<size_t>(from)],
                                   pp.members[static_cast<size_t>(to)]};
    auto c = groups.of(CommGroup::kPp)
                 .split(end ? 0 : NCCL_SPLIT_NOCOLOR, layout.stage == from ? 0 : 1,
                        group_name(fmt::format("pp{}->{}", from, to), ends));
    if (!c) return Error{c.error().message};
    if (!end) continue;
    MOEPLAN_ASSERT(c.value() != nullptr && c.value()->size() == 2 &&
                   c.value()->rank() == (layout.stage == from ? 0 : 1));
    groups.links_[{from, to}] = std::move(c.value());
  }
  return groups;
}

}  // namespace moeplan::executor
