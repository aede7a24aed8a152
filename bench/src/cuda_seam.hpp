// The bench component's one seam to CUDA. Everything else in bench/ is CUDA-free.
// Preconditions: pointers passed to the copy functions are device memory of the current device
// (or host memory, for the host side). Errors: device_count never throws (0 on any error); the
// copies throw poolscope::cuda_error naming the failed call.
#pragma once

#include <cstddef>

namespace poolscope::bench::detail {

/// cudaGetDeviceCount, or 0 if it fails (no driver, no GPU).
[[nodiscard]] int device_count() noexcept;
/// cudaMemcpy host -> device (synchronous).
void copy_to_device(void* dst, const void* src, std::size_t bytes);
/// cudaMemcpy device -> host (synchronous).
void copy_to_host(void* dst, const void* src, std::size_t bytes);

}  // namespace poolscope::bench::detail
