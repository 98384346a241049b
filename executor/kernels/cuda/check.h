// What every CUDA file of moerun shares: error checks that name the call, a device-availability probe that
// tests and benchmarks use to skip cleanly on machines without a driver, and an owning device buffer.
// Host-only header (no kernels), usable from .cpp and .cu files alike.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

namespace moeplan::cuda {

// Aborts with the file, line, call and CUDA's message. Kernels' launch errors are checked with
// MOERUN_CUDA_CHECK(cudaGetLastError()) after each launch.
[[noreturn]] inline void cuda_fail(const char* call, cudaError_t err, const char* file, int line) {
  std::fprintf(stderr, "moerun: CUDA error at %s:%d: %s: %s (%s)\n", file, line, call, cudaGetErrorName(err),
               cudaGetErrorString(err));
  std::abort();
}

#define MOERUN_CUDA_CHECK(call)                                                                         \
  do {                                                                                                  \
    const cudaError_t moerun_err_ = (call);                                                             \
    if (moerun_err_ != cudaSuccess) ::moeplan::cuda::cuda_fail(#call, moerun_err_, __FILE__, __LINE__); \
  } while (0)

// Empty when a CUDA device answers; else why not (here: cudaErrorInsufficientDriver, no driver installed).
inline std::string device_unavailable() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later calls are not confused
    return std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
  }
  return n > 0 ? std::string() : std::string("no CUDA device");
}

// In a doctest case: returns from the case, printing the line ctest's SKIP_REGULAR_EXPRESSION matches, when
// no device answers.
#define MOERUN_SKIP_WITHOUT_DEVICE()                                                     \
  do {                                                                                   \
    if (const std::string why_ = ::moeplan::cuda::device_unavailable(); !why_.empty()) { \
      std::printf("skipped: no CUDA device (%s)\n", why_.c_str());                       \
      return;                                                                            \
    }                                                                                    \
  } while (0)

// Owning device allocation of n elements of T (cudaMalloc; never managed memory).
template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) : n_(n) {
    if (n_ > 0) MOERUN_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), n_ * sizeof(T)));
  }
  // Stream-ordered (cudaMallocAsync on `stream`): no implicit device synchronisation, so it may be made while
  // kernels that wait on other GPUs (NCCL's) are in flight. Freed with cudaFree as any other: drop it where
  // no such kernel is pending.
  static DeviceBuffer stream_ordered(size_t n, cudaStream_t stream) {
    DeviceBuffer b;
    b.n_ = n;
    if (n > 0) MOERUN_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&b.p_), n * sizeof(T), stream));
    return b;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  ~DeviceBuffer() { reset(); }

  T* data() const { return p_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }

  void upload(const T* host, size_t n) {
    MOERUN_CUDA_CHECK(cudaMemcpy(p_, host, n * sizeof(T), cudaMemcpyHostToDevice));
  }
  void download(T* host, size_t n) const {
    MOERUN_CUDA_CHECK(cudaMemcpy(host, p_, n * sizeof(T), cudaMemcpyDeviceToHost));
  }
  std::vector<T> to_host() const {
    std::vector<T> v(n_);
    download(v.data(), n_);
    return v;
  }
  // Every byte 0xFF: NaN in bf16 and fp32, -1 in signed integers, so an element a kernel never writes fails
  // the test that reads it.
  void poison() { MOERUN_CUDA_CHECK(cudaMemset(p_, 0xFF, bytes())); }

 private:
  void reset() {
    if (p_) cudaFree(p_);
    p_ = nullptr;
    n_ = 0;
  }
  T* p_ = nullptr;
  size_t n_ = 0;
};

// A buffer of n poisoned elements (see DeviceBuffer::poison), for kernel outputs under test.
template <class T>
DeviceBuffer<T> poisoned(size_t n) {
  DeviceBuffer<T> d(n);
  d.poison();
  return d;
}

}  // namespace moeplan::cuda
