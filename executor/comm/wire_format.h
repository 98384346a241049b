// Wire formats of the CPU communicator: the exact bytes a GPU run would send for BF16 and FP8 e4m3 payloads,
// as pure functions (pack before send, unpack after receive) so that compressed plans compute with the
// precision they would have on GPUs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "executor/comm/communicator.h"

namespace moeplan::executor {

// FP8 e4m3 (OCP "E4M3FN": bias 7, 3 mantissa bits, no infinities, S.1111.111 is NaN).
inline constexpr float kE4m3Max = 448.0f;        // largest finite: 1.75 * 2^8
inline constexpr int64_t kFp8BlockValues = 128;  // values sharing one fp32 scale

// Error bounds the executor's equivalence tests derive their tolerances from (per value, per rounding):
//   kFp32:    exact.
//   kBf16:    |x - q(x)| <= 2^-8 |x| for finite x in the normal range (2^-126 <= |x| < 2^128 (1 - 2^-9));
//   below
//             it (fp32/bf16 subnormals) |x - q(x)| <= 2^-134, half the bf16 subnormal spacing.
//   kFp8E4m3: |x - q(x)| <= 2^-4 |x| when |x| / scale >= 2^-6 (e4m3's normal range), and
//             |x - q(x)| <= 2^-10 * scale below it (subnormal spacing 2^-9, half of it), scale = amax / 448
//             of the value's block. Both hold at once as |x - q(x)| <= max(2^-4 |x|, 2^-10 scale).
inline constexpr double kBf16RelativeError = 1.0 / 256.0;       // 2^-8
inline constexpr double kE4m3RelativeError = 1.0 / 16.0;        // 2^-4
inline constexpr double kE4m3SubnormalAbsError = 1.0 / 1024.0;  // 2^-10, times the block scale
double relative_error_bound(WireFormat wire);                   // 0 for kFp32

// BF16: round to nearest, ties to even. NaN stays NaN (quiet, sign kept); +-Inf stays +-Inf; finite values
// that round past the largest bf16 become +-Inf (IEEE behaviour, as torch's .to(bfloat16)).
uint16_t bf16_from_float(float x);
float float_from_bf16(uint16_t b);

// E4M3 of an already scaled value: round to nearest, ties to even, saturating (|x| > 448 and +-Inf give
// +-448); NaN gives NaN (0x7F, sign kept). -0 is kept.
uint8_t e4m3_from_float(float x);
float float_from_e4m3(uint8_t b);

// Scale of one block: amax / 448 over its finite values; 1 when the block has no finite nonzero value; at
// least FLT_MIN so that dividing by it never overflows to Inf for a finite value.
float e4m3_block_scale(std::span<const float> block);

// Bytes on the wire for n values: fp32 4n; bf16 2n; fp8 n + 4 * ceil(n / 128) (the block scales first, then
// the values). Blocks start at the beginning of every packed span (each chunk or peer segment is packed
// alone).
int64_t wire_bytes(WireFormat wire, int64_t n);

// out.size() == wire_bytes(wire, in.size()).
void pack(WireFormat wire, std::span<const float> in, std::span<std::byte> out);
// in.size() == wire_bytes(wire, out.size()).
void unpack(WireFormat wire, std::span<const std::byte> in, std::span<float> out);
// pack + unpack in place: what the receiver of `data` would hold.
void round_trip(WireFormat wire, std::span<float> data);

const char* name_of(WireFormat wire);  // "fp32", "bf16", "fp8_e4m3"

}  // namespace moeplan::executor
