// Tests of the MOERUN_FAULT test hook's parser (executor/runtime/fault.h).
#include "executor/runtime/fault.h"

#include <doctest/doctest.h>

namespace moeplan::executor {

TEST_SUITE("executor_runtime") {
  TEST_CASE("MOERUN_FAULT parses crash, hang and slow with a rank, an op label and slow's delay") {
    auto none = parse_fault(nullptr);
    REQUIRE(none);
    CHECK(!none.value().has_value());
    auto crash = parse_fault("crash:rank=1:op=L1.moe_dispatch");
    REQUIRE(crash);
    REQUIRE(crash.value().has_value());
    CHECK(crash.value()->kind == Fault::Kind::kCrash);
    CHECK(crash.value()->rank == 1);
    CHECK(crash.value()->op == "L1.moe_dispatch");
    auto hang = parse_fault("hang:rank=12:op=grad_rs");
    REQUIRE(hang);
    CHECK(hang.value()->kind == Fault::Kind::kHang);
    CHECK(hang.value()->rank == 12);
    auto slow = parse_fault("slow:rank=3:op=L0.expert_fc13:us=2500");
    REQUIRE(slow);
    REQUIRE(slow.value().has_value());
    CHECK(slow.value()->kind == Fault::Kind::kSlow);
    CHECK(slow.value()->rank == 3);
    CHECK(slow.value()->op == "L0.expert_fc13");
    CHECK(slow.value()->delay_us == 2500);
  }

  TEST_CASE("a malformed MOERUN_FAULT is an error naming the variable") {
    for (const char* bad :
         {"crash", "boom:rank=1:op=x", "crash:rank=x:op=a", "hang:rank=1:op=", "hang:rank=-1:op=a",
          "slow:rank=1:op=a", "slow:rank=1:op=a:us=", "slow:rank=1:op=a:us=0", "slow:rank=1:op=a:us=5x",
          "slow:rank=1:op=:us=5"}) {
      auto f = parse_fault(bad);
      CHECK_MESSAGE(!f, bad);
      if (!f) CHECK(f.error().message.rfind("MOERUN_FAULT:", 0) == 0);
    }
  }
}

}  // namespace moeplan::executor
