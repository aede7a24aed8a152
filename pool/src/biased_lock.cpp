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
#include <string>

#include "poolscope/log.hpp"
#include "poolscope/pool/allocator.hpp"

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
