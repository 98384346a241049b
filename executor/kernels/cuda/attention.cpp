// FlashAttention on cuDNN's SDPA graphs. The only translation unit that includes cudnn_frontend: its headers
// cost a minute and 1-2 GB to compile (shared/reference/feasibility.md section 4; attention.cmake has our
// figures), so nothing else should.
#include "executor/kernels/cuda/attention.h"

#include <cudnn_frontend.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <unordered_map>
#include <utility>
#include <vector>

#include "executor/kernels/cuda/check.h"

namespace moeplan::cuda {

namespace fe = cudnn_frontend;

namespace {

[[noreturn]] void cudnn_fail(const char* call, cudnnStatus_t status, const char* file, int line) {
  std::fprintf(stderr, "moerun: cuDNN error at %s:%d: %s: %s\n", file, line, call,
               cudnnGetErrorString(status));
  std::abort();
}

#define MOERUN_CUDNN_CHECK(call)                                                                       \
  do {                                                                                                 \
    const cudnnStatus_t moerun_status_ = (call);                                                       \
    if (moerun_status_ != CUDNN_STATUS_SUCCESS) cudnn_fail(#call, moerun_status_, __FILE__, __LINE__); \
  } while (0)

// A frontend call that must succeed once the graphs are built (execution): failure is a bug or a lost device.
#define MOERUN_CUDNN_FE_CHECK(call)                                                                      \
  do {                                                                                                   \
    auto moerun_fe_err_ = (call);                                                                        \
    if (moerun_fe_err_.is_bad()) {                                                                       \
      std::fprintf(stderr, "moerun: cudnn_frontend error at %s:%d: %s: %s\n", __FILE__, __LINE__, #call, \
                   moerun_fe_err_.get_message().c_str());                                                \
      std::abort();                                                                                      \
    }                                                                                                    \
  } while (0)

// Variant-pack uids of the graphs' user tensors.
enum Uid : fe::graph::Tensor_attributes::uid_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

// A tensor as cuDNN sees it: logical dims (b, h, s, d) and the strides of our memory.
struct Layout {
  std::vector<int64_t> dim, stride;
};
// [batch, seq, heads, d] token-major memory.
Layout token_major(const AttentionShape& a, int64_t seq, int64_t heads, int64_t d) {
  return {{a.batch, heads, seq, d}, {seq * heads * d, d, heads * d, 1}};
}
Layout q_layout(const AttentionShape& a) {  // q, dq
  return token_major(a, a.seq, a.q_heads, a.head_dim);
}
Layout o_layout(const AttentionShape& a) {  // o, do
  return token_major(a, a.seq, a.q_heads, a.value_dim());
}
Layout k_layout(const AttentionShape& a) {  // k, dk
  return token_major(a, a.keys(), a.kv_heads, a.head_dim);
}
Layout v_layout(const AttentionShape& a) {  // v, dv
  return token_major(a, a.keys(), a.kv_heads, a.value_dim());
}

// The mask: causal with the diagonal top-left when queries and keys are as many (key j visible iff j <= i,
// set_causal_mask's expansion), bottom-right otherwise (the queries are the last of the keys' positions);
// a window bounds it on the left (key j visible iff i' - j < window, i' the query's aligned position).
template <class Attributes>
void set_mask(Attributes& opts, const AttentionShape& a) {
  if (!a.causal) return;
  opts.set_diagonal_alignment(a.keys() == a.seq ? fe::DiagonalAlignment_t::TOP_LEFT
                                                : fe::DiagonalAlignment_t::BOTTOM_RIGHT)
      .set_diagonal_band_right_bound(0);
  if (a.window > 0) opts.set_diagonal_band_left_bound(static_cast<int>(a.window));
}
// Stats [batch, q_heads, seq] fp32 as (b, h, s, 1): packed BHSD, the only layout cuDNN < 9.26 reads back in
// the backward (cudnn_frontend 1.32 rejects others there).
Layout stats_layout(const AttentionShape& a) {
  return {{a.batch, a.q_heads, a.seq, 1}, {a.q_heads * a.seq, a.seq, 1, 1}};
}

std::shared_ptr<fe::graph::Tensor_attributes> input(fe::graph::Graph& g, const char* name, Uid uid,
                                                    const Layout& l, fe::DataType_t type) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim(l.dim)
                      .set_stride(l.stride)
                      .set_data_type(type));
}

void mark_output(const std::shared_ptr<fe::graph::Tensor_attributes>& t, Uid uid, const Layout& l,
                 fe::DataType_t type) {
  t->set_output(true).set_uid(uid).set_dim(l.dim).set_stride(l.stride).set_data_type(type);
}

std::shared_ptr<fe::graph::Graph> new_graph() {
  auto g = std::make_shared<fe::graph::Graph>();
  // bf16 in and out; scores, softmax and accumulators in fp32.
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

std::shared_ptr<fe::graph::Graph> forward_graph(const AttentionShape& a) {
  auto g = new_graph();
  const auto bf = fe::DataType_t::BFLOAT16;
  auto q = input(*g, "q", kQ, q_layout(a), bf);
  auto k = input(*g, "k", kK, k_layout(a), bf);
  auto v = input(*g, "v", kV, v_layout(a), bf);
  auto opts = fe::graph::SDPA_attributes()
                  .set_name("flash_fwd")
                  .set_generate_stats(true)
                  .set_attn_scale(a.softmax_scale());
  set_mask(opts, a);
  auto [o, stats] = g->sdpa(q, k, v, opts);
  mark_output(o, kO, o_layout(a), bf);
  mark_output(stats, kStats, stats_layout(a), fe::DataType_t::FLOAT);
  return g;
}

std::shared_ptr<fe::graph::Graph> backward_graph(const AttentionShape& a) {
  auto g = new_graph();
  const auto bf = fe::DataType_t::BFLOAT16;
  auto q = input(*g, "q", kQ, q_layout(a), bf);
  auto k = input(*g, "k", kK, k_layout(a), bf);
  auto v = input(*g, "v", kV, v_layout(a), bf);
  auto o = input(*g, "o", kO, o_layout(a), bf);
  auto d_o = input(*g, "do", kDO, o_layout(a), bf);
  auto stats = input(*g, "stats", kStats, stats_layout(a), fe::DataType_t::FLOAT);
  auto opts = fe::graph::SDPA_backward_attributes().set_name("flash_bwd").set_attn_scale(a.softmax_scale());
  set_mask(opts, a);
  auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, d_o, stats, opts);
  mark_output(dq, kDQ, q_layout(a), bf);
  mark_output(dk, kDK, k_layout(a), bf);
  mark_output(dv, kDV, v_layout(a), bf);
  return g;
}

// Validates and builds g's plan with heuristics mode A; empty on success, else the refusing stage's message.
std::string build(fe::graph::Graph& g, cudnnHandle_t handle, int64_t& workspace) {
  const auto stage = [](const char* name, fe::error_t e) {
    return e.is_good() ? std::string() : std::string(name) + ": " + e.get_message();
  };
  std::string why;
  if (why = stage("validate", g.validate()); !why.empty()) return why;
  if (why = stage("build_operation_graph", g.build_operation_graph(handle)); !why.empty()) return why;
  if (why = stage("create_execution_plans", g.create_execution_plans({fe::HeurMode_t::A})); !why.empty()) {
    return why;
  }
  if (why = stage("check_support", g.check_support()); !why.empty()) return why;
  if (why = stage("build_plans", g.build_plans(fe::BuildPlanPolicy_t::HEURISTICS_CHOICE)); !why.empty()) {
    return why;
  }
  return stage("get_workspace_size", g.get_workspace_size(workspace));
}

// "cuDNN 9.14.0 (frontend 1.32.0), sm_90" for refusal messages.
std::string versions() {
  const size_t v = cudnnGetVersion();
  std::string s = "cuDNN " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
                  std::to_string(v % 100) + " (frontend " + std::to_string(CUDNN_FRONTEND_MAJOR_VERSION) +
                  "." + std::to_string(CUDNN_FRONTEND_MINOR_VERSION) + "." +
                  std::to_string(CUDNN_FRONTEND_PATCH_VERSION) + ")";
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) == cudaSuccess &&
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess) {
    s += ", sm_" + std::to_string(major * 10 + minor);
  } else {
    cudaGetLastError();
    s += ", no device";
  }
  return s;
}

}  // namespace

float AttentionShape::softmax_scale() const {
  return scale != 0 ? scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
}

CudnnHandle::CudnnHandle() {
  MOERUN_CUDNN_CHECK(cudnnCreate(&handle_));
}
CudnnHandle::~CudnnHandle() {
  if (handle_) cudnnDestroy(handle_);
}

struct FlashAttention::Impl {
  cudnnHandle_t handle = nullptr;
  AttentionShape shape;
  std::string unsupported;
  std::shared_ptr<fe::graph::Graph> fwd, bwd;
  DeviceBuffer<std::byte> workspace;

  void execute(const fe::graph::Graph& g,
               std::unordered_map<fe::graph::Tensor_attributes::uid_t, void*>& pack, cudaStream_t stream) {
    if (!unsupported.empty()) {
      std::fprintf(stderr, "moerun: FlashAttention called for an unsupported shape: %s\n",
                   unsupported.c_str());
      std::abort();
    }
    MOERUN_CUDNN_CHECK(cudnnSetStream(handle, stream));
    MOERUN_CUDNN_FE_CHECK(g.execute(handle, pack, workspace.data()));
    MOERUN_CUDA_CHECK(cudaGetLastError());
  }
};

FlashAttention::FlashAttention(cudnnHandle_t handle, const AttentionShape& shape)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.handle = handle;
  m.shape = shape;
  const AttentionShape& a = shape;
  if (a.batch <= 0 || a.seq <= 0 || a.q_heads <= 0 || a.kv_heads <= 0 || a.head_dim <= 0 || a.seq_kv < 0 ||
      a.v_dim < 0 || a.window < 0) {
    m.unsupported = "batch, seq, heads and head_dim must be positive (seq_kv, v_dim and window >= 0)";
    return;
  }
  if (a.causal && a.keys() < a.seq) {
    m.unsupported = "causal attention with fewer keys (" + std::to_string(a.keys()) + ") than queries (" +
                    std::to_string(a.seq) + ")";
    return;
  }
  if (a.window > 0 && !a.causal) {
    m.unsupported = "a sliding window needs the causal mask";
    return;
  }
  if (a.q_heads % a.kv_heads != 0) {
    m.unsupported = "q_heads (" + std::to_string(a.q_heads) + ") is not a multiple of kv_heads (" +
                    std::to_string(a.kv_heads) + ")";
    return;
  }
  int64_t ws_fwd = 0, ws_bwd = 0;
  std::string why;
  try {
    m.fwd = forward_graph(a);
    why = build(*m.fwd, handle, ws_fwd);
    if (why.empty()) {
      m.bwd = backward_graph(a);
      why = build(*m.bwd, handle, ws_bwd);
      if (!why.empty()) why = "backward " + why;
    } else {
      why = "forward " + why;
    }
  } catch (const std::exception& e) {  // the frontend's legacy layer may throw cudnnException
    why = std::string("exception: ") + e.what();
  }
  if (!why.empty()) {
    cudaGetLastError();  // a refused build may leave a CUDA error behind; it is reported here instead
    m.unsupported = versions() + ": " + why;
    m.fwd.reset();
    m.bwd.reset();
    return;
  }
  m.workspace = DeviceBuffer<std::byte>(static_cast<size_t>(std::max(ws_fwd, ws_bwd)));
}

FlashAttention::~FlashAttention() = default;
FlashAttention::FlashAttention(FlashAttention&&) noexcept = default;
FlashAttention& FlashAttention::operator=(FlashAttention&&) noexcept = default;

const std::string& FlashAttention::unsupported() const {
  return impl_->unsupported;
}
const AttentionShape& FlashAttention::shape() const {
  return impl_->shape;
}
size_t FlashAttention::workspace_bytes() const {
  return impl_->workspace.bytes();
}

void FlashAttention::forward(const bf16* q, const bf16* k, const bf16* v, bf16* o, float* stats,
                             cudaStream_t stream) {
  // The variant pack takes void*; cuDNN only reads the inputs.
  std::unordered_map<fe::graph::Tensor_attributes::uid_t, void*> pack{{kQ, const_cast<bf16*>(q)},
                                                                      {kK, const_cast<bf16*>(k)},
                                                                      {kV, const_cast<bf16*>(v)},
                                                                      {kO, o},
                                                                      {kStats, stats}};
  impl_->execute(*impl_->fwd, pack, stream);
}

void FlashAttention::backward(const bf16* q, const bf16* k, const bf16* v, const bf16* o, const bf16* d_o,
                              const float* stats, bf16* dq, bf16* dk, bf16* dv, cudaStream_t stream) {
  std::unordered_map<fe::graph::Tensor_attributes::uid_t, void*> pack{{kQ, const_cast<bf16*>(q)},
                                                                      {kK, const_cast<bf16*>(k)},
                                                                      {kV, const_cast<bf16*>(v)},
                                                                      {kO, const_cast<bf16*>(o)},
                                                                      {kDO, const_cast<bf16*>(d_o)},
                                                                      {kStats, const_cast<float*>(stats)},
                                                                      {kDQ, dq},
                                                                      {kDK, dk},
                                                                      {kDV, dv}};
  impl_->execute(*impl_->bwd, pack, stream);
}

}  // namespace moeplan::cuda
