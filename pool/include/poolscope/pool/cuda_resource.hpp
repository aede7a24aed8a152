// Device memory from cudaMalloc / cudaFree: the plainest GPU resource.
//
//   poolscope::pool::cuda_resource gpu{0};               // throws device_unavailable without a GPU
//   poolscope::pool::bfc_allocator pool{gpu};
//   void* p = gpu.try_allocate(stream, 1 << 20);         // nullptr when the device is full
//   gpu.deallocate(stream, p, 1 << 20);
//
// Ownership: owns nothing but what callers allocated and have not freed; destroying it with live
// allocations leaks them (they stay valid until the process ends or cudaDeviceReset).
// Thread safety: thread-safe (the CUDA runtime is). Stream: ignored; cudaMalloc and cudaFree
// are synchronous with respect to the device (cudaFree waits for work using the memory).
// Cost: one cudaMalloc/cudaFree per call (hundreds of µs for large blocks): wrap it in a pool.
// Errors: try_allocate returns nullptr on cudaErrorMemoryAllocation (the error is cleared) and
// throws cuda_error for any other failure; deallocate logs failures.
#pragma once

#include "poolscope/pool/resource.hpp"

namespace poolscope::pool {

class cuda_resource final : public resource {
 public:
  /// Memory on CUDA device `device`. Throws invalid_argument naming `device` when it is negative
  /// (checked first, on any machine) or past the last device, and device_unavailable when there
  /// is no GPU.
  explicit cuda_resource(int device = 0);

 private:
  void* do_try_allocate(stream_view stream, std::size_t bytes) override;
  void do_deallocate(stream_view stream, void* ptr, std::size_t bytes) noexcept override;
  [[nodiscard]] int do_device() const noexcept override { return device_; }
  [[nodiscard]] memory_kind do_kind() const noexcept override { return memory_kind::device; }
  [[nodiscard]] std::string do_name() const override;

  int device_;
};

}  // namespace poolscope::pool
