// The physical-mapping seam of the virtual resources: the ONE interface through which
// virtual_resource reserves address space and maps memory into it. virtual_resource holds all
// the logic (range bookkeeping, capacity, counts); an implementation only makes the calls.
// Two implementations: host_mapping (host_vmm_resource.cpp: mmap, mprotect, madvise) and
// cuda_mapping (vmm_resource.cpp: the CUDA driver's VMM calls, through cuda_seam.hpp).
//
// Preconditions: every address and size passed is a multiple of granularity() and lies inside
// the one range reserve_range returned; map is called only on unmapped granules and unmap only
// on mapped ones (virtual_resource checks the arguments it is given; the strategies above it own
// their granules).
// Error conventions: reserve_range throws (runtime_error, cuda_error, device_unavailable) when
// the address space cannot be reserved. map returns false when out of memory (ENOMEM,
// CUDA_ERROR_OUT_OF_MEMORY) with nothing left mapped, and throws for any other failure. unmap and
// release_range are noexcept: failures are logged.
// Thread safety: map and unmap of disjoint granules may run concurrently.
#pragma once

#include <cstddef>

namespace poolscope::pool::detail {

class physical_mapping {
 public:
  physical_mapping() = default;
  physical_mapping(const physical_mapping&) = delete;
  physical_mapping& operator=(const physical_mapping&) = delete;
  virtual ~physical_mapping() = default;

  /// Bytes of one granule (a power of two or a multiple of the page size).
  [[nodiscard]] virtual std::size_t granularity() const noexcept = 0;
  /// The device the memory lives on; -1 for host memory.
  [[nodiscard]] virtual int device() const noexcept = 0;
  /// Reserves `bytes` of address space with nothing mapped; returns its start.
  [[nodiscard]] virtual void* reserve_range(std::size_t bytes) = 0;
  /// Releases the range reserve_range returned (everything in it unmapped).
  virtual void release_range(void* base, std::size_t bytes) noexcept = 0;
  /// Backs [ptr, ptr + bytes) with readable, writable memory; false when out of memory.
  [[nodiscard]] virtual bool map(void* ptr, std::size_t bytes) = 0;
  /// Gives back the memory behind [ptr, ptr + bytes); the addresses stay reserved.
  virtual void unmap(void* ptr, std::size_t bytes) noexcept = 0;
};

}  // namespace poolscope::pool::detail
