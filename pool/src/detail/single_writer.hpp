// A count with one writer at a time, read by other threads without a lock.
#pragma once

#include <atomic>

namespace poolscope::pool::detail {

/// A count with one writer at a time (a thread cache's fields under its lock or written by its
/// owning thread; a biased lock's revocations under its inner lock), read by other threads
/// without a lock: a relaxed load and store, no atomic read-modify-write. Thread safety: the
/// writer must be one thread at a time; reads are safe from any thread.
template <class T>
class single_writer {
 public:
  operator T() const noexcept {  // NOLINT(google-explicit-constructor): a count
    return v_.load(std::memory_order_relaxed);
  }
  single_writer& operator=(T v) noexcept {
    v_.store(v, std::memory_order_relaxed);
    return *this;
  }
  single_writer& operator+=(T d) noexcept { return *this = static_cast<T>(*this + d); }
  single_writer& operator-=(T d) noexcept { return *this = static_cast<T>(*this - d); }
  single_writer& operator++() noexcept { return *this += 1; }
  single_writer& operator--() noexcept { return *this -= 1; }

 private:
  std::atomic<T> v_{0};
};

}  // namespace poolscope::pool::detail
