#include "poolscope/bench/capped_resource.hpp"

namespace poolscope::bench {

void* capped_resource::do_try_allocate(stream_view stream, std::size_t bytes) {
  // Reserve first so that concurrent callers cannot pass the capacity together.
  const std::size_t prev = allocated_.fetch_add(bytes, std::memory_order_relaxed);
  if (prev + bytes < prev || prev + bytes > capacity_) {
    allocated_.fetch_sub(bytes, std::memory_order_relaxed);
    return nullptr;
  }
  void* p = nullptr;
  try {
    p = upstream_->try_allocate(stream, bytes);
  } catch (...) {
    allocated_.fetch_sub(bytes, std::memory_order_relaxed);
    throw;
  }
  if (p == nullptr) {
    allocated_.fetch_sub(bytes, std::memory_order_relaxed);
  }
  return p;
}

void capped_resource::do_deallocate(stream_view stream, void* ptr, std::size_t bytes) noexcept {
  upstream_->deallocate(stream, ptr, bytes);
  allocated_.fetch_sub(bytes, std::memory_order_relaxed);
}

}  // namespace poolscope::bench
