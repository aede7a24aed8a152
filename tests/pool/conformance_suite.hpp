// The allocator conformance suite: one typed suite, instantiated for every allocator list in
// allocator_types.hpp by one file per list (conformance_*_test.cpp: the lists compile side by
// side, and the GPU-only lists sit in *_gpu_test files that builds without GPU tests leave out).
// It checks the contract written at the top of pool/include/poolscope/pool/allocator.hpp against
// independent expectations: hand-computed values, a reference model of the counters, the hook
// events and the resource's own byte count.
//
// Everything here is in an anonymous namespace: each including file gets its own copy of the
// suite and instantiates it under its own prefix (GoogleTest's type-parameterized tests).
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <new>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "hooks/recording_hook.hpp"
#include "pool/allocator_types.hpp"
#include "pool/model.hpp"
#include "poolscope/error.hpp"
#include "poolscope/hooks/counting_hook.hpp"
#include "poolscope/pool/allocator.hpp"
#include "poolscope/pool/host_resource.hpp"
#include "poolscope/pool/virtual_resource.hpp"

namespace poolscope::pool::testing {
namespace {

using hooks::event_kind;
using hooks::event_phase;
using poolscope::testing::recording_hook;

// ---- What the suite knows of particular strategies (behaviour beyond the common contract).

/// Strategies that hand every wholly free block back on release_cached(), whatever else is
/// live (each block is its own upstream allocation), so reserved drops to in_use.
template <typename A>
inline constexpr bool releases_every_free_byte =
    std::is_same_v<A, naive_allocator> || std::is_same_v<A, best_fit_allocator>;
/// Strategies whose reserved bytes are exactly in-use plus cached bytes (nothing else held).
template <typename A>
inline constexpr bool reserved_is_in_use_plus_cached =
    std::is_same_v<A, naive_allocator> || std::is_same_v<A, best_fit_allocator> ||
    std::is_same_v<A, bfc_allocator>;
/// Fixtures whose strategy maps granules of a virtual resource itself (bfc over host_vmm or vmm,
/// and stream_pool, whose per-stream pools are such bfcs): its upstream calls are maps and unmaps
/// (segment_map / segment_unmap events), which need not pair, and what a free leaves mapped is
/// the unmap policy's to keep, not the cache of whole blocks the exhaustion test fills.
template <typename F>
inline constexpr bool maps_granules = std::is_base_of_v<on_host_vmm<bfc_allocator>, F> ||
                                      std::is_base_of_v<on_vmm<bfc_allocator>, F> ||
                                      std::is_base_of_v<on_host_vmm<stream_pool_allocator>, F> ||
                                      std::is_base_of_v<on_vmm<stream_pool_allocator>, F>;
/// Strategies that keep freed blocks (so a freed block occupies upstream capacity).
template <typename A>
inline constexpr bool caches_freed_blocks = !std::is_same_v<A, naive_allocator>;

bool gpu_present() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

/// Bytes the resource has handed out, where the resource can say (host_resource, or any
/// resource wrapped in accounting_resource).
std::optional<std::size_t> resource_bytes(const resource& r) {
  if (const auto* h = dynamic_cast<const host_resource*>(&r)) {
    return h->allocated_bytes();
  }
  if (const auto* v = dynamic_cast<const virtual_resource*>(&r)) {
    return v->allocated_bytes();
  }
  if (const auto* w = dynamic_cast<const accounting_resource*>(&r)) {
    return w->allocated_bytes();
  }
  return std::nullopt;
}

/// The fixture's resource with its bytes counted and capped at `capacity`: the fixture's own
/// capacity-limited host_resource where it has one, otherwise its resource wrapped in an
/// accounting_resource.
template <typename Fixture>
class counted_resource {
 public:
  explicit counted_resource(std::size_t capacity = SIZE_MAX) {
    if constexpr (requires { Fixture::make_resource(std::size_t{1}); }) {
      inner_ = Fixture::make_resource(capacity);
    } else {
      inner_ = Fixture::make_resource();
    }
    if (!resource_bytes(*inner_)) {
      wrapper_ = std::make_unique<accounting_resource>(*inner_, capacity);
    }
  }
  resource& get() { return wrapper_ ? static_cast<resource&>(*wrapper_) : *inner_; }

 private:
  std::unique_ptr<resource> inner_;
  std::unique_ptr<accounting_resource> wrapper_;  // destroyed first
};

/// Fills [p, p + bytes) with `value`, on the host or the device as the resource's kind says.
void fill(const resource& r, void* p, std::size_t bytes, unsigned char value) {
  if (r.kind() == memory_kind::device) {
    ASSERT_EQ(cudaMemset(p, value, bytes), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  } else {
    std::memset(p, value, bytes);
  }
}

/// True if every byte of [p, p + bytes) is `value`.
::testing::AssertionResult holds(const resource& r, const void* p, std::size_t bytes,
                                 unsigned char value) {
  std::vector<unsigned char> copy(bytes);
  if (r.kind() == memory_kind::device) {
    if (cudaMemcpy(copy.data(), p, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) {
      return ::testing::AssertionFailure() << "cudaMemcpy from " << p << " failed";
    }
  } else {
    std::memcpy(copy.data(), p, bytes);
  }
  for (std::size_t i = 0; i < bytes; ++i) {
    if (copy[i] != value) {
      return ::testing::AssertionFailure()
             << "byte " << i << " of the block at " << p << " (" << bytes << " bytes) is "
             << int{copy[i]} << ", expected " << int{value};
    }
  }
  return ::testing::AssertionSuccess();
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

/// Every counter of two snapshots, compared (for "nothing changed" checks).
void expect_same_stats(const allocator_stats& a, const allocator_stats& b) {
  EXPECT_EQ(a.to_json(), b.to_json());
}

template <typename Fixture>
class allocator_conformance : public ::testing::Test {
 protected:
  using strategy_type = typename Fixture::strategy_type;

  void SetUp() override {
    if constexpr (Fixture::needs_gpu) {
      if (!gpu_present()) {
        GTEST_SKIP() << "no CUDA device: this instantiation needs a GPU";
      }
    }
    resource_ = Fixture::make_resource();
    alloc_ = Fixture::make(*resource_);
  }

  allocator& a() { return *alloc_; }
  resource& res() { return *resource_; }

  /// allocate + records the rounded size through a hook into the model.
  void* allocate_tracked(allocator& al, allocator_model& model, std::size_t bytes,
                         std::size_t alignment = max_alignment) {
    rounded_size_hook h{al.id()};
    hooks::scoped_hook on{h, hooks::scope::thread};
    void* p = al.allocate({}, bytes, alignment);
    EXPECT_EQ(h.ptr_, p) << "no pool_malloc post event for this allocation";
    EXPECT_GE(h.rounded_, bytes);
    EXPECT_TRUE(model.on_allocate(p, bytes, h.rounded_, alignment)) << p << " handed out twice";
    return p;
  }
  void deallocate_tracked(allocator& al, allocator_model& model, void* p) {
    const model_block b = model.on_deallocate(p);
    al.deallocate({}, p, b.requested, b.alignment);
  }

  // Declared in this order so the allocator goes first.
  std::unique_ptr<resource> resource_;
  std::unique_ptr<allocator> alloc_;
};

TYPED_TEST_SUITE_P(allocator_conformance);

TYPED_TEST_P(allocator_conformance, aligns_to_every_power_of_two_up_to_256) {
  auto& a = this->a();
  allocator_model model;
  std::vector<void*> blocks;
  for (std::size_t align = 1; align <= max_alignment; align *= 2) {
    for (std::size_t bytes : {1, 3, 100, 255, 512, 1000, 4097, 70000}) {
      void* p = this->allocate_tracked(a, model, bytes, align);
      ASSERT_NE(p, nullptr);
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % align, 0U)
          << bytes << " bytes at alignment " << align << " -> " << p;
      // allocator.hpp: "blocks are always at least this aligned".
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % max_alignment, 0U) << p;
      blocks.push_back(p);
    }
  }
  EXPECT_TRUE(model.matches(a.stats()));
  for (void* p : blocks) {
    this->deallocate_tracked(a, model, p);
  }
  EXPECT_TRUE(model.matches(a.stats()));
  EXPECT_EQ(a.stats().invalid_frees, 0U);
}

TYPED_TEST_P(allocator_conformance, alignment_not_a_power_of_two_is_rejected_naming_it) {
  auto& a = this->a();
  recording_hook rec{a.id()};
  hooks::scoped_hook on{rec, hooks::scope::thread};
  const auto before = a.stats();
  for (std::size_t align : {0, 3, 5, 6, 7, 12, 24, 100, 255, 257, 384, 1000}) {
    try {
      (void)a.allocate({}, 1000, align);
      ADD_FAILURE() << "alignment " << align << " was accepted";
    } catch (const invalid_argument& e) {
      EXPECT_TRUE(contains(e.what(), "alignment " + std::to_string(align)))
          << "the message does not name the alignment: " << e.what();
    }
  }
  expect_same_stats(a.stats(), before);
  EXPECT_EQ(rec.size(), 0U) << "a rejected request raised events";
}

TYPED_TEST_P(allocator_conformance, alignment_above_256_is_rejected_naming_it) {
  auto& a = this->a();
  const auto before = a.stats();
  for (std::size_t align :
       {std::size_t{512}, std::size_t{1024}, std::size_t{1} << 20, std::size_t{1} << 63}) {
    try {
      (void)a.allocate({}, 64, align);
      ADD_FAILURE() << "alignment " << align << " was accepted";
    } catch (const poolscope::logic_error& e) {
      EXPECT_NE(dynamic_cast<const invalid_argument*>(&e), nullptr);
      EXPECT_TRUE(contains(e.what(), std::to_string(align))) << e.what();
    }
  }
  expect_same_stats(a.stats(), before);
}

TYPED_TEST_P(allocator_conformance, zero_bytes_returns_null_and_changes_nothing) {
  auto& a = this->a();
  void* keep = a.allocate({}, 100);  // so the allocator is not in its initial state
  recording_hook rec{a.id()};
  hooks::scoped_hook on{rec, hooks::scope::thread};
  const auto before = a.stats();
  for (std::size_t align : {1, 8, 256}) {
    EXPECT_EQ(a.allocate({}, 0, align), nullptr);
  }
  expect_same_stats(a.stats(), before);
  EXPECT_EQ(rec.size(), 0U);
  a.deallocate({}, keep, 100);
}

TYPED_TEST_P(allocator_conformance, deallocating_null_with_zero_bytes_is_a_no_op) {
  auto& a = this->a();
  recording_hook rec{a.id()};
  hooks::scoped_hook on{rec, hooks::scope::thread};
  const auto before = a.stats();
  a.deallocate({}, nullptr, 0);
  a.deallocate({}, nullptr, 0, 64);
  expect_same_stats(a.stats(), before);
  EXPECT_EQ(rec.size(), 0U);
}

TYPED_TEST_P(allocator_conformance, absurd_sizes_throw_out_of_memory_naming_the_request) {
  auto& a = this->a();
  const auto res_before = resource_bytes(this->res());
  hooks::counting_hook counts;
  hooks::scoped_hook on{counts, hooks::scope::thread};
  const std::size_t sizes[] = {SIZE_MAX, SIZE_MAX / 2 + 1, std::size_t{1} << 60,
                               max_request_bytes + 1};
  std::uint64_t thrown = 0;
  for (std::size_t bytes : sizes) {
    const auto before = a.stats();
    try {
      (void)a.allocate({}, bytes);
      ADD_FAILURE() << bytes << " bytes were handed out";
    } catch (const out_of_memory& e) {
      ++thrown;
      EXPECT_EQ(e.requested(), bytes);
      EXPECT_EQ(e.context().requested, bytes);
      EXPECT_TRUE(contains(e.what(), std::to_string(bytes)))
          << "the message does not name the request: " << e.what();
      EXPECT_TRUE(e.cause().starts_with("size overflow")) << e.cause();
    }
    // Generic code catches it as std::bad_alloc.
    EXPECT_THROW((void)a.allocate({}, bytes), std::bad_alloc);
    ++thrown;
    const auto after = a.stats();
    EXPECT_EQ(after.upstream_allocs, before.upstream_allocs) << "upstream was asked";
    EXPECT_EQ(after.upstream_failures, before.upstream_failures) << "upstream was asked";
    EXPECT_EQ(after.reserved, before.reserved);
    EXPECT_EQ(after.allocations, before.allocations);
    EXPECT_EQ(after.oom_count, before.oom_count + 2);
  }
  EXPECT_EQ(counts.snapshot().of(event_kind::oom, event_phase::instant).calls, thrown);
  EXPECT_EQ(counts.snapshot().of(event_kind::pool_malloc, event_phase::post).calls, 0U);
  EXPECT_EQ(resource_bytes(this->res()), res_before);
  // Still usable.
  void* p = a.allocate({}, 1000);
  ASSERT_NE(p, nullptr);
  fill(this->res(), p, 1000, 0x5a);
  EXPECT_TRUE(holds(this->res(), p, 1000, 0x5a));
  a.deallocate({}, p, 1000);
  EXPECT_EQ(a.stats().in_use, 0U);
}

TYPED_TEST_P(allocator_conformance, stats_snapshot_agrees_with_the_model) {
  using A = typename TestFixture::strategy_type;
  auto& a = this->a();
  allocator_model model;
  const auto fresh = a.stats();
  EXPECT_EQ(fresh.in_use, 0U);
  EXPECT_EQ(fresh.allocations, 0U);
  EXPECT_EQ(fresh.limit, SIZE_MAX);
  EXPECT_TRUE(model.matches(fresh));

  auto check_invariants = [&](const char* when) {
    const auto s = a.stats();
    EXPECT_TRUE(model.matches(s)) << when;
    EXPECT_GE(s.reserved, s.in_use) << when;
    EXPECT_GE(s.peak_reserved, s.reserved) << when;
    EXPECT_GE(s.peak_in_use, s.in_use) << when;
    EXPECT_GE(s.in_use, s.requested_in_use) << when;
    EXPECT_LE(s.in_use + s.cached_bytes, s.reserved) << when;
    if constexpr (reserved_is_in_use_plus_cached<A>) {
      EXPECT_EQ(s.in_use + s.cached_bytes, s.reserved) << when;
    }
    EXPECT_LE(s.largest_free_block, s.cached_bytes) << when;
    EXPECT_EQ(s.cached_blocks == 0, s.cached_bytes == 0) << when;
    EXPECT_GE(s.fragmentation, 0.0) << when;
    EXPECT_LE(s.fragmentation, 1.0) << when;
    EXPECT_EQ(s.upstream_failures, 0U) << when;
    // The JSON form carries the same values.
    const nlohmann::json j = nlohmann::json::parse(s.to_json());
    EXPECT_EQ(j.at("in_use").get<std::size_t>(), s.in_use) << when;
    EXPECT_EQ(j.at("reserved").get<std::size_t>(), s.reserved) << when;
    EXPECT_EQ(j.at("allocations").get<std::uint64_t>(), s.allocations) << when;
    EXPECT_TRUE(j.at("limit").is_null()) << when;
    if (auto bytes = resource_bytes(this->res())) {
      EXPECT_EQ(*bytes, s.reserved) << when << ": the resource disagrees with reserved";
    }
  };

  std::vector<void*> blocks;  // the live ones
  for (std::size_t bytes : {1, 511, 512, 513, 4096, 100000, 3 << 20, 700, 700, 700}) {
    blocks.push_back(this->allocate_tracked(a, model, bytes));
  }
  check_invariants("after the first allocations");
  auto s = a.stats();
  EXPECT_GE(s.upstream_allocs, 1U);
  EXPECT_EQ(s.allocations, 10U);
  EXPECT_EQ(s.deallocations, 0U);
  EXPECT_EQ(s.requested_in_use, 1 + 511 + 512 + 513 + 4096 + 100000 + (3 << 20) + 2100U);
  std::vector<void*> kept;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    if (i % 2 == 0) {
      this->deallocate_tracked(a, model, blocks[i]);
    } else {
      kept.push_back(blocks[i]);
    }
  }
  blocks.swap(kept);
  check_invariants("after freeing half");
  for (std::size_t bytes : {2000, 511, 1 << 20}) {
    blocks.push_back(this->allocate_tracked(a, model, bytes));
  }
  check_invariants("after more allocations");
  for (void* p : blocks) {
    this->deallocate_tracked(a, model, p);
  }
  check_invariants("after freeing everything");
  s = a.stats();
  EXPECT_EQ(s.in_use, 0U);
  EXPECT_EQ(s.requested_in_use, 0U);
  EXPECT_EQ(s.allocations, 13U);
  EXPECT_EQ(s.deallocations, 13U);
  EXPECT_EQ(s.peak_requested, 1 + 511 + 512 + 513 + 4096 + 100000 + (3 << 20) + 2100U);
  EXPECT_EQ(s.invalid_frees, 0U);
  EXPECT_EQ(s.oom_count, 0U);
  EXPECT_EQ(s.limit_hits, 0U);
  EXPECT_LE(s.upstream_frees, s.upstream_allocs);
}

TYPED_TEST_P(allocator_conformance, limit_below_use_fails_later_requests_until_raised) {
  auto& a = this->a();
  auto& r = this->res();
  constexpr std::size_t block_bytes = 64 << 10;
  std::vector<void*> blocks;
  for (int i = 0; i < 4; ++i) {
    blocks.push_back(a.allocate({}, block_bytes));
    fill(r, blocks.back(), block_bytes, static_cast<unsigned char>(0x10 + i));
  }
  const std::size_t used = a.stats().in_use;
  const std::size_t limit = used / 2;
  a.set_limit(limit);
  EXPECT_EQ(a.limit(), limit);
  EXPECT_EQ(a.stats().limit, limit);

  recording_hook rec{a.id()};
  hooks::scoped_hook on{rec, hooks::scope::thread};
  // Fails even where a cached block could serve it: in-use bytes would pass the limit.
  a.deallocate({}, blocks[3], block_bytes);
  blocks.pop_back();
  for (std::size_t bytes : {std::size_t{1}, std::size_t{1000}, block_bytes}) {
    const auto before = a.stats();
    try {
      (void)a.allocate({}, bytes);
      ADD_FAILURE() << bytes << " bytes were handed out past the limit";
    } catch (const out_of_memory& e) {
      EXPECT_TRUE(e.cause().starts_with("limit")) << e.cause();
      EXPECT_EQ(e.context().limit, limit);
      EXPECT_EQ(e.context().requested, bytes);
      EXPECT_EQ(e.context().in_use, before.in_use);
    }
    const auto after = a.stats();
    EXPECT_EQ(after.limit_hits, before.limit_hits + 1);
    EXPECT_EQ(after.oom_count, before.oom_count + 1);
    EXPECT_EQ(after.in_use, before.in_use);
    EXPECT_EQ(after.allocations, before.allocations);
  }
  EXPECT_EQ(rec.of(event_kind::limit_hit, event_phase::instant).size(), 3U);
  EXPECT_EQ(rec.of(event_kind::oom, event_phase::instant).size(), 3U);
  EXPECT_TRUE(rec.of(event_kind::pool_malloc, event_phase::post).empty());

  // Existing blocks are untouched, writable and freeable.
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    EXPECT_TRUE(holds(r, blocks[i], block_bytes, static_cast<unsigned char>(0x10 + i)));
    fill(r, blocks[i], block_bytes, 0xee);
    EXPECT_TRUE(holds(r, blocks[i], block_bytes, 0xee));
  }
  a.deallocate({}, blocks.back(), block_bytes);
  blocks.pop_back();

  // Raising the limit allows requests again.
  a.set_limit(SIZE_MAX);
  EXPECT_EQ(a.stats().limit, SIZE_MAX);
  void* p = a.allocate({}, block_bytes);
  ASSERT_NE(p, nullptr);
  blocks.push_back(p);
  for (void* b : blocks) {
    a.deallocate({}, b, block_bytes);
  }
  const auto s = a.stats();
  EXPECT_EQ(s.in_use, 0U);
  EXPECT_EQ(s.invalid_frees, 0U);
}

TYPED_TEST_P(allocator_conformance, limit_caps_reserved_bytes) {
  auto& a = this->a();
  {
    // A request under the limit whose upstream block (rounded, a segment) would pass it: either
    // served within the limit or refused with cause "limit", never blamed on upstream.
    a.set_limit(100);
    try {
      void* p = a.allocate({}, 50);
      EXPECT_LE(a.stats().reserved, 100U);
      a.deallocate({}, p, 50);
    } catch (const out_of_memory& e) {
      EXPECT_TRUE(e.cause().starts_with("limit")) << e.what();
    }
    a.set_limit(SIZE_MAX);
    a.release_cached();
  }
  constexpr std::size_t limit = 8 << 20;
  constexpr std::size_t bytes = 256 << 10;
  a.set_limit(limit);
  std::vector<void*> blocks;
  bool failed = false;
  for (int i = 0; i < 64 && !failed; ++i) {
    try {
      blocks.push_back(a.allocate({}, bytes));
    } catch (const out_of_memory& e) {
      failed = true;
      EXPECT_TRUE(e.cause().starts_with("limit")) << e.cause();
    }
    const auto s = a.stats();
    ASSERT_LE(s.reserved, limit);
    ASSERT_LE(s.in_use, limit);
  }
  EXPECT_TRUE(failed) << "64 blocks of 256 KiB fit under an 8 MiB limit";
  EXPECT_GE(blocks.size(), 1U);
  EXPECT_LE(blocks.size(), limit / bytes);
  EXPECT_LE(a.stats().peak_reserved, limit);
  for (void* p : blocks) {
    a.deallocate({}, p, bytes);
  }
  a.set_limit(SIZE_MAX);
  blocks.clear();
  for (int i = 0; i < 40; ++i) {
    blocks.push_back(a.allocate({}, bytes));
  }
  for (void* p : blocks) {
    a.deallocate({}, p, bytes);
  }
  EXPECT_EQ(a.stats().in_use, 0U);
}

TYPED_TEST_P(allocator_conformance, release_cached_returns_free_memory_and_keeps_live_blocks) {
  using A = typename TestFixture::strategy_type;
  using F = TypeParam;
  auto& a = this->a();
  auto& r = this->res();
  const std::size_t sizes[] = {1000, 5000, 64 << 10, 300 << 10, 1 << 20, 3000, 2 << 20, 700};
  std::vector<std::pair<void*, std::size_t>> live;
  for (int round = 0; round < 3; ++round) {
    for (std::size_t bytes : sizes) {
      void* p = a.allocate({}, bytes);
      fill(r, p, bytes, static_cast<unsigned char>(live.size() + 1));
      live.emplace_back(p, bytes);
    }
  }
  // Free every other block: the cache now holds them.
  std::vector<std::pair<void*, std::size_t>> kept;
  for (std::size_t i = 0; i < live.size(); ++i) {
    if (i % 2 == 0) {
      a.deallocate({}, live[i].first, live[i].second);
    } else {
      kept.push_back(live[i]);
    }
  }
  recording_hook rec{a.id()};
  hooks::scoped_hook on{rec, hooks::scope::thread};
  const auto before = a.stats();
  const std::size_t released = a.release_cached();
  const auto after = a.stats();
  EXPECT_EQ(before.reserved - after.reserved, released);
  EXPECT_EQ(after.in_use, before.in_use) << "release_cached touched live blocks";
  EXPECT_GE(after.reserved, after.in_use);
  if constexpr (releases_every_free_byte<A>) {
    EXPECT_EQ(after.reserved, after.in_use);
    EXPECT_EQ(after.cached_bytes, 0U);
    EXPECT_EQ(after.cached_blocks, 0U);
  }
  if (auto bytes = resource_bytes(r)) {
    EXPECT_EQ(*bytes, after.reserved);
  }
  const auto pre = rec.of(event_kind::release, event_phase::pre);
  const auto post = rec.of(event_kind::release, event_phase::post);
  ASSERT_EQ(pre.size(), 1U);
  ASSERT_EQ(post.size(), 1U);
  EXPECT_EQ(post[0].requested, released);
  std::size_t freed_upstream = 0;
  for (const auto& e : rec.of(event_kind::device_free, event_phase::post)) {
    freed_upstream += e.rounded;
  }
  for (const auto& e : rec.of(event_kind::segment_unmap, event_phase::post)) {
    freed_upstream += e.rounded;  // granules a pool over a virtual resource unmapped
  }
  EXPECT_EQ(freed_upstream, released);

  // Live blocks survived and are still writable.
  for (std::size_t i = 0; i < kept.size(); ++i) {
    const auto [p, bytes] = kept[i];
    EXPECT_TRUE(holds(r, p, bytes, static_cast<unsigned char>(2 * i + 2)));
    fill(r, p, bytes, 0xa5);
    EXPECT_TRUE(holds(r, p, bytes, 0xa5));
  }
  EXPECT_EQ(a.release_cached(), 0U) << "the first release left releasable memory behind";
  for (const auto& [p, bytes] : kept) {
    a.deallocate({}, p, bytes);
  }
  // With nothing live, every strategy can give everything back.
  a.release_cached();
  const auto empty = a.stats();
  EXPECT_EQ(empty.in_use, 0U);
  EXPECT_EQ(empty.reserved, 0U);
  EXPECT_EQ(empty.cached_bytes, 0U);
  EXPECT_EQ(empty.cached_blocks, 0U);
  if constexpr (!maps_granules<F>) {
    // (A pool that maps granules may unmap a run it mapped in one call in several, or the
    // reverse: its calls do not pair; reserved 0 says all went back.)
    EXPECT_EQ(empty.upstream_frees, empty.upstream_allocs);
  }
  if (auto bytes = resource_bytes(r)) {
    EXPECT_EQ(*bytes, 0U);
  }
  EXPECT_EQ(a.release_cached(), 0U);
}

TYPED_TEST_P(allocator_conformance, upstream_exhaustion_releases_the_cache_and_retries) {
  using A = typename TestFixture::strategy_type;
  using F = TypeParam;
  constexpr std::size_t capacity = 32 << 20;
  counted_resource<F> limited{capacity};
  auto& r = limited.get();
  auto alloc = F::make(r);
  auto& a = *alloc;
  constexpr std::size_t mib = 1 << 20;

  // 1. Fill the resource with 1 MiB blocks until the allocator reports exhaustion.
  std::vector<void*> blocks;
  bool exhausted = false;
  while (!exhausted && blocks.size() < 64) {
    try {
      blocks.push_back(a.allocate({}, mib));
    } catch (const out_of_memory& e) {
      exhausted = true;
      const auto s = a.stats();
      EXPECT_EQ(e.context().requested, mib);
      EXPECT_EQ(e.context().reserved, s.reserved);
      EXPECT_EQ(e.context().in_use, s.in_use);
      EXPECT_EQ(e.context().limit, SIZE_MAX);
      EXPECT_EQ(e.context().device, a.device());
      EXPECT_TRUE(contains(e.cause(), "upstream")) << e.cause();
      EXPECT_TRUE(contains(e.what(), std::to_string(mib))) << e.what();
      EXPECT_GT(s.upstream_failures, 0U);
      EXPECT_EQ(s.oom_count, 1U);
    }
    ASSERT_LE(*resource_bytes(r), capacity);
  }
  ASSERT_TRUE(exhausted) << "64 MiB fit in a 32 MiB resource";
  EXPECT_GE(blocks.size(), capacity / mib / 2) << "the allocator wasted half the resource";

  // 2. Still usable: a freed block can be had again.
  a.deallocate({}, blocks.back(), mib);
  blocks.back() = a.allocate({}, mib);
  fill(r, blocks.back(), mib, 0x33);

  // 3. Free everything (a caching strategy keeps it), then ask for a size nothing cached
  //    fits: the allocator must give its cache back and retry.
  for (void* p : blocks) {
    a.deallocate({}, p, mib);
  }
  recording_hook rec{a.id()};
  const auto before = a.stats();
  void* big = nullptr;
  {
    hooks::scoped_hook on{rec, hooks::scope::thread};
    ASSERT_NO_THROW(big = a.allocate({}, 6 * mib + 4096));
  }
  const auto after = a.stats();
  EXPECT_EQ(after.oom_count, before.oom_count);
  if (after.upstream_failures > before.upstream_failures) {
    EXPECT_GT(after.upstream_frees, before.upstream_frees) << "nothing was released";
    EXPECT_EQ(rec.of(event_kind::release, event_phase::post).size(), 1U);
  }
  if constexpr (caches_freed_blocks<A> && !maps_granules<F>) {
    EXPECT_GT(after.upstream_failures, before.upstream_failures)
        << "the freed blocks should have filled the resource";
    EXPECT_GT(after.upstream_frees, before.upstream_frees);
  }
  EXPECT_LE(*resource_bytes(r), capacity);
  fill(r, big, 6 * mib + 4096, 0x77);
  EXPECT_TRUE(holds(r, big, 6 * mib + 4096, 0x77));

  // 4. Truly exhausted: the error reports what the allocator held.
  try {
    (void)a.allocate({}, capacity);
    ADD_FAILURE() << "the whole capacity was handed out next to a live block";
  } catch (const out_of_memory& e) {
    const auto s = a.stats();
    EXPECT_EQ(e.requested(), capacity);
    EXPECT_EQ(e.context().reserved, s.reserved);
    EXPECT_EQ(e.context().in_use, s.in_use);
    EXPECT_GE(s.in_use, 6 * mib + 4096);
    EXPECT_TRUE(contains(e.cause(), "upstream")) << e.cause();
  }
  EXPECT_TRUE(holds(r, big, 6 * mib + 4096, 0x77));
  a.deallocate({}, big, 6 * mib + 4096);
  alloc.reset();
  EXPECT_EQ(*resource_bytes(r), 0U);
}

TYPED_TEST_P(allocator_conformance, memory_is_writable_and_keeps_its_contents) {
  auto& a = this->a();
  auto& r = this->res();
  struct live_block {
    void* p;
    std::size_t bytes;
    unsigned char value;
  };
  std::vector<live_block> live;
  std::uint32_t x = 12345;  // a fixed LCG: the sequence is deterministic
  auto next = [&x] {
    x = x * 1664525U + 1013904223U;
    return x >> 8;
  };
  unsigned char value = 1;
  auto add = [&] {
    const std::size_t range = next() % 4 == 0 ? (256 << 10) : 4096;
    const std::size_t bytes = 1 + next() % range;
    void* p = a.allocate({}, bytes);
    fill(r, p, bytes, value);
    live.push_back({p, bytes, value});
    value = static_cast<unsigned char>(value % 250 + 1);
  };
  for (int i = 0; i < 60; ++i) {
    add();
  }
  for (int round = 0; round < 4; ++round) {
    for (std::size_t i = 0; i < live.size(); i += 3) {
      ASSERT_TRUE(holds(r, live[i].p, live[i].bytes, live[i].value));
      a.deallocate({}, live[i].p, live[i].bytes);
      live[i] = live.back();
      live.pop_back();
    }
    for (int i = 0; i < 20; ++i) {
      add();
    }
    if (round == 2) {
      a.release_cached();
    }
    for (const auto& b : live) {
      ASSERT_TRUE(holds(r, b.p, b.bytes, b.value));
    }
  }
  for (const auto& b : live) {
    a.deallocate({}, b.p, b.bytes);
  }
  EXPECT_EQ(a.stats().in_use, 0U);
  EXPECT_EQ(a.stats().invalid_frees, 0U);
}

TYPED_TEST_P(allocator_conformance, emits_malloc_and_free_events_with_the_right_fields) {
  auto& a = this->a();
  recording_hook rec{a.id()};
  hooks::scoped_hook on{rec, hooks::scope::thread};
  void* p = a.allocate({}, 1000, 64);
  const auto after_alloc = a.stats();
  a.deallocate({}, p, 1000, 64);
  const auto after_free = a.stats();

  const auto events = rec.events();
  const auto mpre = rec.of(event_kind::pool_malloc, event_phase::pre);
  const auto mpost = rec.of(event_kind::pool_malloc, event_phase::post);
  const auto fpre = rec.of(event_kind::pool_free, event_phase::pre);
  const auto fpost = rec.of(event_kind::pool_free, event_phase::post);
  ASSERT_EQ(mpre.size(), 1U);
  ASSERT_EQ(mpost.size(), 1U);
  ASSERT_EQ(fpre.size(), 1U);
  ASSERT_EQ(fpost.size(), 1U);
  for (const auto& r : events) {
    EXPECT_EQ(r.e.allocator_id, a.id());
    EXPECT_EQ(r.allocator_name, a.name());
    EXPECT_EQ(r.e.device, a.device());
    EXPECT_EQ(r.e.stream, nullptr);
    EXPECT_EQ(r.e.thread, hooks::current_thread_id());
  }
  EXPECT_EQ(mpre[0].ptr, nullptr);
  EXPECT_EQ(mpre[0].requested, 1000U);
  EXPECT_EQ(mpost[0].ptr, p);
  EXPECT_EQ(mpost[0].requested, 1000U);
  EXPECT_GE(mpost[0].rounded, 1000U);
  EXPECT_EQ(mpost[0].rounded, after_alloc.in_use) << "the event's rounded is not what is counted";
  EXPECT_EQ(mpost[0].in_use, after_alloc.in_use);
  EXPECT_EQ(mpost[0].reserved, after_alloc.reserved);
  EXPECT_EQ(fpre[0].ptr, p);
  EXPECT_EQ(fpre[0].requested, 1000U);
  EXPECT_EQ(fpost[0].ptr, p);
  EXPECT_EQ(fpost[0].requested, 1000U);
  EXPECT_EQ(fpost[0].rounded, mpost[0].rounded);
  EXPECT_EQ(fpost[0].in_use, after_free.in_use);
  EXPECT_LT(mpre[0].seq, mpost[0].seq);
  EXPECT_LT(mpost[0].seq, fpre[0].seq);
  EXPECT_LT(fpre[0].seq, fpost[0].seq);
  EXPECT_TRUE(rec.of(event_kind::invalid_free, event_phase::instant).empty());

  // Upstream events account for every reserved byte: blocks from the resource, or granules
  // mapped into a virtual resource's range (which the unmap policy may keep mapped when free).
  std::size_t acquired = 0;
  for (const event_kind kind : {event_kind::device_alloc, event_kind::segment_map}) {
    for (const auto& e : rec.of(kind, event_phase::post)) {
      EXPECT_NE(e.ptr, nullptr);
      EXPECT_GT(e.seq, mpre[0].seq);
      EXPECT_LT(e.seq, mpost[0].seq) << "upstream memory acquired after the malloc-post";
      acquired += e.rounded;
    }
    EXPECT_EQ(rec.of(kind, event_phase::pre).size(), rec.of(kind, event_phase::post).size());
  }
  std::size_t returned = 0;
  for (const event_kind kind : {event_kind::device_free, event_kind::segment_unmap}) {
    for (const auto& e : rec.of(kind, event_phase::post)) {
      returned += e.rounded;
    }
  }
  EXPECT_EQ(acquired - returned, after_free.reserved);
}

TYPED_TEST_P(allocator_conformance, destructor_returns_everything_to_the_resource) {
  using F = TypeParam;
  counted_resource<F> counted;
  resource* r = &counted.get();
  {
    auto alloc = F::make(*r);
    std::vector<std::pair<void*, std::size_t>> blocks;
    for (std::size_t bytes : {100, 5000, 70000, 1 << 20, 3 << 20, 12 << 20, 100, 512}) {
      blocks.emplace_back(alloc->allocate({}, bytes), bytes);
    }
    // Some freed (cached), some still live when the allocator dies.
    alloc->deallocate({}, blocks[1].first, blocks[1].second);
    alloc->deallocate({}, blocks[4].first, blocks[4].second);
    alloc->deallocate({}, blocks[6].first, blocks[6].second);
    EXPECT_GT(*resource_bytes(*r), 0U);
  }
  EXPECT_EQ(*resource_bytes(*r), 0U) << "the allocator leaked upstream memory";
}

REGISTER_TYPED_TEST_SUITE_P(
    allocator_conformance, aligns_to_every_power_of_two_up_to_256,
    alignment_not_a_power_of_two_is_rejected_naming_it, alignment_above_256_is_rejected_naming_it,
    zero_bytes_returns_null_and_changes_nothing, deallocating_null_with_zero_bytes_is_a_no_op,
    absurd_sizes_throw_out_of_memory_naming_the_request, stats_snapshot_agrees_with_the_model,
    limit_below_use_fails_later_requests_until_raised, limit_caps_reserved_bytes,
    release_cached_returns_free_memory_and_keeps_live_blocks,
    upstream_exhaustion_releases_the_cache_and_retries, memory_is_writable_and_keeps_its_contents,
    emits_malloc_and_free_events_with_the_right_fields,
    destructor_returns_everything_to_the_resource);

}  // namespace
}  // namespace poolscope::pool::testing
