// The cost cache (simulator/cost/cost_cache.h): ops that differ only in where they run in the step (id,
// micro-batch, layer, chunk, stage, dependencies) share a key and a cost; a change to any field that decides
// the cost gives another key; the cache returns what the cost model returns.
#include <doctest/doctest.h>

#include <functional>
#include <vector>

#include "simulator/cost/cost_cache.h"
#include "simulator/io/hardware_loader.h"
#include "simulator/io/stack_loader.h"
#include "tests/simulator/cost/test_ops.h"

using namespace moeplan;

namespace {

Op gemm_op() {
  Op op = test::gemm_op();
  op.gemm = {4096, 4096, 4096, 1};
  op.flops = 2.0 * 4096.0 * 4096.0 * 4096.0;
  return op;
}

Op all_to_all_op() {
  Op op = test::ep_all_to_all_op(8, 64.0 * 1024 * 1024);
  op.comm.stride = 1;
  op.stream = Stream::kComm;
  return op;
}

}  // namespace

TEST_SUITE("cost") {
  TEST_CASE("ops equal in their cost fields share a key, and any cost field changes it") {
    for (const Op& base : {gemm_op(), all_to_all_op()}) {
      Op moved = base;
      moved.id = 77;
      moved.micro_batch = 5;
      moved.layer = 3;
      moved.chunk = 1;
      moved.stage = 2;
      moved.dep_begin = 10;
      moved.dep_count = 2;
      CHECK(cost::cost_fields_hash(moved) == cost::cost_fields_hash(base));
      const std::vector<std::function<void(Op&)>> changes = {
          [](Op& o) { o.flops += 1; },
          [](Op& o) { o.hbm_bytes += 1; },
          [](Op& o) { o.gemm.m += 1; },
          [](Op& o) { o.gemm.k += 1; },
          [](Op& o) { o.gemm.groups += 1; },
          [](Op& o) { o.dtype = DType::kFp8; },
          [](Op& o) { o.phase = Phase::kBackward; },
          [](Op& o) { o.comm.bytes += 1; },
          [](Op& o) { o.comm.group_size += 1; },
          [](Op& o) { o.comm.stride += 1; },
          [](Op& o) { o.stream = o.stream == Stream::kComm ? Stream::kCompute : Stream::kComm; },
          [](Op& o) { o.kernels += 1; },
          [](Op& o) { o.host_sync = !o.host_sync; },
          [](Op& o) { o.attn.seq_kv += 1; },
          [](Op& o) { o.gemm.n += 1; },
          [](Op& o) { o.part = GemmPart::kWgrad; },
          [](Op& o) { o.mem = MemOp::kCast; },
          [](Op& o) { o.name += 1; },
          [](Op& o) { o.aux_kernels += 1; },
          [](Op& o) { o.accum_bytes += 4; },
          [](Op& o) { o.aux_bytes += 1; },
          [](Op& o) { o.comm.collective = Collective::kReduceScatter; },
          [](Op& o) { o.comm.group = CommGroup::kTp; },
          [](Op& o) { o.comm.node_dedup = !o.comm.node_dedup; },
          [](Op& o) { o.comm.nic_bytes_scale += 0.5; },
          [](Op& o) { o.comm.hot_factor += 0.5; },
          [](Op& o) { o.comm.dtype = DType::kFp32; },
          [](Op& o) { o.comm.userbuffers = !o.comm.userbuffers; },
          [](Op& o) { o.attn.seq_q += 1; },
          [](Op& o) { o.attn.window += 1; },
          [](Op& o) { o.attn.qk_dim += 1; },
          [](Op& o) { o.attn.causal = !o.attn.causal; },
          // The attention kernel's efficiency follows its batch and heads, not only its FLOPs.
          [](Op& o) { o.attn.batch += 1; },
          [](Op& o) { o.attn.heads += 1; },
          [](Op& o) { o.attn.v_dim += 1; },
          [](Op& o) { o.attn.kv_heads += 1; },
      };
      for (size_t i = 0; i < changes.size(); ++i) {
        CAPTURE(i);
        Op changed = base;
        changes[i](changed);
        CHECK(cost::cost_fields_hash(changed) != cost::cost_fields_hash(base));
      }
    }
  }

  TEST_CASE("the cache returns the cost model's cost, once per distinct op") {
    const HardwareProfile hw = io::load_hardware("h100-sxm").value();
    const StackProfile st = io::load_stack("megatron-core").value();
    const cost::CostModel model(hw, st);
    cost::CostCache cache(model);
    Op big = test::gemm_op();
    big.flops = 2.0 * 8192.0 * 8192.0 * 8192.0;
    for (const Op& op : {gemm_op(), all_to_all_op(), big}) {
      const cost::OpCost direct = model.cost(op);
      const cost::OpCost& cached = cache.cost(op);
      CHECK(cached.seconds == direct.seconds);
      CHECK(cached.rel_error == direct.rel_error);
      CHECK(cached.resource == direct.resource);
      Op again = op;
      again.micro_batch = 9;
      CHECK(&cache.cost(again) == &cached);  // the same entry
    }
    CHECK(cache.cost(big).seconds > cache.cost(gemm_op()).seconds);
  }
}
