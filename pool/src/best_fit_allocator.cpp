#include "poolscope/pool/best_fit_allocator.hpp"

#include "detail/round_up.hpp"

namespace poolscope::pool {

best_fit_allocator::best_fit_allocator(resource& upstream, thread_cache_options thread_cache)
    : allocator(upstream, "best_fit/" + upstream.name()) {
  set_size_granularity(round_bytes);
  enable_thread_cache(thread_cache, round_bytes);
}

best_fit_allocator::~best_fit_allocator() {
  disable_thread_cache();  // first: an exiting thread may still reclaim into the pool until then
  do_release_cached();
  for (auto& [ptr, b] : live_) {
    upstream_deallocate(stream_view{}, ptr, b.rounded);
  }
}

block best_fit_allocator::do_allocate(stream_view stream, std::size_t bytes,
                                      std::size_t /*alignment*/) {
  return allocate_block(stream, bytes, false);
}

block best_fit_allocator::do_allocate_held(stream_view stream, std::size_t bytes,
                                           std::size_t /*alignment*/) {
  return allocate_block(stream, bytes, true);
}

block best_fit_allocator::allocate_block(stream_view stream, std::size_t bytes, bool held) {
  // Blocks are whole upstream allocations (>= 256-byte aligned), so any supported alignment holds.
  const std::size_t rounded = detail::round_up(bytes, round_bytes);
  {
    std::lock_guard lock(mutex_);
    auto it = free_.find(rounded);
    if (it != free_.end()) {
      void* p = it->second.back();
      // Live first: if that needs host memory and there is none, the block stays cached.
      live_.emplace(p, live_block{rounded, bytes, held});
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
    live_.emplace(p, live_block{rounded, bytes, held});
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
  if (b.held) {
    return {hooks::free_error::none, 0, 0, true};  // a thread cache's: it frees it
  }
  live_.erase(it);
  account_free(b.rounded, b.requested);  // under the lock: nobody can take the block yet
  if (!cache_block(ptr, b.rounded)) {
    // No host memory for the cache's bookkeeping: hand the block back upstream instead of
    // losing track of it. It still counts as freed.
    upstream_deallocate(stream_view{}, ptr, b.rounded);
    return {hooks::free_error::none, b.rounded, b.requested};
  }
  const bool size_ok = do_size_matches(bytes, b.requested, b.rounded);
  return {size_ok ? hooks::free_error::none : hooks::free_error::size_mismatch, b.rounded,
          b.requested};
}

void best_fit_allocator::do_reclaim(stream_view /*stream*/, void* ptr) noexcept {
  std::lock_guard lock(mutex_);
  auto it = live_.find(ptr);
  if (it == live_.end()) [[unlikely]] {
    return;
  }
  const std::size_t rounded = it->second.rounded;
  live_.erase(it);
  if (!cache_block(ptr, rounded)) {
    upstream_deallocate(stream_view{}, ptr, rounded);  // no host memory to cache it
  }
}

void best_fit_allocator::do_unhold(void* ptr) noexcept {
  std::lock_guard lock(mutex_);
  if (auto it = live_.find(ptr); it != live_.end()) {
    it->second.held = false;
  }
}

bool best_fit_allocator::do_size_matches(std::size_t given, std::size_t /*requested*/,
                                         std::size_t rounded) const noexcept {
  return detail::round_up(given, round_bytes) == rounded && given <= rounded;
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
