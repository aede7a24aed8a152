// planner: what a reshard must move. Pure code (no backend, no memory): given the chunks an array
// has and the chunks it should have, the list of pieces to copy, with their bytes and order.
//
//   using namespace poolscope::darray;
//   auto src = index_map::split({1000}, 0, {{0, 0, 700}, {1, 700, 1000}}).chunks();
//   auto dst = index_map::split({1000}, 0, {{0, 0, 500}, {1, 500, 1000}}).chunks();
//   auto p = plan_reshard(src, dst, {.element_size = 4});
//   // p.pieces: [0:500] 0->0 local, [700:1000] 1->1 local, [500:700] 0->1 remote (800 B)
//
// Rules (docs/design.md §2, darray: never send what is already in place, feed replicas once):
// - replica source (accumulate = false): each destination chunk is partitioned exactly by its
//   pieces. What a chunk on the destination device already holds is taken from there (local
//   pieces: no transfer; `in_place` when the source chunk is the destination chunk). The rest
//   comes from remote chunks; an element held by several remote chunks (replicas) is sent once,
//   from the source device with the fewest bytes assigned so far (spreads load over links).
// - each element crosses to a device at most once per reshard: when destination chunks on one
//   device overlap (replicas) where no source chunk there holds the elements, the first chunk
//   needing them receives them, and each later one takes them from it (`from_dst` pieces: local,
//   src_chunk indexes the destination chunks; the executor aliases the first chunk's received
//   storage, no copy). Such a piece takes what one remote piece (after splitting) delivered and
//   comes right after it, so it is ready when that piece has arrived.
// - partial source (accumulate = true): every source chunk intersecting a destination chunk
//   contributes a piece (the executor reduces them); nothing is deduplicated.
// - remote pieces larger than split_bytes are split along their outermost axis into parts of at
//   most split_bytes (so compute on the first part can start while the rest is in flight).
// - order: local pieces first; remote pieces by their position in the destination chunk (the
//   fraction of the chunk before them; for a piece that later chunks also take from, the
//   smallest of its positions there and in its own chunk), then destination device, then source
//   device — so every destination gets its first elements early and every link starts at once.
//   Each from_dst piece comes right after the remote piece it takes from.
//
//   auto src2 = index_map::split({1000}, 0, {{0, 0, 300}, {1, 300, 1000}}).chunks();
//   index_map dst2;                                   // replicas: [400:600] in both chunks
//   dst2.add(0, box{{slice{0, 600}}}).add(0, box{{slice{400, 1000}}});
//   auto q = plan_reshard(src2, dst2.chunks(), {.element_size = 4});
//   // q.pieces: [0:300] 0->0 local; [300:600] 1->0 remote into dst chunk 0 (1200 B); [400:600]
//   //   from dst chunk 0 into dst chunk 1 (from_dst, 800 B local); [600:1000] 1->0 remote into
//   //   dst chunk 1 (1600 B). 2800 B cross, not 3600.
//
// Ownership: plain values. Thread safety: reentrant. Cost: O((src + dst) log(src + dst)) to index
// the chunks, then per destination chunk one query per search for the chunks meeting it (its own
// device's source chunks, the earlier destination chunks there, the holders of what is left),
// each O(log chunks + the chunks whose bounds meet it); then O(pieces log pieces) to order the
// pieces. For sources without replicas (no element in two source chunks: blocks, grids, splits)
// and for elements found on their own device (a replicated source into blocks) that is
// O(pieces log pieces) — rows to columns has src * dst pieces. Where remote replicas hold what a
// destination chunk needs, choosing the least-loaded one region by region costs O(h^2) for the h
// source chunks meeting it. reshard_plan::boxes_visited counts the work.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "poolscope/darray/geometry.hpp"
#include "poolscope/darray/index_map.hpp"

namespace poolscope::darray {

/// One copy (or aliasing) of a region from a source chunk into a destination chunk, or (from_dst)
/// the aliasing of a region an earlier destination chunk on the same device receives.
struct piece {
  /// Index into the source chunk list; with from_dst, into the destination chunk list (a chunk
  /// before dst_chunk, on the same device).
  std::size_t src_chunk = 0;
  std::size_t dst_chunk = 0;  ///< index into the destination chunk list
  int src_device = 0;
  int dst_device = 0;
  box region;              ///< global indices of the elements moved
  std::int64_t bytes = 0;  ///< region.size() * element_size
  bool local = false;      ///< src_device == dst_device: no transfer between devices
  bool in_place = false;   ///< local, and the source chunk's box equals the destination's
  /// The region is what destination chunk src_chunk receives from another device (one remote
  /// piece of the plan, earlier in it): taken from there on the device (local, not in place).
  /// Only in replica-source plans.
  bool from_dst = false;
  friend bool operator==(const piece&, const piece&) = default;
};

/// Settings of plan_reshard.
struct plan_options {
  std::size_t element_size = 4;
  /// Remote pieces above this many bytes are split (0: never split).
  std::int64_t split_bytes = std::int64_t{64} << 20;
  /// Source is a partial (sum/prod/max/min) array: every intersection is a piece.
  bool accumulate = false;
  friend bool operator==(const plan_options&, const plan_options&) = default;
};

/// The pieces of a reshard, in issue order (see the file comment): a from_dst piece comes after
/// the remote piece it takes from.
struct reshard_plan {
  std::vector<piece> pieces;
  /// Bytes crossing between devices (an element crosses to a device at most once).
  std::int64_t bytes_remote = 0;
  /// Bytes taken from a chunk on the same device: a source chunk, or (from_dst) a destination
  /// chunk that receives them.
  std::int64_t bytes_local = 0;
  std::int64_t bytes_in_place = 0;  ///< of bytes_local, those already in the right chunk
  /// For each destination chunk, the indices (into pieces) of its pieces.
  std::vector<std::vector<std::size_t>> pieces_of_dst;
  /// Remote bytes per (src device, dst device), in increasing (src, dst) order.
  std::vector<std::tuple<int, int, std::int64_t>> link_bytes;
  /// The chunks, index nodes, boxes and pieces planning visited: its bookkeeping work, which
  /// tests bound (see the Cost paragraph of the file comment).
  std::uint64_t boxes_visited = 0;
  /// A multi-line listing for logs and tests.
  [[nodiscard]] std::string to_string() const;
};

/// Plans moving data held as `src` chunks into `dst` chunks (boxes of the same rank). Elements of
/// a destination chunk that no source chunk holds are left out of the plan (only possible when
/// the source map does not cover them: callers validate maps first). Throws invalid_index_map
/// on a rank mismatch or element_size 0.
[[nodiscard]] reshard_plan plan_reshard(const std::vector<chunk_ref>& src,
                                        const std::vector<chunk_ref>& dst,
                                        const plan_options& options);

/// What a plan_cache entry was made from: the source chunks, the array's shape, the target map,
/// whether that map was checked to cover the shape (a map checked only for bounds, as matmul's
/// row requests are, must not let a later reshard skip the cover check), and the options.
struct plan_key {
  std::vector<chunk_ref> src;
  shape_t shape;
  index_map dst;
  bool covering = true;
  plan_options options;
};

/// Counters of a plan_cache.
struct plan_cache_stats {
  std::uint64_t hits = 0;
  std::uint64_t misses = 0;
  std::size_t size = 0;  ///< plans held now
};

/// The plans of recent reshards, by what made them: a reshard repeated with the same source
/// chunks, target map and options (every step of a training loop, every iteration of an op) skips
/// checking the target map and planning — on small arrays most of a reshard's host time. Holds at
/// most `capacity` plans; a new one replaces the least recently used. Plans are immutable and
/// shared: a plan found stays valid after it leaves the cache.
///
/// Ownership: owns copies of its keys. Thread safety: every member may be called concurrently
/// (one mutex; a lookup compares a 64-bit hash per entry before comparing keys).
class plan_cache {
 public:
  explicit plan_cache(std::size_t capacity = 64);

  /// The plan made from exactly these (a plan_key's fields, not copied), or null. Counts a hit or
  /// a miss.
  [[nodiscard]] std::shared_ptr<const reshard_plan> find(const std::vector<chunk_ref>& src,
                                                         const shape_t& shape, const index_map& dst,
                                                         bool covering,
                                                         const plan_options& options);
  /// Remembers `plan` as the one made from `key` (replacing an equal key's).
  void insert(plan_key key, std::shared_ptr<const reshard_plan> plan);
  void clear();
  [[nodiscard]] plan_cache_stats stats() const;

 private:
  struct entry {
    std::uint64_t hash = 0;
    std::uint64_t last_used = 0;
    plan_key key;
    std::shared_ptr<const reshard_plan> plan;
  };
  mutable std::mutex mutex_;
  std::size_t capacity_;
  std::uint64_t clock_ = 0;
  std::uint64_t hits_ = 0;
  std::uint64_t misses_ = 0;
  std::vector<entry> entries_;
};

/// The elements each chunk of `chunks` owns when replicas are counted once: chunk i owns its box
/// minus the boxes of chunks 0..i-1 (what sum and prod reductions and matmul read). One list of
/// disjoint boxes per chunk, in order. Cost: O(n log n) plus the differences with the earlier
/// chunks each chunk meets (found through an index, not by visiting every earlier chunk).
[[nodiscard]] std::vector<std::vector<box>> owned_regions(const std::vector<chunk_ref>& chunks);

}  // namespace poolscope::darray
