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
// Interests: a hook says which (kind, phase) pairs it wants (hook::interests(), read once at
// installation; every pair by default). It receives only those, and an event that no installed
// hook wants is not built at all: allocators test hooks::wants(kind, phase) before building one,
// so a profiler that needs two of a pair's four events costs nothing for the other two.
//
// Cost: with no hook installed, emission is one relaxed atomic load and a predicted branch
// (hooks::active()); the event is built only on the slow path, out of line, and only if some
// installed hook wants it (one more relaxed load). Delivery to thread hooks takes that thread's
// own (uncontended) mutex; a thread without thread hooks skips it. Process-wide hooks are read
// under no shared lock: each thread marks a slot of its own (one store, one load), and install
// and uninstall wait until no thread is marked, so threads delivering at once write no common
// line but the process-wide sequence number.
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

/// A set of (event_kind, event_phase) pairs: the events a hook asks for. Plain value.
class event_filter {
 public:
  /// The empty set.
  constexpr event_filter() noexcept = default;
  /// Every kind in every phase.
  [[nodiscard]] static constexpr event_filter all() noexcept {
    return event_filter((std::uint64_t{1} << bit_count) - 1);
  }
  /// The moments memory starts and stops being usable: pool_malloc and device_alloc post,
  /// pool_free and device_free pre (what a consumer of block and segment lifetimes needs).
  [[nodiscard]] static constexpr event_filter lifetimes() noexcept {
    return event_filter{}
        .add(event_kind::pool_malloc, event_phase::post)
        .add(event_kind::device_alloc, event_phase::post)
        .add(event_kind::pool_free, event_phase::pre)
        .add(event_kind::device_free, event_phase::pre);
  }
  /// Adds `k` in phase `p`.
  constexpr event_filter& add(event_kind k, event_phase p) noexcept {
    bits_ |= std::uint64_t{1} << bit_of(k, p);
    return *this;
  }
  /// Adds `k` in every phase.
  constexpr event_filter& add(event_kind k) noexcept {
    for (int p = 0; p < phase_count; ++p) {
      add(k, static_cast<event_phase>(p));
    }
    return *this;
  }
  /// Removes `k` in phase `p`.
  constexpr event_filter& remove(event_kind k, event_phase p) noexcept {
    bits_ &= ~(std::uint64_t{1} << bit_of(k, p));
    return *this;
  }
  [[nodiscard]] constexpr bool contains(event_kind k, event_phase p) const noexcept {
    return (bits_ & (std::uint64_t{1} << bit_of(k, p))) != 0;
  }
  [[nodiscard]] constexpr bool empty() const noexcept { return bits_ == 0; }
  /// One bit per pair, bit_of(kind, phase).
  [[nodiscard]] constexpr std::uint64_t bits() const noexcept { return bits_; }
  friend constexpr bool operator==(event_filter, event_filter) noexcept = default;

  static constexpr int phase_count = 3;
  static constexpr int bit_count = event_kind_count * phase_count;
  /// The bit of (k, p): kind-major.
  [[nodiscard]] static constexpr int bit_of(event_kind k, event_phase p) noexcept {
    return static_cast<int>(k) * phase_count + static_cast<int>(p);
  }

 private:
  explicit constexpr event_filter(std::uint64_t bits) noexcept : bits_(bits) {}
  std::uint64_t bits_ = 0;
};
static_assert(event_filter::bit_count < 64, "one bit per (kind, phase) in 64 bits");

/// Base of every hook.
class hook {
 public:
  hook() = default;
  hook(const hook&) = delete;
  hook& operator=(const hook&) = delete;
  virtual ~hook() = default;

  /// Called for each event it asks for (interests()) while installed. Must not throw.
  virtual void on_event(const event& e) noexcept = 0;
  /// The events this hook wants; read once when it is installed (a hook installed twice is read
  /// twice), so it must not change while the hook is installed. Default: every event.
  [[nodiscard]] virtual event_filter interests() const noexcept { return event_filter::all(); }
  /// Whether this hook reads event::seq; read once at installation, like interests(). An event
  /// is numbered, for every receiver, while an installed hook that receives it says true; while
  /// none does it is not (seq 0), so delivery writes no process-wide counter and threads
  /// raising events at once share no written cache line (docs/perf.md, "Hooks from several
  /// threads"). Default: true.
  [[nodiscard]] virtual bool wants_sequence() const noexcept { return true; }
  /// Whether this hook reads event::time_ns; read once at installation, like interests(). An
  /// event is timed, for every receiver, while an installed hook that receives it says true;
  /// while none does it is not (time_ns 0), so delivery reads no clock (docs/perf.md, "Events
  /// untimed unless a hook reads the time"). Default: true.
  [[nodiscard]] virtual bool wants_time() const noexcept { return true; }
};

/// Where a hook is installed.
enum class scope : std::uint8_t { process, thread };

namespace detail {
/// Number of installations (process-wide plus every thread's). Defined once, in the library.
extern std::atomic<std::uint32_t> g_installed;
/// Per (kind, phase) bit (event_filter::bit_of): installations whose interests hold it.
extern std::atomic<std::uint32_t> g_wanted[event_filter::bit_count];
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

/// True if an installed hook (of any thread) wants events of kind `k` in phase `p`: test it
/// before building an event. One relaxed load.
[[nodiscard]] inline bool wants(event_kind k, event_phase p) noexcept {
  return detail::g_wanted[event_filter::bit_of(k, p)].load(std::memory_order_relaxed) != 0;
}

/// Delivers `e` to the installed hooks that want it, filling thread, and seq and time_ns while an
/// installed hook that receives it reads them (hook::wants_sequence, hook::wants_time; else 0).
/// Call only when active() is true. Never throws.
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
