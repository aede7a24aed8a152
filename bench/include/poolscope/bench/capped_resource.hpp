// capped_resource: a resource adaptor that fails allocations past a byte capacity.
//
//   auto host = poolscope::pool::make_resource("host");
//   poolscope::bench::capped_resource h100_sized{*host, std::size_t{80} << 30};
//   auto pool = poolscope::pool::make_allocator("best_fit", h100_sized);
//
// Benchmarks on the host resource use it to give host memory a GPU's size, so strategies that
// hoard cache (best_fit) hit "out of memory", release and retry as they would on a device.
// Ownership: holds `upstream` by reference (it must outlive the adaptor); owns nothing else.
// Thread safety: thread-safe (one atomic byte counter). Stream: passed through.
// Cost: two relaxed atomic operations per call on top of the upstream's.
#pragma once

#include <atomic>
#include <cstddef>

#include "poolscope/pool/resource.hpp"

namespace poolscope::bench {

class capped_resource final : public pool::resource {
 public:
  /// Forwards to `upstream` while the bytes live through this adaptor stay <= `capacity`.
  capped_resource(pool::resource& upstream, std::size_t capacity) noexcept
      : upstream_(&upstream), capacity_(capacity) {}

  /// Bytes currently allocated through this adaptor.
  [[nodiscard]] std::size_t allocated_bytes() const noexcept {
    return allocated_.load(std::memory_order_relaxed);
  }
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }

 private:
  void* do_try_allocate(stream_view stream, std::size_t bytes) override;
  void do_deallocate(stream_view stream, void* ptr, std::size_t bytes) noexcept override;
  [[nodiscard]] int do_device() const noexcept override { return upstream_->device(); }
  [[nodiscard]] pool::memory_kind do_kind() const noexcept override { return upstream_->kind(); }
  [[nodiscard]] std::string do_name() const override { return upstream_->name(); }
  [[nodiscard]] bool do_stream_ordered() const noexcept override {
    return upstream_->stream_ordered();
  }

  pool::resource* upstream_;
  std::size_t capacity_;
  std::atomic<std::size_t> allocated_{0};
};

}  // namespace poolscope::bench
