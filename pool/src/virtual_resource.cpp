#include "poolscope/pool/virtual_resource.hpp"

#include <cstdio>
#include <iterator>
#include <string>

#include "detail/physical_mapping.hpp"
#include "detail/round_up.hpp"
#include "poolscope/error.hpp"
#include "poolscope/log.hpp"

namespace poolscope::pool {

namespace {

std::uintptr_t address(const void* p) noexcept {
  return reinterpret_cast<std::uintptr_t>(p);
}

std::string hex(std::uintptr_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%zx", static_cast<std::size_t>(v));
  return buf;
}

constexpr std::size_t word_bits = 64;

// Runs `check` (which throws for bad arguments) in a noexcept function: a bad argument is logged
// and false returned.
template <typename Check>
bool passes(Check&& check) noexcept {
  try {
    check();
    return true;
  } catch (const std::exception& e) {
    log(log_level::error, e.what());
    return false;
  }
}

}  // namespace

virtual_resource::virtual_resource(std::unique_ptr<detail::physical_mapping> mapping,
                                   std::size_t range_bytes, std::size_t capacity)
    : mapping_(std::move(mapping)), granule_(mapping_->granularity()), capacity_(capacity) {
  if (range_bytes == 0) {
    throw invalid_argument("poolscope: virtual resource: address_range_bytes = 0 reserves nothing");
  }
  range_ = detail::round_up(range_bytes, granule_);
  base_ = address(mapping_->reserve_range(range_));
  free_.emplace(base_, range_);
  const std::size_t words = (range_ / granule_ + word_bits - 1) / word_bits;
  mapped_bits_ = std::make_unique<std::atomic<std::uint64_t>[]>(words);
}

virtual_resource::~virtual_resource() {
  // What is still mapped goes with the reservation (the driver frees a range only unmapped).
  unmap_counted(reinterpret_cast<void*>(base_), range_);
  mapping_->release_range(reinterpret_cast<void*>(base_), range_);
}

int virtual_resource::do_device() const noexcept {
  return mapping_->device();
}

void virtual_resource::check_range(const char* what, const void* ptr, std::size_t bytes) const {
  const std::uintptr_t p = address(ptr);
  if (bytes == 0 || bytes % granule_ != 0) {
    throw invalid_argument("poolscope: " + name() + "." + what + ": " + std::to_string(bytes) +
                           " bytes is not a positive multiple of the granule (" +
                           std::to_string(granule_) + " bytes)");
  }
  if (p < base_ || p - base_ > range_ || bytes > range_ - (p - base_) || (p - base_) % granule_) {
    throw invalid_argument(
        "poolscope: " + name() + "." + what + ": range " + hex(p) + " + " + std::to_string(bytes) +
        " bytes is not a granule-aligned part of the reservation at " + hex(base_));
  }
}

void* virtual_resource::reserve(std::size_t bytes) {
  if (bytes == 0 || bytes % granule_ != 0) {
    throw invalid_argument("poolscope: " + name() + ".reserve: " + std::to_string(bytes) +
                           " bytes is not a positive multiple of the granule (" +
                           std::to_string(granule_) + " bytes)");
  }
  std::lock_guard lock(mutex_);
  // First fit from the lowest address: ranges stay packed, and a range taken last is often
  // followed by free addresses, so that it can grow in place (extend).
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < bytes) {
      continue;
    }
    const std::uintptr_t start = it->first;
    const std::size_t left = it->second - bytes;
    free_.erase(it);
    if (left != 0) {
      free_.emplace(start + bytes, left);
    }
    handed_out_ += bytes;
    return reinterpret_cast<void*>(start);
  }
  return nullptr;
}

bool virtual_resource::extend(void* end, std::size_t bytes) {
  check_range("extend", end, bytes);
  std::lock_guard lock(mutex_);
  const auto it = free_.find(address(end));
  if (it == free_.end() || it->second < bytes) {
    return false;
  }
  const std::size_t left = it->second - bytes;
  free_.erase(it);
  if (left != 0) {
    free_.emplace(address(end) + bytes, left);
  }
  handed_out_ += bytes;
  return true;
}

void virtual_resource::unreserve(void* ptr, std::size_t bytes) noexcept {
  if (!passes([&] { check_range("unreserve", ptr, bytes); })) {
    return;
  }
  std::uintptr_t start = address(ptr);
  std::lock_guard lock(mutex_);
  auto next = free_.lower_bound(start);
  const bool overlaps_next = next != free_.end() && next->first < start + bytes;
  const bool overlaps_prev = next != free_.begin() && [&] {
    const auto prev = std::prev(next);
    return prev->first + prev->second > start;
  }();
  if (overlaps_next || overlaps_prev) {
    log(log_level::error, "poolscope: " + name() + ".unreserve: range " + hex(start) + " + " +
                              std::to_string(bytes) + " bytes is (partly) free already; ignored");
    return;
  }
  handed_out_ -= bytes;
  std::size_t size = bytes;
  if (next != free_.end() && next->first == start + size) {
    size += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    const auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      size += prev->second;
      free_.erase(prev);
    }
  }
  free_.emplace(start, size);
}

bool virtual_resource::is_mapped(const void* ptr) const noexcept {
  if (!contains(ptr)) {
    return false;
  }
  const std::size_t g = (address(ptr) - base_) / granule_;
  return (mapped_bits_[g / word_bits].load(std::memory_order_relaxed) >> (g % word_bits) & 1) != 0;
}

bool virtual_resource::map(void* ptr, std::size_t bytes) {
  check_range("map", ptr, bytes);
  for (std::size_t off = 0; off < bytes; off += granule_) {
    if (is_mapped(static_cast<char*>(ptr) + off)) {
      throw invalid_argument("poolscope: " + name() + ".map: granule at " +
                             hex(address(ptr) + off) + " is mapped already");
    }
  }
  if (!map_counted(ptr, bytes)) {
    return false;
  }
  asked_.fetch_add(bytes, std::memory_order_relaxed);
  return true;
}

void virtual_resource::unmap(void* ptr, std::size_t bytes) noexcept {
  if (!passes([&] { check_range("unmap", ptr, bytes); })) {
    return;
  }
  asked_.fetch_sub(unmap_counted(ptr, bytes), std::memory_order_relaxed);
}

bool virtual_resource::map_counted(void* ptr, std::size_t bytes) {
  // Counted against the capacity first, so that concurrent callers cannot pass it together.
  const std::size_t before = mapped_.fetch_add(bytes, std::memory_order_relaxed);
  if (before + bytes > capacity_ || !mapping_->map(ptr, bytes)) {
    mapped_.fetch_sub(bytes, std::memory_order_relaxed);
    map_failures_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  std::size_t peak = peak_mapped_.load(std::memory_order_relaxed);
  while (before + bytes > peak &&
         !peak_mapped_.compare_exchange_weak(peak, before + bytes, std::memory_order_relaxed)) {
  }
  const std::size_t first = (address(ptr) - base_) / granule_;
  for (std::size_t g = first; g < first + bytes / granule_; ++g) {
    mapped_bits_[g / word_bits].fetch_or(std::uint64_t{1} << (g % word_bits),
                                         std::memory_order_relaxed);
  }
  maps_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

// Unmaps the mapped runs of granules in [ptr, ptr + bytes), one seam call per run.
std::size_t virtual_resource::unmap_counted(void* ptr, std::size_t bytes) noexcept {
  const std::size_t first = (address(ptr) - base_) / granule_;
  const std::size_t last = first + bytes / granule_;
  std::size_t unmapped = 0;
  for (std::size_t g = first; g < last;) {
    const auto bit = [this](std::size_t i) {
      return (mapped_bits_[i / word_bits].load(std::memory_order_relaxed) >> (i % word_bits) & 1) !=
             0;
    };
    if (!bit(g)) {
      ++g;
      continue;
    }
    std::size_t end = g;
    while (end < last && bit(end)) {
      mapped_bits_[end / word_bits].fetch_and(~(std::uint64_t{1} << (end % word_bits)),
                                              std::memory_order_relaxed);
      ++end;
    }
    mapping_->unmap(reinterpret_cast<void*>(base_ + g * granule_), (end - g) * granule_);
    unmapped += (end - g) * granule_;
    g = end;
  }
  if (unmapped != 0) {
    mapped_.fetch_sub(unmapped, std::memory_order_relaxed);
    unmaps_.fetch_add(1, std::memory_order_relaxed);
  }
  return unmapped;
}

void* virtual_resource::do_try_allocate(stream_view /*stream*/, std::size_t bytes) {
  if (bytes == 0 || bytes > range_) {
    return nullptr;
  }
  const std::size_t rounded = detail::round_up(bytes, granule_);
  void* p = reserve(rounded);
  if (p == nullptr) {
    return nullptr;
  }
  if (!map_counted(p, rounded)) {
    unreserve(p, rounded);
    return nullptr;
  }
  asked_.fetch_add(bytes, std::memory_order_relaxed);
  return p;
}

void virtual_resource::do_deallocate(stream_view /*stream*/, void* ptr,
                                     std::size_t bytes) noexcept {
  if (ptr == nullptr || !contains(ptr)) {
    return;
  }
  const std::size_t rounded = detail::round_up(bytes, granule_);
  unmap_counted(ptr, rounded);
  unreserve(ptr, rounded);
  asked_.fetch_sub(bytes, std::memory_order_relaxed);
}

virtual_counts virtual_resource::counts() const {
  virtual_counts c;
  c.address_range = range_;
  {
    std::lock_guard lock(mutex_);
    c.address_bytes = handed_out_;
  }
  c.mapped_bytes = mapped_.load(std::memory_order_relaxed);
  c.peak_mapped = peak_mapped_.load(std::memory_order_relaxed);
  c.maps = maps_.load(std::memory_order_relaxed);
  c.unmaps = unmaps_.load(std::memory_order_relaxed);
  c.map_failures = map_failures_.load(std::memory_order_relaxed);
  return c;
}

}  // namespace poolscope::pool
