#include "poolscope/pool/naive_allocator.hpp"

namespace poolscope::pool {

naive_allocator::naive_allocator(resource& upstream)
    : allocator(upstream, "naive/" + upstream.name()) {}

naive_allocator::~naive_allocator() {
  // Blocks the user never freed go back to the resource: the allocator owns what it reserved.
  for (auto& [ptr, b] : live_) {
    upstream_deallocate(stream_view{}, ptr, b.requested);
  }
}

block naive_allocator::do_allocate(stream_view stream, std::size_t bytes, std::size_t /*align*/) {
  void* p = upstream_allocate(stream, bytes);
  if (p == nullptr) {
    return {};
  }
  try {
    std::lock_guard lock(mutex_);
    live_.emplace(p, live_block{bytes});
  } catch (...) {
    upstream_deallocate(stream, p, bytes);  // no host memory to track it: give it back
    throw;
  }
  return {p, bytes};
}

free_outcome naive_allocator::do_deallocate(stream_view stream, void* ptr, std::size_t bytes,
                                            std::size_t /*align*/) noexcept {
  std::size_t true_size = 0;
  {
    std::lock_guard lock(mutex_);
    auto it = live_.find(ptr);
    if (it == live_.end()) {
      // Without a cache the allocator cannot tell a double free from a stranger's pointer.
      return {hooks::free_error::unknown_pointer, 0, 0};
    }
    true_size = it->second.requested;
    live_.erase(it);
  }
  upstream_deallocate(stream, ptr, true_size);
  const auto err = true_size == bytes ? hooks::free_error::none : hooks::free_error::size_mismatch;
  return {err, true_size, true_size};
}

void naive_allocator::do_cache_stats(allocator_stats& s) const {
  s.cached_blocks = 0;
  s.cached_bytes = 0;
  s.largest_free_block = 0;
}

}  // namespace poolscope::pool
