// moerun's CPU kernels (fp32 Eigen, also instantiated in double for the gradient checks), one header per
// family. Each op of the op graph (simulator/core/op_names.def) binds to these kernels:
//
//   embedding: embedding_forward / embedding_backward
//   attn_norm, ffn_norm, final_norm: rmsnorm_forward / rmsnorm_backward
//   qkv_proj, q_proj, kv_proj, out_proj, fc13, fc2, shared_fc13, shared_fc2, the router's GEMM, lm_head:
//     linear_forward / linear_dgrad (the ".dgrad" op), linear_wgrad (the ".wgrad" op)
//   rope: rope_forward / rope_backward
//   attn_core, attn_core_local: attn_core_forward (+ attn_merge) / attn_core_backward
//   act, shared_act, expert_act: swiglu_forward / swiglu_backward
//   router (softmax, top-k, aux loss): router_forward, router_local_stats, aux_loss /
//     aux_loss_dprobs, router_backward
//   permute, scatter: make_permute_index, permute_forward / permute_backward
//   expert_fc13, expert_fc2: expert_gemm_forward / expert_gemm_dgrad, expert_gemm_wgrad
//   unpermute (+ combine): unpermute_forward / unpermute_backward
//   loss: loss_local_max, loss_local_stats, loss_forward / loss_backward
//   optimizer: adam_step
//
// Reductions the executor runs between kernels (the kernels only ever see local data):
//   row-sharded GEMM outputs (out_proj, fc2, shared_fc2, expert_fc2 under TP / ETP) and column-sharded GEMM
//     dgrads (qkv_proj, fc13, ..., lm_head): sum over the tensor-parallel group;
//   embedding outputs: sum over the vocabulary shards;
//   CE: max, then sum of (sum_exp, target_logit) over the vocabulary shards;
//   router stats: sum over the ranks that split a micro-batch's tokens (then aux_loss with the global T);
//   attention dk, dv under CP: reduce-scatter to the owners of the keys; with replicated kv heads, sum;
//   weight gradients of replicated weights (norm gains, router, attention under SP/CP/DP, ...): sum over the
//     replicas, as for any data-parallel gradient.
#pragma once

#include "executor/kernels/cpu/adam.h"
#include "executor/kernels/cpu/attention.h"
#include "executor/kernels/cpu/init.h"
#include "executor/kernels/cpu/linear.h"
#include "executor/kernels/cpu/moe.h"
#include "executor/kernels/cpu/norm.h"
#include "executor/kernels/cpu/rope.h"
#include "executor/kernels/cpu/swiglu.h"
#include "executor/kernels/cpu/types.h"
#include "executor/kernels/cpu/vocab.h"
