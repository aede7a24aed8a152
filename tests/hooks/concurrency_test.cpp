// The registry under concurrency (also run under ThreadSanitizer: suite names end in
// _concurrency): thread hooks installed and removed while other threads allocate, process hooks
// counting everything, and the per-pointer event order across threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <deque>
#include <iostream>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "hooks/recording_hook.hpp"
#include "poolscope/hooks/counting_hook.hpp"
#include "poolscope/hooks/hook.hpp"
#include "poolscope/pool/best_fit_allocator.hpp"
#include "poolscope/pool/host_resource.hpp"
#include "poolscope/pool/naive_allocator.hpp"

namespace {

namespace ph = poolscope::hooks;
using ph::event_kind;
using ph::event_phase;
using poolscope::pool::host_resource;

#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
constexpr int k_rounds = 40;
#else
constexpr int k_rounds = 200;
#endif

TEST(hooks_concurrency, thread_hooks_come_and_go_while_a_process_hook_counts) {
  host_resource host;
  poolscope::pool::best_fit_allocator a{host};
  ph::counting_hook process_counts;
  ph::scoped_hook on{process_counts};

  constexpr int threads = 6;
  constexpr int pairs_per_round = 5;
  std::atomic<int> mismatches{0};
  std::atomic<bool> stop{false};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      for (int round = 0; round < k_rounds; ++round) {
        ph::counting_hook mine;
        {
          ph::scoped_hook on_thread{mine, ph::scope::thread};
          for (int i = 0; i < pairs_per_round; ++i) {
            const std::size_t bytes = 64 + static_cast<std::size_t>((t * 7 + i) % 5) * 512;
            a.deallocate({}, a.allocate({}, bytes), bytes);
          }
        }
        // Outside the scope: must not reach `mine` any more.
        a.deallocate({}, a.allocate({}, 100), 100);
        const auto c = mine.snapshot();
        if (c.of(event_kind::pool_malloc, event_phase::post).calls != pairs_per_round ||
            c.of(event_kind::pool_free, event_phase::pre).calls != pairs_per_round ||
            c.of(event_kind::pool_malloc, event_phase::pre).calls != pairs_per_round ||
            c.of(event_kind::pool_free, event_phase::post).calls != pairs_per_round) {
          mismatches.fetch_add(1);
        }
      }
    });
  }
  // Meanwhile another thread installs and removes process hooks over and over.
  std::uint64_t churn_calls = 0;
  std::thread churn([&] {
    ph::counting_hook transient;
    while (!stop.load()) {
      ph::scoped_hook on_process{transient};
      std::this_thread::yield();
    }
    churn_calls = transient.snapshot().total_calls();
  });
  for (auto& w : workers) {
    w.join();
  }
  stop.store(true);
  churn.join();

  EXPECT_EQ(mismatches.load(), 0) << "a thread hook missed its own events or saw others'";
  const auto c = process_counts.snapshot();
  const std::uint64_t pairs =
      static_cast<std::uint64_t>(threads) * k_rounds * (pairs_per_round + 1);
  EXPECT_EQ(c.of(event_kind::pool_malloc, event_phase::pre).calls, pairs);
  EXPECT_EQ(c.of(event_kind::pool_malloc, event_phase::post).calls, pairs);
  EXPECT_EQ(c.of(event_kind::pool_free, event_phase::pre).calls, pairs);
  EXPECT_EQ(c.of(event_kind::pool_free, event_phase::post).calls, pairs);
  EXPECT_LE(churn_calls, c.total_calls());
  const auto s = a.stats();
  EXPECT_EQ(s.allocations, pairs);
  EXPECT_EQ(s.deallocations, pairs);
  EXPECT_EQ(s.in_use, 0U);
}

// For one pointer, malloc-post comes before its free-pre, which comes before the next
// malloc-post of the same pointer, even when the block moves between threads (events are
// raised after the allocation and before the block becomes reusable).
template <typename Alloc>
void check_per_pointer_order() {
  host_resource host;
  Alloc a{host};
  poolscope::testing::recording_hook rec{a.id()};
  ph::scoped_hook on{rec};

  // Blocks are handed between threads through a shared queue, so a block is often allocated on
  // one thread, freed on another and handed out again on a third.
  constexpr int threads = 4;
  constexpr int per_thread = k_rounds * 5;
  std::mutex queue_mutex;
  std::deque<void*> queue;
  std::atomic<int> ready{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&] {
      ready.fetch_add(1);
      while (ready.load() < threads) {
        std::this_thread::yield();
      }
      for (int i = 0; i < per_thread; ++i) {
        void* p = a.allocate({}, 1000);  // one size class: blocks hop between threads
        void* victim = nullptr;
        {
          std::lock_guard lock(queue_mutex);
          queue.push_back(p);
          if (queue.size() > 6) {
            victim = queue.front();
            queue.pop_front();
          }
        }
        if (victim != nullptr) {
          a.deallocate({}, victim, 1000);
        }
      }
    });
  }
  for (auto& w : workers) {
    w.join();
  }
  for (void* p : queue) {
    a.deallocate({}, p, 1000);
  }
  ASSERT_FALSE(rec.dropped());
  auto events = rec.events();
  std::sort(events.begin(), events.end(),
            [](const auto& x, const auto& y) { return x.e.seq < y.e.seq; });
  for (std::size_t i = 1; i < events.size(); ++i) {
    ASSERT_NE(events[i - 1].e.seq, events[i].e.seq) << "two events share a sequence number";
  }
  // Per pointer, the malloc-post / free-pre events must alternate, starting with a malloc.
  std::map<void*, bool> live;  // pointer -> allocated (last event was malloc-post)
  std::size_t mallocs = 0;
  std::size_t reused_across_threads = 0;
  std::map<void*, std::uint64_t> last_thread;
  for (const auto& r : events) {
    const auto& e = r.e;
    if (e.kind == event_kind::pool_malloc && e.phase == event_phase::post) {
      ++mallocs;
      bool& is_live = live[e.ptr];
      ASSERT_FALSE(is_live) << "malloc-post of " << e.ptr << " (seq " << e.seq
                            << ") before the free-pre of its previous life";
      is_live = true;
      auto [it, fresh] = last_thread.try_emplace(e.ptr, e.thread);
      if (!fresh && it->second != e.thread) {
        ++reused_across_threads;
      }
      it->second = e.thread;
    } else if (e.kind == event_kind::pool_free && e.phase == event_phase::pre) {
      bool& is_live = live[e.ptr];
      ASSERT_TRUE(is_live) << "free-pre of " << e.ptr << " (seq " << e.seq
                           << ") without a malloc-post before it";
      is_live = false;
    }
  }
  EXPECT_EQ(mallocs, static_cast<std::size_t>(threads * per_thread));
  for (const auto& [p, is_live] : live) {
    EXPECT_FALSE(is_live) << p << " never freed";
  }
  // Not asserted (scheduling decides), but reported: the test is only meaningful if blocks moved.
  std::cout << "[          ] blocks reused by another thread: " << reused_across_threads << "\n";
}

TEST(hooks_concurrency, per_pointer_event_order_across_threads_best_fit) {
  check_per_pointer_order<poolscope::pool::best_fit_allocator>();
}

TEST(hooks_concurrency, per_pointer_event_order_across_threads_naive) {
  check_per_pointer_order<poolscope::pool::naive_allocator>();
}

}  // namespace
