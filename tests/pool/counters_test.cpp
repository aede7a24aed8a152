// The counting contract of every allocator (allocator.hpp, "Counters";
// pool/src/detail/allocator_counters.hpp): totals and counts exact; peaks exact while one thread
// uses the allocator, never below the true peak and never above the reserved peak with several.
// The model of model.hpp is the independent reference for the single-thread figures.
//
// Knobs: POOLSCOPE_TEST_SEED (printed).
#include <gtest/gtest.h>

#include <random>
#include <thread>
#include <vector>

#include "pool/allocator_types.hpp"
#include "pool/model.hpp"

namespace poolscope::pool::testing {
namespace {

template <typename Fixture>
class allocator_counters : public ::testing::Test {};
TYPED_TEST_SUITE(allocator_counters, host_allocators);

/// Allocates through `a`, recording the block in `m` with the rounded size its event reports.
void* take(allocator& a, allocator_model& m, std::size_t bytes) {
  rounded_size_hook h{a.id()};
  hooks::scoped_hook on{h, hooks::scope::thread};
  void* p = a.allocate({}, bytes);
  EXPECT_TRUE(m.on_allocate(p, bytes, h.rounded_, max_alignment)) << "handed out twice: " << p;
  return p;
}

// Blocks freed by a thread other than the one that allocated them leave that thread with credit
// against the shared total; once it has exited, the thread left using the allocator alone gets
// exact peaks again, and the totals were exact throughout.
TYPED_TEST(allocator_counters, a_thread_that_freed_others_blocks_and_exited_leaves_exact_peaks) {
  using F = TypeParam;
  const std::uint64_t seed = test_seed();
  auto res = F::make_resource();
  auto alloc = F::make(*res);
  allocator& a = *alloc;
  std::mt19937_64 rng(seed);

  std::vector<std::pair<void*, std::size_t>> handed;
  for (int i = 0; i < 64; ++i) {
    const std::size_t bytes = log_uniform(rng, 1, 256 << 10);
    handed.emplace_back(a.allocate({}, bytes), bytes);
  }
  std::thread other([&] {
    for (const auto& [p, bytes] : handed) {
      a.deallocate({}, p, bytes);  // credit for this thread, against a total it did not raise
    }
  });
  other.join();
  auto s = a.stats();
  EXPECT_EQ(s.in_use, 0U);
  EXPECT_EQ(s.requested_in_use, 0U);
  EXPECT_EQ(s.allocations, 64U);
  EXPECT_EQ(s.deallocations, 64U);
  const std::size_t first_peak = s.peak_in_use;
  EXPECT_LE(first_peak, s.peak_reserved);

  // This thread alone now: every new high is exact (the model starts from zero in use, as the
  // allocator does, so its peak is the allocator's once it passes the first one).
  allocator_model m;
  std::vector<void*> live;
  for (int i = 0; i < 400; ++i) {
    if (live.empty() || rng() % 3 != 0) {
      live.push_back(take(a, m, log_uniform(rng, 1, 512 << 10)));
    } else {
      const std::size_t k = rng() % live.size();
      const model_block b = m.on_deallocate(live[k]);
      a.deallocate({}, live[k], b.requested);
      live[k] = live.back();
      live.pop_back();
    }
    s = a.stats();
    ASSERT_EQ(s.in_use, m.in_use()) << "step " << i << ", seed " << seed;
    ASSERT_EQ(s.requested_in_use, m.requested_in_use()) << "step " << i;
    if (m.peak_in_use() > first_peak) {
      ASSERT_EQ(s.peak_in_use, m.peak_in_use()) << "step " << i << ", seed " << seed;
    }
  }
  for (void* p : live) {
    a.deallocate({}, p, m.on_deallocate(p).requested);
  }
  EXPECT_EQ(a.stats().in_use, 0U);
}

template <typename Fixture>
class allocator_counters_concurrency : public ::testing::Test {};
TYPED_TEST_SUITE(allocator_counters_concurrency, host_allocators);

// Totals stay exact when threads allocate and free each other's blocks at once, through many
// credit refunds and publications; the peaks never pass the reserved peak.
TYPED_TEST(allocator_counters_concurrency, totals_are_exact_after_threads_free_each_others_blocks) {
  using F = TypeParam;
  constexpr int threads = 4;
  const std::uint64_t seed = test_seed();
  auto res = F::make_resource();
  auto alloc = F::make(*res);
  allocator& a = *alloc;
  std::vector<std::vector<std::pair<void*, std::size_t>>> made(threads);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      std::mt19937_64 rng(seed + static_cast<std::uint64_t>(t));
      for (int i = 0; i < 300; ++i) {
        const std::size_t bytes = log_uniform(rng, 1, 8 << 20);
        made[static_cast<std::size_t>(t)].emplace_back(a.allocate({}, bytes), bytes);
      }
    });
  }
  for (auto& th : pool) {
    th.join();
  }
  pool.clear();
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {  // each thread frees the next one's blocks
      for (const auto& [p, bytes] : made[static_cast<std::size_t>((t + 1) % threads)]) {
        a.deallocate({}, p, bytes);
      }
    });
  }
  for (auto& th : pool) {
    th.join();
  }
  const auto s = a.stats();
  EXPECT_EQ(s.in_use, 0U);
  EXPECT_EQ(s.requested_in_use, 0U);
  EXPECT_EQ(s.allocations, static_cast<std::uint64_t>(threads * 300));
  EXPECT_EQ(s.deallocations, static_cast<std::uint64_t>(threads * 300));
  EXPECT_LE(s.peak_in_use, s.peak_reserved);
  EXPECT_LE(s.peak_requested, s.peak_in_use);
}

}  // namespace
}  // namespace poolscope::pool::testing
