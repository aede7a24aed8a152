// Helpers shared by the darray tests.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <set>
#include <vector>

#include "poolscope/darray/geometry.hpp"

namespace poolscope::darray::test_support {

/// Seed of the randomized tests: POOLSCOPE_TEST_SEED if set, else `fallback`.
inline std::uint64_t test_seed(std::uint64_t fallback = 20240611) {
  const char* env = std::getenv("POOLSCOPE_TEST_SEED");
  return env != nullptr ? std::strtoull(env, nullptr, 10) : fallback;
}

using point = std::vector<std::int64_t>;

/// The index set of a slice, by walking it (small slices only; safe up to the int64 limits).
inline std::set<std::int64_t> indices(const slice& s) {
  std::set<std::int64_t> out;
  for (std::int64_t i = s.start; i < s.stop; i += s.step) {
    out.insert(i);
    if (s.stop - i <= s.step) {
      break;  // the next step could overflow int64
    }
  }
  return out;
}

/// The element set of a box, by walking every axis with its step (small boxes only).
inline std::set<point> points(const box& b) {
  std::set<point> out;
  if (b.empty()) {
    return out;
  }
  point p(b.rank());
  const auto walk = [&](const auto& self, std::size_t axis) -> void {
    if (axis == b.rank()) {
      out.insert(p);
      return;
    }
    for (const std::int64_t i : indices(b.dims[axis])) {
      p[axis] = i;
      self(self, axis + 1);
    }
  };
  walk(walk, 0);
  return out;
}

}  // namespace poolscope::darray::test_support
