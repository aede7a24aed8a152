// `trace summary` on written traces: hand-computed traces (devices, windows, unreadable events,
// CUDA API calls, the pools' growth, long names) and a randomized comparison against a model in
// unit time steps.
#include "poolscope/analysis/trace_summary.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "poolscope/error.hpp"
#include "poolscope/profiler/trace_writer.hpp"
#include "profiler/trace_test_util.hpp"

namespace {

using poolscope::profiler::device_overlap;
using poolscope::profiler::interval;

// `trace summary` over a written trace: two devices, top kernels and copies, the window from
// the first to the last timestamp of the whole trace.
TEST(trace_summary, summarize_a_written_trace) {
  using poolscope::profiler::trace_arg;
  using poolscope::profiler::trace_phase;
  poolscope::profiler::testing::temp_file f(".json");
  {
    poolscope::profiler::trace_writer w(f.path(), 0);
    w.process_name(1, "host");
    w.thread_name(1, 1, "main");
    w.process_name(100, "GPU 0");
    w.thread_name(100, 7, "stream 7");
    w.thread_name(100, 8, "stream 8");
    w.process_name(101, "GPU 1");
    w.thread_name(101, 9, "stream 9");
    w.thread_name(101, 10, "stream 10");
    const trace_arg d0[] = {{"device", 0}};
    const trace_arg d1[] = {{"device", 1}};
    const trace_arg c0[] = {{"device", 0}, {"bytes", std::uint64_t{1000}}};
    const trace_arg c1[] = {{"device", 1}, {"bytes", std::uint64_t{3000}}};
    // Host: a slice spanning [0, 10000) sets the window.
    w.write({.phase = trace_phase::complete,
             .name = "run",
             .cat = "user",
             .pid = 1,
             .tid = 1,
             .ts_ns = 0,
             .dur_ns = 10000});
    // Device 0: kernels A [1000,3000) and B [2000,2500) on another stream; copy [2500,4000).
    w.write({.phase = trace_phase::complete,
             .name = "A",
             .cat = "kernel",
             .pid = 100,
             .tid = 7,
             .ts_ns = 1000,
             .dur_ns = 2000,
             .args = d0});
    w.write({.phase = trace_phase::complete,
             .name = "B",
             .cat = "kernel",
             .pid = 100,
             .tid = 8,
             .ts_ns = 2000,
             .dur_ns = 500,
             .args = d0});
    w.write({.phase = trace_phase::complete,
             .name = "A",
             .cat = "kernel",
             .pid = 100,
             .tid = 7,
             .ts_ns = 5000,
             .dur_ns = 1000,
             .args = d0});
    w.write({.phase = trace_phase::complete,
             .name = "Memcpy HtoD",
             .cat = "memcpy",
             .pid = 100,
             .tid = 8,
             .ts_ns = 2500,
             .dur_ns = 1500,
             .args = c0});
    // Device 1: an NCCL kernel [1000,2000) and a peer copy [1500,1800) (both transfer), a
    // kernel [1900,3000).
    w.write({.phase = trace_phase::complete,
             .name = "ncclDevKernel_AllReduce",
             .cat = "nccl",
             .pid = 101,
             .tid = 9,
             .ts_ns = 1000,
             .dur_ns = 1000,
             .args = d1});
    w.write({.phase = trace_phase::complete,
             .name = "Memcpy PtoP",
             .cat = "memcpy",
             .pid = 101,
             .tid = 10,
             .ts_ns = 1500,
             .dur_ns = 300,
             .args = c1});
    w.write({.phase = trace_phase::complete,
             .name = "K",
             .cat = "kernel",
             .pid = 101,
             .tid = 10,
             .ts_ns = 1900,
             .dur_ns = 1100,
             .args = d1});
    // Not device activity: ignored by the summary.
    w.write({.phase = trace_phase::complete,
             .name = "cudaLaunchKernel",
             .cat = "cuda_api",
             .pid = 1,
             .tid = 1,
             .ts_ns = 900,
             .dur_ns = 50});
  }
  poolscope::profiler::testing::expect_valid_trace(f.path());
  const auto s = poolscope::analysis::summarize_trace(f.path());
  EXPECT_EQ(s.window_begin_ns, 0);
  EXPECT_EQ(s.window_end_ns, 10000);
  ASSERT_EQ(s.devices.size(), 2U);
  const device_overlap& g0 = s.devices[0];
  EXPECT_EQ(g0.compute_ns, 3000U);   // [1000,3000) + [5000,6000)
  EXPECT_EQ(g0.transfer_ns, 1500U);  // [2500,4000)
  EXPECT_EQ(g0.both_ns, 500U);       // [2500,3000)
  EXPECT_DOUBLE_EQ(g0.overlap_ratio, 500.0 / 1500.0);
  EXPECT_EQ(g0.busy_ns, 4000U);  // [1000,4000) + [5000,6000)
  EXPECT_EQ(g0.idle_ns, 6000U);
  const device_overlap& g1 = s.devices[1];
  EXPECT_EQ(g1.transfer_ns, 1000U);  // [1000,2000)
  EXPECT_EQ(g1.compute_ns, 1100U);
  EXPECT_EQ(g1.both_ns, 100U);  // [1900,2000)
  EXPECT_DOUBLE_EQ(g1.overlap_ratio, 0.1);
  // Kernels by total time: A (3000 over 2 calls), K, nccl, B.
  ASSERT_EQ(s.kernels.size(), 4U);
  EXPECT_EQ(s.kernels[0].name, "A");
  EXPECT_EQ(s.kernels[0].count, 2U);
  EXPECT_EQ(s.kernels[0].total_ns, 3000U);
  EXPECT_EQ(s.kernels[0].max_ns, 2000U);
  EXPECT_EQ(s.kernels[0].min_ns, 1000U);
  EXPECT_EQ(s.kernels[1].name, "K");
  EXPECT_EQ(s.kernels[2].category, "nccl");
  ASSERT_EQ(s.copies.size(), 2U);
  EXPECT_EQ(s.copies[0].name, "Memcpy HtoD");
  EXPECT_EQ(s.copies[0].bytes, 1000U);
  EXPECT_DOUBLE_EQ(s.copies[0].gbps(), 1000.0 / 1500.0);
  EXPECT_EQ(s.copies[1].device, 1);
  EXPECT_DOUBLE_EQ(s.copies[1].gbps(), 10.0);
  const std::string text = s.to_text(5);
  EXPECT_NE(text.find("device 0"), std::string::npos) << text;
  EXPECT_NE(text.find("overlap ratio 0.333"), std::string::npos) << text;
  EXPECT_NE(text.find("ncclDevKernel_AllReduce [nccl]"), std::string::npos) << text;
  const auto j = s.to_json(1);
  EXPECT_EQ(j["devices"][0]["top_kernels"].size(), 1U);
  EXPECT_EQ(j["devices"][0]["top_kernels"][0]["name"], "A");
  EXPECT_EQ(j["devices"][1]["both_ns"], 100);
}

TEST(trace_summary, summary_leaves_out_and_counts_events_with_unreadable_times) {
  poolscope::profiler::testing::temp_file f(".json");
  {
    // Two good kernels on device 0 ([1, 3) µs and [4, 5) µs) among events `trace check` rejects:
    // a negative dur (summed as is, it was 2^64 ns of kernel time), a dur given as a string, an
    // X event without dur, a ts given as a string, a ts out of any range, no ph, not an object.
    std::ofstream out(f.path());
    out << R"({"traceEvents": [
      {"name": "process_name", "ph": "M", "pid": 100, "args": {"name": "GPU 0"}},
      {"name": "K", "cat": "kernel", "ph": "X", "pid": 100, "tid": 1, "ts": 1, "dur": 2,
       "args": {"device": 0}},
      {"name": "K", "cat": "kernel", "ph": "X", "pid": 100, "tid": 1, "ts": 4, "dur": 1,
       "args": {"device": 0}},
      {"name": "K", "cat": "kernel", "ph": "X", "pid": 100, "tid": 1, "ts": 2, "dur": -1,
       "args": {"device": 0}},
      {"name": "C", "cat": "memcpy", "ph": "X", "pid": 100, "tid": 2, "ts": 2, "dur": "1",
       "args": {"device": 0}},
      {"name": "C", "cat": "memcpy", "ph": "X", "pid": 100, "tid": 2, "ts": 2,
       "args": {"device": 0}},
      {"name": "K", "cat": "kernel", "ph": "X", "pid": 100, "tid": 1, "ts": "3", "dur": 1,
       "args": {"device": 0}},
      {"name": "i", "ph": "i", "pid": 100, "tid": 1, "ts": 1e300},
      {"name": "K", "cat": "kernel", "pid": 100, "tid": 1, "ts": 6, "dur": 1,
       "args": {"device": 0}},
      7
    ]})";
  }
  const auto s = poolscope::analysis::summarize_trace(f.path());
  EXPECT_EQ(s.malformed, 7U);
  EXPECT_EQ(s.window_begin_ns, 1000);
  EXPECT_EQ(s.window_end_ns, 5000);
  ASSERT_EQ(s.devices.size(), 1U);
  EXPECT_EQ(s.devices[0].compute_ns, 3000U);
  EXPECT_EQ(s.devices[0].compute_ops, 2U);
  EXPECT_EQ(s.devices[0].transfer_ops, 0U);
  ASSERT_EQ(s.kernels.size(), 1U);
  EXPECT_EQ(s.kernels[0].count, 2U);
  EXPECT_EQ(s.kernels[0].total_ns, 3000U);
  EXPECT_TRUE(s.copies.empty());
  EXPECT_NE(s.to_text().find("7 event(s) left out"), std::string::npos) << s.to_text();
  EXPECT_EQ(s.to_json()["malformed"], 7);
}

TEST(trace_summary, summary_measures_windows_at_the_ends_of_the_time_range) {
  // Timestamps up to 9e15 µs either side of the origin are read; the window between the first
  // and the last came out negative (a signed difference past INT64_MAX), and a slice whose end
  // lay past the range was summed as a kernel of 8e18 ns with no busy time at all.
  poolscope::profiler::testing::temp_file f(".json");
  {
    std::ofstream out(f.path());
    out << R"({"traceEvents": [
      {"name": "K", "cat": "kernel", "ph": "X", "pid": 100, "tid": 1, "ts": -9e15, "dur": 1,
       "args": {"device": 0}},
      {"name": "K", "cat": "kernel", "ph": "X", "pid": 100, "tid": 1, "ts": 8e15, "dur": 1e15,
       "args": {"device": 0}},
      {"name": "L", "cat": "kernel", "ph": "X", "pid": 100, "tid": 1, "ts": 8e15, "dur": 8e15,
       "args": {"device": 0}}
    ]})";
  }
  const auto s = poolscope::analysis::summarize_trace(f.path());
  // -9e15 µs .. 9e15 µs in ns: the ends and the length, computed here without the summary.
  const std::int64_t begin_ns = -9'000'000'000'000'000'000;
  const std::int64_t end_ns = 9'000'000'000'000'000'000;
  const std::uint64_t window_ns = 18'000'000'000'000'000'000U;
  EXPECT_EQ(s.malformed, 1U);  // "L": its end is past the range
  EXPECT_EQ(s.window_begin_ns, begin_ns);
  EXPECT_EQ(s.window_end_ns, end_ns);
  const std::string text = s.to_text();
  EXPECT_EQ(text.find("window -"), std::string::npos) << text;
  char window_text[64];
  std::snprintf(window_text, sizeof window_text, "window %.3f s",
                static_cast<double>(window_ns) / 1e9);
  EXPECT_NE(text.find(std::string("events, ") + window_text), std::string::npos) << text;
  ASSERT_EQ(s.devices.size(), 1U);
  EXPECT_EQ(s.devices[0].window_ns, window_ns);
  const std::uint64_t busy_ns = 1000U + 1'000'000'000'000'000'000U;  // 1 µs and 1e15 µs
  EXPECT_EQ(s.devices[0].compute_ns, busy_ns);
  EXPECT_EQ(s.devices[0].busy_ns, busy_ns);
  EXPECT_EQ(s.devices[0].idle_ns, window_ns - busy_ns);
  ASSERT_EQ(s.kernels.size(), 1U);
  EXPECT_EQ(s.kernels[0].name, "K");
  EXPECT_EQ(s.kernels[0].total_ns, busy_ns);
}

TEST(trace_summary, summary_leaves_out_events_with_unreadable_devices_or_names) {
  // A device beyond int was summed on another device (4294967296 as device 0), and a name that
  // is not a string ended the whole summary with nlohmann's type_error naming no event.
  poolscope::profiler::testing::temp_file f(".json");
  {
    std::ofstream out(f.path());
    out << R"({"traceEvents": [
      {"name": "K", "cat": "kernel", "ph": "X", "pid": 100, "tid": 1, "ts": 1, "dur": 2,
       "args": {"device": 0}},
      {"name": "K", "cat": "kernel", "ph": "X", "pid": 100, "tid": 1, "ts": 4, "dur": 3,
       "args": {"device": 4294967296}},
      {"name": "K", "cat": "kernel", "ph": "X", "pid": 100, "tid": 1, "ts": 4, "dur": 3,
       "args": {"device": -2}},
      {"name": 7, "cat": "kernel", "ph": "X", "pid": 100, "tid": 1, "ts": 8, "dur": 1,
       "args": {"device": 0}},
      {"name": "P", "cat": "memcpy", "ph": "X", "pid": 100, "tid": 2, "ts": 10, "dur": 1,
       "args": {"device": 0, "src_device": 0, "dst_device": 4294967297}}
    ]})";
  }
  const auto s = poolscope::analysis::summarize_trace(f.path());
  EXPECT_EQ(s.malformed, 4U);
  ASSERT_EQ(s.devices.size(), 1U);
  EXPECT_EQ(s.devices[0].device, 0);
  EXPECT_EQ(s.devices[0].compute_ns, 2000U);
  EXPECT_EQ(s.devices[0].compute_ops, 1U);
  EXPECT_EQ(s.devices[0].transfer_ops, 0U);
  ASSERT_EQ(s.kernels.size(), 1U);
  EXPECT_EQ(s.kernels[0].count, 1U);
  EXPECT_TRUE(s.copies.empty());
}

TEST(trace_summary, summary_sums_cuda_api_calls_by_name_and_api) {
  // The host time of CUDA calls, the cost of a loop of small ops: by (name, api), in and out of
  // a window; other host slices and unreadable calls are not summed.
  poolscope::profiler::testing::temp_file f(".json");
  {
    std::ofstream out(f.path());
    out << R"({"traceEvents": [
      {"name": "cudaGraphLaunch", "cat": "cuda_api", "ph": "X", "pid": 1, "tid": 7, "ts": 10,
       "dur": 2, "args": {"api": "runtime", "correlation": 1}},
      {"name": "cuGraphLaunch", "cat": "cuda_api", "ph": "X", "pid": 1, "tid": 7, "ts": 10.5,
       "dur": 1.5, "args": {"api": "driver", "correlation": 1}},
      {"name": "cudaGraphLaunch", "cat": "cuda_api", "ph": "X", "pid": 1, "tid": 8, "ts": 20,
       "dur": 4, "args": {"api": "runtime", "correlation": 2}},
      {"name": "cudaEventSynchronize", "cat": "cuda_api", "ph": "X", "pid": 1, "tid": 7,
       "ts": 30, "dur": 1, "args": {"api": "runtime"}},
      {"name": "cudaEventSynchronize", "cat": "cuda_api", "ph": "X", "pid": 1, "tid": 7,
       "ts": 40, "dur": 3},
      {"name": "cudaFree", "cat": "cuda_api", "ph": "X", "pid": 1, "tid": 7, "ts": 50,
       "dur": -1, "args": {"api": "runtime"}},
      {"name": "step", "cat": "user", "ph": "X", "pid": 1, "tid": 7, "ts": 0, "dur": 60},
      {"name": "K", "cat": "kernel", "ph": "X", "pid": 100, "tid": 1, "ts": 11, "dur": 5,
       "args": {"device": 0}}
    ]})";
  }
  const auto s = poolscope::analysis::summarize_trace(f.path());
  EXPECT_EQ(s.malformed, 1U);  // the negative duration
  ASSERT_EQ(s.api_calls.size(), 4U);
  // By total time: cudaGraphLaunch 6 µs, cudaEventSynchronize without an api 3 µs, cuGraphLaunch
  // 1.5 µs, cudaEventSynchronize (runtime) 1 µs.
  EXPECT_EQ(s.api_calls[0].name, "cudaGraphLaunch");
  EXPECT_EQ(s.api_calls[0].category, "runtime");
  EXPECT_EQ(s.api_calls[0].count, 2U);
  EXPECT_EQ(s.api_calls[0].total_ns, 6000U);
  EXPECT_EQ(s.api_calls[0].max_ns, 4000U);
  EXPECT_EQ(s.api_calls[0].device, -1);
  EXPECT_EQ(s.api_calls[1].name, "cudaEventSynchronize");
  EXPECT_EQ(s.api_calls[1].category, "");
  EXPECT_EQ(s.api_calls[1].total_ns, 3000U);
  EXPECT_EQ(s.api_calls[2].name, "cuGraphLaunch");
  EXPECT_EQ(s.api_calls[2].category, "driver");
  EXPECT_EQ(s.api_calls[2].total_ns, 1500U);
  EXPECT_EQ(s.api_calls[3].category, "runtime");
  EXPECT_EQ(s.api_calls[3].count, 1U);
  ASSERT_EQ(s.kernels.size(), 1U);  // device activity as before
  EXPECT_EQ(s.devices.size(), 1U);
  const std::string text = s.to_text();
  EXPECT_NE(text.find("CUDA API calls"), std::string::npos) << text;
  EXPECT_NE(text.find("cudaGraphLaunch (runtime)\n"), std::string::npos) << text;
  EXPECT_NE(text.find("cuGraphLaunch (driver)\n"), std::string::npos) << text;
  const auto j = s.to_json(2);
  ASSERT_EQ(j["top_api_calls"].size(), 2U);
  EXPECT_EQ(j["top_api_calls"][0]["name"], "cudaGraphLaunch");
  EXPECT_EQ(j["top_api_calls"][0]["count"], 2U);

  // A window of 19..31 µs: the second launch whole, the first synchronize whole, nothing else.
  const auto w = poolscope::analysis::summarize_trace(f.path(), interval{19000, 31000});
  ASSERT_EQ(w.api_calls.size(), 2U);
  EXPECT_EQ(w.api_calls[0].name, "cudaGraphLaunch");
  EXPECT_EQ(w.api_calls[0].count, 1U);
  EXPECT_EQ(w.api_calls[0].total_ns, 4000U);
  EXPECT_EQ(w.api_calls[1].name, "cudaEventSynchronize");
  EXPECT_EQ(w.api_calls[1].total_ns, 1000U);
  // Cut by the window: 10..12 µs seen through 11..40 counts its last microsecond.
  const auto cut = poolscope::analysis::summarize_trace(f.path(), interval{11000, 40000});
  ASSERT_FALSE(cut.api_calls.empty());
  EXPECT_EQ(cut.api_calls[0].name, "cudaGraphLaunch");
  EXPECT_EQ(cut.api_calls[0].total_ns, 1000U + 4000U);
}

// The pools' growth: allocator device_alloc events (not their "pre" half, not other allocator
// events) counted with their bytes over the trace, in windows, and per window with `each`;
// where an op's first runs paid for cudaMalloc. Times in µs: windows [10,20) and [40,50).
TEST(trace_summary, summary_counts_where_the_pools_grew) {
  poolscope::profiler::testing::temp_file f(".json");
  {
    std::ofstream out(f.path());
    out << R"({"traceEvents": [
      {"name": "op", "cat": "user", "ph": "X", "pid": 1, "tid": 1, "ts": 10, "dur": 10},
      {"name": "op", "cat": "user", "ph": "X", "pid": 1, "tid": 1, "ts": 40, "dur": 10},
      {"name": "K", "cat": "kernel", "ph": "X", "pid": 100, "tid": 1, "ts": 12, "dur": 4,
       "args": {"device": 0}},
      {"name": "device_alloc", "cat": "allocator", "ph": "i", "s": "t", "pid": 1, "tid": 1,
       "ts": 5, "args": {"device": 0, "phase": "post", "rounded": 4096}},
      {"name": "device_alloc", "cat": "allocator", "ph": "i", "s": "t", "pid": 1, "tid": 1,
       "ts": 11, "args": {"device": 0, "phase": "pre", "rounded": 0}},
      {"name": "device_alloc", "cat": "allocator", "ph": "i", "s": "t", "pid": 1, "tid": 1,
       "ts": 11, "args": {"device": 0, "phase": "post", "rounded": 268435456}},
      {"name": "device_alloc", "cat": "allocator", "ph": "i", "s": "t", "pid": 1, "tid": 1,
       "ts": 19, "args": {"device": 1, "phase": "post", "rounded": 268435456}},
      {"name": "pool_malloc", "cat": "allocator", "ph": "i", "s": "t", "pid": 1, "tid": 1,
       "ts": 41, "args": {"device": 0, "phase": "post", "rounded": 1024}},
      {"name": "device_alloc", "cat": "user", "ph": "i", "s": "t", "pid": 1, "tid": 1,
       "ts": 42, "args": {"rounded": 1}},
      {"name": "device_alloc", "cat": "allocator", "ph": "i", "s": "t", "pid": 1, "tid": 1,
       "ts": 60},
      {"name": "upstream alloc", "cat": "allocator", "ph": "X", "pid": 1, "tid": 1,
       "ts": 10.5, "dur": 0.5, "args": {"bytes": 268435456}},
      {"name": "upstream alloc", "cat": "allocator", "ph": "X", "pid": 1, "tid": 1,
       "ts": 18, "dur": 4, "args": {"bytes": 268435456}},
      {"name": "upstream alloc", "cat": "user", "ph": "X", "pid": 1, "tid": 1,
       "ts": 41, "dur": 1},
      {"name": "upstream alloc", "cat": "allocator", "ph": "X", "pid": 1, "tid": 1,
       "ts": 30, "dur": 1}
    ]})";
  }
  using poolscope::analysis::summarize_trace;
  const auto whole = summarize_trace(f.path());
  EXPECT_EQ(whole.upstream_allocs, 4U);  // at 5, 11, 19 and 60 (no args: no bytes)
  EXPECT_EQ(whole.upstream_bytes, 4096U + 2U * 268435456U);
  // The host time of the "upstream alloc" slices (not of another category's): 0.5 + 4 + 1 µs.
  EXPECT_EQ(whole.upstream_ns, 5500U);
  EXPECT_NE(whole.to_text().find("pools grew 4 time(s)"), std::string::npos) << whole.to_text();
  EXPECT_NE(whole.to_text().find("5.500 us of host time"), std::string::npos) << whole.to_text();
  const std::vector<interval> windows{{10000, 20000}, {40000, 50000}};
  const auto w = summarize_trace(f.path(), windows, /*each=*/true);
  EXPECT_EQ(w.upstream_allocs, 2U);
  EXPECT_EQ(w.upstream_bytes, 2U * 268435456U);
  ASSERT_EQ(w.each.size(), 2U);
  EXPECT_EQ(w.each[0].upstream_allocs, 2U);
  EXPECT_EQ(w.each[0].upstream_bytes, 2U * 268435456U);
  EXPECT_EQ(w.each[1].upstream_allocs, 0U);
  // The slices' parts inside the windows: 0.5 µs, and 2 of the 4 that cross 20 µs.
  EXPECT_EQ(w.upstream_ns, 2500U);
  EXPECT_EQ(w.each[0].upstream_ns, 2500U);
  EXPECT_EQ(w.each[1].upstream_ns, 0U);
  const std::string text = w.to_text();
  EXPECT_NE(text.find("pools grew\n"), std::string::npos) << text;  // the table's column
  EXPECT_NE(text.find("2 times, 512.0 MiB, 2.500 us\n"), std::string::npos) << text;
  const auto j = w.to_json();
  EXPECT_EQ(j["upstream_allocs"], 2U);
  EXPECT_EQ(j["each"][0]["upstream_bytes"], 2U * 268435456U);
  EXPECT_EQ(j["each"][1]["upstream_allocs"], 0U);
  EXPECT_EQ(j["upstream_ns"], 2500U);
  EXPECT_EQ(j["each"][0]["upstream_ns"], 2500U);
  // Nothing grew: no line.
  const auto none = summarize_trace(f.path(), interval{40000, 50000});
  EXPECT_EQ(none.upstream_allocs, 0U);
  EXPECT_EQ(none.to_text().find("pools grew"), std::string::npos);
}

// Several windows at once (an op's runs): each slice counts by its parts inside them, once as an
// operation however many parts; every device's window is the union's length. Times in µs:
//   windows [10,20) and [40,50) (the two "op" slices)
//   device 0: kernel [5,15) -> [10,15); peer copy 0->1 [12,45) -> [12,20) + [40,45)
//   device 1: kernel [25,30) (outside: left out), kernel [46,48); the copy's transfer time too
//   cudaLaunchKernel [18,42) -> [18,20) + [40,42)
TEST(trace_summary, summary_in_several_windows_counts_each_slice_by_its_parts) {
  poolscope::profiler::testing::temp_file f(".json");
  {
    std::ofstream out(f.path());
    out << R"({"traceEvents": [
      {"name": "op", "cat": "user", "ph": "X", "pid": 1, "tid": 1, "ts": 10, "dur": 10},
      {"name": "op", "cat": "user", "ph": "X", "pid": 1, "tid": 1, "ts": 40, "dur": 10},
      {"name": "other", "cat": "user", "ph": "X", "pid": 1, "tid": 1, "ts": 0, "dur": 60},
      {"name": "K", "cat": "kernel", "ph": "X", "pid": 100, "tid": 1, "ts": 5, "dur": 10,
       "args": {"device": 0}},
      {"name": "Memcpy PtoP", "cat": "memcpy", "ph": "X", "pid": 100, "tid": 2, "ts": 12,
       "dur": 33, "args": {"device": 0, "src_device": 0, "dst_device": 1, "bytes": 4096}},
      {"name": "K2", "cat": "kernel", "ph": "X", "pid": 101, "tid": 1, "ts": 25, "dur": 5,
       "args": {"device": 1}},
      {"name": "K2", "cat": "kernel", "ph": "X", "pid": 101, "tid": 1, "ts": 46, "dur": 2,
       "args": {"device": 1}},
      {"name": "cudaLaunchKernel", "cat": "cuda_api", "ph": "X", "pid": 1, "tid": 1, "ts": 18,
       "dur": 24, "args": {"api": "runtime"}}
    ]})";
  }
  const auto r = poolscope::analysis::find_trace_ranges(f.path(), "op");
  ASSERT_EQ(r.found, (std::vector<interval>{{10000, 20000}, {40000, 50000}}));
  const auto s = poolscope::analysis::summarize_trace(f.path(), r.found);
  EXPECT_EQ(s.windows, r.found);
  EXPECT_EQ(s.window_begin_ns, 10000);
  EXPECT_EQ(s.window_end_ns, 50000);
  ASSERT_EQ(s.devices.size(), 2U);
  const device_overlap& d0 = s.devices[0];
  EXPECT_EQ(d0.window_ns, 20000U);
  EXPECT_EQ(d0.compute_ns, 5000U);
  EXPECT_EQ(d0.transfer_ns, 13000U);
  EXPECT_EQ(d0.both_ns, 3000U);
  EXPECT_EQ(d0.busy_ns, 15000U);
  EXPECT_EQ(d0.idle_ns, 5000U);
  EXPECT_EQ(d0.compute_ops, 1U);
  EXPECT_EQ(d0.transfer_ops, 1U);
  const device_overlap& d1 = s.devices[1];
  EXPECT_EQ(d1.compute_ns, 2000U);
  EXPECT_EQ(d1.compute_ops, 1U);
  EXPECT_EQ(d1.transfer_ns, 13000U);
  EXPECT_EQ(d1.transfer_ops, 1U);
  EXPECT_EQ(d1.both_ns, 0U);
  EXPECT_EQ(d1.idle_ns, 5000U);
  ASSERT_EQ(s.copies.size(), 1U);
  EXPECT_EQ(s.copies[0].count, 1U);
  EXPECT_EQ(s.copies[0].total_ns, 13000U);
  ASSERT_EQ(s.kernels.size(), 2U);
  EXPECT_EQ(s.kernels[0].name, "K");
  EXPECT_EQ(s.kernels[0].total_ns, 5000U);
  EXPECT_EQ(s.kernels[1].name, "K2");
  EXPECT_EQ(s.kernels[1].count, 1U);
  EXPECT_EQ(s.kernels[1].total_ns, 2000U);
  ASSERT_EQ(s.api_calls.size(), 1U);
  EXPECT_EQ(s.api_calls[0].count, 1U);
  EXPECT_EQ(s.api_calls[0].total_ns, 4000U);
  EXPECT_NE(s.to_text().find("window 20.000 us in 2 ranges"), std::string::npos) << s.to_text();
  EXPECT_EQ(s.to_json()["windows"].size(), 2U);
  EXPECT_TRUE(s.each.empty());  // not asked for

  // Each window alone: [10,20) device 0 compute 5, transfer 8, both 3 (0.375), device 1 the
  // copy's 8 only; [40,50) device 0 the copy's 5, device 1 compute 2 and the copy's 5, apart.
  const auto e = poolscope::analysis::summarize_trace(f.path(), r.found, true);
  ASSERT_EQ(e.each.size(), 2U);
  EXPECT_EQ(e.each[0].window, (interval{10000, 20000}));
  ASSERT_EQ(e.each[0].devices.size(), 2U);
  const device_overlap& w0 = e.each[0].devices[0];
  EXPECT_EQ(w0.window_ns, 10000U);
  EXPECT_EQ(w0.compute_ns, 5000U);
  EXPECT_EQ(w0.transfer_ns, 8000U);
  EXPECT_EQ(w0.both_ns, 3000U);
  EXPECT_DOUBLE_EQ(w0.overlap_ratio, 0.375);
  EXPECT_EQ(w0.transfer_ops, 1U);
  EXPECT_EQ(e.each[0].devices[1].transfer_ns, 8000U);
  EXPECT_EQ(e.each[0].devices[1].compute_ns, 0U);
  ASSERT_EQ(e.each[1].devices.size(), 2U);
  EXPECT_EQ(e.each[1].devices[0].transfer_ns, 5000U);
  EXPECT_EQ(e.each[1].devices[0].transfer_ops, 1U);  // the copy, counted in both windows
  EXPECT_EQ(e.each[1].devices[0].compute_ns, 0U);
  EXPECT_EQ(e.each[1].devices[1].compute_ns, 2000U);
  EXPECT_EQ(e.each[1].devices[1].both_ns, 0U);
  EXPECT_EQ(e.devices, s.devices);  // the union's figures as without `each`
  const std::string text = e.to_text();
  EXPECT_NE(text.find("per range (2)"), std::string::npos) << text;
  EXPECT_NE(text.find("0.375"), std::string::npos) << text;
  EXPECT_EQ(e.to_json()["each"].size(), 2U);

  // A name the trace lacks: nothing found, and the host slices it has, most frequent first
  // (device activity and CUDA calls left out).
  const auto none = poolscope::analysis::find_trace_ranges(f.path(), "nope");
  EXPECT_TRUE(none.found.empty());
  EXPECT_EQ(none.host_names, (std::vector<std::string>{"op", "other"}));
  // Windows that hold no time, or end before they begin, are refused.
  EXPECT_THROW((void)poolscope::analysis::summarize_trace(f.path(), std::vector<interval>{}),
               poolscope::invalid_argument);
  EXPECT_THROW(
      (void)poolscope::analysis::summarize_trace(f.path(), std::vector<interval>{{5000, 3000}}),
      poolscope::invalid_argument);
}

// Random slices on one device and random windows, written as a trace and summarised, against a
// model in unit steps of 1 µs.
TEST(trace_summary, summary_in_random_windows_against_unit_step_model) {
  const auto seed = static_cast<unsigned>(std::random_device{}());
  std::printf("overlap windows seed %u\n", seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  for (int round = 0; round < 10; ++round) {
    constexpr int domain = 400;
    std::uniform_int_distribution<int> start(0, domain - 1);
    std::uniform_int_distribution<int> len(0, 40);
    std::uniform_int_distribution<int> cls(0, 1);
    std::vector<std::array<bool, 2>> busy(domain);
    std::vector<bool> inside(domain, false);
    std::vector<interval> windows;
    for (int i = 0; i < 1 + round % 4; ++i) {
      const int b = start(rng);
      const int e = std::min(domain, b + 1 + len(rng) * 2);
      windows.push_back({b * 1000LL, e * 1000LL});
      for (int t = b; t < e; ++t) {
        inside[static_cast<std::size_t>(t)] = true;
      }
    }
    std::ostringstream json;
    json << R"({"traceEvents": [)";
    std::uint64_t ops[2] = {0, 0};
    std::vector<std::array<int, 3>> slices;  // begin, end, class
    for (int i = 0; i < 60; ++i) {
      const int b = start(rng);
      const int e = std::min(domain, b + 1 + len(rng));
      const int c = cls(rng);
      slices.push_back({b, e, c});
      json << (i == 0 ? "" : ",") << R"({"name": "s", "cat": ")" << (c == 0 ? "kernel" : "memcpy")
           << R"(", "ph": "X", "pid": 100, "tid": 1, "ts": )" << b << R"(, "dur": )" << e - b
           << R"(, "args": {"device": 0}})";
      bool counted = false;
      for (int t = b; t < e; ++t) {
        if (inside[static_cast<std::size_t>(t)]) {
          busy[static_cast<std::size_t>(t)][static_cast<std::size_t>(c)] = true;
          counted = true;
        }
      }
      ops[c] += counted ? 1 : 0;
    }
    json << "]}";
    poolscope::profiler::testing::temp_file f(".json");
    {
      std::ofstream out(f.path());
      out << json.str();
    }
    std::uint64_t compute = 0, transfer = 0, both = 0, any = 0, window = 0;
    for (int t = 0; t < domain; ++t) {
      const auto& b = busy[static_cast<std::size_t>(t)];
      compute += b[0] ? 1000 : 0;
      transfer += b[1] ? 1000 : 0;
      both += b[0] && b[1] ? 1000 : 0;
      any += b[0] || b[1] ? 1000 : 0;
      window += inside[static_cast<std::size_t>(t)] ? 1000 : 0;
    }
    const auto s = poolscope::analysis::summarize_trace(f.path(), windows, true);
    // Each window alone: the runs of `inside` (windows that overlap or touch are one).
    std::vector<std::pair<int, int>> runs;
    for (int t = 0; t < domain; ++t) {
      if (inside[static_cast<std::size_t>(t)]) {
        if (runs.empty() || runs.back().second != t) {
          runs.emplace_back(t, t);
        }
        runs.back().second = t + 1;
      }
    }
    ASSERT_EQ(s.each.size(), runs.size());
    for (std::size_t k = 0; k < runs.size(); ++k) {
      const auto [w0, w1] = runs[k];
      EXPECT_EQ(s.each[k].window, (interval{w0 * 1000LL, w1 * 1000LL}));
      std::uint64_t c_ns = 0, t_ns = 0, b_ns = 0, run_ops[2] = {0, 0};
      for (int t = w0; t < w1; ++t) {
        const auto& b = busy[static_cast<std::size_t>(t)];
        c_ns += b[0] ? 1000 : 0;
        t_ns += b[1] ? 1000 : 0;
        b_ns += b[0] && b[1] ? 1000 : 0;
      }
      for (const auto& [b, e, c] : slices) {
        run_ops[c] += std::max(b, w0) < std::min(e, w1) ? 1 : 0;
      }
      if (c_ns + t_ns == 0) {
        EXPECT_TRUE(s.each[k].devices.empty());
        continue;
      }
      ASSERT_EQ(s.each[k].devices.size(), 1U);
      const device_overlap& r = s.each[k].devices[0];
      EXPECT_EQ(r.window_ns, static_cast<std::uint64_t>(w1 - w0) * 1000);
      EXPECT_EQ(r.compute_ns, c_ns);
      EXPECT_EQ(r.transfer_ns, t_ns);
      EXPECT_EQ(r.both_ns, b_ns);
      EXPECT_EQ(r.compute_ops, run_ops[0]);
      EXPECT_EQ(r.transfer_ops, run_ops[1]);
    }
    if (compute + transfer == 0) {
      EXPECT_TRUE(s.devices.empty());
      continue;
    }
    ASSERT_EQ(s.devices.size(), 1U);
    const device_overlap& d = s.devices[0];
    EXPECT_EQ(d.window_ns, window);
    EXPECT_EQ(d.compute_ns, compute);
    EXPECT_EQ(d.transfer_ns, transfer);
    EXPECT_EQ(d.both_ns, both);
    EXPECT_EQ(d.busy_ns, any);
    EXPECT_EQ(d.idle_ns, window - any);
    EXPECT_EQ(d.compute_ops, ops[0]);
    EXPECT_EQ(d.transfer_ops, ops[1]);
  }
}

TEST(trace_summary, summary_text_keeps_long_kernel_names_whole) {
  // CUB and CUTLASS kernels demangle to hundreds of characters; such a name was cut with the
  // rest of its line at 511 bytes, end of line included, so the next line ran into it.
  poolscope::analysis::trace_summary s;
  s.events = 3;
  s.window_end_ns = 10000;
  device_overlap d;
  d.device = 0;
  d.window_ns = 10000;
  s.devices = {d};
  const std::string long_kernel =
      "void cub::DeviceRadixSortOnesweepKernel<" + std::string(700, 'P') + ">(int*)";
  const std::string long_nccl = "ncclDevKernel_AllReduce_" + std::string(600, 'R');
  const std::string long_copy = "Memcpy " + std::string(520, 'C');
  poolscope::profiler::op_summary k;
  k.name = long_kernel;
  k.category = "kernel";
  k.add(3000, 0);
  poolscope::profiler::op_summary n = k;
  n.name = long_nccl;
  n.category = "nccl";
  poolscope::profiler::op_summary c;
  c.name = long_copy;
  c.category = "memcpy";
  c.add(2000, 4000);
  s.kernels = {k, n};
  s.copies = {c};
  std::istringstream in(s.to_text());
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    lines.push_back(line);
  }
  // Device: three lines; "top kernels" and two kernels; "top copies" and one copy; the total.
  ASSERT_EQ(lines.size(), 9U) << s.to_text();
  EXPECT_EQ(lines[3].rfind("  top kernels:", 0), 0U) << lines[3];
  const auto ends_with = [](const std::string& line, const std::string& tail) {
    return line.size() >= tail.size() &&
           line.compare(line.size() - tail.size(), tail.size(), tail) == 0;
  };
  EXPECT_TRUE(ends_with(lines[4], "  " + long_kernel)) << lines[4];
  EXPECT_EQ(lines[4].find(" 3.000 us "), 4U + 17U - 9U) << lines[4];  // total, right-aligned
  EXPECT_TRUE(ends_with(lines[5], "  " + long_nccl + " [nccl]")) << lines[5];
  EXPECT_EQ(lines[6].rfind("  top copies:", 0), 0U) << lines[6];
  EXPECT_TRUE(ends_with(lines[7], " 2.00  " + long_copy)) << lines[7];  // 4000 B / 2000 ns
  EXPECT_EQ(lines[8].rfind("1 device(s), 3 events", 0), 0U) << lines[8];
}

}  // namespace
