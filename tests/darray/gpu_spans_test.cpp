// gpu_spans' clock, on the CPU: a GPU event's place on the host clock from two anchors of its GPU
// (clock_map), against a model of a GPU clock running at a steady rate of its own (a few ppm off
// the host's, as measured: docs/perf.md, "GPU clocks against the host's") and anchors read within
// their stated errors. The spans themselves are timed on GPUs (ranks_gpu_test.cpp, and the merged
// traces' flows in scripts/gpu-check.sh).
#include <gtest/gtest.h>

#include <cmath>
#include <deque>
#include <random>
#include <vector>

#include "gpu_spans.hpp"

namespace poolscope::darray::detail {
namespace {

// A GPU clock against the host's: GPU ns g (from the first anchor) is host ns origin + g * rate.
struct model_clock {
  double origin = 0;
  double rate = 1;
  [[nodiscard]] double host(double g) const { return origin + g * rate; }
};

TEST(gpu_spans, exact_anchors_place_a_drifting_clock_exactly) {
  const double origin = 1.3e15;  // two weeks of uptime
  for (const double ppm : {-3.85, -1.2, 0.0, 20.0}) {
    const model_clock clock{origin, 1 + ppm * 1e-6};
    const double ab = 1e9;  // anchors a GPU second apart
    const host_reading a{clock.host(0), 0};
    const host_reading b{clock.host(ab), 0};
    for (const double g : {-2e5, 0.0, 3e5, 5e8, 1e9}) {
      const host_reading got = clock_map(a, b, ab, g);
      EXPECT_NEAR(got.ns, clock.host(g), 0.5) << ppm << " ppm, " << g << " ns";
      EXPECT_EQ(got.error_ns, 0) << ppm << " ppm, " << g << " ns";
    }
  }
}

TEST(gpu_spans, one_anchor_alone_counts_at_the_host_rate) {
  const host_reading a{1e12, 1500};
  for (const double ab : {0.0, -10.0}) {
    const host_reading got = clock_map(a, {5e12, 9000}, ab, 2e6);
    EXPECT_EQ(got.ns, 1e12 + 2e6);
    EXPECT_EQ(got.error_ns, 1500);
  }
}

// Anchors read up to their errors off the model, drift rates up to 50 ppm either way, anchors 1 ms
// to 10 s apart and events from a fifth of that before the first anchor to a fifth after the
// second: every placement is within its stated error, which between the anchors is at most the
// larger anchor error. Placing by one anchor at the host's rate misses by the drift, which over a
// second exceeds the anchors' errors.
TEST(gpu_spans, placements_stay_within_their_stated_error) {
  std::mt19937_64 rng(20261129);
  std::uniform_real_distribution<double> unit(0, 1);
  int drift_exceeds_errors = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    const model_clock clock{1e15 * unit(rng), 1 + (unit(rng) * 100 - 50) * 1e-6};
    const double ab = std::pow(10.0, 6 + 4 * unit(rng));
    const double ea = 10'000 * unit(rng);
    const double eb = 10'000 * unit(rng);
    const host_reading a{clock.host(0) + ea * (2 * unit(rng) - 1), ea};
    const host_reading b{clock.host(ab) + eb * (2 * unit(rng) - 1), eb};
    const double g = ab * (1.4 * unit(rng) - 0.2);
    const host_reading got = clock_map(a, b, ab, g);
    const double miss = std::abs(got.ns - clock.host(g));
    ASSERT_LE(miss, got.error_ns + 1) << "trial " << trial << ": " << g << " of " << ab << " ns";
    if (g >= 0 && g <= ab) {
      ASSERT_LE(got.error_ns, std::max(ea, eb) + 1e-6) << "trial " << trial;
    }
    const double by_one_anchor = std::abs(a.ns + g - clock.host(g));
    if (g >= 1e9 && by_one_anchor > ea + 10'000) {
      ++drift_exceeds_errors;
    }
  }
  EXPECT_GT(drift_exceeds_errors, 0) << "the model never drifts beyond the anchors' errors";
}

// A chain of anchors 20 ms apart, read within their errors off a clock whose rate wanders (a step
// every few anchors): every GPU time is placed within its stated error, the map is monotone (so
// spans that follow each other on a stream stay in order), and times before and after the chain
// are placed by its first and last two anchors.
TEST(gpu_spans, a_chain_places_every_time_between_its_anchors) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> unit(0, 1);
  std::deque<clock_point> chain;
  std::vector<double> truth_at;  // the true host time of each anchor
  double g = 0;
  double h = 4.2e14;
  for (int k = 0; k < 50; ++k) {
    const double e = 500 + 4000 * unit(rng);
    chain.push_back({g, {h + e * (2 * unit(rng) - 1), e}});
    truth_at.push_back(h);
    const double gap = 20e6 * (0.5 + unit(rng));
    const double rate = 1 + ((k / 7) % 2 == 0 ? -3.85e-6 : 1.2e-6);
    g += gap;
    h += gap * rate;
  }
  const auto truth = [&](double x) {  // linear between the anchors' true times
    std::size_t i = 0;
    while (i + 2 < chain.size() && chain[i + 1].gpu_ns <= x) {
      ++i;
    }
    const double rate = (truth_at[i + 1] - truth_at[i]) / (chain[i + 1].gpu_ns - chain[i].gpu_ns);
    return truth_at[i] + (x - chain[i].gpu_ns) * rate;
  };
  double previous = -1;
  for (double x = 0; x < chain.back().gpu_ns; x += 997'003) {
    const host_reading got = clock_place(chain, x);
    ASSERT_LE(std::abs(got.ns - truth(x)), got.error_ns + 1) << x;
    ASSERT_LE(got.error_ns, 4500 + 1e-6) << x;
    ASSERT_GE(got.ns, previous) << "placed out of order at " << x;
    previous = got.ns;
  }
  // Beyond the chain: its outer anchors' line, the error growing with the distance.
  const host_reading before = clock_place(chain, -5e6);
  const host_reading after = clock_place(chain, chain.back().gpu_ns + 5e6);
  EXPECT_EQ(before.ns,
            clock_map(chain[0].host, chain[1].host, chain[1].gpu_ns - chain[0].gpu_ns, -5e6).ns);
  const std::size_t n = chain.size();
  EXPECT_EQ(after.ns, clock_map(chain[n - 2].host, chain[n - 1].host,
                                chain[n - 1].gpu_ns - chain[n - 2].gpu_ns,
                                chain[n - 1].gpu_ns + 5e6 - chain[n - 2].gpu_ns)
                          .ns);
  EXPECT_GT(after.error_ns, chain[n - 1].host.error_ns);
  // A chain of one counts at the host's rate from its anchor.
  const std::deque<clock_point> one{{1000, {5e12, 800}}};
  EXPECT_EQ(clock_place(one, 3000).ns, 5e12 + 2000);
  EXPECT_EQ(clock_place(one, 3000).error_ns, 800);
}

}  // namespace
}  // namespace poolscope::darray::detail
