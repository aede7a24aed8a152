// Which granules of a virtual resource's reservation a strategy has mapped, and how many live
// chunks touch each: the bookkeeping by which bfc_allocator maps granules as chunks need them and
// unmaps those that frees leave wholly free (when its unmap policy says so). The strategy does the
// mapping (through allocator::upstream_map / upstream_unmap, which count reserved bytes and emit
// events): it passes the calls in as `map_run` / `unmap_run`, each given one run of adjacent
// granules.
//
// A granule is in one of three states: unmapped; mapped and used (touched by >= 1 live chunk);
// mapped and free (touched by none, kept for reuse). mapped() and mapped_free() are the bytes in
// the last two and the last state.
// Thread safety: none; the strategy calls it under its own lock. Cost: O(granules a range
// touches) per call; 4 bytes of host memory per granule of the reservation.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "poolscope/pool/virtual_resource.hpp"

namespace poolscope::pool::detail {

class granule_map {
 public:
  explicit granule_map(const virtual_resource& vm)
      : base_(static_cast<char*>(vm.address_base())),
        granule_(vm.granularity()),
        state_(vm.address_range() / vm.granularity(), 0) {}

  [[nodiscard]] std::size_t granularity() const noexcept { return granule_; }
  /// Bytes this map has mapped, and those of them that no live chunk touches.
  [[nodiscard]] std::size_t mapped() const noexcept { return mapped_; }
  [[nodiscard]] std::size_t mapped_free() const noexcept { return mapped_free_; }
  [[nodiscard]] std::uint64_t maps() const noexcept { return maps_; }
  [[nodiscard]] std::uint64_t unmaps() const noexcept { return unmaps_; }

  /// A live chunk now covers [p, p + n): maps the unmapped granules it touches (one map_run(ptr,
  /// bytes) -> bool per run) and counts the chunk on each. false if a map_run failed: then the
  /// chunk is not counted, and runs mapped by this call stay mapped and free.
  template <typename MapRun>
  [[nodiscard]] bool acquire(const char* p, std::size_t n, MapRun&& map_run) {
    const std::size_t first = first_of(p);
    const std::size_t last = end_of(p, n);
    std::size_t newly = 0;
    for (std::size_t g = first; g < last;) {
      if (state_[g] != 0) {
        ++g;
        continue;
      }
      std::size_t e = g;
      while (e < last && state_[e] == 0) {
        ++e;
      }
      if (!map_run(base_ + g * granule_, (e - g) * granule_)) {
        mapped_free_ += newly;
        return false;
      }
      for (std::size_t i = g; i < e; ++i) {
        state_[i] = mapped_bit;
      }
      ++maps_;
      mapped_ += (e - g) * granule_;
      newly += (e - g) * granule_;
      g = e;
    }
    std::size_t taken = 0;  // granules that were mapped and free, or mapped just now
    for (std::size_t g = first; g < last; ++g) {
      taken += (state_[g] & ref_mask) == 0 ? granule_ : 0;
      ++state_[g];
    }
    mapped_free_ -= taken - newly;
    return true;
  }

  /// Bytes of the granules [p, p + n) touches that are not mapped (what acquire would map).
  [[nodiscard]] std::size_t unmapped_bytes(const char* p, std::size_t n) const noexcept {
    std::size_t count = 0;
    for (std::size_t g = first_of(p), last = end_of(p, n); g < last; ++g) {
      count += (state_[g] & mapped_bit) == 0 ? 1 : 0;
    }
    return count * granule_;
  }

  /// The live chunk [p, p + n) is gone: its granules that no other live chunk touches become
  /// mapped and free (the strategy decides when to unmap them: unmap_free).
  void release(const char* p, std::size_t n) noexcept {
    for (std::size_t g = first_of(p), last = end_of(p, n); g < last; ++g) {
      --state_[g];
      mapped_free_ += (state_[g] & ref_mask) == 0 ? granule_ : 0;
    }
  }

  /// Unmaps mapped, free granules of [p, p + n), the highest addresses first, until `want` bytes
  /// are unmapped or none is left there (one unmap_run(ptr, bytes) per run). Returns the bytes
  /// unmapped. (A free chunk is carved from its low end: its top is what is reused last.)
  template <typename UnmapRun>
  std::size_t unmap_free(const char* p, std::size_t n, std::size_t want,
                         UnmapRun&& unmap_run) noexcept {
    return trim(first_of(p), end_of(p, n), want, unmap_run);
  }

  /// Unmaps every mapped, free granule in [p, p + n). Returns the bytes unmapped.
  template <typename UnmapRun>
  std::size_t release_free(const char* p, std::size_t n, UnmapRun&& unmap_run) noexcept {
    return trim(first_of(p), end_of(p, n), SIZE_MAX, unmap_run);
  }

  /// Unmaps every mapped granule in [p, p + n), live chunks or not (their owner is going away).
  template <typename UnmapRun>
  void release_all(const char* p, std::size_t n, UnmapRun&& unmap_run) noexcept {
    for (std::size_t g = first_of(p), last = end_of(p, n); g < last; ++g) {
      if ((state_[g] & mapped_bit) != 0) {
        mapped_free_ += (state_[g] & ref_mask) != 0 ? granule_ : 0;
        state_[g] = mapped_bit;
      }
    }
    release_free(p, n, unmap_run);
  }

  /// Live chunks touching the granule that holds `p`.
  [[nodiscard]] std::uint32_t chunks_on(const char* p) const noexcept {
    return state_[first_of(p)] & ref_mask;
  }
  /// True if the granule holding `p` is mapped.
  [[nodiscard]] bool is_mapped(const char* p) const noexcept {
    return (state_[first_of(p)] & mapped_bit) != 0;
  }
  /// The longest piece of [p, p + n) that lies in mapped granules (0 if none).
  [[nodiscard]] std::size_t longest_mapped_piece(const char* p, std::size_t n) const noexcept {
    std::size_t best = 0;
    const char* run = nullptr;
    for (std::size_t g = first_of(p), last = end_of(p, n); g < last; ++g) {
      const char* lo = std::max<const char*>(p, base_ + g * granule_);
      const char* hi = std::min<const char*>(p + n, base_ + (g + 1) * granule_);
      if ((state_[g] & mapped_bit) == 0) {
        run = nullptr;
        continue;
      }
      run = run == nullptr ? lo : run;
      best = std::max(best, static_cast<std::size_t>(hi - run));
    }
    return best;
  }

 private:
  static constexpr std::uint32_t mapped_bit = std::uint32_t{1} << 31;
  static constexpr std::uint32_t ref_mask = mapped_bit - 1;

  [[nodiscard]] std::size_t first_of(const char* p) const noexcept {
    return static_cast<std::size_t>(p - base_) / granule_;
  }
  [[nodiscard]] std::size_t end_of(const char* p, std::size_t n) const noexcept {
    return (static_cast<std::size_t>(p - base_) + n + granule_ - 1) / granule_;
  }
  // Unmaps mapped, free granules of [first, last) from the top down, up to `want` bytes.
  template <typename UnmapRun>
  std::size_t trim(std::size_t first, std::size_t last, std::size_t want,
                   UnmapRun& unmap_run) noexcept {
    std::size_t done = 0;
    for (std::size_t e = last; e > first && done < want;) {
      if (state_[e - 1] != mapped_bit) {
        --e;
        continue;
      }
      std::size_t g = e;
      while (g > first && state_[g - 1] == mapped_bit && done + (e - g) * granule_ < want) {
        --g;
        state_[g] = 0;
      }
      unmap_run(base_ + g * granule_, (e - g) * granule_);
      ++unmaps_;
      done += (e - g) * granule_;
      e = g;
    }
    mapped_ -= done;
    mapped_free_ -= done;
    return done;
  }

  char* base_;
  std::size_t granule_;
  std::vector<std::uint32_t> state_;  // per granule: mapped_bit | live chunks touching it
  std::size_t mapped_ = 0;
  std::size_t mapped_free_ = 0;
  std::uint64_t maps_ = 0;
  std::uint64_t unmaps_ = 0;
};

}  // namespace poolscope::pool::detail
