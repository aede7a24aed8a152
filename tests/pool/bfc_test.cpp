// bfc_allocator's own behaviour (the common contract is in conformance_suite.hpp): splitting,
// merging with each neighbour and never across segments, exact fragmentation figures, what
// release_cached gives back, the limit, the upstream-exhaustion retry, segment consolidation,
// small requests borrowing large chunks, invalid frees, the A5 reserved/requested ratio, a
// randomized run against a model with the internal consistency check after every batch, and the
// pool lock's bias towards a lone thread.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "hooks/recording_hook.hpp"
#include "pool/model.hpp"
#include "poolscope/error.hpp"
#include "poolscope/hooks/hook.hpp"
#include "poolscope/log.hpp"
#include "poolscope/pool/bfc_allocator.hpp"
#include "poolscope/pool/factory.hpp"
#include "poolscope/pool/host_resource.hpp"

namespace poolscope::pool::testing {
namespace {

using hooks::event_kind;
using hooks::event_phase;
using hooks::free_error;
using poolscope::testing::recording_hook;

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;

/// Options with 1 MiB small segments, so small-pool tests reason about one known segment size.
bfc_options one_mib_small_segments() {
  bfc_options o;
  o.small_segment_bytes = MiB;
  return o;
}

char* at(void* base, std::size_t offset) {
  return static_cast<char*>(base) + offset;
}

/// Hands out consecutive slices of one buffer, so two segments can be adjacent in memory.
/// Thread-safe enough for single-threaded tests only.
class arena_resource final : public resource {
 public:
  explicit arena_resource(std::size_t bytes)
      : size_(bytes), base_(static_cast<char*>(std::aligned_alloc(4096, bytes))) {}
  ~arena_resource() override { std::free(base_); }
  [[nodiscard]] char* base() const { return base_; }
  [[nodiscard]] std::size_t allocated_bytes() const { return allocated_; }

 private:
  void* do_try_allocate(stream_view /*stream*/, std::size_t bytes) override {
    if (used_ + bytes > size_) {
      return nullptr;
    }
    char* p = base_ + used_;
    used_ += bytes;
    allocated_ += bytes;
    return p;
  }
  void do_deallocate(stream_view /*stream*/, void* /*ptr*/, std::size_t bytes) noexcept override {
    allocated_ -= bytes;
  }
  [[nodiscard]] int do_device() const noexcept override { return -1; }
  [[nodiscard]] memory_kind do_kind() const noexcept override { return memory_kind::host; }
  [[nodiscard]] std::string do_name() const override { return "arena"; }

  std::size_t size_;
  char* base_;
  std::size_t used_ = 0;
  std::size_t allocated_ = 0;
};

/// Silences the invalid-free warnings of a test and counts them.
class captured_log {
 public:
  captured_log() : previous_(get_log_level()) {
    set_log_level(log_level::warn);
    set_log_sink([this](log_level, std::string_view message) {
      std::lock_guard lock(mutex_);
      messages_.emplace_back(message);
    });
  }
  captured_log(const captured_log&) = delete;
  captured_log& operator=(const captured_log&) = delete;
  ~captured_log() {
    set_log_sink({});
    set_log_level(previous_);
  }
  std::vector<std::string> messages() {
    std::lock_guard lock(mutex_);
    return messages_;
  }

 private:
  log_level previous_;
  std::mutex mutex_;
  std::vector<std::string> messages_;
};

// ---- splitting and merging ------------------------------------------------------------------

TEST(bfc_split, a_segment_serves_a_request_and_keeps_the_remainder_free) {
  host_resource host;
  bfc_allocator pool{host, one_mib_small_segments()};
  recording_hook rec{pool.id()};
  hooks::scoped_hook on{rec, hooks::scope::thread};

  void* p = pool.allocate({}, 256 * KiB);
  ASSERT_NE(p, nullptr);
  const auto splits = rec.of(event_kind::split, event_phase::instant);
  ASSERT_EQ(splits.size(), 1U);
  EXPECT_EQ(splits[0].ptr, p);
  EXPECT_EQ(splits[0].rounded, 256 * KiB);
  EXPECT_EQ(splits[0].aux_ptr, at(p, 256 * KiB));
  EXPECT_EQ(splits[0].aux_bytes, 768 * KiB);

  const auto s = pool.stats();
  EXPECT_EQ(s.reserved, MiB);
  EXPECT_EQ(s.upstream_allocs, 1U);
  EXPECT_EQ(s.in_use, 256 * KiB);
  EXPECT_EQ(s.cached_blocks, 1U);
  EXPECT_EQ(s.cached_bytes, 768 * KiB);
  EXPECT_EQ(s.largest_free_block, 768 * KiB);
  const auto segs = pool.segments();
  ASSERT_EQ(segs.size(), 1U);
  EXPECT_EQ(segs[0].base, p);
  EXPECT_EQ(segs[0].bytes, MiB);
  ASSERT_EQ(segs[0].chunks.size(), 2U);
  EXPECT_FALSE(segs[0].chunks[0].free);
  EXPECT_EQ(segs[0].chunks[0].requested, 256 * KiB);
  EXPECT_TRUE(segs[0].chunks[1].free);

  // The remainder serves the next request without an upstream call: a second split.
  void* q = pool.allocate({}, 1000);
  EXPECT_EQ(q, at(p, 256 * KiB));
  const auto splits2 = rec.of(event_kind::split, event_phase::instant);
  ASSERT_EQ(splits2.size(), 2U);
  EXPECT_EQ(splits2[1].rounded, 1024U);
  EXPECT_EQ(splits2[1].aux_bytes, 768 * KiB - 1024);
  EXPECT_EQ(pool.stats().upstream_allocs, 1U);
  EXPECT_EQ(pool.stats().in_use, 256 * KiB + 1024);

  pool.deallocate({}, q, 1000);
  pool.deallocate({}, p, 256 * KiB);
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(bfc_split, an_exact_fit_does_not_split) {
  host_resource host;
  bfc_allocator pool{host, one_mib_small_segments()};
  recording_hook rec{pool.id()};
  hooks::scoped_hook on{rec, hooks::scope::thread};
  void* p = pool.allocate({}, MiB);  // exactly one small segment
  EXPECT_TRUE(rec.of(event_kind::split, event_phase::instant).empty());
  EXPECT_EQ(pool.stats().cached_blocks, 0U);
  pool.deallocate({}, p, MiB);
  EXPECT_TRUE(rec.of(event_kind::merge, event_phase::instant).empty());
  EXPECT_EQ(pool.stats().cached_blocks, 1U);
}

/// Four 256 KiB blocks filling one 1 MiB segment, with a hook recording merges.
class bfc_merge : public ::testing::Test {
 protected:
  void SetUp() override {
    for (auto& b : blocks_) {
      b = pool_.allocate({}, 256 * KiB);
    }
    ASSERT_EQ(pool_.stats().reserved, MiB);
    for (std::size_t i = 1; i < 4; ++i) {
      ASSERT_EQ(blocks_[i], at(blocks_[0], i * 256 * KiB));
    }
    on_ = std::make_unique<hooks::scoped_hook>(rec_, hooks::scope::thread);
  }
  void TearDown() override {
    on_.reset();
    EXPECT_EQ(pool_.check_invariants(), "");
  }
  std::vector<hooks::event> merges() const {
    return rec_.of(event_kind::merge, event_phase::instant);
  }

  host_resource host_;
  bfc_allocator pool_{host_, one_mib_small_segments()};
  recording_hook rec_{pool_.id()};
  std::unique_ptr<hooks::scoped_hook> on_;
  void* blocks_[4] = {};
};

TEST_F(bfc_merge, with_the_previous_chunk) {
  pool_.deallocate({}, blocks_[1], 256 * KiB);
  EXPECT_TRUE(merges().empty());  // both neighbours live
  pool_.deallocate({}, blocks_[2], 256 * KiB);
  const auto m = merges();
  ASSERT_EQ(m.size(), 1U);
  EXPECT_EQ(m[0].ptr, blocks_[1]);  // the result starts at the previous chunk
  EXPECT_EQ(m[0].rounded, 512 * KiB);
  EXPECT_EQ(m[0].aux_ptr, blocks_[1]);  // the absorbed neighbour
  EXPECT_EQ(m[0].aux_bytes, 256 * KiB);
  const auto s = pool_.stats();
  EXPECT_EQ(s.cached_blocks, 1U);
  EXPECT_EQ(s.largest_free_block, 512 * KiB);
  pool_.deallocate({}, blocks_[0], 256 * KiB);
  pool_.deallocate({}, blocks_[3], 256 * KiB);
}

TEST_F(bfc_merge, with_the_next_chunk) {
  pool_.deallocate({}, blocks_[2], 256 * KiB);
  pool_.deallocate({}, blocks_[1], 256 * KiB);
  const auto m = merges();
  ASSERT_EQ(m.size(), 1U);
  EXPECT_EQ(m[0].ptr, blocks_[1]);
  EXPECT_EQ(m[0].rounded, 512 * KiB);
  EXPECT_EQ(m[0].aux_ptr, blocks_[2]);
  EXPECT_EQ(m[0].aux_bytes, 256 * KiB);
  EXPECT_EQ(pool_.stats().cached_blocks, 1U);
  EXPECT_EQ(pool_.stats().largest_free_block, 512 * KiB);
  pool_.deallocate({}, blocks_[0], 256 * KiB);
  pool_.deallocate({}, blocks_[3], 256 * KiB);
}

TEST_F(bfc_merge, with_both_neighbours_into_one_whole_segment_chunk) {
  pool_.deallocate({}, blocks_[0], 256 * KiB);
  pool_.deallocate({}, blocks_[2], 256 * KiB);
  pool_.deallocate({}, blocks_[3], 256 * KiB);  // merges with 2
  EXPECT_EQ(pool_.stats().cached_blocks, 2U);
  rec_.clear();
  pool_.deallocate({}, blocks_[1], 256 * KiB);  // merges with 0 below and 2+3 above
  const auto m = merges();
  ASSERT_EQ(m.size(), 2U);
  EXPECT_EQ(m[0].ptr, blocks_[0]);
  EXPECT_EQ(m[0].rounded, 512 * KiB);
  EXPECT_EQ(m[0].aux_ptr, blocks_[0]);
  EXPECT_EQ(m[1].ptr, blocks_[0]);
  EXPECT_EQ(m[1].rounded, MiB);
  EXPECT_EQ(m[1].aux_ptr, blocks_[2]);
  EXPECT_EQ(m[1].aux_bytes, 512 * KiB);
  const auto s = pool_.stats();
  EXPECT_EQ(s.cached_blocks, 1U);
  EXPECT_EQ(s.cached_bytes, MiB);
  EXPECT_EQ(s.largest_free_block, MiB);
  EXPECT_EQ(s.fragmentation, 0.0);
  const auto segs = pool_.segments();
  ASSERT_EQ(segs.size(), 1U);
  ASSERT_EQ(segs[0].chunks.size(), 1U);
  EXPECT_TRUE(segs[0].chunks[0].free);
}

TEST(bfc_merge_segments, adjacent_segments_never_merge) {
  arena_resource arena{8 * MiB};
  {
    bfc_allocator pool{arena, one_mib_small_segments()};
    // Each request fills a whole 1 MiB small segment: two segments, adjacent in the arena.
    void* a = pool.allocate({}, MiB);
    void* b = pool.allocate({}, MiB);
    ASSERT_EQ(a, arena.base());
    ASSERT_EQ(b, arena.base() + MiB);
    recording_hook rec{pool.id()};
    hooks::scoped_hook on{rec, hooks::scope::thread};
    pool.deallocate({}, a, MiB);
    pool.deallocate({}, b, MiB);
    EXPECT_TRUE(rec.of(event_kind::merge, event_phase::instant).empty());
    const auto s = pool.stats();
    EXPECT_EQ(s.cached_blocks, 2U);
    EXPECT_EQ(s.cached_bytes, 2 * MiB);
    EXPECT_EQ(s.largest_free_block, MiB);  // not 2 MiB: the chunks are in different segments
    EXPECT_DOUBLE_EQ(s.fragmentation, 0.5);
    const auto segs = pool.segments();
    ASSERT_EQ(segs.size(), 2U);
    EXPECT_EQ(segs[0].chunks.size(), 1U);
    EXPECT_EQ(segs[1].chunks.size(), 1U);

    // A block spanning both would need a merge across segments: it gets a new segment instead.
    void* c = pool.allocate({}, MiB + 512 * KiB);
    EXPECT_EQ(c, arena.base() + 2 * MiB);
    EXPECT_EQ(pool.check_invariants(), "");
    pool.deallocate({}, c, MiB + 512 * KiB);
  }
  EXPECT_EQ(arena.allocated_bytes(), 0U);
}

// ---- cache figures and release ---------------------------------------------------------------

TEST(bfc_fragmentation, figures_of_a_known_hole_pattern_are_exact) {
  host_resource host;
  bfc_allocator pool{host, one_mib_small_segments()};
  std::vector<void*> b(8);
  for (auto& p : b) {
    p = pool.allocate({}, 128 * KiB);
  }
  // Holes: [1] (128 KiB), [3..5] (384 KiB after two merges), [7] (128 KiB).
  for (int i : {1, 3, 5, 4, 7}) {
    pool.deallocate({}, b[static_cast<std::size_t>(i)], 128 * KiB);
  }
  const auto s = pool.stats();
  EXPECT_EQ(s.cached_blocks, 3U);
  EXPECT_EQ(s.cached_bytes, 640 * KiB);
  EXPECT_EQ(s.largest_free_block, 384 * KiB);
  EXPECT_DOUBLE_EQ(s.fragmentation, 1.0 - 384.0 / 640.0);
  EXPECT_EQ(s.in_use, 384 * KiB);
  EXPECT_EQ(s.reserved, s.in_use + s.cached_bytes);

  // Best fit: 100 KiB goes to a 128 KiB hole, not the 384 KiB one.
  void* p = pool.allocate({}, 100 * KiB);
  EXPECT_TRUE(p == b[1] || p == b[7]);
  // 200 KiB goes into the 384 KiB hole, at its start.
  void* q = pool.allocate({}, 200 * KiB);
  EXPECT_EQ(q, b[3]);
  EXPECT_EQ(pool.stats().upstream_allocs, 1U);
  EXPECT_EQ(pool.check_invariants(), "");
  pool.deallocate({}, p, 100 * KiB);
  pool.deallocate({}, q, 200 * KiB);
  for (int i : {0, 2, 6}) {
    pool.deallocate({}, b[static_cast<std::size_t>(i)], 128 * KiB);
  }
  EXPECT_EQ(pool.stats().cached_blocks, 1U);
}

TEST(bfc_release, release_cached_returns_only_wholly_free_segments) {
  host_resource host;
  bfc_allocator pool{host, one_mib_small_segments()};
  void* a = pool.allocate({}, MiB);        // segment A, whole
  void* b = pool.allocate({}, 512 * KiB);  // segment B, half used
  pool.deallocate({}, a, MiB);
  ASSERT_EQ(pool.stats().reserved, 2 * MiB);
  EXPECT_EQ(pool.release_cached(), MiB);
  auto s = pool.stats();
  EXPECT_EQ(s.reserved, MiB);
  EXPECT_EQ(s.upstream_frees, 1U);
  EXPECT_EQ(s.cached_bytes, 512 * KiB);  // B's free half stays cached
  EXPECT_EQ(host.allocated_bytes(), MiB);
  std::memset(b, 0x5a, 512 * KiB);  // still usable
  EXPECT_EQ(pool.check_invariants(), "");
  EXPECT_EQ(pool.release_cached(), 0U);  // nothing wholly free
  pool.deallocate({}, b, 512 * KiB);
  EXPECT_EQ(pool.release_cached(), MiB);
  s = pool.stats();
  EXPECT_EQ(s.reserved, 0U);
  EXPECT_EQ(s.cached_blocks, 0U);
  EXPECT_EQ(host.allocated_bytes(), 0U);
  EXPECT_TRUE(pool.segments().empty());
  // The pool works after being emptied.
  void* c = pool.allocate({}, 4096);
  pool.deallocate({}, c, 4096);
  EXPECT_EQ(pool.check_invariants(), "");
}

// ---- limit and upstream exhaustion -----------------------------------------------------------

TEST(bfc_limit, segments_shrink_to_fit_the_limit_then_requests_fail) {
  host_resource host;
  bfc_allocator pool{host};  // 2 MiB small segments
  pool.set_limit(3 * MiB);
  void* a = pool.allocate({}, MiB);
  void* b = pool.allocate({}, MiB);  // the same 2 MiB segment
  EXPECT_EQ(pool.stats().reserved, 2 * MiB);
  // A third 1 MiB fits the in-use limit; a 2 MiB segment would not fit the reserved limit, so
  // the pool takes an exact 1 MiB segment.
  void* c = pool.allocate({}, MiB);
  auto s = pool.stats();
  EXPECT_EQ(s.reserved, 3 * MiB);
  EXPECT_EQ(s.limit_hits, 0U);
  EXPECT_THROW((void)pool.allocate({}, 512), out_of_memory);
  s = pool.stats();
  EXPECT_EQ(s.oom_count, 1U);
  EXPECT_EQ(s.limit_hits, 1U);
  EXPECT_EQ(s.in_use, 3 * MiB);
  pool.deallocate({}, b, MiB);
  // Room in the cache again: served without upstream.
  void* d = pool.allocate({}, 700 * KiB);
  EXPECT_EQ(pool.stats().upstream_allocs, 2U);
  try {
    (void)pool.allocate({}, 600 * KiB);  // in use would be 3.3 MiB
    ADD_FAILURE() << "no out_of_memory";
  } catch (const out_of_memory& e) {
    EXPECT_NE(e.cause().find("limit"), std::string::npos) << e.cause();
  }
  pool.set_limit(SIZE_MAX);
  void* e = pool.allocate({}, 600 * KiB);
  EXPECT_EQ(pool.check_invariants(), "");
  for (auto [p, n] : {std::pair{a, MiB}, {c, MiB}, {d, 700 * KiB}, {e, 600 * KiB}}) {
    pool.deallocate({}, p, n);
  }
}

TEST(bfc_limit, reserved_limit_is_reported_when_no_segment_fits) {
  host_resource host;
  bfc_allocator pool{host};
  void* a = pool.allocate({}, MiB);
  void* b = pool.allocate({}, MiB);  // a and b share one 2 MiB small segment
  pool.deallocate({}, a, MiB);       // a 1 MiB hole in a segment that stays in use
  pool.set_limit(2 * MiB + 512 * KiB);
  // In use would be 2.5 MiB: allowed. But no free chunk fits 1.5 MiB and any new segment would
  // take reserved bytes past the limit.
  try {
    (void)pool.allocate({}, MiB + 512 * KiB);
    ADD_FAILURE() << "no out_of_memory";
  } catch (const out_of_memory& e) {
    EXPECT_NE(e.cause().find("reserved"), std::string::npos) << e.cause();
    EXPECT_EQ(e.context().largest_free_block, MiB);
  }
  const auto s = pool.stats();
  EXPECT_EQ(s.reserved, 2 * MiB);
  EXPECT_GE(s.limit_hits, 1U);
  EXPECT_EQ(s.upstream_failures, 0U);  // the limit refused, not the resource
  EXPECT_EQ(s.oom_count, 1U);
  void* c = pool.allocate({}, MiB);  // the hole still serves what fits
  pool.deallocate({}, b, MiB);
  pool.deallocate({}, c, MiB);
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(bfc_oom, exhausted_upstream_releases_cached_segments_and_retries) {
  host_resource host{4 * MiB};
  bfc_options o;
  o.small_borrows_large = false;  // make the small request need its own segment
  bfc_allocator pool{host, o};
  void* big = pool.allocate({}, 4 * MiB);
  pool.deallocate({}, big, 4 * MiB);  // a wholly free large segment, cached
  ASSERT_EQ(host.allocated_bytes(), 4 * MiB);
  recording_hook rec{pool.id()};
  hooks::scoped_hook on{rec, hooks::scope::thread};
  void* p = pool.allocate({}, KiB);
  ASSERT_NE(p, nullptr);
  const auto s = pool.stats();
  EXPECT_EQ(s.upstream_failures, 2U);  // the 2 MiB segment, then an exact 1 KiB one
  EXPECT_EQ(s.upstream_frees, 1U);     // the cached 4 MiB segment
  EXPECT_EQ(s.reserved, 2 * MiB);      // the retry got a whole small segment
  EXPECT_EQ(s.oom_count, 0U);
  EXPECT_EQ(rec.of(event_kind::release, event_phase::post).size(), 1U);
  EXPECT_EQ(host.allocated_bytes(), 2 * MiB);
  pool.deallocate({}, p, KiB);
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(bfc_oom, a_large_request_falls_back_to_an_exact_segment) {
  host_resource host{5 * MiB + 512 * KiB};
  bfc_allocator pool{host};
  std::vector<void*> small;
  for (int i = 0; i < 4; ++i) {
    small.push_back(pool.allocate({}, MiB));  // two full 2 MiB small segments
  }
  ASSERT_EQ(pool.stats().reserved, 4 * MiB);
  EXPECT_THROW((void)pool.allocate({}, 2 * MiB), out_of_memory);  // 1.5 MiB left upstream
  // A 2 MiB-rounded segment does not fit what is left; the exact size does.
  void* p = pool.allocate({}, MiB + 256 * KiB);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(pool.stats().reserved, 5 * MiB + 256 * KiB);
  pool.deallocate({}, p, MiB + 256 * KiB);
  for (void* q : small) {
    pool.deallocate({}, q, MiB);
  }
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(bfc_oom, out_of_memory_leaves_the_pool_consistent_and_usable) {
  host_resource host{8 * MiB};
  bfc_allocator pool{host};
  void* a = pool.allocate({}, 6 * MiB);
  try {
    (void)pool.allocate({}, 4 * MiB);
    ADD_FAILURE() << "no out_of_memory";
  } catch (const out_of_memory& e) {
    EXPECT_EQ(e.requested(), 4 * MiB);
    EXPECT_EQ(e.context().reserved, 6 * MiB);
    EXPECT_EQ(e.context().in_use, 6 * MiB);
  }
  EXPECT_EQ(pool.check_invariants(), "");
  pool.deallocate({}, a, 6 * MiB);
  // The cached 6 MiB segment is too small: it is given back before an 8 MiB (7 MiB rounded to
  // 2 MiB) segment is taken, so the two never need to fit upstream together.
  void* b = pool.allocate({}, 7 * MiB);
  EXPECT_EQ(pool.stats().reserved, 8 * MiB);
  EXPECT_EQ(pool.stats().peak_reserved, 8 * MiB);
  pool.deallocate({}, b, 7 * MiB);
  EXPECT_EQ(pool.check_invariants(), "");
}

// ---- consolidation and borrowing --------------------------------------------------------------

TEST(bfc_consolidate, wholly_free_large_segments_are_merged_into_one) {
  host_resource host;
  bfc_allocator pool{host};
  void* a = pool.allocate({}, 12 * MiB);  // > 10 MiB: own segments, rounded to 2 MiB
  void* b = pool.allocate({}, 14 * MiB);
  ASSERT_EQ(pool.segments().size(), 2U);
  pool.deallocate({}, a, 12 * MiB);
  pool.deallocate({}, b, 14 * MiB);
  // 20 MiB fits neither; the two free segments become one of 26 MiB instead of a third.
  void* c = pool.allocate({}, 20 * MiB);
  auto s = pool.stats();
  EXPECT_EQ(s.reserved, 26 * MiB);
  EXPECT_EQ(s.peak_reserved, 26 * MiB);  // never held the old and the new at once
  EXPECT_EQ(s.upstream_frees, 2U);
  EXPECT_EQ(s.upstream_allocs, 3U);
  const auto segs = pool.segments();
  ASSERT_EQ(segs.size(), 1U);
  EXPECT_EQ(segs[0].bytes, 26 * MiB);
  ASSERT_EQ(segs[0].chunks.size(), 2U);
  EXPECT_EQ(segs[0].chunks[0].ptr, c);
  EXPECT_TRUE(segs[0].chunks[1].free);
  EXPECT_EQ(segs[0].chunks[1].bytes, 6 * MiB);
  // Afterwards both old sizes fit in the one segment at once.
  pool.deallocate({}, c, 20 * MiB);
  void* d = pool.allocate({}, 12 * MiB);
  void* e = pool.allocate({}, 14 * MiB);
  EXPECT_EQ(pool.stats().upstream_allocs, 3U);
  pool.deallocate({}, d, 12 * MiB);
  pool.deallocate({}, e, 14 * MiB);
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(bfc_consolidate, a_single_too_small_free_segment_is_replaced_not_kept) {
  host_resource host;
  bfc_allocator pool{host};
  void* a = pool.allocate({}, 12 * MiB);
  pool.deallocate({}, a, 12 * MiB);
  void* b = pool.allocate({}, 16 * MiB);
  const auto s = pool.stats();
  EXPECT_EQ(s.reserved, 16 * MiB);  // not 28
  EXPECT_EQ(s.peak_reserved, 16 * MiB);
  EXPECT_EQ(s.upstream_frees, 1U);
  pool.deallocate({}, b, 16 * MiB);
}

TEST(bfc_consolidate, without_consolidation_segments_accumulate) {
  host_resource host;
  bfc_options o;
  o.consolidate = false;
  bfc_allocator pool{host, o};
  void* a = pool.allocate({}, 12 * MiB);
  pool.deallocate({}, a, 12 * MiB);
  void* b = pool.allocate({}, 16 * MiB);
  EXPECT_EQ(pool.stats().reserved, 28 * MiB);
  pool.deallocate({}, b, 16 * MiB);
}

TEST(bfc_borrow, small_requests_use_free_large_chunks_before_a_new_segment) {
  host_resource host;
  bfc_allocator pool{host};
  void* big = pool.allocate({}, 12 * MiB);
  pool.deallocate({}, big, 12 * MiB);
  void* p = pool.allocate({}, 4 * KiB);
  EXPECT_EQ(p, big);  // carved from the large segment
  EXPECT_EQ(pool.stats().upstream_allocs, 1U);
  pool.deallocate({}, p, 4 * KiB);
  EXPECT_EQ(pool.stats().cached_blocks, 1U);

  bfc_options o;
  o.small_borrows_large = false;
  bfc_allocator strict{host, o};
  void* big2 = strict.allocate({}, 12 * MiB);
  strict.deallocate({}, big2, 12 * MiB);
  void* q = strict.allocate({}, 4 * KiB);
  EXPECT_EQ(strict.stats().upstream_allocs, 2U);  // a small segment of its own
  EXPECT_EQ(strict.stats().reserved, 14 * MiB);
  strict.deallocate({}, q, 4 * KiB);
  EXPECT_EQ(pool.check_invariants(), "");
  EXPECT_EQ(strict.check_invariants(), "");
}

TEST(bfc_segments, mid_size_requests_share_segments_sized_to_the_pool) {
  host_resource host;
  bfc_allocator pool{host};
  // An empty pool takes a mid-size request's segment at its 2 MiB-rounded size...
  void* a = pool.allocate({}, 3 * MiB);
  EXPECT_EQ(pool.stats().reserved, 4 * MiB);
  // ...and a pool holding 200 MiB takes 20 MiB segments that several requests share.
  void* big = pool.allocate({}, 196 * MiB);
  void* b = pool.allocate({}, 5 * MiB);
  EXPECT_EQ(pool.stats().reserved, 220 * MiB);
  void* c = pool.allocate({}, 5 * MiB);
  EXPECT_EQ(pool.stats().upstream_allocs, 3U);
  for (auto [p, n] : {std::pair{a, 3 * MiB}, {big, 196 * MiB}, {b, 5 * MiB}, {c, 5 * MiB}}) {
    pool.deallocate({}, p, n);
  }
  EXPECT_EQ(pool.check_invariants(), "");
}

// ---- invalid frees ------------------------------------------------------------------------------

TEST(bfc_invalid_free, each_kind_is_reported_and_leaves_the_pool_right) {
  captured_log log;
  host_resource host;
  bfc_allocator pool{host, one_mib_small_segments()};
  recording_hook rec{pool.id()};
  hooks::scoped_hook on{rec, hooks::scope::thread};
  void* a = pool.allocate({}, 4096);
  void* b = pool.allocate({}, 1000);
  void* c = pool.allocate({}, 8192);
  auto expect_state = [&](std::size_t in_use, std::size_t requested) {
    const auto s = pool.stats();
    EXPECT_EQ(s.in_use, in_use);
    EXPECT_EQ(s.requested_in_use, requested);
    EXPECT_EQ(s.reserved, s.in_use + s.cached_bytes);
    EXPECT_EQ(pool.check_invariants(), "");
  };
  auto last_error = [&] {
    const auto e = rec.of(event_kind::invalid_free, event_phase::instant);
    return e.empty() ? free_error::none : e.back().error;
  };

  int stranger = 0;
  pool.deallocate({}, &stranger, sizeof stranger);
  EXPECT_EQ(last_error(), free_error::unknown_pointer);
  expect_state(4096 + 1024 + 8192, 4096 + 1000 + 8192);

  pool.deallocate({}, at(a, 512), 512);  // interior pointer of a live block
  EXPECT_EQ(last_error(), free_error::unknown_pointer);
  expect_state(4096 + 1024 + 8192, 4096 + 1000 + 8192);

  pool.deallocate({}, b, 1000);
  pool.deallocate({}, b, 1000);  // b's chunk is free and not merged (a and c are live)
  EXPECT_EQ(last_error(), free_error::double_free);
  expect_state(4096 + 8192, 4096 + 8192);

  pool.deallocate({}, c, 100);  // wrong size: freed with its true size
  EXPECT_EQ(last_error(), free_error::size_mismatch);
  expect_state(4096, 4096);
  pool.deallocate({}, a, 4096 - 511);  // same 512-rounding: accepted
  expect_state(0, 0);

  const auto s = pool.stats();
  EXPECT_EQ(s.invalid_frees, 4U);
  EXPECT_EQ(s.deallocations, 3U);
  EXPECT_EQ(s.cached_blocks, 1U);  // everything merged back into one segment
  EXPECT_EQ(log.messages().size(), 4U);
  void* d = pool.allocate({}, 64 * KiB);  // still usable
  EXPECT_EQ(d, a);
  pool.deallocate({}, d, 64 * KiB);
}

TEST(bfc_options_check, inconsistent_options_are_rejected_naming_the_field) {
  host_resource host;
  auto expect_rejected = [&](bfc_options o, const char* field) {
    try {
      bfc_allocator pool{host, o};
      ADD_FAILURE() << field << " accepted";
    } catch (const invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  bfc_options o;
  o.small_segment_bytes = 1000;
  expect_rejected(o, "small_segment_bytes");
  o = {};
  o.small_segment_bytes = 512 * KiB;  // below small_request_max
  expect_rejected(o, "small_segment_bytes");
  o = {};
  o.mid_segment_bytes = 8 * MiB;  // below mid_request_max
  expect_rejected(o, "mid_segment_bytes");
  o = {};
  o.large_round_bytes = 0;
  expect_rejected(o, "large_round_bytes");
  o = {};
  o.mid_request_max = 512 * KiB;
  expect_rejected(o, "mid_request_max");
}

TEST(bfc_factory, builds_a_bfc_allocator_by_name) {
  host_resource host;
  // By default behind a per-thread cache, under the strategy's name.
  auto a = make_allocator("bfc", host);
  auto* cached = dynamic_cast<thread_cache_adaptor*>(a.get());
  ASSERT_NE(cached, nullptr);
  EXPECT_NE(dynamic_cast<bfc_allocator*>(&cached->inner()), nullptr);
  EXPECT_EQ(a->name(), "bfc/host");
  EXPECT_EQ(cached->options().max_block_bytes, bfc_options{}.small_request_max)
      << "the cache in front of bfc keeps small requests only";
  auto bare = make_allocator("bfc", host, {.thread_cache = false});
  EXPECT_NE(dynamic_cast<bfc_allocator*>(bare.get()), nullptr);
  EXPECT_EQ(bare->name(), "bfc/host");
}

TEST(bfc_destroy, destruction_returns_every_segment_even_with_live_blocks) {
  host_resource host;
  {
    bfc_allocator pool{host};
    (void)pool.allocate({}, 100);
    (void)pool.allocate({}, 30 * MiB);
    void* c = pool.allocate({}, 5 * MiB);
    pool.deallocate({}, c, 5 * MiB);
    EXPECT_GT(host.allocated_bytes(), 0U);
  }
  EXPECT_EQ(host.allocated_bytes(), 0U);
}

// ---- the A5 sequence-batch workload
// --------------------------------------------------------------

/// Replays docs/design.md §4's A5 shape (the bench's sequence_batch_trace: a transformer's steps at
/// random lengths) without touching the memory, and returns peak reserved / peak requested.
double sequence_batch_ratio(allocator& a, std::uint64_t seed, std::size_t steps, std::size_t layers,
                            std::size_t max_len) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::size_t> len(32, max_len);
  constexpr std::size_t batch = 4;
  constexpr std::size_t hidden = 1024;
  constexpr std::size_t heads = 8;
  constexpr std::size_t f32 = 4;
  struct blk {
    void* p;
    std::size_t n;
  };
  auto take = [&](std::size_t n) { return blk{a.allocate({}, n), n}; };
  auto give = [&](blk b) { a.deallocate({}, b.p, b.n); };
  std::vector<blk> weights;
  for (std::size_t l = 0; l < layers; ++l) {
    weights.push_back(take(12 * hidden * hidden * f32));
  }
  for (std::size_t step = 0; step < steps; ++step) {
    const std::size_t L = len(rng);
    const std::size_t act = batch * L * hidden * f32;
    const std::size_t scores = batch * heads * L * L * f32;
    std::vector<std::vector<blk>> kept(layers);
    for (auto& k : kept) {
      k.push_back(take(act));
      k.push_back(take(3 * act));
      const blk s = take(scores);
      k.push_back(take(scores));
      give(s);
      for (std::size_t m : {1, 1, 4, 4, 1}) {
        k.push_back(take(m * act));
      }
    }
    give(take(batch * L * f32));
    const blk grad = take(act);
    for (std::size_t l = layers; l-- > 0;) {
      give(take(4 * act));
      give(take(scores));
      for (auto it = kept[l].rbegin(); it != kept[l].rend(); ++it) {
        give(*it);
      }
    }
    give(grad);
  }
  for (const blk& w : weights) {
    give(w);
  }
  const auto s = a.stats();
  return static_cast<double>(s.peak_reserved) / static_cast<double>(s.peak_requested);
}

TEST(bfc_sequence_batches, peak_reserved_stays_within_ten_percent_of_peak_requested) {
  // Deterministic: the policy never looks at addresses. ~1-3 GiB of untouched host mappings.
  constexpr std::size_t max_len = 1024;
  for (std::uint64_t seed : {1, 2, 3}) {
    host_resource host;
    bfc_allocator pool{host};
    const double ratio = sequence_batch_ratio(pool, seed, 20, 4, max_len);
    EXPECT_LE(ratio, 1.10) << "seed " << seed;
    EXPECT_EQ(pool.check_invariants(), "");
    host_resource host2;
    bfc_options o;
    o.consolidate = false;
    bfc_allocator plain{host2, o};
    const double plain_ratio = sequence_batch_ratio(plain, seed, 20, 4, max_len);
    std::cout << "[          ] seed " << seed << ": peak reserved / peak requested " << ratio
              << " (without consolidation " << plain_ratio << ")\n";
    EXPECT_LT(ratio, plain_ratio) << "seed " << seed;
  }
}

// ---- randomized --------------------------------------------------------------------------------

TEST(bfc_random, operations_agree_with_a_model_and_keep_the_chunk_lists_consistent) {
  const std::uint64_t seed = test_seed();
  const std::uint64_t ops = env_count("POOLSCOPE_TEST_OPS", under_sanitizer ? 50'000 : 200'000);
  std::mt19937_64 rng(seed);
  host_resource host{std::size_t{384} << 20};  // a capacity, so exhaustion paths run too
  bfc_options o;
  o.small_borrows_large = (seed & 1) != 0;
  bfc_allocator pool{host, o};
  allocator_model model;
  interval_set ranges;
  std::vector<void*> live;
  auto tag = [](void* p, std::size_t n, std::uint8_t v) {
    static_cast<std::uint8_t*>(p)[0] = v;
    static_cast<std::uint8_t*>(p)[n - 1] = v;
  };
  auto tag_of = [](void* p) {
    return static_cast<std::uint8_t>(reinterpret_cast<std::uintptr_t>(p) >> 9);
  };
  auto draw_size = [&]() -> std::size_t {
    const auto r = rng() % 100;
    if (r < 70) {
      return log_uniform(rng, 1, 64 * KiB);
    }
    if (r < 95) {
      return log_uniform(rng, 64 * KiB, 4 * MiB);
    }
    return log_uniform(rng, 4 * MiB, 48 * MiB);
  };
  std::uint64_t ooms = 0;
  for (std::uint64_t i = 0; i < ops; ++i) {
    const bool do_alloc = live.empty() || (rng() % 100) < (live.size() < 400 ? 55U : 45U);
    if (do_alloc) {
      const std::size_t n = draw_size();
      const std::size_t align = std::size_t{1} << (rng() % 9);
      void* p = nullptr;
      try {
        p = pool.allocate({}, n, align);
      } catch (const out_of_memory&) {
        ++ooms;
        continue;
      }
      ASSERT_NE(p, nullptr);
      ASSERT_EQ(reinterpret_cast<std::uintptr_t>(p) % 256, 0U) << "op " << i;
      const std::size_t rounded = (n + 511) / 512 * 512;
      ASSERT_TRUE(ranges.insert(p, rounded)) << "op " << i << ": overlapping block at " << p;
      ASSERT_TRUE(model.on_allocate(p, n, rounded, align));
      tag(p, n, tag_of(p));
      live.push_back(p);
    } else {
      const std::size_t k = rng() % live.size();
      void* p = live[k];
      live[k] = live.back();
      live.pop_back();
      const std::size_t n = model.live().at(p).requested;
      ASSERT_EQ(static_cast<std::uint8_t*>(p)[0], tag_of(p)) << "op " << i << ": overwritten";
      ASSERT_EQ(static_cast<std::uint8_t*>(p)[n - 1], tag_of(p)) << "op " << i << ": overwritten";
      model.on_deallocate(p);
      ASSERT_TRUE(ranges.erase(p));
      pool.deallocate({}, p, n);
    }
    const auto s = pool.stats();
    ASSERT_TRUE(model.matches(s)) << "op " << i;
    ASSERT_EQ(s.reserved, s.in_use + s.cached_bytes) << "op " << i;
    ASSERT_EQ(s.reserved, host.allocated_bytes()) << "op " << i;
    if (i % 997 == 0) {
      ASSERT_EQ(pool.check_invariants(), "") << "op " << i;
    }
    if (i % 20011 == 0) {
      (void)pool.release_cached();
    }
  }
  ASSERT_EQ(pool.check_invariants(), "");
  for (void* p : live) {
    const std::size_t n = model.live().at(p).requested;
    pool.deallocate({}, p, n);
    model.on_deallocate(p);
  }
  const auto s = pool.stats();
  EXPECT_TRUE(model.matches(s));
  EXPECT_EQ(s.in_use, 0U);
  EXPECT_EQ(s.reserved, s.cached_bytes);
  EXPECT_EQ(pool.check_invariants(), "");
  pool.release_cached();
  EXPECT_EQ(host.allocated_bytes(), 0U);
  std::cout << "[          ] " << ops << " operations, " << ooms << " out_of_memory, "
            << s.upstream_allocs << " upstream allocations, " << s.upstream_frees
            << " upstream frees\n";
}

TEST(bfc_concurrency, threads_share_one_pool_without_losing_blocks) {
  const std::uint64_t seed = test_seed();
  const int threads = 4;
  const std::uint64_t ops = under_sanitizer ? 4000 : 40000;
  host_resource host;
  bfc_allocator pool{host};
  std::atomic<bool> failed{false};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      std::mt19937_64 rng(seed + static_cast<std::uint64_t>(t));
      std::vector<std::pair<void*, std::size_t>> mine;
      const auto mark = static_cast<std::uint8_t>(t + 1);
      for (std::uint64_t i = 0; i < ops && !failed; ++i) {
        if (mine.empty() || rng() % 2 == 0) {
          const std::size_t n = log_uniform(rng, 1, (rng() % 10 == 0) ? 16 * MiB : 256 * KiB);
          void* p = pool.allocate({}, n);
          std::memset(p, mark, std::min<std::size_t>(n, 64));
          mine.emplace_back(p, n);
        } else {
          const std::size_t k = rng() % mine.size();
          auto [p, n] = mine[k];
          mine[k] = mine.back();
          mine.pop_back();
          const auto* bytes = static_cast<const std::uint8_t*>(p);
          for (std::size_t j = 0; j < std::min<std::size_t>(n, 64); ++j) {
            if (bytes[j] != mark) {
              failed = true;
            }
          }
          pool.deallocate({}, p, n);
        }
        if (i % 5000 == 0 && t == 0) {
          (void)pool.stats();
          (void)pool.release_cached();
        }
      }
      for (auto [p, n] : mine) {
        pool.deallocate({}, p, n);
      }
    });
  }
  for (auto& w : workers) {
    w.join();
  }
  EXPECT_FALSE(failed) << "a block was written by another thread";
  const auto s = pool.stats();
  EXPECT_EQ(s.in_use, 0U);
  EXPECT_EQ(s.requested_in_use, 0U);
  EXPECT_EQ(s.allocations, s.deallocations);
  EXPECT_EQ(s.reserved, s.cached_bytes);
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(bfc_lock_bias, a_lone_thread_gets_the_pool_lock_and_another_threads_free_revokes_it) {
  if (!owner_bias_available()) {
    GTEST_SKIP() << "membarrier(2) private expedited is unavailable here (or under "
                    "ThreadSanitizer): the pool lock is never biased";
  }
  host_resource host;
  bfc_allocator pool{host};  // every request and free takes the pool lock
  void* kept = pool.allocate({}, 3000);
  EXPECT_FALSE(pool.lock_counts().biased);
  for (int i = 0; i < 200; ++i) {  // 1 + 400 lone entries: over the 256 needed
    void* p = pool.allocate({}, 1000 + 512 * static_cast<std::size_t>(i % 7));
    pool.deallocate({}, p, 1000 + 512 * static_cast<std::size_t>(i % 7));
  }
  EXPECT_TRUE(pool.lock_counts().biased);
  EXPECT_EQ(pool.lock_counts().revocations, 0U);
  std::thread([&] { pool.deallocate({}, kept, 3000); }).join();
  EXPECT_FALSE(pool.lock_counts().biased);
  EXPECT_EQ(pool.lock_counts().revocations, 1U);
  const auto s = pool.stats();
  EXPECT_EQ(s.in_use, 0U);
  EXPECT_EQ(s.allocations, 201U);
  EXPECT_EQ(s.deallocations, 201U);
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(bfc_lock_bias, off_by_option) {
  host_resource host;
  bfc_options o;
  o.lock_bias = false;
  bfc_allocator pool{host, o};
  for (int i = 0; i < 1000; ++i) {
    void* p = pool.allocate({}, 4096);
    pool.deallocate({}, p, 4096);
  }
  EXPECT_FALSE(pool.lock_counts().biased);
  std::thread([&] { pool.deallocate({}, pool.allocate({}, 4096), 4096); }).join();
  EXPECT_EQ(pool.lock_counts().revocations, 0U);
}

TEST(bfc_concurrency, a_thread_revoking_the_lock_bias_of_a_running_thread_loses_no_block) {
  // One thread runs alone long enough to get the pool lock's bias, again and again (256, 512,
  // ... lone entries); another frees blocks of the first and allocates its own after each such
  // run, revoking the bias while the first runs through it.
  const std::uint64_t seed = test_seed();
  const std::uint64_t ops = under_sanitizer ? 20000 : 200000;
  host_resource host;
  bfc_allocator pool{host};
  std::mutex handoff_mutex;
  std::vector<std::pair<void*, std::size_t>> handoff;  // the first thread's blocks, for the other
  std::atomic<std::uint64_t> progress{0};
  std::atomic<bool> done{false};
  std::atomic<bool> failed{false};
  std::thread first([&] {
    std::mt19937_64 rng(seed);
    std::vector<std::pair<void*, std::size_t>> mine;
    // At least `ops`, and on until the bias was revoked three times (however the threads are
    // scheduled), within ten times that.
    const auto more = [&](std::uint64_t i) {
      return i < ops ||
             (owner_bias_available() && pool.lock_counts().revocations < 3 && i < 10 * ops);
    };
    for (std::uint64_t i = 0; more(i) && !failed; ++i) {
      if (mine.size() < 64 || rng() % 2 == 0) {
        const std::size_t n = log_uniform(rng, 1, 256 * KiB);
        void* p = pool.allocate({}, n);
        std::memset(p, 1, std::min<std::size_t>(n, 64));
        mine.emplace_back(p, n);
      } else {
        const std::size_t k = rng() % mine.size();
        const auto [p, n] = mine[k];
        mine[k] = mine.back();
        mine.pop_back();
        if (i % 997 == 0) {
          std::lock_guard lock(handoff_mutex);
          handoff.emplace_back(p, n);  // the other thread frees it
        } else {
          for (std::size_t j = 0; j < std::min<std::size_t>(n, 64); ++j) {
            if (static_cast<const std::uint8_t*>(p)[j] != 1) {
              failed = true;
            }
          }
          pool.deallocate({}, p, n);
        }
      }
      progress.store(i, std::memory_order_relaxed);
    }
    for (const auto& [p, n] : mine) {
      pool.deallocate({}, p, n);
    }
    done = true;
  });
  std::thread other([&] {
    std::mt19937_64 rng(seed + 1);
    std::uint64_t seen = 0;
    std::uint64_t interval = 600;  // doubled per visit, as the lone entries needed are
    while (!done) {
      if (progress.load(std::memory_order_relaxed) < seen + interval) {
        std::this_thread::yield();
        continue;
      }
      seen = progress.load(std::memory_order_relaxed);
      interval *= 2;
      std::vector<std::pair<void*, std::size_t>> take;
      {
        std::lock_guard lock(handoff_mutex);
        take.swap(handoff);
      }
      for (const auto& [p, n] : take) {
        pool.deallocate({}, p, n);
      }
      const std::size_t n = log_uniform(rng, 1, 256 * KiB);
      void* p = pool.allocate({}, n);
      std::memset(p, 2, std::min<std::size_t>(n, 64));
      for (std::size_t j = 0; j < std::min<std::size_t>(n, 64); ++j) {
        if (static_cast<const std::uint8_t*>(p)[j] != 2) {
          failed = true;
        }
      }
      pool.deallocate({}, p, n);
    }
  });
  first.join();
  other.join();
  for (const auto& [p, n] : handoff) {
    pool.deallocate({}, p, n);
  }
  EXPECT_FALSE(failed) << "a block was written by the other thread";
  const auto s = pool.stats();
  EXPECT_EQ(s.in_use, 0U);
  EXPECT_EQ(s.allocations, s.deallocations);
  EXPECT_EQ(pool.check_invariants(), "");
  if (owner_bias_available()) {
    EXPECT_GE(pool.lock_counts().revocations, 3U);
  }
  std::cout << "[          ] at least " << ops << " operations, " << pool.lock_counts().revocations
            << " revocations of the pool lock's bias\n";
}

// The pool's bookkeeping in its huge-page region (bfc_options::huge_page_metadata): one 2 MiB
// region by default, used as the pool grows; past it the heap serves, and the pool stays exact
// (the chunk lists' consistency check, every block back, stats at zero). Off: no region.
TEST(bfc_metadata, bookkeeping_fills_its_region_then_the_heap_and_stays_exact) {
  host_resource host;
  bfc_allocator pool{host};
  ASSERT_EQ(pool.metadata_region_bytes(), std::size_t{2} << 20)
      << "the region could not be mapped (no memory?)";
  const std::size_t at_start = pool.metadata_region_used();
  EXPECT_GT(at_start, 0U);  // the state itself
  // 40000 live 512-byte blocks: 40000 chunk nodes (64 bytes each) and a live table of 2^19
  // slots (16 bytes each) are well past 2 MiB.
  constexpr std::size_t blocks = 40000;
  std::vector<void*> live;
  live.reserve(blocks);
  std::size_t used_before = at_start;
  bool grew = false;
  for (std::size_t i = 0; i < blocks; ++i) {
    live.push_back(pool.allocate({}, 512));
    const std::size_t used = pool.metadata_region_used();
    EXPECT_GE(used, used_before);
    grew = grew || used > used_before;
    used_before = used;
  }
  EXPECT_TRUE(grew) << "nothing of the bookkeeping went to the region";
  EXPECT_LE(pool.metadata_region_used(), pool.metadata_region_bytes());
  EXPECT_EQ(pool.check_invariants(), "");
  // Disjoint, distinct blocks (a node or slot shared between region and heap would repeat one).
  std::vector<void*> sorted = live;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end());
  EXPECT_EQ(pool.stats().in_use, blocks * 512);
  for (std::size_t i = 0; i < blocks; i += 2) {
    pool.deallocate({}, live[i], 512);
  }
  EXPECT_EQ(pool.check_invariants(), "");
  for (std::size_t i = 1; i < blocks; i += 2) {
    pool.deallocate({}, live[i], 512);
  }
  EXPECT_EQ(pool.check_invariants(), "");
  EXPECT_EQ(pool.stats().in_use, 0U);

  bfc_options off;
  off.huge_page_metadata = false;
  bfc_allocator plain{host, off};
  EXPECT_EQ(plain.metadata_region_bytes(), 0U);
  EXPECT_EQ(plain.metadata_region_used(), 0U);
  void* p = plain.allocate({}, 1000);
  plain.deallocate({}, p, 1000);
  EXPECT_EQ(plain.check_invariants(), "");
}

}  // namespace
}  // namespace poolscope::pool::testing
