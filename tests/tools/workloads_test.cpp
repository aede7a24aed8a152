// The bench library: workload traces, timing statistics, the capped resource, pattern checks and
// the text table. Randomized tests print their seed.
#include <gtest/gtest.h>

#if __has_include("poolscope/bench/workloads.hpp")

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "poolscope/bench/capped_resource.hpp"
#include "poolscope/bench/memory_access.hpp"
#include "poolscope/bench/text_table.hpp"
#include "poolscope/bench/timing.hpp"
#include "poolscope/bench/workloads.hpp"
#include "poolscope/error.hpp"
#include "poolscope/pool/factory.hpp"

namespace {

using namespace poolscope::bench;

/// Checks the trace contract: each slot alternates alloc/free starting with alloc, a free
/// repeats its allocation's size, and nothing is live at the end.
void expect_well_formed(const trace& t) {
  std::map<std::uint32_t, std::size_t> live;
  for (std::size_t i = 0; i < t.ops.size(); ++i) {
    const auto& op = t.ops[i];
    ASSERT_LT(op.slot, t.slots) << "op " << i;
    if (op.is_free) {
      ASSERT_TRUE(live.count(op.slot)) << "op " << i << " frees a slot that is not live";
      ASSERT_EQ(live[op.slot], op.bytes) << "op " << i;
      live.erase(op.slot);
    } else {
      ASSERT_FALSE(live.count(op.slot)) << "op " << i << " allocates into a live slot";
      ASSERT_GT(op.bytes, 0U);
      live[op.slot] = op.bytes;
    }
  }
  EXPECT_TRUE(live.empty()) << live.size() << " blocks never freed";
  EXPECT_TRUE(std::is_sorted(t.step_ends.begin(), t.step_ends.end()));
  if (!t.step_ends.empty()) {
    EXPECT_EQ(t.step_ends.back(), t.ops.size());
  }
}

std::size_t reference_peak(const trace& t) {
  std::vector<std::size_t> bytes(t.slots, 0);
  std::size_t sum = 0;
  std::size_t peak = 0;
  for (const auto& op : t.ops) {
    if (op.is_free) {
      sum -= bytes[op.slot];
    } else {
      bytes[op.slot] = op.bytes;
      sum += op.bytes;
    }
    peak = std::max(peak, sum);
  }
  return peak;
}

TEST(workloads, log_uniform_sizes_are_uniform_in_log) {
  const std::uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::printf("log_uniform seed %llu\n", static_cast<unsigned long long>(seed));
  const log_uniform_sizes size(512, 64 << 20);
  std::mt19937_64 rng(seed);
  constexpr int n = 100000;
  const double mid = std::sqrt(512.0 * (64 << 20));  // the geometric midpoint
  int below = 0;
  int lowest_octave = 0;
  for (int i = 0; i < n; ++i) {
    const std::size_t s = size(rng);
    ASSERT_GE(s, 512U);
    ASSERT_LE(s, std::size_t{64} << 20);
    below += static_cast<double>(s) < mid ? 1 : 0;
    lowest_octave += s < 1024 ? 1 : 0;
  }
  // Half below the geometric midpoint; 1 of the 17 octaves below 1 KiB (5 sigma bounds).
  EXPECT_NEAR(below / double(n), 0.5, 0.008);
  EXPECT_NEAR(lowest_octave / double(n), 1.0 / 17.0, 0.004);
  EXPECT_THROW(log_uniform_sizes(0, 10), poolscope::invalid_argument);
  EXPECT_THROW(log_uniform_sizes(10, 5), poolscope::invalid_argument);
}

TEST(workloads, sequence_batch_trace_scales_with_length_and_frees_in_reverse) {
  // L > hidden keeps the score tensors (heads*L/hidden activations) apart from activations.
  const sequence_model m{2, 64, 4, 3, 80, 300};
  constexpr std::size_t steps = 6;
  const std::uint64_t seed = 12345;
  const trace t = sequence_batch_trace(m, steps, seed);
  expect_well_formed(t);
  ASSERT_EQ(t.step_ends.size(), steps);
  std::size_t begin = 0;
  std::set<std::size_t> lengths;
  for (std::size_t k = 0; k < steps; ++k) {
    const std::size_t end = t.step_ends[k];
    std::size_t first = begin;
    if (k == 0) {
      // Weights first: 12 * hidden^2 * 4 bytes per layer.
      for (std::size_t l = 0; l < m.layers; ++l) {
        ASSERT_FALSE(t.ops[first].is_free);
        EXPECT_EQ(t.ops[first].bytes, 12 * m.hidden * m.hidden * 4);
        ++first;
      }
    }
    // The first activation is batch * L * hidden * 4 bytes: recover L from it.
    const std::size_t act = t.ops[first].bytes;
    ASSERT_EQ(act % (m.batch * m.hidden * 4), 0U);
    const std::size_t L = act / (m.batch * m.hidden * 4);
    EXPECT_GE(L, m.min_len);
    EXPECT_LE(L, m.max_len);
    lengths.insert(L);
    const std::size_t scores = m.batch * m.heads * L * L * 4;
    std::size_t n_scores = 0;
    std::size_t n_act = 0;
    for (std::size_t i = first; i < end; ++i) {
      if (!t.ops[i].is_free) {
        n_scores += t.ops[i].bytes == scores ? 1 : 0;
        n_act += t.ops[i].bytes % act == 0 && t.ops[i].bytes / act <= 4 ? 1 : 0;
      }
    }
    // Per layer: scores, softmax and the gradient of the scores.
    EXPECT_EQ(n_scores, 3 * m.layers) << "step " << k << " L " << L;
    EXPECT_GE(n_act, 7 * m.layers);
    // Forward = up to the loss (batch * L * 4 bytes). Activations kept from the forward pass
    // are freed in exactly the reverse order of their allocation.
    std::size_t loss = first;
    while (loss < end && (t.ops[loss].is_free || t.ops[loss].bytes != m.batch * L * 4)) {
      ++loss;
    }
    ASSERT_LT(loss, end);
    std::vector<std::uint32_t> kept;
    std::set<std::uint32_t> freed_in_forward;
    for (std::size_t i = first; i < loss; ++i) {
      if (t.ops[i].is_free) {
        freed_in_forward.insert(t.ops[i].slot);
      }
    }
    for (std::size_t i = first; i < loss; ++i) {
      if (!t.ops[i].is_free && !freed_in_forward.count(t.ops[i].slot)) {
        kept.push_back(t.ops[i].slot);
      }
    }
    const std::set<std::uint32_t> kept_set(kept.begin(), kept.end());
    std::vector<std::uint32_t> free_order;
    for (std::size_t i = loss; i < end; ++i) {
      if (t.ops[i].is_free && kept_set.count(t.ops[i].slot)) {
        free_order.push_back(t.ops[i].slot);
      }
    }
    std::reverse(kept.begin(), kept.end());
    EXPECT_EQ(free_order, kept) << "step " << k;
    begin = end;
  }
  EXPECT_GT(lengths.size(), 1U) << "lengths vary from step to step";
  EXPECT_EQ(peak_live_bytes(t), reference_peak(t));
  // Deterministic in the seed.
  const trace again = sequence_batch_trace(m, steps, seed);
  ASSERT_EQ(again.ops.size(), t.ops.size());
  EXPECT_TRUE(std::equal(t.ops.begin(), t.ops.end(), again.ops.begin(), [](auto& a, auto& b) {
    return a.slot == b.slot && a.is_free == b.is_free && a.bytes == b.bytes;
  }));
}

TEST(workloads, random_mix_keeps_the_live_count) {
  const std::uint64_t seed = 99;
  const trace t = random_mix_trace(50, 2000, 256, 1 << 20, seed);
  expect_well_formed(t);
  ASSERT_EQ(t.step_ends.size(), 3U);
  EXPECT_EQ(t.step_ends[0], 50U);
  EXPECT_EQ(t.step_ends[1], 50U + 2 * 2000U);
  EXPECT_EQ(t.ops.size(), 50U + 2 * 2000U + 50U);
  for (const auto& op : t.ops) {
    EXPECT_GE(op.bytes, 256U);
    EXPECT_LE(op.bytes, std::size_t{1} << 20);
  }
  EXPECT_EQ(peak_live_bytes(t), reference_peak(t));
}

TEST(workloads, concat_renumbers_and_peaks_are_the_max) {
  const trace a = random_mix_trace(10, 100, 256, 4096, 1);
  const trace b = sequence_batch_trace(sequence_model{1, 32, 2, 1, 8, 64}, 2, 2);
  const trace c = concat(a, b);
  expect_well_formed(c);
  EXPECT_EQ(c.slots, a.slots + b.slots);
  EXPECT_EQ(c.ops.size(), a.ops.size() + b.ops.size());
  EXPECT_EQ(c.step_ends.size(), a.step_ends.size() + b.step_ends.size());
  // a drains fully before b starts.
  EXPECT_EQ(peak_live_bytes(c), std::max(reference_peak(a), reference_peak(b)));
}

TEST(workloads, demo_trace_is_deterministic_and_sized_by_memory_kind) {
  const auto host = make_demo_plan(false, 3);
  const auto dev = make_demo_plan(true, 3);
  EXPECT_EQ(host.mix_pairs, 300U);
  EXPECT_LT(host.mix_hi, dev.mix_hi);
  EXPECT_LT(host.model.hidden, dev.model.hidden);
  const trace t1 = demo_trace(host, 3, 5);
  const trace t2 = demo_trace(host, 3, 5);
  const trace t3 = demo_trace(host, 3, 6);
  expect_well_formed(t1);
  ASSERT_EQ(t1.ops.size(), t2.ops.size());
  for (std::size_t i = 0; i < t1.ops.size(); ++i) {
    ASSERT_EQ(t1.ops[i].bytes, t2.ops[i].bytes) << i;
  }
  bool differs = t1.ops.size() != t3.ops.size();
  for (std::size_t i = 0; !differs && i < t1.ops.size(); ++i) {
    differs = t1.ops[i].bytes != t3.ops[i].bytes;
  }
  EXPECT_TRUE(differs) << "another seed, another trace";
}

TEST(timing, summarize_uses_nearest_rank) {
  std::vector<double> v;
  for (int i = 100; i >= 1; --i) {
    v.push_back(i);
  }
  const auto s = summarize(v);
  EXPECT_EQ(s.samples, 100U);
  EXPECT_DOUBLE_EQ(s.median, 50.0);
  EXPECT_DOUBLE_EQ(s.p99, 99.0);
  EXPECT_DOUBLE_EQ(s.mean, 50.5);
  EXPECT_DOUBLE_EQ(s.min, 1.0);
  EXPECT_DOUBLE_EQ(s.max, 100.0);
  EXPECT_EQ(summarize({}).samples, 0U);
  EXPECT_DOUBLE_EQ(summarize({7.0}).p99, 7.0);
  EXPECT_DOUBLE_EQ(percentile_sorted({1, 2, 3}, 50), 2.0);
  EXPECT_DOUBLE_EQ(percentile_sorted({1, 2, 3, 4}, 50), 2.0);
  EXPECT_DOUBLE_EQ(percentile_sorted({1, 2, 3, 4}, 100), 4.0);
}

TEST(timing, batch_sizes) {
  EXPECT_EQ(batch_size_for(10.0), 200U);
  EXPECT_EQ(batch_size_for(5000.0), 1U);
  EXPECT_EQ(batch_size_for(0.01), 1024U);
  EXPECT_EQ(batch_size_for(0.0), 1024U);
  EXPECT_EQ(batch_size_for(100.0, 1000.0, 4), 4U);
}

TEST(timing, time_in_batches_counts_operations) {
  std::size_t calls = 0;
  std::vector<std::size_t> seen;
  const auto bt = time_in_batches(
      [&](std::size_t i) {
        ++calls;
        seen.push_back(i);
      },
      {1000, 10.0, 1, 16}, 0.0);
  EXPECT_EQ(calls, bt.ops + bt.untimed) << "warm-up and calibration + timed";
  EXPECT_GE(bt.untimed, 16U + 1) << "16 warm-up calls, at least one calibration call";
  EXPECT_LE(bt.ops, 1000U);
  EXPECT_GT(bt.ops + bt.batch, 1000U) << "ran until max_ops";
  EXPECT_EQ(bt.samples.size() * bt.batch, bt.ops);
  for (std::size_t i = 0; i < seen.size(); ++i) {
    ASSERT_EQ(seen[i], i) << "op indices count up from 0";
  }
  for (double s : bt.samples) {
    EXPECT_GE(s, 0.0);
  }
  EXPECT_GE(timer_overhead_ns(), 0.0);
}

TEST(capped_resource, fails_past_capacity_and_forwards) {
  auto host = poolscope::pool::make_resource("host");
  capped_resource cap{*host, 1 << 20};
  EXPECT_EQ(cap.name(), host->name());
  EXPECT_EQ(cap.kind(), host->kind());
  EXPECT_EQ(cap.device(), host->device());
  void* a = cap.try_allocate({}, 512 << 10);
  void* b = cap.try_allocate({}, 512 << 10);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(cap.allocated_bytes(), std::size_t{1} << 20);
  EXPECT_EQ(cap.try_allocate({}, 1), nullptr);
  EXPECT_EQ(cap.allocated_bytes(), std::size_t{1} << 20) << "a failed call leaves no trace";
  cap.deallocate({}, a, 512 << 10);
  void* c = cap.try_allocate({}, 256 << 10);
  EXPECT_NE(c, nullptr);
  cap.deallocate({}, b, 512 << 10);
  cap.deallocate({}, c, 256 << 10);
  EXPECT_EQ(cap.allocated_bytes(), 0U);
  // Through an allocator: a pool over the cap gets out_of_memory, not more memory.
  auto pool = poolscope::pool::make_allocator("best_fit", cap);
  void* p = pool->allocate({}, 768 << 10);
  EXPECT_THROW((void)pool->allocate({}, 768 << 10), poolscope::out_of_memory);
  pool->deallocate({}, p, 768 << 10);
}

TEST(capped_resource_concurrency, never_exceeds_capacity) {
  auto host = poolscope::pool::make_resource("host");
  constexpr std::size_t block = 64 << 10;
  constexpr std::size_t capacity = 10 * block;
  capped_resource cap{*host, capacity};
  std::atomic<std::size_t> live{0};
  std::atomic<std::size_t> max_live{0};
  std::atomic<int> granted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 300; ++i) {
        std::vector<void*> mine;
        for (int k = 0; k < 3; ++k) {
          if (void* p = cap.try_allocate({}, block)) {
            mine.push_back(p);
            const std::size_t now = live.fetch_add(block) + block;
            std::size_t m = max_live.load();
            while (now > m && !max_live.compare_exchange_weak(m, now)) {
            }
            granted.fetch_add(1);
          }
        }
        for (void* p : mine) {
          live.fetch_sub(block);
          cap.deallocate({}, p, block);
        }
      }
    });
  }
  for (auto& th : threads) {
    th.join();
  }
  EXPECT_LE(max_live.load(), capacity);
  EXPECT_GT(granted.load(), 0);
  EXPECT_EQ(cap.allocated_bytes(), 0U);
}

TEST(memory_access, patterns_detect_corruption_on_host) {
  const auto kind = poolscope::pool::memory_kind::host;
  for (std::size_t n : {std::size_t{1}, std::size_t{13}, std::size_t{4096}, full_pattern_bytes + 7,
                        std::size_t{3} << 20}) {
    SCOPED_TRACE(n);
    std::vector<unsigned char> buf(n);
    write_pattern(kind, buf.data(), n, 42);
    EXPECT_TRUE(check_pattern(kind, buf.data(), n, 42));
    EXPECT_FALSE(check_pattern(kind, buf.data(), n, 43)) << "another block's pattern";
    // Flip a byte in each written piece: head, (middle,) tail.
    std::vector<std::size_t> spots{0, n - 1};
    if (n > full_pattern_bytes) {
      spots.push_back((n / 2) & ~std::size_t{7});
    }
    for (std::size_t at : spots) {
      buf[at] ^= 0x5a;
      EXPECT_FALSE(check_pattern(kind, buf.data(), n, 42)) << "flipped byte " << at;
      buf[at] ^= 0x5a;
    }
    EXPECT_TRUE(check_pattern(kind, buf.data(), n, 42));
  }
  EXPECT_GE(gpu_count(), 0);
}

TEST(text_table, aligns_columns) {
  text_table t({"name", "value"});
  t.add_row({"a", "1"});
  t.add_rule();
  t.add_row({"longer", "12345"});
  std::ostringstream s;
  t.print(s);
  EXPECT_EQ(s.str(),
            "name    value\n"
            "-------------\n"
            "a           1\n"
            "-------------\n"
            "longer  12345\n");
  EXPECT_EQ(format_ns(38.25), "38.2 ns");
  EXPECT_EQ(format_ns(1500.0), "1.50 us");
  EXPECT_EQ(format_size(512), "512 B");
  EXPECT_EQ(format_size(std::size_t{3} << 20), "3.00 MiB");
  EXPECT_EQ(format_ratio(1.054), "1.05");
}

}  // namespace

#else

TEST(workloads, skipped) {
  GTEST_SKIP() << "bench/ is not part of this build";
}

#endif
