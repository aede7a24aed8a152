// One thread's cache of a thread_cache_adaptor (thread_cache_adaptor.hpp, docs/thread_cache.md):
// its record table, its bins and the filters that let most requests and frees skip them. The
// logic that uses them is in thread_cache_adaptor.cpp.
//
// Locking: a thread_cache's members are guarded by its `lock` (taken by the thread that holds the
// cache on every cached operation, through the bias, and by other threads to flush it or to free
// one of its blocks, revoking the bias), except where a member says otherwise. Lock order: the
// registry's mutex, then a cache's lock, then whatever the inner allocator takes. Nothing here
// throws except tc_table::reserve_one (std::bad_alloc), called before any change.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>

#include "address_table.hpp"
#include "biased_lock.hpp"
#include "single_writer.hpp"
#include "thread_registry.hpp"

namespace poolscope::pool::detail {

/// What a thread cache knows of one block: handed out through it (live) or held in a bin
/// (cached). `stream` is the stream of the allocation (live) or of the free (cached).
struct tc_entry {
  std::uintptr_t key = 0;       ///< the block's address; 0 marks an empty slot
  std::size_t rounded = 0;      ///< its size rounded to the inner allocator's granularity
  std::size_t inner_bytes = 0;  ///< what the inner allocator was asked for (it frees by this)
  std::size_t requested = 0;    ///< what the user asked for this time (live)
  void* stream = nullptr;
  bool cached = false;
};

/// Blocks by address (the table bfc's live-chunk map uses too).
using tc_table = address_table<tc_entry, 64>;

/// Cached blocks of one (stream, rounded size), most recently freed last.
struct tc_bin {
  static constexpr std::size_t capacity = 16;
  void* stream = nullptr;
  std::size_t rounded = 0;
  std::uint64_t last_use = 0;
  std::uint32_t count = 0;
  std::array<void*, capacity> blocks{};
};

/// One thread's cache in front of an adaptor's inner allocator: a node of the adaptor's
/// registry (thread_registry.hpp), held by one thread at a time.
struct thread_cache final : thread_node {
  static constexpr std::size_t bin_count = 16;
  /// The most blocks one cache can hold.
  static constexpr std::size_t most_blocks = bin_count * tc_bin::capacity;

  explicit thread_cache(bool owner_bias) : lock(owner_bias) { bin_of_bit.fill(no_bin); }

  /// The holding thread takes it through owner_guard, every other thread through lock():
  /// biased towards the holder (biased_lock.hpp). A later thread that takes the cache over
  /// takes the bias over too (the registry's mutex orders the two threads).
  biased_lock lock;
  tc_table table;  // every block recorded here, live or cached; changed through table_*
  std::array<tc_bin, bin_count> bins{};
  single_writer<std::size_t> cached_bytes;
  single_writer<std::size_t> cached_blocks;  // read without the lock by flushes and stats
  std::uint64_t tick = 0;

  // Whether the cache pays for itself (docs/thread_cache.md, "When a cache steps aside"); the
  // holding thread's alone. Every `sample_takes` requests it counts its hits; below
  // `min_sample_hits` the cache rests: for `next_rest` requests it is bypassed (its blocks go
  // back to the inner allocator, frees cache nothing), then it samples again. A rest lasts
  // `resting_takes` requests after a good sample and twice the last one after a bad one, up to
  // `max_resting_takes`: a thread whose sizes never repeat samples ever more rarely.
  static constexpr std::uint32_t sample_takes = 4096;
  static constexpr std::uint32_t min_sample_hits = sample_takes / 3;
  static constexpr std::uint32_t resting_takes = 16 * sample_takes;
  static constexpr std::uint32_t max_resting_takes = 16 * resting_takes;
  std::uint32_t sampled = 0;
  std::uint32_t sample_hits = 0;
  std::uint32_t next_rest = resting_takes;
  // Written by the holder, read by counts(): requests left to rest, times rested.
  single_writer<std::uint32_t> resting;
  single_writer<std::uint64_t> rests;

  /// The (stream, rounded size) of the latest requests the cache missed, a ring: a freed block
  /// of a size nobody asked for lately and no bin holds goes straight back to the inner
  /// allocator. One entry more than the ring: where add_wanted puts a request too large to
  /// cache, so that it needs no branch on that (no lookup reads the spare).
  struct want {
    std::size_t rounded = 0;
    void* stream = nullptr;
  };
  static constexpr std::uint32_t wanted_ring = bin_count;
  std::array<want, wanted_ring + 1> wanted{};
  std::uint32_t wanted_next = 0;
  // Filters over the sizes, so that a size no bin holds and nobody wanted (most sizes of a
  // random-size workload) costs a bit test instead of a scan of the bins or of `wanted`: bit
  // size_bit(r) of `bin_sizes` is set if a bin is keyed by a size with that bit, and of
  // `wanted_sizes` if an entry of `wanted` is (wanted_bit_count counts them per bit). 256 bits
  // for 16 entries: a size that is in neither passes a filter about once in 16.
  // `wanted`, `wanted_next`, `wanted_sizes` and `wanted_bit_count` are the holder's alone (no
  // other thread reads or writes them), so they need no lock. `bin_sizes` is written under
  // `lock` (relaxed load and store) and read by the holder without it: a request whose size bit
  // is clear in both filters misses without taking the lock (a stale bit costs only that miss).
  static constexpr std::size_t filter_bits = 256;
  using size_filter = std::array<std::uint64_t, filter_bits / 64>;
  std::array<std::atomic<std::uint64_t>, filter_bits / 64> bin_sizes{};
  size_filter wanted_sizes{};
  std::array<std::uint8_t, filter_bits> wanted_bit_count{};
  // For each filter bit, the one bin keyed by a size with that bit, no_bin if none, or
  // several_bins; so find_bin looks at one bin instead of scanning them. Under `lock`.
  static constexpr std::uint8_t no_bin = bin_count;
  static constexpr std::uint8_t several_bins = bin_count + 1;
  std::array<std::uint8_t, filter_bits> bin_of_bit{};
  // A counting filter over the addresses in `table`: slot address_slot(p) counts the entries
  // whose address maps there. Written under `lock` (relaxed load and store), read without it by
  // the holder and by any thread freeing a block: a thread that a block was handed to after it
  // was recorded sees its count (the record's insert happens before), so a zero means the block
  // is not recorded here, and such a free (most of a random-size workload's) takes no lock.
  static constexpr unsigned address_slot_bits = 10;
  std::array<std::atomic<std::uint32_t>, std::size_t{1} << address_slot_bits> recorded{};

  /// The filter bit of a rounded size.
  [[nodiscard]] static unsigned size_bit(std::size_t rounded) noexcept {
    return static_cast<unsigned>((rounded * 0x9E3779B97F4A7C15ULL) >> 56);
  }
  [[nodiscard]] static bool test(const size_filter& f, unsigned bit) noexcept {
    return ((f[bit >> 6] >> (bit & 63)) & 1U) != 0;
  }
  /// Whether a bin may be keyed by a size with filter bit `bit` (lock not needed).
  [[nodiscard]] bool may_have_bin(unsigned bit) const noexcept {
    return ((bin_sizes[bit >> 6].load(std::memory_order_relaxed) >> (bit & 63)) & 1U) != 0;
  }
  /// Whether no request's size could be served or recorded here: no bin and no recent miss
  /// share its filter bit (holder only; lock not needed). Both loads, no branch between them.
  [[nodiscard]] bool surely_passes(std::size_t rounded) const noexcept {
    const unsigned bit = size_bit(rounded);
    return !(may_have_bin(bit) | test(wanted_sizes, bit));
  }

  /// While the cache rests, counts one request and returns true (holder only).
  [[nodiscard]] bool skip_resting() noexcept {
    const std::uint32_t left = resting;  // one load (an atomic's, which the compiler keeps)
    if (left == 0) {
      return false;
    }
    resting = left - 1;
    return true;
  }

  [[nodiscard]] static std::size_t address_slot(const void* p) noexcept {
    return static_cast<std::size_t>((reinterpret_cast<std::uintptr_t>(p) * 0x9E3779B97F4A7C15ULL) >>
                                    (64 - address_slot_bits));
  }
  /// False if `p` is surely not in `table` (lock not needed; see `recorded`).
  [[nodiscard]] bool may_hold(const void* p) const noexcept {
    return recorded[address_slot(p)].load(std::memory_order_relaxed) != 0;
  }
  // The table's changes, which keep `recorded` counting its entries (under `lock`).
  void table_insert(const tc_entry& e) noexcept {
    table.insert(e);
    count_address(reinterpret_cast<const void*>(e.key), 1);
  }
  void table_erase(tc_entry* e) noexcept {
    const auto* p = reinterpret_cast<const void*>(e->key);
    table.erase(e);
    count_address(p, -1);
  }
  void table_clear() noexcept {
    table.clear();
    for (auto& r : recorded) {
      r.store(0, std::memory_order_relaxed);
    }
  }
  void count_address(const void* p, int delta) noexcept {
    std::atomic<std::uint32_t>& r = recorded[address_slot(p)];
    r.store(r.load(std::memory_order_relaxed) + static_cast<std::uint32_t>(delta),
            std::memory_order_relaxed);
  }
  [[nodiscard]] bool is_wanted(std::size_t rounded, void* stream) const noexcept {
    return test(wanted_sizes, size_bit(rounded)) &&
           std::any_of(wanted.begin(), wanted.begin() + wanted_ring,
                       [&](const want& w) { return w.rounded == rounded && w.stream == stream; });
  }
  /// Records a missed request in the ring of wanted sizes, if `cacheable`; else in the spare
  /// entry, which no lookup reads: the caller needs no branch on the size (a coin toss on random
  /// sizes), and the filter counts the spare as one more entry.
  void add_wanted(std::size_t rounded, void* stream, bool cacheable = true) noexcept {
    const auto keep = static_cast<std::uint32_t>(cacheable);
    const std::uint32_t mask = 0U - keep;  // masks, as the compiler branches on `?:` here
    const std::uint32_t at = ((wanted_next % wanted_ring) & mask) | (wanted_ring & ~mask);
    wanted_next += keep;
    want& w = wanted[at];
    if (w.rounded != 0) {
      const unsigned old = size_bit(w.rounded);
      const auto gone = static_cast<std::uint64_t>(--wanted_bit_count[old] == 0);
      wanted_sizes[old >> 6] &= ~(gone << (old & 63));
    }
    w = {rounded, stream};
    const unsigned bit = size_bit(rounded);
    ++wanted_bit_count[bit];
    wanted_sizes[bit >> 6] |= std::uint64_t{1} << (bit & 63);
  }
  /// The bin keyed by (rounded, stream), or bin_count (under `lock`).
  [[nodiscard]] std::size_t find_bin(std::size_t rounded, void* stream) const noexcept {
    const std::uint8_t hint = bin_of_bit[size_bit(rounded)];
    if (hint < bin_count) [[likely]] {
      return bins[hint].rounded == rounded && bins[hint].stream == stream ? hint : bin_count;
    }
    if (hint == no_bin) {
      return bin_count;
    }
    for (std::size_t i = 0; i < bin_count; ++i) {  // several bins share the bit
      if (bins[i].rounded == rounded && bins[i].stream == stream) {
        return i;
      }
    }
    return bin_count;
  }
  /// Whether bin `i` (bin_count: none) can take one more block of `rounded` bytes within the
  /// cache's bounds, so that caching it evicts nothing (under `lock`).
  [[nodiscard]] bool room_in(std::size_t i, std::size_t rounded, std::size_t max_bytes,
                             std::size_t max_blocks) const noexcept {
    return i != bin_count && bins[i].count != tc_bin::capacity &&
           cached_bytes + rounded <= max_bytes && cached_blocks + 1 <= max_blocks;
  }
  /// Caches block `ptr` (table entry `e`) in bin `i`, which has room (under `lock`).
  void push(std::size_t i, tc_entry* e, void* ptr, std::size_t rounded) noexcept {
    tc_bin& bin = bins[i];
    bin.blocks[bin.count++] = ptr;
    bin.last_use = ++tick;
    cached_bytes += rounded;
    ++cached_blocks;
    e->cached = true;
  }
  /// Takes the last block of bin `i` (not empty) out, live for a request of `bytes` (under
  /// `lock`).
  void* pop(std::size_t i, std::size_t bytes) noexcept {
    tc_bin& bin = bins[i];
    void* const p = bin.blocks[--bin.count];
    bin.last_use = ++tick;
    cached_bytes -= bin.rounded;
    --cached_blocks;
    tc_entry* e = table.find(p);
    e->cached = false;
    e->requested = bytes;
    return p;
  }
  /// Recomputes bin_sizes and bin_of_bit after a bin's key changed (under `lock`).
  void rekey_bins() noexcept {
    size_filter f{};
    bin_of_bit.fill(no_bin);
    for (std::size_t i = 0; i < bin_count; ++i) {
      if (bins[i].rounded != 0) {
        const unsigned bit = size_bit(bins[i].rounded);
        f[bit >> 6] |= std::uint64_t{1} << (bit & 63);
        bin_of_bit[bit] = bin_of_bit[bit] == no_bin ? static_cast<std::uint8_t>(i) : several_bins;
      }
    }
    for (std::size_t w = 0; w < f.size(); ++w) {
      bin_sizes[w].store(f[w], std::memory_order_relaxed);
    }
  }
};

}  // namespace poolscope::pool::detail
