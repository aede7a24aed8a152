// The per-thread cache in front of an allocator (thread_cache_adaptor.hpp, docs/thread_cache.md).
//
// A block the adaptor hands out is recorded in the calling thread's cache table when that
// thread may cache it at its free (a size it keeps a bin for, or one it asked for twice lately:
// the `wanted` ring); every other block is the inner allocator's alone. A recorded block's free
// by its thread is cached in a bin keyed by (stream, rounded size), from which the same thread's
// next request of that key takes it. A free the calling thread's table does not know looks in
// the other threads' tables (only those whose address filter counts it), then goes to the inner
// allocator. So every block is freed by exactly one of: one thread's table, the inner allocator.
#include "poolscope/pool/thread_cache_adaptor.hpp"

#include <algorithm>
#include <mutex>
#include <string>

#include "detail/thread_cache.hpp"
#include "detail/thread_registry.hpp"
#include "poolscope/error.hpp"

namespace poolscope::pool {

using detail::tc_entry;
using detail::thread_cache;

namespace {

allocator& checked_inner(const std::unique_ptr<allocator>& inner) {
  if (inner == nullptr) {
    throw invalid_argument("poolscope: thread_cache_adaptor given no inner allocator (null)");
  }
  return *inner;
}

thread_cache_adaptor_options checked_options(thread_cache_adaptor_options o,
                                             const std::string& name) {
  if (o.max_blocks > thread_cache::most_blocks) {
    throw invalid_argument("poolscope: thread_cache_adaptor_options::max_blocks " +
                           std::to_string(o.max_blocks) + " given to " + name +
                           " exceeds the most a thread cache can hold, " +
                           std::to_string(thread_cache::most_blocks));
  }
  return o;
}

/// Whether the calling thread holds `c` (under the registry's mutex, which guards `holder`).
bool held_here(const thread_cache& c) noexcept {
  return c.holder == std::this_thread::get_id();
}

/// What a free of `bytes` says of the live block `rec`: any size with the block's rounding (a
/// power of two) is right, as for the inner allocator; the free reports the size of the
/// allocation it ends.
free_outcome outcome_of(const tc_entry& rec, std::size_t bytes, std::size_t granularity) noexcept {
  const bool size_ok =
      bytes <= rec.rounded && ((bytes + granularity - 1) & ~(granularity - 1)) == rec.rounded;
  return {size_ok ? hooks::free_error::none : hooks::free_error::size_mismatch, rec.rounded,
          rec.requested};
}

}  // namespace

/// The adaptor's side of its registry: makes caches, and retires them when their threads exit.
class thread_cache_adaptor::caches final : public detail::thread_node_owner {
 public:
  explicit caches(thread_cache_adaptor& self) noexcept : self_(self) {}

 private:
  [[nodiscard]] std::unique_ptr<detail::thread_node> make_node() override {
    return std::make_unique<thread_cache>(self_.options_.owner_bias);
  }
  void retire(detail::thread_node& node) noexcept override {
    self_.retire(static_cast<thread_cache&>(node));
  }

  thread_cache_adaptor& self_;
};

thread_cache_adaptor::thread_cache_adaptor(std::unique_ptr<allocator> inner,
                                           thread_cache_adaptor_options options)
    : allocator(checked_inner(inner).upstream(), checked_inner(inner).name()),
      inner_(std::move(inner)),
      options_(checked_options(options, inner_->name())),
      granularity_(inner_->size_granularity()),
      max_block_(options_.max_blocks == 0 ? 0
                                          : std::min(options_.max_block_bytes, options_.max_bytes)),
      caches_(std::make_unique<caches>(*this)),
      registry_(std::make_shared<detail::thread_registry>(*caches_)),
      cache_key_(registry_->key()) {
  set_size_granularity(granularity_);
  adopt(*inner_, adopted_upstream::shared);
}

thread_cache_adaptor::~thread_cache_adaptor() {
  // Cached blocks go back to the inner allocator (still here: destroyed after this body); live
  // records are forgotten (their blocks stay the inner allocator's, which frees everything).
  registry_->close([this](detail::thread_node& node) {
    auto& c = static_cast<thread_cache&>(node);
    detail::biased_guard lock(c.lock, held_here(c));
    (void)flush_locked(c);
    c.table_clear();
  });
}

// ---- requests -------------------------------------------------------------------------------

// A request no cache serves: the inner allocator's strategy. Its refusal ({nullptr, 0}: upstream
// exhausted) is this allocator's: the base class then flushes every cache, has the inner
// allocator release what became free, and asks once more.
[[gnu::always_inline]] inline block thread_cache_adaptor::forward(stream_view stream,
                                                                  std::size_t bytes,
                                                                  std::size_t alignment) {
  return strategy_allocate(*inner_, stream, bytes, alignment);
}

// Every way out is a tail call: a resting cache costs the thread's table lookup and one test.
block thread_cache_adaptor::do_allocate(stream_view stream, std::size_t bytes,
                                        std::size_t alignment) {
  const detail::thread_slot& slot = detail::thread_registry::slot(cache_key_);
  if (slot.key != cache_key_) [[unlikely]] {
    return serve_unslotted(stream, bytes, alignment);
  }
  auto& c = *static_cast<thread_cache*>(slot.node);
  if (c.skip_resting()) {
    return forward(stream, bytes, alignment);
  }
  return serve(c, stream, bytes, alignment);
}

// A request from a thread whose table does not hold its cache: claimed (made, or taken over),
// then served as any; without one (no host memory, or the thread's exit has begun), forwarded.
block thread_cache_adaptor::serve_unslotted(stream_view stream, std::size_t bytes,
                                            std::size_t alignment) {
  auto* const c = static_cast<thread_cache*>(registry_->claim());
  if (c == nullptr || c->skip_resting()) {
    return forward(stream, bytes, alignment);
  }
  return serve(*c, stream, bytes, alignment);
}

// A request this thread's cache looks at (it does not rest): a hit, or a miss.
block thread_cache_adaptor::serve(thread_cache& c, stream_view stream, std::size_t bytes,
                                  std::size_t alignment) {
  if (++c.sampled == thread_cache::sample_takes) [[unlikely]] {
    judge(c);
  }
  const std::size_t r = rounded(bytes);
  // A miss known without the lock: a size too large to cache (never cached: the inner
  // allocator's alone), or one no bin holds and no recent request missed (most requests of a
  // random-size workload). One branch for both, each a coin toss on random sizes; the ring is
  // this thread's own, and add_wanted keeps a large size out of it without a branch.
  const bool cacheable = r <= max_block_;
  if (!cacheable | c.surely_passes(r)) {
    c.add_wanted(r, stream.value(), cacheable);
    return forward(stream, bytes, alignment);
  }
  std::size_t i = thread_cache::bin_count;
  {
    detail::owner_guard lock(c.lock);
    i = c.find_bin(r, stream.value());
    if (i != thread_cache::bin_count && c.bins[i].count != 0) {
      ++c.sample_hits;
      return {c.pop(i, bytes), r};
    }
  }
  return serve_miss(c, stream, bytes, alignment, r, i != thread_cache::bin_count);
}

// A miss of a size this thread's cache may hold (`has_bin`: it keeps a bin of it): the inner
// allocator's block, recorded if the thread may cache it when it frees it: a size with a bin
// here, or one a recent request missed (so asked for twice lately). Any other block stays the
// inner allocator's alone, and its free costs a filter test here more than without a cache.
block thread_cache_adaptor::serve_miss(thread_cache& c, stream_view stream, std::size_t bytes,
                                       std::size_t alignment, std::size_t r, bool has_bin) {
  bool record = has_bin || c.is_wanted(r, stream.value());  // the ring is this thread's own
  c.add_wanted(r, stream.value());
  if (record) {
    detail::owner_guard lock(c.lock);
    try {
      c.table.reserve_one();  // so that recording the inner allocator's block cannot fail
    } catch (const std::bad_alloc&) {
      record = false;
    }
  }
  // The inner allocator works without this cache's lock held: a refusal leads to a flush of
  // every cache, this one included.
  const block b = forward(stream, bytes, alignment);
  if (record && b.ptr != nullptr) {
    detail::owner_guard lock(c.lock);
    c.table_insert(
        {reinterpret_cast<std::uintptr_t>(b.ptr), b.rounded, bytes, bytes, stream.value(), false});
  }
  return b;
}

void thread_cache_adaptor::judge(thread_cache& c) noexcept {
  if (c.sample_hits < thread_cache::min_sample_hits) {
    // Too few hits to pay for the misses: rest, and give the inner allocator the blocks held
    // idle here (it may merge them). Live blocks recorded here are still found at their frees.
    c.resting = c.next_rest;
    c.next_rest = std::min(2 * c.next_rest, thread_cache::max_resting_takes);
    ++c.rests;
    detail::owner_guard lock(c.lock);
    (void)flush_locked(c);
  } else {
    c.next_rest = thread_cache::resting_takes;
  }
  c.sampled = 0;
  c.sample_hits = 0;
}

// ---- frees ----------------------------------------------------------------------------------

// A free from the thread whose cache is `c` (null: none): this thread's cache, if its filter
// counts the block (most frees of a random-size workload are of blocks no cache recorded); the
// other threads' caches, if there are any (none while one thread uses the adaptor); else the
// inner allocator. Every way out is a tail call.
[[gnu::always_inline]] inline free_outcome thread_cache_adaptor::free_with(
    thread_cache* c, stream_view stream, void* ptr, std::size_t bytes,
    std::size_t alignment) noexcept {
  if (c != nullptr && c->may_hold(ptr)) {
    return free_cached(*c, stream, ptr, bytes, alignment);
  }
  const detail::thread_node* const first = registry_->first();
  if (first != c || (c != nullptr && c->next != nullptr)) {
    return free_elsewhere(c, stream, ptr, bytes, alignment);
  }
  return strategy_deallocate(*inner_, stream, ptr, bytes, alignment);
}

free_outcome thread_cache_adaptor::do_deallocate(stream_view stream, void* ptr, std::size_t bytes,
                                                 std::size_t alignment) noexcept {
  const detail::thread_slot& slot = detail::thread_registry::slot(cache_key_);
  if (slot.key != cache_key_) [[unlikely]] {
    return free_unslotted(stream, ptr, bytes, alignment);
  }
  return free_with(static_cast<thread_cache*>(slot.node), stream, ptr, bytes, alignment);
}

// A free from a thread whose table does not hold its cache: claimed first (or none).
free_outcome thread_cache_adaptor::free_unslotted(stream_view stream, void* ptr, std::size_t bytes,
                                                  std::size_t alignment) noexcept {
  return free_with(static_cast<thread_cache*>(registry_->claim()), stream, ptr, bytes, alignment);
}

// The free of a block this thread's cache may have recorded: cached, or handed to the inner
// allocator; a block it has no record of is looked for elsewhere.
free_outcome thread_cache_adaptor::free_cached(thread_cache& c, stream_view stream, void* ptr,
                                               std::size_t bytes, std::size_t alignment) noexcept {
  detail::owner_guard lock(c.lock);
  tc_entry* const e = c.table.find(ptr);
  if (e == nullptr) {
    lock.unlock();
    return free_elsewhere(&c, stream, ptr, bytes, alignment);
  }
  if (e->cached) {
    return {hooks::free_error::double_free, 0, 0};
  }
  const tc_entry rec = *e;
  const free_outcome out = outcome_of(rec, bytes, granularity_);
  if (rec.stream == stream.value() && c.resting == 0) {
    // The common case inline: the size's bin has room within the bounds (nothing evicted).
    const std::size_t bin = c.find_bin(rec.rounded, rec.stream);
    if (c.room_in(bin, rec.rounded, options_.max_bytes, options_.max_blocks)) {
      c.push(bin, e, ptr, rec.rounded);
      return out;
    }
    if (cache_locked(c, ptr, rec.rounded, rec.stream, bin)) {
      return out;
    }
  }
  c.table_erase(c.table.find(ptr));  // found again: an eviction may have moved the entry
  lock.unlock();
  (void)strategy_deallocate(*inner_, stream, ptr, rec.inner_bytes, alignment);
  return out;
}

// The free of a block another thread's cache may have recorded (a live block handed between
// threads, a cached one freed twice, or a block of a thread that has exited): its record goes,
// and the block to the inner allocator. A block no other cache recorded is the inner
// allocator's, which validates the free.
free_outcome thread_cache_adaptor::free_elsewhere(const thread_cache* own, stream_view stream,
                                                  void* ptr, std::size_t bytes,
                                                  std::size_t alignment) noexcept {
  for (detail::thread_node* n = registry_->first(); n != nullptr; n = n->next) {
    auto* const c = static_cast<thread_cache*>(n);
    if (c == own || !c->may_hold(ptr)) {
      continue;  // not recorded there: its holder keeps its lock's bias
    }
    std::unique_lock lock(c->lock);
    tc_entry* const e = c->table.find(ptr);
    if (e == nullptr) {
      continue;
    }
    if (e->cached) {
      return {hooks::free_error::double_free, 0, 0};
    }
    const tc_entry rec = *e;
    c->table_erase(e);
    lock.unlock();
    (void)strategy_deallocate(*inner_, stream, ptr, rec.inner_bytes, alignment);
    return outcome_of(rec, bytes, granularity_);
  }
  return strategy_deallocate(*inner_, stream, ptr, bytes, alignment);
}

// Caches the freed block `ptr` (recorded here, of stream `stream`) in a bin, evicting other sizes
// if the bounds need it, or says no. `target` is the bin of its size (thread_cache::find_bin;
// bin_count: none).
bool thread_cache_adaptor::cache_locked(thread_cache& c, void* ptr, std::size_t r, void* stream,
                                        std::size_t target) noexcept {
  constexpr std::size_t none = thread_cache::bin_count;
  if (target == none && !c.is_wanted(r, stream)) {
    return false;  // no bin for it and no recent request missed it: the inner allocator's
  }
  if (target != none && c.bins[target].count == detail::tc_bin::capacity) {
    return false;  // this size is cached deep enough already
  }
  std::size_t empty = none;
  if (target == none) {
    for (std::size_t i = 0; i < thread_cache::bin_count; ++i) {
      if (c.bins[i].count == 0) {
        empty = i;
        break;
      }
    }
  }
  // Room: the least recently used other sizes go back to the inner allocator first.
  auto lru_other = [&c, &target]() {
    std::size_t lru = none;
    for (std::size_t i = 0; i < thread_cache::bin_count; ++i) {
      const detail::tc_bin& b = c.bins[i];
      if (i != target && b.count != 0 && (lru == none || b.last_use < c.bins[lru].last_use)) {
        lru = i;
      }
    }
    return lru;
  };
  if (target == none && empty == none) {
    empty = lru_other();
    evict_bin_locked(c, empty);
  }
  while (c.cached_bytes + r > options_.max_bytes || c.cached_blocks + 1 > options_.max_blocks) {
    const std::size_t lru = lru_other();
    if (lru == none) {
      return false;  // only this size is cached: keep what is there
    }
    evict_bin_locked(c, lru);
  }
  if (target == none) {
    target = empty;
    c.bins[target].rounded = r;
    c.bins[target].stream = stream;
    c.rekey_bins();
  }
  c.push(target, c.table.find(ptr), ptr, r);  // found again: evictions move entries
  return true;
}

void thread_cache_adaptor::evict_bin_locked(thread_cache& c, std::size_t index) noexcept {
  detail::tc_bin& bin = c.bins[index];
  for (std::uint32_t i = 0; i < bin.count; ++i) {
    tc_entry* const e = c.table.find(bin.blocks[i]);
    const std::size_t inner_bytes = e->inner_bytes;
    c.table_erase(e);
    (void)strategy_deallocate(*inner_, stream_view{bin.stream}, bin.blocks[i], inner_bytes,
                              max_alignment);
  }
  c.cached_bytes -= bin.rounded * bin.count;
  c.cached_blocks -= bin.count;
  bin.count = 0;
}

std::size_t thread_cache_adaptor::flush_locked(thread_cache& c) noexcept {
  const std::size_t moved = c.cached_bytes;
  for (std::size_t i = 0; i < thread_cache::bin_count; ++i) {
    if (c.bins[i].count != 0) {
      evict_bin_locked(c, i);
    }
  }
  return moved;
}

// ---- flushes, thread exit, stats ------------------------------------------------------------

std::size_t thread_cache_adaptor::flush() noexcept {
  std::size_t moved = 0;
  registry_->for_each([this, &moved](detail::thread_node& node) {
    auto& c = static_cast<thread_cache&>(node);
    // An empty cache is skipped without its lock (so its holder keeps the lock's bias): a block
    // cached before this call, in any thread that call happens after, shows in the count.
    if (c.cached_blocks == 0) {
      return;
    }
    detail::biased_guard lock(c.lock, held_here(c));
    moved += flush_locked(c);
  });
  return moved;
}

std::size_t thread_cache_adaptor::do_release_cached() {
  // Every thread's cached blocks first, so that they can be released too. An inner allocator
  // that caches nothing (naive) releases them as they come back: the bytes released are what
  // left the reserved count meanwhile (exact unless other threads change it at the same time).
  const std::size_t before = reserved_bytes();
  (void)flush();
  const std::size_t released = strategy_release_cached(*inner_);
  const std::size_t after = reserved_bytes();
  return std::max(released, before > after ? before - after : 0);
}

void thread_cache_adaptor::retire(thread_cache& c) noexcept {
  // Under the registry's mutex, on the exiting thread that holds `c`. Its cached blocks go back;
  // its live records stay, for the frees of its blocks from other threads (and for whichever
  // thread takes the cache over).
  detail::owner_guard lock(c.lock);
  (void)flush_locked(c);
}

std::size_t thread_cache_adaptor::do_cached_bytes_other_streams(stream_view stream) const {
  return strategy_cached_bytes_other_streams(*inner_, stream);
}

void thread_cache_adaptor::do_cache_stats(allocator_stats& s) const {
  strategy_cache_stats(*inner_, s);
  // Blocks in the caches are in use for the inner allocator, cached for this one.
  registry_->for_each([&s](detail::thread_node& node) {
    auto& c = static_cast<thread_cache&>(node);
    if (c.cached_blocks == 0) {
      return;  // nothing to add; its holder keeps the lock's bias (see flush)
    }
    detail::biased_guard lock(c.lock, held_here(c));
    s.cached_blocks += c.cached_blocks;
    s.cached_bytes += c.cached_bytes;
    for (const detail::tc_bin& b : c.bins) {
      if (b.count != 0) {
        s.largest_free_block = std::max(s.largest_free_block, b.rounded);
      }
    }
  });
}

thread_cache_counters thread_cache_adaptor::counts() const {
  thread_cache_counters n;
  registry_->for_each([&n](detail::thread_node& node) {
    const auto& c = static_cast<const thread_cache&>(node);
    n.caches += c.held ? 1 : 0;
    n.revocations += c.lock.revocations();
    n.rests += c.rests;
    n.resting += c.resting != 0 ? 1 : 0;
  });
  return n;
}

}  // namespace poolscope::pool
