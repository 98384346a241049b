// Shared by the report tests: an example plan simulated as `moeplan simulate` does, and what its page's
// timeline draws.
#pragma once

#include <algorithm>
#include <cstdint>
#include <regex>
#include <string>
#include <vector>

#include "planner/report/html_report.h"
#include "simulator/io/plan_io.h"
#include "simulator/io/stack_loader.h"
#include "simulator/predict/predict.h"
#include "simulator/predict/report.h"

namespace moeplan::test {

// An example plan, simulated as `moeplan simulate` does (default stack: moerun; uniform routing).
struct Simulated {
  io::LoadedPlan in;
  StackProfile stack;
  Prediction p;
  explicit Simulated(const std::string& example, const PredictOptions& options = {})
      : in(io::load_plan(std::string(MOEPLAN_SOURCE_DIR) + "/planner/examples/" + example).value()),
        stack(io::load_stack(in.plan.stack.empty() ? "moerun" : in.plan.stack,
                             std::string(MOEPLAN_SOURCE_DIR) + "/planner/examples")
                  .value()),
        p(predict(in.model, in.plan, in.hardware, stack, workload::uniform_routing(in.model.moe.num_experts),
                  options)) {}
  ReportContext ctx() const { return {in.plan, in.model, in.hardware, stack}; }
};

// Timeline rectangles of ops in the page, with the ops each stands for (data-ops).
inline std::vector<int64_t> op_rects(const std::string& html) {
  std::vector<int64_t> out;
  const std::regex rect(R"re(<rect class="op" data-ops="(\d+)")re");
  for (auto it = std::sregex_iterator(html.begin(), html.end(), rect); it != std::sregex_iterator(); ++it) {
    out.push_back(std::stoll((*it)[1]));
  }
  return out;
}

inline int64_t ops_with_duration(const Prediction& p, const std::vector<int32_t>& stages) {
  int64_t n = 0;
  for (const Op& op : p.graph.ops) {
    const auto& t = p.timeline.ops[static_cast<size_t>(op.id)];
    if (t.end > t.start && std::find(stages.begin(), stages.end(), op.stage) != stages.end()) ++n;
  }
  return n;
}

}  // namespace moeplan::test
