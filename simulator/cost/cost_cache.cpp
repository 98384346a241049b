// The op cost key (see cost_cache.h).
#include "simulator/cost/cost_cache.h"

#include <cstring>
#include <initializer_list>

#include "simulator/core/hash.h"

namespace moeplan::cost {
namespace {

uint64_t bits(double x) {
  uint64_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

uint32_t float_bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

}  // namespace

uint64_t cost_fields_hash(const Op& op) {
  // The fields as 64-bit words, folded two at a time by a 64 x 64 -> 128-bit multiply whose halves are
  // xor-ed (the fold of wyhash): about a third of the instructions of one hash_combine per field. The
  // constants are odd, above 2^62 and NaN patterns as doubles, so no field equals one and zeroes a product.
  constexpr uint64_t kA = 0xfff3a0b9c5d1e2f7ULL, kB = 0xfff7e3c2a1b4d6c9ULL;
  __extension__ using U128 = unsigned __int128;  // GCC and Clang on 64-bit targets
  auto fold = [](uint64_t h, uint64_t x, uint64_t y) {
    const U128 r = static_cast<U128>(h ^ x ^ kA) * (y ^ kB);
    return static_cast<uint64_t>(r) ^ static_cast<uint64_t>(r >> 64);
  };
  auto u = [](int64_t v) { return static_cast<uint64_t>(v); };
  uint64_t h = 1469598103934665603ULL;
  h = fold(h,
           static_cast<uint64_t>(op.kind) | (static_cast<uint64_t>(op.dtype) << 8) |
               (static_cast<uint64_t>(op.part) << 16) | (static_cast<uint64_t>(op.phase) << 24) |
               (static_cast<uint64_t>(op.mem) << 32) | (static_cast<uint64_t>(op.name) << 40),
           static_cast<uint64_t>(op.kernels) | (static_cast<uint64_t>(op.host_sync) << 16) |
               (static_cast<uint64_t>(op.comm.node_dedup) << 17) | (static_cast<uint64_t>(op.graphed) << 18) |
               (static_cast<uint64_t>(op.block_scaled) << 19) | (static_cast<uint64_t>(op.stream) << 24) |
               (static_cast<uint64_t>(op.aux_kernels) << 32) | (static_cast<uint64_t>(op.accum_bytes) << 40) |
               (static_cast<uint64_t>(op.comm.collective) << 48) |
               (static_cast<uint64_t>(op.comm.group) << 56));
  h = fold(h, bits(op.flops), bits(op.hbm_bytes));
  h = fold(h, u(op.gemm.m), u(op.gemm.n));
  h = fold(h, u(op.gemm.k), u(op.gemm.groups));
  h = fold(h, u(op.attn.seq_kv) | (u(op.attn.window) << 32),
           u(op.attn.qk_dim) | (u(op.attn.causal) << 32) | (u(op.attn.seq_q) << 33));
  h = fold(h, u(op.comm.group_size) | (u(op.comm.stride) << 32), bits(op.comm.bytes));
  h = fold(h, bits(op.comm.nic_bytes_scale), bits(op.aux_bytes));
  h = fold(h, bits(op.comm.hot_factor),
           static_cast<uint64_t>(op.comm.dtype) | (static_cast<uint64_t>(op.comm.userbuffers) << 8) |
               (static_cast<uint64_t>(float_bits(op.graph_copy_bytes)) << 32));
  h = fold(h, u(op.attn.batch) | (u(op.attn.heads) << 32), u(op.attn.v_dim) | (u(op.attn.kv_heads) << 32));
  return h;
}

}  // namespace moeplan::cost
