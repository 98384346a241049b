// import (see import.h). Megatron-LM's defaults where a flag is absent are those of arguments.py at the
// commit the launch targets (shared/reference/megatron-flags.md): tp, pp, cp, ep 1; etp = tp; dispatcher
// allgather; cp-comm-type p2p; fp8-recipe delayed; cross-entropy-fusion-impl native; recompute modules
// core_attn.
#include "planner/import.h"

#include <charconv>
#include <map>
#include <optional>
#include <regex>
#include <set>

#include <fmt/format.h>

namespace moeplan::planner {
namespace {

using nlohmann::json;

// Flags with their values, in the order given; a later occurrence replaces an earlier one (as argparse).
class Flags {
 public:
  explicit Flags(const std::vector<std::string>& words) {
    for (size_t i = 0; i < words.size(); ++i) {
      const std::string& w = words[i];
      if (!w.starts_with("--") || w.size() == 2) continue;
      const size_t eq = w.find('=');
      std::string name = w.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
      std::vector<std::string> values;
      if (eq != std::string::npos) {
        values.push_back(w.substr(eq + 1));
      } else {
        while (i + 1 < words.size() && !words[i + 1].starts_with("--") && !looks_like_program(words[i + 1])) {
          values.push_back(words[++i]);
        }
      }
      values_[name] = std::move(values);
    }
  }
  bool has(const std::string& name) {
    read_.insert(name);
    return values_.contains(name);
  }
  // The single value of a flag, or nullopt when absent; an error when it has none or several.
  Result<std::optional<std::string>> word(const std::string& name) {
    if (!has(name)) return std::optional<std::string>{};
    const auto& v = values_.at(name);
    if (v.size() != 1) return Error{fmt::format("--{}: expected one value, got {}", name, v.size())};
    return std::optional<std::string>{v.front()};
  }
  Result<int64_t> integer(const std::string& name, int64_t fallback, int64_t lo = 1) {
    Result<std::optional<std::string>> w = word(name);
    if (!w) return w.error();
    if (!w.value()) return fallback;
    const std::string& s = *w.value();
    int64_t n = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
    if (ec != std::errc() || end != s.data() + s.size() || n < lo) {
      return Error{fmt::format("--{}: expected an integer >= {}, got '{}'", name, lo, s)};
    }
    return n;
  }
  const std::vector<std::string>& list(const std::string& name) {
    read_.insert(name);
    static const std::vector<std::string> kNone;
    const auto it = values_.find(name);
    return it == values_.end() ? kNone : it->second;
  }
  std::vector<std::string> unread() const {
    std::vector<std::string> out;
    for (const auto& [name, v] : values_) {
      if (!read_.contains(name)) out.push_back("--" + name);
    }
    return out;
  }

 private:
  // The script's program (python pretrain_gpt.py) ends a flag's values.
  static bool looks_like_program(const std::string& w) {
    return w.ends_with(".py") || w == "python" || w == "python3";
  }
  std::map<std::string, std::vector<std::string>> values_;
  std::set<std::string> read_;
};

// Flags of the launch that describe the model, the data or the run and have no plan field; read so they are
// not listed as unread.
constexpr const char* kModelFlags[] = {"num-layers",
                                       "hidden-size",
                                       "ffn-hidden-size",
                                       "num-attention-heads",
                                       "normalization",
                                       "swiglu",
                                       "squared-relu",
                                       "position-embedding-type",
                                       "untie-embeddings-and-output-weights",
                                       "mtp-num-layers",
                                       "disable-bias-linear",
                                       "add-qkv-bias",
                                       "multi-latent-attention",
                                       "q-lora-rank",
                                       "kv-lora-rank",
                                       "qk-head-dim",
                                       "qk-pos-emb-head-dim",
                                       "v-head-dim",
                                       "kv-channels",
                                       "group-query-attention",
                                       "num-query-groups",
                                       "qk-layernorm",
                                       "qk-l2-norm",
                                       "softmax-type",
                                       "window-size",
                                       "window-attn-skip-freq",
                                       "num-experts",
                                       "moe-router-topk",
                                       "moe-ffn-hidden-size",
                                       "moe-shared-expert-intermediate-size",
                                       "moe-shared-expert-gate",
                                       "moe-layer-freq",
                                       "moe-grouped-gemm",
                                       "moe-permute-fusion",
                                       "moe-router-num-groups",
                                       "moe-router-group-topk",
                                       "moe-router-score-function",
                                       "moe-router-enable-expert-bias",
                                       "moe-router-load-balancing-type",
                                       "moe-router-pre-softmax",
                                       "moe-router-dtype",
                                       "moe-router-topk-scaling-factor",
                                       "moe-token-drop-policy",
                                       "max-position-embeddings",
                                       "bf16",
                                       "tokenizer-type",
                                       "vocab-size",
                                       "mock-data",
                                       "sequence-parallel",
                                       "moe-router-padding-for-quantization",
                                       "no-gradient-accumulation-fusion",
                                       "delay-wgrad-compute",
                                       "overlap-param-gather",
                                       "rotary-base",
                                       "norm-epsilon",
                                       "train-iters",
                                       "eval-iters",
                                       "eval-interval",
                                       "lr",
                                       "min-lr",
                                       "lr-decay-style",
                                       "lr-warmup-iters",
                                       "weight-decay",
                                       "clip-grad",
                                       "adam-beta1",
                                       "adam-beta2",
                                       "init-method-std",
                                       "log-interval",
                                       "log-throughput",
                                       "nnodes",
                                       "nproc-per-node",
                                       "nproc_per_node",
                                       "rdzv-backend",
                                       "rdzv-endpoint",
                                       "rdzv_backend",
                                       "rdzv_endpoint",
                                       "node-rank",
                                       "node_rank",
                                       "master-addr",
                                       "master_addr",
                                       "master-port",
                                       "master_port"};

// Layers per virtual stage of an explicit --pipeline-model-parallel-layout ("E,t*3|t*4|...|t*2,m,L").
Result<std::vector<int64_t>> layout_counts(const std::string& layout) {
  std::vector<int64_t> out;
  size_t start = 0;
  while (start <= layout.size()) {
    const size_t bar = std::min(layout.find('|', start), layout.size());
    const std::string stage = layout.substr(start, bar - start);
    start = bar + 1;
    int64_t n = 0;
    size_t s = 0;
    while (s <= stage.size()) {
      const size_t comma = std::min(stage.find(',', s), stage.size());
      const std::string item = stage.substr(s, comma - s);
      s = comma + 1;
      if (item == "t") {
        ++n;
      } else if (item.starts_with("t*")) {
        int64_t k = 0;
        const auto [end, ec] = std::from_chars(item.data() + 2, item.data() + item.size(), k);
        if (ec != std::errc() || end != item.data() + item.size() || k < 1) {
          return Error{fmt::format("--pipeline-model-parallel-layout: '{}' is not t*N", item)};
        }
        n += k;
      } else if (item != "E" && item != "L" && item != "m" && !item.starts_with("m*") && !item.empty()) {
        return Error{fmt::format(
            "--pipeline-model-parallel-layout: unknown item '{}' (expected E, t, t*N, m, L)", item)};
      }
    }
    out.push_back(n);
  }
  return out;
}

int64_t first_match(const std::string& text, const std::regex& re) {
  std::smatch m;
  if (!std::regex_search(text, m, re)) return 0;
  return std::stoll(m[1].str());
}

}  // namespace

std::vector<std::string> shell_words(const std::string& text) {
  std::vector<std::string> out;
  std::string word;
  bool in_word = false;
  char quote = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quote) {
      if (c == quote) {
        quote = 0;
      } else {
        word += c;
      }
      continue;
    }
    if (c == '\\' && i + 1 < text.size() && text[i + 1] == '\n') {
      ++i;
      continue;
    }
    if (c == '\'' || c == '"') {
      quote = c;
      in_word = true;
      continue;
    }
    if (c == '#' && !in_word) {
      while (i < text.size() && text[i] != '\n') ++i;
      continue;
    }
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      if (in_word) out.push_back(std::move(word));
      word.clear();
      in_word = false;
      continue;
    }
    word += c;
    in_word = true;
  }
  if (in_word) out.push_back(std::move(word));
  return out;
}

Result<Imported> import_megatron(const std::string& text, const ModelSpec& model,
                                 const ImportOptions& options) {
  Flags f(shell_words(text));
  Imported out;
  json& plan = out.plan;

  // The GPUs: given, or the launcher's nodes x GPUs per node (comment lines included: `moeplan launch`
  // prints the torchrun line as a comment).
  int64_t gpus = options.gpus;
  if (gpus <= 0) {
    const int64_t nnodes = first_match(text, std::regex(R"(--nnodes[= ](\d+))"));
    const int64_t per = first_match(text, std::regex(R"(--nproc[-_]per[-_]node[= ](\d+))"));
    const int64_t sb_nodes = first_match(text, std::regex(R"(#SBATCH\s+(?:--nodes[= ]|-N\s*)(\d+))"));
    const int64_t sb_per = first_match(text, std::regex(R"(--gpus-per-node[= ](\d+))"));
    if (nnodes > 0 && per > 0) {
      gpus = nnodes * per;
    } else if (sb_nodes > 0) {
      gpus = sb_nodes * (sb_per > 0 ? sb_per : options.gpus_per_node);
    } else if (per > 0) {
      gpus = per;
    }
    if (gpus <= 0) {
      return Error{
          "the launch names no GPU count (torchrun --nnodes and --nproc-per-node, or #SBATCH --nodes): "
          "give --gpus N"};
    }
  }
  plan["gpus"] = gpus;

  // Model consistency: the launch's model flags must describe the model the plan is priced with.
  auto check_model = [&](const char* flag, int64_t expected) -> std::optional<Error> {
    Result<int64_t> v = f.integer(flag, expected, 0);
    if (!v) return v.error();
    if (v.value() != expected) {
      return Error{fmt::format("--{} {}: the model {} has {}; import with the model the launch trains", flag,
                               v.value(), model.name, expected)};
    }
    return std::nullopt;
  };
  for (const auto& [flag, expected] :
       {std::pair{"num-layers", model.num_layers()}, std::pair{"hidden-size", model.hidden},
        std::pair{"num-experts", model.moe.num_experts}, std::pair{"moe-router-topk", model.moe.top_k}}) {
    const std::string name = flag;
    if (model.moe.num_experts == 0 && (name.starts_with("moe") || name == "num-experts")) continue;
    if (auto e = check_model(flag, expected)) return *e;
  }
  for (const char* flag : kModelFlags) f.has(flag);
  // MTP is a training choice: Megatron trains none without --mtp-num-layers, whatever the config says.
  Result<int64_t> mtp = f.integer("mtp-num-layers", 0, 0);
  if (!mtp) return mtp.error();
  if (mtp.value() != model.mtp_layers) plan["mtp_layers"] = mtp.value();

  // Parallelism.
  Result<int64_t> tp = f.integer("tensor-model-parallel-size", 1),
                  pp = f.integer("pipeline-model-parallel-size", 1),
                  cp = f.integer("context-parallel-size", 1), ep = f.integer("expert-model-parallel-size", 1);
  for (const auto* r : {&tp, &pp, &cp, &ep}) {
    if (!*r) return r->error();
  }
  Result<int64_t> etp = f.integer("expert-tensor-parallel-size", tp.value());
  if (!etp) return etp.error();
  Result<std::optional<std::string>> cp_type = f.word("cp-comm-type");
  if (!cp_type) return cp_type.error();
  const std::string cpt = cp_type.value().value_or("p2p");
  int64_t sp = 1, cpn = cp.value();
  if (cp.value() > 1) {
    if (cpt == "a2a") {
      sp = cp.value();
      cpn = 1;
    } else if (cpt == "a2a+p2p") {
      const auto& h = f.list("hierarchical-context-parallel-sizes");
      if (h.size() != 2)
        return Error{"--cp-comm-type a2a+p2p: expected --hierarchical-context-parallel-sizes SP CP"};
      sp = std::stoll(h[0]);
      cpn = std::stoll(h[1]);
      if (sp * cpn != cp.value()) {
        return Error{
            fmt::format("--hierarchical-context-parallel-sizes {} {}: the product is not "
                        "--context-parallel-size {}",
                        h[0], h[1], cp.value())};
      }
    } else if (cpt == "p2p") {
      out.notes.push_back(
          "--cp-comm-type p2p: the K/V ring is priced as the K/V all-gather moeplan models (same bytes, "
          "different overlap)");
    } else if (cpt != "all_gather") {
      return Error{fmt::format("--cp-comm-type {}: expected p2p, all_gather, a2a or a2a+p2p", cpt)};
    }
  }
  plan["attention"] = {{"tp", tp.value()}, {"sp", sp}, {"cp", cpn}};
  if (model.attention.kind == AttentionKind::kMla && tp.value() > 1) {
    out.notes.push_back(
        "MLA under TP: its down projections are duplicated on the sequence shard since Megatron-Core 0.14 "
        "(the stack's own layout, used here) and column-parallel before; for an older Megatron set "
        "attention.mla_down_proj to \"column_parallel\"");
  }

  // Experts and the dispatcher.
  Result<std::optional<std::string>> type = f.word("moe-token-dispatcher-type");
  if (!type) return type.error();
  std::string dispatcher = type.value().value_or("allgather");
  std::string backend;
  if (f.has("moe-enable-deepep")) {
    dispatcher = "flex";
    backend = "deepep";
  }
  if (dispatcher == "flex" && backend.empty()) {
    Result<std::optional<std::string>> b = f.word("moe-flex-dispatcher-backend");
    if (!b) return b.error();
    backend = b.value().value_or("deepep");
  }
  const char* dispatch = dispatcher == "alltoall"    ? "all_to_all"
                         : dispatcher == "allgather" ? "all_gather"
                         : dispatcher == "flex"      ? "dedup"
                                                     : nullptr;
  if (!dispatch) {
    return Error{
        fmt::format("--moe-token-dispatcher-type {}: expected alltoall, allgather or flex", dispatcher)};
  }
  plan["experts"] = {{"ep", ep.value()}, {"etp", etp.value()}, {"dispatch", dispatch}};
  // DeepEP's received indices become the per-expert map in one fused kernel under --enable-experimental with
  // --moe-permute-fusion (token_dispatcher.py, _DeepepManager.get_permuted_hidden_states_by_experts).
  const bool experimental = f.has("enable-experimental"), permute_fusion = f.has("moe-permute-fusion");
  if (backend == "deepep" && experimental && permute_fusion) plan["experts"]["fused_index_conversion"] = true;
  // FP8's row alignment padded in the router (--moe-router-padding-for-fp8 before Megatron-Core 0.16, an
  // alias of --moe-router-padding-for-quantization since); without it, where the stack pads.
  if ((f.has("fp8-format") || f.has("fp8")) &&
      (f.has("moe-router-padding-for-quantization") || f.has("moe-router-padding-for-fp8")))
    plan["experts"]["fp8_padding"] = "router";
  plan["stack"] = !options.stack.empty()  ? options.stack
                  : dispatcher != "flex"  ? "megatron-core"
                  : backend == "hybridep" ? "megatron-core-hybridep"
                                          : "megatron-core-deepep";

  // Pipeline: the virtual stages and the layer split.
  Result<int64_t> vpp = f.integer("num-virtual-stages-per-pipeline-rank", 1);
  if (!vpp) return vpp.error();
  Result<int64_t> vpp_old = f.integer("virtual-pipeline-model-parallel-size", 1);
  if (!vpp_old) return vpp_old.error();
  int64_t v = std::max(vpp.value(), vpp_old.value());
  std::vector<int64_t> split;
  const int64_t layers = model.num_layers();
  Result<std::optional<std::string>> layout = f.word("pipeline-model-parallel-layout");
  if (!layout) return layout.error();
  Result<int64_t> first = f.integer("decoder-first-pipeline-num-layers", 0, 1),
                  last = f.integer("decoder-last-pipeline-num-layers", 0, 1);
  if (!first) return first.error();
  if (!last) return last.error();
  Result<int64_t> per_virtual = f.integer("num-layers-per-virtual-pipeline-stage", 0, 1);
  if (!per_virtual) return per_virtual.error();
  // The embedding and the loss may each count as one layer of the split (Megatron's
  // --account-for-embedding/loss-in-pipeline-split, transformer_block.py get_num_layers_to_build): the
  // first virtual stage of the first rank builds one decoder layer less, the last of the last rank too.
  const int64_t embedding_slot = f.has("account-for-embedding-in-pipeline-split") ? 1 : 0,
                loss_slot = f.has("account-for-loss-in-pipeline-split") ? 1 : 0;
  const bool uneven = first.value() > 0 || last.value() > 0;
  if ((embedding_slot || loss_slot) && (layout.value() || uneven)) {
    return Error{
        "--account-for-embedding/loss-in-pipeline-split: cannot be set with --pipeline-model-parallel-layout "
        "or --decoder-first/last-pipeline-num-layers (Megatron refuses the combination)"};
  }
  if (per_virtual.value() > 0) {
    // Megatron derives the virtual stages from it (arguments.py): (layers + embedding + loss) / pp / N.
    if (layout.value() || uneven || f.has("num-virtual-stages-per-pipeline-rank")) {
      return Error{
          "--num-layers-per-virtual-pipeline-stage: cannot be set with --pipeline-model-parallel-layout, "
          "--num-virtual-stages-per-pipeline-rank or --decoder-first/last-pipeline-num-layers"};
    }
    const int64_t counted = layers + embedding_slot + loss_slot;
    if (counted % pp.value() != 0 || (counted / pp.value()) % per_virtual.value() != 0) {
      return Error{fmt::format(
          "--num-layers-per-virtual-pipeline-stage {}: the {} layers (embedding and loss included when "
          "counted) do not split into pp {} ranks of whole virtual stages",
          per_virtual.value(), counted, pp.value())};
    }
    v = counted / pp.value() / per_virtual.value();
  }
  if (layout.value()) {
    Result<std::vector<int64_t>> c = layout_counts(*layout.value());
    if (!c) return c.error();
    const auto stages = static_cast<int64_t>(c.value().size());
    if (stages % pp.value() != 0) {
      return Error{fmt::format("--pipeline-model-parallel-layout: {} stages do not divide over pp {}", stages,
                               pp.value())};
    }
    v = stages / pp.value();
    split = c.value();
  } else if (first.value() > 0 || last.value() > 0) {
    const int64_t P = pp.value();
    const int64_t fl = first.value() > 0 ? first.value() : 0, ll = last.value() > 0 ? last.value() : 0;
    const int64_t middle_ranks = P - (fl > 0 ? 1 : 0) - (ll > 0 ? 1 : 0);
    const int64_t rest = layers - fl - ll;
    if (P < 2 || rest < 0 || (middle_ranks > 0 ? rest % middle_ranks != 0 : rest != 0)) {
      return Error{
          fmt::format("--decoder-first/last-pipeline-num-layers {} / {}: the other {} layers do not "
                      "split evenly over the middle ranks of pp {}",
                      fl, ll, rest, P)};
    }
    const int64_t mid = middle_ranks > 0 ? rest / middle_ranks : 0;
    split.assign(static_cast<size_t>(P * v), 0);
    for (int64_t r = 0; r < P; ++r) {
      const int64_t per_rank = r == 0 && fl > 0 ? fl : (r == P - 1 && ll > 0 ? ll : mid);
      if (per_rank % v != 0) {
        return Error{fmt::format("pipeline rank {} holds {} layers, not divisible by {} virtual stages", r,
                                 per_rank, v)};
      }
      for (int64_t k = 0; k < v; ++k) split[static_cast<size_t>(k * P + r)] = per_rank / v;
    }
  } else if (embedding_slot || loss_slot) {
    const int64_t counted = layers + embedding_slot + loss_slot, P = pp.value();
    if (counted % P != 0 || (counted / P) % v != 0) {
      return Error{fmt::format(
          "--account-for-embedding/loss-in-pipeline-split: {} layers with the embedding and loss counted do "
          "not split evenly over pp {} x {} virtual stages",
          counted, P, v)};
    }
    split.assign(static_cast<size_t>(P * v), counted / P / v);
    split.front() -= embedding_slot;
    split.back() -= loss_slot;
  }
  plan["pipeline"] = {{"pp", pp.value()}, {"vpp", v}, {"schedule", v > 1 ? "interleaved_1f1b" : "1f1b"}};
  if (!split.empty()) plan["pipeline"]["layers_per_stage"] = split;

  // The job.
  Result<int64_t> seq = f.integer("seq-length", 0);
  if (!seq) return seq.error();
  if (seq.value() == 0) return Error{"--seq-length: required (the plan's sequence length)"};
  Result<int64_t> mb = f.integer("micro-batch-size", 1);
  if (!mb) return mb.error();
  const int64_t mesh = tp.value() * cp.value() * pp.value();
  const int64_t dp = mesh > 0 && gpus % mesh == 0 ? gpus / mesh : 1;
  Result<int64_t> gb = f.integer("global-batch-size", mb.value() * dp);
  if (!gb) return gb.error();
  if (!f.has("global-batch-size"))
    out.notes.push_back("no --global-batch-size: Megatron's default, micro-batch x dp");
  plan["seq_len"] = seq.value();
  plan["micro_batch"] = mb.value();
  plan["global_batch"] = gb.value();

  // Optimizer sharding, overlaps and gradient sync.
  int64_t zero = f.has("use-distributed-optimizer") ? 1 : 0;
  if (f.has("use-megatron-fsdp") || f.has("use-torch-fsdp2")) {
    Result<std::optional<std::string>> s = f.word("data-parallel-sharding-strategy");
    if (!s) return s.error();
    const std::string strategy = s.value().value_or("optim_grads_params");
    zero = strategy == "optim_grads_params" ? 3 : strategy == "optim_grads" ? 2 : strategy == "optim" ? 1 : 0;
  }
  plan["data"] = {{"zero", zero}};
  const bool pp_overlap = pp.value() > 1 && v > 1 && !f.has("no-overlap-p2p-communication");
  plan["overlap"] = {{"inter_op", false},
                     {"intra_op", false},
                     {"dp_comm", f.has("overlap-grad-reduce")},
                     {"pp_comm", pp_overlap}};
  if (f.has("overlap-moe-expert-parallel-comm")) plan["overlap"]["cross_micro_batch"] = true;
  if (f.has("delay-wgrad-compute")) plan["overlap"]["delay_wgrad"] = true;
  // Inert without shared experts (Megatron builds no SharedExpertMLP then).
  if (f.has("moe-shared-expert-overlap") && model.is_moe() && model.moe.num_shared_experts > 0)
    plan["overlap"]["shared_experts"] = true;
  if (f.has("tp-comm-overlap") && tp.value() > 1) {
    plan["overlap"]["tp_comm"] = true;
    if (f.has("tp-comm-overlap-cfg")) {
      out.notes.push_back(
          "--tp-comm-overlap-cfg: moeplan prices TE's default userbuffers methods (TE v2.4 initialize_ub), "
          "not "
          "the file's");
    }
  }
  plan["compression"] = {
      {"grad_sync", f.has("grad-reduce-in-bf16") ? "bf16_reduce_scatter" : "fp32_reduce_scatter"},
      {"dispatch", "bf16"}};

  // Precision, loss and router kernels.
  const bool fp8 = f.has("fp8-format") || f.has("fp8");
  plan["precision"] = fp8 ? "fp8" : "bf16";
  if (fp8) {
    Result<std::optional<std::string>> r = f.word("fp8-recipe");
    if (!r) return r.error();
    plan["fp8_recipe"] = r.value().value_or("delayed");
    if (f.has("fp8-param-gather")) plan["data"]["fp8_param_gather"] = true;
  }
  if (f.has("cross-entropy-loss-fusion")) {
    Result<std::optional<std::string>> impl = f.word("cross-entropy-fusion-impl");
    if (!impl) return impl.error();
    plan["cross_entropy"] = impl.value().value_or("native");
  } else {
    plan["cross_entropy"] = "unfused";
  }
  plan["routing"] = {{"distribution", "uniform"}, {"fused_router", f.has("moe-router-fusion")}};
  if (f.has("moe-router-force-load-balancing")) {
    out.notes.push_back(
        "--moe-router-force-load-balancing: routing.distribution uniform, as the launch forces");
  } else {
    out.notes.push_back(
        "routing.distribution uniform: the learned router's imbalance is not in the launch; give a router "
        "trace "
        "or zipf:<s> in the plan to price it");
  }
  Result<std::optional<std::string>> capacity = f.word("moe-expert-capacity-factor");
  if (!capacity) return capacity.error();
  if (capacity.value()) plan["routing"]["capacity_factor"] = std::stod(*capacity.value());
  if (f.has("moe-pad-expert-input-to-capacity")) plan["routing"]["pad_to_capacity"] = true;

  // Recompute.
  Result<std::optional<std::string>> granularity = f.word("recompute-granularity");
  if (!granularity) return granularity.error();
  const std::string g = granularity.value().value_or("");
  if (g == "selective") {
    std::vector<std::string> modules = f.list("recompute-modules");
    if (modules.empty()) modules = {"core_attn"};
    plan["recompute"] = {{"granularity", "selective"}, {"modules", modules}};
  } else if (g == "full") {
    Result<std::optional<std::string>> method = f.word("recompute-method");
    if (!method) return method.error();
    Result<int64_t> n = f.integer("recompute-num-layers", 1);
    if (!n) return n.error();
    plan["recompute"] = {
        {"granularity", "full"}, {"method", method.value().value_or("uniform")}, {"num_layers", n.value()}};
  } else if (g.empty()) {
    plan["recompute"] = "none";
  } else {
    return Error{fmt::format("--recompute-granularity {}: expected selective or full", g)};
  }

  // CUDA graphs: TE's per-layer graphs with their scopes (--cuda-graph-scope, renamed --cuda-graph-modules in
  // Megatron-Core 0.18; none or "full": whole layers). The local implementation's graphs are not modelled.
  Result<std::optional<std::string>> graph_impl = f.word("cuda-graph-impl");
  if (!graph_impl) return graph_impl.error();
  std::vector<std::string> scopes = f.list("cuda-graph-scope");
  for (const std::string& s : f.list("cuda-graph-modules")) scopes.push_back(s);
  const std::string gi = graph_impl.value().value_or("none");
  f.has("te-rng-tracker");  // Megatron turns it on for CUDA graphs anyway; it changes no cost
  if (gi == "transformer_engine") {
    if (scopes.empty() || scopes == std::vector<std::string>{"full"}) scopes = {"layer"};
    plan["cuda_graphs"] = scopes;
  } else if (gi == "local") {
    out.notes.push_back(
        "--cuda-graph-impl local: Megatron's own CUDA graphs are not modelled; the plan runs without CUDA "
        "graphs");
  } else if (gi != "none") {
    return Error{fmt::format("--cuda-graph-impl {}: expected none, local or transformer_engine", gi)};
  }

  out.unread = f.unread();
  return out;
}

}  // namespace moeplan::planner
