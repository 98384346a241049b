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

}  // namespace

uint64_t cost_fields_hash(const Op& op) {
  uint64_t h = 1469598103934665603ULL;
  h = hash_combine(h, static_cast<uint64_t>(op.kind) | (static_cast<uint64_t>(op.dtype) << 8) |
                          (static_cast<uint64_t>(op.part) << 16) | (static_cast<uint64_t>(op.phase) << 24) |
                          (static_cast<uint64_t>(op.mem) << 32) | (static_cast<uint64_t>(op.name) << 40));
  h = hash_combine(h, bits(op.flops));
  h = hash_combine(h, bits(op.hbm_bytes));
  for (int64_t v : std::initializer_list<int64_t>{op.gemm.m, op.gemm.n, op.gemm.k, op.gemm.groups,
                                                  op.attn.seq_kv, op.attn.window, op.attn.qk_dim,
                                                  op.attn.causal, op.comm.group_size, op.comm.stride}) {
    h = hash_combine(h, static_cast<uint64_t>(v));
  }
  h = hash_combine(h,
                   static_cast<uint64_t>(op.comm.collective) | (static_cast<uint64_t>(op.comm.group) << 8));
  h = hash_combine(h, bits(op.comm.bytes));
  h = hash_combine(h, bits(op.comm.nic_bytes_scale));
  h = hash_combine(h, bits(op.aux_bytes));
  h = hash_combine(
      h, static_cast<uint64_t>(op.kernels) | (static_cast<uint64_t>(op.host_sync) << 16) |
             (static_cast<uint64_t>(op.comm.node_dedup) << 17) | (static_cast<uint64_t>(op.stream) << 24) |
             (static_cast<uint64_t>(op.aux_kernels) << 32) | (static_cast<uint64_t>(op.accum_bytes) << 40));
  return h;
}

}  // namespace moeplan::cost
