// What the CUDA side of this machine offers: devices, their names and memory, and the NCCL library version.
// Without a driver (this build machine, CI) it reports the runtime's reason instead of failing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moeplan::cuda {

struct DeviceInfo {
  std::string name;
  int sm_major = 0, sm_minor = 0;
  int sm_count = 0;
  int64_t memory_bytes = 0;
};

struct DeviceQuery {
  std::vector<DeviceInfo> devices;
  std::string unavailable_reason;  // non-empty when no device answers (e.g. cudaErrorInsufficientDriver)
  int runtime_version = 0;         // CUDA runtime, e.g. 13000
  int nccl_version = 0;            // e.g. 22809
};

DeviceQuery query_devices();

}  // namespace moeplan::cuda
