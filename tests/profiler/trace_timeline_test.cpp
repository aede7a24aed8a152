// timeline on the CPU: a host-only run (scopes, allocator instants, memory counters) and
// synthetic device records (what the CUPTI collector delivers), each trace read back, checked
// against what was fed in, and run through the checker; the JSON report built from it.
#include "poolscope/profiler/timeline.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "poolscope/analysis/trace_summary.hpp"
#include "poolscope/error.hpp"
#include "poolscope/hooks/event.hpp"
#include "poolscope/hooks/hook.hpp"
#include "poolscope/log.hpp"
#include "poolscope/pool/bfc_allocator.hpp"
#include "poolscope/pool/host_resource.hpp"
#include "poolscope/profiler/report.hpp"
#include "trace_test_util.hpp"

namespace {

using nlohmann::json;
using poolscope::profiler::activity_kind;
using poolscope::profiler::copy_kind;
using poolscope::profiler::device_activity;
using poolscope::profiler::host_slice;
using poolscope::profiler::marker_phase;
using poolscope::profiler::run_report;
using poolscope::profiler::timeline;
using poolscope::profiler::timeline_options;
using poolscope::profiler::testing::events_of;
using poolscope::profiler::testing::expect_valid_trace;
using poolscope::profiler::testing::read_events;
using poolscope::profiler::testing::temp_file;
using poolscope::profiler::testing::to_ns;

/// Remembers every post/instant allocator event, and each upstream call (device_alloc,
/// device_free) from its pre to its post event: the reference for what the trace must hold.
class recording_hook final : public poolscope::hooks::hook {
 public:
  struct upstream_call {
    std::string name;  // "upstream alloc" / "upstream free"
    std::uint64_t thread;
    std::uint64_t begin_ns;
    std::uint64_t end_ns;
    std::uint64_t bytes;
  };
  void on_event(const poolscope::hooks::event& e) noexcept override {
    using poolscope::hooks::event_kind;
    const bool upstream = e.kind == event_kind::device_alloc || e.kind == event_kind::device_free;
    std::lock_guard lock(mutex_);
    if (e.phase == poolscope::hooks::event_phase::pre) {
      if (upstream) {
        began_[e.thread] = e.time_ns;
      }
      return;
    }
    events_.push_back(e);
    if (upstream && began_.contains(e.thread)) {
      calls_.push_back({e.kind == event_kind::device_alloc ? "upstream alloc" : "upstream free",
                        e.thread, began_[e.thread], e.time_ns, e.rounded});
      began_.erase(e.thread);
    }
  }
  std::vector<poolscope::hooks::event> events() {
    std::lock_guard lock(mutex_);
    return events_;
  }
  std::vector<upstream_call> calls() {
    std::lock_guard lock(mutex_);
    return calls_;
  }

 private:
  std::mutex mutex_;
  std::vector<poolscope::hooks::event> events_;
  std::map<std::uint64_t, std::uint64_t> began_;  // thread -> its upstream call's pre event
  std::vector<upstream_call> calls_;
};

timeline_options host_only(const std::string& path) {
  timeline_options o;
  o.trace_path = path;
  o.cupti = false;
  return o;
}

TEST(trace_timeline, host_only_run_with_scopes_allocator_events_and_counters) {
  temp_file f(".json");
  recording_hook reference;
  std::uint64_t worker_tid = 0;
  const std::uint64_t main_tid = poolscope::hooks::current_thread_id();
  poolscope::pool::host_resource host;
  timeline tl(host_only(f.path()));
  tl.start();
  poolscope::pool::allocator_stats final_stats;
  {
    poolscope::hooks::scoped_hook on{reference};
    poolscope::pool::bfc_allocator pool(host);
    const std::uint64_t t0 = poolscope::hooks::now_ns();
    std::vector<void*> blocks;
    for (int i = 0; i < 20; ++i) {
      const std::uint64_t b = poolscope::hooks::now_ns();
      blocks.push_back(pool.allocate({}, 1000 + 4096 * static_cast<std::size_t>(i)));
      tl.add_host_slice({.name = "alloc",
                         .category = "pool",
                         .begin_ns = b,
                         .end_ns = poolscope::hooks::now_ns()});
    }
    std::thread worker([&] {
      worker_tid = poolscope::hooks::current_thread_id();
      const std::uint64_t b = poolscope::hooks::now_ns();
      void* p = pool.allocate({}, 1 << 20);
      pool.deallocate({}, p, 1 << 20);
      tl.add_host_slice(
          {.name = "worker step", .begin_ns = b, .end_ns = poolscope::hooks::now_ns()});
    });
    worker.join();
    for (std::size_t i = 0; i < blocks.size(); i += 2) {
      pool.deallocate({}, blocks[i], 1000 + 4096 * i);
    }
    (void)pool.release_cached();
    tl.add_host_slice(
        {.name = "run", .category = "user", .begin_ns = t0, .end_ns = poolscope::hooks::now_ns()});
    final_stats = pool.stats();
    for (std::size_t i = 1; i < blocks.size(); i += 2) {
      pool.deallocate({}, blocks[i], 1000 + 4096 * i);
    }
  }  // the pool's destructor raises its last events while both hooks are installed
  tl.stop();
  expect_valid_trace(f.path());
  const auto events = read_events(f.path());
  const auto st = tl.stats();
  EXPECT_EQ(st.events_dropped, 0U);
  EXPECT_EQ(st.events_written, events.size());
  EXPECT_FALSE(st.write_failed);

  // Upstream calls: a slice each (cat "allocator"), from its pre to its post event, on the
  // calling thread, in the order made (each thread's calls come one after another).
  const auto calls = reference.calls();
  const auto upstream = events_of(events, "X", "allocator");
  ASSERT_EQ(upstream.size(), calls.size());
  ASSERT_GE(calls.size(), 2U);  // the pool's segments taken, and given back by release_cached
  // (name, thread, bytes, duration in µs): sorted alike, as the trace's rounding to the
  // nanosecond keeps the order of durations.
  std::multiset<std::tuple<std::string, std::uint64_t, std::uint64_t, double>> want_calls;
  std::multiset<std::tuple<std::string, std::uint64_t, std::uint64_t, double>> got_calls;
  for (const auto& c : calls) {
    want_calls.insert(
        {c.name, c.thread, c.bytes, static_cast<double>(c.end_ns - c.begin_ns) / 1000.0});
  }
  for (const auto& s : upstream) {
    EXPECT_EQ(s["pid"], poolscope::profiler::host_pid);
    EXPECT_EQ(s["args"]["allocator"], "bfc/host");
    got_calls.insert({s["name"].get<std::string>(), s["tid"].get<std::uint64_t>(),
                      s["args"]["bytes"].get<std::uint64_t>(), s["dur"].get<double>()});
  }
  ASSERT_EQ(got_calls.size(), want_calls.size());
  for (auto w = want_calls.begin(), g = got_calls.begin(); w != want_calls.end(); ++w, ++g) {
    EXPECT_EQ(std::get<0>(*g), std::get<0>(*w));
    EXPECT_EQ(std::get<1>(*g), std::get<1>(*w));
    EXPECT_EQ(std::get<2>(*g), std::get<2>(*w));
    EXPECT_NEAR(std::get<3>(*g), std::get<3>(*w), 0.0015);  // µs with three decimals
  }

  // Host slices: 20 "alloc" in "pool", one "run", one "worker step" on the worker's track.
  std::vector<json> slices;
  for (const auto& s : events_of(events, "X")) {
    if (s["cat"] != "allocator") {
      slices.push_back(s);
    }
  }
  ASSERT_EQ(slices.size(), 22U);
  EXPECT_EQ(events_of(events, "X", "pool").size(), 20U);
  for (const auto& s : slices) {
    const auto tid = s["tid"].get<std::uint64_t>();
    EXPECT_EQ(tid, s["name"] == "worker step" ? worker_tid : main_tid);
    EXPECT_EQ(s["pid"], poolscope::profiler::host_pid);
  }
  // Allocator instants: one per post/instant event the reference saw, on the raising thread,
  // in the same order per thread.
  const auto ref = reference.events();
  const auto instants = events_of(events, "i", "allocator");
  ASSERT_EQ(instants.size(), ref.size());
  EXPECT_EQ(st.allocator_events, ref.size());
  std::multiset<std::uint64_t> ref_seq;
  std::multiset<std::uint64_t> trace_seq;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    ref_seq.insert(ref[i].seq);
    trace_seq.insert(instants[i]["args"]["seq"].get<std::uint64_t>());
  }
  EXPECT_EQ(ref_seq, trace_seq);
  for (const auto& e : instants) {
    const auto& kind = e["name"];
    EXPECT_TRUE(kind == "pool_malloc" || kind == "pool_free" || kind == "device_alloc" ||
                kind == "device_free" || kind == "split" || kind == "merge" || kind == "release")
        << kind;
    EXPECT_EQ(e["args"]["allocator"], "bfc/host");
  }
  // Counters: the values of the allocator after its last event, on the host process.
  const auto counters = events_of(events, "C");
  ASSERT_FALSE(counters.empty());
  json last_own;
  json last_all;
  for (const auto& c : counters) {
    EXPECT_EQ(c["pid"], poolscope::profiler::host_pid);
    if (c["name"] == "memory (all pools)") {
      last_all = c;
    } else {
      EXPECT_EQ(c["name"].get<std::string>().rfind("memory bfc/host #", 0), 0U) << c;
      last_own = c;
    }
  }
  EXPECT_EQ(last_own["args"]["in_use"], 0);
  EXPECT_EQ(last_own["args"]["reserved"], ref.back().reserved);
  EXPECT_EQ(last_all["args"], last_own["args"]);  // one pool: the total is the pool

  // Summaries: peaks as the allocator counted them, scopes as added.
  const auto sum = tl.summary();
  ASSERT_EQ(sum.memory.size(), 1U);
  EXPECT_EQ(sum.memory[0].peak_in_use, final_stats.peak_in_use);
  EXPECT_EQ(sum.memory[0].peak_reserved, final_stats.peak_reserved);
  EXPECT_EQ(sum.memory[0].final_in_use, 0U);
  EXPECT_EQ(sum.memory[0].device, -1);
  ASSERT_EQ(sum.device_memory.size(), 1U);
  EXPECT_EQ(sum.device_memory[0].peak_in_use, final_stats.peak_in_use);
  ASSERT_EQ(sum.scopes.size(), 3U);
  EXPECT_EQ(sum.scopes[0].name, "run");  // the longest
  std::map<std::string, std::uint64_t> counts;
  for (const auto& s : sum.scopes) {
    counts[s.name] = s.count;
  }
  EXPECT_EQ(counts["alloc"], 20U);
  EXPECT_EQ(counts["worker step"], 1U);
  EXPECT_TRUE(sum.overlap.empty());  // no device activity, no darray slices
  EXPECT_EQ(sum.cupti.state, poolscope::profiler::cupti_state::off);

  // Both threads are named; the host process too.
  std::set<std::uint64_t> named;
  for (const auto& m : events_of(events, "M")) {
    if (m["name"] == "thread_name") {
      named.insert(m["tid"].get<std::uint64_t>());
    }
  }
  EXPECT_TRUE(named.count(main_tid) == 1 && named.count(worker_tid) == 1);
}

TEST(trace_timeline, allocator_instants_can_be_left_out) {
  temp_file f(".json");
  poolscope::pool::host_resource host;
  auto o = host_only(f.path());
  o.allocator_instants = false;
  timeline tl(o);
  tl.start();
  {
    poolscope::pool::bfc_allocator pool(host);
    void* p = pool.allocate({}, 4096);
    pool.deallocate({}, p, 4096);
  }
  tl.stop();
  const auto events = read_events(f.path());
  EXPECT_TRUE(events_of(events, "i").empty());
  EXPECT_FALSE(events_of(events, "C").empty());
  expect_valid_trace(f.path());
}

// A slice on a track of the caller's own (a thread id no thread has) names it by track_name; a
// thread's track keeps the thread's name.
TEST(trace_timeline, a_track_of_the_callers_own_takes_its_name) {
  temp_file f(".json");
  timeline tl(host_only(f.path()));
  tl.start();
  constexpr std::uint64_t track = std::uint64_t{1} << 30;
  const auto t = poolscope::hooks::now_ns();
  tl.add_host_slice({.name = "a",
                     .thread = track,
                     .track_name = "transfers, device 3",
                     .begin_ns = t,
                     .end_ns = t + 10});
  tl.add_host_slice({.name = "b",
                     .thread = track,
                     .track_name = "ignored: named already",
                     .begin_ns = t + 20,
                     .end_ns = t + 30});
  tl.add_host_slice({.name = "c", .begin_ns = t, .end_ns = t + 10});
  tl.stop();
  expect_valid_trace(f.path());
  std::map<std::int64_t, std::string> names;
  for (const json& m : events_of(read_events(f.path()), "M")) {
    if (m["name"] == "thread_name") {
      names[m["tid"].get<std::int64_t>()] = m["args"]["name"].get<std::string>();
    }
  }
  EXPECT_EQ(names[static_cast<std::int64_t>(track)], "transfers, device 3");
  const auto me = static_cast<std::int64_t>(poolscope::hooks::current_thread_id());
  EXPECT_NE(names[me].find("(tid " + std::to_string(me) + ")"), std::string::npos) << names[me];
}

// A slice's args: its device; both ends of a copy between devices; and clock_error_ns where its
// times may be off the host clock (a GPU span), on a device's slice and never otherwise.
TEST(trace_timeline, host_slices_carry_their_devices_and_clock_error) {
  temp_file f(".json");
  timeline tl(host_only(f.path()));
  tl.start();
  const auto t = poolscope::hooks::now_ns();
  tl.add_host_slice({.name = "plain", .begin_ns = t, .end_ns = t + 10, .clock_error_ns = 7});
  tl.add_host_slice({.name = "on 2", .begin_ns = t, .end_ns = t + 10, .device = 2});
  tl.add_host_slice({.name = "copy",
                     .category = "darray.piece",
                     .begin_ns = t,
                     .end_ns = t + 10,
                     .device = 1,
                     .src_device = 1,
                     .dst_device = 4,
                     .clock_error_ns = 2'500});
  tl.stop();
  expect_valid_trace(f.path());
  std::map<std::string, json> by_name;
  for (const json& e : events_of(read_events(f.path()), "X")) {
    by_name[e["name"].get<std::string>()] = e;
  }
  EXPECT_FALSE(by_name["plain"].contains("args"));
  EXPECT_EQ(by_name["on 2"]["args"], (json{{"device", 2}}));
  EXPECT_EQ(by_name["copy"]["args"],
            (json{{"device", 1}, {"src_device", 1}, {"dst_device", 4}, {"clock_error_ns", 2500}}));
}

TEST(trace_timeline, gzip_trace_passes_the_checker) {
  if (!poolscope::profiler::trace_gzip_supported()) {
    GTEST_SKIP() << "built without zlib";
  }
  temp_file f(".json.gz");
  timeline tl(host_only(f.path()));
  tl.start();
  for (int i = 0; i < 100; ++i) {
    const auto t = poolscope::hooks::now_ns();
    tl.add_host_slice({.name = "s", .begin_ns = t, .end_ns = t + 10});
  }
  tl.stop();
  const std::string bytes = poolscope::profiler::testing::read_bytes(f.path());
  ASSERT_FALSE(bytes.empty());
  EXPECT_EQ(static_cast<unsigned char>(bytes[0]), 0x1f);
  EXPECT_EQ(events_of(read_events(f.path()), "X").size(), 100U);
  expect_valid_trace(f.path());
}

// Host events are dropped, never waited for, when the writer falls behind; what is written plus
// what is dropped is exactly what was added, whatever the timing.
TEST(trace_timeline, dropped_events_are_counted_exactly) {
  temp_file f(".json");
  auto o = host_only(f.path());
  o.chunk_bytes = 4096;
  o.max_pending_chunks = 1;
  o.writer.chunk_bytes = 4096;
  timeline tl(o);
  tl.start();
  constexpr int threads = 4;
  constexpr int per_thread = 5000;
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&tl] {
      for (int i = 0; i < per_thread; ++i) {
        const auto now = poolscope::hooks::now_ns();
        tl.add_host_slice({.name = "tiny", .begin_ns = now, .end_ns = now + 1});
      }
    });
  }
  for (auto& t : ts) {
    t.join();
  }
  tl.stop();
  const auto st = tl.stats();
  EXPECT_EQ(st.host_slices, static_cast<std::uint64_t>(threads * per_thread));
  const auto events = read_events(f.path());
  EXPECT_EQ(events_of(events, "X").size() + st.events_dropped, st.host_slices);
  EXPECT_EQ(events.size(), st.events_written);
  std::printf("dropped %llu of %llu host slices\n",
              static_cast<unsigned long long>(st.events_dropped),
              static_cast<unsigned long long>(st.host_slices));
  expect_valid_trace(f.path());
}

TEST(trace_timeline, write_failure_is_logged_once_and_never_thrown) {
  std::vector<std::string> errors;
  std::mutex m;
  poolscope::set_log_sink([&](poolscope::log_level l, std::string_view msg) {
    if (l == poolscope::log_level::error) {
      std::lock_guard lock(m);
      errors.emplace_back(msg);
    }
  });
  {
    timeline_options o = host_only("/dev/full");
    o.chunk_bytes = 4096;
    o.writer.chunk_bytes = 4096;
    timeline tl(o);
    tl.start();
    for (int i = 0; i < 20000; ++i) {
      const auto now = poolscope::hooks::now_ns();
      tl.add_host_slice({.name = "x", .begin_ns = now, .end_ns = now + 1});
    }
    tl.stop();
    const auto st = tl.stats();
    EXPECT_TRUE(st.write_failed);
    EXPECT_NE(st.write_error.find("/dev/full"), std::string::npos) << st.write_error;
  }
  poolscope::set_log_sink({});
  EXPECT_EQ(errors.size(), 1U);
}

TEST(trace_timeline, events_outside_the_session_are_counted_not_written) {
  temp_file f(".json");
  timeline tl(host_only(f.path()));
  tl.add_host_slice({.name = "early", .begin_ns = 1, .end_ns = 2});
  tl.start();
  tl.stop();
  tl.add_host_slice({.name = "late", .begin_ns = 1, .end_ns = 2});
  EXPECT_EQ(tl.stats().outside_session, 2U);
  EXPECT_TRUE(events_of(read_events(f.path()), "X").empty());
  expect_valid_trace(f.path());
  EXPECT_THROW(tl.start(), poolscope::logic_error);
  EXPECT_THROW(timeline(timeline_options{}), poolscope::invalid_argument);
}

// ---------------------------------------------------------------------------------------------
// Synthetic device records: flows, names, clipping, NVTX, synchronization, CUDA memory.

device_activity api(activity_kind k, std::string_view name, std::uint32_t corr,
                    std::uint64_t thread, std::uint64_t b, std::uint64_t e) {
  device_activity a;
  a.kind = k;
  a.name = name;
  a.correlation = corr;
  a.thread = thread;
  a.start_ns = b;
  a.end_ns = e;
  return a;
}

device_activity op(activity_kind k, std::uint32_t device, std::uint32_t stream, std::uint32_t corr,
                   std::uint64_t b, std::uint64_t e) {
  device_activity a;
  a.kind = k;
  a.device = device;
  a.stream = stream;
  a.correlation = corr;
  a.start_ns = b;
  a.end_ns = e;
  return a;
}

TEST(trace_timeline, synthetic_device_records) {
  temp_file f(".json");
  timeline tl(host_only(f.path()));
  tl.start();
  const std::uint64_t o = tl.origin_ns();
  const std::uint64_t t = poolscope::hooks::current_thread_id();
  using k = activity_kind;
  // A host scope around everything, on the launching thread.
  tl.add_host_slice({.name = "step", .thread = t, .begin_ns = o + 100, .end_ns = o + 90'000});
  // Launch (runtime + nested driver call, same correlation) then its kernel.
  tl.add_device_activity(api(k::runtime_api, "cudaLaunchKernel", 1, t, o + 1'000, o + 3'000));
  tl.add_device_activity(api(k::driver_api, "cuLaunchKernel", 1, t, o + 1'500, o + 2'500));
  device_activity kern = op(k::kernel, 0, 7, 1, o + 10'000, o + 20'000);
  kern.name = "_Z6scale2PfS_i";
  kern.grid = {128, 1, 1};
  kern.block = {256, 1, 1};
  tl.add_device_activity(kern);
  // A copy whose record arrives before its API call's.
  device_activity copy = op(k::memcpy, 0, 8, 2, o + 12'000, o + 16'000);
  copy.copy = copy_kind::htod;
  copy.bytes = 8000;
  tl.add_device_activity(copy);
  tl.add_device_activity(api(k::runtime_api, "cudaMemcpyAsync", 2, t, o + 4'000, o + 5'000));
  // A memset, a second kernel on stream 7 overlapping the first by 500 ns (clipped).
  device_activity ms = op(k::memset, 0, 8, 3, o + 17'000, o + 18'000);
  ms.bytes = 1000;
  tl.add_device_activity(api(k::runtime_api, "cudaMemsetAsync", 3, t, o + 5'500, o + 6'000));
  tl.add_device_activity(ms);
  device_activity kern2 = op(k::kernel, 0, 7, 4, o + 19'500, o + 25'000);
  kern2.name = "plain_c_kernel";
  tl.add_device_activity(api(k::runtime_api, "cudaLaunchKernel", 4, t, o + 6'500, o + 7'000));
  tl.add_device_activity(kern2);
  // One API call launching two kernels (a graph): two flows.
  tl.add_device_activity(api(k::runtime_api, "cudaGraphLaunch", 5, t, o + 7'500, o + 8'000));
  device_activity g1 = op(k::kernel, 1, 9, 5, o + 30'000, o + 31'000);
  g1.name = "_Z2g1v";
  device_activity g2 = op(k::kernel, 1, 9, 5, o + 31'000, o + 32'000);
  g2.name = "_Z2g2v";
  tl.add_device_activity(g1);
  tl.add_device_activity(g2);
  // NCCL and a peer copy on device 1, overlapping each other.
  device_activity nccl = op(k::kernel, 1, 10, 6, o + 40'000, o + 50'000);
  nccl.name = "ncclDevKernel_AllReduce_Sum_f32_RING_LL";
  tl.add_device_activity(api(k::runtime_api, "cudaLaunchKernelExC", 6, t, o + 8'200, o + 8'400));
  tl.add_device_activity(nccl);
  device_activity peer = op(k::memcpy, 1, 11, 7, o + 45'000, o + 47'000);
  peer.copy = copy_kind::ptop;
  peer.peer = true;
  peer.src_device = 1;
  peer.dst_device = 0;
  peer.bytes = 2'000'000;
  tl.add_device_activity(peer);  // its API call never shows up: no flow
  // A kernel whose record is incomplete (no end): counted, not written.
  device_activity unfinished = op(k::kernel, 0, 7, 8, o + 60'000, 0);
  unfinished.name = "late";
  tl.add_device_activity(unfinished);
  // NVTX: a range (start, end), an unmatched end, an instant.
  device_activity m;
  m.kind = k::marker;
  m.marker = marker_phase::start;
  m.marker_id = 1;
  m.thread = t;
  m.start_ns = m.end_ns = o + 200;
  m.name = "nvtx range";
  tl.add_device_activity(m);
  m.marker = marker_phase::end;
  m.name = {};
  m.start_ns = m.end_ns = o + 80'000;
  tl.add_device_activity(m);
  m.marker_id = 99;
  tl.add_device_activity(m);
  m.marker = marker_phase::instant;
  m.marker_id = 2;
  m.name = "mark";
  m.start_ns = m.end_ns = o + 300;
  tl.add_device_activity(m);
  // A stream synchronization and a CUDA allocation.
  device_activity sync = op(k::synchronization, 0, 7, 9, o + 26'000, o + 27'000);
  sync.sync = poolscope::profiler::sync_kind::stream_synchronize;
  tl.add_device_activity(sync);
  device_activity mem = op(k::memory, 0, poolscope::profiler::no_stream, 10, o + 500, o + 500);
  mem.bytes = 1 << 20;
  mem.address = 0x7f0000000000;
  tl.add_device_activity(mem);
  tl.stop();

  expect_valid_trace(f.path());
  const auto events = read_events(f.path());
  const auto st = tl.stats();
  EXPECT_EQ(st.incomplete_records, 1U);
  EXPECT_EQ(st.device_clipped, 1U);
  EXPECT_EQ(st.nvtx_unmatched, 1U);
  EXPECT_EQ(st.unlinked_device_ops, 1U);  // the peer copy
  EXPECT_EQ(st.flows, 7U);                // kern, copy, memset, kern2, g1, g2, nccl

  // Kernels: demangled names, NCCL recognised, args.
  std::map<std::string, json> by_name;
  for (const auto& e : events_of(events, "X")) {
    by_name[e["name"].get<std::string>()] = e;
  }
  ASSERT_TRUE(by_name.count("scale2(float*, float*, int)")) << "demangled name";
  const json& k1 = by_name["scale2(float*, float*, int)"];
  EXPECT_EQ(k1["cat"], "kernel");
  EXPECT_EQ(k1["pid"], poolscope::profiler::device_pid(0));
  EXPECT_EQ(k1["tid"], 7);
  EXPECT_EQ(k1["args"]["grid"], "[128,1,1]");
  EXPECT_EQ(k1["args"]["mangled"], "_Z6scale2PfS_i");
  EXPECT_EQ(to_ns(k1["ts"]), 10'000);
  EXPECT_EQ(to_ns(k1["dur"]), 10'000);
  // The second kernel started 500 ns before the first ended: clipped to start at its end.
  const json& k2 = by_name["plain_c_kernel"];
  EXPECT_EQ(to_ns(k2["ts"]), 20'000);
  EXPECT_EQ(to_ns(k2["dur"]), 5'000);
  EXPECT_EQ(k2["args"]["clipped_ns"], 500);
  EXPECT_EQ(by_name["ncclDevKernel_AllReduce_Sum_f32_RING_LL"]["cat"], "nccl");
  const json& c = by_name["Memcpy HtoD"];
  EXPECT_EQ(c["cat"], "memcpy");
  EXPECT_EQ(c["args"]["bytes"], 8000);
  EXPECT_DOUBLE_EQ(c["args"]["gbps"].get<double>(), 2.0);  // 8000 B / 4000 ns
  const json& p = by_name["Memcpy PtoP"];
  EXPECT_EQ(p["args"]["src_device"], 1);
  EXPECT_EQ(p["args"]["dst_device"], 0);
  EXPECT_DOUBLE_EQ(p["args"]["gbps"].get<double>(), 1000.0);
  EXPECT_EQ(by_name["Memset"]["cat"], "memset");
  EXPECT_EQ(by_name.count("late"), 0U);
  // API calls on the host thread's track, nested in the scope.
  EXPECT_EQ(by_name["cuLaunchKernel"]["tid"].get<std::uint64_t>(), t);
  EXPECT_EQ(by_name["cudaLaunchKernel"]["cat"], "cuda_api");

  // Flows: every launched op but the peer copy, each s on the host thread at its API call's
  // start, each f on the op's track at its (clipped) start; ids unique.
  const auto starts = events_of(events, "s", "launch");
  const auto ends = events_of(events, "f", "launch");
  ASSERT_EQ(starts.size(), 7U);
  ASSERT_EQ(ends.size(), 7U);
  std::set<std::uint64_t> ids;
  std::map<long long, long long> end_of_start;  // s ts -> f ts, per id
  for (std::size_t i = 0; i < starts.size(); ++i) {
    ids.insert(starts[i]["id"].get<std::uint64_t>());
    EXPECT_EQ(starts[i]["tid"].get<std::uint64_t>(), t);
    EXPECT_EQ(ends[i]["id"], starts[i]["id"]);
    EXPECT_EQ(ends[i]["bp"], "e");
  }
  EXPECT_EQ(ids.size(), 7U);
  // The kernel's flow starts at the runtime call (the outer one), not the driver call.
  bool kernel_flow = false;
  for (std::size_t i = 0; i < starts.size(); ++i) {
    if (to_ns(ends[i]["ts"]) == 10'000) {
      EXPECT_EQ(to_ns(starts[i]["ts"]), 1'000);
      kernel_flow = true;
    }
  }
  EXPECT_TRUE(kernel_flow);

  // NVTX range as an async slice; the mark as an instant; sync as an async slice; CUDA memory.
  const auto b = events_of(events, "b", "nvtx");
  ASSERT_EQ(b.size(), 1U);
  EXPECT_EQ(b[0]["name"], "nvtx range");
  EXPECT_EQ(to_ns(b[0]["ts"]), 200);
  const auto e = events_of(events, "e", "nvtx");
  ASSERT_EQ(e.size(), 1U);
  EXPECT_EQ(to_ns(e[0]["ts"]), 80'000);
  ASSERT_EQ(events_of(events, "i", "nvtx").size(), 1U);
  const auto sb = events_of(events, "b", "sync");
  ASSERT_EQ(sb.size(), 1U);
  EXPECT_EQ(sb[0]["name"], "cudaStreamSynchronize");
  const auto cm = events_of(events, "i", "cuda_memory");
  ASSERT_EQ(cm.size(), 1U);
  EXPECT_EQ(cm[0]["args"]["bytes"], 1 << 20);
  EXPECT_EQ(cm[0]["args"]["address"], "0x7f0000000000");
  EXPECT_EQ(cm[0]["tid"], poolscope::profiler::cuda_memory_tid);

  // Summary: overlap per device from the raw (unclipped) intervals, by hand:
  //  device 0: compute [10000,20000) + [19500,25000) = [10000,25000) = 15000;
  //            transfer [12000,16000) = 4000, all overlapped, plus the peer copy 1 -> 0 that
  //            lands here [45000,47000) = 2000, not overlapped; other (memset) 1000.
  //  device 1: compute [30000,32000) = 2000; transfer NCCL [40000,50000) + peer inside = 10000,
  //            no overlap.
  const auto sum = tl.summary();
  ASSERT_EQ(sum.overlap.size(), 2U);
  EXPECT_EQ(sum.overlap[0].compute_ns, 15'000U);
  EXPECT_EQ(sum.overlap[0].transfer_ns, 6'000U);
  EXPECT_EQ(sum.overlap[0].both_ns, 4'000U);
  EXPECT_DOUBLE_EQ(sum.overlap[0].overlap_ratio, 4.0 / 6.0);
  EXPECT_EQ(sum.overlap[0].other_ns, 1'000U);
  EXPECT_EQ(sum.overlap[1].compute_ns, 2'000U);
  EXPECT_EQ(sum.overlap[1].transfer_ns, 10'000U);
  EXPECT_DOUBLE_EQ(sum.overlap[1].overlap_ratio, 0.0);
  EXPECT_EQ(sum.overlap[0].window_ns, sum.stop_ns - sum.start_ns);
  // Kernel and copy summaries.
  ASSERT_EQ(sum.kernels.size(), 5U);
  EXPECT_EQ(sum.kernels[0].name, "ncclDevKernel_AllReduce_Sum_f32_RING_LL");
  EXPECT_EQ(sum.kernels[0].category, "nccl");
  EXPECT_EQ(sum.kernels[1].name, "scale2(float*, float*, int)");
  ASSERT_EQ(sum.copies.size(), 3U);
  std::map<std::string, poolscope::profiler::op_summary> copies;
  for (const auto& cs : sum.copies) {
    copies[cs.name] = cs;
  }
  EXPECT_EQ(copies["Memcpy PtoP"].device, 1);
  EXPECT_EQ(copies["Memcpy HtoD"].bytes, 8000U);
  EXPECT_EQ(copies["Memset"].category, "memset");

  // The same answers from the file, through `trace summary`'s library function.
  const auto from_file = poolscope::analysis::summarize_trace(f.path());
  ASSERT_EQ(from_file.devices.size(), 2U);
  // The file holds the clipped kernel ([20000,25000)): the union is the same.
  EXPECT_EQ(from_file.devices[0].compute_ns, 15'000U);
  EXPECT_EQ(from_file.devices[0].both_ns, 4'000U);
  EXPECT_EQ(from_file.devices[1].transfer_ns, 10'000U);
}

// ---------------------------------------------------------------------------------------------
// The JSON report.

TEST(trace_timeline, report_holds_the_summaries_and_profiles) {
  temp_file trace(".json");
  temp_file out(".report.json");
  poolscope::pool::host_resource host;
  timeline tl(host_only(trace.path()));
  tl.start();
  {
    poolscope::pool::bfc_allocator pool(host);
    void* p = pool.allocate({}, 3000);
    const auto t0 = poolscope::hooks::now_ns();
    // As a host backend's transfer and compute workers would: each on its own thread.
    tl.add_host_slice({.name = "reshard",
                       .category = "darray.transfer",
                       .thread = 900001,
                       .begin_ns = t0,
                       .end_ns = t0 + 1000,
                       .device = 2});
    tl.add_host_slice({.name = "add",
                       .category = "darray.compute",
                       .thread = 900002,
                       .begin_ns = t0 + 500,
                       .end_ns = t0 + 2000,
                       .device = 2});
    pool.deallocate({}, p, 3000);
  }
  tl.stop();
  expect_valid_trace(trace.path());
  run_report r = run_report::from(tl);
  r.add_profile("function", json{{"scopes", json::array({{{"name", "step"}}})}});
  r.add_profile("line", json::parse(R"({"total":{"count":1}})"));
  r.set_metadata("command", "poolscope demo");
  EXPECT_THROW(r.set_metadata("cupti", 1), poolscope::invalid_argument);
  r.write(out.path());
  const json j = json::parse(poolscope::profiler::testing::read_bytes(out.path()));
  EXPECT_EQ(j["schema"], "poolscope.report");
  EXPECT_EQ(j["version"], 1);
  EXPECT_EQ(j["run"]["command"], "poolscope demo");
  EXPECT_EQ(j["run"]["trace_file"], trace.path());
  EXPECT_EQ(j["run"]["cupti"]["state"], "off");
  EXPECT_EQ(j["run"]["clock"], "CLOCK_MONOTONIC");
  EXPECT_GT(j["run"]["duration_ns"].get<std::uint64_t>(), 0U);
  EXPECT_EQ(j["run"]["timeline"]["host_slices"], 2);
  EXPECT_EQ(j["profiles"]["function"]["scopes"][0]["name"], "step");
  EXPECT_EQ(j["profiles"]["line"]["total"]["count"], 1);
  ASSERT_EQ(j["memory"]["allocators"].size(), 1U);
  EXPECT_EQ(j["memory"]["allocators"][0]["allocator"], "bfc/host");
  EXPECT_GE(j["memory"]["allocators"][0]["peak_in_use"].get<std::uint64_t>(), 3000U);
  ASSERT_EQ(j["scopes"].size(), 2U);
  // darray slices count on the device they name: transfer [0,1000), compute [500,2000).
  ASSERT_EQ(j["overlap"].size(), 1U);
  EXPECT_EQ(j["overlap"][0]["device"], 2);
  EXPECT_EQ(j["overlap"][0]["transfer_ns"], 1000);
  EXPECT_EQ(j["overlap"][0]["compute_ns"], 1500);
  EXPECT_EQ(j["overlap"][0]["both_ns"], 500);
  EXPECT_DOUBLE_EQ(j["overlap"][0]["overlap_ratio"].get<double>(), 0.5);
  EXPECT_TRUE(j["kernels"].empty());
  EXPECT_TRUE(j["copies"].empty());
  // The darray slices carry their device in the trace.
  const auto xs = events_of(read_events(trace.path()), "X", "darray.transfer");
  ASSERT_EQ(xs.size(), 1U);
  EXPECT_EQ(xs[0]["args"]["device"], 2);
}

}  // namespace
