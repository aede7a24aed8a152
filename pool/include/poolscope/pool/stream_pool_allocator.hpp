// stream_pool: a pool per stream, each one any inner strategy (naive, best_fit, bfc), over one
// upstream resource. Memory freed on a stream is reused at once on that stream; it reaches
// another stream only as whole upstream blocks, and only after an event recorded on the
// releasing stream has completed.
//
//   poolscope::pool::cuda_resource gpu{0};
//   poolscope::pool::stream_pool_allocator pool{gpu};     // inner strategy "bfc"
//   void* a = pool.allocate(s1, 1 << 20);
//   kernel<<<g, b, 0, s1>>>(a);
//   pool.deallocate(s1, a, 1 << 20);                      // reusable on s1 at once
//   void* b = pool.allocate(s1, 1 << 20);                 // same memory, ordered after kernel
//   void* c = pool.allocate(s2, 1 << 20);                 // never memory s1 may still be using
//   pool.release_cached(s1);                              // s1's free blocks -> shared cache
//
// How memory moves (docs/design.md §2):
// - Each stream S has its own inner pool, created on S's first request by
//   make_allocator(inner, ...) over an internal per-stream upstream. That upstream takes
//   whole blocks from: S's own released blocks (no wait), the shared cache (blocks S released
//   itself, or blocks of other streams whose release event has completed: queried, never
//   waited for), then the real resource.
// - Whole upstream blocks leave S's pool when S's pool releases them: release_cached(S), or
//   when another stream runs short. They go to the shared cache tagged with S. One event is
//   recorded on S per release_cached(S) call (lazily: never on a plain deallocate), and
//   another stream takes such a block only once that event has completed.
// - When a stream runs short (the resource refuses a block), it takes a cached block of any
//   size that fits (its own, or a shared one whose event has completed), then waits on the
//   event of a fitting shared block, then try-locks the other streams' pools, runs a device-wide
//   barrier (stream_event_source::synchronize_all) and takes over their wholly free blocks,
//   then gives the cached blocks that cannot serve it back to the resource and asks again. If
//   that fails too, the base allocator releases everything and retries once before throwing
//   out_of_memory (whose message names the bytes still cached on other streams).
// - A block freed on a stream T other than the one it was allocated on (S) goes back to S's
//   pool only after an event recorded on T at that free has completed; meanwhile it counts as
//   cached on S (stream_cached_bytes::pending_bytes, stats().cached_bytes). Such a free costs an
//   event record and a search of the other streams' tables.
// - release_cached() (all streams) holds every stream's mutex across a barrier, and the
//   destructor runs one too; then they return every cached block to the resource on the
//   default stream. So the pool
//   records events and frees memory only on streams the caller names in that very call (short
//   of the host running out of memory for bookkeeping): destroying a stream after its last use
//   is safe. A stream named in release_cached(stream) or deallocate must be alive in that call.
//
// Over a virtual resource (vmm, host_vmm) with inner strategy bfc, each stream's pool is a bfc
// over the resource itself: it reserves address ranges of its own (its large pool one range that
// grows in place while the addresses after it are free) and maps and unmaps granules as
// bfc_allocator does over a virtual resource (its unmap policy, bfc_options::unmap_*), so the
// memory mapped follows each stream's live bytes. A stream's ranges are its own until its pool
// gives them back (release_cached, the destructor); memory moves between streams as physical
// granules, unmapped by one pool and mapped by another, not as whole blocks: the shared cache
// stays empty. release_cached(stream) then unmaps the stream's free granules and returns its
// wholly free ranges to the resource (an unmap is ordered after the work using the memory as
// the resource orders it: virtual_resource.hpp). A refused map fails the request, and the
// allocator's release-and-retry (a barrier, then every stream's free granules unmapped) runs
// before out_of_memory. Maps count as this pool's reserved bytes, under its limit, and emit
// segment_map/segment_unmap under its identity. Other inner strategies take whole blocks, each
// a range mapped whole, as over any resource.
//
// Hook events: this allocator alone reports. pool_malloc/pool_free are emitted once per user
// call (by the allocator base, under this allocator's id); device_alloc/device_free only for
// real calls to the upstream resource (a block moving between a stream's pool and the shared
// cache is not one). Inner pools are adopted (allocator::adopt): their split/merge events carry
// this allocator's id and name; they emit nothing else. release pre/post is emitted by
// release_cached(); release_cached(stream) moves memory inside the pool and emits none.
// device_alloc/device_free and split/merge are emitted while a stream's mutex is held: a hook
// must not call back into this allocator (not even stats()).
//
// Ownership: owns the inner pools, the per-stream state, the shared cache and the event
// source; holds the resource by reference (it must outlive the pool) and returns all reserved
// memory to it on destruction (after the barrier).
// Thread safety: thread-safe. Each stream has its own mutex, held while its inner pool works,
// so users of different streams do not contend. The stream map is guarded by a reader/writer
// lock, taken only when a thread uses another stream than its last one (each thread remembers
// its last stream's state). The shared cache has its own mutex. Lock order: a stream's mutex,
// then the shared cache's; while a stream's mutex is held another one is only try-locked,
// except in release_cached(), which takes them all in first-use order.
// Cost: a thread-local lookup, one uncontended mutex, a hash-table update and the inner strategy
// per operation; an event record per release_cached(stream) and an event query per shared block
// looked at when a stream's pool needs a new whole block.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "poolscope/pool/allocator.hpp"

namespace poolscope::pool {

/// Events a stream_pool_allocator records on streams to learn when work enqueued before a
/// point has finished. CUDA resources use CUDA events; host resources use host_event_source.
/// Tests inject their own to hold events incomplete. Implementations must be thread-safe.
class stream_event_source {
 public:
  /// An opaque event; 0 is never a valid handle.
  using handle = std::uintptr_t;

  stream_event_source() = default;
  stream_event_source(const stream_event_source&) = delete;
  stream_event_source& operator=(const stream_event_source&) = delete;
  virtual ~stream_event_source() = default;

  /// Called once for each stream the pool allocates on, before its first allocation there (a
  /// stream that only frees blocks of other streams is seen by record() alone). May throw: that
  /// allocation fails.
  void attach(stream_view stream) { do_attach(stream); }
  /// A new event that completes once the work enqueued on `stream` so far has finished.
  [[nodiscard]] handle record(stream_view stream) { return do_record(stream); }
  /// True once `e` has completed. Never blocks.
  [[nodiscard]] bool query(handle e) { return do_query(e); }
  /// Blocks until `e` has completed.
  void synchronize(handle e) { do_synchronize(e); }
  /// Blocks until all work on every stream attached or recorded on so far has finished (and so
  /// every event recorded so far has completed): for CUDA, every stream of those streams'
  /// devices.
  void synchronize_all() { do_synchronize_all(); }
  /// Frees `e` (recorded or not, complete or not).
  void destroy(handle e) noexcept { do_destroy(e); }

 private:
  virtual void do_attach(stream_view /*stream*/) {}
  virtual handle do_record(stream_view stream) = 0;
  virtual bool do_query(handle e) = 0;
  virtual void do_synchronize(handle e) = 0;
  virtual void do_synchronize_all() = 0;
  virtual void do_destroy(handle e) noexcept = 0;
};

/// Events of host streams: host work is synchronous, so every event is complete when recorded.
/// Thread-safe; cost: one atomic increment per record.
class host_event_source final : public stream_event_source {
 private:
  handle do_record(stream_view stream) override;
  bool do_query(handle) override { return true; }
  void do_synchronize(handle) override {}
  void do_synchronize_all() override {}
  void do_destroy(handle) noexcept override {}

  std::atomic<handle> next_{1};
};

/// Bytes a stream pool caches for one stream.
struct stream_cached_bytes {
  stream_view stream;          ///< the stream (a cudaStream_t, or a host key)
  std::size_t bytes = 0;       ///< pool_bytes + released_bytes + pending_bytes + tail_bytes
  std::size_t pool_bytes = 0;  ///< free in the stream's own pool: reusable at once on the stream
  /// Whole blocks the stream released to the shared cache, not yet taken by any stream:
  /// reusable by other streams once the stream's release event has completed.
  std::size_t released_bytes = 0;
  /// Blocks of this stream's pool freed on another stream, waiting for the event recorded there
  /// at the free: back in pool_bytes at the stream's next request after it has completed.
  std::size_t pending_bytes = 0;
  /// The unused tails of cached whole blocks handed to the stream's pool when it asked for less
  /// (each counts as one cached block in stats()): held, reusable once the block leaves the pool.
  std::size_t tail_bytes = 0;
};

namespace detail {
struct stream_state;
struct shared_cache;
struct release_event;
class stream_upstream;
}  // namespace detail

class stream_pool_allocator final : public allocator {
 public:
  /// A stream pool over `upstream` whose per-stream pools use strategy `inner` ("naive",
  /// "best_fit" or "bfc"; invalid_argument naming it otherwise). `events` defaults to CUDA
  /// events (each on its stream's device: a pool over pinned memory may serve streams of several
  /// GPUs) for device and pinned memory, host_event_source for host memory.
  explicit stream_pool_allocator(resource& upstream, std::string_view inner = "bfc",
                                 std::unique_ptr<stream_event_source> events = nullptr);
  ~stream_pool_allocator() override;

  /// The inner strategy's name.
  [[nodiscard]] const std::string& inner_strategy() const noexcept { return inner_; }
  /// Cached bytes of every stream this pool has served, in first-use order. A snapshot.
  [[nodiscard]] std::vector<stream_cached_bytes> cached_bytes_by_stream() const;
  /// Moves the wholly free upstream blocks of `stream`'s pool to the shared cache, where other
  /// streams take them once an event recorded now on `stream` has completed. Returns the bytes
  /// moved. `stream` must be alive. Never blocks.
  std::size_t release_cached(stream_view stream);
  /// Returns every cached block of every stream to the resource (after a barrier); returns the
  /// bytes released. See allocator::release_cached.
  using allocator::release_cached;
  /// Number of streams this pool has served.
  [[nodiscard]] std::size_t stream_count() const;

 private:
  friend class detail::stream_upstream;

  block do_allocate(stream_view stream, std::size_t bytes, std::size_t alignment) override;
  free_outcome do_deallocate(stream_view stream, void* ptr, std::size_t bytes,
                             std::size_t alignment) noexcept override;
  void do_cache_stats(allocator_stats& s) const override;
  std::size_t do_release_cached() override;
  [[nodiscard]] std::size_t do_cached_bytes_other_streams(stream_view stream) const override;

  // Internals (stream_pool_allocator.cpp). "_locked": the caller holds st's mutex.
  detail::stream_state& state_for(stream_view stream);
  [[nodiscard]] detail::stream_state* find_state(stream_view stream) const;
  [[nodiscard]] std::vector<detail::stream_state*> states_snapshot() const;
  /// The i-th stream state in first-use order, or null past the last; allocates nothing (states
  /// are only added, and live as long as the pool).
  [[nodiscard]] detail::stream_state* state_at(std::size_t i) const noexcept;
  void* acquire_block_locked(detail::stream_state& st, std::size_t bytes);
  void return_block_locked(detail::stream_state& st, void* ptr, std::size_t bytes) noexcept;
  void* take_local_locked(detail::stream_state& st, std::size_t bytes, std::size_t cap);
  void* take_shared_locked(detail::stream_state& st, std::size_t bytes, std::size_t cap, bool wait);
  std::size_t release_stream_locked(detail::stream_state& st, bool record_event);
  void release_local_locked(detail::stream_state& st) noexcept;
  void drain_pending_locked(detail::stream_state& st, bool after_barrier);
  [[nodiscard]] std::vector<std::shared_ptr<detail::release_event>> shared_events() const;
  void mark_complete(const std::vector<std::shared_ptr<detail::release_event>>& covered);
  std::size_t release_shared(bool all) noexcept;
  /// Out of host memory queueing a cross-stream free: waits for `event` (a barrier without
  /// one), then returns `ptr`, live in `owner`'s pool (its mutex held), to that pool. Keeps it
  /// held if the wait fails.
  void return_at_once_locked(detail::stream_state& owner, void* ptr, std::size_t alignment,
                             stream_event_source::handle event) noexcept;
  free_outcome deallocate_elsewhere(stream_view stream, void* ptr, std::size_t bytes,
                                    std::size_t alignment) noexcept;

  std::string inner_;
  /// The inner pools are bfc over a virtual resource: each maps granules itself (class comment).
  bool maps_granules_ = false;
  std::unique_ptr<stream_event_source> events_;
  mutable std::shared_mutex states_mutex_;
  std::unordered_map<void*, std::unique_ptr<detail::stream_state>> states_;
  std::vector<detail::stream_state*> order_;  // first-use order; states live until destruction
  std::unique_ptr<detail::shared_cache> shared_;
  bool closing_ = false;  // set by the destructor (after its barrier)
};

}  // namespace poolscope::pool
