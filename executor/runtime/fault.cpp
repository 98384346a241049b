// Parses MOERUN_FAULT (see fault.h).
#include "executor/runtime/fault.h"

#include <charconv>
#include <string_view>

namespace moeplan::executor {

Result<std::optional<Fault>> parse_fault(const char* text) {
  if (text == nullptr || *text == '\0') return std::optional<Fault>{};
  const std::string_view s(text);
  const Error bad{
      "MOERUN_FAULT: expected crash:rank=R:op=LABEL, hang:rank=R:op=LABEL or slow:rank=R:op=LABEL:us=N, got "
      "'" +
      std::string(s) + "'"};
  Fault f;
  std::string_view rest;
  if (s.starts_with("crash:rank=")) {
    f.kind = Fault::Kind::kCrash;
    rest = s.substr(11);
  } else if (s.starts_with("hang:rank=")) {
    f.kind = Fault::Kind::kHang;
    rest = s.substr(10);
  } else if (s.starts_with("slow:rank=")) {
    f.kind = Fault::Kind::kSlow;
    rest = s.substr(10);
  } else {
    return bad;
  }
  const size_t colon = rest.find(":op=");
  if (colon == std::string_view::npos || colon == 0) return bad;
  const std::string_view rank = rest.substr(0, colon);
  const auto [end, ec] = std::from_chars(rank.data(), rank.data() + rank.size(), f.rank);
  if (ec != std::errc{} || end != rank.data() + rank.size() || f.rank < 0) return bad;
  std::string_view op = rest.substr(colon + 4);
  if (f.kind == Fault::Kind::kSlow) {
    // The delay comes last: an op label has no ':us=' in it.
    const size_t us = op.rfind(":us=");
    if (us == std::string_view::npos) return bad;
    const std::string_view delay = op.substr(us + 4);
    const auto [dend, dec] = std::from_chars(delay.data(), delay.data() + delay.size(), f.delay_us);
    if (dec != std::errc{} || dend != delay.data() + delay.size() || f.delay_us <= 0) return bad;
    op = op.substr(0, us);
  }
  f.op = std::string(op);
  if (f.op.empty()) return bad;
  return std::optional<Fault>{f};
}

}  // namespace moeplan::executor
