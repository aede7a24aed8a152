// ordered_worker: one thread that runs the jobs handed to it one after another, in the order they
// were pushed — the CUDA backend's MPI sends between ranks (mpi_staging.hpp) run on one per GPU,
// so that a send waits for its data on the GPU without holding up the thread that issues work.
// Internal to darray; no CUDA or MPI here (tested on the CPU: ordered_worker_test.cpp).
//
// A job that throws does not stop the worker: its message is kept (the first one until
// take_failure() takes it) and the jobs after it run as usual (each is expected to fail fast once
// the group it talks to has failed). Ownership: owns its thread and the jobs not yet run. Thread
// safety: every member may be called from several threads at once. Cost: a push is a lock and a
// notify; each job runs once, on the worker's thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace poolscope::darray::detail {

class ordered_worker {
 public:
  /// Starts the thread. `name` prefixes the failures' messages ("rank 0's sends from GPU 0").
  explicit ordered_worker(std::string name);
  ordered_worker(const ordered_worker&) = delete;
  ordered_worker& operator=(const ordered_worker&) = delete;
  /// Runs every job still queued, then joins the thread.
  ~ordered_worker();

  /// Runs `job` on the worker's thread after every job pushed before it.
  void push(std::function<void()> job);
  /// Returns once every job pushed before this call has run.
  void drain();
  /// The first failure since the last call ("<name>: <what the job threw>"), if any; clears it.
  [[nodiscard]] std::optional<std::string> take_failure();
  /// Jobs run so far (each counted once it has returned or thrown).
  [[nodiscard]] std::uint64_t completed() const;

 private:
  void run() noexcept;

  std::string name_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable idle_;
  std::deque<std::function<void()>> jobs_;  // mutex_
  std::uint64_t pushed_ = 0;                // mutex_
  std::uint64_t completed_ = 0;             // mutex_
  std::optional<std::string> failure_;      // mutex_
  bool stop_ = false;                       // mutex_
  std::thread thread_;                      // last: starts after the rest is built
};

}  // namespace poolscope::darray::detail
