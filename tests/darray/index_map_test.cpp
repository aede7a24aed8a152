// darray index_map: the builders, the accessors, deduplication, and validate() with one test per
// error it reports (each message names the device, the chunk and the value), plus a randomized
// coverage check against brute-force enumeration (seed printed on failure).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "poolscope/darray/index_map.hpp"
#include "poolscope/error.hpp"
#include "test_support.hpp"

namespace poolscope::darray {
namespace {

using test_support::point;
using test_support::points;
using test_support::test_seed;

// The message validate() throws, or "" when the map is valid.
std::string validate_message(const index_map& m, const shape_t& shape, int devices,
                             bool require_cover = true) {
  try {
    m.validate(shape, devices, require_cover);
  } catch (const invalid_index_map& e) {
    return e.what();
  }
  return "";
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// --- builders and accessors ---

TEST(darray_index_map, header_example) {
  const shape_t shape{1000};
  const index_map a = index_map::split(shape, 0, {{0, 0, 500}, {1, 500, 1000}});
  EXPECT_EQ(a.to_string(), "{0: [[0:500]], 1: [[500:1000]]}");
  EXPECT_NO_THROW(a.validate(shape, 2));
  index_map r;
  r.add(0, box{{slice{0, 1000}}});
  r.add(1, box{{slice{0, 1000, 2}}});
  EXPECT_NO_THROW(r.validate(shape, 2));
  EXPECT_EQ(r.to_string(), "{0: [[0:1000]], 1: [[0:999:2]]}");
}

TEST(darray_index_map, accessors) {
  index_map m;
  EXPECT_TRUE(m.empty());
  EXPECT_EQ(m.to_string(), "{}");
  m.add(2, box{{slice(0, 4)}}).add(0, box{{slice(4, 8)}}).add(2, box{{slice(8, 10)}});
  EXPECT_FALSE(m.empty());
  EXPECT_EQ(m.chunk_count(), 3u);
  EXPECT_EQ(m.devices(), (std::vector<int>{0, 2}));
  EXPECT_EQ(m.boxes(2), (std::vector<box>{box{{slice(0, 4)}}, box{{slice(8, 10)}}}));
  EXPECT_TRUE(m.boxes(1).empty());
  const std::vector<chunk_ref> chunks = m.chunks();
  ASSERT_EQ(chunks.size(), 3u);
  EXPECT_EQ(chunks[0].device, 0);
  EXPECT_EQ(chunks[0].index, 0u);
  EXPECT_EQ(chunks[0].region, (box{{slice(4, 8)}}));
  EXPECT_EQ(chunks[1].device, 2);
  EXPECT_EQ(chunks[1].index, 0u);
  EXPECT_EQ(chunks[2].device, 2);
  EXPECT_EQ(chunks[2].index, 1u);
  EXPECT_EQ(chunks[2].region, (box{{slice(8, 10)}}));
  EXPECT_EQ(m.to_string(), "{0: [[4:8]], 2: [[0:4], [8:10]]}");
}

TEST(darray_index_map, copies_share_until_changed) {
  const auto a = index_map::split({10}, 0, {{0, 0, 5}, {1, 5, 10}});
  index_map b = a;
  EXPECT_EQ(b, a);
  b.add(1, box{{slice(0, 10)}});  // b copies before it changes: a keeps its two chunks
  EXPECT_EQ(a.chunk_count(), 2U);
  EXPECT_EQ(b.chunk_count(), 3U);
  EXPECT_NE(b, a);
  EXPECT_EQ(a, index_map::split({10}, 0, {{0, 0, 5}, {1, 5, 10}}));  // equal contents, apart
  index_map empty;
  EXPECT_TRUE(empty.empty());
  EXPECT_TRUE(empty.parts().empty());
  EXPECT_TRUE(empty.boxes(0).empty());
  EXPECT_EQ(empty, index_map{});
  EXPECT_NE(empty, a);
  index_map grown = empty;
  grown.add(0, box{{slice(0, 1)}});
  EXPECT_TRUE(empty.empty());
  EXPECT_EQ(grown.chunk_count(), 1U);
}

TEST(darray_index_map, split_along_an_inner_axis) {
  const index_map m = index_map::split({4, 10}, 1, {{1, 0, 7}, {0, 7, 10}});
  EXPECT_EQ(m.boxes(1), (std::vector<box>{box{{slice(0, 4), slice(0, 7)}}}));
  EXPECT_EQ(m.boxes(0), (std::vector<box>{box{{slice(0, 4), slice(7, 10)}}}));
  EXPECT_THROW(static_cast<void>(index_map::split({4, 10}, 2, {{0, 0, 1}})), invalid_index_map);
}

TEST(darray_index_map, blocks_last_takes_the_remainder) {
  const index_map m = index_map::blocks({10, 3}, 0, 3);
  EXPECT_EQ(m.boxes(0), (std::vector<box>{box{{slice(0, 3), slice(0, 3)}}}));
  EXPECT_EQ(m.boxes(1), (std::vector<box>{box{{slice(3, 6), slice(0, 3)}}}));
  EXPECT_EQ(m.boxes(2), (std::vector<box>{box{{slice(6, 10), slice(0, 3)}}}));
  EXPECT_NO_THROW(m.validate({10, 3}, 3));
  EXPECT_THROW(static_cast<void>(index_map::blocks({10}, 0, 0)), invalid_index_map);
  EXPECT_THROW(static_cast<void>(index_map::blocks({10}, 1, 2)), invalid_index_map);
}

TEST(darray_index_map, replicated) {
  const index_map m = index_map::replicated({3, 5}, {0, 2});
  EXPECT_EQ(m.boxes(0), (std::vector<box>{box::full({3, 5})}));
  EXPECT_EQ(m.boxes(2), (std::vector<box>{box::full({3, 5})}));
  EXPECT_EQ(m.chunk_count(), 2u);
  EXPECT_NO_THROW(m.validate({3, 5}, 3));
}

TEST(darray_index_map, grid) {
  const index_map m = index_map::grid({5, 7}, 2, 2, {{0, 1}, {2, 3}});
  EXPECT_EQ(m.boxes(0), (std::vector<box>{box{{slice(0, 2), slice(0, 3)}}}));
  EXPECT_EQ(m.boxes(1), (std::vector<box>{box{{slice(0, 2), slice(3, 7)}}}));
  EXPECT_EQ(m.boxes(2), (std::vector<box>{box{{slice(2, 5), slice(0, 3)}}}));
  EXPECT_EQ(m.boxes(3), (std::vector<box>{box{{slice(2, 5), slice(3, 7)}}}));
  EXPECT_NO_THROW(m.validate({5, 7}, 4));
  const index_map same_device = index_map::grid({4, 4}, 1, 2, {{0, 0}});
  EXPECT_EQ(same_device.boxes(0).size(), 2u);
  EXPECT_THROW(static_cast<void>(index_map::grid({4}, 1, 1, {{0}})), invalid_index_map);
  EXPECT_THROW(static_cast<void>(index_map::grid({4, 4}, 2, 1, {{0}})), invalid_index_map);
  EXPECT_THROW(static_cast<void>(index_map::grid({4, 4}, 1, 2, {{0}})), invalid_index_map);
  EXPECT_THROW(static_cast<void>(index_map::grid({4, 4}, 0, 2, {})), invalid_index_map);
}

TEST(darray_index_map, deduplicated_keeps_coverage) {
  index_map m;
  m.add(0, box{{slice(0, 10)}});
  m.add(0, box{{slice(2, 5)}});      // inside the first
  m.add(0, box{{slice(0, 10)}});     // duplicate
  m.add(0, box{{slice(5, 15)}});     // overlaps, not contained
  m.add(0, box{{slice(0, 10, 3)}});  // inside the first (with a step)
  m.add(1, box{{slice(0, 10)}});     // a replica on another device stays
  m.add(1, box{{slice(0, 10)}});
  const index_map d = m.deduplicated();
  EXPECT_EQ(d.boxes(0), (std::vector<box>{box{{slice(0, 10)}}, box{{slice(5, 15)}}}));
  EXPECT_EQ(d.boxes(1), (std::vector<box>{box{{slice(0, 10)}}}));
  EXPECT_EQ(d.deduplicated(), d);
}

// --- validate: one test per error ---

TEST(darray_index_map_validate, accepts_valid_maps) {
  index_map steps;  // even indices on 0, odd on 1
  steps.add(0, box{{slice(0, 10, 2)}}).add(1, box{{slice(1, 10, 2)}});
  EXPECT_EQ(validate_message(steps, {10}, 2), "");
  index_map overlap;  // replicas overlapping on the same device
  overlap.add(0, box{{slice(0, 6), slice(0, 4)}}).add(0, box{{slice(3, 8), slice(0, 4)}});
  EXPECT_EQ(validate_message(overlap, {8, 4}, 1), "");
  index_map scalar;
  scalar.add(0, box{});
  EXPECT_EQ(validate_message(scalar, {}, 1), "");
  EXPECT_EQ(validate_message(index_map{}, {0, 5}, 1), "");  // nothing to cover
}

TEST(darray_index_map_validate, device_outside_the_range) {
  const index_map high = index_map::split({10}, 0, {{0, 0, 5}, {3, 5, 10}});
  const std::string m = validate_message(high, {10}, 2);
  EXPECT_TRUE(has(m, "device 3 chunk 0")) << m;
  EXPECT_TRUE(has(m, "[0, 2)")) << m;
  index_map negative;
  negative.add(-1, box{{slice(0, 10)}});
  EXPECT_TRUE(has(validate_message(negative, {10}, 2), "device -1 chunk 0"));
  EXPECT_TRUE(has(validate_message(index_map::replicated({10}, {0}), {10}, 0), "device 0"));
}

TEST(darray_index_map_validate, rank_mismatch) {
  index_map m;
  m.add(0, box{{slice(0, 4), slice(0, 5)}});
  m.add(0, box{{slice(0, 4)}});
  const std::string msg = validate_message(m, {4, 5}, 1);
  EXPECT_TRUE(has(msg, "device 0 chunk 1")) << msg;
  EXPECT_TRUE(has(msg, "[0:4]")) << msg;
  EXPECT_TRUE(has(msg, "rank 1")) << msg;
  EXPECT_TRUE(has(msg, "rank 2")) << msg;
}

TEST(darray_index_map_validate, index_out_of_bounds) {
  index_map past;
  past.add(0, box{{slice(0, 4), slice(0, 5)}});
  past.add(1, box{{slice(0, 4), slice(3, 9, 2)}});  // 3 5 7: 7 is outside extent 6
  std::string msg = validate_message(past, {4, 6}, 2);
  EXPECT_TRUE(has(msg, "device 1 chunk 0")) << msg;
  EXPECT_TRUE(has(msg, "axis 1")) << msg;
  EXPECT_TRUE(has(msg, "3:8:2")) << msg;
  EXPECT_TRUE(has(msg, "[0, 6)")) << msg;
  index_map before;
  before.add(0, box{{slice(-2, 3), slice(0, 6)}});
  msg = validate_message(before, {4, 6}, 1);
  EXPECT_TRUE(has(msg, "axis 0")) << msg;
  EXPECT_TRUE(has(msg, "-2:3")) << msg;
  // A hand-set stop beyond the last index is judged by the last index.
  index_map loose;
  box b{{slice(0, 6)}};
  b.dims[0].stop = 9;
  b.dims[0].step = 3;  // 0 3 6: 6 is outside extent 6
  loose.add(0, b);
  EXPECT_TRUE(has(validate_message(loose, {6}, 1), "axis 0")) << validate_message(loose, {6}, 1);
  b.dims[0].stop = 7;
  b.dims[0].step = 5;  // 0 5: inside, then nothing covers 1..4
  index_map inside;
  inside.add(0, b);
  EXPECT_TRUE(has(validate_message(inside, {6}, 1), "element (1)"));
}

TEST(darray_index_map_validate, zero_or_negative_step) {
  for (const std::int64_t step : {std::int64_t{0}, std::int64_t{-2}}) {
    box b = box::full({4, 6});
    b.dims[1].step = step;  // set by hand: the constructor would refuse it
    index_map m;
    m.add(0, box::full({4, 6}));
    m.add(0, b);
    const std::string msg = validate_message(m, {4, 6}, 1);
    EXPECT_TRUE(has(msg, "device 0 chunk 1")) << msg;
    EXPECT_TRUE(has(msg, "axis 1")) << msg;
    EXPECT_TRUE(has(msg, "step " + std::to_string(step))) << msg;
  }
}

TEST(darray_index_map_validate, uncovered_element_named) {
  const shape_t shape{5, 10};
  const box hole{{slice(3, 4), slice(7, 8)}};
  index_map m;
  for (const box& b : subtract(box::full(shape), hole)) {
    m.add(0, b);
  }
  EXPECT_TRUE(has(validate_message(m, shape, 1), "element (3, 7) is not covered by any chunk"))
      << validate_message(m, shape, 1);
  EXPECT_EQ(validate_message(m, shape, 1, /*require_cover=*/false), "");
  // The first uncovered index in row-major order is named.
  index_map two;
  for (const box& b : subtract_all(box::full(shape), {hole, box{{slice(4, 5), slice(1, 2)}},
                                                      box{{slice(3, 4), slice(8, 10, 2)}}})) {
    two.add(1, b);
  }
  EXPECT_TRUE(has(validate_message(two, shape, 2), "element (3, 7)"));
  index_map earlier;
  for (const box& b : subtract_all(box::full(shape), {hole, box{{slice(3, 4), slice(2, 3)}}})) {
    earlier.add(0, b);
  }
  EXPECT_TRUE(has(validate_message(earlier, shape, 1), "element (3, 2)"));
  // Steps that together miss a residue class.
  index_map steps;
  steps.add(0, box{{slice(0, 12, 3)}}).add(1, box{{slice(1, 12, 3)}});
  EXPECT_TRUE(has(validate_message(steps, {12}, 2), "element (2) is not covered"));
  EXPECT_TRUE(has(validate_message(index_map{}, {}, 1), "element () is not covered"));
}

TEST(darray_index_map_validate, bad_shape) {
  EXPECT_TRUE(has(validate_message(index_map{}, {3, -1}, 1), "-1"));
  EXPECT_TRUE(has(validate_message(index_map{}, {1, 1, 1, 1, 1}, 1), "rank 5"));
}

TEST(darray_index_map_validate, errors_are_invalid_arguments) {
  const index_map m = index_map::split({10}, 0, {{0, 0, 5}});
  EXPECT_THROW(m.validate({10}, 1), poolscope::invalid_argument);
  EXPECT_THROW(m.validate({10}, 1), poolscope::logic_error);
}

TEST(darray_index_map_validate, random_coverage_against_brute_force) {
  const std::uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed + 10);
  for (int iter = 0; iter < 1500; ++iter) {
    const std::size_t rank = 1 + rng() % 3;
    shape_t shape;
    for (std::size_t axis = 0; axis < rank; ++axis) {
      shape.push_back(1 + static_cast<std::int64_t>(rng() % 5));
    }
    index_map m;
    std::set<point> covered;
    const std::size_t chunks = 1 + rng() % 6;
    for (std::size_t k = 0; k < chunks; ++k) {
      box b;
      for (std::size_t axis = 0; axis < rank; ++axis) {
        const auto n = static_cast<std::uint64_t>(shape[axis]);
        const auto start = static_cast<std::int64_t>(rng() % n);
        const auto stop = start + 1 + static_cast<std::int64_t>(rng() % (n - start));
        b.dims.emplace_back(start, stop, 1 + static_cast<std::int64_t>(rng() % 3));
      }
      const auto pts = points(b);
      covered.insert(pts.begin(), pts.end());
      m.add(static_cast<int>(rng() % 3), b);
    }
    std::optional<point> first_missing;
    for (const point& p : points(box::full(shape))) {
      if (covered.count(p) == 0) {
        first_missing = p;
        break;
      }
    }
    const std::string msg = validate_message(m, shape, 3);
    if (!first_missing) {
      ASSERT_EQ(msg, "") << m.to_string();
    } else {
      std::string name = "element (";
      for (std::size_t axis = 0; axis < rank; ++axis) {
        name += (axis != 0 ? ", " : "") + std::to_string((*first_missing)[axis]);
      }
      name += ") is not covered";
      ASSERT_TRUE(has(msg, name)) << m.to_string() << ": " << msg << " (expected " << name << ")";
    }
  }
}

// Threads copy one map and change their copies at once: the original and every copy hold exactly
// their own chunks (copies share contents until changed).
TEST(darray_index_map_concurrency, copies_change_independently) {
  const auto shared = index_map::blocks({64}, 0, 4);
  constexpr int threads = 4;
  std::vector<int> wrong(threads, 0);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (int round = 0; round < 500; ++round) {
        index_map mine = shared;
        const index_map twin = mine;
        mine.add(t, box{{slice(t, t + 1)}});
        const bool ok = mine.chunk_count() == 5 && twin.chunk_count() == 4 && twin == shared &&
                        mine.boxes(t).back() == box{{slice(t, t + 1)}};
        wrong[static_cast<std::size_t>(t)] += ok ? 0 : 1;
      }
    });
  }
  for (auto& th : pool) {
    th.join();
  }
  EXPECT_EQ(wrong, std::vector<int>(threads, 0));
  EXPECT_EQ(shared, index_map::blocks({64}, 0, 4));
}

// A copy read and dropped on another thread while the original is changed: the original must not
// change the contents in place on the strength of a reference count read without ordering (the
// other thread's reads would race with the change; ThreadSanitizer, which CI runs this suite
// under, reports it). Both sides still see exactly their own chunks.
TEST(darray_index_map_concurrency, a_copy_dropped_on_another_thread_is_not_changed_under_it) {
  int wrong = 0;
  std::atomic<int> other_wrong{0};
  for (int round = 0; round < 300; ++round) {
    index_map mine = index_map::blocks({64}, 0, 4);
    std::thread reader([copy = mine, &other_wrong]() mutable {
      if (copy.chunk_count() != 4 || copy.boxes(1).size() != 1 ||
          !(copy.boxes(1)[0] == box{{slice{16, 32}}})) {
        other_wrong.fetch_add(1);
      }
      copy = index_map();
    });
    for (int i = 0; i < 40; ++i) {
      mine.add(1, box{{slice(i, i + 1)}});
    }
    reader.join();
    wrong += mine.chunk_count() == 44 && mine.boxes(1).size() == 41 ? 0 : 1;
  }
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(other_wrong.load(), 0);
}

}  // namespace
}  // namespace poolscope::darray
