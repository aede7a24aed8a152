// darray box_index (darray/src/box_index.hpp): its candidates hold every box that shares an
// element with the query (checked against a walk over every box), for random strided boxes of
// ranks 1 to 4; for_each_meeting gives exactly the meeting pairs, in order, on both of its paths
// (every pair, and through the index); and the work of pairing tiled lists grows as n log n.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <tuple>
#include <vector>

#include "box_index.hpp"
#include "poolscope/darray/geometry.hpp"
#include "test_support.hpp"

namespace poolscope::darray {
namespace {

using detail::box_index;
using detail::for_each_meeting;
using test_support::test_seed;

// A random box of `rank` inside [0, 40) per axis, sometimes strided, sometimes empty.
box random_box(std::mt19937_64& rng, std::size_t rank) {
  std::uniform_int_distribution<std::int64_t> at(0, 39);
  std::uniform_int_distribution<std::int64_t> step(1, 4);
  box b;
  for (std::size_t a = 0; a < rank; ++a) {
    std::int64_t lo = at(rng);
    std::int64_t hi = at(rng);
    if (lo > hi) {
      std::swap(lo, hi);
    }
    b.dims.emplace_back(lo, hi + (rng() % 8 == 0 ? 0 : 1), rng() % 3 == 0 ? step(rng) : 1);
  }
  return b;
}

TEST(darray_box_index, candidates_hold_every_box_sharing_an_element) {
  const std::uint64_t seed = test_seed();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  for (std::size_t rank = 1; rank <= max_rank; ++rank) {
    for (const std::size_t n : {0U, 1U, 3U, 17U, 200U}) {
      std::vector<box> boxes;
      for (std::size_t i = 0; i < n; ++i) {
        boxes.push_back(random_box(rng, rank));
      }
      const box_index index(n, [&](std::size_t i) -> const box& { return boxes[i]; });
      EXPECT_EQ(index.size(),
                static_cast<std::size_t>(std::count_if(boxes.begin(), boxes.end(),
                                                       [](const box& b) { return !b.empty(); })));
      for (int q = 0; q < 50; ++q) {
        const box query = random_box(rng, rank);
        std::vector<std::uint32_t> found;
        static_cast<void>(index.candidates(query, found));
        std::sort(found.begin(), found.end());
        EXPECT_TRUE(std::adjacent_find(found.begin(), found.end()) == found.end())
            << "a box found twice";
        for (std::size_t i = 0; i < n; ++i) {
          if (intersect(boxes[i], query)) {
            EXPECT_TRUE(std::binary_search(found.begin(), found.end(), i))
                << "box " << boxes[i].to_string() << " meets " << query.to_string()
                << " and was not found (rank " << rank << ", " << n << " boxes)";
          }
        }
        for (const std::uint32_t i : found) {
          EXPECT_FALSE(boxes[i].empty()) << "an empty box was found";
        }
      }
    }
  }
}

// The pairs of two random lists, by walking every pair, in for_each_meeting's order (j, then i).
std::vector<std::tuple<std::size_t, std::size_t, box>> every_pair(const std::vector<box>& a,
                                                                  const std::vector<box>& b) {
  std::vector<std::tuple<std::size_t, std::size_t, box>> out;
  for (std::size_t j = 0; j < b.size(); ++j) {
    for (std::size_t i = 0; i < a.size(); ++i) {
      if (std::optional<box> c = intersect(a[i], b[j])) {
        out.emplace_back(i, j, *c);
      }
    }
  }
  return out;
}

TEST(darray_box_index, for_each_meeting_gives_exactly_the_meeting_pairs_in_order) {
  const std::uint64_t seed = test_seed();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  // Sizes below and above all_pairs_below: both paths.
  for (const auto& [na, nb] : std::vector<std::pair<std::size_t, std::size_t>>{
           {0, 5}, {5, 0}, {1, 1}, {3, 7}, {8, 8}, {9, 8}, {1, 300}, {300, 1}, {120, 90}}) {
    std::vector<box> a;
    std::vector<box> b;
    const std::size_t rank = 1 + rng() % max_rank;
    for (std::size_t i = 0; i < na; ++i) {
      a.push_back(random_box(rng, rank));
    }
    for (std::size_t j = 0; j < nb; ++j) {
      b.push_back(random_box(rng, rank));
    }
    std::vector<std::tuple<std::size_t, std::size_t, box>> got;
    const std::uint64_t visited = for_each_meeting(
        a.size(), [&](std::size_t i) -> const box& { return a[i]; }, b.size(),
        [&](std::size_t j) -> const box& { return b[j]; },
        [&](std::size_t i, std::size_t j, box c) { got.emplace_back(i, j, std::move(c)); });
    EXPECT_EQ(got, every_pair(a, b)) << na << " x " << nb;
    if (na * nb < detail::all_pairs_below) {
      EXPECT_EQ(visited, na * nb);
    }
  }
}

// n slabs against the same n slabs cut elsewhere: each slab meets at most two. Walking every pair
// visits n^2; the index n log n.
TEST(darray_box_index, pairing_tiled_lists_visits_n_log_n) {
  for (const std::int64_t n : {64, 256, 1024, 4096, 16384}) {
    std::vector<box> a;
    std::vector<box> b;
    for (std::int64_t i = 0; i < n; ++i) {
      a.push_back(box{{slice{i * 10, i * 10 + 10}, slice{0, 4}}});
      b.push_back(box{{slice{i * 10 + 3, i * 10 + 13}, slice{0, 4}}});
    }
    std::size_t pairs = 0;
    const std::uint64_t visited = for_each_meeting(
        a.size(), [&](std::size_t i) -> const box& { return a[i]; }, b.size(),
        [&](std::size_t j) -> const box& { return b[j]; },
        [&](std::size_t, std::size_t, const box&) { ++pairs; });
    EXPECT_EQ(pairs, static_cast<std::size_t>(2 * n - 1));
    const double bound = 8.0 * static_cast<double>(n) * std::log2(static_cast<double>(n));
    EXPECT_LE(static_cast<double>(visited), bound) << n << " slabs";
  }
}

TEST(darray_box_index, replicas_with_one_centre_are_each_a_candidate) {
  std::vector<box> same(100, box{{slice{0, 50}}});
  const box_index index(same.size(), [&](std::size_t i) -> const box& { return same[i]; });
  std::vector<std::uint32_t> found;
  static_cast<void>(index.candidates(box{{slice{10, 11}}}, found));
  EXPECT_EQ(found.size(), same.size());
  found.clear();
  static_cast<void>(index.candidates(box{{slice{50, 60}}}, found));
  EXPECT_TRUE(found.empty());
}

}  // namespace
}  // namespace poolscope::darray
