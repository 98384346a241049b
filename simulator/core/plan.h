// Plan: one parallel layout, overlap, compression and recompute choice for one job (GPUs, sequence, batch),
// in the plan-file form of DESIGN.md ("Contracts"). validate() lists every rule the plan breaks for a model.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "simulator/core/hardware.h"
#include "simulator/core/model_spec.h"
#include "simulator/core/stack.h"

namespace moeplan {

enum class Dispatch { kAllToAll, kAllGather, kDedup };
// Pipeline schedules: Megatron's 1F1B and interleaved 1F1B, and DeepSeek's DualPipeV (two virtual stages per
// rank in a V: rank r holds stages r and 2 pp - 1 - r; forward and backward chunks of different micro-batches
// overlapped; backward split into input and weight gradients to fill bubbles).
enum class Schedule { k1F1B, kInterleaved1F1B, kDualPipeV };
// Gradient synchronisation: Megatron's reduce-scatter of FP32 main grads, the same in BF16
// (--grad-reduce-in-bf16), or MegaScale-MoE's BF16 all-to-all + local FP32 reduce.
enum class GradSync { kFp32ReduceScatter, kBf16AllToAll, kBf16ReduceScatter };
enum class DispatchPrecision { kBf16, kFp8 };
enum class Precision { kBf16, kFp8 };
// FP8 scaling recipes (Megatron --fp8-recipe): delayed (per tensor, amax history), tensorwise (per-tensor
// current scaling), blockwise (1x128 activations, 128x128 weights, as DeepSeek-V3), mxfp8 (Blackwell only).
enum class Fp8Recipe { kDelayed, kTensorwise, kBlockwise, kMxfp8 };
// Activation recompute: Megatron's selective (the modules of `recompute_modules`) and full (whole layers,
// `recompute_method` and `recompute_num_layers`), or MegaScale-MoE's selective activation rematerialization.
enum class Recompute { kNone, kSelective, kFull, kSar };
// The language-model loss as Megatron-Core runs it: TE's fused Triton kernels (--cross-entropy-loss-fusion
// --cross-entropy-fusion-impl te), Megatron's jit-fused PyTorch functions (impl native), or the unfused
// vocab_parallel_cross_entropy (Megatron's default).
enum class CrossEntropy { kTe, kNative, kUnfused };
// How MLA's down projections run under tensor parallelism. kStack: as the stack builds them (the first of its
// capabilities.mla_down_proj). Megatron-Core since 0.14 (multi_latent_attention.py, 720c8b40d8): TE linears
// duplicated over TP on the rank's sequence shard, the up projections gather the latents (kDuplicated);
// before 0.14 (gpt_layer_specs.py at 7094270): TE column-parallel linears, each gathering the hidden state,
// their outputs gathered over TP and scattered back to the sequence shard before the up projections gather
// them again (kColumnParallel); moerun and MegaScale-MoE gather the hidden state once and project the
// gathered rows at full width (kGathered).
enum class MlaDownProj { kStack, kDuplicated, kColumnParallel, kGathered };
// Where an FP8 plan pads each expert's rows to the FP8 GEMMs' alignment (16 rows; 32 under MX scaling).
// kStack: as the stack does it (the first of its capabilities.fp8_padding). kExperts: Megatron-Core's
// TEGroupedMLP pads the permuted rows and probs with TE's Fp8Padding and unpads the output with Fp8Unpadding
// (experts.py, taken under FP8 unless the router or the dispatcher padded: moe_utils.py
// skip_routed_expert_padding at d98e8a64): a copy of the rows on each side, forward and backward.
// kDispatcher: the dispatcher pads each local expert's rows: HybridEP inside its dispatch (pad_multiple,
// token_dispatcher.py at 2edffadb), DeepEP in the fused permute of the received rows (align_size, TE 2.12+'s
// fused_permute_and_pad_with_probs, token_dispatcher.py:1446-1454 at d98e8a64). kRouter:
// --moe-router-padding-for-quantization (--moe-router-padding-for-fp8 before 0.16) routes extra
// zero-probability tokens so each expert's count is a multiple: the alltoall dispatcher pads each source
// rank's routing map before the exchange (moe_utils.py pad_routing_map), so the padded rows cross the network
// and run through the experts; DeepEP pads the received map (token_dispatcher.py _pad_routing_map at
// core_v0.14.0). kNone: the grouped GEMMs take any row count (moerun's CUTLASS grouped GEMM, BF16 stacks).
enum class Fp8Padding { kStack, kNone, kExperts, kDispatcher, kRouter };
enum class RecomputeMethod { kUniform, kBlock };
// Megatron --recompute-modules, as bit flags.
enum RecomputeModule : uint16_t {
  kRecomputeCoreAttn = 1u << 0,       // core attention re-run from q, k, v
  kRecomputeMoeAct = 1u << 1,         // the expert activation between FC1 and FC2
  kRecomputeLayernorm = 1u << 2,      // norms that are separate modules (pre-MLP; attention's under MLA)
  kRecomputeMlaUpProj = 1u << 3,      // MLA q/kv up-projections and RoPE
  kRecomputeMlp = 1u << 4,            // the dense MLP of dense layers
  kRecomputeMoe = 1u << 5,            // the whole MoE layer, dispatch and combine included
  kRecomputeSharedExperts = 1u << 6,  // the shared-expert MLP
};
inline constexpr uint16_t kAllRecomputeModules = 0x7f;

// Parts of every layer Megatron-Core captures as CUDA graphs with Transformer Engine's
// make_graphed_callables (--cuda-graph-impl transformer_engine --cuda-graph-scope ...), one graph per layer
// and micro-batch each way: a replay issues the part's kernels in one launch, after copying its inputs into
// the graph's static buffers (TE pytorch/graph.py Graphed.forward / backward). What each scope covers is
// TransformerLayer._get_submodules_under_cudagraphs and _te_cuda_graph_capture (transformer_layer.py at
// core_v0.16.0).
enum CudaGraphScope : uint8_t {
  kGraphLayer = 1u << 0,          // the whole layer (Megatron's empty scope list, formerly "full")
  kGraphAttn = 1u << 1,           // the input norm and attention, to its residual add
  kGraphMlp = 1u << 2,            // the MLP of dense layers
  kGraphMoe = 1u << 3,            // the whole MoE, dispatch included (drop-and-pad only)
  kGraphMoeRouter = 1u << 4,      // the pre-MLP norm, the router, the shared experts unless overlapped
  kGraphMoePreprocess = 1u << 5,  // the dispatcher's preprocess (all-to-all: counts and the local permute)
  kGraphMamba = 1u << 6,          // Mamba mixers
};
inline constexpr uint8_t kAllCudaGraphScopes = 0x7f;

// The largest global batch, in sequences, that plans and jobs may ask for: 2^20, about 70x the largest
// published MoE batch (DeepSeek-V3's 15,360 sequences of 4,096 tokens). Beyond it the number is almost
// certainly tokens typed where sequences are expected, and the step would hold millions of micro-batches.
inline constexpr int64_t kMaxGlobalBatch = int64_t{1} << 20;
// The one-line reason for refusing a larger one.
inline constexpr const char* kGlobalBatchTooLarge =
    "at most 1048576 sequences per step (the global batch counts sequences of seq_len tokens, not tokens: "
    "did "
    "you mean tokens?)";

struct Plan {
  // Paths as written in the plan file (relative to it) or built-in names.
  std::string model;
  std::string hardware;
  std::string stack;  // empty: moerun's own stack

  int64_t gpus = 0;
  int64_t seq_len = 0;
  int64_t global_batch = 0;  // sequences per step
  int64_t micro_batch = 1;   // sequences per micro-batch

  struct Attention {
    int64_t tp = 1;  // Megatron tensor parallelism with sequence parallelism
    int64_t sp = 1;  // Ulysses sequence parallelism (all-to-all over heads)
    int64_t cp = 1;  // context parallelism (ring / all-gather of K/V)
    MlaDownProj mla_down_proj = MlaDownProj::kStack;
    bool operator==(const Attention&) const = default;
  } attention;

  struct Experts {
    int64_t ep = 1;
    int64_t etp = 1;
    Dispatch dispatch = Dispatch::kAllToAll;
    // DeepEP's received token indices turned into the per-expert map by one fused kernel each way (Megatron's
    // fused_indices_to_multihot, taken under --enable-experimental with --moe-permute-fusion); off, the eager
    // conversion runs, with the host waits and kernels its stack states (dispatcher.permute_host_waits).
    bool fused_index_conversion = false;
    Fp8Padding fp8_padding = Fp8Padding::kStack;
    bool operator==(const Experts&) const = default;
  } experts;

  struct Pipeline {
    int64_t pp = 1;
    int64_t vpp = 1;
    Schedule schedule = Schedule::k1F1B;
    std::vector<int64_t> layers_per_stage;  // per virtual stage; empty = as even as possible
    bool operator==(const Pipeline&) const = default;
  } pipeline;

  struct Data {
    int64_t zero = 1;  // 0..3 (1 = distributed optimizer)
    // FP8 plans: the GEMM weights are FP8 tensors in a uint8 parameter buffer, all-gathered in FP8, and the
    // optimizer casts its FP32 master shard to FP8 (Megatron --fp8-param-gather, TE's FP8 model init): no
    // BF16 copy and no FP8 weight cache beside it, half the parameter all-gather's bytes, and the weight's
    // transpose made after each gather (TE post_all_gather_processing) instead of the step's weight casts.
    bool fp8_param_gather = false;
    bool operator==(const Data&) const = default;
  } data;

  struct Overlap {
    bool inter_op = false;
    bool intra_op = false;
    bool dp_comm = false;
    bool pp_comm = false;
    // The forward of one micro-batch and the backward of another run interleaved layer by layer, so each
    // one's expert-parallel communication hides behind the other's compute (Megatron
    // --overlap-moe-expert-parallel-comm: combined 1F1B).
    bool cross_micro_batch = false;
    // With cross_micro_batch: the experts' and attention's weight gradients run after the node that computes
    // their input gradients has signalled the next node (Megatron --delay-wgrad-compute), so the backward
    // dispatch starts before the experts' weight gradients and the next layer's combine before attention's.
    bool delay_wgrad = false;
    // Tensor-parallel exchanges pipelined with the GEMMs beside them by Transformer Engine's userbuffers
    // (Megatron --tp-comm-overlap): the column-parallel linears' all-gather as a ring exchange of chunks
    // feeding the GEMM chunk by chunk, the row-parallel linears' reduce-scatter after each of the GEMM's row
    // chunks, the backward's exchanges beside the data- and weight-gradient GEMMs.
    bool tp_comm = false;
    // The shared experts on their own stream beside the dispatch (Megatron --moe-shared-expert-overlap):
    // their TP gather, FC1 and activation beside the dispatch all-to-all, FC2 and TP reduce-scatter beside
    // the combine, without userbuffers (shared_experts.py). inter_op puts them there too, with every other
    // exchange.
    bool shared_experts = false;
    bool operator==(const Overlap&) const = default;
  } overlap;

  struct Compression {
    GradSync grad_sync = GradSync::kFp32ReduceScatter;
    DispatchPrecision dispatch = DispatchPrecision::kBf16;
    bool operator==(const Compression&) const = default;
  } compression;

  Precision precision = Precision::kBf16;
  Fp8Recipe fp8_recipe = Fp8Recipe::kTensorwise;  // when precision is fp8
  Recompute recompute = Recompute::kNone;
  CrossEntropy cross_entropy = CrossEntropy::kTe;
  uint16_t recompute_modules = kRecomputeCoreAttn;               // selective: Megatron's default module set
  RecomputeMethod recompute_method = RecomputeMethod::kUniform;  // full
  int64_t recompute_num_layers = 1;                              // full: layers per checkpoint (uniform) or
                                                                 // recomputed layers per chunk (block)

  // The CudaGraphScope bits the plan captures (0: no CUDA graphs).
  uint8_t cuda_graphs = 0;

  // Multi-token prediction layers the run trains (Megatron --mtp-num-layers), where they differ from the
  // model config's (num_nextn_predict_layers; Qwen3-Next ships MTP weights its config does not count): a
  // training choice, applied to the model as the plan file is loaded (io::load_plan).
  std::optional<int64_t> mtp_layers;

  struct Routing {
    std::string distribution = "uniform";  // "uniform", "zipf:<s>", or a router-trace file
    std::optional<double> capacity_factor;
    // The router's scores, top-k and aux-loss scores as fused kernels (Megatron's --moe-router-fusion, TE's
    // fused_topk_with_score_function); off, Megatron runs them as eager PyTorch ops (TC:944, default off).
    bool fused_router = true;
    // With a capacity factor: every source rank sends each expert exactly its capacity of rows, the dropped
    // ones replaced by padding (Megatron --moe-pad-expert-input-to-capacity): equal splits known on the host,
    // so the alltoall dispatcher exchanges no counts and the host never waits for them.
    bool pad_to_capacity = false;
    bool operator==(const Routing&) const = default;
  } routing;

  // Derived sizes.
  int64_t attention_mesh() const { return attention.tp * attention.sp * attention.cp; }
  int64_t expert_mesh() const { return experts.ep * experts.etp; }
  int64_t gpus_per_stage() const { return gpus / pipeline.pp; }
  int64_t dp() const { return gpus_per_stage() / attention_mesh(); }      // attention data parallelism
  int64_t expert_dp() const { return gpus_per_stage() / expert_mesh(); }  // expert data parallelism
  int64_t num_micro_batches() const { return global_batch / (micro_batch * dp()); }

  bool operator==(const Plan&) const = default;  // every field
};

struct Violation {
  std::string rule;    // short id, e.g. "heads_divisible"
  std::string reason;  // one sentence with the numbers
};

// Every rule the plan breaks for this model on this hardware; empty when the plan is legal. Memory fit is not
// a rule here: it is the cost model's verdict.
// Without reasons, each violation names its rule only (the planner counts rules over millions of plans).
std::vector<Violation> validate(const Plan& plan, const ModelSpec& model, const HardwareProfile& hw,
                                bool reasons = true);
// The rule of validate()'s first violation, or nullptr when the plan is legal, without building the list
// (the search's test of millions of plans).
const char* first_broken_rule(const Plan& plan, const ModelSpec& model, const HardwareProfile& hw);

// What the rules read of a model that takes a pass over its layers (its mixers, whether it is an
// encoder-decoder), found once: first_broken_rule for many plans of one model and hardware.
class RuleChecker {
 public:
  RuleChecker(const ModelSpec& model, const HardwareProfile& hw);
  const char* first_broken_rule(const Plan& plan) const;

  struct Facts {
    bool delta_net = false, mamba = false, encoder_decoder = false, dense_ffn = false;
  };

 private:
  const ModelSpec& model_;
  const HardwareProfile& hw_;
  Facts facts_;
};

// What the rules read of a model (RuleChecker's facts), found in one pass over its layers.
RuleChecker::Facts rule_facts(const ModelSpec& model);

// The model as the plan trains it: with the plan's mtp_layers where it names a count other than the model
// config's; nullopt where the model stands as it is.
std::optional<ModelSpec> trained_model(const ModelSpec& model, const Plan& plan);

// Every plan feature the stack cannot run (its capabilities): dispatch, recompute granularity and modules,
// schedule, precision and FP8 recipe, gradient synchronisation, dispatch precision, MLA's down-projection
// layout and where FP8 pads the experts' rows, where the plan names them. Overlaps are not here.
std::vector<Violation> validate_for_stack(const Plan& plan, const StackProfile& stack, bool reasons = true);

// How MLA's down projections run: the plan's layout where it names one, else the stack's own (the first of
// its capabilities.mla_down_proj; kGathered where it lists none).
MlaDownProj mla_down_proj_of(const Plan& plan, const StackProfile& stack);
MlaDownProj stack_mla_down_proj(const StackProfile& stack);
// The same with the stack's own layout given.
MlaDownProj mla_down_proj_of(const Plan& plan, MlaDownProj stack_own);

// Where an FP8 plan's expert rows are padded to the FP8 GEMMs' alignment: the plan's choice where it names
// one, else the stack's own (the first of its capabilities.fp8_padding); kNone for a plan not in FP8.
Fp8Padding fp8_padding_of(const Plan& plan, const StackProfile& stack);
Fp8Padding fp8_padding_of(const Plan& plan, Fp8Padding stack_own);
Fp8Padding stack_fp8_padding(const StackProfile& stack);
// The padding a stack's capabilities.fp8_padding entry names ("experts", ...); kStack for any other word.
Fp8Padding fp8_padding_named(const std::string& name);
// Rows an expert's FP8 alignment adds on average to a count drawn with mean `mean` (Poisson: each of many
// tokens picks the expert independently, as balanced routing does): E[(-c) mod align]. (align - 1) / 2 once
// the mean reaches align^2; more for means of a few rows (a count of 1 pads align - 1), toward 0 for means
// well below 1 (most counts are 0 and pad nothing).
double expected_alignment_pad(double mean, int align);
// The rows `rows` spread evenly over `groups` counts (experts, or an expert's sources) gain by each count's
// alignment: groups x expected_alignment_pad(rows / groups, align); 0 without groups.
double alignment_pad_rows(double rows, double groups, int align);
// Under routing.pad_to_capacity: the rows a rank's experts receive from `tokens` routed tokens per source
// rank (top-k each), E x the capacity ceil(tokens k / E x capacity_factor) (Megatron get_capacity, one
// capacity per expert and source); over tokens x k, the factor the expert rows scale by (1 for a capacity
// factor of 1 where E divides tokens x k).
double capacity_padded_rows_factor(const Plan& plan, double tokens, int64_t top_k, int64_t experts);

// The FP8 row alignment of the plan's recipe (Megatron get_fp8_align_size: 32 under MX scaling, else 16).
int fp8_row_alignment(const Plan& plan);

// The plan as the stack runs it: each overlap the plan asks for and the stack does not achieve is switched
// off (it gets no credit), with one notice per overlap saying so.
Plan with_stack_overlaps(const Plan& plan, const StackProfile& stack, std::vector<std::string>* notices);
// Whether the stack overlaps pipeline sends with compute in a pipeline of `pp` stages and `vpp` virtual
// stages per rank: never without a pipeline, and only with a virtual pipeline where the stack says so
// (overlaps.pp_comm_needs_vpp).
bool stack_overlaps_pipeline_sends(const StackProfile& stack, int64_t pp, int64_t vpp);

// Layers per virtual stage when they do not divide evenly: the first and last chunks (which also hold the
// embedding and the output layer + loss) take the smaller shares.
std::vector<int64_t> uneven_split(int64_t layers, int64_t chunks);

// Bytes per element of the main gradient buffer the weight gradients accumulate in and the gradient
// synchronisation reduces: fp32 unless gradients are reduced in BF16 (--grad-reduce-in-bf16); MegaScale-MoE's
// BF16 all-to-all stages its copy in half of the fp32 buffer, so it keeps 4 B.
double main_grad_bytes(const Plan& plan);
// Whether the plan's GEMM weights are FP8 parameters (an FP8 plan with data.fp8_param_gather): what the
// lowering's gathers and casts and the memory model read.
bool fp8_params(const Plan& plan);

// The dense peak MFU is measured against: the precision the plan computes in ("fp8" for FP8 plans when the
// hardware profile has an FP8 peak), else "bf16".
const char* mfu_peak_dtype(const Plan& plan, const HardwareProfile& hw);

// Names used in plan files and reports.
const char* name_of(Dispatch d);
const char* name_of(Schedule s);
const char* name_of(GradSync g);
const char* name_of(DispatchPrecision d);
const char* name_of(Precision p);
const char* name_of(Recompute r);
const char* name_of(CrossEntropy c);
const char* name_of(MlaDownProj m);  // "stack", "duplicated", "column_parallel", "gathered"
const char* name_of(Fp8Padding f);   // "stack", "none", "experts", "dispatcher", "router"
const char* name_of(RecomputeMethod m);
const char* name_of(Fp8Recipe r);
// Megatron's module names, in flag order ("core_attn", "moe_act", ...).
const char* name_of(RecomputeModule m);
std::vector<std::string> recompute_module_names(uint16_t modules);
// Megatron's scope names ("attn", "moe_router", ...; "layer" for the whole layer), in flag order.
const char* name_of(CudaGraphScope s);
std::vector<std::string> cuda_graph_scope_names(uint8_t scopes);

// The virtual stage a (chunk, stage) pair runs: chunk * stages + stage, or under DualPipeV's V the stage on
// the way down (chunk 0) and 2 stages - 1 - stage on the way back (chunk 1).
inline int64_t virtual_stage(int64_t chunk, int64_t stage, int64_t stages, Schedule schedule) {
  if (schedule == Schedule::kDualPipeV) return chunk == 0 ? stage : 2 * stages - 1 - stage;
  return chunk * stages + stage;
}
// The pipeline stage (rank) that runs virtual stage v; the inverse of virtual_stage.
// Inline: the search's screen asks it about a hundred times per plan.
inline int64_t stage_of_virtual(int64_t v, int64_t stages, Schedule schedule) {
  if (schedule == Schedule::kDualPipeV) return v < stages ? v : 2 * stages - 1 - v;
  return v % stages;
}

}  // namespace moeplan
