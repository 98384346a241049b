// parallel_for: every index runs exactly once, whatever the thread count, and nothing runs for none.
#include <doctest/doctest.h>

#include <atomic>
#include <vector>

#include "simulator/core/parallel.h"

using namespace moeplan;

TEST_SUITE("core") {
  TEST_CASE("parallel_for runs each index once on any number of threads") {
    for (int threads : {1, 2, 3, 8}) {
      for (size_t n : {0UL, 1UL, 2UL, 3UL, 100UL}) {
        CAPTURE(threads);
        CAPTURE(n);
        std::vector<std::atomic<int>> runs(n);
        parallel_for(n, threads, [&](size_t i) { ++runs[i]; });
        for (size_t i = 0; i < n; ++i) CHECK(runs[i] == 1);
      }
    }
  }
}
