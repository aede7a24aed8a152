// bfc: best-fit with coalescing (TensorFlow's BFC, PyTorch's caching allocator). Memory comes
// from upstream in segments; each segment is a list of chunks in address order. A request,
// rounded up to 512 bytes, takes the smallest free chunk that fits and splits off the rest; a
// freed chunk merges with its free neighbours in the same segment (never across segments).
//
//   poolscope::pool::host_resource host;
//   poolscope::pool::bfc_allocator pool{host};
//   void* a = pool.allocate(s, 256 << 10);  // 2 MiB small segment: a 256 KiB chunk + 1.75 MiB free
//   void* b = pool.allocate(s, 100 << 10);  // carved from the free remainder, no upstream call
//   pool.deallocate(s, a, 256 << 10);       // a's chunk is free again
//   pool.deallocate(s, b, 100 << 10);       // merges with both neighbours: one free 2 MiB chunk
//
// Policy (bfc_options). Tuned for docs/design.md §4 A5 (tensors whose sizes follow a random
// sequence length each step), where it keeps peak reserved within a few percent of peak
// requested (docs/perf.md has the figures).
// - Small and large segments are kept apart, as in PyTorch: requests up to 1 MiB are served
//   from 2 MiB "small" segments, larger ones from "large" segments, so long-lived small blocks
//   do not pin large segments. One exception: a small request that finds no small chunk takes
//   the best-fitting free large chunk before a new small segment is acquired (memory idle in
//   one pool serves the other instead of growing the total; small_borrows_large).
// - Large segments: requests above 10 MiB get a segment of their size rounded up to 2 MiB (the
//   granularity of cudaMalloc). Requests of 1-10 MiB share 20 MiB segments, or segments of 1/8
//   of the bytes already reserved when that is less (never less than the request rounded to
//   2 MiB), so a pool of a few tens of MiB is not dominated by one mostly empty segment.
// - Consolidation (consolidate): separate segments cannot serve a block larger than each of
//   them, so a pool that keeps them grows one generation of segments per size (PyTorch's 1.8).
//   (1) When a large request finds no free chunk that fits, every wholly free large segment is
//   returned upstream first and one segment of max(policy size, bytes returned) is taken: the
//   reserved bytes never exceed what the plain policy would take and the cache stays in one
//   piece. (2) When two or more wholly free large segments hold at least half of the large
//   pool (between the steps of a training loop), the next large request merges them the same
//   way before it is served, so the next step carves one contiguous segment. A merge of k
//   segments costs k + 1 upstream calls and removes k - 1 segments: at most three upstream
//   calls per segment ever acquired on a miss.
// - Splitting: a chunk is always split when the remainder is at least 512 bytes (every chunk
//   is a multiple of 512), so in-use bytes are the requests rounded to 512 and nothing more.
//   Best fit is exact: the smallest free chunk that fits (ties: the most recently freed).
// - When upstream refuses a segment, smaller sizes are tried (the request rounded to 2 MiB,
//   then to 512 B) before the allocator reports failure, so a 3 MiB request does not fail
//   merely because a 20 MiB segment does not fit. Sizes that would pass the limit are skipped.
//
// Over a virtual resource (vmm_resource, host_vmm_resource): segments are address ranges the
// resource reserves, with nothing mapped; a chunk handed out gets the granules it touches mapped
// (allocator::upstream_map), and granules no live chunk touches any more stay mapped until the
// unmap policy unmaps them. `reserved` is then the bytes mapped: live bytes plus at most a
// granule at each end of a live run, plus the free granules the policy keeps; the stats'
// virtual_bytes, mapped_free_bytes, maps and unmaps say the rest, and cached_bytes are the mapped
// bytes no live chunk holds. A large request that finds no free chunk grows the last large
// segment in place when the addresses after it are free, so the large pool stays one range.
// The granules are mapped and unmapped under the pool's mutex (a chunk must not be handed out
// before its granules are mapped, nor a granule unmapped that a neighbour has just taken).
// Unmap policy (bfc_options::unmap_*): a band above the live bytes, as jemalloc's decay and
// PyTorch's expandable segments keep freed pages rather than give each back at once (a driver
// map costs tens of microseconds per granule; an unmap after every free that passes a fixed
// ratio remaps on the next request, and a workload oscillating near the ratio churns). The
// reference is the most live bytes over a window of frees (two buckets of unmap_window_frees
// frees each: the peak of the current bucket and of the one before), so a workload that
// returns to its level each step keeps its granules, and one that shrinks for good gives them
// back within two buckets. While the bytes mapped stay at or below the high mark (the reference
// plus unmap_high_fraction of it, at least keep_mapped_granules) nothing is unmapped; when an
// allocation's maps would take them past it (checked before mapping) or a bucket's end lowers
// it, free granules are unmapped in one batch down to the low mark: those of the largest free
// chunks first, and of each chunk its top first (best fit carves a chunk from its bottom and
// picks large chunks last). So after every operation the bytes mapped are at most the larger
// of the high mark and the granules live chunks touch: peak mapped is at most
// (1 + unmap_high_fraction) x peak live (or keep_mapped_granules more) or the peak of the
// granules live chunks touch. Pressure ignores the band: release_cached, and so the
// out-of-memory retry after a refused map, unmaps every free granule.
// Mapped fit (bfc_options::mapped_fit_candidates): over a virtual resource a fit is judged first
// by the granules it would map, then by its size. When the bytes a request would take at the
// bottom of its best fit lie in granules not all mapped, the request also weighs the best fit's
// top and the bottom and top of the next mapped_fit_candidates free chunks in best-fit order
// (the next larger sizes), and takes the place with the fewest granules to map: ties go to the
// smaller chunk and its bottom, so a place that maps nothing stops the search, and nothing is
// looked at when the best fit maps nothing (the usual case). A top is taken by splitting the chunk
// there: a chunk freed just above free space that the unmap policy has trimmed holds its mapped
// granules at its top. A driver map costs tens of microseconds per granule; the search costs a
// look at the granules the request spans per place; a larger chunk leaves a larger free
// remainder, which costs addresses, not memory.
// Ownership: the allocator owns every segment it took and returns them all to the resource on
// destruction (blocks still handed out are released with their segment).
// Thread safety: thread-safe. One mutex guards all state (free index, live table, segment
// lists): an inline futex-style lock (detail/bfc_structures.hpp) whose waiters spin briefly,
// then sleep, biased towards a thread that takes it alone (lock_bias; detail/biased_lock.hpp:
// after 256 entries with no other thread in between, that thread enters with plain stores until
// another thread revokes the bias with one membarrier(2); the count doubles per revocation). The
// critical section is short: a bitmap search, a few pointer updates and a hash-table operation.
// Upstream calls and segment releases run outside it; split/merge hooks run inside it, so a hook
// must be short and must not call back into the same allocator. Threads share the one lock;
// make_allocator("bfc") puts a thread_cache_adaptor in front of the pool so that a thread's
// repeated sizes do not take it.
// Stream semantics: not stream-aware. A block freed on one stream may be handed out for another
// at once; use stream_pool_allocator when several streams share a pool. Segments are acquired on
// the requesting stream and released on the default stream. Cost: O(1) per allocate/deallocate
// (bitmap search with countr_zero, open-addressing hash table, pooled chunk nodes: no heap
// allocation per operation), plus a walk of one size class when it holds chunks of several
// sizes; one upstream call per segment. Over a virtual resource, a batch of unmaps walks the
// free chunks from the largest size class down: O(size classes + granules of those it visits);
// a request whose best fit would map weighs at most 2 x (mapped_fit_candidates + 1) places, each
// O(granules the request spans).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "poolscope/pool/allocator.hpp"

namespace poolscope::pool {

class virtual_resource;

namespace detail {
struct bfc_chunk;
struct bfc_segment;
class metadata_arena;
}  // namespace detail

/// Segment sizing of a bfc_allocator. Sizes are in bytes and multiples of 512.
struct bfc_options {
  /// Requests (rounded to 512 B) up to this size are served from small segments.
  std::size_t small_request_max = std::size_t{1} << 20;
  /// Size of a small segment; at least small_request_max.
  std::size_t small_segment_bytes = std::size_t{2} << 20;
  /// Large requests up to this size share segments (mid_segment_bytes).
  std::size_t mid_request_max = std::size_t{10} << 20;
  /// Largest segment taken for a request in (small_request_max, mid_request_max]: the segment
  /// is the smaller of this and 1/8 of the bytes reserved, but at least the request rounded up
  /// to large_round_bytes. At least mid_request_max.
  std::size_t mid_segment_bytes = std::size_t{20} << 20;
  /// Larger requests get their own segment, rounded up to a multiple of this.
  std::size_t large_round_bytes = std::size_t{2} << 20;
  /// Merge wholly free large segments into one on a miss and between steps (file comment).
  bool consolidate = true;
  /// A small request that finds no free small chunk takes the best-fitting free chunk of the
  /// large pool before a new small segment is acquired (see the file comment).
  bool small_borrows_large = true;
  /// Bias the pool's lock towards a thread that takes it alone (no other thread in between for
  /// a while): that thread then takes and leaves it with plain stores, no locked instruction,
  /// and another thread's first entry revokes the bias with an asymmetric fence, membarrier(2)
  /// (see the file comment). Off, or where the fence is missing (owner_bias_available(),
  /// thread_cache_adaptor.hpp): one compare-exchange and one exchange per lock.
  bool lock_bias = true;
  /// Keep the pool's bookkeeping (free index, chunk nodes, live table) in one 2 MiB region
  /// advised for a transparent huge page (MADV_HUGEPAGE), where the OS grants one: its random
  /// reads then stay within one TLB entry, which pays on random sizes. Costs 2 MiB of host
  /// memory per pool when the huge page is granted (else only the pages touched); bookkeeping
  /// beyond the region comes from the heap. Off: all of it from the heap.
  bool huge_page_metadata = true;
  /// Over a virtual resource (vmm, host_vmm): the unmap policy (the file comment, "Unmap
  /// policy"). Mapped granules that no live chunk touches stay mapped while the bytes mapped stay
  /// at or below the high mark, reference + max(keep_mapped_granules granules,
  /// unmap_high_fraction x reference); past it, free granules are unmapped down to the low mark,
  /// reference + max(keep_mapped_granules granules, unmap_low_fraction x reference). The
  /// reference is the most live bytes over the last unmap_window_frees to 2 x
  /// unmap_window_frees frees (0: the live bytes now). Fractions lie in [0, 1], the low one at
  /// most the high one. All four 0: every free unmaps the granules it leaves free.
  /// release_cached (and so an out-of-memory retry) unmaps every free granule whatever the marks.
  double unmap_high_fraction = 1.0 / 32;
  double unmap_low_fraction = 1.0 / 64;
  std::size_t unmap_window_frees = std::size_t{1} << 16;
  std::size_t keep_mapped_granules = 4;
  /// Over a virtual resource, the mapped fit (the file comment, "Mapped fit"): when the granules
  /// a request would take at the bottom of its best fit are not all mapped, it also weighs the
  /// best fit's top and the bottom and top of this many more free chunks of its pool, in best-fit
  /// order, and takes the place with the fewest granules to map (ties: the smaller chunk, its
  /// bottom first). Each costs a look at the granules the request spans. 0: the best fit alone,
  /// as over any resource.
  std::size_t mapped_fit_candidates = 16;
};

/// The state of a bfc_allocator's pool lock (bfc_allocator::lock_counts).
struct bfc_lock_counters {
  /// Some thread takes the lock through its bias now.
  bool biased = false;
  /// Times another thread revoked the bias (each costs one membarrier(2)). The count a thread
  /// needs to take the lock alone before the bias is set again doubles with each, so it stays
  /// small (about a dozen) when threads share the pool.
  std::uint64_t revocations = 0;
};

/// One chunk of a segment, as reported by bfc_allocator::segments().
struct bfc_chunk_info {
  void* ptr = nullptr;
  std::size_t bytes = 0;      ///< chunk size (a multiple of 512)
  std::size_t requested = 0;  ///< bytes asked for (0 for a free chunk)
  bool free = false;
};

/// One upstream segment and its chunks in address order, as reported by segments().
struct bfc_segment_info {
  void* base = nullptr;
  std::size_t bytes = 0;
  bool large = false;  ///< from the large pool (else small)
  std::vector<bfc_chunk_info> chunks;
};

/// Best-fit-with-coalescing pool; see the file comment for policy, ownership, threads, cost.
class bfc_allocator final : public allocator {
 public:
  /// Chunk granularity: requests are rounded up to a multiple of this.
  static constexpr std::size_t round_bytes = 512;

  /// A pool over `upstream` (which must outlive it). Throws invalid_argument naming the field
  /// if `options` is inconsistent (sizes not multiples of 512, segments smaller than requests).
  explicit bfc_allocator(resource& upstream, bfc_options options = {});
  ~bfc_allocator() override;

  /// The options the pool was built with.
  [[nodiscard]] bfc_options options() const noexcept { return options_; }

  /// A snapshot of every segment (ordered by base address) and its chunks. Takes the mutex;
  /// O(chunks). For reports and tests.
  [[nodiscard]] std::vector<bfc_segment_info> segments() const;

  /// Debug aid: walks every segment, chunk, size-class list and the live table and checks
  /// that they agree (chunks tile their segment, no two free neighbours, each free chunk in the
  /// right sorted class list and bitmap, counters exact; over a virtual resource also that every
  /// granule a live chunk touches is mapped, the granule counts are exact, and no free granule
  /// is left mapped past the unmap policy's high mark). Returns "" when consistent, else a
  /// description of the first violation. Takes the mutex; O(chunks + size classes), plus
  /// O(granules of the segments) over a virtual resource.
  [[nodiscard]] std::string check_invariants() const;

  /// The pool lock's bias now (bfc_options::lock_bias). Thread-safe; a snapshot.
  [[nodiscard]] bfc_lock_counters lock_counts() const noexcept;

  /// Bytes of the region that holds the pool's bookkeeping (bfc_options::huge_page_metadata;
  /// 0 without one), and how many of them are used. Thread-safe (takes the mutex).
  [[nodiscard]] std::size_t metadata_region_bytes() const noexcept;
  [[nodiscard]] std::size_t metadata_region_used() const noexcept;

 private:
  struct state;
  /// Destroys the state and gives its memory back to where it came from (the arena or the heap).
  struct state_deleter {
    detail::metadata_arena* arena = nullptr;
    void operator()(state* s) const noexcept;
  };

  block do_allocate(stream_view stream, std::size_t bytes, std::size_t alignment) override;
  free_outcome do_deallocate(stream_view stream, void* ptr, std::size_t bytes,
                             std::size_t alignment) noexcept override;
  void do_cache_stats(allocator_stats& s) const override;
  std::size_t do_release_cached() override;

  // The helpers below marked "locked" require the caller to hold the mutex. Those that take the
  // state take it from the caller, which read state_ before locking (read after the lock's
  // acquire, it would be loaded again).
  // The hot paths, allocate_chunk and deallocate_chunk (fit_locked, take, carve and free_chunk
  // inlined into them), are compiled once per instruction set (POOLSCOPE_HOT_CLONES,
  // detail/bfc_structures.hpp).
  block allocate_chunk(stream_view stream, std::size_t bytes);
  free_outcome deallocate_chunk(stream_view stream, void* ptr, std::size_t bytes) noexcept;
  [[gnu::noinline]] block allocate_missed(stream_view stream, std::size_t bytes);
  detail::bfc_chunk* fit_locked(state& st, std::size_t rounded, bool large) noexcept;  // locked
  block take(state& st, stream_view stream, detail::bfc_chunk* c, std::size_t rounded,
             std::size_t bytes);  // locked
  block allocate_segment(stream_view stream, bool large, std::size_t rounded, std::size_t bytes,
                         detail::bfc_segment* detached, std::size_t detached_bytes,
                         std::size_t reserved_now);
  void carve(state& st, stream_view stream, detail::bfc_chunk* c, std::size_t rounded,
             std::size_t bytes) noexcept;                                         // locked
  void free_chunk(state& st, stream_view stream, detail::bfc_chunk* c) noexcept;  // locked
  static free_outcome returned(std::size_t rounded, std::size_t requested,
                               std::size_t bytes) noexcept;
  void detach_wholly_free(bool large, detail::bfc_segment*& chain,
                          std::size_t& bytes) noexcept;  // locked
  std::size_t release_detached(detail::bfc_segment* list) noexcept;

  // Over a virtual resource (the file comment). Locked helpers as above.
  [[nodiscard]] bool map_chunk(state& st, stream_view stream, detail::bfc_chunk* c);  // locked
  /// take's path over a virtual resource: the mapped fit of `best` carved, its granules mapped.
  block take_mapped(state& st, stream_view stream, detail::bfc_chunk* best, std::size_t rounded,
                    std::size_t bytes);  // locked
  /// The free chunk a request of `rounded` bytes is carved from (at its bottom) instead of its
  /// best fit `best` (bfc_options::mapped_fit_candidates): `best`, or a larger free chunk, or the
  /// top of one split off (split_top) for the request to take.
  [[nodiscard]] detail::bfc_chunk* mapped_fit(state& st, stream_view stream,
                                              detail::bfc_chunk* best,
                                              std::size_t rounded) noexcept;  // locked
  /// Splits free chunk `c` (larger than `bytes`) so that its top `bytes` are a free chunk of
  /// their own, and returns that chunk.
  detail::bfc_chunk* split_top(state& st, stream_view stream, detail::bfc_chunk* c,
                               std::size_t bytes) noexcept;  // locked
  /// The live chunk `c` is being freed: its granules' counts, and the policy's bucket of frees.
  void release_granules(state& st, const detail::bfc_chunk* c) noexcept;  // locked
  /// The unmap policy's marks now (the file comment): {high, low}.
  [[nodiscard]] std::pair<std::size_t, std::size_t> unmap_marks(const state& st) const noexcept;
  /// When the bytes mapped plus `need` more would pass the high mark and free granules are
  /// mapped: unmaps them until the bytes mapped plus `need` are down to the low mark.
  void trim_to_marks(state& st, stream_view stream, std::size_t need) noexcept;  // locked
  /// A live chunk whose granules could not be mapped goes back to the index.
  void uncarve(state& st, stream_view stream, detail::bfc_chunk* c) noexcept;  // locked
  /// A large request's chunk from the last large segment grown in place; {} if it cannot grow.
  block grow_in_place(stream_view stream, std::size_t rounded, std::size_t bytes);
  [[nodiscard]] void* acquire_range(stream_view stream, std::size_t bytes);
  std::size_t release_range(stream_view stream, void* base, std::size_t bytes) noexcept;
  [[nodiscard]] std::size_t release_mapped_free(state& st) noexcept;   // locked
  void mapped_cache_stats(const state& st, allocator_stats& s) const;  // locked

  bfc_options options_;
  virtual_resource* vm_ = nullptr;                 // the upstream, when it is a virtual resource
  std::unique_ptr<detail::metadata_arena> arena_;  // the state's home; outlives it
  std::unique_ptr<state, state_deleter> state_;
};

}  // namespace poolscope::pool
