// Arrays and one backend used from several threads at once (run under TSan by CI): every thread's
// results stay right and every buffer goes back to the pools.
#include <gtest/gtest.h>

#include <cstdint>
#include <latch>
#include <memory>
#include <thread>
#include <vector>

#include "poolscope/darray/distributed_array.hpp"
#include "test_support.hpp"

namespace poolscope::darray {
namespace {

class darray_concurrency : public ::testing::TestWithParam<int> {};

// issue_threads 0: each op's enqueue calls on the calling thread; 2: each device's share from a
// thread of its own too, several callers contending for those threads.
TEST_P(darray_concurrency, threads_share_arrays_and_a_backend) {
  backend_options options;
  options.issue_threads = GetParam();
  auto be = make_host_backend(3, options);
  ASSERT_EQ(be->issue_threads(), static_cast<std::size_t>(GetParam()));
  const std::int64_t n = 4000;
  std::vector<std::int64_t> h(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < h.size(); ++i) {
    h[i] = static_cast<std::int64_t>(i);
  }
  auto a = distributed_array<std::int64_t>::from_host(be, h, {n}, index_map::blocks({n}, 0, 3));
  std::vector<std::thread> threads;
  std::vector<int> failures(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      const auto target = index_map::split(
          {n}, 0, {{(t + 1) % 3, 0, 1000 + 100 * t}, {(t + 2) % 3, 1000 + 100 * t, n}});
      for (int i = 0; i < 20; ++i) {
        auto b = a.reshard(target) * std::int64_t{t + 1} + a;
        auto s = sum(b).change_mode(array_mode::replica).to_host();
        // sum over i of (t + 2) * i
        if (s.at(0) != (t + 2) * (n * (n - 1) / 2)) {
          ++failures[static_cast<std::size_t>(t)];
        }
      }
    });
  }
  for (auto& th : threads) {
    th.join();
  }
  for (int t = 0; t < 4; ++t) {
    EXPECT_EQ(failures[static_cast<std::size_t>(t)], 0) << "thread " << t;
  }
  a = {};
  be->synchronize();
  for (int d = 0; d < 3; ++d) {
    EXPECT_EQ(be->allocator(d).stats().in_use, 0U) << "device " << d;
  }
}

// Loops of `x = x + y` from several threads at once, none waiting until its end: each op's output
// may take a buffer dropped by any thread with its uses pending on the same device's compute queue
// (stream-ordered reuse); the queue's order keeps every thread's values right.
TEST_P(darray_concurrency, threads_looping_ahead_share_dropped_buffers_in_queue_order) {
  backend_options options;
  options.issue_threads = GetParam();
  auto be = make_host_backend(2, options);
  const std::int64_t n = std::int64_t{1} << 12;
  const auto map = index_map::blocks({n}, 0, 2);
  auto y = distributed_array<float>::full(be, 1.0f, {n}, map);
  constexpr int ops = 50;
  std::vector<std::thread> threads;
  std::vector<int> wrong(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      auto x = distributed_array<float>::full(be, static_cast<float>(t), {n}, map);
      for (int i = 0; i < ops; ++i) {
        x = x + y;
      }
      for (float v : x.to_host()) {
        wrong[static_cast<std::size_t>(t)] += v == static_cast<float>(t + ops) ? 0 : 1;
      }
    });
  }
  for (auto& th : threads) {
    th.join();
  }
  for (int t = 0; t < 4; ++t) {
    EXPECT_EQ(wrong[static_cast<std::size_t>(t)], 0) << "thread " << t;
  }
  y = {};
  be->synchronize();
  for (int d = 0; d < 2; ++d) {
    EXPECT_EQ(be->allocator(d).stats().in_use, 0U) << "device " << d;
  }
}

// Fused ops from several threads whose reshards copy 4 MiB out of device 1 (backend::
// yield_min_bytes) while device 1's transfer queue is held: every thread's add on device 1 is
// enqueued while its copy is pending, so it yields (backend_options::yield_to_copies), the
// threads noting copies' ends and asking them at once; the values stay right.
TEST_P(darray_concurrency, threads_fusing_large_reshards_yield_to_their_copies) {
  backend_options options;
  options.issue_threads = GetParam();
  auto be = make_host_backend(2, options);
  const std::int64_t n = std::int64_t{1} << 21;  // half of it, 4 MiB of floats, moves
  ASSERT_EQ(static_cast<std::uint64_t>(n / 2) * sizeof(float), backend::yield_min_bytes);
  std::vector<float> ha(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < ha.size(); ++i) {
    ha[i] = static_cast<float>(i % 1000);
  }
  const auto halves = index_map::blocks({n}, 0, 2);
  const auto on_one = index_map::split({n}, 0, {{1, 0, n}});
  auto a = distributed_array<float>::from_host(be, ha, {n}, halves);
  constexpr int threads_n = 3;
  std::vector<distributed_array<float>> cs;
  for (int t = 0; t < threads_n; ++t) {
    cs.push_back(distributed_array<float>::full(be, static_cast<float>(t + 1), {n}, on_one));
  }
  be->synchronize();
  auto g = std::make_shared<test_support::gate>();
  be->wait(1, queue_kind::transfer, event(g));  // device 1 sends on its transfer queue
  std::latch enqueued(threads_n);
  std::vector<std::thread> threads;
  std::vector<int> wrong(threads_n, 0);
  for (int t = 0; t < threads_n; ++t) {
    threads.emplace_back([&, t] {
      auto r = a + cs[static_cast<std::size_t>(t)].reshard(a.index_map());
      enqueued.count_down();
      const auto got = r.to_host();  // waits for the gate
      for (std::size_t i = 0; i < got.size(); ++i) {
        wrong[static_cast<std::size_t>(t)] += got[i] == ha[i] + static_cast<float>(t + 1) ? 0 : 1;
      }
    });
  }
  enqueued.wait();
  const std::uint64_t yielded = be->stats().compute_yielding;
  g->open();
  for (auto& th : threads) {
    th.join();
  }
  EXPECT_GE(yielded, static_cast<std::uint64_t>(threads_n));
  for (int t = 0; t < threads_n; ++t) {
    EXPECT_EQ(wrong[static_cast<std::size_t>(t)], 0) << "thread " << t;
  }
  a = {};
  cs.clear();
  be->synchronize();
  for (int d = 0; d < 2; ++d) {
    EXPECT_EQ(be->allocator(d).stats().in_use, 0U) << "device " << d;
  }
}

INSTANTIATE_TEST_SUITE_P(issue_threads, darray_concurrency, ::testing::Values(0, 2));

}  // namespace
}  // namespace poolscope::darray
