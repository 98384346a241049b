// Units: everything inside moeplan is SI (seconds, bytes, FLOP, FLOP/s, bytes/s). Files carry their unit in
// the field name (bw_GBps, latency_us); conversion happens once, in the loaders, with these constants.
#pragma once

#include <cstdint>
#include <string_view>

namespace moeplan {

inline constexpr double kGB = 1e9;  // decimal, as vendors and nccl-tests quote bandwidth and capacity
inline constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
inline constexpr double kMiB = 1024.0 * 1024.0;
inline constexpr double kTera = 1e12;
inline constexpr double kMicro = 1e-6;

// Numeric formats of weights, activations and messages.
enum class DType : uint8_t { kFp32, kBf16, kFp16, kFp8 };

constexpr double bytes_of(DType t) {
  switch (t) {
    case DType::kFp32:
      return 4.0;
    case DType::kBf16:
      return 2.0;
    case DType::kFp16:
      return 2.0;
    case DType::kFp8:
      return 1.0;
  }
  return 0.0;
}

constexpr std::string_view name_of(DType t) {
  switch (t) {
    case DType::kFp32:
      return "fp32";
    case DType::kBf16:
      return "bf16";
    case DType::kFp16:
      return "fp16";
    case DType::kFp8:
      return "fp8";
  }
  return "?";
}

}  // namespace moeplan
