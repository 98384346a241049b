#include "executor/kernels/cpu/init.h"

#include <cmath>
#include <numbers>

#include "simulator/core/status.h"

namespace moeplan::executor::cpu {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t fnv1a64(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (const char ch : s) {
    h ^= static_cast<unsigned char>(ch);
    h *= 0x100000001b3ULL;
  }
  return h;
}

uint64_t counter_hash(uint64_t seed, uint64_t a, uint64_t b, uint64_t c) {
  return splitmix64(splitmix64(splitmix64(splitmix64(seed) ^ a) ^ b) ^ c);
}

double init_normal(uint64_t seed, uint64_t id, int64_t row, int64_t col) {
  const uint64_t h = counter_hash(seed, id, static_cast<uint64_t>(row), static_cast<uint64_t>(col));
  constexpr double kInv53 = 1.0 / 9007199254740992.0;               // 2^-53
  const double u1 = (static_cast<double>(h >> 11) + 0.5) * kInv53;  // (0, 1): log is finite
  const double u2 = static_cast<double>(splitmix64(h) >> 11) * kInv53;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

template <class S>
void init_block(MRef<S> out, uint64_t seed, std::string_view name, int64_t row0, int64_t col0, double std) {
  const uint64_t id = param_id(name);
  for (Eigen::Index i = 0; i < out.rows(); ++i)
    for (Eigen::Index j = 0; j < out.cols(); ++j)
      out(i, j) = static_cast<S>(std * init_normal(seed, id, row0 + i, col0 + j));
}

template <class S>
void init_columns(MRef<S> out, uint64_t seed, std::string_view name, int64_t row0,
                  std::span<const int64_t> cols, double std) {
  MOEPLAN_ASSERT(static_cast<Eigen::Index>(cols.size()) == out.cols());
  const uint64_t id = param_id(name);
  for (Eigen::Index i = 0; i < out.rows(); ++i)
    for (Eigen::Index j = 0; j < out.cols(); ++j)
      out(i, j) = static_cast<S>(std * init_normal(seed, id, row0 + i, cols[static_cast<size_t>(j)]));
}

std::vector<int64_t> qkv_shard_columns(int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t h0,
                                       int64_t h1) {
  MOEPLAN_ASSERT(heads % kv_heads == 0 && 0 <= h0 && h0 < h1 && h1 <= heads);
  const int64_t group = heads / kv_heads;
  const int64_t g0 = h0 / group, g1 = (h1 - 1) / group + 1;
  std::vector<int64_t> cols;
  for (int64_t c = h0 * head_dim; c < h1 * head_dim; ++c) cols.push_back(c);
  const int64_t k_base = heads * head_dim, v_base = (heads + kv_heads) * head_dim;
  for (int64_t c = g0 * head_dim; c < g1 * head_dim; ++c) cols.push_back(k_base + c);
  for (int64_t c = g0 * head_dim; c < g1 * head_dim; ++c) cols.push_back(v_base + c);
  return cols;
}

std::vector<int64_t> fc13_shard_columns(int64_t ffn, int64_t f0, int64_t f1) {
  MOEPLAN_ASSERT(0 <= f0 && f0 < f1 && f1 <= ffn);
  std::vector<int64_t> cols;
  for (int64_t c = f0; c < f1; ++c) cols.push_back(c);
  for (int64_t c = f0; c < f1; ++c) cols.push_back(ffn + c);
  return cols;
}

template <class S>
Mat<S> gather_columns(const CRef<S>& full, std::span<const int64_t> cols) {
  Mat<S> out(full.rows(), static_cast<Eigen::Index>(cols.size()));
  for (size_t j = 0; j < cols.size(); ++j) {
    MOEPLAN_ASSERT(cols[j] >= 0 && cols[j] < full.cols());
    out.col(static_cast<Eigen::Index>(j)) = full.col(cols[j]);
  }
  return out;
}

int64_t synthetic_token(uint64_t seed, int64_t sequence, int64_t position, int64_t vocab) {
  MOEPLAN_ASSERT(vocab > 0);
  const uint64_t h =
      counter_hash(seed, static_cast<uint64_t>(sequence), static_cast<uint64_t>(position), 0x746f6b656eULL);
  return static_cast<int64_t>(h % static_cast<uint64_t>(vocab));
}

TokenBatch synthetic_batch(uint64_t seed, std::span<const int64_t> sequences, int64_t seq_len,
                           int64_t vocab) {
  TokenBatch b;
  b.tokens.reserve(sequences.size() * static_cast<size_t>(seq_len));
  b.targets.reserve(b.tokens.capacity());
  for (const int64_t s : sequences) {
    for (int64_t p = 0; p < seq_len; ++p) {
      b.tokens.push_back(synthetic_token(seed, s, p, vocab));
      b.targets.push_back(synthetic_token(seed, s, p + 1, vocab));
    }
  }
  return b;
}

#define MOERUN_INSTANTIATE(S)                                                                           \
  template void init_block<S>(MRef<S>, uint64_t, std::string_view, int64_t, int64_t, double);           \
  template void init_columns<S>(MRef<S>, uint64_t, std::string_view, int64_t, std::span<const int64_t>, \
                                double);                                                                \
  template Mat<S> gather_columns<S>(const CRef<S>&, std::span<const int64_t>);
MOERUN_INSTANTIATE(float)
MOERUN_INSTANTIATE(double)
#undef MOERUN_INSTANTIATE

}  // namespace moeplan::executor::cpu
