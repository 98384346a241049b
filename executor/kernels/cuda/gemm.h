// Dense GEMMs of moerun's training step on the GPU through cuBLASLt: the forward, dgrad and wgrad products of
// a linear layer (executor/kernels/cpu/linear.h) in bf16 with fp32 accumulation, and an fp8 (e4m3) product
// with per-tensor fp32 scales. One Gemm object per shape and layout caches cuBLASLt's descriptors and the
// algorithm its heuristic picked, so run() is a single cublasLtMatmul on the caller's stream.
// Host-only header (no kernels, no cuBLAS types), usable from .cpp and .cu files alike.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace moeplan::cuda {

// All matrices are row-major and densely packed (leading dimension = number of columns), as in the CPU
// kernels. A linear layer has W [in, out] and y = x W.
enum class GemmOp {
  kForward,  // C [m, n] = A [m, k] B [k, n]      y = x W:      m = tokens, k = in, n = out
  kDgrad,    // C [m, n] = A [m, k] B [n, k]^T    dx = dy W^T:  m = tokens, k = out, n = in (B = W [in, out])
  kWgrad,    // C [m, n] = A [k, m]^T B [k, n]    dW = x^T dy:  m = in, n = out, k = tokens
};

enum class GemmType { kBf16, kF32, kE4m3 };

struct GemmProblem {
  GemmOp op = GemmOp::kForward;
  int64_t m = 0, n = 0, k = 0;
  GemmType input = GemmType::kBf16;   // A and B: kBf16 or kE4m3
  GemmType output = GemmType::kBf16;  // C: kBf16 or kF32
  bool accumulate = false;            // C += product (beta = 1) instead of C = product; wgrad's dW += x^T dy
};

// Device pointers for one run. Pointers must be 256-byte aligned (cuBLASLt's heuristic assumes so by default;
// cudaMalloc returns that). For fp8, a_scale and b_scale point to one fp32 each in device memory and the
// product is a_scale * b_scale * (A B): the dequantisation factors of the two e4m3 tensors.
struct GemmOperands {
  const void* a = nullptr;
  const void* b = nullptr;
  void* c = nullptr;
  const float* a_scale = nullptr;
  const float* b_scale = nullptr;
};

// Lifecycle (CUTLASS's): construct (builds the descriptors and queries the heuristic; needs a device),
// can_implement(), workspace_size(), then run() any number of times. Not thread-safe: run() sets the fp8
// scale pointers on the shared descriptor.
//
// FP8 follows the one layout Hopper's fp8 tensor-core GEMMs take (cuBLAS docs, cublasLtMatmul, "FP8" notes:
// on compute capability 9.x only the "TN" format, both operands K-contiguous): op kDgrad, i.e.
// C [m, n] = A [m, k] B [n, k]^T with bf16 output, or fp32 (optionally accumulated: a weight gradient
// C [in, out] = X^T [in, tokens] (dY^T [out, tokens])^T into its FP32 main gradient). A forward pass in
// fp8 therefore passes W^T [out, in], which is how fp8 training recipes store the quantised weight anyway,
// and a weight gradient the transposed copies of its input and gradient that the recipe's cast writes. m, n,
// k must be multiples of 16 (16-byte rows). Block scales (CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F /
// BLK128x128_32F, present in cuBLASLt 13.1's header) are not used: per-tensor scales only.
class Gemm {
 public:
  explicit Gemm(const GemmProblem& problem);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;
  Gemm(Gemm&&) noexcept;
  Gemm& operator=(Gemm&&) noexcept;

  // Empty when run() may be called; otherwise why not (shape or type rules, or no cuBLASLt algorithm).
  const std::string& can_implement() const;
  // Bytes of device workspace run() needs (the chosen algorithm's, or for fp8 the whole 32 MiB that cuBLAS
  // advises for Hopper).
  size_t workspace_size() const;
  const GemmProblem& problem() const;

  // Enqueues C = A B (or C += A B) on `stream`; no host synchronisation. Aborts if can_implement() is not
  // empty.
  void run(const GemmOperands& ops, void* workspace, cudaStream_t stream) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Shape and type rules alone (no device needed); Gemm's can_implement() adds cuBLASLt's own verdict.
std::string gemm_shape_rules(const GemmProblem& problem);

// 2 m n k: the floating-point operations of one run.
inline double gemm_flops(const GemmProblem& p) {
  return 2.0 * static_cast<double>(p.m) * static_cast<double>(p.n) * static_cast<double>(p.k);
}

}  // namespace moeplan::cuda
