#include "detail/device_memory_seam.hpp"

#include <cuda_runtime_api.h>
#include <unistd.h>

#include "detail/cuda_timing_seam.hpp"
#include "poolscope/detail/cuda_check.hpp"

namespace poolscope::profiler::detail::device_memory {

bool free_bytes(int device, std::uint64_t& out) noexcept {
  using ::poolscope::detail::succeeded;
  if (device < 0) {
    const long pages = ::sysconf(_SC_AVPHYS_PAGES);
    const long page = ::sysconf(_SC_PAGESIZE);
    if (pages < 0 || page < 0) {
      return false;
    }
    out = static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page);
    return true;
  }
  if (!cuda_timing::gpu_available()) {
    return false;
  }
  const int previous = cuda_timing::current_device();
  if (previous < 0 || (previous != device && !succeeded(cudaSetDevice(device)))) {
    return false;
  }
  std::size_t free = 0;
  std::size_t total = 0;
  const bool ok = succeeded(cudaMemGetInfo(&free, &total));
  if (previous != device) {
    (void)succeeded(cudaSetDevice(previous));
  }
  out = free;
  return ok;
}

}  // namespace poolscope::profiler::detail::device_memory
