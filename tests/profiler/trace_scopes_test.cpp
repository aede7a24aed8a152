// Scopes on the timeline: every POOLSCOPE_SCOPE / profiler::scope closed while a timeline runs is
// a host slice on it (name, category, thread, open and close on hooks::now_ns), with or without
// a function profiler, on every running timeline. The traces are read back, compared with what
// the scopes did, and run through the checker. Suite trace_scopes_concurrency (also run under
// ThreadSanitizer) opens and closes scopes on threads while timelines start and stop.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "poolscope/hooks/event.hpp"
#include "poolscope/profiler/function_profiler.hpp"
#include "poolscope/profiler/scope.hpp"
#include "poolscope/profiler/timeline.hpp"
#include "trace_test_util.hpp"

namespace {

using nlohmann::json;
using poolscope::profiler::category;
using poolscope::profiler::timeline;
using poolscope::profiler::timeline_options;
using poolscope::profiler::testing::events_of;
using poolscope::profiler::testing::expect_valid_trace;
using poolscope::profiler::testing::read_events;
using poolscope::profiler::testing::temp_file;
using poolscope::profiler::testing::to_ns;

timeline_options host_only(const std::string& path) {
  timeline_options o;
  o.trace_path = path;
  o.cupti = false;
  o.allocator_events = false;
  return o;
}

std::uint32_t scope_flags() {
  return poolscope::profiler::detail::g_scope_flags.load();
}

/// A host slice as read back from the trace, times in ns since the trace's origin.
struct slice {
  std::string name;
  std::string cat;
  std::int64_t tid = 0;
  long long begin = 0;
  long long end = 0;
};

/// The X events whose name starts with `prefix`.
std::vector<slice> slices_named(const std::vector<json>& events, const std::string& prefix) {
  std::vector<slice> out;
  for (const auto& e : events_of(events, "X")) {
    const auto name = e.at("name").get<std::string>();
    if (name.rfind(prefix, 0) != 0) {
      continue;
    }
    EXPECT_EQ(e.at("pid"), poolscope::profiler::host_pid) << name;
    const long long b = to_ns(e.at("ts"));
    out.push_back({name, e.at("cat").get<std::string>(), e.at("tid").get<std::int64_t>(), b,
                   b + to_ns(e.at("dur"))});
  }
  return out;
}

/// True if `inner` lies within `outer` on the same track.
bool contains(const slice& outer, const slice& inner) {
  return outer.tid == inner.tid && outer.begin <= inner.begin && inner.end <= outer.end;
}

/// Nested scopes as a thread of the tests runs them: what it saw of the clock around each outer
/// scope, to compare with the slices.
struct thread_run {
  std::uint64_t tid = 0;
  std::vector<std::pair<std::uint64_t, std::uint64_t>>
      outer_spans;  // now_ns before open, after close
};

void nested_scopes(thread_run& run, int iterations) {
  run.tid = poolscope::hooks::current_thread_id();
  for (int i = 0; i < iterations; ++i) {
    const std::uint64_t before = poolscope::hooks::now_ns();
    {
      POOLSCOPE_SCOPE("ts.outer");
      {
        POOLSCOPE_SCOPE_IN(category::pool, "ts.inner");
        poolscope::profiler::scope dynamic{std::string("ts.dyn.") + std::to_string(i % 2),
                                           category::darray_compute};
      }
    }
    run.outer_spans.emplace_back(before, poolscope::hooks::now_ns());
  }
}

TEST(trace_scopes, nested_scopes_on_two_threads_are_host_slices) {
  constexpr int iterations = 5;
  temp_file f(".json");
  timeline tl(host_only(f.path()));
  EXPECT_EQ(scope_flags() & poolscope::profiler::detail::flag_timeline, 0U);
  std::uint64_t origin = 0;
  thread_run main_run;
  thread_run worker_run;
  {
    POOLSCOPE_SCOPE("ts.before_start");  // opened before the timeline runs: not on it
    tl.start();
    origin = tl.origin_ns();
    EXPECT_NE(scope_flags() & poolscope::profiler::detail::flag_timeline, 0U);
    std::thread worker([&] { nested_scopes(worker_run, iterations); });
    nested_scopes(main_run, iterations);
    worker.join();
  }
  {
    POOLSCOPE_SCOPE("ts.until_after_stop");  // still open at stop(): not on it either
    tl.stop();
  }
  EXPECT_EQ(scope_flags() & poolscope::profiler::detail::flag_timeline, 0U);
  { POOLSCOPE_SCOPE("ts.after_stop"); }

  expect_valid_trace(f.path());
  const auto events = read_events(f.path());
  EXPECT_EQ(events.size(), tl.stats().events_written);
  EXPECT_EQ(tl.stats().events_dropped, 0U);
  const auto all = slices_named(events, "ts.");
  EXPECT_EQ(tl.stats().host_slices, all.size());
  ASSERT_EQ(all.size(), 2U * 3U * iterations);

  // Both threads have their track, named.
  std::map<std::int64_t, std::string> thread_names;
  for (const auto& e : events_of(events, "M")) {
    if (e.at("name") == "thread_name" && e.at("pid") == poolscope::profiler::host_pid) {
      thread_names[e.at("tid").get<std::int64_t>()] = e.at("args").at("name").get<std::string>();
    }
  }
  for (const thread_run* run : {&main_run, &worker_run}) {
    const auto tid = static_cast<std::int64_t>(run->tid);
    SCOPED_TRACE("thread " + std::to_string(tid));
    EXPECT_TRUE(thread_names.contains(tid));
    std::vector<slice> outer;
    std::vector<slice> inner;
    std::vector<slice> dynamic;
    for (const auto& s : all) {
      if (s.tid != tid) {
        continue;
      }
      if (s.name == "ts.outer") {
        EXPECT_EQ(s.cat, "user");
        outer.push_back(s);
      } else if (s.name == "ts.inner") {
        EXPECT_EQ(s.cat, "pool");
        inner.push_back(s);
      } else {
        EXPECT_TRUE(s.name == "ts.dyn.0" || s.name == "ts.dyn.1") << s.name;
        EXPECT_EQ(s.cat, "darray.compute");
        dynamic.push_back(s);
      }
    }
    ASSERT_EQ(outer.size(), static_cast<std::size_t>(iterations));
    ASSERT_EQ(inner.size(), static_cast<std::size_t>(iterations));
    ASSERT_EQ(dynamic.size(), static_cast<std::size_t>(iterations));
    const auto by_begin = [](const slice& a, const slice& b) { return a.begin < b.begin; };
    std::sort(outer.begin(), outer.end(), by_begin);
    std::sort(inner.begin(), inner.end(), by_begin);
    std::sort(dynamic.begin(), dynamic.end(), by_begin);
    for (int i = 0; i < iterations; ++i) {
      const auto k = static_cast<std::size_t>(i);
      // Nesting: outer > inner > dynamic, iteration by iteration.
      EXPECT_TRUE(contains(outer[k], inner[k])) << "iteration " << i;
      EXPECT_TRUE(contains(inner[k], dynamic[k])) << "iteration " << i;
      EXPECT_EQ(dynamic[k].name, "ts.dyn." + std::to_string(i % 2));
      if (k > 0) {
        EXPECT_LE(outer[k - 1].end, outer[k].begin) << "outer scopes follow one another";
      }
      // On the now_ns clock: inside what the thread read around the scope.
      const auto [before, after] = run->outer_spans[k];
      EXPECT_LE(static_cast<long long>(before - origin), outer[k].begin);
      EXPECT_LE(outer[k].end, static_cast<long long>(after - origin));
    }
  }

  // The summary counts them by name and category.
  const auto summary = tl.summary();
  const auto outer_summary =
      std::find_if(summary.scopes.begin(), summary.scopes.end(),
                   [](const auto& s) { return s.name == "ts.outer" && s.category == "user"; });
  ASSERT_NE(outer_summary, summary.scopes.end());
  EXPECT_EQ(outer_summary->count, 2U * iterations);
  // Scopes name no device: the darray.compute ones are in no device's overlap analysis.
  EXPECT_TRUE(summary.overlap.empty());
}

TEST(trace_scopes, every_running_timeline_gets_the_slice_and_so_does_the_profiler) {
  temp_file fa(".json");
  temp_file fb(".json");
  timeline a(host_only(fa.path()));
  timeline b(host_only(fb.path()));
  poolscope::profiler::function_profiler_options po;
  po.gpu_timing = false;
  po.memory = false;
  a.start();
  {
    POOLSCOPE_SCOPE("ts.two.early");  // opened before b started: on a only
    b.start();
    poolscope::profiler::function_profiler prof{po};
    { POOLSCOPE_SCOPE("ts.two.both"); }
    prof.stop();
    const auto p = prof.report();
    ASSERT_NE(p.find("ts.two.both"), nullptr);
    EXPECT_EQ(p.find("ts.two.both")->calls, 1U);
  }
  b.stop();
  EXPECT_NE(scope_flags() & poolscope::profiler::detail::flag_timeline, 0U) << "a still runs";
  { POOLSCOPE_SCOPE("ts.two.late"); }  // b stopped: on a only
  a.stop();
  EXPECT_EQ(scope_flags() & poolscope::profiler::detail::flag_timeline, 0U);

  expect_valid_trace(fa.path());
  expect_valid_trace(fb.path());
  std::vector<std::string> on_a;
  std::vector<std::string> on_b;
  for (const auto& s : slices_named(read_events(fa.path()), "ts.two.")) {
    on_a.push_back(s.name);
  }
  for (const auto& s : slices_named(read_events(fb.path()), "ts.two.")) {
    on_b.push_back(s.name);
  }
  std::sort(on_a.begin(), on_a.end());
  EXPECT_EQ(on_a, (std::vector<std::string>{"ts.two.both", "ts.two.early", "ts.two.late"}));
  EXPECT_EQ(on_b, (std::vector<std::string>{"ts.two.both"}));
}

TEST(trace_scopes, a_timeline_without_scopes_leaves_them_alone) {
  temp_file f(".json");
  timeline_options o = host_only(f.path());
  o.scopes = false;
  timeline tl(o);
  tl.start();
  EXPECT_EQ(scope_flags() & poolscope::profiler::detail::flag_timeline, 0U);
  { POOLSCOPE_SCOPE("ts.off"); }
  tl.add_host_slice({.name = "ts.by_hand", .begin_ns = tl.origin_ns(), .end_ns = tl.origin_ns()});
  tl.stop();
  expect_valid_trace(f.path());
  const auto all = slices_named(read_events(f.path()), "ts.");
  ASSERT_EQ(all.size(), 1U);
  EXPECT_EQ(all[0].name, "ts.by_hand");
}

// ---- scopes on threads while timelines start and stop (also run under ThreadSanitizer) ------

TEST(trace_scopes_concurrency, scopes_close_on_threads_while_timelines_start_and_stop) {
  constexpr int threads = 4;
  constexpr int rounds = 24;
  std::atomic<bool> go{true};
  std::atomic<std::uint64_t> closed{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&] {
      while (go.load(std::memory_order_relaxed)) {
        POOLSCOPE_SCOPE("ts.mt.outer");
        { POOLSCOPE_SCOPE_IN(category::pool, "ts.mt.inner"); }
        closed.fetch_add(1, std::memory_order_relaxed);
        std::this_thread::yield();  // a pace that keeps the traces small
      }
    });
  }
  // Timelines come and go under the running scopes; every odd round a second one overlaps the
  // first and outlives it. Each is destroyed right after stop(): a scope still feeding it would
  // touch freed memory (ASan) or race with stop (TSan). The traces are read once all are done.
  struct finished {
    std::unique_ptr<temp_file> file;
    poolscope::profiler::timeline_stats stats;
  };
  std::vector<finished> done;
  struct running {
    std::unique_ptr<temp_file> file;
    std::unique_ptr<timeline> tl;
  };
  const auto finish = [&](running r) {
    r.tl->stop();
    done.push_back({std::move(r.file), r.tl->stats()});
    r.tl.reset();
  };
  std::optional<running> carried;
  for (int r = 0; r < rounds; ++r) {
    running now{std::make_unique<temp_file>(".json"), nullptr};
    now.tl = std::make_unique<timeline>(host_only(now.file->path()));
    now.tl->start();
    const std::uint64_t seen = closed.load();
    while (closed.load() < seen + 20) {
      std::this_thread::yield();
    }
    if (carried) {
      finish(std::move(*carried));
      carried.reset();
    }
    if (r % 2 == 1) {
      carried = std::move(now);
    } else {
      finish(std::move(now));
    }
  }
  if (carried) {
    finish(std::move(*carried));
  }
  EXPECT_EQ(scope_flags() & poolscope::profiler::detail::flag_timeline, 0U);
  go = false;
  for (auto& w : workers) {
    w.join();
  }

  std::uint64_t slices = 0;
  for (const auto& d : done) {
    expect_valid_trace(d.file->path());
    const auto events = read_events(d.file->path());
    EXPECT_EQ(events.size(), d.stats.events_written);
    const auto mine = slices_named(events, "ts.mt.");
    for (const auto& s : mine) {
      EXPECT_EQ(s.cat, s.name == "ts.mt.outer" ? "user" : "pool") << s.name;
    }
    EXPECT_EQ(mine.size() + d.stats.events_dropped, d.stats.host_slices);
    slices += mine.size();
  }
  EXPECT_GT(slices, 0U);
  std::cout << "[          ] " << slices << " slices on " << done.size() << " timelines\n";
}

}  // namespace
