// Plain host memory: page-backed (mmap) for large blocks, aligned heap for small ones.
//
//   poolscope::pool::host_resource host{/*capacity=*/64 << 20};  // fails past 64 MiB
//   auto pool = poolscope::pool::bfc_allocator{host};
//
// This is how CI exercises every allocator without a GPU, and how `poolscope replay
// --capacity` simulates a device of a given size. Useful in its own right for host staging.
// Accounting: in bytes handed out, the sizes callers asked for: allocated_bytes() is the sum of
// the live blocks' requested sizes (so it equals an allocator's `reserved`, which the allocator
// tests and `poolscope replay` rely on), and the capacity bounds that sum. The memory really
// taken is larger: blocks under 64 KiB are rounded up to 256 bytes (plus malloc's own overhead),
// larger ones to whole pages. To bound the footprint, leave about 256 bytes per live block of
// headroom.
// Ownership: the caller owns each block until it deallocates it; the resource tracks no blocks,
// so destroying it with live blocks leaks them.
// Thread safety: thread-safe (an atomic byte counter). Cost: one mmap/munmap per block of
// >= 64 KiB, aligned_alloc below. Stream: ignored.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

#include "poolscope/pool/resource.hpp"

namespace poolscope::pool {

class host_resource final : public resource {
 public:
  /// `capacity`: the most bytes live at once, counted as requested (see Accounting above);
  /// try_allocate returns nullptr beyond it. `key` >= 0 names the resource "host:<key>" (one of
  /// darray's fake host devices), so that its allocator's name tells it from the others'; the
  /// memory is host memory all the same (device() is -1). Otherwise the name is "host".
  explicit host_resource(std::size_t capacity = std::numeric_limits<std::size_t>::max(),
                         int key = -1) noexcept
      : capacity_(capacity), key_(key) {}

  /// Bytes currently allocated from this resource: the requested sizes of the live blocks.
  [[nodiscard]] std::size_t allocated_bytes() const noexcept {
    return allocated_.load(std::memory_order_relaxed);
  }
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }

 private:
  void* do_try_allocate(stream_view stream, std::size_t bytes) override;
  void do_deallocate(stream_view stream, void* ptr, std::size_t bytes) noexcept override;
  [[nodiscard]] int do_device() const noexcept override { return -1; }
  [[nodiscard]] memory_kind do_kind() const noexcept override { return memory_kind::host; }
  [[nodiscard]] std::string do_name() const override {
    return key_ < 0 ? std::string("host") : "host:" + std::to_string(key_);
  }

  std::size_t capacity_;
  int key_;
  std::atomic<std::size_t> allocated_{0};
};

}  // namespace poolscope::pool
