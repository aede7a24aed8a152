// The NCCL watchdog (nccl_watchdog.hpp).
#include "nccl_watchdog.hpp"

#include <cstdlib>
#include <thread>
#include <utility>

#include "poolscope/error.hpp"
#include "poolscope/log.hpp"

namespace poolscope::darray::detail {

namespace {
constexpr auto poll_every = std::chrono::milliseconds(50);

// Whole seconds, or tenths below ten seconds (a bound of 0.2 s reads "0.2 s", not "0 s").
std::string seconds_of(std::chrono::steady_clock::duration d) {
  const auto tenths = std::chrono::duration_cast<std::chrono::milliseconds>(d).count() / 100;
  if (tenths >= 100) {
    return std::to_string(tenths / 10) + " s";
  }
  return std::to_string(tenths / 10) + "." + std::to_string(tenths % 10) + " s";
}
}  // namespace

nccl_watchdog::nccl_watchdog(std::vector<ncclComm_t> comms, bool abort_comms,
                             std::shared_ptr<process_group> group, std::mutex& nccl_calls,
                             std::function<void()> on_failure)
    : comms_(std::move(comms)),
      abort_comms_(abort_comms),
      group_(std::move(group)),
      nccl_calls_(nccl_calls),
      on_failure_(std::move(on_failure)),
      timeout_(group_->timeout()),
      thread_([this] { loop(); }) {}

nccl_watchdog::~nccl_watchdog() {
  {
    const std::lock_guard lock(mutex_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  thread_.join();
  for (const pending& p : pending_) {
    seam::log_failure("cudaEventDestroy", [&p] { POOLSCOPE_CUDA_CHECK(cudaEventDestroy(p.done)); });
  }
}

nccl_watchdog::host_call::host_call(nccl_watchdog& w, std::string what) : w_(w) {
  const std::lock_guard lock(w_.mutex_);
  w_.call_since_ = std::chrono::steady_clock::now();
  w_.call_what_ = std::move(what);
}

nccl_watchdog::host_call::~host_call() {
  const std::lock_guard lock(w_.mutex_);
  w_.call_since_ = {};
}

void nccl_watchdog::watch(int ordinal, cudaStream_t s, std::string what) {
  const seam::device_guard guard(ordinal);
  cudaEvent_t e = nullptr;
  POOLSCOPE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  const cudaError_t recorded = cudaEventRecord(e, s);
  if (recorded != cudaSuccess) {
    (void)cudaEventDestroy(e);
    seam::raise(recorded, "cudaEventRecord(e, s)", __FILE__, __LINE__);
  }
  const std::lock_guard lock(mutex_);
  pending_.push_back(pending{ordinal, e, std::chrono::steady_clock::now(), std::move(what)});
}

void nccl_watchdog::check() const {
  const std::lock_guard lock(mutex_);
  if (failure_) {
    throw communication_error("darray " + group_->describe() + ": " + *failure_);
  }
}

std::optional<std::string> nccl_watchdog::poll() {
  for (std::size_t i = 0; i < comms_.size(); ++i) {
    ncclResult_t async = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comms_[i], &async);
    if (r != ncclSuccess || (async != ncclSuccess && async != ncclInProgress)) {
      const ncclResult_t e = r != ncclSuccess ? r : async;
      return std::string("NCCL reports ") + ::poolscope::detail::api_status<ncclResult_t>::name(e) +
             " on this rank's GPU " + std::to_string(i) +
             (e == ncclRemoteError ? " (another rank failed, or left its side of the connection)"
                                   : "");
    }
  }
  if (auto f = group_->poll_failure()) {
    return f;
  }
  const auto now = std::chrono::steady_clock::now();
  const std::lock_guard lock(mutex_);
  if (call_since_ != std::chrono::steady_clock::time_point{} && now - call_since_ > timeout_) {
    return "an NCCL call (" + call_what_ + ") has waited " + seconds_of(now - call_since_) +
           " for its peer (POOLSCOPE_RANK_TIMEOUT sets the bound)";
  }
  while (!pending_.empty()) {
    pending& p = pending_.front();
    const cudaError_t q = cudaEventQuery(p.done);
    if (q == cudaErrorNotReady) {
      (void)cudaGetLastError();
      if (now - p.since > timeout_) {
        return p.what + " has not completed in " + seconds_of(now - p.since) +
               " (POOLSCOPE_RANK_TIMEOUT sets the bound)";
      }
      break;
    }
    (void)cudaEventDestroy(p.done);
    const std::string what = p.what;
    pending_.pop_front();
    if (q != cudaSuccess) {
      (void)cudaGetLastError();
      return what + " failed: " + cudaGetErrorName(q);
    }
  }
  return std::nullopt;
}

void nccl_watchdog::fail(const std::string& why) noexcept {
  {
    const std::lock_guard lock(mutex_);
    if (failure_) {
      return;
    }
    try {
      failure_ = why;
    } catch (...) {
      return;  // no memory for the message: the next poll tries again
    }
  }
  poolscope::log(log_level::error, "darray cuda backend: " + why +
                                       (abort_comms_ ? "; aborting its NCCL communicators" : ""));
  group_->fail(why);
  if (on_failure_) {
    on_failure_();
  }
  if (!abort_comms_) {
    return;
  }
  // Once no host call is in NCCL: one in progress holds the mutex for its enqueue. A call that
  // still holds it after the timeout is stuck there (waiting for a peer), and aborting beside it
  // frees what it uses: the process ends instead.
  std::chrono::milliseconds wait = timeout_;
  {
    const std::lock_guard lock(mutex_);
    if (call_since_ != std::chrono::steady_clock::time_point{} &&
        std::chrono::steady_clock::now() - call_since_ > timeout_) {
      wait = std::chrono::milliseconds(0);  // the failure is that call, stuck
    }
  }
  // Polled, not a timed lock: ThreadSanitizer does not follow the timed lock's system call.
  std::unique_lock calls(nccl_calls_, std::defer_lock);
  const auto until = std::chrono::steady_clock::now() + wait;
  while (!calls.try_lock() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!calls.owns_lock()) {
    std::string call;
    {
      const std::lock_guard lock(mutex_);
      call = call_since_ != std::chrono::steady_clock::time_point{}
                 ? "an NCCL call (" + call_what_ + ")"
                 : std::string("an NCCL call");
    }
    poolscope::log(log_level::error,
                   "darray cuda backend: " + call +
                       " is still inside NCCL and cannot be aborted safely; ending the process");
    std::_Exit(EXIT_FAILURE);
  }
  for (ncclComm_t c : comms_) {
    seam::log_failure("ncclCommAbort", [c] { POOLSCOPE_CUDA_CHECK(ncclCommAbort(c)); });
  }
  aborted_.store(true, std::memory_order_release);
}

void nccl_watchdog::loop() noexcept {
  std::unique_lock lock(mutex_);
  while (!stop_) {
    stop_cv_.wait_for(lock, poll_every, [this] { return stop_; });
    if (stop_ || failure_) {
      continue;  // after a failure: nothing more to find, wait to be stopped
    }
    lock.unlock();
    std::optional<std::string> found;
    try {
      found = poll();
    } catch (const std::exception& e) {
      found = std::string("the NCCL watchdog failed: ") + e.what();
    } catch (...) {
      found = "the NCCL watchdog failed";
    }
    if (found) {
      fail(*found);
    }
    lock.lock();
  }
}

}  // namespace poolscope::darray::detail
