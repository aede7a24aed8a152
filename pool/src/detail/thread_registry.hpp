// Per-thread state of one owner: each thread that uses the owner (an allocator's counters, a
// thread_cache_adaptor's caches) holds a node of its own, which the hot paths find through a
// small thread-local table of recently used nodes, without a lock.
//
// Lifetimes. The registry owns its nodes and is shared (std::shared_ptr) by its owner and by
// every thread that holds one of its nodes, so a node's memory lives as long as either does.
// A node outlives its thread: when the thread exits, the owner retires the node (under the
// registry's mutex) and a later thread takes it over. Before the owner is destroyed it closes
// the registry: no callback reaches it afterwards, and threads drop their share of the registry
// at their next claim or at their exit. Nodes are only added, at the head of a list that any
// thread may walk without the mutex while it holds a share of the registry (its owner does).
//
// Thread safety: claim, release, close and for_each take the registry's mutex; local() and the
// walk from first() take none. Lock order: a registry's mutex before anything its callbacks take.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>

namespace poolscope::pool::detail {

/// A node of a thread_registry; owners derive their per-thread state from it.
struct thread_node {
  thread_node() = default;
  thread_node(const thread_node&) = delete;
  thread_node& operator=(const thread_node&) = delete;
  virtual ~thread_node() = default;

  /// The next node of the registry's list (null at its end): set before the node is published,
  /// never changed afterwards.
  thread_node* next = nullptr;
  /// A thread holds the node now, and which (guarded by the registry's mutex).
  bool held = false;
  std::thread::id holder;
};

/// What a registry asks of its owner, always under the registry's mutex.
class thread_node_owner {
 public:
  /// A new node for the calling thread. May throw std::bad_alloc.
  [[nodiscard]] virtual std::unique_ptr<thread_node> make_node() = 0;
  /// The thread that holds `node` is exiting: take back what only that thread may use. The node
  /// then waits for a later thread, which takes it over as it is.
  virtual void retire(thread_node& node) noexcept = 0;

 protected:
  thread_node_owner() = default;
  ~thread_node_owner() = default;
};

/// One entry of a thread's table of recently used nodes: `key` names the registry (0: none).
struct thread_slot {
  std::uint32_t key = 0;
  thread_node* node = nullptr;
};
inline constexpr std::size_t thread_slot_count = 8;
/// The calling thread's table, indexed by a registry's key modulo its size. Trivially
/// destructible and constant-initialised: read inline without a TLS guard. initial-exec: one
/// load from the thread pointer (thread_registry.cpp defines it; 128 bytes of the static TLS
/// block, which glibc keeps a surplus of for libraries loaded later, as the plug-in is).
[[gnu::tls_model(
    "initial-exec")]] extern thread_local constinit std::array<thread_slot, thread_slot_count>
    t_thread_slots;

/// The nodes of one owner; see the file comment. Create it with std::make_shared.
class thread_registry : public std::enable_shared_from_this<thread_registry> {
 public:
  explicit thread_registry(thread_node_owner& owner) noexcept;
  thread_registry(const thread_registry&) = delete;
  thread_registry& operator=(const thread_registry&) = delete;
  /// Frees every node.
  ~thread_registry();

  /// The calling thread's node, or null when it cannot have one (no host memory, the thread is
  /// exiting, or the registry is closed). Inline while the node is in the thread's table.
  [[nodiscard, gnu::always_inline]] thread_node* local() noexcept { return local(key_, *this); }
  /// local() for a caller that keeps the registry's key beside its own hot data (one load less).
  [[nodiscard, gnu::always_inline]] static thread_node* local(std::uint32_t key,
                                                              thread_registry& r) noexcept {
    const thread_slot& s = t_thread_slots[key % thread_slot_count];
    if (s.key == key) [[likely]] {
      return s.node;
    }
    return r.claim();
  }
  /// The calling thread's node, now in its table; null when it cannot have one. Out of line:
  /// for callers whose table lookup missed.
  [[gnu::noinline]] thread_node* claim() noexcept;
  /// The calling thread's table entry for registry key `key` (its node, when the entry's key is
  /// `key`; else claim()).
  [[nodiscard, gnu::always_inline]] static const thread_slot& slot(std::uint32_t key) noexcept {
    return t_thread_slots[key % thread_slot_count];
  }
  /// The key that names this registry in the threads' tables.
  [[nodiscard]] std::uint32_t key() const noexcept { return key_; }
  /// The first node of the list; walk it through `next`.
  [[nodiscard]] thread_node* first() const noexcept {
    return head_.load(std::memory_order_acquire);
  }
  /// Runs `f(node)` on every node with the mutex held (so no node changes hands meanwhile).
  template <class F>
  void for_each(F&& f) const {
    std::lock_guard lock(mutex_);
    for (thread_node* n = first(); n != nullptr; n = n->next) {
      f(*n);
    }
  }
  /// For the owner's destructor: runs `f(node)` on every node with the mutex held, then no
  /// callback reaches the owner any more.
  template <class F>
  void close(F&& f) noexcept {
    std::lock_guard lock(mutex_);
    for (thread_node* n = first(); n != nullptr; n = n->next) {
      f(*n);
    }
    owner_ = nullptr;
    closed_.store(true, std::memory_order_release);
  }
  /// The exiting thread gives its node back (retired by the owner, if it is still there).
  void release(thread_node& node) noexcept;
  /// Whether close() has run. Takes no lock (a claim asks it of other registries while it may
  /// hold this one's mutex).
  [[nodiscard]] bool closed() const noexcept { return closed_.load(std::memory_order_acquire); }

 private:
  thread_node* take_locked();  // a free node, or a new one; may throw std::bad_alloc

  const std::uint32_t key_;
  mutable std::mutex mutex_;
  thread_node_owner* owner_;  // null once closed; guarded by mutex_
  std::atomic<thread_node*> head_{nullptr};
  std::atomic<bool> closed_{false};
};

}  // namespace poolscope::pool::detail
