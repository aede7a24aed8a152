// The snapshot recorder's seam for a device's free memory (the `device_free` of an oom entry):
// cudaMemGetInfo for a GPU, the kernel's count of available pages for host memory.
//
// Preconditions: none; without a GPU (or a driver) a device's figure is unknown.
// Error convention: nothing throws; false when the figure is unknown. The CUDA call leaves no
// error in the runtime's last-error state (the application's next cudaGetLastError() must not
// report it), and the calling thread's current device is restored.
// Thread safety: thread-safe.
#pragma once

#include <cstdint>

namespace poolscope::profiler::detail::device_memory {

/// Free bytes of CUDA device `device`, or of host memory for device -1.
[[nodiscard]] bool free_bytes(int device, std::uint64_t& out) noexcept;

}  // namespace poolscope::profiler::detail::device_memory
