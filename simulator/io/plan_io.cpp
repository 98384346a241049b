// Reading and writing plan files. Unknown keys are errors; absent sections take the defaults of core/plan.h.
#include "simulator/io/plan_io.h"

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>

#include "simulator/io/hardware_loader.h"
#include "simulator/io/model_loader.h"

namespace moeplan::io {
namespace {

constexpr int64_t kMaxDegree = 1 << 20;

constexpr std::pair<const char*, RecomputeModule> kModuleNames[] = {
    {"core_attn", kRecomputeCoreAttn},
    {"moe_act", kRecomputeMoeAct},
    {"layernorm", kRecomputeLayernorm},
    {"mla_up_proj", kRecomputeMlaUpProj},
    {"mlp", kRecomputeMlp},
    {"moe", kRecomputeMoe},
    {"shared_experts", kRecomputeSharedExperts}};

// "recompute": "none" | "selective" | "full" | "sar", or an object
//   {"granularity": "selective", "modules": ["core_attn", "moe_act", ...]}
//   {"granularity": "full", "method": "uniform" | "block", "num_layers": N}
void read_recompute(const JsonNode& r, Plan& p) {
  const std::initializer_list<std::pair<const char*, Recompute>> kinds = {
      {"none", Recompute::kNone},
      {"selective", Recompute::kSelective},
      {"full", Recompute::kFull},
      {"sar", Recompute::kSar}};
  if (!r.has("recompute")) return;
  if (r.raw().at("recompute").is_string()) {
    p.recompute = r.choice<Recompute>("recompute", kinds);
    return;
  }
  const JsonNode o = r.object("recompute");
  o.only_keys({"granularity", "modules", "method", "num_layers"});
  p.recompute = o.choice<Recompute>("granularity", kinds);
  if (o.has("modules")) {
    if (p.recompute != Recompute::kSelective)
      o.fail("modules", "no modules unless granularity is \"selective\"");
    p.recompute_modules = 0;
    for (const JsonNode& m : o.array("modules")) {
      if (!m.raw().is_string()) m.fail_here("a recompute module name");
      const auto name = m.raw().get<std::string>();
      bool found = false;
      for (const auto& [n, bit] : kModuleNames) {
        if (name == n) p.recompute_modules |= bit, found = true;
      }
      if (!found) {
        std::vector<std::string> known;
        for (const auto& [n, bit] : kModuleNames) known.emplace_back(n);
        const std::string near = closest_match(name, known);
        m.fail_here(
            fmt::format("one of core_attn, moe_act, layernorm, mla_up_proj, mlp, moe, shared_experts{}",
                        near.empty() ? "" : fmt::format(" (did you mean \"{}\"?)", near)));
      }
    }
    if (p.recompute_modules == 0) o.fail("modules", "at least one module");
  }
  if (o.has("method") || o.has("num_layers")) {
    if (p.recompute != Recompute::kFull)
      o.fail(o.has("method") ? "method" : "num_layers",
             "no method or num_layers unless granularity is \"full\"");
    p.recompute_method = o.choice_or<RecomputeMethod>(
        "method", RecomputeMethod::kUniform,
        {{"uniform", RecomputeMethod::kUniform}, {"block", RecomputeMethod::kBlock}});
    p.recompute_num_layers = o.integer_or("num_layers", 1, 1, 100000);
  }
}

Plan read_plan(const JsonNode& r) {
  r.only_keys({"model",        "hardware",    "stack",         "gpus",        "seq_len",
               "global_batch", "micro_batch", "attention",     "experts",     "pipeline",
               "data",         "overlap",     "compression",   "precision",   "fp8_recipe",
               "recompute",    "routing",     "cross_entropy", "cuda_graphs", "mtp_layers"});
  Plan p;
  p.model = r.string("model");
  p.hardware = r.string("hardware");
  p.stack = r.string_or("stack", "");
  p.gpus = r.integer("gpus", 1, kMaxDegree);
  p.seq_len = r.integer("seq_len", 1, int64_t{1} << 30);
  p.global_batch = r.integer("global_batch", 1, int64_t{1} << 40);
  if (p.global_batch > kMaxGlobalBatch) r.fail("global_batch", kGlobalBatchTooLarge);
  p.micro_batch = r.integer_or("micro_batch", 1, 1, int64_t{1} << 30);

  if (auto a = r.optional_object("attention")) {
    a->only_keys({"tp", "sp", "cp", "mla_down_proj"});
    p.attention.tp = a->integer_or("tp", 1, 1, kMaxDegree);
    p.attention.sp = a->integer_or("sp", 1, 1, kMaxDegree);
    p.attention.cp = a->integer_or("cp", 1, 1, kMaxDegree);
    // Absent: as the stack builds them.
    p.attention.mla_down_proj = a->choice_or<MlaDownProj>("mla_down_proj", MlaDownProj::kStack,
                                                          {{"duplicated", MlaDownProj::kDuplicated},
                                                           {"column_parallel", MlaDownProj::kColumnParallel},
                                                           {"gathered", MlaDownProj::kGathered}});
  }
  if (auto e = r.optional_object("experts")) {
    e->only_keys({"ep", "etp", "dispatch", "fused_index_conversion", "fp8_padding"});
    p.experts.ep = e->integer_or("ep", 1, 1, kMaxDegree);
    p.experts.etp = e->integer_or("etp", 1, 1, kMaxDegree);
    p.experts.dispatch = e->choice_or<Dispatch>("dispatch", Dispatch::kAllToAll,
                                                {{"all_to_all", Dispatch::kAllToAll},
                                                 {"all_gather", Dispatch::kAllGather},
                                                 {"dedup", Dispatch::kDedup}});
    p.experts.fused_index_conversion = e->boolean_or("fused_index_conversion", false);
    // Absent: where the stack pads.
    p.experts.fp8_padding = e->choice_or<Fp8Padding>("fp8_padding", Fp8Padding::kStack,
                                                     {{"experts", Fp8Padding::kExperts},
                                                      {"dispatcher", Fp8Padding::kDispatcher},
                                                      {"router", Fp8Padding::kRouter},
                                                      {"none", Fp8Padding::kNone}});
  }
  if (auto pp = r.optional_object("pipeline")) {
    pp->only_keys({"pp", "vpp", "schedule", "layers_per_stage"});
    p.pipeline.pp = pp->integer_or("pp", 1, 1, kMaxDegree);
    p.pipeline.vpp = pp->integer_or("vpp", 1, 1, 1024);
    p.pipeline.schedule = pp->choice_or<Schedule>("schedule", Schedule::k1F1B,
                                                  {{"1f1b", Schedule::k1F1B},
                                                   {"interleaved_1f1b", Schedule::kInterleaved1F1B},
                                                   {"dualpipev", Schedule::kDualPipeV}});
    if (pp->has("layers_per_stage")) {
      for (const auto& n : pp->array("layers_per_stage"))
        p.pipeline.layers_per_stage.push_back(n.as_integer(0, 100000));
    }
  }
  if (auto d = r.optional_object("data")) {
    d->only_keys({"zero", "fp8_param_gather"});
    p.data.zero = d->integer_or("zero", 1, 0, 3);
    p.data.fp8_param_gather = d->boolean_or("fp8_param_gather", false);
  }
  if (auto o = r.optional_object("overlap")) {
    o->only_keys({"inter_op", "intra_op", "dp_comm", "pp_comm", "cross_micro_batch", "delay_wgrad", "tp_comm",
                  "shared_experts"});
    p.overlap.inter_op = o->boolean_or("inter_op", false);
    p.overlap.intra_op = o->boolean_or("intra_op", false);
    p.overlap.dp_comm = o->boolean_or("dp_comm", false);
    p.overlap.pp_comm = o->boolean_or("pp_comm", false);
    p.overlap.cross_micro_batch = o->boolean_or("cross_micro_batch", false);
    p.overlap.delay_wgrad = o->boolean_or("delay_wgrad", false);
    p.overlap.tp_comm = o->boolean_or("tp_comm", false);
    p.overlap.shared_experts = o->boolean_or("shared_experts", false);
  }
  if (auto c = r.optional_object("compression")) {
    c->only_keys({"grad_sync", "dispatch"});
    p.compression.grad_sync = c->choice_or<GradSync>("grad_sync", GradSync::kFp32ReduceScatter,
                                                     {{"fp32_reduce_scatter", GradSync::kFp32ReduceScatter},
                                                      {"bf16_reduce_scatter", GradSync::kBf16ReduceScatter},
                                                      {"bf16_all_to_all", GradSync::kBf16AllToAll}});
    p.compression.dispatch = c->choice_or<DispatchPrecision>(
        "dispatch", DispatchPrecision::kBf16,
        {{"bf16", DispatchPrecision::kBf16}, {"fp8", DispatchPrecision::kFp8}});
  }
  p.cross_entropy = r.choice_or<CrossEntropy>(
      "cross_entropy", CrossEntropy::kTe,
      {{"te", CrossEntropy::kTe}, {"native", CrossEntropy::kNative}, {"unfused", CrossEntropy::kUnfused}});
  p.precision = r.choice_or<Precision>("precision", Precision::kBf16,
                                       {{"bf16", Precision::kBf16}, {"fp8", Precision::kFp8}});
  if (r.has("fp8_recipe")) {
    if (p.precision != Precision::kFp8) r.fail("fp8_recipe", "no fp8_recipe unless precision is \"fp8\"");
    p.fp8_recipe = r.choice<Fp8Recipe>("fp8_recipe", {{"delayed", Fp8Recipe::kDelayed},
                                                      {"tensorwise", Fp8Recipe::kTensorwise},
                                                      {"blockwise", Fp8Recipe::kBlockwise},
                                                      {"mxfp8", Fp8Recipe::kMxfp8}});
  }
  read_recompute(r, p);
  if (auto rt = r.optional_object("routing")) {
    rt->only_keys({"distribution", "capacity_factor", "fused_router", "pad_to_capacity"});
    p.routing.distribution = rt->string_or("distribution", "uniform");
    const std::string& d = p.routing.distribution;
    if (d.starts_with("zipf:")) {
      try {
        size_t used = 0;
        const double s = std::stod(d.substr(5), &used);
        if (used != d.size() - 5 || !(s > 0 && s < 100)) throw std::invalid_argument("range");
      } catch (const std::exception&) {
        rt->fail("distribution", "\"uniform\", \"zipf:<s>\" with 0 < s < 100, or a router-trace file");
      }
    } else if (d.empty()) {
      rt->fail("distribution", "\"uniform\", \"zipf:<s>\", or a router-trace file");
    }
    if (rt->has("capacity_factor")) p.routing.capacity_factor = rt->number("capacity_factor", 1e-3, 1e3);
    p.routing.fused_router = rt->boolean_or("fused_router", true);
    p.routing.pad_to_capacity = rt->boolean_or("pad_to_capacity", false);
  }
  if (r.has("mtp_layers")) p.mtp_layers = r.integer("mtp_layers", 0, 64);
  // "cuda_graphs": the scopes Megatron captures per layer, ["attn", "moe_router", ...] or ["layer"].
  if (r.has("cuda_graphs")) {
    const std::vector<std::string> known = cuda_graph_scope_names(kAllCudaGraphScopes);
    for (const JsonNode& g : r.array("cuda_graphs")) {
      if (!g.raw().is_string()) g.fail_here("a CUDA-graph scope name");
      const auto name = g.raw().get<std::string>();
      const auto at = std::find(known.begin(), known.end(), name);
      if (at == known.end()) {
        const std::string near = closest_match(name, known);
        g.fail_here(fmt::format("one of layer, attn, mlp, moe, moe_router, moe_preprocess, mamba{}",
                                near.empty() ? "" : fmt::format(" (did you mean \"{}\"?)", near)));
      }
      p.cuda_graphs |= static_cast<uint8_t>(1u << (at - known.begin()));
    }
    if (p.cuda_graphs == 0)
      r.fail("cuda_graphs", "at least one scope (leave the key out for no CUDA graphs)");
  }
  return p;
}

}  // namespace

json recompute_to_json(const Plan& p) {
  if (p.recompute == Recompute::kSelective && p.recompute_modules != kRecomputeCoreAttn) {
    return {{"granularity", "selective"}, {"modules", recompute_module_names(p.recompute_modules)}};
  }
  if (p.recompute == Recompute::kFull &&
      (p.recompute_method != RecomputeMethod::kUniform || p.recompute_num_layers != 1)) {
    return {{"granularity", "full"},
            {"method", name_of(p.recompute_method)},
            {"num_layers", p.recompute_num_layers}};
  }
  return name_of(p.recompute);
}

Result<Plan> plan_from_json(const json& j, const std::string& label) {
  return catch_input_errors([&]() { return read_plan(JsonNode(j, label)); });
}

json plan_to_json(const Plan& p) {
  json j;
  j["model"] = p.model;
  j["hardware"] = p.hardware;
  if (!p.stack.empty()) j["stack"] = p.stack;
  j["gpus"] = p.gpus;
  j["seq_len"] = p.seq_len;
  j["global_batch"] = p.global_batch;
  j["micro_batch"] = p.micro_batch;
  j["attention"] = {{"tp", p.attention.tp}, {"sp", p.attention.sp}, {"cp", p.attention.cp}};
  if (p.attention.mla_down_proj != MlaDownProj::kStack)
    j["attention"]["mla_down_proj"] = name_of(p.attention.mla_down_proj);
  j["experts"] = {{"ep", p.experts.ep}, {"etp", p.experts.etp}, {"dispatch", name_of(p.experts.dispatch)}};
  if (p.experts.fused_index_conversion) j["experts"]["fused_index_conversion"] = true;
  if (p.experts.fp8_padding != Fp8Padding::kStack)
    j["experts"]["fp8_padding"] = name_of(p.experts.fp8_padding);
  j["pipeline"] = {
      {"pp", p.pipeline.pp}, {"vpp", p.pipeline.vpp}, {"schedule", name_of(p.pipeline.schedule)}};
  if (!p.pipeline.layers_per_stage.empty()) j["pipeline"]["layers_per_stage"] = p.pipeline.layers_per_stage;
  j["data"] = {{"zero", p.data.zero}};
  if (p.data.fp8_param_gather) j["data"]["fp8_param_gather"] = true;
  j["overlap"] = {{"inter_op", p.overlap.inter_op},
                  {"intra_op", p.overlap.intra_op},
                  {"dp_comm", p.overlap.dp_comm},
                  {"pp_comm", p.overlap.pp_comm}};
  if (p.overlap.cross_micro_batch) j["overlap"]["cross_micro_batch"] = true;
  if (p.overlap.delay_wgrad) j["overlap"]["delay_wgrad"] = true;
  if (p.overlap.tp_comm) j["overlap"]["tp_comm"] = true;
  if (p.overlap.shared_experts) j["overlap"]["shared_experts"] = true;
  j["compression"] = {{"grad_sync", name_of(p.compression.grad_sync)},
                      {"dispatch", name_of(p.compression.dispatch)}};
  j["precision"] = name_of(p.precision);
  j["cross_entropy"] = name_of(p.cross_entropy);
  if (p.precision == Precision::kFp8) j["fp8_recipe"] = name_of(p.fp8_recipe);
  j["recompute"] = recompute_to_json(p);
  j["routing"] = {
      {"distribution", p.routing.distribution},
      {"capacity_factor", p.routing.capacity_factor ? json(*p.routing.capacity_factor) : json(nullptr)},
      {"fused_router", p.routing.fused_router}};
  if (p.routing.pad_to_capacity) j["routing"]["pad_to_capacity"] = true;
  if (p.cuda_graphs != 0) j["cuda_graphs"] = cuda_graph_scope_names(p.cuda_graphs);
  if (p.mtp_layers) j["mtp_layers"] = *p.mtp_layers;
  return j;
}

Result<LoadedPlan> load_plan(const std::string& path) {
  Result<json> j = parse_json_file(path);
  if (!j) return j.error();
  Result<Plan> plan = plan_from_json(j.value(), path);
  if (!plan) return plan.error();
  const std::string base = std::filesystem::path(path).parent_path().string();
  Result<ModelSpec> model = load_model(plan.value().model, base);
  if (!model) return Error{fmt::format("{} (model named by {})", model.error().message, path)};
  if (std::optional<ModelSpec> trained = trained_model(model.value(), plan.value()))
    model.value() = std::move(*trained);
  Result<HardwareProfile> hw = load_hardware(plan.value().hardware, base);
  if (!hw) return Error{fmt::format("{} (hardware named by {})", hw.error().message, path)};
  return LoadedPlan{std::move(plan).value(), std::move(model).value(), std::move(hw).value(), path};
}

}  // namespace moeplan::io
