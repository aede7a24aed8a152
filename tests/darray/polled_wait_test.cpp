// polled_wait (darray/src/polled_wait.hpp), the CUDA backend's one way for a host thread to wait
// for GPU work: the schedule of pauses between polls (back to back, then yields, then sleeps
// doubling to a cap), and poll_until, driven here by polls of host state: it polls until done and
// no more, a poll that throws ends the wait, and threads wait at once, each on its own.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "polled_wait.hpp"

namespace poolscope::darray::detail {
namespace {

using std::chrono::microseconds;
using std::chrono::nanoseconds;
using kind = poll_pause::kind;

constexpr poll_schedule schedule{nanoseconds(5000), nanoseconds(1000000), microseconds(8),
                                 microseconds(64)};

TEST(polled_wait, spins_then_yields_then_sleeps) {
  const poll_pause start{};
  EXPECT_EQ(next_pause(schedule, nanoseconds(0), start), (poll_pause{kind::spin, microseconds(0)}));
  EXPECT_EQ(next_pause(schedule, nanoseconds(4999), start).how, kind::spin);
  EXPECT_EQ(next_pause(schedule, nanoseconds(5000), start),
            (poll_pause{kind::yield, microseconds(0)}));
  EXPECT_EQ(next_pause(schedule, nanoseconds(1004999), start).how, kind::yield);
  EXPECT_EQ(next_pause(schedule, nanoseconds(1005000), start),
            (poll_pause{kind::sleep, microseconds(8)}));
}

TEST(polled_wait, sleeps_double_up_to_the_cap) {
  // 8, 16, 32, 64, then 64 for as long as the wait lasts.
  const std::vector<long> expected{8, 16, 32, 64, 64, 64};
  poll_pause p{kind::yield, microseconds(0)};
  for (const long us : expected) {
    p = next_pause(schedule, std::chrono::seconds(1), p);
    EXPECT_EQ(p, (poll_pause{kind::sleep, microseconds(us)}));
  }
  // A first sleep beyond the cap is the cap.
  poll_schedule low = schedule;
  low.first_sleep = microseconds(100);
  EXPECT_EQ(next_pause(low, std::chrono::seconds(1), poll_pause{}),
            (poll_pause{kind::sleep, microseconds(64)}));
}

TEST(polled_wait, polls_until_done_and_no_more) {
  for (const int needed : {1, 2, 50}) {
    int polls = 0;
    poll_until([&] { return ++polls == needed; });
    EXPECT_EQ(polls, needed);
  }
  // Straight to sleeps: every pause of the wait sleeps.
  const poll_schedule sleepy{nanoseconds(0), nanoseconds(0), microseconds(1), microseconds(2)};
  int polls = 0;
  poll_until([&] { return ++polls == 20; }, sleepy);
  EXPECT_EQ(polls, 20);
}

TEST(polled_wait, a_failing_poll_ends_the_wait) {
  int polls = 0;
  EXPECT_THROW(poll_until([&]() -> bool {
                 if (++polls == 3) {
                   throw std::runtime_error("device fault");
                 }
                 return false;
               }),
               std::runtime_error);
  EXPECT_EQ(polls, 3);
}

TEST(polled_wait_concurrency, threads_wait_at_once_each_for_its_own) {
  constexpr int threads = 4;
  std::vector<std::atomic<bool>> ready(threads);
  std::atomic<int> returned{0};
  std::vector<int> polls(threads, 0);
  std::vector<std::thread> waiters;
  for (int t = 0; t < threads; ++t) {
    waiters.emplace_back([&, t] {
      poll_until([&] {
        ++polls[static_cast<std::size_t>(t)];
        return ready[static_cast<std::size_t>(t)].load(std::memory_order_acquire);
      });
      returned.fetch_add(1);
    });
  }
  // Released one at a time: only the released waiter may return.
  for (int t = 0; t < threads; ++t) {
    EXPECT_EQ(returned.load(), t);
    ready[static_cast<std::size_t>(t)].store(true, std::memory_order_release);
    while (returned.load() != t + 1) {
      std::this_thread::yield();
    }
  }
  for (auto& w : waiters) {
    w.join();
  }
  for (const int p : polls) {
    EXPECT_GE(p, 1);
  }
}

}  // namespace
}  // namespace poolscope::darray::detail
