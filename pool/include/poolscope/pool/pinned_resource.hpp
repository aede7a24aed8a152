// Page-locked (pinned) host memory from cudaHostAlloc / cudaFreeHost: host staging buffers that
// copy engines can reach directly (asynchronous cudaMemcpyAsync, zero-copy access).
//
//   poolscope::pool::pinned_resource pinned;              // throws device_unavailable without a
//   GPU poolscope::pool::best_fit_allocator staging{pinned}; void* h = staging.allocate(stream, 64
//   << 20);
//
// The memory is portable (cudaHostAllocPortable): usable from every device's context.
// Ownership: owns nothing but what callers allocated and have not freed; destroying it with live
// allocations leaks them. Thread safety: thread-safe. Stream: ignored (cudaFreeHost waits for
// work using the memory). Cost: one cudaHostAlloc/cudaFreeHost per call (page pinning: slow,
// milliseconds for large blocks): wrap it in a pool.
// Errors: try_allocate returns nullptr when host memory cannot be pinned
// (cudaErrorMemoryAllocation, cleared) and throws cuda_error otherwise; deallocate logs failures.
#pragma once

#include "poolscope/pool/resource.hpp"

namespace poolscope::pool {

class pinned_resource final : public resource {
 public:
  /// Throws device_unavailable when there is no CUDA driver or GPU.
  pinned_resource();

 private:
  void* do_try_allocate(stream_view stream, std::size_t bytes) override;
  void do_deallocate(stream_view stream, void* ptr, std::size_t bytes) noexcept override;
  [[nodiscard]] int do_device() const noexcept override { return -1; }
  [[nodiscard]] memory_kind do_kind() const noexcept override { return memory_kind::pinned_host; }
  [[nodiscard]] std::string do_name() const override { return "pinned"; }
};

}  // namespace poolscope::pool
