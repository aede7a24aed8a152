// The CUPTI collector's CPU-testable parts: the unavailable path (no GPU here, or CUPTI taken),
// the clock (timestamp callback on now_ns, offset estimation and conversion with synthetic
// clocks), and the fixed buffer pool. GPU behaviour is in cupti_gpu_test.cu.
#include "poolscope/profiler/cupti_collector.hpp"

#include <gtest/gtest.h>

#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "poolscope/error.hpp"
#include "poolscope/hooks/event.hpp"
#include "poolscope/log.hpp"
#include "poolscope/pool/bfc_allocator.hpp"
#include "poolscope/pool/host_resource.hpp"
#include "poolscope/profiler/timeline.hpp"
#include "trace_test_util.hpp"

namespace {

using poolscope::profiler::activity_buffer_pool;
using poolscope::profiler::cupti_collector;
using poolscope::profiler::cupti_state;
using poolscope::profiler::device_activity;
using poolscope::profiler::testing::events_of;
using poolscope::profiler::testing::read_events;
using poolscope::profiler::testing::temp_file;
using poolscope::profiler::testing::to_ns;

bool have_gpu() {
  return !cupti_collector::device_names().empty();
}

/// Captures poolscope's log lines (warn and above) while alive.
class log_capture {
 public:
  log_capture() {
    poolscope::set_log_sink([this](poolscope::log_level l, std::string_view m) {
      if (l <= poolscope::log_level::warn) {
        std::lock_guard lock(mutex_);
        lines_.emplace_back(m);
      }
    });
  }
  log_capture(const log_capture&) = delete;
  log_capture& operator=(const log_capture&) = delete;
  ~log_capture() { poolscope::set_log_sink({}); }
  std::vector<std::string> lines() {
    std::lock_guard lock(mutex_);
    return lines_;
  }
  std::size_t count_containing(const std::string& s) {
    std::size_t n = 0;
    for (const auto& l : lines()) {
      n += l.find(s) != std::string::npos ? 1 : 0;
    }
    return n;
  }

 private:
  std::mutex mutex_;
  std::vector<std::string> lines_;
};

TEST(cupti_collector, without_gpu_start_logs_once_and_says_why) {
  if (have_gpu()) {
    GTEST_SKIP() << "a GPU is present: CUPTI is available (see cupti_gpu tests and "
                    "second_collector_is_refused)";
  }
  log_capture logs;
  std::uint64_t delivered = 0;
  cupti_collector c([&](const device_activity&) { ++delivered; });
  EXPECT_FALSE(c.start());
  EXPECT_FALSE(c.running());
  const auto s = c.status();
  EXPECT_EQ(s.state, cupti_state::unavailable);
  EXPECT_NE(s.reason.find("no usable CUDA device or driver"), std::string::npos) << s.reason;
  EXPECT_NE(s.reason.find("cudaError"), std::string::npos) << s.reason;
  c.flush();  // no-ops when not running
  c.stop();
  EXPECT_EQ(delivered, 0U);
  ASSERT_EQ(logs.lines().size(), 1U);
  EXPECT_NE(logs.lines()[0].find("CUPTI"), std::string::npos);
  EXPECT_NE(logs.lines()[0].find("host-side events"), std::string::npos);
  // A collector collects once.
  EXPECT_THROW((void)c.start(), poolscope::logic_error);
}

TEST(cupti_collector, second_collector_is_refused) {
  log_capture logs;
  cupti_collector first([](const device_activity&) {});
  const bool first_ran = first.start();
  EXPECT_EQ(first_ran, have_gpu());
  cupti_collector second([](const device_activity&) {});
  EXPECT_FALSE(second.start());
  EXPECT_EQ(second.status().state, cupti_state::unavailable);
  if (first_ran) {
    EXPECT_NE(second.status().reason.find("another poolscope collector"), std::string::npos)
        << second.status().reason;
    EXPECT_EQ(logs.lines().size(), 1U);
  } else {
    EXPECT_EQ(logs.lines().size(), 2U);  // one per collector, each once
  }
  first.stop();
  EXPECT_EQ(first.status().state, first_ran ? cupti_state::off : cupti_state::unavailable);
}

// The CUPTI-unavailable path through the timeline: one log line, then host events as usual,
// and a trace that passes the checker.
TEST(cupti_collector, timeline_goes_on_with_host_events_when_cupti_is_off) {
  temp_file f(".json");
  log_capture logs;
  poolscope::pool::host_resource host;
  poolscope::profiler::timeline_options o;
  o.trace_path = f.path();
  poolscope::profiler::timeline tl(o);  // cupti on by default
  tl.start();
  {
    poolscope::pool::bfc_allocator pool(host);
    const auto t0 = poolscope::hooks::now_ns();
    void* p = pool.allocate({}, 5000);
    pool.deallocate({}, p, 5000);
    tl.add_host_slice({.name = "step", .begin_ns = t0, .end_ns = poolscope::hooks::now_ns()});
  }
  tl.stop();
  poolscope::profiler::testing::expect_valid_trace(f.path());
  const auto events = read_events(f.path());
  EXPECT_EQ(events_of(events, "X", "user").size(), 1U);
  EXPECT_FALSE(events_of(events, "i", "allocator").empty());
  EXPECT_FALSE(events_of(events, "C").empty());
  if (!have_gpu()) {
    EXPECT_EQ(tl.cupti().state, cupti_state::unavailable);
    EXPECT_EQ(logs.count_containing("CUPTI"), 1U);
    EXPECT_EQ(logs.lines().size(), 1U);
  }
}

TEST(cupti_clock, timestamp_callback_reads_the_process_clock) {
  for (int i = 0; i < 100; ++i) {
    const std::uint64_t before = poolscope::hooks::now_ns();
    const std::uint64_t t = poolscope::profiler::cupti_timestamp();
    const std::uint64_t after = poolscope::hooks::now_ns();
    ASSERT_LE(before, t);
    ASSERT_LE(t, after);
  }
}

// Deterministic fake clocks: every reading advances a shared tick by 10 ns; `other` is the same
// time shifted back by K, and is slow (1000 ns) on most readings: the tightest bracket gives K.
std::uint64_t g_tick = 0;
int g_calls = 0;
constexpr std::int64_t g_shift = 1'234'567'890;
std::uint64_t fake_now() noexcept {
  g_tick += 10;
  return g_tick;
}
std::uint64_t fake_other() noexcept {
  ++g_calls;
  g_tick += (g_calls % 7 == 3) ? 10 : 1000;  // a fast reading now and then
  return g_tick - static_cast<std::uint64_t>(g_shift);
}

TEST(cupti_clock, offset_estimate_with_synthetic_clocks) {
  g_tick = 5'000'000'000ULL;
  g_calls = 0;
  const std::int64_t offset =
      poolscope::profiler::estimate_clock_offset(&fake_other, &fake_now, 16);
  // Tightest bracket: a = T+10, o = T+20-K, b = T+30: midpoint T+20, offset exactly K.
  EXPECT_EQ(offset, g_shift);
}

TEST(cupti_clock, device_timestamps_convert_to_the_process_clock) {
  using poolscope::profiler::to_process_clock;
  EXPECT_EQ(to_process_clock(1000, 500), 1500U);
  EXPECT_EQ(to_process_clock(1000, -400), 600U);
  EXPECT_EQ(to_process_clock(0, 12345), 0U);  // CUPTI's "unknown" stays unknown
  // A realistic case: CUPTI's default clock is CLOCK_REALTIME (~1.7e18 ns), ours is
  // CLOCK_MONOTONIC (~1e13): a large negative offset.
  const std::uint64_t realtime = 1'795'273'288'721'112'579ULL;
  const std::uint64_t monotonic = 32'779'850'356ULL;
  const auto offset = static_cast<std::int64_t>(monotonic - realtime);
  EXPECT_EQ(to_process_clock(realtime + 777, offset), monotonic + 777);

  // Converted records land in the trace where the process clock says.
  temp_file f(".json");
  poolscope::profiler::timeline_options o;
  o.trace_path = f.path();
  o.cupti = false;
  poolscope::profiler::timeline tl(o);
  tl.start();
  const std::uint64_t origin = tl.origin_ns();
  const auto device_clock_origin = origin - static_cast<std::uint64_t>(offset);  // same instant
  device_activity k;
  k.kind = poolscope::profiler::activity_kind::kernel;
  k.name = "k";
  k.stream = 3;
  k.start_ns = to_process_clock(device_clock_origin + 2'000, offset);
  k.end_ns = to_process_clock(device_clock_origin + 5'000, offset);
  tl.add_device_activity(k);
  tl.stop();
  const auto x = events_of(read_events(f.path()), "X", "kernel");
  ASSERT_EQ(x.size(), 1U);
  EXPECT_EQ(to_ns(x[0]["ts"]), 2'000);
  EXPECT_EQ(to_ns(x[0]["dur"]), 3'000);
  poolscope::profiler::testing::expect_valid_trace(f.path());
}

TEST(cupti_buffers, fixed_pool_hands_out_and_refuses) {
  activity_buffer_pool pool(3, 1001);
  EXPECT_EQ(pool.buffer_bytes(), 1008U);  // a multiple of 8
  EXPECT_EQ(pool.count(), 3U);
  std::set<std::uint8_t*> got;
  for (int i = 0; i < 3; ++i) {
    std::uint8_t* b = pool.acquire();
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b) % 8, 0U);
    EXPECT_TRUE(pool.owns(b));
    got.insert(b);
  }
  EXPECT_EQ(got.size(), 3U);
  EXPECT_EQ(pool.available(), 0U);
  EXPECT_EQ(pool.acquire(), nullptr);
  EXPECT_EQ(pool.acquire(), nullptr);
  EXPECT_EQ(pool.refused(), 2U);
  std::uint8_t* first = *got.begin();
  pool.release(first);
  EXPECT_EQ(pool.available(), 1U);
  EXPECT_EQ(pool.acquire(), first);
  // Foreign pointers and double releases are ignored and counted.
  std::uint8_t other[16];
  pool.release(other);
  pool.release(first + 8);  // inside a buffer, not its start
  EXPECT_FALSE(pool.owns(first + 8));
  pool.release(first);
  pool.release(first);
  EXPECT_EQ(pool.foreign(), 3U);
  EXPECT_EQ(pool.available(), 1U);
  EXPECT_THROW(activity_buffer_pool(0, 100), poolscope::invalid_argument);
  EXPECT_THROW(activity_buffer_pool(1, 0), poolscope::invalid_argument);
}

TEST(cupti_buffers, collector_allocates_its_pool_up_front) {
  poolscope::profiler::cupti_options o;
  o.buffer_count = 4;
  o.buffer_bytes = 64 * 1024;
  cupti_collector c([](const device_activity&) {}, o);
  const auto s = c.status();
  EXPECT_EQ(s.buffer_count, 4U);
  EXPECT_EQ(s.buffer_bytes, 64U * 1024U);
  EXPECT_EQ(s.state, cupti_state::off);
  EXPECT_EQ(s.buffers_refused, 0U);
}

}  // namespace

namespace {

using poolscope::profiler::activity_kinds_of;
using poolscope::profiler::cupti_options;
using poolscope::profiler::with_activity_kinds;

// Every switch of cupti_options that names a kind, in with_activity_kinds' order.
std::vector<bool> switches(const cupti_options& o) {
  return {o.kernels,         o.copies,      o.memsets,    o.memory,
          o.synchronization, o.runtime_api, o.driver_api, o.markers};
}

TEST(cupti_activity_kinds, a_list_turns_on_exactly_the_kinds_it_names) {
  const cupti_options o = with_activity_kinds(" copies ,kernels,kernels");
  EXPECT_EQ(switches(o), (std::vector<bool>{true, true, false, false, false, false, false, false}));
  EXPECT_FALSE(o.attach_nvtx);  // no markers: libcupti is not made the NVTX tool
  EXPECT_EQ(activity_kinds_of(o), "kernels,copies");

  const cupti_options m = with_activity_kinds("markers,sync,driver,runtime,memsets,memory");
  EXPECT_EQ(switches(m), (std::vector<bool>{false, false, true, true, true, true, true, true}));
  EXPECT_TRUE(m.attach_nvtx);
  EXPECT_EQ(activity_kinds_of(m), "memsets,memory,sync,runtime,driver,markers");
}

TEST(cupti_activity_kinds, all_is_every_kind_and_other_settings_are_kept) {
  cupti_options base;
  base.kernels = false;
  base.attach_nvtx = false;
  base.buffer_count = 3;
  base.flush_period_ms = 7;
  const cupti_options o = with_activity_kinds("all", base);
  EXPECT_EQ(switches(o), std::vector<bool>(8, true));
  EXPECT_TRUE(o.attach_nvtx);
  EXPECT_EQ(o.buffer_count, 3U);
  EXPECT_EQ(o.flush_period_ms, 7U);
  EXPECT_EQ(activity_kinds_of(o), "all");
  EXPECT_EQ(activity_kinds_of(with_activity_kinds("kernels", o)), "kernels");
}

TEST(cupti_activity_kinds, unknown_or_empty_lists_are_refused_by_name) {
  try {
    (void)with_activity_kinds("kernels,kernal");
    FAIL() << "a misspelt kind was accepted";
  } catch (const poolscope::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'kernal'"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)with_activity_kinds(""), poolscope::invalid_argument);
  EXPECT_THROW((void)with_activity_kinds(" , ,"), poolscope::invalid_argument);
  EXPECT_THROW((void)with_activity_kinds("none"), poolscope::invalid_argument);
}

}  // namespace
