#include "poolscope/bench/timing.hpp"

#include <cmath>
#include <numeric>

namespace poolscope::bench {

double timer_overhead_ns() {
  constexpr int rounds = 20000;
  std::vector<double> samples;
  samples.reserve(rounds);
  for (int r = 0; r < rounds; ++r) {
    const std::uint64_t t0 = clock_ns();
    const std::uint64_t t1 = clock_ns();
    samples.push_back(static_cast<double>(t1 - t0));
  }
  return summarize(std::move(samples)).median;
}

double percentile_sorted(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) {
    return 0.0;
  }
  // Nearest rank: the smallest sample with at least p% of the samples at or below it.
  const double rank = std::ceil(p / 100.0 * static_cast<double>(sorted.size()));
  const auto idx = static_cast<std::size_t>(std::max(1.0, rank)) - 1;
  return sorted[std::min(idx, sorted.size() - 1)];
}

sample_summary summarize(std::vector<double> samples) {
  sample_summary s;
  if (samples.empty()) {
    return s;
  }
  std::sort(samples.begin(), samples.end());
  s.samples = samples.size();
  s.median = percentile_sorted(samples, 50.0);
  s.p99 = percentile_sorted(samples, 99.0);
  s.mean =
      std::accumulate(samples.begin(), samples.end(), 0.0) / static_cast<double>(samples.size());
  s.min = samples.front();
  s.max = samples.back();
  return s;
}

std::size_t batch_size_for(double op_ns, double target_ns, std::size_t max_batch) {
  if (!(op_ns > 0.0)) {
    return max_batch;
  }
  const double b = std::ceil(target_ns / op_ns);
  if (b <= 1.0) {
    return 1;
  }
  return std::min(max_batch, static_cast<std::size_t>(b));
}

}  // namespace poolscope::bench
