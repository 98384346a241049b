// Wire formats: exact round-to-nearest-even cases, e4m3 range and saturation, NaN/Inf policy, the packed
// layout and the error bounds the executor's equivalence tests rely on.
#include "executor/comm/wire_format.h"

#include <doctest/doctest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace moeplan::executor {
namespace {

float bf16_round(float x) {
  return float_from_bf16(bf16_from_float(x));
}

}  // namespace

TEST_SUITE("executor.comm") {
  TEST_CASE("bf16 rounds to nearest with ties to even") {
    CHECK(bf16_from_float(1.0f) == 0x3f80);
    // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1).
    CHECK(bf16_from_float(1.0f + 0x1p-8f) == 0x3f80);
    // 1 + 3 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even).
    CHECK(bf16_from_float(1.0f + 3 * 0x1p-8f) == 0x3f82);
    // Just above the tie rounds up.
    CHECK(bf16_from_float(1.0f + 0x1p-8f + 0x1p-20f) == 0x3f81);
    CHECK(bf16_from_float(-2.0f) == 0xc000);
    // A carry into the exponent: the largest mantissa rounds up to the next power of two.
    CHECK(bf16_round(2.0f - 0x1p-20f) == 2.0f);
  }

  TEST_CASE("bf16 keeps subnormals infinities and NaN and overflows to infinity") {
    CHECK(bf16_from_float(0x1p-133f) == 0x0001);  // smallest bf16 subnormal, exact
    CHECK(bf16_from_float(0x1p-149f) == 0x0000);  // below half of it: rounds to zero
    CHECK(bf16_round(0x1p-133f + 0x1p-149f) == 0x1p-133f);
    CHECK(bf16_from_float(std::numeric_limits<float>::infinity()) == 0x7f80);
    CHECK(bf16_from_float(-std::numeric_limits<float>::infinity()) == 0xff80);
    CHECK(bf16_from_float(FLT_MAX) == 0x7f80);  // rounds past the largest bf16
    CHECK(std::isnan(bf16_round(std::numeric_limits<float>::quiet_NaN())));
    CHECK(std::signbit(bf16_round(-0.0f)));
  }

  TEST_CASE("bf16 relative error stays within 2^-8 and is really there") {
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> mant(1.0f, 2.0f);  // with expo: normal numbers only
    std::uniform_int_distribution<int> expo(-125, 120);
    double worst = 0.0;
    for (int i = 0; i < 100000; ++i) {
      const float x = std::ldexp(mant(rng), expo(rng));
      if (x == 0.0f) continue;
      const double err = std::fabs(static_cast<double>(bf16_round(x)) - static_cast<double>(x)) /
                         std::fabs(static_cast<double>(x));
      worst = std::max(worst, err);
    }
    CHECK(worst <= kBf16RelativeError);
    CHECK(worst > kBf16RelativeError / 2);  // the bound is tight, not vacuous
    CHECK(relative_error_bound(WireFormat::kBf16) == kBf16RelativeError);
    // Below the normal range the bound is absolute: half the subnormal spacing 2^-133.
    for (int i = 0; i < 10000; ++i) {
      const float x = std::ldexp(mant(rng), -127 - i % 20);
      CHECK(std::fabs(static_cast<double>(bf16_round(x)) - static_cast<double>(x)) <= 0x1p-134);
    }
  }

  TEST_CASE("e4m3 encodes its range exactly and saturates above 448") {
    CHECK(e4m3_from_float(1.0f) == 0x38);
    CHECK(e4m3_from_float(448.0f) == 0x7e);
    CHECK(float_from_e4m3(0x7e) == 448.0f);
    CHECK(e4m3_from_float(449.0f) == 0x7e);
    CHECK(e4m3_from_float(1e9f) == 0x7e);
    CHECK(e4m3_from_float(-1e9f) == 0xfe);
    CHECK(e4m3_from_float(std::numeric_limits<float>::infinity()) == 0x7e);
    CHECK(e4m3_from_float(-std::numeric_limits<float>::infinity()) == 0xfe);
    CHECK(e4m3_from_float(std::numeric_limits<float>::quiet_NaN()) == 0x7f);
    CHECK(std::isnan(float_from_e4m3(0x7f)));
    CHECK(std::isnan(float_from_e4m3(0xff)));
    // Every finite code decodes and encodes back to itself.
    for (int b = 0; b < 256; ++b) {
      if ((b & 0x7f) == 0x7f) continue;
      CHECK(e4m3_from_float(float_from_e4m3(static_cast<uint8_t>(b))) == b);
    }
  }

  TEST_CASE("e4m3 rounds ties to even in the normal and subnormal ranges") {
    CHECK(e4m3_from_float(1.0625f) == 0x38);  // between 1 (even) and 1.125: 1
    CHECK(e4m3_from_float(1.1875f) == 0x3a);  // between 1.125 (odd) and 1.25 (even): 1.25
    CHECK(e4m3_from_float(0x1p-6f) == 0x08);  // smallest normal
    CHECK(e4m3_from_float(0x1p-9f) == 0x01);  // smallest subnormal
    CHECK(float_from_e4m3(0x01) == 0x1p-9f);
    CHECK(e4m3_from_float(0x1p-10f) == 0x00);       // tie between 0 (even) and 2^-9
    CHECK(e4m3_from_float(3 * 0x1p-10f) == 0x02);   // tie between 1 and 2 units: 2
    CHECK(e4m3_from_float(15 * 0x1p-10f) == 0x08);  // tie between 7 units and the smallest normal (even)
    CHECK(e4m3_from_float(-0.0f) == 0x80);
  }

  TEST_CASE("e4m3 relative error stays within 2^-4 in the normal range") {
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> u(0x1p-6f, 448.0f);
    double worst = 0.0;
    for (int i = 0; i < 100000; ++i) {
      const float x = u(rng);
      const double err =
          std::fabs(static_cast<double>(float_from_e4m3(e4m3_from_float(x))) - static_cast<double>(x)) /
          static_cast<double>(x);
      worst = std::max(worst, err);
    }
    CHECK(worst <= kE4m3RelativeError);
    CHECK(worst > kE4m3RelativeError / 2);
  }

  TEST_CASE("packed sizes follow the wire layout") {
    CHECK(wire_bytes(WireFormat::kFp32, 10) == 40);
    CHECK(wire_bytes(WireFormat::kBf16, 10) == 20);
    CHECK(wire_bytes(WireFormat::kFp8E4m3, 0) == 0);
    CHECK(wire_bytes(WireFormat::kFp8E4m3, 128) == 132);
    CHECK(wire_bytes(WireFormat::kFp8E4m3, 300) == 312);  // 3 blocks: 3 scales + 300 codes
  }

  TEST_CASE("fp8 packing scales each block of 128 by amax over 448 and meets its error bound") {
    const int n = 300;  // two full blocks and a partial one
    std::vector<float> x(n);
    std::mt19937 rng(3);
    std::normal_distribution<float> g(0.0f, 1.0f);
    for (int i = 0; i < n; ++i) x[static_cast<size_t>(i)] = g(rng) * (i < 128 ? 1000.0f : 0.01f);
    x[5] = 896.0f * 4.0f;  // this block's amax: scale 8
    std::vector<std::byte> wire(static_cast<size_t>(wire_bytes(WireFormat::kFp8E4m3, n)));
    pack(WireFormat::kFp8E4m3, x, wire);
    float scale0 = 0.0f;
    std::memcpy(&scale0, wire.data(), 4);
    CHECK(scale0 == 8.0f);
    std::vector<float> y(n);
    unpack(WireFormat::kFp8E4m3, wire, y);
    CHECK(y[5] == x[5]);  // amax maps to 448 exactly
    std::vector<float> z = x;
    round_trip(WireFormat::kFp8E4m3, z);
    bool exact_somewhere_not = false;
    for (size_t b = 0; b < 3; ++b) {
      const size_t begin = b * 128, end = std::min<size_t>(n, begin + 128);
      const float scale = e4m3_block_scale(std::span(x).subspan(begin, end - begin));
      for (size_t i = begin; i < end; ++i) {
        CHECK(std::memcmp(&y[i], &z[i], 4) == 0);  // round_trip == pack + unpack, bit for bit
        const double bound = std::max(kE4m3RelativeError * std::fabs(static_cast<double>(x[i])),
                                      kE4m3SubnormalAbsError * static_cast<double>(scale)) *
                             (1.0 + 0x1p-22);  // + the fp32 rounding of code * scale
        CHECK(std::fabs(static_cast<double>(y[i]) - static_cast<double>(x[i])) <= bound);
        exact_somewhere_not |= y[i] != x[i];
      }
    }
    CHECK(exact_somewhere_not);
  }

  TEST_CASE("fp8 packing saturates infinities keeps NaN and uses scale 1 for an all-zero block") {
    std::vector<float> x = {1.0f, -2.0f, std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN()};
    round_trip(WireFormat::kFp8E4m3, x);
    // scale = 2 / 448 from the finite values; decoding multiplies by it in fp32 (one rounding).
    CHECK(x[0] == doctest::Approx(1.0).epsilon(1e-6));
    CHECK(x[1] == doctest::Approx(-2.0).epsilon(1e-6));
    CHECK(x[2] == doctest::Approx(2.0).epsilon(1e-6));  // +Inf saturates to 448 * scale
    CHECK(std::isnan(x[3]));
    std::vector<float> zeros(5, 0.0f);
    CHECK(e4m3_block_scale(zeros) == 1.0f);
    round_trip(WireFormat::kFp8E4m3, zeros);
    CHECK(zeros[4] == 0.0f);
  }

  TEST_CASE("bf16 packing is two bytes per value and fp32 packing is exact") {
    const std::vector<float> x = {1.0f + 0x1p-8f + 0x1p-20f, 3.14159265f, -1e-30f};
    std::vector<std::byte> wire(6);
    pack(WireFormat::kBf16, x, wire);
    std::vector<float> y(3);
    unpack(WireFormat::kBf16, wire, y);
    for (size_t i = 0; i < 3; ++i) CHECK(y[i] == bf16_round(x[i]));
    CHECK(y[1] != x[1]);
    std::vector<std::byte> raw(12);
    pack(WireFormat::kFp32, x, raw);
    unpack(WireFormat::kFp32, raw, y);
    CHECK(y == x);
  }
}

}  // namespace moeplan::executor
