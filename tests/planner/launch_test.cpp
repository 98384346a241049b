// Launch configurations (planner/launch.h): every Megatron flag exists in Megatron-LM's list and each plan's
// arguments keep the cross-flag rules of shared/reference/megatron-flags.md; the moerun plan file
// round-trips; mpirun / srun / sbatch carry the right node and rank counts; `moeplan launch` behaves as a
// CLI.
#include <doctest/doctest.h>

#include "tests/planner/cli/run_moeplan.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <numeric>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner/launch.h"
#include "simulator/io/hardware_loader.h"
#include "simulator/io/model_loader.h"
#include "simulator/io/plan_io.h"

using namespace moeplan;
namespace fs = std::filesystem;

namespace {

using namespace moeplan::test;  // Run, slurp, run_cli, lines

std::vector<std::string> flag_names_in(const std::string& path) {
  std::vector<std::string> names;
  std::istringstream in(slurp(path));
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with("--")) names.push_back(line);
  }
  return names;
}

// Megatron-LM's accepted flags: the copy under tests/planner/data (so that the tests need no ../shared).
const std::set<std::string>& known_flags() {
  static const std::set<std::string> names = [] {
    const auto v = flag_names_in(std::string(MOEPLAN_SOURCE_DIR) + "/tests/planner/data/megatron_flags.txt");
    return std::set<std::string>(v.begin(), v.end());
  }();
  return names;
}

const ModelSpec& model(const std::string& name) {
  static std::map<std::string, ModelSpec> cache;
  auto it = cache.find(name);
  if (it == cache.end()) {
    Result<ModelSpec> m = io::load_model(name);
    REQUIRE_MESSAGE(m.ok(), (m.ok() ? "" : m.error().message));
    it = cache.emplace(name, m.value()).first;
  }
  return it->second;
}

const HardwareProfile& hardware(const std::string& name) {
  static std::map<std::string, HardwareProfile> cache;
  auto it = cache.find(name);
  if (it == cache.end()) {
    Result<HardwareProfile> h = io::load_hardware(name);
    REQUIRE_MESSAGE(h.ok(), (h.ok() ? "" : h.error().message));
    it = cache.emplace(name, h.value()).first;
  }
  return it->second;
}

Plan make_plan(const std::string& model_name, int64_t gpus, int64_t seq, int64_t global_batch) {
  Plan p;
  p.model = model_name;
  p.hardware = "h100-sxm";
  p.gpus = gpus;
  p.seq_len = seq;
  p.global_batch = global_batch;
  return p;
}

// Mixtral-8x7B on one node of 8 H100s, EP 8.
Plan mixtral_ep8() {
  Plan p = make_plan("mixtral-8x7b", 8, 4096, 32);
  p.experts.ep = 8;
  return p;
}

// The flags as a map: name -> values, with single quotes removed (shell words as emitted).
struct Flags {
  std::map<std::string, std::vector<std::string>> values;
  std::vector<std::string> order;

  bool has(const std::string& n) const { return values.count(n) > 0; }
  std::vector<std::string> list(const std::string& n) const {
    auto it = values.find(n);
    return it == values.end() ? std::vector<std::string>{} : it->second;
  }
  std::string str(const std::string& n, const std::string& fallback = "") const {
    const auto v = list(n);
    return v.empty() ? fallback : v[0];
  }
  int64_t num(const std::string& n, int64_t fallback) const {
    const auto v = list(n);
    return v.empty() ? fallback : std::stoll(v[0]);
  }
};

std::vector<std::string> shell_words(const std::string& line) {
  std::vector<std::string> words;
  std::string cur;
  bool quoted = false, any = false;
  for (char c : line) {
    if (c == '\'') {
      quoted = !quoted;
      any = true;
    } else if (c == ' ' && !quoted) {
      if (any) words.push_back(cur);
      cur.clear();
      any = false;
    } else {
      cur += c;
      any = true;
    }
  }
  if (any) words.push_back(cur);
  return words;
}

Flags parse_flags(const std::vector<std::string>& lines) {
  Flags f;
  for (const std::string& line : lines) {
    std::vector<std::string> w = shell_words(line);
    REQUIRE(!w.empty());
    CHECK_MESSAGE(f.values.count(w[0]) == 0, "flag given twice: " << w[0]);
    f.order.push_back(w[0]);
    f.values[w[0]] = std::vector<std::string>(w.begin() + 1, w.end());
  }
  return f;
}

// A Megatron list expression ("([0]*3+[1]*58)", "([0,1]*24)"): terms joined by '+', each a bracketed list or
// a parenthesised expression, optionally '*' a count (A:327-350).
class ListExpr {
 public:
  explicit ListExpr(std::string s) : s_(std::move(s)) {}
  std::vector<int> parse() {
    std::vector<int> v = expr();
    CHECK(i_ == s_.size());
    return v;
  }

 private:
  std::vector<int> expr() {
    std::vector<int> out = term();
    while (peek('+')) {
      ++i_;
      const auto t = term();
      out.insert(out.end(), t.begin(), t.end());
    }
    return out;
  }
  std::vector<int> term() {
    std::vector<int> a;
    if (peek('(')) {
      ++i_;
      a = expr();
      REQUIRE(peek(')'));
      ++i_;
    } else {
      REQUIRE(peek('['));
      ++i_;
      a.push_back(number());
      while (peek(',')) {
        ++i_;
        a.push_back(number());
      }
      REQUIRE(peek(']'));
      ++i_;
    }
    if (peek('*')) {
      ++i_;
      const int n = number();
      std::vector<int> r;
      for (int k = 0; k < n; ++k) r.insert(r.end(), a.begin(), a.end());
      return r;
    }
    return a;
  }
  int number() {
    size_t j = i_;
    while (j < s_.size() && std::isdigit(static_cast<unsigned char>(s_[j]))) ++j;
    REQUIRE(j > i_);
    const int n = std::stoi(s_.substr(i_, j - i_));
    i_ = j;
    return n;
  }
  bool peek(char c) const { return i_ < s_.size() && s_[i_] == c; }
  std::string s_;
  size_t i_ = 0;
};

// The per-layer pattern an --moe-layer-freq / --window-attn-skip-freq value gives: an int N marks the layers
// with index % N == 0 (index 0-based for MoE, 1-based layer numbers for windows), a list marks its 1s.
std::vector<int> layer_pattern(const std::string& value, int64_t layers, size_t offset) {
  const bool allowed = value.find_first_not_of("0123456789,[]()+*") == std::string::npos;
  CHECK_MESSAGE(allowed, "only digits , [ ] ( ) + * are allowed (A:245-253): " << value);
  std::vector<int> bits;
  if (!value.empty() && std::isdigit(static_cast<unsigned char>(value[0]))) {
    const int64_t n = std::stoll(value);
    for (int64_t i = 0; i < layers; ++i) bits.push_back((i + static_cast<int64_t>(offset)) % n == 0 ? 1 : 0);
  } else {
    bits = ListExpr(value).parse();
    CHECK_MESSAGE(static_cast<int64_t>(bits.size()) == layers,
                  "one entry per layer (gpt_layer_specs.py:643-671)");
  }
  return bits;
}

// Every rule of megatron-flags.md that these flags can break, each with the line range it rests on.
void check_megatron_rules(const Plan& p, const ModelSpec& m, const planner::MegatronArgs& args) {
  const Flags f = parse_flags(args.flags);
  for (const std::string& name : f.order)
    CHECK_MESSAGE(known_flags().count(name) == 1, "unknown flag " << name);

  const int64_t world = p.gpus;
  const int64_t tp = f.num("--tensor-model-parallel-size", 1);
  const int64_t pp = f.num("--pipeline-model-parallel-size", 1);
  const int64_t cp = f.num("--context-parallel-size", 1);
  const int64_t ep = f.num("--expert-model-parallel-size", 1);
  const int64_t etp = f.num("--expert-tensor-parallel-size", tp);  // defaults to TP (A:587-588)
  const int64_t layers = f.num("--num-layers", 0);
  const int64_t experts = f.num("--num-experts", 0);
  const int64_t mtp = f.num("--mtp-num-layers", 0);
  const bool moe = experts > 0;

  // The plan, as Megatron sees it: our Ulysses SP and CP both become context parallelism.
  CHECK(tp == p.attention.tp);
  CHECK(pp == p.pipeline.pp);
  CHECK(cp == p.attention.sp * p.attention.cp);
  CHECK(layers == m.num_layers());
  CHECK(f.num("--hidden-size", 0) == m.hidden);
  CHECK(f.num("--num-attention-heads", 0) == m.attention.num_heads);
  CHECK(experts == m.moe.num_experts);
  if (moe) CHECK(ep == p.experts.ep);
  if (moe) CHECK(etp == p.experts.etp);

  // Required shape flags (A:1314-1317); max positions at least the sequence (A:1353-1356).
  for (const char* required :
       {"--num-layers", "--hidden-size", "--num-attention-heads", "--max-position-embeddings"})
    CHECK_MESSAGE(f.has(required), required << " is required");
  CHECK(f.num("--max-position-embeddings", 0) >= f.num("--seq-length", 0));
  CHECK(f.num("--seq-length", 0) == p.seq_len);

  // Dense and expert grids (A:411-448, PS:815-902): DP = world / (TP x PP x CP); ETP x EP divides TP x CP x
  // DP.
  REQUIRE(world % (tp * pp * cp) == 0);
  const int64_t dp = world / (tp * pp * cp);
  CHECK(world % (etp * ep * pp) == 0);
  CHECK((tp * cp * dp) % (etp * ep) == 0);
  CHECK(dp == p.dp());

  // Sequence parallel: every MoE plan with TP > 1 (moe_layer.py:636-640); never with TP = 1 (MPC:502-504);
  // --tp-comm-overlap needs it (A:1441-1442).
  if (tp > 1 && moe) CHECK(f.has("--sequence-parallel"));
  if (tp == 1) CHECK_FALSE(f.has("--sequence-parallel"));
  if (f.has("--tp-comm-overlap")) CHECK(f.has("--sequence-parallel"));

  // Experts: --num-experts for EP > 1 and a multiple of EP (A:1654-1658); no linear bias when ETP > 1
  // (TC:2612-2615).
  if (ep > 1) CHECK(experts > 0);
  if (ep > 1) CHECK(experts % ep == 0);
  if (moe && etp > 1) CHECK(f.has("--disable-bias-linear"));

  // Heads (TC:1446-1468).
  CHECK(m.attention.num_heads % tp == 0);
  if (f.has("--group-query-attention")) {
    const int64_t groups = f.num("--num-query-groups", 1);
    const bool ok = groups % tp == 0 || tp % groups == 0;
    const bool reported =
        std::any_of(args.not_expressible.begin(), args.not_expressible.end(),
                    [](const std::string& r) { return r.find("query groups") != std::string::npos; });
    CHECK((ok || reported));
  }

  // Context parallel (A:580-585, A:1335-1338, TC:3103-3112).
  const auto cp_types = f.list("--cp-comm-type");
  CHECK((cp_types.size() <= 1 || static_cast<int64_t>(cp_types.size()) == layers));
  for (const std::string& t : cp_types) {
    CHECK((t == "p2p" || t == "a2a" || t == "all_gather" || t == "a2a+p2p"));
  }
  if (cp > 1) CHECK(p.seq_len % (2 * cp) == 0);
  if (std::find(cp_types.begin(), cp_types.end(), "a2a+p2p") != cp_types.end())
    CHECK(f.has("--hierarchical-context-parallel-sizes"));
  if (f.has("--hierarchical-context-parallel-sizes")) {
    int64_t product = 1;
    for (const auto& v : f.list("--hierarchical-context-parallel-sizes")) product *= std::stoll(v);
    CHECK(product == cp);
  }

  // Virtual pipeline and uneven stages (A:927-1019, TC:2229-2415).
  const bool by_layers = f.has("--num-layers-per-virtual-pipeline-stage");
  const bool by_count = f.has("--num-virtual-stages-per-pipeline-rank");
  const bool by_layout = f.has("--pipeline-model-parallel-layout");
  CHECK(int(by_layers) + int(by_count) + int(by_layout) <= 1);
  const bool has_first = f.has("--decoder-first-pipeline-num-layers");
  const bool has_last = f.has("--decoder-last-pipeline-num-layers");
  const int64_t account = int64_t(f.has("--account-for-embedding-in-pipeline-split")) +
                          int64_t(f.has("--account-for-loss-in-pipeline-split"));
  int64_t vpp = 1;
  if (by_count) vpp = f.num("--num-virtual-stages-per-pipeline-rank", 1);
  if (by_layers) {
    CHECK_FALSE((has_first || has_last));
    CHECK((layers + account) % pp == 0);
    const int64_t per_stage = (layers + account) / pp;
    const int64_t per_vstage = f.num("--num-layers-per-virtual-pipeline-stage", 1);
    CHECK(per_stage % per_vstage == 0);
    vpp = per_stage / per_vstage;
  }
  if (by_layout) {
    CHECK_FALSE((has_first || has_last || account > 0));
    std::vector<std::string> stages;
    std::string layout = f.str("--pipeline-model-parallel-layout"), cur;
    for (char c : layout + "|") {
      if (c == '|') {
        stages.push_back(cur);
        cur.clear();
      } else {
        cur += c;
      }
    }
    CHECK(static_cast<int64_t>(stages.size()) % pp == 0);
    vpp = static_cast<int64_t>(stages.size()) / pp;
    int64_t t = 0, mtp_count = 0, e_count = 0, l_count = 0;
    for (size_t s = 0; s < stages.size(); ++s) {
      std::istringstream items(stages[s]);
      for (std::string item; std::getline(items, item, ',');) {
        if (item.empty()) continue;
        const int64_t n = item.size() > 2 && item[1] == '*' ? std::stoll(item.substr(2)) : 1;
        if (item[0] == 't') t += n;
        if (item[0] == 'm') {
          mtp_count += n;
          CHECK(static_cast<int64_t>(s) / pp == vpp - 1);  // in the last virtual stage of its rank
        }
        if (item[0] == 'E') {
          e_count += n;
          CHECK(s == 0);
        }
        if (item[0] == 'L') {
          l_count += n;
          CHECK(s + 1 == stages.size());
        }
      }
    }
    CHECK(e_count == 1);
    CHECK(l_count == 1);
    CHECK(t == layers);
    CHECK(mtp_count == mtp);
  }
  if (vpp > 1) CHECK(pp > (f.has("--no-overlap-p2p-communication") ? 2 : 1));
  if (has_first || has_last) {
    CHECK(account == 0);
    const int64_t first = f.num("--decoder-first-pipeline-num-layers", 0);
    const int64_t last = f.num("--decoder-last-pipeline-num-layers", 0);
    if (has_first) CHECK((first > 0 && first % vpp == 0));
    if (has_last) CHECK((last > 0 && last % vpp == 0));
    const int64_t middle_layers = layers - first - last;
    const int64_t middle_stages = pp - int64_t(has_first) - int64_t(has_last);
    CHECK((middle_layers == 0) == (middle_stages == 0));
    if (middle_stages > 0) {
      CHECK(middle_layers % middle_stages == 0);
      CHECK((middle_layers / middle_stages) % vpp == 0);
    }
  } else if (!by_layout && !by_layers) {
    CHECK((layers + account) % pp == 0);
    CHECK(((layers + account) / pp) % vpp == 0);
  }
  CHECK(vpp == p.pipeline.vpp);

  // Batch (num_microbatches_calculator.py:380-391; schedules.py:1160-1180 at the default group size PP).
  const int64_t mbs = f.num("--micro-batch-size", 0), gbs = f.num("--global-batch-size", 0);
  REQUIRE(mbs > 0);
  CHECK(gbs % (mbs * dp) == 0);
  const int64_t micro_batches = gbs / (mbs * dp);
  CHECK(micro_batches >= 1);
  if (vpp > 1) CHECK(micro_batches % pp == 0);

  // Distributed optimizer and overlap (A:1024-1097, TC:1813-1826, TC:3002-3101).
  const bool dist_opt = f.has("--use-distributed-optimizer") || f.has("--use-megatron-fsdp");
  CHECK(f.has("--use-distributed-optimizer") == (p.data.zero >= 1));
  if (f.has("--overlap-param-gather")) CHECK((f.has("--overlap-grad-reduce") && dist_opt));
  if (f.has("--overlap-param-gather-with-optimizer-step")) {
    CHECK((dist_opt && f.has("--overlap-param-gather") && vpp > 1 && f.str("--ckpt-format") == "torch"));
  }
  if (f.has("--fp8-param-gather")) CHECK((dist_opt && f.has("--fp8-format")));
  const std::string dispatcher = f.str("--moe-token-dispatcher-type", "allgather");
  const std::string granularity = f.str("--recompute-granularity");
  const auto modules = f.list("--recompute-modules");
  auto has_module = [&](const char* name) {
    return std::find(modules.begin(), modules.end(), name) != modules.end();
  };
  // Per-layer CUDA graphs (TC:1715-1820 and arguments.py:1240-1253 at core_v0.16.0).
  if (f.has("--cuda-graph-impl")) {
    CHECK(f.str("--cuda-graph-impl") == "transformer_engine");
    const auto scope = f.list("--cuda-graph-scope");
    auto in_scope = [&](const char* s) { return std::find(scope.begin(), scope.end(), s) != scope.end(); };
    CHECK_FALSE(in_scope("full_iteration"));
    CHECK_FALSE((in_scope("moe") && in_scope("moe_router")));
    if (in_scope("moe_preprocess")) CHECK(in_scope("moe_router"));
    if (in_scope("moe") || (scope.empty() && experts > 0)) CHECK(f.has("--moe-pad-expert-input-to-capacity"));
    if (in_scope("moe_preprocess") && dispatcher == "alltoall")
      CHECK((!f.has("--moe-expert-capacity-factor") || f.has("--moe-pad-expert-input-to-capacity")));
    if (in_scope("moe_router") && granularity == "selective") CHECK_FALSE(has_module("moe"));
    CHECK(granularity != "full");
    CHECK(f.has("--te-rng-tracker"));
    CHECK(std::find(args.env.begin(), args.env.end(), "NCCL_GRAPH_REGISTER=0") != args.env.end());
  }
  if (f.has("--overlap-moe-expert-parallel-comm")) {
    CHECK(ep > 1);
    CHECK((dispatcher == "alltoall" || dispatcher == "flex"));
    CHECK(granularity != "full");
    CHECK_FALSE(f.has("--recompute-method"));
    CHECK_FALSE(f.has("--recompute-num-layers"));
    CHECK_FALSE(has_module("moe"));
    CHECK((f.has("--bf16") || f.has("--fp16")));
    CHECK_FALSE(f.has("--moe-shared-expert-overlap"));
    CHECK(mtp <= 1);
    if (pp > 1) CHECK(vpp > 1);
  }
  if (f.has("--delay-wgrad-compute")) CHECK(f.has("--overlap-moe-expert-parallel-comm"));
  if (f.has("--ep-overlap-early-attn-memory-release")) CHECK(f.has("--overlap-moe-expert-parallel-comm"));
  if (f.has("--moe-shared-expert-overlap")) {
    CHECK(f.has("--moe-shared-expert-intermediate-size"));
    CHECK((dispatcher == "alltoall" || dispatcher == "flex"));
    CHECK_FALSE(has_module("shared_experts"));
  }

  // Dispatcher and backends (TC:1743-1774, TD:1835-1854).
  CHECK((dispatcher == "allgather" || dispatcher == "alltoall" || dispatcher == "flex"));
  const std::string backend = f.str("--moe-flex-dispatcher-backend", "deepep");
  if (f.has("--moe-flex-dispatcher-backend") || f.has("--moe-enable-deepep")) CHECK(dispatcher == "flex");
  if (f.has("--moe-enable-deepep")) CHECK(backend != "hybridep");
  if (dispatcher == "flex" && (backend == "deepep" || backend == "ncclep")) CHECK(tp * ep > 1);
  if (dispatcher == "flex" && backend == "deepep") CHECK_FALSE(f.has("--moe-pad-expert-input-to-capacity"));

  // Capacity and padding (TC:1836-1882).
  auto lb = f.list("--moe-router-load-balancing-type");
  if (lb.empty()) lb = {"aux_loss"};
  if (f.has("--moe-expert-capacity-factor")) {
    for (const auto& t : lb)
      CHECK((t == "aux_loss" || t == "seq_aux_loss" || t == "global_aux_loss" || t == "none"));
  }
  if (f.has("--moe-pad-expert-input-to-capacity")) CHECK(f.has("--moe-expert-capacity-factor"));
  if (f.has("--moe-expert-rank-capacity-factor")) CHECK((backend == "hybridep" || backend == "ncclep"));
  if (lb.size() > 1) CHECK(f.list("--moe-aux-loss-coeff").size() == lb.size());

  // Router (TC:2617-2689, TC:2641-2660).
  const std::string score = f.str("--moe-router-score-function", "softmax");
  const bool sinkhorn = std::find(lb.begin(), lb.end(), "sinkhorn") != lb.end();
  if (moe && f.num("--moe-router-topk", 2) == 1 && score == "softmax" && !sinkhorn)
    CHECK(f.has("--moe-router-pre-softmax"));
  if (f.has("--moe-router-enable-expert-bias")) CHECK((score == "sigmoid" || score == "sqrtsoftplus"));
  if (f.has("--moe-router-group-topk")) {
    const int64_t groups = f.num("--moe-router-num-groups", 0);
    CHECK((groups > 0 && experts % groups == 0 && f.num("--moe-router-group-topk", 0) <= groups));
  }
  if (f.has("--moe-router-padding-for-quantization"))
    CHECK((f.has("--fp8-format") && dispatcher != "allgather"));
  // FP8 parameters (A:655-656 at core_v0.16.0): the distributed optimizer or FSDP.
  if (f.has("--fp8-param-gather"))
    CHECK((f.has("--fp8-format") && (f.has("--use-distributed-optimizer") || f.has("--use-megatron-fsdp"))));

  // Grouped GEMM (TC:1413-1414) and recompute (TC:1901-2025, A:1410-1428).
  if (f.has("--moe-use-grouped-tensor")) CHECK(f.has("--moe-grouped-gemm"));
  if (granularity == "full") CHECK((f.has("--recompute-method") && f.has("--recompute-num-layers")));
  if (granularity == "selective")
    CHECK_FALSE((f.has("--recompute-method") || f.has("--recompute-num-layers")));
  if (!modules.empty()) CHECK(granularity == "selective");
  static const std::set<std::string> kModules = {
      "core_attn",      "moe_act",      "layernorm",   "mla_up_proj", "mlp", "moe",
      "shared_experts", "gdn_norm_out", "gdp_in_proj", "gdp_qkv",     "mhc"};
  for (const auto& mod : modules) CHECK_MESSAGE(kModules.count(mod) == 1, "unknown recompute module " << mod);
  if (has_module("moe_act")) CHECK(f.has("--moe-grouped-gemm"));
  if (has_module("mla_up_proj")) CHECK(f.has("--multi-latent-attention"));
  const std::string recipe = f.str("--fp8-recipe", "delayed");
  if (f.has("--fp8-format") && recipe == "delayed")
    CHECK_FALSE((has_module("moe_act") || has_module("layernorm")));
  if (f.has("--distribute-saved-activations")) {
    CHECK((tp > 1 && granularity == "full" && f.has("--recompute-method")));
    CHECK_FALSE(f.has("--sequence-parallel"));
  }
  // MegaScale-MoE's SAR maps to selective recompute of layernorm and moe_act.
  CHECK(granularity == (p.recompute == Recompute::kNone  ? ""
                        : p.recompute == Recompute::kSar ? "selective"
                                                         : name_of(p.recompute)));
  if (p.recompute == Recompute::kSelective) {
    for (const auto& mod : recompute_module_names(p.recompute_modules)) CHECK(has_module(mod.c_str()));
  }

  // Precision (A:1193-1217, TC:1527-1567).
  CHECK_FALSE((f.has("--bf16") && f.has("--fp16")));
  if (recipe == "custom" && f.has("--fp8-format")) CHECK(f.has("--fp8-quantizer-factory"));
  if (f.has("--first-last-layers-bf16")) CHECK(recipe != "delayed");
  CHECK(f.has("--fp8-format") == (p.precision == Precision::kFp8));

  // MTP (A:882-886) and MLA (AU:292-342, A:1973-1974, TC:2526-2527).
  if (mtp > 0) {
    const std::string pos = f.str("--position-embedding-type", "learned_absolute");
    CHECK((pos == "rope" || pos == "none"));
  }
  if (f.has("--multi-latent-attention")) {
    CHECK_FALSE(f.has("--group-query-attention"));
    CHECK_FALSE(f.has("--rotary-interleaved"));
    CHECK(f.str("--normalization") == "RMSNorm");
    for (const char* dim : {"--kv-lora-rank", "--qk-head-dim", "--qk-pos-emb-head-dim", "--v-head-dim"})
      CHECK_MESSAGE(f.has(dim), "MLA needs " << dim << " explicitly");
  }

  // Layer patterns match the model (gpt_layer_specs.py:643-671; transformer/utils.py
  // is_layer_window_attention).
  if (moe) {
    std::vector<int> want;
    for (const auto& l : m.layers) want.push_back(l.moe ? 1 : 0);
    const std::vector<int> got = f.has("--moe-layer-freq")
                                     ? layer_pattern(f.str("--moe-layer-freq"), layers, 0)
                                     : std::vector<int>(want.size(), 1);
    CHECK(got == want);
  }
  if (f.has("--window-attn-skip-freq")) {
    REQUIRE(f.has("--window-size"));
    const std::string v = f.str("--window-attn-skip-freq");
    std::vector<int> windowed = layer_pattern(v, layers, 1);
    if (std::isdigit(static_cast<unsigned char>(v[0]))) {
      for (int& w : windowed) w = 1 - w;  // an int marks the full-attention layers
    }
    for (int64_t i = 0; i < layers; ++i) {
      const int64_t w = m.layers[static_cast<size_t>(i)].window;
      CHECK(windowed[static_cast<size_t>(i)] == (w > 0 && w < p.seq_len ? 1 : 0));
    }
  }

  // Vocabulary (build_tokenizer.py:96-114) and environment (A:1453-1479).
  if (f.str("--tokenizer-type") == "NullTokenizer") CHECK(f.num("--vocab-size", 0) == m.vocab);
  const bool relaxed = f.has("--overlap-moe-expert-parallel-comm") || f.has("--use-megatron-fsdp");
  const bool env_set =
      std::find(args.env.begin(), args.env.end(), "CUDA_DEVICE_MAX_CONNECTIONS=1") != args.env.end();
  if ((tp > 1 || cp > 1) && !relaxed) CHECK(env_set);
}

bool mentions(const std::vector<std::string>& lines, const std::string& what) {
  return std::any_of(lines.begin(), lines.end(),
                     [&](const std::string& l) { return l.find(what) != std::string::npos; });
}

// Checks the plan is legal for moeplan, then the Megatron rules; returns the arguments.
planner::MegatronArgs checked(const Plan& p) {
  const ModelSpec& m = model(p.model);
  const HardwareProfile& hw = hardware(p.hardware);
  const std::vector<Violation> v = validate(p, m, hw);
  REQUIRE_MESSAGE(v.empty(), p.model << ": " << (v.empty() ? "" : v[0].reason));
  const planner::MegatronArgs a = planner::megatron_args(p, m, hw);
  check_megatron_rules(p, m, a);
  return a;
}

Result<io::LoadedPlan> example(const std::string& name) {
  return io::load_plan(std::string(MOEPLAN_SOURCE_DIR) + "/planner/examples/" + name);
}

}  // namespace

TEST_SUITE("planner") {
  TEST_CASE("the copied Megatron flag list matches the reference when the reference is present") {
    CHECK(known_flags().size() == 878);
    CHECK(known_flags().count("--tensor-model-parallel-size") == 1);
    const std::string reference = std::string(MOEPLAN_SOURCE_DIR) + "/../shared/reference/megatron_flags.txt";
    if (fs::exists(reference)) {
      const auto v = flag_names_in(reference);
      CHECK(std::set<std::string>(v.begin(), v.end()) == known_flags());
    }
  }

  TEST_CASE("the shipped example plans give Megatron arguments that exist and keep Megatron's rules") {
    for (const char* name :
         {"mixtral-8x22b-128xh100.json", "deepseek-v3-2048xh800.json", "internal-352b-1440xh800.json"}) {
      CAPTURE(name);
      Result<io::LoadedPlan> l = example(name);
      REQUIRE_MESSAGE(l.ok(), (l.ok() ? "" : l.error().message));
      const auto& [plan, m, hw, path] = l.value();
      REQUIRE(validate(plan, m, hw).empty());
      check_megatron_rules(plan, m, planner::megatron_args(plan, m, hw));
    }
  }

  TEST_CASE("every shipped model on one node with expert parallelism keeps Megatron's rules") {
    for (const auto& entry : fs::directory_iterator(fs::path(MOEPLAN_SOURCE_DIR) / "models")) {
      if (entry.path().extension() != ".json") continue;
      const std::string name = entry.path().stem().string();
      CAPTURE(name);
      Plan p = make_plan(name, 8, 4096, 64);
      p.experts.ep = 8;
      p.overlap = {.inter_op = false, .intra_op = false, .dp_comm = true, .pp_comm = false};
      checked(p);
    }
  }

  TEST_CASE("a set of plans covering each mapping keeps Megatron's rules") {
    // Interleaved 1F1B with ETP, EP overlap, a capacity factor and p2p overlap off.
    Plan a = make_plan("mixtral-8x7b", 64, 4096, 256);
    a.attention.tp = 2;
    a.experts = {.ep = 4, .etp = 2, .dispatch = Dispatch::kAllToAll};
    a.pipeline = {.pp = 4, .vpp = 2, .schedule = Schedule::kInterleaved1F1B, .layers_per_stage = {}};
    a.overlap = {.inter_op = true, .intra_op = false, .dp_comm = true, .pp_comm = false};
    a.routing.capacity_factor = 1.25;
    const auto ma = checked(a);
    CHECK(mentions(ma.flags, "--num-virtual-stages-per-pipeline-rank 2"));
    CHECK(mentions(ma.flags, "--no-overlap-p2p-communication"));
    CHECK(mentions(ma.flags, "--overlap-moe-expert-parallel-comm"));
    CHECK(mentions(ma.flags, "--moe-expert-capacity-factor 1.25"));
    CHECK(mentions(ma.flags, "--disable-bias-linear"));

    // All-gather dispatch, ZeRO-0, a shared-expert gate and q/k/v biases.
    Plan b = make_plan("qwen2-57b-a14b", 32, 4096, 64);
    b.attention.tp = 4;
    b.experts = {.ep = 8, .etp = 1, .dispatch = Dispatch::kAllGather};
    b.data.zero = 0;
    b.overlap = {.inter_op = true, .intra_op = false, .dp_comm = true, .pp_comm = false};
    const auto mb = checked(b);
    CHECK(mentions(mb.flags, "--moe-token-dispatcher-type allgather"));
    CHECK(mentions(mb.flags, "--add-qkv-bias"));
    CHECK(mentions(mb.flags, "--moe-shared-expert-gate"));
    CHECK_FALSE(mentions(mb.flags, "--use-distributed-optimizer"));
    CHECK_FALSE(mentions(mb.flags, "--overlap-param-gather"));

    // Ulysses SP and CP together: hierarchical a2a+p2p.
    Plan c = make_plan("qwen3-30b-a3b", 64, 8192, 64);
    c.attention = {.tp = 1, .sp = 4, .cp = 2};
    c.experts.ep = 8;
    const auto mc = checked(c);
    CHECK(mentions(mc.flags, "--cp-comm-type a2a+p2p"));
    CHECK(mentions(mc.flags, "--hierarchical-context-parallel-sizes 4 2"));
    CHECK(mentions(mc.flags, "--qk-layernorm"));

    // CP alone, Megatron-FSDP for ZeRO-3, FP8, an interleaved MoE layer pattern, top-1 routing.
    Plan d = make_plan("llama-4-maverick", 128, 8192, 128);
    d.attention = {.tp = 4, .sp = 1, .cp = 2};
    d.experts.ep = 16;
    d.pipeline.pp = 2;
    d.data.zero = 3;
    d.precision = Precision::kFp8;
    d.overlap.dp_comm = true;
    const auto md = checked(d);
    CHECK(mentions(md.flags, "--cp-comm-type all_gather"));
    CHECK(mentions(md.flags, "--data-parallel-sharding-strategy optim_grads_params"));
    CHECK(mentions(md.flags, "--moe-layer-freq '([0,1]*24)'"));
    CHECK(mentions(md.flags, "--moe-router-pre-softmax"));
    // FP8's row alignment: Megatron's default pads in the experts (no flag); a plan may pad in the router.
    CHECK_FALSE(mentions(md.flags, "--moe-router-padding-for-quantization"));
    d.experts.fp8_padding = Fp8Padding::kRouter;
    CHECK(mentions(checked(d).flags, "--moe-router-padding-for-quantization"));
    // FP8 parameters gathered in FP8 only where the plan says so.
    CHECK_FALSE(mentions(md.flags, "--fp8-param-gather"));
    d.data.fp8_param_gather = true;
    CHECK(mentions(checked(d).flags, "--fp8-param-gather"));

    // MLA with MTP, an uneven split that first/last counts cannot express (a layout), selective recompute.
    Plan e = make_plan("deepseek-v3", 256, 4096, 512);
    e.hardware = "h800-sxm";
    e.experts = {.ep = 64, .etp = 1, .dispatch = Dispatch::kDedup};
    e.pipeline = {.pp = 4,
                  .vpp = 2,
                  .schedule = Schedule::kInterleaved1F1B,
                  .layers_per_stage = {7, 8, 8, 8, 8, 8, 8, 6}};
    e.recompute = Recompute::kSar;
    e.precision = Precision::kFp8;
    e.overlap = {.inter_op = true, .intra_op = false, .dp_comm = true, .pp_comm = true};
    const auto me = checked(e);
    CHECK(mentions(me.flags, "--pipeline-model-parallel-layout 'E,t*7|t*8|t*8|t*8|t*8|t*8|t*8|t*6,m,L'"));
    CHECK(mentions(me.flags, "--moe-token-dispatcher-type flex"));
    CHECK(mentions(me.flags, "--moe-flex-dispatcher-backend deepep"));
    CHECK(mentions(me.flags, "--recompute-modules layernorm moe_act"));
    CHECK(mentions(me.flags, "--moe-layer-freq '([0]*3+[1]*58)'"));
    CHECK(mentions(me.flags, "--moe-router-enable-expert-bias"));

    // Sliding windows, sinks and linear biases with ETP > 1.
    Plan g = make_plan("gpt-oss-20b", 16, 4096, 64);
    g.attention.tp = 2;
    g.experts = {.ep = 8, .etp = 2, .dispatch = Dispatch::kAllToAll};
    g.recompute = Recompute::kFull;
    const auto mg = checked(g);
    CHECK(mentions(mg.flags, "--window-size 128,0"));
    CHECK(mentions(mg.flags, "--window-attn-skip-freq 2"));
    CHECK(mentions(mg.flags, "--softmax-type learnable"));
    CHECK(mentions(mg.flags, "--recompute-method uniform"));
    CHECK(mentions(mg.not_expressible, "linear-layer biases"));

    // Cross-layer attention, top-1 routing, tied embeddings.
    Plan h = make_plan("hunyuan-large", 128, 4096, 256);
    h.attention.tp = 8;
    h.experts.ep = 16;
    h.pipeline.pp = 2;
    const auto mh = checked(h);
    CHECK(mentions(mh.not_expressible, "cross-layer attention"));
    CHECK_FALSE(mentions(mh.flags, "--untie-embeddings-and-output-weights"));

    // Qwen3-Next: Gated DeltaNet layers (three of every four), the gated attention output, RoPE on a
    // quarter of each head, zero-centred norms, the shared expert's gate: all expressible.
    Plan q = make_plan("qwen3-next-80b-a3b", 32, 4096, 64);
    q.experts.ep = 32;
    const auto mq = checked(q);
    CHECK(mq.not_expressible.empty());
    for (const char* f :
         {"--experimental-attention-variant gated_delta_net", "--linear-attention-freq 4",
          "--linear-conv-kernel-dim 4", "--linear-key-head-dim 128", "--linear-value-head-dim 128",
          "--linear-num-key-heads 16", "--linear-num-value-heads 32", "--attention-output-gate",
          "--rotary-percent 0.25", "--apply-layernorm-1p", "--moe-shared-expert-gate"}) {
      CAPTURE(f);
      CHECK(mentions(mq.flags, f));
    }
    // A pattern that is not N - 1 linear layers then one attention layer goes as the per-layer list.
    ModelSpec odd = model("qwen3-next-80b-a3b");
    odd.layers.resize(8);
    std::swap(odd.layers[0].mixer, odd.layers[3].mixer);
    const auto mo =
        planner::megatron_args(make_plan("qwen3-next-80b-a3b", 32, 4096, 64), odd, hardware("h100-sxm"));
    CHECK(mentions(mo.flags, "--linear-attention-freq '[0,1,1,1,1,1,1,0]'"));
    // Models without them get none of these flags.
    for (const char* f : {"--experimental-attention-variant", "--attention-output-gate", "--rotary-percent",
                          "--apply-layernorm-1p"}) {
      CAPTURE(f);
      CHECK_FALSE(mentions(mh.flags, f));
    }
  }

  TEST_CASE("Ulysses SP maps to Megatron's a2a context parallelism") {
    Plan p = make_plan("mixtral-8x7b", 16, 4096, 32);
    p.attention.sp = 8;
    p.experts.ep = 8;
    const auto a = checked(p);
    CHECK(mentions(a.flags, "--context-parallel-size 8"));
    CHECK(mentions(a.flags, "--cp-comm-type a2a"));
    CHECK_FALSE(mentions(a.not_expressible, "Ulysses"));
  }

  TEST_CASE("an Ulysses SP plan with replicated K/V heads yields a not-expressible comment") {
    // 8 K/V heads over tp 2 leave 4 per TP rank; Ulysses over 8 ranks replicates them, TE's a2a cannot.
    Plan p = make_plan("mixtral-8x7b", 16, 4096, 32);
    p.attention = {.tp = 2, .sp = 8, .cp = 1};
    p.experts.ep = 8;
    const auto a = checked(p);
    CHECK(mentions(a.flags, "--cp-comm-type all_gather"));
    const std::string text = planner::megatron_text(p, model(p.model), hardware(p.hardware), "plan.json");
    CHECK(text.find("# not expressible in Megatron-LM: Ulysses SP (sp = 8)") != std::string::npos);
  }

  TEST_CASE("features Megatron lacks become comment lines before the flags") {
    Result<io::LoadedPlan> l = example("internal-352b-1440xh800.json");
    REQUIRE(l.ok());
    const auto& [plan, m, hw, path] = l.value();
    const std::string text = planner::megatron_text(plan, m, hw, path);
    for (const char* what :
         {"intra-operator overlap", "BF16 gradient sync", "inter-operator overlap",
          "MegaScale-MoE's selective activation rematerialization", "overlapped pipeline p2p"}) {
      CAPTURE(what);
      CHECK(text.find(std::string("# not expressible in Megatron-LM: ") + what) != std::string::npos);
    }
    // A bash script: comments, then the environment from `set -euo pipefail` on, the torchrun line, the
    // program, then one flag per line, each but the last ending in a backslash.
    std::istringstream in(text);
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    REQUIRE(!lines.empty());
    CHECK(lines.front() == "#!/bin/bash");
    const auto set_e = std::find(lines.begin(), lines.end(), "set -euo pipefail");
    REQUIRE(set_e != lines.end());
    for (auto it = lines.begin(); it != set_e; ++it) CHECK(it->starts_with("#"));
    CHECK(text.find(std::string("Megatron-LM commit ") + planner::kMegatronCommit) != std::string::npos);
    const auto torchrun =
        std::find_if(set_e, lines.end(), [](const std::string& s) { return s.starts_with("torchrun "); });
    REQUIRE(torchrun != lines.end());
    CHECK(torchrun->find("--nnodes=180 --nproc-per-node=8") != std::string::npos);
    REQUIRE(torchrun + 1 != lines.end());
    CHECK(*(torchrun + 1) == "  \"$MEGATRON_LM/pretrain_gpt.py\" \\");
    const auto first_flag = torchrun + 2;
    for (auto it = first_flag; it != lines.end(); ++it) {
      CHECK(it->starts_with("  --"));
      CHECK(it->ends_with(" \\") == (it + 1 != lines.end()));
    }
    CHECK(static_cast<size_t>(lines.end() - first_flag) == planner::megatron_flags(plan, m, hw).size());
  }

  TEST_CASE(
      "the rotary base and norm epsilon come from the model's config, and Megatron's defaults are named") {
    Plan p = make_plan("mixtral-8x7b", 16, 4096, 32);
    p.experts.ep = 8;
    const auto a = checked(p);  // rope_theta 1e6, rms_norm_eps 1e-5 in models/mixtral-8x7b.json
    CHECK(mentions(a.flags, "--rotary-base 1000000"));
    CHECK(mentions(a.flags, "--norm-epsilon 1e-05"));

    Plan d = make_plan("deepseek-v3", 256, 4096, 512);
    d.experts.ep = 64;
    const auto b = planner::megatron_args(d, model("deepseek-v3"), hardware("h100-sxm"));
    CHECK(mentions(b.flags, "--rotary-base 10000"));
    CHECK(mentions(b.flags, "--norm-epsilon 1e-06"));
    CHECK(mentions(b.notes, "rope_scaling (yarn factor 40) is not passed"));
    CHECK(mentions(b.flags, "--moe-router-topk-scaling-factor 2.5"));    // routed_scaling_factor
    CHECK_FALSE(mentions(a.flags, "--moe-router-topk-scaling-factor"));  // Mixtral has none

    // The MegaScale-MoE model states neither: the notes say which defaults apply.
    Plan i = make_plan("internal-352b", 64, 4096, 64);
    i.experts.ep = 32;
    const auto c = planner::megatron_args(i, model("internal-352b"), hardware("h800-sxm"));
    CHECK_FALSE(mentions(c.flags, "--rotary-base"));
    CHECK_FALSE(mentions(c.flags, "--norm-epsilon"));
    CHECK(mentions(c.notes, "default --rotary-base 10000"));
    CHECK(mentions(c.notes, "default --norm-epsilon 1e-5"));
  }

  TEST_CASE("first and last pipeline stages map to Megatron's uneven split") {
    Result<io::LoadedPlan> l = example("deepseek-v3-2048xh800.json");
    REQUIRE(l.ok());
    const auto& [plan, m, hw, path] = l.value();
    const auto flags = planner::megatron_flags(plan, m, hw);
    CHECK(mentions(flags, "--decoder-first-pipeline-num-layers 3"));
    CHECK(mentions(flags, "--decoder-last-pipeline-num-layers 2"));
    CHECK(mentions(flags, "--recompute-granularity full"));
    CHECK(mentions(flags, "--mtp-num-layers 1"));
    CHECK_FALSE(mentions(flags, "--pipeline-model-parallel-layout"));
  }

  TEST_CASE("Megatron's recompute flags are exactly the plan's modules, or full's method and layer count") {
    // Selective: --recompute-modules with the plan's modules and no others, in Megatron's order; full: the
    // plan's --recompute-method and --recompute-num-layers (TC:1901-2025).
    Plan p = make_plan("deepseek-v3", 8, 4096, 8);
    p.experts.ep = 8;
    p.recompute = Recompute::kSelective;
    p.recompute_modules = kRecomputeMlaUpProj | kRecomputeMoeAct | kRecomputeCoreAttn | kRecomputeLayernorm;
    Flags f = parse_flags(checked(p).flags);
    CHECK(f.str("--recompute-granularity") == "selective");
    CHECK(f.list("--recompute-modules") ==
          std::vector<std::string>{"core_attn", "moe_act", "layernorm", "mla_up_proj"});
    p.recompute_modules = kRecomputeMoeAct;
    f = parse_flags(checked(p).flags);
    CHECK(f.list("--recompute-modules") == std::vector<std::string>{"moe_act"});

    Plan q = make_plan("mixtral-8x7b", 16, 4096, 32);
    q.experts.ep = 8;
    q.pipeline.pp = 2;
    q.recompute = Recompute::kFull;
    q.recompute_method = RecomputeMethod::kBlock;
    q.recompute_num_layers = 3;
    f = parse_flags(checked(q).flags);
    CHECK(f.str("--recompute-granularity") == "full");
    CHECK(f.str("--recompute-method") == "block");
    CHECK(f.num("--recompute-num-layers", 0) == 3);
    CHECK_FALSE(f.has("--recompute-modules"));
  }

  TEST_CASE("a MoE launch asks for the plan's router, fused by default, and the fused permute") {
    // Without --moe-router-fusion Megatron runs the unfused router (TC:944, default off): for DeepSeek-V3
    // 77 kernels forward and backward where the fused one launches 21 (megatron_router_kernels).
    Plan p = make_plan("deepseek-v3", 8, 4096, 8);
    p.experts.ep = 8;
    const Flags f = parse_flags(checked(p).flags);
    CHECK(f.has("--moe-router-fusion"));
    CHECK(f.has("--moe-permute-fusion"));
    // A plan of a run with the eager router (Megatron's default) leaves the flag out.
    p.routing.fused_router = false;
    CHECK_FALSE(parse_flags(checked(p).flags).has("--moe-router-fusion"));
  }

  // A plan priced as an older Megatron builds something: `older` turns that on; the launch says so in a note
  // (`note`, which the plan as the stack builds it lacks: `absent`) and its flags stay the same.
  void check_version_note(Plan p, const std::function<void(Plan&)>& older, const std::string& absent,
                          const std::string& note) {
    const auto own = checked(p);
    CHECK_FALSE(mentions(own.notes, absent));
    older(p);
    const auto old = checked(p);
    CHECK(mentions(old.notes, note));
    CHECK(old.flags == own.flags);
  }

  TEST_CASE("MLA's column-parallel down projections are Megatron's version, said in a note and no flag") {
    Plan p = make_plan("deepseek-v3", 8, 4096, 8);
    p.experts.ep = 8;
    p.attention.tp = 2;
    check_version_note(
        p, [](Plan& q) { q.attention.mla_down_proj = MlaDownProj::kColumnParallel; }, "before 0.14",
        "column-parallel, as Megatron-Core before 0.14 builds them");
  }

  // DeepSeek-V3 on one node of eight, EP 8, on Megatron-Core with DeepEP.
  Plan deepep_v3_plan() {
    Plan p = make_plan("deepseek-v3", 8, 4096, 8);
    p.experts.ep = 8;
    p.experts.dispatch = Dispatch::kDedup;
    p.stack = "megatron-core-deepep";
    return p;
  }

  TEST_CASE(
      "DeepEP's FP8 row padding in the experts is Megatron's and TE's version, said in a note and no flag") {
    Plan p = deepep_v3_plan();
    p.precision = Precision::kFp8;
    check_version_note(
        p, [](Plan& q) { q.experts.fp8_padding = Fp8Padding::kExperts; }, "TEGroupedMLP's copies",
        "TEGroupedMLP's copies, as Megatron-Core before the DeepEP permute padded");
  }

  TEST_CASE(
      "DeepEP's fused index conversion asks for Megatron's experimental switch, and otherwise it is off") {
    Plan p = deepep_v3_plan();
    CHECK_FALSE(parse_flags(checked(p).flags).has("--enable-experimental"));
    p.experts.fused_index_conversion = true;
    const Flags f = parse_flags(checked(p).flags);
    CHECK(f.has("--enable-experimental"));
    CHECK(f.has("--moe-permute-fusion"));
    // HybridEP has no such conversion: the switch stays off.
    p.stack = "megatron-core-hybridep";
    CHECK_FALSE(parse_flags(checked(p).flags).has("--enable-experimental"));
  }

  TEST_CASE(
      "the loss runs the plan's cross-entropy kernels: TE's by default, Megatron's native fusion, or none") {
    Plan p = make_plan("deepseek-v3", 8, 4096, 8);
    p.experts.ep = 8;
    Flags f = parse_flags(checked(p).flags);
    CHECK(f.has("--cross-entropy-loss-fusion"));
    CHECK(f.str("--cross-entropy-fusion-impl") == "te");
    p.cross_entropy = CrossEntropy::kNative;
    f = parse_flags(checked(p).flags);
    CHECK(f.has("--cross-entropy-loss-fusion"));
    CHECK(f.str("--cross-entropy-fusion-impl") == "native");
    p.cross_entropy = CrossEntropy::kUnfused;
    f = parse_flags(checked(p).flags);
    CHECK_FALSE(f.has("--cross-entropy-loss-fusion"));
    CHECK_FALSE(f.has("--cross-entropy-fusion-impl"));
  }

  TEST_CASE("cross-micro-batch overlap maps to Megatron's combined 1F1B flags and keeps their rules") {
    // --overlap-moe-expert-parallel-comm, with --delay-wgrad-compute where the plan delays the weight
    // gradients (it needs the former: TC:3073-3077); never beside --moe-shared-expert-overlap (TC:3002-3072),
    // also when the plan asks for inter-operator overlap too and the model has shared experts (DeepSeek-V3).
    Plan p = mixtral_ep8();
    p.overlap.cross_micro_batch = true;
    Flags f = parse_flags(checked(p).flags);
    CHECK(f.has("--overlap-moe-expert-parallel-comm"));
    CHECK_FALSE(f.has("--delay-wgrad-compute"));
    p.overlap.delay_wgrad = true;
    f = parse_flags(checked(p).flags);
    CHECK(f.has("--overlap-moe-expert-parallel-comm"));
    CHECK(f.has("--delay-wgrad-compute"));
    Plan q = make_plan("deepseek-v3", 8, 4096, 32);
    q.experts.ep = 8;
    q.overlap.cross_micro_batch = true;
    q.overlap.inter_op = true;
    f = parse_flags(checked(q).flags);
    CHECK(f.has("--overlap-moe-expert-parallel-comm"));
    CHECK_FALSE(f.has("--moe-shared-expert-overlap"));
  }

  TEST_CASE("the shared-expert overlap is Megatron's --moe-shared-expert-overlap") {
    Plan p = make_plan("deepseek-v3", 8, 4096, 32);
    p.experts.ep = 8;
    p.experts.dispatch = Dispatch::kAllToAll;
    Flags f = parse_flags(checked(p).flags);
    CHECK_FALSE(f.has("--moe-shared-expert-overlap"));
    p.overlap.shared_experts = true;
    const planner::MegatronArgs args = checked(p);
    f = parse_flags(args.flags);
    CHECK(f.has("--moe-shared-expert-overlap"));
    CHECK(f.str("--moe-token-dispatcher-type") == "alltoall");
    CHECK_FALSE(mentions(args.notes, "Megatron-Core 0.18"));
    // The flex dispatcher takes it only from Megatron-Core 0.18 (ebfa13852f): the launch says so.
    p.stack = "megatron-core-deepep";
    p.experts.dispatch = Dispatch::kDedup;
    const planner::MegatronArgs flex = checked(p);
    CHECK(parse_flags(flex.flags).has("--moe-shared-expert-overlap"));
    CHECK(mentions(flex.notes,
                   "--moe-shared-expert-overlap with the flex dispatcher needs Megatron-Core 0.18"));
  }

  TEST_CASE(
      "padding to capacity is Megatron's --moe-pad-expert-input-to-capacity beside the capacity factor") {
    Plan p = mixtral_ep8();
    p.routing.capacity_factor = 1.0;
    Flags f = parse_flags(checked(p).flags);
    CHECK(f.has("--moe-expert-capacity-factor"));
    CHECK_FALSE(f.has("--moe-pad-expert-input-to-capacity"));
    p.routing.pad_to_capacity = true;
    f = parse_flags(checked(p).flags);
    CHECK(f.has("--moe-pad-expert-input-to-capacity"));
  }

  TEST_CASE("per-layer CUDA graphs are Megatron's TE graphs with the plan's scopes and the RNG tracker") {
    Plan p = mixtral_ep8();
    Flags f = parse_flags(checked(p).flags);
    CHECK_FALSE(f.has("--cuda-graph-impl"));
    p.cuda_graphs = kGraphAttn | kGraphMoeRouter | kGraphMoePreprocess;
    const planner::MegatronArgs a = checked(p);
    f = parse_flags(a.flags);
    CHECK(f.str("--cuda-graph-impl") == "transformer_engine");
    CHECK(f.list("--cuda-graph-scope") == std::vector<std::string>{"attn", "moe_router", "moe_preprocess"});
    CHECK(f.has("--te-rng-tracker"));
    CHECK(std::find(a.env.begin(), a.env.end(), "NCCL_GRAPH_REGISTER=0") != a.env.end());
    // Whole layers: Megatron's default scope, so no scope flag.
    p.cuda_graphs = kGraphLayer;
    p.routing.capacity_factor = 1.0;
    p.routing.pad_to_capacity = true;
    f = parse_flags(checked(p).flags);
    CHECK(f.str("--cuda-graph-impl") == "transformer_engine");
    CHECK_FALSE(f.has("--cuda-graph-scope"));
  }

  TEST_CASE("a plan's mtp_layers is Megatron's --mtp-num-layers, whatever the model config counts") {
    Plan p = mixtral_ep8();
    CHECK_FALSE(parse_flags(checked(p).flags).has("--mtp-num-layers"));
    p.mtp_layers = 1;
    const Flags f = parse_flags(checked(p).flags);
    CHECK(f.num("--mtp-num-layers", 0) == 1);
  }

  TEST_CASE("TE's userbuffers are Megatron's --tp-comm-overlap, beside sequence parallelism") {
    Plan p = make_plan("mixtral-8x7b", 8, 4096, 32);
    p.attention.tp = 2;
    p.experts.ep = 4;
    Flags f = parse_flags(checked(p).flags);
    CHECK_FALSE(f.has("--tp-comm-overlap"));
    p.overlap.tp_comm = true;
    f = parse_flags(checked(p).flags);
    CHECK(f.has("--tp-comm-overlap"));
    CHECK(f.has("--sequence-parallel"));
  }

  TEST_CASE("every legal mix of recompute, FP8 recipe and EP overlap keeps Megatron's rules") {
    // Each set of Megatron recompute modules, full recompute by both methods, BF16 and each FP8 recipe,
    // with and without cross-micro-batch, inter-operator and shared-expert overlap, on a GQA and an MLA model
    // with shared experts: every plan moeplan accepts gives arguments Megatron accepts.
    int legal = 0;
    for (const char* name : {"mixtral-8x7b", "deepseek-v3"}) {
      const ModelSpec& m = model(name);
      const HardwareProfile& hw = hardware("h100-sxm");
      std::vector<Plan> plans;
      Plan base = make_plan(name, 8, 4096, 32);
      base.experts.ep = 8;
      for (uint16_t modules = 1; modules <= kAllRecomputeModules; ++modules) {
        base.recompute = Recompute::kSelective;
        base.recompute_modules = modules;
        plans.push_back(base);
      }
      base.recompute = Recompute::kFull;
      for (RecomputeMethod method : {RecomputeMethod::kUniform, RecomputeMethod::kBlock}) {
        base.recompute_method = method;
        plans.push_back(base);
      }
      for (Plan p : plans) {
        for (int precision = 0; precision < 4; ++precision) {
          p.precision = precision == 0 ? Precision::kBf16 : Precision::kFp8;
          p.fp8_recipe = precision == 1   ? Fp8Recipe::kDelayed
                         : precision == 2 ? Fp8Recipe::kTensorwise
                                          : Fp8Recipe::kBlockwise;
          for (int overlap = 0; overlap < 16; ++overlap) {
            p.overlap.cross_micro_batch = overlap & 1;
            p.overlap.inter_op = overlap & 2;
            p.overlap.delay_wgrad = overlap & 4;
            p.overlap.shared_experts = overlap & 8;
            if (!validate(p, m, hw).empty()) continue;
            ++legal;
            CAPTURE(std::string(name));
            CAPTURE(io::plan_to_json(p).dump());
            check_megatron_rules(p, m, planner::megatron_args(p, m, hw));
          }
        }
      }
    }
    CHECK(legal > 500);
  }

  TEST_CASE("the moerun plan file round-trips to an equal plan") {
    Plan p = make_plan("deepseek-v3", 256, 4096, 512);
    p.hardware = "h800-sxm";
    p.stack = "megatron-core-deepep";
    p.attention = {.tp = 2, .sp = 2, .cp = 2};
    p.experts = {.ep = 32, .etp = 2, .dispatch = Dispatch::kDedup};
    p.pipeline = {.pp = 4,
                  .vpp = 2,
                  .schedule = Schedule::kInterleaved1F1B,
                  .layers_per_stage = {7, 8, 8, 8, 8, 8, 8, 6}};
    p.data.zero = 2;
    p.overlap = {.inter_op = true, .intra_op = true, .dp_comm = false, .pp_comm = true};
    p.compression = {.grad_sync = GradSync::kBf16AllToAll, .dispatch = DispatchPrecision::kFp8};
    p.precision = Precision::kFp8;
    p.recompute = Recompute::kSar;
    p.routing = {.distribution = "zipf:1.2", .capacity_factor = 1.5};
    const planner::MoerunLaunch l =
        planner::moerun_launch(p, hardware("h800-sxm"), "plan.json", "runs/plan", "cuda");
    Result<nlohmann::json> j = io::parse_json_text(l.plan_json, "plan.json");
    REQUIRE(j.ok());
    Result<Plan> back = io::plan_from_json(j.value(), "plan.json");
    REQUIRE(back.ok());
    const Plan& q = back.value();
    CHECK(q.model == p.model);
    CHECK(q.hardware == p.hardware);
    CHECK(q.stack == p.stack);
    CHECK(q.gpus == p.gpus);
    CHECK(q.seq_len == p.seq_len);
    CHECK(q.global_batch == p.global_batch);
    CHECK(q.micro_batch == p.micro_batch);
    CHECK(q.attention.tp == p.attention.tp);
    CHECK(q.attention.sp == p.attention.sp);
    CHECK(q.attention.cp == p.attention.cp);
    CHECK(q.experts.ep == p.experts.ep);
    CHECK(q.experts.etp == p.experts.etp);
    CHECK(q.experts.dispatch == p.experts.dispatch);
    CHECK(q.pipeline.pp == p.pipeline.pp);
    CHECK(q.pipeline.vpp == p.pipeline.vpp);
    CHECK(q.pipeline.schedule == p.pipeline.schedule);
    CHECK(q.pipeline.layers_per_stage == p.pipeline.layers_per_stage);
    CHECK(q.data.zero == p.data.zero);
    CHECK(q.overlap.inter_op == p.overlap.inter_op);
    CHECK(q.overlap.intra_op == p.overlap.intra_op);
    CHECK(q.overlap.dp_comm == p.overlap.dp_comm);
    CHECK(q.overlap.pp_comm == p.overlap.pp_comm);
    CHECK(q.compression.grad_sync == p.compression.grad_sync);
    CHECK(q.compression.dispatch == p.compression.dispatch);
    CHECK(q.precision == p.precision);
    CHECK(q.recompute == p.recompute);
    CHECK(q.routing.distribution == p.routing.distribution);
    CHECK(q.routing.capacity_factor == p.routing.capacity_factor);
    CHECK(io::plan_to_json(q) == io::plan_to_json(p));
  }

  TEST_CASE("mpirun and srun start one rank per GPU on whole nodes, on the CUDA backend") {
    Plan p = make_plan("mixtral-8x7b", 16, 4096, 32);
    p.experts.ep = 8;
    const planner::MoerunLaunch l =
        planner::moerun_launch(p, hardware("h100-sxm"), "plans/my plan.json", "runs/x", "cuda");
    CHECK(
        l.mpirun ==
        "mpirun -np 16 --map-by ppr:8:node --bind-to none -x NCCL_DEBUG=WARN moerun run 'plans/my plan.json' "
        "--backend cuda --out runs/x");
    CHECK(l.srun ==
          "srun --mpi=pmix --nodes=2 --ntasks-per-node=8 --gpus-per-node=8 moerun run 'plans/my plan.json' "
          "--backend cuda --out runs/x");
    CHECK(planner::default_run_dir("plans/my plan.json") == "runs/my_plan");
    const std::string text =
        planner::moerun_text(p, model(p.model), hardware(p.hardware), "p.json", "runs/p", "cuda");
    CHECK(text.find(planner::moerun_launch(p, hardware("h100-sxm"), "p.json", "runs/p", "cuda").plan_json) !=
          std::string::npos);
    CHECK(text.find("local rank i the node's GPU i") != std::string::npos);

    // The CPU backend: MPI ranks, no GPUs asked for, no NCCL environment.
    const planner::MoerunLaunch c =
        planner::moerun_launch(p, hardware("h100-sxm"), "p.json", "runs/p", "cpu");
    CHECK(c.mpirun == "mpirun -np 16 --map-by ppr:8:node moerun run p.json --backend cpu --out runs/p");
    CHECK(c.srun ==
          "srun --mpi=pmix --nodes=2 --ntasks-per-node=8 moerun run p.json --backend cpu --out runs/p");
    CHECK(planner::moerun_text(p, model(p.model), hardware(p.hardware), "p.json", "runs/p", "cpu")
              .find("NCCL") == std::string::npos);
  }

  TEST_CASE("the sbatch script asks for the plan's node count and states the NCCL environment") {
    Result<io::LoadedPlan> l = example("deepseek-v3-2048xh800.json");
    REQUIRE(l.ok());
    const auto& [plan, m, hw, path] = l.value();
    const std::string s = planner::slurm_script(plan, m, hw, "ds.json", "runs/ds", "cuda");
    CHECK(s.starts_with("#!/bin/bash\n"));
    CHECK(s.find("#SBATCH --nodes=256\n") != std::string::npos);
    CHECK(s.find("#SBATCH --ntasks-per-node=8\n") != std::string::npos);
    CHECK(s.find("#SBATCH --gpus-per-node=8\n") != std::string::npos);
    CHECK(s.find("#SBATCH --exclusive\n") != std::string::npos);
    CHECK(s.find("#SBATCH --job-name=moerun-ds\n") != std::string::npos);
    CHECK(s.find("#SBATCH --output=") != std::string::npos);
    CHECK(s.find("NCCL_IB_HCA") != std::string::npos);
    CHECK(s.find("\nexport NCCL_DEBUG=WARN\n") != std::string::npos);
    CHECK(
        s.ends_with("srun --mpi=pmix --nodes=256 --ntasks-per-node=8 --gpus-per-node=8 moerun run ds.json "
                    "--backend cuda --out runs/ds\n"));

    // Fewer GPUs than a node: one node, one rank per GPU. The CPU backend asks for no GPUs.
    Plan small = make_plan("tiny-moe", 4, 256, 8);
    small.experts.ep = 4;
    const std::string t =
        planner::slurm_script(small, model("tiny-moe"), hardware("h100-sxm"), "t.json", "runs/t", "cpu");
    CHECK(t.find("#SBATCH --nodes=1\n") != std::string::npos);
    CHECK(t.find("#SBATCH --ntasks-per-node=4\n") != std::string::npos);
    CHECK(t.find("--gpus-per-node") == std::string::npos);
    CHECK(t.find("NCCL") == std::string::npos);
  }

  TEST_CASE(
      "the sbatch script with calibrate measures the nodes, fits, predicts, runs and compares in order") {
    Result<io::LoadedPlan> l = example("deepseek-v3-2048xh800.json");
    REQUIRE(l.ok());
    const auto& [plan, m, hw, path] = l.value();
    const std::string s = planner::slurm_script(plan, m, hw, "ds.json", "runs/ds", "cuda", true);
    const std::string srun = "srun --mpi=pmix --nodes=256 --ntasks-per-node=8 --gpus-per-node=8 ";
    const std::vector<std::string> steps = {
        srun + "moerun bench --backend cuda --base " + plan.hardware +
            " --plan ds.json --out runs/ds/bench ${MOERUN_BENCH_FLAGS:-}\n",
        "moeplan calibrate --bench runs/ds/bench -o runs/ds/hardware.json --report >runs/ds/calibrate.txt\n",
        "moeplan simulate ds.json --hardware runs/ds/hardware.json --json >runs/ds/predicted.json\n",
        srun + "moerun run ds.json --backend cuda --out runs/ds ${MOERUN_RUN_FLAGS:-}\n",
        "moeplan compare runs/ds/predicted.json runs/ds/report.json | tee runs/ds/compare.txt\n"};
    size_t at = 0;
    for (const std::string& step : steps) {
      CAPTURE(step);
      const size_t found = s.find(step, at);
      REQUIRE(found != std::string::npos);
      at = found + step.size();
    }
    CHECK(at == s.size());
    // Without calibrate the script is unchanged: it ends with the run.
    CHECK(planner::slurm_script(plan, m, hw, "ds.json", "runs/ds", "cuda").find("moerun bench") ==
          std::string::npos);
    // A hardware profile beside the plan is named from where the script runs; the CPU bench takes no base.
    Plan filed = plan;
    filed.hardware = "my-cluster.json";
    const fs::path dir = fs::temp_directory_path() / ("moeplan_slurm_" + std::to_string(::getpid()));
    fs::create_directories(dir / "plans");
    std::ofstream(dir / "plans" / "my-cluster.json") << "{}";
    const std::string beside =
        planner::slurm_script(filed, m, hw, (dir / "plans" / "ds.json").string(), "runs/ds", "cuda", true);
    CHECK(beside.find("--base " + (dir / "plans" / "my-cluster.json").string() + " ") != std::string::npos);
    CHECK(planner::slurm_script(plan, m, hw, "ds.json", "runs/ds", "cpu", true).find("--base") ==
          std::string::npos);
    fs::remove_all(dir);
  }

  TEST_CASE("a plan copied elsewhere names the same model files") {
    const fs::path dir = fs::temp_directory_path() / ("moeplan_rebase_" + std::to_string(::getpid()));
    fs::create_directories(dir / "a" / "models");
    fs::create_directories(dir / "b" / "c");
    std::ofstream(dir / "a" / "models" / "m.json") << "{}";
    Plan p = make_plan("models/m.json", 8, 4096, 8);
    p.hardware = "h100-sxm";  // a built-in name stays as it is
    const Plan q = planner::rebase_plan_paths(p, (dir / "a" / "plan.json").string(),
                                              (dir / "b" / "c" / "p.json").string());
    CHECK(q.model == "../../a/models/m.json");
    CHECK(fs::equivalent(dir / "b" / "c" / q.model, dir / "a" / "models" / "m.json"));
    CHECK(q.hardware == "h100-sxm");
    fs::remove_all(dir);
  }

  TEST_CASE("moeplan launch writes each target and rejects bad input") {
    const std::string plan = "planner/examples/mixtral-8x22b-128xh100.json";
    Run r = run_cli("launch " + plan + " --for megatron --json");
    REQUIRE(r.exit_code == 0);
    const auto j = nlohmann::json::parse(r.out);
    CHECK(j.at("target") == "megatron");
    CHECK(j.at("flags").size() > 20);
    CHECK(j.at("text").get<std::string>().find("--tensor-model-parallel-size 2 \\\n") != std::string::npos);

    const fs::path out =
        fs::temp_directory_path() / ("moeplan_launch_" + std::to_string(::getpid()) + ".sbatch");
    r = run_cli("launch " + plan + " --for slurm --out '" + out.string() + "'");
    CHECK(r.exit_code == 0);
    CHECK(slurp(out.string()).find("#SBATCH --nodes=16\n") != std::string::npos);
    CHECK_FALSE(fs::exists(out.string() + ".tmp"));
    fs::remove(out);

    const fs::path plan_out =
        fs::temp_directory_path() / ("moeplan_launch_" + std::to_string(::getpid()) + ".json");
    r = run_cli("launch " + plan + " --for moerun --out '" + plan_out.string() + "' --json");
    REQUIRE(r.exit_code == 0);
    const auto k = nlohmann::json::parse(r.out);
    CHECK(k.at("commands").at("mpirun").get<std::string>().starts_with("mpirun -np 128 --map-by ppr:8:node"));
    Result<io::LoadedPlan> copied = io::load_plan(plan_out.string());  // the copy still finds its model
    CHECK(copied.ok());
    fs::remove(plan_out);

    r = run_cli("launch " + plan + " --for megatron --calibrate");
    CHECK(r.exit_code == 2);
    CHECK(r.err == "moeplan: error: --calibrate: only with --for slurm\n");
    r = run_cli("launch " + plan + " --for deepspeed");
    CHECK(r.exit_code == 2);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    r = run_cli("launch no-such-plan.json --for moerun");
    CHECK(r.exit_code == 2);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  }
}
