// Every approximation the simulator makes for a model, and every part of its checkpoint it leaves out, is one
// labelled line; a model of plain layers with nothing left out has none.
#include <doctest/doctest.h>

#include <string>

#include "simulator/core/model_notes.h"
#include "simulator/io/model_loader.h"

using namespace moeplan;

namespace {

std::vector<std::string> notes_of(const char* name) {
  auto m = io::load_model(name);
  REQUIRE_MESSAGE(m.ok(), (m.ok() ? "" : m.error().message));
  return model_notes(m.value());
}

bool has_line(const std::vector<std::string>& notes, const std::string& start, const std::string& label) {
  for (const auto& n : notes) {
    if (n.starts_with(start) && n.find(label) != std::string::npos && n.find('\n') == std::string::npos)
      return true;
  }
  return false;
}

}  // namespace

TEST_SUITE("core") {
  TEST_CASE("approximated layer kinds and checkpoint formats are each stated in one labelled line") {
    CHECK(notes_of("mixtral-8x7b").empty());
    CHECK(notes_of("tiny-moe").empty());
    const auto qn = notes_of("qwen3-next-80b-a3b");
    CHECK(qn.size() == 1);
    CHECK(has_line(qn, "Gated DeltaNet layers:", "(assumed: no calibrated kernel)"));
    const auto nh = notes_of("nemotron-3-nano-30b-a3b");
    CHECK(nh.size() == 1);
    CHECK(has_line(nh, "Mamba-2 layers:", "(assumed: no calibrated kernel)"));
    const auto v32 = notes_of("deepseek-v3.2");
    CHECK(v32.size() == 2);
    CHECK(has_line(v32, "DSA sparse attention:", "2048-token window (the same key count, derived)"));
    CHECK(has_line(v32, "checkpoint quantization (quantization_config): fp8", "weight blocks 128x128"));
    // Checkpoints that were read silently before: DeepSeek-V3's FP8 blocks, GPT-OSS's MXFP4 experts.
    CHECK(has_line(notes_of("deepseek-v3"), "checkpoint quantization", "fp8"));
    CHECK(has_line(notes_of("gpt-oss-20b"), "checkpoint quantization", "mxfp4"));
    const auto k25 = notes_of("kimi-k2.5");
    CHECK(has_line(k25, "checkpoint quantization", "compressed-tensors"));
    CHECK(has_line(k25, "not counted or simulated:", "vision tower"));
    CHECK(has_line(notes_of("minimax-m2.5"), "not counted or simulated:", "3 MTP modules"));
  }
}
