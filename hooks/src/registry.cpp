// The process's one hook registry (STYLE rule 7: defined here, never as a header inline variable).
#include <algorithm>
#include <atomic>
#include <bit>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <thread>
#include <vector>

#include "poolscope/error.hpp"
#include "poolscope/hooks/hook.hpp"
#include "poolscope/log.hpp"

namespace poolscope::hooks {
namespace detail {

std::atomic<std::uint32_t> g_installed{0};
std::atomic<std::uint32_t> g_wanted[event_filter::bit_count] = {};

namespace {
/// Per (kind, phase) bit: installations whose interests hold it and that read event::seq (low
/// 32 bits) or event::time_ns (high 32 bits), so delivery reads both in one load. Written at
/// installation and removal only.
constexpr std::uint64_t one_numbered = 1;
constexpr std::uint64_t one_timed = std::uint64_t{1} << 32;
std::atomic<std::uint64_t> g_needs[event_filter::bit_count] = {};
}  // namespace

/// One installation: the hook, and its interests and needs of sequence numbers and timestamps as
/// read then.
struct installed {
  hook* h;
  std::uint64_t bits;
  bool sequenced;
  bool timed;
};

namespace {

/// Counts one installation in (+1) or out (-1) of g_wanted, g_needs and g_installed.
void count_installation(const installed& i, bool in) noexcept {
  const auto count = [in](auto& counter, auto amount) {
    if (in) {
      counter.fetch_add(amount, std::memory_order_relaxed);
    } else {
      counter.fetch_sub(amount, std::memory_order_relaxed);
    }
  };
  const std::uint64_t needs = (i.sequenced ? one_numbered : 0) | (i.timed ? one_timed : 0);
  for (std::uint64_t rest = i.bits; rest != 0; rest &= rest - 1) {
    const int b = std::countr_zero(rest);
    count(g_wanted[b], 1U);
    count(g_needs[b], needs);  // adding 0 changes nothing
  }
  count(g_installed, 1U);
}

/// `h` as installed now: its interests and its needs of sequence numbers and timestamps, read once.
installed installation_of(hook& h) noexcept {
  return {&h, h.interests().bits(), h.wants_sequence(), h.wants_time()};
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

/// The process-wide sequence, from 1 (0 marks an event no hook asked a number for), alone on its
/// cache line: every sequenced event writes it, and the flags every event reads must not share it.
struct alignas(64) sequence_counter {
  std::atomic<std::uint64_t> next{1};
};
sequence_counter g_seq;
std::atomic<std::uint64_t> g_dropped{0};

/// A thread's mark for reading the process-wide stack without a shared lock: delivery sets it
/// while it reads the stack, and a writer (install, uninstall) waits until no slot is set. One
/// cache line each, so readers on different threads write no common line. Never freed: a thread
/// gives its slot back at exit, to the next thread that needs one.
struct alignas(64) reader_slot {
  std::atomic<std::uint32_t> active{0};
  reader_slot* next_free = nullptr;  // guarded by process_hooks::slots_mutex
};

/// The process-wide stack. Readers (delivery) take a thread's slot (the Dekker handshake in
/// deliver() and write_stack()), or, without one or beside a writer, `mutex` shared. Writers
/// take `mutex` exclusively, raise `writing`, wait until no slot is set, then change the stack.
struct process_hooks {
  std::shared_mutex mutex;
  std::vector<installed> stack;  // most recent last
  std::atomic<std::uint32_t> writing{0};
  std::mutex slots_mutex;
  std::vector<reader_slot*> slots;    // every slot made; guarded by slots_mutex
  reader_slot* free_slots = nullptr;  // guarded by slots_mutex
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
  reader_slot* slot = nullptr;  // this thread's reader slot, given back at exit

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
// This thread's reader slot (t_hooks.slot), and whether it was asked for already: a thread gets
// one try (a thread whose slot is gone, at exit, or could not get one reads under the lock).
[[gnu::tls_model("initial-exec")]] thread_local constinit reader_slot* t_slot = nullptr;
[[gnu::tls_model("initial-exec")]] thread_local constinit bool t_slot_asked = false;

thread_hooks::~thread_hooks() {
  if (registry) {
    std::lock_guard lock(registry->mutex);
    for (const installed& i : registry->stack) {
      count_installation(i, false);
    }
    registry->stack.clear();
    registry->update_count();
    registry->exited = true;
  }
  if (slot != nullptr) {
    auto& reg = process_registry();
    std::lock_guard lock(reg.slots_mutex);
    slot->next_free = reg.free_slots;
    reg.free_slots = slot;
  }
  t_hooks_gone = true;
  t_registry = nullptr;
  t_slot = nullptr;
}

/// This thread's reader slot, made (or taken from the free list) at its first delivery; null
/// if it could not be had (no memory, or the thread's hooks are gone at exit).
reader_slot* this_thread_slot(process_hooks& reg) noexcept {
  if (t_slot_asked) {  // set whenever t_slot is
    return t_slot;
  }
  t_slot_asked = true;
  if (t_hooks_gone) {
    return nullptr;
  }
  try {
    std::lock_guard lock(reg.slots_mutex);
    reader_slot* s = reg.free_slots;
    if (s != nullptr) {
      reg.free_slots = s->next_free;
    } else {
      reg.slots.reserve(reg.slots.size() + 1);  // first: if it throws, nothing is made
      s = new reader_slot;
      reg.slots.push_back(s);
    }
    t_hooks.slot = s;  // constructs t_hooks if need be: its destructor gives the slot back
    t_slot = s;
  } catch (...) {
    return nullptr;
  }
  return t_slot;
}

/// Changes the process-wide stack with `change(stack)`, excluding every reader: those under the
/// lock by holding it, those with a slot by raising `writing` and waiting until no slot is set.
/// Called from outside hooks only (a hook's own slot would be set).
template <typename Change>
auto write_stack(process_hooks& reg, Change&& change) {
  std::unique_lock lock(reg.mutex);
  reg.writing.store(1, std::memory_order_seq_cst);
  {
    std::lock_guard slots(reg.slots_mutex);
    for (reader_slot* s : reg.slots) {
      while (s->active.load(std::memory_order_seq_cst) != 0) {
        std::this_thread::yield();  // a delivery in progress there: it ends by itself
      }
    }
  }
  struct lower {
    process_hooks& reg;
    ~lower() { reg.writing.store(0, std::memory_order_release); }
  } done{reg};
  return change(reg.stack);
}

/// Removes the most recent installation of `h` from `stack` and counts it out; false if it is
/// not there.
bool remove_last(std::vector<installed>& stack, const hook& h) noexcept {
  auto it =
      std::find_if(stack.rbegin(), stack.rend(), [&](const installed& i) { return i.h == &h; });
  if (it == stack.rend()) {
    return false;
  }
  const installed gone = *it;
  stack.erase(std::next(it).base());
  count_installation(gone, false);
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
  const installed entry = installation_of(h);
  {
    std::lock_guard lock(r.mutex);
    r.stack.push_back(entry);
    r.update_count();
  }
  count_installation(entry, true);
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
  // seq and time_ns are filled only while an installed hook that receives this kind of event
  // reads them, so an event that only hooks wanting neither receive writes no process-wide
  // counter (the one line every thread's events would write) and reads no clock. They are
  // filled before the first receiver, so a hook that reads neither sees them too when another
  // does, whatever the order of delivery (the line profiler's peak_seq); and again, lazily, for
  // a receiver that reads them when the counts read here did not have it yet (a hook installed
  // while the event is in flight).
  const int index = event_filter::bit_of(e.kind, e.phase);
  const std::uint64_t needs = g_needs[index].load(std::memory_order_relaxed);
  e.seq = (needs & (one_timed - 1)) != 0 ? g_seq.next.fetch_add(1, std::memory_order_relaxed) : 0;
  e.time_ns = needs >= one_timed ? now_ns() : 0;
  e.thread = current_thread_id();
  const std::uint64_t bit = std::uint64_t{1} << index;
  const auto give = [&e, bit](const installed& i) {
    if ((i.bits & bit) == 0) {
      return;
    }
    if (i.sequenced && e.seq == 0) {
      e.seq = g_seq.next.fetch_add(1, std::memory_order_relaxed);
    }
    if (i.timed && e.time_ns == 0) {
      e.time_ns = now_ns();
    }
    i.h->on_event(e);
  };
  // t_registry is null once this thread's hooks are gone (exit), or before it installed any.
  thread_registry* r = t_registry;
  if (r != nullptr && r->count.load(std::memory_order_relaxed) != 0) {
    std::lock_guard lock(r->mutex);
    for (auto it = r->stack.rbegin(); it != r->stack.rend(); ++it) {
      give(*it);
    }
  }
  auto& reg = process_registry();
  auto deliver_all = [&] {
    for (auto it = reg.stack.rbegin(); it != reg.stack.rend(); ++it) {
      give(*it);
    }
  };
  // The usual way: this thread's slot set, then `writing` read, both seq_cst, against a writer's
  // `writing` raised, then every slot read: one of the two sees the other's store (Dekker), so
  // either this delivery steps aside to the lock or the writer waits for it. No line written
  // here is written by another thread's delivery.
  reader_slot* slot = this_thread_slot(reg);
  bool done = false;
  if (slot != nullptr) {
    slot->active.store(1, std::memory_order_seq_cst);
    if (reg.writing.load(std::memory_order_seq_cst) == 0) [[likely]] {
      deliver_all();
      done = true;
    }
    slot->active.store(0, std::memory_order_release);
  }
  if (!done) {
    std::shared_lock lock(reg.mutex);
    deliver_all();
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
  const detail::installed entry = detail::installation_of(h);
  detail::write_stack(reg, [&](std::vector<detail::installed>& stack) { stack.push_back(entry); });
  detail::count_installation(entry, true);
}

bool uninstall(hook& h, scope where) noexcept {
  if (detail::t_in_hook) {
    return false;  // would deadlock on the registry lock; the contract forbids it
  }
  if (where == scope::thread) {
    return !detail::t_hooks_gone && detail::t_hooks.registry &&
           detail::uninstall_from(*detail::t_hooks.registry, h);
  }
  // Waits for deliveries in progress: h is unused once this returns.
  return detail::write_stack(
      detail::process_registry(),
      [&](std::vector<detail::installed>& stack) { return detail::remove_last(stack, h); });
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
