// index_map: which device holds which part of an array.
//
//   using namespace poolscope::darray;
//   shape_t shape{1000};
//   auto a = index_map::split(shape, 0, {{0, 0, 500}, {1, 500, 1000}});   // A split at N/2
//   auto c = index_map::split(shape, 0, {{0, 0, 700}, {1, 700, 1000}});   // C split at 0.7 N
//   index_map r;                                                           // hand-made, replicas
//   r.add(0, box{{slice{0, 1000}}});
//   r.add(1, box{{slice{0, 1000, 2}}});
//   r.validate(shape, /*device_count=*/2);                                 // throws on bad maps
//
// A map is device -> list of N-D boxes (chunks). Chunks may overlap (replicas, on the same or
// different devices), need not be contiguous (steps) or equal. A valid map covers every element
// of the shape at least once, every box lies inside the shape, has the shape's rank, and names a
// device in [0, device_count).
//
// Ownership: plain value (copies share their contents until one of them is changed). Thread
// safety: const methods (copying included) are reentrant; copies may be changed and dropped on
// different threads at once; one map is not synchronized (no change while others read it).
// Cost: validate is O(chunks^2 * rank) box differences (coverage is checked exactly).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "poolscope/darray/geometry.hpp"
#include "poolscope/error.hpp"

namespace poolscope::darray {

/// A bad index map or a shape mismatch: the message names the offending device, chunk and value.
class invalid_index_map : public invalid_argument {
 public:
  using invalid_argument::invalid_argument;
};

/// One chunk of a map: a device and a box, with its position in the map's list for the device.
struct chunk_ref {
  int device = 0;
  std::size_t index = 0;  ///< position in the device's list
  box region;
  friend bool operator==(const chunk_ref&, const chunk_ref&) = default;
};

/// Device -> boxes. See the file comment.
class index_map {
 public:
  index_map() = default;
  /// Shares `other`'s contents (both copy them before their next change).
  index_map(const index_map& other) noexcept;
  index_map(index_map&& other) noexcept;
  index_map& operator=(const index_map& other) noexcept;
  index_map& operator=(index_map&& other) noexcept;
  ~index_map() = default;

  /// Appends a chunk `b` on `device` (not checked until validate()).
  index_map& add(int device, box b);

  /// The chunks of `device` (empty if none).
  [[nodiscard]] const std::vector<box>& boxes(int device) const;
  /// Every chunk, ordered by device then position.
  [[nodiscard]] std::vector<chunk_ref> chunks() const;
  /// Devices with at least one chunk, increasing.
  [[nodiscard]] std::vector<int> devices() const;
  [[nodiscard]] std::size_t chunk_count() const noexcept;
  [[nodiscard]] bool empty() const noexcept { return parts().empty(); }
  [[nodiscard]] const std::map<int, std::vector<box>>& parts() const noexcept;

  /// Throws invalid_index_map naming the first problem: a device outside [0, device_count), a
  /// box whose rank differs from the shape's, an index outside the shape, a zero/negative step,
  /// or (with require_cover) an element no chunk covers (naming its index).
  void validate(const shape_t& shape, int device_count, bool require_cover = true) const;

  /// The map with each device's duplicate and contained boxes dropped (same coverage).
  [[nodiscard]] index_map deduplicated() const;

  /// "{0: [[0:500]], 1: [[500:1000]]}".
  [[nodiscard]] std::string to_string() const;

  friend bool operator==(const index_map& a, const index_map& b) noexcept {
    return a.parts_ == b.parts_ || a.parts() == b.parts();
  }

  // --- builders ---
  /// Contiguous ranges along `axis` (other axes full): each (device, start, stop).
  [[nodiscard]] static index_map split(
      const shape_t& shape, std::size_t axis,
      const std::vector<std::tuple<int, std::int64_t, std::int64_t>>& ranges);
  /// `devices` equal blocks along `axis` (device i gets block i; the last takes the remainder).
  [[nodiscard]] static index_map blocks(const shape_t& shape, std::size_t axis, int devices);
  /// The whole array on each of `devices`.
  [[nodiscard]] static index_map replicated(const shape_t& shape, const std::vector<int>& devices);
  /// A 2-D grid of rows x cols blocks, block (i, j) on device grid[i][j] (what matmul takes).
  [[nodiscard]] static index_map grid(const shape_t& shape, std::int64_t row_blocks,
                                      std::int64_t col_blocks,
                                      const std::vector<std::vector<int>>& device_of_block);

 private:
  using parts_map = std::map<int, std::vector<box>>;
  /// The contents, shared by copies: arrays and plans copy their maps on every op, and a copy is
  /// a reference count. add() changes them in place only while they were never shared (null:
  /// empty), else copies them first.
  std::shared_ptr<parts_map> parts_;
  /// No other map ever shared parts_. Not use_count() == 1: a copy dropped on another thread
  /// brings the count back to 1 without ordering that thread's reads before our writes.
  /// Atomic: copying a const map (from several threads at once) clears it.
  mutable std::atomic<bool> unshared_{true};
};

}  // namespace poolscope::darray
