// DistributedArray on the host backend: the seed example, partial modes, matmul, bad input,
// overlapping destination chunks on one device (each element crosses once), and randomized
// sequences of reshards and ops on host:2..4, every result (and chunk) against a host reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <pthread.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "poolscope/analysis/trace_summary.hpp"
#include "poolscope/darray/distributed_array.hpp"
#include "poolscope/error.hpp"
#include "poolscope/hooks/hook.hpp"
#include "poolscope/profiler/timeline.hpp"
#include "test_support.hpp"

namespace poolscope::darray {
namespace {

using i64 = std::int64_t;

std::vector<i64> iota_values(i64 n, i64 start = 0) {
  std::vector<i64> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), start);
  return v;
}

std::size_t in_use(backend& be) {
  std::size_t total = 0;
  for (int d = 0; d < be.device_count(); ++d) {
    total += be.allocator(d).stats().in_use;
  }
  return total;
}

TEST(darray_array, seed_example_moves_only_what_must_move) {
  auto be = make_host_backend(2);
  const i64 n = 1000;
  auto ha = iota_values(n);
  auto hc = iota_values(n, 5000);
  const auto a_map = index_map::split({n}, 0, {{0, 0, 500}, {1, 500, 1000}});
  const auto c_map = index_map::split({n}, 0, {{0, 0, 700}, {1, 700, 1000}});
  auto a = distributed_array<i64>::from_host(be, ha, {n}, a_map);
  auto c = distributed_array<i64>::from_host(be, hc, {n}, c_map);

  auto moved = c.reshard(a.index_map());
  const auto& plan = *moved.handle().last_reshard().plan;     // shared, never null
  EXPECT_EQ(plan.bytes_remote, 200 * 8) << plan.to_string();  // [500, 700) from device 0 to 1
  EXPECT_EQ(plan.bytes_local, 800 * 8);
  EXPECT_EQ(moved.handle().last_reshard().transfers, 1U);
  EXPECT_EQ(moved.to_host(), hc);
  // The chunk of device 0 reads C's own buffer (no copy): same storage.
  EXPECT_EQ(moved.chunks()[0].parts[0].storage, c.chunks()[0].parts[0].storage);

  auto sum = a + c.reshard(a.index_map());
  std::vector<i64> want(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < want.size(); ++i) {
    want[i] = ha[i] + hc[i];
  }
  EXPECT_EQ(sum.to_host(), want);
  EXPECT_EQ(sum.index_map(), a_map);
  EXPECT_EQ(be->stats().copies_peer, 2U);  // one piece per reshard
}

TEST(darray_array, repeated_reshards_reuse_their_plan) {
  auto be = make_host_backend(2);
  const i64 n = 1000;
  const auto hc = iota_values(n, 5000);
  const auto a_map = index_map::split({n}, 0, {{0, 0, 500}, {1, 500, 1000}});
  auto c = distributed_array<i64>::from_host(
      be, hc, {n}, index_map::split({n}, 0, {{0, 0, 700}, {1, 700, 1000}}));
  const plan_cache_stats before = be->plans().stats();
  const auto m1 = c.reshard(a_map);
  const auto m2 = c.reshard(a_map);
  const plan_cache_stats after = be->plans().stats();
  EXPECT_EQ(after.misses - before.misses, 1U);
  EXPECT_EQ(after.hits - before.hits, 1U);
  EXPECT_EQ(m1.handle().last_reshard().plan, m2.handle().last_reshard().plan);  // one object
  EXPECT_EQ(m2.to_host(), hc);
  // Other options, another plan.
  reshard_options small;
  small.split_bytes = 64;
  const auto m3 = c.reshard(a_map, small);
  EXPECT_GT(m3.handle().last_reshard().plan->pieces.size(),
            m1.handle().last_reshard().plan->pieces.size());
  EXPECT_EQ(m3.to_host(), hc);

  // A target map that fails its check is not remembered: it fails every time.
  const auto uncovered = index_map::split({n}, 0, {{0, 0, 400}, {1, 500, 1000}});
  EXPECT_THROW((void)c.reshard(uncovered), invalid_index_map);
  EXPECT_THROW((void)c.reshard(uncovered), invalid_index_map);
  // A plan kept for a map checked only for bounds (as matmul's row requests are) does not let a
  // reshard skip the cover check.
  plan_options po;
  po.element_size = sizeof(i64);
  be->plans().insert(plan_key{c.index_map().chunks(), {n}, uncovered, false, po},
                     std::make_shared<const reshard_plan>(
                         plan_reshard(c.index_map().chunks(), uncovered.chunks(), po)));
  EXPECT_THROW((void)c.reshard(uncovered), invalid_index_map);
}

// A 6 x 9 array on host:3, rows <-> columns, sent as one group: the pieces that are strided on
// the sender are packed before the group, those strided on the receiver unpacked after it.
TEST(darray_array, grouped_reshards_pack_and_unpack_strided_pieces) {
  auto be = make_host_backend(3);
  const shape_t shape{6, 9};
  const auto rows = index_map::blocks(shape, 0, 3);
  const auto cols = index_map::blocks(shape, 1, 3);
  std::vector<i64> h(54);
  std::iota(h.begin(), h.end(), i64{-20});
  auto x = distributed_array<i64>::from_host(be, h, shape, rows);
  EXPECT_FALSE(be->groups_transfers(*x.handle().last_reshard().plan, transport::automatic));
  const reshard_options grouped{.how = transport::nccl};
  for (const auto& [from, to] : {std::pair{rows, cols}, std::pair{cols, rows}}) {
    SCOPED_TRACE(from.to_string() + " -> " + to.to_string());
    const auto a = x.reshard(from);
    a.wait();
    const backend_stats before = be->stats();
    const auto b = a.reshard(to, grouped);
    EXPECT_EQ(b.to_host(), h);
    const backend_stats after = be->stats();
    // 3 x 3 blocks, 3 of them already in place: 6 pieces cross, each strided on one side
    // (a row block's columns or a column block's rows), so 6 packs or unpacks on the devices.
    EXPECT_EQ(b.handle().last_reshard().transfers, 6U);
    EXPECT_EQ(after.copies_peer - before.copies_peer, 6U);
    EXPECT_EQ(after.copies_local - before.copies_local, 6U);
    EXPECT_EQ(after.bytes_peer - before.bytes_peer, 6U * 2 * 3 * sizeof(i64));
    // The grouped result computes like any other.
    EXPECT_EQ((b + b).to_host(), [&] {
      std::vector<i64> twice = h;
      for (auto& v : twice) {
        v *= 2;
      }
      return twice;
    }());
  }
  // A group's transfers are checked like copies.
  const auto buf = be->allocate(0, 64);
  const view v = view::dense(buf->data(), {4});
  EXPECT_THROW(be->copy_group(dtype::i64, {backend::transfer{v, 0, v, 0}}, transport::nccl),
               invalid_argument);
  EXPECT_THROW(
      be->copy_group(dtype::i64, {backend::transfer{v, 1, view::dense(buf->data(), {3}), 0}},
                     transport::nccl),
      invalid_argument);
  EXPECT_THROW(be->copy_group(dtype::i64, {backend::transfer{v, 3, v, 0}}, transport::nccl),
               invalid_argument);
}

// Device 1's chunk of A + C.reshard(A's map) has two parts (C's own, the piece from device 0):
// a small chunk computes both in one task, a large one each as soon as it is there.
TEST(darray_array, small_chunks_compute_their_parts_in_one_task) {
  for (const i64 n : {i64{1000}, i64{1} << 21}) {
    SCOPED_TRACE("n " + std::to_string(n));
    auto be = make_host_backend(2);
    const auto ha = iota_values(n);
    const auto hc = iota_values(n, 7);
    auto a = distributed_array<i64>::from_host(
        be, ha, {n}, index_map::split({n}, 0, {{0, 0, n / 2}, {1, n / 2, n}}));
    auto c = distributed_array<i64>::from_host(
        be, hc, {n}, index_map::split({n}, 0, {{0, 0, n * 7 / 10}, {1, n * 7 / 10, n}}));
    const auto moved = c.reshard(a.index_map());
    moved.wait();
    const auto ops = be->stats().ops;
    const auto sum = a + moved;
    EXPECT_EQ(be->stats().ops - ops, n < (i64{1} << 21) ? 2U : 3U);
    std::vector<i64> want(ha.size());
    for (std::size_t i = 0; i < want.size(); ++i) {
      want[i] = ha[i] + hc[i];
    }
    EXPECT_EQ(sum.to_host(), want);
  }
}

// A binary op of arrays on different maps reshards its right operand inside the op and computes
// part by part: what each device holds, then each received piece. Chunks of 2^20 elements and more
// take that path (smaller ones compute all their parts in one task); the result and its parts (the
// local part first, one per piece after it) are checked, on 2 and 3 devices.
TEST(darray_array, implicit_reshard_computes_the_local_part_then_each_piece) {
  for (const int devices : {2, 3}) {
    SCOPED_TRACE("host:" + std::to_string(devices));
    auto be = make_host_backend(devices);
    const std::size_t before = in_use(*be);
    const i64 n = i64{3} << 20;
    const auto ha = iota_values(n);
    const auto hc = iota_values(n, 11);
    std::vector<std::tuple<int, i64, i64>> a_ranges;
    std::vector<std::tuple<int, i64, i64>> c_ranges;
    for (int d = 0; d < devices; ++d) {
      a_ranges.emplace_back(d, n * d / devices, n * (d + 1) / devices);
      // C's boundaries sit elsewhere: every device but one receives from its neighbours.
      c_ranges.emplace_back(d, d == 0 ? 0 : n * d / devices + n / 10,
                            d + 1 == devices ? n : n * (d + 1) / devices + n / 10);
    }
    const auto a_map = index_map::split({n}, 0, a_ranges);
    const auto c_map = index_map::split({n}, 0, c_ranges);
    {
      auto a = distributed_array<i64>::from_host(be, ha, {n}, a_map);
      auto c = distributed_array<i64>::from_host(be, hc, {n}, c_map);
      const auto copies = be->stats().copies_peer;
      auto sum = a + c;  // maps differ: resharded inside the op
      std::vector<i64> want(ha.size());
      for (std::size_t i = 0; i < want.size(); ++i) {
        want[i] = ha[i] + hc[i];
      }
      EXPECT_EQ(sum.to_host(), want);
      EXPECT_EQ(sum.index_map(), a_map);
      const auto received = be->stats().copies_peer - copies;
      std::size_t parts = 0;
      for (std::size_t j = 0; j < sum.chunks().size(); ++j) {
        const auto& ch = sum.chunks()[j];
        ASSERT_GE(ch.parts.size(), 1U);
        // The part C's chunk on this device holds comes first.
        const auto [d, c_lo, c_hi] = c_ranges[static_cast<std::size_t>(ch.device)];
        const auto [d2, a_lo, a_hi] = a_ranges[static_cast<std::size_t>(ch.device)];
        EXPECT_EQ(ch.parts[0].region.dims[0].start, std::max(a_lo, c_lo)) << "chunk " << j;
        EXPECT_EQ(ch.parts[0].region.dims[0].stop, std::min(a_hi, c_hi)) << "chunk " << j;
        parts += ch.parts.size();
      }
      EXPECT_EQ(parts, sum.chunks().size() + received);  // one local part each, one per piece
    }
    be->synchronize();
    EXPECT_EQ(in_use(*be), before);
  }
}

TEST(darray_array, elementwise_ops_and_scalars_match_the_host) {
  auto be = make_host_backend(3);
  const i64 n = 300;
  std::vector<double> ha(static_cast<std::size_t>(n)), hb(ha.size());
  for (std::size_t i = 0; i < ha.size(); ++i) {
    ha[i] = 0.5 + static_cast<double>(i) * 0.01;
    hb[i] = 2.0 - static_cast<double>(i) * 0.003;
  }
  auto a = distributed_array<double>::from_host(be, ha, {n}, index_map::blocks({n}, 0, 3));
  auto b = distributed_array<double>::from_host(
      be, hb, {n}, index_map::split({n}, 0, {{2, 0, 100}, {0, 100, 250}, {1, 250, 300}}));
  const auto r1 = (a * b - a / b).to_host();
  const auto r2 = pow(a, 2.0).to_host();
  const auto r3 = (1.0 - exp(log(a))).to_host();
  const auto r4 = maximum(sin(a), cos(b)).to_host();
  const auto r5 = (-sqrt(abs(a))).to_host();
  for (std::size_t i = 0; i < ha.size(); ++i) {
    EXPECT_DOUBLE_EQ(r1[i], ha[i] * hb[i] - ha[i] / hb[i]) << i;
    EXPECT_DOUBLE_EQ(r2[i], std::pow(ha[i], 2.0)) << i;
    EXPECT_NEAR(r3[i], 1.0 - std::exp(std::log(ha[i])), 1e-12) << i;
    EXPECT_DOUBLE_EQ(r4[i], std::max(std::sin(ha[i]), std::cos(hb[i]))) << i;
    EXPECT_DOUBLE_EQ(r5[i], -std::sqrt(std::abs(ha[i]))) << i;
  }
}

TEST(darray_array, integer_semantics_are_defined) {
  auto be = make_host_backend(2);
  std::vector<i64> ha{7, -7, 5, 0};
  std::vector<i64> hb{2, 2, 0, 3};
  auto m = index_map::blocks({4}, 0, 2);
  auto a = distributed_array<i64>::from_host(be, ha, {4}, m);
  auto b = distributed_array<i64>::from_host(be, hb, {4}, m);
  EXPECT_EQ((a / b).to_host(), (std::vector<i64>{3, -3, 0, 0}));  // truncation; x / 0 = 0
  EXPECT_EQ(pow(a, b).to_host(), (std::vector<i64>{49, 49, 1, 0}));
}

// Integer pow is exact where a double is not (results beyond 2^53), saturates outside the range,
// truncates negative powers; arrays and scalars on either side agree with the reference.
TEST(darray_array, integer_pow_is_exact_and_saturates) {
  auto be = make_host_backend(2);
  const i64 max64 = std::numeric_limits<i64>::max();
  std::vector<i64> ha{3, -3, 7, -2, -2, 2, 3, -3, 10, -10, 2, -1, 0, 1, 5, -7, 0, 9};
  std::vector<i64> hb{35, 39, 22, 63, 64, 63, 40, 41, 18, 19, -1, -3, -1, -9, 0, 0, 3, 19};
  std::vector<i64> want(ha.size());
  for (std::size_t i = 0; i < ha.size(); ++i) {
    want[i] = test_support::reference_pow(ha[i], hb[i]);
  }
  EXPECT_EQ(want[0], i64{50031545098999707});     // a double gives ...704
  EXPECT_EQ(want[1], i64{-4052555153018976267});  // a double gives ...256
  const auto n = static_cast<i64>(ha.size());
  const auto m = index_map::blocks({n}, 0, 2);
  auto a = distributed_array<i64>::from_host(be, ha, {n}, m);
  auto b = distributed_array<i64>::from_host(be, hb, {n}, m);
  EXPECT_EQ(pow(a, b).to_host(), want);
  // Huge odd and even exponents of -1 and 1 (a double makes every such exponent even).
  const std::vector<i64> ones{-1, -1, 1, -1};
  const std::vector<i64> huge{max64, max64 - 1, max64, std::numeric_limits<i64>::min()};
  EXPECT_EQ(pow(distributed_array<i64>::from_host(be, ones, {4}, index_map::blocks({4}, 0, 2)),
                distributed_array<i64>::from_host(be, huge, {4}, index_map::blocks({4}, 0, 2)))
                .to_host(),
            (std::vector<i64>{-1, 1, 1, 1}));
  // Scalars on either side.
  std::vector<i64> want_right(ha.size());
  std::vector<i64> want_left(ha.size());
  for (std::size_t i = 0; i < ha.size(); ++i) {
    want_right[i] = test_support::reference_pow(ha[i], i64{37});
    want_left[i] = test_support::reference_pow(i64{-3}, hb[i]);
  }
  EXPECT_EQ(pow(a, i64{37}).to_host(), want_right);
  EXPECT_EQ(pow(i64{-3}, b).to_host(), want_left);
  // int32: every result of the range is exact in a double too; saturation and truncation agree.
  std::vector<std::int32_t> h32a{3, -3, 2, -2, -2, 46341, 0, 5};
  std::vector<std::int32_t> h32b{19, 19, 31, 31, 32, 2, -2, -2};
  std::vector<std::int32_t> want32(h32a.size());
  for (std::size_t i = 0; i < h32a.size(); ++i) {
    want32[i] = test_support::reference_pow(h32a[i], h32b[i]);
  }
  const auto m32 = index_map::blocks({8}, 0, 2);
  EXPECT_EQ(pow(distributed_array<std::int32_t>::from_host(be, h32a, {8}, m32),
                distributed_array<std::int32_t>::from_host(be, h32b, {8}, m32))
                .to_host(),
            want32);
}

TEST(darray_array, reductions_give_partial_arrays_completed_by_change_mode) {
  auto be = make_host_backend(2);
  const shape_t shape{6, 5};
  auto h = iota_values(30, 1);
  // Rows 0..3 on device 0, rows 2..5 on device 1: rows 2 and 3 are replicas.
  index_map m;
  m.add(0, box{{slice{0, 4}, slice{0, 5}}});
  m.add(1, box{{slice{2, 6}, slice{0, 5}}});
  auto x = distributed_array<i64>::from_host(be, h, shape, m);

  auto total = sum(x);
  EXPECT_EQ(total.mode(), array_mode::sum);
  EXPECT_EQ(total.shape(), shape_t{});
  EXPECT_EQ(total.to_host(), std::vector<i64>{465});  // replicas counted once
  EXPECT_EQ(total.change_mode(array_mode::replica).to_host(), std::vector<i64>{465});
  EXPECT_EQ(max(x).to_host(), std::vector<i64>{30});
  EXPECT_EQ(min(x).to_host(), std::vector<i64>{1});
  EXPECT_EQ(
      prod(distributed_array<i64>::full(be, 2, {3, 3}, index_map::blocks({3, 3}, 1, 2))).to_host(),
      std::vector<i64>{512});

  for (std::size_t axis = 0; axis < 2; ++axis) {
    std::vector<i64> want(static_cast<std::size_t>(shape[1 - axis]), 0);
    for (i64 i = 0; i < 6; ++i) {
      for (i64 j = 0; j < 5; ++j) {
        want[static_cast<std::size_t>(axis == 0 ? j : i)] += h[static_cast<std::size_t>(i * 5 + j)];
      }
    }
    auto partial = sum(x, axis);
    EXPECT_EQ(partial.mode(), array_mode::sum);
    EXPECT_EQ(partial.to_host(), want) << "axis " << axis;
    // Reduce-scatter: complete into a disjoint map.
    const i64 len = shape[1 - axis];
    auto scattered =
        partial.reshard(index_map::split({len}, 0, {{1, 0, len / 2}, {0, len / 2, len}}));
    EXPECT_EQ(scattered.mode(), array_mode::replica);
    EXPECT_EQ(scattered.to_host(), want) << "axis " << axis;
  }
}

TEST(darray_array, reductions_and_matmuls_of_nothing_give_the_identity_or_a_typed_error) {
  auto be = make_host_backend(2);
  // A zero-size 1-D array: sum and prod of nothing are 0 and 1 (NumPy's answers).
  auto empty = distributed_array<double>::from_host(be, std::vector<double>{}, {0},
                                                    index_map::blocks({0}, 0, 2));
  EXPECT_EQ(sum(empty).to_host(), std::vector<double>{0.0});
  EXPECT_EQ(sum(empty).change_mode(array_mode::replica).to_host(), std::vector<double>{0.0});
  EXPECT_EQ(prod(empty).to_host(), std::vector<double>{1.0});
  // Max and min of nothing have no identity: a typed error naming the op and the shape.
  for (const auto& [name, op] :
       {std::pair{"max", +[](const distributed_array<double>& x) { return max(x); }},
        std::pair{"min", +[](const distributed_array<double>& x) { return min(x); }}}) {
    try {
      (void)op(empty);
      ADD_FAILURE() << name << " of a zero-size array gave a value";
    } catch (const poolscope::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("(0,)"), std::string::npos) << e.what();
    }
  }
  // Shape (0, 3): over axis 0 (extent 0) three sums of nothing; over axis 1 nothing at all.
  auto rows = distributed_array<i64>::from_host(be, std::vector<i64>{}, {0, 3},
                                                index_map::blocks({0, 3}, 1, 2));
  EXPECT_EQ(sum(rows, 0).change_mode(array_mode::replica).to_host(), (std::vector<i64>{0, 0, 0}));
  EXPECT_EQ(prod(rows, 0).to_host(), (std::vector<i64>{1, 1, 1}));
  // Resharded to a map of its own, completed by the reshard.
  EXPECT_EQ(sum(rows, 0).reshard(index_map::split({3}, 0, {{1, 0, 2}, {0, 2, 3}})).to_host(),
            (std::vector<i64>{0, 0, 0}));
  EXPECT_TRUE(sum(rows, 1).to_host().empty());
  EXPECT_TRUE(max(rows, 1).to_host().empty());  // nothing to give: no identity needed
  EXPECT_THROW((void)max(rows, 0), poolscope::invalid_argument);
  // A matmul whose inner extent is 0: every element a sum of nothing.
  auto a = distributed_array<i64>::from_host(be, std::vector<i64>{}, {3, 0},
                                             index_map::grid({3, 0}, 1, 1, {{0}}));
  auto b = distributed_array<i64>::from_host(be, std::vector<i64>{}, {0, 2},
                                             index_map::grid({0, 2}, 1, 1, {{1}}));
  auto c = matmul(a, b);
  EXPECT_EQ(c.shape(), (shape_t{3, 2}));
  EXPECT_EQ(c.change_mode(array_mode::replica).to_host(), std::vector<i64>(6, 0));
  // The arrays stay usable.
  EXPECT_EQ((rows + rows).shape(), (shape_t{0, 3}));
}

// The host reference of a @ b (row-major, m x k and k x n).
std::vector<i64> host_matmul(const std::vector<i64>& a, const std::vector<i64>& b, i64 m, i64 k,
                             i64 n) {
  std::vector<i64> c(static_cast<std::size_t>(m * n), 0);
  for (i64 i = 0; i < m; ++i) {
    for (i64 p = 0; p < k; ++p) {
      for (i64 j = 0; j < n; ++j) {
        c[static_cast<std::size_t>(i * n + j)] +=
            a[static_cast<std::size_t>(i * k + p)] * b[static_cast<std::size_t>(p * n + j)];
      }
    }
  }
  return c;
}

TEST(darray_array, block_matmul_matches_the_host) {
  auto be = make_host_backend(3);
  const i64 m = 7, k = 9, n = 5;
  auto ha = iota_values(m * k, -20);
  auto hb = iota_values(k * n, 3);
  auto a = distributed_array<i64>::from_host(
      be, ha, {m, k}, index_map::grid({m, k}, 3, 2, {{0, 1}, {1, 2}, {2, 0}}));
  auto b = distributed_array<i64>::from_host(be, hb, {k, n},
                                             index_map::grid({k, n}, 2, 2, {{2, 2}, {1, 0}}));
  auto c = matmul(a, b);
  EXPECT_EQ(c.mode(), array_mode::sum);
  const std::vector<i64> want = host_matmul(ha, hb, m, k, n);
  EXPECT_EQ(c.change_mode(array_mode::replica).to_host(), want);
}

// Maps with strided chunks (replicas of every other row or column) are valid maps: matmul takes
// them on either side, a gemm per index of a strided axis.
TEST(darray_array, matmul_of_strided_chunks_matches_the_host) {
  auto be = make_host_backend(2);
  const i64 m = 5, k = 6, n = 7;
  const auto ha = iota_values(m * k, -11);
  const auto hb = iota_values(k * n, 4);
  const auto want = host_matmul(ha, hb, m, k, n);
  const auto whole_a = index_map::replicated({m, k}, {1});
  const auto whole_b = index_map::replicated({k, n}, {1});
  // b: every other row on device 0 (so device 0 takes those rows locally, the others from 1).
  index_map b_rows = whole_b;
  b_rows.add(0, box{{slice{0, k, 2}, slice{0, n}}});
  // b: every third column on device 0.
  index_map b_cols = whole_b;
  b_cols.add(0, box{{slice{0, k}, slice{1, n, 3}}});
  // a: every other column on device 0, the rest on device 1; every other row on device 1.
  index_map a_cols;
  a_cols.add(0, box{{slice{0, m}, slice{0, k, 2}}});
  a_cols.add(1, box{{slice{0, m}, slice{1, k, 2}}});
  index_map a_rows;
  a_rows.add(1, box{{slice{0, m, 2}, slice{0, k}}});
  a_rows.add(0, box{{slice{1, m, 2}, slice{0, k}}});
  const index_map a_grid = index_map::grid({m, k}, 1, 1, {{0}});
  for (const auto& [am, bm] :
       {std::pair{a_grid, b_rows}, std::pair{a_grid, b_cols}, std::pair{a_cols, whole_b},
        std::pair{a_rows, b_rows}, std::pair{whole_a, b_cols}}) {
    SCOPED_TRACE("a " + am.to_string() + " b " + bm.to_string());
    auto a = distributed_array<i64>::from_host(be, ha, {m, k}, am);
    auto b = distributed_array<i64>::from_host(be, hb, {k, n}, bm);
    auto c = matmul(a, b);
    EXPECT_EQ(c.mode(), array_mode::sum);
    EXPECT_EQ(c.to_host(), want);
    EXPECT_EQ(c.change_mode(array_mode::replica).to_host(), want);
  }
}

// Shapes whose element count fits int64 but whose bytes do not: a typed error naming the shape,
// never a buffer of the wrapped-around size that the op then overruns.
TEST(darray_array, shapes_whose_bytes_overflow_are_a_typed_error) {
  auto be = make_host_backend(2);
  const i64 huge = (i64{1} << 61) + 1;  // 8 * huge wraps around to 8 bytes
  const auto expect_named = [](const auto& fn, const std::string& what) {
    try {
      fn();
      ADD_FAILURE() << "no error for " << what;
    } catch (const poolscope::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not an invalid_argument: " << e.what();
    }
  };
  expect_named(
      [&] {
        (void)distributed_array<double>::full(be, 1.0, {huge}, index_map::blocks({huge}, 0, 2));
      },
      std::to_string(huge));
  expect_named(
      [&] {
        (void)distributed_array<double>::full(be, 1.0, {huge}, index_map::replicated({huge}, {1}));
      },
      std::to_string(huge));
  expect_named(
      [&] {
        (void)distributed_array<float>::full(be, 1.0f, {4, huge / 3 + 1},
                                             index_map::blocks({4, huge / 3 + 1}, 0, 2));
      },
      std::to_string(huge / 3 + 1));
  // Zero-size operands are cheap; their results are not: a sum over an axis of extent 0 and a
  // matmul with an inner extent of 0 (the result's extents are 3 and huge / 3).
  auto rows = distributed_array<double>::from_host(be, std::vector<double>{}, {0, huge},
                                                   index_map::blocks({0, huge}, 1, 2));
  expect_named([&] { (void)sum(rows, 0); }, std::to_string(huge));
  auto a = distributed_array<double>::from_host(be, std::vector<double>{}, {3, 0},
                                                index_map::grid({3, 0}, 1, 1, {{0}}));
  auto b = distributed_array<double>::from_host(be, std::vector<double>{}, {0, huge / 3},
                                                index_map::grid({0, huge / 3}, 1, 1, {{1}}));
  expect_named([&] { (void)matmul(a, b); }, std::to_string(huge / 3));
  // The backend stays usable.
  be->synchronize();
  EXPECT_EQ(
      sum(distributed_array<double>::full(be, 2.0, {3}, index_map::blocks({3}, 0, 2))).to_host(),
      std::vector<double>{6.0});
}

TEST(darray_array, bad_input_is_a_typed_error_and_leaves_nothing_behind) {
  auto be = make_host_backend(2);
  auto other = make_host_backend(2);
  auto h = iota_values(10);
  const auto good = index_map::blocks({10}, 0, 2);
  auto a = distributed_array<i64>::from_host(be, h, {10}, good);
  auto b =
      distributed_array<i64>::from_host(be, iota_values(12), {12}, index_map::blocks({12}, 0, 2));
  auto c = distributed_array<i64>::from_host(other, h, {10}, good);
  auto sq = distributed_array<i64>::from_host(be, iota_values(9), {3, 3},
                                              index_map::blocks({3, 3}, 0, 2));
  be->synchronize();
  const std::size_t before = in_use(*be);

  index_map uncovered;
  uncovered.add(0, box{{slice{0, 4}}});
  uncovered.add(1, box{{slice{5, 10}}});
  EXPECT_THROW((void)a.reshard(uncovered), invalid_index_map);
  index_map absent;
  absent.add(2, box{{slice{0, 10}}});
  EXPECT_THROW((void)a.reshard(absent), invalid_index_map);
  index_map oob;
  oob.add(0, box{{slice{0, 11}}});
  EXPECT_THROW((void)distributed_array<i64>::from_host(be, h, {10}, oob), invalid_index_map);
  EXPECT_THROW((void)distributed_array<i64>::from_host(be, h, {11}, good), invalid_argument);
  EXPECT_THROW((void)(a + b), invalid_index_map);
  EXPECT_THROW((void)(a + c), invalid_argument);
  EXPECT_THROW((void)sum(a, 1), invalid_argument);
  EXPECT_THROW((void)a.change_mode(array_mode::sum), logic_error);
  EXPECT_THROW((void)matmul(a, sq), invalid_index_map);
  EXPECT_THROW((void)a.reshard(good, {.split_bytes = -1}), invalid_argument);

  be->synchronize();
  EXPECT_EQ(in_use(*be), before) << "a failed operation left memory behind";
  EXPECT_EQ(a.to_host(), h);  // the operands are intact
}

// Calls with a bad argument throw a poolscope error naming the value before they enqueue any work
// (a partial array's to_host with the wrong room does not complete the array first).
TEST(darray_array, bad_reads_are_typed_errors_that_enqueue_nothing) {
  auto be = make_host_backend(2);
  const auto h = iota_values(12);
  auto a = distributed_array<i64>::from_host(be, h, {3, 4}, index_map::blocks({3, 4}, 0, 2));
  auto partial = sum(a, 1);
  be->synchronize();
  const backend_stats before = be->stats();
  try {
    (void)a.chunk_to_host(2);
    ADD_FAILURE() << "no error for chunk 2 of 2";
  } catch (const poolscope::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("chunk 2"), std::string::npos) << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a poolscope::invalid_argument: " << e.what();
  }
  std::vector<i64> room(2);
  try {
    partial.handle().to_host(room.data(), room.size());
    ADD_FAILURE() << "no error for room of 2 elements";
  } catch (const poolscope::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("room for 2"), std::string::npos) << e.what();
  }
  const backend_stats after = be->stats();
  EXPECT_EQ(after.ops, before.ops);
  EXPECT_EQ(after.copies_local + after.copies_peer, before.copies_local + before.copies_peer);
  // Both arrays stay usable.
  EXPECT_EQ(a.chunk_to_host(1), (std::vector<i64>{4, 5, 6, 7, 8, 9, 10, 11}));
  EXPECT_EQ(partial.to_host(), (std::vector<i64>{6, 22, 38}));
}

TEST(darray_array, memory_returns_to_the_pools) {
  auto be = make_host_backend(2);
  {
    auto a = distributed_array<float>::full(be, 1.5f, {1000}, index_map::blocks({1000}, 0, 2));
    auto c = distributed_array<float>::full(
        be, 2.0f, {1000}, index_map::split({1000}, 0, {{0, 0, 700}, {1, 700, 1000}}));
    auto s = sum(a * 2.0f + c.reshard(a.index_map()));
    EXPECT_EQ(s.to_host(), std::vector<float>{5000.0f});
    EXPECT_GT(in_use(*be), 0U);
  }
  be->synchronize();
  EXPECT_EQ(in_use(*be), 0U);
}

// --- destination replicas on one device ---

// The elements of `b` in a host array `h` of `shape`, in b's row-major order (what chunk_to_host
// gives for a chunk of box b).
std::vector<i64> elements_of(const std::vector<i64>& h, const shape_t& shape, const box& b) {
  std::vector<i64> out;
  if (b.empty()) {
    return out;
  }
  out.reserve(static_cast<std::size_t>(b.size()));
  std::vector<i64> at(b.rank());
  for (std::size_t a = 0; a < b.rank(); ++a) {
    at[a] = b.dims[a].start;
  }
  while (true) {
    i64 lin = 0;
    for (std::size_t a = 0; a < b.rank(); ++a) {
      lin = lin * shape[a] + at[a];
    }
    out.push_back(h[static_cast<std::size_t>(lin)]);
    std::size_t a = b.rank();
    while (a > 0) {
      --a;
      at[a] += b.dims[a].step;
      if (at[a] < b.dims[a].stop) {
        break;
      }
      at[a] = b.dims[a].start;
      if (a == 0) {
        return out;
      }
    }
  }
}

// Every chunk of `x` against the host array `h` (chunk access, so a chunk that is wrong where a
// replica on another chunk is right is caught).
void expect_chunks_match(const distributed_array<i64>& x, const std::vector<i64>& h) {
  for (std::size_t k = 0; k < x.chunks().size(); ++k) {
    EXPECT_EQ(x.chunk_to_host(k), elements_of(h, x.shape(), x.chunks()[k].region))
        << "chunk " << k << " (device " << x.chunks()[k].device << ", box "
        << x.chunks()[k].region.to_string() << ")";
  }
}

// The bytes a reshard from `from` into `to` must move, counted independently of the planner: on
// each device, the elements some chunk of `to` there holds and no chunk of `from` there does,
// each once however many chunks of `to` on that device hold it.
i64 lacking_bytes(const index_map& from, const index_map& to, i64 element_size) {
  std::map<int, std::set<test_support::point>> have;
  std::map<int, std::set<test_support::point>> need;
  for (const chunk_ref& c : from.chunks()) {
    const auto p = test_support::points(c.region);
    have[c.device].insert(p.begin(), p.end());
  }
  for (const chunk_ref& c : to.chunks()) {
    const auto p = test_support::points(c.region);
    need[c.device].insert(p.begin(), p.end());
  }
  i64 elements = 0;
  for (const auto& [device, points] : need) {
    for (const auto& e : points) {
      elements += have[device].count(e) == 0 ? 1 : 0;
    }
  }
  return elements * element_size;
}

struct overlap_case {
  const char* name;
  int devices;
  shape_t shape;
  index_map from;
  index_map to;  // two overlapping chunks on device 0 whose overlap device 0 does not hold
};

std::vector<overlap_case> overlap_cases() {
  std::vector<overlap_case> cases;
  {
    // [400:600] is in both chunks of device 0 and held by device 1 only.
    overlap_case c{"1-D on host:2", 2, {1000}, {}, {}};
    c.from = index_map::split({1000}, 0, {{0, 0, 400}, {1, 400, 1000}});
    c.to.add(0, box{{slice{0, 600}}}).add(0, box{{slice{400, 1000}}}).add(1, box{{slice{0, 500}}});
    cases.push_back(std::move(c));
  }
  {
    // Device 0: rows 1..2 of the overlap are there already, rows 3..5 come from device 1.
    // Device 1: its chunks overlap in row 0 (columns 1, 3, 5, 7), from device 0.
    overlap_case c{"2-D on host:2", 2, {6, 8}, {}, {}};
    c.from = index_map::split({6, 8}, 0, {{0, 0, 3}, {1, 3, 6}});
    c.to.add(0, box{{slice{0, 6}, slice{0, 5}}})
        .add(0, box{{slice{1, 6}, slice{3, 8}}})
        .add(1, box{{slice{0, 6}, slice{1, 8, 2}}})
        .add(1, box{{slice{0, 1}, slice{0, 8}}});
    cases.push_back(std::move(c));
  }
  {
    // The overlap [250:700] of device 0's chunks: [250:300] held there, [300:600] from device 1,
    // [600:700] from device 2; device 1 takes a strided replica, device 2 a third.
    overlap_case c{"1-D on host:3", 3, {900}, {}, {}};
    c.from = index_map::blocks({900}, 0, 3);
    c.to.add(0, box{{slice{100, 700}}})
        .add(0, box{{slice{250, 900}}})
        .add(1, box{{slice{0, 900, 2}}})
        .add(2, box{{slice{0, 300}}});
    cases.push_back(std::move(c));
  }
  return cases;
}

// A reshard into a map with overlapping chunks on one device sends what that device lacks once:
// the plan's remote bytes and the bytes the backend moved equal an independent count, piece by
// piece (split or not, pushed or pulled) and as one group, and every destination chunk holds its
// elements.
TEST(darray_array, overlapping_destination_chunks_receive_each_element_once) {
  for (const overlap_case& oc : overlap_cases()) {
    SCOPED_TRACE(oc.name);
    auto be = make_host_backend(oc.devices);
    const i64 count = element_count(oc.shape);
    const auto h = iota_values(count, 100);
    const i64 want_bytes = lacking_bytes(oc.from, oc.to, sizeof(i64));
    auto x = distributed_array<i64>::from_host(be, h, oc.shape, oc.from);
    const reshard_options variants[] = {
        {.split_bytes = 0},
        {.split_bytes = 64},
        {.split_bytes = 0, .issue_on = copy_queue::destination},
        {.how = transport::nccl},
    };
    for (const reshard_options& o : variants) {
      SCOPED_TRACE("transport " + std::to_string(static_cast<int>(o.how)) + ", split_bytes " +
                   std::to_string(o.split_bytes));
      const backend_stats before = be->stats();
      const auto y = x.reshard(oc.to, o);
      expect_chunks_match(y, h);
      EXPECT_EQ(y.to_host(), h);
      const reshard_plan& plan = *y.handle().last_reshard().plan;
      EXPECT_EQ(plan.bytes_remote, want_bytes) << plan.to_string();
      EXPECT_EQ(be->stats().bytes_peer - before.bytes_peer, static_cast<std::uint64_t>(want_bytes));
      std::int64_t link_total = 0;
      for (const auto& [from, to, bytes] : plan.link_bytes) {
        link_total += bytes;
      }
      EXPECT_EQ(link_total, want_bytes);
      // Every element of every destination chunk is accounted for once, locally or remotely.
      i64 dst_bytes = 0;
      for (const chunk_ref& c : oc.to.chunks()) {
        dst_bytes += c.region.size() * static_cast<i64>(sizeof(i64));
      }
      EXPECT_EQ(plan.bytes_remote + plan.bytes_local, dst_bytes);
    }
  }
}

// The seed example's maps of n elements on two devices: A split at n/2, C at 0.7 n (device 1
// receives [n/2, 0.7 n) from device 0).
struct seed_maps {
  shape_t shape;
  index_map a;
  index_map c;
};
seed_maps seed_example_maps(i64 n) {
  const shape_t shape{n};
  return {shape, index_map::split(shape, 0, {{0, 0, n / 2}, {1, n / 2, n}}),
          index_map::split(shape, 0, {{0, 0, n * 7 / 10}, {1, n * 7 / 10, n}})};
}

// A timeline writing a trace to `path`, without CUPTI (host devices).
profiler::timeline_options host_trace_to(const std::filesystem::path& path) {
  profiler::timeline_options options;
  options.trace_path = path.string();
  options.cupti = false;
  return options;
}

// A remote piece of at most 64 KiB is copied on the receiver's compute queue (no event between
// queues for the op that reads it to wait on); a larger one on the sender's transfer queue.
TEST(darray_array, small_pieces_are_pulled_on_the_receivers_compute_queue) {
  auto be = make_host_backend(2);
  // D3's seed shapes: device 1 receives [n/2, 0.7 n) from device 0, 0.2 n elements of 8 bytes.
  for (const i64 n : {i64{4096}, i64{40960}, i64{65536}}) {
    SCOPED_TRACE("n = " + std::to_string(n));
    const i64 cut = n * 7 / 10;
    const auto [shape, a_map, c_map] = seed_example_maps(n);
    const auto h = iota_values(n, 7);
    const auto c = distributed_array<i64>::from_host(be, h, shape, c_map);
    const auto y = c.reshard(a_map);
    EXPECT_EQ(y.to_host(), h);
    const i64 piece_bytes = (cut - n / 2) * static_cast<i64>(sizeof(i64));
    const int want_queue = piece_bytes <= (i64{64} << 10)
                               ? backend::queue_key(1, queue_kind::compute)
                               : backend::queue_key(0, queue_kind::transfer);
    int received = 0;
    for (const chunk_part& part : y.chunks()[1].parts) {
      if (part.region.dims[0].start == n / 2) {
        ++received;
        ASSERT_NE(part.ready.state(), nullptr);
        EXPECT_EQ(part.ready.state()->queue_key(), want_queue)
            << "piece of " << piece_bytes << " B";
      }
    }
    EXPECT_EQ(received, 1);
    // The op that reads it: A + C.reshard(A's map), every element checked.
    const auto a = distributed_array<i64>::from_host(be, iota_values(n), shape, a_map);
    const auto sum = (a + c.reshard(a_map)).to_host();
    for (i64 i = 0; i < n; ++i) {
      ASSERT_EQ(sum[static_cast<std::size_t>(i)], i + h[static_cast<std::size_t>(i)]) << i;
    }
  }
}

// On host devices a copy's slice is a transfer whichever queue ran it (the pulled small piece
// runs on the receiver's compute queue), traced on the receiving device, as on CUDA.
TEST(darray_array, a_pulled_piece_is_traced_as_a_transfer_on_the_receiver) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("poolscope_pull_trace_" + std::to_string(::getpid()) + ".json");
  auto be = make_host_backend(2);
  const i64 n = 4096;
  const auto [shape, a_map, c_map] = seed_example_maps(n);
  const auto c = distributed_array<i64>::from_host(be, iota_values(n), shape, c_map);
  profiler::timeline tl{host_trace_to(path)};
  tl.start();
  be->set_timeline(&tl);
  const auto y = c.reshard(a_map);
  y.wait();
  be->synchronize();
  be->set_timeline(nullptr);
  tl.stop();
  std::filesystem::remove(path);
  int copies = 0;
  for (const auto& s : tl.summary().scopes) {
    if (s.name.starts_with("darray.copy 0->1")) {
      copies += static_cast<int>(s.count);
      EXPECT_EQ(s.category, "darray.transfer") << s.name;
    }
  }
  EXPECT_EQ(copies, 1);
  EXPECT_EQ(y.to_host(), iota_values(n));
}

// In a trace of host devices each queue's thread is named for its device and kind, so that
// Perfetto's thread tracks say which is which (they were "poolscope (tid N)" alike), and a copy
// between devices counts on both, as on GPUs.
TEST(darray_array, host_traces_name_queue_threads_and_both_ends_of_a_copy) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("poolscope_thread_names_" + std::to_string(::getpid()) + ".json");
  auto be = make_host_backend(2);
  const i64 n = i64{1} << 20;  // large enough that the reshard's pieces use the transfer queues
  const auto [shape, a_map, c_map] = seed_example_maps(n);
  const auto a = distributed_array<i64>::from_host(be, iota_values(n), shape, a_map);
  const auto c = distributed_array<i64>::from_host(be, iota_values(n, 5), shape, c_map);
  {
    profiler::timeline tl{host_trace_to(path)};
    tl.start();
    be->set_timeline(&tl);
    (a + c.reshard(a_map)).wait();
    be->synchronize();
    be->set_timeline(nullptr);
    tl.stop();
  }
  std::ifstream in(path);
  ASSERT_TRUE(in.good()) << path;
  const auto trace = nlohmann::json::parse(in);
  in.close();
  const analysis::trace_summary summary = analysis::summarize_trace(path.string());
  std::filesystem::remove(path);
  std::map<std::int64_t, std::string> names;  // tid -> thread_name
  for (const auto& e : trace["traceEvents"]) {
    if (e.value("ph", "") == "M" && e.value("name", "") == "thread_name") {
      names[e["tid"].get<std::int64_t>()] = e["args"].value("name", "");
    }
  }
  std::set<std::string> queue_threads;  // the names of the threads darray's slices ran on
  for (const auto& e : trace["traceEvents"]) {
    if (e.value("ph", "") == "X" && e.value("cat", "").starts_with("darray.")) {
      const std::string name = names[e["tid"].get<std::int64_t>()];
      queue_threads.insert(name.substr(0, name.find(" (tid ")));
    }
  }
  const std::set<std::string> want{"dev0 compute", "dev1 compute", "dev0 transfer"};
  for (const std::string& w : want) {
    EXPECT_EQ(queue_threads.count(w), 1U) << w;
  }
  // Besides the queues, only this thread, which issued the ops, has darray slices.
  char self[16] = "";
  ASSERT_EQ(pthread_getname_np(pthread_self(), self, sizeof self), 0);
  for (const std::string& t : queue_threads) {
    EXPECT_TRUE(t == "dev0 compute" || t == "dev1 compute" || t == "dev0 transfer" ||
                t == "dev1 transfer" || t == self)
        << "a darray slice on thread '" << t << "'";
  }
  // The copy between the devices names both ends: transfer time on the receiver (its device)
  // and on the sender, as a CUPTI peer copy is. Nothing else moves, so both devices' transfer
  // time is that copy's.
  int copies = 0;
  for (const auto& e : trace["traceEvents"]) {
    if (e.value("ph", "") == "X" && e.value("name", "").starts_with("darray.copy 0->1")) {
      ++copies;
      EXPECT_EQ(e["args"].value("device", -9), 1) << e.dump();
      EXPECT_EQ(e["args"].value("src_device", -9), 0) << e.dump();
      EXPECT_EQ(e["args"].value("dst_device", -9), 1) << e.dump();
    }
  }
  EXPECT_EQ(copies, 1);
  ASSERT_EQ(summary.devices.size(), 2U);
  EXPECT_GT(summary.devices[0].transfer_ns, 0U);
  EXPECT_EQ(summary.devices[0].transfer_ns, summary.devices[1].transfer_ns);
}

// The second chunk's share of the overlap reads the first chunk's received storage (no copy).
TEST(darray_array, overlapping_destination_chunks_share_the_received_storage) {
  auto be = make_host_backend(2);
  const overlap_case oc = overlap_cases().front();
  const auto h = iota_values(1000);
  auto x = distributed_array<i64>::from_host(be, h, oc.shape, oc.from);
  const auto y = x.reshard(oc.to);
  ASSERT_EQ(y.chunks().size(), 3U);
  const chunk& first = y.chunks()[0];
  const chunk& second = y.chunks()[1];
  const box overlap{{slice{400, 600}}};
  bool shared = false;
  for (const chunk_part& p : second.parts) {
    if (!p.region.contains(overlap)) {
      continue;
    }
    for (const chunk_part& q : first.parts) {
      shared = shared || (q.storage == p.storage && q.region.contains(overlap));
    }
  }
  EXPECT_TRUE(shared);
  // [400:600] once (into chunk 0), [600:1000] into chunk 1, [0:400] to device 1.
  EXPECT_EQ(y.handle().last_reshard().transfers, 3U);
}

// Ops that reshard their right operand into a map with overlapping chunks on one device compute
// every chunk right, small chunks (all parts in one task) and large ones (each part as it lands).
TEST(darray_array, fused_ops_on_overlapping_destination_chunks) {
  for (const overlap_case& oc : overlap_cases()) {
    SCOPED_TRACE(oc.name);
    auto be = make_host_backend(oc.devices);
    const i64 count = element_count(oc.shape);
    const auto hx = iota_values(count, 3);
    const auto hy = iota_values(count, -1000);
    auto x = distributed_array<i64>::from_host(be, hx, oc.shape, oc.to);
    auto y = distributed_array<i64>::from_host(be, hy, oc.shape, oc.from);
    const backend_stats before = be->stats();
    const auto z = x + y;  // y resharded into x's map inside the op
    std::vector<i64> want(hx.size());
    for (std::size_t i = 0; i < want.size(); ++i) {
      want[i] = hx[i] + hy[i];
    }
    expect_chunks_match(z, want);
    EXPECT_EQ(be->stats().bytes_peer - before.bytes_peer,
              static_cast<std::uint64_t>(lacking_bytes(oc.from, oc.to, sizeof(i64))));
  }
  // Chunks of 2^20 elements and more: 1-D, device 0 holds [0:0.6n] and [0.4n:n], device 1 [0:n/2];
  // the source splits at 0.4n.
  auto be = make_host_backend(2);
  const i64 n = i64{1} << 21;
  const i64 lo = n * 2 / 5;
  const i64 hi = n * 3 / 5;
  index_map to;
  to.add(0, box{{slice{0, hi}}}).add(0, box{{slice{lo, n}}}).add(1, box{{slice{0, n / 2}}});
  const auto from = index_map::split({n}, 0, {{0, 0, lo}, {1, lo, n}});
  const auto hx = iota_values(n, 7);
  const auto hy = iota_values(n, 11);
  auto x = distributed_array<i64>::from_host(be, hx, {n}, to);
  auto y = distributed_array<i64>::from_host(be, hy, {n}, from);
  const backend_stats before = be->stats();
  const auto z = x + y.reshard(to, {.split_bytes = (n / 8) * 8});
  std::vector<i64> want(hx.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    want[i] = hx[i] + hy[i];
  }
  expect_chunks_match(z, want);
  // Device 0 lacks [lo:n], device 1 [0:lo].
  EXPECT_EQ(be->stats().bytes_peer - before.bytes_peer,
            static_cast<std::uint64_t>((n - lo) + lo) * sizeof(i64));
}

// [0, n/4) on device 0; [n/4, n/2) and [n/2, n) as two chunks on device 1 (the issue-order
// tests below).
index_map quarter_then_two_chunks(i64 n) {
  index_map m;
  m.add(0, box{{slice{0, n / 4}}})
      .add(1, box{{slice{n / 4, n / 2}}})
      .add(1, box{{slice{n / 2, n}}});
  return m;
}

// A fused op enqueues compute on the data already in place once every link's first copy is
// enqueued, not after the host has issued every piece, and only that compute: what the first
// pieces bring is computed after the rest is issued. Two host devices; x's map puts [0, n/4) on
// device 0 and [n/4, n/2), [n/2, n) in two chunks on device 1; y holds [0, 3n/4) on device 0 and
// the rest on device 1, so device 0's transfer queue sends two pieces, each into its own landing
// buffer on device 1. A hook on the calling thread notes the backend's enqueued compute tasks at
// each allocation: the three output chunks and the first landing buffer come before any compute,
// the second landing buffer after the two adds of what is in place ([0, n/4) on device 0,
// [3n/4, n) on device 1; every chunk has 2^20 elements or more, so each part is its own task),
// and not the add of the first piece.
TEST(darray_array, fused_op_computes_what_is_in_place_while_the_first_pieces_move) {
  struct ops_at_malloc final : hooks::hook {
    const backend* be = nullptr;
    std::vector<std::uint64_t> ops;
    void on_event(const hooks::event& e) noexcept override {
      if (e.kind == hooks::event_kind::pool_malloc && e.phase != hooks::event_phase::pre &&
          e.ptr != nullptr) {
        ops.push_back(be->stats().ops);
      }
    }
  };
  auto be = make_host_backend(2);
  const i64 n = i64{1} << 22;
  const shape_t shape{n};
  const index_map x_map = quarter_then_two_chunks(n);
  const auto y_map = index_map::split(shape, 0, {{0, 0, n * 3 / 4}, {1, n * 3 / 4, n}});
  const auto hx = iota_values(n, 3);
  const auto hy = iota_values(n, -7);
  const auto x = distributed_array<i64>::from_host(be, hx, shape, x_map);
  const auto y = distributed_array<i64>::from_host(be, hy, shape, y_map);
  be->synchronize();
  ops_at_malloc h;
  h.be = be.get();
  const std::uint64_t before = be->stats().ops;
  std::optional<distributed_array<i64>> sum;
  {
    const hooks::scoped_hook installed{h, hooks::scope::thread};
    sum.emplace(x + y);
  }
  const std::vector<i64> z = sum->to_host();
  const std::vector<std::uint64_t> want{before, before, before, before, before + 2};
  EXPECT_EQ(h.ops, want);
  EXPECT_EQ(be->stats().ops - before, 4U);  // a task per part: two in place, two received
  for (i64 i = 0; i < n; ++i) {
    ASSERT_EQ(z[static_cast<std::size_t>(i)],
              hx[static_cast<std::size_t>(i)] + hy[static_cast<std::size_t>(i)])
        << i;
  }
}

// An element-wise op enqueues the first part of every large chunk before the second of any: a
// chunk whose data is all in place is not queued behind another chunk's wait for a copy on the
// same device. Two host devices; x's map has chunk 1 = [n/4, n/2) and chunk 2 = [n/2, n) on
// device 1; y is c resharded into x's map while device 0's transfer queue is held, so chunk 1's
// part [n/4, 3n/8) (from device 0) cannot land. Device 1's compute queue then holds chunk 1's
// in-place part, chunk 2's, and only then the wait for the copy: chunk 2's result completes
// while the copy is still held (in chunk order, it would wait behind that wait). For a binary
// op (x + y) and a unary one (-y), each on a backend of its own.
TEST(darray_array, chunks_in_place_are_not_queued_behind_another_chunks_copy) {
  const i64 n = i64{1} << 22;
  const shape_t shape{n};
  const index_map x_map = quarter_then_two_chunks(n);
  const auto c_map = index_map::split(shape, 0, {{0, 0, n * 3 / 8}, {1, n * 3 / 8, n}});
  const auto hx = iota_values(n, 5);
  const auto hc = iota_values(n, -9);
  for (const bool unary : {false, true}) {
    SCOPED_TRACE(unary ? "-y" : "x + y");
    auto be = make_host_backend(2);
    const auto x = distributed_array<i64>::from_host(be, hx, shape, x_map);
    const auto c = distributed_array<i64>::from_host(be, hc, shape, c_map);
    be->synchronize();
    auto held = std::make_shared<test_support::gate>();
    struct opens_at_exit {
      test_support::gate& g;
      ~opens_at_exit() { g.open(); }  // a failed assertion must not leave the queue held
    } release{*held};
    be->wait(0, queue_kind::transfer, event(held));
    const auto y = c.reshard(x_map);
    const auto z = unary ? -y : x + y;
    ASSERT_EQ(z.chunks().size(), 3U);
    ASSERT_EQ(z.chunks()[2].parts.size(), 1U);
    const event whole_chunk = z.chunks()[2].parts[0].ready;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!whole_chunk.ready() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    const bool done_while_held = whole_chunk.ready();
    const bool copy_still_held = !y.chunks()[1].parts.back().ready.ready();
    held->open();
    EXPECT_TRUE(done_while_held) << "chunk 2's op waited behind chunk 1's copy";
    EXPECT_TRUE(copy_still_held);
    const auto got = z.to_host();
    for (i64 i = 0; i < n; ++i) {
      const auto k = static_cast<std::size_t>(i);
      ASSERT_EQ(got[k], unary ? -hc[k] : hx[k] + hc[k]) << i;
    }
  }
}

// matmul's row requests: two row blocks of `a` on device 0 need the same rows of `b` (held by
// device 1 alone): they cross once, and the second block's request reads them where they landed.
TEST(darray_array, matmul_sends_the_rows_of_b_once_per_device) {
  auto be = make_host_backend(2);
  const i64 m = 4, k = 6, n = 3;
  const auto ha = iota_values(m * k, -5);
  const auto hb = iota_values(k * n, 2);
  auto a = distributed_array<i64>::from_host(be, ha, {m, k},
                                             index_map::split({m, k}, 0, {{0, 0, 2}, {0, 2, 4}}));
  auto b = distributed_array<i64>::from_host(be, hb, {k, n}, index_map::replicated({k, n}, {1}));
  const backend_stats before = be->stats();
  auto c = matmul(a, b);
  const std::vector<i64> want = host_matmul(ha, hb, m, k, n);
  EXPECT_EQ(c.change_mode(array_mode::replica).to_host(), want);
  const auto b_bytes = static_cast<std::uint64_t>(k * n) * sizeof(i64);
  EXPECT_EQ(c.handle().last_reshard().plan->bytes_remote, static_cast<std::int64_t>(b_bytes))
      << c.handle().last_reshard().plan->to_string();
  EXPECT_EQ(be->stats().bytes_peer - before.bytes_peer, b_bytes);  // was twice b
}

// --- randomized ---

// A random map of `shape` over `devices`: a partition along a random axis (so every element is
// covered), plus random strided replicas.
index_map random_map(std::mt19937_64& rng, const shape_t& shape, int devices) {
  auto pick = [&](i64 lo, i64 hi) { return std::uniform_int_distribution<i64>(lo, hi)(rng); };
  index_map m;
  const auto axis = static_cast<std::size_t>(pick(0, static_cast<i64>(shape.size()) - 1));
  const i64 parts = pick(1, std::min<i64>(4, shape[axis]));
  std::vector<i64> cuts{0, shape[axis]};
  while (static_cast<i64>(cuts.size()) < parts + 1) {
    cuts.push_back(pick(1, shape[axis] - 1));
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  }
  for (std::size_t i = 0; i + 1 < cuts.size(); ++i) {
    box b = box::full(shape);
    b.dims[axis] = slice{cuts[i], cuts[i + 1]};
    m.add(static_cast<int>(pick(0, devices - 1)), b);
  }
  const i64 replicas = pick(0, 2);
  for (i64 r = 0; r < replicas; ++r) {
    box b;
    for (i64 extent : shape) {
      const i64 start = pick(0, extent - 1);
      const i64 stop = pick(start + 1, extent);
      b.dims.push_back(slice{start, stop, pick(1, 3)});
    }
    m.add(static_cast<int>(pick(0, devices - 1)), b);
  }
  return m;
}

// The same randomized sequences on host:2..4 and, when GPUs are present, on the CUDA backend.
class darray_random : public ::testing::TestWithParam<std::string> {};

TEST_P(darray_random, reshards_and_ops_match_the_host) {
  std::shared_ptr<backend> be;
  // "<spec>+issue": every device's share of an elementwise op from a thread of its own;
  // "<spec>+noissue": all from the calling thread; "<spec>+nographs": kernels launched plainly.
  std::string spec = GetParam();
  backend_options options;
  if (spec.ends_with("+nographs")) {
    spec.resize(spec.size() - 9);
    options.kernel_graphs = false;
  }
  if (spec.ends_with("+issue")) {
    spec.resize(spec.size() - 6);
    options.issue_threads = 8;
  } else if (spec.ends_with("+noissue")) {
    spec.resize(spec.size() - 8);
    options.issue_threads = 0;
  }
  try {
    be = make_backend(spec, options);
    if (options.issue_threads > 0) {
      ASSERT_EQ(be->issue_threads(), static_cast<std::size_t>(be->device_count() - 1));
    }
  } catch (const device_unavailable& e) {
    GTEST_SKIP() << "no GPU for " << GetParam() << ": " << e.what();
  }
  const int devices = be->device_count();
  // POOLSCOPE_TEST_SEED replays a printed seed; without it every run draws a new one.
  const auto seed = std::getenv("POOLSCOPE_TEST_SEED") != nullptr
                        ? test_support::test_seed()
                        : static_cast<std::uint64_t>(std::random_device{}()) ^
                              (static_cast<std::uint64_t>(devices) << 32);
  SCOPED_TRACE("seed " + std::to_string(seed) + " (" + be->name() + ")");
  std::printf("darray_random seed %llu on %s\n", static_cast<unsigned long long>(seed),
              be->name().c_str());
  std::mt19937_64 rng(seed);
  auto pick = [&](i64 lo, i64 hi) { return std::uniform_int_distribution<i64>(lo, hi)(rng); };
  const bool verbose = std::getenv("POOLSCOPE_TEST_VERBOSE") != nullptr;
  // Pieces that took a region another destination chunk on their device received (overlapping
  // destination chunks: the region crossed once).
  std::size_t reused = 0;
  const auto count_reused = [&](const array_handle& h) {
    for (const piece& p : h.last_reshard().plan->pieces) {
      reused += p.from_dst ? 1 : 0;
    }
  };
  for (int round = 0; round < 12; ++round) {
    shape_t shape;
    const i64 rank = pick(1, 3);
    for (i64 r = 0; r < rank; ++r) {
      shape.push_back(pick(1, rank == 1 ? 40 : 9));
    }
    const i64 count = element_count(shape);
    std::vector<i64> hx(static_cast<std::size_t>(count)), hy(hx.size());
    for (std::size_t i = 0; i < hx.size(); ++i) {
      hx[i] = pick(-50, 50);
      hy[i] = pick(-50, 50);
    }
    auto x = distributed_array<i64>::from_host(be, hx, shape, random_map(rng, shape, devices));
    auto y = distributed_array<i64>::from_host(be, hy, shape, random_map(rng, shape, devices));
    for (int step = 0; step < 6; ++step) {
      SCOPED_TRACE("round " + std::to_string(round) + " step " + std::to_string(step) + " x " +
                   x.index_map().to_string() + " y " + y.index_map().to_string());
      const i64 what = pick(0, 5);
      if (verbose) {  // which step a hang or a crash stopped at
        std::fprintf(stderr, "round %d step %d op %lld x %s y %s\n", round, step,
                     static_cast<long long>(what), x.index_map().to_string().c_str(),
                     y.index_map().to_string().c_str());
      }
      switch (what) {
        case 0: {
          // Piece by piece or as one group (NCCL on GPUs), split or not.
          x = x.reshard(random_map(rng, shape, devices),
                        {.how = pick(0, 1) == 1 ? transport::nccl : transport::automatic,
                         .split_bytes = pick(0, 1) * 64});
          count_reused(x.handle());
          break;
        }
        case 1: {
          x = x + y;
          count_reused(x.handle());
          for (std::size_t i = 0; i < hx.size(); ++i) {
            hx[i] += hy[i];
          }
          break;
        }
        case 2: {
          x = y * x - i64{3};
          for (std::size_t i = 0; i < hx.size(); ++i) {
            hx[i] = hy[i] * hx[i] - 3;
          }
          break;
        }
        case 3: {
          const auto moved = y.reshard(random_map(rng, shape, devices));
          count_reused(moved.handle());
          expect_chunks_match(moved, hy);
          ASSERT_FALSE(HasFailure());
          x = maximum(-x, moved);
          for (std::size_t i = 0; i < hx.size(); ++i) {
            hx[i] = std::max(-hx[i], hy[i]);
          }
          break;
        }
        case 4: {
          const auto axis = static_cast<std::size_t>(pick(0, rank - 1));
          auto s = sum(x, axis);
          shape_t rs = shape;
          rs.erase(rs.begin() + static_cast<std::ptrdiff_t>(axis));
          std::vector<i64> want(static_cast<std::size_t>(element_count(rs)), 0);
          // Row-major index arithmetic for the reference.
          std::vector<i64> idx(shape.size(), 0);
          for (std::size_t lin = 0; lin < hx.size(); ++lin) {
            i64 rem = static_cast<i64>(lin);
            for (std::size_t d = shape.size(); d-- > 0;) {
              idx[d] = rem % shape[d];
              rem /= shape[d];
            }
            i64 out = 0;
            for (std::size_t d = 0; d < shape.size(); ++d) {
              if (d != axis) {
                out = out * shape[d] + idx[d];
              }
            }
            want[static_cast<std::size_t>(out)] += hx[lin];
          }
          ASSERT_EQ(s.to_host(), want);
          ASSERT_EQ(s.change_mode(array_mode::replica).to_host(), want);
          break;
        }
        default: {
          auto total = max(x);
          ASSERT_EQ(total.to_host(), std::vector<i64>{*std::max_element(hx.begin(), hx.end())});
          break;
        }
      }
      ASSERT_EQ(x.to_host(), hx);
      expect_chunks_match(x, hx);  // each replica, not only the last one to_host writes
      ASSERT_FALSE(HasFailure());
    }
  }
  std::printf("darray_random: %zu pieces took a region another chunk on their device received\n",
              reused);
  be->synchronize();
}

INSTANTIATE_TEST_SUITE_P(backends, darray_random,
                         ::testing::Values("host:2", "host:3", "host:4", "host:3+issue", "cuda",
                                           "cuda+issue", "cuda+nographs"),
                         [](const auto& p) {
                           std::string name = p.param;
                           std::erase(name, ':');
                           std::replace(name.begin(), name.end(), '+', '_');
                           return name;
                         });

}  // namespace
}  // namespace poolscope::darray
