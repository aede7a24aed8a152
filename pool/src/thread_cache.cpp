// The per-thread cache in front of a pool strategy (allocator.hpp, docs/thread_cache.md).
//
// A block a thread allocates through an allocator with a cache is recorded in that thread's
// cache table (live) when the thread may cache it at its free: a size it has a bin for, or one
// it asked for twice lately (the `wanted` ring); the strategy marks such a block held. So the
// thread's own free finds it without the strategy's lock or table; a freed block of a cacheable
// size stays in the table (cached) and in a bin keyed by (stream, rounded size), from which the
// same thread's next request of that key takes it. Every other block is the strategy's alone,
// as without a cache. A free that the thread's own table does not know goes to the strategy,
// which frees its own blocks, reports invalid pointers, and answers `held` for a block another
// thread's cache recorded; that free then looks in the registry: the orphans (blocks of exited
// threads), then every thread's table under its lock. So a live block is freed by exactly one
// of: one thread's table, the orphans, the strategy.
#include "detail/thread_cache.hpp"

#include <algorithm>
#include <string>

#include "detail/log_fixed.hpp"
#include "poolscope/error.hpp"
#include "poolscope/log.hpp"

namespace poolscope::pool {
namespace detail {

/// Lets the thread-exit code retire a cache through its allocator.
struct thread_cache_access {
  static void retire(allocator& a, thread_cache& c) noexcept { a.tc_retire(c); }
};

// initial-exec (as declared): read inline on every cached operation, not through
// __tls_get_addr (a call per access in a shared library). 17 bytes of the static TLS block,
// which glibc keeps a surplus of for libraries loaded later, as the plug-in is (by PyTorch or
// CuPy).
constinit thread_local last_cache t_last;
constinit thread_local bool t_exited = false;

namespace {

/// The calling thread's caches, one per allocator it allocated from; retired at thread exit.
struct thread_caches {
  std::vector<thread_cache*> caches;

  thread_caches() = default;
  thread_caches(const thread_caches&) = delete;
  thread_caches& operator=(const thread_caches&) = delete;
  ~thread_caches() {
    t_exited = true;
    t_last = {};
    for (thread_cache* c : caches) {
      {
        std::lock_guard lock(c->registry->mutex);
        if (c->registry->owner != nullptr) {
          thread_cache_access::retire(*c->registry->owner, *c);
        }
      }
      delete c;
    }
    caches.clear();
  }
};
thread_local thread_caches t_caches;

}  // namespace
}  // namespace detail

using detail::tc_entry;
using detail::thread_cache;
using detail::thread_cache_registry;

void allocator::enable_thread_cache(const thread_cache_options& options, std::size_t granularity) {
  if (!options.enabled) {
    return;
  }
  constexpr std::size_t most_blocks = thread_cache::bin_count * detail::tc_bin::capacity;
  if (options.max_blocks > most_blocks) {
    throw invalid_argument("poolscope: thread_cache_options::max_blocks " +
                           std::to_string(options.max_blocks) + " given to " + name_ +
                           " exceeds the most a thread cache can hold, " +
                           std::to_string(most_blocks));
  }
  if (options.max_blocks == 0 || options.max_bytes == 0 || options.max_block_bytes == 0) {
    return;  // a cache that may hold nothing is no cache
  }
  tc_ = std::make_shared<thread_cache_registry>(this, options);
  tc_granularity_ = granularity;
  tc_max_block_ = std::min(options.max_block_bytes, options.max_bytes);
}

void allocator::disable_thread_cache() noexcept {
  if (tc_ == nullptr) {
    return;
  }
  {
    std::lock_guard lock(tc_->mutex);
    for (thread_cache* c : tc_->caches) {
      std::lock_guard cl(c->lock);
      tc_fold_locked(*c);  // the cached blocks' memory stays the strategy's: it frees it
      c->dead = true;
      c->table_clear();
      c->bins = {};
      c->rekey_bins();
      c->cached_bytes = 0;
      c->cached_blocks = 0;
    }
    tc_->caches.clear();
    tc_->orphans.clear();
    tc_->owner = nullptr;
  }
  tc_.reset();
}

thread_cache* allocator::tc_local() {
  if (detail::t_exited) {
    return nullptr;  // called from a thread-exit destructor after the caches were retired
  }
  auto& mine = detail::t_caches.caches;
  for (thread_cache* c : mine) {
    if (c->allocator_id == id_) {
      detail::t_last = {id_, c};
      return c;
    }
  }
  // A new cache. First free the caches of allocators destroyed since (their ids never recur).
  std::erase_if(mine, [](thread_cache* c) {
    bool dead = false;
    {
      detail::owner_guard lock(c->lock);  // this thread's own caches
      dead = c->dead;
    }
    if (dead) {
      delete c;
    }
    return dead;
  });
  auto c = std::make_unique<thread_cache>(tc_, id_, tc_->options.owner_bias);
  mine.reserve(mine.size() + 1);
  {
    std::lock_guard lock(tc_->mutex);
    tc_->caches.push_back(c.get());
  }
  mine.push_back(c.get());
  detail::t_last = {id_, c.get()};
  return c.release();
}

block allocator::tc_take(stream_view stream, std::size_t bytes, thread_cache*& cache,
                         bool& record) {
  // `cache`: the thread's last-used cache if it is this allocator's (the caller found it not
  // resting), else null; on return, the thread's cache (null without one).
  thread_cache* c = cache;
  if (c == nullptr) [[unlikely]] {
    try {
      c = tc_local();
    } catch (const std::bad_alloc&) {
      c = nullptr;  // no host memory for a cache: this block bypasses it
    }
    cache = c;
    if (c == nullptr || c->skip_resting()) {
      return {};
    }
  }
  if (++c->sampled == thread_cache::sample_takes) [[unlikely]] {
    tc_judge(*c);
  }
  const std::size_t rounded = (bytes + tc_granularity_ - 1) & ~(tc_granularity_ - 1);
  // A miss known without the lock: a size too large to cache (never cached: the strategy's
  // alone), or one no bin holds and no recent request missed (most requests of a random-size
  // workload). One branch for both, each a coin toss on random sizes; the ring is this
  // thread's own, and add_wanted keeps a large size out of it without a branch.
  const bool cacheable = rounded <= tc_max_block_;
  if (!cacheable | c->surely_passes(rounded)) {
    c->add_wanted(rounded, stream.value(), cacheable);
    return {};
  }
  detail::owner_guard lock(c->lock);
  const std::size_t i = c->find_bin(rounded, stream.value());
  if (i != thread_cache::bin_count && c->bins[i].count != 0) {
    detail::tc_bin& bin = c->bins[i];
    void* p = bin.blocks[--bin.count];
    bin.last_use = ++c->tick;
    ++c->sample_hits;
    c->cached_bytes -= rounded;
    --c->cached_blocks;
    tc_entry* e = c->table.find(p);
    e->cached = false;
    e->requested = bytes;
    // The block's shard share goes from cached (-rounded, -rounded) to live (0,
    // -(rounded - bytes)).
    detail::shard_add(c->d_in_use, rounded);
    detail::shard_add(c->d_requested, bytes);
    detail::shard_add(c->allocations, 1);
    tc_raise_peaks(*c);
    return {p, rounded};
  }
  // The strategy's block is recorded here only if this thread may cache it when it frees it:
  // a size with a bin here, or one a recent request missed (so asked for twice lately). Any
  // other block stays the strategy's alone, and its free costs one lookup here more than
  // without a cache; a random-size workload pays no more.
  const bool may_cache = i != thread_cache::bin_count || c->is_wanted(rounded, stream.value());
  c->add_wanted(rounded, stream.value());
  if (may_cache) {
    try {
      c->table.reserve_one();  // so that recording the strategy's block cannot fail
      record = true;
    } catch (const std::bad_alloc&) {
      record = false;
    }
  }
  return {};
}

void allocator::tc_judge(thread_cache& c) noexcept {
  if (c.sample_hits < thread_cache::min_sample_hits) {
    // Too few hits to pay for the misses: rest, and give the strategy the blocks held idle
    // here (it may merge them). Live blocks recorded here are still found at their frees.
    c.resting = c.next_rest;
    c.next_rest = std::min(2 * c.next_rest, thread_cache::max_resting_takes);
    ++c.rests;
    detail::owner_guard lock(c.lock);
    (void)tc_flush_locked(c);
  } else {
    c.next_rest = thread_cache::resting_takes;
  }
  c.sampled = 0;
  c.sample_hits = 0;
}

void allocator::tc_record(thread_cache* c, stream_view stream, const block& b,
                          std::size_t bytes) noexcept {
  detail::owner_guard lock(c->lock);
  c->table_insert(
      {reinterpret_cast<std::uintptr_t>(b.ptr), b.rounded, bytes, stream.value(), false});
  // The shared counters take the block at its rounded size, the shard the rest of its share;
  // raised first, so the sum never passes below the total.
  in_use_.fetch_add(b.rounded, std::memory_order_relaxed);
  requested_in_use_.fetch_add(b.rounded, std::memory_order_relaxed);
  detail::shard_add(c->d_requested, -static_cast<std::int64_t>(b.rounded - bytes));
  detail::shard_add(c->allocations, 1);
  tc_raise_peaks(*c);
}

void allocator::tc_fold_locked(thread_cache& c) noexcept {
  // Moves the shard into the shared counters (the cache's lock is held). Its blocks then count
  // as blocks of the strategy's: live ones at (rounded, requested).
  const std::int64_t du = c.d_in_use.load(std::memory_order_relaxed);
  const std::int64_t dq = c.d_requested.load(std::memory_order_relaxed);
  in_use_.fetch_add(static_cast<std::size_t>(du), std::memory_order_relaxed);  // wraps: du <= 0
  requested_in_use_.fetch_add(static_cast<std::size_t>(dq), std::memory_order_relaxed);
  allocations_.fetch_add(c.allocations.load(std::memory_order_relaxed), std::memory_order_relaxed);
  deallocations_.fetch_add(c.deallocations.load(std::memory_order_relaxed),
                           std::memory_order_relaxed);
  c.d_in_use.store(0, std::memory_order_relaxed);
  c.d_requested.store(0, std::memory_order_relaxed);
  c.allocations.store(0, std::memory_order_relaxed);
  c.deallocations.store(0, std::memory_order_relaxed);
}

allocator::shard_sums allocator::tc_shard_sums() const {
  shard_sums sums;
  std::lock_guard lock(tc_->mutex);
  for (const thread_cache* c : tc_->caches) {
    sums.in_use += c->d_in_use.load(std::memory_order_relaxed);
    sums.requested += c->d_requested.load(std::memory_order_relaxed);
    sums.allocations += c->allocations.load(std::memory_order_relaxed);
    sums.deallocations += c->deallocations.load(std::memory_order_relaxed);
  }
  return sums;
}

std::int64_t allocator::tc_own_in_use_delta() const noexcept {
  if (detail::t_last.allocator_id == id_ && detail::t_last.cache != nullptr) {
    return detail::t_last.cache->d_in_use.load(std::memory_order_relaxed);
  }
  return 0;
}

bool allocator::tc_give(thread_cache* c, stream_view stream, void* ptr, std::size_t bytes,
                        free_outcome& out) noexcept {
  // `c`: the thread's last-used cache if it is this allocator's and its address filter counts
  // `ptr` (the caller checked), else null: looked up here. may_hold: a block this thread never
  // recorded (most, on random sizes) skips the lock.
  if (c == nullptr) {
    if (!detail::t_exited) {
      for (thread_cache* mine : detail::t_caches.caches) {
        if (mine->allocator_id == id_) {
          c = mine;
          detail::t_last = {id_, c};
          break;
        }
      }
    }
    if (c == nullptr || !c->may_hold(ptr)) {
      return false;
    }
  }
  {
    detail::owner_guard lock(c->lock);
    if (tc_entry* e = c->table.find(ptr)) {
      if (e->cached) {
        out = {hooks::free_error::double_free, 0, 0};
        return true;
      }
      const tc_entry rec = *e;
      const bool size_ok = do_size_matches(bytes, rec.requested, rec.rounded);
      out = {size_ok ? hooks::free_error::none : hooks::free_error::size_mismatch, rec.rounded,
             rec.requested};
      detail::shard_add(c->deallocations, 1);
      bool cached = false;
      if (rec.rounded <= tc_max_block_ && rec.stream == stream.value() && c->resting == 0) {
        // The common case inline: the size's bin has room within the bounds (nothing evicted).
        const std::size_t bin = c->find_bin(rec.rounded, rec.stream);
        if (c->room_in(bin, rec.rounded, tc_->options.max_bytes, tc_->options.max_blocks)) {
          c->push(bin, e, ptr, rec.rounded);
          cached = true;
        } else {
          cached = tc_cache_locked(*c, e, ptr, rec.rounded, rec.stream, bin);
        }
      }
      if (cached) {
        // Live (0, -(rounded - requested)) to cached (-rounded, -rounded), under the lock a
        // request must take to reuse it.
        detail::shard_add(c->d_in_use, -static_cast<std::int64_t>(rec.rounded));
        detail::shard_add(c->d_requested, -static_cast<std::int64_t>(rec.requested));
        return true;
      }
      c->table_erase(e);  // tc_cache_locked found it again if an eviction moved it
      // The block leaves the cache's books: its shard share first (the sum only rises), then
      // the shared counters, before the strategy can hand it out again.
      detail::shard_add(c->d_requested, rec.rounded - rec.requested);
      in_use_.fetch_sub(rec.rounded, std::memory_order_relaxed);
      requested_in_use_.fetch_sub(rec.rounded, std::memory_order_relaxed);
      lock.unlock();
      do_reclaim(stream, ptr);
      return true;
    }
  }
  return false;  // not this thread's: the strategy's, or held by another cache (it says which)
}

bool allocator::tc_give_remote(stream_view stream, void* ptr, std::size_t bytes,
                               free_outcome& out) noexcept {
  thread_cache_registry& r = *tc_;
  tc_entry rec;
  {
    std::lock_guard lock(r.mutex);
    bool found = false;
    bool orphan = false;  // counted in the shared counters at (rounded, requested)
    if (!r.orphans.empty()) {
      auto it = r.orphans.find(ptr);
      if (it != r.orphans.end()) {
        rec = it->second;
        r.orphans.erase(it);
        found = true;
        orphan = true;
      }
    }
    for (auto it = r.caches.begin(); !found && it != r.caches.end(); ++it) {
      thread_cache* c = *it;
      if (!c->may_hold(ptr)) {
        continue;  // not recorded there: its owner keeps its lock's bias
      }
      std::lock_guard cl(c->lock);
      if (tc_entry* e = c->table.find(ptr)) {
        if (e->cached) {
          out = {hooks::free_error::double_free, 0, 0};
          return true;
        }
        rec = *e;
        c->table_erase(e);
        // Its share leaves that cache's shard (under its lock), then the shared counters.
        detail::shard_add(c->d_requested, rec.rounded - rec.requested);
        found = true;
      }
    }
    if (!found) {
      return false;  // the strategy's: it validates and reports
    }
    // Under the registry mutex: a flush in progress cannot be overtaken. The block is known to
    // nobody now but the strategy, which still counts it handed out. The shared counters only:
    // those under the strategy's lock are not this path's to write (count_under_lock).
    account_free_shared(rec.rounded, orphan ? rec.requested : rec.rounded);
  }
  const bool size_ok = do_size_matches(bytes, rec.requested, rec.rounded);
  out = {size_ok ? hooks::free_error::none : hooks::free_error::size_mismatch, rec.rounded,
         rec.requested};
  do_reclaim(stream, ptr);
  return true;
}

void allocator::tc_evict_bin_locked(thread_cache& c, std::size_t index) noexcept {
  detail::tc_bin& bin = c.bins[index];
  // The blocks leave the cache's books: their shard shares (-rounded each) first, then the
  // shared counters, before the strategy gets them back.
  const std::size_t bytes = bin.rounded * bin.count;
  detail::shard_add(c.d_in_use, bytes);
  detail::shard_add(c.d_requested, bytes);
  in_use_.fetch_sub(bytes, std::memory_order_relaxed);
  requested_in_use_.fetch_sub(bytes, std::memory_order_relaxed);
  for (std::uint32_t i = 0; i < bin.count; ++i) {
    c.table_erase(c.table.find(bin.blocks[i]));
    do_reclaim(stream_view{bin.stream}, bin.blocks[i]);
  }
  c.cached_bytes -= bytes;
  c.cached_blocks -= bin.count;
  bin.count = 0;
}

bool allocator::tc_cache_locked(thread_cache& c, tc_entry*& entry, void* ptr, std::size_t rounded,
                                void* stream, std::size_t target) noexcept {
  const thread_cache_options& o = tc_->options;
  // `target`: the bin of this size, perhaps emptied by hits (a size in use here), or none.
  if (target == thread_cache::bin_count && !c.is_wanted(rounded, stream)) {
    return false;  // no bin for it and no recent request missed it: the strategy may merge it
  }
  if (target != thread_cache::bin_count && c.bins[target].count == detail::tc_bin::capacity) {
    return false;  // this size is cached deep enough already
  }
  std::size_t empty = thread_cache::bin_count;
  if (target == thread_cache::bin_count) {
    for (std::size_t i = 0; i < thread_cache::bin_count; ++i) {
      if (c.bins[i].count == 0) {
        empty = i;
        break;
      }
    }
  }
  // Room: the least recently used other sizes go back to the strategy first.
  auto lru_other = [&c, &target]() {
    std::size_t lru = thread_cache::bin_count;
    for (std::size_t i = 0; i < thread_cache::bin_count; ++i) {
      const detail::tc_bin& b = c.bins[i];
      if (i != target && b.count != 0 &&
          (lru == thread_cache::bin_count || b.last_use < c.bins[lru].last_use)) {
        lru = i;
      }
    }
    return lru;
  };
  bool evicted = false;  // evictions erase table entries, which may move `entry`
  if (target == thread_cache::bin_count && empty == thread_cache::bin_count) {
    empty = lru_other();
    tc_evict_bin_locked(c, empty);
    evicted = true;
  }
  while (c.cached_bytes + rounded > o.max_bytes || c.cached_blocks + 1 > o.max_blocks) {
    const std::size_t lru = lru_other();
    if (lru == thread_cache::bin_count) {
      entry = evicted ? c.table.find(ptr) : entry;
      return false;  // only this size is cached: keep what is there
    }
    tc_evict_bin_locked(c, lru);
    evicted = true;
  }
  if (target == thread_cache::bin_count) {
    target = empty;
    c.bins[target].rounded = rounded;
    c.bins[target].stream = stream;
    c.rekey_bins();
  }
  entry = evicted ? c.table.find(ptr) : entry;
  c.push(target, entry, ptr, rounded);
  return true;
}

std::size_t allocator::tc_flush_locked(thread_cache& c) noexcept {
  const std::size_t moved = c.cached_bytes;
  for (std::size_t i = 0; i < thread_cache::bin_count; ++i) {
    if (c.bins[i].count != 0) {
      tc_evict_bin_locked(c, i);
    }
  }
  return moved;
}

std::size_t allocator::flush_thread_caches() noexcept {
  if (tc_ == nullptr) {
    return 0;
  }
  std::size_t moved = 0;
  std::lock_guard lock(tc_->mutex);
  for (thread_cache* c : tc_->caches) {
    // An empty cache is skipped without its lock (so its owner keeps the lock's bias): a block
    // cached before this call, in any thread that call happens after, shows in the count. The
    // caller's own cache is locked as its owner.
    if (c->cached_blocks == 0) {
      continue;
    }
    detail::biased_guard cl(c->lock, c->owned_here());
    if (c->cached_blocks != 0) {
      moved += tc_flush_locked(*c);
    }
  }
  return moved;
}

void allocator::tc_retire(thread_cache& c) noexcept {
  // The caller holds the registry mutex; the thread that owns `c` is exiting.
  thread_cache_registry& r = *tc_;
  detail::owner_guard cl(c.lock);
  (void)tc_flush_locked(c);
  tc_fold_locked(c);  // its live blocks now count at (rounded, requested), as orphans do
  std::size_t lost = 0;
  c.table.for_each([this, &r, &lost](tc_entry& e) {
    try {
      r.orphans.emplace(reinterpret_cast<void*>(e.key), e);
    } catch (const std::bad_alloc&) {
      do_unhold(reinterpret_cast<void*>(e.key));  // lock order: registry, cache, strategy
      ++lost;
    }
  });
  c.table_clear();
  std::erase(r.caches, &c);
  if (lost != 0) {
    detail::log_fixed(log_level::warn,
                      "poolscope: %s: out of host memory retiring an exiting thread's cache; %zu "
                      "live block(s) will be accounted by the strategy when freed",
                      name_.c_str(), lost);
  }
}

thread_cache_counters allocator::thread_cache_counts() const {
  thread_cache_counters n;
  if (tc_ == nullptr) {
    return n;
  }
  std::lock_guard lock(tc_->mutex);
  for (const thread_cache* c : tc_->caches) {
    ++n.caches;
    n.revocations += c->lock.revocations();
    n.rests += c->rests;
    n.resting += c->resting != 0 ? 1 : 0;
  }
  return n;
}

void allocator::tc_cache_stats(allocator_stats& s) const {
  std::lock_guard lock(tc_->mutex);
  for (thread_cache* c : tc_->caches) {
    if (c->cached_blocks == 0) {
      continue;  // nothing to add; its owner keeps the lock's bias (see flush_thread_caches)
    }
    detail::biased_guard cl(c->lock, c->owned_here());
    s.cached_blocks += c->cached_blocks;
    s.cached_bytes += c->cached_bytes;
    for (const detail::tc_bin& b : c->bins) {
      if (b.count != 0) {
        s.largest_free_block = std::max(s.largest_free_block, b.rounded);
      }
    }
  }
}

}  // namespace poolscope::pool
