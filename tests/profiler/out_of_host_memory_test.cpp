// The profilers when the host runs out of memory: allocations and frees through a real pool (bfc
// over the host resource, behind its per-thread cache as make_allocator composes it), inside
// named scopes, run with each operator new they reach made to fail in turn (a sweep: the 1st,
// the 2nd, ... until a run reaches no failure). The user's work
// must go on (an allocation may fail only with the pool's own std::bad_alloc, a free always
// completes), the process must not end, and each profiler must stay valid: what it saw is
// recorded or its loss is counted (or, where the collector gives up, logged), later events are
// recorded normally, and what it writes is well-formed. Skipped under sanitizers (the failing
// operator new is left out there; see tests/support/failing_new.hpp, whose operators
// nvtx_test.cpp brings into this test program).
#include <gtest/gtest.h>

#include <array>
#include <cstddef>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "poolscope/analysis/event_log.hpp"
#include "poolscope/hooks/hook.hpp"
#include "poolscope/log.hpp"
#include "poolscope/pool/bfc_allocator.hpp"
#include "poolscope/pool/host_resource.hpp"
#include "poolscope/pool/thread_cache_adaptor.hpp"
#include "poolscope/profiler/function_profiler.hpp"
#include "poolscope/profiler/line_profiler.hpp"
#include "poolscope/profiler/nvtx.hpp"
#include "poolscope/profiler/recorder.hpp"
#include "poolscope/profiler/scope.hpp"
#include "poolscope/profiler/timeline.hpp"
#include "support/failing_new.hpp"
#include "support/fixed_log_capture.hpp"
#include "support/three_pool_workload.hpp"
#include "trace_test_util.hpp"

namespace {

namespace pp = poolscope::profiler;
namespace ph = poolscope::hooks;
using poolscope::testing::cancel_failing_new;
using poolscope::testing::fail_nth_new;
using poolscope::testing::failing_new_available;
using poolscope::testing::fixed_log_capture;

char g_stream;
const poolscope::stream_view S{&g_stream};

/// A timeline writing to `path` without CUPTI (host events only).
pp::timeline_options without_cupti(const std::string& path) {
  pp::timeline_options o;
  o.trace_path = path;
  o.cupti = false;
  return o;
}

/// What one run of the workload did.
struct outcome {
  int allocations = 0;  // that succeeded
  int left = 0;         // cancel_failing_new(): > 0 when the failure was not reached
};

/// Inside a scope of `site`, the sweep's workload (support/three_pool_workload.hpp) with the
/// k-th operator new failing (the scope's open and close included).
outcome run_workload(poolscope::pool::allocator& alloc, const pp::scope_site& site, int k) {
  outcome o;
  fail_nth_new(k);
  {
    const pp::scope s{site, S};
    o.allocations = poolscope::testing::run_three_pool_workload(alloc, S).allocations;
  }
  o.left = cancel_failing_new();
  return o;
}

class profiler_out_of_host_memory : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!failing_new_available) {
      GTEST_SKIP() << "needs the failing operator new, left out under a sanitizer";
    }
    // This program loads the test NVTX tool (nvtx_test.cpp), which records each call with
    // operator new: the failures swept here are to hit poolscope, not that tool. Scopes stop
    // calling NVTX for the test (their NVTX path allocates nothing of poolscope's).
    (void)pp::nvtx_tool_attached();  // NVTX initialises (and sets the flag) first
    nvtx_was_on_ =
        (pp::detail::g_scope_flags.fetch_and(~pp::detail::flag_nvtx) & pp::detail::flag_nvtx) != 0;
  }
  void TearDown() override {
    if (nvtx_was_on_) {
      pp::detail::g_scope_flags.fetch_or(pp::detail::flag_nvtx);
    }
  }
  bool nvtx_was_on_ = false;
  poolscope::pool::host_resource host_;
  poolscope::pool::thread_cache_adaptor alloc_{
      std::make_unique<poolscope::pool::bfc_allocator>(host_)};
};

// Line profiler: each run either is attributed whole, or the profiler disabled itself, said so,
// and marked its report incomplete; after reset() it records again.
TEST_F(profiler_out_of_host_memory, line_profiler_records_or_disables_with_a_log_line) {
  static const pp::scope_site site{"oom_line"};
  for (int k = 1; k < 1000; ++k) {
    fixed_log_capture log;
    pp::line_profiler prof;
    outcome o;
    {
      ph::scoped_hook on{prof};
      o = run_workload(alloc_, site, k);
    }
    pp::line_profile r = prof.report({.symbolize = false});
    if (prof.enabled()) {
      EXPECT_TRUE(r.complete) << "new #" << k;
      EXPECT_EQ(r.root.total.count, static_cast<std::uint64_t>(o.allocations)) << "new #" << k;
      EXPECT_EQ(r.root.total.live, 0U) << "new #" << k;
    } else {
      EXPECT_FALSE(r.complete) << "new #" << k;
      EXPECT_TRUE(log.saw("line_profiler disabled")) << "new #" << k;
    }
    prof.reset();
    {
      ph::scoped_hook on{prof};
      void* p = alloc_.allocate(S, 1000);
      alloc_.deallocate(S, p, 1000);
    }
    EXPECT_TRUE(prof.enabled());
    EXPECT_EQ(prof.report({.symbolize = false}).root.total.count, 1U) << "new #" << k;
    if (o.left > 0) {
      EXPECT_EQ(o.allocations, 3);
      return;
    }
  }
  ADD_FAILURE() << "the workload reached 1000 allocations";
}

// Function profiler: every scope run is counted, or counted as lost; the memory inside counted
// scopes is attributed; scopes after the failure are counted normally.
TEST_F(profiler_out_of_host_memory, function_profiler_counts_each_scope_or_its_loss) {
  static const pp::scope_site site{"oom_function"};
  pp::function_profiler prof{{.gpu_timing = false}};
  int runs = 0;
  for (int k = 1; k < 1000; ++k) {
    const outcome o = run_workload(alloc_, site, k);
    ++runs;
    const pp::function_profile p = prof.report(false);
    const pp::scope_record* rec = p.find("oom_function");
    const std::uint64_t calls = rec != nullptr ? rec->calls : 0;
    EXPECT_EQ(calls + p.scopes_lost, static_cast<std::uint64_t>(runs)) << "new #" << k;
    if (o.left > 0) {
      ASSERT_NE(rec, nullptr);
      const pp::function_profile again = pp::function_profile::from_json(p.to_json());
      EXPECT_EQ(again, p);
      prof.stop();
      return;
    }
  }
  ADD_FAILURE() << "the workload reached 1000 allocations";
}

// Timeline: scopes (a name long enough that formatting it needs a new chunk buffer), with and
// without allocator events. Each slice is on the trace or counted as dropped, and the trace
// written at the end is well-formed.
TEST_F(profiler_out_of_host_memory, timeline_records_or_counts_and_writes_a_valid_trace) {
  static const pp::scope_site site = pp::scope_site::named(std::string(10000, 's'));
  for (const bool allocator_events : {false, true}) {
    SCOPED_TRACE(allocator_events ? "with allocator events" : "scopes only");
    pp::testing::temp_file f(".json");
    pp::timeline_options opts = without_cupti(f.path());
    opts.chunk_bytes = 4096;
    opts.allocator_events = allocator_events;
    pp::timeline tl{opts};
    tl.start();
    std::uint64_t runs = 0;
    bool done = false;
    for (int k = 1; k < 1000 && !done; ++k) {
      const outcome o = run_workload(alloc_, site, k);
      ++runs;
      const auto st = tl.stats();
      EXPECT_EQ(st.host_slices, runs) << "new #" << k << ": a closed scope was not counted once";
      done = o.left > 0;
    }
    EXPECT_TRUE(done) << "the workload reached 1000 allocations";
    // After the failures: a slice and allocator events are recorded normally.
    const auto before = tl.stats();
    (void)run_workload(alloc_, site, 0);
    const auto after = tl.stats();
    EXPECT_EQ(after.events_dropped, before.events_dropped);
    EXPECT_EQ(after.host_slices, before.host_slices + 1);
    tl.stop();
    const auto st = tl.stats();
    EXPECT_FALSE(st.write_failed) << st.write_error;
    pp::testing::expect_valid_trace(f.path());
    const auto events = pp::testing::read_events(f.path());
    EXPECT_EQ(events.size(), st.events_written);
    std::uint64_t slices = 0;
    for (const auto& e : pp::testing::events_of(events, "X")) {
      slices += e.value("name", "") == site.name() ? 1 : 0;
    }
    if (allocator_events) {
      // events_dropped counts lost allocator events too.
      EXPECT_GE(slices + st.events_dropped, st.host_slices);
      EXPECT_LE(slices, st.host_slices);
    } else {
      EXPECT_EQ(slices + st.events_dropped, st.host_slices);
    }
    EXPECT_GT(st.events_dropped, 0U) << "no failure reached the timeline: the test tests nothing";
  }
}

// Timeline stop() under memory pressure: it never ends the program; the trace it writes is
// well-formed, or the failure is in stats().
TEST_F(profiler_out_of_host_memory, timeline_stop_finishes_the_trace_or_reports_why) {
  static const pp::scope_site site{"oom_stop"};
  for (int k = 1; k < 1000; ++k) {
    pp::testing::temp_file f(".json");
    pp::timeline tl{without_cupti(f.path())};
    tl.start();
    (void)run_workload(alloc_, site, 0);
    fail_nth_new(k);
    tl.stop();
    const int left = cancel_failing_new();
    const auto st = tl.stats();
    EXPECT_FALSE(tl.running());
    if (st.write_failed) {
      EXPECT_FALSE(st.write_error.empty()) << "new #" << k;
    } else {
      pp::testing::expect_valid_trace(f.path());
      const auto events = pp::testing::read_events(f.path());
      EXPECT_EQ(events.size(), st.events_written) << "new #" << k;
    }
    if (left > 0) {
      EXPECT_FALSE(st.write_failed) << st.write_error;
      return;
    }
  }
  ADD_FAILURE() << "stop() reached 1000 allocations";
}

// Scope names registered without host memory: neither a named() site, nor a literal site, nor a
// scope with a run-time name throws; a name that could not be interned is counted as lost by the
// function profiler and the timeline while unregistered, and registers once memory is back (a
// literal site by itself, at its next scope). Each allocation registration makes fails in turn.
TEST_F(profiler_out_of_host_memory, scope_names_register_later_or_count_as_lost) {
  pp::function_profiler prof{{.gpu_timing = false}};
  std::uint64_t lost = 0;
  std::uint64_t counted = 0;
  int registered_at = 0;
  for (int k = 1; k < 100 && registered_at == 0; ++k) {
    // A new name for each run (made before the failure is armed): a known name allocates nothing.
    const std::string name = "oom_named_site_" + std::to_string(k) + std::string(40, 'n');
    fail_nth_new(k);
    const pp::scope_site site = pp::scope_site::named(name);
    const int left = cancel_failing_new();
    { const pp::scope s{site, S}; }
    const pp::function_profile p = prof.report(false);
    if (site.registered()) {
      EXPECT_EQ(site.name(), name);
      const pp::scope_record* rec = p.find(name);
      ASSERT_NE(rec, nullptr) << "new #" << k;
      EXPECT_EQ(rec->calls, 1U);
      ++counted;
      registered_at = left > 0 ? k : 0;
    } else {
      EXPECT_EQ(left, 0) << "unregistered although no allocation failed, new #" << k;
      EXPECT_TRUE(site.name().empty());
      EXPECT_EQ(p.find(name), nullptr);
      ++lost;
    }
    EXPECT_EQ(p.scopes_lost, lost) << "new #" << k;
  }
  EXPECT_GT(registered_at, 1) << "registration allocated nothing, or never succeeded";
  EXPECT_GT(lost, 0U);

  // A literal site made while its registration fails registers at its first scope after.
  const std::uint64_t lost_before = prof.report(false).scopes_lost;
  fail_nth_new(1);
  const pp::scope_site literal{"oom_literal_site_registered_late"};
  EXPECT_EQ(cancel_failing_new(), 0);
  EXPECT_FALSE(literal.registered());
  EXPECT_EQ(literal.name(), "oom_literal_site_registered_late");
  {
    fail_nth_new(1);  // the scope's own registration fails again: lost
    const pp::scope s{literal, S};
    EXPECT_EQ(cancel_failing_new(), 0);
  }
  EXPECT_FALSE(literal.registered());
  EXPECT_EQ(prof.report(false).scopes_lost, lost_before + 1);
  for (int i = 0; i < 2; ++i) {
    const pp::scope s{literal, S};
  }
  EXPECT_TRUE(literal.registered());
  const pp::scope_record* rec = prof.report(false).find("oom_literal_site_registered_late");
  ASSERT_NE(rec, nullptr);
  EXPECT_EQ(rec->calls, 2U);

  // A scope with a run-time name: lost while the name cannot be interned, counted after.
  const std::string runtime = "oom_runtime_scope_name" + std::string(40, 'r');
  {
    fail_nth_new(1);
    const pp::scope s{runtime, pp::category::user, S};
    EXPECT_EQ(cancel_failing_new(), 0);
  }
  { const pp::scope s{runtime, pp::category::user, S}; }
  const pp::function_profile last = prof.report(false);
  EXPECT_EQ(last.scopes_lost, lost_before + 2);
  ASSERT_NE(last.find(runtime), nullptr);
  EXPECT_EQ(last.find(runtime)->calls, 1U);
  prof.stop();
}

// A literal site left unregistered, then opened by several threads at once once memory is back:
// each registers it again (one name, one object whichever wins), and every scope is counted.
TEST_F(profiler_out_of_host_memory, threads_register_a_lost_literal_site_once_together) {
  fail_nth_new(1);
  const pp::scope_site site{"oom_literal_site_of_many_threads"};
  EXPECT_EQ(cancel_failing_new(), 0);
  ASSERT_FALSE(site.registered());
  pp::function_profiler prof{{.gpu_timing = false}};
  constexpr int threads = 4;
  constexpr int scopes = 200;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&site] {
      for (int i = 0; i < scopes; ++i) {
        const pp::scope s{site, S};
      }
    });
  }
  for (auto& th : pool) {
    th.join();
  }
  EXPECT_TRUE(site.registered());
  const pp::function_profile p = prof.report(false);
  EXPECT_EQ(p.scopes_lost, 0U);
  const pp::scope_record* rec = p.find("oom_literal_site_of_many_threads");
  ASSERT_NE(rec, nullptr);
  EXPECT_EQ(rec->calls, static_cast<std::uint64_t>(threads) * scopes);
  EXPECT_EQ(&site.info(), &pp::scope_site{"oom_literal_site_of_many_threads"}.info());
  prof.stop();
}

// A timeline counts a scope of an unregistered name as dropped, and records it once registered.
TEST_F(profiler_out_of_host_memory, timeline_counts_scopes_of_unregistered_names_as_dropped) {
  pp::testing::temp_file f(".json");
  pp::timeline tl{without_cupti(f.path())};
  tl.start();
  fail_nth_new(1);
  const pp::scope_site site{"oom_timeline_site_registered_late"};
  EXPECT_EQ(cancel_failing_new(), 0);
  ASSERT_FALSE(site.registered());
  const auto before = tl.stats();
  {
    fail_nth_new(1);
    const pp::scope s{site, S};
    EXPECT_EQ(cancel_failing_new(), 0);
  }
  const auto lost = tl.stats();
  EXPECT_EQ(lost.events_dropped, before.events_dropped + 1);
  EXPECT_EQ(lost.host_slices, before.host_slices + 1);  // closed, though not on the trace
  { const pp::scope s{site, S}; }
  EXPECT_TRUE(site.registered());
  tl.stop();
  const auto st = tl.stats();
  EXPECT_EQ(st.host_slices, before.host_slices + 2);
  std::uint64_t slices = 0;
  for (const auto& e : pp::testing::events_of(pp::testing::read_events(f.path()), "X")) {
    slices += e.value("name", "") == "oom_timeline_site_registered_late" ? 1 : 0;
  }
  EXPECT_EQ(slices, 1U);
}

// Event recorder: it allocates nothing per event, so every event of every run is in the log, and
// the log reads back.
TEST_F(profiler_out_of_host_memory, recorder_writes_every_event) {
  static const pp::scope_site site{"oom_recorder"};
  pp::testing::temp_file f(".jsonl");
  std::uint64_t allocations = 0;
  std::uint64_t lines = 0;
  {
    pp::recorder rec{f.path()};
    ph::scoped_hook on{rec};
    for (int k = 1; k < 1000; ++k) {
      const outcome o = run_workload(alloc_, site, k);
      allocations += static_cast<std::uint64_t>(o.allocations);
      if (o.left > 0) {
        break;
      }
    }
    EXPECT_TRUE(rec.flush());
    lines = rec.lines();
  }
  const poolscope::analysis::event_log log = poolscope::analysis::read_event_log(f.path());
  EXPECT_EQ(log.records.size(), lines);
  std::uint64_t mallocs = 0;
  for (const auto& r : log.records) {
    mallocs += r.kind == ph::event_kind::pool_malloc ? 1 : 0;
  }
  EXPECT_EQ(mallocs, allocations);
}

}  // namespace
