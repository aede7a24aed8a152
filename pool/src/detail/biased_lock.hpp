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
//
// biased_mutex is the same protocol for a lock with no fixed owner (a pool's lock): it biases
// itself towards whichever thread takes it alone for long enough, and marks the owner's presence
// in a record of that thread's (thread_presence) rather than in the lock (see there).
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>

#include "poolscope/spin_lock.hpp"
#include "single_writer.hpp"

namespace poolscope::pool::detail {

/// Whether asymmetric_fence() is available in this process (registers for it on first call).
/// Thread-safe.
[[nodiscard]] bool asymmetric_fence_available() noexcept;

/// A full memory barrier on every running thread of this process, as seen by the caller when it
/// returns. Only when asymmetric_fence_available(). Thread-safe; costs a system call and an
/// interrupt of each CPU running a thread of the process.
void asymmetric_fence() noexcept;

/// The inner lock of the biased locks (poolscope/spin_lock.hpp).
using poolscope::spin_lock;

/// When a biased lock sets its bias again (biased_lock, biased_mutex): after `after` entries
/// through its inner lock, counted since the last revocation (or in a row), where each revocation
/// doubles `after`, up to `cap`. Guarded by the lock's inner lock; revocations() may be read by
/// any thread.
class rebias_schedule {
 public:
  static constexpr std::uint32_t initial_after = 256;
  static constexpr std::uint32_t max_after = std::uint32_t{1} << 20;

  rebias_schedule(std::uint32_t after, std::uint32_t cap) noexcept
      : cap_(cap < 1 ? 1 : cap), after_(after < 1 ? 1 : after) {}
  /// Counts one entry through the inner lock; true for the one that sets the bias (the count
  /// then starts again).
  [[nodiscard]] bool entered() noexcept {
    if (++entries_ < after_) {
      return false;
    }
    entries_ = 0;
    return true;
  }
  /// Starts the count again (another thread came in between).
  void restart() noexcept { entries_ = 0; }
  /// A revocation: the count starts again and the entries needed double.
  void revoked() noexcept {
    entries_ = 0;
    after_ = after_ >= cap_ / 2 ? cap_ : after_ * 2;
    ++revocations_;
  }
  [[nodiscard]] std::uint64_t revocations() const noexcept { return revocations_; }

 private:
  const std::uint32_t cap_;
  std::uint32_t after_;
  std::uint32_t entries_ = 0;
  single_writer<std::uint64_t> revocations_;
};

/// Spins while `owner_inside()` holds, yielding after a while: a revoker waiting for the owner
/// to leave (it holds the lock for a few hundred nanoseconds, unless it was preempted).
template <typename F>
void wait_while(F owner_inside) noexcept {
  for (int spins = 0; owner_inside(); ++spins) {
    if (spins >= 64) {
      std::this_thread::yield();
    }
  }
}

/// The lock of a thread cache. Its owning thread calls owner_lock / owner_unlock (one thread at a
/// time: the role passes to another thread only after the owner has left for good, ordered by a
/// mutex, as a cache of an exited thread is taken over); every other thread, and the owner when
/// it acts as any thread would (a flush, its exit), lock / unlock. Mutual exclusion holds between
/// all of them.
class biased_lock {
 public:
  static constexpr std::uint32_t initial_rebias_after = rebias_schedule::initial_after;
  static constexpr std::uint32_t max_rebias_after = rebias_schedule::max_after;

  /// `bias`: start biased, if the asymmetric fence is available. `rebias_after` and
  /// `rebias_cap`: the owner's inner-lock entries before it sets the bias again, at first and
  /// at most (tests lower them, to revoke often).
  explicit biased_lock(bool bias = true, std::uint32_t rebias_after = initial_rebias_after,
                       std::uint32_t rebias_cap = max_rebias_after) noexcept
      : can_bias_(bias && asymmetric_fence_available()),
        biased_(can_bias_),
        schedule_(rebias_after, rebias_cap) {}

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
    if (can_bias_ && schedule_.entered()) {
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
      wait_while([this] { return busy_.load(std::memory_order_acquire); });
      schedule_.revoked();
    }
  }
  void unlock() noexcept { inner_.unlock(); }

  /// Whether the owner enters without a locked instruction now (a snapshot).
  [[nodiscard]] bool biased() const noexcept { return biased_.load(std::memory_order_relaxed); }
  /// Whether this lock may be biased at all (the option and the fence).
  [[nodiscard]] bool can_bias() const noexcept { return can_bias_; }
  /// Times the bias was revoked (a snapshot).
  [[nodiscard]] std::uint64_t revocations() const noexcept { return schedule_.revocations(); }

 private:
  const bool can_bias_;
  spin_lock inner_;
  std::atomic<bool> biased_;
  std::atomic<bool> busy_{false};
  rebias_schedule schedule_;  // under the inner lock: the owner's entries since a revocation
};

/// Holds a biased_lock as its owner, for a scope. Kept apart from biased_guard (which also
/// takes the lock as any thread): it runs on every cached operation, which then tests no
/// "as whom" flag.
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

/// A thread's presence mark for biased_mutex: `inside` names the biased_mutex the thread holds
/// through its bias (null when none). One record per thread, written by that thread only; records
/// are never freed, and a thread's record goes to a later thread when it exits, because a mutex
/// may still name it as its owner (the later thread then inherits that bias, which is sound: it
/// is the record's only user). The mark lives in the thread's record and not in the lock because
/// the owner may change: a thread that read a stale "I am the owner" would otherwise clear a
/// flag the new owner had just set. It names the mutex, not just "some", so that a revoker waits
/// only for the owner to leave the mutex being revoked: a thread that holds one biased mutex
/// through its bias and then waits for another's inner lock must not be waited for by that
/// other's revoker (two threads would wait for each other).
struct alignas(64) thread_presence {
  std::atomic<const void*> inside{nullptr};
  thread_presence* next_free = nullptr;  // on the free list, between threads
};

/// The record of every thread that has none of its own: never written, and marked inside (a
/// mutex of its own), so that biased_mutex::lock's test of the mark sends such a thread to its
/// slow path with no separate test of the record (biased_lock.cpp).
extern constinit thread_presence no_presence;

/// The calling thread's record, or &no_presence before claim_thread_presence() (or after the
/// thread's exit began). Trivially initialised: read inline without a TLS guard
/// (biased_lock.cpp).
[[gnu::tls_model("initial-exec")]] extern thread_local constinit thread_presence* t_presence;

/// Makes (or reuses) the calling thread's record and sets t_presence; returns it, or null when
/// none can be had (no memory, or the thread is exiting). Thread-safe; takes a global mutex.
[[nodiscard]] thread_presence* claim_thread_presence() noexcept;

/// A mutex biased towards the thread that takes it alone, for a pool's lock. While biased, that
/// thread enters with plain loads and stores (its mark, the owner, how it entered) and leaves
/// with two stores: no locked instruction (on random-size requests a pool takes its lock twice
/// per alloc+free pair, and each locked exchange also waits for every store before it to drain).
/// Any other thread takes the inner lock, revokes the bias with the asymmetric fence and waits for
/// the owner to leave. A thread that takes the inner lock `rebias_after` times in a row, with no
/// other thread in between, sets the bias towards itself; each revocation doubles that count (up to
/// 2^20), so a lock that several threads share settles on the inner lock and pays for a fence at
/// most about a dozen times, then once per 2^20 lone entries.
///
/// Satisfies BasicLockable. Thread-safe. Not recursive. A thread may hold several biased_mutexes
/// at once (all but the first through their inner locks, its mark being taken), but no two
/// threads may take them in opposite orders, as for any locks. `Inner` is any BasicLockable (bfc's
/// futex lock).
template <typename Inner>
class biased_mutex {
 public:
  static constexpr std::uint32_t initial_rebias_after = rebias_schedule::initial_after;
  static constexpr std::uint32_t max_rebias_after = rebias_schedule::max_after;

  /// `bias`: allow the bias at all (when the asymmetric fence is available). `rebias_after`
  /// and `rebias_cap`: lone inner-lock entries before a thread sets the bias, at first and at
  /// most (tests lower them, to revoke often).
  explicit biased_mutex(bool bias = true, std::uint32_t rebias_after = initial_rebias_after,
                        std::uint32_t rebias_cap = max_rebias_after) noexcept
      : can_bias_(bias && asymmetric_fence_available()), schedule_(rebias_after, rebias_cap) {}
  biased_mutex(const biased_mutex&) = delete;
  biased_mutex& operator=(const biased_mutex&) = delete;

  void lock() noexcept {
    thread_presence* const me = t_presence;
    // Not when the thread is already inside another biased_mutex through its bias: its one mark
    // is taken (it enters this one through the inner lock, and keeps its bias if it owns it).
    // A thread that is not the owner marks itself for nothing, and nobody waits on its mark.
    // A thread with no record of its own finds no_presence marked: the slow path claims one.
    if (me->inside.load(std::memory_order_relaxed) == nullptr) [[likely]] {
      // Release, as every store of the mark: a revoker that reads any of them (this one, if the
      // thread entered another mutex since) then sees what the thread did in this one before.
      me->inside.store(this, std::memory_order_release);
      std::atomic_signal_fence(std::memory_order_seq_cst);  // the store before the load
      if (owner_.load(std::memory_order_acquire) == me) [[likely]] {
        via_bias_ = me;
        return;
      }
      me->inside.store(nullptr, std::memory_order_release);
    }
    lock_slow(me);
  }

  void unlock() noexcept {
    if (thread_presence* const me = via_bias_) {
      via_bias_ = nullptr;  // before the release below: the next holder reads it
      me->inside.store(nullptr, std::memory_order_release);
      return;
    }
    inner_.unlock();
  }

  /// Whether the calling thread owns the bias now (a snapshot, for tests and reports).
  [[nodiscard]] bool biased_to_caller() const noexcept {
    return owner_.load(std::memory_order_relaxed) == t_presence;  // never &no_presence
  }
  /// Whether some thread owns the bias now (a snapshot).
  [[nodiscard]] bool biased() const noexcept {
    return owner_.load(std::memory_order_relaxed) != nullptr;
  }
  /// Whether this mutex may be biased at all (the option and the fence).
  [[nodiscard]] bool can_bias() const noexcept { return can_bias_; }
  /// Times the bias was revoked (a snapshot).
  [[nodiscard]] std::uint64_t revocations() const noexcept { return schedule_.revocations(); }

 private:
  [[gnu::noinline]] void lock_slow(thread_presence* me) noexcept {
    if (me == &no_presence) {
      // Before the inner lock: it may allocate. (Null: none, the thread takes no bias.)
      me = can_bias_ ? claim_thread_presence() : nullptr;
    }
    inner_.lock();
    thread_presence* const owner = owner_.load(std::memory_order_relaxed);
    if (owner != nullptr && owner != me) {
      // Another thread's bias: revoke it, then wait for that thread to leave this mutex. (The
      // owner's own entries through the inner lock keep its bias: it is not inside, the lock not
      // being recursive, and nobody else enters through the bias.)
      owner_.store(nullptr, std::memory_order_relaxed);
      asymmetric_fence();
      wait_while([this, owner] { return owner->inside.load(std::memory_order_acquire) == this; });
      schedule_.revoked();
    } else if (owner == nullptr && me != nullptr && can_bias_) {
      if (last_ != me) {
        last_ = me;
        schedule_.restart();
      }
      if (schedule_.entered()) {
        owner_.store(me, std::memory_order_relaxed);  // for this thread's next entry
      }
    }
  }

  Inner inner_;
  std::atomic<thread_presence*> owner_{nullptr};  // written under the inner lock only
  thread_presence* via_bias_ = nullptr;  // the holder's record if it entered through the bias
  const bool can_bias_;
  // Under the inner lock:
  rebias_schedule schedule_;         // the entries of `last_` in a row
  thread_presence* last_ = nullptr;  // the last thread through the inner lock (a tag only)
};

}  // namespace poolscope::pool::detail
