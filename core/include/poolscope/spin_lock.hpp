// spin_lock: a test-and-test-and-set lock for critical sections of a few dozen nanoseconds that
// threads may enter at once (a thread cache's inner lock, the line profiler's tables).
//
//   poolscope::spin_lock lock;
//   { std::lock_guard hold(lock); ++shared_counter; }
//
// Why not std::mutex: a contended glibc mutex sleeps in futex(2) at once and its unlock wakes
// the sleeper with another system call, microseconds for a section that lasts tens of
// nanoseconds (the line profiler's pair on 2 threads at once took half the CPU time under this
// lock; docs/line_profile.md). Uncontended it is inline, where std::mutex calls into the C
// library. For long sections, or more threads than cores, a sleeping lock is kinder.
//
// Thread safety: thread-safe (that is its job); not recursive. Cost: one exchange to take it when
// free, one release store to leave; a contender reads the lock with a pause between looks (so it
// does not take the line from the holder) and yields its CPU after `spins_before_yield` looks,
// so a holder that was preempted gets to run.
#pragma once

#include <atomic>
#include <thread>

#include "poolscope/cpu_relax.hpp"

namespace poolscope {

class spin_lock {
 public:
  static constexpr int spins_before_yield = 128;

  void lock() noexcept {
    if (!state_.exchange(true, std::memory_order_acquire)) [[likely]] {
      return;
    }
    lock_contended();
  }
  [[nodiscard]] bool try_lock() noexcept {
    return !state_.load(std::memory_order_relaxed) &&
           !state_.exchange(true, std::memory_order_acquire);
  }
  void unlock() noexcept { state_.store(false, std::memory_order_release); }

 private:
  void lock_contended() noexcept {
    for (int spins = 0;; ++spins) {
      if (try_lock()) {
        return;
      }
      if (spins >= spins_before_yield) {
        std::this_thread::yield();
      } else {
        cpu_relax();
      }
    }
  }

  std::atomic<bool> state_{false};
};

}  // namespace poolscope
