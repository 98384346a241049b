// GemmGrid (simulator/cost/gemm_grid.h) in closed form: a table that is the full product of its m, n and k
// values reads back every measured shape exactly and interpolates log(time) linearly in log m, log n and
// log k between them; anything else is not a grid, and shapes outside it are not priced by it.
#include <doctest/doctest.h>

#include <cmath>

#include "simulator/cost/gemm_grid.h"

using namespace moeplan;

namespace {

// Seconds of the toy library at (m, n, k): a power law, which log-log interpolation reproduces exactly.
double toy_seconds(double m, double n, double k) {
  return 1e-6 * std::pow(m / 128, 0.9) * std::pow(n / 256, 0.8) * std::pow(k / 256, 0.7);
}

GemmTable toy_table() {
  GemmTable t;
  t.dtype = "bf16";
  for (int64_t m : {128, 512, 2048}) {
    for (int64_t n : {256, 1024}) {
      for (int64_t k : {256, 4096}) {
        const double s = toy_seconds(static_cast<double>(m), static_cast<double>(n), static_cast<double>(k));
        t.points.push_back({m, n, k, 2.0 * static_cast<double>(m * n * k) / s});
      }
    }
  }
  return t;
}

doctest::Approx rel(double value) {
  return doctest::Approx(value).scale(0);
}

}  // namespace

TEST_SUITE("cost") {
  TEST_CASE("a GEMM grid reads back each measured shape and interpolates a power law exactly") {
    const auto g = cost::GemmGrid::from_table(toy_table());
    REQUIRE(g.has_value());
    CHECK(g->points() == 12);
    CHECK(g->seconds(512, 1024, 256).value() == rel(toy_seconds(512, 1024, 256)));
    CHECK(g->seconds(128, 256, 4096).value() == rel(toy_seconds(128, 256, 4096)));
    // Between the measured values in all three dimensions at once.
    CHECK(g->seconds(300, 500, 1000).value() == rel(toy_seconds(300, 500, 1000)));
    CHECK(g->seconds(2048, 1024, 4096).value() == rel(toy_seconds(2048, 1024, 4096)));
  }

  TEST_CASE("a GEMM grid prices nothing outside its measured ranges") {
    const auto g = cost::GemmGrid::from_table(toy_table());
    REQUIRE(g.has_value());
    CHECK_FALSE(g->seconds(64, 512, 1024).has_value());
    CHECK_FALSE(g->seconds(4096, 512, 1024).has_value());
    CHECK_FALSE(g->seconds(512, 2048, 1024).has_value());
    CHECK_FALSE(g->seconds(512, 512, 128).has_value());
  }

  TEST_CASE("a table that is not the full product of its m, n and k values is not a grid") {
    GemmTable missing = toy_table();
    missing.points.pop_back();
    CHECK_FALSE(cost::GemmGrid::from_table(missing).has_value());
    GemmTable repeated = toy_table();
    repeated.points.back() = repeated.points.front();
    CHECK_FALSE(cost::GemmGrid::from_table(repeated).has_value());
    GemmTable one_k;
    one_k.dtype = "bf16";
    for (int64_t m : {128, 512}) {
      for (int64_t n : {256, 1024}) one_k.points.push_back({m, n, 1024, 1e12});
    }
    CHECK_FALSE(cost::GemmGrid::from_table(one_k).has_value());
  }

  TEST_CASE("leaving a row count out predicts it from its two neighbours along m") {
    const auto g = cost::GemmGrid::from_table(toy_table());
    REQUIRE(g.has_value());
    // m = 512 between 128 and 2048: log(512/128) / log(2048/128) = 1/2 of the way, on a power law exact.
    CHECK(g->seconds_without(1, 1, 0).value() == rel(toy_seconds(512, 1024, 256)));
    CHECK(g->measured_seconds(1, 1, 0) == rel(toy_seconds(512, 1024, 256)));
    CHECK_FALSE(g->seconds_without(0, 0, 0).has_value());
    CHECK_FALSE(g->seconds_without(2, 0, 0).has_value());
  }
}
