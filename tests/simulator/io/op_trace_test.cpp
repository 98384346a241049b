// The per-op summary (each row's count and time, the message of its last op), and the Chrome trace writer's
// selection: a large step's trace keeps the micro-batches and stages asked for, every op of no micro-batch,
// and says what it left out; bad selections are one-line errors naming the option.
#include "simulator/io/op_trace.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "simulator/io/model_loader.h"
#include "simulator/workload/lower.h"

using namespace moeplan;

namespace {

// tiny-moe on 4 pipeline stages with 8 micro-batches (or `micro_batches`), timed with unit durations (the
// writer does not care).
struct Step {
  OpGraph graph;
  std::vector<OpTiming> timing;
  explicit Step(int64_t micro_batches = 8) {
    Result<ModelSpec> m = io::load_model("tiny-moe");
    REQUIRE(m);
    Plan p;
    p.gpus = 4;
    p.seq_len = 256;
    p.global_batch = micro_batches;
    p.pipeline.pp = 4;
    p.pipeline.layers_per_stage = {1, 1, 1, 1};
    REQUIRE(m.value().num_layers() == 4);
    graph = lower(m.value(), p, LoweringOptions{});
    for (const Op& op : graph.ops) timing.push_back({static_cast<double>(op.id), op.id + 1.0});
  }
};

}  // namespace

TEST_SUITE("io") {
  TEST_CASE("a trace selection keeps the first micro-batches of the listed stages and says so") {
    const Step s;
    REQUIRE(s.graph.num_stages == 4);
    const nlohmann::json all = nlohmann::json::parse(chrome_trace(s.graph, s.timing));
    CHECK_FALSE(all.contains("otherData"));
    Result<TraceSelection> sel = parse_trace_selection(2, "0,2-3", 4);
    REQUIRE(sel);
    CHECK(sel.value().stages == std::vector<int>{0, 2, 3});
    const nlohmann::json some = nlohmann::json::parse(chrome_trace(s.graph, s.timing, sel.value()));
    int64_t shown = 0;
    for (const auto& e : some.at("traceEvents")) {
      if (e.at("ph") != "X") continue;
      ++shown;
      CHECK(e.at("pid") != 1);
      CHECK(e.at("args").at("micro_batch").get<int>() < 2);
    }
    CHECK(shown == trace_events(s.graph, sel.value()));
    int64_t expected = 0;
    for (const Op& op : s.graph.ops) expected += op.stage != 1 && op.micro_batch < 2 ? 1 : 0;
    CHECK(shown == expected);
    CHECK(some.at("otherData")
              .at("selection")
              .get<std::string>()
              .find("micro-batches 0..1, stages 0,2,3; the step has 8 micro-batch(es) and 4 stage(s)") == 0);
  }

  TEST_CASE("the default selection keeps the longest prefix of micro-batches within the event budget") {
    const Step s;
    const int64_t total = trace_events(s.graph, {});
    CHECK(trace_micro_batches_within(s.graph, {}, total) == 0);  // fits whole
    const int64_t three = trace_events(s.graph, {.micro_batches = 3, .stages = {}});
    CHECK(trace_micro_batches_within(s.graph, {}, three) == 3);
    CHECK(trace_micro_batches_within(s.graph, {}, three + 1) == 3);
    CHECK(trace_micro_batches_within(s.graph, {}, 1) == 1);  // never fewer than one
  }

  TEST_CASE("the per-op summary counts each row's ops and shows the message of its last op") {
    // Small and large graphs (passes over 4,096 ops or more read ahead: the same rows).
    for (const int64_t micro_batches : {int64_t{8}, int64_t{64}}) {
      CAPTURE(micro_batches);
      Step s(micro_batches);
      if (micro_batches == 64) CHECK(s.graph.ops.size() >= kOpPrefetchMinOps);
      // Each row's ops in id order, by (stage, label, phase).
      std::map<std::tuple<int, std::string, Phase>, std::vector<size_t>> ops_of;
      for (size_t i = 0; i < s.graph.ops.size(); ++i) {
        const Op& op = s.graph.ops[i];
        ops_of[{op.stage, op_label(op), op.phase}].push_back(i);
      }
      // A row of several collectives: its first and last op get different messages.
      const std::vector<size_t>* exchange = nullptr;
      for (const auto& [key, ids] : ops_of) {
        if (s.graph.ops[ids.front()].kind == OpKind::kCollective && ids.size() > 1) {
          exchange = &ids;
          break;
        }
      }
      REQUIRE(exchange != nullptr);
      s.graph.ops[exchange->front()].comm.bytes = 999;
      s.graph.ops[exchange->back()].comm.bytes = 12345;
      const std::vector<OpSummaryRow> rows = op_summary(s.graph, s.timing);
      REQUIRE(rows.size() == ops_of.size());
      int64_t counted = 0;
      for (const OpSummaryRow& r : rows) {
        const auto it = ops_of.find({r.stage, r.op, r.phase});
        REQUIRE(it != ops_of.end());
        CHECK(r.count == static_cast<int64_t>(it->second.size()));
        CHECK(r.total_s == doctest::Approx(static_cast<double>(r.count)));  // unit durations
        const Op& last = s.graph.ops[it->second.back()];
        CHECK(r.kind == last.kind);
        CHECK(r.bytes == last.comm.bytes);
        counted += r.count;
      }
      CHECK(counted == static_cast<int64_t>(s.graph.ops.size()));
      const Op& changed = s.graph.ops[exchange->back()];
      const auto row = std::find_if(rows.begin(), rows.end(), [&](const OpSummaryRow& r) {
        return r.stage == changed.stage && r.op == op_label(changed) && r.phase == changed.phase;
      });
      REQUIRE(row != rows.end());
      CHECK(row->bytes == 12345);
      CHECK(row->comm);
    }
  }

  TEST_CASE("bad trace selections name the option and the stages that exist") {
    CHECK(parse_trace_selection(-2, "", 4).error().message.find("--trace-micro-batches -2") == 0);
    for (const char* bad : {"x", "1-", "3-1", "4", "0,,1"}) {
      CAPTURE(bad);
      Result<TraceSelection> r = parse_trace_selection(0, bad, 4);
      REQUIRE_FALSE(r);
      CHECK(r.error().message.find(std::string("--trace-stages ") + bad) == 0);
      CHECK(r.error().message.find("stages are 0..3") != std::string::npos);
    }
  }
}
