// box_index: a bounding-volume hierarchy over box bounds. See box_index.hpp.
#include "box_index.hpp"

#include <limits>
#include <string>

#include "poolscope/error.hpp"

namespace poolscope::darray::detail {
namespace {

// Boxes per leaf: a leaf's boxes are tested one by one, which costs less than descending further.
constexpr std::uint32_t leaf_size = 4;

// A node's centre along `axis`, halved to stay within int64 (only the order of centres matters).
std::int64_t centre(const box_bounds& b, std::size_t axis) noexcept {
  return (b.lo[axis] >> 1) + (b.hi[axis] >> 1);
}

void widen(box_bounds& into, const box_bounds& b) noexcept {
  for (std::size_t a = 0; a < b.rank; ++a) {
    into.lo[a] = std::min(into.lo[a], b.lo[a]);
    into.hi[a] = std::max(into.hi[a], b.hi[a]);
  }
}

}  // namespace

box_bounds box_bounds::of(const box& b) noexcept {
  box_bounds out;
  out.rank = static_cast<std::uint8_t>(b.rank());
  for (std::size_t a = 0; a < b.rank(); ++a) {
    out.lo[a] = b.dims[a].start;
    out.hi[a] = b.dims[a].stop - 1;  // non-empty: stop > start, so no overflow
  }
  return out;
}

void box_index::reserve(std::size_t n) {
  if (n > std::numeric_limits<std::uint32_t>::max()) {
    throw invalid_argument("box_index: " + std::to_string(n) +
                           " boxes are more than an index holds (2^32 - 1)");
  }
  items_.reserve(n);
}

void box_index::add(std::size_t index, const box& b) {
  items_.push_back(item{box_bounds::of(b), static_cast<std::uint32_t>(index)});
}

void box_index::build() {
  nodes_.clear();
  if (items_.empty()) {
    return;
  }
  // A split node has two children and a leaf at least leaf_size / 2 boxes: fewer nodes than boxes.
  nodes_.reserve(items_.size());
  nodes_.emplace_back();
  build_node(0, 0, static_cast<std::uint32_t>(items_.size()));
}

void box_index::build_node(std::uint32_t at, std::uint32_t begin, std::uint32_t end) {
  box_bounds bounds = items_[begin].bounds;
  for (std::uint32_t i = begin + 1; i < end; ++i) {
    widen(bounds, items_[i].bounds);
  }
  nodes_[at].bounds = bounds;
  nodes_[at].begin = begin;
  nodes_[at].end = end;
  if (end - begin <= leaf_size) {
    return;
  }
  // The axis along which the centres spread most; none spread: every box has the same centre,
  // and a split would not separate what queries meet, so the node stays a leaf.
  std::size_t axis = 0;
  std::int64_t widest = 0;
  for (std::size_t a = 0; a < bounds.rank; ++a) {
    std::int64_t lo = std::numeric_limits<std::int64_t>::max();
    std::int64_t hi = std::numeric_limits<std::int64_t>::min();
    for (std::uint32_t i = begin; i < end; ++i) {
      const std::int64_t c = centre(items_[i].bounds, a);
      lo = std::min(lo, c);
      hi = std::max(hi, c);
    }
    if (hi - lo > widest) {  // two halved values: the difference fits in int64
      widest = hi - lo;
      axis = a;
    }
  }
  if (widest == 0) {
    return;
  }
  const std::uint32_t mid = begin + (end - begin) / 2;
  std::nth_element(items_.begin() + begin, items_.begin() + mid, items_.begin() + end,
                   [axis](const item& l, const item& r) {
                     return centre(l.bounds, axis) < centre(r.bounds, axis);
                   });
  const auto first = static_cast<std::uint32_t>(nodes_.size());
  nodes_[at].children = first;
  nodes_.emplace_back();
  nodes_.emplace_back();
  build_node(first, begin, mid);
  build_node(first + 1, mid, end);
}

std::uint64_t box_index::candidates(const box& q, std::vector<std::uint32_t>& out) const {
  if (nodes_.empty() || q.empty()) {
    return 0;
  }
  const box_bounds qb = box_bounds::of(q);
  std::uint64_t visited = 0;
  // Depth is at most log2(n / leaf_size) + 1 < 64 for n < 2^32.
  std::array<std::uint32_t, 64> stack{};
  std::size_t top = 0;
  stack[top++] = 0;
  while (top > 0) {
    const node& n = nodes_[stack[--top]];
    ++visited;
    if (!n.bounds.meets(qb)) {
      continue;
    }
    if (n.children == 0) {
      for (std::uint32_t i = n.begin; i < n.end; ++i) {
        ++visited;
        if (items_[i].bounds.meets(qb)) {
          out.push_back(items_[i].index);
        }
      }
      continue;
    }
    stack[top++] = n.children;
    stack[top++] = n.children + 1;
  }
  return visited;
}

}  // namespace poolscope::darray::detail
