// The process's one hook registry (STYLE rule 7: defined here, never as a header inline variable).
#include <algorithm>
#include <atomic>
#include <mutex>
#include <shared_mutex>
#include <vector>

#include "poolscope/error.hpp"
#include "poolscope/hooks/hook.hpp"

namespace poolscope::hooks {
namespace detail {

std::atomic<std::uint32_t> g_installed{0};

namespace {

std::atomic<std::uint64_t> g_seq{0};
std::atomic<std::uint64_t> g_dropped{0};

struct process_hooks {
  std::shared_mutex mutex;
  std::vector<hook*> stack;  // most recent last
};

process_hooks& process_registry() {
  // Leaked on purpose: allocators may emit from static destructors after main returns.
  static auto* registry = new process_hooks;
  return *registry;
}

/// This thread's hooks, most recent last. A thread that exits with hooks still installed
/// takes their installations off g_installed, so active() does not stay true for good.
struct thread_hooks {
  std::vector<hook*> stack;

  thread_hooks() = default;
  thread_hooks(const thread_hooks&) = delete;
  thread_hooks& operator=(const thread_hooks&) = delete;
  ~thread_hooks();
};
thread_local thread_hooks t_hooks;
thread_local bool t_in_hook = false;     // set while delivering, to drop nested events
thread_local bool t_hooks_gone = false;  // t_hooks destroyed (events from later exit code)

thread_hooks::~thread_hooks() {
  if (!stack.empty()) {
    g_installed.fetch_sub(static_cast<std::uint32_t>(stack.size()), std::memory_order_relaxed);
    stack.clear();
  }
  t_hooks_gone = true;
}

}  // namespace

void deliver(event& e) noexcept {
  if (t_in_hook) {
    g_dropped.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  t_in_hook = true;
  e.seq = g_seq.fetch_add(1, std::memory_order_relaxed);
  e.time_ns = now_ns();
  e.thread = current_thread_id();
  if (!t_hooks_gone) {
    for (auto it = t_hooks.stack.rbegin(); it != t_hooks.stack.rend(); ++it) {
      (*it)->on_event(e);
    }
  }
  auto& reg = process_registry();
  {
    std::shared_lock lock(reg.mutex);
    for (auto it = reg.stack.rbegin(); it != reg.stack.rend(); ++it) {
      (*it)->on_event(e);
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
    if (detail::t_hooks_gone) {
      throw logic_error("poolscope::hooks::install: thread scope asked for by an exiting thread");
    }
    detail::t_hooks.stack.push_back(&h);
  } else {
    auto& reg = detail::process_registry();
    std::unique_lock lock(reg.mutex);
    reg.stack.push_back(&h);
  }
  detail::g_installed.fetch_add(1, std::memory_order_relaxed);
}

bool uninstall(hook& h, scope where) noexcept {
  if (detail::t_in_hook) {
    return false;  // would deadlock on the registry lock; the contract forbids it
  }
  auto remove_last = [&h](std::vector<hook*>& stack) {
    auto it = std::find(stack.rbegin(), stack.rend(), &h);
    if (it == stack.rend()) {
      return false;
    }
    stack.erase(std::next(it).base());
    return true;
  };
  bool removed = false;
  if (where == scope::thread) {
    removed = !detail::t_hooks_gone && remove_last(detail::t_hooks.stack);
  } else {
    auto& reg = detail::process_registry();
    std::unique_lock lock(reg.mutex);  // waits for in-flight deliveries: h is unused after return
    removed = remove_last(reg.stack);
  }
  if (removed) {
    detail::g_installed.fetch_sub(1, std::memory_order_relaxed);
  }
  return removed;
}

std::uint64_t dropped_reentrant_events() noexcept {
  return detail::g_dropped.load(std::memory_order_relaxed);
}

}  // namespace poolscope::hooks
