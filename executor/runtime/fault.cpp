// Parses MOERUN_FAULT (see fault.h).
#include "executor/runtime/fault.h"

#include <charconv>
#include <string_view>

namespace moeplan::executor {

Result<std::optional<Fault>> parse_fault(const char* text) {
  if (text == nullptr || *text == '\0') return std::optional<Fault>{};
  const std::string_view s(text);
  const Error bad{"MOERUN_FAULT: expected crash:rank=R:op=LABEL or hang:rank=R:op=LABEL, got '" +
                  std::string(s) + "'"};
  Fault f;
  std::string_view rest;
  if (s.starts_with("crash:rank=")) {
    f.kind = Fault::Kind::kCrash;
    rest = s.substr(11);
  } else if (s.starts_with("hang:rank=")) {
    f.kind = Fault::Kind::kHang;
    rest = s.substr(10);
  } else {
    return bad;
  }
  const size_t colon = rest.find(":op=");
  if (colon == std::string_view::npos || colon == 0) return bad;
  const std::string_view rank = rest.substr(0, colon);
  const auto [end, ec] = std::from_chars(rank.data(), rank.data() + rank.size(), f.rank);
  if (ec != std::errc{} || end != rank.data() + rank.size() || f.rank < 0) return bad;
  f.op = std::string(rest.substr(colon + 4));
  if (f.op.empty()) return bad;
  return std::optional<Fault>{f};
}

}  // namespace moeplan::executor
