// Fuzzes every JSON loader with the same bytes: parse, then read as a model, a hardware profile and a plan,
// and run what consumes a loaded spec (parameter and FLOP counts, plan validation). Any crash, sanitizer
// report or assertion is a bug; a rejected input is the expected outcome for most bytes.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "simulator/core/model_stats.h"
#include "simulator/core/plan.h"
#include "simulator/io/hardware_loader.h"
#include "simulator/io/model_loader.h"
#include "simulator/io/plan_io.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace moeplan;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto j = io::parse_json_text(text, "fuzz.json");
  if (!j) return 0;

  auto model = io::model_from_json(j.value(), "fuzz.json", "fuzz");
  if (model) {
    const ParamCounts p = count_params(model.value());
    const FlopsPerToken f = flops_per_token(model.value(), 4096);
    MOEPLAN_ASSERT(p.active.total() <= p.total.total() * (1 + 1e-12) + 1);
    MOEPLAN_ASSERT(f.train_step >= 0);
  }
  auto hw = io::hardware_from_json(j.value(), "fuzz.json");
  auto plan = io::plan_from_json(j.value(), "fuzz.json");
  if (plan) {
    const auto round_trip = io::plan_from_json(io::plan_to_json(plan.value()), "again.json");
    MOEPLAN_ASSERT(round_trip.ok());
    if (model && hw) (void)validate(plan.value(), model.value(), hw.value());
  }
  return 0;
}
