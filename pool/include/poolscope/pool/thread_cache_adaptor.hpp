// thread_cache_adaptor: a small cache per thread in front of any allocator (docs/thread_cache.md).
// Each thread that allocates through the adaptor gets a cache of its own; it keeps blocks that
// thread freed, by (stream, rounded size), and hands them out again to that thread on the same
// stream without taking the inner allocator's lock. A thread's repeated sizes then cost a few
// plain loads and stores; a cache whose sizes rarely repeat steps aside by itself.
//
//   poolscope::pool::host_resource host;
//   poolscope::pool::thread_cache_adaptor pool{
//       std::make_unique<poolscope::pool::bfc_allocator>(host)};
//   void* p = pool.allocate(stream, 1000);    // the first of its size: bfc serves it
//   pool.deallocate(stream, p, 1000);
//   void* q = pool.allocate(stream, 1000);    // asked for again: bfc serves it and the cache
//   pool.deallocate(stream, q, 1000);         //   records it, so its free is cached here
//   void* r = pool.allocate(stream, 900);     // the same rounded size: q, from the cache
//
// What a cache holds: a table of the blocks the thread allocated and may cache (sizes it asked
// for twice lately or keeps a bin for; live or cached) and up to 16 bins of up to 16 blocks.
// Blocks larger than max_block_bytes are never cached; past max_bytes or max_blocks the least
// recently used sizes go back to the inner allocator. Any other block is the inner allocator's
// alone, as without the adaptor. Blocks in a cache are in use for the inner allocator and cached
// for the adaptor's stats(), so in_use + cached_bytes == reserved holds where it holds for the
// inner allocator.
//
// Frees from any thread: a free looks in the calling thread's cache first, then (only where a
// filter of that cache's addresses says it may be there) in the other threads' caches, so a
// block recorded by one thread may be freed by another, a double free of a cached block is
// reported, and a block freed by any thread leaves every record at once. A free that no cache
// recorded goes to the inner allocator, which validates it.
// Flushes: release_cached(), the out-of-memory retry (which calls it) and flush() return every
// thread's cached blocks to the inner allocator; a thread's exit returns its own (its live
// records stay, so frees of its blocks from other threads find them).
//
// The inner allocator: any allocator (a strategy, a stream pool). The adaptor owns it and drives
// its strategy (allocator::strategy_*), so a request is validated, limited, counted, retried
// and reported once, by the adaptor, whether a cache or the inner allocator serves it. The inner
// allocator becomes part of the adaptor (allocator::adopt): use it only through the adaptor.
// Ownership: owns the inner allocator (which holds the resource by reference) and destroys it
// after its caches: cached blocks go back to it first. Destroying the adaptor while other
// threads still use it is an error; threads that merely hold caches of a destroyed adaptor lose
// them at their exit.
// Hooks: the adaptor reports under the inner allocator's name and its own id: pool_malloc and
// pool_free once per user call (a hit or a miss alike), and the inner allocator's
// device_alloc/device_free, split/merge and limit_hit events. A profiler therefore counts each
// request once.
// Limit and stats: the adaptor's limit caps the bytes its users hold and, through the inner
// allocator's upstream calls, the bytes reserved. stats() counts the blocks its users hold as in
// use and the blocks in its caches as cached.
// Thread safety: thread-safe. A cache's lock is biased towards the thread that holds it
// (owner_bias): that thread takes it with plain stores and loads; another thread (a flush, a
// cross-thread free, stats) revokes the bias with one membarrier(2) and takes it with an
// exchange. Lock order: the adaptor's registry, a cache, then the inner allocator's locks.
// Stream semantics: a block is cached only when freed on the stream it was allocated on, and
// reused only on that stream, at once (as stream_pool_allocator reuses a stream's own blocks).
// Cost: a hit is a thread-local lookup, a bin lookup and a record update under the thread's
// own uncontended lock; a miss adds a thread-local lookup and filter tests to the inner
// allocator's work; a cross-thread free walks the threads' address filters.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "poolscope/pool/allocator.hpp"

namespace poolscope::pool {

namespace detail {
class thread_registry;
struct thread_cache;
}  // namespace detail

/// Bounds of a thread_cache_adaptor's caches: per thread, per adaptor.
struct thread_cache_adaptor_options {
  /// Bytes one thread's cache may hold.
  std::size_t max_bytes = std::size_t{16} << 20;
  /// Blocks one thread's cache may hold: at most 256 (more is an invalid_argument naming the
  /// value, from the adaptor's constructor). 0 caches nothing.
  std::size_t max_blocks = 64;
  /// Larger blocks bypass the cache.
  std::size_t max_block_bytes = std::size_t{4} << 20;
  /// The holding thread takes its cache's lock without a locked instruction while no other
  /// thread has touched the cache lately (an asymmetric fence, membarrier(2), makes the others
  /// pay instead; docs/thread_cache.md). Off, or where the fence is missing: one exchange per
  /// cached operation.
  bool owner_bias = true;
};

/// Whether locks can be biased towards a thread in this process (owner_bias above, and
/// bfc_options::lock_bias): membarrier(2)'s private expedited command is there, and this is not
/// a ThreadSanitizer build. Thread-safe.
[[nodiscard]] bool owner_bias_available() noexcept;

/// What the caches of a thread_cache_adaptor have done (thread_cache_adaptor::counts).
struct thread_cache_counters {
  /// Threads holding a cache now.
  std::uint64_t caches = 0;
  /// Times another thread revoked the bias of a cache's lock (each costs one membarrier(2)).
  /// Growing steadily: threads free each other's blocks often, and their caches run on plain
  /// locks.
  std::uint64_t revocations = 0;
  /// Times a cache went to rest: its hits over a sample of requests were too few to pay for its
  /// misses (random sizes), so it was bypassed for a while (docs/thread_cache.md).
  std::uint64_t rests = 0;
  /// Caches resting now.
  std::uint64_t resting = 0;
};

/// A per-thread cache in front of an allocator; see the file comment.
class thread_cache_adaptor final : public allocator {
 public:
  /// A cache in front of `inner` (not null, not used yet). Throws invalid_argument naming the
  /// value if `inner` is null or options.max_blocks exceeds 256.
  explicit thread_cache_adaptor(std::unique_ptr<allocator> inner,
                                thread_cache_adaptor_options options = {});
  ~thread_cache_adaptor() override;

  /// The allocator behind the caches (part of this one: see the file comment).
  [[nodiscard]] allocator& inner() const noexcept { return *inner_; }
  [[nodiscard]] const thread_cache_adaptor_options& options() const noexcept { return options_; }
  /// Returns the blocks held in every thread's cache to the inner allocator (they stay
  /// reserved, in its own cache); returns the bytes moved. Takes the lock of each cache that
  /// holds blocks, in turn (another thread's revokes its bias).
  std::size_t flush() noexcept;
  /// What the caches have done (a diagnostic). Thread-safe.
  [[nodiscard]] thread_cache_counters counts() const;

 private:
  class caches;

  block do_allocate(stream_view stream, std::size_t bytes, std::size_t alignment) override;
  free_outcome do_deallocate(stream_view stream, void* ptr, std::size_t bytes,
                             std::size_t alignment) noexcept override;
  std::size_t do_release_cached() override;
  void do_cache_stats(allocator_stats& s) const override;
  [[nodiscard]] std::size_t do_cached_bytes_other_streams(stream_view stream) const override;

  [[gnu::noinline]] block serve_unslotted(stream_view stream, std::size_t bytes,
                                          std::size_t alignment);
  [[gnu::noinline]] free_outcome free_unslotted(stream_view stream, void* ptr, std::size_t bytes,
                                                std::size_t alignment) noexcept;
  free_outcome free_with(detail::thread_cache* c, stream_view stream, void* ptr, std::size_t bytes,
                         std::size_t alignment) noexcept;
  block forward(stream_view stream, std::size_t bytes, std::size_t alignment);
  [[gnu::noinline]] block serve(detail::thread_cache& c, stream_view stream, std::size_t bytes,
                                std::size_t alignment);
  [[gnu::noinline]] block serve_miss(detail::thread_cache& c, stream_view stream, std::size_t bytes,
                                     std::size_t alignment, std::size_t rounded, bool has_bin);
  [[gnu::noinline]] free_outcome free_cached(detail::thread_cache& c, stream_view stream, void* ptr,
                                             std::size_t bytes, std::size_t alignment) noexcept;
  [[gnu::noinline]] free_outcome free_elsewhere(const detail::thread_cache* own, stream_view stream,
                                                void* ptr, std::size_t bytes,
                                                std::size_t alignment) noexcept;
  bool cache_locked(detail::thread_cache& c, void* ptr, std::size_t rounded, void* stream,
                    std::size_t target) noexcept;
  void evict_bin_locked(detail::thread_cache& c, std::size_t bin) noexcept;
  std::size_t flush_locked(detail::thread_cache& c) noexcept;
  void judge(detail::thread_cache& c) noexcept;
  void retire(detail::thread_cache& c) noexcept;
  [[nodiscard]] std::size_t rounded(std::size_t bytes) const noexcept {
    return (bytes + granularity_ - 1) & ~(granularity_ - 1);
  }

  std::unique_ptr<allocator> inner_;
  thread_cache_adaptor_options options_;
  std::size_t granularity_;  // the inner allocator's (a power of two)
  std::size_t max_block_;    // the largest rounded size a cache keeps (0: none)
  std::unique_ptr<caches> caches_;
  std::shared_ptr<detail::thread_registry> registry_;
  std::uint32_t cache_key_;  // the registry's (thread_registry::local)
};

}  // namespace poolscope::pool
