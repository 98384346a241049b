// The CUDA runtime and NCCL are linked and answer; devices are listed when a driver is present.
#include <doctest/doctest.h>

#include <cstdio>

#include "executor/cuda/device_query.h"

TEST_SUITE("gpu") {
  TEST_CASE("the CUDA runtime and NCCL report their versions with or without a device") {
    const auto q = moeplan::cuda::query_devices();
    CHECK(q.runtime_version >= 12000);
    CHECK(q.nccl_version >= 22800);
  }

  TEST_CASE("every visible device is a GPU with SMs and memory") {
    const auto q = moeplan::cuda::query_devices();
    if (q.devices.empty()) {
      std::printf("skipped: no CUDA device (%s)\n", q.unavailable_reason.c_str());
      return;
    }
    for (const auto& d : q.devices) {
      CHECK(d.sm_count > 0);
      CHECK(d.memory_bytes > 0);
      CHECK(d.sm_major >= 7);
    }
  }
}
