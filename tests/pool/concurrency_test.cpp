// Every host allocator under 8 threads (suite allocator_concurrency: also run under
// ThreadSanitizer). Each thread allocates, fills the whole block with a value of its own,
// verifies it before freeing, and sometimes hands blocks to other threads to free; a ninth
// thread calls stats() and release_cached() meanwhile. Two threads holding overlapping blocks
// would overwrite each other's values (and TSan would report the race).
//
// Knobs: POOLSCOPE_TEST_SEED (printed), POOLSCOPE_CONCURRENCY_OPS (operations per thread;
// default 50000, 5000 under sanitizers).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
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

}  // namespace
}  // namespace poolscope::pool::testing
