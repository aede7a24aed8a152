// Chunks of many parts on one device: an array placed in P blocks on device 0 and resharded to
// one block there arrives as P local pieces, which the executor neither copies nor coalesces, so
// the new chunk holds P parts, each reading its source chunk's buffer; ops on it visit
// O(P log P) parts (backend_stats::parts_visited: the work counted, not timed) and give the
// host's values. (The one-device parts rows of bench/src/darray_scale_bench.cpp are this array.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "poolscope/darray/distributed_array.hpp"

namespace poolscope::darray {
namespace {

using i64 = std::int64_t;

// As tests/darray/scale_test.cpp bounds it: c * P * log2 P plus the fixed work of an op.
double bound(double p) {
  return 8.0 * p * std::max(1.0, std::log2(p)) + 256.0;
}

index_map blocks_on_device_0(i64 n, i64 p) {
  index_map m;
  for (i64 i = 0; i < p; ++i) {
    m.add(0, box{{slice{n * i / p, n * (i + 1) / p}}});
  }
  return m;
}

TEST(darray_one_device_parts, local_pieces_leave_p_parts_that_ops_read_in_p_log_p) {
  auto be = make_host_backend(1);
  const i64 n = 3 * 4096 + 5;  // blocks of unequal sizes
  const shape_t shape{n};
  std::vector<i64> h(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < h.size(); ++i) {
    h[i] = static_cast<i64>(i * 11 % 1000) - 500;
  }
  i64 total = 0;
  std::vector<i64> twice;
  std::vector<i64> thrice;
  for (const i64 v : h) {
    total += v;
    twice.push_back(2 * v);
    thrice.push_back(3 * v);
  }
  const index_map one = index_map::blocks(shape, 0, 1);
  const auto a = distributed_array<i64>::from_host(be, h, shape, one);
  for (const i64 p : {1, 4, 16, 64, 256, 1024, 4096}) {
    SCOPED_TRACE("P = " + std::to_string(p));
    const auto x = distributed_array<i64>::from_host(be, h, shape, blocks_on_device_0(n, p));
    const std::uint64_t copies_before = be->stats().copies_local;
    const auto b = x.reshard(one);
    b.wait();
    // P local pieces, no copy: each part reads its source chunk's buffer.
    EXPECT_EQ(b.handle().last_reshard().transfers, 0U);
    EXPECT_EQ(be->stats().copies_local, copies_before);
    ASSERT_EQ(b.chunks().size(), 1U);
    const auto& parts = b.chunks()[0].parts;
    ASSERT_EQ(static_cast<i64>(parts.size()), p);
    std::set<const void*> buffers;
    for (const auto& part : parts) {
      buffers.insert(part.storage.get());
    }
    EXPECT_EQ(static_cast<i64>(buffers.size()), p);

    // Each op: its values against the host's, and the parts it visited.
    const double most = bound(static_cast<double>(p));
    const auto visits = [&](const std::function<distributed_array<i64>()>& op,
                            const std::vector<i64>& want, const char* what) {
      const std::uint64_t before = be->stats().parts_visited;
      const distributed_array<i64> r = op();
      r.wait();
      EXPECT_LE(static_cast<double>(be->stats().parts_visited - before), most) << what;
      EXPECT_TRUE(r.to_host() == want) << what << " differs from the host's values";
    };
    visits([&] { return b + b; }, twice, "b + b");
    visits([&] { return b + a; }, twice, "b + a");
    visits([&] { return b * i64{3}; }, thrice, "b * 3");
    visits([&] { return sum(b).change_mode(array_mode::replica); }, {total}, "sum(b)");
  }
}

}  // namespace
}  // namespace poolscope::darray
