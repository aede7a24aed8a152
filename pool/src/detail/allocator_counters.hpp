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

  /// The credit past which a thread gives its credit back, for a total of `published`.
  [[nodiscard]] static std::size_t cap_for(std::size_t published) noexcept {
    return std::max(min_credit_cap, published >> credit_cap_shift);
  }
  /// Counts `bytes` allocated by a thread whose credit `credit` falls short of them: the credit
  /// is spent and the rest added to the total. Returns the total afterwards (the thread's
  /// bound: its credit is now 0).
  std::size_t spend_all(single_writer<std::size_t>& credit, std::size_t bytes) noexcept {
    const std::size_t c = credit;
    credit = 0;
    return published_.fetch_add(bytes - c, std::memory_order_relaxed) + (bytes - c);
  }
  /// Gives a whole credit back to the total (past its cap, or at its thread's exit).
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
    with_shard(
        [&](counter_shard& s) {
          s.allocations = s.allocations + 1;
          const std::size_t cu = s.credit_in_use;
          const std::size_t cr = s.credit_requested;
          if ((cu < rounded) | (cr < requested)) [[unlikely]] {
            spend_beyond_credit(s, rounded, requested);
            return;
          }
          const std::size_t left_u = cu - rounded;
          const std::size_t left_r = cr - requested;
          s.credit_in_use = left_u;
          s.credit_requested = left_r;
          // The bounds, compared signed: a total read before another thread's update may trail
          // this thread's credit, and such a bound raises nothing.
          const auto bound_u = static_cast<std::int64_t>(in_use_.published() - left_u);
          const auto bound_r = static_cast<std::int64_t>(requested_.published() - left_r);
          if ((bound_u > static_cast<std::int64_t>(peak_in_use.load(std::memory_order_relaxed))) |
              (bound_r > static_cast<std::int64_t>(peak_requested.load(std::memory_order_relaxed))))
              [[unlikely]] {
            raise_peaks(bound_u, bound_r);
          }
        },
        [&] { on_allocate_unslotted(rounded, requested); });
  }
  /// Counts a free of a block of `rounded` bytes allocated for `requested`.
  [[gnu::always_inline]] void on_free(std::size_t rounded, std::size_t requested) noexcept {
    with_shard(
        [&](counter_shard& s) {
          s.deallocations = s.deallocations + 1;
          const std::size_t cu = s.credit_in_use + rounded;
          const std::size_t cr = s.credit_requested + requested;
          // One cap for both credits, from the in-use total (requested bytes never exceed it).
          const std::size_t cap = credited_total::cap_for(in_use_.published());
          if ((cu > cap) | (cr > cap)) [[unlikely]] {
            return_credit(s, cu, cr);
            return;
          }
          s.credit_in_use = cu;
          s.credit_requested = cr;
        },
        [&] { on_free_unslotted(rounded, requested); });
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
  /// Runs `counted(shard)` on the calling thread's shard when its table holds it (inline), else
  /// `unslotted()` (which claims the shard, or counts without one).
  template <class Counted, class Unslotted>
  [[gnu::always_inline]] void with_shard(Counted&& counted, Unslotted&& unslotted) noexcept {
    const thread_slot& slot = thread_registry::slot(shard_key_);
    if (slot.key != shard_key_) [[unlikely]] {
      unslotted();
      return;
    }
    counted(*static_cast<counter_shard*>(slot.node));
  }
  // The paths off the usual one (allocator_counters.cpp).
  [[gnu::noinline]] void on_allocate_unslotted(std::size_t rounded, std::size_t requested) noexcept;
  [[gnu::noinline]] void on_free_unslotted(std::size_t rounded, std::size_t requested) noexcept;
  [[gnu::noinline]] void spend_beyond_credit(counter_shard& s, std::size_t rounded,
                                             std::size_t requested) noexcept;
  [[gnu::noinline]] void return_credit(counter_shard& s, std::size_t credit_in_use,
                                       std::size_t credit_requested) noexcept;
  [[gnu::noinline]] void raise_peaks(std::int64_t in_use, std::int64_t requested) noexcept;

  std::atomic<std::uint64_t> unsharded_allocations_{0}, unsharded_deallocations_{0};
};

}  // namespace poolscope::pool::detail
