// The timeline under concurrent producers (also run under ThreadSanitizer in CI: the suite name
// ends in _concurrency): host slices from several threads, allocator events from pools in use on
// others, synthetic device records, summary() and stats() readers, and stop() while all of them
// are still going. The trace must be valid and hold exactly what the counters say.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "poolscope/hooks/event.hpp"
#include "poolscope/pool/bfc_allocator.hpp"
#include "poolscope/pool/host_resource.hpp"
#include "poolscope/profiler/timeline.hpp"
#include "trace_test_util.hpp"

namespace {

using poolscope::profiler::activity_kind;
using poolscope::profiler::device_activity;
using poolscope::profiler::timeline;
using poolscope::profiler::testing::events_of;
using poolscope::profiler::testing::expect_valid_trace;
using poolscope::profiler::testing::read_events;
using poolscope::profiler::testing::temp_file;

TEST(trace_timeline_concurrency, producers_readers_and_a_stop_in_the_middle) {
  temp_file f(".json");
  poolscope::profiler::timeline_options o;
  o.trace_path = f.path();
  o.cupti = false;
  o.chunk_bytes = 8192;
  o.max_pending_chunks = 4;
  timeline tl(o);
  tl.start();
  const std::uint64_t origin = tl.origin_ns();
  std::atomic<bool> go{true};
  std::atomic<int> started{0};
  // Each thread counts itself after its first round, so under load none misses the session.
  const auto count_start = [&](bool first) {
    if (first) {
      ++started;
    }
  };
  std::vector<std::thread> threads;

  // Host slices: nested pairs, closed inner first.
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&] {
      for (bool first = true; go.load(); first = false) {
        const auto a = poolscope::hooks::now_ns();
        const auto b = poolscope::hooks::now_ns();
        const auto c = poolscope::hooks::now_ns();
        tl.add_host_slice({.name = "inner", .begin_ns = b, .end_ns = c});
        tl.add_host_slice({.name = "outer", .begin_ns = a, .end_ns = poolscope::hooks::now_ns()});
        count_start(first);
      }
    });
  }
  // Pools in use: allocator events through the timeline's hook.
  poolscope::pool::host_resource host;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&] {
      poolscope::pool::bfc_allocator pool(host);
      for (bool first = true; go.load(); first = false) {
        void* p = pool.allocate({}, 4096);
        pool.deallocate({}, p, 4096);
        count_start(first);
      }
    });
  }
  // Device records: an API call on a thread of its own, then its kernel, on a stream per feeder.
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      std::uint32_t corr = 1 + static_cast<std::uint32_t>(t) * 1'000'000;
      std::uint64_t ts = origin + 1000;
      for (bool first = true; go.load(); first = false) {
        device_activity api;
        api.kind = activity_kind::runtime_api;
        api.name = "cudaLaunchKernel";
        api.thread = 900000 + static_cast<std::uint64_t>(t);
        api.correlation = corr;
        api.start_ns = ts;
        api.end_ns = ts + 100;
        device_activity k;
        k.kind = activity_kind::kernel;
        k.name = "_Z1kv";
        k.device = 0;
        k.stream = 7 + static_cast<std::uint32_t>(t);
        k.correlation = corr;
        k.start_ns = ts + 200;
        k.end_ns = ts + 900;
        tl.add_device_activity(t == 0 ? api : k);  // one feeder sends the kernel first
        tl.add_device_activity(t == 0 ? k : api);
        ++corr;
        ts += 1000;
        count_start(first);
      }
    });
  }
  // Readers.
  threads.emplace_back([&] {
    for (bool first = true; go.load(); first = false) {
      (void)tl.summary();
      (void)tl.stats();
      count_start(first);
    }
  });
  while (started.load() < static_cast<int>(threads.size())) {
    std::this_thread::yield();
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  tl.stop();  // producers are still running: what comes later is counted, not written
  go = false;
  for (auto& t : threads) {
    t.join();
  }

  expect_valid_trace(f.path());
  const auto events = read_events(f.path());
  const auto st = tl.stats();
  EXPECT_EQ(events.size(), st.events_written);
  EXPECT_GT(st.outside_session, 0U);
  EXPECT_EQ(events_of(events, "s", "launch").size(), st.flows);
  EXPECT_EQ(events_of(events, "f", "launch").size(), st.flows);
  EXPECT_GT(st.host_slices, 0U);
  EXPECT_GT(st.allocator_events, 0U);
  EXPECT_GT(st.device_records, 0U);
}

}  // namespace
