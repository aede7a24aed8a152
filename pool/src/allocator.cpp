// The allocator base class (allocator.hpp): validation, the limit, counting, the
// out-of-memory retry and hook emission, once for every strategy and adaptor.
#include "poolscope/pool/allocator.hpp"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "detail/allocator_counters.hpp"
#include "detail/round_up.hpp"
#include "poolscope/error.hpp"
#include "poolscope/hooks/hook.hpp"
#include "poolscope/log.hpp"

namespace poolscope::pool {

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
      device_(upstream.device()),
      counters_(std::make_unique<detail::allocator_counters>()) {}

allocator::~allocator() = default;

void allocator::adopt(allocator& inner, adopted_upstream upstream) noexcept {
  inner.reporter_ = this;
  inner.accounts_ = upstream == adopted_upstream::shared ? this : &inner;
}

// ---- allocate -------------------------------------------------------------------------------

// The strategy, its retry and the counters: every request that passed the checks, hooked or not.
// Inlined into allocate and allocate_checked.
[[gnu::always_inline]] inline block allocator::serve(stream_view stream, std::size_t bytes,
                                                     std::size_t alignment) {
  block b = do_allocate(stream, bytes, alignment);
  if (b.ptr == nullptr) [[unlikely]] {
    b = allocate_after_refusal(stream, bytes, alignment);
  }
  counters_->on_allocate(b.rounded, bytes);
  return b;
}

void* allocator::allocate(stream_view stream, std::size_t bytes, std::size_t alignment) {
  // The usual request in one predicted branch: the default alignment, 0 < bytes <=
  // max_request_bytes, no hook, no limit. Each term is zero exactly then (the division is a
  // shift); anything else (another alignment included) takes allocate_checked, which checks the
  // arguments one by one in the contract's order and serves the request the same way.
  const std::size_t unusual = (alignment ^ max_alignment) | ((bytes - 1) / max_request_bytes) |
                              ~limit_.load(std::memory_order_relaxed) |
                              static_cast<std::size_t>(hooks::active());
  if (unusual != 0) [[unlikely]] {
    return allocate_checked(stream, bytes, alignment);
  }
  return serve(stream, bytes, alignment).ptr;
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
  if (const std::size_t lim = limit_.load(std::memory_order_relaxed); lim != SIZE_MAX) {
    check_limit(stream, bytes, lim);
  }
  const block b = serve(stream, bytes, alignment);
  if (hooked || hooks::active()) {
    emit(hooks::event_kind::pool_malloc, hooks::event_phase::post, stream, b.ptr, bytes, b.rounded);
  }
  return b.ptr;
}

void allocator::check_limit(stream_view stream, std::size_t bytes, std::size_t limit) {
  // The request counts at the size its block will have (in use counts that). The calling
  // thread's bound first; the exact total (a walk of the shards) only when the bound refuses.
  const std::size_t need = detail::round_up(bytes, granularity_);
  if (counters_->in_use_bound() + need <= limit || counters_->exact().in_use + need <= limit) {
    return;
  }
  counters_->limit_hits.fetch_add(1, std::memory_order_relaxed);
  if (hooks::active()) [[unlikely]] {
    emit(hooks::event_kind::limit_hit, hooks::event_phase::instant, stream, nullptr, bytes, 0);
  }
  throw_oom(stream, bytes, "limit: in-use bytes would exceed the allocator's limit");
}

// Upstream exhausted (or the reserved limit reached) on the first try: give back the cache and
// retry once; out of line, as the first try is not.
block allocator::allocate_after_refusal(stream_view stream, std::size_t bytes,
                                        std::size_t alignment) {
  release_cached();
  const detail::allocator_counters& acc = *accounts_->counters_;
  const std::uint64_t hits = acc.limit_hits.load(std::memory_order_relaxed);
  const block b = do_allocate(stream, bytes, alignment);
  if (b.ptr == nullptr) {
    // The strategy may have asked upstream for more than `bytes` (rounding, segments): a
    // refusal by the limit shows in limit_hits.
    const std::size_t lim = accounts_->limit();
    throw_oom(
        stream, bytes,
        acc.limit_hits.load(std::memory_order_relaxed) != hits ||
                (lim != SIZE_MAX && acc.reserved.load(std::memory_order_relaxed) + bytes > lim)
            ? "limit: reserved bytes would exceed the allocator's limit"
            : "upstream exhausted: the resource could not supply a new block even after "
              "cached blocks were released");
  }
  return b;
}

void allocator::throw_oom(stream_view stream, std::size_t bytes, const char* cause) {
  counters_->oom_count.fetch_add(1, std::memory_order_relaxed);
  if (hooks::active()) {
    emit(hooks::event_kind::oom, hooks::event_phase::instant, stream, nullptr, bytes, 0);
  }
  oom_context ctx;
  ctx.requested = bytes;
  ctx.reserved = accounts_->counters_->reserved.load(std::memory_order_relaxed);
  ctx.in_use = counters_->exact().in_use;
  allocator_stats cache;
  do_cache_stats(cache);
  ctx.largest_free_block = cache.largest_free_block;
  ctx.cached_other_streams = do_cached_bytes_other_streams(stream);
  ctx.limit = accounts_->limit();
  ctx.device = device_;
  throw out_of_memory(name_, ctx, cause);
}

// ---- deallocate -----------------------------------------------------------------------------

// The strategy's free, its report and the counters: every free of a block, hooked or not.
// Inlined into deallocate and deallocate_checked.
[[gnu::always_inline]] inline void allocator::take_back(stream_view stream, void* ptr,
                                                        std::size_t bytes, std::size_t alignment,
                                                        bool hooked) noexcept {
  const free_outcome out = do_deallocate(stream, ptr, bytes, alignment);
  if (out.error != hooks::free_error::none) [[unlikely]] {
    report_invalid_free(stream, ptr, bytes, out);
    if (out.rounded == 0) {
      return;  // ignored: nothing was freed
    }
  }
  counters_->on_free(out.rounded, out.requested);
  if (hooked || hooks::active()) [[unlikely]] {
    emit(hooks::event_kind::pool_free, hooks::event_phase::post, stream, ptr, out.requested,
         out.rounded);
  }
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
  counters_->invalid_frees.fetch_add(1, std::memory_order_relaxed);
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

// ---- stats and release ----------------------------------------------------------------------

allocator_stats allocator::stats() const {
  const detail::allocator_counters& c = *counters_;
  allocator_stats s;
  const detail::allocator_counters::totals t = c.exact();
  s.allocations = t.allocations;
  s.deallocations = t.deallocations;
  s.reserved = c.reserved.load(std::memory_order_relaxed);
  s.peak_reserved = c.peak_reserved.load(std::memory_order_relaxed);
  // Every byte in use lies in reserved memory, so the peaks are capped by the reserved peak
  // (what other threads' credits add to a bound stays under it). The totals are then capped by
  // the peaks: under concurrent use the counters summed are from nearby instants, and a sum that
  // passes a peak counted a block twice across them.
  s.peak_in_use = std::min(c.peak_in_use.load(std::memory_order_relaxed), s.peak_reserved);
  s.peak_requested = std::min(c.peak_requested.load(std::memory_order_relaxed), s.peak_in_use);
  s.in_use = std::min(t.in_use, s.peak_in_use);
  s.requested_in_use = std::min(t.requested, s.peak_requested);
  s.upstream_allocs = c.upstream_allocs.load(std::memory_order_relaxed);
  s.upstream_frees = c.upstream_frees.load(std::memory_order_relaxed);
  s.upstream_failures = c.upstream_failures.load(std::memory_order_relaxed);
  s.oom_count = c.oom_count.load(std::memory_order_relaxed);
  s.limit_hits = c.limit_hits.load(std::memory_order_relaxed);
  s.invalid_frees = c.invalid_frees.load(std::memory_order_relaxed);
  s.limit = limit();
  do_cache_stats(s);
  s.fragmentation = s.cached_bytes == 0 ? 0.0
                                        : 1.0 - static_cast<double>(s.largest_free_block) /
                                                    static_cast<double>(s.cached_bytes);
  return s;
}

std::size_t allocator::reserved_bytes() const noexcept {
  return counters_->reserved.load(std::memory_order_relaxed);
}

std::size_t allocator::release_cached() {
  const bool hooked = hooks::active();
  if (hooked) [[unlikely]] {
    emit(hooks::event_kind::release, hooks::event_phase::pre, stream_view{}, nullptr, 0, 0);
  }
  const std::size_t released = do_release_cached();
  if (hooked || hooks::active()) [[unlikely]] {
    emit(hooks::event_kind::release, hooks::event_phase::post, stream_view{}, nullptr, released,
         released);
  }
  return released;
}

// ---- upstream -------------------------------------------------------------------------------

void* allocator::upstream_allocate(stream_view stream, std::size_t bytes) {
  detail::allocator_counters& c = *accounts_->counters_;
  const std::size_t lim = accounts_->limit();
  if (lim != SIZE_MAX && c.reserved.load(std::memory_order_relaxed) + bytes > lim) {
    c.limit_hits.fetch_add(1, std::memory_order_relaxed);
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
    c.upstream_failures.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  const std::size_t res = c.reserved.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  detail::raise_peak(c.peak_reserved, res);
  c.upstream_allocs.fetch_add(1, std::memory_order_relaxed);
  if (hooked || hooks::active()) [[unlikely]] {
    emit(hooks::event_kind::device_alloc, hooks::event_phase::post, stream, p, bytes, bytes);
  }
  return p;
}

void allocator::upstream_deallocate(stream_view stream, void* ptr, std::size_t bytes) noexcept {
  detail::allocator_counters& c = *accounts_->counters_;
  const bool hooked = hooks::active();
  if (hooked) [[unlikely]] {
    emit(hooks::event_kind::device_free, hooks::event_phase::pre, stream, ptr, bytes, bytes);
  }
  // Lowered first: once the resource has the memory back, another thread's upstream_allocate
  // may get it and count it, and the reserved peak must not count it twice.
  c.reserved.fetch_sub(bytes, std::memory_order_relaxed);
  upstream_->deallocate(stream, ptr, bytes);
  c.upstream_frees.fetch_add(1, std::memory_order_relaxed);
  if (hooked || hooks::active()) [[unlikely]] {
    emit(hooks::event_kind::device_free, hooks::event_phase::post, stream, nullptr, bytes, bytes);
  }
}

// ---- events ---------------------------------------------------------------------------------

// Whether an adopted allocator raises events of `kind` (under its adopter's identity): the
// changes to its structure, and the upstream calls when they are real ones. Its requests are
// its adopter's to report.
bool allocator::reports_itself(hooks::event_kind kind) const noexcept {
  switch (kind) {
    case hooks::event_kind::split:
    case hooks::event_kind::merge:
      return true;
    case hooks::event_kind::device_alloc:
    case hooks::event_kind::device_free:
    case hooks::event_kind::limit_hit:
      return accounts_ != this;
    default:
      return false;
  }
}

void allocator::emit(hooks::event_kind kind, hooks::event_phase phase, stream_view stream,
                     void* ptr, std::size_t requested, std::size_t rounded, hooks::free_error error,
                     void* aux_ptr, std::size_t aux_bytes) const noexcept {
  if (!hooks::wants(kind, phase)) {
    return;  // no installed hook asks for it: not built
  }
  const allocator* who = this;
  if (reporter_ != nullptr) {
    if (!reports_itself(kind)) {
      return;
    }
    who = reporter_;
  }
  detail::allocator_counters& c = *who->counters_;
  hooks::event e;
  e.kind = kind;
  e.phase = phase;
  e.error = error;
  e.device = who->device_;
  e.stream = stream.value();
  e.allocator_id = who->id_;
  e.allocator_name = who->name_.c_str();
  e.ptr = ptr;
  e.requested = requested;
  e.rounded = rounded;
  e.aux_ptr = aux_ptr;
  e.aux_bytes = aux_bytes;
  // Never above the peak: a timeline's memory track peaks where the pool's does.
  e.in_use = std::min(c.in_use_bound(), c.peak_in_use.load(std::memory_order_relaxed));
  e.reserved = who->accounts_->counters_->reserved.load(std::memory_order_relaxed);
  hooks::dispatch(e);
}

void allocator::emit_split(stream_view stream, void* taken, std::size_t taken_bytes, void* rest,
                           std::size_t rest_bytes) const noexcept {
  emit(hooks::event_kind::split, hooks::event_phase::instant, stream, taken, 0, taken_bytes,
       hooks::free_error::none, rest, rest_bytes);
}

void allocator::emit_merge(stream_view stream, void* result, std::size_t result_bytes,
                           void* absorbed, std::size_t absorbed_bytes) const noexcept {
  emit(hooks::event_kind::merge, hooks::event_phase::instant, stream, result, 0, result_bytes,
       hooks::free_error::none, absorbed, absorbed_bytes);
}

}  // namespace poolscope::pool
