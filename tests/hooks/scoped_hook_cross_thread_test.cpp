// A thread-scoped scoped_hook destroyed on another thread than the one that installed it must
// remove the hook from the installing thread's stack; looking in the destroying thread's would
// remove nothing, and the installing thread would call the hook after its guard was gone.
// Suite scoped_hook_concurrency: also run under ThreadSanitizer.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "poolscope/hooks/hook.hpp"

namespace {

namespace ph = poolscope::hooks;

/// Counts its calls, and the calls that came after `gone` was set (after its guard was
/// destroyed): those must never happen.
class watched_hook final : public ph::hook {
 public:
  void on_event(const ph::event& /*e*/) noexcept override {
    calls.fetch_add(1, std::memory_order_relaxed);
    if (gone.load(std::memory_order_relaxed)) {
      calls_after_gone.fetch_add(1, std::memory_order_relaxed);
    }
  }
  std::atomic<std::uint64_t> calls{0};
  std::atomic<std::uint64_t> calls_after_gone{0};
  std::atomic<bool> gone{false};
};

void emit_one() {
  ph::event e;
  e.kind = ph::event_kind::pool_malloc;
  e.phase = ph::event_phase::post;
  if (ph::active()) {
    ph::dispatch(e);
  }
}

TEST(scoped_hook_concurrency, a_guard_destroyed_on_another_thread_uninstalls_from_its_owner) {
  ASSERT_FALSE(ph::active()) << "a hook from another test is still installed";
  watched_hook h;
  std::promise<std::unique_ptr<ph::scoped_hook>> guard_made;
  std::promise<void> guard_destroyed;
  auto destroyed = guard_destroyed.get_future();
  std::uint64_t calls_before = 0;
  std::thread owner([&] {
    auto guard = std::make_unique<ph::scoped_hook>(h, ph::scope::thread);
    emit_one();
    calls_before = h.calls.load();
    guard_made.set_value(std::move(guard));
    destroyed.wait();
    emit_one();  // after the guard is gone: must not reach h
  });
  auto guard = guard_made.get_future().get();
  EXPECT_TRUE(ph::active());
  guard.reset();  // on this thread, not the owner
  EXPECT_FALSE(ph::active()) << "the installation was not taken off the count";
  guard_destroyed.set_value();
  owner.join();
  EXPECT_EQ(calls_before, 1U);
  EXPECT_EQ(h.calls.load(), 1U) << "the owner thread still called the hook after its guard died";
  EXPECT_FALSE(ph::active());
}

TEST(scoped_hook_concurrency, a_guard_outliving_its_thread_is_destroyed_safely) {
  ASSERT_FALSE(ph::active()) << "a hook from another test is still installed";
  watched_hook h;
  std::unique_ptr<ph::scoped_hook> guard;
  std::thread owner([&] {
    guard = std::make_unique<ph::scoped_hook>(h, ph::scope::thread);
    emit_one();
  });
  owner.join();
  EXPECT_FALSE(ph::active()) << "the exiting thread left its installation counted";
  guard.reset();  // the owner's stack is gone: nothing to remove, nothing to crash on
  EXPECT_FALSE(ph::active());
  EXPECT_EQ(h.calls.load(), 1U);
}

TEST(scoped_hook_concurrency, destroying_a_guard_waits_for_a_delivery_on_its_owner) {
  ASSERT_FALSE(ph::active()) << "a hook from another test is still installed";
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
  constexpr int rounds = 50;
#else
  constexpr int rounds = 100;
#endif
  for (int round = 0; round < rounds; ++round) {
    auto h = std::make_unique<watched_hook>();
    std::promise<std::unique_ptr<ph::scoped_hook>> guard_made;
    std::atomic<bool> stop{false};
    std::atomic<std::uint64_t> emitted_after{0};
    std::thread owner([&] {
      guard_made.set_value(std::make_unique<ph::scoped_hook>(*h, ph::scope::thread));
      while (!stop.load()) {
        emit_one();
        if (h->gone.load()) {
          emitted_after.fetch_add(1);
        }
      }
    });
    auto guard = guard_made.get_future().get();
    while (h->calls.load() < static_cast<std::uint64_t>(round % 7)) {
      std::this_thread::yield();
    }
    guard.reset();        // races with the owner's deliveries
    h->gone.store(true);  // from here on, a call is a call to a dead hook
    while (emitted_after.load() < 3 && !stop.load()) {
      std::this_thread::yield();
    }
    stop.store(true);
    owner.join();
    ASSERT_EQ(h->calls_after_gone.load(), 0U) << "round " << round;
    ASSERT_FALSE(ph::active()) << "round " << round;
  }
}

// The process-wide stack is read without a shared lock (each thread marks its own slot): a
// process hook removed while other threads deliver must still never be called once its guard is
// gone, and a thread's first delivery (which makes its slot) may race with the removal.
TEST(scoped_hook_concurrency, removing_a_process_hook_waits_for_every_thread_delivering) {
  ASSERT_FALSE(ph::active()) << "a hook from another test is still installed";
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
  constexpr int rounds = 30;
#else
  constexpr int rounds = 100;
#endif
  constexpr int emitters = 3;
  for (int round = 0; round < rounds; ++round) {
    auto h = std::make_unique<watched_hook>();
    auto guard = std::make_unique<ph::scoped_hook>(*h);
    std::atomic<bool> stop{false};
    std::atomic<std::uint64_t> emitted_after{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < emitters; ++t) {
      threads.emplace_back([&] {  // new threads each round: their first delivery makes a slot
        while (!stop.load()) {
          emit_one();
          if (h->gone.load()) {
            emitted_after.fetch_add(1);
          }
        }
      });
    }
    while (h->calls.load() < static_cast<std::uint64_t>(round % 5)) {
      std::this_thread::yield();
    }
    guard.reset();        // races with every thread's deliveries
    h->gone.store(true);  // from here on, a call is a call to a dead hook
    while (emitted_after.load() < 3 * emitters && !stop.load()) {
      std::this_thread::yield();
    }
    stop.store(true);
    for (auto& t : threads) {
      t.join();
    }
    ASSERT_EQ(h->calls_after_gone.load(), 0U) << "round " << round;
    ASSERT_FALSE(ph::active()) << "round " << round;
  }
}

/// Holds its caller inside on_event until released.
class blocking_hook final : public ph::hook {
 public:
  void on_event(const ph::event& /*e*/) noexcept override {
    inside.store(true);
    while (!release.load()) {
      std::this_thread::yield();
    }
    returned.store(true);
  }
  std::atomic<bool> inside{false};
  std::atomic<bool> release{false};
  std::atomic<bool> returned{false};
};

TEST(scoped_hook_concurrency, uninstall_of_a_process_hook_returns_only_after_its_call_returns) {
  ASSERT_FALSE(ph::active()) << "a hook from another test is still installed";
  blocking_hook h;
  ph::install(h);
  std::thread deliverer([] { emit_one(); });
  while (!h.inside.load()) {
    std::this_thread::yield();
  }
  std::atomic<bool> uninstalled{false};
  std::atomic<bool> returned_before{false};
  std::thread remover([&] {
    EXPECT_TRUE(ph::uninstall(h));
    returned_before.store(h.returned.load());
    uninstalled.store(true);
  });
  // The remover must be waiting: give it time to (wrongly) finish.
  for (int i = 0; i < 200 && !uninstalled.load(); ++i) {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  EXPECT_FALSE(uninstalled.load()) << "uninstall returned while the hook was running";
  h.release.store(true);
  remover.join();
  deliverer.join();
  EXPECT_TRUE(returned_before.load());
  EXPECT_FALSE(ph::active());
  // A later install and delivery work as before: the stack is usable again.
  watched_hook w;
  {
    ph::scoped_hook on{w};
    emit_one();
  }
  EXPECT_EQ(w.calls.load(), 1U);
}

}  // namespace
