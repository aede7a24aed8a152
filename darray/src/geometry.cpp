#include "poolscope/darray/geometry.hpp"

#include <algorithm>
#include <limits>
#include <numeric>
#include <utility>

#include "poolscope/error.hpp"

namespace poolscope::darray {
namespace {

// Intersections and spans of int64 slices need a little more than 64 bits (differences of two
// indices, lcm of two steps, a residue times a step); __int128 holds every intermediate.
__extension__ using wide = __int128;

constexpr std::int64_t int64_max = std::numeric_limits<std::int64_t>::max();

// Number of indices of start, start+step, ... < stop, computed without overflow (0 when empty or
// when the step is not positive); saturates at INT64_MAX.
std::int64_t count_of(std::int64_t start, std::int64_t stop, std::int64_t step) noexcept {
  if (stop <= start || step < 1) {
    return 0;
  }
  if (std::int64_t n = 0; step == 1 && !__builtin_sub_overflow(stop, start, &n)) {
    return n;  // the common case, without a 128-bit division
  }
  const wide n = (wide{stop} - start - 1) / step + 1;
  return n > int64_max ? int64_max : static_cast<std::int64_t>(n);
}

// The last index of a non-empty slice (stop > start, step >= 1), also for slices whose stop is
// not canonical. Not from count_of: the count saturates (a step-2 slice of the whole int64 range
// has 2^63 indices), the last index does not.
std::int64_t last_index(const slice& s) noexcept {
  if (s.step == 1 && s.stop > s.start) {
    return s.stop - 1;
  }
  const wide span = wide{s.stop} - 1 - s.start;  // >= 0 for a non-empty slice
  return static_cast<std::int64_t>(wide{s.start} + span / s.step * s.step);
}

// Floor modulo: the result lies in [0, m) for m > 0.
wide floor_mod(wide a, wide m) noexcept {
  const wide r = a % m;
  return r < 0 ? r + m : r;
}

// Extended Euclid: returns g = gcd(a, b) and x with a * x == g (mod b), for a, b >= 1.
std::pair<wide, wide> extended_gcd(wide a, wide b) noexcept {
  wide old_r = a;
  wide r = b;
  wide old_x = 1;
  wide x = 0;
  while (r != 0) {
    const wide q = old_r / r;
    old_r = std::exchange(r, old_r - q * r);
    old_x = std::exchange(x, old_x - q * x);
  }
  return {old_r, old_x};
}

// True if every index of `part` is in `whole` (both treated as sets).
bool slice_contains(const slice& whole, const slice& part) noexcept {
  const std::int64_t n = count_of(part.start, part.stop, part.step);
  if (n == 0) {
    return true;
  }
  if (!whole.contains(part.start)) {
    return false;
  }
  if (n == 1) {
    return true;
  }
  return part.step % whole.step == 0 && whole.contains(last_index(part));
}

void check_same_rank(const box& a, const box& b, const char* what) {
  if (a.rank() != b.rank()) {
    throw invalid_argument(std::string(what) + ": boxes " + a.to_string() + " (rank " +
                           std::to_string(a.rank()) + ") and " + b.to_string() + " (rank " +
                           std::to_string(b.rank()) + ") differ in rank");
  }
}

}  // namespace

std::int64_t element_count(const shape_t& shape) {
  std::int64_t n = 1;
  for (std::size_t axis = 0; axis < shape.size(); ++axis) {
    if (shape[axis] < 0) {
      throw invalid_argument("element_count: extent " + std::to_string(shape[axis]) + " of axis " +
                             std::to_string(axis) + " is negative");
    }
    if (__builtin_mul_overflow(n, shape[axis], &n)) {
      throw invalid_argument("element_count: the element count of a shape with extent " +
                             std::to_string(shape[axis]) + " on axis " + std::to_string(axis) +
                             " overflows int64");
    }
  }
  return n;
}

slice::slice(std::int64_t start_, std::int64_t stop_, std::int64_t step_)
    : start(start_), stop(stop_), step(step_) {
  if (step == 1) {  // already canonical unless empty
    stop = std::max(start, stop);
    return;
  }
  if (step < 1) {
    throw invalid_argument("slice: step " + std::to_string(step) + " of " + std::to_string(start) +
                           ":" + std::to_string(stop) + " must be >= 1");
  }
  const std::int64_t n = count_of(start, stop, step);
  if (n == 0) {
    stop = start;
    step = 1;
  } else if (n == 1) {
    stop = start + 1;
    step = 1;
  } else {
    stop = last_index(*this) + 1;
  }
}

std::int64_t slice::size() const noexcept {
  return count_of(start, stop, step);
}

bool slice::contains(std::int64_t i) const noexcept {
  if (i < start || i >= stop || step < 1) {
    return false;
  }
  return step == 1 || (wide{i} - start) % step == 0;
}

std::string slice::to_string() const {
  std::string s = std::to_string(start) + ":" + std::to_string(stop);
  if (step != 1) {
    s += ":" + std::to_string(step);
  }
  return s;
}

slice normalize_slice(std::optional<std::int64_t> start, std::optional<std::int64_t> stop,
                      std::int64_t step, std::int64_t extent) {
  if (step == 0) {
    throw invalid_argument("normalize_slice: step 0 is not allowed");
  }
  if (extent < 0) {
    throw invalid_argument("normalize_slice: extent " + std::to_string(extent) + " is negative");
  }
  if (step == std::numeric_limits<std::int64_t>::min()) {
    throw invalid_argument("normalize_slice: step " + std::to_string(step) + " is out of range");
  }
  // Python's slice.indices(): clamp into [lower, upper].
  const std::int64_t lower = step > 0 ? 0 : -1;
  const std::int64_t upper = step > 0 ? extent : extent - 1;
  const auto clamp = [&](std::optional<std::int64_t> v, std::int64_t if_absent) {
    if (!v) {
      return if_absent;
    }
    wide x = *v;
    if (x < 0) {
      x += extent;
    }
    return static_cast<std::int64_t>(std::clamp<wide>(x, lower, upper));
  };
  const std::int64_t first = clamp(start, step > 0 ? lower : upper);
  const std::int64_t end = clamp(stop, step > 0 ? upper : lower);
  if (step > 0) {
    return slice{first, end, step};
  }
  // Backwards: first, first+step, ... > end; the same set read upwards.
  if (first <= end) {
    return slice{0, 0};
  }
  const std::int64_t n = count_of(end, first, -step);  // indices in (end, first] spaced -step
  const std::int64_t lowest = first - (n - 1) * -step;
  return slice{lowest, first + 1, -step};
}

slice intersect(const slice& a, const slice& b) {
  if (a.step == 1 && b.step == 1) {  // the common case: no modular arithmetic
    const std::int64_t lo = std::max(a.start, b.start);
    const std::int64_t hi = std::min(a.stop, b.stop);
    return lo < hi ? slice{lo, hi} : slice{0, 0};
  }
  const std::int64_t na = a.size();
  const std::int64_t nb = b.size();
  if (na == 0 || nb == 0) {
    return slice{0, 0};
  }
  const wide lo = std::max(a.start, b.start);
  const wide hi = std::min(wide{last_index(a)}, wide{last_index(b)}) + 1;
  if (lo >= hi) {
    return slice{0, 0};
  }
  // x == a.start (mod a.step) and x == b.start (mod b.step): a.start + a.step * k with
  // a.step * k == b.start - a.start (mod b.step).
  const auto [g, inv] = extended_gcd(a.step, b.step);
  const wide d = wide{b.start} - a.start;
  if (d % g != 0) {
    return slice{0, 0};
  }
  const wide m = wide{b.step} / g;
  const wide k = floor_mod(floor_mod(d / g, m) * floor_mod(inv, m), m);
  const wide lcm = wide{a.step} / g * b.step;
  const wide x = wide{a.start} + wide{a.step} * k;
  const wide first = lo + floor_mod(x - lo, lcm);
  if (first >= hi) {
    return slice{0, 0};
  }
  if (first + lcm < hi) {
    if (lcm > int64_max) {
      throw invalid_argument("intersect: slices " + a.to_string() + " and " + b.to_string() +
                             " share indices " + std::to_string(static_cast<std::int64_t>(first)) +
                             " and more, lcm of steps " + std::to_string(a.step) + " and " +
                             std::to_string(b.step) + " apart, which overflows int64");
    }
    return slice{static_cast<std::int64_t>(first), static_cast<std::int64_t>(hi),
                 static_cast<std::int64_t>(lcm)};
  }
  return slice{static_cast<std::int64_t>(first), static_cast<std::int64_t>(first) + 1};
}

std::vector<slice> subtract(const slice& a, const slice& b) {
  const slice c = intersect(a, b);
  std::vector<slice> out;
  if (a.empty()) {
    return out;
  }
  if (c.empty()) {
    out.push_back(slice{a.start, a.stop, a.step});
    return out;
  }
  const std::int64_t a_last = last_index(a);
  const std::int64_t c_last = c.last();
  // Before the first shared index.
  if (a.start < c.start) {
    out.push_back(slice{a.start, c.start, a.step});
  }
  // Between the first and last shared index, a's indices fall in `per` residue classes modulo
  // c.step, one of which is c: either one slice per other class, or one per gap between shared
  // indices, whichever is fewer.
  const std::int64_t shared = c.size();
  if (shared > 1) {
    const std::int64_t per = c.step / a.step;
    if (per - 1 <= shared - 1) {
      for (std::int64_t r = 1; r < per; ++r) {
        out.push_back(slice{c.start + r * a.step, c_last, c.step});
      }
    } else {
      for (std::int64_t j = 0; j + 1 < shared; ++j) {
        const std::int64_t at = c.start + j * c.step;
        out.push_back(slice{at + a.step, at + c.step, a.step});
      }
    }
  }
  // After the last shared index.
  if (c_last < a_last) {
    out.push_back(slice{c_last + a.step, a_last + 1, a.step});
  }
  std::erase_if(out, [](const slice& s) { return s.empty(); });
  // A lone index before or after may continue a middle slice (0:10 minus 0:10:2 is 1:10:2, not
  // 1:8:2 and 9:10): fold it in, so that fewer pieces result.
  const auto fold = [&](std::size_t lone) {
    const std::int64_t i = out[lone].start;
    for (std::size_t k = 0; k < out.size(); ++k) {
      slice& s = out[k];
      if (k == lone || s.size() < 2) {
        continue;
      }
      if (wide{s.last()} + s.step == i) {
        s = slice{s.start, i + 1, s.step};
      } else if (wide{s.start} - s.step == i) {
        s = slice{i, s.stop, s.step};
      } else {
        continue;
      }
      out.erase(out.begin() + static_cast<std::ptrdiff_t>(lone));
      return;
    }
  };
  if (out.size() > 1 && out.back().size() == 1) {
    fold(out.size() - 1);
  }
  if (out.size() > 1 && out.front().size() == 1) {
    fold(0);
  }
  std::sort(out.begin(), out.end(),
            [](const slice& x, const slice& y) { return x.start < y.start; });
  return out;
}

const slice& box_dims::at(std::size_t i) const {
  if (i >= n_) {
    throw invalid_argument("darray box: axis " + std::to_string(i) + " of a box of rank " +
                           std::to_string(n_));
  }
  return s_[i];
}

void box_dims::reserve(std::size_t n) const {
  if (n > max_rank) {
    too_many(n);
  }
}

void box_dims::too_many(std::size_t rank) {
  throw invalid_argument("darray box: rank " + std::to_string(rank) + " exceeds the maximum rank " +
                         std::to_string(max_rank));
}

box box::full(const shape_t& shape) {
  box b;
  b.dims.reserve(shape.size());
  for (const std::int64_t n : shape) {
    b.dims.emplace_back(0, n);
  }
  return b;
}

std::int64_t box::size() const noexcept {
  std::int64_t n = 1;
  for (const slice& s : dims) {
    const std::int64_t k = s.size();
    if (k == 0) {
      return 0;
    }
    if (__builtin_mul_overflow(n, k, &n)) {
      n = int64_max;
    }
  }
  return n;
}

shape_t box::extents() const {
  shape_t e;
  e.reserve(dims.size());
  for (const slice& s : dims) {
    e.push_back(s.size());
  }
  return e;
}

bool box::contains(const box& other) const noexcept {
  if (other.rank() != rank()) {
    return false;
  }
  if (other.empty()) {
    return true;
  }
  for (std::size_t axis = 0; axis < dims.size(); ++axis) {
    if (!slice_contains(dims[axis], other.dims[axis])) {
      return false;
    }
  }
  return true;
}

std::string box::to_string() const {
  std::string s = "[";
  for (std::size_t axis = 0; axis < dims.size(); ++axis) {
    if (axis != 0) {
      s += ", ";
    }
    s += dims[axis].to_string();
  }
  return s + "]";
}

std::optional<box> intersect(const box& a, const box& b) {
  check_same_rank(a, b, "intersect");
  box c;
  c.dims.reserve(a.rank());
  for (std::size_t axis = 0; axis < a.rank(); ++axis) {
    slice s = intersect(a.dims[axis], b.dims[axis]);
    if (s.empty()) {
      return std::nullopt;
    }
    c.dims.push_back(s);
  }
  return c;
}

std::vector<box> subtract(const box& a, const box& b) {
  check_same_rank(a, b, "subtract");
  std::vector<box> out;
  if (a.empty()) {
    return out;
  }
  const std::optional<box> c = intersect(a, b);
  if (!c) {
    out.push_back(a);
    return out;
  }
  // Axis by axis: axes before `axis` restricted to the intersection, `axis` outside it, the
  // axes after it whole. The boxes are disjoint because they differ on the first such axis.
  box rest = a;
  for (std::size_t axis = 0; axis < a.rank(); ++axis) {
    for (const slice& s : subtract(a.dims[axis], c->dims[axis])) {
      box piece = rest;
      piece.dims[axis] = s;
      out.push_back(std::move(piece));
    }
    rest.dims[axis] = c->dims[axis];
  }
  return out;
}

std::vector<box> subtract_all(const box& a, const std::vector<box>& others) {
  std::vector<box> rest;
  if (!a.empty()) {
    rest.push_back(a);
  }
  for (const box& o : others) {
    if (rest.empty()) {
      break;
    }
    std::vector<box> next;
    for (const box& r : rest) {
      std::vector<box> parts = subtract(r, o);
      next.insert(next.end(), std::make_move_iterator(parts.begin()),
                  std::make_move_iterator(parts.end()));
    }
    rest = std::move(next);
  }
  return rest;
}

box local_slices(const box& whole, const box& part) {
  check_same_rank(whole, part, "local_slices");
  if (!whole.contains(part)) {
    throw invalid_argument("local_slices: box " + part.to_string() + " is not a subset of " +
                           whole.to_string());
  }
  box local;
  local.dims.reserve(part.rank());
  const bool part_empty = part.empty();
  for (std::size_t axis = 0; axis < part.rank(); ++axis) {
    const slice& w = whole.dims[axis];
    const slice& p = part.dims[axis];
    if (part_empty) {
      // An empty part has no position (its other axes may lie anywhere).
      local.dims.emplace_back(0, 0);
      continue;
    }
    const std::int64_t first = (p.start - w.start) / w.step;
    const std::int64_t last = (last_index(p) - w.start) / w.step;
    local.dims.emplace_back(first, last + 1, p.size() > 1 ? p.step / w.step : 1);
  }
  return local;
}

box drop_axis(const box& b, std::size_t axis) {
  if (axis >= b.rank()) {
    throw invalid_argument("drop_axis: axis " + std::to_string(axis) + " is not below rank " +
                           std::to_string(b.rank()) + " of " + b.to_string());
  }
  box out = b;
  out.dims.erase(out.dims.begin() + static_cast<std::ptrdiff_t>(axis));
  return out;
}

std::vector<box> split_outer(const box& b, std::size_t parts) {
  if (parts == 0) {
    throw invalid_argument("split_outer: parts 0 is not allowed (box " + b.to_string() + ")");
  }
  const auto axis_it =
      std::find_if(b.dims.begin(), b.dims.end(), [](const slice& s) { return s.size() > 1; });
  if (axis_it == b.dims.end() || parts == 1 || b.empty()) {
    return {b};
  }
  const auto axis = static_cast<std::size_t>(axis_it - b.dims.begin());
  const slice& s = *axis_it;
  const std::int64_t n = s.size();
  const auto p = static_cast<std::int64_t>(std::min(parts, static_cast<std::size_t>(n)));
  const std::int64_t base = n / p;
  const std::int64_t extra = n % p;
  std::vector<box> out;
  out.reserve(static_cast<std::size_t>(p));
  std::int64_t offset = 0;
  for (std::int64_t i = 0; i < p; ++i) {
    const std::int64_t len = base + (i < extra ? 1 : 0);
    box part = b;
    const std::int64_t first = s.start + offset * s.step;
    part.dims[axis] = slice{first, first + (len - 1) * s.step + 1, s.step};
    out.push_back(std::move(part));
    offset += len;
  }
  return out;
}

}  // namespace poolscope::darray
