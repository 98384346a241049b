// A model from a config's JSON text, for tests that write small configs inline ("cfg.json" in errors).
#pragma once

#include <doctest/doctest.h>

#include "simulator/io/model_loader.h"

namespace moeplan::test {

inline ModelSpec parse_model(const char* text) {
  auto j = io::parse_json_text(text, "cfg.json");
  REQUIRE(j.ok());
  auto m = io::model_from_json(j.value(), "cfg.json", "cfg");
  REQUIRE_MESSAGE(m.ok(), (m.ok() ? "" : m.error().message));
  return m.value();
}

}  // namespace moeplan::test
