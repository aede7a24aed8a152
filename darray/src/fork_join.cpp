#include "poolscope/darray/fork_join.hpp"

#include <pthread.h>

#include "poolscope/cpu_relax.hpp"

namespace poolscope::darray::detail {

fork_join::fork_join(std::size_t helpers, std::chrono::microseconds spin) : spin_(spin) {
  threads_.reserve(helpers);
  try {
    for (std::size_t i = 0; i < helpers; ++i) {
      threads_.emplace_back([this] {
        // The name traces, top and gdb show (at most 15 characters); failure is harmless.
        (void)pthread_setname_np(pthread_self(), "darray issuer");
        helper_loop();
      });
    }
  } catch (...) {
    stop_.store(true);
    generation_.fetch_add(1);
    wake_sleepers();
    for (auto& t : threads_) {
      t.join();
    }
    throw;
  }
}

fork_join::~fork_join() {
  stop_.store(true);
  generation_.fetch_add(1);
  wake_sleepers();
  for (auto& t : threads_) {
    t.join();
  }
}

void fork_join::wake_sleepers() noexcept {
  // A helper counts itself asleep, then looks at the generation, both under sleep_mutex_; the
  // generation changed before this reads the count (both sequentially consistent). So either the
  // helper saw the change, or this sees it asleep, or about to be: taking the mutex waits until
  // it sleeps, and the notification wakes it.
  if (sleepers_.load() != 0) {
    { const std::lock_guard lock(sleep_mutex_); }
    wake_.notify_all();
  }
}

void fork_join::take_tasks() noexcept {
  for (std::size_t i = next_.fetch_add(1); i < count_; i = next_.fetch_add(1)) {
    try {
      task_(i);
    } catch (...) {
      const std::lock_guard lock(error_mutex_);
      if (!error_) {
        error_ = std::current_exception();
      }
    }
    done_.fetch_add(1, std::memory_order_acq_rel);
  }
}

void fork_join::helper_loop() noexcept {
  using clock = std::chrono::steady_clock;
  std::uint64_t seen = generation_.load();
  for (;;) {
    // Wait for the next run or the stop: spin a while (a run soon after the last one finds us
    // awake), then sleep. The stop is looked at too, not only the generation: a helper that
    // starts after the destructor's last increment sees no change to wait for.
    std::uint64_t g = generation_.load(std::memory_order_acquire);
    if (g == seen) {
      const auto until = clock::now() + spin_;
      for (unsigned k = 1; g == seen && !stop_.load(); ++k) {
        cpu_relax();
        g = generation_.load(std::memory_order_acquire);
        if (g == seen && k % 64 == 0 && clock::now() >= until) {
          std::unique_lock lock(sleep_mutex_);
          sleepers_.fetch_add(1);
          wake_.wait(lock, [&] { return stop_.load() || generation_.load() != seen; });
          sleepers_.fetch_sub(1);
          g = generation_.load(std::memory_order_acquire);
        }
      }
    }
    seen = g;
    if (stop_.load()) {
      return;
    }
    // Join the run of generation g unless it closed (or a later one began) meanwhile: run()
    // closes before it waits for active_ to drop to 0, and a helper counts itself active before
    // it looks at closed_ (both sequentially consistent), so a helper either sees the run
    // closed or is waited for.
    active_.fetch_add(1);
    if (!closed_.load() && generation_.load() == g) {
      take_tasks();
    }
    active_.fetch_sub(1);
  }
}

void fork_join::run(std::size_t n, task_ref task) {
  std::unique_lock lock(run_mutex_, std::defer_lock);
  if (n <= 1 || threads_.empty() || !lock.try_lock()) {
    // Nothing to share, or another run has the helpers: run here, in order, all of them.
    std::exception_ptr first;
    for (std::size_t i = 0; i < n; ++i) {
      try {
        task(i);
      } catch (...) {
        if (!first) {
          first = std::current_exception();
        }
      }
    }
    if (first) {
      std::rethrow_exception(first);
    }
    return;
  }
  task_ = task;
  count_ = n;
  next_.store(0);
  done_.store(0);
  error_ = nullptr;
  closed_.store(false);
  generation_.fetch_add(1);  // publishes the run (sequentially consistent: after the fields)
  wake_sleepers();
  take_tasks();
  while (done_.load(std::memory_order_acquire) < n) {
    cpu_relax();
  }
  closed_.store(true);
  while (active_.load() != 0) {
    cpu_relax();
  }
  if (error_) {
    std::exception_ptr e = std::move(error_);
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

}  // namespace poolscope::darray::detail
