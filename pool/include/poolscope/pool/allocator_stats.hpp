// A snapshot of an allocator's state, returned by value from allocator::stats().
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace poolscope::pool {

/// Counters and gauges of one allocator. Sizes in bytes. A snapshot: taken field by field
/// without stopping other threads, so under concurrent use the fields may be from slightly
/// different instants; each field on its own is exact, except the in-use peaks of an allocator
/// with thread caches used by several threads (allocator.hpp: they may count what other threads
/// hold through their caches; never less than the true peak).
struct allocator_stats {
  std::size_t in_use = 0;  ///< bytes handed out (rounded sizes) and not yet freed
  std::size_t peak_in_use = 0;
  std::size_t requested_in_use = 0;  ///< bytes asked for by live allocations
  std::size_t peak_requested = 0;
  std::size_t reserved = 0;  ///< bytes held from the upstream resource
  std::size_t peak_reserved = 0;
  std::uint64_t allocations = 0;      ///< successful allocate calls with bytes > 0
  std::uint64_t deallocations = 0;    ///< accepted deallocate calls
  std::uint64_t upstream_allocs = 0;  ///< calls to the resource that succeeded
  std::uint64_t upstream_frees = 0;
  std::uint64_t upstream_failures = 0;  ///< resource calls that returned out of memory
  std::uint64_t oom_count = 0;          ///< out_of_memory thrown
  /// Refusals by set_limit: requests refused because in use would pass the limit (each also an
  /// out_of_memory), and upstream requests refused because reserved would pass it (the pool then
  /// releases cached blocks and retries, so such a request may still succeed).
  std::uint64_t limit_hits = 0;
  std::uint64_t invalid_frees = 0;  ///< deallocations rejected or corrected
  std::size_t cached_blocks = 0;    ///< free blocks/chunks held for reuse
  std::size_t cached_bytes = 0;     ///< bytes in those blocks
  std::size_t largest_free_block = 0;
  /// External fragmentation of the cache: 1 - largest_free_block / cached_bytes (0 if empty).
  double fragmentation = 0.0;
  std::size_t limit = SIZE_MAX;  ///< SIZE_MAX when none
  /// Over a virtual resource (vmm, host_vmm) with a strategy that maps granules itself (bfc):
  /// `reserved` is then the bytes physically mapped, and these say the rest. 0 otherwise.
  std::size_t virtual_bytes = 0;      ///< address space held (the segments' ranges)
  std::size_t mapped_free_bytes = 0;  ///< mapped granules holding no live block (kept)
  std::uint64_t maps = 0;             ///< map calls (segment_map events)
  std::uint64_t unmaps = 0;           ///< unmap calls (segment_unmap events)

  /// JSON object with every field (for reports and the C ABI's poolscope_stats_json).
  [[nodiscard]] std::string to_json() const;
};

}  // namespace poolscope::pool
