// darray planner: exact piece lists and byte counts for small reshards (the seed example, a 2-D
// rows -> columns swap, replicas on either side, overlapping destination chunks on one device,
// steps, accumulate mode, splitting), and randomized properties checked by brute-force
// enumeration (seed printed on failure).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "poolscope/darray/planner.hpp"
#include "poolscope/error.hpp"
#include "test_support.hpp"

namespace poolscope::darray {
namespace {

using test_support::point;
using test_support::points;
using test_support::test_seed;

piece make_piece(std::size_t src_chunk, std::size_t dst_chunk, int src_device, int dst_device,
                 box region, std::int64_t bytes, bool in_place = false) {
  piece p;
  p.src_chunk = src_chunk;
  p.dst_chunk = dst_chunk;
  p.src_device = src_device;
  p.dst_device = dst_device;
  p.region = std::move(region);
  p.bytes = bytes;
  p.local = src_device == dst_device;
  p.in_place = in_place;
  return p;
}

// A piece of destination chunk `dst_chunk` that takes `region` from destination chunk
// `from_chunk` (which receives it) on `device`.
piece reused(std::size_t from_chunk, std::size_t dst_chunk, int device, box region,
             std::int64_t bytes) {
  piece p = make_piece(from_chunk, dst_chunk, device, device, std::move(region), bytes);
  p.from_dst = true;
  return p;
}

box b1(std::int64_t start, std::int64_t stop, std::int64_t step = 1) {
  return box{{slice(start, stop, step)}};
}

box b2(slice rows, slice cols) {
  return box{{rows, cols}};
}

using links = std::vector<std::tuple<int, int, std::int64_t>>;

// --- exact plans ---

TEST(darray_planner, seed_example_c_to_a) {
  const auto src = index_map::split({1000}, 0, {{0, 0, 700}, {1, 700, 1000}}).chunks();
  const auto dst = index_map::split({1000}, 0, {{0, 0, 500}, {1, 500, 1000}}).chunks();
  const reshard_plan p = plan_reshard(src, dst, {.element_size = 4});
  EXPECT_EQ(p.pieces, (std::vector<piece>{make_piece(0, 0, 0, 0, b1(0, 500), 2000),
                                          make_piece(1, 1, 1, 1, b1(700, 1000), 1200),
                                          make_piece(0, 1, 0, 1, b1(500, 700), 800)}))
      << p.to_string();
  EXPECT_EQ(p.bytes_remote, 800);
  EXPECT_EQ(p.bytes_local, 3200);
  EXPECT_EQ(p.bytes_in_place, 0);
  EXPECT_EQ(p.pieces_of_dst, (std::vector<std::vector<std::size_t>>{{0}, {1, 2}}));
  EXPECT_EQ(p.link_bytes, (links{{0, 1, 800}}));
}

TEST(darray_planner, seed_example_a_to_c) {
  const auto src = index_map::split({1000}, 0, {{0, 0, 500}, {1, 500, 1000}}).chunks();
  const auto dst = index_map::split({1000}, 0, {{0, 0, 700}, {1, 700, 1000}}).chunks();
  const reshard_plan p = plan_reshard(src, dst, {.element_size = 4});
  EXPECT_EQ(p.pieces, (std::vector<piece>{make_piece(0, 0, 0, 0, b1(0, 500), 2000),
                                          make_piece(1, 1, 1, 1, b1(700, 1000), 1200),
                                          make_piece(1, 0, 1, 0, b1(500, 700), 800)}))
      << p.to_string();
  EXPECT_EQ(p.pieces_of_dst, (std::vector<std::vector<std::size_t>>{{0, 2}, {1}}));
  EXPECT_EQ(p.link_bytes, (links{{1, 0, 800}}));
  EXPECT_EQ(p.bytes_remote, 800);
  EXPECT_EQ(p.bytes_local, 3200);
}

TEST(darray_planner, same_map_is_in_place) {
  const auto m = index_map::split({1000}, 0, {{0, 0, 500}, {1, 500, 1000}}).chunks();
  const reshard_plan p = plan_reshard(m, m, {.element_size = 2});
  EXPECT_EQ(p.pieces, (std::vector<piece>{make_piece(0, 0, 0, 0, b1(0, 500), 1000, true),
                                          make_piece(1, 1, 1, 1, b1(500, 1000), 1000, true)}));
  EXPECT_EQ(p.bytes_remote, 0);
  EXPECT_EQ(p.bytes_local, 2000);
  EXPECT_EQ(p.bytes_in_place, 2000);
  EXPECT_TRUE(p.link_bytes.empty());
}

TEST(darray_planner, in_place_chunk_preferred_over_a_larger_local_one) {
  index_map src;
  src.add(0, b1(0, 100)).add(0, b1(20, 40));
  index_map dst;
  dst.add(0, b1(20, 40));
  const reshard_plan p = plan_reshard(src.chunks(), dst.chunks(), {.element_size = 1});
  EXPECT_EQ(p.pieces, (std::vector<piece>{make_piece(1, 0, 0, 0, b1(20, 40), 20, true)}))
      << p.to_string();
}

TEST(darray_planner, rows_to_columns_2d) {
  const shape_t shape{4, 6};
  const auto src = index_map::split(shape, 0, {{0, 0, 2}, {1, 2, 4}}).chunks();
  const auto dst = index_map::split(shape, 1, {{0, 0, 3}, {1, 3, 6}}).chunks();
  const reshard_plan p = plan_reshard(src, dst, {.element_size = 8});
  EXPECT_EQ(p.pieces,
            (std::vector<piece>{
                make_piece(0, 0, 0, 0, b2(slice(0, 2), slice(0, 3)), 48),
                make_piece(1, 1, 1, 1, b2(slice(2, 4), slice(3, 6)), 48),
                make_piece(0, 1, 0, 1, b2(slice(0, 2), slice(3, 6)), 48),  // first of dst 1
                make_piece(1, 0, 1, 0, b2(slice(2, 4), slice(0, 3)), 48),  // half-way into dst 0
            }))
      << p.to_string();
  EXPECT_EQ(p.bytes_remote, 96);
  EXPECT_EQ(p.bytes_local, 96);
  EXPECT_EQ(p.pieces_of_dst, (std::vector<std::vector<std::size_t>>{{0, 3}, {1, 2}}));
  EXPECT_EQ(p.link_bytes, (links{{0, 1, 48}, {1, 0, 48}}));
}

TEST(darray_planner, source_replicas_fed_once_from_least_loaded_device) {
  const auto src = index_map::replicated({1000}, {0, 1}).chunks();
  const auto dst = index_map::split({1000}, 0, {{2, 0, 500}, {3, 500, 1000}}).chunks();
  const reshard_plan p = plan_reshard(src, dst, {.element_size = 4});
  EXPECT_EQ(p.pieces, (std::vector<piece>{make_piece(0, 0, 0, 2, b1(0, 500), 2000),
                                          make_piece(1, 1, 1, 3, b1(500, 1000), 2000)}))
      << p.to_string();
  EXPECT_EQ(p.link_bytes, (links{{0, 2, 2000}, {1, 3, 2000}}));
}

TEST(darray_planner, overlapping_source_replicas_balance_the_links) {
  index_map src;
  src.add(0, b1(0, 600)).add(1, b1(400, 1000));
  const auto dst = index_map::replicated({1000}, {2, 3}).chunks();
  const reshard_plan p = plan_reshard(src.chunks(), dst, {.element_size = 4});
  // dst 0 (device 2): devices 0 and 1 tie at 0 B, so 0 sends [0:600], 1 the rest. dst 1 (device
  // 3): device 1 has sent less (1600 B against 2400 B), so it sends [400:1000], 0 the rest.
  EXPECT_EQ(p.pieces, (std::vector<piece>{make_piece(0, 0, 0, 2, b1(0, 600), 2400),
                                          make_piece(0, 1, 0, 3, b1(0, 400), 1600),
                                          make_piece(1, 1, 1, 3, b1(400, 1000), 2400),
                                          make_piece(1, 0, 1, 2, b1(600, 1000), 1600)}))
      << p.to_string();
  EXPECT_EQ(p.link_bytes, (links{{0, 2, 2400}, {0, 3, 1600}, {1, 2, 1600}, {1, 3, 2400}}));
  EXPECT_EQ(p.bytes_remote, 8000);
}

TEST(darray_planner, replicas_on_both_sides) {
  const auto src = index_map::replicated({1000}, {0, 1}).chunks();
  const auto dst = index_map::replicated({1000}, {1, 2}).chunks();
  const reshard_plan p = plan_reshard(src, dst, {.element_size = 4});
  EXPECT_EQ(p.pieces, (std::vector<piece>{make_piece(1, 0, 1, 1, b1(0, 1000), 4000, true),
                                          make_piece(0, 1, 0, 2, b1(0, 1000), 4000)}))
      << p.to_string();
  EXPECT_EQ(p.bytes_in_place, 4000);
  EXPECT_EQ(p.bytes_remote, 4000);
}

TEST(darray_planner, destination_replicas_each_filled) {
  const auto src = index_map::split({1000}, 0, {{0, 0, 500}, {1, 500, 1000}}).chunks();
  const auto dst = index_map::replicated({1000}, {0, 1}).chunks();
  const reshard_plan p = plan_reshard(src, dst, {.element_size = 1});
  EXPECT_EQ(p.pieces, (std::vector<piece>{make_piece(0, 0, 0, 0, b1(0, 500), 500),
                                          make_piece(1, 1, 1, 1, b1(500, 1000), 500),
                                          make_piece(0, 1, 0, 1, b1(0, 500), 500),
                                          make_piece(1, 0, 1, 0, b1(500, 1000), 500)}))
      << p.to_string();
}

// --- overlapping destination chunks on one device (each element crosses to a device once) ---

// Device 0 wants [0:600] and [400:1000] and holds [0:300]: [300:600] crosses once, into dst chunk
// 0; dst chunk 1 takes [400:600] from there (right after it arrives) and receives only [600:1000].
// [300:600] goes first: it holds dst chunk 1's first elements. Planned chunk by chunk, [400:600]
// crossed twice (3600 B).
TEST(darray_planner, overlapping_destination_chunks_receive_the_overlap_once) {
  const auto src = index_map::split({1000}, 0, {{0, 0, 300}, {1, 300, 1000}}).chunks();
  index_map dst;
  dst.add(0, b1(0, 600)).add(0, b1(400, 1000));
  const reshard_plan p = plan_reshard(src, dst.chunks(), {.element_size = 4});
  EXPECT_EQ(p.pieces, (std::vector<piece>{make_piece(0, 0, 0, 0, b1(0, 300), 1200),
                                          make_piece(1, 0, 1, 0, b1(300, 600), 1200),
                                          reused(0, 1, 0, b1(400, 600), 800),
                                          make_piece(1, 1, 1, 0, b1(600, 1000), 1600)}))
      << p.to_string();
  EXPECT_EQ(p.bytes_remote, 2800);
  EXPECT_EQ(p.bytes_local, 2000);
  EXPECT_EQ(p.bytes_in_place, 0);
  EXPECT_EQ(p.pieces_of_dst, (std::vector<std::vector<std::size_t>>{{0, 1}, {2, 3}}));
  EXPECT_EQ(p.link_bytes, (links{{1, 0, 2800}}));
  const std::string s = p.to_string();
  EXPECT_NE(s.find("[400:600] 0->0 (from dst chunk 0, dst chunk 1) 800 B local"), std::string::npos)
      << s;
}

// The overlap [300:700] is half on device 0 already: [300:500] from the source chunk there (for
// both destination chunks), [500:700] received once.
TEST(darray_planner, overlap_partly_held_locally) {
  const auto src = index_map::split({1000}, 0, {{0, 0, 500}, {1, 500, 1000}}).chunks();
  index_map dst;
  dst.add(0, b1(0, 700)).add(0, b1(300, 1000));
  const reshard_plan p = plan_reshard(src, dst.chunks(), {.element_size = 4});
  EXPECT_EQ(p.pieces, (std::vector<piece>{make_piece(0, 0, 0, 0, b1(0, 500), 2000),
                                          make_piece(0, 1, 0, 0, b1(300, 500), 800),
                                          make_piece(1, 0, 1, 0, b1(500, 700), 800),  // 2/7
                                          reused(0, 1, 0, b1(500, 700), 800),
                                          make_piece(1, 1, 1, 0, b1(700, 1000), 1200)}))  // 4/7
      << p.to_string();
  EXPECT_EQ(p.bytes_remote, 2000);  // device 0 lacks [500:1000]
  EXPECT_EQ(p.bytes_local, 3600);
  EXPECT_EQ(p.pieces_of_dst, (std::vector<std::vector<std::size_t>>{{0, 2}, {1, 3, 4}}));
  EXPECT_EQ(p.link_bytes, (links{{1, 0, 2000}}));
}

// 2-D: device 0 wants rows 0..5 x cols 0..4 and rows 1..5 x cols 3..7, holds rows 0..2. The
// overlap's rows 1..2 are local; rows 3..5 x cols 3..4 are received once, into dst chunk 0.
TEST(darray_planner, overlapping_destination_chunks_2d) {
  const shape_t shape{6, 8};
  const auto src = index_map::split(shape, 0, {{0, 0, 3}, {1, 3, 6}}).chunks();
  index_map dst;
  dst.add(0, b2(slice(0, 6), slice(0, 5))).add(0, b2(slice(1, 6), slice(3, 8)));
  const reshard_plan p = plan_reshard(src, dst.chunks(), {.element_size = 8});
  EXPECT_EQ(p.pieces,
            (std::vector<piece>{
                make_piece(0, 0, 0, 0, b2(slice(0, 3), slice(0, 5)), 120),
                make_piece(0, 1, 0, 0, b2(slice(1, 3), slice(3, 8)), 80),
                // 15/30 into dst 0, but its columns 3..4 are 10/25 into dst 1: before 12/25.
                make_piece(1, 0, 1, 0, b2(slice(3, 6), slice(0, 5)), 120),
                reused(0, 1, 0, b2(slice(3, 6), slice(3, 5)), 48),
                make_piece(1, 1, 1, 0, b2(slice(3, 6), slice(5, 8)), 72),
            }))
      << p.to_string();
  EXPECT_EQ(p.bytes_remote, 192);  // rows 3..5 x cols 0..7: 24 elements
  EXPECT_EQ(p.bytes_local, 248);
  EXPECT_EQ(p.link_bytes, (links{{1, 0, 192}}));
}

// Three devices: device 0's overlap [300:700] comes from device 1 ([300:600]) and device 2
// ([600:700]), each once, into dst chunk 0; dst chunk 1 takes each part after its own arrival.
TEST(darray_planner, overlap_from_two_source_devices) {
  const auto src = index_map::blocks({900}, 0, 3).chunks();
  index_map dst;
  dst.add(0, b1(100, 700)).add(0, b1(250, 900));
  const reshard_plan p = plan_reshard(src, dst.chunks(), {.element_size = 4});
  EXPECT_EQ(p.pieces, (std::vector<piece>{make_piece(0, 0, 0, 0, b1(100, 300), 800),
                                          make_piece(0, 1, 0, 0, b1(250, 300), 200),
                                          make_piece(1, 0, 1, 0, b1(300, 600), 1200),  // 50/650
                                          reused(0, 1, 0, b1(300, 600), 1200),
                                          make_piece(2, 0, 2, 0, b1(600, 700), 400),  // 350/650
                                          reused(0, 1, 0, b1(600, 700), 400),
                                          make_piece(2, 1, 2, 0, b1(700, 900), 800)}))  // 450/650
      << p.to_string();
  EXPECT_EQ(p.bytes_remote, 2400);  // device 0 lacks [300:900]; was 4000 chunk by chunk
  EXPECT_EQ(p.bytes_local, 2600);
  EXPECT_EQ(p.pieces_of_dst, (std::vector<std::vector<std::size_t>>{{0, 2, 4}, {1, 3, 5, 6}}));
  EXPECT_EQ(p.link_bytes, (links{{1, 0, 1200}, {2, 0, 1200}}));
}

// A chunk needing what two earlier chunks receive takes each part from the chunk that received it;
// a later chunk with the same box as an earlier one takes everything from it.
TEST(darray_planner, third_chunk_takes_from_whichever_chunk_received) {
  const auto src = index_map::split({30}, 0, {{0, 0, 10}, {1, 10, 30}}).chunks();
  index_map dst;
  dst.add(0, b1(10, 20)).add(0, b1(20, 30)).add(0, b1(15, 25)).add(0, b1(10, 20));
  const reshard_plan p = plan_reshard(src, dst.chunks(), {.element_size = 1});
  EXPECT_EQ(p.pieces, (std::vector<piece>{
                          make_piece(1, 0, 1, 0, b1(10, 20), 10), reused(0, 2, 0, b1(15, 20), 5),
                          reused(0, 3, 0, b1(10, 20), 10), make_piece(1, 1, 1, 0, b1(20, 30), 10),
                          reused(1, 2, 0, b1(20, 25), 5)}))
      << p.to_string();
  EXPECT_EQ(p.bytes_remote, 20);
  EXPECT_EQ(p.bytes_local, 20);
}

// Split remote pieces: the reused region is cut along the parts of the chunk that receives it,
// each right after its part (so it waits for that part alone); those parts go first, as they
// hold dst chunk 1's first elements.
TEST(darray_planner_split, reused_regions_follow_each_part) {
  const auto src = index_map::split({1000}, 0, {{0, 0, 300}, {1, 300, 1000}}).chunks();
  index_map dst;
  dst.add(0, b1(0, 600)).add(0, b1(400, 1000));
  const reshard_plan p = plan_reshard(src, dst.chunks(), {.element_size = 4, .split_bytes = 400});
  EXPECT_EQ(
      p.pieces,
      (std::vector<piece>{
          make_piece(0, 0, 0, 0, b1(0, 300), 1200), make_piece(1, 0, 1, 0, b1(400, 500), 400),  // 0
          reused(0, 1, 0, b1(400, 500), 400), make_piece(1, 0, 1, 0, b1(500, 600), 400),  // 1/6
          reused(0, 1, 0, b1(500, 600), 400), make_piece(1, 1, 1, 0, b1(600, 700), 400),  // 1/3
          make_piece(1, 0, 1, 0, b1(300, 400), 400),                                      // 1/2
          make_piece(1, 1, 1, 0, b1(700, 800), 400),                                      // 1/2
          make_piece(1, 1, 1, 0, b1(800, 900), 400),                                      // 2/3
          make_piece(1, 1, 1, 0, b1(900, 1000), 400)}))                                   // 5/6
      << p.to_string();
  EXPECT_EQ(p.bytes_remote, 2800);
  EXPECT_EQ(p.bytes_local, 2000);
}

// Overlapping chunks on different devices, and partial sources, plan as before: each device
// receives its own copy; every intersection of a partial source is a piece.
TEST(darray_planner, the_rule_is_per_device_and_replica_mode_only) {
  const auto src = index_map::split({1000}, 0, {{0, 0, 300}, {1, 300, 1000}}).chunks();
  index_map dst;
  dst.add(0, b1(0, 600)).add(2, b1(400, 1000));
  const reshard_plan p = plan_reshard(src, dst.chunks(), {.element_size = 4});
  EXPECT_EQ(p.pieces, (std::vector<piece>{make_piece(0, 0, 0, 0, b1(0, 300), 1200),
                                          make_piece(1, 1, 1, 2, b1(400, 1000), 2400),
                                          make_piece(1, 0, 1, 0, b1(300, 600), 1200)}))
      << p.to_string();
  index_map one;
  one.add(0, b1(0, 600)).add(0, b1(400, 1000));
  const reshard_plan a = plan_reshard(index_map::replicated({1000}, {1, 2}).chunks(), one.chunks(),
                                      {.element_size = 4, .accumulate = true});
  EXPECT_EQ(a.pieces, (std::vector<piece>{make_piece(0, 0, 1, 0, b1(0, 600), 2400),
                                          make_piece(0, 1, 1, 0, b1(400, 1000), 2400),
                                          make_piece(1, 0, 2, 0, b1(0, 600), 2400),
                                          make_piece(1, 1, 2, 0, b1(400, 1000), 2400)}))
      << a.to_string();
}

TEST(darray_planner, steps) {
  index_map src;
  src.add(0, b1(0, 10, 2)).add(1, b1(1, 10, 2));
  const auto dst = index_map::split({10}, 0, {{0, 0, 5}, {1, 5, 10}}).chunks();
  const reshard_plan p = plan_reshard(src.chunks(), dst, {.element_size = 8});
  EXPECT_EQ(p.pieces,
            (std::vector<piece>{
                make_piece(0, 0, 0, 0, b1(0, 5, 2), 24), make_piece(1, 1, 1, 1, b1(5, 10, 2), 24),
                make_piece(1, 0, 1, 0, b1(1, 4, 2), 16), make_piece(0, 1, 0, 1, b1(6, 9, 2), 16)}))
      << p.to_string();
  EXPECT_EQ(p.bytes_remote, 32);
  EXPECT_EQ(p.bytes_local, 48);
}

TEST(darray_planner, accumulate_takes_every_intersection) {
  const auto src = index_map::replicated({100}, {0, 1}).chunks();  // two partial sums
  const auto dst = index_map::split({100}, 0, {{0, 0, 50}, {1, 50, 100}}).chunks();
  const reshard_plan p = plan_reshard(src, dst, {.element_size = 4, .accumulate = true});
  EXPECT_EQ(p.pieces,
            (std::vector<piece>{
                make_piece(0, 0, 0, 0, b1(0, 50), 200), make_piece(1, 1, 1, 1, b1(50, 100), 200),
                make_piece(1, 0, 1, 0, b1(0, 50), 200), make_piece(0, 1, 0, 1, b1(50, 100), 200)}))
      << p.to_string();
  EXPECT_EQ(p.bytes_remote, 400);
  EXPECT_EQ(p.bytes_local, 400);
  // Without accumulate the replicas are complete copies: nothing crosses a link.
  const reshard_plan r = plan_reshard(src, dst, {.element_size = 4});
  EXPECT_EQ(r.bytes_remote, 0);
  EXPECT_EQ(r.pieces.size(), 2u);
}

TEST(darray_planner, accumulate_in_place) {
  const auto src = index_map::replicated({100}, {0, 1}).chunks();
  const auto dst = index_map::replicated({100}, {0}).chunks();
  const reshard_plan p = plan_reshard(src, dst, {.element_size = 4, .accumulate = true});
  EXPECT_EQ(p.pieces, (std::vector<piece>{make_piece(0, 0, 0, 0, b1(0, 100), 400, true),
                                          make_piece(1, 0, 1, 0, b1(0, 100), 400)}))
      << p.to_string();
  EXPECT_EQ(p.bytes_in_place, 400);
}

// --- splitting ---

std::vector<box> regions(const reshard_plan& p) {
  std::vector<box> out;
  for (const piece& q : p.pieces) {
    out.push_back(q.region);
  }
  return out;
}

TEST(darray_planner_split, one_dimension_into_equal_parts) {
  const auto src = index_map::replicated({1000}, {0}).chunks();
  const auto dst = index_map::replicated({1000}, {1}).chunks();
  const reshard_plan p = plan_reshard(src, dst, {.element_size = 4, .split_bytes = 1000});
  EXPECT_EQ(regions(p), (std::vector<box>{b1(0, 250), b1(250, 500), b1(500, 750), b1(750, 1000)}));
  for (const piece& q : p.pieces) {
    EXPECT_EQ(q.bytes, 1000);
    EXPECT_EQ(q.src_chunk, 0u);
    EXPECT_EQ(q.dst_chunk, 0u);
  }
  EXPECT_EQ(p.bytes_remote, 4000);
  EXPECT_EQ(p.link_bytes, (links{{0, 1, 4000}}));
  const reshard_plan q = plan_reshard(src, dst, {.element_size = 4, .split_bytes = 1500});
  EXPECT_EQ(regions(q), (std::vector<box>{b1(0, 334), b1(334, 667), b1(667, 1000)}));
  EXPECT_EQ(q.pieces[0].bytes, 1336);
  EXPECT_EQ(q.pieces[1].bytes, 1332);
  EXPECT_EQ(plan_reshard(src, dst, {.element_size = 4, .split_bytes = 0}).pieces.size(), 1u);
  EXPECT_EQ(plan_reshard(src, dst, {.element_size = 4, .split_bytes = 4000}).pieces.size(), 1u);
}

TEST(darray_planner_split, outer_axis_of_a_2d_piece) {
  const auto src = index_map::replicated({10, 100}, {0}).chunks();
  const auto dst = index_map::replicated({10, 100}, {1}).chunks();
  const reshard_plan p = plan_reshard(src, dst, {.element_size = 4, .split_bytes = 1000});
  ASSERT_EQ(p.pieces.size(), 5u) << p.to_string();
  for (std::size_t k = 0; k < 5; ++k) {
    const auto r = static_cast<std::int64_t>(2 * k);
    EXPECT_EQ(p.pieces[k].region, b2(slice(r, r + 2), slice(0, 100)));
    EXPECT_EQ(p.pieces[k].bytes, 800);
  }
}

TEST(darray_planner_split, rows_larger_than_the_limit_go_inward) {
  const auto src = index_map::replicated({3, 100}, {0}).chunks();
  const auto dst = index_map::replicated({3, 100}, {1}).chunks();
  const reshard_plan p = plan_reshard(src, dst, {.element_size = 4, .split_bytes = 100});
  ASSERT_EQ(p.pieces.size(), 12u) << p.to_string();
  EXPECT_EQ(p.pieces[0].region, b2(slice(0, 1), slice(0, 25)));
  EXPECT_EQ(p.pieces[1].region, b2(slice(0, 1), slice(25, 50)));
  EXPECT_EQ(p.pieces[11].region, b2(slice(2, 3), slice(75, 100)));
  for (const piece& q : p.pieces) {
    EXPECT_EQ(q.bytes, 100);
  }
  // One element larger than the limit stays whole.
  const reshard_plan e = plan_reshard(index_map::replicated({4}, {0}).chunks(),
                                      index_map::replicated({4}, {1}).chunks(),
                                      {.element_size = 16, .split_bytes = 10});
  EXPECT_EQ(regions(e), (std::vector<box>{b1(0, 1), b1(1, 2), b1(2, 3), b1(3, 4)}));
}

TEST(darray_planner_split, parts_interleave_across_destinations) {
  const auto src = index_map::replicated({1000}, {0}).chunks();
  const auto dst = index_map::split({1000}, 0, {{1, 0, 500}, {2, 500, 1000}}).chunks();
  const reshard_plan p = plan_reshard(src, dst, {.element_size = 4, .split_bytes = 1000});
  EXPECT_EQ(p.pieces, (std::vector<piece>{make_piece(0, 0, 0, 1, b1(0, 250), 1000),
                                          make_piece(0, 1, 0, 2, b1(500, 750), 1000),
                                          make_piece(0, 0, 0, 1, b1(250, 500), 1000),
                                          make_piece(0, 1, 0, 2, b1(750, 1000), 1000)}))
      << p.to_string();
  EXPECT_EQ(p.pieces_of_dst, (std::vector<std::vector<std::size_t>>{{0, 2}, {1, 3}}));
}

TEST(darray_planner_split, local_pieces_are_not_split) {
  const auto m = index_map::replicated({1000}, {0}).chunks();
  const reshard_plan p = plan_reshard(m, m, {.element_size = 4, .split_bytes = 100});
  EXPECT_EQ(p.pieces, (std::vector<piece>{make_piece(0, 0, 0, 0, b1(0, 1000), 4000, true)}));
}

// --- errors, listing, owned regions ---

TEST(darray_planner, bad_input) {
  const auto src = index_map::replicated({10}, {0}).chunks();
  const auto dst2 = index_map::replicated({10, 2}, {1}).chunks();
  try {
    static_cast<void>(plan_reshard(src, dst2, {}));
    FAIL() << "no throw";
  } catch (const invalid_index_map& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("destination chunk 0"), std::string::npos) << what;
    EXPECT_NE(what.find("rank 2"), std::string::npos) << what;
  }
  try {
    static_cast<void>(plan_reshard(src, src, {.element_size = 0}));
    FAIL() << "no throw";
  } catch (const invalid_index_map& e) {
    EXPECT_NE(std::string(e.what()).find("element_size 0"), std::string::npos) << e.what();
  }
  // Elements no source holds are left out.
  const auto part = index_map::split({10}, 0, {{0, 0, 4}}).chunks();
  const reshard_plan p = plan_reshard(part, index_map::replicated({10}, {1}).chunks(), {});
  EXPECT_EQ(p.pieces, (std::vector<piece>{make_piece(0, 0, 0, 1, b1(0, 4), 16)}));
  EXPECT_TRUE(plan_reshard({}, {}, {}).pieces.empty());
}

TEST(darray_planner, to_string_lists_pieces) {
  const auto src = index_map::split({1000}, 0, {{0, 0, 700}, {1, 700, 1000}}).chunks();
  const auto dst = index_map::split({1000}, 0, {{0, 0, 500}, {1, 500, 1000}}).chunks();
  const std::string s = plan_reshard(src, dst, {.element_size = 4}).to_string();
  EXPECT_NE(s.find("3 pieces"), std::string::npos) << s;
  EXPECT_NE(s.find("[500:700] 0->1"), std::string::npos) << s;
  EXPECT_NE(s.find("800 B remote"), std::string::npos) << s;
  EXPECT_NE(s.find("link 0->1: 800 B"), std::string::npos) << s;
}

TEST(darray_owned_regions, replicas_counted_once) {
  index_map m;
  m.add(0, b1(0, 10)).add(1, b1(5, 15)).add(2, b1(0, 15)).add(3, b1(0, 20, 2));
  const auto owned = owned_regions(m.chunks());
  ASSERT_EQ(owned.size(), 4u);
  EXPECT_EQ(owned[0], (std::vector<box>{b1(0, 10)}));
  EXPECT_EQ(owned[1], (std::vector<box>{b1(10, 15)}));
  EXPECT_TRUE(owned[2].empty());
  EXPECT_EQ(owned[3], (std::vector<box>{b1(16, 20, 2)}));
}

// --- plan_cache ---

// A key over a 1-D array of `n` split at `from` (source) and `to` (target), and its plan.
struct split_key {
  plan_key key;
  reshard_plan plan;
};
split_key make_split_key(std::int64_t n, std::int64_t from, std::int64_t to,
                         plan_options options = {}) {
  const auto src = index_map::split({n}, 0, {{0, 0, from}, {1, from, n}});
  const auto dst = index_map::split({n}, 0, {{0, 0, to}, {1, to, n}});
  split_key k{plan_key{src.chunks(), {n}, dst, true, options}, {}};
  k.plan = plan_reshard(k.key.src, dst.chunks(), options);
  return k;
}

std::shared_ptr<const reshard_plan> find(plan_cache& cache, const plan_key& k) {
  return cache.find(k.src, k.shape, k.dst, k.covering, k.options);
}

TEST(darray_plan_cache, finds_exactly_the_key_it_was_given) {
  plan_cache cache;
  const split_key k = make_split_key(1000, 700, 500);
  EXPECT_EQ(find(cache, k.key), nullptr);
  const auto plan = std::make_shared<const reshard_plan>(k.plan);
  cache.insert(k.key, plan);
  EXPECT_EQ(find(cache, k.key), plan);  // the same object: shared, not copied
  EXPECT_EQ(find(cache, k.key)->pieces, k.plan.pieces);

  // Every field of the key matters.
  plan_key other = k.key;
  other.covering = false;  // a map checked only for bounds does not stand for a covering one
  EXPECT_EQ(find(cache, other), nullptr);
  other = k.key;
  other.options.split_bytes = 100;
  EXPECT_EQ(find(cache, other), nullptr);
  other = k.key;
  other.options.element_size = 8;
  EXPECT_EQ(find(cache, other), nullptr);
  other = k.key;
  other.options.accumulate = true;
  EXPECT_EQ(find(cache, other), nullptr);
  other = k.key;
  other.shape = {1001};
  EXPECT_EQ(find(cache, other), nullptr);
  EXPECT_EQ(find(cache, make_split_key(1000, 701, 500).key), nullptr);  // source chunks
  EXPECT_EQ(find(cache, make_split_key(1000, 700, 501).key), nullptr);  // target map
  other = k.key;
  other.src[1].device = 0;  // same boxes, another device
  EXPECT_EQ(find(cache, other), nullptr);

  const plan_cache_stats st = cache.stats();
  EXPECT_EQ(st.hits, 2U);
  EXPECT_EQ(st.misses, 9U);
  EXPECT_EQ(st.size, 1U);
  cache.clear();
  EXPECT_EQ(find(cache, k.key), nullptr);
  EXPECT_EQ(cache.stats().size, 0U);
}

TEST(darray_plan_cache, keeps_the_most_recently_used_plans) {
  plan_cache cache(2);
  const split_key a = make_split_key(100, 70, 50);
  const split_key b = make_split_key(100, 70, 40);
  const split_key c = make_split_key(100, 70, 30);
  cache.insert(a.key, std::make_shared<const reshard_plan>(a.plan));
  cache.insert(b.key, std::make_shared<const reshard_plan>(b.plan));
  const auto held = find(cache, a.key);  // a is now more recent than b
  ASSERT_NE(held, nullptr);
  cache.insert(c.key, std::make_shared<const reshard_plan>(c.plan));
  EXPECT_EQ(cache.stats().size, 2U);
  EXPECT_NE(find(cache, a.key), nullptr);
  EXPECT_EQ(find(cache, b.key), nullptr);  // the least recently used went
  ASSERT_NE(find(cache, c.key), nullptr);
  EXPECT_EQ(find(cache, c.key)->pieces, c.plan.pieces);
  // Inserting an equal key replaces its plan instead of taking a second slot.
  const auto again = std::make_shared<const reshard_plan>(c.plan);
  cache.insert(c.key, again);
  EXPECT_EQ(cache.stats().size, 2U);
  EXPECT_EQ(find(cache, c.key), again);
  EXPECT_NE(find(cache, a.key), nullptr);
  // A plan found stays valid after it leaves the cache.
  cache.clear();
  EXPECT_EQ(held->pieces, a.plan.pieces);
}

TEST(darray_plan_cache_concurrency, threads_share_one_cache) {
  // More keys than room: threads find, plan, insert and evict at once; every plan found must be
  // the one of its key.
  std::vector<split_key> keys;
  for (std::int64_t to = 10; to < 130; to += 10) {
    keys.push_back(make_split_key(200, 100, to, {.element_size = 4, .split_bytes = 64}));
  }
  plan_cache cache(8);
  constexpr int threads = 4;
  constexpr int rounds = 2000;
  std::vector<int> wrong(threads, 0);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      std::mt19937_64 rng(test_seed() + static_cast<std::uint64_t>(t));
      for (int i = 0; i < rounds; ++i) {
        const split_key& k = keys[rng() % keys.size()];
        auto plan = find(cache, k.key);
        if (!plan) {
          plan = std::make_shared<const reshard_plan>(
              plan_reshard(k.key.src, k.key.dst.chunks(), k.key.options));
          cache.insert(k.key, plan);
        }
        wrong[static_cast<std::size_t>(t)] += plan->pieces == k.plan.pieces ? 0 : 1;
      }
    });
  }
  for (auto& th : pool) {
    th.join();
  }
  EXPECT_EQ(wrong, std::vector<int>(threads, 0));
  const plan_cache_stats st = cache.stats();
  EXPECT_EQ(st.hits + st.misses, static_cast<std::uint64_t>(threads * rounds));
  EXPECT_GT(st.hits, 0U);
  EXPECT_EQ(st.size, 8U);
}

// --- randomized properties ---

// A random map of `shape` on `devices` devices: contiguous ranges along a random axis, plus up to
// three extra boxes (with steps) as replicas.
index_map random_map(std::mt19937_64& rng, const shape_t& shape, int devices) {
  index_map m;
  const std::size_t axis = rng() % shape.size();
  std::int64_t at = 0;
  while (at < shape[axis]) {
    const std::int64_t len = 1 + static_cast<std::int64_t>(rng() % 3);
    box b = box::full(shape);
    b.dims[axis] = slice(at, std::min(at + len, shape[axis]));
    m.add(static_cast<int>(rng() % static_cast<std::uint64_t>(devices)), b);
    at += len;
  }
  for (std::size_t k = rng() % 4; k > 0; --k) {
    box b;
    for (const std::int64_t n : shape) {
      const auto start = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(n));
      const auto stop =
          start + 1 + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(n - start));
      b.dims.emplace_back(start, stop, 1 + static_cast<std::int64_t>(rng() % 3));
    }
    m.add(static_cast<int>(rng() % static_cast<std::uint64_t>(devices)), b);
  }
  return m;
}

struct random_case {
  shape_t shape;
  std::vector<chunk_ref> src;
  std::vector<chunk_ref> dst;
  plan_options options;
};

random_case make_case(std::mt19937_64& rng, bool accumulate) {
  random_case c;
  const std::size_t rank = 1 + rng() % 3;
  for (std::size_t axis = 0; axis < rank; ++axis) {
    c.shape.push_back(1 + static_cast<std::int64_t>(rng() % 6));
  }
  const int devices = 1 + static_cast<int>(rng() % 4);
  const index_map src = random_map(rng, c.shape, devices);
  const index_map dst = random_map(rng, c.shape, devices);
  src.validate(c.shape, devices);
  dst.validate(c.shape, devices);
  c.src = src.chunks();
  c.dst = dst.chunks();
  c.options.element_size = 1 + rng() % 8;
  const std::int64_t limits[] = {0, 1, 8, 20, 64};
  c.options.split_bytes = limits[rng() % 5];
  c.options.accumulate = accumulate;
  return c;
}

// Checks shared by both modes: the fields of every piece, the order, the byte totals, the links
// and pieces_of_dst.
void check_bookkeeping(const random_case& c, const reshard_plan& p) {
  const auto es = static_cast<std::int64_t>(c.options.element_size);
  std::int64_t remote = 0;
  std::int64_t local = 0;
  std::int64_t in_place = 0;
  std::map<std::pair<int, int>, std::int64_t> link_sum;
  std::vector<std::vector<std::size_t>> of_dst(c.dst.size());
  bool seen_remote = false;
  std::optional<std::tuple<long double, int, int>> prev_key;
  for (std::size_t k = 0; k < p.pieces.size(); ++k) {
    const piece& q = p.pieces[k];
    ASSERT_LT(q.dst_chunk, c.dst.size());
    if (q.from_dst) {
      // Takes from an earlier destination chunk on its device what the nearest remote piece
      // before it (skipping other from_dst pieces) delivers into that chunk.
      ASSERT_FALSE(c.options.accumulate) << "from_dst piece " << k << " in a partial plan";
      ASSERT_LT(q.src_chunk, q.dst_chunk);
      const chunk_ref& d = c.dst[q.dst_chunk];
      ASSERT_EQ(q.src_device, d.device);
      ASSERT_EQ(q.dst_device, d.device);
      ASSERT_EQ(c.dst[q.src_chunk].device, d.device);
      ASSERT_TRUE(q.local);
      ASSERT_FALSE(q.in_place);
      const auto region = points(q.region);
      ASSERT_FALSE(region.empty());
      const auto in_dst = points(d.region);
      ASSERT_TRUE(std::includes(in_dst.begin(), in_dst.end(), region.begin(), region.end()))
          << "piece " << k << " " << q.region.to_string() << " outside its destination chunk";
      ASSERT_EQ(q.bytes, static_cast<std::int64_t>(region.size()) * es);
      std::size_t before = k;
      while (before > 0 && p.pieces[before - 1].from_dst) {
        --before;
      }
      ASSERT_GT(before, 0U) << "from_dst piece " << k << " follows no remote piece";
      const piece& feed = p.pieces[before - 1];
      ASSERT_FALSE(feed.local) << "from_dst piece " << k << " follows a local piece";
      ASSERT_EQ(feed.dst_chunk, q.src_chunk) << "from_dst piece " << k;
      const auto fed = points(feed.region);
      ASSERT_TRUE(std::includes(fed.begin(), fed.end(), region.begin(), region.end()))
          << "from_dst piece " << k << " " << q.region.to_string() << " outside the piece before";
      of_dst[q.dst_chunk].push_back(k);
      local += q.bytes;
      continue;
    }
    ASSERT_LT(q.src_chunk, c.src.size());
    const chunk_ref& s = c.src[q.src_chunk];
    const chunk_ref& d = c.dst[q.dst_chunk];
    ASSERT_EQ(q.src_device, s.device);
    ASSERT_EQ(q.dst_device, d.device);
    const auto region = points(q.region);
    ASSERT_FALSE(region.empty());
    const auto in_src = points(s.region);
    const auto in_dst = points(d.region);
    ASSERT_TRUE(std::includes(in_src.begin(), in_src.end(), region.begin(), region.end()))
        << "piece " << k << " " << q.region.to_string() << " outside its source chunk";
    ASSERT_TRUE(std::includes(in_dst.begin(), in_dst.end(), region.begin(), region.end()))
        << "piece " << k << " " << q.region.to_string() << " outside its destination chunk";
    ASSERT_EQ(q.bytes, static_cast<std::int64_t>(region.size()) * es);
    ASSERT_EQ(q.local, q.src_device == q.dst_device);
    ASSERT_EQ(q.in_place, q.local && in_src == in_dst);
    of_dst[q.dst_chunk].push_back(k);
    if (q.local) {
      ASSERT_FALSE(seen_remote) << "local piece " << k << " after a remote one";
      local += q.bytes;
      in_place += q.in_place ? q.bytes : 0;
      continue;
    }
    seen_remote = true;
    remote += q.bytes;
    link_sum[{q.src_device, q.dst_device}] += q.bytes;
    if (c.options.split_bytes > 0) {
      ASSERT_LE(q.bytes, std::max(c.options.split_bytes, es)) << "piece " << k << " not split";
    }
    // Position of the first element in the destination chunk's row-major storage: the earliest of
    // this piece's and of the from_dst pieces right after it (which take from it).
    const auto fraction = [&](const piece& x) {
      const box& whole = c.dst[x.dst_chunk].region;
      const box loc = local_slices(whole, x.region);
      const shape_t ext = whole.extents();
      std::int64_t offset = 0;
      for (std::size_t axis = 0; axis < ext.size(); ++axis) {
        offset = offset * ext[axis] + loc.dims[axis].start;
      }
      return static_cast<long double>(offset) / static_cast<long double>(whole.size());
    };
    long double at = fraction(q);
    for (std::size_t next = k + 1; next < p.pieces.size() && p.pieces[next].from_dst; ++next) {
      at = std::min(at, fraction(p.pieces[next]));
    }
    const std::tuple<long double, int, int> key{at, q.dst_device, q.src_device};
    if (prev_key) {
      ASSERT_LE(*prev_key, key) << "remote piece " << k << " out of order";
    }
    prev_key = key;
  }
  ASSERT_EQ(p.bytes_remote, remote);
  ASSERT_EQ(p.bytes_local, local);
  ASSERT_EQ(p.bytes_in_place, in_place);
  ASSERT_EQ(p.pieces_of_dst, of_dst);
  links expected_links;
  for (const auto& [link, bytes] : link_sum) {
    expected_links.emplace_back(link.first, link.second, bytes);
  }
  ASSERT_EQ(p.link_bytes, expected_links);
}

std::string describe(const random_case& c) {
  std::string s = "shape rank " + std::to_string(c.shape.size()) + ", src:";
  for (const chunk_ref& r : c.src) {
    s += " " + std::to_string(r.device) + ":" + r.region.to_string();
  }
  s += ", dst:";
  for (const chunk_ref& r : c.dst) {
    s += " " + std::to_string(r.device) + ":" + r.region.to_string();
  }
  return s + ", element_size " + std::to_string(c.options.element_size) + ", split_bytes " +
         std::to_string(c.options.split_bytes);
}

TEST(darray_planner_property, replica_source_partitions_every_destination) {
  const std::uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed + 20);
  int reused = 0;  // from_dst pieces seen
  for (int iter = 0; iter < 400; ++iter) {
    const random_case c = make_case(rng, false);
    SCOPED_TRACE(describe(c));
    const reshard_plan p = plan_reshard(c.src, c.dst, c.options);
    SCOPED_TRACE(p.to_string());
    check_bookkeeping(c, p);
    if (testing::Test::HasFatalFailure()) {
      return;
    }
    // The pieces of each destination chunk partition it exactly.
    for (std::size_t j = 0; j < c.dst.size(); ++j) {
      std::multiset<point> got;
      for (const std::size_t k : p.pieces_of_dst[j]) {
        const auto r = points(p.pieces[k].region);
        got.insert(r.begin(), r.end());
      }
      const auto want = points(c.dst[j].region);
      ASSERT_EQ(got, std::multiset<point>(want.begin(), want.end())) << "dst chunk " << j;
    }
    // Local whenever the destination device holds the element (from_dst pieces only where it
    // does not); each element a device lacks crosses to it exactly once, however many
    // destination chunks there hold it.
    std::map<int, std::set<point>> held;
    for (const chunk_ref& s : c.src) {
      const auto e = points(s.region);
      held[s.device].insert(e.begin(), e.end());
    }
    std::map<std::pair<int, point>, int> delivered;
    for (const piece& q : p.pieces) {
      if (q.from_dst) {
        reused += 1;
      }
      if (q.local && !q.from_dst) {
        continue;
      }
      for (const point& e : points(q.region)) {
        ASSERT_EQ(held[q.dst_device].count(e), 0U)
            << "element " << (q.from_dst ? "reused" : "sent") << " on device " << q.dst_device
            << " which holds it";
        if (!q.from_dst) {
          ++delivered[{q.dst_device, e}];
        }
      }
    }
    std::map<std::pair<int, point>, int> lacking;
    for (const chunk_ref& d : c.dst) {
      for (const point& e : points(d.region)) {
        if (held[d.device].count(e) == 0) {
          lacking[{d.device, e}] = 1;
        }
      }
    }
    ASSERT_EQ(delivered, lacking);  // random maps cover the shape: every element has a holder
  }
  // The generator makes overlapping destination chunks on one device that it does not hold.
  EXPECT_GT(reused, 0) << "no from_dst piece in any plan";
}

TEST(darray_planner_property, accumulate_takes_every_intersection_once) {
  const std::uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed + 21);
  for (int iter = 0; iter < 300; ++iter) {
    const random_case c = make_case(rng, true);
    SCOPED_TRACE(describe(c));
    const reshard_plan p = plan_reshard(c.src, c.dst, c.options);
    SCOPED_TRACE(p.to_string());
    check_bookkeeping(c, p);
    if (testing::Test::HasFatalFailure()) {
      return;
    }
    std::map<std::pair<std::size_t, std::size_t>, std::multiset<point>> got;
    for (const piece& q : p.pieces) {
      const auto r = points(q.region);
      got[{q.src_chunk, q.dst_chunk}].insert(r.begin(), r.end());
    }
    for (std::size_t i = 0; i < c.src.size(); ++i) {
      const auto s = points(c.src[i].region);
      for (std::size_t j = 0; j < c.dst.size(); ++j) {
        std::multiset<point> want;
        for (const point& e : points(c.dst[j].region)) {
          if (s.count(e) == 1) {
            want.insert(e);
          }
        }
        ASSERT_EQ(got[std::make_pair(i, j)], want) << "src chunk " << i << ", dst chunk " << j;
      }
    }
  }
}

TEST(darray_planner_property, owned_regions_partition_the_union) {
  const std::uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed + 22);
  for (int iter = 0; iter < 300; ++iter) {
    const random_case c = make_case(rng, false);
    SCOPED_TRACE(describe(c));
    const auto owned = owned_regions(c.src);
    ASSERT_EQ(owned.size(), c.src.size());
    std::set<point> earlier;
    for (std::size_t i = 0; i < c.src.size(); ++i) {
      std::multiset<point> got;
      for (const box& b : owned[i]) {
        const auto r = points(b);
        got.insert(r.begin(), r.end());
      }
      std::multiset<point> want;
      for (const point& e : points(c.src[i].region)) {
        if (earlier.count(e) == 0) {
          want.insert(e);
        }
      }
      ASSERT_EQ(got, want) << "chunk " << i;
      const auto all = points(c.src[i].region);
      earlier.insert(all.begin(), all.end());
    }
  }
}

}  // namespace
}  // namespace poolscope::darray
