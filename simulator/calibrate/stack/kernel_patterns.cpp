// Loading and applying the ordered kernel-name patterns; strict like every moeplan data file.
#include "simulator/calibrate/stack/kernel_patterns.h"

#include <fmt/format.h>

#include "simulator/io/builtin_catalog.h"
#include "simulator/io/json_reader.h"

namespace moeplan::calibrate {

const char* name_of(KernelKind k) {
  switch (k) {
    case KernelKind::kGemm:
      return "gemm";
    case KernelKind::kGroupedGemm:
      return "grouped_gemm";
    case KernelKind::kAttention:
      return "attention";
    case KernelKind::kNccl:
      return "nccl";
    case KernelKind::kPermute:
      return "permute";
    case KernelKind::kNorm:
      return "norm";
    case KernelKind::kCast:
      return "cast";
    case KernelKind::kElementwise:
      return "elementwise";
    case KernelKind::kOther:
      return "other";
  }
  return "?";
}

KernelKind KernelPatterns::classify(const std::string& kernel_name) const {
  for (const auto& p : patterns) {
    if (std::regex_search(kernel_name, p.re)) return p.kind;
  }
  return KernelKind::kOther;
}

KernelKind KernelPatterns::classify(const KernelEvent& k, TraceDialect dialect) const {
  if (dialect != TraceDialect::kMoerun) return classify(k.name);
  // moerun: cat is name_of(OpKind); memory-bound ops are told apart by their base name.
  if (k.cat == "grouped_gemm") return KernelKind::kGroupedGemm;
  if (k.cat == "gemm") return KernelKind::kGemm;
  if (k.cat == "attention") return KernelKind::kAttention;
  if (k.cat == "collective" || k.cat == "send_recv") return KernelKind::kNccl;
  if (k.cat != "memory_bound") return KernelKind::kOther;
  const std::string base =
      k.name.substr(k.name.find('.') == std::string::npos || k.name[0] != 'L' ? 0 : k.name.find('.') + 1);
  if (base.find("permute") != std::string::npos || base.rfind("scatter", 0) == 0 ||
      base.rfind("gather", 0) == 0)
    return KernelKind::kPermute;
  if (base.find("norm") != std::string::npos) return KernelKind::kNorm;
  if (base.find("cast") != std::string::npos || base.find("quant") != std::string::npos)
    return KernelKind::kCast;
  return KernelKind::kElementwise;
}

Result<KernelPatterns> load_kernel_patterns(const std::string& ref) {
  std::string label;
  // The built-in copy is found by its repository path (or stem) from any working directory.
  Result<io::json> j = io::read_input(ref, "hwprofiles/calibration", "", &label, nullptr);
  if (!j) return j.error();
  return io::catch_input_errors([&]() -> KernelPatterns {
    const io::JsonNode root(j.value(), label);
    root.only_keys({"format", "description", "patterns"});
    if (root.string("format") != "moeplan-kernel-patterns-v1")
      root.fail("format", "\"moeplan-kernel-patterns-v1\"");
    KernelPatterns out;
    out.label = label;
    for (const auto& p : root.array("patterns")) {
      p.only_keys({"kind", "regex", "note"});
      KernelPattern k;
      k.kind = p.choice<KernelKind>("kind", {{"gemm", KernelKind::kGemm},
                                             {"grouped_gemm", KernelKind::kGroupedGemm},
                                             {"attention", KernelKind::kAttention},
                                             {"nccl", KernelKind::kNccl},
                                             {"permute", KernelKind::kPermute},
                                             {"norm", KernelKind::kNorm},
                                             {"cast", KernelKind::kCast},
                                             {"elementwise", KernelKind::kElementwise},
                                             {"other", KernelKind::kOther}});
      k.regex = p.string("regex");
      k.note = p.string("note");
      if (k.note.find_first_not_of(" \t") == std::string::npos)
        p.fail("note", "a non-empty note saying where the names come from");
      try {
        k.re = std::regex(k.regex, std::regex::ECMAScript | std::regex::optimize);
      } catch (const std::regex_error& e) {
        p.fail("regex", fmt::format("a valid ECMAScript regex ({})", e.what()));
      }
      out.patterns.push_back(std::move(k));
    }
    if (out.patterns.empty()) root.fail("patterns", "at least one pattern");
    return out;
  });
}

}  // namespace moeplan::calibrate
