// The allocator interface every poolscope strategy implements.
//
//   poolscope::pool::host_resource host;
//   poolscope::pool::bfc_allocator pool{host};
//   void* p = pool.allocate(stream, 1000);        // >= 1000 bytes, 256-byte aligned
//   pool.deallocate(stream, p, 1000);
//   auto s = pool.stats();                        // a snapshot by value
//
// Contract (DESIGN.md §2):
// - allocate(stream, bytes, alignment = 256): alignment must be a power of two <= 256
//   (invalid_argument otherwise). bytes == 0 returns nullptr and does nothing else (no event, no
//   count); deallocating nullptr with 0 bytes is a no-op. Requests past max_request_bytes throw
//   out_of_memory (cause "size overflow") without touching upstream. When upstream is
//   exhausted the allocator releases its cached memory, retries once, then throws
//   out_of_memory naming the request, reserved, in use, largest free block, bytes cached on
//   other streams and the limit.
// - deallocate(stream, ptr, bytes, alignment) is noexcept. An unknown pointer or a double free
//   is ignored; a wrong size is corrected (the block is freed with its true size). Each is
//   reported as an invalid_free hook event and a log warning, and counted in stats; the pool
//   stays consistent and usable.
// - set_limit(bytes): later requests that would take in-use bytes or reserved bytes past the
//   limit fail with out_of_memory (cause "limit"); existing allocations are never touched.
// - release_cached(): returns every wholly free upstream block to the resource.
// - Host out of memory for the pool's own bookkeeping: allocate throws std::bad_alloc and
//   changes nothing (a block taken upstream for it goes back); deallocate still frees the block
//   (a stream pool that cannot queue a cross-stream free waits for the freeing stream instead).
//   Either way reserved == in use + cached still holds (tests/pool/out_of_host_memory_test.cpp).
// Thread cache (thread_cache_options; docs/thread_cache.md): strategies that support it (bfc,
// best_fit) keep each thread's recently freed blocks, per (stream, rounded size), in a small
// bounded cache of that thread's, so a cached allocate/deallocate pair takes no shared lock and
// no shared table lookup. Blocks in a thread cache count as cached (stats().cached_*), not in
// use. set_limit, release_cached and the out-of-memory retry first return the blocks of every
// thread's cache to the strategy; so does a thread's exit (for its own cache).
// Accounting with thread caches: in_use, requested_in_use and the counts in stats() are exact
// (each thread's cache keeps a shard of them, summed by stats()). peak_in_use and
// peak_requested never miss a high and are exact when one thread uses the allocator; with
// several, a request counts what *other* threads hold through their caches: cached blocks as in
// use and, in peak_requested, live blocks at their rounded size (so a peak can pass the true one
// by that much; it stays <= peak_reserved). The in_use carried by hook events is counted the
// same way. The limit is checked against the exact total.
// Hooks: pool_malloc pre/post, pool_free pre/post, device_alloc/device_free pre/post, release
// pre/post, oom, limit_hit, invalid_free, and split/merge where the strategy has them.
// Thread safety: every allocator is thread-safe; each class says how.
// Ownership: the allocator holds its resource by reference (it must outlive the allocator) and
// returns all reserved memory to it on destruction.
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
struct thread_cache;
struct tc_entry;
struct thread_cache_registry;
struct thread_cache_access;
}  // namespace detail

/// The per-thread cache of an allocator (docs/thread_cache.md). Each thread that allocates
/// gets a cache of its own for each allocator that has one; it holds blocks that thread freed,
/// by (stream, rounded size), and hands them out again to that thread on the same stream. The
/// bounds are per thread and per allocator: blocks larger than max_block_bytes are never
/// cached; past max_bytes or max_blocks the least recently used sizes go back to the strategy.
struct thread_cache_options {
  /// Off: every request goes to the strategy (under its lock), as it did before caches.
  bool enabled = true;
  /// Bytes one thread's cache may hold for one allocator.
  std::size_t max_bytes = std::size_t{16} << 20;
  /// Blocks one thread's cache may hold for one allocator: at most 256 (more is an
  /// invalid_argument naming the value, from the allocator's constructor).
  std::size_t max_blocks = 64;
  /// Larger blocks bypass the cache.
  std::size_t max_block_bytes = std::size_t{4} << 20;
  /// The owning thread takes its cache's lock without a locked instruction while no other
  /// thread has touched the cache lately (an asymmetric fence, membarrier(2), makes the others
  /// pay instead; docs/thread_cache.md). Off, or where the fence is missing: one exchange per
  /// cached operation.
  bool owner_bias = true;
};

/// Whether thread caches' locks can be biased towards their threads in this process
/// (thread_cache_options::owner_bias): membarrier(2)'s private expedited command is there, and
/// this is not a ThreadSanitizer build. Thread-safe.
[[nodiscard]] bool owner_bias_available() noexcept;

/// What the live threads' caches of an allocator have done (allocator::thread_cache_counts).
struct thread_cache_counters {
  /// Threads with a cache for this allocator.
  std::uint64_t caches = 0;
  /// Times another thread revoked the bias of a cache's lock (thread_cache_options::owner_bias;
  /// each costs one membarrier(2)). Growing steadily: threads free each other's blocks often,
  /// and their caches run on plain locks.
  std::uint64_t revocations = 0;
  /// Times a cache went to rest: its hits over a sample of requests were too few to pay for its
  /// misses (random sizes), so it was bypassed for a while (docs/thread_cache.md).
  std::uint64_t rests = 0;
  /// Caches resting now.
  std::uint64_t resting = 0;
};

/// What a strategy hands back: the block and the bytes it took for it.
struct block {
  void* ptr = nullptr;
  std::size_t rounded = 0;
};

/// What a strategy says of a deallocation.
struct free_outcome {
  hooks::free_error error = hooks::free_error::none;
  std::size_t rounded = 0;    ///< bytes released to the cache (0 if the free was ignored)
  std::size_t requested = 0;  ///< bytes the block was allocated with (0 if unknown)
  /// The block is live and held by a thread cache (do_allocate_held): the strategy left it
  /// alone, the cache that recorded it frees it.
  bool held = false;
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
  /// Caps in-use and reserved bytes (SIZE_MAX: no limit). Existing allocations are kept; blocks
  /// in every thread's cache go back to the strategy (so release_cached can return them).
  void set_limit(std::size_t bytes) noexcept;
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

  /// True if this allocator keeps per-thread caches (thread_cache_options::enabled and a
  /// strategy that supports them).
  [[nodiscard]] bool thread_cache_enabled() const noexcept { return tc_ != nullptr; }
  /// Returns the blocks held in every thread's cache to the strategy (they stay reserved, now
  /// in the strategy's own cache); returns the bytes moved. Thread-safe; takes the lock of each
  /// thread's cache that holds blocks, in turn (another thread's revokes that lock's bias).
  /// release_cached, set_limit, the out-of-memory retry and bfc before it grows call it.
  std::size_t flush_thread_caches() noexcept;
  /// What the live threads' caches have done (a diagnostic; zeros without caches). Thread-safe.
  [[nodiscard]] thread_cache_counters thread_cache_counts() const;

 protected:
  /// Strategies get upstream memory only through these: they count, enforce the limit on
  /// reserved bytes and emit device_alloc/device_free. upstream_allocate returns nullptr when
  /// the resource is exhausted or the limit would be passed (never throws out_of_memory).
  [[nodiscard]] void* upstream_allocate(stream_view stream, std::size_t bytes);
  void upstream_deallocate(stream_view stream, void* ptr, std::size_t bytes) noexcept;
  /// Lowers the in-use counters (stats().in_use, requested_in_use) for a block being taken back.
  /// do_deallocate calls it exactly once for every block it takes back (the outcome's `rounded`
  /// and `requested`), before the block can be handed out again: while it still holds the lock
  /// that guards the block, or before giving the block to a resource. Accounted any later,
  /// another thread could take the block and count its bytes while they are still counted here,
  /// and peaks would count them twice. Does nothing on an adopted inner strategy (the composite
  /// accounts for its blocks itself). Two relaxed atomic subtractions; when the strategy counts
  /// under its lock (count_under_lock), plain loads and stores, and the free is counted here.
  void account_free(std::size_t rounded, std::size_t requested) noexcept {
    if (counts_under_lock_) {
      account_free_locked(rounded, requested);
    } else {
      account_free_shared(rounded, requested);
    }
  }
  /// account_free where the caller knows counts_under_lock() holds.
  void account_free_locked(std::size_t rounded, std::size_t requested) noexcept {
    plain_add(locked_.in_use, 0 - rounded);  // wraps: a subtraction
    plain_add(locked_.requested, 0 - requested);
    plain_add(locked_.deallocations, std::uint64_t{1});
  }
  /// account_free on the shared atomics only: for a path that holds no strategy lock (a thread
  /// cache's remote free), whose writes must not touch the counters under that lock.
  void account_free_shared(std::size_t rounded, std::size_t requested) noexcept {
    if (reporter_ == nullptr) {
      in_use_.fetch_sub(rounded, std::memory_order_relaxed);
      requested_in_use_.fetch_sub(requested, std::memory_order_relaxed);
    }
  }
  /// For a strategy whose do_allocate and do_deallocate each run wholly under one lock of its
  /// own: call at the end of its constructor to count the blocks it hands out and takes back
  /// under that lock, in counters only it writes (locked_), with plain loads and stores instead
  /// of atomic read-modify-writes (six per alloc+free pair, about a tenth of a bfc pair on
  /// random sizes). Not on a composite's inner strategy (adopt() turns it off). The strategy
  /// then calls account_alloc_locked for every block it hands out that a thread cache does not
  /// record (do_allocate, not do_allocate_held), and account_free as before; the thread caches
  /// keep counting their blocks in the shared atomics. Every reader adds the two (modulo 2^64:
  /// a block counted in one and taken back through the other leaves the sum exact).
  void count_under_lock() noexcept { counts_under_lock_ = reporter_ == nullptr; }
  [[nodiscard]] bool counts_under_lock() const noexcept { return counts_under_lock_; }
  /// Counts a block handed out (`rounded` bytes for `requested`), under the strategy's lock;
  /// only when counts_under_lock(). `blocks` is 1, or 0 with sizes 0 for a block a thread cache
  /// records (so that a strategy needs no branch on that). Without thread caches it raises the
  /// peaks too (nobody else writes them then); with them allocate() raises them.
  void account_alloc_locked(std::size_t rounded, std::size_t requested,
                            std::uint64_t blocks) noexcept {
    const std::size_t locked_used = plain_add(locked_.in_use, rounded);
    const std::size_t locked_req = plain_add(locked_.requested, requested);
    plain_add(locked_.allocations, blocks);
    if (tc_ == nullptr) {
      // shared_in_use() and shared_requested(), with the locked counters as just written.
      const std::size_t used = in_use_.load(std::memory_order_relaxed) + locked_used;
      const std::size_t req = requested_in_use_.load(std::memory_order_relaxed) + locked_req;
      if (used > peak_in_use_.load(std::memory_order_relaxed)) {
        peak_in_use_.store(used, std::memory_order_relaxed);
      }
      if (req > peak_requested_.load(std::memory_order_relaxed)) {
        peak_requested_.store(req, std::memory_order_relaxed);
      }
    }
  }
  /// As account_alloc_locked for a block that do_serve hands out (never one a thread cache
  /// records), which raises the peaks too, here under the lock, from the counters just written
  /// and `cache`'s shard (do_serve's cache: this thread's, or null without one), as allocate()
  /// would after it: finish_served then only reports the block. Only when counts_under_lock().
  /// Inline (detail/allocator_inline.hpp).
  void account_served_locked(std::size_t rounded, std::size_t requested,
                             const detail::thread_cache* cache) noexcept;
  /// Split/merge events for strategies that carve chunks.
  void emit_split(stream_view stream, void* taken, std::size_t taken_bytes, void* rest,
                  std::size_t rest_bytes) const noexcept;
  void emit_merge(stream_view stream, void* result, std::size_t result_bytes, void* absorbed,
                  std::size_t absorbed_bytes) const noexcept;
  /// The end of do_serve, for a strategy that overrides it: `b` is what its allocation gave
  /// (do_allocate's block; {nullptr, 0} if upstream refused it, which retries once after
  /// release_cached). Counts the block, raises the peaks, emits the pool_malloc post event if a
  /// hook is installed by now, and returns the block. Inline (detail/allocator_inline.hpp).
  void* finish_serve(stream_view stream, std::size_t bytes, std::size_t alignment,
                     detail::thread_cache* cache, block b);
  /// finish_serve for a block (not null) counted with account_served_locked: emits the
  /// pool_malloc post event if a hook is installed by now, and returns the block. Inline
  /// (detail/allocator_inline.hpp).
  void* finish_served(stream_view stream, std::size_t bytes, block b);
  /// The end of do_take_back, for a strategy that overrides it: `out` is what its do_deallocate
  /// said of the free. Takes a block held by a thread cache back through the registry, reports an
  /// invalid free, counts the free (unless the strategy did, count_under_lock) and emits the
  /// pool_free post event (if `hooked` or a hook is installed by now). Inline
  /// (detail/allocator_inline.hpp).
  void finish_take_back(stream_view stream, void* ptr, std::size_t bytes, const free_outcome& out,
                        bool hooked) noexcept;
  /// finish_take_back where the caller knows counts_under_lock() holds (its do_deallocate
  /// counted the free with account_free_locked). Inline (detail/allocator_inline.hpp).
  void finish_counted_take_back(stream_view stream, void* ptr, std::size_t bytes,
                                const free_outcome& out, bool hooked) noexcept;
  /// Strategies whose cache is split by stream report the bytes cached for other streams.
  [[nodiscard]] virtual std::size_t do_cached_bytes_other_streams(stream_view) const { return 0; }

  /// Composite allocators (stream_pool_allocator) build their pools out of inner strategies and
  /// report for them. After adopt(inner), `inner` emits its split and merge events under this
  /// allocator's identity and no other hook event (its requests and its upstream, an internal
  /// one, are this allocator's to report). Call before `inner` is used.
  void adopt(allocator& inner) const noexcept {
    inner.reporter_ = this;
    inner.counts_under_lock_ = false;
  }
  /// Run `inner`'s strategy directly, as this allocator's own do_* would: no validation,
  /// counters, limit, retry or pool_malloc/pool_free events of `inner`'s own.
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

  /// A strategy that implements do_reclaim (and do_size_matches if its sizes are rounded) calls
  /// this in its constructor to put a thread cache in front of it, unless options.enabled is
  /// false. `granularity` (a power of two) is how the strategy rounds a request: the rounded
  /// size its do_allocate reports for `bytes` must be bytes rounded up to it.
  void enable_thread_cache(const thread_cache_options& options, std::size_t granularity);
  /// A strategy whose blocks are its requests rounded up to a multiple of `granularity` (a
  /// power of two) says so in its constructor: the limit then counts a request at the size it
  /// will take, so that a block cannot carry in-use bytes past the limit. Default 1 (exact).
  void set_size_granularity(std::size_t granularity) noexcept { granularity_ = granularity; }
  /// Such a strategy calls this first in its destructor, while do_reclaim still works: it
  /// detaches every thread's cache (a thread exiting later finds its cache dead and only frees
  /// it). Blocks in the caches are the strategy's: it frees them with everything else.
  void disable_thread_cache() noexcept;

 private:
  friend struct detail::thread_cache_access;

  /// Serve `bytes` (> 0, already validated) at `alignment`; {nullptr, 0} if upstream failed.
  virtual block do_allocate(stream_view stream, std::size_t bytes, std::size_t alignment) = 0;
  /// Take back `ptr`; validate it and say what happened. Must not throw. Calls account_free for
  /// the block it takes back before the block can be reused (see there).
  virtual free_outcome do_deallocate(stream_view stream, void* ptr, std::size_t bytes,
                                     std::size_t alignment) noexcept = 0;
  /// Fill the cache fields of `s` (cached_blocks, cached_bytes, largest_free_block).
  virtual void do_cache_stats(allocator_stats& s) const = 0;
  /// Return wholly free upstream blocks; return the bytes released.
  virtual std::size_t do_release_cached() = 0;
  /// The usual request, past allocate's checks (valid arguments, no limit, no hook installed when
  /// it began), that no thread cache serves or records (`cache`: this thread's cache, resting,
  /// or null): the block, counted and reported. Default: finish_serve(do_allocate(...)). A
  /// strategy may override it to run its allocation and finish_serve in one function of its own
  /// (bfc: one call, and one frame of saved registers, less per request).
  virtual void* do_serve(stream_view stream, std::size_t bytes, std::size_t alignment,
                         detail::thread_cache* cache);
  /// A free of `ptr` (not null, past its pre event if `hooked`) that no thread cache took.
  /// Default: finish_take_back(do_deallocate(...)); a strategy may override it as do_serve.
  virtual void do_take_back(stream_view stream, void* ptr, std::size_t bytes, std::size_t alignment,
                            bool hooked) noexcept;
  /// Thread-cache support: as do_allocate, for a block a thread cache will record. The strategy
  /// marks it held: until do_reclaim or do_unhold, a do_deallocate of it changes nothing and
  /// answers `held` (the cache that recorded it frees it; a free from another thread finds it
  /// there). Strategies that call enable_thread_cache override it; never called otherwise.
  virtual block do_allocate_held(stream_view stream, std::size_t bytes, std::size_t alignment) {
    return do_allocate(stream, bytes, alignment);
  }
  /// Thread-cache support: take back a block do_allocate_held handed out that a thread cache
  /// held (it was validated and accounted when the user freed it) into the strategy's own pool,
  /// as do_deallocate would, without validating or accounting it again. Never called unless the
  /// strategy called enable_thread_cache.
  virtual void do_reclaim(stream_view /*stream*/, void* /*ptr*/) noexcept {}
  /// Thread-cache support: the held live block `ptr` becomes the strategy's alone (no cache
  /// could keep its record): a later do_deallocate frees it.
  virtual void do_unhold(void* /*ptr*/) noexcept {}
  /// Thread-cache support: whether a free of `given` bytes names a block allocated with
  /// `requested` bytes and rounded to `rounded` (what do_deallocate accepts without reporting a
  /// size mismatch). Default: exactly the requested size.
  [[nodiscard]] virtual bool do_size_matches(std::size_t given, std::size_t requested,
                                             std::size_t /*rounded*/) const noexcept {
    return given == requested;
  }

  void emit(hooks::event_kind kind, hooks::event_phase phase, stream_view stream, void* ptr,
            std::size_t requested, std::size_t rounded,
            hooks::free_error error = hooks::free_error::none) const noexcept;
  // allocate and deallocate: the usual request inline, the rest (bad arguments, zero bytes,
  // nullptr, a hook, a limit) out of line; serve and take_back are the part both paths share
  // (serve_cached, serve_strategy and settle its parts).
  [[gnu::noinline]] void* allocate_checked(stream_view stream, std::size_t bytes,
                                           std::size_t alignment);
  [[gnu::noinline]] void* allocate_cached(stream_view stream, std::size_t bytes,
                                          std::size_t alignment, detail::thread_cache* cache);
  block serve(stream_view stream, std::size_t bytes, std::size_t alignment, std::size_t lim);
  // Whether a request asks this thread's cache first; `cache` is set to the thread's last-used
  // cache if it is this allocator's (else null). Inline (allocator.cpp).
  bool cache_first(detail::thread_cache*& cache) noexcept;
  block serve_cached(stream_view stream, std::size_t bytes, std::size_t alignment, std::size_t lim,
                     detail::thread_cache* cache);
  block serve_strategy(stream_view stream, std::size_t bytes, std::size_t alignment,
                       std::size_t lim, detail::thread_cache* cache, bool record);
  block settle(stream_view stream, std::size_t bytes, std::size_t alignment, std::size_t lim,
               detail::thread_cache* cache, block b);  // inline, detail/allocator_inline.hpp
  [[gnu::noinline]] void deallocate_checked(stream_view stream, void* ptr, std::size_t bytes,
                                            std::size_t alignment) noexcept;
  void take_back(stream_view stream, void* ptr, std::size_t bytes, std::size_t alignment,
                 bool hooked) noexcept;
  [[gnu::noinline]] void take_back_cached(stream_view stream, void* ptr, std::size_t bytes,
                                          std::size_t alignment, bool hooked) noexcept;
  void finish_free(stream_view stream, void* ptr, std::size_t bytes, const free_outcome& out,
                   bool counted, bool hooked) noexcept;  // inline, detail/allocator_inline.hpp
  void finish_take_back_of(stream_view stream, void* ptr, std::size_t bytes,
                           const free_outcome& out, bool counted,
                           bool hooked) noexcept;  // inline, detail/allocator_inline.hpp
  [[gnu::noinline]] block allocate_after_refusal(stream_view stream, std::size_t bytes,
                                                 std::size_t alignment, std::size_t lim, bool held);
  [[noreturn]] void throw_oom(stream_view stream, std::size_t bytes, const char* cause);
  // `outcome` by value: a caller's own outcome then stays in registers, its copy made only on
  // this rare path (by reference, bfc's free kept its outcome in memory throughout).
  [[gnu::cold]] void report_invalid_free(stream_view stream, void* ptr, std::size_t bytes,
                                         free_outcome outcome) noexcept;

  // Thread cache (thread_cache.cpp).
  [[nodiscard]] detail::thread_cache* tc_local();
  [[nodiscard]] block tc_take(stream_view stream, std::size_t bytes, detail::thread_cache*& c,
                              bool& record);
  void tc_record(detail::thread_cache* c, stream_view stream, const block& b,
                 std::size_t bytes) noexcept;
  /// Frees `ptr` through this thread's cache if it recorded the block: true, and `out` says what
  /// happened (a valid free is counted in the cache's shard); false if not this thread's.
  [[nodiscard]] bool tc_give(detail::thread_cache* c, stream_view stream, void* ptr,
                             std::size_t bytes, free_outcome& out) noexcept;
  [[nodiscard]] bool tc_give_remote(stream_view stream, void* ptr, std::size_t bytes,
                                    free_outcome& out) noexcept;
  void tc_raise_peaks(const detail::thread_cache& c) noexcept;  // inline, detail/thread_cache.hpp
  // Raises the peaks to `used` and `requested`, upper bounds of the totals (compared signed; see
  // tc_raise_peaks). Inline, detail/thread_cache.hpp.
  void raise_peaks(std::int64_t used, std::int64_t requested) noexcept;
  void tc_fold_locked(detail::thread_cache& c) noexcept;
  /// Sums of the thread caches' counter shards (under the registry mutex).
  struct shard_sums {
    std::int64_t in_use = 0, requested = 0;
    std::uint64_t allocations = 0, deallocations = 0;
  };
  [[nodiscard]] shard_sums tc_shard_sums() const;
  [[nodiscard]] std::int64_t tc_own_in_use_delta() const noexcept;
  /// In-use bytes now: the shared counter plus every thread's shard (takes the registry mutex).
  [[nodiscard]] std::size_t in_use_exact() const;
  /// In-use bytes as hook events carry them: the shared counter plus the calling thread's
  /// shard (exact unless other threads hold cached blocks, which it counts as in use).
  [[nodiscard]] std::size_t in_use_hint() const noexcept;
  /// Caches the freed block `ptr` (its table entry `entry`, already of stream `stream`) in a
  /// bin, evicting other sizes if the bounds need it, or says no. `target` is the bin of its
  /// size (thread_cache::find_bin; bin_count: none). Evictions move table entries: `entry` is
  /// the block's entry again on return.
  bool tc_cache_locked(detail::thread_cache& c, detail::tc_entry*& entry, void* ptr,
                       std::size_t rounded, void* stream, std::size_t target) noexcept;
  std::size_t tc_flush_locked(detail::thread_cache& c) noexcept;
  void tc_judge(detail::thread_cache& c) noexcept;
  void tc_evict_bin_locked(detail::thread_cache& c, std::size_t bin) noexcept;
  void tc_retire(detail::thread_cache& c) noexcept;
  void tc_cache_stats(allocator_stats& s) const;

  // Read by every operation, written almost never.
  resource* upstream_;
  std::string name_;
  std::uint32_t id_;
  int device_;
  std::atomic<std::size_t> limit_{SIZE_MAX};
  const allocator* reporter_ = nullptr;  // set by adopt(): the composite that reports for us
  bool counts_under_lock_ = false;       // count_under_lock(): the strategy counts, locked
  std::shared_ptr<detail::thread_cache_registry> tc_;  // null: no thread cache
  std::size_t granularity_ = 1;                        // set_size_granularity
  std::size_t tc_granularity_ = 1;
  std::size_t tc_max_block_ = 0;

  /// Adds `v` to a counter whose writers all hold one lock (count_under_lock): a load and a
  /// store, no read-modify-write. Returns the new value.
  template <class T>
  static T plain_add(std::atomic<T>& a, T v) noexcept {
    const T now = a.load(std::memory_order_relaxed) + v;
    a.store(now, std::memory_order_relaxed);
    return now;
  }

  /// The in-use and requested bytes the shared atomics and the strategy's locked counters
  /// count (without the thread caches' shards).
  [[nodiscard]] std::size_t shared_in_use() const noexcept {
    return in_use_.load(std::memory_order_relaxed) + locked_.in_use.load(std::memory_order_relaxed);
  }
  [[nodiscard]] std::size_t shared_requested() const noexcept {
    return requested_in_use_.load(std::memory_order_relaxed) +
           locked_.requested.load(std::memory_order_relaxed);
  }

  // Counters: relaxed atomics, so stats() never takes a strategy's lock. With thread caches the
  // in-use totals are these plus the caches' shards (docs/thread_cache.md, "Accounting"); these
  // and the peaks are written only when a block enters or leaves the caches and the strategy,
  // and read by every cached operation, so they have a cache line of their own.
  alignas(64) std::atomic<std::size_t> in_use_{0};
  std::atomic<std::size_t> requested_in_use_{0};
  std::atomic<std::size_t> peak_in_use_{0}, peak_requested_{0};
  // Counters of the paths that take a strategy's lock or call upstream anyway.
  alignas(64) std::atomic<std::size_t> reserved_{0};
  std::atomic<std::size_t> peak_reserved_{0};
  std::atomic<std::uint64_t> allocations_{0}, deallocations_{0};
  std::atomic<std::uint64_t> upstream_allocs_{0}, upstream_frees_{0}, upstream_failures_{0};
  std::atomic<std::uint64_t> oom_count_{0}, limit_hits_{0}, invalid_frees_{0};
  // What a strategy that counts under its lock (count_under_lock) counts, written only under
  // that lock, on a line of their own (the lock's holder writes them, cached hits never).
  struct locked_counters {
    std::atomic<std::size_t> in_use{0}, requested{0};
    std::atomic<std::uint64_t> allocations{0}, deallocations{0};
  };
  alignas(64) locked_counters locked_;
};

}  // namespace poolscope::pool
