// Tests of the watchdog (executor/runtime/watchdog.h).
#include "executor/runtime/watchdog.h"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace moeplan::executor {

TEST_SUITE("executor_runtime") {
  TEST_CASE("the watchdog names the slot busy past its timeout, once") {
    std::atomic<int> fired{0};
    std::string what;
    std::mutex m;
    {
      Watchdog w(0.05, 2, [&](const std::string& s, double timeout) {
        std::lock_guard<std::mutex> lock(m);
        what = s;
        CHECK(timeout == doctest::Approx(0.05));
        fired.fetch_add(1);
      });
      w.begin(0, [] { return std::string("op quick (stage 0, micro-batch 0)"); });
      w.end(0);
      w.begin(1, [] { return std::string("op L1.moe_dispatch (stage 0, micro-batch 3)"); });
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
    CHECK(fired.load() == 1);
    CHECK(what == "op L1.moe_dispatch (stage 0, micro-batch 3)");
  }

  TEST_CASE("the watchdog stays quiet while work ends within the timeout") {
    std::atomic<int> fired{0};
    {
      Watchdog w(0.2, 1, [&](const std::string&, double) { fired.fetch_add(1); });
      for (int i = 0; i < 10; ++i) {
        w.begin(0, [] { return std::string("op"); });
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        w.end(0);
      }
    }
    CHECK(fired.load() == 0);
  }
}

}  // namespace moeplan::executor
