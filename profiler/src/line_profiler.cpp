#include "poolscope/profiler/line_profiler.hpp"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "detail/stack_capture.hpp"
#include "detail/stack_seam.hpp"
#include "poolscope/error.hpp"
#include "poolscope/log.hpp"
#include "poolscope/spin_lock.hpp"

namespace poolscope::profiler {

std::string_view to_string(stack_unwinder u) noexcept {
  switch (u) {
    case stack_unwinder::automatic:
      return "automatic";
    case stack_unwinder::libunwind:
      return "libunwind";
    case stack_unwinder::glibc_backtrace:
      return "glibc_backtrace";
    case stack_unwinder::frame_pointer:
      return "frame_pointer";
    case stack_unwinder::cached_dwarf:
      return "cached_dwarf";
  }
  return "unknown";
}

detail::unwind_backend detail::backend_of(stack_unwinder u) noexcept {
  switch (u) {
    case stack_unwinder::libunwind:
      return detail::unwind_backend::libunwind;
    case stack_unwinder::glibc_backtrace:
      return detail::unwind_backend::glibc_backtrace;
    case stack_unwinder::frame_pointer:
      return detail::unwind_backend::frame_pointer;
    case stack_unwinder::cached_dwarf:
      return detail::unwind_backend::cached_dwarf;
    case stack_unwinder::automatic:
      break;
  }
  return detail::default_unwind_backend();
}

namespace {

stack_unwinder unwinder_of(detail::unwind_backend b) noexcept {
  switch (b) {
    case detail::unwind_backend::libunwind:
      return stack_unwinder::libunwind;
    case detail::unwind_backend::glibc_backtrace:
      return stack_unwinder::glibc_backtrace;
    case detail::unwind_backend::frame_pointer:
      return stack_unwinder::frame_pointer;
    case detail::unwind_backend::cached_dwarf:
      return stack_unwinder::cached_dwarf;
  }
  return stack_unwinder::glibc_backtrace;
}

constexpr std::size_t max_supported_depth = detail::stack_capturer::max_supported_depth;
constexpr std::size_t max_supported_python_depth = 256;
constexpr std::uint32_t root_index = 0;
// Events left for the lock's holder beyond which threads wait for the lock instead (see
// line_profiler::state::crowded).
constexpr std::size_t max_pending_batch = 256;

/// One call site. Counters are guarded by the profiler's table lock.
struct trie_node {
  std::uintptr_t address = 0;
  std::uint32_t parent = root_index;
  std::uint64_t count = 0;
  std::uint64_t used = 0;
  std::uint64_t rounded = 0;
  std::uint64_t freed = 0;
  std::uint64_t live = 0;
  // `live` as of the latest peak, saved lazily: valid only while mark_epoch == the current epoch.
  std::uint64_t live_at_mark = 0;
  std::uint64_t mark_epoch = 0;
  std::uint64_t acquire_count = 0;
  std::uint64_t acquired = 0;
  std::uint64_t live_acquired = 0;
};

struct child_key {
  std::uint32_t parent;
  std::uintptr_t address;
  friend bool operator==(const child_key&, const child_key&) = default;
};
struct child_key_hash {
  std::size_t operator()(const child_key& k) const noexcept {
    return std::hash<std::uintptr_t>{}(k.address * 0x9E3779B97F4A7C15ULL ^ k.parent);
  }
};

/// A block allocated under profiling: the node it is attributed to and its size.
struct live_block {
  std::uint32_t node;
  std::uint64_t bytes;
};

/// Pointer -> live_block, open addressing with linear probing and backward-shift deletion: no
/// allocation per insert or erase (the profiler's hot path inserts and erases once per block).
/// Key 0 marks an empty slot (null pointers are never recorded). Not thread-safe.
class block_table {
 public:
  block_table() { clear(); }

  /// The block of `ptr`, or nullptr.
  live_block* find(std::uintptr_t ptr) noexcept {
    for (std::size_t i = slot_of(ptr);; i = (i + 1) & mask_) {
      if (keys_[i] == ptr) {
        return &values_[i];
      }
      if (keys_[i] == 0) {
        return nullptr;
      }
    }
  }
  /// Inserts `ptr` (which must not be present). May throw std::bad_alloc when growing.
  void insert(std::uintptr_t ptr, live_block b) {
    if ((size_ + 1) * 4 > keys_.size() * 3) {
      rehash(keys_.size() * 2);
    }
    std::size_t i = slot_of(ptr);
    while (keys_[i] != 0) {
      i = (i + 1) & mask_;
    }
    keys_[i] = ptr;
    values_[i] = b;
    ++size_;
  }
  /// Removes the entry `b` points at (from find).
  void erase(live_block* b) noexcept {
    auto i = static_cast<std::size_t>(b - values_.data());
    keys_[i] = 0;
    --size_;
    // Shift later members of the probe run back so lookups never stop at the hole too early.
    for (std::size_t j = (i + 1) & mask_; keys_[j] != 0; j = (j + 1) & mask_) {
      const std::size_t home = slot_of(keys_[j]);
      // Move j to i if its home is not within (i, j] cyclically.
      const bool stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
      if (!stays) {
        keys_[i] = keys_[j];
        values_[i] = values_[j];
        keys_[j] = 0;
        i = j;
      }
    }
  }
  void clear() {
    keys_.assign(1024, 0);
    values_.assign(1024, live_block{});
    mask_ = 1023;
    size_ = 0;
  }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }

 private:
  [[nodiscard]] std::size_t slot_of(std::uintptr_t ptr) const noexcept {
    return static_cast<std::size_t>((ptr * 0x9E3779B97F4A7C15ULL) >> 20) & mask_;
  }
  void rehash(std::size_t capacity) {
    std::vector<std::uintptr_t> old_keys(capacity, 0);
    std::vector<live_block> old_values(capacity);
    old_keys.swap(keys_);
    old_values.swap(values_);
    mask_ = capacity - 1;
    size_ = 0;
    for (std::size_t i = 0; i < old_keys.size(); ++i) {
      if (old_keys[i] != 0) {
        insert(old_keys[i], old_values[i]);
      }
    }
  }

  std::vector<std::uintptr_t> keys_;
  std::vector<live_block> values_;
  std::size_t mask_ = 0;
  std::size_t size_ = 0;
};

std::uint64_t hash_stack(const std::uintptr_t* frames, std::size_t depth) noexcept {
  // Independent multiplies (no chain through h), then one final mix: cheap for 16-32 frames.
  std::uint64_t h = depth;
  for (std::size_t i = 0; i < depth; ++i) {
    h += (frames[i] ^ (i * 0xD6E8FEB86659FD93ULL)) * 0x9E3779B97F4A7C15ULL;
  }
  h ^= h >> 31;
  h *= 0xBF58476D1CE4E5B9ULL;
  h ^= h >> 29;
  return h;
}

/// A range mapped by a segment_map: where it ends and the node it is charged to.
struct mapped_range {
  std::uintptr_t end = 0;
  std::uint32_t node = 0;
};

/// One event, as the lock's holder applies it.
struct event_record {
  hooks::event_kind kind = hooks::event_kind::pool_malloc;
  std::uintptr_t ptr = 0;
  std::uint64_t requested = 0;
  std::uint64_t rounded = 0;
  std::uint64_t seq = 0;
  std::uint64_t stack_hash = 0;  // mallocs and device_allocs: hash_stack of the frames
  std::uint32_t depth = 0;       // frames kept (innermost first)
  bool truncated = false;
};

/// An event left by a thread that found the table lock taken, with a copy of its frames right
/// after it in the same allocation. Applied by the next thread to hold the lock.
struct pending_event {
  pending_event* next = nullptr;
  event_record record;

  [[nodiscard]] std::uintptr_t* frames() noexcept {
    return reinterpret_cast<std::uintptr_t*>(this + 1);
  }
  /// A copy of `r` and its frames, or nullptr when out of memory.
  static pending_event* make(const event_record& r, const std::uintptr_t* frames) noexcept {
    void* raw =
        ::operator new(sizeof(pending_event) + r.depth * sizeof(std::uintptr_t), std::nothrow);
    if (raw == nullptr) {
      return nullptr;
    }
    auto* p = new (raw) pending_event{nullptr, r};
    if (r.depth != 0) {
      std::memcpy(p->frames(), frames, r.depth * sizeof(std::uintptr_t));
    }
    return p;
  }
  /// Frees a list of them.
  static void destroy_all(pending_event* p) noexcept {
    while (p != nullptr) {
      pending_event* next = p->next;
      p->~pending_event();
      ::operator delete(p);
      p = next;
    }
  }
};
static_assert(alignof(pending_event) >= alignof(std::uintptr_t));
static_assert(sizeof(pending_event) % alignof(std::uintptr_t) == 0);

/// Whole stack -> its leaf in the tree: open addressing over (hash, leaf), each stack's frames
/// kept contiguously so a hit is checked with one memcmp instead of a walk up the tree.
/// Not thread-safe.
class leaf_table {
 public:
  leaf_table() { clear(); }

  /// The leaf of this stack, or UINT32_MAX.
  [[nodiscard]] std::uint32_t find(std::uint64_t h, const std::uintptr_t* frames,
                                   std::size_t depth) const noexcept {
    for (std::size_t i = h & mask_;; i = (i + 1) & mask_) {
      const entry& e = entries_[i];
      if (e.offset == empty) {
        return UINT32_MAX;
      }
      if (e.hash == h && e.depth == depth &&
          std::memcmp(frames_.data() + e.offset, frames, depth * sizeof(std::uintptr_t)) == 0) {
        return e.leaf;
      }
    }
  }
  /// Remembers the stack's leaf. May throw std::bad_alloc.
  void insert(std::uint64_t h, const std::uintptr_t* frames, std::size_t depth,
              std::uint32_t leaf) {
    if ((size_ + 1) * 2 > entries_.size()) {
      grow();
    }
    const auto offset = static_cast<std::uint32_t>(frames_.size());
    frames_.insert(frames_.end(), frames, frames + depth);
    place(entry{h, offset, static_cast<std::uint32_t>(depth), leaf});
    ++size_;
  }
  void clear() {
    entries_.assign(256, entry{});
    frames_.clear();
    mask_ = 255;
    size_ = 0;
  }

 private:
  static constexpr std::uint32_t empty = UINT32_MAX;
  struct entry {
    std::uint64_t hash = 0;
    std::uint32_t offset = empty;  // into frames_
    std::uint32_t depth = 0;
    std::uint32_t leaf = 0;
  };
  void place(const entry& e) {
    std::size_t i = e.hash & mask_;
    while (entries_[i].offset != empty) {
      i = (i + 1) & mask_;
    }
    entries_[i] = e;
  }
  void grow() {
    std::vector<entry> old(entries_.size() * 2);
    old.swap(entries_);
    mask_ = entries_.size() - 1;
    for (const entry& e : old) {
      if (e.offset != empty) {
        place(e);
      }
    }
  }

  std::vector<entry> entries_;
  std::vector<std::uintptr_t> frames_;
  std::size_t mask_ = 0;
  std::size_t size_ = 0;
};

}  // namespace

bool unwinder_available(stack_unwinder u) noexcept {
  return u == stack_unwinder::automatic || detail::unwind_backend_available(detail::backend_of(u));
}

bool has_libdw() noexcept {
#if defined(POOLSCOPE_HAVE_LIBDW)
  return true;
#else
  return false;
#endif
}

struct line_profiler::state {
  detail::stack_capturer capturer;

  // A spin lock: its sections are a few table operations, and a contended std::mutex sleeps in
  // the kernel. A thread that finds it taken does not wait: it leaves its event on `pending`
  // (a stack of events, newest on top), and whoever holds the lock next applies those first,
  // oldest first, then its own (docs/line_profile.md, "Threads").
  mutable spin_lock table_lock;
  std::atomic<pending_event*> pending{nullptr};
  // Set by a holder that found more than max_pending_batch events left: until one finds fewer,
  // threads wait for the lock instead of leaving more (threads raising events faster than one
  // holder applies them would otherwise grow the list without bound).
  std::atomic<bool> crowded{false};
  std::vector<trie_node> nodes;  // [0] is the root
  std::unordered_map<child_key, std::uint32_t, child_key_hash> children;
  leaf_table leaves;
  block_table blocks;    // pool_malloc ptr -> block
  block_table segments;  // device_alloc ptr -> segment
  // Memory mapped into a virtual resource's range (segment_map), by address: an unmap may cover
  // part of a map, or several maps, so ranges are matched by overlap, not by pointer.
  std::map<std::uintptr_t, mapped_range> mapped;
  std::uint64_t total_live = 0;
  std::uint64_t peak_live = 0;
  std::uint64_t peak_seq = 0;
  std::uint64_t epoch = 0;  // bumped at every new peak
  std::uint64_t events = 0;
  std::uint64_t unmatched_frees = 0;
  std::uint64_t truncated = 0;
  std::uint64_t deferred = 0;  // events applied from `pending`

  explicit state(const detail::stack_capture_options& options) : capturer(options) { clear(); }
  ~state() { discard_pending(); }
  state(const state&) = delete;
  state& operator=(const state&) = delete;

  // Leaves an event for the lock's next holder. Lock-free; never fails.
  void push(pending_event* p) noexcept {
    p->next = pending.load(std::memory_order_relaxed);
    while (!pending.compare_exchange_weak(p->next, p, std::memory_order_release,
                                          std::memory_order_relaxed)) {
    }
  }

  // The events left so far, oldest first (the caller owns them); `count` is set to how many.
  pending_event* take_pending(std::size_t& count) noexcept {
    count = 0;
    if (pending.load(std::memory_order_relaxed) == nullptr) {
      return nullptr;
    }
    pending_event* newest_first = pending.exchange(nullptr, std::memory_order_acquire);
    pending_event* oldest_first = nullptr;
    while (newest_first != nullptr) {
      pending_event* next = newest_first->next;
      newest_first->next = oldest_first;
      oldest_first = newest_first;
      newest_first = next;
      ++count;
    }
    return oldest_first;
  }

  // With the lock held: applies the events left by other threads, in the order they were left,
  // and returns them, for the caller to free once it has released the lock (the section stays
  // short). If one cannot be applied (out of memory), all are freed and the exception goes on.
  [[nodiscard]] pending_event* drain() {
    std::size_t count = 0;
    pending_event* const first = take_pending(count);
    if (const bool too_many = count > max_pending_batch;
        too_many != crowded.load(std::memory_order_relaxed)) {
      crowded.store(too_many, std::memory_order_relaxed);
    }
    try {
      for (pending_event* p = first; p != nullptr; p = p->next) {
        apply(p->record, p->frames());
        ++deferred;
      }
    } catch (...) {
      pending_event::destroy_all(first);
      throw;
    }
    return first;
  }

  void discard_pending() noexcept {
    std::size_t count = 0;
    pending_event::destroy_all(take_pending(count));
  }

  void clear() {
    nodes.clear();
    nodes.emplace_back();
    children.clear();
    leaves.clear();
    blocks.clear();
    segments.clear();
    mapped.clear();
    total_live = peak_live = peak_seq = epoch = events = unmatched_frees = truncated = deferred = 0;
  }

  // Saves a node's live bytes as of the latest peak before they first change after it.
  void touch(trie_node& n) const noexcept {
    if (n.mark_epoch != epoch) {
      n.live_at_mark = n.live;
      n.mark_epoch = epoch;
    }
  }

  [[nodiscard]] std::uint64_t live_at_peak(const trie_node& n) const noexcept {
    return n.mark_epoch == epoch ? n.live_at_mark : n.live;
  }

  // Walks (and extends) the tree from the root along the stack, outermost frame first.
  std::uint32_t insert_path(const std::uintptr_t* frames, std::size_t depth) {
    std::uint32_t cur = root_index;
    for (std::size_t i = depth; i-- > 0;) {
      const child_key key{cur, frames[i]};
      auto it = children.find(key);
      if (it != children.end()) {
        cur = it->second;
        continue;
      }
      trie_node n;
      n.address = frames[i];
      n.parent = cur;
      n.mark_epoch = epoch;  // it did not exist at the latest peak: live there was 0
      const auto index = static_cast<std::uint32_t>(nodes.size());
      nodes.push_back(n);
      children.emplace(key, index);
      cur = index;
    }
    return cur;
  }

  // The leaf of a stack whose hash_stack() is `h` (computed before the lock is taken).
  std::uint32_t leaf_for(std::uint64_t h, const std::uintptr_t* frames, std::size_t depth) {
    const std::uint32_t known = leaves.find(h, frames, depth);
    if (known != UINT32_MAX) {
      return known;
    }
    const std::uint32_t leaf = insert_path(frames, depth);
    leaves.insert(h, frames, depth, leaf);
    return leaf;
  }

  // With the lock held: [addr, addr + bytes) mapped, charged to `leaf`. What it overlaps was
  // unmapped without an event seen (filtered or lost): it is no longer charged.
  void map_range(std::uintptr_t addr, std::uint64_t bytes, std::uint32_t leaf) {
    (void)unmap_range(addr, bytes);
    mapped.emplace(addr, mapped_range{addr + bytes, leaf});
    nodes[leaf].acquire_count += 1;
    nodes[leaf].acquired += bytes;
    nodes[leaf].live_acquired += bytes;
  }

  // With the lock held: gives back the charge of every mapped byte in [addr, addr + bytes),
  // splitting the ranges it cuts through; returns the bytes found mapped.
  std::uint64_t unmap_range(std::uintptr_t addr, std::uint64_t bytes) {
    const std::uintptr_t end = addr + bytes;
    auto it = mapped.upper_bound(addr);
    if (it != mapped.begin() && std::prev(it)->second.end > addr) {
      --it;
    }
    std::uint64_t found = 0;
    while (it != mapped.end() && it->first < end) {
      const std::uintptr_t lo = it->first;
      const mapped_range m = it->second;
      const std::uintptr_t cut_lo = std::max(lo, addr);
      const std::uintptr_t cut_hi = std::min(m.end, end);
      nodes[m.node].live_acquired -= cut_hi - cut_lo;
      found += cut_hi - cut_lo;
      if (m.end > end) {
        mapped.emplace_hint(std::next(it), end, mapped_range{m.end, m.node});
      }
      if (lo < addr) {
        it->second.end = addr;
        ++it;
      } else {
        it = mapped.erase(it);
      }
    }
    return found;
  }

  // With the lock held: records one event. May throw std::bad_alloc (tables growing).
  void apply(const event_record& r, const std::uintptr_t* frames) {
    ++events;
    if (r.kind == hooks::event_kind::segment_unmap) {
      if (unmap_range(r.ptr, r.rounded) != r.rounded) {
        ++unmatched_frees;  // some of it was mapped before the profile began
      }
      return;
    }
    const bool is_free =
        r.kind == hooks::event_kind::pool_free || r.kind == hooks::event_kind::device_free;
    if (is_free) {
      auto& table = r.kind == hooks::event_kind::pool_free ? blocks : segments;
      live_block* it = table.find(r.ptr);
      if (it == nullptr) {
        ++unmatched_frees;
        return;
      }
      trie_node& n = nodes[it->node];
      const std::uint64_t bytes = it->bytes;
      if (r.kind == hooks::event_kind::pool_free) {
        touch(n);
        n.live -= bytes;
        n.freed += bytes;
        total_live -= bytes;
      } else {
        n.live_acquired -= bytes;
      }
      table.erase(it);
      return;
    }
    if (r.truncated) {
      ++truncated;
    }
    const std::uint32_t leaf = leaf_for(r.stack_hash, frames, r.depth);
    trie_node& node = nodes[leaf];
    if (r.kind == hooks::event_kind::pool_malloc) {
      const std::uint64_t bytes = r.requested;
      if (live_block* old_block = blocks.find(r.ptr); old_block != nullptr) {
        // The block's free was never seen (filtered or lost): it is not live any more.
        trie_node& old = nodes[old_block->node];
        touch(old);
        old.live -= old_block->bytes;
        total_live -= old_block->bytes;
        *old_block = live_block{leaf, bytes};
      } else {
        blocks.insert(r.ptr, live_block{leaf, bytes});  // first: if it throws, nothing moved
      }
      touch(node);
      node.count += 1;
      node.used += bytes;
      node.rounded += r.rounded;
      node.live += bytes;
      total_live += bytes;
      if (total_live > peak_live) {
        peak_live = total_live;
        peak_seq = r.seq;
        ++epoch;
      }
    } else if (r.kind == hooks::event_kind::segment_map) {
      map_range(r.ptr, r.rounded, leaf);
    } else {
      const std::uint64_t bytes = r.rounded != 0 ? r.rounded : r.requested;
      if (live_block* old_segment = segments.find(r.ptr); old_segment != nullptr) {
        nodes[old_segment->node].live_acquired -= old_segment->bytes;
        *old_segment = live_block{leaf, bytes};
      } else {
        segments.insert(r.ptr, live_block{leaf, bytes});
      }
      node.acquire_count += 1;
      node.acquired += bytes;
      node.live_acquired += bytes;
    }
  }
};

line_profiler::line_profiler(const line_profiler_options& options) : options_(options) {
  if (options_.max_depth == 0 || options_.max_depth > max_supported_depth) {
    throw invalid_argument("poolscope: line_profiler max_depth " +
                           std::to_string(options_.max_depth) + " is outside 1.." +
                           std::to_string(max_supported_depth));
  }
  if (!unwinder_available(options_.unwinder)) {
    throw invalid_argument("poolscope: line_profiler unwinder '" +
                           std::string(to_string(options_.unwinder)) +
                           "' is not available in this build");
  }
  if (options_.max_python_depth > max_supported_python_depth) {
    throw invalid_argument("poolscope: line_profiler max_python_depth " +
                           std::to_string(options_.max_python_depth) + " is above " +
                           std::to_string(max_supported_python_depth));
  }
  if (options_.skip_modules_of.size() > detail::own_code_ranges::max_extra) {
    throw invalid_argument("poolscope: line_profiler skip_modules_of holds " +
                           std::to_string(options_.skip_modules_of.size()) +
                           " addresses; at most " +
                           std::to_string(detail::own_code_ranges::max_extra));
  }
  detail::stack_capture_options capture;
  capture.backend = detail::backend_of(options_.unwinder);
  capture.max_depth = options_.max_depth;
  capture.skip_poolscope_frames = options_.skip_poolscope_frames;
  capture.skip_frames = options_.skip_frames;
  capture.skip_modules_of = options_.skip_modules_of;
  capture.max_python_depth = options_.max_python_depth;
  state_ = std::make_unique<state>(capture);
  if (const std::size_t i = state_->capturer.own().first_extra_not_found();
      i < options_.skip_modules_of.size()) {
    char where[32];
    std::snprintf(where, sizeof where, "%p", options_.skip_modules_of[i]);
    throw invalid_argument("poolscope: line_profiler skip_modules_of[" + std::to_string(i) + "] (" +
                           where +
                           ") is in no shared object (the main executable's frames cannot be "
                           "told from the application's by address: use skip_frames)");
  }
  detail::warm_up(capture.backend);
}

line_profiler::~line_profiler() = default;

stack_unwinder line_profiler::unwinder() const noexcept {
  return unwinder_of(state_->capturer.backend());
}

void line_profiler::disable(const char* what) const noexcept {
  if (!disabled_.exchange(true, std::memory_order_relaxed)) {
    char message[256];
    std::snprintf(message, sizeof message, "line_profiler disabled, the report is incomplete: %s",
                  what);
    log(log_level::error, message);
  }
}

hooks::event_filter line_profiler::interests() const noexcept {
  return hooks::event_filter::lifetimes()
      .add(hooks::event_kind::segment_map, hooks::event_phase::post)
      .add(hooks::event_kind::segment_unmap, hooks::event_phase::pre);
}

void line_profiler::on_event(const hooks::event& e) noexcept {
  if (disabled_.load(std::memory_order_relaxed)) {
    return;
  }
  if (options_.only_allocator != 0 && e.allocator_id != options_.only_allocator) {
    return;
  }
  // Memory a pool acquires is a device_alloc, or a segment_map over a virtual resource: both
  // are charged to the line that caused them, and their releases give the charge back.
  const bool is_alloc =
      e.phase == hooks::event_phase::post &&
      (e.kind == hooks::event_kind::pool_malloc || e.kind == hooks::event_kind::device_alloc ||
       e.kind == hooks::event_kind::segment_map);
  const bool is_free =
      e.phase == hooks::event_phase::pre &&
      (e.kind == hooks::event_kind::pool_free || e.kind == hooks::event_kind::device_free ||
       e.kind == hooks::event_kind::segment_unmap);
  if ((!is_alloc && !is_free) || e.ptr == nullptr) {
    return;
  }
  state& s = *state_;
  event_record r;
  r.kind = e.kind;
  r.ptr = reinterpret_cast<std::uintptr_t>(e.ptr);
  r.requested = e.requested;
  r.rounded = e.rounded;
  r.seq = e.seq;
  // The stack is captured, and hashed, before taking the lock: it is the expensive part.
  std::uintptr_t frames[max_supported_depth + max_supported_python_depth];
  if (is_alloc) {
    bool truncated = false;
    r.depth = static_cast<std::uint32_t>(
        s.capturer.capture(frames, truncated, e.kind == hooks::event_kind::pool_malloc));
    r.truncated = truncated;
    r.stack_hash = hash_stack(frames, r.depth);
  }
  pending_event* applied = nullptr;  // events left by others, freed once the lock is released
  try {
    bool held = s.table_lock.try_lock();
    if (!held && s.crowded.load(std::memory_order_relaxed)) {
      // Holders are not keeping up with the events left: wait for the lock instead.
      s.table_lock.lock();
      held = true;
    }
    if (held) {
      // Apply the events left by others (they happened before this one), then this one.
      std::lock_guard lock(s.table_lock, std::adopt_lock);
      applied = s.drain();
      s.apply(r, frames);
    } else {
      // Another thread holds the lock: leave the event for the next holder instead of waiting.
      pending_event* p = pending_event::make(r, frames);
      if (p == nullptr) {
        throw std::bad_alloc();
      }
      s.push(p);
    }
  } catch (const std::exception& ex) {
    disable(ex.what());
  } catch (...) {
    disable("unknown exception");
  }
  pending_event::destroy_all(applied);
}

void line_profiler::reset() noexcept {
  {
    std::lock_guard lock(state_->table_lock);
    state_->discard_pending();  // left before the reset
    try {
      state_->clear();
    } catch (...) {
      // clear() only fails if the root node cannot be allocated; the next report shows nothing.
    }
  }
  disabled_.store(false, std::memory_order_relaxed);
}

void line_profiler::drain_locked() const noexcept {
  try {
    pending_event::destroy_all(state_->drain());
  } catch (const std::exception& ex) {
    disable(ex.what());
  } catch (...) {
    disable("unknown exception");
  }
}

std::size_t line_profiler::node_count() const {
  std::lock_guard lock(state_->table_lock);
  drain_locked();
  return state_->nodes.size() - 1;
}

line_profile line_profiler::report(const report_options& options) const {
  struct flat {
    std::uintptr_t address;
    std::uint32_t parent;
    profile_counts self;
  };
  std::vector<flat> copy;
  line_profile out;
  {
    const state& s = *state_;
    std::lock_guard lock(s.table_lock);
    drain_locked();  // events other threads left while the lock was taken
    copy.reserve(s.nodes.size());
    for (const trie_node& n : s.nodes) {
      flat f{n.address, n.parent, {}};
      f.self.count = n.count;
      f.self.used = n.used;
      f.self.rounded = n.rounded;
      f.self.freed = n.freed;
      f.self.live = n.live;
      f.self.live_at_peak = s.live_at_peak(n);
      f.self.acquire_count = n.acquire_count;
      f.self.acquired = n.acquired;
      f.self.live_acquired = n.live_acquired;
      copy.push_back(f);
    }
    out.peak_live = s.peak_live;
    out.peak_seq = s.peak_seq;
    out.events = s.events;
    out.unmatched_frees = s.unmatched_frees;
    out.truncated_stacks = s.truncated;
    out.deferred_events = s.deferred;
    out.complete = enabled();
  }
  out.unwinder = detail::unwind_backend_name(state_->capturer.backend());
  out.max_depth = options_.max_depth;

  std::vector<std::vector<std::uint32_t>> kids(copy.size());
  for (std::uint32_t i = 1; i < copy.size(); ++i) {
    kids[copy[i].parent].push_back(i);
  }
  std::unique_ptr<detail::symbolizer> sym;
  if (options.symbolize) {
    sym = std::make_unique<detail::symbolizer>();
    out.symbolizer = sym->backend();
  } else {
    out.symbolizer = "none";
  }
  // Iterative build: stacks may be up to 256 deep, and nodes are moved into parents bottom-up.
  auto make = [&](std::uint32_t i) {
    profile_node p;
    p.address = copy[i].address;
    p.self = copy[i].self;
    if (i != root_index && sym) {
      detail::symbol info = detail::symbolize_frame(*sym, copy[i].address);
      p.function = std::move(info.function);
      p.file = std::move(info.file);
      p.line = info.line;
      p.module = std::move(info.module);
      p.offset = info.offset;
    }
    return p;
  };
  std::vector<profile_node> built(copy.size());
  // Children always have larger indices than their parent: fill from the back.
  for (std::size_t i = copy.size(); i-- > 0;) {
    profile_node p = make(static_cast<std::uint32_t>(i));
    p.children.reserve(kids[i].size());
    for (std::uint32_t k : kids[i]) {
      p.children.push_back(std::move(built[k]));
    }
    built[i] = std::move(p);
  }
  out.root = std::move(built[root_index]);
  out.root.function = "<root>";
  out.recompute_totals();
  // Deterministic order: most used first, then most acquired, then by label.
  std::vector<profile_node*> todo{&out.root};
  while (!todo.empty()) {
    profile_node* p = todo.back();
    todo.pop_back();
    std::sort(p->children.begin(), p->children.end(),
              [](const profile_node& a, const profile_node& b) {
                if (a.total.used != b.total.used) {
                  return a.total.used > b.total.used;
                }
                if (a.total.acquired != b.total.acquired) {
                  return a.total.acquired > b.total.acquired;
                }
                return a.address < b.address;
              });
    for (auto& c : p->children) {
      todo.push_back(&c);
    }
  }
  return out;
}

}  // namespace poolscope::profiler
