// The counters of an allocator (allocator.hpp, "Counters"), kept so that an allocate/deallocate
// pair on one thread writes no memory that another thread writes.
//
// In-use bytes. The shared total `published` counts every block handed out, plus each thread's
// `credit`: bytes that thread freed and has not yet taken off the total. A free adds to the
// freeing thread's credit; an allocation spends its thread's credit first and adds to the total
// only what the credit lacks; a credit past credit_cap goes back to the total at once. So
//   in use = published - (the sum of every thread's credit),
// which stats() computes exactly, and, every credit being >= 0, published minus the calling
// thread's own credit bounds the total from above: exact when no other thread holds credit (one
// thread using the allocator), over by at most a credit cap per other thread (the larger of
// 4 MiB and 1/64 of the total; credited_total). Each allocation
// raises the peak to that bound. A thread that repeats allocate/free of similar sizes (a cache
// hit, a training step) moves its credit back and forth and writes nothing shared. Requested
// bytes work the same way with credits of their own; the counts of allocations and frees are
// plain per-thread sums.
//
// A thread with no shard (no host memory for one, or its exit has begun) updates the shared
// totals directly with atomic read-modify-writes.
//
// Thread safety: a shard is written by the thread that holds it only (handed over under the
// registry's mutex); everything else is atomic. Cost: per allocation or free, the thread's table
// lookup and a few loads and stores; an atomic read-modify-write only when a credit runs dry or
// over its cap.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "single_writer.hpp"
#include "thread_registry.hpp"

namespace poolscope::pool::detail {

/// Raises `peak` to `value` if it is higher.
inline void raise_peak(std::atomic<std::size_t>& peak, std::size_t value) noexcept {
  std::size_t cur = peak.load(std::memory_order_relaxed);
  while (value > cur && !peak.compare_exchange_weak(cur, value, std::memory_order_relaxed)) {
  }
}

/// One thread's part of an allocator's counters: its own cache line(s), written by that thread.
struct alignas(64) counter_shard final : thread_node {
  single_writer<std::size_t> credit_in_use;
  single_writer<std::size_t> credit_requested;
  single_writer<std::uint64_t> allocations;
  single_writer<std::uint64_t> deallocations;
};

/// A shared total and the per-thread credits against it (the file comment).
class credited_total {
 public:
  /// A thread gives its credit back to the total once it passes the larger of these: a few
  /// blocks of a repeated size stay within it, and on large pools of random sizes (where a
  /// fixed cap would be passed by every few frees) a credit seldom reaches it.
  static constexpr std::size_t min_credit_cap = std::size_t{4} << 20;
  static constexpr unsigned credit_cap_shift = 6;  // 1/64 of the total

  /// Counts `bytes` allocated by the thread whose credit is `credit`; returns the upper bound
  /// of the total afterwards (published minus this thread's credit).
  [[gnu::always_inline]] std::size_t spend(single_writer<std::size_t>& credit,
                                           std::size_t bytes) noexcept {
    const std::size_t c = credit;
    if (c >= bytes) {
      const std::size_t left = c - bytes;
      credit = left;
      // Never below zero: a total read before another thread's update may trail this credit.
      const std::size_t p = published_.load(std::memory_order_relaxed);
      return p > left ? p - left : 0;
    }
    credit = 0;
    return published_.fetch_add(bytes - c, std::memory_order_relaxed) + (bytes - c);
  }
  /// Counts `bytes` freed by the thread whose credit is `credit`.
  [[gnu::always_inline]] void refund(single_writer<std::size_t>& credit,
                                     std::size_t bytes) noexcept {
    const std::size_t c = credit + bytes;
    const std::size_t cap =
        std::max(min_credit_cap, published_.load(std::memory_order_relaxed) >> credit_cap_shift);
    if (c > cap) [[unlikely]] {
      published_.fetch_sub(c, std::memory_order_relaxed);
      credit = 0;
      return;
    }
    credit = c;
  }
  /// Gives a credit back to the total (a thread's exit: its shard waits for a later thread).
  void settle(single_writer<std::size_t>& credit) noexcept {
    published_.fetch_sub(credit, std::memory_order_relaxed);
    credit = 0;
  }
  /// For a thread with no shard.
  std::size_t add(std::size_t bytes) noexcept {
    return published_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  }
  void sub(std::size_t bytes) noexcept { published_.fetch_sub(bytes, std::memory_order_relaxed); }
  [[nodiscard]] std::size_t published() const noexcept {
    return published_.load(std::memory_order_relaxed);
  }

 private:
  std::atomic<std::size_t> published_{0};
};

/// Everything an allocator counts. Owned by its allocator; see the file comment.
class allocator_counters final : public thread_node_owner {
 public:
  allocator_counters()
      : shards_(std::make_shared<thread_registry>(*this)), shard_key_(shards_->key()) {}
  allocator_counters(const allocator_counters&) = delete;
  allocator_counters& operator=(const allocator_counters&) = delete;
  ~allocator_counters() {
    shards_->close([](thread_node&) {});
  }

  /// Counts an allocation of `rounded` bytes for `requested`, and raises the peaks.
  [[gnu::always_inline]] void on_allocate(std::size_t rounded, std::size_t requested) noexcept {
    auto* s = static_cast<counter_shard*>(thread_registry::local(shard_key_, *shards_));
    if (s == nullptr) [[unlikely]] {
      on_allocate_unsharded(rounded, requested);
      return;
    }
    s->allocations = s->allocations + 1;
    raise(peak_in_use, in_use_.spend(s->credit_in_use, rounded));
    raise(peak_requested, requested_.spend(s->credit_requested, requested));
  }
  /// Counts a free of a block of `rounded` bytes allocated for `requested`.
  [[gnu::always_inline]] void on_free(std::size_t rounded, std::size_t requested) noexcept {
    auto* s = static_cast<counter_shard*>(thread_registry::local(shard_key_, *shards_));
    if (s == nullptr) [[unlikely]] {
      on_free_unsharded(rounded, requested);
      return;
    }
    s->deallocations = s->deallocations + 1;
    in_use_.refund(s->credit_in_use, rounded);
    requested_.refund(s->credit_requested, requested);
  }

  /// The totals, exact for one instant when no other thread counts meanwhile (takes the
  /// registry's mutex; O(threads that used the allocator)).
  struct totals {
    std::size_t in_use = 0;
    std::size_t requested = 0;
    std::uint64_t allocations = 0;
    std::uint64_t deallocations = 0;
  };
  [[nodiscard]] totals exact() const;
  /// The calling thread's upper bound of the bytes in use (published minus its own credit).
  [[nodiscard]] std::size_t in_use_bound() noexcept;

  // What every allocation and free reads (the key of the thread's shard, the published totals,
  // the peaks), written only when a credit runs dry or over or a peak rises: a line of its own.
 private:
  std::shared_ptr<thread_registry> shards_;
  alignas(64) const std::uint32_t shard_key_;
  credited_total in_use_;
  credited_total requested_;

 public:
  std::atomic<std::size_t> peak_in_use{0};
  std::atomic<std::size_t> peak_requested{0};
  // What upstream_allocate / upstream_deallocate and the reports count.
  alignas(64) std::atomic<std::size_t> reserved{0};
  std::atomic<std::size_t> peak_reserved{0};
  std::atomic<std::uint64_t> upstream_allocs{0}, upstream_frees{0}, upstream_failures{0};
  std::atomic<std::uint64_t> oom_count{0}, limit_hits{0}, invalid_frees{0};

 private:
  [[nodiscard]] std::unique_ptr<thread_node> make_node() override {
    return std::make_unique<counter_shard>();
  }
  void retire(thread_node& node) noexcept override;
  [[gnu::noinline]] void on_allocate_unsharded(std::size_t rounded, std::size_t requested) noexcept;
  [[gnu::noinline]] void on_free_unsharded(std::size_t rounded, std::size_t requested) noexcept;
  /// Raises `peak` to `bound` (one predicted compare when it is not a new high).
  [[gnu::always_inline]] static void raise(std::atomic<std::size_t>& peak,
                                           std::size_t bound) noexcept {
    if (bound > peak.load(std::memory_order_relaxed)) [[unlikely]] {
      raise_peak(peak, bound);
    }
  }

  std::atomic<std::uint64_t> unsharded_allocations_{0}, unsharded_deallocations_{0};
};

}  // namespace poolscope::pool::detail
