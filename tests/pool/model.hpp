// Test helpers for the allocator suites: a reference model of what an allocator's counters must
// say, a checker that live blocks never overlap, a hook that reports the rounded size of each
// allocation, and the seed / operation-count knobs of the randomized tests.
// Thread safety: none of these is thread-safe except rounded_size_hook; use one per thread.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <unordered_map>

#include "poolscope/hooks/hook.hpp"
#include "poolscope/pool/allocator_stats.hpp"
#include "poolscope/pool/resource.hpp"

namespace poolscope::pool::testing {

/// What the model knows of one live block.
struct model_block {
  std::size_t requested = 0;
  std::size_t rounded = 0;
  std::size_t alignment = 0;
};

/// The counters an allocator must report, computed independently from the operations the test
/// performed: in_use is the sum of the rounded sizes the allocator reported for the live
/// blocks, requested_in_use the sum of what was asked, and the peaks the maxima over time.
class allocator_model {
 public:
  /// Records a successful allocation. Returns false if `ptr` was already live.
  bool on_allocate(void* ptr, std::size_t requested, std::size_t rounded, std::size_t alignment) {
    if (!live_.emplace(ptr, model_block{requested, rounded, alignment}).second) {
      return false;
    }
    in_use_ += rounded;
    requested_in_use_ += requested;
    peak_in_use_ = std::max(peak_in_use_, in_use_);
    peak_requested_ = std::max(peak_requested_, requested_in_use_);
    ++allocations_;
    return true;
  }
  /// Records a valid deallocation and returns the block (which must be live).
  model_block on_deallocate(void* ptr) {
    const auto it = live_.find(ptr);
    EXPECT_NE(it, live_.end()) << "the model has no live block at " << ptr;
    if (it == live_.end()) {
      return {};
    }
    const model_block b = it->second;
    live_.erase(it);
    in_use_ -= b.rounded;
    requested_in_use_ -= b.requested;
    ++deallocations_;
    return b;
  }

  /// Empty if `s` agrees with the model on every counter the model tracks.
  [[nodiscard]] ::testing::AssertionResult matches(const allocator_stats& s) const {
    std::string diff;
    auto check = [&diff](const char* field, std::uint64_t got, std::uint64_t want) {
      if (got != want) {
        diff += std::string(" ") + field + "=" + std::to_string(got) + " (model " +
                std::to_string(want) + ")";
      }
    };
    check("in_use", s.in_use, in_use_);
    check("requested_in_use", s.requested_in_use, requested_in_use_);
    check("allocations", s.allocations, allocations_);
    check("deallocations", s.deallocations, deallocations_);
    check("peak_requested", s.peak_requested, peak_requested_);
    check("peak_in_use", s.peak_in_use, peak_in_use_);
    if (s.reserved < s.in_use) {
      diff += " reserved=" + std::to_string(s.reserved) + " < in_use";
    }
    if (s.peak_reserved < s.reserved) {
      diff += " peak_reserved=" + std::to_string(s.peak_reserved) + " < reserved";
    }
    if (diff.empty()) {
      return ::testing::AssertionSuccess();
    }
    return ::testing::AssertionFailure() << "stats disagree with the model:" << diff;
  }

  [[nodiscard]] const std::unordered_map<void*, model_block>& live() const { return live_; }
  [[nodiscard]] std::size_t in_use() const { return in_use_; }
  [[nodiscard]] std::size_t requested_in_use() const { return requested_in_use_; }
  [[nodiscard]] std::size_t peak_in_use() const { return peak_in_use_; }
  [[nodiscard]] std::uint64_t allocations() const { return allocations_; }

 private:
  std::unordered_map<void*, model_block> live_;
  std::size_t in_use_ = 0;
  std::size_t requested_in_use_ = 0;
  std::size_t peak_in_use_ = 0;
  std::size_t peak_requested_ = 0;
  std::uint64_t allocations_ = 0;
  std::uint64_t deallocations_ = 0;
};

/// Live byte ranges [begin, end), ordered by address; refuses overlapping ranges.
class interval_set {
 public:
  /// Adds [p, p + bytes); returns false (and adds nothing) if it overlaps a live range.
  bool insert(const void* p, std::size_t bytes) {
    const auto begin = reinterpret_cast<std::uintptr_t>(p);
    const auto end = begin + bytes;
    auto next = ranges_.lower_bound(begin);
    if (next != ranges_.end() && next->first < end) {
      return false;
    }
    if (next != ranges_.begin() && std::prev(next)->second > begin) {
      return false;
    }
    ranges_.emplace_hint(next, begin, end);
    return true;
  }
  /// Removes the range starting at p; returns false if there is none.
  bool erase(const void* p) { return ranges_.erase(reinterpret_cast<std::uintptr_t>(p)) == 1; }
  [[nodiscard]] std::size_t size() const { return ranges_.size(); }

 private:
  std::map<std::uintptr_t, std::uintptr_t> ranges_;
};

/// Remembers the rounded size and pointer of the last pool_malloc post event of one allocator
/// on this thread (install it with scope::thread). Thread-safe as a hook; read it on the
/// installing thread.
class rounded_size_hook final : public hooks::hook {
 public:
  explicit rounded_size_hook(std::uint32_t allocator_id) : id_(allocator_id) {}
  void on_event(const hooks::event& e) noexcept override {
    if (e.allocator_id == id_ && e.kind == hooks::event_kind::pool_malloc &&
        e.phase == hooks::event_phase::post) {
      ptr_ = e.ptr;
      rounded_ = e.rounded;
      requested_ = e.requested;
    }
  }
  void* ptr_ = nullptr;
  std::size_t rounded_ = 0;
  std::size_t requested_ = 0;

 private:
  std::uint32_t id_;
};

/// Wraps any resource to count the bytes it has handed out and to cap them at `capacity`
/// (try_allocate returns nullptr past it): the host_resource accounting, for every resource.
/// Thread-safe (one atomic counter).
class accounting_resource final : public resource {
 public:
  explicit accounting_resource(resource& inner, std::size_t capacity = SIZE_MAX)
      : inner_(&inner), capacity_(capacity) {}
  [[nodiscard]] std::size_t allocated_bytes() const noexcept {
    return allocated_.load(std::memory_order_relaxed);
  }

 private:
  void* do_try_allocate(stream_view stream, std::size_t bytes) override {
    const std::size_t prev = allocated_.fetch_add(bytes, std::memory_order_relaxed);
    if (prev + bytes > capacity_ || prev + bytes < prev) {
      allocated_.fetch_sub(bytes, std::memory_order_relaxed);
      return nullptr;
    }
    void* p = inner_->try_allocate(stream, bytes);
    if (p == nullptr) {
      allocated_.fetch_sub(bytes, std::memory_order_relaxed);
    }
    return p;
  }
  void do_deallocate(stream_view stream, void* ptr, std::size_t bytes) noexcept override {
    inner_->deallocate(stream, ptr, bytes);
    allocated_.fetch_sub(bytes, std::memory_order_relaxed);
  }
  [[nodiscard]] int do_device() const noexcept override { return inner_->device(); }
  [[nodiscard]] memory_kind do_kind() const noexcept override { return inner_->kind(); }
  [[nodiscard]] std::string do_name() const override { return inner_->name(); }
  [[nodiscard]] bool do_stream_ordered() const noexcept override {
    return inner_->stream_ordered();
  }

  resource* inner_;
  std::size_t capacity_;
  std::atomic<std::size_t> allocated_{0};
};

/// True when built with AddressSanitizer or ThreadSanitizer (randomized tests shrink there).
inline constexpr bool under_sanitizer =
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    true;
#else
    false;
#endif

/// The seed of a randomized test: POOLSCOPE_TEST_SEED if set, else fresh. Printed, and recorded
/// as a test property, so a failure can be replayed.
inline std::uint64_t test_seed() {
  std::uint64_t seed = 0;
  if (const char* v = std::getenv("POOLSCOPE_TEST_SEED"); v != nullptr && *v != '\0') {
    seed = std::strtoull(v, nullptr, 0);
  } else {
    std::random_device rd;
    seed = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
  }
  std::cout << "[          ] seed " << seed << " (replay with POOLSCOPE_TEST_SEED=" << seed
            << ")\n";
  ::testing::Test::RecordProperty("seed", std::to_string(seed));
  return seed;
}

/// The value of environment variable `name` as a count, or `fallback` when unset or invalid.
inline std::uint64_t env_count(const char* name, std::uint64_t fallback) {
  if (const char* v = std::getenv(name); v != nullptr && *v != '\0') {
    char* end = nullptr;
    const std::uint64_t n = std::strtoull(v, &end, 10);
    if (end != v && *end == '\0' && n > 0) {
      return n;
    }
  }
  return fallback;
}

/// A size drawn log-uniformly from [lo, hi] (so small sizes dominate).
inline std::size_t log_uniform(std::mt19937_64& rng, std::size_t lo, std::size_t hi) {
  std::uniform_real_distribution<double> d(std::log2(static_cast<double>(lo)),
                                           std::log2(static_cast<double>(hi) + 1.0));
  const auto v = static_cast<std::size_t>(std::exp2(d(rng)));
  return std::clamp(v, lo, hi);
}

}  // namespace poolscope::pool::testing
