// The process's one hook registry (STYLE rule 7: defined here, never as a header inline variable).
#include <algorithm>
#include <atomic>
#include <bit>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <vector>

#include "poolscope/error.hpp"
#include "poolscope/hooks/hook.hpp"
#include "poolscope/log.hpp"

namespace poolscope::hooks {
namespace detail {

std::atomic<std::uint32_t> g_installed{0};
std::atomic<std::uint32_t> g_wanted[event_filter::bit_count] = {};

/// One installation: the hook and its interests as read then.
struct installed {
  hook* h;
  std::uint32_t bits;
};

namespace {

/// Counts one installation of `bits` in (+1) or out (-1) of g_wanted and g_installed.
void count_installation(std::uint32_t bits, bool in) noexcept {
  for (std::uint32_t rest = bits; rest != 0; rest &= rest - 1) {
    auto& w = g_wanted[std::countr_zero(rest)];
    if (in) {
      w.fetch_add(1, std::memory_order_relaxed);
    } else {
      w.fetch_sub(1, std::memory_order_relaxed);
    }
  }
  if (in) {
    g_installed.fetch_add(1, std::memory_order_relaxed);
  } else {
    g_installed.fetch_sub(1, std::memory_order_relaxed);
  }
}

}  // namespace

/// One thread's hooks. Its thread delivers from it; any thread may remove from it (a scoped_hook
/// destroyed elsewhere), hence the mutex, which delivery holds while calling the hooks so that a
/// removal returns only once the hook is no longer running.
struct thread_registry {
  std::mutex mutex;
  std::vector<installed> stack;  // most recent last; guarded by mutex
  // stack.size(), written under mutex. Read without the lock by the owning thread only, which
  // alone adds entries: a zero it reads cannot be stale, so delivery skips the lock when empty.
  std::atomic<std::uint32_t> count{0};
  bool exited = false;  // the owning thread has ended (its hooks are uninstalled); under mutex

  void update_count() noexcept {
    count.store(static_cast<std::uint32_t>(stack.size()), std::memory_order_relaxed);
  }
};

namespace {

std::atomic<std::uint64_t> g_seq{0};
std::atomic<std::uint64_t> g_dropped{0};

struct process_hooks {
  std::shared_mutex mutex;
  std::vector<installed> stack;  // most recent last
};

process_hooks& process_registry() {
  // Leaked on purpose: allocators may emit from static destructors after main returns.
  static auto* registry = new process_hooks;
  return *registry;
}

/// This thread's registry, created at its first thread-scope installation. A thread that exits
/// with hooks still installed takes their installations off g_installed, so active() does not
/// stay true for good.
struct thread_hooks {
  std::shared_ptr<thread_registry> registry;

  thread_hooks() = default;
  thread_hooks(const thread_hooks&) = delete;
  thread_hooks& operator=(const thread_hooks&) = delete;
  ~thread_hooks();
};
thread_local thread_hooks t_hooks;
// What delivery reads on every event, as initial-exec TLS (no __tls_get_addr call, no guard):
// set while delivering, to drop nested events; t_hooks destroyed (events from later exit code);
// t_hooks.registry's raw pointer.
[[gnu::tls_model("initial-exec")]] thread_local constinit bool t_in_hook = false;
[[gnu::tls_model("initial-exec")]] thread_local constinit bool t_hooks_gone = false;
[[gnu::tls_model("initial-exec")]] thread_local constinit thread_registry* t_registry = nullptr;

thread_hooks::~thread_hooks() {
  if (registry) {
    std::lock_guard lock(registry->mutex);
    for (const installed& i : registry->stack) {
      count_installation(i.bits, false);
    }
    registry->stack.clear();
    registry->update_count();
    registry->exited = true;
  }
  t_hooks_gone = true;
  t_registry = nullptr;
}

/// Removes the most recent installation of `h` from `stack` and counts it out; false if it is
/// not there.
bool remove_last(std::vector<installed>& stack, const hook& h) noexcept {
  auto it =
      std::find_if(stack.rbegin(), stack.rend(), [&](const installed& i) { return i.h == &h; });
  if (it == stack.rend()) {
    return false;
  }
  const std::uint32_t bits = it->bits;
  stack.erase(std::next(it).base());
  count_installation(bits, false);
  return true;
}

/// Installs `h` on this thread; returns this thread's registry.
std::shared_ptr<thread_registry> install_on_this_thread(hook& h) {
  if (t_hooks_gone) {
    throw logic_error("poolscope::hooks::install: thread scope asked for by an exiting thread");
  }
  if (!t_hooks.registry) {
    t_hooks.registry = std::make_shared<thread_registry>();
    t_registry = t_hooks.registry.get();
  }
  thread_registry& r = *t_hooks.registry;
  const std::uint32_t bits = h.interests().bits();
  {
    std::lock_guard lock(r.mutex);
    r.stack.push_back({&h, bits});
    r.update_count();
  }
  count_installation(bits, true);
  return t_hooks.registry;
}

/// Removes the most recent installation of `h` from `r`, from any thread. Waits for a delivery
/// in progress on r's thread, so `h` is unused once this returns.
bool uninstall_from(thread_registry& r, hook& h) noexcept {
  std::lock_guard lock(r.mutex);
  if (!remove_last(r.stack, h)) {
    return false;  // not there, or the thread has exited and taken its hooks off already
  }
  r.update_count();
  return true;
}

}  // namespace

void deliver(event& e) noexcept {
  if (!wants(e.kind, e.phase)) {
    return;  // no hook asks for it (an emitter that did not test wants() first)
  }
  if (t_in_hook) {
    g_dropped.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  t_in_hook = true;
  e.seq = g_seq.fetch_add(1, std::memory_order_relaxed);
  e.time_ns = now_ns();
  e.thread = current_thread_id();
  const std::uint32_t bit = std::uint32_t{1} << event_filter::bit_of(e.kind, e.phase);
  // t_registry is null once this thread's hooks are gone (exit), or before it installed any.
  thread_registry* r = t_registry;
  if (r != nullptr && r->count.load(std::memory_order_relaxed) != 0) {
    std::lock_guard lock(r->mutex);
    for (auto it = r->stack.rbegin(); it != r->stack.rend(); ++it) {
      if ((it->bits & bit) != 0) {
        it->h->on_event(e);
      }
    }
  }
  auto& reg = process_registry();
  {
    std::shared_lock lock(reg.mutex);
    for (auto it = reg.stack.rbegin(); it != reg.stack.rend(); ++it) {
      if ((it->bits & bit) != 0) {
        it->h->on_event(e);
      }
    }
  }
  t_in_hook = false;
}

}  // namespace detail

void install(hook& h, scope where) {
  if (detail::t_in_hook) {
    throw logic_error("poolscope::hooks::install called from inside a hook");
  }
  if (where == scope::thread) {
    (void)detail::install_on_this_thread(h);
    return;
  }
  auto& reg = detail::process_registry();
  const std::uint32_t bits = h.interests().bits();
  {
    std::unique_lock lock(reg.mutex);
    reg.stack.push_back({&h, bits});
  }
  detail::count_installation(bits, true);
}

bool uninstall(hook& h, scope where) noexcept {
  if (detail::t_in_hook) {
    return false;  // would deadlock on the registry lock; the contract forbids it
  }
  if (where == scope::thread) {
    return !detail::t_hooks_gone && detail::t_hooks.registry &&
           detail::uninstall_from(*detail::t_hooks.registry, h);
  }
  auto& reg = detail::process_registry();
  std::unique_lock lock(reg.mutex);  // waits for in-flight deliveries: h is unused after return
  return detail::remove_last(reg.stack, h);
}

scoped_hook::scoped_hook(hook& h, scope where) : hook_(&h), where_(where) {
  if (detail::t_in_hook) {
    throw logic_error("poolscope::hooks::install called from inside a hook");
  }
  if (where == scope::thread) {
    owner_ = detail::install_on_this_thread(h);
  } else {
    install(h, where);
  }
}

scoped_hook::~scoped_hook() {
  if (detail::t_in_hook) {
    // Removing would wait on a registry lock this thread may hold: the hook stays installed.
    log(log_level::error,
        "poolscope::hooks::scoped_hook destroyed from inside a hook, which hooks must not do; "
        "its hook stays installed and must outlive the process's allocator events");
    return;
  }
  if (owner_) {
    (void)detail::uninstall_from(*owner_, *hook_);
  } else {
    (void)uninstall(*hook_, where_);
  }
}

std::uint64_t dropped_reentrant_events() noexcept {
  return detail::g_dropped.load(std::memory_order_relaxed);
}

}  // namespace poolscope::hooks
