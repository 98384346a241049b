// The attention kernel calls an executor runs for an attention op: their FLOPs are the op's on every
// layout the lowering emits (GQA, MLA, windows, Ulysses, context parallelism, cross-attention), the K/V
// heads follow Megatron's replication and Ulysses' all-to-all, and the mask's pairs are counted in closed
// form.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "simulator/core/attention_calls.h"
#include "simulator/core/model_stats.h"
#include "simulator/io/model_loader.h"
#include "simulator/workload/lower.h"

using namespace moeplan;

namespace {

// The model cut to its first `layers` layers, one micro-batch of `seq` tokens on tp x sp x cp GPUs.
OpGraph lowered(const char* model, int64_t layers, int64_t tp, int64_t sp, int64_t cp, int64_t seq) {
  ModelSpec m = io::load_model(model).value();
  m.layers.resize(static_cast<size_t>(layers));
  m.mtp_layers = 0;
  Plan p;
  p.gpus = tp * sp * cp;
  p.seq_len = seq;
  p.global_batch = 1;
  p.micro_batch = 1;
  p.attention.tp = tp;
  p.attention.sp = sp;
  p.attention.cp = cp;
  p.data.zero = 0;
  return lower(m, p, {});
}

std::vector<const Op*> attention_ops(const OpGraph& g) {
  std::vector<const Op*> v;
  for (const Op& op : g.ops) {
    if (op.kind == OpKind::kAttention) v.push_back(&op);
  }
  return v;
}

double forward_flops(const Op& op) {
  return op.phase == Phase::kBackward ? op.flops / kAttentionBackwardFlops : op.flops;
}

double calls_flops(const Op& op) {
  double f = 0;
  for (const AttentionCall& c : attention_calls(op)) f += c.forward_flops();
  return f;
}

}  // namespace

TEST_SUITE("attention_calls") {
  TEST_CASE("a mask's visible pairs in closed form: causal, bottom-right, windowed and full") {
    AttentionCall c{
        .batch = 1, .seq_q = 7, .seq_kv = 7, .heads = 1, .kv_heads = 1, .qk_dim = 64, .v_dim = 64};
    CHECK(c.visible_pairs() == 7.0 * 8.0 / 2.0);
    c.window = 3;  // queries 0, 1 see 1, 2 keys; the other five see 3
    CHECK(c.visible_pairs() == 1 + 2 + 5 * 3);
    CHECK(c.visible_pairs() == doctest::Approx(7 * mean_attended_keys(7, 3)));
    c.window = 0;
    c.seq_q = 2;  // the last two of seven positions: 6 and 7 keys
    CHECK(c.visible_pairs() == 13);
    c.window = 4;  // 4 and 4 keys
    CHECK(c.visible_pairs() == 8);
    c.window = 0;
    c.seq_q = 9;  // more queries than keys: the first two see none, the rest 1 .. 7
    CHECK(c.visible_pairs() == 28);
    c.seq_q = 2;
    c.causal = false;
    CHECK(c.visible_pairs() == 14);
    CHECK(c.forward_flops() == 2.0 * 14 * (64 + 64));
  }

  TEST_CASE("the closed form of the visible pairs counts the mask pair by pair") {
    for (int64_t sq = 1; sq <= 12; ++sq) {
      for (int64_t skv = 1; skv <= 12; ++skv) {
        for (int64_t w = 0; w <= 13; ++w) {
          const AttentionCall c{.batch = 1, .seq_q = sq, .seq_kv = skv, .heads = 1, .window = w};
          int64_t pairs = 0;
          for (int64_t i = 0; i < sq; ++i) {
            for (int64_t j = 0; j < skv; ++j) {
              const int64_t pos = i + skv - sq;  // the query's position among the keys'
              pairs += j <= pos && (w == 0 || pos - j < w) ? 1 : 0;
            }
          }
          CAPTURE(sq);
          CAPTURE(skv);
          CAPTURE(w);
          CHECK(c.visible_pairs() == static_cast<double>(pairs));
        }
      }
    }
  }

  TEST_CASE("the calls of every attention op do its FLOPs, on every layout the lowering emits") {
    struct Case {
      const char* model;
      int64_t layers, tp, sp, cp, seq;
    };
    const std::vector<Case> cases = {
        {"qwen3-30b-a3b", 1, 1, 1, 1, 4096},  // GQA
        {"qwen3-30b-a3b", 1, 4, 1, 1, 4096}, {"qwen3-30b-a3b", 1, 1, 4, 1, 4096},
        {"qwen3-30b-a3b", 1, 2, 1, 2, 8192},  // context parallelism
        {"qwen3-30b-a3b", 1, 1, 1, 4, 8192}, {"qwen3-30b-a3b", 1, 1, 1, 8, 16384},
        {"deepseek-v3", 1, 1, 1, 1, 4096},                                         // MLA: qk 192, v 128
        {"deepseek-v3", 1, 2, 1, 4, 8192},   {"gpt-oss-120b", 2, 1, 1, 1, 4096},   // windows of 128
        {"mixtral-8x7b", 1, 2, 2, 1, 4096},  {"switch-base-64", 2, 1, 1, 1, 512},  // cross-attention
    };
    for (const Case& k : cases) {
      CAPTURE(std::string(k.model));
      CAPTURE(k.tp);
      CAPTURE(k.sp);
      CAPTURE(k.cp);
      const OpGraph g = lowered(k.model, k.layers, k.tp, k.sp, k.cp, k.seq);
      const auto ops = attention_ops(g);
      REQUIRE(!ops.empty());
      for (const Op* op : ops) {
        CAPTURE(op_label(*op));
        CHECK(calls_flops(*op) == doctest::Approx(forward_flops(*op)).epsilon(2e-3));
      }
    }
  }

  TEST_CASE(
      "context parallelism: the local part is a causal square of the rank's queries, the rest one "
      "full block of a chunk's keys per other rank") {
    for (int64_t cp : {2, 4, 8}) {
      CAPTURE(cp);
      const int64_t seq = 8192, c = seq / (2 * cp);
      const OpGraph g = lowered("qwen3-30b-a3b", 1, 1, 1, cp, seq);
      int seen = 0;
      for (const Op* op : attention_ops(g)) {
        const auto calls = attention_calls(*op);
        const bool local = static_cast<OpName>(op->name) == OpName::kAttnCoreLocal;
        REQUIRE(calls.size() == static_cast<size_t>(local ? 1 : cp - 1));
        for (const AttentionCall& k : calls) {
          CHECK(k.seq_q == seq / cp);
          CHECK(k.causal == local);
          CHECK(k.seq_kv == (local ? seq / cp : c));
        }
        ++seen;
      }
      CHECK(seen == 4);  // local and remote, forward and backward
    }
  }

  TEST_CASE(
      "K/V heads as Megatron replicates them over tp and Ulysses spreads them over sp, MLA per query "
      "head") {
    // Qwen3-30B-A3B: 32 query heads, 4 K/V heads.
    struct Case {
      int64_t tp, sp, heads, kv_heads;
    };
    for (const Case& k : std::vector<Case>{
             {1, 1, 32, 4}, {2, 1, 16, 2}, {8, 1, 4, 1}, {1, 2, 16, 2}, {1, 8, 4, 1}, {2, 4, 4, 1}}) {
      CAPTURE(k.tp);
      CAPTURE(k.sp);
      const OpGraph g = lowered("qwen3-30b-a3b", 1, k.tp, k.sp, 1, 4096);
      for (const Op* op : attention_ops(g)) {
        const auto calls = attention_calls(*op);
        REQUIRE(calls.size() == 1);
        CHECK(calls.front().heads == k.heads);
        CHECK(calls.front().kv_heads == k.kv_heads);
      }
    }
    const OpGraph mla = lowered("deepseek-v3", 1, 2, 1, 1, 4096);
    for (const Op* op : attention_ops(mla)) {
      const AttentionCall c = attention_calls(*op).front();
      CHECK(c.kv_heads == c.heads);
      CHECK(c.qk_dim == 192);
      CHECK(c.v_dim == 128);
    }
  }

  TEST_CASE("windows reach the calls, and an op without a shape has none") {
    const OpGraph g = lowered("gpt-oss-120b", 2, 1, 1, 1, 4096);
    bool windowed = false, full = false;
    for (const Op* op : attention_ops(g)) {
      const int64_t w = attention_calls(*op).front().window;
      windowed = windowed || w == 128;
      full = full || w == 0;
    }
    CHECK(windowed);
    CHECK(full);
    Op empty;
    empty.kind = OpKind::kAttention;
    CHECK(attention_calls(empty).empty());
  }
}
