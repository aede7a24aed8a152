// Hooks: receivers of allocator events, installed for a scope.
//
//   poolscope::hooks::counting_hook counts;
//   {
//     poolscope::hooks::scoped_hook guard{counts};            // process-wide, this scope
//     run_workload();
//   }                                                          // uninstalled here
//   std::cout << counts.snapshot().of(event_kind::pool_malloc).calls;
//
// Installation: hooks stack. A process-wide hook sees events from every thread; a thread hook
// (scope::thread) sees only events raised on the installing thread. Thread hooks are called
// first (innermost first), then process-wide ones (most recent first). A thread hook still
// installed when its thread exits is uninstalled then (active() does not stay true for it).
// A scoped_hook of thread scope may be destroyed on any thread: it removes the hook from the
// stack of the thread that installed it (waiting for a delivery in progress there), so the hook
// is never called after the guard is gone.
//
// Contract for hook authors: on_event is noexcept, must not allocate through a poolscope
// allocator (a nested event raised from inside a hook is dropped, not delivered), and must not
// change allocator behaviour. Hooks run synchronously on the allocating thread, often while the
// allocator holds its lock: keep them short.
//
// Cost: with no hook installed, emission is one relaxed atomic load and a predicted branch
// (hooks::active()); the event is built only on the slow path, out of line. Delivery to thread
// hooks takes that thread's own (uncontended) mutex; a thread without thread hooks skips it.
//
// Thread safety: install/uninstall and delivery are thread-safe; a process-wide hook may be
// called from several threads at once and must be thread-safe itself. A hook must outlive its
// installation (scoped_hook guarantees that for a stack object).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "poolscope/hooks/event.hpp"

namespace poolscope::hooks {

/// Base of every hook.
class hook {
 public:
  hook() = default;
  hook(const hook&) = delete;
  hook& operator=(const hook&) = delete;
  virtual ~hook() = default;

  /// Called for each event while installed. Must not throw.
  virtual void on_event(const event& e) noexcept = 0;
};

/// Where a hook is installed.
enum class scope : std::uint8_t { process, thread };

namespace detail {
/// Number of installations (process-wide plus every thread's). Defined once, in the library.
extern std::atomic<std::uint32_t> g_installed;
/// Slow path: fills seq/time/thread and delivers to the installed hooks.
void deliver(event& e) noexcept;
/// One thread's hook stack. Owned jointly by its thread and by the scoped_hooks installed there,
/// so a guard outliving the thread, or destroyed on another thread, still reaches it.
struct thread_registry;
}  // namespace detail

/// True if any hook is installed anywhere: the one branch on every allocator hot path.
[[nodiscard]] inline bool active() noexcept {
  return detail::g_installed.load(std::memory_order_relaxed) != 0;
}

/// Delivers `e` to the installed hooks, filling seq, time_ns and thread. Call only when
/// active() is true (emit() does that check). Never throws.
inline void dispatch(event& e) noexcept {
  detail::deliver(e);
}

/// Installs `h` until uninstall(h) (scope::thread: for the calling thread). Prefer scoped_hook.
void install(hook& h, scope where = scope::process);
/// Removes the most recent installation of `h` in `where` (scope::thread: the calling thread's
/// stack); returns false if it was not there, or if called from inside a hook.
bool uninstall(hook& h, scope where = scope::process) noexcept;

/// Installs a hook for the lifetime of this object. Thread scope means the constructing thread;
/// the guard may be destroyed on any thread and still removes the hook from that thread's stack.
/// Thread safety: one guard is used by one thread at a time; guards on different threads are
/// independent. Destroyed from inside a hook (which the hook contract forbids), it cannot remove
/// the hook and says so through poolscope::log.
class scoped_hook {
 public:
  /// Installs `h` in `where` (throws logic_error from inside a hook, as install() does).
  explicit scoped_hook(hook& h, scope where = scope::process);
  scoped_hook(const scoped_hook&) = delete;
  scoped_hook& operator=(const scoped_hook&) = delete;
  /// Uninstalls the hook; once it returns, the hook is not running and is not called again.
  ~scoped_hook();

 private:
  hook* hook_;
  scope where_;
  std::shared_ptr<detail::thread_registry> owner_;  // the installing thread's stack (thread scope)
};

/// Number of events dropped because they were raised from inside a hook.
[[nodiscard]] std::uint64_t dropped_reentrant_events() noexcept;

}  // namespace poolscope::hooks
