// Deterministic init, synthetic tokens, shard layouts and Adam.
#include <doctest/doctest.h>

#include "executor/kernels/cpu/kernels.h"
#include "tests/executor/kernels/cpu/test_util.h"

namespace moeplan::executor::cpu::test {
namespace {

TEST_CASE("hashes: FNV-1a and splitmix64 reference values") {
  CHECK(fnv1a64("") == 0xcbf29ce484222325ULL);
  CHECK(fnv1a64("a") == 0xaf63dc4c8601ec8cULL);
  CHECK(splitmix64(0) == 0xe220a8397b1dcdafULL);
  CHECK(param_id("L0.qkv") != param_id("L1.qkv"));
}

TEST_CASE("init: normal values of std 0.02, identical whatever the block a rank asks for") {
  MatF full(64, 48);
  init_block<float>(full, 7, "L3.expert5.fc13", 0, 0);
  const double mean = static_cast<double>(full.mean());
  const double var = static_cast<double>((full.array() - full.mean()).square().mean());
  CHECK(std::abs(mean) < 0.002);
  CHECK(std::sqrt(var) == doctest::Approx(0.02).epsilon(0.05));
  MatF block(10, 7);
  init_block<float>(block, 7, "L3.expert5.fc13", 20, 30);
  CHECK(block == full.block(20, 30, 10, 7));
  const std::vector<int64_t> cols{47, 3, 11};
  MatF scattered(64, 3);
  init_columns<float>(scattered, 7, "L3.expert5.fc13", 0, cols);
  CHECK(scattered == gather_columns<float>(full, cols));
  MatF other(64, 48);
  init_block<float>(other, 8, "L3.expert5.fc13", 0, 0);  // another seed
  CHECK(other != full);
  init_block<float>(other, 7, "L3.expert4.fc13", 0, 0);  // another name
  CHECK(other != full);
  // Many samples: the standard normal's moments.
  double s = 0, s2 = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const double z = init_normal(1, 2, i, 3);
    s += z;
    s2 += z * z;
  }
  CHECK(std::abs(s / n) < 0.01);
  CHECK(s2 / n == doctest::Approx(1.0).epsilon(0.01));
}

TEST_CASE("shard layouts: qkv heads with their kv heads, fc13 gate and up together") {
  // 8 heads, 4 kv heads, head_dim 2: heads [2, 4) use kv head 1.
  const std::vector<int64_t> qkv = qkv_shard_columns(8, 4, 2, 2, 4);
  CHECK(qkv == std::vector<int64_t>{4, 5, 6, 7, 18, 19, 26, 27});
  // Heads [0, 4) of 8 with 2 kv heads: kv head 0 only.
  CHECK(qkv_shard_columns(8, 2, 1, 0, 4) == std::vector<int64_t>{0, 1, 2, 3, 8, 10});
  CHECK(fc13_shard_columns(6, 2, 4) == std::vector<int64_t>{2, 3, 8, 9});
}

TEST_CASE("synthetic tokens: deterministic, in range, target = next position") {
  const std::vector<int64_t> seqs{5, 9};
  const TokenBatch b = synthetic_batch(42, seqs, 8, 512);
  REQUIRE(b.tokens.size() == 16);
  for (size_t i = 0; i < 16; ++i) {
    CHECK(b.tokens[i] >= 0);
    CHECK(b.tokens[i] < 512);
  }
  for (size_t p = 0; p + 1 < 8; ++p) CHECK(b.targets[p] == b.tokens[p + 1]);
  CHECK(b.targets[7] == synthetic_token(42, 5, 8, 512));
  CHECK(b.tokens[8] == synthetic_token(42, 9, 0, 512));
  CHECK(synthetic_batch(42, seqs, 8, 512).tokens == b.tokens);
  CHECK(synthetic_batch(43, seqs, 8, 512).tokens != b.tokens);
}

TEST_CASE("adam: first steps by hand, weight decay, and slices update like the whole") {
  // Step 1: m_hat = g, v_hat = g^2, so p moves by lr * g / (|g| + eps) ~ lr * sign(g).
  std::vector<double> p{1.0, -2.0, 0.5}, g{0.3, -0.1, 0.0}, m(3, 0.0), v(3, 0.0);
  adam_step<double>(p, g, m, v, 1);
  CHECK(p[0] == doctest::Approx(1.0 - 1e-3 * 0.3 / (0.3 + 1e-8)).epsilon(1e-14));
  CHECK(p[1] == doctest::Approx(-2.0 + 1e-3 * 0.1 / (0.1 + 1e-8)).epsilon(1e-14));
  CHECK(p[2] == 0.5);
  // Step 2 with g2: m = 0.9 m1 + 0.1 g2, v = 0.95 v1 + 0.05 g2^2, bias corrections 1 - 0.9^2, 1 - 0.95^2.
  const double p1 = p[0];
  const std::vector<double> g2{-0.2, 0.0, 0.0};
  adam_step<double>(p, g2, m, v, 2);
  const double m2 = 0.9 * 0.03 + 0.1 * -0.2, v2 = 0.95 * 0.05 * 0.09 + 0.05 * 0.04;
  CHECK(p[0] ==
        doctest::Approx(p1 - 1e-3 * (m2 / 0.19) / (std::sqrt(v2 / (1 - 0.9025)) + 1e-8)).epsilon(1e-13));
  // Decoupled weight decay: zero gradient still shrinks the parameter by lr * wd * p.
  std::vector<double> q{2.0}, gz{0.0}, mq{0.0}, vq{0.0};
  AdamConfig cfg;
  cfg.weight_decay = 0.1;
  adam_step<double>(q, gz, mq, vq, 1, cfg);
  CHECK(q[0] == doctest::Approx(2.0 - 1e-3 * 0.1 * 2.0).epsilon(1e-14));
  // ZeRO: updating [0, 5) and [5, 11) separately equals one update of [0, 11), bit for bit.
  std::vector<float> pa(11), ga(11), ma(11, 0.f), va(11, 0.f);
  for (size_t i = 0; i < 11; ++i) {
    pa[i] = static_cast<float>(init_normal(1, 1, static_cast<int64_t>(i), 0));
    ga[i] = static_cast<float>(init_normal(1, 2, static_cast<int64_t>(i), 0));
  }
  std::vector<float> pb = pa, mb = ma, vb = va;
  for (int64_t step = 1; step <= 3; ++step) {
    adam_step<float>(pa, ga, ma, va, step);
    adam_step<float>(std::span<float>(pb).subspan(0, 5), std::span<const float>(ga).subspan(0, 5),
                     std::span<float>(mb).subspan(0, 5), std::span<float>(vb).subspan(0, 5), step);
    adam_step<float>(std::span<float>(pb).subspan(5), std::span<const float>(ga).subspan(5),
                     std::span<float>(mb).subspan(5), std::span<float>(vb).subspan(5), step);
  }
  CHECK(pa == pb);
  CHECK(ma == mb);
  CHECK(va == vb);
}

}  // namespace
}  // namespace moeplan::executor::cpu::test
