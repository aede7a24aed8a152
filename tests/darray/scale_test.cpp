// darray at scale: ops, reductions, matmuls and reshards of arrays whose chunks arrived in P
// pieces visit O(P log P) parts (backend_stats::parts_visited), P = 1 ... 16384 — the work is
// counted, not timed — and give the host's values; the planner's work over up to 4,096 devices
// (reshard_plan::boxes_visited) grows as pieces log pieces for the patterns of the planner
// benchmark (bench/include/poolscope/bench/darray_scale_bench.hpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "poolscope/darray/distributed_array.hpp"
#include "poolscope/darray/planner.hpp"

namespace poolscope::darray {
namespace {

using i64 = std::int64_t;

// The bound the tests hold the counted work to: c * P * log2 P, plus a constant for the fixed
// work of an op (its chunks, its output). Walking every pair of P parts visits P^2, past this
// bound from P = 256 on.
double bound(double p, double c = 8.0) {
  return c * p * std::max(1.0, std::log2(p)) + 256.0;
}

// `blocks` of `shape` along axis 0 over 2 devices, block i on device 1 - i.
index_map swapped_blocks(const shape_t& shape) {
  const index_map m = index_map::blocks(shape, 0, 2);
  index_map out;
  for (const auto& [device, boxes] : m.parts()) {
    for (const box& b : boxes) {
      out.add(1 - device, b);
    }
  }
  return out;
}

// x resharded to the swapped blocks with every chunk arriving in `p` pieces.
distributed_array<i64> in_pieces(const distributed_array<i64>& x, const index_map& to, i64 p) {
  i64 chunk_elements = 0;
  for (const auto& c : x.chunks()) {
    chunk_elements = std::max(chunk_elements, c.region.size());
  }
  reshard_options o;
  o.split_bytes = p == 1 ? 0 : std::max<i64>(8, chunk_elements * 8 / p);
  auto b = x.reshard(to, o);
  b.wait();
  return b;
}

std::uint64_t visited_by(backend& be, const std::function<void()>& op) {
  const std::uint64_t before = be.stats().parts_visited;
  op();
  return be.stats().parts_visited - before;
}

TEST(darray_scale, ops_on_chunks_of_many_parts_visit_p_log_p) {
  auto be = make_host_backend(2);
  const i64 n = 2 * 16384 * 2;  // 16384 pieces of 2 elements per chunk at the largest P
  const shape_t shape{n};
  std::vector<i64> h(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < h.size(); ++i) {
    h[i] = static_cast<i64>(i * 7 % 1000) - 500;
  }
  const index_map to = swapped_blocks(shape);
  const auto x = distributed_array<i64>::from_host(be, h, shape, index_map::blocks(shape, 0, 2));
  const auto a = distributed_array<i64>::from_host(be, h, shape, to);
  i64 total = 0;
  for (const i64 v : h) {
    total += v;
  }
  for (const i64 p : {1, 4, 16, 64, 256, 1024, 4096, 16384}) {
    SCOPED_TRACE("P = " + std::to_string(p));
    const auto b = in_pieces(x, to, p);
    for (const auto& c : b.chunks()) {
      ASSERT_EQ(static_cast<i64>(c.parts.size()), p);
    }
    // A second partition of the same chunks, cut elsewhere: pairs of parts that differ.
    const auto b2 = in_pieces(x, to, std::max<i64>(1, p / 2));
    const auto pd = static_cast<double>(p);
    const auto check = [&](const char* what, const std::function<distributed_array<i64>()>& op,
                           const std::function<i64(std::size_t)>& want) {
      distributed_array<i64> r;
      const std::uint64_t visited = visited_by(*be, [&] {
        r = op();
        r.wait();
      });
      EXPECT_LE(static_cast<double>(visited), bound(pd)) << what;
      const auto out = r.to_host();
      for (std::size_t i = 0; i < out.size(); ++i) {
        if (out[i] != want(i)) {
          ADD_FAILURE() << what << ": element " << i << " is " << out[i] << ", not " << want(i);
          break;
        }
      }
    };
    check(
        "b + b", [&] { return b + b; }, [&](std::size_t i) { return 2 * h[i]; });
    check(
        "b + a", [&] { return b + a; }, [&](std::size_t i) { return 2 * h[i]; });
    check(
        "a + b", [&] { return a + b; }, [&](std::size_t i) { return 2 * h[i]; });
    check(
        "b - b2", [&] { return b - b2; }, [](std::size_t) { return i64{0}; });
    check(
        "b + x (reshard of x fused)", [&] { return b + x; },
        [&](std::size_t i) { return 2 * h[i]; });
    check(
        "b * 3", [&] { return b * i64{3}; }, [&](std::size_t i) { return 3 * h[i]; });
    check(
        "-b", [&] { return -b; }, [&](std::size_t i) { return -h[i]; });
    check(
        "b.reshard(blocks)", [&] { return b.reshard(index_map::blocks(shape, 0, 2)); },
        [&](std::size_t i) { return h[i]; });
    check(
        "sum(b)", [&] { return sum(b).change_mode(array_mode::replica); },
        [&](std::size_t) { return total; });
    check(
        "max(b)", [&] { return darray::max(b); },
        [&](std::size_t) { return *std::max_element(h.begin(), h.end()); });
  }
}

TEST(darray_scale, reductions_and_matmuls_of_rows_in_many_parts_visit_p_log_p) {
  auto be = make_host_backend(2);
  const i64 rows = 2 * 4096;
  const i64 cols = 3;
  const shape_t shape{rows, cols};
  std::vector<i64> h(static_cast<std::size_t>(rows * cols));
  for (std::size_t i = 0; i < h.size(); ++i) {
    h[i] = static_cast<i64>(i % 13) - 6;
  }
  const auto x = distributed_array<i64>::from_host(be, h, shape, index_map::blocks(shape, 0, 2));
  const index_map to = swapped_blocks(shape);
  // w: cols x 2, one chunk on device 0.
  const std::vector<i64> hw{1, 2, 3, 4, 5, 6};
  const auto w =
      distributed_array<i64>::from_host(be, hw, {cols, 2}, index_map::blocks({cols, 2}, 0, 1));
  std::vector<i64> col_sums(static_cast<std::size_t>(cols), 0);
  std::vector<i64> row_sums(static_cast<std::size_t>(rows), 0);
  std::vector<i64> xw(static_cast<std::size_t>(rows * 2), 0);
  for (i64 r = 0; r < rows; ++r) {
    for (i64 c = 0; c < cols; ++c) {
      const i64 v = h[static_cast<std::size_t>(r * cols + c)];
      col_sums[static_cast<std::size_t>(c)] += v;
      row_sums[static_cast<std::size_t>(r)] += v;
      for (i64 k = 0; k < 2; ++k) {
        xw[static_cast<std::size_t>(r * 2 + k)] += v * hw[static_cast<std::size_t>(c * 2 + k)];
      }
    }
  }
  for (const i64 p : {1, 16, 256, 4096}) {
    SCOPED_TRACE("P = " + std::to_string(p));
    const auto b = in_pieces(x, to, p);
    for (const auto& c : b.chunks()) {
      ASSERT_EQ(static_cast<i64>(c.parts.size()), p);
    }
    const auto pd = static_cast<double>(p);
    const auto expect_op = [&](const char* what, const std::function<distributed_array<i64>()>& op,
                               const std::vector<i64>& want) {
      distributed_array<i64> r;
      const std::uint64_t visited = visited_by(*be, [&] {
        r = op();
        r.wait();
      });
      EXPECT_LE(static_cast<double>(visited), bound(pd)) << what;
      EXPECT_EQ(r.to_host(), want) << what;
    };
    expect_op(
        "sum(b, 0)", [&] { return sum(b, 0).change_mode(array_mode::replica); }, col_sums);
    expect_op(
        "sum(b, 1)", [&] { return sum(b, 1).change_mode(array_mode::replica); }, row_sums);
    expect_op(
        "matmul(b, w)", [&] { return matmul(b, w).change_mode(array_mode::replica); }, xw);
  }
}

// The planner benchmark's patterns (darray_scale_bench.cpp builds the same maps) over up to 4,096
// devices: the pieces each pattern must have, and planning work within c * pieces * log2 pieces.
TEST(darray_scale, planner_work_grows_as_pieces_log_pieces) {
  for (const int d : {4, 64, 1024, 4096}) {
    SCOPED_TRACE("devices " + std::to_string(d));
    const i64 n = i64{d} << 10;
    const shape_t shape{n};
    const index_map blocks = index_map::blocks(shape, 0, d);
    index_map rotated;
    for (const auto& [device, boxes] : blocks.parts()) {
      rotated.add((device + 1) % d, boxes.front());
    }
    std::vector<std::tuple<int, i64, i64>> ranges;
    const i64 cut = 7 * n / 10;
    const i64 low = d / 2;
    for (i64 i = 0; i < low; ++i) {
      ranges.emplace_back(static_cast<int>(i), cut * i / low, cut * (i + 1) / low);
    }
    for (i64 i = 0; i < d - low; ++i) {
      ranges.emplace_back(static_cast<int>(low + i), cut + (n - cut) * i / (d - low),
                          cut + (n - cut) * (i + 1) / (d - low));
    }
    std::vector<int> all(static_cast<std::size_t>(d));
    for (int i = 0; i < d; ++i) {
      all[static_cast<std::size_t>(i)] = i;
    }
    struct pattern {
      const char* name;
      index_map src;
      index_map dst;
      std::size_t pieces_at_least;
      std::size_t pieces_at_most;
    };
    const auto dd = static_cast<std::size_t>(d);
    const std::vector<pattern> patterns{
        {"rotate", blocks, rotated, dd, dd},
        {"split_07", blocks, index_map::split(shape, 0, ranges), dd, 2 * dd + 1},
        {"replicate_to_blocks", index_map::replicated(shape, all), blocks, dd, dd},
    };
    for (const auto& pt : patterns) {
      const auto plan = plan_reshard(pt.src.chunks(), pt.dst.chunks(), {.element_size = 4});
      const std::size_t pieces = plan.pieces.size();
      EXPECT_GE(pieces, pt.pieces_at_least) << pt.name;
      EXPECT_LE(pieces, pt.pieces_at_most) << pt.name;
      EXPECT_LE(static_cast<double>(plan.boxes_visited), bound(static_cast<double>(pieces), 16.0))
          << pt.name << ": " << pieces << " pieces";
    }
  }
  // Rows to columns: every destination chunk meets every source chunk, d^2 pieces.
  for (const int d : {4, 64, 256}) {
    const shape_t shape{8 * i64{d}, 8 * i64{d}};
    const auto plan = plan_reshard(index_map::blocks(shape, 0, d).chunks(),
                                   index_map::blocks(shape, 1, d).chunks(), {.element_size = 4});
    const auto pieces = static_cast<std::size_t>(d) * static_cast<std::size_t>(d);
    EXPECT_EQ(plan.pieces.size(), pieces) << d;
    EXPECT_LE(static_cast<double>(plan.boxes_visited), bound(static_cast<double>(pieces), 16.0))
        << d;
  }
}

}  // namespace
}  // namespace poolscope::darray
