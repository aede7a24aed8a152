// stream_pool_allocator on the CPU: the cross-stream rule, lazy events, per-stream cache
// reporting, the short-of-memory path and hook attribution, checked with a manual event source
// whose events stay incomplete until the test completes them, and with a reference model of
// which memory each stream may touch. Host streams are plain keys.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "hooks/recording_hook.hpp"
#include "pool/model.hpp"
#include "poolscope/error.hpp"
#include "poolscope/hooks/hook.hpp"
#include "poolscope/pool/factory.hpp"
#include "poolscope/pool/host_resource.hpp"
#include "poolscope/pool/host_vmm_resource.hpp"
#include "poolscope/pool/stream_pool_allocator.hpp"

namespace poolscope::pool::testing {
namespace {

using hooks::event_kind;
using hooks::event_phase;
using poolscope::testing::recording_hook;

/// Host "events" that complete only when the test says so (or at a synchronize / barrier,
/// which stand for waiting on the device). Every record, barrier and test tick is stamped from
/// one logical clock so a model can ask "was this free covered by a completed event?".
class manual_event_source final : public stream_event_source {
 public:
  struct record {
    stream_view stream;
    std::uint64_t tick = 0;
    bool complete = false;
    bool destroyed = false;
  };

  /// Advances the logical clock; returns the new time.
  std::uint64_t tick() {
    std::lock_guard lock(mutex_);
    return ++clock_;
  }
  void complete(handle h) {
    std::lock_guard lock(mutex_);
    records_.at(h).complete = true;
  }
  void complete_all() {
    std::lock_guard lock(mutex_);
    for (auto& [h, r] : records_) {
      r.complete = true;
    }
  }
  /// Completes every event recorded on `stream`.
  void complete_stream(stream_view stream) {
    std::lock_guard lock(mutex_);
    for (auto& [h, r] : records_) {
      if (r.stream == stream) {
        r.complete = true;
      }
    }
  }
  [[nodiscard]] std::vector<handle> recorded_on(stream_view stream) const {
    std::lock_guard lock(mutex_);
    std::vector<handle> out;
    for (const auto& [h, r] : records_) {
      if (r.stream == stream) {
        out.push_back(h);
      }
    }
    return out;
  }
  [[nodiscard]] std::vector<handle> all() const {
    std::lock_guard lock(mutex_);
    std::vector<handle> out;
    for (const auto& [h, r] : records_) {
      out.push_back(h);
    }
    return out;
  }
  [[nodiscard]] std::size_t recorded() const {
    std::lock_guard lock(mutex_);
    return records_.size();
  }
  [[nodiscard]] std::size_t live() const {
    std::lock_guard lock(mutex_);
    return static_cast<std::size_t>(std::count_if(
        records_.begin(), records_.end(), [](const auto& kv) { return !kv.second.destroyed; }));
  }
  [[nodiscard]] std::size_t barriers() const {
    std::lock_guard lock(mutex_);
    return barrier_ticks_.size();
  }
  [[nodiscard]] std::size_t synchronized() const {
    std::lock_guard lock(mutex_);
    return syncs_;
  }
  [[nodiscard]] std::size_t errors() const {
    std::lock_guard lock(mutex_);
    return errors_;
  }
  /// Makes attach() throw (a stream of a device the source cannot use).
  void fail_attach(bool fail) {
    std::lock_guard lock(mutex_);
    fail_attach_ = fail;
  }
  /// The streams attached, in order (each should appear once).
  [[nodiscard]] std::vector<stream_view> attached() const {
    std::lock_guard lock(mutex_);
    return attached_;
  }
  /// True if what was freed on `stream` at `freed_tick` is known finished: a completed event
  /// recorded on that stream later, or a barrier later.
  [[nodiscard]] bool covered(stream_view stream, std::uint64_t freed_tick) const {
    std::lock_guard lock(mutex_);
    for (std::uint64_t b : barrier_ticks_) {
      if (b > freed_tick) {
        return true;
      }
    }
    for (const auto& [h, r] : records_) {
      if (r.stream == stream && r.tick > freed_tick && r.complete) {
        return true;
      }
    }
    return false;
  }

 private:
  void do_attach(stream_view stream) override {
    std::lock_guard lock(mutex_);
    if (fail_attach_) {
      throw std::runtime_error("manual_event_source: attach refused");
    }
    attached_.push_back(stream);
  }
  handle do_record(stream_view stream) override {
    std::lock_guard lock(mutex_);
    const handle h = next_++;
    records_[h] = {stream, ++clock_, false, false};
    return h;
  }
  bool do_query(handle h) override {
    std::lock_guard lock(mutex_);
    auto it = records_.find(h);
    if (it == records_.end() || it->second.destroyed) {
      ++errors_;
      return true;
    }
    return it->second.complete;
  }
  void do_synchronize(handle h) override {
    std::lock_guard lock(mutex_);
    ++syncs_;
    auto it = records_.find(h);
    if (it == records_.end() || it->second.destroyed) {
      ++errors_;
      return;
    }
    it->second.complete = true;
  }
  void do_synchronize_all() override {
    std::lock_guard lock(mutex_);
    barrier_ticks_.push_back(++clock_);
    for (auto& [h, r] : records_) {
      r.complete = true;
    }
  }
  void do_destroy(handle h) noexcept override {
    std::lock_guard lock(mutex_);
    auto it = records_.find(h);
    if (it == records_.end() || it->second.destroyed) {
      ++errors_;  // unknown handle or destroyed twice
      return;
    }
    it->second.destroyed = true;
  }

  mutable std::mutex mutex_;
  std::vector<stream_view> attached_;
  bool fail_attach_ = false;
  std::map<handle, record> records_;
  std::vector<std::uint64_t> barrier_ticks_;
  handle next_ = 1;
  std::uint64_t clock_ = 0;
  std::size_t syncs_ = 0;
  std::size_t errors_ = 0;
};

/// Host stream keys.
char g_stream_keys[8];
stream_view stream_key(int i) {
  return stream_view{&g_stream_keys[i]};
}
const stream_view S = stream_key(1);
const stream_view T = stream_key(2);
const stream_view U = stream_key(3);

/// A pool with a manual event source it owns; `events` stays valid while the pool lives.
struct fixture {
  explicit fixture(std::string_view inner, std::size_t capacity = SIZE_MAX)
      : host(capacity), pool(make(inner)) {}

  std::unique_ptr<stream_pool_allocator> make(std::string_view inner) {
    auto source = std::make_unique<manual_event_source>();
    events = source.get();
    return std::make_unique<stream_pool_allocator>(host, inner, std::move(source));
  }

  host_resource host;
  manual_event_source* events = nullptr;
  std::unique_ptr<stream_pool_allocator> pool;
};

bool overlaps(const void* a, std::size_t an, const void* b, std::size_t bn) {
  const auto x = reinterpret_cast<std::uintptr_t>(a);
  const auto y = reinterpret_cast<std::uintptr_t>(b);
  return x < y + bn && y < x + an;
}

stream_cached_bytes cached_of(const stream_pool_allocator& pool, stream_view s) {
  for (const auto& c : pool.cached_bytes_by_stream()) {
    if (c.stream == s) {
      return c;
    }
  }
  return {};
}

/// The inner strategies, as types (never strings: a type names its fixture at compile time).
struct naive_inner {
  static constexpr const char* name = "naive";
};
struct best_fit_inner {
  static constexpr const char* name = "best_fit";
};
struct bfc_inner {
  static constexpr const char* name = "bfc";
};

template <typename Inner>
class stream_pool_inner : public ::testing::Test {
 protected:
  static constexpr const char* inner() { return Inner::name; }
};
using inner_strategies = ::testing::Types<naive_inner, best_fit_inner, bfc_inner>;
TYPED_TEST_SUITE(stream_pool_inner, inner_strategies);

TYPED_TEST(stream_pool_inner, reuses_a_block_freed_on_a_stream_at_once_on_that_stream) {
  fixture f{this->inner()};
  auto& pool = *f.pool;
  void* p = pool.allocate(S, 1000);
  const auto after_first = pool.stats();
  pool.deallocate(S, p, 1000);
  void* q = pool.allocate(S, 1000);
  EXPECT_EQ(q, p) << "the block freed on S was not reused on S";
  EXPECT_EQ(pool.stats().upstream_allocs, after_first.upstream_allocs);
  EXPECT_EQ(f.events->recorded(), 0U) << "a plain free recorded an event";
  pool.deallocate(S, q, 1000);
}

TYPED_TEST(stream_pool_inner, never_hands_a_block_freed_on_one_stream_to_another_before_release) {
  fixture f{this->inner()};
  auto& pool = *f.pool;
  std::vector<std::pair<void*, std::size_t>> freed_on_s;
  for (std::size_t bytes : {1000, 64 << 10, 3 << 20}) {
    void* p = pool.allocate(S, bytes);
    freed_on_s.emplace_back(p, bytes);
  }
  for (auto [p, bytes] : freed_on_s) {
    pool.deallocate(S, p, bytes);
  }
  for (std::size_t bytes : {1000, 64 << 10, 3 << 20, 1000}) {
    void* q = pool.allocate(T, bytes);
    for (auto [p, pbytes] : freed_on_s) {
      EXPECT_FALSE(overlaps(q, bytes, p, pbytes)) << "T got memory S freed without an event";
    }
  }
  EXPECT_EQ(f.events->recorded(), 0U);
  EXPECT_GT(cached_of(pool, S).pool_bytes, 0U);
}

TYPED_TEST(stream_pool_inner, released_blocks_reach_another_stream_only_after_the_event_completes) {
  fixture f{this->inner()};
  auto& pool = *f.pool;
  constexpr std::size_t bytes = 64 << 10;
  std::vector<void*> on_s;
  for (int i = 0; i < 4; ++i) {
    on_s.push_back(pool.allocate(S, bytes));
  }
  for (void* p : on_s) {
    pool.deallocate(S, p, bytes);
  }
  const std::size_t cached_s = cached_of(pool, S).pool_bytes;
  ASSERT_GT(cached_s, 0U);
  const std::size_t moved = pool.release_cached(S);
  EXPECT_EQ(moved, cached_s);
  ASSERT_EQ(f.events->recorded(), 1U) << "one event per release, not one per free";
  ASSERT_EQ(f.events->recorded_on(S).size(), 1U);
  EXPECT_EQ(cached_of(pool, S).pool_bytes, 0U);
  EXPECT_EQ(cached_of(pool, S).released_bytes, moved);

  // Event incomplete: T must get fresh memory.
  const auto before = pool.stats();
  void* q = pool.allocate(T, bytes);
  for (void* p : on_s) {
    EXPECT_FALSE(overlaps(q, bytes, p, bytes)) << "T got S's block while S's event is pending";
  }
  EXPECT_GT(pool.stats().upstream_allocs, before.upstream_allocs);
  EXPECT_EQ(cached_of(pool, S).released_bytes, moved);

  // Completed: the next block T needs comes from S's release, not from upstream.
  f.events->complete_all();
  const auto mid = pool.stats();
  std::vector<void*> more;
  bool reused = false;
  // Enough requests that T's pool needs a new whole block (bfc carves 2 MiB segments).
  for (int i = 0; i < 64 && !reused; ++i) {
    void* r = pool.allocate(T, bytes);
    more.push_back(r);
    for (void* p : on_s) {
      reused = reused || overlaps(r, bytes, p, bytes);
    }
  }
  EXPECT_TRUE(reused) << "T never reused S's released memory after the event completed";
  EXPECT_EQ(pool.stats().upstream_allocs, mid.upstream_allocs) << "went upstream instead";
  EXPECT_LT(cached_of(pool, S).released_bytes, moved);
  pool.deallocate(T, q, bytes);
  for (void* r : more) {
    pool.deallocate(T, r, bytes);
  }
  EXPECT_EQ(f.events->errors(), 0U);
}

TYPED_TEST(stream_pool_inner, the_releasing_stream_takes_its_blocks_back_without_waiting) {
  fixture f{this->inner()};
  auto& pool = *f.pool;
  void* p = pool.allocate(S, 64 << 10);
  pool.deallocate(S, p, 64 << 10);
  ASSERT_GT(pool.release_cached(S), 0U);
  const auto before = pool.stats();
  void* q = pool.allocate(S, 64 << 10);
  EXPECT_EQ(q, p);
  EXPECT_EQ(pool.stats().upstream_allocs, before.upstream_allocs);
  EXPECT_EQ(f.events->synchronized(), 0U);
  EXPECT_EQ(f.events->barriers(), 0U);
  pool.deallocate(S, q, 64 << 10);
}

TYPED_TEST(stream_pool_inner, a_short_stream_waits_for_the_release_event_it_needs) {
  fixture f{this->inner(), 4 << 20};
  auto& pool = *f.pool;
  void* p = pool.allocate(S, 1 << 20);
  pool.deallocate(S, p, 1 << 20);
  ASSERT_GT(pool.release_cached(S), 0U);
  // The resource is full of S's released memory: T must wait on S's event, then take it.
  std::vector<void*> filler;
  try {
    for (int i = 0; i < 8; ++i) {
      filler.push_back(pool.allocate(T, 1 << 20));
    }
  } catch (const out_of_memory&) {
  }
  bool reused = false;
  for (void* q : filler) {
    reused = reused || overlaps(q, 1 << 20, p, 1 << 20);
  }
  EXPECT_TRUE(reused) << "T never got S's released block although the resource was full";
  EXPECT_GE(f.events->synchronized() + f.events->barriers(), 1U)
      << "the block was handed over without waiting for its event";
  EXPECT_LE(f.host.allocated_bytes(), 4U << 20);
  for (void* q : filler) {
    pool.deallocate(T, q, 1 << 20);
  }
  EXPECT_EQ(f.events->errors(), 0U);
}

TEST(stream_pool, a_short_stream_takes_other_streams_free_blocks_after_a_barrier) {
  fixture f{"best_fit", 1 << 20};
  auto& pool = *f.pool;
  void* p = pool.allocate(S, 1 << 20);
  pool.deallocate(S, p, 1 << 20);  // cached in S's pool; the resource is full
  EXPECT_EQ(f.events->barriers(), 0U);
  void* q = pool.allocate(T, 1 << 20);
  EXPECT_EQ(q, p) << "T should have taken S's free block";
  EXPECT_EQ(f.events->barriers(), 1U) << "taken without a barrier";
  const auto s = pool.stats();
  EXPECT_EQ(s.upstream_allocs, 1U);
  EXPECT_GE(s.upstream_failures, 1U);
  EXPECT_EQ(s.oom_count, 0U);
  EXPECT_EQ(cached_of(pool, S).bytes, 0U);
  pool.deallocate(T, q, 1 << 20);
}

TEST(stream_pool, a_block_freed_on_another_stream_returns_after_that_streams_event) {
  fixture f{"best_fit"};
  auto& pool = *f.pool;
  constexpr std::size_t bytes = 64 << 10;
  void* p = pool.allocate(S, bytes);
  pool.deallocate(T, p, bytes);  // last used on T
  ASSERT_EQ(f.events->recorded_on(T).size(), 1U) << "no event recorded on the freeing stream";
  EXPECT_EQ(f.events->recorded(), 1U);
  EXPECT_EQ(pool.stats().in_use, 0U);
  EXPECT_EQ(pool.stats().deallocations, 1U);
  EXPECT_EQ(pool.stats().invalid_frees, 0U);

  void* q = pool.allocate(S, bytes);
  EXPECT_NE(q, p) << "S reused a block T may still be using";
  EXPECT_FALSE(overlaps(q, bytes, p, bytes));

  f.events->complete_stream(T);
  void* r = pool.allocate(S, bytes);
  EXPECT_EQ(r, p) << "the block did not come back to S after T's event completed";
  pool.deallocate(S, q, bytes);
  pool.deallocate(S, r, bytes);
  EXPECT_EQ(pool.stats().in_use, 0U);
  EXPECT_EQ(f.events->live(), 0U) << "the cross-stream event was not destroyed";
  EXPECT_EQ(f.events->errors(), 0U);
}

// A block freed on a stream other than its own waits for that stream's event before it returns
// to its pool. Meanwhile it is neither in use nor (it was) cached: its bytes vanished from
// stats() (in_use + cached_bytes < reserved) and from cached_bytes_by_stream(), and so from the
// "cached on other streams" of an out_of_memory, although release_cached() reclaims them.
TEST(stream_pool, a_block_freed_on_another_stream_counts_as_cached_while_it_waits) {
  fixture f{"best_fit"};  // exact 512-byte multiples: reserved == in use + cached, as a model
  auto& pool = *f.pool;
  void* p = pool.allocate(S, 4096);
  void* q = pool.allocate(S, 8192);
  void* r = pool.allocate(T, 1024);
  pool.deallocate(T, p, 4096);  // pending on S behind T's event
  pool.deallocate(U, q, 8192);  // pending on S behind U's event
  auto s = pool.stats();
  EXPECT_EQ(s.in_use, 1024U);
  EXPECT_EQ(s.reserved, 4096U + 8192U + 1024U);
  EXPECT_EQ(s.cached_bytes, 4096U + 8192U);
  EXPECT_EQ(s.cached_blocks, 2U);
  EXPECT_EQ(s.largest_free_block, 8192U);
  EXPECT_EQ(s.in_use + s.cached_bytes, s.reserved);
  auto on_s = cached_of(pool, S);
  EXPECT_EQ(on_s.pending_bytes, 4096U + 8192U);
  EXPECT_EQ(on_s.pool_bytes, 0U);
  EXPECT_EQ(on_s.released_bytes, 0U);
  EXPECT_EQ(on_s.bytes, 4096U + 8192U);
  EXPECT_EQ(cached_of(pool, T).bytes, 0U);
  EXPECT_EQ(cached_of(pool, U).bytes, 0U);
  std::size_t by_stream = 0;
  for (const auto& c : pool.cached_bytes_by_stream()) {
    by_stream += c.bytes;
  }
  EXPECT_EQ(by_stream, s.cached_bytes);

  // T's event completes: p returns to S's pool at S's next request (which takes another size).
  f.events->complete_stream(T);
  void* big = pool.allocate(S, 16384);
  on_s = cached_of(pool, S);
  EXPECT_EQ(on_s.pending_bytes, 8192U);
  EXPECT_EQ(on_s.pool_bytes, 4096U);
  EXPECT_EQ(on_s.bytes, 4096U + 8192U);
  s = pool.stats();
  EXPECT_EQ(s.cached_bytes, 4096U + 8192U);
  EXPECT_EQ(s.in_use + s.cached_bytes, s.reserved);

  // release_cached() reclaims the waiting block too (after its barrier), and says so.
  EXPECT_EQ(pool.release_cached(), 4096U + 8192U);
  s = pool.stats();
  EXPECT_EQ(s.cached_bytes, 0U);
  EXPECT_EQ(s.cached_blocks, 0U);
  EXPECT_EQ(cached_of(pool, S).bytes, 0U);
  EXPECT_EQ(s.reserved, 16384U + 1024U);
  EXPECT_EQ(f.host.allocated_bytes(), s.reserved);
  pool.deallocate(S, big, 16384);
  pool.deallocate(T, r, 1024);
  EXPECT_EQ(f.events->errors(), 0U);
}

TEST(stream_pool, invalid_frees_are_reported_and_ignored) {
  fixture f{"best_fit"};
  auto& pool = *f.pool;
  recording_hook rec{pool.id()};
  hooks::scoped_hook on{rec, hooks::scope::thread};
  void* p = pool.allocate(S, 1000);
  pool.deallocate(S, p, 1000);
  pool.deallocate(S, p, 1000);  // double free on its stream
  void* q = pool.allocate(S, 5000);
  pool.deallocate(T, q, 5000);
  pool.deallocate(S, q, 5000);  // double free while the cross-stream free is pending
  int stranger = 0;
  pool.deallocate(U, &stranger, 4);  // never handed out, on a stream the pool never saw
  const auto invalid = rec.of(event_kind::invalid_free, event_phase::instant);
  ASSERT_EQ(invalid.size(), 3U);
  EXPECT_EQ(invalid[0].error, hooks::free_error::double_free);
  EXPECT_EQ(invalid[1].error, hooks::free_error::double_free);
  EXPECT_EQ(invalid[2].error, hooks::free_error::unknown_pointer);
  const auto s = pool.stats();
  EXPECT_EQ(s.invalid_frees, 3U);
  EXPECT_EQ(s.deallocations, 2U);
  EXPECT_EQ(s.in_use, 0U);
  // Still consistent and usable.
  void* r = pool.allocate(S, 1000);
  EXPECT_EQ(r, p);
  pool.deallocate(S, r, 1000);
}

TEST(stream_pool, a_wrong_size_is_corrected) {
  fixture f{"best_fit"};
  auto& pool = *f.pool;
  void* p = pool.allocate(S, 1000);
  void* q = pool.allocate(S, 1000);
  pool.deallocate(S, p, 99999);
  pool.deallocate(T, q, 3);
  const auto s = pool.stats();
  EXPECT_EQ(s.invalid_frees, 2U);
  EXPECT_EQ(s.in_use, 0U);
  EXPECT_EQ(s.requested_in_use, 0U);
}

TEST(stream_pool, reports_and_reclaims_cached_bytes_per_stream) {
  fixture f{"best_fit"};
  auto& pool = *f.pool;
  // best_fit rounds to 512: 4096-byte requests take exactly 4096.
  void* s1 = pool.allocate(S, 4096);
  void* s2 = pool.allocate(S, 4096);
  void* s3 = pool.allocate(S, 4096);
  void* t1 = pool.allocate(T, 4096);
  pool.deallocate(S, s1, 4096);
  pool.deallocate(S, s2, 4096);
  pool.deallocate(T, t1, 4096);
  auto by = pool.cached_bytes_by_stream();
  ASSERT_EQ(by.size(), 2U);
  EXPECT_EQ(by[0].stream, S);  // first-use order
  EXPECT_EQ(by[1].stream, T);
  EXPECT_EQ(by[0].pool_bytes, 8192U);
  EXPECT_EQ(by[0].released_bytes, 0U);
  EXPECT_EQ(by[0].bytes, 8192U);
  EXPECT_EQ(by[1].bytes, 4096U);
  EXPECT_EQ(pool.stats().cached_bytes, 12288U);
  EXPECT_EQ(pool.stream_count(), 2U);

  EXPECT_EQ(pool.release_cached(S), 8192U);
  by = pool.cached_bytes_by_stream();
  EXPECT_EQ(by[0].pool_bytes, 0U);
  EXPECT_EQ(by[0].released_bytes, 8192U);
  EXPECT_EQ(by[0].bytes, 8192U);
  EXPECT_EQ(pool.stats().cached_bytes, 12288U) << "release_cached(stream) keeps memory cached";
  EXPECT_EQ(pool.stats().reserved, 16384U);
  EXPECT_EQ(pool.release_cached(S), 0U);
  EXPECT_EQ(pool.release_cached(U), 0U) << "a stream never seen has nothing cached";

  const auto barriers = f.events->barriers();
  EXPECT_EQ(pool.release_cached(), 12288U);
  EXPECT_EQ(f.events->barriers(), barriers + 1);
  const auto s = pool.stats();
  EXPECT_EQ(s.reserved, 4096U);
  EXPECT_EQ(s.cached_bytes, 0U);
  for (const auto& c : pool.cached_bytes_by_stream()) {
    EXPECT_EQ(c.bytes, 0U);
  }
  EXPECT_EQ(f.host.allocated_bytes(), 4096U);
  pool.deallocate(S, s3, 4096);
  EXPECT_EQ(f.events->live(), 0U) << "release events outlived their blocks";
}

TEST(stream_pool, out_of_memory_names_the_request_and_leaves_the_pool_usable) {
  fixture f{"bfc", 8 << 20};
  auto& pool = *f.pool;
  void* keep = pool.allocate(T, 1 << 20);
  try {
    (void)pool.allocate(S, 64 << 20);
    ADD_FAILURE() << "64 MiB came out of an 8 MiB resource";
  } catch (const out_of_memory& e) {
    EXPECT_EQ(e.requested(), std::size_t{64} << 20);
    EXPECT_NE(std::string(e.what()).find("cached on other streams"), std::string::npos);
    EXPECT_NE(e.cause().find("upstream"), std::string::npos) << e.cause();
  }
  try {
    (void)pool.allocate(S, max_request_bytes);  // 1 PiB
    ADD_FAILURE() << "1 PiB was handed out";
  } catch (const out_of_memory& e) {
    EXPECT_EQ(e.requested(), max_request_bytes);
  }
  void* p = pool.allocate(S, 1 << 20);
  std::memset(p, 0x5a, 1 << 20);
  pool.deallocate(S, p, 1 << 20);
  pool.deallocate(T, keep, 1 << 20);
  EXPECT_EQ(pool.stats().oom_count, 2U);
  EXPECT_EQ(pool.stats().in_use, 0U);
}

TEST(stream_pool, hooks_see_one_event_per_user_call_and_only_real_upstream_calls) {
  for (const char* inner : {"naive", "best_fit", "bfc"}) {
    SCOPED_TRACE(inner);
    fixture f{inner, 16 << 20};
    auto& pool = *f.pool;
    recording_hook all;  // every allocator's events: inner pools must not show up
    std::uint64_t calls = 0;
    {
      hooks::scoped_hook on{all, hooks::scope::thread};
      std::vector<std::pair<void*, std::size_t>> live;
      std::mt19937_64 rng(7);
      const stream_view streams[] = {S, T, U};
      for (int i = 0; i < 300; ++i) {
        const stream_view s = streams[rng() % 3];
        if (live.empty() || rng() % 3 != 0) {
          const std::size_t bytes = log_uniform(rng, 64, 1 << 20);
          try {
            live.emplace_back(pool.allocate(s, bytes), bytes);
          } catch (const out_of_memory&) {
          }
          ++calls;
        } else {
          const std::size_t k = rng() % live.size();
          pool.deallocate(s, live[k].first, live[k].second);  // often on another stream
          live[k] = live.back();
          live.pop_back();
        }
        if (i % 50 == 49) {
          (void)pool.release_cached(s);
          f.events->complete_all();
        }
      }
      for (auto [p, bytes] : live) {
        pool.deallocate(S, p, bytes);
      }
      (void)pool.release_cached();
    }
    const auto s = pool.stats();
    for (const auto& r : all.events()) {
      EXPECT_EQ(r.e.allocator_id, pool.id())
          << "an event of another allocator (" << r.allocator_name
          << "): " << hooks::to_string(r.e.kind);
    }
    EXPECT_EQ(all.of(event_kind::pool_malloc, event_phase::pre).size(), calls);
    EXPECT_EQ(all.of(event_kind::pool_malloc, event_phase::post).size(), s.allocations);
    EXPECT_EQ(all.of(event_kind::pool_free, event_phase::post).size(), s.deallocations);
    EXPECT_EQ(all.of(event_kind::device_alloc, event_phase::post).size(), s.upstream_allocs);
    EXPECT_EQ(all.of(event_kind::device_free, event_phase::post).size(), s.upstream_frees);
    // One release per explicit release_cached() and per allocator-level retry.
    EXPECT_GE(all.of(event_kind::release, event_phase::post).size(), 1U + s.oom_count);
    std::size_t acquired = 0;
    for (const auto& e : all.of(event_kind::device_alloc, event_phase::post)) {
      acquired += e.rounded;
    }
    std::size_t returned = 0;
    for (const auto& e : all.of(event_kind::device_free, event_phase::post)) {
      returned += e.rounded;
    }
    EXPECT_EQ(acquired - returned, s.reserved);
    EXPECT_EQ(s.reserved, f.host.allocated_bytes());
    EXPECT_EQ(s.in_use, 0U);
    if (std::string(inner) == "bfc") {
      EXPECT_FALSE(all.of(event_kind::split, event_phase::instant).empty())
          << "the inner bfc's splits were not reported under the stream pool";
    }
  }
}

TEST(stream_pool, destruction_returns_everything_and_destroys_every_event) {
  host_resource host;
  manual_event_source* events = nullptr;
  {
    auto source = std::make_unique<manual_event_source>();
    events = source.get();
    stream_pool_allocator pool{host, "bfc", std::move(source)};
    void* a = pool.allocate(S, 1000);
    void* b = pool.allocate(S, 3 << 20);
    void* c = pool.allocate(T, 5000);
    (void)pool.allocate(U, 70000);  // never freed
    pool.deallocate(T, a, 1000);    // pending on S behind T's event
    pool.deallocate(S, b, 3 << 20);
    (void)pool.release_cached(S);  // shared, behind S's event
    pool.deallocate(T, c, 5000);
    EXPECT_GT(host.allocated_bytes(), 0U);
    EXPECT_EQ(events->recorded(), 2U);
    EXPECT_EQ(events->errors(), 0U);
  }
  EXPECT_EQ(host.allocated_bytes(), 0U) << "the pool leaked upstream memory";
}

TEST(stream_pool, rejects_unknown_inner_strategies_naming_them) {
  host_resource host;
  for (const char* bad : {"stream_pool", "bogus", ""}) {
    try {
      stream_pool_allocator pool{host, bad};
      ADD_FAILURE() << "inner '" << bad << "' was accepted";
    } catch (const invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("'") + bad + "'"), std::string::npos)
          << e.what();
    }
  }
  stream_pool_allocator pool{host};
  EXPECT_EQ(pool.inner_strategy(), "bfc");
  EXPECT_NE(pool.name().find("stream_pool"), std::string::npos);
  auto made = make_allocator("stream_pool", host);
  EXPECT_NE(dynamic_cast<stream_pool_allocator*>(made.get()), nullptr);
}

// The event source learns each stream the pool allocates on once, before anything is recorded on
// it (the CUDA source notes the stream's device there, for its barrier); a source that refuses a
// stream fails that allocation and leaves nothing behind.
TEST(stream_pool, attaches_each_allocating_stream_once_before_its_first_allocation) {
  fixture f{"bfc"};
  auto& pool = *f.pool;
  void* a = pool.allocate(S, 4096);
  EXPECT_EQ(f.events->attached(), std::vector<stream_view>{S});
  void* b = pool.allocate(T, 4096);
  void* c = pool.allocate(S, 8192);
  pool.deallocate(U, a, 4096);  // U only frees: seen by record(), not attached
  EXPECT_EQ(f.events->attached(), (std::vector<stream_view>{S, T}));
  EXPECT_EQ(f.events->recorded_on(U).size(), 1U);

  f.events->fail_attach(true);
  const auto before = pool.stats();
  EXPECT_THROW((void)pool.allocate(U, 4096), std::runtime_error);
  EXPECT_EQ(pool.stream_count(), 2U) << "a stream whose attach failed was kept";
  EXPECT_EQ(pool.stats().in_use, before.in_use);
  EXPECT_EQ(pool.stats().reserved, before.reserved);
  f.events->fail_attach(false);
  void* d = pool.allocate(U, 4096);
  EXPECT_EQ(f.events->attached(), (std::vector<stream_view>{S, T, U}));
  EXPECT_EQ(pool.stream_count(), 3U);
  pool.deallocate(T, b, 4096);
  pool.deallocate(S, c, 8192);
  pool.deallocate(U, d, 4096);
  EXPECT_EQ(pool.stats().in_use, 0U);
  EXPECT_EQ(f.events->errors(), 0U);
}

TEST(stream_pool, host_events_complete_at_once) {
  host_event_source events;
  const auto a = events.record(S);
  const auto b = events.record(T);
  EXPECT_NE(a, 0U);
  EXPECT_NE(a, b);
  EXPECT_TRUE(events.query(a));
  events.synchronize(b);
  events.synchronize_all();
  events.destroy(a);
  events.destroy(b);
}

// ---- over a virtual resource: each stream's bfc maps granules of ranges of its own ------------

TEST(stream_pool_over_host_vmm, each_streams_pool_maps_granules_of_ranges_of_its_own) {
  constexpr std::size_t granule = std::size_t{64} << 10;
  constexpr std::size_t two = 2 * granule;
  host_vmm_resource vm{{.address_range_bytes = std::size_t{1} << 30, .granule_bytes = granule}};
  auto source = std::make_unique<manual_event_source>();
  manual_event_source& events = *source;
  {
    stream_pool_allocator pool{vm, "bfc", std::move(source)};
    void* a = pool.allocate(S, two);
    void* b = pool.allocate(T, two);
    allocator_stats s = pool.stats();
    EXPECT_EQ(s.reserved, 2 * two) << "the granules the blocks touch, not whole 2 MiB segments";
    EXPECT_EQ(s.reserved, vm.mapped_bytes());
    EXPECT_EQ(s.maps, 2U);
    EXPECT_EQ(s.virtual_bytes, std::size_t{4} << 20) << "a small segment's range per stream";
    EXPECT_FALSE(overlaps(a, std::size_t{2} << 20, b, 1)) << "T's block in S's range";
    EXPECT_FALSE(overlaps(b, std::size_t{2} << 20, a, 1)) << "S's block in T's range";

    // Freed on S and asked again: S's granules stay mapped (the unmap policy), the same block.
    pool.deallocate(S, a, two);
    EXPECT_EQ(pool.stats().mapped_free_bytes, two);
    EXPECT_EQ(cached_of(pool, S).pool_bytes, two);
    void* again = pool.allocate(S, two);
    EXPECT_EQ(again, a);
    EXPECT_EQ(pool.stats().maps, 2U) << "a cached pair maps nothing";
    pool.deallocate(S, again, two);

    // release_cached(S) unmaps S's free granules and gives back its range; T is untouched.
    EXPECT_EQ(pool.release_cached(S), two);
    s = pool.stats();
    EXPECT_EQ(s.reserved, two);
    EXPECT_EQ(s.mapped_free_bytes, 0U);
    EXPECT_EQ(s.unmaps, 1U);
    EXPECT_EQ(s.virtual_bytes, std::size_t{2} << 20);
    EXPECT_EQ(cached_of(pool, S).bytes, 0U);
    EXPECT_TRUE(vm.is_mapped(b));
    pool.deallocate(T, b, two);
    const std::size_t barriers = events.barriers();
    EXPECT_EQ(pool.release_cached(), two);
    EXPECT_EQ(events.barriers(), barriers + 1) << "release_cached() unmaps after a barrier";
    EXPECT_EQ(vm.mapped_bytes(), 0U);
    EXPECT_EQ(pool.stats().in_use, 0U);
  }
  EXPECT_EQ(vm.counts().address_bytes, 0U) << "the pool returned every range";
}

TEST(stream_pool_over_host_vmm, a_refused_map_unmaps_other_streams_free_granules_and_retries) {
  // A budget of 4 granules: S's 2 freed ones stay mapped until T's map is refused; the
  // allocator's release-and-retry (a barrier, every stream's free granules unmapped) serves T.
  constexpr std::size_t granule = std::size_t{64} << 10;
  constexpr std::size_t two = 2 * granule;
  host_vmm_resource vm{{.address_range_bytes = std::size_t{1} << 30,
                        .granule_bytes = granule,
                        .capacity = 4 * granule}};
  auto source = std::make_unique<manual_event_source>();
  manual_event_source& events = *source;
  stream_pool_allocator pool{vm, "bfc", std::move(source)};
  void* a = pool.allocate(S, two);
  void* b = pool.allocate(T, two);
  pool.deallocate(S, a, two);
  ASSERT_EQ(pool.stats().mapped_free_bytes, two);
  const std::size_t barriers = events.barriers();
  void* c = pool.allocate(T, two);
  EXPECT_TRUE(vm.is_mapped(c));
  EXPECT_EQ(events.barriers(), barriers + 1) << "one release-and-retry";
  allocator_stats s = pool.stats();
  EXPECT_EQ(s.oom_count, 0U);
  EXPECT_EQ(s.reserved, 2 * two);
  EXPECT_EQ(s.upstream_failures, 1U) << "the refused map";
  try {
    (void)pool.allocate(S, two);
    ADD_FAILURE() << "a map past the budget succeeded";
  } catch (const out_of_memory& e) {
    EXPECT_EQ(e.requested(), two);
    EXPECT_EQ(e.context().reserved, 2 * two) << "reserved is what is mapped";
  }
  pool.deallocate(T, b, two);
  pool.deallocate(T, c, two);
  void* d = pool.allocate(S, two);  // the pool stays usable
  EXPECT_TRUE(vm.is_mapped(d));
  pool.deallocate(S, d, two);
}

// ---- A reference model of the cross-stream rule, under random operations ----------------------

/// What the model remembers of memory freed by the user: the stream it was freed on and when.
struct freed_range {
  std::uintptr_t end = 0;
  stream_view stream;
  std::uint64_t tick = 0;
};

/// Checks every allocation and every return to the resource against the rule: memory freed on
/// stream Y may be handed to stream X != Y, or given back to the resource, only once an event
/// recorded on Y after the free has completed, or a barrier ran after it.
class cross_stream_model final : public hooks::hook {
 public:
  explicit cross_stream_model(const manual_event_source& events, std::uint32_t pool)
      : events_(&events), pool_(pool) {}

  void on_event(const hooks::event& e) noexcept override {
    if (e.allocator_id != pool_ || e.kind != event_kind::device_free ||
        e.phase != event_phase::pre) {
      return;
    }
    // Memory going back to a (not stream-ordered) resource: every free inside must be over.
    const auto begin = reinterpret_cast<std::uintptr_t>(e.ptr);
    const auto end = begin + e.rounded;
    for (auto it = freed_.begin(); it != freed_.end();) {
      if (it->first < end && begin < it->second.end) {
        if (!events_->covered(it->second.stream, it->second.tick)) {
          ++violations_;
        }
        it = freed_.erase(it);
      } else {
        ++it;
      }
    }
  }

  void on_allocate(stream_view x, void* p, std::size_t bytes) {
    const auto begin = reinterpret_cast<std::uintptr_t>(p);
    const auto end = begin + bytes;
    for (auto it = freed_.begin(); it != freed_.end();) {
      if (it->first < end && begin < it->second.end) {
        if (!(it->second.stream == x) && !events_->covered(it->second.stream, it->second.tick)) {
          ++violations_;
          ADD_FAILURE() << "stream " << x.id() << " got " << p << " (" << bytes
                        << " B), freed on stream " << it->second.stream.id() << " at tick "
                        << it->second.tick << " with no completed event or barrier since";
        }
        it = freed_.erase(it);
      } else {
        ++it;
      }
    }
  }
  void on_free(stream_view y, void* p, std::size_t bytes, std::uint64_t tick) {
    const auto begin = reinterpret_cast<std::uintptr_t>(p);
    freed_[begin] = {begin + bytes, y, tick};
  }
  [[nodiscard]] std::size_t violations() const { return violations_; }

 private:
  const manual_event_source* events_;
  std::uint32_t pool_;
  std::map<std::uintptr_t, freed_range> freed_;  // disjoint: live blocks never overlap
  std::size_t violations_ = 0;
};

/// A request of the random stream-pool tests: one in ten 1–3 MiB (whole blocks of their own),
/// the rest 16 B–96 KiB, log-uniform.
std::size_t random_request_bytes(std::mt19937_64& rng) {
  return rng() % 10 == 0 ? log_uniform(rng, 1 << 20, 3 << 20) : log_uniform(rng, 16, 96 << 10);
}

TYPED_TEST(stream_pool_inner, random_operations_obey_the_cross_stream_rule) {
  const std::uint64_t seed = test_seed();
  const std::uint64_t ops = env_count("POOLSCOPE_TEST_OPS", under_sanitizer ? 1500 : 6000);
  for (std::size_t capacity : {SIZE_MAX, std::size_t{24} << 20}) {
    SCOPED_TRACE(capacity == SIZE_MAX ? "unlimited resource" : "24 MiB resource");
    fixture f{this->inner(), capacity};
    auto& pool = *f.pool;
    cross_stream_model model{*f.events, pool.id()};
    std::mt19937_64 rng(seed);
    struct live_block {
      void* p;
      std::size_t bytes;
      unsigned char fill;
      stream_view stream;
    };
    std::vector<live_block> live;
    interval_set ranges;
    const stream_view streams[] = {S, T, U};
    std::size_t ooms = 0;
    {
      hooks::scoped_hook on{model, hooks::scope::thread};
      for (std::uint64_t i = 0; i < ops; ++i) {
        const stream_view s = streams[rng() % 3];
        const unsigned op = rng() % 100;
        if (op < 50 || live.empty()) {
          const std::size_t bytes = random_request_bytes(rng);
          void* p = nullptr;
          try {
            p = pool.allocate(s, bytes);
          } catch (const out_of_memory&) {
            ++ooms;
            continue;
          }
          ASSERT_TRUE(ranges.insert(p, bytes)) << "live blocks overlap at " << p;
          model.on_allocate(s, p, bytes);
          const auto fill = static_cast<unsigned char>(i);
          std::memset(p, fill, std::min<std::size_t>(bytes, 256));
          live.push_back({p, bytes, fill, s});
        } else if (op < 92) {
          const std::size_t k = rng() % live.size();
          const live_block b = live[k];
          const auto* bytes = static_cast<const unsigned char*>(b.p);
          for (std::size_t j = 0; j < std::min<std::size_t>(b.bytes, 256); ++j) {
            ASSERT_EQ(bytes[j], b.fill) << "block " << b.p << " was overwritten";
          }
          // Mostly on the stream of last use; sometimes elsewhere (a cross-stream free).
          const stream_view free_on = rng() % 4 == 0 ? streams[rng() % 3] : b.stream;
          model.on_free(free_on, b.p, b.bytes, f.events->tick());
          ASSERT_TRUE(ranges.erase(b.p));
          pool.deallocate(free_on, b.p, b.bytes);
          live[k] = live.back();
          live.pop_back();
        } else if (op < 96) {
          (void)pool.release_cached(s);
        } else if (op < 99) {
          const auto all = f.events->all();
          if (!all.empty()) {
            f.events->complete(all[rng() % all.size()]);
          }
        } else {
          (void)pool.release_cached();
        }
      }
      for (const auto& b : live) {
        pool.deallocate(S, b.p, b.bytes);
      }
      live.clear();
      (void)pool.release_cached();
    }
    EXPECT_EQ(model.violations(), 0U);
    const auto st = pool.stats();
    EXPECT_EQ(st.in_use, 0U);
    EXPECT_EQ(st.invalid_frees, 0U);
    EXPECT_EQ(st.reserved, f.host.allocated_bytes());
    EXPECT_EQ(st.oom_count, ooms);
    EXPECT_EQ(f.events->errors(), 0U);
    if (capacity == SIZE_MAX) {
      EXPECT_EQ(ooms, 0U);
    }
  }
}

// Every byte the pool holds is in use or cached: reserved == in_use + cached_bytes after every
// operation, and the per-stream report adds up to cached_bytes. Two kinds of held bytes used to
// be in neither: blocks freed on another stream waiting for its event, and the unused tail of a
// cached whole block handed to a stream's pool that asked for less (its own block released by
// release_cached(stream), or another stream's), which the inner pool knows only at the size it
// asked for.
TYPED_TEST(stream_pool_inner, random_operations_keep_reserved_equal_to_in_use_plus_cached) {
  const std::uint64_t seed = test_seed();
  const std::uint64_t ops = env_count("POOLSCOPE_TEST_OPS", under_sanitizer ? 1500 : 6000);
  fixture f{this->inner()};
  auto& pool = *f.pool;
  std::mt19937_64 rng(seed);
  struct live_block {
    void* p;
    std::size_t bytes;
    stream_view stream;
  };
  std::vector<live_block> live;
  std::size_t requested = 0;  // the model: bytes asked for by live blocks
  const stream_view streams[] = {S, T, U};
  for (std::uint64_t i = 0; i < ops; ++i) {
    const stream_view s = streams[rng() % 3];
    const unsigned op = rng() % 100;
    if (op < 50 || live.empty()) {
      const std::size_t bytes = random_request_bytes(rng);
      live.push_back({pool.allocate(s, bytes), bytes, s});
      requested += bytes;
    } else if (op < 90) {
      const std::size_t k = rng() % live.size();
      const live_block b = live[k];
      pool.deallocate(rng() % 4 == 0 ? streams[rng() % 3] : b.stream, b.p, b.bytes);
      requested -= b.bytes;
      live[k] = live.back();
      live.pop_back();
    } else if (op < 96) {
      (void)pool.release_cached(s);
    } else if (op < 99) {
      f.events->complete_all();
    } else {
      (void)pool.release_cached();
    }
    const auto st = pool.stats();
    ASSERT_EQ(st.requested_in_use, requested) << "op " << i;
    ASSERT_EQ(st.in_use + st.cached_bytes, st.reserved)
        << "op " << i << ": in use " << st.in_use << ", cached " << st.cached_bytes;
    ASSERT_EQ(st.reserved, f.host.allocated_bytes()) << "op " << i;
    ASSERT_EQ(st.cached_blocks == 0, st.cached_bytes == 0) << "op " << i;
    ASSERT_LE(st.largest_free_block, st.cached_bytes) << "op " << i;
    std::size_t by_stream = 0;
    for (const auto& c : pool.cached_bytes_by_stream()) {
      ASSERT_EQ(c.bytes, c.pool_bytes + c.released_bytes + c.pending_bytes + c.tail_bytes);
      by_stream += c.bytes;
    }
    ASSERT_EQ(by_stream, st.cached_bytes) << "op " << i;
  }
  for (const auto& b : live) {
    pool.deallocate(b.stream, b.p, b.bytes);
  }
  (void)pool.release_cached();
  const auto st = pool.stats();
  EXPECT_EQ(st.in_use, 0U);
  EXPECT_EQ(st.cached_bytes, 0U);
  EXPECT_EQ(st.reserved, 0U);
  EXPECT_EQ(f.host.allocated_bytes(), 0U);
}

// ---- Concurrency (also run under ThreadSanitizer) -----------------------------------------------

/// Four threads, each on a stream of its own, allocate, free, hand blocks to each other to free
/// on another stream and release caches over `host` (48 MiB), with events completed meanwhile.
template <typename Resource>
void streams_on_threads_with_cross_stream_frees_and_releases(Resource& host) {
  const std::uint64_t seed = test_seed();
  const int per_thread = under_sanitizer ? 1500 : 6000;
  constexpr int threads = 4;
  auto source = std::make_unique<manual_event_source>();
  manual_event_source* events = source.get();
  {
    stream_pool_allocator pool{host, "bfc", std::move(source)};
    std::mutex handoff_mutex;
    struct handed {
      void* p;
      std::size_t bytes;
      unsigned char fill;
    };
    std::vector<handed> handoff;  // blocks one thread passes to another to free
    std::atomic<bool> stop{false};
    std::atomic<std::uint64_t> corrupt{0};
    std::thread completer([&] {
      while (!stop.load()) {
        events->complete_all();
        std::this_thread::yield();
      }
    });
    auto check = [&](const void* p, std::size_t bytes, unsigned char fill) {
      const auto* b = static_cast<const unsigned char*>(p);
      for (std::size_t j = 0; j < std::min<std::size_t>(bytes, 128); ++j) {
        if (b[j] != fill) {
          corrupt.fetch_add(1);
          return;
        }
      }
    };
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] {
        std::mt19937_64 rng(seed + static_cast<std::uint64_t>(t));
        const stream_view mine = stream_key(t + 1);
        std::vector<handed> live;
        for (int i = 0; i < per_thread; ++i) {
          const unsigned op = rng() % 100;
          if (op < 45 || live.empty()) {
            const std::size_t bytes = log_uniform(rng, 64, 512 << 10);
            try {
              void* p = pool.allocate(mine, bytes);
              const auto fill = static_cast<unsigned char>(t * 16 + i % 16);
              std::memset(p, fill, std::min<std::size_t>(bytes, 128));
              live.push_back({p, bytes, fill});
            } catch (const out_of_memory&) {
            }
          } else if (op < 85) {
            const std::size_t k = rng() % live.size();
            check(live[k].p, live[k].bytes, live[k].fill);
            pool.deallocate(mine, live[k].p, live[k].bytes);
            live[k] = live.back();
            live.pop_back();
          } else if (op < 93) {
            // Hand a block to whoever frees next: a free on a stream it was not allocated on.
            std::lock_guard lock(handoff_mutex);
            if (!handoff.empty()) {
              const handed h = handoff.back();
              handoff.pop_back();
              check(h.p, h.bytes, h.fill);
              pool.deallocate(mine, h.p, h.bytes);
            } else {
              handoff.push_back(live.back());
              live.pop_back();
            }
          } else if (op < 98) {
            (void)pool.release_cached(mine);
          } else if (op < 99) {
            (void)pool.cached_bytes_by_stream();
            (void)pool.stats();
          } else {
            (void)pool.release_cached();
          }
        }
        for (const auto& h : live) {
          check(h.p, h.bytes, h.fill);
          pool.deallocate(mine, h.p, h.bytes);
        }
      });
    }
    for (auto& w : workers) {
      w.join();
    }
    stop.store(true);
    completer.join();
    for (const auto& h : handoff) {
      pool.deallocate(S, h.p, h.bytes);
    }
    EXPECT_EQ(corrupt.load(), 0U) << "a live block was overwritten: two owners at once";
    const auto s = pool.stats();
    EXPECT_EQ(s.in_use, 0U);
    EXPECT_EQ(s.invalid_frees, 0U);
    EXPECT_EQ(s.reserved, host.allocated_bytes());
    EXPECT_EQ(s.in_use + s.cached_bytes, s.reserved) << "held bytes neither in use nor cached";
  }
  EXPECT_EQ(host.allocated_bytes(), 0U);
}

TEST(stream_pool_concurrency, streams_on_threads_with_cross_stream_frees_and_releases) {
  host_resource host{48 << 20};
  streams_on_threads_with_cross_stream_frees_and_releases(host);
}

// The same over host_vmm: each stream's bfc maps and unmaps granules of its own ranges of one
// shared reservation while the others do (under ThreadSanitizer too).
TEST(stream_pool_concurrency, over_host_vmm_streams_map_and_unmap_granules_on_threads) {
  host_vmm_resource vm{{.address_range_bytes = std::size_t{1} << 30,
                        .granule_bytes = std::size_t{64} << 10,
                        .capacity = std::size_t{48} << 20}};
  streams_on_threads_with_cross_stream_frees_and_releases(vm);
  EXPECT_EQ(vm.mapped_bytes(), 0U);
  EXPECT_EQ(vm.counts().address_bytes, 0U);
}

}  // namespace
}  // namespace poolscope::pool::testing
