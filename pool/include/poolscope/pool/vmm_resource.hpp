// vmm: device memory through the CUDA driver's virtual memory management. One address range
// per device is reserved with cuMemAddressReserve; physical granules
// (cuMemGetAllocationGranularity, 2 MiB on current GPUs) are created with cuMemCreate, mapped with
// cuMemMap, made accessible with cuMemSetAccess (to the device and, by default, to every peer that
// can access it, so that darray can copy between devices), and given back with cuMemUnmap.
//
//   poolscope::pool::vmm_resource gpu{0};      // device_unavailable without a GPU
//   poolscope::pool::bfc_allocator pool{gpu};  // reserved: the bytes physically mapped
//   void* p = pool.allocate(stream, 100 << 20);
//
// The driver is reached through the runtime's entry-point lookup
// (cudaGetDriverEntryPointByVersion), so programs need no link to libcuda and start without a
// driver; every driver call is checked (POOLSCOPE_CUDA_CHECK, detail/cuda_seam.hpp). The logic is
// virtual_resource's, shared with host_vmm_resource, which CI tests. Ownership, thread safety and
// stream semantics: virtual_resource.hpp. Each granule is a physical allocation of its own (so any
// granule can be unmapped alone): a map of n granules is n cuMemCreate + cuMemMap calls and one
// cuMemSetAccess (tens of µs each); unmapping n granules is n cuMemUnmap calls, synchronous with
// the device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "poolscope/pool/virtual_resource.hpp"

namespace poolscope::pool {

/// How a vmm_resource reserves and maps.
struct vmm_options {
  /// Bytes of address space reserved; 0: twice the device's memory.
  std::size_t address_range_bytes = 0;
  /// The most bytes mapped at once; SIZE_MAX: what the device gives.
  std::size_t capacity = SIZE_MAX;
  /// Grant every peer device that can access this one read/write access to the mapped memory.
  bool peer_access = true;
};

class vmm_resource final : public virtual_resource {
 public:
  /// Memory on CUDA device `device`. Throws invalid_argument naming `device` when it is negative
  /// or past the last device, device_unavailable without a GPU or when the device does not
  /// support virtual memory management, cuda_error for any other driver failure.
  explicit vmm_resource(int device = 0, vmm_options options = {});

 private:
  [[nodiscard]] memory_kind do_kind() const noexcept override { return memory_kind::device; }
  [[nodiscard]] std::string do_name() const override;

  int device_;
};

}  // namespace poolscope::pool
