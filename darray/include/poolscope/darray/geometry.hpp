// geometry: the index arithmetic of distributed arrays — slices, N-D boxes, their intersections
// and differences, and where a box sits inside a chunk's dense storage.
//
//   using namespace poolscope::darray;
//   box a{{slice{0, 10}, slice{0, 8, 2}}};          // rows 0..9, columns 0,2,4,6
//   box b{{slice{5, 20}, slice{0, 8}}};
//   auto c = intersect(a, b);                        // rows 5..9, columns 0,2,4,6
//   auto rest = subtract(a, b);                      // rows 0..4, columns 0,2,4,6
//   auto v = local_slices(a, *c);                    // c inside a's storage: rows 5..9, cols 0..3
//
// A slice is a set of indices start, start+step, ... below stop, with step >= 1. Slices are kept
// canonical (stop = last index + 1; step 1 when there are fewer than two indices; start == stop
// when empty), so equal non-empty sets compare equal.
// Python-style input (negative indices, negative steps) is turned into this form by
// normalize_slice; a box's storage order is always increasing index along every axis.
// A chunk stores the elements of its box densely in row-major order of the box's own extents.
//
// Ownership: plain values. Thread safety: all functions are pure and reentrant.
// Cost: intersection O(rank) (an extended gcd per axis); subtraction O(rank * lcm/step) boxes.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace poolscope::darray {

/// The extent of an array along each axis.
using shape_t = std::vector<std::int64_t>;

/// The largest rank a distributed array may have.
inline constexpr std::size_t max_rank = 4;

/// Number of elements of `shape` (1 for rank 0). Throws invalid_argument on a negative extent
/// or an overflow of int64.
[[nodiscard]] std::int64_t element_count(const shape_t& shape);

/// The indices start, start+step, ... < stop along one axis (canonical: see the file comment).
struct slice {
  std::int64_t start = 0;
  std::int64_t stop = 0;
  std::int64_t step = 1;

  /// Canonical slice of the given bounds: step must be >= 1 (else invalid_argument naming it);
  /// stop is lowered to the last index + 1; a single index gets step 1; an empty range becomes
  /// {start, start, 1}.
  slice(std::int64_t start_, std::int64_t stop_, std::int64_t step_ = 1);
  slice() = default;

  /// Number of indices.
  [[nodiscard]] std::int64_t size() const noexcept;
  [[nodiscard]] bool empty() const noexcept { return stop <= start; }
  /// The last index (precondition: not empty).
  [[nodiscard]] std::int64_t last() const noexcept { return stop - 1; }
  [[nodiscard]] bool contains(std::int64_t i) const noexcept;
  /// "start:stop:step" (":step" omitted when 1).
  [[nodiscard]] std::string to_string() const;
  friend bool operator==(const slice&, const slice&) = default;
};

/// A Python-style slice of an axis of `extent` (negative indices count from the end, negative
/// steps walk backwards, omitted bounds are nullopt) as the canonical slice of the same set.
/// Throws invalid_argument naming the value for a zero step.
[[nodiscard]] slice normalize_slice(std::optional<std::int64_t> start,
                                    std::optional<std::int64_t> stop, std::int64_t step,
                                    std::int64_t extent);

/// The indices two slices share (empty if none), itself a slice (step: the lcm of the steps).
/// Throws invalid_argument naming the slices in the one case a slice cannot hold the result: two
/// or more shared indices lcm > INT64_MAX apart.
[[nodiscard]] slice intersect(const slice& a, const slice& b);

/// The indices of `a` that are not in `b`, as disjoint slices in increasing order of start.
[[nodiscard]] std::vector<slice> subtract(const slice& a, const slice& b);

/// The slices of a box, at most max_rank of them, held inline: boxes are copied on every piece,
/// part and intersection, and a heap allocation each time cost more than the arithmetic. Offers
/// the std::vector members the code uses. Adding a slice past max_rank throws invalid_argument
/// naming the rank.
class box_dims {
 public:
  using value_type = slice;
  using iterator = slice*;
  using const_iterator = const slice*;

  box_dims() = default;
  box_dims(std::initializer_list<slice> slices) {
    for (const slice& s : slices) {
      push_back(s);
    }
  }

  [[nodiscard]] std::size_t size() const noexcept { return n_; }
  [[nodiscard]] bool empty() const noexcept { return n_ == 0; }
  [[nodiscard]] iterator begin() noexcept { return s_.data(); }
  [[nodiscard]] iterator end() noexcept { return s_.data() + n_; }
  [[nodiscard]] const_iterator begin() const noexcept { return s_.data(); }
  [[nodiscard]] const_iterator end() const noexcept { return s_.data() + n_; }
  [[nodiscard]] slice& operator[](std::size_t i) noexcept { return s_[i]; }
  [[nodiscard]] const slice& operator[](std::size_t i) const noexcept { return s_[i]; }
  /// Throws invalid_argument for i >= size().
  [[nodiscard]] const slice& at(std::size_t i) const;

  /// Room is fixed: only checks that `n` slices fit.
  void reserve(std::size_t n) const;
  void push_back(const slice& s) {
    grow();
    s_[n_++] = s;
  }
  template <typename... Args>
  slice& emplace_back(Args&&... args) {
    grow();
    s_[n_] = slice(std::forward<Args>(args)...);
    return s_[n_++];
  }
  /// Removes the slice at `pos`; returns the position after it.
  iterator erase(const_iterator pos) noexcept {
    const auto i = static_cast<std::size_t>(pos - s_.data());
    std::move(s_.begin() + static_cast<std::ptrdiff_t>(i) + 1,
              s_.begin() + static_cast<std::ptrdiff_t>(n_),
              s_.begin() + static_cast<std::ptrdiff_t>(i));
    --n_;
    return s_.data() + i;
  }

  friend bool operator==(const box_dims& a, const box_dims& b) noexcept {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }

 private:
  void grow() const {
    if (n_ == max_rank) {
      too_many(n_ + 1U);
    }
  }
  [[noreturn]] static void too_many(std::size_t rank);

  std::array<slice, max_rank> s_{};
  std::uint8_t n_ = 0;
};

/// An N-D box: one slice per axis.
struct box {
  box_dims dims;

  /// The full box of `shape` (0:n per axis).
  [[nodiscard]] static box full(const shape_t& shape);

  [[nodiscard]] std::size_t rank() const noexcept { return dims.size(); }
  /// Number of elements (0 if any axis is empty).
  [[nodiscard]] std::int64_t size() const noexcept;
  [[nodiscard]] bool empty() const noexcept { return size() == 0; }
  /// The extent of the box along each axis (its dense storage shape).
  [[nodiscard]] shape_t extents() const;
  /// True if every element of `other` is in this box (same rank).
  [[nodiscard]] bool contains(const box& other) const noexcept;
  /// "[0:4, 2:9:2]".
  [[nodiscard]] std::string to_string() const;
  friend bool operator==(const box&, const box&) = default;
};

/// The elements two boxes of the same rank share; nullopt when none.
[[nodiscard]] std::optional<box> intersect(const box& a, const box& b);

/// The elements of `a` not in `b` (same rank) as disjoint boxes.
[[nodiscard]] std::vector<box> subtract(const box& a, const box& b);

/// The elements of `a` not in any of `others`, as disjoint boxes.
[[nodiscard]] std::vector<box> subtract_all(const box& a, const std::vector<box>& others);

/// Where `part` (a subset of `whole`) sits in `whole`'s dense storage: per axis, the slice of
/// local indices ((i - whole.start) / whole.step). Throws invalid_argument if `part` is not a
/// subset of `whole`.
[[nodiscard]] box local_slices(const box& whole, const box& part);

/// `b` with axis `axis` removed (what a reduction along that axis produces).
[[nodiscard]] box drop_axis(const box& b, std::size_t axis);

/// Splits `b` along its outermost axis with more than one index into at most `parts` boxes of
/// nearly equal extent, in increasing index order (fewer when that axis is shorter; `b` itself
/// when no axis has more than one index). Throws invalid_argument for parts == 0.
[[nodiscard]] std::vector<box> split_outer(const box& b, std::size_t parts);

}  // namespace poolscope::darray
