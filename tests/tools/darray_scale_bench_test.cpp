// The darray scale benchmark's parts rows on one device (bench/src/darray_scale_bench.cpp): the
// array b of each row really holds P parts per chunk, and the parts its ops visit stay within
// c * P * log2 P (the work counted, never the time). Two devices: tests/darray/scale_test.cpp
// checks the same arrays' values and counts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "poolscope/bench/darray_scale_bench.hpp"

namespace {

TEST(darray_scale_bench, one_device_rows_hold_p_parts_and_visit_p_log_p) {
  poolscope::bench::darray_scale_options o;
  o.devices = "host:1";
  o.n = 4096;
  o.max_parts = 1024;
  o.repeat = 1;
  o.only = {"parts"};
  const auto rep = poolscope::bench::run_darray_scale_bench(o);
  ASSERT_EQ(rep.parts.size(), 6U);  // P = 1, 4, ..., 1024
  std::int64_t want = 1;
  for (const auto& r : rep.parts) {
    EXPECT_EQ(r.parts, want);
    const double p = static_cast<double>(want);
    const double bound = 8.0 * p * std::max(1.0, std::log2(p)) + 256.0;
    EXPECT_GE(static_cast<double>(r.add_visited), p) << "b + b reads each of its parts";
    EXPECT_LE(static_cast<double>(r.add_visited), bound) << "P = " << want;
    EXPECT_LE(static_cast<double>(r.sum_visited), bound) << "P = " << want;
    want *= 4;
  }
  EXPECT_NE(rep.text.find("summary: b + b at P = 1024"), std::string::npos) << rep.text;
}

}  // namespace
