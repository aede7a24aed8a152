// poolscope::spin_lock: mutual exclusion between threads (suite spin_lock_concurrency, also run
// under ThreadSanitizer), try_lock, and a holder that sleeps while others wait (they yield).
#include "poolscope/spin_lock.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace {

using poolscope::spin_lock;

TEST(spin_lock, try_lock_fails_while_held_and_succeeds_after) {
  spin_lock lock;
  ASSERT_TRUE(lock.try_lock());
  EXPECT_FALSE(lock.try_lock());
  std::thread other([&] { EXPECT_FALSE(lock.try_lock()); });
  other.join();
  lock.unlock();
  EXPECT_TRUE(lock.try_lock());
  lock.unlock();
}

TEST(spin_lock_concurrency, excludes_every_other_thread) {
  constexpr int threads = 8;
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
  constexpr int rounds = 2000;
#else
  constexpr int rounds = 50000;
#endif
  spin_lock lock;
  std::uint64_t plain = 0;  // written only under the lock (a data race TSan reports otherwise)
  std::atomic<int> inside{0};
  std::atomic<int> overlaps{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (int i = 0; i < rounds; ++i) {
        const std::lock_guard hold(lock);
        if (inside.fetch_add(1, std::memory_order_relaxed) != 0) {
          overlaps.fetch_add(1, std::memory_order_relaxed);
        }
        plain = plain + 1;
        inside.fetch_sub(1, std::memory_order_relaxed);
      }
    });
  }
  for (auto& th : pool) {
    th.join();
  }
  EXPECT_EQ(plain, std::uint64_t{threads} * rounds);
  EXPECT_EQ(overlaps.load(), 0);
}

TEST(spin_lock_concurrency, waiters_get_in_after_a_holder_that_sleeps) {
  spin_lock lock;
  std::atomic<int> entered{0};
  lock.lock();
  std::vector<std::thread> waiters;
  for (int t = 0; t < 4; ++t) {
    waiters.emplace_back([&] {
      const std::lock_guard hold(lock);
      entered.fetch_add(1, std::memory_order_relaxed);
    });
  }
  // Longer than the waiters' spinning: they are yielding by now, and none got in.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(entered.load(), 0);
  lock.unlock();
  for (auto& th : waiters) {
    th.join();
  }
  EXPECT_EQ(entered.load(), 4);
}

}  // namespace
