// thread_cache_adaptor around bfc and best_fit (thread_cache_adaptor.hpp, docs/thread_cache.md):
// hits, bounds, stats, invalid frees, flushes, the invariants of records kept per thread (a block
// recorded by one thread freed by another, double frees across threads, no record outliving its
// block), and (suite thread_cache_concurrency, also run under ThreadSanitizer) cross-thread frees,
// flushes under contention, thread exit and adaptor destruction while other threads still hold
// caches. The contract every allocator keeps is checked by the conformance suite, which runs over
// the adaptor around each strategy. Counters are checked against allocator_model (model.hpp), fed
// from the hook events of each allocation.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../../pool/src/detail/thread_cache.hpp"
#include "hooks/recording_hook.hpp"
#include "pool/model.hpp"
#include "poolscope/error.hpp"
#include "poolscope/hooks/hook.hpp"
#include "poolscope/pool/best_fit_allocator.hpp"
#include "poolscope/pool/bfc_allocator.hpp"
#include "poolscope/pool/factory.hpp"
#include "poolscope/pool/host_resource.hpp"
#include "poolscope/pool/thread_cache_adaptor.hpp"

namespace poolscope::pool::testing {
namespace {

using hooks::event_kind;
using hooks::event_phase;
using hooks::free_error;

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;

/// A cache of the given bounds around a new strategy A over `r`.
template <typename A>
std::unique_ptr<thread_cache_adaptor> make(resource& r, thread_cache_adaptor_options o = {}) {
  return std::make_unique<thread_cache_adaptor>(std::make_unique<A>(r), o);
}
/// The factory's name of strategy A.
template <typename A>
constexpr const char* factory_name = "";
template <>
constexpr const char* factory_name<bfc_allocator> = "bfc";
template <>
constexpr const char* factory_name<best_fit_allocator> = "best_fit";

/// Allocates through `a`, recording the block in `m` with the rounded size its event reports.
void* take(allocator& a, allocator_model& m, std::size_t bytes, stream_view s = {}) {
  rounded_size_hook h{a.id()};
  hooks::scoped_hook on{h, hooks::scope::thread};
  void* p = a.allocate(s, bytes);
  EXPECT_EQ(h.ptr_, p);
  EXPECT_TRUE(m.on_allocate(p, bytes, h.rounded_, max_alignment)) << "handed out twice: " << p;
  return p;
}
void give(allocator& a, allocator_model& m, void* p, stream_view s = {}) {
  const model_block b = m.on_deallocate(p);
  a.deallocate(s, p, b.requested);
}

/// Runs `fill` on a thread of its own, which then stays alive and idle (so its cache keeps what
/// `fill` left in it) until this object is destroyed. Constructing waits for `fill` to finish.
class parked_thread {
 public:
  explicit parked_thread(std::function<void()> fill)
      : thread_([this, fill = std::move(fill)] {
          fill();
          filled_ = true;
          while (!done_.load()) {
            std::this_thread::yield();
          }
        }) {
    while (!filled_.load()) {
      std::this_thread::yield();
    }
  }
  parked_thread(const parked_thread&) = delete;
  parked_thread& operator=(const parked_thread&) = delete;
  ~parked_thread() {
    done_ = true;
    thread_.join();
  }

 private:
  std::atomic<bool> filled_{false};
  std::atomic<bool> done_{false};
  std::thread thread_;  // last: started once the flags exist
};

/// Allocates `count` blocks of `bytes` at once, then frees them all (into the calling thread's
/// cache, as far as its bounds and the sizes in demand there allow).
void churn(allocator& a, std::size_t bytes, int count) {
  std::vector<void*> v;
  for (int i = 0; i < count; ++i) {
    v.push_back(a.allocate({}, bytes));
  }
  for (void* p : v) {
    a.deallocate({}, p, bytes);
  }
}

/// A thread that allocates a block of `bytes` its cache records (the size asked for twice), then
/// waits; finish() lets it free that block once more and joins it. Constructing waits for the
/// block.
class recording_thread {
 public:
  recording_thread(allocator& a, std::size_t bytes)
      : thread_([this, &a, bytes] {
          a.deallocate({}, a.allocate({}, bytes), bytes);
          block_ = a.allocate({}, bytes);  // in demand: recorded in this thread's table
          phase_ = 1;
          while (phase_.load() != 2) {
            std::this_thread::yield();
          }
          a.deallocate({}, block_, bytes);  // freed by another thread meanwhile
        }) {
    while (phase_.load() != 1) {
      std::this_thread::yield();
    }
  }
  recording_thread(const recording_thread&) = delete;
  recording_thread& operator=(const recording_thread&) = delete;
  ~recording_thread() { finish(); }
  [[nodiscard]] void* block() const { return block_; }
  void finish() {
    phase_ = 2;
    if (thread_.joinable()) {
      thread_.join();
    }
  }

 private:
  void* block_ = nullptr;
  std::atomic<int> phase_{0};
  std::thread thread_;  // last: started once the rest exists
};

/// The inner strategy's own consistency check, where it has one (bfc).
void expect_consistent(const thread_cache_adaptor& a) {
  if (const auto* bfc = dynamic_cast<const bfc_allocator*>(&a.inner())) {
    EXPECT_EQ(bfc->check_invariants(), "");
  }
}

/// Two blocks of `bytes` at once are two blocks (none is handed out twice); both freed again.
void expect_handed_out_once(thread_cache_adaptor& a, std::size_t bytes) {
  void* x = a.allocate({}, bytes);
  void* y = a.allocate({}, bytes);
  EXPECT_NE(x, y);
  a.deallocate({}, x, bytes);
  a.deallocate({}, y, bytes);
}

template <typename A>
class thread_cache : public ::testing::Test {};
using cached_strategies = ::testing::Types<bfc_allocator, best_fit_allocator>;
TYPED_TEST_SUITE(thread_cache, cached_strategies);

/// The strategy behind `a`, when a thread_cache_adaptor stands in front of it.
const allocator* behind_a_cache(const allocator& a) {
  const auto* cached = dynamic_cast<const thread_cache_adaptor*>(&a);
  return cached != nullptr ? &cached->inner() : nullptr;
}

TYPED_TEST(thread_cache, the_factory_composes_it_by_default_and_can_leave_it_out) {
  host_resource host;
  const auto made = make_allocator(factory_name<TypeParam>, host);
  ASSERT_NE(behind_a_cache(*made), nullptr);
  EXPECT_NE(dynamic_cast<const TypeParam*>(behind_a_cache(*made)), nullptr);
  EXPECT_EQ(made->name(), behind_a_cache(*made)->name()) << "the cache reports as its strategy";
  const auto bare = make_allocator(factory_name<TypeParam>, host, {.thread_cache = false});
  EXPECT_NE(dynamic_cast<const TypeParam*>(bare.get()), nullptr);
  EXPECT_EQ(behind_a_cache(*make_allocator("naive", host)), nullptr);
  EXPECT_EQ(behind_a_cache(*make_allocator("stream_pool", host)), nullptr);
  try {
    (void)thread_cache_adaptor(nullptr);
    ADD_FAILURE() << "an adaptor without an inner allocator was built";
  } catch (const invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("null"), std::string::npos) << e.what();
  }
}

TYPED_TEST(thread_cache, a_freed_block_is_reused_on_its_stream_and_counts_as_cached) {
  host_resource host;
  auto alloc = make<TypeParam>(host);
  thread_cache_adaptor& a = *alloc;
  allocator_model m;
  int s1 = 0;
  int s2 = 0;
  void* p = take(a, m, 1000, &s1);
  give(a, m, p, &s1);
  auto s = a.stats();
  EXPECT_TRUE(m.matches(s));
  EXPECT_EQ(s.in_use, 0U);
  EXPECT_GE(s.cached_blocks, 1U);
  EXPECT_EQ(s.in_use + s.cached_bytes, s.reserved);
  // Same stream, same rounded size: the same block.
  void* q = take(a, m, 900, &s1);
  EXPECT_EQ(q, p);
  EXPECT_TRUE(m.matches(a.stats()));
  give(a, m, q, &s1);
  // Another stream never gets it from the cache (the strategy may hand out other memory).
  void* r = take(a, m, 1000, &s2);
  EXPECT_NE(r, p) << "a block freed on one stream came out of the cache for another";
  give(a, m, r, &s2);
  s = a.stats();
  EXPECT_TRUE(m.matches(s));
  EXPECT_EQ(s.in_use + s.cached_bytes, s.reserved);
}

TYPED_TEST(thread_cache, hooks_see_every_cached_malloc_and_free_with_its_fields) {
  host_resource host;
  auto alloc = make<TypeParam>(host);
  thread_cache_adaptor& a = *alloc;
  void* warm = a.allocate({}, 3000);
  a.deallocate({}, warm, 3000);  // now cached
  poolscope::testing::recording_hook rec{a.id()};
  void* p = nullptr;
  {
    hooks::scoped_hook on{rec, hooks::scope::thread};
    p = a.allocate({}, 2600);  // a hit: 3072 rounded, like 3000
    a.deallocate({}, p, 2600);
  }
  EXPECT_EQ(p, warm);
  const auto pre = rec.of(event_kind::pool_malloc, event_phase::pre);
  const auto post = rec.of(event_kind::pool_malloc, event_phase::post);
  const auto fpre = rec.of(event_kind::pool_free, event_phase::pre);
  const auto fpost = rec.of(event_kind::pool_free, event_phase::post);
  ASSERT_EQ(pre.size(), 1U);
  ASSERT_EQ(post.size(), 1U);
  ASSERT_EQ(fpre.size(), 1U);
  ASSERT_EQ(fpost.size(), 1U);
  EXPECT_EQ(post[0].ptr, p);
  EXPECT_EQ(post[0].requested, 2600U);
  EXPECT_EQ(post[0].rounded, 3072U);
  EXPECT_EQ(post[0].in_use, 3072U);
  EXPECT_EQ(fpost[0].ptr, p);
  EXPECT_EQ(fpost[0].requested, 2600U) << "the free reports the size of this allocation";
  EXPECT_EQ(fpost[0].rounded, 3072U);
  EXPECT_EQ(fpost[0].in_use, 0U);
  EXPECT_LT(pre[0].seq, post[0].seq);
  EXPECT_LT(post[0].seq, fpre[0].seq);
  EXPECT_LT(fpre[0].seq, fpost[0].seq);
  EXPECT_TRUE(rec.of(event_kind::device_alloc, event_phase::post).empty());
}

TYPED_TEST(thread_cache, is_bounded_in_blocks_and_bytes) {
  host_resource host;
  thread_cache_adaptor_options o;
  o.max_blocks = 4;
  o.max_bytes = 64 * KiB;
  o.max_block_bytes = 32 * KiB;
  auto alloc = make<TypeParam>(host, o);
  thread_cache_adaptor& a = *alloc;
  allocator_model m;
  std::vector<void*> blocks;
  for (int i = 0; i < 8; ++i) {
    blocks.push_back(take(a, m, 8 * KiB));
  }
  void* big = take(a, m, 40 * KiB);  // above max_block_bytes: never cached
  give(a, m, big);
  for (void* p : blocks) {
    give(a, m, p);
  }
  EXPECT_TRUE(m.matches(a.stats()));
  // Only 4 blocks stay in this thread's cache: a flush moves exactly those.
  EXPECT_EQ(a.flush(), 4 * 8 * KiB);
  EXPECT_EQ(a.flush(), 0U);

  // Bytes: 24 KiB blocks, at most two fit in 64 KiB.
  std::vector<void*> mid;
  for (int i = 0; i < 4; ++i) {
    mid.push_back(take(a, m, 24 * KiB));
  }
  for (void* p : mid) {
    give(a, m, p);
  }
  EXPECT_EQ(a.flush(), 2 * 24 * KiB);
  EXPECT_TRUE(m.matches(a.stats()));
  a.release_cached();
  EXPECT_EQ(a.stats().reserved, 0U);
  EXPECT_EQ(host.allocated_bytes(), 0U);
}

// A cache holds at most 256 blocks; asking for more was clamped silently.
TYPED_TEST(thread_cache, more_blocks_than_a_cache_can_hold_is_a_typed_error_naming_the_value) {
  host_resource host;
  thread_cache_adaptor_options o;
  o.max_blocks = 257;
  try {
    (void)make<TypeParam>(host, o);
    ADD_FAILURE() << "max_blocks 257 was accepted";
  } catch (const invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("max_blocks 257"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("256"), std::string::npos) << e.what();
  }
  EXPECT_EQ(host.allocated_bytes(), 0U);
  o.max_blocks = 256;
  auto alloc = make<TypeParam>(host, o);
  allocator_model m;
  give(*alloc, m, take(*alloc, m, 1 * KiB));
  EXPECT_TRUE(m.matches(alloc->stats()));
}

TYPED_TEST(thread_cache, least_recently_used_sizes_make_room) {
  host_resource host;
  thread_cache_adaptor_options o;
  o.max_blocks = 3;
  auto alloc = make<TypeParam>(host, o);
  thread_cache_adaptor& a = *alloc;
  allocator_model m;
  for (std::size_t kib = 1; kib <= 4; ++kib) {
    give(a, m, take(a, m, kib * KiB));  // asked for once: each size is now in demand here
  }
  EXPECT_EQ(a.flush(), 0U) << "a size asked for once was cached";
  void* x = take(a, m, 1 * KiB);
  void* y = take(a, m, 2 * KiB);
  void* z = take(a, m, 3 * KiB);
  void* w = take(a, m, 4 * KiB);
  give(a, m, x);
  give(a, m, y);
  give(a, m, z);
  give(a, m, w);  // x's size (least recently used) goes back to the strategy
  EXPECT_EQ(a.flush(), (2 + 3 + 4) * KiB);
  EXPECT_TRUE(m.matches(a.stats()));
}

TYPED_TEST(thread_cache, invalid_frees_of_cached_and_live_blocks_are_reported) {
  host_resource host;
  auto alloc = make<TypeParam>(host);
  thread_cache_adaptor& a = *alloc;
  allocator_model m;
  void* keep = take(a, m, 5000);
  give(a, m, take(a, m, 1000));  // asked for once: the next block of this size is cached
  void* p = take(a, m, 1000);
  give(a, m, p);  // cached in this thread's cache
  ASSERT_GT(a.stats().cached_bytes, 0U);
  const auto before = a.stats();
  poolscope::testing::recording_hook rec{a.id()};
  int local = 0;
  {
    hooks::scoped_hook on{rec, hooks::scope::thread};
    a.deallocate({}, p, 1000);       // double free of a cached block
    a.deallocate({}, &local, 4);     // never allocated
    a.deallocate({}, keep, 100000);  // wrong size: corrected
  }
  const auto inv = rec.of(event_kind::invalid_free, event_phase::instant);
  ASSERT_EQ(inv.size(), 3U);
  EXPECT_EQ(inv[0].error, free_error::double_free);
  EXPECT_EQ(inv[1].error, free_error::unknown_pointer);
  EXPECT_EQ(inv[2].error, free_error::size_mismatch);
  (void)m.on_deallocate(keep);
  const auto s = a.stats();
  EXPECT_TRUE(m.matches(s));
  EXPECT_EQ(s.invalid_frees, before.invalid_frees + 3);
  EXPECT_EQ(s.deallocations, before.deallocations + 1);
  EXPECT_EQ(s.in_use + s.cached_bytes, s.reserved);
  // The double-freed block is handed out once only.
  void* x = take(a, m, 1000);
  void* y = take(a, m, 1000);
  EXPECT_NE(x, y);
  give(a, m, x);
  give(a, m, y);
  EXPECT_TRUE(m.matches(a.stats()));
}

// A size asked for once is the strategy's alone: its free goes straight back (bfc merges it)
// and the cache records nothing. The second request of the size is recorded, its free cached.
TYPED_TEST(thread_cache, only_sizes_in_demand_are_recorded_and_cached) {
  host_resource host;
  auto alloc = make<TypeParam>(host);
  thread_cache_adaptor& a = *alloc;
  allocator_model m;
  void* p = take(a, m, 3 * KiB);
  give(a, m, p);
  EXPECT_EQ(a.flush(), 0U) << "a size asked for once was cached";
  EXPECT_TRUE(m.matches(a.stats()));
  void* q = take(a, m, 3 * KiB);
  give(a, m, q);
  EXPECT_EQ(a.flush(), 3 * KiB) << "a size asked for twice was not cached";
  // Sizes asked for once each never displace one in demand.
  void* r = take(a, m, 3 * KiB);
  give(a, m, r);
  for (std::size_t i = 1; i <= 40; ++i) {
    give(a, m, take(a, m, (8 + i) * KiB));
  }
  void* again = take(a, m, 3 * KiB);
  EXPECT_EQ(again, r) << "the cached block was not reused";
  give(a, m, again);
  EXPECT_TRUE(m.matches(a.stats()));
  expect_consistent(a);
}

// A block one thread's cache recorded, freed by another thread: the free finds the block in the
// owner's table (its address filter counts it) and takes it out, so the owner's later free of it
// is a double free, and the pool stays consistent.
TYPED_TEST(thread_cache, a_block_recorded_by_one_thread_is_freed_by_another_once) {
  host_resource host;
  auto alloc = make<TypeParam>(host);
  thread_cache_adaptor& a = *alloc;
  recording_thread owner{a, 6 * KiB};
  a.deallocate({}, owner.block(), 6 * KiB);
  owner.finish();  // the owner's free of it: a double free now
  auto s = a.stats();
  EXPECT_EQ(s.invalid_frees, 1U) << "the owner's second free was not reported";
  EXPECT_EQ(s.in_use, 0U);
  EXPECT_EQ(s.requested_in_use, 0U);
  EXPECT_EQ(s.allocations, 2U);
  EXPECT_EQ(s.deallocations, 2U);
  EXPECT_EQ(s.in_use + s.cached_bytes, s.reserved);
  // The block is the strategy's again, handed out once.
  expect_handed_out_once(a, 6 * KiB);
  s = a.stats();
  EXPECT_EQ(s.in_use, 0U);
  EXPECT_EQ(s.deallocations, 4U);
  expect_consistent(a);
}

TYPED_TEST(thread_cache, release_cached_reaches_every_threads_cache) {
  host_resource host;
  auto alloc = make<TypeParam>(host);
  thread_cache_adaptor& a = *alloc;
  // Another thread fills its own cache and stays alive, idle.
  const parked_thread other([&] { churn(a, 64 * KiB, 8); });
  auto s = a.stats();
  EXPECT_EQ(s.in_use, 0U);
  EXPECT_EQ(s.cached_bytes, s.reserved) << "the other thread's cache counts as cached";
  EXPECT_GT(a.flush(), 0U) << "the other thread's cache held nothing";
  EXPECT_EQ(a.flush(), 0U);
  void* p = a.allocate({}, 64 * KiB);  // may reuse the other thread's memory now
  a.deallocate({}, p, 64 * KiB);
  EXPECT_GT(a.release_cached(), 0U);
  s = a.stats();
  EXPECT_EQ(s.reserved, 0U) << "release_cached left blocks in a thread cache";
  EXPECT_EQ(s.cached_bytes, 0U);
  EXPECT_EQ(host.allocated_bytes(), 0U);
}

// A request refused by the limit on reserved bytes retries after every thread's cache went back
// to the inner allocator (and it released what became wholly free): blocks another thread keeps
// idle do not make it fail.
TYPED_TEST(thread_cache, a_request_refused_by_the_limit_takes_blocks_from_other_threads_caches) {
  host_resource host;
  auto alloc = make<TypeParam>(host);
  thread_cache_adaptor& a = *alloc;
  const parked_thread other([&] { churn(a, 64 * KiB, 8); });
  const std::size_t reserved = a.stats().reserved;
  ASSERT_GT(a.stats().cached_bytes, 0U);
  a.set_limit(reserved);  // no room for a byte more upstream
  void* p = nullptr;
  // As much as is reserved: more than the inner allocator has free beside the cached blocks.
  EXPECT_NO_THROW(p = a.allocate({}, reserved)) << "the idle cached blocks were not reclaimed";
  if (p != nullptr) {
    a.deallocate({}, p, reserved);
  }
  const auto s = a.stats();
  EXPECT_GE(s.limit_hits, 1U) << "the first try was not refused by the limit";
  EXPECT_LE(s.reserved, reserved);
  EXPECT_EQ(s.in_use, 0U);
}

// A block sitting in one thread's bin, freed by another thread: a double free, reported, and
// the block stays where it is (not handed to the inner allocator, which sees it in use).
TYPED_TEST(thread_cache, a_double_free_of_a_block_cached_by_another_thread_is_reported) {
  host_resource host;
  auto alloc = make<TypeParam>(host);
  thread_cache_adaptor& a = *alloc;
  void* p = nullptr;
  const parked_thread owner([&] {
    a.deallocate({}, a.allocate({}, 6 * KiB), 6 * KiB);  // asked for once: in demand now
    p = a.allocate({}, 6 * KiB);                         // recorded
    a.deallocate({}, p, 6 * KiB);                        // cached in this thread's bin
  });
  ASSERT_GT(a.stats().cached_bytes, 0U);
  const auto before = a.stats();
  poolscope::testing::recording_hook rec{a.id()};
  {
    hooks::scoped_hook on{rec, hooks::scope::thread};
    a.deallocate({}, p, 6 * KiB);
  }
  const auto inv = rec.of(event_kind::invalid_free, event_phase::instant);
  ASSERT_EQ(inv.size(), 1U);
  EXPECT_EQ(inv[0].error, free_error::double_free);
  const auto after = a.stats();
  EXPECT_EQ(after.deallocations, before.deallocations);
  EXPECT_EQ(after.in_use, 0U);
  EXPECT_EQ(after.cached_bytes, before.cached_bytes) << "the block was cached twice";
  EXPECT_EQ(after.in_use + after.cached_bytes, after.reserved);
  // The block is handed out once: flushed back, two allocations of its size differ.
  EXPECT_EQ(a.flush(), 6 * KiB);
  expect_handed_out_once(a, 6 * KiB);
  expect_consistent(a);
}

// A record leaves with its block, whichever thread frees it: once a block recorded by one
// thread is freed by another and handed out again for another size of its rounding, the new
// owner's free is checked against the new request, and the first thread's free of it (a double
// free) is reported, never cached under the old size.
TYPED_TEST(thread_cache, a_record_never_outlives_its_block) {
  host_resource host;
  auto alloc = make<TypeParam>(host);
  thread_cache_adaptor& a = *alloc;
  recording_thread first{a, 6 * KiB};
  void* const p = first.block();
  a.deallocate({}, p, 6 * KiB);  // another thread frees it: the first thread's record goes
  // This thread's first request of the size: the inner allocator's, which hands out p again.
  void* q = a.allocate({}, 6 * KiB - 300);
  const bool reused = q == p;
  first.finish();  // its free of the block, freed and handed out again meanwhile
  auto s = a.stats();
  if (reused) {
    // The first thread's free named the block q now is: freed by whoever frees it first, the
    // block goes back once, and the second free is the one reported.
    EXPECT_EQ(s.invalid_frees, 0U) << "the first thread's free of the block now live as q";
    EXPECT_EQ(s.in_use, 0U);
    a.deallocate({}, q, 6 * KiB - 300);
    s = a.stats();
    EXPECT_EQ(s.invalid_frees, 1U) << "the second free of the reused block was not reported";
  } else {
    EXPECT_EQ(s.invalid_frees, 1U) << "the first thread's second free was not reported";
    a.deallocate({}, q, 6 * KiB - 300);
    s = a.stats();
  }
  EXPECT_EQ(s.in_use, 0U);
  EXPECT_EQ(s.requested_in_use, 0U);
  EXPECT_EQ(s.in_use + s.cached_bytes, s.reserved);
  // Nothing cached under a stale size: the blocks of the size are handed out once each.
  expect_handed_out_once(a, 6 * KiB);
  expect_consistent(a);
}

// The biased lock of a cache is revoked only when another thread must take it: not by the
// holder's own flushes, stats and releases, nor by flushes that find a cache empty.
TYPED_TEST(thread_cache, only_other_threads_touching_a_cache_with_blocks_revoke_its_bias) {
  if (!owner_bias_available()) {
    GTEST_SKIP() << "membarrier(2) private expedited is unavailable here (or under "
                    "ThreadSanitizer): thread caches' locks are never biased";
  }
  host_resource host;
  auto alloc = make<TypeParam>(host);
  thread_cache_adaptor& a = *alloc;
  const parked_thread empty([&] {
    churn(a, 64 * KiB, 2);
    (void)a.flush();  // its own cache, as its owner: empty now, still biased
  });
  churn(a, 64 * KiB, 8);  // this thread's cache holds blocks now
  (void)a.stats();
  (void)a.flush();
  churn(a, 64 * KiB, 8);
  (void)a.release_cached();
  for (int i = 0; i < 64; ++i) {
    churn(a, (1 + static_cast<std::size_t>(i)) * 512 * KiB, 1);  // grows the pool
  }
  EXPECT_EQ(a.counts().revocations, 0U)
      << "the owner's own flushes and stats, or flushes of an empty cache, revoked a bias";
  {
    const parked_thread full([&] { churn(a, 64 * KiB, 4); });  // its cache holds blocks, idle
    (void)a.stats();                                           // takes its lock: one revocation
    EXPECT_EQ(a.counts().revocations, 1U);
    EXPECT_GT(a.flush(), 0U);  // revoked already: no second fence
    EXPECT_EQ(a.counts().revocations, 1U);
  }
}

// A cache whose requests rarely hit (sizes that do not repeat) rests: it is bypassed, caches
// nothing, then samples again, and stays on for a workload whose sizes repeat.
TYPED_TEST(thread_cache, a_cache_that_rarely_hits_rests_then_samples_again) {
  using detail::thread_cache;
  host_resource host;
  auto alloc = make<TypeParam>(host);
  thread_cache_adaptor& a = *alloc;
  auto pair = [&a](std::size_t bytes) { a.deallocate({}, a.allocate({}, bytes), bytes); };
  // Sizes that recur only 2000 requests apart: the ring of recent misses never holds them.
  for (std::uint32_t i = 0; i < thread_cache::sample_takes; ++i) {
    pair(512 * (1 + i % 2000));
  }
  auto n = a.counts();
  EXPECT_EQ(n.caches, 1U);
  EXPECT_EQ(n.rests, 1U);
  EXPECT_EQ(n.resting, 1U);
  EXPECT_EQ(a.flush(), 0U) << "a resting cache gave its blocks back";
  // Resting, it caches nothing, even a size asked for again and again.
  for (int i = 0; i < 4; ++i) {
    pair(64 * KiB);
  }
  EXPECT_EQ(a.flush(), 0U) << "a resting cache kept a freed block";
  for (std::uint32_t i = 4; i < thread_cache::resting_takes; ++i) {
    pair(64 * KiB);
  }
  n = a.counts();
  EXPECT_EQ(n.resting, 0U) << "the rest lasts resting_takes requests";
  for (int i = 0; i < 4; ++i) {
    pair(64 * KiB);
  }
  EXPECT_EQ(a.flush(), 64 * KiB) << "after its rest the cache caches again";
  // Half the requests hit: above the bar, no rest.
  for (std::uint32_t i = 0; i < 3 * thread_cache::sample_takes; ++i) {
    pair(i % 2 == 0 ? 64 * KiB : 512 * (1 + i % 2000));
  }
  n = a.counts();
  EXPECT_EQ(n.rests, 1U);
  EXPECT_EQ(n.resting, 0U);
  const auto s = a.stats();
  EXPECT_EQ(s.in_use, 0U);
  EXPECT_EQ(s.allocations, s.deallocations);
  EXPECT_EQ(s.in_use + s.cached_bytes, s.reserved);
}

// Each bad sample right after a rest doubles the next rest (up to max_resting_takes); a good
// sample brings it back to resting_takes.
TYPED_TEST(thread_cache, a_cache_that_keeps_missing_rests_longer_each_time) {
  using detail::thread_cache;
  host_resource host;
  auto alloc = make<TypeParam>(host);
  thread_cache_adaptor& a = *alloc;
  std::uint32_t k = 0;
  // Sizes that recur only 2000 requests apart: nearly every request misses.
  auto random_pairs = [&](std::uint32_t n) {
    for (std::uint32_t i = 0; i < n; ++i, ++k) {
      const std::size_t bytes = 512 * (1 + k % 2000);
      a.deallocate({}, a.allocate({}, bytes), bytes);
    }
  };
  auto resting = [&a] { return a.counts().resting == 1; };
  random_pairs(thread_cache::sample_takes);
  ASSERT_EQ(a.counts().rests, 1U);
  random_pairs(thread_cache::resting_takes - 1);
  EXPECT_TRUE(resting());
  random_pairs(1);
  EXPECT_FALSE(resting()) << "the first rest lasts resting_takes requests";
  random_pairs(thread_cache::sample_takes);
  ASSERT_EQ(a.counts().rests, 2U);
  random_pairs(2 * thread_cache::resting_takes - 1);
  EXPECT_TRUE(resting()) << "a second bad sample in a row doubles the rest";
  random_pairs(1);
  EXPECT_FALSE(resting());
  // Repeated sizes: the sample is good, and the next rest is back to resting_takes.
  for (std::uint32_t i = 0; i < thread_cache::sample_takes; ++i) {
    a.deallocate({}, a.allocate({}, 64 * KiB), 64 * KiB);
  }
  EXPECT_EQ(a.counts().rests, 2U);
  random_pairs(thread_cache::sample_takes);
  ASSERT_EQ(a.counts().rests, 3U);
  random_pairs(thread_cache::resting_takes - 1);
  EXPECT_TRUE(resting());
  random_pairs(1);
  EXPECT_FALSE(resting()) << "a good sample resets the rest to resting_takes";
  static_assert(thread_cache::max_resting_takes >= 4 * thread_cache::resting_takes);
  const auto s = a.stats();
  EXPECT_EQ(s.in_use, 0U);
  EXPECT_EQ(s.allocations, s.deallocations);
}

TYPED_TEST(thread_cache, out_of_memory_retry_takes_blocks_from_other_threads_caches) {
  host_resource host{256 * KiB};  // room for 4 blocks of 64 KiB (bfc: segments of 64 KiB)
  auto alloc = make<TypeParam>(host);
  thread_cache_adaptor& a = *alloc;
  // Another thread takes all the memory, frees it into its own cache and stays alive, idle.
  {
    std::size_t got = 0;
    const parked_thread other([&] {
      std::vector<void*> v;
      try {
        for (;;) {
          v.push_back(a.allocate({}, 64 * KiB));
        }
      } catch (const out_of_memory&) {
      }
      got = v.size();
      for (void* p : v) {
        a.deallocate({}, p, 64 * KiB);
      }
    });
    ASSERT_GT(got, 0U);
    // Every byte the resource had sits in the other thread's cache: this request succeeds only
    // if the out-of-memory retry reclaims it.
    void* p = nullptr;
    EXPECT_NO_THROW(p = a.allocate({}, 64 * KiB));
    if (p != nullptr) {
      a.deallocate({}, p, 64 * KiB);
    }
  }  // the other thread exits here, retiring its cache
  EXPECT_EQ(a.stats().in_use, 0U);
}

// The counting contract (allocator.hpp, "Counters"): totals are exact; peaks are exact on one
// thread and, across threads, never less than the true peak nor more than the reserved peak.
TYPED_TEST(thread_cache, peaks_are_exact_on_one_thread_and_bound_the_true_peak_across_threads) {
  host_resource host;
  auto alloc = make<TypeParam>(host);
  thread_cache_adaptor& a = *alloc;
  allocator_model m;
  // One thread: a miss, a free into the cache, hits of smaller requests of the same rounded
  // size; the peaks follow the model exactly after every step.
  for (std::size_t bytes : {100 * KiB, 100 * KiB - 1000, std::size_t{3000}}) {
    give(a, m, take(a, m, bytes));  // every size asked for once first: then in demand here
  }
  void* p = take(a, m, 100 * KiB);
  EXPECT_TRUE(m.matches(a.stats())) << "the first block";
  give(a, m, p);
  for (std::size_t bytes : {100 * KiB - 1000, 100 * KiB - 10, 100 * KiB}) {
    p = take(a, m, bytes);
    void* q = take(a, m, 3000);
    EXPECT_TRUE(m.matches(a.stats())) << "hits and misses of " << bytes;
    give(a, m, q);
    give(a, m, p);
    EXPECT_TRUE(m.matches(a.stats())) << "both freed into the cache";
  }
  const std::size_t true_peak = a.stats().peak_in_use;

  // Another thread, while this thread's blocks sit in its cache: the totals stay exact, and the
  // peak bounds both threads' use.
  std::size_t rounded = 0;
  std::thread other([&] {
    void* b = a.allocate({}, 40 * KiB);
    rounded = a.stats().in_use;  // exact: only this block is live
    a.deallocate({}, b, 40 * KiB);
  });
  other.join();
  const auto s = a.stats();
  EXPECT_EQ(s.in_use, 0U) << "totals are exact";
  EXPECT_EQ(s.requested_in_use, 0U);
  EXPECT_GE(rounded, 40 * KiB);
  EXPECT_GE(s.peak_in_use, true_peak);
  EXPECT_GE(s.peak_in_use, rounded);
  EXPECT_LE(s.peak_in_use, s.peak_reserved);
  EXPECT_EQ(s.allocations, s.deallocations);
  EXPECT_EQ(s.allocations, m.allocations() + 1);
}

// The in-use limit is checked against the exact total: blocks cached by a thread do not make a
// request that fits fail. Here the request needs upstream memory, which the out-of-memory
// retry finds by releasing the cached block.
TYPED_TEST(thread_cache, the_limit_counts_in_use_bytes_not_cached_ones) {
  host_resource host;
  auto alloc = make<TypeParam>(host);
  thread_cache_adaptor& a = *alloc;
  a.set_limit(3 * MiB);
  void* p = a.allocate({}, 768 * KiB);
  a.deallocate({}, p, 768 * KiB);
  ASSERT_EQ(a.stats().cached_bytes, a.stats().reserved);
  void* big = nullptr;
  EXPECT_NO_THROW(big = a.allocate({}, 5 * MiB / 2)) << "768 KiB cached + 2.5 MiB <= 3 MiB in use";
  ASSERT_NE(big, nullptr);
  EXPECT_THROW((void)a.allocate({}, 768 * KiB), out_of_memory) << "2.5 MiB + 768 KiB > 3 MiB";
  const auto s = a.stats();
  EXPECT_EQ(s.requested_in_use, 5 * MiB / 2);
  EXPECT_GE(s.limit_hits, 1U);
  a.deallocate({}, big, 5 * MiB / 2);
  EXPECT_EQ(a.stats().in_use, 0U);
  void* again = a.allocate({}, 768 * KiB);  // the pool stays usable
  a.deallocate({}, again, 768 * KiB);
}

// A request refused by the limit names the largest free block, blocks idle in thread caches
// included (stats() counts them; the message named only the strategy's own free blocks).
TYPED_TEST(thread_cache, out_of_memory_names_a_thread_cached_block_as_the_largest_free_one) {
  host_resource host;
  auto alloc = make<TypeParam>(host);
  thread_cache_adaptor& a = *alloc;
  a.set_limit(100 * KiB);
  for (int i = 0; i < 3; ++i) {  // asked for again and again: a size the cache keeps
    a.deallocate({}, a.allocate({}, 64 * KiB), 64 * KiB);
  }
  ASSERT_GE(a.stats().largest_free_block, 64 * KiB);
  try {
    (void)a.allocate({}, 128 * KiB);  // in use 0 + 128 KiB > 100 KiB
    FAIL() << "128 KiB within a 100 KiB limit";
  } catch (const out_of_memory& e) {
    EXPECT_EQ(e.cause().rfind("limit", 0), 0U) << e.what();
    EXPECT_EQ(e.context().largest_free_block, a.stats().largest_free_block) << e.what();
    EXPECT_NE(std::string(e.what()).find(format_bytes(a.stats().largest_free_block)),
              std::string::npos)
        << e.what();
  }
}

// The limit counts a request at the size its block takes (in-use bytes count that): a 600 B
// request that a cached 1024 B block would serve passed a 1000 B limit and took in use to 1024.
TYPED_TEST(thread_cache, the_limit_counts_a_request_at_its_rounded_size) {
  host_resource host;
  auto alloc = make<TypeParam>(host);
  thread_cache_adaptor& a = *alloc;
  for (int i = 0; i < 3; ++i) {  // a cached 1024 B block (in the thread cache or the strategy)
    a.deallocate({}, a.allocate({}, 1000), 1000);
  }
  a.set_limit(1000);
  EXPECT_THROW((void)a.allocate({}, 600), out_of_memory) << "600 B takes 1024 B, over 1000 B";
  EXPECT_EQ(a.stats().in_use, 0U);
  a.set_limit(1024);
  void* p = a.allocate({}, 600);  // exactly at the limit
  EXPECT_EQ(a.stats().in_use, 1024U);
  a.deallocate({}, p, 600);
}

// ---- threads ------------------------------------------------------------------------------

template <typename A>
class thread_cache_concurrency : public ::testing::Test {};
TYPED_TEST_SUITE(thread_cache_concurrency, cached_strategies);

// Blocks allocated on one thread and freed on another (and back), while a janitor flushes
// every cache and reads stats. Every block is filled with its owner's value and checked before
// it is freed; the final counters must match the number of operations exactly.
TYPED_TEST(thread_cache_concurrency, cross_thread_frees_and_flushes_keep_blocks_and_counters) {
  constexpr int threads = 4;
  const std::uint64_t seed = test_seed();
  const std::uint64_t ops = env_count("POOLSCOPE_CONCURRENCY_OPS", under_sanitizer ? 3000 : 30000);
  host_resource host;
  auto alloc = make<TypeParam>(host);
  thread_cache_adaptor& a = *alloc;
  struct blk {
    void* p;
    std::size_t n;
    unsigned char v;
  };
  std::mutex mailbox_mutex;
  std::vector<std::vector<blk>> mailbox(threads);  // blocks sent to thread i to free
  std::atomic<int> bad{0};
  std::atomic<std::uint64_t> allocs{0};
  std::atomic<int> running{threads};
  auto check_and_free = [&](const blk& b) {
    const auto* c = static_cast<const unsigned char*>(b.p);
    for (std::size_t i = 0; i < b.n; i += 97) {
      if (c[i] != b.v) {
        bad.fetch_add(1);
        break;
      }
    }
    a.deallocate({}, b.p, b.n);
  };
  auto worker = [&](int t) {
    std::mt19937_64 rng(seed + static_cast<std::uint64_t>(t));
    std::vector<blk> mine;
    for (std::uint64_t op = 0; op < ops; ++op) {
      if (mine.size() < 16 && rng() % 2 == 0) {
        const std::size_t n = 512 * (1 + rng() % 16);
        void* p = a.allocate({}, n);
        const auto v = static_cast<unsigned char>(1 + t);
        std::memset(p, v, n);
        mine.push_back({p, n, v});
        allocs.fetch_add(1);
      } else if (!mine.empty()) {
        const blk b = mine.back();
        mine.pop_back();
        if (rng() % 4 == 0) {
          std::lock_guard lock(mailbox_mutex);
          mailbox[static_cast<std::size_t>((t + 1) % threads)].push_back(b);
        } else {
          check_and_free(b);
        }
      }
      if (op % 8 == 0) {
        std::vector<blk> in;
        {
          std::lock_guard lock(mailbox_mutex);
          in.swap(mailbox[static_cast<std::size_t>(t)]);
        }
        for (const blk& b : in) {
          check_and_free(b);
        }
      }
    }
    for (const blk& b : mine) {
      check_and_free(b);
    }
    running.fetch_sub(1);
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back(worker, t);
  }
  std::uint64_t flushes = 0;
  std::thread janitor([&] {
    while (running.load() > 0) {
      const auto s = a.stats();
      if (s.in_use + s.cached_bytes > s.reserved + (64 * MiB)) {
        bad.fetch_add(1000);  // wildly inconsistent (fields may be from nearby instants)
      }
      (void)a.flush();
      if (++flushes % 16 == 0) {
        (void)a.release_cached();
      }
      std::this_thread::yield();
    }
  });
  for (auto& th : pool) {
    th.join();
  }
  janitor.join();
  for (auto& box : mailbox) {
    for (const blk& b : box) {
      check_and_free(b);
    }
  }
  EXPECT_EQ(bad.load(), 0) << "a live block was overwritten (handed out twice)";
  const auto s = a.stats();
  EXPECT_EQ(s.in_use, 0U);
  EXPECT_EQ(s.requested_in_use, 0U);
  EXPECT_EQ(s.allocations, allocs.load());
  EXPECT_EQ(s.deallocations, allocs.load());
  EXPECT_EQ(s.invalid_frees, 0U);
  EXPECT_EQ(s.in_use + s.cached_bytes, s.reserved);
  a.release_cached();
  EXPECT_EQ(a.stats().reserved, 0U);
  EXPECT_EQ(host.allocated_bytes(), 0U);
  std::cout << "[          ] " << allocs.load() << " allocations, " << flushes << " flushes\n";
}

// A thread that exits returns its cached blocks; the blocks it handed out and left live are
// freed later by another thread with the sizes and counts they were allocated with.
TYPED_TEST(thread_cache_concurrency, an_exiting_thread_returns_its_cache_and_leaves_live_blocks) {
  host_resource host;
  auto alloc = make<TypeParam>(host);
  thread_cache_adaptor& a = *alloc;
  std::vector<std::pair<void*, std::size_t>> left;
  std::thread t([&] {
    std::vector<void*> cached;
    for (int i = 0; i < 6; ++i) {
      cached.push_back(a.allocate({}, 4 * KiB));
    }
    for (void* p : cached) {
      a.deallocate({}, p, 4 * KiB);
    }
    for (int i = 0; i < 5; ++i) {
      // A hit for the first blocks: handed out from the cache, then left live at exit.
      const std::size_t n = 4 * KiB - 100 * static_cast<std::size_t>(i);
      left.emplace_back(a.allocate({}, n), n);
    }
  });
  t.join();
  auto s = a.stats();
  EXPECT_EQ(s.in_use, 5 * 4 * KiB);
  EXPECT_EQ(s.cached_bytes + s.in_use, s.reserved);
  EXPECT_EQ(a.flush(), 0U) << "the exited thread's cache is still listed";
  poolscope::testing::recording_hook rec{a.id()};
  {
    hooks::scoped_hook on{rec, hooks::scope::thread};
    for (const auto& [p, n] : left) {
      a.deallocate({}, p, n);
    }
    a.deallocate({}, left[0].first, left[0].second);  // now a double free
  }
  const auto posts = rec.of(event_kind::pool_free, event_phase::post);
  ASSERT_EQ(posts.size(), left.size());
  for (std::size_t i = 0; i < left.size(); ++i) {
    EXPECT_EQ(posts[i].requested, left[i].second);
    EXPECT_EQ(posts[i].rounded, 4 * KiB);
  }
  EXPECT_EQ(rec.of(event_kind::invalid_free, event_phase::instant).size(), 1U);
  s = a.stats();
  EXPECT_EQ(s.in_use, 0U);
  EXPECT_EQ(s.requested_in_use, 0U);
  EXPECT_EQ(s.invalid_frees, 1U);
  a.release_cached();
  EXPECT_EQ(a.stats().reserved, 0U);
  EXPECT_EQ(host.allocated_bytes(), 0U);
}

// Allocators destroyed while threads that used them are alive (caches still listed), then the
// threads go on with a new allocator and exit: nothing dangles, nothing leaks.
TYPED_TEST(thread_cache_concurrency, allocators_die_while_threads_keep_cache_state) {
  constexpr int threads = 4;
  host_resource host;
  std::atomic<int> phase{0};
  std::atomic<int> arrived{0};
  auto wait_for = [&](int p) {
    arrived.fetch_add(1);
    while (phase.load() < p) {
      std::this_thread::yield();
    }
  };
  std::unique_ptr<allocator> first = make<TypeParam>(host);
  std::unique_ptr<thread_cache_adaptor> second;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (int i = 0; i < 50; ++i) {
        void* p = first->allocate({}, 1000 + 512 * static_cast<std::size_t>(i % 5));
        first->deallocate({}, p, 1000 + 512 * static_cast<std::size_t>(i % 5));
      }
      wait_for(1);  // the main thread destroys `first` meanwhile
      for (int i = 0; i < 50; ++i) {
        void* p = second->allocate({}, 2000);
        second->deallocate({}, p, 2000);
      }
      wait_for(2);
    });
  }
  while (arrived.load() < threads) {
    std::this_thread::yield();
  }
  first.reset();  // every thread still has a cache of it, full of its blocks
  EXPECT_EQ(host.allocated_bytes(), 0U);
  second = make<TypeParam>(host);
  phase = 1;
  while (arrived.load() < 2 * threads) {
    std::this_thread::yield();
  }
  const auto s = second->stats();
  EXPECT_EQ(s.in_use, 0U);
  EXPECT_EQ(s.allocations, static_cast<std::uint64_t>(50 * threads));
  phase = 2;
  for (auto& th : pool) {
    th.join();  // their exits retire caches of `second`, and free the dead ones of `first`
  }
  EXPECT_EQ(second->flush(), 0U);
  second.reset();
  EXPECT_EQ(host.allocated_bytes(), 0U);
}

// The hook registry forgets the thread hooks of a thread that exits with them installed.
TEST(hooks_thread_exit_concurrency, a_thread_exiting_with_a_thread_hook_leaves_hooks_inactive) {
  ASSERT_FALSE(hooks::active()) << "another test left a hook installed";
  class nop final : public hooks::hook {
    void on_event(const hooks::event&) noexcept override {}
  };
  nop h;
  host_resource host;
  auto alloc = make<bfc_allocator>(host);
  std::thread t([&] {
    hooks::install(h, hooks::scope::thread);  // never uninstalled
    void* p = alloc->allocate({}, 100);
    alloc->deallocate({}, p, 100);
  });
  t.join();
  EXPECT_FALSE(hooks::active()) << "the exited thread's hook still counts as installed";
}

}  // namespace
}  // namespace poolscope::pool::testing
