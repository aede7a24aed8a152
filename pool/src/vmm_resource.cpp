#include "poolscope/pool/vmm_resource.hpp"

#include <memory>
#include <string>
#include <vector>

#include "detail/cuda_seam.hpp"
#include "detail/physical_mapping.hpp"

namespace poolscope::pool {

namespace {

// The CUDA implementation of the physical-mapping seam, over the driver part of the CUDA seam.
class cuda_mapping final : public detail::physical_mapping {
 public:
  cuda_mapping(int device, bool peer_access)
      : device_(device), granule_(detail::cudrv::granularity(device)) {
    access_.push_back(device);
    if (peer_access) {
      for (const int peer : detail::cudart::peers_of(device)) {
        access_.push_back(peer);
      }
    }
  }

  [[nodiscard]] std::size_t granularity() const noexcept override { return granule_; }
  [[nodiscard]] int device() const noexcept override { return device_; }
  // The driver calls act in the calling thread's current context: each runs with the device's
  // primary context current (a device_guard), whichever thread a pool calls from.
  void* reserve_range(std::size_t bytes) override {
    const detail::cudart::device_guard guard{device_};
    return detail::cudrv::address_reserve(bytes, granule_);
  }
  void release_range(void* base, std::size_t bytes) noexcept override {
    detail::logged([&] {
      const detail::cudart::device_guard guard{device_};
      detail::cudrv::address_free(base, bytes);
    });
  }
  bool map(void* ptr, std::size_t bytes) override {
    const detail::cudart::device_guard guard{device_};
    return detail::cudrv::map(ptr, bytes, granule_, device_, access_);
  }
  void unmap(void* ptr, std::size_t bytes) noexcept override {
    detail::logged([&] {
      const detail::cudart::device_guard guard{device_};
      detail::cudrv::unmap(ptr, bytes, granule_);
    });
  }

 private:
  int device_;
  std::size_t granule_;
  std::vector<int> access_;  // the device, then its peers
};

std::unique_ptr<detail::physical_mapping> checked_cuda_mapping(int device,
                                                               const vmm_options& options) {
  detail::cudrv::require_vmm(device, "vmm_resource");
  const detail::cudart::device_guard guard{device};
  return std::make_unique<cuda_mapping>(device, options.peer_access);
}

std::size_t range_for(int device, const vmm_options& options) {
  // Twice the device's memory by default: a pool's segments may leave address holes, and
  // addresses cost nothing until mapped. The device is checked here too: the base's arguments
  // are evaluated in no set order.
  detail::cudart::require_device(device, "vmm_resource");
  return options.address_range_bytes != 0 ? options.address_range_bytes
                                          : 2 * detail::cudrv::total_memory(device);
}

}  // namespace

vmm_resource::vmm_resource(int device, vmm_options options)
    : virtual_resource(checked_cuda_mapping(device, options), range_for(device, options),
                       options.capacity),
      device_(device) {}

std::string vmm_resource::do_name() const {
  return "vmm:" + std::to_string(device_);
}

}  // namespace poolscope::pool
