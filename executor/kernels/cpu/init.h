// Deterministic, shard-friendly data: parameter initialisation and synthetic tokens from counter-based
// hashes, so that any rank computes exactly its slice of a parameter, or its tokens, without knowing the
// sharding.
//
//   param_id(name): FNV-1a 64 of the parameter's stable name ("L3.expert5.fc13", "L0.qkv", "embedding",
//     ...; ReferenceModel lists them)
//   counter_hash(seed, a, b, c) = splitmix64(splitmix64(splitmix64(splitmix64(seed) ^ a) ^ b) ^ c)
//   init_normal(seed, id, r, c): Box-Muller on two uniforms from h = counter_hash(seed, id, r, c):
//     u1 = ((h >> 11) + 0.5) / 2^53, u2 = (splitmix64(h) >> 11) / 2^53, z = sqrt(-2 ln u1) cos(2 pi u2),
//     in double
//   parameter entry (global row r, global col c) = std * init_normal(seed, param_id(name), r, c), std 0.02,
//     rounded once to the scalar type; RMSNorm gains are 1.
//   synthetic_token(seed, s, p, V) = counter_hash(seed, s, p, 0x746f6b656e) % V; the target of (s, p) is
//     synthetic_token(seed, s, p + 1, V) (so the last position's target is hash(seed, s, seq_len) % V).
//
// Global coordinates of fused parameters (what a shard's columns are):
//   qkv [hidden, (H + 2 KV) D]: columns [Q heads 0..H-1 | K heads 0..KV-1 | V heads 0..KV-1], D per head.
//     A head shard [h0, h1) with kv heads [g0, g1) holds [Q h0..h1-1 | K g0..g1-1 | V g0..g1-1]
//     (qkv_shard_columns).
//   fc13 [hidden, 2F]: columns [gate 0..F-1 | up 0..F-1]. A column shard [f0, f1) holds
//     [gate f0..f1-1 | up f0..f1-1] (fc13_shard_columns), the [gate | up] layout swiglu expects.
//   fc2 [F, hidden] and out_proj [H D, hidden]: a row shard is rows [f0, f1) or [h0 D, h1 D).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "executor/kernels/cpu/types.h"

namespace moeplan::executor::cpu {

inline constexpr uint64_t kDefaultParamSeed = 1234;
inline constexpr uint64_t kDefaultDataSeed = 5678;
inline constexpr double kInitStd = 0.02;

uint64_t splitmix64(uint64_t x);
uint64_t fnv1a64(std::string_view s);
inline uint64_t param_id(std::string_view name) {
  return fnv1a64(name);
}
uint64_t counter_hash(uint64_t seed, uint64_t a, uint64_t b, uint64_t c);
double init_normal(uint64_t seed, uint64_t id, int64_t row, int64_t col);  // standard normal

// out(i, j) = std * init_normal(seed, param_id(name), row0 + i, col0 + j).
template <class S>
void init_block(MRef<S> out, uint64_t seed, std::string_view name, int64_t row0, int64_t col0,
                double std = kInitStd);
// out(i, j) = std * init_normal(seed, param_id(name), row0 + i, cols[j]): a shard with scattered columns.
template <class S>
void init_columns(MRef<S> out, uint64_t seed, std::string_view name, int64_t row0,
                  std::span<const int64_t> cols, double std = kInitStd);

// Global columns of qkv held by query heads [h0, h1) (and their kv heads), in the shard's layout.
std::vector<int64_t> qkv_shard_columns(int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t h0,
                                       int64_t h1);
// Global columns of fc13 [hidden, 2F] held by the column shard [f0, f1): [f0..f1) then [F+f0..F+f1).
std::vector<int64_t> fc13_shard_columns(int64_t ffn, int64_t f0, int64_t f1);
// The columns `cols` of `full`, in that order.
template <class S>
Mat<S> gather_columns(const CRef<S>& full, std::span<const int64_t> cols);

int64_t synthetic_token(uint64_t seed, int64_t sequence, int64_t position, int64_t vocab);
// Tokens and targets of sequences (row-major [sequences.size() * seq_len]: sequence-major, then position).
struct TokenBatch {
  std::vector<int64_t> tokens, targets;
};
TokenBatch synthetic_batch(uint64_t seed, std::span<const int64_t> sequences, int64_t seq_len, int64_t vocab);

}  // namespace moeplan::executor::cpu
