// box_index: which boxes of a list meet a given box, without testing every box of the list — the
// bookkeeping of reshards and ops pairs up lists of thousands of chunks, pieces and parts, and
// testing every pair costs their product.
//
//   std::vector<box> parts = ...;                        // a chunk's parts, say
//   detail::box_index index(parts.size(), [&](std::size_t i) -> const box& { return parts[i]; });
//   std::vector<std::uint32_t> found;
//   index.candidates(piece_region, found);               // every i whose part may meet it
//   // ... then intersect(parts[i], piece_region) for each i found
//
//   // or every meeting pair of two lists at once (the pairs of each b in increasing a):
//   detail::for_each_meeting(a.size(), a_of, b.size(), b_of,
//                            [&](std::size_t i, std::size_t j, box common) { ... });
//
// The index is a bounding-volume hierarchy over the boxes' bounds (per axis the interval from
// start to stop - 1; steps are ignored, so a candidate may hold no common element): each node
// splits its boxes at the median centre along the axis where their centres spread most. Boxes
// that tile a region (slabs, grids, the pieces of a split) so give O(log n + k) candidates for a
// query meeting k of them; boxes whose bounds overlap without sharing elements (interleaved
// strides, replicas) are each a candidate.
//
// Ownership: plain values (the index copies the bounds it needs). Thread safety: a built index is
// immutable; const methods may run concurrently. Cost: building O(n log n), a query O(log n + the
// candidates and nodes whose bounds meet it), returned as the count of nodes and boxes visited.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "poolscope/darray/geometry.hpp"

namespace poolscope::darray::detail {

/// The per-axis closed intervals [start, stop - 1] of a non-empty box: they hold its indices.
struct box_bounds {
  std::array<std::int64_t, max_rank> lo{};
  std::array<std::int64_t, max_rank> hi{};
  std::uint8_t rank = 0;

  [[nodiscard]] static box_bounds of(const box& b) noexcept;
  /// Whether the intervals meet on every axis (the boxes may share elements).
  [[nodiscard]] bool meets(const box_bounds& o) const noexcept {
    for (std::size_t a = 0; a < rank; ++a) {
      if (hi[a] < o.lo[a] || o.hi[a] < lo[a]) {
        return false;
      }
    }
    return true;
  }
};

/// A static index of boxes. See the file comment.
class box_index {
 public:
  box_index() = default;
  /// Indexes box_of(i) for i < n (box_of returns a box or a reference to one). Empty boxes are
  /// left out: they meet nothing. Throws invalid_argument for n above 2^32 - 1.
  template <typename BoxOf>
  box_index(std::size_t n, BoxOf&& box_of) {
    reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      const box& b = box_of(i);
      if (!b.empty()) {
        add(i, b);
      }
    }
    build();
  }

  /// Appends to `out` the index of every box whose bounds meet `q`'s (a superset of the boxes
  /// sharing an element with q), in no set order. Returns the nodes and boxes visited.
  std::uint64_t candidates(const box& q, std::vector<std::uint32_t>& out) const;
  /// The boxes indexed (non-empty ones).
  [[nodiscard]] std::size_t size() const noexcept { return items_.size(); }

 private:
  struct item {
    box_bounds bounds;
    std::uint32_t index = 0;
  };
  struct node {
    box_bounds bounds;        // of every box below
    std::uint32_t begin = 0;  // items_[begin, end)
    std::uint32_t end = 0;
    std::uint32_t children = 0;  // 0: a leaf; else the first child (the second follows it)
  };
  void reserve(std::size_t n);
  void add(std::size_t index, const box& b);
  void build();
  void build_node(std::uint32_t at, std::uint32_t begin, std::uint32_t end);

  std::vector<item> items_;
  std::vector<node> nodes_;
};

/// Pairs of lists small enough to test every pair (no index is built).
inline constexpr std::size_t all_pairs_below = 64;

/// Calls f(i, j, common) for every i < n_a and j < n_b whose boxes a_of(i) and b_of(j) share
/// elements (common: their intersection), in order of j, then of i. Returns the boxes and nodes
/// visited: every pair when n_a * n_b < all_pairs_below, else n_a (the index of the a side) plus
/// each query's count.
template <typename AOf, typename BOf, typename F>
std::uint64_t for_each_meeting(std::size_t n_a, AOf&& a_of, std::size_t n_b, BOf&& b_of, F&& f) {
  std::uint64_t visited = 0;
  if (n_b == 0 || n_a < (all_pairs_below + n_b - 1) / n_b) {
    for (std::size_t j = 0; j < n_b; ++j) {
      const box& bj = b_of(j);
      for (std::size_t i = 0; i < n_a; ++i) {
        ++visited;
        if (std::optional<box> common = intersect(a_of(i), bj)) {
          f(i, j, std::move(*common));
        }
      }
    }
    return visited;
  }
  const box_index index(n_a, a_of);
  visited += n_a;
  std::vector<std::uint32_t> found;
  for (std::size_t j = 0; j < n_b; ++j) {
    const box& bj = b_of(j);
    found.clear();
    visited += index.candidates(bj, found);
    std::sort(found.begin(), found.end());
    for (const std::uint32_t i : found) {
      if (std::optional<box> common = intersect(a_of(i), bj)) {
        f(std::size_t{i}, j, std::move(*common));
      }
    }
  }
  return visited;
}

}  // namespace poolscope::darray::detail
