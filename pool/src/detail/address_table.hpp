// The hash table of the pools' hot paths: slots keyed by an address. bfc's live-chunk map and the
// per-thread caches' block tables are both this table.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace poolscope::pool::detail {

/// Slots keyed by an address (Slot::key, a std::uintptr_t that is never 0; 0 marks an empty
/// slot): open addressing, linear probing, backward-shift deletion (no tombstones), load factor
/// <= 1/8, multiplicative hashing. The low load keeps almost every key in its home slot and
/// almost every erase free of shifts, so lookups rarely take the unpredicted branch (on random
/// frees, a higher load makes the probe and shift loops the table's main source of mispredicted
/// branches), for about 170 bytes of slots per entry on average. A lookup touches one slot's
/// line at any load.
/// `FirstCapacity` (a power of two) is the first allocation; `Alloc` allocates the slots (bfc's
/// map puts them in its metadata_arena).
/// Ownership: owns its slots. Thread safety: none (its owner's lock guards it). Nothing throws
/// except reserve_one (std::bad_alloc), which callers run before they change anything.
template <typename Slot, std::size_t FirstCapacity, typename Alloc = std::allocator<Slot>>
class address_table {
  static_assert(std::has_single_bit(FirstCapacity) && FirstCapacity >= 8,
                "FirstCapacity must be a power of two of at least 8 (the load factor is 1/8)");

 public:
  address_table() = default;
  explicit address_table(const Alloc& alloc) : slots_(alloc) {}

  /// Makes sure one insert will not allocate. May throw std::bad_alloc. (The check is forced
  /// inline: bfc calls it on every allocation, and GCC otherwise called it through the PLT.)
  [[gnu::always_inline]] void reserve_one() {
    if (size_ >= grow_at_) [[unlikely]] {
      grow();
    }
  }
  /// Adds `s` (its key absent). Precondition: reserve_one() since the last insert.
  void insert(const Slot& s) noexcept {
    std::size_t i = home(s.key);
    while (slots_[i].key != 0) {
      i = (i + 1) & mask_;
    }
    slots_[i] = s;
    ++size_;
  }
  /// The slot of `p`, or null. Valid until the next insert or erase.
  [[nodiscard]] Slot* find(const void* p) noexcept {
    if (size_ == 0) {
      return nullptr;
    }
    const auto key = reinterpret_cast<std::uintptr_t>(p);
    for (std::size_t i = home(key);; i = (i + 1) & mask_) {
      if (slots_[i].key == key) {
        return &slots_[i];
      }
      if (slots_[i].key == 0) {
        return nullptr;
      }
    }
  }
  [[nodiscard]] const Slot* find(const void* p) const noexcept {
    return const_cast<address_table*>(this)->find(p);  // NOLINT: same lookup, no change
  }
  /// Removes the slot `s` points at (from find()).
  void erase(Slot* s) noexcept {
    // At a load of 1/8 the next slot is almost always empty: then nothing moves, and the slot's
    // index is not needed (the shift loop's first test by index would be wasted work).
    Slot* const next = s + 1 != slots_.data() + slots_.size() ? s + 1 : slots_.data();
    if (next->key == 0) [[likely]] {
      *s = Slot{};
      --size_;
      return;
    }
    auto i = static_cast<std::size_t>(s - slots_.data());
    // Backward shift: pull later slots of the probe run into the hole when their home does not
    // lie cyclically in (hole, j].
    for (std::size_t j = (i + 1) & mask_; slots_[j].key != 0; j = (j + 1) & mask_) {
      const std::size_t k = home(slots_[j].key);
      const bool stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
      if (!stays) {
        slots_[i] = slots_[j];
        i = j;
      }
    }
    slots_[i] = Slot{};
    --size_;
  }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  /// Calls f(slot) for every slot in use (f must not insert or erase).
  template <typename F>
  void for_each(F&& f) {
    for (Slot& s : slots_) {
      if (s.key != 0) {
        f(s);
      }
    }
  }
  template <typename F>
  void for_each(F&& f) const {
    for (const Slot& s : slots_) {
      if (s.key != 0) {
        f(s);
      }
    }
  }
  /// Empties the table and frees its slots.
  void clear() noexcept {
    slots_.clear();
    slots_.shrink_to_fit();
    size_ = 0;
    grow_at_ = 0;
  }

 private:
  [[nodiscard]] std::size_t home(std::uintptr_t key) const noexcept {
    return static_cast<std::size_t>((key * 0x9E3779B97F4A7C15ULL) >> shift_);
  }
  [[gnu::noinline]] void grow() { rehash(slots_.empty() ? FirstCapacity : slots_.size() * 2); }
  void rehash(std::size_t capacity) {
    std::vector<Slot, Alloc> old(capacity, Slot{}, slots_.get_allocator());
    old.swap(slots_);
    mask_ = capacity - 1;
    shift_ = 64 - static_cast<unsigned>(std::countr_zero(capacity));
    grow_at_ = capacity / 8;
    size_ = 0;
    for (const Slot& s : old) {
      if (s.key != 0) {
        insert(s);
      }
    }
  }

  std::vector<Slot, Alloc> slots_;
  std::size_t mask_ = 0;
  unsigned shift_ = 64;
  std::size_t size_ = 0;
  std::size_t grow_at_ = 0;  // the size at which an insert would pass the load factor: grow
};

}  // namespace poolscope::pool::detail
