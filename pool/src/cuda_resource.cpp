#include "poolscope/pool/cuda_resource.hpp"

#include "detail/cuda_seam.hpp"

namespace poolscope::pool {

cuda_resource::cuda_resource(int device) : device_(device) {
  detail::cudart::require_device(device, "cuda_resource");
}

void* cuda_resource::do_try_allocate(stream_view /*stream*/, std::size_t bytes) {
  detail::cudart::device_guard guard{device_};
  return detail::cudart::malloc(bytes);
}

void cuda_resource::do_deallocate(stream_view /*stream*/, void* ptr,
                                  std::size_t /*bytes*/) noexcept {
  // cudaFree finds the device from the pointer (unified addressing): no device switch needed.
  detail::cudart::free(ptr);
}

std::string cuda_resource::do_name() const {
  return "cuda:" + std::to_string(device_);
}

}  // namespace poolscope::pool
