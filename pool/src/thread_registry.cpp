// Per-thread nodes of an owner (detail/thread_registry.hpp): claiming, the thread-local table,
// and giving nodes back when threads exit.
#include "detail/thread_registry.hpp"

#include <new>
#include <thread>
#include <vector>

namespace poolscope::pool::detail {

// initial-exec (as declared): read inline by every allocate and deallocate.
constinit thread_local std::array<thread_slot, thread_slot_count> t_thread_slots{};

namespace {

std::atomic<std::uint32_t> g_next_key{1};

/// A node the calling thread holds, and its share of the node's registry.
struct held_node {
  std::shared_ptr<thread_registry> registry;
  thread_node* node = nullptr;
};

/// Set once the calling thread has given its nodes back (trivially destructible: readable to
/// the thread's very end). A claim afterwards gets no node.
constinit thread_local bool t_released = false;

/// The nodes the calling thread holds; given back when it exits.
struct thread_nodes {
  std::vector<held_node> held;

  thread_nodes() = default;
  thread_nodes(const thread_nodes&) = delete;
  thread_nodes& operator=(const thread_nodes&) = delete;
  ~thread_nodes() {
    t_released = true;
    t_thread_slots = {};  // the nodes are someone else's from here on
    for (held_node& h : held) {
      h.registry->release(*h.node);
    }
    held.clear();  // drops this thread's shares: a closed registry may go with them
  }
};
thread_local thread_nodes t_nodes;

}  // namespace

thread_registry::thread_registry(thread_node_owner& owner) noexcept
    : key_(g_next_key.fetch_add(1, std::memory_order_relaxed)), owner_(&owner) {}

thread_registry::~thread_registry() {
  for (thread_node* n = first(); n != nullptr;) {
    thread_node* const next = n->next;
    delete n;
    n = next;
  }
}

thread_node* thread_registry::take_locked() {
  for (thread_node* n = first(); n != nullptr; n = n->next) {
    if (!n->held) {
      n->held = true;
      n->holder = std::this_thread::get_id();
      return n;
    }
  }
  std::unique_ptr<thread_node> made = owner_->make_node();
  made->next = head_.load(std::memory_order_relaxed);
  made->held = true;
  made->holder = std::this_thread::get_id();
  thread_node* const n = made.release();
  head_.store(n, std::memory_order_release);  // published whole to lock-free walkers
  return n;
}

thread_node* thread_registry::claim() noexcept {
  if (t_released) {
    return nullptr;  // a thread-exit destructor of this thread, after its nodes went back
  }
  try {
    std::vector<held_node>& held = t_nodes.held;
    thread_node* node = nullptr;
    for (const held_node& h : held) {
      if (h.registry.get() == this) {
        node = h.node;  // held already; another registry had its table entry
        break;
      }
    }
    if (node == nullptr) {
      // Shares of registries closed since go first: their owners are gone, their keys never
      // recur.
      std::erase_if(held, [](const held_node& h) { return h.registry->closed(); });
      held.reserve(held.size() + 1);  // so that the push below cannot fail
      std::shared_ptr<thread_registry> self = shared_from_this();
      std::lock_guard lock(mutex_);
      if (owner_ == nullptr) {
        return nullptr;
      }
      node = take_locked();
      held.push_back({std::move(self), node});
    }
    t_thread_slots[key_ % thread_slot_count] = {key_, node};
    return node;
  } catch (const std::bad_alloc&) {
    return nullptr;  // no host memory for a node: the caller does without
  }
}

void thread_registry::release(thread_node& node) noexcept {
  std::lock_guard lock(mutex_);
  if (owner_ != nullptr) {
    owner_->retire(node);
  }
  node.held = false;
  node.holder = std::thread::id{};
}

}  // namespace poolscope::pool::detail
