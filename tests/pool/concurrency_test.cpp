// Every host allocator under 8 threads (suite allocator_concurrency: also run under
// ThreadSanitizer). Each thread allocates, fills the whole block with a value of its own,
// verifies it before freeing, and sometimes hands blocks to other threads to free; a ninth
// thread calls stats() and release_cached() meanwhile. Two threads holding overlapping blocks
// would overwrite each other's values (and TSan would report the race).
//
// Two more tests bound the peaks by what the resource holds: a freed block's bytes must leave the
// counters before another thread can take the block.
//
// Knobs: POOLSCOPE_TEST_SEED (printed), POOLSCOPE_CONCURRENCY_OPS (operations per thread,
// default 50000, 5000 under sanitizers; and the allocations in all of the contention test,
// default 2000, 500 under sanitizers).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "pool/allocator_types.hpp"
#include "pool/model.hpp"
#include "poolscope/error.hpp"
#include "poolscope/hooks/hook.hpp"
#include "poolscope/pool/allocator.hpp"

namespace poolscope::pool::testing {
namespace {

struct filled_block {
  void* p = nullptr;
  std::size_t bytes = 0;
  unsigned char value = 0;
};

/// True if every byte of the block still holds its value.
bool intact(const filled_block& b) {
  const auto* c = static_cast<const unsigned char*>(b.p);
  return c[0] == b.value && (b.bytes == 1 || std::memcmp(c, c + 1, b.bytes - 1) == 0);
}

/// Records the first failure of any thread (gtest assertions are not for worker threads).
class failure_log {
 public:
  void add(const std::string& what) {
    std::lock_guard lock(mutex_);
    if (count_++ == 0) {
      first_ = what;
    }
  }
  [[nodiscard]] int count() const {
    std::lock_guard lock(mutex_);
    return count_;
  }
  [[nodiscard]] std::string first() const {
    std::lock_guard lock(mutex_);
    return first_;
  }

 private:
  mutable std::mutex mutex_;
  int count_ = 0;
  std::string first_;
};

template <typename Fixture>
class allocator_concurrency : public ::testing::Test {};

TYPED_TEST_SUITE(allocator_concurrency, host_allocators);

TYPED_TEST(allocator_concurrency, threads_never_share_live_blocks) {
  using F = TypeParam;
  constexpr int threads = 8;
  const std::uint64_t seed = test_seed();
  const std::uint64_t ops = env_count("POOLSCOPE_CONCURRENCY_OPS", under_sanitizer ? 5000 : 50000);
  auto res = F::make_resource();
  auto alloc = F::make(*res);
  allocator& a = *alloc;

  failure_log failures;
  std::mutex exchange_mutex;
  std::vector<filled_block> exchange;  // blocks handed from one thread to another
  std::atomic<std::uint64_t> allocations{0};
  std::atomic<int> running{threads};

  auto worker = [&](int t) {
    std::mt19937_64 rng(seed + static_cast<std::uint64_t>(t));
    std::vector<filled_block> mine;
    std::uint64_t serial = 0;
    auto release = [&](const filled_block& b) {
      if (!intact(b)) {
        failures.add("thread " + std::to_string(t) + ": the block at " +
                     std::to_string(reinterpret_cast<std::uintptr_t>(b.p)) + " (" +
                     std::to_string(b.bytes) + " bytes) was overwritten while live");
      }
      a.deallocate({}, b.p, b.bytes);
    };
    for (std::uint64_t op = 0; op < ops; ++op) {
      if (mine.empty() || (mine.size() < 32 && rng() % 2 == 0)) {
        const std::size_t bytes =
            rng() % 64 == 0 ? log_uniform(rng, 1, 1 << 20) : log_uniform(rng, 1, 64 << 10);
        void* p = nullptr;
        try {
          p = a.allocate({}, bytes);
        } catch (const std::exception& e) {
          failures.add(std::string("allocate threw: ") + e.what());
          continue;
        }
        // A value unique to this thread among the values live at once: threads own disjoint
        // ranges of 31 values.
        const auto value = static_cast<unsigned char>(1 + t * 31 + static_cast<int>(serial++ % 31));
        std::memset(p, value, bytes);
        mine.push_back({p, bytes, value});
        allocations.fetch_add(1, std::memory_order_relaxed);
      } else {
        const std::size_t i = rng() % mine.size();
        const filled_block b = mine[i];
        mine[i] = mine.back();
        mine.pop_back();
        if (rng() % 16 == 0) {
          // Hand it to whichever thread comes next; free one handed over by someone else.
          filled_block other;
          {
            std::lock_guard lock(exchange_mutex);
            exchange.push_back(b);
            if (exchange.size() > 4) {
              other = exchange.front();
              exchange.erase(exchange.begin());
            }
          }
          if (other.p != nullptr) {
            release(other);
          }
        } else {
          release(b);
        }
      }
    }
    for (const auto& b : mine) {
      release(b);
    }
    running.fetch_sub(1);
  };

  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back(worker, t);
  }
  // Meanwhile: snapshots and cache releases from another thread.
  std::uint64_t janitor_rounds = 0;
  std::size_t max_seen_in_use = 0;
  std::thread janitor([&] {
    while (running.load() > 0) {
      // Fields of a snapshot under concurrent use may be from different instants, so only
      // each field's own bound is checked.
      const auto s = a.stats();
      max_seen_in_use = std::max(max_seen_in_use, s.in_use);
      if (++janitor_rounds % 8 == 0) {
        (void)a.release_cached();
      }
      std::this_thread::yield();
    }
  });
  for (auto& th : pool) {
    th.join();
  }
  janitor.join();
  for (const auto& b : exchange) {
    if (!intact(b)) {
      failures.add("a handed-over block was overwritten");
    }
    a.deallocate({}, b.p, b.bytes);
  }

  EXPECT_EQ(failures.count(), 0) << failures.first();
  const auto s = a.stats();
  EXPECT_EQ(s.in_use, 0U);
  EXPECT_EQ(s.requested_in_use, 0U);
  EXPECT_EQ(s.allocations, allocations.load());
  EXPECT_EQ(s.deallocations, allocations.load());
  EXPECT_EQ(s.invalid_frees, 0U);
  EXPECT_EQ(s.oom_count, 0U);
  EXPECT_GE(s.peak_in_use, max_seen_in_use) << "a snapshot saw more in use than the peak";
  a.release_cached();
  EXPECT_EQ(a.stats().reserved, 0U);
  if (auto* host = dynamic_cast<host_resource*>(res.get())) {
    EXPECT_EQ(host->allocated_bytes(), 0U);
  }
  std::cout << "[          ] " << allocations.load() << " allocations over " << threads
            << " threads; janitor ran " << janitor_rounds << " rounds; peak reserved "
            << s.peak_reserved << "\n";
}

// A block's bytes leave the in-use counters before another thread can take the block: else the
// next owner counts them while they are still counted, and the peaks count one block twice.
// Deterministic: the report of a free with a wrong size (corrected: the block is
// freed with its true size) runs a thread hook after the strategy took the block back; the hook
// lets a second thread allocate and waits for it. The resource holds one block and a half, so
// the second thread gets the freed block or nothing, and two blocks counted at once is one
// block counted twice.
TYPED_TEST(allocator_concurrency, a_freed_block_leaves_the_counters_before_it_is_reused) {
  using F = TypeParam;
  constexpr std::size_t block_bytes = std::size_t{16} << 10;
  constexpr std::size_t capacity = block_bytes * 3 / 2;
  auto res = F::make_resource(capacity);
  auto alloc = F::make(*res);
  allocator& a = *alloc;

  std::atomic<bool> window_open{false};
  std::atomic<bool> other_done{false};
  std::atomic<bool> other_got_a_block{false};
  // On the freeing thread only: at the invalid_free report, let the other thread allocate.
  class window_hook final : public hooks::hook {
   public:
    window_hook(std::atomic<bool>& open, std::atomic<bool>& done) : open_(&open), done_(&done) {}
    void on_event(const hooks::event& e) noexcept override {
      if (e.kind != hooks::event_kind::invalid_free) {
        return;
      }
      open_->store(true);
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (!done_->load() && std::chrono::steady_clock::now() < give_up) {
        std::this_thread::yield();
      }
    }

   private:
    std::atomic<bool>* open_;
    std::atomic<bool>* done_;
  } window{window_open, other_done};

  void* mine = a.allocate({}, block_bytes);
  void* theirs = nullptr;
  std::thread other([&] {
    while (!window_open.load()) {
      std::this_thread::yield();
    }
    try {
      theirs = a.allocate({}, block_bytes);
      other_got_a_block = true;
    } catch (const out_of_memory&) {
      // Checked below: the freed block must have been reusable by now.
    }
    other_done = true;
  });
  {
    hooks::scoped_hook on{window, hooks::scope::thread};
    a.deallocate({}, mine, block_bytes + 1000);  // the wrong size: reported, then corrected
  }
  other.join();

  ASSERT_TRUE(window_open.load()) << "the wrong size was not reported";
  ASSERT_TRUE(other_got_a_block.load()) << "the freed block was not reusable at the report";
  const auto s = a.stats();
  EXPECT_EQ(s.invalid_frees, 1U);
  EXPECT_LE(s.peak_in_use, capacity) << "the freed block was counted in use twice";
  EXPECT_LE(s.peak_requested, capacity) << "the freed block was counted as requested twice";
  EXPECT_LE(s.peak_reserved, capacity);
  a.deallocate({}, theirs, block_bytes);
  EXPECT_EQ(a.stats().in_use, 0U);
  EXPECT_EQ(a.stats().requested_in_use, 0U);
}

// The same bound under contention: eight threads share a pool whose resource holds two blocks
// and a half, so at most two blocks are live at once and each block freed is wanted at once by
// a waiting thread. The peaks never pass what the resource holds.
TYPED_TEST(allocator_concurrency, peaks_under_contention_stay_within_what_the_resource_holds) {
  using F = TypeParam;
  constexpr int threads = 8;
  constexpr std::size_t block_bytes = std::size_t{16} << 10;
  constexpr std::size_t capacity = block_bytes * 5 / 2;
  const std::uint64_t total = env_count("POOLSCOPE_CONCURRENCY_OPS", under_sanitizer ? 500 : 2000);
  auto res = F::make_resource(capacity);
  auto alloc = F::make(*res);
  allocator& a = *alloc;

  failure_log failures;
  std::atomic<bool> go{false};
  std::atomic<std::uint64_t> taken{0};
  std::atomic<std::uint64_t> refused{0};
  auto worker = [&] {
    while (!go.load()) {
      std::this_thread::yield();
    }
    while (taken.load(std::memory_order_relaxed) < total) {
      void* p = nullptr;
      try {
        p = a.allocate({}, block_bytes);
      } catch (const out_of_memory&) {
        refused.fetch_add(1, std::memory_order_relaxed);  // both blocks are taken
        std::this_thread::yield();
        continue;
      } catch (const std::exception& e) {
        failures.add(std::string("allocate threw: ") + e.what());
        return;
      }
      static_cast<unsigned char*>(p)[0] = 1;
      taken.fetch_add(1, std::memory_order_relaxed);
      std::this_thread::yield();  // held a moment: the other threads queue up for it
      a.deallocate({}, p, block_bytes);
    }
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back(worker);
  }
  go = true;
  for (auto& th : pool) {
    th.join();
  }

  EXPECT_EQ(failures.count(), 0) << failures.first();
  const auto s = a.stats();
  EXPECT_EQ(s.in_use, 0U);
  EXPECT_EQ(s.requested_in_use, 0U);
  EXPECT_EQ(s.allocations, s.deallocations);
  EXPECT_LE(s.peak_in_use, capacity) << "a freed block was counted in use twice";
  EXPECT_LE(s.peak_requested, capacity) << "a freed block was counted as requested twice";
  EXPECT_LE(s.peak_reserved, capacity);
  std::cout << "[          ] " << taken.load() << " allocations over " << threads << " threads, "
            << refused.load() << " refused; peak in use " << s.peak_in_use << " of the " << capacity
            << " bytes the resource holds\n";
}

}  // namespace
}  // namespace poolscope::pool::testing
