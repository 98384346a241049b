// Infeasible or malformed input is a value, not an exception: Status carries a reason, Result<T> a value or a
// reason. Bugs are assertions (MOEPLAN_ASSERT), never Status.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <variant>

#define MOEPLAN_ASSERT(cond)                                                                     \
  do {                                                                                           \
    if (!(cond)) {                                                                               \
      std::fprintf(stderr, "moeplan: internal error: %s at %s:%d\n", #cond, __FILE__, __LINE__); \
      std::abort();                                                                              \
    }                                                                                            \
  } while (0)

namespace moeplan {

struct Error {
  std::string message;  // one line: file, field, what was expected
};

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}      // NOLINT: implicit by design
  Result(Error error) : v_(std::move(error)) {}  // NOLINT

  bool ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return ok(); }

  const T& value() const& {
    MOEPLAN_ASSERT(ok());
    return std::get<T>(v_);
  }
  T& value() & {
    MOEPLAN_ASSERT(ok());
    return std::get<T>(v_);
  }
  T&& value() && {
    MOEPLAN_ASSERT(ok());
    return std::get<T>(std::move(v_));
  }
  const Error& error() const {
    MOEPLAN_ASSERT(!ok());
    return std::get<Error>(v_);
  }

 private:
  std::variant<T, Error> v_;
};

}  // namespace moeplan
