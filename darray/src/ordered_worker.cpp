// ordered_worker (ordered_worker.hpp).
#include "ordered_worker.hpp"

#include <exception>
#include <utility>

#include "poolscope/log.hpp"

namespace poolscope::darray::detail {

ordered_worker::ordered_worker(std::string name)
    : name_(std::move(name)), thread_([this] { run(); }) {}

ordered_worker::~ordered_worker() {
  {
    const std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void ordered_worker::push(std::function<void()> job) {
  {
    const std::lock_guard lock(mutex_);
    jobs_.push_back(std::move(job));
    ++pushed_;
  }
  wake_.notify_one();
}

void ordered_worker::drain() {
  std::unique_lock lock(mutex_);
  const std::uint64_t target = pushed_;
  idle_.wait(lock, [&] { return completed_ >= target; });
}

std::optional<std::string> ordered_worker::take_failure() {
  const std::lock_guard lock(mutex_);
  return std::exchange(failure_, std::nullopt);
}

std::uint64_t ordered_worker::completed() const {
  const std::lock_guard lock(mutex_);
  return completed_;
}

void ordered_worker::run() noexcept {
  std::unique_lock lock(mutex_);
  for (;;) {
    wake_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
    if (jobs_.empty()) {
      return;  // stopping, and nothing left to run
    }
    std::function<void()> job = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    std::optional<std::string> failed;
    try {
      job();
    } catch (const std::exception& e) {
      failed = e.what();
    } catch (...) {
      failed = "unknown exception";
    }
    job = nullptr;  // what the job held goes before it counts as run
    if (failed) {
      try {
        poolscope::log(log_level::error, name_ + ": " + *failed);
      } catch (...) {  // no memory for the line: the failure is still kept below
      }
    }
    lock.lock();
    if (failed && !failure_) {
      try {
        failure_ = name_ + ": " + *failed;
      } catch (...) {
        failure_.emplace();  // no memory for the message: an empty one still says it failed
      }
    }
    ++completed_;
    idle_.notify_all();
  }
}

}  // namespace poolscope::darray::detail
