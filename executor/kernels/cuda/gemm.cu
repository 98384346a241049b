// cuBLASLt behind moerun's Gemm (gemm.h): descriptors and the heuristic's algorithm built once per shape,
// row-major operands mapped onto cuBLASLt's column-major convention.
#include "executor/kernels/cuda/gemm.h"

#include <cublasLt.h>
#include <cublas_api.h>

#include <cstdio>
#include <cstdlib>
#include <utility>

#include "executor/kernels/cuda/check.h"

namespace moeplan::cuda {
namespace {

[[noreturn]] void cublas_fail(const char* call, cublasStatus_t st, const char* file, int line) {
  std::fprintf(stderr, "moerun: cuBLAS error at %s:%d: %s: %s (%s)\n", file, line, call,
               cublasGetStatusName(st), cublasGetStatusString(st));
  std::abort();
}

#define MOERUN_CUBLAS_CHECK(call)                                                                \
  do {                                                                                           \
    const cublasStatus_t moerun_st_ = (call);                                                    \
    if (moerun_st_ != CUBLAS_STATUS_SUCCESS) cublas_fail(#call, moerun_st_, __FILE__, __LINE__); \
  } while (0)

// cuBLAS's advice for Hopper: 32 MiB of workspace (cuBLAS docs, cublasSetWorkspace, "recommended sizes").
constexpr size_t kMaxWorkspaceBytes = size_t{32} << 20;

// One handle for the process. Never destroyed: at exit the CUDA runtime may already be torn down.
cublasLtHandle_t lt_handle() {
  static cublasLtHandle_t handle = [] {
    cublasLtHandle_t h = nullptr;
    MOERUN_CUBLAS_CHECK(cublasLtCreate(&h));
    return h;
  }();
  return handle;
}

cudaDataType_t to_cuda(GemmType t) {
  switch (t) {
    case GemmType::kBf16:
      return CUDA_R_16BF;
    case GemmType::kF32:
      return CUDA_R_32F;
    case GemmType::kE4m3:
      return CUDA_R_8F_E4M3;
  }
  std::abort();
}

}  // namespace

std::string gemm_shape_rules(const GemmProblem& p) {
  if (p.m <= 0 || p.n <= 0 || p.k <= 0) return "m, n and k must be positive";
  if (p.input != GemmType::kBf16 && p.input != GemmType::kE4m3) return "inputs must be bf16 or e4m3";
  if (p.output != GemmType::kBf16 && p.output != GemmType::kF32) return "output must be bf16 or fp32";
  if (p.input == GemmType::kE4m3) {
    if (p.op != GemmOp::kDgrad)
      return "fp8 on Hopper takes only C = A B^T with both operands K-contiguous (op kDgrad; pass W^T)";
    // bf16, or fp32 (C and D both): the weight gradient accumulated into its FP32 main gradient, as
    // Transformer Engine's FP8 wgrad GEMM writes it (cuBLAS docs, cublasLtMatmul, FP8 type table).
    if (p.output != GemmType::kBf16 && p.output != GemmType::kF32) return "fp8 GEMMs write bf16 or fp32";
    if (p.m % 16 != 0 || p.n % 16 != 0 || p.k % 16 != 0) return "fp8 needs m, n, k multiples of 16";
  }
  return {};
}

struct Gemm::Impl {
  GemmProblem problem;
  std::string why_not;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;  // cuBLASLt's A, B, C (see the constructor)
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;

  ~Impl() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

// Row-major C [m, n] is column-major C^T [n, m], so cuBLASLt computes C^T = op(B)^T op(A)^T: its A operand is
// our B and its B operand is our A. A row-major matrix [r, c] is a column-major [c, r] with ld = c:
//   our B, not transposed (kForward, kWgrad): stored [k, n] = col-major [n, k], used as is (N), ld n.
//   our B, transposed (kDgrad): stored [n, k] = col-major [k, n], used transposed (T), ld k.
//   our A, not transposed (kForward, kDgrad): stored [m, k] = col-major [k, m], used as is (N), ld k.
//   our A, transposed (kWgrad): stored [k, m] = col-major [m, k], used transposed (T), ld m.
//   C: col-major [n, m], ld n.
Gemm::Gemm(const GemmProblem& problem) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.problem = problem;
  s.why_not = gemm_shape_rules(problem);
  if (!s.why_not.empty()) return;

  const bool trans_a = problem.op == GemmOp::kWgrad;
  const bool trans_b = problem.op == GemmOp::kDgrad;
  const auto m = static_cast<uint64_t>(problem.m), n = static_cast<uint64_t>(problem.n),
             k = static_cast<uint64_t>(problem.k);
  const cudaDataType_t in = to_cuda(problem.input), out = to_cuda(problem.output);

  MOERUN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&s.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_lt_a = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_lt_b = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  MOERUN_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_lt_a, sizeof(op_lt_a)));
  MOERUN_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_lt_b, sizeof(op_lt_b)));

  MOERUN_CUBLAS_CHECK(trans_b ? cublasLtMatrixLayoutCreate(&s.a, in, k, n, static_cast<int64_t>(k))
                              : cublasLtMatrixLayoutCreate(&s.a, in, n, k, static_cast<int64_t>(n)));
  MOERUN_CUBLAS_CHECK(trans_a ? cublasLtMatrixLayoutCreate(&s.b, in, m, k, static_cast<int64_t>(m))
                              : cublasLtMatrixLayoutCreate(&s.b, in, k, m, static_cast<int64_t>(k)));
  MOERUN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&s.c, out, n, m, static_cast<int64_t>(n)));

  cublasLtMatmulPreference_t pref = nullptr;
  MOERUN_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  MOERUN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                           &kMaxWorkspaceBytes, sizeof(kMaxWorkspaceBytes)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(lt_handle(), s.desc, s.a, s.b, s.c, s.c, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED || (st == CUBLAS_STATUS_SUCCESS && found == 0)) {
    s.why_not = "cuBLASLt has no algorithm for this problem on this device";
    return;
  }
  MOERUN_CUBLAS_CHECK(st);
  s.algo = result.algo;
  // fp8 gets the whole 32 MiB, as NVIDIA's LtFp8Matmul sample, Transformer Engine and PyTorch's scaled_mm
  // pass it: on the H200, fp8 cublasLtMatmul returned NOT_SUPPORTED with exactly the heuristic's workspace
  // (one suspect of several; the device check's cublaslt.log says which).
  s.workspace = problem.input == GemmType::kE4m3 ? kMaxWorkspaceBytes : result.workspaceSize;
}

Gemm::~Gemm() = default;
Gemm::Gemm(Gemm&&) noexcept = default;
Gemm& Gemm::operator=(Gemm&&) noexcept = default;

const std::string& Gemm::can_implement() const {
  return impl_->why_not;
}
size_t Gemm::workspace_size() const {
  return impl_->workspace;
}
const GemmProblem& Gemm::problem() const {
  return impl_->problem;
}

void Gemm::run(const GemmOperands& ops, void* workspace, cudaStream_t stream) const {
  const Impl& s = *impl_;
  if (!s.why_not.empty()) {
    std::fprintf(stderr, "moerun: Gemm::run on a problem it cannot implement: %s\n", s.why_not.c_str());
    std::abort();
  }
  for (const void* p : {ops.a, ops.b, static_cast<const void*>(ops.c)}) {
    if (reinterpret_cast<uintptr_t>(p) % 256 != 0) {
      std::fprintf(stderr, "moerun: Gemm::run needs 256-byte aligned operands (got %p)\n", p);
      std::abort();
    }
  }
  if (s.workspace > 0 && workspace == nullptr) {
    std::fprintf(stderr, "moerun: Gemm::run needs %zu bytes of workspace\n", s.workspace);
    std::abort();
  }
  if (s.problem.input == GemmType::kE4m3) {
    if (!ops.a_scale || !ops.b_scale) {
      std::fprintf(stderr, "moerun: fp8 Gemm::run needs a_scale and b_scale\n");
      std::abort();
    }
    // cuBLASLt's A is our B and vice versa (see the constructor).
    MOERUN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                       &ops.b_scale, sizeof(ops.b_scale)));
    MOERUN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                       &ops.a_scale, sizeof(ops.a_scale)));
  }
  const float alpha = 1.0f, beta = s.problem.accumulate ? 1.0f : 0.0f;
  MOERUN_CUBLAS_CHECK(cublasLtMatmul(lt_handle(), s.desc, &alpha, ops.b, s.a, ops.a, s.b, &beta, ops.c, s.c,
                                     ops.c, s.c, &s.algo, workspace, s.workspace, stream));
}

}  // namespace moeplan::cuda
