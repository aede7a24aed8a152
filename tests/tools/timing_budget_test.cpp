// bench/timing.hpp's time budget: a budget too long for the clock leaves the operation count alone
// to end the run (converting 1e300 s to nanoseconds used to overflow, an undefined conversion that
// ended the run after its first batches), and a budget that is not positive ends it at once.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#if __has_include("poolscope/bench/timing.hpp")
#include "poolscope/bench/timing.hpp"

namespace {

using poolscope::bench::batch_limits;
using poolscope::bench::time_in_batches;

TEST(timing_budget, a_budget_beyond_the_clock_runs_to_max_ops) {
  for (const double budget : {1e300, 1.8e10, 1e12, std::numeric_limits<double>::infinity()}) {
    SCOPED_TRACE(budget);
    std::size_t calls = 0;
    const batch_limits limits{
        .max_ops = 20000, .budget_s = budget, .min_batches = 1, .warmup_ops = 1};
    const auto t = time_in_batches([&](std::size_t) { ++calls; }, limits, 0.0);
    // Every batch that fits under max_ops ran: fewer than one batch short of it.
    EXPECT_GT(t.ops + t.batch, limits.max_ops) << "ops " << t.ops << ", batch " << t.batch;
    EXPECT_LE(t.ops, limits.max_ops);
  }
}

TEST(timing_budget, deadline_after_saturates_and_ignores_bad_budgets) {
  using poolscope::bench::deadline_after;
  constexpr std::uint64_t end = std::numeric_limits<std::uint64_t>::max();
  EXPECT_EQ(deadline_after(100, 1.0), 100 + 1000000000ULL);
  EXPECT_EQ(deadline_after(100, 1e300), end);
  EXPECT_EQ(deadline_after(end - 10, 1.0), end);
  EXPECT_EQ(deadline_after(100, std::numeric_limits<double>::infinity()), end);
  EXPECT_EQ(deadline_after(100, 0.0), 100U);
  EXPECT_EQ(deadline_after(100, -5.0), 100U);
  EXPECT_EQ(deadline_after(100, std::nan("")), 100U);
}

}  // namespace

#endif
