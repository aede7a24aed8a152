// fork_join: runs a handful of short tasks at once on a few persistent threads plus the caller.
// The backend issues each device's share of an elementwise op through it
// (backend_options::issue_threads), so the host-side cost of the enqueue calls of several GPUs
// overlaps instead of adding up.
//
//   poolscope::darray::detail::fork_join fj(2);        // two helper threads
//   fj.run(3, [&](std::size_t i) { enqueue_on(i); });  // 0, 1, 2 each once; returns when all did
//
// Ownership: owns its threads (started by the constructor, joined by the destructor).
// Thread safety: run() may be called from any thread; one run at a time uses the helpers, and a
// run() that finds them busy runs its tasks on its own thread, in order. Tasks of one run may
// execute concurrently, each on one thread. Cost: the caller takes tasks too, so a run is never
// slower than running its tasks in a loop by more than a few atomic operations; helpers spin
// for `spin` after their last task, then sleep until the next run (a run that finds them asleep
// wakes them, and does what it can meanwhile).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace poolscope::darray::detail {

/// A non-owning reference to a callable taking a task index (valid while the callable lives).
class task_ref {
 public:
  template <typename F>
  requires(!std::is_same_v<std::remove_cvref_t<F>, task_ref>) task_ref(F& f)
  noexcept  // NOLINT(google-explicit-constructor): a reference, like a view
      : object_(static_cast<void*>(&f)),
        call_([](void* o, std::size_t i) { (*static_cast<F*>(o))(i); }) {}
  void operator()(std::size_t i) const { call_(object_, i); }

 private:
  void* object_;
  void (*call_)(void*, std::size_t);
};

class fork_join {
 public:
  /// `helpers` threads besides the callers of run() (0: run() is a plain loop).
  explicit fork_join(std::size_t helpers,
                     std::chrono::microseconds spin = std::chrono::microseconds{100});
  fork_join(const fork_join&) = delete;
  fork_join& operator=(const fork_join&) = delete;
  ~fork_join();

  /// Calls task(i) once for each i in [0, n), on this thread and the helpers, and returns when
  /// every call has returned. If calls throw, every other call still runs, and the first
  /// exception is rethrown.
  void run(std::size_t n, task_ref task);

  [[nodiscard]] std::size_t helpers() const noexcept { return threads_.size(); }

 private:
  void helper_loop() noexcept;
  void take_tasks() noexcept;     // runs tasks of the current run until none is left
  void wake_sleepers() noexcept;  // after a new generation: wakes helpers asleep on it

  const std::chrono::microseconds spin_;
  std::mutex run_mutex_;  // one run at a time uses the helpers
  // The current run, written by run() before it publishes a new generation and stable until
  // every helper that joined it has left (active_ back to 0 after closed_ is set).
  task_ref task_{none_};
  std::size_t count_ = 0;
  std::atomic<std::size_t> next_{0};  // the next task index to take
  std::atomic<std::size_t> done_{0};  // tasks that returned
  std::atomic<std::uint64_t> generation_{0};
  std::atomic<bool> closed_{true};  // no task of the current run is left to join for
  std::atomic<int> active_{0};      // helpers inside the current run
  std::atomic<bool> stop_{false};
  // Sleeping helpers wait on wake_ for a new generation or the stop.
  std::mutex sleep_mutex_;
  std::condition_variable wake_;
  std::atomic<int> sleepers_{0};
  std::mutex error_mutex_;
  std::exception_ptr error_;  // the run's first exception (error_mutex_)
  std::vector<std::thread> threads_;

  static inline auto none_ = [](std::size_t) {};
};

}  // namespace poolscope::darray::detail
