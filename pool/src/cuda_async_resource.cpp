#include "poolscope/pool/cuda_async_resource.hpp"

#include "detail/cuda_seam.hpp"

namespace poolscope::pool {
namespace {
cudaMemPool_t as_pool(void* p) noexcept {
  return static_cast<cudaMemPool_t>(p);
}
cudaStream_t as_stream(stream_view s) noexcept {
  return static_cast<cudaStream_t>(s.value());
}
}  // namespace

cuda_async_resource::cuda_async_resource(int device, std::size_t release_threshold)
    : device_(device) {
  detail::cudart::require_device(device, "cuda_async_resource");
  detail::cudart::device_guard guard{device_};
  pool_ = detail::cudart::mem_pool_create(device, release_threshold);
}

cuda_async_resource::~cuda_async_resource() {
  detail::cudart::mem_pool_destroy(as_pool(pool_));
}

std::uint64_t cuda_async_resource::release_threshold() const {
  return detail::cudart::mem_pool_attribute(as_pool(pool_), cudaMemPoolAttrReleaseThreshold);
}

std::uint64_t cuda_async_resource::pool_reserved_bytes() const {
  return detail::cudart::mem_pool_attribute(as_pool(pool_), cudaMemPoolAttrReservedMemCurrent);
}

std::uint64_t cuda_async_resource::pool_used_bytes() const {
  return detail::cudart::mem_pool_attribute(as_pool(pool_), cudaMemPoolAttrUsedMemCurrent);
}

void cuda_async_resource::trim_to(std::size_t keep_bytes) {
  detail::cudart::mem_pool_trim_to(as_pool(pool_), keep_bytes);
}

void* cuda_async_resource::do_try_allocate(stream_view stream, std::size_t bytes) {
  detail::cudart::device_guard guard{device_};
  return detail::cudart::malloc_async(as_pool(pool_), bytes, as_stream(stream));
}

void cuda_async_resource::do_deallocate(stream_view stream, void* ptr,
                                        std::size_t /*bytes*/) noexcept {
  detail::cudart::free_async(ptr, as_stream(stream));
}

std::string cuda_async_resource::do_name() const {
  return "cuda_async:" + std::to_string(device_);
}

}  // namespace poolscope::pool
