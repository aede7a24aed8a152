#include "detail/drain_thread.hpp"

#include <pthread.h>

namespace poolscope::profiler::detail {

drain_thread::drain_thread(std::function<void()> drain, std::chrono::milliseconds period,
                           const char* name)
    : drain_(std::move(drain)), period_(period), name_(name) {
  thread_ = std::thread([this] { run(); });
}

drain_thread::~drain_thread() {
  stop();
}

void drain_thread::stop() noexcept {
  {
    std::lock_guard lock(mutex_);
    if (stopping_) {
      return;
    }
    stopping_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) {
    thread_.join();
  }
}

void drain_thread::run() {
  (void)pthread_setname_np(pthread_self(), name_);  // a name is a courtesy: failure is harmless
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    // A wake that comes between the drain and this wait is seen by the predicate; one that is
    // missed (the notify raced the wait) costs a period at most.
    cv_.wait_for(lock, period_,
                 [this] { return stopping_ || asked_.load(std::memory_order_acquire); });
    asked_.store(false, std::memory_order_release);
    lock.unlock();
    drain_();
    lock.lock();
  }
  lock.unlock();
  drain_();
}

}  // namespace poolscope::profiler::detail
