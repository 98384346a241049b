// Combining hashes of several fields into one (the search's cache keys, an op's cost fields).
#pragma once

#include <cstdint>

namespace moeplan {

// `h` with `v` mixed in (Boost's hash_combine constant and shifts, on 64 bits).
inline uint64_t hash_combine(uint64_t h, uint64_t v) {
  return h ^ (v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2));
}

}  // namespace moeplan
