// Upstream memory resources: where allocators get their memory.
//
//   poolscope::pool::host_resource host;                         // plain host memory
//   void* p = host.try_allocate(poolscope::stream_view{}, 1 << 20);
//   if (p == nullptr) { /* out of memory */ }
//   host.deallocate(poolscope::stream_view{}, p, 1 << 20);
//
// Contract: try_allocate(stream, bytes) returns memory aligned to at least 256 bytes, or nullptr
// when the upstream is out of memory; any other failure throws (cuda_error, device_unavailable).
// deallocate(stream, ptr, bytes) is noexcept and takes the size that was allocated.
// Stream semantics: stream-ordered resources (cuda_async) allocate and free in stream order;
// the others ignore the stream.
// Ownership: a resource owns nothing the caller did not free and tracks no blocks; destroying it
// with live allocations leaks them (device, pinned and host resources alike).
// Thread safety: every resource is thread-safe.
#pragma once

#include <cstddef>
#include <string>

#include "poolscope/stream_view.hpp"

namespace poolscope::pool {

/// Where a resource's memory lives.
enum class memory_kind { device, pinned_host, host };

/// Abstract upstream resource. Public non-virtual methods call the private do_* virtuals.
class resource {
 public:
  resource() = default;
  resource(const resource&) = delete;
  resource& operator=(const resource&) = delete;
  virtual ~resource() = default;

  /// `bytes` (> 0) of memory aligned to >= 256 bytes, or nullptr if the upstream is exhausted.
  [[nodiscard]] void* try_allocate(stream_view stream, std::size_t bytes) {
    return do_try_allocate(stream, bytes);
  }
  /// Returns memory from try_allocate; `bytes` must be the size asked for.
  void deallocate(stream_view stream, void* ptr, std::size_t bytes) noexcept {
    do_deallocate(stream, ptr, bytes);
  }
  /// CUDA device ordinal the memory belongs to; -1 for host memory.
  [[nodiscard]] int device() const noexcept { return do_device(); }
  [[nodiscard]] memory_kind kind() const noexcept { return do_kind(); }
  /// Short name for reports: "cuda:0", "cuda_async:1", "pinned", "host".
  [[nodiscard]] std::string name() const { return do_name(); }
  /// True if allocation and free are ordered on the stream passed (cudaMallocAsync).
  [[nodiscard]] bool stream_ordered() const noexcept { return do_stream_ordered(); }

 private:
  virtual void* do_try_allocate(stream_view stream, std::size_t bytes) = 0;
  virtual void do_deallocate(stream_view stream, void* ptr, std::size_t bytes) noexcept = 0;
  [[nodiscard]] virtual int do_device() const noexcept = 0;
  [[nodiscard]] virtual memory_kind do_kind() const noexcept = 0;
  [[nodiscard]] virtual std::string do_name() const = 0;
  [[nodiscard]] virtual bool do_stream_ordered() const noexcept { return false; }
};

}  // namespace poolscope::pool
