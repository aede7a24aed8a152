// The allocator base's part for strategies over virtual resources (allocator.hpp,
// upstream_map / upstream_unmap): granules mapped count as reserved bytes, as segments do, and
// each map or unmap as an upstream call (upstream_allocs, upstream_frees, upstream_failures).
#include "detail/allocator_counters.hpp"
#include "poolscope/hooks/hook.hpp"
#include "poolscope/pool/allocator.hpp"
#include "poolscope/pool/virtual_resource.hpp"

namespace poolscope::pool {

bool allocator::upstream_map(virtual_resource& vm, stream_view stream, void* ptr,
                             std::size_t bytes) {
  if (refuses_reserve(stream, bytes)) {
    return false;
  }
  detail::allocator_counters& c = *accounts_->counters_;
  const bool hooked = hooks::active();
  if (hooked) [[unlikely]] {
    emit(hooks::event_kind::segment_map, hooks::event_phase::pre, stream, ptr, bytes, 0);
  }
  if (!vm.map(ptr, bytes)) {
    c.upstream_failures.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  const std::size_t res = c.reserved.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  detail::raise_peak(c.peak_reserved, res);
  c.upstream_allocs.fetch_add(1, std::memory_order_relaxed);  // a call to the resource, as any
  if (hooked || hooks::active()) [[unlikely]] {
    emit(hooks::event_kind::segment_map, hooks::event_phase::post, stream, ptr, bytes, bytes);
  }
  return true;
}

void allocator::upstream_unmap(virtual_resource& vm, stream_view stream, void* ptr,
                               std::size_t bytes) noexcept {
  detail::allocator_counters& c = *accounts_->counters_;
  const bool hooked = hooks::active();
  if (hooked) [[unlikely]] {
    emit(hooks::event_kind::segment_unmap, hooks::event_phase::pre, stream, ptr, bytes, bytes);
  }
  // Lowered first, as in upstream_deallocate: the peak must not count these bytes twice.
  c.reserved.fetch_sub(bytes, std::memory_order_relaxed);
  vm.unmap(ptr, bytes);
  c.upstream_frees.fetch_add(1, std::memory_order_relaxed);
  if (hooked || hooks::active()) [[unlikely]] {
    emit(hooks::event_kind::segment_unmap, hooks::event_phase::post, stream, ptr, bytes, bytes);
  }
}

}  // namespace poolscope::pool
