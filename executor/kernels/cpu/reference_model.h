// ReferenceModel: the whole model of a ModelSpec on one rank, built from the kernels of this directory; the
// reference the parallel executor is compared against (relative error target 1e-5).
// Comparing in fp32: step losses and the first step's gradients agree entry-wise to ~5e-7 across different
// fp32 summation orders; parameters after Adam steps should be compared per tensor in the 2-norm (~2e-6),
// not entry-wise: Adam moves an entry by ~lr * g / (|g| + eps), so entries with |g| ~ 1e-8 turn 1e-10
// rounding differences into ~5e-5 of the tensor's largest entry (fp32 against double shows the same).
//
// Supported: GQA attention with RoPE (rotate half, theta 10000), RMSNorm, SwiGLU dense FFNs and MoE layers
// (softmax router, top-k, renormalised gates by default, Switch aux loss, routed experts, shared experts as
// one dense SwiGLU FFN of width num_shared * shared_ffn), tied or untied embeddings, sliding windows.
// Anything else (MLA, LayerNorm, GELU, biases, qk-norm, sinks, CLA, MTP, shared gates, router biases) is
// refused: unsupported() names it and the constructor throws std::invalid_argument.
//
// Parameters (one flat buffer, in this order; global shapes; init.h gives the init and the shard layouts):
//   embedding [V, h]
//   per layer l: L<l>.attn_norm [1, h], L<l>.qkv [h, (H + 2 KV) D], L<l>.out_proj [H D, h],
//                L<l>.ffn_norm [1, h], then
//     dense:     L<l>.fc13 [h, 2F], L<l>.fc2 [F, h]
//     MoE:       L<l>.router [h, E];
//                L<l>.shared.fc13 [h, 2Fs], L<l>.shared.fc2 [Fs, h] (with shared experts);
//                L<l>.expert<e>.fc13 [h, 2Fe] for e = 0..E-1, then L<l>.expert<e>.fc2 [Fe, h] for all e
//                (so each layer's experts are stacked contiguously, as expert_gemm_* take them)
//   final_norm [1, h], lm_head [h, V] (absent when embeddings are tied: logits = x embedding^T)
// Gradients and Adam moments are flat buffers in the same order.
//
// One step (train_step = zero_grad, forward_backward, optimizer_step):
//   The global batch `sequences` is cut into micro-batches of `micro_batch` sequences, processed in order; a
//   micro-batch is T = micro_batch * seq_len token rows, sequence-major; positions restart at 0 in each
//   sequence (tokens from synthetic_batch with the data seed).
//   Forward per layer:
//     a = rmsnorm(x); qkv = a W_qkv; rope on the q and k columns; attention per sequence; x = x + o W_out;
//     b = rmsnorm(x);
//     dense: x = x + swiglu(b W_13) W_2
//     MoE:   route = router(b W_r); y = shared(b) (or 0); y += unpermute(experts(permute(b))) in
//            permuted-row order; x = x + y; aux_l from the micro-batch's router stats (T tokens)
//   Head: logits = rmsnorm(x) W_lm_head; CE summed over the micro-batch's tokens in order, times
//     1 / (tokens of the global batch).
//   Backward mirrors it. In a MoE layer d(b) = permute_backward(routed) + shared dgrad + router dgrad, in
//     that order; a residual adds the branch gradient last (dx = dx_out + rmsnorm_backward(...)).
//   Loss of the step = (sum over micro-batches of CE_mb) + (sum over micro-batches of aux_mb / n_micro),
//     aux_mb = sum over MoE layers of aux_l; the aux gradient scale is 1 / n_micro
//     (n_micro = global batch / micro_batch).
//   Gradients accumulate over micro-batches in the flat buffer (wgrad +=); then Adam on the whole buffer.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "executor/kernels/cpu/adam.h"
#include "executor/kernels/cpu/init.h"
#include "executor/kernels/cpu/moe.h"
#include "executor/kernels/cpu/norm.h"
#include "executor/kernels/cpu/rope.h"
#include "executor/kernels/cpu/types.h"
#include "simulator/core/model_spec.h"

namespace moeplan::executor::cpu {

struct ReferenceConfig {
  uint64_t param_seed = kDefaultParamSeed;
  uint64_t data_seed = kDefaultDataSeed;
  double rope_theta = kRopeTheta;
  double norm_eps = kRmsNormEps;
  double aux_coef = kAuxLossCoef;
  bool renormalize_gates = true;
  AdamConfig adam;
  // Wire rounding of a compressed dispatch (FP8 rows out, BF16 gradients back), reproduced here so that such
  // plans are compared with the parallel run at fp32 tolerance. Empty: none. Only ReferenceModel<float> calls
  // them. dispatch_fwd rounds the permuted expert inputs of a micro-batch in place ([T k, cols] row-major,
  // offsets[e] = first row of expert e, E + 1 entries); dispatch_bwd rounds their gradients.
  std::function<void(float*rows, int64_t cols, std::span<const int64_t> offsets)> dispatch_fwd, dispatch_bwd;
};

struct ParamInfo {
  std::string name;
  int64_t rows = 0, cols = 0;
  int64_t offset = 0;  // into the flat buffers
  int64_t size() const { return rows * cols; }
};

template <class S>
struct StepLoss {
  S total = 0, ce = 0, aux = 0;  // total = ce + aux (aux already averaged over micro-batches)
};

template <class S>
class ReferenceModel {
 public:
  explicit ReferenceModel(const ModelSpec& spec, const ReferenceConfig& cfg = {});
  // Empty when the reference model can run `spec`, else what it lacks.
  static std::string unsupported(const ModelSpec& spec);

  // zero_grad + forward_backward + optimizer_step; returns the step's loss.
  S train_step(std::span<const int64_t> sequences, int64_t micro_batch, int64_t seq_len);
  // Forward and backward of every micro-batch, gradients accumulated; no optimizer step.
  StepLoss<S> forward_backward(std::span<const int64_t> sequences, int64_t micro_batch, int64_t seq_len);
  // Forward only (gradients untouched).
  StepLoss<S> loss(std::span<const int64_t> sequences, int64_t micro_batch, int64_t seq_len);
  void zero_grad();
  void optimizer_step();  // Adam over all parameters, step count + 1

  const ModelSpec& spec() const { return spec_; }
  const ReferenceConfig& config() const { return cfg_; }
  int64_t steps() const { return steps_; }
  const StepLoss<S>& last_loss() const { return last_; }

  const std::vector<ParamInfo>& params() const { return info_; }
  const ParamInfo& info(std::string_view name) const;  // asserts the name exists
  bool has(std::string_view name) const;
  Eigen::Map<Mat<S>> param(std::string_view name);
  Eigen::Map<const Mat<S>> param(std::string_view name) const;
  Eigen::Map<Mat<S>> grad(std::string_view name);
  Eigen::Map<const Mat<S>> grad(std::string_view name) const;
  std::span<S> flat_params() { return params_; }
  std::span<const S> flat_params() const { return params_; }
  std::span<S> flat_grads() { return grads_; }
  std::span<const S> flat_grads() const { return grads_; }

 private:
  // Indices into info_ of one layer's parameters (npos where absent).
  struct LayerParams {
    bool moe = false;
    size_t attn_norm = 0, qkv = 0, out_proj = 0, ffn_norm = 0;
    size_t fc13 = 0, fc2 = 0;                            // dense
    size_t router = 0, shared_fc13 = 0, shared_fc2 = 0;  // MoE
    size_t expert_fc13 = 0, expert_fc2 = 0;              // expert 0's; the others follow
    bool shared = false;
  };
  struct Batch;

  size_t add(const std::string& name, int64_t rows, int64_t cols);
  // The parameter p (rows * row_mult rows: row_mult consecutive parameters of one shape, stacked).
  Eigen::Map<Mat<S>> map(std::vector<S>& buf, size_t p, int64_t row_mult = 1);
  StepLoss<S> run(std::span<const int64_t> sequences, int64_t micro_batch, int64_t seq_len, bool backward);
  void run_micro_batch(const Batch& b, bool backward, S& ce, S& aux);

  ModelSpec spec_;
  ReferenceConfig cfg_;
  std::vector<ParamInfo> info_;
  std::vector<S> params_, grads_, adam_m_, adam_v_;
  std::vector<LayerParams> layers_;
  size_t embedding_ = 0, final_norm_ = 0, lm_head_ = 0;
  int64_t steps_ = 0;
  StepLoss<S> last_;
};

extern template class ReferenceModel<float>;
extern template class ReferenceModel<double>;

}  // namespace moeplan::executor::cpu
