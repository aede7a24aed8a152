// The hook registry: scoped installation, stacking order, uninstall, thread scope, sequence
// numbers and clock, reentrancy.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>
#include <utility>
#include <vector>

#include "hooks/recording_hook.hpp"
#include "poolscope/error.hpp"
#include "poolscope/hooks/counting_hook.hpp"
#include "poolscope/hooks/hook.hpp"
#include "poolscope/pool/best_fit_allocator.hpp"
#include "poolscope/pool/host_resource.hpp"
#include "poolscope/pool/naive_allocator.hpp"

namespace {

namespace ph = poolscope::hooks;
using poolscope::stream_view;
using poolscope::pool::host_resource;
using poolscope::pool::naive_allocator;
using poolscope::testing::recording_hook;

/// Appends its tag to a shared list on every event (single-threaded tests only).
class tag_hook final : public ph::hook {
 public:
  tag_hook(std::vector<int>& order, int tag) : order_(&order), tag_(tag) {}
  void on_event(const ph::event& /*e*/) noexcept override { order_->push_back(tag_); }

 private:
  std::vector<int>* order_;
  int tag_;
};

ph::event sample_event() {
  ph::event e;
  e.kind = ph::event_kind::pool_malloc;
  e.phase = ph::event_phase::post;
  e.requested = 64;
  e.rounded = 64;
  return e;
}

std::uint64_t calls(const ph::counting_hook& h) {
  return h.snapshot().total_calls();
}

TEST(hooks_registry, inactive_when_nothing_installed) {
  EXPECT_FALSE(ph::active());
  // An allocator used with nothing installed raises nothing and leaves the registry inactive.
  host_resource host;
  naive_allocator a{host};
  a.deallocate({}, a.allocate({}, 100), 100);
  EXPECT_FALSE(ph::active());
}

TEST(hooks_registry, scoped_process_hook_is_installed_for_its_scope) {
  ph::counting_hook c;
  {
    ph::scoped_hook on{c};
    EXPECT_TRUE(ph::active());
    auto e = sample_event();
    ph::dispatch(e);
    EXPECT_EQ(calls(c), 1U);
  }
  EXPECT_FALSE(ph::active());
  host_resource host;
  naive_allocator a{host};
  a.deallocate({}, a.allocate({}, 100), 100);
  EXPECT_EQ(calls(c), 1U) << "an uninstalled hook must not receive events";
}

TEST(hooks_registry, scoped_thread_hook_is_installed_for_its_scope) {
  ph::counting_hook c;
  {
    ph::scoped_hook on{c, ph::scope::thread};
    EXPECT_TRUE(ph::active());
    auto e = sample_event();
    ph::dispatch(e);
  }
  EXPECT_FALSE(ph::active());
  auto e = sample_event();
  ph::dispatch(e);
  EXPECT_EQ(calls(c), 1U);
}

TEST(hooks_registry, stacking_order_thread_innermost_first_then_process_most_recent_first) {
  std::vector<int> order;
  tag_hook p1{order, 1};
  tag_hook p2{order, 2};
  tag_hook t1{order, 11};
  tag_hook t2{order, 12};
  {
    ph::scoped_hook a{p1};
    ph::scoped_hook b{t1, ph::scope::thread};
    ph::scoped_hook c{p2};
    ph::scoped_hook d{t2, ph::scope::thread};
    auto e = sample_event();
    ph::dispatch(e);
    EXPECT_EQ(order, (std::vector<int>{12, 11, 2, 1}));
  }
  order.clear();
  auto e = sample_event();
  ph::dispatch(e);
  EXPECT_TRUE(order.empty());
}

TEST(hooks_registry, uninstall_removes_the_most_recent_installation) {
  std::vector<int> order;
  tag_hook p1{order, 1};
  tag_hook p2{order, 2};
  ph::install(p1);
  ph::install(p2);
  ph::install(p1);  // the same hook twice: it is called twice
  auto e = sample_event();
  ph::dispatch(e);
  EXPECT_EQ(order, (std::vector<int>{1, 2, 1}));

  order.clear();
  EXPECT_TRUE(ph::uninstall(p1));  // the later p1 goes
  ph::dispatch(e);
  EXPECT_EQ(order, (std::vector<int>{2, 1}));

  EXPECT_FALSE(ph::uninstall(p2, ph::scope::thread)) << "p2 is installed process-wide only";
  order.clear();
  EXPECT_TRUE(ph::uninstall(p2));
  ph::dispatch(e);
  EXPECT_EQ(order, (std::vector<int>{1}));

  EXPECT_TRUE(ph::uninstall(p1));
  EXPECT_FALSE(ph::uninstall(p1)) << "nothing left to uninstall";
  EXPECT_FALSE(ph::active());
}

TEST(hooks_registry, thread_hook_does_not_see_other_threads_events) {
  host_resource host;
  naive_allocator a{host};
  recording_hook mine{a.id()};
  recording_hook everyone{a.id()};
  ph::scoped_hook on_process{everyone};
  ph::scoped_hook on_thread{mine, ph::scope::thread};

  std::thread other([&] {
    for (int i = 0; i < 10; ++i) {
      a.deallocate({}, a.allocate({}, 128), 128);
    }
  });
  other.join();
  EXPECT_EQ(mine.size(), 0U) << "the thread hook saw another thread's events";
  const std::size_t others = everyone.size();
  EXPECT_EQ(everyone.of(ph::event_kind::pool_malloc, ph::event_phase::post).size(), 10U);

  a.deallocate({}, a.allocate({}, 128), 128);
  ASSERT_GT(mine.size(), 0U);
  EXPECT_EQ(mine.size(), everyone.size() - others);
  for (const auto& r : mine.events()) {
    EXPECT_EQ(r.e.thread, ph::current_thread_id());
  }
}

TEST(hooks_registry, a_thread_hook_anywhere_makes_the_registry_active) {
  ph::counting_hook c;
  std::atomic<int> step{0};
  std::thread other([&] {
    ph::scoped_hook on{c, ph::scope::thread};
    step.store(1);
    while (step.load() != 2) {
      std::this_thread::yield();
    }
  });
  while (step.load() != 1) {
    std::this_thread::yield();
  }
  EXPECT_TRUE(ph::active());
  auto e = sample_event();
  ph::dispatch(e);  // raised here: the other thread's hook must not see it
  step.store(2);
  other.join();
  EXPECT_FALSE(ph::active());
  EXPECT_EQ(calls(c), 0U);
}

TEST(hooks_registry, seq_strictly_increasing_and_time_monotonic) {
  host_resource host;
  poolscope::pool::best_fit_allocator a{host};
  recording_hook rec;
  ph::scoped_hook on{rec, ph::scope::thread};
  std::vector<std::pair<void*, std::size_t>> live;
  for (std::size_t i = 0; i < 200; ++i) {
    const std::size_t bytes = 100 + i * 37;
    live.emplace_back(a.allocate({}, bytes), bytes);
    if (i % 3 == 0) {
      a.deallocate({}, live.front().first, live.front().second);
      live.erase(live.begin());
    }
  }
  for (auto [p, bytes] : live) {
    a.deallocate({}, p, bytes);
  }
  (void)a.release_cached();
  const auto events = rec.events();
  ASSERT_GT(events.size(), 400U);
  const auto tid = ph::current_thread_id();
  for (std::size_t i = 1; i < events.size(); ++i) {
    EXPECT_LT(events[i - 1].e.seq, events[i].e.seq) << "at event " << i;
    EXPECT_LE(events[i - 1].e.time_ns, events[i].e.time_ns) << "at event " << i;
    EXPECT_EQ(events[i].e.thread, tid);
  }
  const std::uint64_t before = ph::now_ns();
  auto e = sample_event();
  ph::dispatch(e);
  EXPECT_GE(rec.events().back().e.time_ns, before) << "time_ns is not on the now_ns() clock";
  EXPECT_LE(rec.events().back().e.time_ns, ph::now_ns());
}

// A hook that allocates through a poolscope allocator when it sees the outer allocator's
// malloc-post: the nested events must be dropped and counted, never delivered.
class allocating_hook final : public ph::hook {
 public:
  allocating_hook(std::uint32_t outer_id, poolscope::pool::allocator& inner)
      : outer_id_(outer_id), inner_(&inner) {}

  void on_event(const ph::event& e) noexcept override {
    ++depth_;
    max_depth_ = std::max(max_depth_, depth_);
    ++seen_;
    if (e.allocator_id != outer_id_) {
      ++foreign_;
    }
    if (e.kind == ph::event_kind::pool_malloc && e.phase == ph::event_phase::post) {
      try {
        void* p = inner_->allocate({}, 4096);
        inner_->deallocate({}, p, 4096);
        ++nested_pairs_;
      } catch (...) {
        ++nested_failures_;
      }
    }
    --depth_;
  }

  int max_depth_ = 0;
  int seen_ = 0;
  int foreign_ = 0;
  int nested_pairs_ = 0;
  int nested_failures_ = 0;

 private:
  std::uint32_t outer_id_;
  poolscope::pool::allocator* inner_;
  int depth_ = 0;
};

TEST(hooks_registry, reentrant_events_are_dropped_and_counted) {
  host_resource host;
  naive_allocator outer{host};
  naive_allocator inner{host};

  // How many events one inner allocate+free pair raises, measured with nothing reentrant.
  std::uint64_t per_pair = 0;
  {
    ph::counting_hook c;
    ph::scoped_hook on{c, ph::scope::thread};
    inner.deallocate({}, inner.allocate({}, 4096), 4096);
    per_pair = calls(c);
  }
  ASSERT_EQ(per_pair, 8U);  // malloc pre/post, device_alloc pre/post, free pre/post, device_free

  allocating_hook h{outer.id(), inner};
  const std::uint64_t dropped_before = ph::dropped_reentrant_events();
  {
    ph::scoped_hook on{h, ph::scope::thread};
    for (int i = 0; i < 3; ++i) {
      outer.deallocate({}, outer.allocate({}, 100), 100);
    }
  }
  EXPECT_EQ(h.nested_pairs_, 3);
  EXPECT_EQ(h.nested_failures_, 0);
  EXPECT_EQ(h.max_depth_, 1) << "a hook was re-entered";
  EXPECT_EQ(h.foreign_, 0) << "a nested event from inside the hook was delivered";
  EXPECT_EQ(h.seen_, 3 * 8) << "each outer pair raises 8 events";
  EXPECT_EQ(ph::dropped_reentrant_events() - dropped_before, 3 * per_pair);

  // The nested operations really happened and left the inner allocator consistent.
  const auto s = inner.stats();
  EXPECT_EQ(s.allocations, 4U);
  EXPECT_EQ(s.deallocations, 4U);
  EXPECT_EQ(s.in_use, 0U);
  EXPECT_EQ(host.allocated_bytes(), 0U);
}

TEST(hooks_registry, install_from_inside_a_hook_is_refused) {
  struct installing_hook final : ph::hook {
    ph::counting_hook other;
    bool threw_logic_error = false;
    bool uninstall_result = true;
    void on_event(const ph::event& /*e*/) noexcept override {
      try {
        ph::install(other);
      } catch (const poolscope::logic_error&) {
        threw_logic_error = true;
      } catch (...) {
      }
      uninstall_result = ph::uninstall(*this, ph::scope::thread);
    }
  } h;
  {
    ph::scoped_hook on{h, ph::scope::thread};
    auto e = sample_event();
    ph::dispatch(e);
    EXPECT_TRUE(h.threw_logic_error);
    EXPECT_FALSE(h.uninstall_result);
  }
  EXPECT_FALSE(ph::active()) << "the refused install must not leave an installation behind";
}

TEST(hooks_registry, dispatch_fills_seq_time_and_thread) {
  recording_hook rec;
  ph::scoped_hook on{rec, ph::scope::thread};
  auto e = sample_event();
  e.seq = 0;
  e.time_ns = 0;
  e.thread = 0;
  ph::dispatch(e);
  ph::dispatch(e);
  const auto events = rec.events();
  ASSERT_EQ(events.size(), 2U);
  EXPECT_GT(events[1].e.seq, events[0].e.seq);
  EXPECT_NE(events[0].e.time_ns, 0U);
  EXPECT_EQ(events[0].e.thread, ph::current_thread_id());
  EXPECT_EQ(events[0].e.requested, 64U);
}

}  // namespace
