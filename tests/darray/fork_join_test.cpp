// detail::fork_join (the backend's issuing threads): every task runs exactly once per run, on
// the caller and the helpers at once, exceptions come back after every task ran, helpers that
// went to sleep wake for the next run, and concurrent callers share one instance (run under TSan
// by CI: the suite is a _concurrency one).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "poolscope/darray/fork_join.hpp"

namespace poolscope::darray::detail {
namespace {

TEST(fork_join_concurrency, every_task_runs_once_per_run_and_all_before_run_returns) {
  fork_join fj(3);
  ASSERT_EQ(fj.helpers(), 3U);
  std::vector<std::atomic<int>> hits(7);
  std::mutex ids_mutex;
  std::set<std::thread::id> ids;
  for (int round = 0; round < 2000; ++round) {
    for (auto& h : hits) {
      h.store(0);
    }
    const std::size_t n = 1 + static_cast<std::size_t>(round) % hits.size();
    auto task = [&](std::size_t i) {
      hits[i].fetch_add(1);
      if (round % 97 == 0) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));  // others take the rest
        const std::lock_guard lock(ids_mutex);
        ids.insert(std::this_thread::get_id());
      }
    };
    fj.run(n, task);
    for (std::size_t i = 0; i < hits.size(); ++i) {
      ASSERT_EQ(hits[i].load(), i < n ? 1 : 0) << "round " << round << " task " << i;
    }
  }
  EXPECT_GE(ids.size(), 2U) << "no task ever ran on a helper";
}

TEST(fork_join_concurrency, exceptions_come_back_after_every_task_ran) {
  fork_join fj(2);
  std::atomic<int> ran{0};
  auto task = [&](std::size_t i) {
    ran.fetch_add(1);
    if (i == 1 || i == 3) {
      throw std::runtime_error("task " + std::to_string(i));
    }
  };
  EXPECT_THROW(fj.run(5, task), std::runtime_error);
  EXPECT_EQ(ran.load(), 5);
  // The instance stays usable, and a clean run throws nothing.
  ran = 0;
  auto fine = [&](std::size_t) { ran.fetch_add(1); };
  EXPECT_NO_THROW(fj.run(5, fine));
  EXPECT_EQ(ran.load(), 5);
}

TEST(fork_join_concurrency, sleeping_helpers_wake_for_the_next_run) {
  fork_join fj(2, std::chrono::microseconds(0));  // helpers sleep as soon as a run ends
  std::mutex ids_mutex;
  std::set<std::thread::id> ids;
  for (int round = 0; round < 50; ++round) {
    std::this_thread::sleep_for(std::chrono::microseconds(300));  // they are asleep by now
    auto task = [&](std::size_t) {
      std::this_thread::sleep_for(std::chrono::microseconds(500));
      const std::lock_guard lock(ids_mutex);
      ids.insert(std::this_thread::get_id());
    };
    fj.run(3, task);
  }
  EXPECT_GE(ids.size(), 2U) << "sleeping helpers never took a task";
}

TEST(fork_join_concurrency, concurrent_callers_each_get_all_their_tasks) {
  fork_join fj(2);
  std::atomic<int> bad{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 4; ++t) {
    callers.emplace_back([&] {
      for (int round = 0; round < 500; ++round) {
        std::vector<int> hits(4, 0);
        auto task = [&](std::size_t i) { ++hits[i]; };  // each index written by one thread
        fj.run(hits.size(), task);
        for (int h : hits) {
          if (h != 1) {
            bad.fetch_add(1);
          }
        }
      }
    });
  }
  for (auto& c : callers) {
    c.join();
  }
  EXPECT_EQ(bad.load(), 0);
}

// Destroyed at once, or after a run the caller did alone, before the helpers even started: they
// must see the stop, not wait for a generation that has already moved.
TEST(fork_join_concurrency, destruction_right_after_construction_or_a_quick_run) {
  for (int i = 0; i < 300; ++i) {
    fork_join fj(2, std::chrono::microseconds(i % 2 == 0 ? 0 : 100));
    if (i % 3 != 0) {
      std::atomic<int> ran{0};
      auto task = [&](std::size_t) { ran.fetch_add(1); };
      fj.run(2, task);
      ASSERT_EQ(ran.load(), 2);
    }
  }
}

TEST(fork_join, no_helpers_is_a_loop_in_order) {
  fork_join fj(0);
  std::vector<std::size_t> order;
  auto task = [&](std::size_t i) { order.push_back(i); };
  fj.run(4, task);
  EXPECT_EQ(order, (std::vector<std::size_t>{0, 1, 2, 3}));
  fj.run(0, task);
  EXPECT_EQ(order.size(), 4U);
}

}  // namespace
}  // namespace poolscope::darray::detail
