// The train runner's data parallelism: gradient synchronisation per bucket, ZeRO parameter gathers and the
// Adam step (see train_runner_impl.h).
#include "executor/runtime/train_runner_impl.h"

namespace moeplan::executor {

using namespace train;  // NOLINT: the runner's own helpers

Bucket& TrainRunner::Impl::sync_bucket_of(const Op& op) {
  if (op.kind == OpKind::kCollective) return bucket_of(op);
  for (const int32_t d : graph.deps_of(op)) {
    const Op& dep = graph.ops[sz(d)];
    if (static_cast<OpName>(dep.name) == OpName::kGradA2a) return bucket_of(dep);
  }
  MOEPLAN_ASSERT(false && "grad_reduce without its grad_a2a");
  std::abort();
}

void TrainRunner::Impl::grad_sync(const Op& op) {
  if (static_cast<OpName>(op.name) == OpName::kGradCast) return;  // fp32 -> bf16: the a2a's wire rounds
  Bucket& b = sync_bucket_of(op);
  MOEPLAN_ASSERT(b.comm != nullptr);
  const auto shard = static_cast<size_t>(b.hi - b.lo);
  const bool reads_grads = static_cast<OpName>(op.name) != OpName::kGradReduce;
  std::vector<float>& g =
      b.grads_of(reads_grads && !b.g_mb.empty() ? b.syncs++ % static_cast<int>(n_local) : 0);
  switch (static_cast<OpName>(op.name)) {
    case OpName::kGradRs:
      if (op.comm.collective == Collective::kAllReduce) {
        MOEPLAN_ASSERT(!b.sharded);
        b.comm->all_reduce(g, WireFormat::kFp32);
        for (size_t i = 0; i < shard; ++i) b.sg[i] += g[i];
      } else {
        MOEPLAN_ASSERT(b.sharded && op.comm.collective == Collective::kReduceScatter);
        std::vector<float> out(shard);
        b.comm->reduce_scatter(g, out, WireFormat::kFp32);
        for (size_t i = 0; i < shard; ++i) b.sg[i] += out[i];
      }
      std::fill(g.begin(), g.end(), 0.0f);
      return;
    case OpName::kGradA2a: {
      MOEPLAN_ASSERT(b.sharded);
      const std::vector<int64_t> counts(sz(b.comm->size()), static_cast<int64_t>(shard));
      b.a2a.assign(g.size(), 0.0f);
      b.comm->all_to_all_v(g, counts, b.a2a, counts, WireFormat::kBf16);
      std::fill(g.begin(), g.end(), 0.0f);
      return;
    }
    case OpName::kGradReduce:  // local fp32 reduce of the received bf16 chunks, in rank order
      for (int r = 0; r < b.comm->size(); ++r)
        for (size_t i = 0; i < shard; ++i) b.sg[i] += b.a2a[static_cast<size_t>(r) * shard + i];
      return;
    default:
      MOEPLAN_ASSERT(false && "not a gradient sync op");
  }
}

void TrainRunner::Impl::param_gather(Bucket& b) {
  if (!b.sharded) return;
  const std::vector<float> mine(b.p.begin() + b.lo, b.p.begin() + b.hi);
  b.gather.resize(b.p.size());
  b.comm->all_gather(mine, b.gather, WireFormat::kFp32);
  if (b.stale) b.p.swap(b.gather);
  b.stale = false;
}

void TrainRunner::Impl::optimizer() {
  ++step;
  for (Bucket& b : buckets) {
    if (!b.outside) continue;
    // Sum over the ranks of the stage: its attention mesh, tp x attention replicas (sp cp dp).
    for (const CommGroup g : {CommGroup::kTp, CommGroup::kAttnReplica})
      if (Communicator* c = internal(g)) c->all_reduce(b.g, WireFormat::kFp32);
  }
  for (Bucket& b : buckets) {
    if (b.outside || b.comm == nullptr) {  // no gradient sync op in the graph: the shard is everything
      for (size_t i = 0; i < b.sg.size(); ++i) b.sg[i] += b.g[i];
      std::fill(b.g.begin(), b.g.end(), 0.0f);
    }
    if (tp_comm != nullptr && !b.outside) {
      for (const Entry& e : b.entries) {
        if (!e.tp_replicated) continue;
        const int64_t lo = std::max(e.offset, b.lo), hi = std::min(e.offset + e.size(), b.hi);
        if (lo < hi)
          internal(CommGroup::kTp)
              ->all_reduce(std::span<float>(b.sg).subspan(sz(lo - b.lo), sz(hi - lo)), WireFormat::kFp32);
      }
    }
    cpu::adam_step<float>(std::span<float>(b.p).subspan(sz(b.lo), sz(b.hi - b.lo)), b.sg, b.m, b.v, step,
                          cfg.adam);
    std::fill(b.sg.begin(), b.sg.end(), 0.0f);
    b.stale = b.sharded;
    b.syncs = 0;
  }
}

}  // namespace moeplan::executor
