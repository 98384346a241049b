// Tests of the stage's activation stashes (executor/runtime/activation_layout.h).
#include "executor/runtime/activation_layout.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <set>

#include "simulator/io/stack_loader.h"
#include "simulator/predict/predict.h"
#include "tests/executor/runtime/runtime_fixtures.h"

namespace moeplan::executor {

namespace {

// Micro-batches of each chunk of `stage` whose forward has run and whose backward has not, at most, over
// the schedule's task order (workload::pipeline_order), as the memory model counts them.
std::vector<int64_t> most_in_flight(const Plan& p, int stage) {
  const int64_t chunks = p.pipeline.vpp;
  const std::vector<PipelineTask> order =
      pipeline_order(stage, p.pipeline.pp, chunks, p.num_micro_batches(), false, p.pipeline.schedule);
  std::vector<int64_t> live(static_cast<size_t>(chunks), 0), most(static_cast<size_t>(chunks), 0);
  for (const PipelineTask& t : order) {
    if (t.weights) continue;
    int64_t& n = live[static_cast<size_t>(t.chunk)];
    n += t.forward ? 1 : -1;
    most[static_cast<size_t>(t.chunk)] = std::max(most[static_cast<size_t>(t.chunk)], n);
  }
  return most;
}

// For each (chunk, micro-batch) of `stage` that uses the stashes: its stash and the first and last op index
// (graph order) that writes or reads it.
struct Use {
  int64_t stash = -1;
  size_t first = 0, last = 0;
};
std::map<std::pair<int, int>, Use> uses(const OpGraph& g, const ActivationLayout& l, int stage) {
  std::map<std::pair<int, int>, Use> out;
  for (size_t i = 0; i < g.ops.size(); ++i) {
    const Op& op = g.ops[i];
    const int64_t at = l.offset_of(op) >= 0 ? l.offset_of(op) : l.output_offset(op);
    if (op.stage != stage || at < 0) continue;
    int chunk = 0;  // the chunk whose stashes hold `at`
    while (static_cast<size_t>(chunk + 1) < l.chunk_base.size() &&
           l.chunk_base[static_cast<size_t>(chunk + 1)] <= at)
      ++chunk;
    const int64_t within = at - l.chunk_base[static_cast<size_t>(chunk)];
    const int64_t stash = within / l.stash_bytes[static_cast<size_t>(chunk)];
    auto [it, fresh] = out.try_emplace({chunk, op.micro_batch}, Use{stash, i, i});
    CHECK(it->second.stash == stash);  // one stash per micro-batch
    it->second.last = i;
  }
  return out;
}

}  // namespace

TEST_SUITE("executor_runtime") {
  TEST_CASE("activation stashes rotate: one per micro-batch in flight, never shared by two live ones") {
    const std::string dualpipev =
        "\"attention\": {\"tp\": 1, \"sp\": 1, \"cp\": 1}, \"experts\": {\"ep\": 1, \"etp\": 1}, "
        "\"pipeline\": {\"pp\": 2, \"vpp\": 2, \"schedule\": \"dualpipev\"}";
    for (const std::string& fields : {std::string(test::kPp2), std::string(test::kPp2Vpp2), dualpipev}) {
      CAPTURE(fields);
      const RunInputs in = test::load_tiny("acts_pp2", test::tiny_plan(2, fields, 256, 8));
      const OpGraph& g = in.graph;
      const Plan& p = in.loaded.plan;
      for (int stage = 0; stage < 2; ++stage) {
        CAPTURE(stage);
        const ActivationLayout l = activation_layout(g, stage);
        // As many stashes per chunk as the schedule holds micro-batches of it in flight.
        CHECK(l.stashes == most_in_flight(p, stage));
        const auto u = uses(g, l, stage);
        CHECK(u.size() == static_cast<size_t>(p.num_micro_batches() * p.pipeline.vpp));
        // Two micro-batches of one chunk in one stash never overlap in graph order.
        for (auto a = u.begin(); a != u.end(); ++a) {
          for (auto b = std::next(a); b != u.end(); ++b) {
            if (a->first.first != b->first.first || a->second.stash != b->second.stash) continue;
            CHECK((a->second.last < b->second.first || b->second.last < a->second.first));
          }
        }
        // Each stash is used by more than one micro-batch once there are more micro-batches than stashes.
        for (size_t c = 0; c < l.stashes.size(); ++c) CHECK(l.stashes[c] < p.num_micro_batches());
      }
    }
  }

  TEST_CASE("each backward reads what its forward stashed: GEMM inputs, attention, norm and SwiGLU tensors") {
    const RunInputs in = test::load_tiny("acts_pp2_sizes", test::tiny_plan(2, test::kPp2, 256, 8));
    const OpGraph& g = in.graph;
    const ActivationLayout l = activation_layout(g, 0);
    // Slices are disjoint, in their chunk's stash, 256-byte aligned.
    std::vector<int64_t> end(l.stash_bytes.size(), 0);
    for (const auto& [key, s] : l.slices) {
      const auto c = static_cast<size_t>(s.chunk);
      CHECK(s.offset == end[c]);
      CHECK(s.offset % 256 == 0);
      end[c] = s.offset + s.bytes;
    }
    CHECK(end == l.stash_bytes);
    auto round = [](int64_t b) { return (b + 255) / 256 * 256; };
    std::map<std::tuple<int, int, int>, int64_t> forward_at;  // (layer, name, micro-batch) -> offset
    std::map<std::string, int> forwards, backwards;           // by kind of saved tensor
    auto kind_of = [](const Op& op) -> std::string {
      if (op.kind == OpKind::kAttention) return "attention";
      if (op.kind == OpKind::kGemm || op.kind == OpKind::kGroupedGemm) return "gemm";
      return op.mem == MemOp::kGlu ? "swiglu" : "norm";
    };
    for (const Op& op : g.ops) {
      if (op.stage != 0 || op.phase != Phase::kForward || l.offset_of(op) < 0) continue;
      forward_at[{op.layer, op.name, op.micro_batch}] = l.offset_of(op);
      CHECK(l.offset_of(op) + l.bytes_of(op) <= l.bytes);
      const std::string kind = kind_of(op);
      ++forwards[kind];
      CAPTURE(kind);
      const int64_t m = op.gemm.m, n = op.gemm.n, k = op.gemm.k;
      if (kind == "attention") {
        // q, o [queries, heads, dims], k, v [keys, kv heads, dims] (bf16) and the statistics (fp32) of each
        // call, each rounded up to 256 bytes.
        int64_t exact = 0, calls = 0;
        for (const AttentionCall& c : attention_calls(op)) {
          const int64_t kv = c.kv_heads > 0 ? c.kv_heads : c.heads, v_dim = c.v_dim > 0 ? c.v_dim : c.qk_dim;
          exact +=
              2 * c.batch * (c.seq_q * c.heads * (c.qk_dim + v_dim) + c.seq_kv * kv * (c.qk_dim + v_dim)) +
              4 * c.batch * c.heads * c.seq_q;
          ++calls;
        }
        CHECK(calls > 0);
        CHECK(l.bytes_of(op) >= exact);
        CHECK(l.bytes_of(op) < exact + 5 * 256 * calls);
      } else if (kind == "gemm") {
        // The input X [m, k] in bf16 (tiny-moe trains in bf16), rows rounded up to whole experts if grouped.
        const int64_t rows =
            op.gemm.groups > 1 ? (m + op.gemm.groups - 1) / op.gemm.groups * op.gemm.groups : m;
        CHECK(l.bytes_of(op) == round(rows * k * 2));
      } else if (kind == "swiglu") {
        CHECK(l.bytes_of(op) == round(m * 2 * n * 2));  // the input [rows, 2 cols]
      } else {
        CHECK(l.bytes_of(op) == round(m * n * 2) + round(m * 4));  // the input and the inverse RMS
      }
    }
    for (const Op& op : g.ops) {
      if (op.stage != 0 || !reads_saved(op)) continue;
      const auto it = forward_at.find({op.layer, op.name, op.micro_batch});
      REQUIRE(it != forward_at.end());
      CHECK(l.offset_of(op) == it->second);
      ++backwards[kind_of(op)];
    }
    CHECK(forwards.size() == 4);  // every kind is stashed
    CHECK(forwards == backwards);
  }

  TEST_CASE("a tensor two forwards keep is kept once: producers write into their consumer's place") {
    Result<RunInputs> in =
        load_run_inputs(std::string(MOEPLAN_SOURCE_DIR) + "/executor/cuda/device_plan.json");
    REQUIRE(in);
    const OpGraph& g = in.value().graph;
    const ActivationLayout l = activation_layout(g, 0);
    // Layer 1, micro-batch 0, forward: each op by name.
    std::map<std::string, const Op*> at;
    for (const Op& op : g.ops) {
      if (op.layer == 1 && op.micro_batch == 0 && op.phase == Phase::kForward) at[kOpNames[op.name]] = &op;
    }
    for (const char* name : {"attn_norm", "qkv_proj", "attn_core", "out_proj", "ffn_norm", "router",
                             "shared_fc13", "expert_fc13", "expert_act", "expert_fc2"})
      REQUIRE_MESSAGE(at.contains(name), name);
    // The attention's output is the output projection's input: in the attention's slice, after q, k and v.
    const std::vector<AttentionCall> calls = attention_calls(*at["attn_core"]);
    REQUIRE(calls.size() == 1);
    const std::array<int64_t, 5> part = attention_saved_parts(calls.front());
    CHECK(l.offset_of(*at["out_proj"]) == l.offset_of(*at["attn_core"]) + part[0] + part[1] + part[2]);
    // Norms write their output where the GEMMs reading it keep it; the router and the shared experts keep
    // the pre-MLP norm's output once.
    CHECK(l.output_offset(*at["attn_norm"]) == l.offset_of(*at["qkv_proj"]));
    CHECK(l.output_offset(*at["ffn_norm"]) == l.offset_of(*at["router"]));
    CHECK(l.offset_of(*at["shared_fc13"]) == l.offset_of(*at["router"]));
    // The experts' first GEMM writes SwiGLU's input in its place, SwiGLU the second GEMM's.
    CHECK(l.output_offset(*at["expert_fc13"]) == l.offset_of(*at["expert_act"]));
    CHECK(l.output_offset(*at["expert_act"]) == l.offset_of(*at["expert_fc2"]));
    CHECK(l.output_bytes_of(*at["expert_act"]) >= at["expert_act"]->gemm.m * at["expert_act"]->gemm.n * 2);
    // Ops that share no tensor have places of their own.
    CHECK(l.offset_of(*at["qkv_proj"]) != l.offset_of(*at["router"]));
    CHECK(l.output_offset(*at["qkv_proj"]) < 0);  // its output goes to RoPE, which keeps nothing here
    // Every write into another's place is where a forward of the same micro-batch that depends on it reads.
    for (const Op& p : g.ops) {
      if (p.stage != 0 || l.output_offset(p) < 0) continue;
      bool read = false;
      for (const Op& c : g.ops) {
        if (c.micro_batch != p.micro_batch || c.phase != Phase::kForward ||
            l.offset_of(c) != l.output_offset(p))
          continue;
        for (const int32_t d : g.deps_of(c)) read = read || d == p.id;
      }
      CHECK_MESSAGE(read, kOpNames[p.name]);
    }
    // The stash is smaller than every stashing forward's tensors summed.
    int64_t each = 0;
    for (const Op& op : g.ops) {
      if (op.stage == 0 && op.micro_batch == 0) each += saved_bytes(op);
    }
    CHECK(l.bytes < each);
  }

  TEST_CASE("an MTP module's saved tensors have places of their own, apart from the main model's") {
    // tiny-moe with one MTP module on the last of two stages: every forward of a micro-batch that keeps a
    // tensor has a key of its own (two forwards under one key would write one slice), the main model's final
    // norm and the MTP module's included, and each one's backward reads its own forward's place.
    const std::string plan = test::tiny_plan(2, std::string(test::kPp2) + ", \"mtp_layers\": 1", 256, 8);
    const RunInputs in = test::load_tiny("acts_mtp", plan);
    const OpGraph& g = in.graph;
    const ActivationLayout l = activation_layout(g, 1);
    std::map<ActivationLayout::Key, int> saving;  // forwards of micro-batch 0 keeping a tensor, by key
    std::map<uint16_t, int64_t> norm_at;          // micro-batch 0's final norms' places, by name
    for (const Op& op : g.ops) {
      if (op.stage != 1 || op.micro_batch != 0 || saved_bytes(op) <= 0) continue;
      ++saving[{op.layer, op.name}];
      const auto name = static_cast<OpName>(op.name);
      if (name == OpName::kFinalNorm || name == OpName::kMtpFinalNorm) norm_at[op.name] = l.offset_of(op);
    }
    REQUIRE(!saving.empty());
    for (const auto& [key, n] : saving) {
      CAPTURE(key.first);
      CAPTURE(kOpNames[key.second]);
      CHECK(n == 1);
    }
    REQUIRE(norm_at.size() == 2);
    CHECK(norm_at.begin()->second >= 0);
    CHECK(norm_at.begin()->second != std::next(norm_at.begin())->second);
    for (const Op& op : g.ops) {
      const auto name = static_cast<OpName>(op.name);
      if (op.stage != 1 || op.micro_batch != 0 || !reads_saved(op) ||
          (name != OpName::kFinalNorm && name != OpName::kMtpFinalNorm))
        continue;
      CHECK(l.offset_of(op) == norm_at.at(op.name));
    }
  }

  TEST_CASE("recomputed forwards keep nothing in the stashes") {
    const std::string plan =
        test::tiny_plan(2, std::string(test::kPp2) + ", \"recompute\": \"full\"", 256, 8);
    const RunInputs in = test::load_tiny("acts_recompute", plan);
    const OpGraph& g = in.graph;
    const ActivationLayout l = activation_layout(g, 0);
    std::set<std::pair<int32_t, uint16_t>> recomputed;
    for (const Op& op : g.ops) {
      if (op.stage == 0 && op.phase == Phase::kRecompute) recomputed.insert({op.layer, op.name});
    }
    REQUIRE(!recomputed.empty());
    for (const auto& key : recomputed) CHECK(!l.slices.contains(key));
    // Without recompute the same stage stashes more.
    const RunInputs plain = test::load_tiny("acts_plain", test::tiny_plan(2, test::kPp2, 256, 8));
    CHECK(activation_layout(plain.graph, 0).bytes > l.bytes);
  }

  TEST_CASE("the stashes hold no more than the memory model's activations of the stage that needs most") {
    // tiny-moe on two stages, and the device check's plans (executor/cuda), whose replay must fit one GPU.
    std::vector<RunInputs> runs;
    for (const std::string fields : {test::kPp2, test::kPp2Vpp2})
      runs.push_back(test::load_tiny("acts_memory", test::tiny_plan(2, fields, 256, 8)));
    for (const char* plan : {"device_plan", "device_plan_fp8", "device_plan_pp2"}) {
      Result<RunInputs> in =
          load_run_inputs(std::string(MOEPLAN_SOURCE_DIR) + "/executor/cuda/" + plan + ".json");
      REQUIRE(in);
      runs.push_back(std::move(in).value());
    }
    for (const RunInputs& in : runs) {
      CAPTURE(in.loaded.path);
      const Result<StackProfile> stack = io::load_stack("moerun");
      REQUIRE(stack);
      const cost::MemoryBreakdown m =
          predict_memory(in.loaded.model, in.loaded.plan, in.loaded.hardware, stack.value(), in.routing);
      const ActivationLayout l = activation_layout(in.graph, static_cast<int>(m.stage));
      CAPTURE(l.bytes);
      CAPTURE(m.activations);
      CHECK(l.bytes > 0);
      CHECK(static_cast<double>(l.bytes) <= m.activations);
    }
  }
}

}  // namespace moeplan::executor
