// Device discovery through the CUDA runtime and NCCL; no driver-API symbol is linked.
#include "executor/cuda/device_query.h"

#include <cuda_runtime.h>
#include <nccl.h>

namespace moeplan::cuda {

DeviceQuery query_devices() {
  DeviceQuery q;
  cudaRuntimeGetVersion(&q.runtime_version);
  ncclGetVersion(&q.nccl_version);
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    q.unavailable_reason = std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
    return q;
  }
  if (count == 0) {
    q.unavailable_reason = "no CUDA device";
    return q;
  }
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, d) != cudaSuccess) continue;
    q.devices.push_back(
        {p.name, p.major, p.minor, p.multiProcessorCount, static_cast<int64_t>(p.totalGlobalMem)});
  }
  return q;
}

}  // namespace moeplan::cuda
