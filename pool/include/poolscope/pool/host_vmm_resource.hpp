// host_vmm: the CPU twin of vmm_resource. Host address space reserved with mmap(PROT_NONE),
// granules committed with mprotect(PROT_READ | PROT_WRITE) and given back with
// madvise(MADV_DONTNEED) + mprotect(PROT_NONE).
//
//   poolscope::pool::host_vmm_resource host;   // 64 GiB of addresses, 2 MiB granules
//   poolscope::pool::bfc_allocator pool{host};  // maps granules as chunks need them
//   void* p = pool.allocate(stream, 3 << 20);   // two granules mapped
//   pool.deallocate(stream, p, 3 << 20);        // kept mapped within the unmap policy's band
//
// It shares all its logic with vmm_resource (virtual_resource.hpp), so CI tests that logic on the
// CPU; `poolscope replay --resource host_vmm` shows what a log's peak physical memory would be.
// Ownership, thread safety, stream semantics and cost: virtual_resource.hpp. A system call per
// map (one mprotect for the whole range) and two per unmap.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "poolscope/pool/virtual_resource.hpp"

namespace poolscope::pool {

/// How a host_vmm_resource reserves and maps.
struct host_vmm_options {
  /// Bytes of address space reserved (rounded up to the granule).
  std::size_t address_range_bytes = std::size_t{64} << 30;
  /// Granule: a positive multiple of the system page size. 2 MiB as on GPUs by default.
  std::size_t granule_bytes = std::size_t{2} << 20;
  /// The most bytes mapped at once (a budget past which map fails as on an exhausted device);
  /// SIZE_MAX: what the system gives.
  std::size_t capacity = SIZE_MAX;
};

class host_vmm_resource final : public virtual_resource {
 public:
  /// Throws invalid_argument naming the field when granule_bytes is not a positive multiple of
  /// the page size or address_range_bytes is 0; runtime_error naming errno when the address
  /// space cannot be reserved.
  explicit host_vmm_resource(host_vmm_options options = {});

 private:
  [[nodiscard]] memory_kind do_kind() const noexcept override { return memory_kind::host; }
  [[nodiscard]] std::string do_name() const override { return "host_vmm"; }
};

}  // namespace poolscope::pool
