#include "poolscope/pool/best_fit_allocator.hpp"

#include "detail/round_up.hpp"

namespace poolscope::pool {

best_fit_allocator::best_fit_allocator(resource& upstream)
    : allocator(upstream, "best_fit/" + upstream.name()) {
  set_size_granularity(round_bytes);
}

best_fit_allocator::~best_fit_allocator() {
  do_release_cached();
  for (auto& [ptr, b] : live_) {
    upstream_deallocate(stream_view{}, ptr, b.rounded);
  }
}

block best_fit_allocator::do_allocate(stream_view stream, std::size_t bytes,
                                      std::size_t /*alignment*/) {
  // Blocks are whole upstream allocations (>= 256-byte aligned), so any supported alignment holds.
  const std::size_t rounded = detail::round_up(bytes, round_bytes);
  {
    std::lock_guard lock(mutex_);
    auto it = free_.find(rounded);
    if (it != free_.end()) {
      void* p = it->second.back();
      // Live first: if that needs host memory and there is none, the block stays cached.
      live_.emplace(p, live_block{rounded, bytes});
      it->second.pop_back();
      if (it->second.empty()) {
        free_.erase(it);
      }
      cached_.erase(p);
      cached_bytes_ -= rounded;
      return {p, rounded};
    }
  }
  // Cache miss: the upstream call runs outside the lock so other sizes are served meanwhile.
  void* p = upstream_allocate(stream, rounded);
  if (p == nullptr) {
    return {};
  }
  try {
    std::lock_guard lock(mutex_);
    live_.emplace(p, live_block{rounded, bytes});
  } catch (...) {
    upstream_deallocate(stream, p, rounded);  // no host memory to track it: give it back
    throw;
  }
  return {p, rounded};
}

free_outcome best_fit_allocator::do_deallocate(stream_view /*stream*/, void* ptr, std::size_t bytes,
                                               std::size_t /*alignment*/) noexcept {
  std::lock_guard lock(mutex_);
  auto it = live_.find(ptr);
  if (it == live_.end()) {
    return {
        cached_.contains(ptr) ? hooks::free_error::double_free : hooks::free_error::unknown_pointer,
        0, 0};
  }
  const live_block b = it->second;
  live_.erase(it);
  if (!cache_block(ptr, b.rounded)) {
    // No host memory for the cache's bookkeeping: hand the block back upstream instead of
    // losing track of it. It still counts as freed.
    upstream_deallocate(stream_view{}, ptr, b.rounded);
    return {hooks::free_error::none, b.rounded, b.requested};
  }
  // Any size with the block's rounding names it (size_granularity).
  const bool size_ok = bytes <= b.rounded && detail::round_up(bytes, round_bytes) == b.rounded;
  return {size_ok ? hooks::free_error::none : hooks::free_error::size_mismatch, b.rounded,
          b.requested};
}

bool best_fit_allocator::cache_block(void* ptr, std::size_t rounded) noexcept {
  try {
    auto& list = free_[rounded];
    try {
      list.push_back(ptr);
      cached_.emplace(ptr, rounded);
    } catch (...) {
      if (!list.empty() && list.back() == ptr) {
        list.pop_back();
      }
      if (list.empty()) {
        free_.erase(rounded);
      }
      return false;
    }
  } catch (...) {
    return false;
  }
  cached_bytes_ += rounded;
  return true;
}

void best_fit_allocator::do_cache_stats(allocator_stats& s) const {
  std::lock_guard lock(mutex_);
  s.cached_blocks = cached_.size();
  s.cached_bytes = cached_bytes_;
  s.largest_free_block = free_.empty() ? 0 : free_.rbegin()->first;
}

std::size_t best_fit_allocator::do_release_cached() {
  std::map<std::size_t, std::vector<void*>> victims;
  {
    std::lock_guard lock(mutex_);
    victims.swap(free_);
    cached_.clear();
    cached_bytes_ = 0;
  }
  std::size_t released = 0;
  for (auto& [size, blocks] : victims) {
    for (void* p : blocks) {
      upstream_deallocate(stream_view{}, p, size);
      released += size;
    }
  }
  return released;
}

}  // namespace poolscope::pool
