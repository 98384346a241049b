// The experts' GEMMs (ops expert_fc13, expert_fc2 and their backward) as one grouped GEMM per op: CUTLASS's
// SM90 (TMA + wgmma, warp-specialised cooperative) grouped kernel, fed per-expert shapes that a small device
// kernel derives from the per-expert token counts in device memory, so a layer never waits on the host.
// Host-only header (no kernels, no CUTLASS types), usable from .cpp and .cu files alike.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace moeplan::cuda {

// Layouts follow the CPU kernels (executor/kernels/cpu/moe.h, expert_gemm_*), all row-major and packed:
//   rows       = expert-sorted token rows: expert e owns rows [o_e, o_e + m_e), o_e = m_0 + ... + m_{e-1}
//   x  [rows, in]   bf16, dy [rows, out] bf16
//   w  [E, in, out] bf16: expert e's weight W_e [in, out] (y = x W_e) at w + e in out
//   dw [E, in, out] fp32: the gradient, accumulated (dW_e += x_e^T dy_e), as the fp32 main-grad buffer of
//                          mixed-precision training expects
enum class ExpertGemmOp {
  kForward,  // y  [rows, out] bf16  = x_e  W_e    per expert  (A = x,  B = w,  D = y)
  kDgrad,    // dx [rows, in]  bf16  = dy_e W_e^T  per expert  (A = dy, B = w,  D = dx)
  kWgrad,  // dw [E, in, out] fp32 += x_e^T dy_e per expert  (A = x,  B = dy, D = dw); reduction over m_e rows
};

struct GroupedGemmProblem {
  ExpertGemmOp op = ExpertGemmOp::kForward;
  int num_experts = 0;
  int64_t in = 0, out = 0;  // an expert's weight is [in, out]
  // FP8 (kForward and kDgrad only; in and out multiples of 16): a and b are e4m3 (__nv_fp8_e4m3), d bf16,
  // unscaled (a scale of 1: the caller's quantiser scales the values). Hopper's FP8 tensor cores read both
  // operands K-major, so kForward's b is each expert's weight transposed, wt [E, out, in] (Wt_e at
  // b + e in out), as Transformer Engine keeps a transposed FP8 copy of each weight; kDgrad's b is w as in
  // bf16.
  bool fp8 = false;
};

// Device pointers for one run; `counts` [E] int32 holds m_e (>= 0). a, b, d per the op above (d is
// __nv_bfloat16* for kForward / kDgrad, float* for kWgrad). `rows` is the capacity of the row buffers: the
// counts must sum to at most `rows` (checked on the device; a violation traps, as it is a bug upstream).
// Rows past the sum of the counts are neither read nor written.
struct GroupedGemmOperands {
  const int32_t* counts = nullptr;
  const void* a = nullptr;
  const void* b = nullptr;
  void* d = nullptr;
  int64_t rows = 0;
};

// Lifecycle (CUTLASS's): construct, can_implement(), workspace_size(), initialize(workspace) once (builds the
// TMA descriptors' templates on the host; no device synchronisation), then run() any number of times with any
// operands of the same problem. Each run launches the setup kernel (exclusive scan of the counts into
// per-expert shapes, pointers and strides, written to the workspace) and then the grouped GEMM on the same
// stream. Experts with m_e = 0 get an empty problem: nothing written for kForward / kDgrad (they own no rows)
// and dW_e left as it is for kWgrad.
class GroupedGemm {
 public:
  explicit GroupedGemm(const GroupedGemmProblem& problem);
  ~GroupedGemm();
  GroupedGemm(const GroupedGemm&) = delete;
  GroupedGemm& operator=(const GroupedGemm&) = delete;

  // Empty when the kernel can run here; otherwise why not: shape rules (in, out multiples of 8 for 16-byte
  // TMA rows; 1 <= E <= 1024), no device, a device other than sm_90, or a build without sm_90a code.
  std::string can_implement() const;
  size_t workspace_size() const;
  // Prepares the kernel on `workspace` (workspace_size() bytes, 256-byte aligned, owned by the caller and
  // kept for every later run). May enqueue work on `stream`.
  void initialize(void* workspace, cudaStream_t stream);
  void run(const GroupedGemmOperands& ops, cudaStream_t stream);

  const GroupedGemmProblem& problem() const { return problem_; }

  struct Impl;  // the CUTLASS kernel for the op; defined in grouped_gemm.cu

 private:
  GroupedGemmProblem problem_;
  std::unique_ptr<Impl> impl_;
};

// Floating-point operations of one run for given counts: 2 in out sum(m_e).
inline double grouped_gemm_flops(const GroupedGemmProblem& p, int64_t total_rows) {
  return 2.0 * static_cast<double>(p.in) * static_cast<double>(p.out) * static_cast<double>(total_rows);
}

}  // namespace moeplan::cuda
