// Timing and reporting for the CUDA benchmark programs (executor/kernels/cuda/bench/): median of CUDA-event
// timings after warm-up, the device's achieved copy bandwidth (the ceiling memory-bound kernels are judged
// against), and one result row format that executor/cuda/device_check.sh collects into its final table.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "executor/kernels/cuda/check.h"

namespace moeplan::cuda::bench {

// Median milliseconds of `reps` runs of fn(stream) after `warmup` runs, each run timed with events.
template <class Fn>
double median_ms(Fn&& fn, int warmup = 3, int reps = 20, cudaStream_t stream = nullptr) {
  for (int i = 0; i < warmup; ++i) fn(stream);
  MOERUN_CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaEvent_t a, b;
  MOERUN_CUDA_CHECK(cudaEventCreate(&a));
  MOERUN_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    MOERUN_CUDA_CHECK(cudaEventRecord(a, stream));
    fn(stream);
    MOERUN_CUDA_CHECK(cudaEventRecord(b, stream));
    MOERUN_CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    MOERUN_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  MOERUN_CUDA_CHECK(cudaGetLastError());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Achieved HBM bandwidth in bytes/s: a device-to-device copy of `bytes`, counting bytes read plus written.
inline double copy_bandwidth(size_t bytes = size_t{2} << 30) {
  DeviceBuffer<char> src(bytes), dst(bytes);
  MOERUN_CUDA_CHECK(cudaMemset(src.data(), 1, bytes));
  const double ms = median_ms([&](cudaStream_t s) {
    MOERUN_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice, s));
  });
  return 2.0 * static_cast<double>(bytes) / (ms * 1e-3);
}

// One result row: "RESULT | family | kernel | shape | time | rate | reference | ratio | target | verdict".
// `rate` and `reference` are in the same unit (TFLOP/s or GB/s); ratio = rate / reference; target is the
// issue's threshold on the ratio (0 when there is none). device_check.sh greps these lines.
inline void print_result(const std::string& family, const std::string& kernel, const std::string& shape,
                         double ms, double rate, double reference, const std::string& unit, double target) {
  const double ratio = reference > 0 ? rate / reference : 0;
  const char* verdict = target <= 0 ? "-" : (ratio >= target ? "meets" : "MISSES");
  std::printf("RESULT | %s | %s | %s | %.3f ms | %.1f %s | %.1f %s | %.0f%% | %s | %s\n", family.c_str(),
              kernel.c_str(), shape.c_str(), ms, rate, unit.c_str(), reference, unit.c_str(), ratio * 100,
              target > 0 ? (std::to_string(static_cast<int>(target * 100)) + "%").c_str() : "-", verdict);
  std::fflush(stdout);
}

}  // namespace moeplan::cuda::bench
