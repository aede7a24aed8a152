// ordered_worker (darray/src/ordered_worker.hpp): jobs run one at a time, in the order pushed,
// on a thread of the worker's own; failures are kept, not fatal; drain and the destructor wait
// for what was pushed. Pushes from several threads at once keep each thread's order.
#include "ordered_worker.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <future>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace poolscope::darray::detail {
namespace {

TEST(ordered_worker, runs_jobs_in_order_on_its_own_thread) {
  std::vector<int> ran;  // written by the worker only; read after drain
  std::vector<std::thread::id> threads;
  {
    ordered_worker w("test worker");
    for (int i = 0; i < 100; ++i) {
      w.push([&, i] {
        ran.push_back(i);
        threads.push_back(std::this_thread::get_id());
      });
    }
    w.drain();
    EXPECT_EQ(w.completed(), 100U);
  }
  ASSERT_EQ(ran.size(), 100U);
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(ran[static_cast<std::size_t>(i)], i);
    EXPECT_NE(threads[static_cast<std::size_t>(i)], std::this_thread::get_id());
    EXPECT_EQ(threads[static_cast<std::size_t>(i)], threads.front());
  }
}

TEST(ordered_worker, drain_waits_for_a_job_still_running) {
  ordered_worker w("test worker");
  std::promise<void> go;
  std::shared_future<void> opened = go.get_future().share();
  std::atomic<bool> finished{false};
  w.push([opened, &finished] {
    opened.wait();
    finished = true;
  });
  auto drained = std::async(std::launch::async, [&] {
    w.drain();
    return finished.load();
  });
  // The job cannot finish before the gate opens, so neither can drain.
  EXPECT_EQ(w.completed(), 0U);
  go.set_value();
  EXPECT_TRUE(drained.get());
  EXPECT_EQ(w.completed(), 1U);
}

TEST(ordered_worker, a_failure_is_kept_and_later_jobs_still_run) {
  ordered_worker w("rank 0's sends");
  std::atomic<int> after{0};
  w.push([] { throw std::runtime_error("the peer left"); });
  w.push([] { throw std::runtime_error("second failure"); });
  w.push([&] { ++after; });
  w.drain();
  EXPECT_EQ(after.load(), 1);
  const auto f = w.take_failure();
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(*f, "rank 0's sends: the peer left");  // the first one, named
  EXPECT_FALSE(w.take_failure().has_value());      // taken once
  w.push([] { throw 42; });
  w.drain();
  EXPECT_EQ(w.take_failure().value_or(""), "rank 0's sends: unknown exception");
}

TEST(ordered_worker, destruction_runs_what_was_pushed) {
  std::atomic<int> ran{0};
  {
    ordered_worker w("test worker");
    for (int i = 0; i < 50; ++i) {
      w.push([&] {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        ++ran;
      });
    }
  }
  EXPECT_EQ(ran.load(), 50);
}

TEST(ordered_worker, concurrent_pushes_keep_each_threads_order) {
  constexpr int threads = 4;
  constexpr int per_thread = 500;
  ordered_worker w("test worker");
  std::vector<std::pair<int, int>> ran;  // (thread, index), written by the worker only
  std::vector<std::thread> pushers;
  for (int t = 0; t < threads; ++t) {
    pushers.emplace_back([&, t] {
      for (int i = 0; i < per_thread; ++i) {
        w.push([&ran, t, i] { ran.emplace_back(t, i); });
      }
    });
  }
  for (auto& p : pushers) {
    p.join();
  }
  w.drain();
  ASSERT_EQ(ran.size(), static_cast<std::size_t>(threads * per_thread));
  std::vector<int> next(threads, 0);
  for (const auto& [t, i] : ran) {
    EXPECT_EQ(i, next[static_cast<std::size_t>(t)]++) << "thread " << t;
  }
  EXPECT_EQ(w.completed(), static_cast<std::uint64_t>(threads * per_thread));
}

}  // namespace
}  // namespace poolscope::darray::detail
