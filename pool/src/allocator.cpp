#include "poolscope/pool/allocator.hpp"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "detail/allocator_inline.hpp"
#include "detail/round_up.hpp"
#include "detail/thread_cache.hpp"
#include "poolscope/error.hpp"
#include "poolscope/hooks/hook.hpp"
#include "poolscope/log.hpp"

namespace poolscope::pool {
using detail::raise_peak;

namespace {

std::atomic<std::uint32_t> g_next_id{1};

}  // namespace

std::string allocator_stats::to_json() const {
  nlohmann::json j = {
      {"in_use", in_use},
      {"peak_in_use", peak_in_use},
      {"requested_in_use", requested_in_use},
      {"peak_requested", peak_requested},
      {"reserved", reserved},
      {"peak_reserved", peak_reserved},
      {"allocations", allocations},
      {"deallocations", deallocations},
      {"upstream_allocs", upstream_allocs},
      {"upstream_frees", upstream_frees},
      {"upstream_failures", upstream_failures},
      {"oom_count", oom_count},
      {"limit_hits", limit_hits},
      {"invalid_frees", invalid_frees},
      {"cached_blocks", cached_blocks},
      {"cached_bytes", cached_bytes},
      {"largest_free_block", largest_free_block},
      {"fragmentation", fragmentation},
      {"limit", limit == SIZE_MAX ? nlohmann::json(nullptr) : nlohmann::json(limit)},
  };
  return j.dump();
}

allocator::allocator(resource& upstream, std::string name)
    : upstream_(&upstream),
      name_(std::move(name)),
      id_(g_next_id.fetch_add(1, std::memory_order_relaxed)),
      device_(upstream.device()) {}

allocator::~allocator() {
  // A strategy with a cache detaches it first in its own destructor; this only catches one that
  // did not (its caches then die here, after the strategy: nothing may reclaim into it).
  disable_thread_cache();
}

void allocator::set_limit(std::size_t bytes) noexcept {
  limit_.store(bytes, std::memory_order_relaxed);
  (void)flush_thread_caches();
}

void allocator::emit(hooks::event_kind kind, hooks::event_phase phase, stream_view stream,
                     void* ptr, std::size_t requested, std::size_t rounded,
                     hooks::free_error error) const noexcept {
  if (reporter_ != nullptr || !hooks::wants(kind, phase)) {
    // An adopted inner strategy (the composite reports this operation itself), or an event
    // that no installed hook asks for: not built.
    return;
  }
  hooks::event e;
  e.kind = kind;
  e.phase = phase;
  e.error = error;
  e.device = device_;
  e.stream = stream.value();
  e.allocator_id = id_;
  e.allocator_name = name_.c_str();
  e.ptr = ptr;
  e.requested = requested;
  e.rounded = rounded;
  e.in_use = in_use_hint();
  e.reserved = reserved_.load(std::memory_order_relaxed);
  hooks::dispatch(e);
}

// After the thread cache (if any) missed or stepped aside: the strategy, its retry and the
// counters. `cache` is this thread's cache (null without one), `record` whether it records the
// block (a size it may cache). Inlined into serve and serve_cached.
[[gnu::always_inline]] inline block allocator::serve_strategy(stream_view stream, std::size_t bytes,
                                                              std::size_t alignment,
                                                              std::size_t lim,
                                                              detail::thread_cache* cache,
                                                              bool record) {
  if (!record) {
    // The strategy, called here (one call less per request); a refusal goes to the retry.
    return settle(stream, bytes, alignment, lim, cache, do_allocate(stream, bytes, alignment));
  }
  block b = do_allocate_held(stream, bytes, alignment);
  if (b.ptr == nullptr) [[unlikely]] {
    b = allocate_after_refusal(stream, bytes, alignment, lim, true);
  }
  tc_record(cache, stream, b, bytes);
  return b;
}

void* allocator::do_serve(stream_view stream, std::size_t bytes, std::size_t alignment,
                          detail::thread_cache* cache) {
  return finish_serve(stream, bytes, alignment, cache, do_allocate(stream, bytes, alignment));
}

// A request with thread caches that serve did not settle inline: the cache first (a hit takes
// no shared lock and writes no shared counter: the cache's shard counts it), then the strategy.
// `cache`: this thread's last-used cache if it is this allocator's, else null (tc_take looks it
// up, or makes it, then).
[[gnu::always_inline]] inline block allocator::serve_cached(stream_view stream, std::size_t bytes,
                                                            std::size_t alignment, std::size_t lim,
                                                            detail::thread_cache* cache) {
  bool record = false;  // on a miss: whether the cache records, and counts, the strategy's block
  const block b = tc_take(stream, bytes, cache, record);
  if (b.ptr != nullptr) {
    return b;
  }
  return serve_strategy(stream, bytes, alignment, lim, cache, record);
}

// The strategy's part of a request that passed the checks (allocate and allocate_checked).
// Inlined into both. With thread caches, this thread's cache, when it rests (as it does on
// random sizes, most of the time), is skipped here before anything else, so that such a request
// costs the cache a thread-local load, a test and a count (and no local whose address escapes
// to tc_take: those cost stores and loads on every request).
[[gnu::always_inline]] inline bool allocator::cache_first(detail::thread_cache*& cache) noexcept {
  cache = nullptr;
  if (tc_ == nullptr) {
    return false;
  }
  if (detail::t_last.allocator_id != id_) {
    return true;  // tc_take looks this thread's cache up
  }
  cache = detail::t_last.cache;  // never null where the id matches (thread_cache.hpp)
  return !cache->skip_resting();
}

[[gnu::always_inline]] inline block allocator::serve(stream_view stream, std::size_t bytes,
                                                     std::size_t alignment, std::size_t lim) {
  detail::thread_cache* cache = nullptr;
  if (cache_first(cache)) {
    return serve_cached(stream, bytes, alignment, lim, cache);
  }
  return serve_strategy(stream, bytes, alignment, lim, cache, false);
}

void* allocator::allocate(stream_view stream, std::size_t bytes, std::size_t alignment) {
  // The usual request in one predicted branch: valid arguments (alignment a power of two up to
  // max_alignment, 0 < bytes <= max_request_bytes), no hook, no limit. Each term is zero exactly
  // then (the divisions are shifts); anything else takes allocate_checked, which checks them one
  // by one in the contract's order. (One branch: with deallocate's like it, about 19
  // instructions less per pair on DESIGN.md §4 A2, callgrind, of about 750.)
  const std::size_t unusual = (alignment & (alignment - 1)) | ((alignment - 1) / max_alignment) |
                              ((bytes - 1) / max_request_bytes) |
                              ~limit_.load(std::memory_order_relaxed) |
                              static_cast<std::size_t>(hooks::active());
  if (unusual != 0) [[unlikely]] {
    return allocate_checked(stream, bytes, alignment);
  }
  // As serve, but a request that no thread cache takes ends in the strategy's do_serve, which
  // finishes it there: a tail call, so that this function needs no frame of its own then.
  detail::thread_cache* cache = nullptr;
  if (cache_first(cache)) {
    return allocate_cached(stream, bytes, alignment, cache);
  }
  return do_serve(stream, bytes, alignment, cache);
}

// allocate's request when this thread's cache (if any) is not resting: the cache first, as
// serve_cached, then the strategy (do_serve, for a block the cache does not record).
void* allocator::allocate_cached(stream_view stream, std::size_t bytes, std::size_t alignment,
                                 detail::thread_cache* cache) {
  bool record = false;
  block b = tc_take(stream, bytes, cache, record);
  if (b.ptr == nullptr) {
    if (!record) {
      return do_serve(stream, bytes, alignment, cache);
    }
    b = serve_strategy(stream, bytes, alignment, SIZE_MAX, cache, true);
  }
  if (hooks::active()) [[unlikely]] {  // installed meanwhile
    emit(hooks::event_kind::pool_malloc, hooks::event_phase::post, stream, b.ptr, bytes, b.rounded);
  }
  return b.ptr;
}

void* allocator::allocate_checked(stream_view stream, std::size_t bytes, std::size_t alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
    throw invalid_argument("poolscope: alignment " + std::to_string(alignment) + " given to " +
                           name_ + " is not a power of two");
  }
  if (alignment > max_alignment) {
    throw invalid_argument("poolscope: alignment " + std::to_string(alignment) + " given to " +
                           name_ + " exceeds the largest supported alignment " +
                           std::to_string(max_alignment));
  }
  if (bytes == 0) {
    return nullptr;
  }
  const bool hooked = hooks::active();
  if (hooked) [[unlikely]] {
    emit(hooks::event_kind::pool_malloc, hooks::event_phase::pre, stream, nullptr, bytes, 0);
  }
  if (bytes > max_request_bytes) {
    throw_oom(stream, bytes, "size overflow: the request exceeds the largest supported size");
  }
  const std::size_t lim = limit_.load(std::memory_order_relaxed);
  // in_use_ bounds the total from above (it counts thread-cached blocks too): refuse only on
  // the exact total. The request counts at the size its block will have (in use counts that).
  if (lim != SIZE_MAX) {
    const std::size_t need = detail::round_up(bytes, granularity_);
    if (shared_in_use() + need > lim && in_use_exact() + need > lim) {
      limit_hits_.fetch_add(1, std::memory_order_relaxed);
      if (hooks::active()) [[unlikely]] {
        emit(hooks::event_kind::limit_hit, hooks::event_phase::instant, stream, nullptr, bytes, 0);
      }
      throw_oom(stream, bytes, "limit: in-use bytes would exceed the allocator's limit");
    }
  }
  const block b = serve(stream, bytes, alignment, lim);
  if (hooked || hooks::active()) {
    emit(hooks::event_kind::pool_malloc, hooks::event_phase::post, stream, b.ptr, bytes, b.rounded);
  }
  return b.ptr;
}

// Upstream exhausted (or the reserved limit reached) on the first try: give back the cache and
// retry once; out of line, as the first try is not.
block allocator::allocate_after_refusal(stream_view stream, std::size_t bytes,
                                        std::size_t alignment, std::size_t lim, bool held) {
  release_cached();
  const std::uint64_t hits = limit_hits_.load(std::memory_order_relaxed);
  const block b =
      held ? do_allocate_held(stream, bytes, alignment) : do_allocate(stream, bytes, alignment);
  if (b.ptr == nullptr) {
    // The strategy may have asked upstream for more than `bytes` (rounding, segments): a
    // refusal by the limit shows in limit_hits_.
    throw_oom(stream, bytes,
              limit_hits_.load(std::memory_order_relaxed) != hits ||
                      (lim != SIZE_MAX && reserved_.load(std::memory_order_relaxed) + bytes > lim)
                  ? "limit: reserved bytes would exceed the allocator's limit"
                  : "upstream exhausted: the resource could not supply a new block even after "
                    "cached blocks were released");
  }
  return b;
}

// A free of `ptr` (not null) past its pre event: the thread cache (take_back_cached), or the
// strategy's do_take_back, which finishes the free itself. Both tail calls: deallocate needs no
// frame of its own. Inlined into deallocate and deallocate_checked.
[[gnu::always_inline]] inline void allocator::take_back(stream_view stream, void* ptr,
                                                        std::size_t bytes, std::size_t alignment,
                                                        bool hooked) noexcept {
  // The thread's own cache first, if it may hold the block (the address filter, inline: most
  // frees of a random-size workload are not recorded there).
  if (tc_ != nullptr) {
    // t_last's cache is never null where its allocator id matches (thread_cache.hpp): one test.
    const bool last = detail::t_last.allocator_id == id_;
    if (!last || detail::t_last.cache->may_hold(ptr)) {
      take_back_cached(stream, ptr, bytes, alignment, hooked);
      return;
    }
  }
  do_take_back(stream, ptr, bytes, alignment, hooked);
}

// take_back's free of a block this thread's cache may hold (or of any block, when the thread's
// last-used cache is another allocator's): the cache, then finish_free, or do_take_back.
void allocator::take_back_cached(stream_view stream, void* ptr, std::size_t bytes,
                                 std::size_t alignment, bool hooked) noexcept {
  // As take_back found it; null: tc_give looks this thread's cache up.
  detail::thread_cache* c = detail::t_last.allocator_id == id_ ? detail::t_last.cache : nullptr;
  free_outcome cached;
  if (tc_give(c, stream, ptr, bytes, cached)) {
    // Counted in the cache's shard (or a double free, which frees nothing and counts nothing).
    finish_free(stream, ptr, bytes, cached, /*counted=*/true, hooked);
    return;
  }
  do_take_back(stream, ptr, bytes, alignment, hooked);
}

void allocator::do_take_back(stream_view stream, void* ptr, std::size_t bytes,
                             std::size_t alignment, bool hooked) noexcept {
  finish_take_back(stream, ptr, bytes, do_deallocate(stream, ptr, bytes, alignment), hooked);
}

void allocator::deallocate(stream_view stream, void* ptr, std::size_t bytes,
                           std::size_t alignment) noexcept {
  // The usual free in one predicted branch (a block, no hook); deallocate_checked has the rest.
  if ((ptr == nullptr) | hooks::active()) [[unlikely]] {
    deallocate_checked(stream, ptr, bytes, alignment);
    return;
  }
  take_back(stream, ptr, bytes, alignment, false);
}

void allocator::deallocate_checked(stream_view stream, void* ptr, std::size_t bytes,
                                   std::size_t alignment) noexcept {
  if (ptr == nullptr) {
    if (bytes != 0) {
      report_invalid_free(stream, ptr, bytes, {hooks::free_error::null_with_size, 0, 0});
    }
    return;
  }
  const bool hooked = hooks::active();
  if (hooked) [[unlikely]] {
    emit(hooks::event_kind::pool_free, hooks::event_phase::pre, stream, ptr, bytes, 0);
  }
  take_back(stream, ptr, bytes, alignment, hooked);
}

void allocator::report_invalid_free(stream_view stream, void* ptr, std::size_t bytes,
                                    free_outcome outcome) noexcept {
  invalid_frees_.fetch_add(1, std::memory_order_relaxed);
  if (hooks::active()) {
    emit(hooks::event_kind::invalid_free, hooks::event_phase::instant, stream, ptr, bytes,
         outcome.rounded, outcome.error);
  }
  if (log_enabled(log_level::warn)) {
    char buf[256];
    const auto what = hooks::to_string(outcome.error);
    if (outcome.error == hooks::free_error::size_mismatch) {
      std::snprintf(buf, sizeof buf,
                    "%s: deallocate(%p, %zu bytes): %.*s, the block holds %zu bytes; freed with "
                    "its true size",
                    name_.c_str(), ptr, bytes, static_cast<int>(what.size()), what.data(),
                    outcome.requested);
    } else {
      std::snprintf(buf, sizeof buf, "%s: deallocate(%p, %zu bytes): %.*s; ignored", name_.c_str(),
                    ptr, bytes, static_cast<int>(what.size()), what.data());
    }
    log(log_level::warn, buf);
  }
}

void allocator::throw_oom(stream_view stream, std::size_t bytes, const char* cause) {
  oom_count_.fetch_add(1, std::memory_order_relaxed);
  if (hooks::active()) {
    emit(hooks::event_kind::oom, hooks::event_phase::instant, stream, nullptr, bytes, 0);
  }
  oom_context ctx;
  ctx.requested = bytes;
  ctx.reserved = reserved_.load(std::memory_order_relaxed);
  ctx.in_use = in_use_exact();
  allocator_stats cache;
  do_cache_stats(cache);
  if (tc_ != nullptr) {
    tc_cache_stats(cache);  // blocks idle in thread caches are free blocks too, as in stats()
  }
  ctx.largest_free_block = cache.largest_free_block;
  ctx.cached_other_streams = do_cached_bytes_other_streams(stream);
  ctx.limit = limit();
  ctx.device = device_;
  throw out_of_memory(name_, ctx, cause);
}

namespace {

/// shared + delta, clamped to [0, shared]: fields of a snapshot under concurrent use may be from
/// different instants (the shards are read after the shared counter).
std::size_t with_delta(std::size_t shared, std::int64_t delta) noexcept {
  if (delta >= 0) {
    return shared;  // deltas are <= 0 at any one instant
  }
  const auto down = static_cast<std::size_t>(-delta);
  return down > shared ? 0 : shared - down;
}

}  // namespace

std::size_t allocator::in_use_exact() const {
  const std::size_t shared = shared_in_use();
  return tc_ == nullptr ? shared : with_delta(shared, tc_shard_sums().in_use);
}

std::size_t allocator::in_use_hint() const noexcept {
  const std::size_t shared = shared_in_use();
  if (tc_ == nullptr) {
    return shared;
  }
  // Never above the peak (see stats()): a timeline's memory track peaks where the pool's does.
  return std::min(with_delta(shared, tc_own_in_use_delta()),
                  peak_in_use_.load(std::memory_order_relaxed));
}

allocator_stats allocator::stats() const {
  allocator_stats s;
  s.in_use = shared_in_use();
  s.requested_in_use = shared_requested();
  s.reserved = reserved_.load(std::memory_order_relaxed);
  s.peak_reserved = peak_reserved_.load(std::memory_order_relaxed);
  s.allocations = allocations_.load(std::memory_order_relaxed) +
                  locked_.allocations.load(std::memory_order_relaxed);
  s.deallocations = deallocations_.load(std::memory_order_relaxed) +
                    locked_.deallocations.load(std::memory_order_relaxed);
  if (tc_ != nullptr) {
    const shard_sums sums = tc_shard_sums();
    s.in_use = with_delta(s.in_use, sums.in_use);
    s.requested_in_use = with_delta(s.requested_in_use, sums.requested);
    s.allocations += sums.allocations;
    s.deallocations += sums.deallocations;
  }
  // The peaks after the totals: every total ever in use is under the peak (it bounds each
  // operation's total from above), so a sum of counters read at nearby instants that passes it
  // counted a block twice across those instants; the snapshot reports no more than the peak.
  s.peak_in_use = peak_in_use_.load(std::memory_order_relaxed);
  s.peak_requested = peak_requested_.load(std::memory_order_relaxed);
  s.in_use = std::min(s.in_use, s.peak_in_use);
  s.requested_in_use = std::min(s.requested_in_use, s.peak_requested);
  s.upstream_allocs = upstream_allocs_.load(std::memory_order_relaxed);
  s.upstream_frees = upstream_frees_.load(std::memory_order_relaxed);
  s.upstream_failures = upstream_failures_.load(std::memory_order_relaxed);
  s.oom_count = oom_count_.load(std::memory_order_relaxed);
  s.limit_hits = limit_hits_.load(std::memory_order_relaxed);
  s.invalid_frees = invalid_frees_.load(std::memory_order_relaxed);
  s.limit = limit();
  do_cache_stats(s);
  if (tc_ != nullptr) {
    tc_cache_stats(s);  // blocks in thread caches are cached, not in use
  }
  s.fragmentation = s.cached_bytes == 0 ? 0.0
                                        : 1.0 - static_cast<double>(s.largest_free_block) /
                                                    static_cast<double>(s.cached_bytes);
  return s;
}

std::size_t allocator::release_cached() {
  const bool hooked = hooks::active();
  if (hooked) [[unlikely]] {
    emit(hooks::event_kind::release, hooks::event_phase::pre, stream_view{}, nullptr, 0, 0);
  }
  (void)flush_thread_caches();  // every thread's, so that their blocks can be released too
  const std::size_t released = do_release_cached();
  if (hooked || hooks::active()) [[unlikely]] {
    emit(hooks::event_kind::release, hooks::event_phase::post, stream_view{}, nullptr, released,
         released);
  }
  return released;
}

void* allocator::upstream_allocate(stream_view stream, std::size_t bytes) {
  const std::size_t lim = limit_.load(std::memory_order_relaxed);
  if (lim != SIZE_MAX && reserved_.load(std::memory_order_relaxed) + bytes > lim) {
    limit_hits_.fetch_add(1, std::memory_order_relaxed);
    if (hooks::active()) [[unlikely]] {
      emit(hooks::event_kind::limit_hit, hooks::event_phase::instant, stream, nullptr, bytes, 0);
    }
    return nullptr;
  }
  const bool hooked = hooks::active();
  if (hooked) [[unlikely]] {
    emit(hooks::event_kind::device_alloc, hooks::event_phase::pre, stream, nullptr, bytes, 0);
  }
  void* p = upstream_->try_allocate(stream, bytes);
  if (p == nullptr) {
    upstream_failures_.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  const std::size_t res = reserved_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  raise_peak(peak_reserved_, res);
  upstream_allocs_.fetch_add(1, std::memory_order_relaxed);
  if (hooked || hooks::active()) [[unlikely]] {
    emit(hooks::event_kind::device_alloc, hooks::event_phase::post, stream, p, bytes, bytes);
  }
  return p;
}

void allocator::upstream_deallocate(stream_view stream, void* ptr, std::size_t bytes) noexcept {
  const bool hooked = hooks::active();
  if (hooked) [[unlikely]] {
    emit(hooks::event_kind::device_free, hooks::event_phase::pre, stream, ptr, bytes, bytes);
  }
  // Lowered first: once the resource has the memory back, another thread's upstream_allocate
  // may get it and count it, and the reserved peak must not count it twice.
  reserved_.fetch_sub(bytes, std::memory_order_relaxed);
  upstream_->deallocate(stream, ptr, bytes);
  upstream_frees_.fetch_add(1, std::memory_order_relaxed);
  if (hooked || hooks::active()) [[unlikely]] {
    emit(hooks::event_kind::device_free, hooks::event_phase::post, stream, nullptr, bytes, bytes);
  }
}

void allocator::emit_split(stream_view stream, void* taken, std::size_t taken_bytes, void* rest,
                           std::size_t rest_bytes) const noexcept {
  if (!hooks::wants(hooks::event_kind::split, hooks::event_phase::instant)) {
    return;
  }
  const allocator& who = reporter_ != nullptr ? *reporter_ : *this;
  hooks::event e;
  e.kind = hooks::event_kind::split;
  e.phase = hooks::event_phase::instant;
  e.device = who.device_;
  e.stream = stream.value();
  e.allocator_id = who.id_;
  e.allocator_name = who.name_.c_str();
  e.ptr = taken;
  e.rounded = taken_bytes;
  e.aux_ptr = rest;
  e.aux_bytes = rest_bytes;
  e.in_use = who.in_use_hint();
  e.reserved = who.reserved_.load(std::memory_order_relaxed);
  hooks::dispatch(e);
}

void allocator::emit_merge(stream_view stream, void* result, std::size_t result_bytes,
                           void* absorbed, std::size_t absorbed_bytes) const noexcept {
  if (!hooks::wants(hooks::event_kind::merge, hooks::event_phase::instant)) {
    return;
  }
  const allocator& who = reporter_ != nullptr ? *reporter_ : *this;
  hooks::event e;
  e.kind = hooks::event_kind::merge;
  e.phase = hooks::event_phase::instant;
  e.device = who.device_;
  e.stream = stream.value();
  e.allocator_id = who.id_;
  e.allocator_name = who.name_.c_str();
  e.ptr = result;
  e.rounded = result_bytes;
  e.aux_ptr = absorbed;
  e.aux_bytes = absorbed_bytes;
  e.in_use = who.in_use_hint();
  e.reserved = who.reserved_.load(std::memory_order_relaxed);
  hooks::dispatch(e);
}

}  // namespace poolscope::pool
