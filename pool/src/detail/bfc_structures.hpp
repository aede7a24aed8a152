// Internal data structures of bfc_allocator: chunk and segment nodes, the node pool, the
// segregated free index (size classes + bitmap) and the open-addressing pointer map.
//
// None of these types locks: bfc_allocator guards every one of them with its single mutex.
// Preconditions are stated per function; violating them is undefined behaviour (the allocator
// checks them before calling). Nothing here throws except the reserve* functions
// (std::bad_alloc), which are called before the allocator changes any state.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "address_table.hpp"
#include "metadata_arena.hpp"
#include "poolscope/cpu_relax.hpp"

// bfc's hot functions (allocate_chunk and deallocate_chunk, which its do_* virtuals call, with
// the index and table code inlined into them) are compiled twice on x86-64: for x86-64-v3
// (Haswell, Zen and later: BMI, BMI2, LZCNT) and for the baseline, the loader picking one for
// the CPU (GNU ifunc). The size classes and bitmaps shift by variable amounts, which the
// baseline does with `shl %cl` (three micro-ops on Intel cores, against one for BMI2's shlx),
// and std::countr_zero / bit_width test for zero first without TZCNT / LZCNT: the v3 copy is
// measurably faster on random sizes (docs/perf.md). Builds under ASan or TSan keep one
// (baseline) copy: the copy CI's sanitizer runs test.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__GLIBC__) && \
    !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define POOLSCOPE_HOT_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define POOLSCOPE_HOT_CLONES
#endif

namespace poolscope::pool::detail {

/// The pool's one lock: a futex-style mutex (Drepper's "mutex2": 0 free, 1 held, 2 held with
/// sleepers) on a std::atomic wait/notify. Uncontended, lock is one compare-exchange and unlock
/// one exchange, inline (std::mutex makes the same two atomic operations plus calls into the C
/// library). Contended, a waiter spins briefly, then sleeps until woken, so the thread holding
/// the lock keeps running with the pool's data hot in its cache instead of handing the lock
/// (and every cache line it guards) to another core on each operation, as a spin lock does.
/// Satisfies Lockable.
class bfc_lock {
 public:
  void lock() noexcept {
    std::uint32_t expected = 0;
    if (state_.compare_exchange_strong(expected, 1, std::memory_order_acquire,
                                       std::memory_order_relaxed)) [[likely]] {
      return;
    }
    lock_contended();
  }
  [[nodiscard]] bool try_lock() noexcept {
    std::uint32_t expected = 0;
    return state_.compare_exchange_strong(expected, 1, std::memory_order_acquire,
                                          std::memory_order_relaxed);
  }
  void unlock() noexcept {
    if (state_.exchange(0, std::memory_order_release) == 2) [[unlikely]] {
      wake_one();
    }
  }

 private:
  // Out of line: inlined, notify_one's waiter-table lookup and system call sat in every hot
  // function that unlocks (twice in some), tying up registers there.
  [[gnu::cold, gnu::noinline]] void wake_one() noexcept { state_.notify_one(); }
  void lock_contended() noexcept {
    for (int i = 0; i < 16; ++i) {
      cpu_relax();
      std::uint32_t expected = 0;
      if (state_.load(std::memory_order_relaxed) == 0 &&
          state_.compare_exchange_weak(expected, 1, std::memory_order_acquire,
                                       std::memory_order_relaxed)) {
        return;
      }
    }
    // Mark the lock contended so the owner's unlock wakes a sleeper, then sleep while held.
    while (state_.exchange(2, std::memory_order_acquire) != 0) {
      state_.wait(2, std::memory_order_relaxed);
    }
  }
  std::atomic<std::uint32_t> state_{0};
};

/// Chunk granularity: every chunk size and every chunk offset in a segment is a multiple.
inline constexpr std::size_t bfc_granularity = 512;
inline constexpr unsigned bfc_granularity_shift = 9;

/// The two segment pools: small requests never share a segment with large ones.
enum class bfc_pool_kind : std::uint8_t { small = 0, large = 1 };

/// The links of a size-class list, and the size the list is sorted by. Every chunk is one; each
/// class list also has one of its own as a sentinel (size SIZE_MAX), so that the lists are
/// circular and never empty of nodes: linking, unlinking and walking need no null checks.
struct bfc_free_link {
  bfc_free_link* free_next = nullptr;  ///< free: next in the class list; pooled: next free node
  bfc_free_link* free_prev = nullptr;  ///< free: previous in the class list
  std::size_t size = 0;                ///< bytes, a multiple of bfc_granularity
};

/// One chunk of a segment: a range of bytes either handed out (live) or free.
/// 64 bytes, one cache line. (bfc's split sets every field of the node it takes with
/// bfc_node_pool::take_unset: a field added here must be set there too.)
struct alignas(64) bfc_chunk : bfc_free_link {
  char* addr = nullptr;
  std::size_t requested = 0;     ///< live: bytes the caller asked for; free: 0
  bfc_chunk* prev = nullptr;     ///< the chunk just below in the same segment (address order)
  bfc_chunk* next = nullptr;     ///< the chunk just above in the same segment
  std::uint16_t size_class = 0;  ///< free: the class list the chunk is on
  bfc_pool_kind pool = bfc_pool_kind::small;
  bool is_free = false;
  /// Whether `prev` / `next` is free (false without one). A free reads them here rather than in
  /// the neighbours' nodes: its merge decisions wait for this node's cache line only, and the
  /// neighbours are loaded just when they merge (their flags are stored, not loaded, otherwise).
  bool prev_free = false;
  bool next_free = false;

  /// True if this chunk covers its whole segment.
  [[nodiscard]] bool whole_segment() const noexcept {
    return (prev == nullptr) & (next == nullptr);  // both loads, no branch between them
  }
};
static_assert(sizeof(bfc_chunk) == 64);

/// One block acquired from upstream, cut into chunks. `first` is stable for the segment's life:
/// a split keeps the front part in the existing node and a merge keeps the lower node.
struct bfc_segment {
  char* base = nullptr;
  std::size_t size = 0;
  bfc_chunk* first = nullptr;
  bfc_segment* prev = nullptr;  ///< neighbours in the pool's segment list (no address order)
  bfc_segment* next = nullptr;
  bfc_pool_kind pool = bfc_pool_kind::small;
};

/// Recycles chunk nodes so that splitting and merging never call the heap: nodes come from
/// slabs that grow geometrically and live as long as the pool, allocated from `arena` (the
/// pool's metadata_arena; null: the heap).
class bfc_node_pool {
 public:
  explicit bfc_node_pool(metadata_arena* arena = nullptr) noexcept : arena_(arena) {}
  bfc_node_pool(const bfc_node_pool&) = delete;
  bfc_node_pool& operator=(const bfc_node_pool&) = delete;
  ~bfc_node_pool() {
    for (const slab& s : slabs_) {
      arena_.deallocate(s.nodes, s.count);
    }
  }

  /// Makes sure `n` nodes can be taken without allocating. May throw std::bad_alloc.
  void reserve(std::size_t n) {
    while (free_count_ < n) {
      grow();
    }
  }
  /// A node reset to its defaults. Precondition: a node is available (reserve).
  [[nodiscard]] bfc_chunk* take() noexcept {
    bfc_chunk* c = take_unset();
    *c = bfc_chunk{};
    return c;
  }
  /// A node with whatever its last use left in it, for a caller that sets every field.
  /// Precondition: a node is available (reserve).
  [[nodiscard]] bfc_chunk* take_unset() noexcept {
    bfc_chunk* c = free_;
    free_ = static_cast<bfc_chunk*>(c->free_next);
    --free_count_;
    return c;
  }
  /// Returns a node to the pool.
  void give(bfc_chunk* c) noexcept {
    c->free_next = free_;
    free_ = c;
    ++free_count_;
  }
  /// Nodes handed out and not yet given back.
  [[nodiscard]] std::size_t in_use() const noexcept { return capacity_ - free_count_; }

 private:
  struct slab {
    bfc_chunk* nodes;
    std::size_t count;
  };
  // Out of line and cold: bfc reserves a node on every allocation, and this path (a vector's
  // growth, the arena) inlined there would tie up its hot path's registers.
  [[gnu::noinline, gnu::cold]] void grow() {
    const std::size_t n = slabs_.empty() ? 64 : std::min<std::size_t>(capacity_, 4096);
    slabs_.reserve(slabs_.size() + 1);
    bfc_chunk* nodes = arena_.allocate(n);
    for (std::size_t i = 0; i < n; ++i) {
      give(new (&nodes[i]) bfc_chunk{});
    }
    capacity_ += n;
    slabs_.push_back({nodes, n});  // reserved above: cannot throw
  }

  arena_allocator<bfc_chunk> arena_;
  bfc_chunk* free_ = nullptr;
  std::size_t free_count_ = 0;
  std::size_t capacity_ = 0;
  std::vector<slab> slabs_;
};

/// Segregated free lists with a two-level bitmap, TLSF-style: sizes below 32 units (of 512 B)
/// have a class each; above, each power of two is cut into 32 linear sub-classes (classes span
/// at most ~3 % of their size). Each class list is kept sorted by size (ties: most recently
/// freed first), so the best fit is the first chunk >= the request in the request's own class,
/// or else the head of the next non-empty class, found with countr_zero on the bitmap.
/// The lists are circular around a sentinel per class (bfc_free_link), whose size SIZE_MAX ends
/// every walk, and the bitmap is updated without branches: on random sizes these lists'
/// empty/head/tail cases would otherwise be most of the pool's mispredicted branches. Each
/// sentinel also records its class's largest size, so that the question "does this class hold a
/// fit / is this chunk its new largest" is answered from the sentinel's cache line alone, not
/// after a dependent load of the list's last chunk.
/// Cost: find O(1) plus a walk of the request's class only when its largest chunk fits;
/// insert O(1) when the chunk is the smallest or largest of its class, else a walk of it.
class bfc_free_index {
 public:
  static constexpr unsigned sub_bits = 5;
  static constexpr std::size_t sub_count = std::size_t{1} << sub_bits;
  /// Classes for every unit count below 2^55 (sizes below 2^64).
  static constexpr std::size_t class_count = (55 - sub_bits + 1) * sub_count;
  static constexpr std::size_t word_count = (class_count + 63) / 64;
  static_assert(word_count < 64, "the summary word covers the bitmap words, and one more bit");

  bfc_free_index() noexcept {
    for (class_list& s : lists_) {
      s.free_next = s.free_prev = &s;
      s.size = SIZE_MAX;
    }
  }
  // The sentinels point at themselves: the index does not move.
  bfc_free_index(const bfc_free_index&) = delete;
  bfc_free_index& operator=(const bfc_free_index&) = delete;

  /// Class of a chunk of `size` bytes (size >= bfc_granularity). Without branches or a clamp:
  /// or-ing sub_count into the unit count leaves counts from sub_count up as they are and lifts
  /// smaller ones into sub_count's octave, so the shift, which keeps the top sub_bits + 1 bits of
  /// the count, is 0 below 2 * sub_count (the class is the count itself) and steps one octave
  /// per power of two above (the count's leading 1, worth sub_count, steps the class too). Every
  /// size has a class: SIZE_MAX's is the last (static_assert below the class).
  [[nodiscard]] static constexpr unsigned class_of(std::size_t size) noexcept {
    // On the size itself rather than its unit count (one shift less): sub_count units are
    // sub_count << bfc_granularity_shift bytes.
    const unsigned shift =
        static_cast<unsigned>(std::bit_width(size | (sub_count << bfc_granularity_shift))) -
        (sub_bits + 1 + bfc_granularity_shift);
    return (shift << sub_bits) + static_cast<unsigned>(size >> (shift + bfc_granularity_shift));
  }
  /// Largest size best_fit takes (2^63 - 1): the class after its own, where its search of the
  /// larger classes starts, exists (static_assert below the class).
  static constexpr std::size_t max_fit_size = SIZE_MAX >> 1;

  /// Adds free chunk `c` to its class list.
  void insert(bfc_chunk* c) noexcept {
    const unsigned cls = class_of(c->size);
    c->size_class = static_cast<std::uint16_t>(cls);
    class_list* const s = &lists_[cls];
    // Before the first chunk >= c (ties: in front). A new largest goes straight before the
    // sentinel (an empty list's largest is 0).
    // (Selected without a branch: whether a chunk is its class's largest is a coin toss on
    // random sizes. The list's first link is loaded either way, so that GCC selects with
    // conditional moves: a selection between `s` and a load made only when needed becomes a
    // branch, and masks take more instructions.)
    bfc_free_link* const first = s->free_next;
    const bool largest = c->size > s->largest;
    s->largest = largest ? c->size : s->largest;
    bfc_free_link* at = largest ? static_cast<bfc_free_link*>(s) : first;
    while (at->size < c->size) {
      at = at->free_next;
    }
    c->free_next = at;
    c->free_prev = at->free_prev;
    at->free_prev->free_next = c;
    at->free_prev = c;
    words_[cls >> 6] |= std::uint64_t{1} << (cls & 63);
    summary_ |= std::uint64_t{1} << (cls >> 6);
  }

  /// Removes free chunk `c` from its class list.
  void remove(bfc_chunk* c) noexcept {
    const unsigned cls = c->size_class;
    class_list* const s = &lists_[cls];
    bfc_free_link* const before = c->free_prev;
    bfc_free_link* const after = c->free_next;
    // Without its largest chunk, a class's largest is the one before it (the sentinel: none, 0).
    // (Both sizes loaded either way, so that GCC selects with conditional moves, as in insert.)
    const std::size_t before_size = before->size;
    const std::size_t largest = s->largest;
    before->free_next = after;
    after->free_prev = before;
    const std::size_t below = before != s ? before_size : 0;
    s->largest = after != s ? largest : below;
    const auto emptied = static_cast<std::uint64_t>(s->free_next == s);
    std::uint64_t& word = words_[cls >> 6];
    word &= ~(emptied << (cls & 63));
    summary_ &= ~(static_cast<std::uint64_t>(word == 0) << (cls >> 6));
  }

  /// The smallest free chunk of at least `size` bytes (ties: the most recently freed), or null.
  /// Requires size <= max_fit_size (bfc's requests are at most max_request_bytes).
  [[nodiscard]] bfc_chunk* best_fit(std::size_t size) const noexcept {
    const unsigned cls = class_of(size);
    const class_list* s = &lists_[cls];
    if (s->largest >= size) {
      const bfc_free_link* c = s->free_next;  // the walk ends at the last chunk at the latest
      while (c->size < size) {
        c = c->free_next;
      }
      return chunk(c);
    }
    const int next = next_class(cls + 1);  // marked, so its first link is a chunk
    return next < 0 ? nullptr : chunk(lists_[static_cast<std::size_t>(next)].free_next);
  }

  /// The free chunk after `c` in best-fit order (size, then the most recently freed first): the
  /// next of its class, else the first of the next non-empty class; null after the largest.
  /// O(1) plus a bitmap search. Precondition: `c` is in this index.
  [[nodiscard]] bfc_chunk* next_larger(const bfc_chunk* c) const noexcept {
    const unsigned cls = c->size_class;
    if (c->free_next != &lists_[cls]) {
      return chunk(c->free_next);
    }
    const int next = cls + 1 < class_count ? next_class(cls + 1) : -1;
    return next < 0 ? nullptr : chunk(lists_[static_cast<std::size_t>(next)].free_next);
  }

  /// Size of the largest free chunk (0 if none).
  [[nodiscard]] std::size_t largest() const noexcept {
    if (summary_ == 0) {
      return 0;
    }
    const unsigned w = 63 - static_cast<unsigned>(std::countl_zero(summary_));
    const unsigned b = 63 - static_cast<unsigned>(std::countl_zero(words_[w]));
    return lists_[w * 64 + b].largest;
  }

  /// First and last chunk of class `cls` (null when empty), and the chunk after `c` in its
  /// class (null at the end): for consistency checks.
  [[nodiscard]] bfc_chunk* head(std::size_t cls) const noexcept {
    return end_or_chunk(cls, lists_[cls].free_next);
  }
  [[nodiscard]] bfc_chunk* tail(std::size_t cls) const noexcept {
    return end_or_chunk(cls, lists_[cls].free_prev);
  }
  [[nodiscard]] bfc_chunk* next_in_class(const bfc_chunk* c) const noexcept {
    return end_or_chunk(c->size_class, c->free_next);
  }
  [[nodiscard]] bfc_chunk* prev_in_class(const bfc_chunk* c) const noexcept {
    return end_or_chunk(c->size_class, c->free_prev);
  }
  /// The size of class `cls`'s largest chunk as recorded (0: empty), for consistency checks.
  [[nodiscard]] std::size_t class_largest(std::size_t cls) const noexcept {
    return lists_[cls].largest;
  }
  /// Whether the bitmap marks class `cls` non-empty (for consistency checks).
  [[nodiscard]] bool marked(std::size_t cls) const noexcept {
    return ((words_[cls >> 6] >> (cls & 63)) & 1U) != 0 && ((summary_ >> (cls >> 6)) & 1U) != 0;
  }

 private:
  // Every link but the sentinels is a chunk.
  [[nodiscard]] static bfc_chunk* chunk(const bfc_free_link* l) noexcept {
    return static_cast<bfc_chunk*>(const_cast<bfc_free_link*>(l));  // NOLINT: the index's own
  }
  [[nodiscard]] bfc_chunk* end_or_chunk(std::size_t cls, const bfc_free_link* l) const noexcept {
    return l == &lists_[cls] ? nullptr : chunk(l);
  }

  /// The first non-empty class >= `from` (< class_count), or -1.
  [[nodiscard]] int next_class(unsigned from) const noexcept {
    unsigned w = from >> 6;
    std::uint64_t bits = words_[w] & (~std::uint64_t{0} << (from & 63));
    if (bits == 0) {
      // w + 1 <= word_count < 64: a valid shift.
      const std::uint64_t above = summary_ & (~std::uint64_t{0} << (w + 1));
      if (above == 0) {
        return -1;
      }
      w = static_cast<unsigned>(std::countr_zero(above));
      bits = words_[w];
    }
    return static_cast<int>(w * 64 + static_cast<unsigned>(std::countr_zero(bits)));
  }

  /// A class list's sentinel, with the size of the class's largest chunk (0 when empty): best
  /// fit and insert compare with it without loading the list's last chunk, a cache miss on
  /// random sizes that their branches had to wait for.
  struct class_list : bfc_free_link {
    std::size_t largest = 0;
  };
  std::array<class_list, class_count> lists_;  // sentinels, by class
  std::array<std::uint64_t, word_count> words_{};
  std::uint64_t summary_ = 0;
};

static_assert(bfc_free_index::class_of(SIZE_MAX) == bfc_free_index::class_count - 1,
              "every size has a class");
static_assert(bfc_free_index::class_of(bfc_free_index::max_fit_size) + 1 <
                  bfc_free_index::class_count,
              "best_fit's class and the next one exist");

/// Live chunks by address (an address_table of {address, chunk}).
class bfc_ptr_map {
 public:
  /// Slots from `arena` (the pool's metadata_arena; null: the heap).
  explicit bfc_ptr_map(metadata_arena* arena = nullptr) : table_(arena_allocator<slot>(arena)) {}

  /// Makes sure one insert will not allocate. May throw std::bad_alloc.
  void reserve_one() { table_.reserve_one(); }
  /// Adds `c` under c->addr. Precondition: reserve_one() since the last insert; key absent.
  void insert(bfc_chunk* c) noexcept {
    table_.insert(slot{reinterpret_cast<std::uintptr_t>(c->addr), c});
  }
  /// The chunk at `p`, or null.
  [[nodiscard]] bfc_chunk* find(const void* p) const noexcept {
    const slot* s = table_.find(p);
    return s != nullptr ? s->value : nullptr;
  }
  /// The chunk at `p` (null if absent), removed.
  bfc_chunk* erase(const void* p) noexcept {
    slot* s = table_.find(p);
    if (s == nullptr) {
      return nullptr;
    }
    bfc_chunk* found = s->value;
    table_.erase(s);
    return found;
  }
  [[nodiscard]] std::size_t size() const noexcept { return table_.size(); }
  /// Calls f(chunk*) for every entry.
  template <typename F>
  void for_each(F&& f) const {
    table_.for_each([&f](const slot& s) { f(s.value); });
  }

 private:
  struct slot {
    std::uintptr_t key = 0;
    bfc_chunk* value = nullptr;
  };
  address_table<slot, 256, arena_allocator<slot>> table_;
};

}  // namespace poolscope::pool::detail
