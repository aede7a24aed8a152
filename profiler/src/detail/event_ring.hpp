// event_ring: a bounded queue of fixed-size records from any number of threads to one consumer,
// so that a hook's work on the allocating thread is a copy into a slot, and the encoding and
// writing happen on a writer thread (the recorder, the snapshot recorder).
//
//   event_ring ring{1 << 16, sizeof(record)};
//   if (ring.try_push([&](void* slot) { std::memcpy(slot, &r, sizeof r); }) !=
//       event_ring::push_result::stored) {
//     writer.wake();                                                        // any thread
//   }
//   ring.drain([&](const void* slot) { encode(*static_cast<const record*>(slot)); });  // one
//
// A slot holds its record and a sequence number (Vyukov's bounded queue): a producer takes the
// next position with one compare-exchange, writes its record and publishes it with a release
// store of the slot's sequence; the consumer takes records in position order. A full ring drops
// the record and counts it: dropped() is exact, and pushed() + dropped() is every try_push. A
// producer that took a position and has not published it yet holds the consumer at that record
// (records stay in position order).
//
// The layout keeps the allocating thread off the consumer's cache lines, whose moves between
// cores are what a push costs on a machine of many cores: a slot is whole cache lines, its
// sequence number at its end (a record of up to 60 bytes and its sequence share one line, so a
// push writes one line the consumer freed a ring's length ago); producers never read the
// consumer's position, and learn that the consumer should run from their own position (every
// quarter of the ring, push_result::stored_wake) or from a full ring (push_result::dropped).
// The consumer publishes its position and frees slots once per batch of up to `batch` records,
// so a producer that finds the ring full keeps reading a line that does not change under it
// until a batch is freed.
//
// Ownership: owns the slots (capacity() * stride bytes, the stride being the record and a 4-byte
// sequence rounded up to 64 bytes). Thread safety: try_push from any thread; drain from one
// thread at a time (callers serialise it); peek from any thread, also while others push and
// drain. Cost: a compare-exchange on a shared word and a copy into one line per record (records
// up to 60 bytes); no allocation after construction.
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>

namespace poolscope::profiler::detail {

class event_ring {
 public:
  /// Records a slot holds in one cache line with its sequence number.
  static constexpr std::size_t line_bytes = 64;
  static constexpr std::size_t max_one_line_record = line_bytes - sizeof(std::uint32_t);
  /// The most slots a ring has (sequence numbers are 32 bits: they stay unambiguous while they
  /// differ by less than 2^31).
  static constexpr std::size_t max_slots = std::size_t{1} << 30;
  /// Records the consumer takes before it publishes its position and frees their slots.
  static constexpr std::size_t batch = 64;

  /// What try_push did.
  enum class push_result {
    stored,       ///< the record is in the ring
    stored_wake,  ///< the record is in the ring and completes a quarter of it: drain soon
    dropped,      ///< the ring was full: the record is dropped and counted; drain soon
  };

  /// `slots` is rounded up to a power of two in 2..max_slots; each holds `slot_bytes` bytes.
  /// `first` is the position of the first record (tests start near 2^32 to see the sequence
  /// numbers wrap).
  event_ring(std::size_t slots, std::size_t slot_bytes, std::uint64_t first = 0)
      : slots_(std::bit_ceil(std::clamp(slots, std::size_t{2}, max_slots))),
        mask_(slots_ - 1),
        wake_mask_(std::max<std::size_t>(slots_ / 4, 1) - 1),
        stride_((slot_bytes + sizeof(std::uint32_t) + line_bytes - 1) & ~(line_bytes - 1)),
        data_(static_cast<std::byte*>(
            ::operator new[](slots_* stride_, std::align_val_t{line_bytes}))),
        first_(first),
        tail_(first),
        head_(first) {
    for (std::uint64_t pos = first; pos != first + slots_; ++pos) {
      new (slot_at(pos) + stride_ - sizeof(std::uint32_t))
          std::atomic<std::uint32_t>(static_cast<std::uint32_t>(pos));
    }
  }

  /// Takes a slot and calls fill(void* slot) to write the record (the slot is 64-byte aligned);
  /// dropped (counted in dropped()) if the ring is full. fill must not throw.
  template <class Fill>
  push_result try_push(Fill&& fill) noexcept {
    std::uint64_t pos = tail_.load(std::memory_order_relaxed);
    while (true) {
      std::atomic<std::uint32_t>& seq = seq_at(pos);
      const std::uint32_t s = seq.load(std::memory_order_acquire);
      const auto diff = static_cast<std::int32_t>(s - static_cast<std::uint32_t>(pos));
      if (diff == 0) {
        if (tail_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
          fill(static_cast<void*>(slot_at(pos)));
          seq.store(static_cast<std::uint32_t>(pos + 1), std::memory_order_release);
          return ((pos + 1) & wake_mask_) == 0 ? push_result::stored_wake : push_result::stored;
        }
      } else if (diff < 0) {
        dropped_.fetch_add(1, std::memory_order_relaxed);  // the consumer has not freed it
        return push_result::dropped;
      } else {
        pos = tail_.load(std::memory_order_relaxed);  // another producer took it
      }
    }
  }

  /// Hands the published records, oldest first, to consume(const void* slot), at most `max`;
  /// returns how many. One caller at a time.
  template <class Consume>
  std::size_t drain(Consume&& consume, std::size_t max = SIZE_MAX) {
    std::size_t n = 0;
    std::uint64_t pos = head_.load(std::memory_order_relaxed);
    while (n < max) {
      const std::uint64_t first = pos;
      while (n < max && pos - first < batch &&
             seq_at(pos).load(std::memory_order_acquire) == static_cast<std::uint32_t>(pos + 1)) {
        consume(static_cast<const void*>(slot_at(pos)));
        ++pos;
        ++n;
      }
      if (pos == first) {
        break;  // empty, or its producer has not published it yet
      }
      // Before the slots are freed: peek never sees a reused slot as waiting.
      head_.store(pos, std::memory_order_release);
      for (std::uint64_t p = first; p != pos; ++p) {
        seq_at(p).store(static_cast<std::uint32_t>(p + slots_), std::memory_order_release);
      }
      if (pos - first < batch) {
        break;  // stopped at an unpublished record (or at max)
      }
    }
    return n;
  }

  /// Calls look(const void* slot) for each published record from the oldest, without taking
  /// them: for a fatal-signal handler (async-signal-safe: atomics only), which may run while the
  /// consumer drains. It starts at the position the consumer last published, so it also sees
  /// the records of the batch the consumer was taking (up to `batch` records seen by both).
  template <class Look>
  void peek(Look&& look) const noexcept {
    std::uint64_t pos = head_.load(std::memory_order_acquire);
    for (std::size_t n = 0; n < slots_; ++n, ++pos) {
      if (seq_at(pos).load(std::memory_order_acquire) != static_cast<std::uint32_t>(pos + 1)) {
        return;
      }
      look(static_cast<const void*>(slot_at(pos)));
    }
  }

  /// Records taken so far (published or about to be).
  [[nodiscard]] std::uint64_t pushed() const noexcept {
    return tail_.load(std::memory_order_relaxed) - first_;
  }
  /// Records dropped because the ring was full.
  [[nodiscard]] std::uint64_t dropped() const noexcept {
    return dropped_.load(std::memory_order_relaxed);
  }
  /// Records not yet freed by the consumer (approximate while others push and drain). Reads the
  /// consumer's position: not for the allocating thread's path.
  [[nodiscard]] std::size_t waiting() const noexcept {
    return static_cast<std::size_t>(tail_.load(std::memory_order_relaxed) -
                                    head_.load(std::memory_order_relaxed));
  }
  [[nodiscard]] std::size_t capacity() const noexcept { return slots_; }

 private:
  struct aligned_delete {
    void operator()(std::byte* p) const noexcept {
      ::operator delete[](p, std::align_val_t{line_bytes});
    }
  };

  [[nodiscard]] std::byte* slot_at(std::uint64_t pos) const noexcept {
    return data_.get() + (pos & mask_) * stride_;
  }
  [[nodiscard]] std::atomic<std::uint32_t>& seq_at(std::uint64_t pos) const noexcept {
    return *std::launder(reinterpret_cast<std::atomic<std::uint32_t>*>(slot_at(pos) + stride_ -
                                                                       sizeof(std::uint32_t)));
  }

  std::size_t slots_;
  std::size_t mask_;
  std::size_t wake_mask_;
  std::size_t stride_;
  std::unique_ptr<std::byte[], aligned_delete> data_;
  std::uint64_t first_;
  alignas(64) std::atomic<std::uint64_t> tail_;
  alignas(64) std::atomic<std::uint64_t> head_;
  alignas(64) std::atomic<std::uint64_t> dropped_{0};
};

}  // namespace poolscope::profiler::detail
