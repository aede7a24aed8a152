// Hook interests (hook::interests, hooks::wants): a hook receives only the (kind, phase) pairs it
// asks for, an event nobody asks for is neither built nor numbered, and the registry's counts
// follow installations in and out, on every thread.
#include <gtest/gtest.h>

#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <thread>
#include <vector>

#include "hooks/recording_hook.hpp"
#include "poolscope/hooks/counting_hook.hpp"
#include "poolscope/hooks/hook.hpp"
#include "poolscope/hooks/jsonl_hook.hpp"
#include "poolscope/pool/best_fit_allocator.hpp"
#include "poolscope/pool/bfc_allocator.hpp"
#include "poolscope/pool/host_resource.hpp"

namespace {

namespace ph = poolscope::hooks;
using ph::event_filter;
using ph::event_kind;
using ph::event_phase;
using poolscope::pool::best_fit_allocator;
using poolscope::pool::host_resource;
using poolscope::testing::recording_hook;

constexpr event_phase phases[] = {event_phase::pre, event_phase::post, event_phase::instant};

/// The pairs hooks::wants() reports now, as a filter.
event_filter wanted_now() {
  event_filter f;
  for (int k = 0; k < ph::event_kind_count; ++k) {
    for (event_phase p : phases) {
      if (ph::wants(static_cast<event_kind>(k), p)) {
        f.add(static_cast<event_kind>(k), p);
      }
    }
  }
  return f;
}

/// The line profiler's pairs: allocations when done, frees before the memory is reusable.
event_filter alloc_post_free_pre() {
  return event_filter{}
      .add(event_kind::pool_malloc, event_phase::post)
      .add(event_kind::pool_free, event_phase::pre);
}

/// A few pairs of each size on `a`, so that every event kind of a plain workload happens.
void workload(poolscope::pool::allocator& a) {
  std::vector<void*> live;
  for (std::size_t bytes : {100, 5000, 100, 70000}) {
    live.push_back(a.allocate({}, bytes));
  }
  std::size_t i = 0;
  for (std::size_t bytes : {100, 5000, 100, 70000}) {
    a.deallocate({}, live[i++], bytes);
  }
}

TEST(event_filter, sets_and_tests_each_pair_alone) {
  EXPECT_TRUE(event_filter{}.empty());
  EXPECT_FALSE(event_filter::all().empty());
  for (int k = 0; k < ph::event_kind_count; ++k) {
    for (event_phase p : phases) {
      const auto kind = static_cast<event_kind>(k);
      event_filter one;
      one.add(kind, p);
      EXPECT_TRUE(one.contains(kind, p));
      EXPECT_TRUE(event_filter::all().contains(kind, p));
      EXPECT_EQ(std::popcount(one.bits()), 1) << "kind " << k;
      EXPECT_TRUE(event_filter::all().remove(kind, p) != event_filter::all());
      EXPECT_FALSE(event_filter::all().remove(kind, p).contains(kind, p));
    }
  }
  // lifetimes(): allocations when done, frees before the memory is reusable, blocks and segments.
  EXPECT_EQ(event_filter::lifetimes(), alloc_post_free_pre()
                                           .add(event_kind::device_alloc, event_phase::post)
                                           .add(event_kind::device_free, event_phase::pre));
  EXPECT_EQ(std::popcount(event_filter::lifetimes().bits()), 4);
  // add(kind) is the kind in all three phases, and nothing else.
  const event_filter split = event_filter{}.add(event_kind::split);
  EXPECT_EQ(std::popcount(split.bits()), 3);
  EXPECT_TRUE(split.contains(event_kind::split, event_phase::instant));
  EXPECT_FALSE(split.contains(event_kind::merge, event_phase::instant));
}

TEST(hooks_interests, wants_follows_installations_in_and_out) {
  ASSERT_TRUE(wanted_now().empty());
  recording_hook narrow{0, alloc_post_free_pre()};
  {
    ph::scoped_hook a{narrow};
    EXPECT_EQ(wanted_now(), alloc_post_free_pre());
    ph::counting_hook all;
    {
      ph::scoped_hook b{all};
      EXPECT_EQ(wanted_now(), event_filter::all());
      ph::scoped_hook again{narrow, ph::scope::thread};  // a second installation of the same hook
      EXPECT_EQ(wanted_now(), event_filter::all());
    }
    EXPECT_EQ(wanted_now(), alloc_post_free_pre());
  }
  EXPECT_TRUE(wanted_now().empty());
  EXPECT_FALSE(ph::active());
}

TEST(hooks_interests, a_hook_receives_only_what_it_asks_for_beside_one_that_takes_all) {
  host_resource host;
  best_fit_allocator a{host};
  recording_hook narrow{a.id(), alloc_post_free_pre()};
  recording_hook all{a.id()};
  {
    ph::scoped_hook on_all{all};
    ph::scoped_hook on_narrow{narrow};
    workload(a);
  }
  // The reference: what the unfiltered hook saw, restricted to the narrow hook's pairs.
  std::vector<ph::event> expected;
  for (const auto& r : all.events()) {
    if (alloc_post_free_pre().contains(r.e.kind, r.e.phase)) {
      expected.push_back(r.e);
    }
  }
  const auto got = narrow.events();
  ASSERT_EQ(got.size(), expected.size());
  ASSERT_EQ(got.size(), 8U);  // four allocations, four frees
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].e.seq, expected[i].seq) << i;  // the same events, not copies
    EXPECT_EQ(got[i].e.ptr, expected[i].ptr) << i;
  }
  EXPECT_GT(all.size(), got.size());  // the pre-malloc and post-free events went to `all` only
}

TEST(hooks_interests, events_nobody_asks_for_are_not_numbered) {
  host_resource host;
  best_fit_allocator a{host};
  recording_hook narrow{a.id(), alloc_post_free_pre()};
  {
    ph::scoped_hook on{narrow};
    workload(a);
    workload(a);
  }
  const auto got = narrow.events();
  ASSERT_EQ(got.size(), 16U);
  for (const auto& r : got) {
    EXPECT_TRUE(alloc_post_free_pre().contains(r.e.kind, r.e.phase));
  }
  // Only the delivered events took sequence numbers: consecutive within this single-threaded
  // run (the pre-malloc and post-free events, and best_fit's others, were never built).
  for (std::size_t i = 1; i < got.size(); ++i) {
    EXPECT_EQ(got[i].e.seq, got[i - 1].e.seq + 1) << i;
  }
}

TEST(hooks_interests, bfc_builds_split_and_merge_only_for_a_hook_that_wants_them) {
  host_resource host;
  poolscope::pool::bfc_allocator a{host};
  const event_filter chunks = event_filter{}.add(event_kind::split).add(event_kind::merge);
  recording_hook splits{a.id(), chunks};
  recording_hook allocs{a.id(), alloc_post_free_pre()};
  {
    ph::scoped_hook on_allocs{allocs};
    workload(a);  // splits and merges happen, but nobody wants them
  }
  for (const auto& r : allocs.events()) {
    EXPECT_TRUE(alloc_post_free_pre().contains(r.e.kind, r.e.phase));
  }
  {
    ph::scoped_hook on_splits{splits};
    workload(a);
  }
  ASSERT_FALSE(splits.events().empty());
  bool split_seen = false;
  for (const auto& r : splits.events()) {
    EXPECT_TRUE(r.e.kind == event_kind::split || r.e.kind == event_kind::merge);
    split_seen = split_seen || r.e.kind == event_kind::split;
  }
  EXPECT_TRUE(split_seen);
}

TEST(hooks_interests, a_thread_hook_counts_until_its_thread_exits) {
  recording_hook narrow{0, alloc_post_free_pre()};
  std::atomic<int> step{0};
  std::thread other([&] {
    ph::install(narrow, ph::scope::thread);  // left installed: the thread's exit takes it off
    step.store(1);
    while (step.load() != 2) {
      std::this_thread::yield();
    }
  });
  while (step.load() != 1) {
    std::this_thread::yield();
  }
  EXPECT_EQ(wanted_now(), alloc_post_free_pre());
  step.store(2);
  other.join();
  EXPECT_TRUE(wanted_now().empty());
  EXPECT_FALSE(ph::active());
}

TEST(hooks_interests, a_hook_asking_for_nothing_receives_nothing) {
  host_resource host;
  best_fit_allocator a{host};
  recording_hook none{a.id(), event_filter{}};
  {
    ph::scoped_hook on{none};
    EXPECT_TRUE(ph::active());  // installed, so allocators look, but build nothing
    EXPECT_TRUE(wanted_now().empty());
    workload(a);
  }
  EXPECT_EQ(none.size(), 0U);
  EXPECT_EQ(a.stats().in_use, 0U);
}

TEST(hooks_interests, jsonl_hook_asks_for_its_kinds_in_every_phase) {
  std::ostringstream out;
  ph::jsonl_hook j{out, {event_kind::pool_free, event_kind::oom}};
  const event_filter f = j.interests();
  EXPECT_EQ(f, event_filter{}.add(event_kind::pool_free).add(event_kind::oom));
  ph::jsonl_hook every{out};
  EXPECT_EQ(every.interests(), event_filter::all());
}

/// Keeps the seq and time_ns of every event it receives; asks for sequence numbers and
/// timestamps, or not.
class fields_hook final : public ph::hook {
 public:
  fields_hook(bool wants_sequence, bool wants_time)
      : wants_sequence_(wants_sequence), wants_time_(wants_time) {}
  void on_event(const ph::event& e) noexcept override {
    seqs.push_back(e.seq);
    times.push_back(e.time_ns);
  }
  [[nodiscard]] bool wants_sequence() const noexcept override { return wants_sequence_; }
  [[nodiscard]] bool wants_time() const noexcept override { return wants_time_; }
  std::vector<std::uint64_t> seqs;  // single-threaded tests only
  std::vector<std::uint64_t> times;

 private:
  bool wants_sequence_;
  bool wants_time_;
};

// seq and time_ns are given only while a hook that reads them is installed (process-wide or on
// this thread): a hook that reads neither, alone, sees zeros; beside one that reads both, it sees
// the same strictly increasing numbers, from 1, and monotonic times taken during the workload.
TEST(hooks_interests, events_are_numbered_and_timed_only_while_a_hook_wants_it) {
  host_resource host;
  best_fit_allocator a{host};
  fields_hook plain{false, false};
  const auto expect_all_zero = [&plain] {
    ASSERT_FALSE(plain.seqs.empty());
    for (std::size_t i = 0; i < plain.seqs.size(); ++i) {
      EXPECT_EQ(plain.seqs[i], 0U) << i;   // no process-wide counter was written
      EXPECT_EQ(plain.times[i], 0U) << i;  // no clock was read
    }
  };
  {
    ph::scoped_hook on{plain};
    workload(a);
  }
  expect_all_zero();
  for (const ph::scope where : {ph::scope::process, ph::scope::thread}) {
    SCOPED_TRACE(where == ph::scope::process ? "process" : "thread");
    fields_hook both{true, true};
    plain.seqs.clear();
    plain.times.clear();
    const std::uint64_t before = ph::now_ns();
    {
      ph::scoped_hook on_plain{plain};
      ph::scoped_hook on_both{both, where};
      workload(a);
    }
    const std::uint64_t after = ph::now_ns();
    ASSERT_EQ(plain.seqs, both.seqs);
    ASSERT_EQ(plain.times, both.times);
    ASSERT_FALSE(both.seqs.empty());
    EXPECT_GE(both.seqs.front(), 1U);
    EXPECT_GE(both.times.front(), before);
    EXPECT_LE(both.times.back(), after);
    for (std::size_t i = 1; i < both.seqs.size(); ++i) {
      EXPECT_GT(both.seqs[i], both.seqs[i - 1]) << i;
      EXPECT_GE(both.times[i], both.times[i - 1]) << i;
    }
  }
  // Once it is gone, neither is given again.
  plain.seqs.clear();
  plain.times.clear();
  {
    ph::scoped_hook on{plain};
    workload(a);
  }
  expect_all_zero();
  // The counting hook asks for neither; a hook by default asks for both.
  ph::counting_hook counts;
  EXPECT_FALSE(counts.wants_sequence());
  EXPECT_FALSE(counts.wants_time());
  std::ostringstream out;
  ph::jsonl_hook every{out};
  EXPECT_TRUE(every.wants_sequence());
  EXPECT_TRUE(every.wants_time());
}

// Numbers and times are given before the first receiver: a hook that reads neither, delivered
// before the one that reads both (installed after it, or on this thread against a process-wide
// one), sees the same values. A reader of other events only gives these none.
TEST(hooks_interests, every_receiver_sees_the_numbers_whatever_the_delivery_order) {
  host_resource host;
  best_fit_allocator a{host};
  for (const ph::scope plain_where : {ph::scope::process, ph::scope::thread}) {
    SCOPED_TRACE(plain_where == ph::scope::process ? "plain process-wide, installed last"
                                                   : "plain on this thread");
    fields_hook both{true, true};
    fields_hook plain{false, false};
    {
      ph::scoped_hook on_both{both};                 // delivered last
      ph::scoped_hook on_plain{plain, plain_where};  // delivered first
      workload(a);
    }
    ASSERT_FALSE(plain.seqs.empty());
    EXPECT_EQ(plain.seqs, both.seqs);
    EXPECT_EQ(plain.times, both.times);
    for (std::size_t i = 0; i < plain.seqs.size(); ++i) {
      EXPECT_GE(plain.seqs[i], 1U) << i;
      EXPECT_GE(plain.times[i], 1U) << i;
    }
  }
  // A reader of oom events alone: the workload raises none, and numbers and times nothing.
  struct oom_reader final : ph::hook {
    void on_event(const ph::event& /*e*/) noexcept override {}
    [[nodiscard]] event_filter interests() const noexcept override {
      return event_filter{}.add(event_kind::oom, event_phase::instant);
    }
  } oom;
  fields_hook plain{false, false};
  {
    ph::scoped_hook on_oom{oom};
    ph::scoped_hook on_plain{plain};
    workload(a);
  }
  ASSERT_FALSE(plain.seqs.empty());
  for (std::size_t i = 0; i < plain.seqs.size(); ++i) {
    EXPECT_EQ(plain.seqs[i], 0U) << i;
    EXPECT_EQ(plain.times[i], 0U) << i;
  }
}

// A hook that reads seq and time_ns, installed and removed over and over while other threads
// raise events that another hook (reading neither) already receives: every event it gets carries
// both, even one that was in flight when it was installed.
TEST(hooks_interests_concurrency, a_hook_installed_while_events_fly_gets_seq_and_time) {
  host_resource host;
  best_fit_allocator a{host};
  ph::counting_hook
      counts;  // reads neither: events flow unnumbered and untimed without the checker
  struct checker final : ph::hook {
    std::atomic<std::uint64_t> events{0};
    std::atomic<std::uint64_t> without_seq{0};
    std::atomic<std::uint64_t> without_time{0};
    void on_event(const ph::event& e) noexcept override {
      events.fetch_add(1, std::memory_order_relaxed);
      without_seq.fetch_add(e.seq == 0 ? 1 : 0, std::memory_order_relaxed);
      without_time.fetch_add(e.time_ns == 0 ? 1 : 0, std::memory_order_relaxed);
    }
  } check;
  ph::scoped_hook on{counts};
  std::atomic<bool> stop{false};
  std::vector<std::thread> raisers;
  for (int t = 0; t < 2; ++t) {
    raisers.emplace_back([&] {
      while (!stop.load(std::memory_order_relaxed)) {
        workload(a);
      }
    });
  }
  while (counts.snapshot().total_calls() < 1000) {  // the raisers are running
    std::this_thread::yield();
  }
  // Rounds until the checker has seen events from many of them (bounded: a stuck raiser fails the
  // count below rather than hanging).
  for (int round = 0; round < 100000 && check.events.load() < 20000; ++round) {
    ph::scoped_hook checking{check};
    std::this_thread::yield();
  }
  stop.store(true, std::memory_order_relaxed);
  for (auto& th : raisers) {
    th.join();
  }
  EXPECT_GT(check.events.load(), 0U);
  EXPECT_EQ(check.without_seq.load(), 0U);
  EXPECT_EQ(check.without_time.load(), 0U);
}

// Threads install and remove narrow hooks (process and thread scope) while all of them allocate
// under a process-wide counting hook that takes everything: the counts come out exact and the
// registry ends with nothing wanted.
TEST(hooks_interests_concurrency, installs_beside_events_leave_exact_counts_and_nothing_wanted) {
  host_resource host;
  best_fit_allocator a{host};
  ph::counting_hook every;
  constexpr int threads = 4;
  constexpr int rounds = 200;
  {
    ph::scoped_hook on{every};
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        recording_hook narrow{a.id(), alloc_post_free_pre()};
        for (int r = 0; r < rounds; ++r) {
          if ((r + t) % 2 == 0) {
            ph::scoped_hook here{narrow, ph::scope::thread};
            workload(a);
          } else {
            ph::scoped_hook everywhere{narrow};
            workload(a);
          }
        }
        // Its own thread-scope rounds, at least, each gave it all 8 of its pairs.
        EXPECT_GE(narrow.size(), static_cast<std::size_t>(rounds / 2) * 8);
      });
    }
    for (auto& th : pool) {
      th.join();
    }
  }
  const auto c = every.snapshot();
  EXPECT_EQ(c.of(event_kind::pool_malloc, event_phase::post).calls,
            static_cast<std::uint64_t>(threads) * rounds * 4);
  EXPECT_EQ(c.of(event_kind::pool_free, event_phase::post).calls,
            static_cast<std::uint64_t>(threads) * rounds * 4);
  EXPECT_TRUE(wanted_now().empty());
  EXPECT_FALSE(ph::active());
}

}  // namespace
