// The HTML report (issue #8): self-contained (nothing fetched, no script), its summary numbers are the --json
// report's, one SVG per chart, one timeline rectangle per op (or per merged run of ops, within the budget),
// exposed-communication and idle marks that add up to the breakdown, escaped text; and the --html flag of
// `simulate` and `plan` as a user meets it. The rendering in a browser is html_chromium_test.sh.
#include <doctest/doctest.h>

#include "tests/planner/cli/run_moeplan.h"

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "planner/report/html_report.h"
#include "planner/search.h"
#include "simulator/io/hardware_loader.h"
#include "simulator/io/model_loader.h"
#include "simulator/io/plan_io.h"
#include "simulator/io/stack_loader.h"
#include "simulator/predict/predict.h"
#include "simulator/predict/report.h"
#include "tests/planner/report/report_fixtures.h"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace moeplan;
using moeplan::test::Simulated;

namespace {

int64_t count(const std::string& text, const std::string& what) {
  int64_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

// Nothing the browser would fetch or run: no URL, no <link>/<script>/<img>/@import, every url() a reference
// to a pattern defined in the page, every src= a data: URI.
void check_self_contained(const std::string& html) {
  CHECK(html.starts_with("<!DOCTYPE html>"));
  for (const char* bad :
       {"http://", "https://", "<link", "<script", "<img", "<iframe", "@import", "//fonts"}) {
    CAPTURE(bad);
    CHECK(html.find(bad) == std::string::npos);
  }
  const std::regex url(R"(url\(([^)]*)\))");
  for (auto it = std::sregex_iterator(html.begin(), html.end(), url); it != std::sregex_iterator(); ++it) {
    const std::string target = (*it)[1];
    CAPTURE(target);
    CHECK(target.starts_with("#"));
    CHECK(html.find("id=\"" + target.substr(1) + "\"") != std::string::npos);
  }
  const std::regex src(R"(src\s*=\s*["']?([^"' >]*))");
  for (auto it = std::sregex_iterator(html.begin(), html.end(), src); it != std::sregex_iterator(); ++it) {
    CHECK(std::string((*it)[1]).starts_with("data:"));
  }
}

// The summary cards: data-key -> the exact JSON value the card shows.
std::map<std::string, json> cards(const std::string& html) {
  std::map<std::string, json> out;
  const std::regex card(R"re(class="kpi" data-key="([^"]+)" data-value="([^"]*)")re");
  for (auto it = std::sregex_iterator(html.begin(), html.end(), card); it != std::sregex_iterator(); ++it) {
    out[(*it)[1]] = json::parse(std::string((*it)[2]));  // numbers and booleans: nothing to unescape
  }
  return out;
}

json at_dotted(const json& j, const std::string& key) {
  const size_t dot = key.find('.');
  return dot == std::string::npos ? j.at(key) : j.at(key.substr(0, dot)).at(key.substr(dot + 1));
}

}  // namespace

TEST_SUITE("report.html") {
  TEST_CASE("html_escape turns every markup character into an entity") {
    CHECK(report::html_escape(R"(<a href="x">Tom & 'Jerry'</a>)") ==
          "&lt;a href=&quot;x&quot;&gt;Tom &amp; &#39;Jerry&#39;&lt;/a&gt;");
    CHECK(report::html_escape("plain text 1.5 GB") == "plain text 1.5 GB");
  }

  TEST_CASE("the simulate page is self-contained and its summary cards hold the --json numbers") {
    const Simulated s("tiny-moe-ep2.json");
    REQUIRE(s.p.violations.empty());
    const std::string html = report::simulate_html(s.p, s.ctx());
    check_self_contained(html);

    const json r = prediction_json(s.p, s.ctx());
    const auto c = cards(html);
    CHECK(c.size() == 6);
    for (const char* key : {"step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "mfu",
                            "memory.per_gpu_bytes", "memory.fits"}) {
      CAPTURE(key);
      REQUIRE(c.contains(key));
      CHECK(c.at(key) == at_dotted(r, key));
    }
    // The shown text is those numbers, rounded.
    CHECK(html.find(fmt::format("<div class=\"v\">{:.1f}%</div>", 100 * s.p.mfu)) != std::string::npos);
    CHECK(html.find(fmt::format("<div class=\"v\">{:.1f}</div>", s.p.tokens_per_s_per_gpu)) !=
          std::string::npos);
    CHECK(html.find(fmt::format("<div class=\"v\">{:.1f} GiB</div>",
                                s.p.memory.total() / (1024.0 * 1024.0 * 1024.0))) != std::string::npos);
    // The breakdown table lists every part of the --json breakdown with its exact seconds.
    std::map<std::string, json> parts;
    const std::regex part(R"re(<tr data-part="([^"]+)" data-seconds="([^"]+)")re");
    for (auto it = std::sregex_iterator(html.begin(), html.end(), part); it != std::sregex_iterator(); ++it) {
      parts[(*it)[1]] = json::parse(std::string((*it)[2]));
    }
    const json& b = r.at("breakdown");
    size_t expected = (b.at("optimizer").get<double>() > 0) + (b.at("bubble").get<double>() > 0) +
                      (b.at("host_wait").get<double>() > 0);
    for (const auto& [k, v] : b.at("compute").items()) {
      CAPTURE(k);
      REQUIRE(parts.contains(k));
      CHECK(parts.at(k) == v);
      ++expected;
    }
    for (const auto& [k, v] : b.at("exposed_comm").items()) {
      CAPTURE(k);
      REQUIRE(parts.contains("exposed:" + k));
      CHECK(parts.at("exposed:" + k) == v);
      ++expected;
    }
    CHECK(parts.size() == expected);
    if (b.at("bubble").get<double>() > 0) CHECK(parts.at("bubble") == b.at("bubble"));
    if (b.at("host_wait").get<double>() > 0) CHECK(parts.at("host_wait") == b.at("host_wait"));
  }

  TEST_CASE("the simulate page has one svg per chart: breakdown, memory and timeline") {
    const Simulated s("tiny-moe-ep2.json");
    const std::string html = report::simulate_html(s.p, s.ctx());
    CHECK(count(html, "<svg") == 3);
    CHECK(count(html, "</svg>") == 3);
    CHECK(count(html, "<svg class=\"chart breakdown\"") == 1);
    CHECK(count(html, "<svg class=\"chart memory\"") == 1);
    CHECK(count(html, "<svg class=\"chart timeline\"") == 1);
  }

  TEST_CASE("the simulate page says what priced each routed all-to-all, the table's source escaped") {
    // tiny-moe on 2 ranks, ep 2, uniform routing: the busiest rank's expected load is above the mean, and the
    // built-in profile has no hot-receiver table, so the page marks the exchange's price as assumed. A
    // measured table is named, its source escaped.
    Simulated s("tiny-moe-ep2.json");
    REQUIRE(s.p.hot_exchanges.size() == 1);
    const std::string html = report::simulate_html(s.p, s.ctx());
    CHECK(count(html, "data-hot-alltoall=\"assumed\"") == 1);
    CHECK(html.find(fmt::format("Routed all-to-alls on 2 ranks / 1 node(s), busiest rank {:.3f}×",
                                s.p.hot_exchanges[0].hot_factor)) != std::string::npos);
    s.p.hot_exchanges[0].table_source = "<b>bench</b> & co";
    const std::string measured = report::simulate_html(s.p, s.ctx());
    CHECK(count(measured, "data-hot-alltoall=\"measured\"") == 1);
    CHECK(count(measured, "data-hot-alltoall=\"assumed\"") == 0);
    CHECK(measured.find("(&lt;b&gt;bench&lt;/b&gt; &amp; co)") != std::string::npos);
  }

  TEST_CASE("names from the inputs are escaped in the page") {
    Simulated s("tiny-moe-ep2.json");
    s.in.model.name = R"(<script>alert("x")</script> & co)";
    s.in.hardware.name = "<b>gpu</b>";
    const std::string html = report::simulate_html(s.p, s.ctx());
    CHECK(html.find("&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; co") != std::string::npos);
    CHECK(html.find("&lt;b&gt;gpu&lt;/b&gt;") != std::string::npos);
    CHECK(html.find("<script") == std::string::npos);
    CHECK(html.find("<b>gpu") == std::string::npos);
  }

  TEST_CASE("the settings table says which overlaps the plan turns on and how it routes") {
    Simulated s("tiny-moe-ep2.json");
    Plan plan = s.in.plan;
    plan.overlap.cross_micro_batch = true;
    plan.overlap.delay_wgrad = true;
    plan.overlap.shared_experts = true;
    plan.routing.capacity_factor = 1.0;
    plan.routing.pad_to_capacity = true;
    const std::string html = report::simulate_html(s.p, {plan, s.in.model, s.in.hardware, s.stack});
    CHECK(html.find("across micro-batches on (weight gradients delayed)") != std::string::npos);
    CHECK(html.find("TE userbuffers off") != std::string::npos);
    CHECK(html.find("shared experts beside the dispatch on") != std::string::npos);
    CHECK(html.find("capacity factor 1, padded to capacity") != std::string::npos);
    CHECK(html.find("<td>CUDA graphs</td><td>none</td>") != std::string::npos);
    plan.cuda_graphs = kGraphAttn | kGraphMoeRouter;
    const std::string graphed = report::simulate_html(s.p, {plan, s.in.model, s.in.hardware, s.stack});
    CHECK(graphed.find("<td>CUDA graphs</td><td>per layer: attn, moe_router</td>") != std::string::npos);
  }

  TEST_CASE("an illegal plan's page lists the rules it breaks and draws no chart") {
    Simulated s("tiny-moe-ep2.json");
    s.in.plan.attention.tp = 3;  // divides neither the heads nor the GPUs
    const Prediction p = predict(s.in.model, s.in.plan, s.in.hardware, s.stack,
                                 workload::uniform_routing(s.in.model.moe.num_experts));
    REQUIRE(!p.violations.empty());
    const std::string html = report::simulate_html(p, s.ctx());
    check_self_contained(html);
    CHECK(html.find("cannot run") != std::string::npos);
    for (const auto& v : p.violations) CHECK(html.find(report::html_escape(v.reason)) != std::string::npos);
    CHECK(count(html, "<svg") == 0);
  }

  TEST_CASE("the plan page ranks the top plans with their numbers and details the best one") {
    const ModelSpec model = io::load_model("tiny-moe").value();
    const HardwareProfile hw = io::load_hardware("h100-sxm").value();
    const StackProfile stack = io::load_stack("moerun").value();
    const auto routing = workload::uniform_routing(model.moe.num_experts);
    const planner::Job job{8, 256, 32};
    planner::SearchOptions opts;
    opts.top = 4;
    opts.keep_graphs = true;
    const planner::SearchResult r =
        planner::search(model, hw, stack, routing, job, planner::SearchSpace{}, opts);
    REQUIRE(r.plans.size() == 4);
    const std::string html = report::plan_html({r, job, model, hw, stack, &r.plans[0].prediction});
    check_self_contained(html);
    // Two bar charts, the breakdowns and memory of the top plans, then the best plan's three.
    CHECK(count(html, "<svg") == 7);
    CHECK(count(html, "<svg class=\"chart bars\"") == 2);
    CHECK(count(html, "<svg class=\"chart timeline\"") == 1);
    for (size_t i = 0; i < r.plans.size(); ++i) {
      const double tps = r.plans[i].prediction.tokens_per_s;
      CAPTURE(i);
      CHECK(html.find(fmt::format("<tr data-rank=\"{}\" data-tokens-per-s=\"{}\">", i + 1,
                                  json(tps).dump())) != std::string::npos);
      CHECK(html.find(report::html_escape(planner::describe(r.plans[i].plan))) != std::string::npos);
    }
    const auto c = cards(html);
    REQUIRE(c.contains("tokens_per_s"));
    CHECK(c.at("tokens_per_s") == json(r.plans[0].prediction.tokens_per_s));
    // moerun captures no CUDA graphs: the header says nothing of them; a search that tried them says so.
    CHECK(html.find("held up by the host") == std::string::npos);
    planner::SearchResult tried = r;
    tried.graph_tried = 3;
    tried.graph_kept = 2;
    const std::string with = report::plan_html({tried, job, model, hw, stack, &r.plans[0].prediction});
    CHECK(with.find("(3 held up by the host simulated again with CUDA graphs, 2 faster with them)") !=
          std::string::npos);
  }
}

TEST_SUITE("cli") {
  using namespace moeplan::test;

  TEST_CASE("simulate --html writes a page whose summary equals simulate --json") {
    const std::string plan =
        std::string(MOEPLAN_SOURCE_DIR) + "/planner/examples/mixtral-8x22b-128xh100.json";
    const fs::path page = fs::temp_directory_path() / fmt::format("moeplan_html_{}.html", ::getpid());
    fs::remove(page);
    const Run h = run_cli(fmt::format("simulate '{}' --html '{}'", plan, page.string()));
    CHECK(h.exit_code == 0);
    CHECK(h.err.empty());
    REQUIRE(fs::exists(page));
    CHECK(!fs::exists(page.string() + ".tmp"));
    const std::string html = slurp(page.string());
    fs::remove(page);
    check_self_contained(html);
    const Run j = run_cli(fmt::format("simulate '{}' --json", plan));
    REQUIRE(j.exit_code == 0);
    const json r = json::parse(j.out);
    const auto c = cards(html);
    CHECK(c.size() == 6);
    for (const auto& [key, value] : c) {
      CAPTURE(key);
      CHECK(value == at_dotted(r, key));
    }
    // The step over the stack's and the hardware's unmeasured numbers, with the number it moves with most.
    CHECK(html.find("Over the stack's and the hardware's unmeasured numbers") != std::string::npos);
    CHECK(html.find("<code>" + r.at("assumptions").at("numbers")[0].at("number").get<std::string>() +
                    "</code>") != std::string::npos);
  }

  TEST_CASE("simulate --html into a missing directory exits 2 with one line and writes nothing") {
    const std::string plan = std::string(MOEPLAN_SOURCE_DIR) + "/planner/examples/tiny-moe-ep2.json";
    const Run r = run_cli(fmt::format("simulate '{}' --html /nonexistent/dir/x.html", plan));
    CHECK(r.exit_code == 2);
    CHECK(lines(r.err) == 1);
    CHECK(r.err.find("/nonexistent/dir/x.html") != std::string::npos);
    CHECK(r.out.empty());
    CHECK(!fs::exists("/nonexistent/dir/x.html"));
  }

  TEST_CASE("simulate --html onto a directory exits 2 and leaves no temporary file") {
    // The write itself succeeds (into PATH.tmp) and the rename fails: the half-step must be cleaned up.
    const fs::path dir = fs::temp_directory_path() / fmt::format("moeplan_html_dir_{}", ::getpid());
    fs::create_directories(dir / "page.html");
    const std::string plan = std::string(MOEPLAN_SOURCE_DIR) + "/planner/examples/tiny-moe-ep2.json";
    const Run r = run_cli(fmt::format("simulate '{}' --html '{}'", plan, (dir / "page.html").string()));
    CHECK(r.exit_code == 2);
    CHECK(lines(r.err) == 1);
    CHECK(fs::is_directory(dir / "page.html"));
    CHECK(!fs::exists(dir / "page.html.tmp"));
    fs::remove_all(dir);
  }

  TEST_CASE("plan --html writes the top plans page, and a missing directory fails before the search") {
    const fs::path page = fs::temp_directory_path() / fmt::format("moeplan_plan_html_{}.html", ::getpid());
    fs::remove(page);
    const std::string job =
        "--model tiny-moe --hardware h100-sxm --gpus 8 --seq-len 256 --global-batch 32 --top 3";
    const Run ok = run_cli(fmt::format("plan {} --html '{}'", job, page.string()));
    CHECK(ok.exit_code == 0);
    REQUIRE(fs::exists(page));
    const std::string html = slurp(page.string());
    fs::remove(page);
    check_self_contained(html);
    CHECK(count(html, "<tr data-rank=") == 3);
    CHECK(count(html, "<svg class=\"chart timeline\"") == 1);

    const Run bad = run_cli(fmt::format("plan {} --html /nonexistent/dir/x.html", job));
    CHECK(bad.exit_code == 2);
    CHECK(lines(bad.err) == 1);
    CHECK(bad.out.empty());
  }
}
