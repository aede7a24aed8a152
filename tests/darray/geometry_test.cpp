// darray geometry: slices and boxes checked against brute-force enumeration of their index sets
// (random cases print their seed), Python's slice semantics (a table produced by CPython), and
// int64 edge cases of the intersection of arithmetic progressions.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "poolscope/darray/geometry.hpp"
#include "poolscope/error.hpp"
#include "test_support.hpp"

namespace poolscope::darray {
namespace {

using test_support::indices;
using test_support::point;
using test_support::points;
constexpr std::int64_t i64_max = std::numeric_limits<std::int64_t>::max();
constexpr std::int64_t i64_min = std::numeric_limits<std::int64_t>::min();

using test_support::test_seed;

// True if the slice has the canonical form the header promises.
bool canonical(const slice& s) {
  if (s.step < 1) {
    return false;
  }
  if (s.stop <= s.start) {
    return s.stop == s.start && s.step == 1;
  }
  const std::int64_t n = (s.stop - s.start - 1) / s.step + 1;
  return s.start + (n - 1) * s.step == s.stop - 1 && (n > 1 || s.step == 1);
}

slice random_slice(std::mt19937_64& rng, std::int64_t lo, std::int64_t hi, std::int64_t max_step) {
  std::uniform_int_distribution<std::int64_t> pos(lo, hi);
  std::uniform_int_distribution<std::int64_t> step(1, max_step);
  std::int64_t a = pos(rng);
  std::int64_t b = pos(rng);
  if (a > b && rng() % 4 != 0) {
    std::swap(a, b);  // mostly non-empty
  }
  return slice{a, b, step(rng)};
}

box random_box(std::mt19937_64& rng, std::size_t rank, std::int64_t extent, std::int64_t max_step) {
  box b;
  for (std::size_t axis = 0; axis < rank; ++axis) {
    b.dims.push_back(random_slice(rng, 0, extent, max_step));
  }
  return b;
}

// --- element_count ---

TEST(darray_element_count, multiplies_extents) {
  EXPECT_EQ(element_count({}), 1);
  EXPECT_EQ(element_count({7}), 7);
  EXPECT_EQ(element_count({3, 4, 5}), 60);
  EXPECT_EQ(element_count({3, 0, 5}), 0);
}

TEST(darray_element_count, rejects_negative_extents_and_overflow) {
  try {
    static_cast<void>(element_count({3, -2}));
    FAIL() << "no throw";
  } catch (const invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("-2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(static_cast<void>(element_count({std::int64_t{1} << 32, std::int64_t{1} << 32})),
               invalid_argument);
  EXPECT_EQ(element_count({std::int64_t{1} << 31, std::int64_t{1} << 31}), std::int64_t{1} << 62);
}

// --- slice ---

TEST(darray_slice, constructor_canonicalizes) {
  EXPECT_EQ(slice(0, 11, 3), slice(0, 10, 3));
  EXPECT_EQ(slice(0, 11, 3).stop, 10);
  EXPECT_EQ(slice(0, 10, 3).stop, 10);
  EXPECT_EQ(slice(2, 9, 3).stop, 9);
  const slice one(4, 6, 3);
  EXPECT_EQ(one.start, 4);
  EXPECT_EQ(one.stop, 5);
  EXPECT_EQ(one.step, 1);
  const slice none(5, 3, 2);
  EXPECT_EQ(none.start, 5);
  EXPECT_EQ(none.stop, 5);
  EXPECT_EQ(none.step, 1);
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(slice(i64_min, i64_max, 1).size(), i64_max);  // saturated, not overflowed
  EXPECT_EQ(slice(i64_max - 1, i64_max, 5), slice(i64_max - 1, i64_max));
}

TEST(darray_slice, rejects_step_below_one) {
  for (const std::int64_t step : {std::int64_t{0}, std::int64_t{-1}, i64_min}) {
    try {
      static_cast<void>(slice(0, 10, step));
      FAIL() << "no throw for step " << step;
    } catch (const invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("step " + std::to_string(step)), std::string::npos)
          << e.what();
    }
  }
}

TEST(darray_slice, size_contains_and_to_string) {
  const slice s(3, 20, 4);  // 3 7 11 15 19
  EXPECT_EQ(s.size(), 5);
  EXPECT_EQ(s.last(), 19);
  EXPECT_TRUE(s.contains(3));
  EXPECT_TRUE(s.contains(19));
  EXPECT_FALSE(s.contains(4));
  EXPECT_FALSE(s.contains(23));
  EXPECT_FALSE(s.contains(-1));
  EXPECT_EQ(s.to_string(), "3:20:4");
  EXPECT_EQ(slice(0, 5).to_string(), "0:5");
  EXPECT_EQ(slice(2, 2).size(), 0);
  EXPECT_FALSE(slice(2, 2).contains(2));
}

// Unit steps take a path without 128-bit arithmetic: the same answers, up to the int64 limits.
TEST(darray_slice, unit_steps_at_the_int64_limits) {
  EXPECT_EQ(slice(i64_min, i64_max).size(), i64_max);  // 2^64 - 1 indices: saturates
  EXPECT_EQ(slice(-5, i64_max).size(), i64_max);       // 2^63 + 4 indices: saturates
  EXPECT_EQ(slice(0, i64_max).size(), i64_max);
  EXPECT_EQ(slice(i64_min, i64_min + 3).size(), 3);
  EXPECT_EQ(slice(7, 3), slice(7, 7));  // empty: stop = start
  EXPECT_TRUE(slice(i64_min, i64_max).contains(i64_min));
  EXPECT_TRUE(slice(i64_min, i64_max).contains(i64_max - 1));
  EXPECT_FALSE(slice(i64_min, i64_max).contains(i64_max));
  EXPECT_EQ(intersect(slice(i64_min, 10), slice(-10, i64_max)), slice(-10, 10));
  EXPECT_EQ(intersect(slice(0, 10), slice(10, 20)), slice(0, 0));
  EXPECT_EQ(intersect(slice(0, 10), slice(0, 10, 3)), slice(0, 10, 3));  // mixed steps
  const box whole{{slice(i64_min, i64_max)}};
  EXPECT_TRUE(whole.contains(box{{slice(i64_max - 2, i64_max)}}));
  EXPECT_EQ(local_slices(box{{slice(-4, 4)}}, box{{slice(0, 2)}}), (box{{slice(4, 6)}}));
}

// Stepped slices with more than INT64_MAX indices (size() saturates) keep their last index: the
// canonical stop and every operation using the last index see the whole set.
TEST(darray_slice, stepped_slices_beyond_int64_max_indices_keep_their_last_index) {
  const slice evens(i64_min, i64_max, 2);  // 2^63 indices, the last i64_max - 1
  EXPECT_EQ(evens.size(), i64_max);        // saturated
  EXPECT_EQ(evens.stop, i64_max);
  EXPECT_TRUE(evens.contains(i64_max - 1));
  EXPECT_TRUE(evens.contains(i64_min));
  EXPECT_FALSE(evens.contains(i64_max - 2));
  const slice odds(i64_min + 1, i64_max, 2);  // 2^63 - 1 indices, the last i64_max - 2
  EXPECT_EQ(odds.size(), i64_max);
  EXPECT_EQ(odds.stop, i64_max - 1);
  EXPECT_TRUE(odds.contains(i64_max - 2));
  // The top of the range, through intersection, containment and subtraction.
  EXPECT_EQ(intersect(evens, slice(i64_max - 10, i64_max)), slice(i64_max - 9, i64_max, 2));
  EXPECT_TRUE(box{{evens}}.contains(box{{slice(i64_max - 1, i64_max)}}));
  EXPECT_TRUE(box{{evens}}.contains(box{{slice(i64_max - 5, i64_max, 2)}}));
  const std::vector<slice> rest = subtract(slice(i64_max - 6, i64_max), evens);
  ASSERT_EQ(rest.size(), 1U);
  EXPECT_EQ(rest[0], slice(i64_max - 6, i64_max, 2));  // i64_max - 6 is odd
  EXPECT_EQ(subtract(evens, slice(i64_min, i64_max - 1)),
            std::vector<slice>{slice(i64_max - 1, i64_max)});
}

TEST(darray_slice, random_slices_are_canonical_and_hold_their_range) {
  const std::uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int iter = 0; iter < 2000; ++iter) {
    std::uniform_int_distribution<std::int64_t> pos(-30, 30);
    std::uniform_int_distribution<std::int64_t> step(1, 9);
    const std::int64_t a = pos(rng);
    const std::int64_t b = pos(rng);
    const std::int64_t k = step(rng);
    const slice s(a, b, k);
    std::set<std::int64_t> expected;
    for (std::int64_t i = a; i < b; i += k) {
      expected.insert(i);
    }
    ASSERT_EQ(indices(s), expected) << a << ":" << b << ":" << k;
    ASSERT_TRUE(canonical(s)) << s.to_string();
    ASSERT_EQ(s.size(), static_cast<std::int64_t>(expected.size()));
    for (std::int64_t i = -32; i < 32; ++i) {
      ASSERT_EQ(s.contains(i), expected.count(i) == 1) << s.to_string() << " " << i;
    }
  }
}

// --- normalize_slice, against CPython: sorted(range(extent)[start:stop:step]) ---

struct python_case {
  std::optional<std::int64_t> start;
  std::optional<std::int64_t> stop;
  std::int64_t step;
  std::int64_t extent;
  std::vector<std::int64_t> expected;
};

TEST(darray_normalize_slice, matches_python) {
  const std::vector<python_case> cases = {
      {-1, -3, -2, 1, {0}},
      {-1, 5, -2, 0, {}},
      {-1, std::nullopt, -2, 8, {1, 3, 5, 7}},
      {-15, -3, 5, 1, {}},
      {-15, 0, -4, 0, {}},
      {-15, 5, -3, 10, {}},
      {-15, 7, 1, 10, {0, 1, 2, 3, 4, 5, 6}},
      {-3, 7, 3, 1, {0}},
      {-3, std::nullopt, -2, 5, {0, 2}},
      {-7, -15, -2, 1, {}},
      {0, -7, -3, 8, {}},
      {0, 9, 3, 1, {0}},
      {1, -7, -3, 10, {}},
      {1, 1, -3, 8, {}},
      {1, 5, 1, 8, {1, 2, 3, 4}},
      {15, -3, 3, 8, {}},
      {15, 15, 1, 10, {}},
      {15, 5, -4, 8, {7}},
      {2, -15, -2, 8, {0, 2}},
      {2, -15, -3, 5, {2}},
      {2, 7, -2, 5, {}},
      {2, 7, 5, 5, {2}},
      {7, -15, -1, 10, {0, 1, 2, 3, 4, 5, 6, 7}},
      {7, -15, -3, 10, {1, 4, 7}},
      {7, 7, -1, 5, {}},
      {9, 0, -4, 8, {3, 7}},
      {9, 2, 1, 8, {}},
      {std::nullopt, -3, 1, 1, {}},
      {std::nullopt, 7, -1, 8, {}},
      {std::nullopt, 7, -2, 10, {9}},
      {std::nullopt, std::nullopt, -1, 5, {0, 1, 2, 3, 4}},
      {std::nullopt, std::nullopt, -3, 10, {0, 3, 6, 9}},
      {std::nullopt, std::nullopt, 4, 10, {0, 4, 8}},
      {-2, std::nullopt, 1, 10, {8, 9}},
      {std::nullopt, -1, -1, 10, {}},
      {-1, std::nullopt, -1, 4, {0, 1, 2, 3}},
  };
  for (const python_case& c : cases) {
    const slice s = normalize_slice(c.start, c.stop, c.step, c.extent);
    const std::set<std::int64_t> expected(c.expected.begin(), c.expected.end());
    EXPECT_EQ(indices(s), expected) << (c.start ? std::to_string(*c.start) : "None") << ":"
                                    << (c.stop ? std::to_string(*c.stop) : "None") << ":" << c.step
                                    << " of " << c.extent << " -> " << s.to_string();
    EXPECT_TRUE(canonical(s)) << s.to_string();
  }
}

TEST(darray_normalize_slice, rejects_zero_step_and_negative_extent) {
  try {
    static_cast<void>(normalize_slice(0, 5, 0, 10));
    FAIL() << "no throw";
  } catch (const invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("step 0"), std::string::npos) << e.what();
  }
  EXPECT_THROW(static_cast<void>(normalize_slice(std::nullopt, std::nullopt, 1, -1)),
               invalid_argument);
}

// --- slice intersection ---

TEST(darray_slice_intersect, examples) {
  EXPECT_EQ(intersect(slice(0, 100, 4), slice(2, 100, 6)), slice(8, 93, 12));  // 8 20 .. 92
  EXPECT_EQ(intersect(slice(0, 100, 4), slice(1, 100, 2)), slice(0, 0));       // parity differs
  EXPECT_EQ(intersect(slice(0, 10), slice(5, 20)), slice(5, 10));
  EXPECT_EQ(intersect(slice(0, 10, 3), slice(9, 12)), slice(9, 10));
  EXPECT_TRUE(intersect(slice(0, 10), slice(10, 20)).empty());
  EXPECT_TRUE(intersect(slice(0, 10), slice(3, 3)).empty());
}

TEST(darray_slice_intersect, random_against_brute_force) {
  const std::uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int iter = 0; iter < 20000; ++iter) {
    const slice a = random_slice(rng, -40, 60, 12);
    const slice b = random_slice(rng, -40, 60, 12);
    const slice c = intersect(a, b);
    std::set<std::int64_t> expected;
    for (const std::int64_t i : indices(a)) {
      if (indices(b).count(i) == 1) {
        expected.insert(i);
      }
    }
    ASSERT_EQ(indices(c), expected)
        << a.to_string() << " & " << b.to_string() << " -> " << c.to_string();
    ASSERT_TRUE(canonical(c)) << c.to_string();
    ASSERT_EQ(intersect(b, a), c);
  }
}

TEST(darray_slice_intersect, large_steps_with_representable_lcm) {
  const std::int64_t p = std::int64_t{1} << 31;
  const std::int64_t q = std::int64_t{3} << 30;
  // Multiples of 2^31 and of 3 * 2^30: the multiples of 3 * 2^31.
  EXPECT_EQ(intersect(slice(0, i64_max, p), slice(0, i64_max, q)),
            slice(0, i64_max, std::int64_t{3} << 31));
  // Near the top of int64: brute force over the last 40 indices.
  const slice a(i64_max - 40, i64_max, 3);
  const slice b(i64_max - 37, i64_max, 2);
  std::set<std::int64_t> expected;
  for (std::int64_t off = 40; off >= 1; --off) {
    const std::int64_t i = i64_max - off;
    if ((i - a.start) % 3 == 0 && (i - b.start) % 2 == 0 && i >= b.start) {
      expected.insert(i);
    }
  }
  const slice c = intersect(a, b);
  EXPECT_EQ(indices(c), expected) << c.to_string();
  // Near the bottom.
  EXPECT_EQ(intersect(slice(i64_min, i64_min + 30, 5), slice(i64_min + 2, i64_min + 30, 4)),
            slice(i64_min + 10, i64_min + 11));  // offsets 0 5 10 .. and 2 6 10 ..: only 10
}

TEST(darray_slice_intersect, lcm_beyond_int64) {
  // Two primes just around sqrt(2^63): their product exceeds INT64_MAX.
  const std::int64_t p = 3037000507;
  const std::int64_t q = 3037000493;
  // One shared index in range: representable.
  EXPECT_EQ(intersect(slice(0, i64_max, p), slice(0, i64_max, q)), slice(0, 1));
  EXPECT_EQ(intersect(slice(5, i64_max, p), slice(5, i64_max, q)), slice(5, 6));
  // x = 0 mod p, x = 1 mod q: at most one such x in range, and it is in both.
  const slice one = intersect(slice(0, i64_max, p), slice(1, i64_max, q));
  EXPECT_LE(one.size(), 1);
  if (!one.empty()) {
    EXPECT_EQ(one.start % p, 0);
    EXPECT_EQ(one.start % q, 1);
  }
  // Two shared indices lcm > INT64_MAX apart: no slice holds them.
  try {
    static_cast<void>(intersect(slice(i64_min, i64_max, p), slice(i64_min, i64_max, q)));
    FAIL() << "no throw";
  } catch (const invalid_argument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(std::to_string(p)), std::string::npos) << what;
    EXPECT_NE(what.find(std::to_string(q)), std::string::npos) << what;
  }
}

// --- slice subtraction ---

TEST(darray_slice_subtract, examples) {
  EXPECT_EQ(subtract(slice(0, 10), slice(3, 6)), (std::vector<slice>{slice(0, 3), slice(6, 10)}));
  EXPECT_EQ(subtract(slice(0, 10), slice(0, 10, 2)), (std::vector<slice>{slice(1, 10, 2)}));
  EXPECT_EQ(subtract(slice(0, 10), slice(20, 30)), (std::vector<slice>{slice(0, 10)}));
  EXPECT_TRUE(subtract(slice(0, 10, 2), slice(0, 10)).empty());
  EXPECT_TRUE(subtract(slice(4, 4), slice(0, 10)).empty());
  // A long run minus two indices far apart: gaps, not one slice per residue class.
  const std::vector<slice> gaps = subtract(slice(0, 1000000), slice(10, 1000000, 500000));
  EXPECT_EQ(gaps, (std::vector<slice>{slice(0, 10), slice(11, 500010), slice(500011, 1000000)}));
}

TEST(darray_slice_subtract, random_against_brute_force) {
  const std::uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed + 1);
  for (int iter = 0; iter < 20000; ++iter) {
    const slice a = random_slice(rng, -40, 60, 6);
    const slice b = random_slice(rng, -40, 60, 12);
    const std::vector<slice> parts = subtract(a, b);
    std::set<std::int64_t> expected = indices(a);
    for (const std::int64_t i : indices(b)) {
      expected.erase(i);
    }
    std::set<std::int64_t> got;
    std::size_t total = 0;
    for (std::size_t k = 0; k < parts.size(); ++k) {
      ASSERT_FALSE(parts[k].empty());
      ASSERT_TRUE(canonical(parts[k])) << parts[k].to_string();
      if (k > 0) {
        ASSERT_LT(parts[k - 1].start, parts[k].start);
      }
      const auto idx = indices(parts[k]);
      got.insert(idx.begin(), idx.end());
      total += idx.size();
    }
    ASSERT_EQ(got, expected) << a.to_string() << " - " << b.to_string();
    ASSERT_EQ(total, expected.size())
        << "overlapping parts of " << a.to_string() << " - " << b.to_string();
  }
}

// --- boxes ---

TEST(darray_box, full_extents_size_and_to_string) {
  const box b = box::full({4, 6});
  EXPECT_EQ(b, (box{{slice(0, 4), slice(0, 6)}}));
  EXPECT_EQ(b.size(), 24);
  EXPECT_EQ(b.to_string(), "[0:4, 0:6]");
  const box s{{slice(0, 4), slice(2, 8, 2)}};
  EXPECT_EQ(s.to_string(), "[0:4, 2:7:2]");  // canonical: stop is the last index + 1
  EXPECT_EQ(s.extents(), (shape_t{4, 3}));
  EXPECT_EQ(s.size(), 12);
  const box scalar = box::full({});
  EXPECT_EQ(scalar.rank(), 0u);
  EXPECT_EQ(scalar.size(), 1);
  EXPECT_EQ(scalar.to_string(), "[]");
  EXPECT_TRUE((box{{slice(0, 4), slice(3, 3)}}).empty());
}

TEST(darray_box, header_example) {
  const box a{{slice{0, 10}, slice{0, 8, 2}}};
  const box b{{slice{5, 20}, slice{0, 8}}};
  const auto c = intersect(a, b);
  ASSERT_TRUE(c);
  EXPECT_EQ(*c, (box{{slice(5, 10), slice(0, 8, 2)}}));
  EXPECT_EQ(subtract(a, b), (std::vector<box>{box{{slice(0, 5), slice(0, 8, 2)}}}));
  EXPECT_EQ(local_slices(a, *c), (box{{slice(5, 10), slice(0, 4)}}));
}

TEST(darray_box, contains) {
  const box a{{slice(0, 10), slice(0, 20, 2)}};
  EXPECT_TRUE(a.contains(box{{slice(2, 5), slice(4, 20, 4)}}));
  EXPECT_TRUE(a.contains(box{{slice(2, 5), slice(6, 7)}}));
  EXPECT_FALSE(a.contains(box{{slice(2, 5), slice(5, 6)}}));
  EXPECT_FALSE(a.contains(box{{slice(2, 5), slice(4, 20, 3)}}));
  EXPECT_FALSE(a.contains(box{{slice(2, 11), slice(4, 5)}}));
  EXPECT_TRUE(a.contains(box{{slice(50, 50), slice(1, 99)}}));  // empty: a subset of anything
  EXPECT_FALSE(a.contains(box{{slice(0, 1)}}));                 // rank differs
}

TEST(darray_box, rank_mismatch_throws) {
  const box a{{slice(0, 4)}};
  const box b{{slice(0, 4), slice(0, 4)}};
  EXPECT_THROW(static_cast<void>(intersect(a, b)), invalid_argument);
  EXPECT_THROW(static_cast<void>(subtract(a, b)), invalid_argument);
  EXPECT_THROW(static_cast<void>(local_slices(a, b)), invalid_argument);
}

TEST(darray_box, at_most_max_rank_slices_held_inline) {
  box b{{slice(0, 2), slice(0, 3), slice(0, 4), slice(0, 5)}};
  EXPECT_EQ(b.rank(), max_rank);
  EXPECT_EQ(b.size(), 120);
  const box copy = b;  // a plain value
  EXPECT_EQ(copy, b);
  b.dims.erase(b.dims.begin() + 1);
  EXPECT_EQ(b, (box{{slice(0, 2), slice(0, 4), slice(0, 5)}}));
  EXPECT_NE(b, copy);
  EXPECT_EQ(b.dims.at(2), slice(0, 5));
  EXPECT_THROW((void)b.dims.at(3), invalid_argument);
  b.dims.push_back(slice(0, 6));
  try {
    b.dims.emplace_back(0, 7);
    FAIL() << "a fifth axis was accepted";
  } catch (const invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("rank 5"), std::string::npos) << e.what();
  }
  EXPECT_EQ(b.rank(), max_rank);  // unchanged by the failed add
  EXPECT_THROW((box{{slice(0, 1), slice(0, 1), slice(0, 1), slice(0, 1), slice(0, 1)}}),
               invalid_argument);
  EXPECT_THROW((void)box::full({1, 2, 3, 4, 5}), invalid_argument);
}

TEST(darray_box, rank_zero) {
  const box s = box::full({});
  const auto c = intersect(s, s);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->size(), 1);
  EXPECT_TRUE(subtract(s, s).empty());
  EXPECT_EQ(local_slices(s, s), s);
  EXPECT_EQ(split_outer(s, 3), std::vector<box>{s});
}

TEST(darray_box, random_intersect_subtract_against_brute_force) {
  const std::uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed + 2);
  for (int iter = 0; iter < 3000; ++iter) {
    const std::size_t rank = 1 + rng() % 3;
    const box a = random_box(rng, rank, 9, 3);
    const box b = random_box(rng, rank, 9, 4);
    const std::set<point> pa = points(a);
    const std::set<point> pb = points(b);
    std::set<point> common;
    std::set<point> diff;
    for (const point& p : pa) {
      (pb.count(p) == 1 ? common : diff).insert(p);
    }
    const auto c = intersect(a, b);
    if (common.empty()) {
      ASSERT_FALSE(c) << a.to_string() << " & " << b.to_string();
    } else {
      ASSERT_TRUE(c);
      ASSERT_EQ(points(*c), common) << a.to_string() << " & " << b.to_string();
    }
    std::set<point> got;
    std::size_t total = 0;
    for (const box& part : subtract(a, b)) {
      ASSERT_FALSE(part.empty());
      const auto pp = points(part);
      got.insert(pp.begin(), pp.end());
      total += pp.size();
    }
    ASSERT_EQ(got, diff) << a.to_string() << " - " << b.to_string();
    ASSERT_EQ(total, diff.size()) << "overlap in " << a.to_string() << " - " << b.to_string();
    ASSERT_EQ(a.contains(b), std::includes(pa.begin(), pa.end(), pb.begin(), pb.end()))
        << a.to_string() << " contains " << b.to_string();
  }
}

TEST(darray_box, random_subtract_all_against_brute_force) {
  const std::uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed + 3);
  for (int iter = 0; iter < 1000; ++iter) {
    const std::size_t rank = 1 + rng() % 3;
    const box a = random_box(rng, rank, 8, 2);
    std::vector<box> others;
    std::set<point> expected = points(a);
    for (std::size_t k = rng() % 5; k > 0; --k) {
      others.push_back(random_box(rng, rank, 8, 3));
      for (const point& p : points(others.back())) {
        expected.erase(p);
      }
    }
    std::set<point> got;
    std::size_t total = 0;
    for (const box& part : subtract_all(a, others)) {
      const auto pp = points(part);
      got.insert(pp.begin(), pp.end());
      total += pp.size();
    }
    ASSERT_EQ(got, expected) << a.to_string();
    ASSERT_EQ(total, expected.size());
  }
}

// --- local_slices ---

TEST(darray_local_slices, random_subsets_against_brute_force) {
  const std::uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed + 4);
  for (int iter = 0; iter < 3000; ++iter) {
    const std::size_t rank = 1 + rng() % 3;
    box whole;
    box part;
    for (std::size_t axis = 0; axis < rank; ++axis) {
      const std::int64_t start = static_cast<std::int64_t>(rng() % 20) - 5;
      const std::int64_t step = 1 + static_cast<std::int64_t>(rng() % 4);
      const std::int64_t n = 1 + static_cast<std::int64_t>(rng() % 8);
      whole.dims.emplace_back(start, start + n * step, step);
      // A part: local indices first, first+k, ... within [0, n).
      const auto first = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(n));
      const std::int64_t k = 1 + static_cast<std::int64_t>(rng() % 3);
      const std::int64_t last =
          first + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(n - first));
      part.dims.emplace_back(start + first * step, start + last * step + 1, k * step);
    }
    const box local = local_slices(whole, part);
    // Brute force: the dense row-major positions of part's elements inside whole.
    std::set<point> expected;
    for (point p : points(part)) {
      for (std::size_t axis = 0; axis < rank; ++axis) {
        p[axis] = (p[axis] - whole.dims[axis].start) / whole.dims[axis].step;
      }
      expected.insert(p);
    }
    ASSERT_EQ(points(local), expected) << whole.to_string() << " / " << part.to_string();
    for (const slice& s : local.dims) {
      ASSERT_TRUE(canonical(s)) << s.to_string();
    }
    ASSERT_TRUE(box::full(whole.extents()).contains(local));
  }
}

TEST(darray_local_slices, rejects_non_subsets) {
  const box whole{{slice(0, 10), slice(0, 20, 2)}};
  for (const box& bad : {box{{slice(0, 11), slice(0, 2)}}, box{{slice(0, 3), slice(1, 2)}},
                         box{{slice(0, 3), slice(0, 20, 3)}}, box{{slice(-1, 3), slice(0, 1)}}}) {
    try {
      static_cast<void>(local_slices(whole, bad));
      ADD_FAILURE() << "no throw for " << bad.to_string();
    } catch (const invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(bad.to_string()), std::string::npos) << e.what();
    }
  }
  // A single index needs no matching step.
  EXPECT_EQ(local_slices(whole, box{{slice(3, 4), slice(6, 7)}}),
            (box{{slice(3, 4), slice(3, 4)}}));
}

// --- drop_axis and split_outer ---

TEST(darray_drop_axis, removes_the_axis) {
  const box b{{slice(0, 4), slice(1, 9, 2), slice(3, 5)}};
  EXPECT_EQ(drop_axis(b, 1), (box{{slice(0, 4), slice(3, 5)}}));
  EXPECT_EQ(drop_axis(b, 0), (box{{slice(1, 9, 2), slice(3, 5)}}));
  EXPECT_THROW(static_cast<void>(drop_axis(b, 3)), invalid_argument);
}

TEST(darray_split_outer, examples) {
  const box b{{slice(0, 10), slice(0, 4)}};
  EXPECT_EQ(split_outer(b, 3),
            (std::vector<box>{box{{slice(0, 4), slice(0, 4)}}, box{{slice(4, 7), slice(0, 4)}},
                              box{{slice(7, 10), slice(0, 4)}}}));
  // The outer axis has one index: the next axis is split.
  const box row{{slice(5, 6), slice(0, 10, 2)}};
  ASSERT_EQ(split_outer(row, 2).size(), 2u);
  EXPECT_EQ(split_outer(row, 2)[0], (box{{slice(5, 6), slice(0, 5, 2)}}));
  EXPECT_EQ(split_outer(row, 2)[1], (box{{slice(5, 6), slice(6, 9, 2)}}));
  // More parts than indices: one per index.
  EXPECT_EQ(split_outer(box{{slice(0, 3)}}, 8).size(), 3u);
  EXPECT_EQ(split_outer(b, 1), std::vector<box>{b});
  EXPECT_THROW(static_cast<void>(split_outer(b, 0)), invalid_argument);
}

TEST(darray_split_outer, random_partitions_in_order) {
  const std::uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed + 5);
  for (int iter = 0; iter < 1000; ++iter) {
    const std::size_t rank = 1 + rng() % 3;
    const box b = random_box(rng, rank, 12, 3);
    const std::size_t parts = 1 + rng() % 6;
    const std::vector<box> split = split_outer(b, parts);
    ASSERT_LE(split.size(), parts);
    // Along the outermost axis with more than one index: min(parts, extent) parts whose extents
    // differ by at most one; the other axes untouched.
    std::size_t axis = 0;
    while (axis < b.rank() && b.dims[axis].size() <= 1) {
      ++axis;
    }
    if (b.empty() || axis == b.rank()) {
      ASSERT_EQ(split, std::vector<box>{b});
      continue;
    }
    const std::int64_t n = b.dims[axis].size();
    ASSERT_EQ(static_cast<std::int64_t>(split.size()),
              std::min(n, static_cast<std::int64_t>(parts)));
    std::set<point> got;
    std::size_t total = 0;
    for (std::size_t k = 0; k < split.size(); ++k) {
      const auto pp = points(split[k]);
      got.insert(pp.begin(), pp.end());
      total += pp.size();
      if (k > 0) {
        ASSERT_LT(split[k - 1].dims[axis].last(), split[k].dims[axis].start);
      }
      const std::int64_t len = split[k].dims[axis].size();
      ASSERT_TRUE(len == n / static_cast<std::int64_t>(split.size()) ||
                  len == n / static_cast<std::int64_t>(split.size()) + 1)
          << "uneven split of " << b.to_string();
      for (std::size_t other = 0; other < b.rank(); ++other) {
        if (other != axis) {
          ASSERT_EQ(split[k].dims[other], b.dims[other]);
        }
      }
    }
    const auto expected = points(b);
    ASSERT_EQ(got, expected) << b.to_string();
    ASSERT_EQ(total, expected.size());
  }
}

}  // namespace
}  // namespace poolscope::darray
