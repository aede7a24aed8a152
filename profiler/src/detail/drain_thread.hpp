// drain_thread: the writer thread behind an event_ring — it runs a drain function every period,
// and sooner when a producer asks (the ring filling up), and once more when stopped.
//
//   drain_thread writer{[this] { drain(); }, std::chrono::milliseconds(5), "poolscope rec"};
//   ... writer.wake();      // from a hook: cheap, never blocks
//   writer.stop();          // joins; the function has run after the last wake
//
// Ownership: owns the thread. Thread safety: wake() from any thread, at any time (also during
// stop); stop() from one thread. The drain function runs on the writer thread only, never at
// once with itself; it must not throw (an exception ends the program). Cost: wake() is a load
// when the thread is already asked, else an exchange and a notify.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace poolscope::profiler::detail {

class drain_thread {
 public:
  /// Starts the thread, named `name` (at most 15 characters: top -H, taskset by name). Throws
  /// std::system_error if it cannot be started.
  drain_thread(std::function<void()> drain, std::chrono::milliseconds period, const char* name);
  drain_thread(const drain_thread&) = delete;
  drain_thread& operator=(const drain_thread&) = delete;
  /// stop().
  ~drain_thread();

  /// Asks for a drain now. A wake that finds the thread already asked writes nothing: the flag
  /// stays in the caller's cache while the thread drains. A record published just before a wake
  /// that reads a stale `asked` may wait for the next drain (a period at most).
  void wake() noexcept {
    if (!asked_.load(std::memory_order_relaxed) &&
        !asked_.exchange(true, std::memory_order_acq_rel)) {
      cv_.notify_one();
    }
  }
  /// Runs the drain a last time and joins the thread. Idempotent.
  void stop() noexcept;

 private:
  void run();

  std::function<void()> drain_;
  std::chrono::milliseconds period_;
  const char* name_;
  std::mutex mutex_;
  std::condition_variable cv_;
  alignas(64) std::atomic<bool> asked_{false};  // a line of its own: hooks read it
  bool stopping_ = false;                       // guarded by mutex_
  std::thread thread_;
};

}  // namespace poolscope::profiler::detail
