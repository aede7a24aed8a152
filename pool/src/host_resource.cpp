#include "poolscope/pool/host_resource.hpp"

#include <sys/mman.h>

#include <cstdlib>

namespace poolscope::pool {
namespace {
constexpr std::size_t k_mmap_threshold = 64 * 1024;
constexpr std::size_t k_alignment = 256;
}  // namespace

void* host_resource::do_try_allocate(stream_view /*stream*/, std::size_t bytes) {
  if (bytes == 0 || bytes > std::numeric_limits<std::size_t>::max() / 2) {
    return nullptr;
  }
  // Reserve against the capacity first so concurrent callers cannot overshoot it together.
  std::size_t prev = allocated_.fetch_add(bytes, std::memory_order_relaxed);
  if (prev + bytes > capacity_ || prev + bytes < prev) {
    allocated_.fetch_sub(bytes, std::memory_order_relaxed);
    return nullptr;
  }
  void* p = nullptr;
  if (bytes >= k_mmap_threshold) {
    p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
               -1, 0);
    if (p == MAP_FAILED) {
      p = nullptr;
    }
  } else {
    std::size_t rounded = (bytes + k_alignment - 1) & ~(k_alignment - 1);
    p = std::aligned_alloc(k_alignment, rounded);
  }
  if (p == nullptr) {
    allocated_.fetch_sub(bytes, std::memory_order_relaxed);
  }
  return p;
}

void host_resource::do_deallocate(stream_view /*stream*/, void* ptr, std::size_t bytes) noexcept {
  if (ptr == nullptr) {
    return;
  }
  if (bytes >= k_mmap_threshold) {
    ::munmap(ptr, bytes);
  } else {
    std::free(ptr);
  }
  allocated_.fetch_sub(bytes, std::memory_order_relaxed);
}

}  // namespace poolscope::pool
