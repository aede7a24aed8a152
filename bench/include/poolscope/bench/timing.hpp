// Timing primitives shared by the benchmarks and the demo.
//
//   const double overhead = poolscope::bench::timer_overhead_ns();
//   auto t = poolscope::bench::time_in_batches([&] { pool.deallocate(s, pool.allocate(s, n), n); },
//                                              {.max_ops = 100000, .budget_s = 1.0}, overhead);
//   std::printf("%.1f ns median, %.1f ns p99\n", t.per_op.median, t.per_op.p99);
//
// Method: operations are timed in batches of B back-to-back calls, B chosen (after a warm-up, by
// timing chunks of 1, 2, 4, ... calls) so that a batch takes about 2 µs (B = 1 for operations
// slower than that). Each batch gives one sample, (batch time -
// timer overhead) / B; the median and p99 are over those samples. The timer's own cost (two
// steady_clock reads, ~20-40 ns) is thus spread over B operations and subtracted. The price: a
// single slow call inside a batch is diluted by B, so p99 is the 99th percentile of B-call means,
// which equals the per-call p99 only when B = 1.
// Thread safety: the functions are reentrant; time_in_batches runs on the calling thread.
// Cost: timer_overhead_ns takes ~1 ms; time_in_batches runs until max_ops or budget_s.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace poolscope::bench {

/// Monotonic nanoseconds (steady_clock): the clock of every benchmark.
[[nodiscard]] inline std::uint64_t clock_ns() noexcept {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
}

/// Median cost of an empty timed region (two clock_ns() reads), in ns.
[[nodiscard]] double timer_overhead_ns();

/// Order statistics of a set of samples (ns). Percentiles use the nearest-rank definition.
struct sample_summary {
  std::size_t samples = 0;
  double median = 0.0;
  double p99 = 0.0;
  double mean = 0.0;
  double min = 0.0;
  double max = 0.0;
};

/// Summarizes `samples` (taken by value and sorted). All zero if empty.
[[nodiscard]] sample_summary summarize(std::vector<double> samples);

/// The nearest-rank percentile `p` (0 < p <= 100) of sorted `samples`; 0 if empty.
[[nodiscard]] double percentile_sorted(const std::vector<double>& sorted, double p);

/// Batch size so that a batch of operations costing `op_ns` each takes >= `target_ns`;
/// between 1 and `max_batch`.
[[nodiscard]] std::size_t batch_size_for(double op_ns, double target_ns = 2000.0,
                                         std::size_t max_batch = 1024);

/// The clock_ns() value `budget_s` seconds after `now`: saturates at the clock's end for a budget
/// too long to represent (1e300 s: run until the operation count says stop), and is `now` for a
/// budget that is not a positive number. (Converting an out-of-range double to an integer is
/// undefined: unchecked, a budget above ~1.8e10 s would end the run at once.)
[[nodiscard]] inline std::uint64_t deadline_after(std::uint64_t now, double budget_s) noexcept {
  constexpr std::uint64_t end = std::numeric_limits<std::uint64_t>::max();
  const double ns = budget_s * 1e9;
  if (!(ns > 0)) {  // NaN too
    return now;
  }
  // 2^64 as a double: anything at or above it cannot be converted.
  if (ns >= 18446744073709551616.0) {
    return end;
  }
  const auto add = static_cast<std::uint64_t>(ns);
  return add > end - now ? end : now + add;
}

/// How long time_in_batches runs: until `max_ops` operations or `budget_s` seconds, whichever
/// comes first, but at least `min_batches` batches (if max_ops allows). A budget too long for the
/// clock (1e300) leaves max_ops alone to end the run.
struct batch_limits {
  std::size_t max_ops = 100000;
  double budget_s = 1.0;
  std::size_t min_batches = 16;
  std::size_t warmup_ops = 16;
};

/// Per-operation samples of a batch-timed run.
struct batch_timing {
  std::vector<double> samples;  ///< one per batch: ns per operation
  std::size_t ops = 0;          ///< timed operations
  std::size_t untimed = 0;      ///< warm-up and calibration operations run before them
  std::size_t batch = 1;
};

/// Runs `op(i)` for i = 0, 1, ... and times it in batches (see the method above): first
/// `warmup_ops` untimed calls (caches fill, first upstream allocations happen), then untimed
/// calibration chunks of 1, 2, 4, ... calls until one lasts `target_ns`, which sets the batch
/// size, then timed batches. `op` may throw; the exception propagates.
template <typename Op>
batch_timing time_in_batches(Op&& op, const batch_limits& limits, double overhead_ns,
                             double target_ns = 2000.0, std::size_t max_batch = 1024) {
  batch_timing out;
  std::size_t i = 0;
  for (; i < limits.warmup_ops; ++i) {
    op(i);
  }
  double est = target_ns;
  for (std::size_t chunk = 1;; chunk *= 2) {
    const std::uint64_t t0 = clock_ns();
    for (std::size_t k = 0; k < chunk; ++k) {
      op(i++);
    }
    const double dt = static_cast<double>(clock_ns() - t0) - overhead_ns;
    if (dt >= target_ns || chunk >= max_batch) {
      est = std::max(dt, 0.0) / static_cast<double>(chunk);
      break;
    }
  }
  out.untimed = i;
  out.batch = batch_size_for(est, target_ns, max_batch);
  const std::uint64_t deadline = deadline_after(clock_ns(), limits.budget_s);
  std::size_t batches = 0;
  while (out.ops + out.batch <= limits.max_ops) {
    const std::uint64_t t0 = clock_ns();
    for (std::size_t k = 0; k < out.batch; ++k) {
      op(i++);
    }
    const std::uint64_t t1 = clock_ns();
    const double dt = std::max(0.0, static_cast<double>(t1 - t0) - overhead_ns);
    out.samples.push_back(dt / static_cast<double>(out.batch));
    out.ops += out.batch;
    ++batches;
    if (batches >= limits.min_batches && t1 >= deadline) {
      break;
    }
  }
  return out;
}

}  // namespace poolscope::bench
