// Kernel classification by name, with the patterns kept in data
// (hwprofiles/calibration/kernel_patterns.json), so a new library's kernel names need a line of JSON, not
// code.
#pragma once

#include <cstdint>
#include <regex>
#include <string>
#include <vector>

#include "simulator/calibrate/stack/trace_reader.h"
#include "simulator/core/status.h"

namespace moeplan::calibrate {

enum class KernelKind : uint8_t {
  kGemm,
  kGroupedGemm,
  kAttention,
  kNccl,  // any communication kernel (NCCL, DeepEP)
  kPermute,
  kNorm,
  kCast,
  kElementwise,
  kOther,
};
const char* name_of(KernelKind k);

struct KernelPattern {
  KernelKind kind = KernelKind::kOther;
  std::string regex, note;
  std::regex re;
};

struct KernelPatterns {
  std::string label;
  std::vector<KernelPattern> patterns;  // ordered: the first match wins

  KernelKind classify(const std::string& kernel_name) const;
  // Kineto / Nsys: by name; moerun: by op kind and label (the op graph already says what each op is).
  KernelKind classify(const KernelEvent& k, TraceDialect dialect) const;
};

// `ref`: a file or the built-in "hwprofiles/calibration/kernel_patterns.json" (the default).
Result<KernelPatterns> load_kernel_patterns(
    const std::string& ref = "hwprofiles/calibration/kernel_patterns.json");

}  // namespace moeplan::calibrate
