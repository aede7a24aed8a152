// event_ring: a bounded queue of fixed-size records from any number of threads to one consumer,
// so that a hook's work on the allocating thread is a copy into a slot, and the encoding and
// writing happen on a writer thread (the recorder, the snapshot recorder).
//
//   event_ring ring{1 << 16, sizeof(record)};
//   ring.try_push([&](void* slot) { std::memcpy(slot, &r, sizeof r); });    // any thread
//   ring.drain([&](const void* slot) { encode(*static_cast<const record*>(slot)); });  // one
//
// A slot holds a sequence number (Vyukov's bounded queue): a producer takes the next position with
// one compare-exchange, writes its record and publishes it with a release store; the consumer
// takes records in position order. A full ring drops the record and counts it: dropped() is
// exact, and pushed() + dropped() is every try_push. A producer that took a position and has not
// published it yet holds the consumer at that record (records stay in position order).
//
// Ownership: owns the slots (slots * slot_bytes bytes). Thread safety: try_push from any thread;
// drain from one thread at a time (callers serialise it). Cost: one compare-exchange on a shared
// word and a copy per record; no allocation after construction.
#pragma once

#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>

namespace poolscope::profiler::detail {

class event_ring {
 public:
  /// `slots` is rounded up to a power of two (at least 2); each holds `slot_bytes` bytes.
  event_ring(std::size_t slots, std::size_t slot_bytes)
      : slots_(std::bit_ceil(slots < 2 ? std::size_t{2} : slots)),
        mask_(slots_ - 1),
        stride_((slot_bytes + alignof(std::max_align_t) - 1) & ~(alignof(std::max_align_t) - 1)),
        seq_(std::make_unique<std::atomic<std::uint64_t>[]>(slots_)),
        data_(std::make_unique<std::byte[]>(slots_ * stride_)) {
    for (std::size_t i = 0; i < slots_; ++i) {
      seq_[i].store(i, std::memory_order_relaxed);
    }
  }

  /// Takes a slot and calls fill(void* slot) to write the record; false (counted in dropped())
  /// if the ring is full. fill must not throw.
  template <class Fill>
  bool try_push(Fill&& fill) noexcept {
    std::uint64_t pos = tail_.load(std::memory_order_relaxed);
    while (true) {
      std::atomic<std::uint64_t>& seq = seq_[pos & mask_];
      const std::uint64_t s = seq.load(std::memory_order_acquire);
      const auto diff = static_cast<std::int64_t>(s - pos);
      if (diff == 0) {
        if (tail_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
          fill(static_cast<void*>(data_.get() + (pos & mask_) * stride_));
          seq.store(pos + 1, std::memory_order_release);
          return true;
        }
      } else if (diff < 0) {
        dropped_.fetch_add(1, std::memory_order_relaxed);  // the consumer has not freed it
        return false;
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
      std::atomic<std::uint64_t>& seq = seq_[pos & mask_];
      if (seq.load(std::memory_order_acquire) != pos + 1) {
        break;  // empty, or its producer has not published it yet
      }
      consume(static_cast<const void*>(data_.get() + (pos & mask_) * stride_));
      ++pos;
      ++n;
      head_.store(pos, std::memory_order_release);  // before the slot is freed: peek never
      seq.store(pos - 1 + slots_, std::memory_order_release);  // sees a reused slot as waiting
    }
    return n;
  }

  /// Calls look(const void* slot) for each published record from the oldest, without taking
  /// them: for a fatal-signal handler (async-signal-safe: atomics only), which may run while the
  /// consumer drains (a record may then be seen by both).
  template <class Look>
  void peek(Look&& look) const noexcept {
    std::uint64_t pos = head_.load(std::memory_order_acquire);
    for (std::size_t n = 0; n < slots_; ++n, ++pos) {
      if (seq_[pos & mask_].load(std::memory_order_acquire) != pos + 1) {
        return;
      }
      look(static_cast<const void*>(data_.get() + (pos & mask_) * stride_));
    }
  }

  /// Records taken so far (published or about to be).
  [[nodiscard]] std::uint64_t pushed() const noexcept {
    return tail_.load(std::memory_order_relaxed);
  }
  /// Records dropped because the ring was full.
  [[nodiscard]] std::uint64_t dropped() const noexcept {
    return dropped_.load(std::memory_order_relaxed);
  }
  /// Records waiting (approximate while producers run).
  [[nodiscard]] std::size_t waiting() const noexcept {
    return static_cast<std::size_t>(tail_.load(std::memory_order_relaxed) -
                                    head_.load(std::memory_order_relaxed));
  }
  [[nodiscard]] std::size_t capacity() const noexcept { return slots_; }

 private:
  std::size_t slots_;
  std::size_t mask_;
  std::size_t stride_;
  std::unique_ptr<std::atomic<std::uint64_t>[]> seq_;
  std::unique_ptr<std::byte[]> data_;
  alignas(64) std::atomic<std::uint64_t> tail_{0};
  alignas(64) std::atomic<std::uint64_t> head_{0};
  alignas(64) std::atomic<std::uint64_t> dropped_{0};
};

}  // namespace poolscope::profiler::detail
