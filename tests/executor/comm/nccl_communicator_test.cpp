// NcclCommunicator on one rank: every collective of a one-rank world is the identity, which checks the calls,
// types, counts and the a2a's segment walk on a single GPU (NCCL refuses two ranks on one device; the
// two-rank test is nccl_groups_mpi_test.cpp). Without a device, setup fails with an error, not a crash.
#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "executor/comm/nccl_communicator.h"
#include "executor/kernels/cuda/check.h"

namespace {

using moeplan::DType;
using moeplan::cuda::DeviceBuffer;
using moeplan::executor::nccl_unique_id;
using moeplan::executor::NcclCommunicator;

std::vector<float> random_values(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

}  // namespace

TEST_SUITE("gpu") {
  TEST_CASE("an NCCL unique id is made from host sockets alone") {
    CHECK(nccl_unique_id().ok());
  }

  TEST_CASE("without a device the NCCL world fails with an error naming the call") {
    if (moeplan::cuda::device_unavailable().empty()) return;  // a device answers: the next case covers it
    auto id = nccl_unique_id();
    REQUIRE(id.ok());
    auto world = NcclCommunicator::init(id.value(), 1, 0, "world[0]");
    REQUIRE_FALSE(world.ok());
    CHECK(world.error().message.find("ncclCommInitRank") != std::string::npos);
  }

  TEST_CASE("every collective of a one-rank NCCL world and its split is the identity") {
    MOERUN_SKIP_WITHOUT_DEVICE();
    auto id = nccl_unique_id();
    REQUIRE(id.ok());
    auto made = NcclCommunicator::init(id.value(), 1, 0, "world[0]");
    REQUIRE_MESSAGE(made.ok(), (made.ok() ? "" : made.error().message));
    NcclCommunicator& world = *made.value();
    CHECK(world.size() == 1);
    CHECK(world.rank() == 0);
    auto split = world.split(0, 0, "ep[0]");
    REQUIRE_MESSAGE(split.ok(), (split.ok() ? "" : split.error().message));

    cudaStream_t stream = nullptr;
    MOERUN_CUDA_CHECK(cudaStreamCreate(&stream));
    const size_t n = 3 * 1000 + 7;
    const std::vector<float> x = random_values(n, 1);
    for (NcclCommunicator* c : {&world, split.value().get()}) {
      DeviceBuffer<float> a(n), out(n);
      a.upload(x.data(), n);
      c->all_reduce(a.data(), n, DType::kFp32, stream);
      out.poison();
      c->all_gather(a.data(), out.data(), n, DType::kFp32, stream);
      MOERUN_CUDA_CHECK(cudaStreamSynchronize(stream));
      CHECK(a.to_host() == x);
      CHECK(out.to_host() == x);
      out.poison();
      c->reduce_scatter(a.data(), out.data(), n, DType::kFp32, stream);
      MOERUN_CUDA_CHECK(cudaStreamSynchronize(stream));
      CHECK(out.to_host() == x);
      // bf16 as raw halves: the identity must hold bit for bit.
      out.poison();
      const std::vector<int64_t> counts{static_cast<int64_t>(2 * n)};
      c->all_to_all_v(a.data(), counts, out.data(), counts, DType::kBf16, stream);
      MOERUN_CUDA_CHECK(cudaStreamSynchronize(stream));
      CHECK(out.to_host() == x);
      CHECK(c->async_error().empty());
    }
    MOERUN_CUDA_CHECK(cudaStreamDestroy(stream));
  }
}
