// The asymmetric fence behind biased_lock (detail/biased_lock.hpp): membarrier(2)'s private
// expedited command, registered for once per process.
#include "detail/biased_lock.hpp"

#if defined(__linux__)
#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <string>

#include "poolscope/log.hpp"
#include "poolscope/pool/thread_cache_adaptor.hpp"

#if defined(__SANITIZE_THREAD__)
#define POOLSCOPE_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define POOLSCOPE_TSAN 1
#endif
#endif

namespace poolscope::pool::detail {
namespace {

#if defined(__linux__) && defined(SYS_membarrier)
long membarrier(int cmd) noexcept {
  return syscall(SYS_membarrier, cmd, 0U, 0);
}

bool register_fence() noexcept {
#if defined(POOLSCOPE_TSAN)
  return false;  // ThreadSanitizer cannot see the fence's ordering: biased locks stay off
#else
  const long commands = membarrier(MEMBARRIER_CMD_QUERY);
  if (commands < 0 || (commands & MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0 ||
      (commands & MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0) {
    return false;
  }
  return membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0;
#endif
}
#else
bool register_fence() noexcept {
  return false;
}
#endif

}  // namespace

// initial-exec (as declared), like the thread caches' t_last: 8 bytes of the static TLS block.
constinit thread_presence no_presence{&no_presence, nullptr};
constinit thread_local thread_presence* t_presence = &no_presence;

namespace {

/// Records of exited threads, for later threads. Never destroyed: threads may exit after static
/// destruction has begun, and mutexes may name any record as their owner until the process ends.
struct presence_pool {
  std::mutex mutex;
  thread_presence* free = nullptr;
};
/// Null when there was no host memory for it: records are then not recycled. (A throwing new
/// here ended the program: claim_thread_presence is noexcept, reached from a pool's lock.)
presence_pool* presences() noexcept {
  static presence_pool* const pool = new (std::nothrow) presence_pool;  // NOLINT: leaked (above)
  return pool;
}

/// Set when the thread's record went back (trivially destructible: readable to the thread's end).
thread_local bool t_presence_released = false;

/// Gives the thread's record back when the thread exits; afterwards the thread takes biased
/// mutexes through their inner locks (its remaining thread-exit work may still use a pool).
struct presence_holder {
  presence_holder() = default;
  presence_holder(const presence_holder&) = delete;
  presence_holder& operator=(const presence_holder&) = delete;
  ~presence_holder() {
    t_presence_released = true;
    thread_presence* const mine = t_presence;
    t_presence = &no_presence;
    presence_pool* const pool = presences();
    if (mine != &no_presence && pool != nullptr) {
      std::lock_guard lock(pool->mutex);  // publishes `inside == false` to the next thread
      mine->next_free = pool->free;
      pool->free = mine;
    }
  }
};
thread_local presence_holder t_holder;

}  // namespace

thread_presence* claim_thread_presence() noexcept {
  if (t_presence != &no_presence) {
    return t_presence;
  }
  if (t_presence_released) {
    return nullptr;
  }
  (void)&t_holder;  // constructed here, on the thread's first claim, to give the record back

  thread_presence* mine = nullptr;
  if (presence_pool* const pool = presences()) {
    std::lock_guard lock(pool->mutex);
    if (pool->free != nullptr) {
      mine = pool->free;
      pool->free = mine->next_free;
      mine->next_free = nullptr;
    }
  }
  if (mine == nullptr) {
    mine = new (std::nothrow) thread_presence;  // NOLINT: never freed (see presence_pool)
  }
  if (mine != nullptr) {
    t_presence = mine;
  }
  return mine;
}

bool asymmetric_fence_available() noexcept {
  static const bool available = register_fence();
  return available;
}

void asymmetric_fence() noexcept {
#if defined(__linux__) && defined(SYS_membarrier)
  // Registered, the command fails only on a bad argument; should it fail anyway, the global
  // command (which waits for every CPU to pass a quiescent state) gives the same guarantee.
  if (membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0) [[likely]] {
    return;
  }
  const int err = errno;
  if (membarrier(MEMBARRIER_CMD_GLOBAL) == 0) {
    return;
  }
  // Neither: nothing orders the owner's store and load, so stop here rather than let two
  // threads into one cache (a corrupted pool). Registration succeeded, so this cannot happen
  // on a kernel that keeps its contract.
  log(log_level::error, std::string("poolscope: membarrier failed after registration (") +
                            std::strerror(err) + "); aborting to keep the pool consistent");
  std::abort();
#endif
}

}  // namespace poolscope::pool::detail

namespace poolscope::pool {

bool owner_bias_available() noexcept {
  return detail::asymmetric_fence_available();
}

}  // namespace poolscope::pool
