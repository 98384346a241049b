// Watchdog: notices work (an op, a barrier) that has not completed within a timeout and reports it once, so a
// hung collective ends the job with a message naming the op instead of blocking it forever.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace moeplan::executor {

class Watchdog {
 public:
  using Clock = std::chrono::steady_clock;
  // `on_expire(what, seconds)` runs on the watchdog thread, once, for the first slot that stays busy longer
  // than `timeout_s`; `what` is the slot's description ("op L1.moe_dispatch (stage 0, micro-batch 2)").
  Watchdog(double timeout_s, int slots,
           std::function<void(const std::string& what, double timeout_s)> on_expire);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Marks slot `slot` busy from now with a description built only if it expires.
  void begin(int slot, std::function<std::string()> describe);
  void end(int slot);
  double timeout_s() const { return timeout_s_; }

 private:
  struct Slot {
    bool busy = false;
    Clock::time_point since;
    std::function<std::string()> describe;
  };
  void loop();

  double timeout_s_;
  std::function<void(const std::string&, double)> on_expire_;
  std::mutex mutex_;
  std::condition_variable stop_cv_;
  bool stop_ = false, fired_ = false;
  std::vector<Slot> slots_;
  std::thread thread_;
};

}  // namespace moeplan::executor
