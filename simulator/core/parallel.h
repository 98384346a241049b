// f(0), ..., f(n - 1) spread over up to `threads` threads, the caller's among them, each taking the next
// index as it finishes one; returns when all have run. f must be safe to run at once for different indices.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <functional>
#include <thread>
#include <vector>

namespace moeplan {

inline void parallel_for(size_t n, int threads, const std::function<void(size_t)>& f) {
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < n; i = next++) f(i);
  };
  std::vector<std::thread> pool;
  const size_t helpers = std::min(n, static_cast<size_t>(std::max(1, threads))) - (n > 0 ? 1 : 0);
  for (size_t t = 0; t < helpers; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
}

}  // namespace moeplan
