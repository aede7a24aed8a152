// Overlap analysis on synthetic timelines with hand-computed answers and a randomized comparison
// against a brute-force model (unit time steps). (`trace summary` on written traces:
// trace_summary_test.cpp.)
#include "poolscope/profiler/overlap.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

namespace {

using poolscope::profiler::activity_class;
using poolscope::profiler::classify_category;
using poolscope::profiler::device_overlap;
using poolscope::profiler::intersect_intervals;
using poolscope::profiler::interval;
using poolscope::profiler::merge_intervals;
using poolscope::profiler::overlap_analyzer;
using poolscope::profiler::total_length;

TEST(overlap, merge_and_intersect) {
  const auto m = merge_intervals({{5, 7}, {1, 3}, {2, 4}, {4, 5}, {10, 10}, {12, 11}, {8, 9}});
  EXPECT_EQ(m, (std::vector<interval>{{1, 7}, {8, 9}}));
  EXPECT_EQ(total_length(m), 7U);
  const std::vector<interval> a{{0, 10}, {20, 30}};
  const std::vector<interval> b{{5, 25}, {28, 40}};
  EXPECT_EQ(intersect_intervals(a, b), (std::vector<interval>{{5, 10}, {20, 25}, {28, 30}}));
  EXPECT_TRUE(intersect_intervals(a, {}).empty());
}

TEST(overlap, classes_from_categories_and_names) {
  EXPECT_EQ(classify_category("kernel"), activity_class::compute);
  EXPECT_EQ(classify_category("darray.compute"), activity_class::compute);
  EXPECT_EQ(classify_category("memcpy"), activity_class::transfer);
  EXPECT_EQ(classify_category("nccl"), activity_class::transfer);
  EXPECT_EQ(classify_category("darray.transfer"), activity_class::transfer);
  EXPECT_EQ(classify_category("memset"), activity_class::other);
  EXPECT_FALSE(classify_category("user").has_value());
  EXPECT_FALSE(classify_category("cuda_api").has_value());
  EXPECT_TRUE(poolscope::profiler::is_nccl_kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)"));
  EXPECT_TRUE(poolscope::profiler::is_nccl_kernel("ncclKernel_SendRecv"));
  EXPECT_FALSE(poolscope::profiler::is_nccl_kernel("my_ncclDevKernel"));
}

// One device, hand-computed:
//   compute:  [0,100) on stream A, [50,150) on stream B (concurrent) -> union [0,150) = 150
//   transfer: [120,200) copy, [300,350) NCCL kernel              -> union 80 + 50 = 130
//   other:    [400,410) memset                                    -> 10
//   both:     [120,150) = 30 -> ratio 30/130
//   busy:     [0,200) + [300,350) + [400,410) = 260; window [0,1000) -> idle 740
TEST(overlap, one_device_by_hand) {
  overlap_analyzer a;
  a.add(0, activity_class::compute, 0, 100);
  a.add(0, activity_class::compute, 50, 150);
  a.add(0, activity_class::transfer, 120, 200);
  a.add(0, activity_class::transfer, 300, 350);
  a.add(0, activity_class::other, 400, 410);
  a.set_window(0, 1000);
  const auto r = a.analyze();
  ASSERT_EQ(r.size(), 1U);
  const device_overlap& d = r[0];
  EXPECT_EQ(d.device, 0);
  EXPECT_EQ(d.compute_ns, 150U);
  EXPECT_EQ(d.transfer_ns, 130U);
  EXPECT_EQ(d.other_ns, 10U);
  EXPECT_EQ(d.both_ns, 30U);
  EXPECT_DOUBLE_EQ(d.overlap_ratio, 30.0 / 130.0);
  EXPECT_EQ(d.busy_ns, 260U);
  EXPECT_EQ(d.window_ns, 1000U);
  EXPECT_EQ(d.idle_ns, 740U);
  EXPECT_EQ(d.first_ns, 0);
  EXPECT_EQ(d.last_ns, 410);
  EXPECT_EQ(d.compute_ops, 2U);
  EXPECT_EQ(d.transfer_ops, 2U);
  EXPECT_EQ(d.other_ops, 1U);
}

// Two devices, one fully overlapped, one not at all; host slices with darray categories on a
// third (device -1); the window is the span of everything when none is set.
TEST(overlap, devices_are_separate) {
  overlap_analyzer a;
  a.add(0, activity_class::compute, 1000, 2000);
  a.add(0, activity_class::transfer, 1200, 1800);  // inside the kernel: ratio 1
  a.add(1, activity_class::compute, 1000, 1500);
  a.add(1, activity_class::transfer, 1500, 2500);  // touching only: ratio 0
  a.add(-1, activity_class::transfer, 3000, 4000);
  const auto r = a.analyze();
  ASSERT_EQ(r.size(), 3U);
  EXPECT_EQ(r[0].device, -1);
  EXPECT_EQ(r[1].device, 0);
  EXPECT_EQ(r[2].device, 1);
  EXPECT_DOUBLE_EQ(r[1].overlap_ratio, 1.0);
  EXPECT_EQ(r[1].both_ns, 600U);
  EXPECT_EQ(r[1].busy_ns, 1000U);
  EXPECT_DOUBLE_EQ(r[2].overlap_ratio, 0.0);
  EXPECT_EQ(r[2].both_ns, 0U);
  EXPECT_EQ(r[2].busy_ns, 1500U);
  for (const auto& d : r) {
    EXPECT_EQ(d.window_ns, 3000U);  // [1000, 4000)
  }
  EXPECT_EQ(r[1].idle_ns, 2000U);
  EXPECT_EQ(r[2].idle_ns, 1500U);
  EXPECT_EQ(r[0].compute_ns, 0U);
  EXPECT_DOUBLE_EQ(r[0].overlap_ratio, 0.0);
}

TEST(overlap, no_transfer_means_ratio_zero_and_empty_intervals_count_as_ops) {
  overlap_analyzer a;
  a.add(3, activity_class::compute, 10, 20);
  a.add(3, activity_class::transfer, 30, 30);  // empty: an op, no time
  const auto r = a.analyze();
  ASSERT_EQ(r.size(), 1U);
  EXPECT_EQ(r[0].transfer_ops, 1U);
  EXPECT_EQ(r[0].transfer_ns, 0U);
  EXPECT_DOUBLE_EQ(r[0].overlap_ratio, 0.0);
  EXPECT_TRUE(overlap_analyzer{}.analyze().empty());
}

TEST(overlap, activity_outside_the_window_is_not_idle_time) {
  overlap_analyzer a;
  a.add(0, activity_class::compute, 0, 50);
  a.add(0, activity_class::compute, 90, 200);
  a.set_window(40, 100);  // busy inside: [40,50) + [90,100) = 20
  const auto r = a.analyze();
  EXPECT_EQ(r[0].window_ns, 60U);
  EXPECT_EQ(r[0].busy_ns, 160U);
  EXPECT_EQ(r[0].idle_ns, 40U);
}

// Random intervals on a small integer domain against a per-step model; small compaction
// thresholds exercise the in-place merging.
TEST(overlap, random_against_unit_step_model) {
  const auto seed = static_cast<unsigned>(std::random_device{}());
  std::printf("overlap random seed %u\n", seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  for (int round = 0; round < 20; ++round) {
    constexpr int domain = 2000;
    overlap_analyzer a(std::size_t{1} << 20, 16);
    std::vector<std::array<bool, 3>> busy(static_cast<std::size_t>(domain));
    std::uniform_int_distribution<int> start(0, domain - 1);
    std::uniform_int_distribution<int> len(0, 60);
    std::uniform_int_distribution<int> cls(0, 2);
    const int n = 50 + round * 20;
    for (int i = 0; i < n; ++i) {
      const int b = start(rng);
      const int e = std::min(domain, b + len(rng));
      const int c = cls(rng);
      a.add(0, static_cast<activity_class>(c), b, e);
      for (int t = b; t < e; ++t) {
        busy[static_cast<std::size_t>(t)][static_cast<std::size_t>(c)] = true;
      }
    }
    a.set_window(0, domain);
    std::uint64_t compute = 0, transfer = 0, other = 0, both = 0, any = 0;
    for (const auto& s : busy) {
      compute += s[0] ? 1 : 0;
      transfer += s[1] ? 1 : 0;
      other += s[2] ? 1 : 0;
      both += s[0] && s[1] ? 1 : 0;
      any += s[0] || s[1] || s[2] ? 1 : 0;
    }
    const auto r = a.analyze();
    ASSERT_EQ(r.size(), 1U);
    EXPECT_EQ(r[0].compute_ns, compute);
    EXPECT_EQ(r[0].transfer_ns, transfer);
    EXPECT_EQ(r[0].other_ns, other);
    EXPECT_EQ(r[0].both_ns, both);
    EXPECT_EQ(r[0].busy_ns, any);
    EXPECT_EQ(r[0].idle_ns, domain - any);
    EXPECT_EQ(r[0].compute_ops + r[0].transfer_ops + r[0].other_ops, static_cast<std::uint64_t>(n));
  }
}

TEST(overlap, interval_cap_counts_what_it_leaves_out) {
  overlap_analyzer a(4, 16);
  for (int i = 0; i < 10; ++i) {
    a.add(0, activity_class::compute, i * 10, i * 10 + 5);  // disjoint: nothing merges
  }
  EXPECT_EQ(a.held(), 4U);
  EXPECT_EQ(a.dropped(), 6U);
  EXPECT_EQ(a.analyze()[0].compute_ns, 20U);
  EXPECT_EQ(a.analyze()[0].compute_ops, 10U);
}

}  // namespace
