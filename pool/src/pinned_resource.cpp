#include "poolscope/pool/pinned_resource.hpp"

#include "detail/cuda_seam.hpp"

namespace poolscope::pool {

pinned_resource::pinned_resource() {
  detail::cudart::require_any_device("pinned_resource");
}

void* pinned_resource::do_try_allocate(stream_view /*stream*/, std::size_t bytes) {
  return detail::cudart::host_alloc(bytes);
}

void pinned_resource::do_deallocate(stream_view /*stream*/, void* ptr,
                                    std::size_t /*bytes*/) noexcept {
  detail::cudart::free_host(ptr);
}

}  // namespace poolscope::pool
