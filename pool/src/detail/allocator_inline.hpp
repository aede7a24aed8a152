// The allocator's member functions that end a request or a free (allocator.hpp): defined here,
// inline, so that a strategy that overrides do_serve / do_take_back compiles them into its own
// hot function, after its allocation or free (bfc_allocator.cpp), and allocator.cpp into its
// own paths. One definition for both: what is counted and reported stays in one place.
#pragma once

#include "poolscope/hooks/hook.hpp"
#include "poolscope/pool/allocator.hpp"
#include "thread_cache.hpp"

namespace poolscope::pool {

// After the strategy's do_allocate gave `b` for a request that no thread cache records: its
// retry, if upstream refused, and the counters. `cache` is this thread's cache (null without
// one); `lim` the limit the request was checked against.
[[gnu::always_inline]] inline block allocator::settle(stream_view stream, std::size_t bytes,
                                                      std::size_t alignment, std::size_t lim,
                                                      detail::thread_cache* cache, block b) {
  if (b.ptr == nullptr) [[unlikely]] {
    b = allocate_after_refusal(stream, bytes, alignment, lim, false);
  }
  if (counts_under_lock_) {
    // The strategy counted it (account_alloc_locked) and, without caches, raised the peaks.
    if (cache != nullptr) {
      tc_raise_peaks(*cache);
    } else if (tc_ != nullptr) [[unlikely]] {  // no cache for this thread (no host memory)
      detail::raise_peak(peak_in_use_, shared_in_use());
      detail::raise_peak(peak_requested_, shared_requested());
    }
  } else {
    const std::size_t used = in_use_.fetch_add(b.rounded, std::memory_order_relaxed) + b.rounded;
    const std::size_t req = requested_in_use_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    allocations_.fetch_add(1, std::memory_order_relaxed);
    if (cache != nullptr) {
      tc_raise_peaks(*cache);  // the shared counters count this thread's cached blocks too
    } else {
      detail::raise_peak(peak_in_use_, used);
      detail::raise_peak(peak_requested_, req);
    }
  }
  return b;
}

[[gnu::always_inline]] inline void* allocator::finish_serve(stream_view stream, std::size_t bytes,
                                                            std::size_t alignment,
                                                            detail::thread_cache* cache, block b) {
  b = settle(stream, bytes, alignment, SIZE_MAX, cache, b);  // allocate's checks: no limit
  return finish_served(stream, bytes, b);
}

[[gnu::always_inline]] inline void* allocator::finish_served(stream_view stream, std::size_t bytes,
                                                             block b) {
  if (hooks::active()) [[unlikely]] {  // installed meanwhile
    emit(hooks::event_kind::pool_malloc, hooks::event_phase::post, stream, b.ptr, bytes, b.rounded);
  }
  return b.ptr;
}

[[gnu::always_inline]] inline void allocator::account_served_locked(
    std::size_t rounded, std::size_t requested, const detail::thread_cache* cache) noexcept {
  const std::size_t locked_used = plain_add(locked_.in_use, rounded);
  const std::size_t locked_req = plain_add(locked_.requested, requested);
  plain_add(locked_.allocations, std::uint64_t{1});
  // What tc_raise_peaks (or, without a cache, settle) would raise them to after the lock, from
  // the same counters: shared_in_use() and shared_requested() with the locked ones as just
  // written, plus this thread's shard. (Here they cost no second load of the locked counters
  // and no second test of counts_under_lock_ and of the cache after the lock.)
  std::int64_t own_used = 0;
  std::int64_t own_req = 0;
  if (cache != nullptr) {
    own_used = cache->d_in_use.load(std::memory_order_relaxed);
    own_req = cache->d_requested.load(std::memory_order_relaxed);
  }
  raise_peaks(
      static_cast<std::int64_t>(in_use_.load(std::memory_order_relaxed) + locked_used) + own_used,
      static_cast<std::int64_t>(requested_in_use_.load(std::memory_order_relaxed) + locked_req) +
          own_req);
}

// The end of a free whose outcome is known: the report of an invalid free, the count (unless
// `counted`: in a thread cache's shard, or by the strategy's account_free), the post event.
[[gnu::always_inline]] inline void allocator::finish_free(stream_view stream, void* ptr,
                                                          std::size_t bytes,
                                                          const free_outcome& out, bool counted,
                                                          bool hooked) noexcept {
  if (out.error != hooks::free_error::none) [[unlikely]] {
    report_invalid_free(stream, ptr, bytes, out);
    if (out.rounded == 0) {
      return;  // ignored: nothing was freed
    }
  }
  // The strategy has lowered in_use_ already (account_free), before the block became reusable.
  if (!counted) {
    deallocations_.fetch_add(1, std::memory_order_relaxed);
  }
  if (hooked || hooks::active()) [[unlikely]] {
    emit(hooks::event_kind::pool_free, hooks::event_phase::post, stream, ptr, out.requested,
         out.rounded);
  }
}

// finish_take_back and finish_counted_take_back: `counted` says whether the strategy counted a
// free it took back (count_under_lock).
[[gnu::always_inline]] inline void allocator::finish_take_back_of(stream_view stream, void* ptr,
                                                                  std::size_t bytes,
                                                                  const free_outcome& out,
                                                                  bool counted,
                                                                  bool hooked) noexcept {
  if (out.held) [[unlikely]] {
    // Another thread's cache recorded it (or an exited thread's, now an orphan); the strategy
    // counted nothing. (Finished here, apart: the usual finish then takes `counted` as it is,
    // with no test of `held` folded in, 7 instructions less per pair on DESIGN.md §4 A2,
    // callgrind.)
    free_outcome remote = out;
    if (!tc_give_remote(stream, ptr, bytes, remote)) {
      // Held, yet no record: another free of it is taking it back right now.
      remote = {hooks::free_error::double_free, 0, 0};
    }
    finish_free(stream, ptr, bytes, remote, false, hooked);
    return;
  }
  finish_free(stream, ptr, bytes, out, counted, hooked);
}

[[gnu::always_inline]] inline void allocator::finish_take_back(stream_view stream, void* ptr,
                                                               std::size_t bytes,
                                                               const free_outcome& out,
                                                               bool hooked) noexcept {
  finish_take_back_of(stream, ptr, bytes, out, counts_under_lock_, hooked);
}

[[gnu::always_inline]] inline void allocator::finish_counted_take_back(stream_view stream,
                                                                       void* ptr, std::size_t bytes,
                                                                       const free_outcome& out,
                                                                       bool hooked) noexcept {
  finish_take_back_of(stream, ptr, bytes, out, true, hooked);
}

}  // namespace poolscope::pool
