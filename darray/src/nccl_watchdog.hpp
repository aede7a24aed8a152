// The NCCL watchdog of a CUDA backend over several ranks: NCCL work with another rank waits, on
// the GPU or in the host call that connects to it, for as long as that rank does not come (and so
// does a transfer through CUDA IPC, ipc_links.hpp), so a thread of its own watches it, as PyTorch's
// ProcessGroupNCCL does. It polls every communicator's asynchronous error (ncclCommGetAsyncError),
// the process group's failures (another rank's notice), each host call into NCCL with another rank,
// and each such operation enqueued (an event after it); a failure, or a call or operation older
// than the group's timeout, aborts the communicators (ncclCommAbort: NCCL work in flight ends),
// tells the other ranks, and is thrown by the backend's next synchronizing call (check()). Internal
// to cuda_backend.cpp; through cuda_seam.hpp like it.
//
// An abort never runs beside another call on the same communicator (NCCL frees what that call
// uses): the watchdog aborts holding the backend's mutex of NCCL calls. Once a group's ranks are
// connected (cuda_backend connects them when it is made) no host call waits for a peer, so the
// mutex comes free within a call's enqueue. A host call still in NCCL after the timeout cannot be
// aborted safely: the watchdog then tells the other ranks and ends the process, naming the call.
//
// Ownership: owns its thread and the events it watches; the communicators stay the backend's
// (aborted here only when `abort_comms`: never an application's). Thread safety: every member may
// be called from several threads. Cost: a poll every 50 ms; one event per watched operation.
#pragma once

#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cuda_seam.hpp"
#include "poolscope/darray/process_group.hpp"

namespace poolscope::darray::detail {

class nccl_watchdog {
 public:
  /// `nccl_calls`: the mutex every host call into NCCL on `comms` holds (the backend's).
  /// `on_failure` (optional, noexcept) runs once on a failure, after the other ranks are told:
  /// what else must stop waiting for a peer (the backend's IPC gates, ipc_links.hpp).
  nccl_watchdog(std::vector<ncclComm_t> comms, bool abort_comms,
                std::shared_ptr<process_group> group, std::mutex& nccl_calls,
                std::function<void()> on_failure = {});
  nccl_watchdog(const nccl_watchdog&) = delete;
  nccl_watchdog& operator=(const nccl_watchdog&) = delete;
  /// Stops the thread and destroys the events still watched.
  ~nccl_watchdog();

  /// A host call into NCCL with another rank, from construction to destruction: watched too (the
  /// first transfer between two GPUs connects them, waiting for the peer in the host call).
  class host_call {
   public:
    host_call(nccl_watchdog& w, std::string what);
    host_call(const host_call&) = delete;
    host_call& operator=(const host_call&) = delete;
    ~host_call();

   private:
    nccl_watchdog& w_;
  };

  /// Watches the work enqueued so far on `s` (of CUDA device `ordinal`) until it completes.
  void watch(int ordinal, cudaStream_t s, std::string what);
  /// Throws communication_error naming the failure if the watchdog found one.
  void check() const;
  /// Whether it aborted the communicators (they are then freed: not to be finalized).
  [[nodiscard]] bool aborted() const noexcept { return aborted_.load(std::memory_order_acquire); }

 private:
  struct pending {
    int ordinal;
    cudaEvent_t done;
    std::chrono::steady_clock::time_point since;
    std::string what;
  };
  void loop() noexcept;
  // One poll; the failure found, if any.
  std::optional<std::string> poll();
  void fail(const std::string& why) noexcept;

  std::vector<ncclComm_t> comms_;
  bool abort_comms_;
  std::shared_ptr<process_group> group_;
  std::mutex& nccl_calls_;
  std::function<void()> on_failure_;
  std::chrono::milliseconds timeout_;
  mutable std::mutex mutex_;
  std::condition_variable stop_cv_;
  bool stop_ = false;                   // mutex_
  std::deque<pending> pending_;         // mutex_, oldest first
  std::optional<std::string> failure_;  // mutex_
  // The host call in progress (since its start; the epoch when none), and what it is (mutex_).
  std::chrono::steady_clock::time_point call_since_{};
  std::string call_what_;
  std::atomic<bool> aborted_{false};
  std::thread thread_;  // last: starts after the rest is built
};

}  // namespace poolscope::darray::detail
