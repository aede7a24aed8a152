// A lock biased towards one owning thread (a thread cache's): while biased, the owner enters and
// leaves with plain stores, no locked instruction; any other thread revokes the bias first, with
// an asymmetric fence (membarrier(2), docs/thread_cache.md "The cache's lock").
//
// Protocol. The owner enters with `busy = true`, then reads `biased`; another thread, holding
// the inner lock, writes `biased = false`, runs the process-wide fence, then waits for `busy` to
// be false. The fence orders the owner's store before its load as a full barrier would, at
// whatever point of the owner's program it lands: so either the owner sees the bias gone (and
// takes the inner lock, behind the revoker) or the revoker sees `busy` and waits for the owner
// to leave. Only the owner sets the bias again, holding the inner lock, once it has taken that
// lock `rebias_after` times since the last revocation; each revocation doubles that count (up
// to 2^20), so an owner whose blocks other threads free often ends up on the inner lock, as an
// unbiased lock, and one revoked now and then (a flush) pays one fence per revocation.
//
// Without the fence (a kernel older than 4.14, a sandbox without membarrier, ThreadSanitizer,
// which cannot see it) or with the bias switched off, the lock is the inner lock alone: one
// exchange to take it, one release store to leave it.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>

namespace poolscope::pool::detail {

/// Whether asymmetric_fence() is available in this process (registers for it on first call).
/// Thread-safe.
[[nodiscard]] bool asymmetric_fence_available() noexcept;

/// A full memory barrier on every running thread of this process, as seen by the caller when it
/// returns. Only when asymmetric_fence_available(). Thread-safe; costs a system call and an
/// interrupt of each CPU running a thread of the process.
void asymmetric_fence() noexcept;

/// A test-and-test-and-set spin lock: lock is one exchange when free, unlock a release store;
/// a contender spins briefly, then yields. Thread-safe.
class spin_lock {
 public:
  void lock() noexcept {
    if (!state_.exchange(true, std::memory_order_acquire)) [[likely]] {
      return;
    }
    lock_contended();
  }
  void unlock() noexcept { state_.store(false, std::memory_order_release); }

 private:
  void lock_contended() noexcept {
    for (int spins = 0;; ++spins) {
      if (!state_.load(std::memory_order_relaxed) &&
          !state_.exchange(true, std::memory_order_acquire)) {
        return;
      }
      if (spins >= 64) {
        std::this_thread::yield();
      }
    }
  }

  std::atomic<bool> state_{false};
};

/// The lock of a thread cache. Its owning thread calls owner_lock / owner_unlock (one thread
/// only, the same for the lock's life); every other thread, and the owner when it acts as any
/// thread would (a flush, its exit), lock / unlock. Mutual exclusion holds between all of them.
class biased_lock {
 public:
  static constexpr std::uint32_t initial_rebias_after = 256;
  static constexpr std::uint32_t max_rebias_after = std::uint32_t{1} << 20;

  /// `bias`: start biased, if the asymmetric fence is available. `rebias_after` and
  /// `rebias_cap`: the owner's inner-lock entries before it sets the bias again, at first and
  /// at most (tests lower them, to revoke often).
  explicit biased_lock(bool bias = true, std::uint32_t rebias_after = initial_rebias_after,
                       std::uint32_t rebias_cap = max_rebias_after) noexcept
      : can_bias_(bias && asymmetric_fence_available()),
        rebias_cap_(rebias_cap < 1 ? 1 : rebias_cap),
        biased_(can_bias_),
        rebias_after_(rebias_after < 1 ? 1 : rebias_after) {}

  /// Owner only. Returns whether it entered through the bias (pass it to owner_unlock).
  [[nodiscard]] bool owner_lock() noexcept {
    if (can_bias_) {
      busy_.store(true, std::memory_order_relaxed);
      std::atomic_signal_fence(std::memory_order_seq_cst);  // the store before the load
      if (biased_.load(std::memory_order_acquire)) [[likely]] {
        return true;
      }
      busy_.store(false, std::memory_order_release);
    }
    inner_.lock();
    if (can_bias_ && ++owner_locks_ >= rebias_after_) {
      owner_locks_ = 0;
      biased_.store(true, std::memory_order_relaxed);  // published by the inner lock's unlock
    }
    return false;
  }
  void owner_unlock(bool through_bias) noexcept {
    if (through_bias) [[likely]] {
      busy_.store(false, std::memory_order_release);
    } else {
      inner_.unlock();
    }
  }

  /// Any thread.
  void lock() noexcept {
    inner_.lock();
    if (biased_.load(std::memory_order_relaxed)) {  // only set under the inner lock
      biased_.store(false, std::memory_order_relaxed);
      asymmetric_fence();
      for (int spins = 0; busy_.load(std::memory_order_acquire); ++spins) {
        if (spins >= 64) {
          std::this_thread::yield();
        }
      }
      owner_locks_ = 0;
      rebias_after_ = rebias_after_ >= rebias_cap_ / 2 ? rebias_cap_ : rebias_after_ * 2;
      revocations_.store(revocations_.load(std::memory_order_relaxed) + 1,
                         std::memory_order_relaxed);
    }
  }
  void unlock() noexcept { inner_.unlock(); }

  /// Whether the owner enters without a locked instruction now (a snapshot).
  [[nodiscard]] bool biased() const noexcept { return biased_.load(std::memory_order_relaxed); }
  /// Whether this lock may be biased at all (the option and the fence).
  [[nodiscard]] bool can_bias() const noexcept { return can_bias_; }
  /// Times the bias was revoked (a snapshot).
  [[nodiscard]] std::uint64_t revocations() const noexcept {
    return revocations_.load(std::memory_order_relaxed);
  }

 private:
  const bool can_bias_;
  const std::uint32_t rebias_cap_;
  spin_lock inner_;
  std::atomic<bool> biased_;
  std::atomic<bool> busy_{false};
  // Under the inner lock:
  std::uint32_t owner_locks_ = 0;  // the owner's inner-lock entries since the last revocation
  std::uint32_t rebias_after_;
  std::atomic<std::uint64_t> revocations_{0};  // written under it, read anywhere
};

/// Holds a biased_lock as its owner, for a scope. Kept apart from biased_guard (which also
/// takes the lock as any thread): it runs on every cached operation, and folding it into
/// biased_guard cost a cached A1 pair about 60 instructions (callgrind).
class owner_guard {
 public:
  explicit owner_guard(biased_lock& l) noexcept : lock_(&l), through_bias_(l.owner_lock()) {}
  owner_guard(const owner_guard&) = delete;
  owner_guard& operator=(const owner_guard&) = delete;
  ~owner_guard() {
    if (lock_ != nullptr) {
      lock_->owner_unlock(through_bias_);
    }
  }
  /// Leaves before the scope ends.
  void unlock() noexcept {
    lock_->owner_unlock(through_bias_);
    lock_ = nullptr;
  }

 private:
  biased_lock* lock_;
  bool through_bias_;
};

/// Holds a biased_lock for a scope: through the owner's path when the caller is its owner
/// (`as_owner`), so that the owner's own flush or retirement does not revoke the bias.
class biased_guard {
 public:
  biased_guard(biased_lock& l, bool as_owner) noexcept
      : lock_(l), as_owner_(as_owner), through_bias_(as_owner && l.owner_lock()) {
    if (!as_owner_) {
      lock_.lock();
    }
  }
  biased_guard(const biased_guard&) = delete;
  biased_guard& operator=(const biased_guard&) = delete;
  ~biased_guard() {
    if (as_owner_) {
      lock_.owner_unlock(through_bias_);
    } else {
      lock_.unlock();
    }
  }

 private:
  biased_lock& lock_;
  const bool as_owner_;
  const bool through_bias_;
};

}  // namespace poolscope::pool::detail
