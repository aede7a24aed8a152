#include "poolscope/pool/bfc_allocator.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <mutex>

#include "detail/bfc_structures.hpp"
#include "detail/biased_lock.hpp"
#include "detail/granule_map.hpp"
#include "detail/round_up.hpp"
#include "poolscope/error.hpp"
#include "poolscope/hooks/hook.hpp"
#include "poolscope/pool/virtual_resource.hpp"

namespace poolscope::pool {

using detail::bfc_chunk;
using detail::bfc_pool_kind;
using detail::bfc_segment;
using detail::round_up;

namespace {

constexpr std::size_t index_of(bfc_pool_kind k) noexcept {
  return static_cast<std::size_t>(k);
}

std::uintptr_t address(const void* p) noexcept {
  return reinterpret_cast<std::uintptr_t>(p);
}

void check_option(const char* field, std::size_t value, bool ok, const char* rule) {
  if (!ok) {
    throw invalid_argument("poolscope: bfc_options." + std::string(field) + " = " +
                           std::to_string(value) + " " + rule);
  }
}

void check_fraction(const char* field, double value, double most) {
  if (!(value >= 0.0 && value <= most)) {
    throw invalid_argument("poolscope: bfc_options." + std::string(field) + " = " +
                           std::to_string(value) + " must lie in [0, " + std::to_string(most) +
                           "]" + (most < 1.0 ? " (at most unmap_high_fraction)" : ""));
  }
}

}  // namespace

struct bfc_allocator::state {
  state(bool lock_bias, detail::metadata_arena* arena) noexcept
      : mutex(lock_bias), live(arena), nodes(arena) {}

  mutable detail::biased_mutex<detail::bfc_lock> mutex;
  std::array<detail::bfc_free_index, 2> index{};  // by bfc_pool_kind
  detail::bfc_ptr_map live;                       // live chunks by address
  detail::bfc_node_pool nodes;
  std::array<bfc_segment*, 2> segments{};  // list heads, by bfc_pool_kind
  std::array<std::size_t, 2> segment_count{};
  std::array<std::size_t, 2> wholly_free{};
  std::array<std::size_t, 2> wholly_free_bytes{};
  std::array<std::size_t, 2> pool_reserved{};  // free chunks that cover their whole segment
  std::size_t reserved = 0;                    // sum of segment sizes
  std::size_t live_bytes = 0;  // sum of live chunk sizes (those in thread caches included)
  /// Over a virtual resource: the granules mapped and the chunks on each (else null), and the
  /// large segment acquired or grown last, which the next one grows in place if it can.
  std::unique_ptr<detail::granule_map> granules;
  bfc_segment* growing = nullptr;
  /// Over a virtual resource, the unmap policy's reference (bfc_allocator.hpp): the most live
  /// bytes in the current bucket of frees and in the one before, and the frees of this bucket.
  std::size_t live_peak_now = 0;
  std::size_t live_peak_before = 0;
  std::size_t frees_in_bucket = 0;
  /// Where carve and free_chunk write a neighbour's link or flag when the chunk has no such
  /// neighbour (it is at its segment's edge): a store through a selected pointer (cmov) instead
  /// of a branch on the null test, which is a coin toss on random sizes (large requests get
  /// segments of their own, small ones share segments of many chunks). Written under the mutex,
  /// never read, in no segment.
  bfc_chunk nobody;

  /// `c`, or `nobody` if `c` is null. (GCC 12 selects with cmov here: both are at hand and
  /// neither arm loads.)
  [[nodiscard]] bfc_chunk* or_nobody(bfc_chunk* c) noexcept { return c != nullptr ? c : &nobody; }

  /// Free chunks and their bytes, for stats: every chunk node in use is a chunk, and the live
  /// ones are in the live table, so neither needs a counter of its own that the four index
  /// changes of a typical alloc+free pair would update (carve and free_chunk keep live_bytes,
  /// two updates per pair instead of eight).
  [[nodiscard]] std::size_t free_chunks() const noexcept { return nodes.in_use() - live.size(); }
  [[nodiscard]] std::size_t free_bytes() const noexcept { return reserved - live_bytes; }

  /// A free chunk into / out of the index and the wholly-free counts. The _part forms are for a
  /// chunk with a neighbour in its segment, which therefore does not cover it: the wholly-free
  /// counts stay as they are. (A split's remainder borders the chunk carved from it, a merged
  /// neighbour the chunk freed: two of the four index changes of a typical alloc+free pair skip the
  /// whole-segment test and its two counter updates.)
  void add_free_part(bfc_chunk* c) noexcept { index[index_of(c->pool)].insert(c); }
  void remove_free_part(bfc_chunk* c) noexcept { index[index_of(c->pool)].remove(c); }
  void add_free(bfc_chunk* c) noexcept {
    add_free_part(c);
    // Counted without a branch: whether a chunk covers its segment is a coin toss on random
    // sizes, and a mispredicted branch costs more than two additions.
    const std::size_t whole = c->whole_segment() ? 1 : 0;
    wholly_free[index_of(c->pool)] += whole;
    wholly_free_bytes[index_of(c->pool)] += whole * c->size;
  }
  void remove_free(bfc_chunk* c) noexcept {
    remove_free_part(c);
    const std::size_t whole = c->whole_segment() ? 1 : 0;
    wholly_free[index_of(c->pool)] -= whole;
    wholly_free_bytes[index_of(c->pool)] -= whole * c->size;
  }
  /// Makes sure one carve (a node for the split's remainder, one for the free part below when
  /// the mapped fit carves a chunk's top, a live-table slot) will not allocate: everything that
  /// can throw happens before the pool changes. May throw std::bad_alloc.
  void reserve_for_carve() {
    nodes.reserve(2);
    live.reserve_one();
  }
  void link(bfc_segment* s) noexcept {
    bfc_segment*& head = segments[index_of(s->pool)];
    s->prev = nullptr;
    s->next = head;
    if (head != nullptr) {
      head->prev = s;
    }
    head = s;
    ++segment_count[index_of(s->pool)];
    reserved += s->size;
    pool_reserved[index_of(s->pool)] += s->size;
  }
  void unlink(bfc_segment* s) noexcept {
    if (s->prev != nullptr) {
      s->prev->next = s->next;
    } else {
      segments[index_of(s->pool)] = s->next;
    }
    if (s->next != nullptr) {
      s->next->prev = s->prev;
    }
    --segment_count[index_of(s->pool)];
    growing = growing == s ? nullptr : growing;
    reserved -= s->size;
    pool_reserved[index_of(s->pool)] -= s->size;
  }
  /// Why `ptr` is not a live chunk: the start of a free chunk is a double free; anything else
  /// (a stranger's pointer, an interior pointer) is unknown. O(segments + chunks of one). Out
  /// of line: an invalid free is rare, and its loops inlined cost deallocate_chunk registers.
  [[nodiscard, gnu::cold, gnu::noinline]] hooks::free_error classify(
      const void* ptr) const noexcept {
    const std::uintptr_t p = address(ptr);
    for (const bfc_segment* head : segments) {
      for (const bfc_segment* s = head; s != nullptr; s = s->next) {
        if (p < address(s->base) || p >= address(s->base) + s->size) {
          continue;
        }
        for (const bfc_chunk* c = s->first; c != nullptr && address(c->addr) <= p; c = c->next) {
          if (address(c->addr) == p && c->is_free) {
            return hooks::free_error::double_free;
          }
        }
        return hooks::free_error::unknown_pointer;
      }
    }
    return hooks::free_error::unknown_pointer;
  }
};

bfc_allocator::bfc_allocator(resource& upstream, bfc_options options)
    : allocator(upstream, "bfc/" + upstream.name()),
      options_(options),
      arena_(options.huge_page_metadata
                 ? std::make_unique<detail::metadata_arena>(detail::metadata_arena::huge_page_bytes)
                 : nullptr),
      // In the arena when there is one (its first piece: the free index's class sentinels,
      // which every operation reads, at the start of the huge page).
      state_(new (detail::arena_allocator<state>(arena_.get()).allocate(1))
                 state(options.lock_bias, arena_.get()),
             state_deleter{arena_.get()}) {
  const auto multiple = [](std::size_t v) { return v != 0 && v % round_bytes == 0; };
  const char* not_multiple = "must be a positive multiple of 512";
  check_option("small_request_max", options_.small_request_max,
               multiple(options_.small_request_max), not_multiple);
  check_option("small_segment_bytes", options_.small_segment_bytes,
               multiple(options_.small_segment_bytes), not_multiple);
  check_option("mid_request_max", options_.mid_request_max, multiple(options_.mid_request_max),
               not_multiple);
  check_option("mid_segment_bytes", options_.mid_segment_bytes,
               multiple(options_.mid_segment_bytes), not_multiple);
  check_option("large_round_bytes", options_.large_round_bytes,
               multiple(options_.large_round_bytes), not_multiple);
  check_option("small_segment_bytes", options_.small_segment_bytes,
               options_.small_segment_bytes >= options_.small_request_max,
               "must be at least small_request_max");
  check_option("mid_request_max", options_.mid_request_max,
               options_.mid_request_max >= options_.small_request_max,
               "must be at least small_request_max");
  check_option("mid_segment_bytes", options_.mid_segment_bytes,
               options_.mid_segment_bytes >= options_.mid_request_max,
               "must be at least mid_request_max");
  check_fraction("unmap_high_fraction", options_.unmap_high_fraction, 1.0);
  check_fraction("unmap_low_fraction", options_.unmap_low_fraction, options_.unmap_high_fraction);
  set_size_granularity(round_bytes);
  vm_ = dynamic_cast<virtual_resource*>(&upstream);
  if (vm_ != nullptr) {
    state_->granules = std::make_unique<detail::granule_map>(*vm_);
  }
}

bfc_allocator::~bfc_allocator() {
  // Blocks still handed out go back with their segment: the allocator owns what it reserved.
  for (bfc_segment* head : state_->segments) {
    for (bfc_segment* s = head; s != nullptr;) {
      bfc_segment* next = s->next;
      if (vm_ != nullptr) {
        state_->granules->release_all(s->base, s->size, [&](char* p, std::size_t n) {
          upstream_unmap(*vm_, stream_view{}, p, n);
        });
      }
      release_range(stream_view{}, s->base, s->size);
      delete s;
      s = next;
    }
  }
}

// Inlined into the hot paths: they run once per allocate / deallocate.
[[gnu::always_inline]] inline void bfc_allocator::carve(state& st, stream_view stream, bfc_chunk* c,
                                                        std::size_t rounded,
                                                        std::size_t bytes) noexcept {
  st.remove_free(c);
  // c's neighbours are live (free chunks never touch): the one below now borders a live chunk.
  st.or_nobody(c->prev)->next_free = false;
  if (c->size > rounded) {
    // Every field set here or by add_free_part (its links and class), none twice.
    bfc_chunk* rest = st.nodes.take_unset();
    rest->addr = c->addr + rounded;
    rest->size = c->size - rounded;
    rest->requested = 0;
    rest->prev = c;
    rest->next = c->next;
    rest->pool = c->pool;
    rest->is_free = true;
    rest->prev_free = false;             // c, below it, is live
    rest->next_free = false;             // and so is the chunk above (free chunks never touch)
    st.or_nobody(c->next)->prev = rest;  // (its prev_free stays true: rest is free)
    c->next = rest;
    c->next_free = true;
    c->size = rounded;
    st.add_free_part(rest);
    if (hooks::active()) [[unlikely]] {
      emit_split(stream, c->addr, rounded, rest->addr, rest->size);
    }
  } else {
    st.or_nobody(c->next)->prev_free = false;
  }
  c->is_free = false;
  c->requested = bytes;
  st.live_bytes += rounded;
  st.live.insert(c);
}

[[gnu::always_inline]] inline void bfc_allocator::free_chunk(state& st, stream_view stream,
                                                             bfc_chunk* c) noexcept {
  c->is_free = true;
  c->requested = 0;
  st.live_bytes -= c->size;
  bfc_chunk* prev = c->prev;
  if (c->prev_free) {
    st.remove_free_part(prev);  // it borders c
    char* const absorbed = prev->addr;
    const std::size_t absorbed_bytes = prev->size;
    prev->size += c->size;
    prev->next = c->next;
    st.or_nobody(c->next)->prev = prev;
    prev->next_free = c->next_free;
    st.nodes.give(c);
    c = prev;
    if (hooks::active()) [[unlikely]] {
      emit_merge(stream, c->addr, c->size, absorbed, absorbed_bytes);
    }
  } else {
    st.or_nobody(prev)->next_free = true;
  }
  bfc_chunk* next = c->next;
  if (c->next_free) {
    st.remove_free_part(next);  // it borders c
    c->size += next->size;
    c->next = next->next;
    c->next_free = false;                // the chunk above `next` is live
    st.or_nobody(next->next)->prev = c;  // (its prev_free stays true: c is free)
    if (hooks::active()) [[unlikely]] {
      emit_merge(stream, c->addr, c->size, next->addr, next->size);
    }
    st.nodes.give(next);
  } else {
    st.or_nobody(next)->prev_free = true;
  }
  st.add_free(c);
}

// Alignment always holds: segments are >= 256-aligned and chunks start at multiples of 512.
block bfc_allocator::do_allocate(stream_view stream, std::size_t bytes, std::size_t /*alignment*/) {
  return allocate_chunk(stream, bytes);  // (a virtual function has no clones)
}

// A request's best fit in the pool (the caller holds the mutex); null if no free chunk fits or
// the large pool should merge its wholly free segments first. Inlined into allocate_chunk and
// allocate_missed.
[[gnu::always_inline]] inline bfc_chunk* bfc_allocator::fit_locked(state& st, std::size_t rounded,
                                                                   bool large) noexcept {
  // Two or more wholly free large segments holding at least half the large pool (typically
  // between the steps of a training loop): merge them into one before serving (see the header).
  // A merge of k segments makes k + 1 upstream calls and removes k - 1 segments, so merges cost
  // at most three upstream calls per segment ever acquired on a miss. (The rare condition
  // first: whether the request is large is a coin toss on mixed sizes, and two wholly free
  // large segments are the rule on random sizes, where requests above 10 MiB get segments of
  // their own, but half the large pool wholly free is not.)
  const bool merge_first = st.wholly_free_bytes[1] * 2 >= st.pool_reserved[1] &&
                           st.wholly_free[1] >= 2 && large && options_.consolidate;
  if (merge_first) [[unlikely]] {
    return nullptr;
  }
  bfc_chunk* c = st.index[large ? 1 : 0].best_fit(rounded);
  if (c == nullptr && !large && options_.small_borrows_large) {
    c = st.index[1].best_fit(rounded);
  }
  return c;
}

// The request's block from its best fit `c` (the caller holds the mutex, and has reserved two
// nodes and a live-table slot): `c` carved, or over a virtual resource the mapped fit carved and
// its granules mapped ({} when a map is refused: the caller releases the cache and asks once
// more). Inlined into allocate_chunk and allocate_missed; the virtual resource's path is out of
// line, so that the usual one tests vm_ once.
[[gnu::always_inline]] inline block bfc_allocator::take(state& st, stream_view stream, bfc_chunk* c,
                                                        std::size_t rounded, std::size_t bytes) {
  if (vm_ == nullptr) [[likely]] {
    carve(st, stream, c, rounded, bytes);
    return {c->addr, rounded};
  }
  return take_mapped(st, stream, c, rounded, bytes);
}

// The usual request: one try under the mutex. Everything else (a merge, a new segment) is
// allocate_missed's, out of line: this function then keeps no loop state and saves fewer
// registers on entry.
POOLSCOPE_HOT_CLONES
block bfc_allocator::allocate_chunk(stream_view stream, std::size_t bytes) {
  const std::size_t rounded = round_up(bytes, round_bytes);
  const bool large = rounded > options_.small_request_max;
  state& st = *state_;
  {
    std::lock_guard lock(st.mutex);
    st.reserve_for_carve();
    if (bfc_chunk* c = fit_locked(st, rounded, large)) [[likely]] {
      return take(st, stream, c, rounded, bytes);
    }
  }
  return allocate_missed(stream, bytes);
}

// No free chunk fit on the first try (or a merge comes first): one more try (under the mutex
// anew: another thread may have freed a fit meanwhile), then a new segment.
block bfc_allocator::allocate_missed(stream_view stream, std::size_t bytes) {
  const std::size_t rounded = round_up(bytes, round_bytes);
  const bool large = rounded > options_.small_request_max;
  state& st = *state_;
  bfc_segment* detached = nullptr;
  std::size_t detached_bytes = 0;
  std::size_t reserved_now = 0;
  {
    std::lock_guard lock(st.mutex);
    st.reserve_for_carve();
    if (bfc_chunk* c = fit_locked(st, rounded, large)) {
      return take(st, stream, c, rounded, bytes);
    }
    if (large && options_.consolidate && st.wholly_free[1] != 0) {
      detach_wholly_free(true, detached, detached_bytes);
    }
    reserved_now = st.reserved;
  }
  return allocate_segment(stream, large, rounded, bytes, detached, detached_bytes, reserved_now);
}

block bfc_allocator::allocate_segment(stream_view stream, bool large, std::size_t rounded,
                                      std::size_t bytes, bfc_segment* detached,
                                      std::size_t detached_bytes, std::size_t reserved_now) {
  // Release first, acquire second: reserved bytes never hold both at once.
  release_detached(detached);
  if (vm_ != nullptr && large) {
    if (const block b = grow_in_place(stream, rounded, bytes); b.ptr != nullptr) {
      return b;
    }
  }

  // Over a virtual resource, segments are address ranges: whole granules, and no part of
  // reserved (the limit applies to what is mapped).
  const std::size_t unit = vm_ != nullptr ? vm_->granularity() : 1;
  std::size_t policy = options_.small_segment_bytes;
  if (large) {
    const std::size_t exact = round_up(rounded, options_.large_round_bytes);
    // Mid-size requests share a segment, but one no larger than 1/8 of what the pool holds, so
    // a small pool is not dominated by one mostly empty 20 MiB segment.
    policy =
        rounded > options_.mid_request_max
            ? exact
            : std::max(exact, std::min(options_.mid_segment_bytes,
                                       round_up(reserved_now / 8, options_.large_round_bytes)));
  }
  // Largest first; each later one is a fallback when upstream (or the limit) refuses.
  const std::array<std::size_t, 4> candidates{
      round_up(std::max(policy, detached_bytes), unit), round_up(policy, unit),
      round_up(round_up(rounded, options_.large_round_bytes), unit), round_up(rounded, unit)};
  const std::size_t lim = vm_ != nullptr ? SIZE_MAX : limit();
  void* p = nullptr;
  std::size_t size = 0;
  std::size_t tried = SIZE_MAX;
  for (const std::size_t s : candidates) {
    if (s >= tried || s < rounded) {
      continue;
    }
    // Sizes that would pass the limit are skipped; the last (exact) one is always asked, so the
    // limit hit is recorded once by upstream_allocate.
    if (s != rounded && lim != SIZE_MAX && reserved_now + s > lim) {
      continue;
    }
    tried = s;
    p = acquire_range(stream, s);
    if (p != nullptr) {
      size = s;
      break;
    }
  }
  if (p == nullptr) {
    return {};
  }

  state& st = *state_;
  std::unique_lock lock(st.mutex);
  bfc_segment* seg = nullptr;
  try {
    st.nodes.reserve(2);
    st.live.reserve_one();
    seg = new bfc_segment;
  } catch (...) {
    lock.unlock();
    release_range(stream, p, size);
    throw;
  }
  seg->base = static_cast<char*>(p);
  seg->size = size;
  seg->pool = large ? bfc_pool_kind::large : bfc_pool_kind::small;
  bfc_chunk* c = st.nodes.take();
  c->addr = seg->base;
  c->size = size;
  c->pool = seg->pool;
  c->is_free = true;
  seg->first = c;
  st.link(seg);
  if (vm_ != nullptr && large) {
    st.growing = seg;
  }
  st.add_free(c);
  carve(st, stream, c, rounded, bytes);
  if (vm_ != nullptr && !map_chunk(st, stream, c)) {
    uncarve(st, stream, c);  // the segment stays, wholly free
    return {};
  }
  return {p, rounded};
}

// What a free of `bytes` says of a chunk of `rounded` bytes for `requested` it returned. Chunks
// are exactly the request rounded to 512, so any size with the same rounding is right:
// bytes <= rounded < bytes + 512, one comparison (a larger `bytes` wraps the difference).
[[gnu::always_inline]] inline free_outcome bfc_allocator::returned(std::size_t rounded,
                                                                   std::size_t requested,
                                                                   std::size_t bytes) noexcept {
  const bool size_ok = rounded - bytes < round_bytes;
  return {size_ok ? hooks::free_error::none : hooks::free_error::size_mismatch, rounded, requested};
}

free_outcome bfc_allocator::do_deallocate(stream_view stream, void* ptr, std::size_t bytes,
                                          std::size_t /*alignment*/) noexcept {
  return deallocate_chunk(stream, ptr, bytes);  // (a virtual function has no clones)
}

// A free: the live chunk back into the index, merged with its free neighbours, all under the
// mutex (nobody can take the chunk before it is in the index). An unknown pointer or a double
// free changes nothing.
POOLSCOPE_HOT_CLONES
free_outcome bfc_allocator::deallocate_chunk(stream_view stream, void* ptr,
                                             std::size_t bytes) noexcept {
  state& st = *state_;
  std::lock_guard lock(st.mutex);
  bfc_chunk* const c = st.live.erase(ptr);
  if (c == nullptr) [[unlikely]] {
    return {st.classify(ptr), 0, 0};
  }
  const std::size_t rounded = c->size;
  const std::size_t requested = c->requested;
  if (vm_ != nullptr) [[unlikely]] {
    release_granules(st, c);
  }
  free_chunk(st, stream, c);
  if (vm_ != nullptr) [[unlikely]] {
    trim_to_marks(st, stream, 0);  // after free_chunk: the trim walks the free index
  }
  return returned(rounded, requested, bytes);
}

void bfc_allocator::detach_wholly_free(bool large, bfc_segment*& chain,
                                       std::size_t& bytes) noexcept {
  state& st = *state_;
  const std::size_t i = large ? 1 : 0;
  for (bfc_segment* s = st.segments[i]; s != nullptr && st.wholly_free[i] != 0;) {
    bfc_segment* const next = s->next;
    bfc_chunk* const c = s->first;
    if (c->is_free && c->whole_segment()) {
      st.remove_free(c);
      st.nodes.give(c);
      st.unlink(s);
      s->first = nullptr;
      s->prev = nullptr;
      s->next = chain;
      chain = s;
      bytes += s->size;
    }
    s = next;
  }
}

std::size_t bfc_allocator::release_detached(bfc_segment* list) noexcept {
  std::size_t released = 0;
  while (list != nullptr) {
    bfc_segment* const next = list->next;
    released += release_range(stream_view{}, list->base, list->size);
    delete list;
    list = next;
  }
  return released;
}

void bfc_allocator::do_cache_stats(allocator_stats& s) const {
  const state& st = *state_;
  std::lock_guard lock(st.mutex);
  if (vm_ != nullptr) {
    mapped_cache_stats(st, s);
    return;
  }
  s.cached_blocks = st.free_chunks();
  s.cached_bytes = st.free_bytes();
  s.largest_free_block = std::max(st.index[0].largest(), st.index[1].largest());
}

std::size_t bfc_allocator::do_release_cached() {
  bfc_segment* chain = nullptr;
  std::size_t bytes = 0;
  {
    std::lock_guard lock(state_->mutex);
    detach_wholly_free(false, chain, bytes);
    detach_wholly_free(true, chain, bytes);
    if (vm_ != nullptr) {
      // Reserved bytes are mapped ones: what goes is the mapped free granules of the segments
      // that stay and (release_detached) of those detached.
      bytes = release_mapped_free(*state_);
    }
  }
  const std::size_t released = release_detached(chain);
  return vm_ != nullptr ? bytes + released : bytes;
}

void bfc_allocator::state_deleter::operator()(state* s) const noexcept {
  s->~state();
  detail::arena_allocator<state>(arena).deallocate(s, 1);
}

std::size_t bfc_allocator::metadata_region_bytes() const noexcept {
  return arena_ != nullptr ? arena_->capacity() : 0;
}

std::size_t bfc_allocator::metadata_region_used() const noexcept {
  if (arena_ == nullptr) {
    return 0;
  }
  std::lock_guard lock(state_->mutex);
  return arena_->used();
}

bfc_lock_counters bfc_allocator::lock_counts() const noexcept {
  const auto& m = state_->mutex;
  return {m.biased(), m.revocations()};
}

std::vector<bfc_segment_info> bfc_allocator::segments() const {
  std::vector<bfc_segment_info> out;
  {
    const state& st = *state_;
    std::lock_guard lock(st.mutex);
    out.reserve(st.segment_count[0] + st.segment_count[1]);
    for (const bfc_segment* head : st.segments) {
      for (const bfc_segment* s = head; s != nullptr; s = s->next) {
        bfc_segment_info info;
        info.base = s->base;
        info.bytes = s->size;
        info.large = s->pool == bfc_pool_kind::large;
        for (const bfc_chunk* c = s->first; c != nullptr; c = c->next) {
          info.chunks.push_back({c->addr, c->size, c->requested, c->is_free});
        }
        out.push_back(std::move(info));
      }
    }
  }
  std::sort(out.begin(), out.end(), [](const bfc_segment_info& a, const bfc_segment_info& b) {
    return address(a.base) < address(b.base);
  });
  return out;
}

std::string bfc_allocator::check_invariants() const {
  const state& st = *state_;
  std::lock_guard lock(st.mutex);
  const auto at = [](const void* p) { return std::to_string(address(p)); };
  std::size_t free_chunks = 0;
  std::size_t free_bytes = 0;
  std::size_t live_chunks = 0;
  std::size_t reserved = 0;
  std::size_t all_chunks = 0;
  for (std::size_t i = 0; i < 2; ++i) {
    std::size_t count = 0;
    std::size_t wholly_free = 0;
    std::size_t wholly_free_bytes = 0;
    std::size_t pool_reserved = 0;
    const bfc_segment* prev_seg = nullptr;
    for (const bfc_segment* s = st.segments[i]; s != nullptr; prev_seg = s, s = s->next) {
      ++count;
      reserved += s->size;
      pool_reserved += s->size;
      if (index_of(s->pool) != i || s->prev != prev_seg) {
        return "segment " + at(s->base) + ": wrong pool or broken segment list";
      }
      if (address(s->base) % max_alignment != 0) {
        return "segment " + at(s->base) + ": base not 256-aligned";
      }
      const bfc_chunk* c = s->first;
      if (c == nullptr || c->prev != nullptr || c->addr != s->base) {
        return "segment " + at(s->base) + ": first chunk does not start it";
      }
      std::size_t covered = 0;
      for (; c != nullptr; c = c->next) {
        ++all_chunks;
        const std::string where = "chunk " + at(c->addr) + " of segment " + at(s->base);
        if (c->size == 0 || c->size % round_bytes != 0) {
          return where + ": size " + std::to_string(c->size) + " not a positive multiple of 512";
        }
        if (c->addr != s->base + covered) {
          return where + ": not contiguous with the chunk below";
        }
        if (c->pool != s->pool) {
          return where + ": wrong pool";
        }
        if (c->next != nullptr && c->next->prev != c) {
          return where + ": next->prev does not point back";
        }
        if (c->prev_free != (c->prev != nullptr && c->prev->is_free) ||
            c->next_free != (c->next != nullptr && c->next->is_free)) {
          return where + ": its record of which neighbours are free is wrong";
        }
        covered += c->size;
        if (c->is_free) {
          ++free_chunks;
          free_bytes += c->size;
          if (c->whole_segment()) {
            ++wholly_free;
            wholly_free_bytes += c->size;
          }
          if (c->next != nullptr && c->next->is_free) {
            return where + ": two free neighbours were not merged";
          }
          if (c->requested != 0 || st.live.find(c->addr) != nullptr) {
            return where + ": free but in the live table";
          }
        } else {
          ++live_chunks;
          if (st.live.find(c->addr) != c) {
            return where + ": live but not in the live table";
          }
          if (c->requested > c->size || c->requested + round_bytes <= c->size) {
            return where + ": size " + std::to_string(c->size) + " is not requested " +
                   std::to_string(c->requested) + " rounded to 512";
          }
        }
      }
      if (covered != s->size) {
        return "segment " + at(s->base) + ": chunks cover " + std::to_string(covered) + " of " +
               std::to_string(s->size) + " bytes";
      }
    }
    if (count != st.segment_count[i]) {
      return "segment count " + std::to_string(st.segment_count[i]) + " but " +
             std::to_string(count) + " segments listed";
    }
    if (wholly_free != st.wholly_free[i] || wholly_free_bytes != st.wholly_free_bytes[i]) {
      return "wholly-free segments " + std::to_string(st.wholly_free[i]) + " (" +
             std::to_string(st.wholly_free_bytes[i]) + " B) but " + std::to_string(wholly_free) +
             " (" + std::to_string(wholly_free_bytes) + " B) found";
    }
    if (pool_reserved != st.pool_reserved[i]) {
      return "pool reserved " + std::to_string(st.pool_reserved[i]) + " but its segments hold " +
             std::to_string(pool_reserved);
    }
  }
  if (free_chunks != st.free_chunks() || free_bytes != st.free_bytes()) {
    return "free counters (" + std::to_string(st.free_chunks()) + " chunks, " +
           std::to_string(st.free_bytes()) + " B) differ from the segments (" +
           std::to_string(free_chunks) + ", " + std::to_string(free_bytes) + ")";
  }
  if (reserved != st.reserved) {
    return "reserved " + std::to_string(st.reserved) + " but segments hold " +
           std::to_string(reserved);
  }
  if (live_chunks != st.live.size()) {
    return "live table holds " + std::to_string(st.live.size()) + " entries but " +
           std::to_string(live_chunks) + " chunks are live";
  }
  if (all_chunks != st.nodes.in_use()) {
    return "node pool lends " + std::to_string(st.nodes.in_use()) + " nodes but " +
           std::to_string(all_chunks) + " chunks exist";
  }
  std::size_t listed = 0;
  std::size_t listed_bytes = 0;
  for (std::size_t i = 0; i < 2; ++i) {
    const detail::bfc_free_index& ix = st.index[i];
    std::size_t largest = 0;
    for (std::size_t cls = 0; cls < detail::bfc_free_index::class_count; ++cls) {
      const bfc_chunk* h = ix.head(cls);
      if ((h != nullptr) != ix.marked(cls)) {
        return "class " + std::to_string(cls) + ": bitmap disagrees with the list";
      }
      const bfc_chunk* last = nullptr;
      for (const bfc_chunk* c = h; c != nullptr; last = c, c = ix.next_in_class(c)) {
        ++listed;
        listed_bytes += c->size;
        if (!c->is_free || index_of(c->pool) != i || c->size_class != cls ||
            detail::bfc_free_index::class_of(c->size) != cls || ix.prev_in_class(c) != last) {
          return "class " + std::to_string(cls) + ": chunk " + at(c->addr) + " misfiled";
        }
        if (last != nullptr && last->size > c->size) {
          return "class " + std::to_string(cls) + ": list not sorted by size";
        }
        largest = std::max(largest, c->size);
      }
      if (ix.tail(cls) != last) {
        return "class " + std::to_string(cls) + ": wrong tail";
      }
      if (ix.class_largest(cls) != (last != nullptr ? last->size : 0)) {
        return "class " + std::to_string(cls) + ": recorded largest " +
               std::to_string(ix.class_largest(cls)) + " is not its last chunk's size";
      }
    }
    if (ix.largest() != largest) {
      return "largest free chunk " + std::to_string(ix.largest()) + " but lists hold " +
             std::to_string(largest);
    }
  }
  if (listed != free_chunks || listed_bytes != free_bytes) {
    return "class lists hold " + std::to_string(listed) + " chunks, segments " +
           std::to_string(free_chunks);
  }
  if (vm_ == nullptr) {
    return {};
  }
  // Over a virtual resource: the live chunks on each granule, counted again here, agree with the
  // granule map; a granule a live chunk touches is mapped (as the map and the resource see it);
  // the mapped granules add up to what the map says.
  const detail::granule_map& g = *st.granules;
  const std::size_t unit = g.granularity();
  std::map<std::uintptr_t, std::uint32_t> on;  // granule index -> live chunks touching it
  std::size_t mapped = 0;
  std::size_t mapped_free = 0;
  for (const bfc_segment* head : st.segments) {
    for (const bfc_segment* s = head; s != nullptr; s = s->next) {
      for (const bfc_chunk* c = s->first; c != nullptr; c = c->next) {
        for (std::uintptr_t i = address(c->addr) / unit;
             !c->is_free && i <= (address(c->addr) + c->size - 1) / unit; ++i) {
          ++on[i];
        }
      }
      for (const char* p = s->base; p < s->base + s->size; p += unit) {
        const auto it = on.find(address(p) / unit);
        const std::uint32_t live = it != on.end() ? it->second : 0;
        if (g.chunks_on(p) != live) {
          return "granule " + at(p) + ": the map counts " + std::to_string(g.chunks_on(p)) +
                 " live chunks on it, the segment " + std::to_string(live);
        }
        if (live != 0 && (!g.is_mapped(p) || !vm_->is_mapped(p))) {
          return "granule " + at(p) + ": a live chunk touches it, but it is not mapped";
        }
        mapped += g.is_mapped(p) ? unit : 0;
        mapped_free += g.is_mapped(p) && live == 0 ? unit : 0;
      }
    }
  }
  if (mapped != g.mapped() || mapped_free != g.mapped_free()) {
    return "the map says " + std::to_string(g.mapped()) + " B mapped (" +
           std::to_string(g.mapped_free()) + " B free), the segments hold " +
           std::to_string(mapped) + " (" + std::to_string(mapped_free) + ")";
  }
  if (const std::size_t high = unmap_marks(st).first; mapped > high && mapped_free != 0) {
    return std::to_string(mapped) + " B mapped, past the high mark " + std::to_string(high) +
           " B, with " + std::to_string(mapped_free) + " B of free granules left mapped";
  }
  return {};
}

// ---- over a virtual resource ------------------------------------------------------------------

bool bfc_allocator::map_chunk(state& st, stream_view stream, bfc_chunk* c) {
  detail::granule_map& g = *st.granules;
  st.live_peak_now = std::max(st.live_peak_now, st.live_bytes);  // c is live (carved)
  const std::size_t need = g.unmapped_bytes(c->addr, c->size);
  if (need == 0) [[likely]] {
    return g.acquire(c->addr, c->size, [](char*, std::size_t) { return true; });
  }
  // Room first, then the maps: the bytes mapped never pass the high mark by the new granules,
  // not even between the two (the peak counts every map).
  trim_to_marks(st, stream, need);
  if (!g.acquire(c->addr, c->size,
                 [&](char* p, std::size_t n) { return upstream_map(*vm_, stream, p, n); })) {
    return false;
  }
  // The trim may have taken a granule at c's edge (shared with a free neighbour) that acquire
  // mapped again: rare, and then the marks are checked once more.
  trim_to_marks(st, stream, 0);
  return true;
}

// A map costs driver calls per granule (tens of microseconds each on a GPU) and looking at a few
// chunks costs nanoseconds, so a request whose best fit would map looks a bounded way up the sizes
// for a place with fewer granules to map: the bottom of a chunk, where carve cuts it, or its top
// (a chunk freed just above free space that the unmap policy has trimmed). A larger chunk leaves a
// larger remainder free: addresses, not memory.
block bfc_allocator::take_mapped(state& st, stream_view stream, bfc_chunk* best,
                                 std::size_t rounded, std::size_t bytes) {
  bfc_chunk* const c = mapped_fit(st, stream, best, rounded);
  carve(st, stream, c, rounded, bytes);
  if (map_chunk(st, stream, c)) [[likely]] {
    return {c->addr, rounded};
  }
  uncarve(st, stream, c);
  return {};  // out of memory: the caller releases the cache and asks once more
}

bfc_chunk* bfc_allocator::mapped_fit(state& st, stream_view stream, bfc_chunk* best,
                                     std::size_t rounded) noexcept {
  const detail::granule_map& g = *st.granules;
  std::size_t least = g.unmapped_bytes(best->addr, rounded);
  if (least == 0 || options_.mapped_fit_candidates == 0) [[likely]] {
    return best;
  }
  bfc_chunk* pick = best;
  bool at_top = false;
  // A place replaces the pick only when it maps strictly less: ties keep the smaller chunk, and
  // of one chunk its bottom (weighed first).
  const auto weigh = [&](bfc_chunk* c, bool top) {
    const std::size_t unmapped =
        g.unmapped_bytes(top ? c->addr + c->size - rounded : c->addr, rounded);
    if (unmapped < least) {
      least = unmapped;
      pick = c;
      at_top = top;
    }
  };
  const detail::bfc_free_index& ix = st.index[index_of(best->pool)];
  bfc_chunk* c = best;
  for (std::size_t k = 0;; ++k) {
    if (c->size > rounded) {
      weigh(c, true);
    }
    if (least == 0 || k == options_.mapped_fit_candidates) {
      break;
    }
    c = ix.next_larger(c);
    if (c == nullptr) {
      break;
    }
    weigh(c, false);
  }
  return at_top ? split_top(st, stream, pick, rounded) : pick;
}

bfc_chunk* bfc_allocator::split_top(state& st, stream_view stream, bfc_chunk* c,
                                    std::size_t bytes) noexcept {
  st.remove_free(c);  // it may cover its segment; its two parts do not
  bfc_chunk* top = st.nodes.take_unset();
  top->addr = c->addr + c->size - bytes;
  top->size = bytes;
  top->requested = 0;
  top->prev = c;
  top->next = c->next;
  top->pool = c->pool;
  top->is_free = true;
  top->prev_free = true;              // c, below it
  top->next_free = false;             // the chunk above c is live (free chunks never touch)
  st.or_nobody(c->next)->prev = top;  // (its prev_free stays true: top is free)
  c->next = top;
  c->next_free = true;
  c->size -= bytes;
  st.add_free_part(c);
  st.add_free_part(top);
  if (hooks::active()) [[unlikely]] {
    emit_split(stream, top->addr, bytes, c->addr, c->size);  // the top is the part taken
  }
  return top;
}

void bfc_allocator::release_granules(state& st, const bfc_chunk* c) noexcept {
  st.granules->release(c->addr, c->size);
  if (++st.frees_in_bucket >= options_.unmap_window_frees) {
    st.live_peak_before = st.live_peak_now;
    st.live_peak_now = st.live_bytes - c->size;  // the live bytes once c is free
    st.frees_in_bucket = 0;
  }
}

std::pair<std::size_t, std::size_t> bfc_allocator::unmap_marks(const state& st) const noexcept {
  const std::size_t ref = options_.unmap_window_frees == 0
                              ? st.live_bytes
                              : std::max(st.live_peak_now, st.live_peak_before);
  // The floor in granules keeps a small pool (a few granules live) from unmapping the granule a
  // pair of requests keeps returning to.
  const std::size_t floor = options_.keep_mapped_granules * st.granules->granularity();
  const auto above = [&](double fraction) {
    const auto part = static_cast<std::size_t>(static_cast<double>(ref) * fraction);
    return ref + std::max(floor, part);
  };
  return {above(options_.unmap_high_fraction), above(options_.unmap_low_fraction)};
}

void bfc_allocator::trim_to_marks(state& st, stream_view stream, std::size_t need) noexcept {
  detail::granule_map& g = *st.granules;
  const auto [high, low] = unmap_marks(st);
  if (g.mapped() + need <= high || g.mapped_free() == 0) [[likely]] {
    return;
  }
  // The largest free chunks first (best fit takes them last), from both pools.
  std::size_t want = g.mapped() + need - low;
  const auto unmap_run = [&](char* p, std::size_t n) { upstream_unmap(*vm_, stream, p, n); };
  for (std::size_t cls = detail::bfc_free_index::class_count; cls-- > 0 && want != 0;) {
    for (const detail::bfc_free_index& ix : st.index) {
      if (!ix.marked(cls)) {
        continue;
      }
      for (bfc_chunk* c = ix.tail(cls); c != nullptr && want != 0; c = ix.prev_in_class(c)) {
        const std::size_t done = g.unmap_free(c->addr, c->size, want, unmap_run);
        want -= std::min(want, done);
      }
    }
    if (g.mapped_free() == 0) {
      return;
    }
  }
}

void bfc_allocator::uncarve(state& st, stream_view stream, bfc_chunk* c) noexcept {
  st.live.erase(c->addr);
  free_chunk(st, stream, c);
}

void* bfc_allocator::acquire_range(stream_view stream, std::size_t bytes) {
  if (vm_ == nullptr) {
    return upstream_allocate(stream, bytes);
  }
  return vm_->reserve(bytes);
}

std::size_t bfc_allocator::release_range(stream_view stream, void* base,
                                         std::size_t bytes) noexcept {
  if (vm_ == nullptr) {
    upstream_deallocate(stream, base, bytes);
    return bytes;
  }
  std::size_t unmapped = 0;
  {
    std::lock_guard lock(state_->mutex);
    unmapped = state_->granules->release_free(
        static_cast<char*>(base), bytes,
        [&](char* p, std::size_t n) { upstream_unmap(*vm_, stream, p, n); });
  }
  vm_->unreserve(base, bytes);
  return unmapped;
}

std::size_t bfc_allocator::release_mapped_free(state& st) noexcept {
  std::size_t unmapped = 0;
  for (const bfc_segment* head : st.segments) {
    for (const bfc_segment* s = head; s != nullptr && st.granules->mapped_free() != 0;
         s = s->next) {
      unmapped += st.granules->release_free(s->base, s->size, [&](char* p, std::size_t n) {
        upstream_unmap(*vm_, stream_view{}, p, n);
      });
    }
  }
  return unmapped;
}

// Mapped bytes no live chunk holds are the cache: they lie in free chunks (the ends of granules
// shared with live chunks, and granules kept mapped), and a block is cached when it is mapped.
void bfc_allocator::mapped_cache_stats(const state& st, allocator_stats& s) const {
  const detail::granule_map& g = *st.granules;
  s.cached_bytes = g.mapped() - st.live_bytes;
  s.cached_blocks = 0;
  s.largest_free_block = 0;
  for (const bfc_segment* head : st.segments) {
    for (const bfc_segment* seg = head; seg != nullptr; seg = seg->next) {
      for (const bfc_chunk* c = seg->first; c != nullptr; c = c->next) {
        if (!c->is_free) {
          continue;
        }
        const std::size_t piece = g.longest_mapped_piece(c->addr, c->size);
        s.cached_blocks += piece != 0 ? 1 : 0;
        s.largest_free_block = std::max(s.largest_free_block, piece);
      }
    }
  }
  s.virtual_bytes = st.reserved;
  s.mapped_free_bytes = g.mapped_free();
  s.maps = g.maps();
  s.unmaps = g.unmaps();
}

// A large request that found no fit: the large segment acquired or grown last grows by the
// request (rounded to the granule) when the addresses after it are free, its top chunk taking
// them, so that free space at its end and the new space make one chunk and the large pool stays
// one range. {} when it cannot (another range follows it, or there is none).
block bfc_allocator::grow_in_place(stream_view stream, std::size_t rounded, std::size_t bytes) {
  state& st = *state_;
  std::lock_guard lock(st.mutex);
  bfc_segment* const seg = st.growing;
  if (seg == nullptr) {
    return {};
  }
  bfc_chunk* top = seg->first;
  while (top->next != nullptr) {
    top = top->next;
  }
  const std::size_t have = top->is_free ? top->size : 0;
  const std::size_t grow = round_up(rounded - std::min(rounded, have), vm_->granularity());
  st.nodes.reserve(2);  // the chunk the growth adds (when the top is live), and carve's remainder
  st.live.reserve_one();
  if (grow == 0 || !vm_->extend(seg->base + seg->size, grow)) {
    return {};
  }
  if (top->is_free) {
    st.remove_free(top);
    top->size += grow;
    st.add_free(top);
  } else {
    bfc_chunk* c = st.nodes.take();
    c->addr = seg->base + seg->size;
    c->size = grow;
    c->prev = top;
    c->pool = seg->pool;
    c->is_free = true;
    top->next = c;
    top->next_free = true;
    st.add_free_part(c);
    top = c;
  }
  seg->size += grow;
  st.reserved += grow;
  st.pool_reserved[index_of(seg->pool)] += grow;
  carve(st, stream, top, rounded, bytes);
  if (!map_chunk(st, stream, top)) {
    uncarve(st, stream, top);
    return {};
  }
  return {top->addr, rounded};
}

}  // namespace poolscope::pool
