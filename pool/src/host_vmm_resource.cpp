#include "poolscope/pool/host_vmm_resource.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>

#include "detail/physical_mapping.hpp"
#include "poolscope/error.hpp"
#include "poolscope/log.hpp"

namespace poolscope::pool {

namespace {

std::string errno_text(int err) {
  return std::string(std::strerror(err)) + " (errno " + std::to_string(err) + ")";
}

// The host implementation of the physical-mapping seam. The reservation is private, anonymous
// and PROT_NONE (no commit charge, nothing touchable); mapping makes granules readable and
// writable (pages appear on first touch), unmapping drops their pages (MADV_DONTNEED) and makes
// them untouchable again, so a stray access to an unmapped granule faults as on a GPU.
class host_mapping final : public detail::physical_mapping {
 public:
  explicit host_mapping(std::size_t granule) : granule_(granule) {}

  [[nodiscard]] std::size_t granularity() const noexcept override { return granule_; }
  [[nodiscard]] int device() const noexcept override { return -1; }

  void* reserve_range(std::size_t bytes) override {
    void* p = ::mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      throw runtime_error("poolscope: host_vmm: cannot reserve " + format_bytes(bytes) +
                          " of address space: mmap failed: " + errno_text(errno));
    }
    return p;
  }
  void release_range(void* base, std::size_t bytes) noexcept override {
    if (::munmap(base, bytes) != 0) {
      log(log_level::error,
          "poolscope: host_vmm: munmap of the reservation failed: " + errno_text(errno));
    }
  }
  bool map(void* ptr, std::size_t bytes) override {
    if (::mprotect(ptr, bytes, PROT_READ | PROT_WRITE) == 0) {
      return true;
    }
    const int err = errno;
    if (err == ENOMEM || err == EAGAIN) {
      return false;  // out of memory (commit limit, or too many mappings)
    }
    throw runtime_error("poolscope: host_vmm: mprotect(PROT_READ | PROT_WRITE) of " +
                        format_bytes(bytes) + " failed: " + errno_text(err));
  }
  void unmap(void* ptr, std::size_t bytes) noexcept override {
    if (::madvise(ptr, bytes, MADV_DONTNEED) != 0 || ::mprotect(ptr, bytes, PROT_NONE) != 0) {
      log(log_level::error, "poolscope: host_vmm: giving back " + format_bytes(bytes) +
                                " failed: " + errno_text(errno));
    }
  }

 private:
  std::size_t granule_;
};

std::unique_ptr<detail::physical_mapping> checked_host_mapping(const host_vmm_options& o) {
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  if (o.granule_bytes == 0 || o.granule_bytes % page != 0) {
    throw invalid_argument(
        "poolscope: host_vmm_options.granule_bytes = " + std::to_string(o.granule_bytes) +
        " must be a positive multiple of the page size (" + std::to_string(page) + " bytes)");
  }
  if (o.address_range_bytes == 0) {
    throw invalid_argument("poolscope: host_vmm_options.address_range_bytes = 0 reserves nothing");
  }
  return std::make_unique<host_mapping>(o.granule_bytes);
}

}  // namespace

host_vmm_resource::host_vmm_resource(host_vmm_options options)
    : virtual_resource(checked_host_mapping(options), options.address_range_bytes,
                       options.capacity) {}

}  // namespace poolscope::pool
