// The plan's NCCL groups under mpiexec, one GPU per rank: every group has rank_layout's members, and a sum
// and a variable all-to-all over it move exactly its members' data. Needs as many CUDA devices as ranks
// (NCCL refuses two ranks on one device); with fewer, every rank prints the skip line and passes.
#include <doctest/doctest.h>
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <thread>
#include <utility>
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

// This rank and the world size; false (after the skip line) unless each rank has a device, which it then
// selects.
bool on_own_device(int& rank, int& size) {
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (!enough_devices(size)) return false;
  MOERUN_CUDA_CHECK(cudaSetDevice(rank));
  return true;
}

Plan small_plan(int gpus) {
  Plan p;
  p.gpus = gpus;
  p.seq_len = 64;
  p.global_batch = 16;
  return p;
}

}  // namespace

TEST_SUITE("gpu") {
  TEST_CASE("NCCL groups of a plan sum and exchange exactly their members' data") {
    int rank = 0, size = 0;
    if (!on_own_device(rank, size)) return;
    Plan p = small_plan(size);
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

  TEST_CASE("each directed pipeline link carries its sender's messages in order while the other link runs") {
    int rank = 0, size = 0;
    if (!on_own_device(rank, size)) return;
    Plan p = small_plan(size);
    p.pipeline.pp = size;
    const RankLayout layout = rank_layout(p, rank);
    std::vector<std::pair<int, int>> links;
    for (int s = 0; s + 1 < size; ++s) links.insert(links.end(), {{s, s + 1}, {s + 1, s}});
    std::sort(links.begin(), links.end());
    auto made = make_nccl_groups(layout, MPI_COMM_WORLD, links);
    REQUIRE_MESSAGE(made.ok(), (made.ok() ? "" : made.error().message));
    NcclGroups& groups = made.value();
    const int stage = layout.stage;
    for (const auto& [from, to] : links) {
      NcclCommunicator* c = groups.link(from, to);
      const bool end = stage == from || stage == to;
      REQUIRE((c != nullptr) == end);
      if (end) CHECK(c->rank() == (stage == from ? 0 : 1));
    }
    // Each rank sends three messages to each neighbour (value: 100 x sender + index) from one thread and
    // receives its neighbours' on another, each on its own stream, as the CUDA replay's lanes do.
    constexpr int kMessages = 3;
    constexpr size_t kCount = 1024;
    std::vector<int> peers;
    if (stage > 0) peers.push_back(stage - 1);
    if (stage + 1 < size) peers.push_back(stage + 1);
    std::vector<std::vector<float>> got(peers.size());
    auto sender = [&] {
      cudaStream_t s = nullptr;
      MOERUN_CUDA_CHECK(cudaStreamCreate(&s));
      std::vector<DeviceBuffer<float>> bufs;
      bufs.reserve(static_cast<size_t>(kMessages) * peers.size());
      for (int i = 0; i < kMessages; ++i) {
        for (int peer : peers) {
          bufs.emplace_back(kCount);
          const std::vector<float> v(kCount, static_cast<float>(100 * stage + i));
          bufs.back().upload(v.data(), kCount);
          groups.link(stage, peer)->send(bufs.back().data(), kCount, DType::kFp32, 1, s);
        }
      }
      MOERUN_CUDA_CHECK(cudaStreamSynchronize(s));
      MOERUN_CUDA_CHECK(cudaStreamDestroy(s));
    };
    auto receiver = [&](size_t k) {
      cudaStream_t s = nullptr;
      MOERUN_CUDA_CHECK(cudaStreamCreate(&s));
      DeviceBuffer<float> buf(kCount);
      for (int i = 0; i < kMessages; ++i) {
        groups.link(peers[k], stage)->recv(buf.data(), kCount, DType::kFp32, 0, s);
        MOERUN_CUDA_CHECK(cudaStreamSynchronize(s));
        got[k].push_back(buf.to_host()[kCount - 1]);
      }
      MOERUN_CUDA_CHECK(cudaStreamDestroy(s));
    };
    std::vector<std::thread> threads;
    threads.emplace_back(sender);
    for (size_t k = 0; k < peers.size(); ++k) threads.emplace_back(receiver, k);
    for (std::thread& t : threads) t.join();
    for (size_t k = 0; k < peers.size(); ++k) {
      std::vector<float> want;
      for (int i = 0; i < kMessages; ++i) want.push_back(static_cast<float>(100 * peers[k] + i));
      CHECK(got[k] == want);
    }
  }
}

}  // namespace moeplan::executor
