// Randomized stress of every host allocator against the reference model (model.hpp): a long run
// of random allocations (1 B .. 4 MiB, log-uniform and mostly small; random alignment) and frees,
// with the occasional release_cached() and limit change. After every step: live blocks never
// overlap, alignment holds, and the counters equal the model's.
//
// Knobs: POOLSCOPE_TEST_SEED replays a run (the seed is printed); POOLSCOPE_STRESS_OPS sets
// the operation count per allocator (default 10^6, 10^5 under sanitizers).
#include <gtest/gtest.h>

#include <cstdint>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "pool/allocator_types.hpp"
#include "pool/model.hpp"
#include "poolscope/error.hpp"
#include "poolscope/pool/allocator.hpp"

namespace poolscope::pool::testing {
namespace {

constexpr std::size_t k_max_bytes = std::size_t{4} << 20;
constexpr std::size_t k_target_live = 1000;

/// The byte written at both ends of a live block: a function of where it is and its size.
unsigned char tag_of(const void* p, std::size_t bytes) {
  return static_cast<unsigned char>((reinterpret_cast<std::uintptr_t>(p) >> 8) ^ bytes ^ 0x5a);
}

template <typename Fixture>
class allocator_stress : public ::testing::Test {};

TYPED_TEST_SUITE(allocator_stress, host_allocators);

TYPED_TEST(allocator_stress, random_operations_agree_with_the_model) {
  using F = TypeParam;
  const std::uint64_t seed = test_seed();
  const std::uint64_t ops =
      env_count("POOLSCOPE_STRESS_OPS", under_sanitizer ? 100'000 : 1'000'000);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);

  auto res = F::make_resource();
  auto alloc = F::make(*res);
  allocator& a = *alloc;
  auto* host = dynamic_cast<host_resource*>(res.get());
  ASSERT_NE(host, nullptr);

  allocator_model model;
  interval_set ranges;
  std::vector<void*> live;  // the model's live blocks, for picking one at random
  rounded_size_hook last{a.id()};
  hooks::scoped_hook on{last, hooks::scope::thread};

  std::size_t limit = SIZE_MAX;
  std::uint64_t allocs = 0, frees = 0, limit_failures = 0, releases = 0, limit_changes = 0;

  for (std::uint64_t op = 0; op < ops; ++op) {
    const double u = unit(rng);
    if (u < 1.0 / 2000) {
      // Give the cache back.
      const auto before = a.stats();
      const std::size_t released = a.release_cached();
      const auto after = a.stats();
      ASSERT_EQ(before.reserved - after.reserved, released) << "op " << op;
      ASSERT_EQ(after.in_use, before.in_use) << "op " << op;
      ++releases;
    } else if (u < 1.0 / 2000 + 1.0 / 10000) {
      // Impose a limit somewhat above current use, or lift it.
      if (limit == SIZE_MAX) {
        limit = model.in_use() + log_uniform(rng, 1, 64 << 20);
      } else {
        limit = SIZE_MAX;
      }
      a.set_limit(limit);
      ASSERT_EQ(a.limit(), limit);
      ++limit_changes;
    } else if (live.empty() || unit(rng) < (live.size() < k_target_live ? 0.6 : 0.4)) {
      // Mostly small: 9 in 10 log-uniform in 1 B .. 64 KiB, the rest in 64 KiB .. 4 MiB.
      const std::size_t bytes =
          rng() % 10 != 0 ? log_uniform(rng, 1, 64 << 10) : log_uniform(rng, 64 << 10, k_max_bytes);
      const std::size_t alignment = std::size_t{1} << (rng() % 9);
      const bool must_fail_limit = limit != SIZE_MAX && model.in_use() + bytes > limit;
      void* p = nullptr;
      try {
        p = a.allocate({}, bytes, alignment);
      } catch (const out_of_memory& e) {
        ASSERT_NE(limit, SIZE_MAX) << "op " << op << ": out of memory with no limit: " << e.what();
        ASSERT_TRUE(e.cause().starts_with("limit")) << "op " << op << ": " << e.what();
        ++limit_failures;
      }
      if (p != nullptr) {
        ASSERT_FALSE(must_fail_limit)
            << "op " << op << ": " << bytes << " bytes handed out past the limit " << limit
            << " with " << model.in_use() << " in use";
        ASSERT_EQ(reinterpret_cast<std::uintptr_t>(p) % alignment, 0U) << "op " << op;
        ASSERT_EQ(reinterpret_cast<std::uintptr_t>(p) % max_alignment, 0U) << "op " << op;
        ASSERT_EQ(last.ptr_, p) << "op " << op << ": no malloc-post event for the block";
        ASSERT_GE(last.rounded_, bytes) << "op " << op;
        ASSERT_TRUE(ranges.insert(p, bytes))
            << "op " << op << ": [" << p << ", +" << bytes << ") overlaps a live block";
        ASSERT_TRUE(model.on_allocate(p, bytes, last.rounded_, alignment)) << "op " << op;
        auto* bytes_p = static_cast<unsigned char*>(p);
        bytes_p[0] = tag_of(p, bytes);
        bytes_p[bytes - 1] = tag_of(p, bytes);
        live.push_back(p);
        ++allocs;
      }
    } else {
      const std::size_t i = rng() % live.size();
      void* p = live[i];
      live[i] = live.back();
      live.pop_back();
      const model_block b = model.on_deallocate(p);
      const auto* bytes_p = static_cast<const unsigned char*>(p);
      ASSERT_EQ(bytes_p[0], tag_of(p, b.requested))
          << "op " << op << ": block " << p << " was overwritten";
      ASSERT_EQ(bytes_p[b.requested - 1], tag_of(p, b.requested))
          << "op " << op << ": block " << p << " was overwritten";
      ASSERT_TRUE(ranges.erase(p));
      a.deallocate({}, p, b.requested, b.alignment);
      ++frees;
    }
    const auto s = a.stats();
    ASSERT_TRUE(model.matches(s)) << "op " << op;
    ASSERT_EQ(s.invalid_frees, 0U) << "op " << op;
    if (op % 1024 == 0) {
      ASSERT_EQ(host->allocated_bytes(), s.reserved) << "op " << op;
      ASSERT_LE(s.in_use + s.cached_bytes, s.reserved) << "op " << op;
    }
  }

  a.set_limit(SIZE_MAX);
  for (void* p : live) {
    const model_block b = model.on_deallocate(p);
    a.deallocate({}, p, b.requested, b.alignment);
  }
  ASSERT_TRUE(model.matches(a.stats()));
  a.release_cached();
  const auto s = a.stats();
  EXPECT_EQ(s.in_use, 0U);
  EXPECT_EQ(s.reserved, 0U);
  EXPECT_EQ(host->allocated_bytes(), 0U);
  EXPECT_GT(allocs, ops / 3);
  std::cout << "[          ] " << ops << " ops: " << allocs << " allocations, " << frees
            << " frees, " << limit_failures << " refused by a limit, " << releases << " releases, "
            << limit_changes << " limit changes; peak in use " << s.peak_in_use
            << ", peak reserved " << s.peak_reserved << ", upstream calls " << s.upstream_allocs
            << "\n";
}

}  // namespace
}  // namespace poolscope::pool::testing
