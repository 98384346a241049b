// Watchdog thread (see watchdog.h): polls the busy slots every 20 ms.
#include "executor/runtime/watchdog.h"

#include "simulator/core/status.h"

namespace moeplan::executor {

Watchdog::Watchdog(double timeout_s, int slots,
                   std::function<void(const std::string& what, double timeout_s)> on_expire)
    : timeout_s_(timeout_s), on_expire_(std::move(on_expire)), slots_(static_cast<size_t>(slots)) {
  MOEPLAN_ASSERT(timeout_s > 0 && slots > 0);
  thread_ = std::thread([this] { loop(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  thread_.join();
}

void Watchdog::begin(int slot, std::function<std::string()> describe) {
  std::lock_guard<std::mutex> lock(mutex_);
  Slot& s = slots_.at(static_cast<size_t>(slot));
  s.busy = true;
  s.since = Clock::now();
  s.describe = std::move(describe);
}

void Watchdog::end(int slot) {
  std::lock_guard<std::mutex> lock(mutex_);
  slots_.at(static_cast<size_t>(slot)).busy = false;
}

void Watchdog::loop() {
  const auto timeout = std::chrono::duration<double>(timeout_s_);
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    stop_cv_.wait_for(lock, std::chrono::milliseconds(20));
    if (stop_ || fired_) continue;
    const Clock::time_point now = Clock::now();
    // The slot busy the longest is the one to name.
    const Slot* oldest = nullptr;
    for (const Slot& s : slots_) {
      if (s.busy && now - s.since > timeout && (oldest == nullptr || s.since < oldest->since)) oldest = &s;
    }
    if (oldest == nullptr) continue;
    fired_ = true;
    const std::string what = oldest->describe();
    lock.unlock();
    on_expire_(what, timeout_s_);
    lock.lock();
  }
}

}  // namespace moeplan::executor
