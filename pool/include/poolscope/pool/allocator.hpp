// The allocator interface every poolscope strategy and adaptor implements.
//
//   poolscope::pool::host_resource host;
//   poolscope::pool::bfc_allocator pool{host};
//   void* p = pool.allocate(stream, 1000);        // >= 1000 bytes, 256-byte aligned
//   pool.deallocate(stream, p, 1000);
//   auto s = pool.stats();                        // a snapshot by value
//
// Contract (docs/design.md §2):
// - allocate(stream, bytes, alignment = 256): alignment must be a power of two <= 256
//   (invalid_argument otherwise). bytes == 0 returns nullptr and does nothing else (no event, no
//   count); deallocating nullptr with 0 bytes is a no-op. Requests past max_request_bytes throw
//   out_of_memory (cause "size overflow") without touching upstream. When upstream is
//   exhausted the allocator releases its cached memory, retries once, then throws
//   out_of_memory naming the request, reserved, in use, largest free block, bytes cached on
//   other streams and the limit. Every block is aligned to max_alignment.
// - deallocate(stream, ptr, bytes, alignment) is noexcept. An unknown pointer or a double free
//   is ignored; a wrong size is corrected (the block is freed with its true size). Each is
//   reported as an invalid_free hook event and a log warning, and counted in stats; the pool
//   stays consistent and usable.
// - set_limit(bytes): later requests that would take in-use bytes or reserved bytes past the
//   limit fail with out_of_memory (cause "limit"); existing allocations are never touched.
// - release_cached(): returns every wholly free upstream block to the resource.
// - Host out of memory for the pool's own bookkeeping: allocate throws std::bad_alloc and
//   changes nothing; deallocate still frees the block. Either way reserved == in use + cached
//   holds (tests/pool/out_of_host_memory_test.cpp).
// Counters (detail/allocator_counters.hpp): in_use, requested_in_use and the counts in stats()
// are exact. The peaks never miss a high and never pass peak_reserved; they are exact while one
// thread uses the allocator, and with several may count more, by at most the larger of 4 MiB
// and 1/64 of the total per other thread (bytes another thread freed and has not yet taken off
// the shared total). Hook events carry the same upper bound as in_use.
// Hooks: pool_malloc pre/post, pool_free pre/post, device_alloc/device_free pre/post, release
// pre/post, oom, limit_hit, invalid_free, and split/merge where the strategy has them. The same
// code runs with or without hooks installed: a hook adds events, nothing else.
// Thread safety: every allocator is thread-safe; each class says how.
// Ownership: the allocator holds its resource by reference (it must outlive the allocator) and
// returns all reserved memory to it on destruction.
//
// Writing a strategy. The public methods validate the arguments, check the limit, count, retry
// on upstream exhaustion and emit the hooks, once for every allocator; a strategy implements
// only its structure, in the private virtuals below: take a block (do_allocate), give one back
// (do_deallocate), release what it caches (do_release_cached), report its cache
// (do_cache_stats). It gets upstream memory only through upstream_allocate and
// upstream_deallocate, which count reserved bytes, enforce the limit on them and emit
// device_alloc / device_free.
// Locking policy: a strategy locks its own structure; the base class takes no lock. Its counters
// live in per-thread shards (above), so a strategy's critical section holds only its structure
// and threads that share an allocator write no common counter line: one lock in the base would
// serialise stream_pool's per-stream pools and a thread cache's hits, which take no shared lock.
// Composition. An adaptor (thread_cache_adaptor) or a composite (stream_pool_allocator) is an
// allocator built on inner allocators, which it owns and drives through strategy_*: their
// do_* directly, so that validation, counting, the limit, the retry and the request events
// happen once per user request, in the outer allocator. It adopts them (adopt): their split,
// merge and upstream events carry its identity.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "poolscope/hooks/event.hpp"
#include "poolscope/pool/allocator_stats.hpp"
#include "poolscope/pool/resource.hpp"
#include "poolscope/stream_view.hpp"

namespace poolscope::pool {

/// Largest supported alignment; blocks are always at least this aligned.
inline constexpr std::size_t max_alignment = 256;
/// Largest request any allocator accepts (1 PiB); larger requests throw out_of_memory.
inline constexpr std::size_t max_request_bytes = std::size_t{1} << 50;

namespace detail {
class allocator_counters;
}  // namespace detail

/// What a strategy hands back: the block and the bytes it took for it.
struct block {
  void* ptr = nullptr;
  std::size_t rounded = 0;
};

/// What a strategy says of a deallocation. Two words, so that it comes back in registers.
struct free_outcome {
  hooks::free_error error : 8 = hooks::free_error::none;
  std::size_t rounded : 56 = 0;  ///< bytes taken back (0 if the free was ignored)
  std::size_t requested = 0;     ///< bytes the block was allocated with (0 if unknown)
};

/// Abstract allocator. Public non-virtual methods validate, count, enforce the limit, retry on
/// upstream exhaustion and emit hooks; strategies implement the private do_* virtuals.
class allocator {
 public:
  allocator(resource& upstream, std::string name);
  allocator(const allocator&) = delete;
  allocator& operator=(const allocator&) = delete;
  virtual ~allocator();

  /// At least `bytes` bytes aligned to `alignment`, usable on `stream`. See the contract above.
  [[nodiscard]] void* allocate(stream_view stream, std::size_t bytes,
                               std::size_t alignment = max_alignment);
  /// Returns a block from allocate (same stream, bytes, alignment). Never throws.
  void deallocate(stream_view stream, void* ptr, std::size_t bytes,
                  std::size_t alignment = max_alignment) noexcept;

  /// A snapshot of the counters and the cache.
  [[nodiscard]] allocator_stats stats() const;
  /// Returns cached memory to the resource; returns the bytes released.
  std::size_t release_cached();
  /// Caps in-use and reserved bytes (SIZE_MAX: no limit). Existing allocations are kept.
  void set_limit(std::size_t bytes) noexcept { limit_.store(bytes, std::memory_order_relaxed); }
  [[nodiscard]] std::size_t limit() const noexcept {
    return limit_.load(std::memory_order_relaxed);
  }

  /// "bfc/host", "best_fit/cuda:0", ...: strategy and resource.
  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  /// Process-unique id, as in hook events.
  [[nodiscard]] std::uint32_t id() const noexcept { return id_; }
  /// Device of the resource (-1: host).
  [[nodiscard]] int device() const noexcept { return device_; }
  [[nodiscard]] resource& upstream() const noexcept { return *upstream_; }
  /// How requests are rounded (a power of two): a block serves `bytes` at the size `bytes`
  /// rounded up to this, and a free names it by any size with the same rounding.
  [[nodiscard]] std::size_t size_granularity() const noexcept { return granularity_; }

 protected:
  /// Strategies get upstream memory only through these: they count, enforce the limit on
  /// reserved bytes and emit device_alloc/device_free. upstream_allocate returns nullptr when
  /// the resource is exhausted or the limit would be passed (never throws out_of_memory).
  [[nodiscard]] void* upstream_allocate(stream_view stream, std::size_t bytes);
  void upstream_deallocate(stream_view stream, void* ptr, std::size_t bytes) noexcept;
  /// Bytes reserved from upstream now (stats().reserved, alone).
  [[nodiscard]] std::size_t reserved_bytes() const noexcept;
  /// A strategy whose blocks are requests rounded up to a multiple of `granularity` (a power of
  /// two) says so in its constructor (size_granularity). Default 1 (exact).
  void set_size_granularity(std::size_t granularity) noexcept { granularity_ = granularity; }
  /// Split/merge events for strategies that carve chunks.
  void emit_split(stream_view stream, void* taken, std::size_t taken_bytes, void* rest,
                  std::size_t rest_bytes) const noexcept;
  void emit_merge(stream_view stream, void* result, std::size_t result_bytes, void* absorbed,
                  std::size_t absorbed_bytes) const noexcept;

  /// Where an adopted allocator's upstream is (adopt).
  enum class adopted_upstream {
    /// The adopter's own blocks (stream_pool's per-stream pools): moving them is no event, and
    /// the inner allocator's reserved bytes are its own business.
    internal,
    /// The real resource (an adaptor's inner allocator): its calls are the adopter's
    /// device_alloc / device_free and limit_hit events, counted in the adopter's stats and
    /// limited by the adopter's limit.
    shared,
  };
  /// Makes `inner` a part of this allocator: it emits split and merge events (and, with a
  /// shared upstream, its upstream events) under this allocator's identity, and no other event.
  /// Call before `inner` is used; afterwards drive it only through strategy_*.
  void adopt(allocator& inner, adopted_upstream upstream) noexcept;

  /// For an allocator built on inner ones: runs `inner`'s do_* directly, with no validation,
  /// counting, limit, retry or request event of `inner`'s own (the caller's do_* is inside its
  /// own public call, which does all of that once).
  [[nodiscard]] static block strategy_allocate(allocator& inner, stream_view stream,
                                               std::size_t bytes, std::size_t alignment) {
    return inner.do_allocate(stream, bytes, alignment);
  }
  static free_outcome strategy_deallocate(allocator& inner, stream_view stream, void* ptr,
                                          std::size_t bytes, std::size_t alignment) noexcept {
    return inner.do_deallocate(stream, ptr, bytes, alignment);
  }
  static void strategy_cache_stats(const allocator& inner, allocator_stats& s) {
    inner.do_cache_stats(s);
  }
  static std::size_t strategy_release_cached(allocator& inner) { return inner.do_release_cached(); }
  [[nodiscard]] static std::size_t strategy_cached_bytes_other_streams(const allocator& inner,
                                                                       stream_view stream) {
    return inner.do_cached_bytes_other_streams(stream);
  }

 private:
  /// Take a block of at least `bytes` (> 0, validated) aligned to `alignment` from the
  /// structure, growing it through upstream_allocate if need be; {nullptr, 0} when upstream
  /// refused (the caller releases the cache and asks once more). May throw std::bad_alloc
  /// (no host memory for bookkeeping), changing nothing.
  virtual block do_allocate(stream_view stream, std::size_t bytes, std::size_t alignment) = 0;
  /// Give `ptr` (not null) back to the structure: validate it and say what happened.
  virtual free_outcome do_deallocate(stream_view stream, void* ptr, std::size_t bytes,
                                     std::size_t alignment) noexcept = 0;
  /// Return wholly free upstream blocks; return the bytes released.
  virtual std::size_t do_release_cached() = 0;
  /// Fill the cache fields of `s` (cached_blocks, cached_bytes, largest_free_block).
  virtual void do_cache_stats(allocator_stats& s) const = 0;
  /// Bytes cached for streams other than `stream` (strategies whose cache is split by stream).
  [[nodiscard]] virtual std::size_t do_cached_bytes_other_streams(stream_view /*stream*/) const {
    return 0;
  }

  // The usual request and free inline in allocate / deallocate; the rest out of line.
  block serve(stream_view stream, std::size_t bytes, std::size_t alignment);
  void take_back(stream_view stream, void* ptr, std::size_t bytes, std::size_t alignment,
                 bool hooked) noexcept;
  [[gnu::noinline]] void* allocate_checked(stream_view stream, std::size_t bytes,
                                           std::size_t alignment);
  [[gnu::noinline]] void deallocate_checked(stream_view stream, void* ptr, std::size_t bytes,
                                            std::size_t alignment) noexcept;
  [[gnu::noinline]] block allocate_after_refusal(stream_view stream, std::size_t bytes,
                                                 std::size_t alignment);
  void check_limit(stream_view stream, std::size_t bytes, std::size_t limit);
  [[noreturn]] void throw_oom(stream_view stream, std::size_t bytes, const char* cause);
  [[gnu::cold]] void report_invalid_free(stream_view stream, void* ptr, std::size_t bytes,
                                         free_outcome outcome) noexcept;
  void emit(hooks::event_kind kind, hooks::event_phase phase, stream_view stream, void* ptr,
            std::size_t requested, std::size_t rounded,
            hooks::free_error error = hooks::free_error::none, void* aux_ptr = nullptr,
            std::size_t aux_bytes = 0) const noexcept;
  [[nodiscard]] bool reports_itself(hooks::event_kind kind) const noexcept;

  resource* upstream_;
  std::string name_;
  std::uint32_t id_;
  int device_;
  std::size_t granularity_ = 1;
  std::atomic<std::size_t> limit_{SIZE_MAX};
  const allocator* reporter_ = nullptr;  // adopt(): the allocator whose identity events carry
  allocator* accounts_ = this;           // adopt(): whose upstream counters and limit apply
  std::unique_ptr<detail::allocator_counters> counters_;
};

}  // namespace poolscope::pool
