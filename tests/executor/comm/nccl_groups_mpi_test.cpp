// The plan's NCCL groups under mpiexec, one GPU per rank: every group has rank_layout's members, and a sum
// and a variable all-to-all over it move exactly its members' data. Needs as many CUDA devices as ranks
// (NCCL refuses two ranks on one device); with fewer, every rank prints the skip line and passes.
#include <doctest/doctest.h>
#include <mpi.h>

#include <cstdio>
#include <vector>

#include "executor/comm/nccl_groups.h"
#include "executor/kernels/cuda/check.h"

namespace moeplan::executor {
namespace {

using cuda::DeviceBuffer;

bool enough_devices(int ranks) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    n = 0;
  }
  if (n >= ranks) return true;
  std::printf("skipped: no CUDA device for each of the %d ranks (%d found)\n", ranks, n);
  return false;
}

}  // namespace

TEST_SUITE("gpu") {
  TEST_CASE("NCCL groups of a plan sum and exchange exactly their members' data") {
    int rank = 0, size = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (!enough_devices(size)) return;
    MOERUN_CUDA_CHECK(cudaSetDevice(rank));
    Plan p;
    p.gpus = size;
    p.seq_len = 64;
    p.global_batch = 16;
    p.experts.ep = size;
    if (size % 2 == 0) p.attention.tp = 2;
    const RankLayout layout = rank_layout(p, rank);
    auto made = make_nccl_groups(layout, MPI_COMM_WORLD);
    REQUIRE_MESSAGE(made.ok(), (made.ok() ? "" : made.error().message));
    NcclGroups& groups = made.value();
    cudaStream_t stream = nullptr;
    MOERUN_CUDA_CHECK(cudaStreamCreate(&stream));
    for (CommGroup g : {CommGroup::kTp, CommGroup::kEp, CommGroup::kDp}) {
      NcclCommunicator& c = groups.of(g);
      const GroupPlace& place = layout.of(g);
      CHECK(c.size() == static_cast<int>(place.members.size()));
      CHECK(c.rank() == place.index);
      // Sum of world ranks over the group.
      DeviceBuffer<float> v(4);
      const std::vector<float> mine(4, static_cast<float>(rank));
      v.upload(mine.data(), 4);
      c.all_reduce(v.data(), 4, DType::kFp32, stream);
      MOERUN_CUDA_CHECK(cudaStreamSynchronize(stream));
      float want = 0;
      for (int m : place.members) want += static_cast<float>(m);
      CHECK(v.to_host() == std::vector<float>(4, want));
      // Peer q receives q + 1 values from each rank, all equal to the sender's world rank.
      std::vector<int64_t> send(static_cast<size_t>(c.size())), recv(send.size(), c.rank() + 1);
      std::vector<float> payload;
      for (int q = 0; q < c.size(); ++q) {
        send[static_cast<size_t>(q)] = q + 1;
        payload.insert(payload.end(), static_cast<size_t>(q + 1), static_cast<float>(rank));
      }
      DeviceBuffer<float> in(payload.size()), out(static_cast<size_t>(c.size() * (c.rank() + 1)));
      in.upload(payload.data(), payload.size());
      out.poison();
      c.all_to_all_v(in.data(), send, out.data(), recv, DType::kFp32, stream);
      MOERUN_CUDA_CHECK(cudaStreamSynchronize(stream));
      std::vector<float> expect;
      for (int m : place.members)
        expect.insert(expect.end(), static_cast<size_t>(c.rank() + 1), static_cast<float>(m));
      CHECK(out.to_host() == expect);
    }
    MOERUN_CUDA_CHECK(cudaStreamDestroy(stream));
  }
}

}  // namespace moeplan::executor
