// BF16 and FP8 e4m3 conversions and the packed layouts of wire_format.h.
#include "executor/comm/wire_format.h"

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>

#include "simulator/core/status.h"

namespace moeplan::executor {

double relative_error_bound(WireFormat wire) {
  switch (wire) {
    case WireFormat::kFp32:
      return 0.0;
    case WireFormat::kBf16:
      return kBf16RelativeError;
    case WireFormat::kFp8E4m3:
      return kE4m3RelativeError;
  }
  return 0.0;
}

uint16_t bf16_from_float(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  if (std::isnan(x)) return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // quiet NaN, sign kept
  // Adding 0x7fff plus the lowest kept bit rounds to nearest, ties to even; a carry into the exponent is the
  // correct result (and +-Inf when the largest finite rounds up).
  const uint32_t rounded = bits + 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(rounded >> 16);
}

float float_from_bf16(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

uint8_t e4m3_from_float(float x) {
  const auto sign = static_cast<uint8_t>((std::bit_cast<uint32_t>(x) >> 24) & 0x80u);
  if (std::isnan(x)) return static_cast<uint8_t>(sign | 0x7fu);
  const double a = std::fabs(static_cast<double>(x));
  if (a >= static_cast<double>(kE4m3Max)) return static_cast<uint8_t>(sign | 0x7eu);  // saturate (and +-Inf)
  // nearbyint rounds half to even under the default rounding mode; every product below is exact in double.
  if (a < 0x1p-6) {
    // Subnormal: units of 2^-9; 8 units is the smallest normal, whose code is 0x08 as well.
    return static_cast<uint8_t>(sign | static_cast<uint8_t>(std::nearbyint(a * 0x1p9)));
  }
  int e = 0;
  const double m = std::frexp(a, &e);  // a = m 2^e, m in [0.5, 1)
  int exponent = e - 1;                // a = (2m) 2^exponent, 2m in [1, 2)
  int mantissa = static_cast<int>(std::nearbyint((2.0 * m - 1.0) * 8.0));
  if (mantissa == 8) {
    mantissa = 0;
    ++exponent;
  }
  const int code = std::min(((exponent + 7) << 3) | mantissa, 0x7e);
  return static_cast<uint8_t>(sign | static_cast<uint8_t>(code));
}

float float_from_e4m3(uint8_t b) {
  const int exponent = (b >> 3) & 0xf;
  const int mantissa = b & 0x7;
  const bool negative = (b & 0x80u) != 0;
  if (exponent == 0xf && mantissa == 0x7) {
    return negative ? -std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::quiet_NaN();
  }
  const float v = exponent == 0 ? std::ldexp(static_cast<float>(mantissa), -9)
                                : std::ldexp(1.0f + static_cast<float>(mantissa) / 8.0f, exponent - 7);
  return negative ? -v : v;
}

float e4m3_block_scale(std::span<const float> block) {
  float amax = 0.0f;
  for (float v : block) {
    if (std::isfinite(v)) amax = std::max(amax, std::fabs(v));
  }
  if (amax == 0.0f) return 1.0f;
  return std::max(amax / kE4m3Max, FLT_MIN);
}

int64_t wire_bytes(WireFormat wire, int64_t n) {
  switch (wire) {
    case WireFormat::kFp32:
      return 4 * n;
    case WireFormat::kBf16:
      return 2 * n;
    case WireFormat::kFp8E4m3:
      return n + 4 * ((n + kFp8BlockValues - 1) / kFp8BlockValues);
  }
  return 0;
}

void pack(WireFormat wire, std::span<const float> in, std::span<std::byte> out) {
  const auto n = static_cast<int64_t>(in.size());
  MOEPLAN_ASSERT(static_cast<int64_t>(out.size()) == wire_bytes(wire, n));
  switch (wire) {
    case WireFormat::kFp32:
      if (n > 0) std::memcpy(out.data(), in.data(), in.size_bytes());
      return;
    case WireFormat::kBf16:
      for (size_t i = 0; i < in.size(); ++i) {
        const uint16_t b = bf16_from_float(in[i]);
        std::memcpy(out.data() + 2 * i, &b, 2);
      }
      return;
    case WireFormat::kFp8E4m3: {
      // [blocks] fp32 scales, then [n] e4m3 codes.
      const int64_t blocks = (n + kFp8BlockValues - 1) / kFp8BlockValues;
      std::byte* values = out.data() + 4 * blocks;
      for (int64_t blk = 0; blk < blocks; ++blk) {
        const int64_t begin = blk * kFp8BlockValues;
        const int64_t len = std::min(kFp8BlockValues, n - begin);
        const float scale =
            e4m3_block_scale(in.subspan(static_cast<size_t>(begin), static_cast<size_t>(len)));
        std::memcpy(out.data() + 4 * blk, &scale, 4);
        for (int64_t i = begin; i < begin + len; ++i) {
          values[i] = static_cast<std::byte>(e4m3_from_float(in[static_cast<size_t>(i)] / scale));
        }
      }
      return;
    }
  }
}

void unpack(WireFormat wire, std::span<const std::byte> in, std::span<float> out) {
  const auto n = static_cast<int64_t>(out.size());
  MOEPLAN_ASSERT(static_cast<int64_t>(in.size()) == wire_bytes(wire, n));
  switch (wire) {
    case WireFormat::kFp32:
      if (n > 0) std::memcpy(out.data(), in.data(), out.size_bytes());
      return;
    case WireFormat::kBf16:
      for (size_t i = 0; i < out.size(); ++i) {
        uint16_t b = 0;
        std::memcpy(&b, in.data() + 2 * i, 2);
        out[i] = float_from_bf16(b);
      }
      return;
    case WireFormat::kFp8E4m3: {
      const int64_t blocks = (n + kFp8BlockValues - 1) / kFp8BlockValues;
      const std::byte* values = in.data() + 4 * blocks;
      for (int64_t blk = 0; blk < blocks; ++blk) {
        float scale = 0.0f;
        std::memcpy(&scale, in.data() + 4 * blk, 4);
        const int64_t begin = blk * kFp8BlockValues;
        const int64_t end = std::min(n, begin + kFp8BlockValues);
        for (int64_t i = begin; i < end; ++i) {
          out[static_cast<size_t>(i)] = float_from_e4m3(static_cast<uint8_t>(values[i])) * scale;
        }
      }
      return;
    }
  }
}

void round_trip(WireFormat wire, std::span<float> data) {
  switch (wire) {
    case WireFormat::kFp32:
      return;
    case WireFormat::kBf16:
      for (float& v : data) v = float_from_bf16(bf16_from_float(v));
      return;
    case WireFormat::kFp8E4m3: {
      for (size_t begin = 0; begin < data.size(); begin += kFp8BlockValues) {
        const auto block = data.subspan(begin, std::min<size_t>(kFp8BlockValues, data.size() - begin));
        const float scale = e4m3_block_scale(block);
        for (float& v : block) v = float_from_e4m3(e4m3_from_float(v / scale)) * scale;
      }
      return;
    }
  }
}

const char* name_of(WireFormat wire) {
  switch (wire) {
    case WireFormat::kFp32:
      return "fp32";
    case WireFormat::kBf16:
      return "bf16";
    case WireFormat::kFp8E4m3:
      return "fp8_e4m3";
  }
  return "?";
}

}  // namespace moeplan::executor
