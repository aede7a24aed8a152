// Many threads allocating under the line profiler and the recorder (also run under TSan).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "poolscope/analysis/event_log.hpp"
#include "poolscope/hooks/hook.hpp"
#include "poolscope/pool/best_fit_allocator.hpp"
#include "poolscope/pool/host_resource.hpp"
#include "poolscope/profiler/line_profiler.hpp"
#include "poolscope/profiler/recorder.hpp"

namespace poolscope::profiler {
namespace {

using analysis::event_log;
using analysis::read_event_log;

constexpr int k_threads = 8;
constexpr int k_rounds = 400;

__attribute__((noipa)) void* worker_site_small(pool::allocator& a, std::size_t n) {
  void* p = a.allocate({}, n);
  asm volatile("" : : "r"(p) : "memory");
  return p;
}
__attribute__((noipa)) void* worker_site_large(pool::allocator& a, std::size_t n) {
  void* p = a.allocate({}, n + 4096);
  asm volatile("" : : "r"(p) : "memory");
  return p;
}

/// Each thread allocates from two sites and frees everything; returns the requested bytes.
__attribute__((noipa)) std::size_t work(pool::allocator& a, int t) {
  std::size_t bytes = 0;
  std::vector<std::pair<void*, std::size_t>> held;
  for (int i = 0; i < k_rounds; ++i) {
    const std::size_t n = 64 + static_cast<std::size_t>((t * 131 + i * 17) % 2000);
    if (i % 2 == 0) {
      held.emplace_back(worker_site_small(a, n), n);
      bytes += n;
    } else {
      held.emplace_back(worker_site_large(a, n), n + 4096);
      bytes += n + 4096;
    }
    if (held.size() > 8) {
      a.deallocate({}, held.front().first, held.front().second);
      held.erase(held.begin());
    }
  }
  for (auto [p, n] : held) {
    a.deallocate({}, p, n);
  }
  return bytes;
}

TEST(profiler_concurrency, eight_threads_under_the_line_profiler) {
  pool::host_resource host;
  pool::best_fit_allocator alloc{host};
  line_profiler prof;
  std::vector<std::size_t> bytes(k_threads, 0);
  {
    hooks::scoped_hook on{prof};
    std::vector<std::thread> threads;
    for (int t = 0; t < k_threads; ++t) {
      threads.emplace_back([&, t] { bytes[static_cast<std::size_t>(t)] = work(alloc, t); });
    }
    // Reports while the threads run must be consistent snapshots (and race-free).
    for (int i = 0; i < 5; ++i) {
      const line_profile mid = prof.report({.symbolize = false});
      EXPECT_LE(mid.root.total.live, mid.peak_live);
    }
    for (auto& th : threads) {
      th.join();
    }
  }
  std::size_t expected = 0;
  for (auto b : bytes) {
    expected += b;
  }
  const line_profile r = prof.report({.symbolize = false});
  EXPECT_EQ(r.root.total.count, static_cast<std::uint64_t>(k_threads) * k_rounds);
  EXPECT_EQ(r.root.total.used, expected);
  EXPECT_EQ(r.root.total.freed, expected);
  EXPECT_EQ(r.root.total.live, 0u);
  EXPECT_EQ(r.unmatched_frees, 0u);
  EXPECT_GT(r.peak_live, 0u);
  EXPECT_EQ(r.root.total.live_at_peak, r.peak_live);
  EXPECT_TRUE(r.complete);
  // Every stack ends in one of the two worker sites: at most two leaves per distinct thread
  // entry path (all threads share the same code path).
  std::size_t leaves = 0;
  std::vector<const profile_node*> todo{&r.root};
  while (!todo.empty()) {
    const profile_node* n = todo.back();
    todo.pop_back();
    leaves += n->self.count > 0 ? 1 : 0;
    for (const auto& c : n->children) {
      todo.push_back(&c);
    }
  }
  EXPECT_EQ(leaves, 2u);
}

// Blocks allocated on some threads and freed on others, everything at once: a thread that finds
// the profiler's lock taken leaves its event to the holder, and every free must still be applied
// after its block's malloc (else it would count as unmatched and the block stay live). Repeated
// until some events were left to another thread (deferred_events), so that path ran.
TEST(profiler_concurrency, blocks_freed_on_other_threads_are_matched) {
  constexpr int producers = 4;
  constexpr int consumers = 4;
  constexpr int per_producer = 3000;
  pool::host_resource host;
  pool::best_fit_allocator alloc{host};
  std::uint64_t deferred = 0;
  for (int attempt = 0; attempt < 20 && deferred == 0; ++attempt) {
    line_profiler prof;
    std::mutex m;
    std::deque<std::pair<void*, std::size_t>> handed;
    std::atomic<int> producers_left{producers};
    std::atomic<std::size_t> requested{0};
    {
      hooks::scoped_hook on{prof};
      std::vector<std::thread> threads;
      for (int t = 0; t < producers; ++t) {
        threads.emplace_back([&, t] {
          std::size_t bytes = 0;
          for (int i = 0; i < per_producer; ++i) {
            const std::size_t n = 64 + static_cast<std::size_t>((t * 977 + i * 31) % 3000);
            void* p = i % 2 == 0 ? worker_site_small(alloc, n) : worker_site_large(alloc, n);
            const std::size_t size = i % 2 == 0 ? n : n + 4096;
            bytes += size;
            const std::lock_guard lock(m);
            handed.emplace_back(p, size);
          }
          requested += bytes;
          --producers_left;
        });
      }
      for (int t = 0; t < consumers; ++t) {
        threads.emplace_back([&] {
          for (;;) {
            std::pair<void*, std::size_t> block{nullptr, 0};
            {
              const std::lock_guard lock(m);
              if (!handed.empty()) {
                block = handed.front();
                handed.pop_front();
              }
            }
            if (block.first != nullptr) {
              alloc.deallocate({}, block.first, block.second);
            } else if (producers_left.load() == 0) {
              const std::lock_guard lock(m);
              if (handed.empty()) {
                return;
              }
            } else {
              std::this_thread::yield();
            }
          }
        });
      }
      for (auto& th : threads) {
        th.join();
      }
    }
    const line_profile r = prof.report({.symbolize = false});
    SCOPED_TRACE("attempt " + std::to_string(attempt));
    EXPECT_GE(r.events, 2u * producers * per_producer);  // and the pool's upstream calls
    EXPECT_EQ(r.root.total.count, static_cast<std::uint64_t>(producers) * per_producer);
    EXPECT_EQ(r.root.total.used, requested.load());
    EXPECT_EQ(r.root.total.freed, requested.load());
    EXPECT_EQ(r.root.total.live, 0u);
    EXPECT_EQ(r.unmatched_frees, 0u);
    EXPECT_EQ(r.root.total.live_at_peak, r.peak_live);
    EXPECT_LE(r.deferred_events, r.events);
    EXPECT_TRUE(r.complete);
    deferred = r.deferred_events;
  }
  EXPECT_GT(deferred, 0u) << "no event ever found the profiler's lock taken in 20 attempts";
}

TEST(profiler_concurrency, eight_threads_under_the_recorder) {
  const std::string path =
      ::testing::TempDir() + "poolscope_concurrency_" + std::to_string(::getpid()) + ".jsonl";
  pool::host_resource host;
  pool::best_fit_allocator alloc{host};
  std::uint64_t lines = 0;
  {
    recorder rec{path, {.buffer_bytes = 8192}};
    hooks::scoped_hook on{rec};
    std::vector<std::thread> threads;
    for (int t = 0; t < k_threads; ++t) {
      threads.emplace_back([&, t] { (void)work(alloc, t); });
    }
    for (auto& th : threads) {
      th.join();
    }
    ASSERT_TRUE(rec.flush());  // lines() counts what the writer thread has taken from the ring
    ASSERT_EQ(rec.dropped(), 0u);
    lines = rec.lines();
  }
  const event_log log = read_event_log(path);
  EXPECT_EQ(log.records.size(), lines);
  std::size_t mallocs = 0;
  std::size_t frees = 0;
  for (std::size_t i = 0; i < log.records.size(); ++i) {
    mallocs += log.records[i].kind == hooks::event_kind::pool_malloc ? 1 : 0;
    frees += log.records[i].kind == hooks::event_kind::pool_free ? 1 : 0;
    if (i > 0) {
      EXPECT_LT(log.records[i - 1].seq, log.records[i].seq);
    }
  }
  EXPECT_EQ(mallocs, static_cast<std::size_t>(k_threads) * k_rounds);
  EXPECT_EQ(frees, mallocs);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace poolscope::profiler
