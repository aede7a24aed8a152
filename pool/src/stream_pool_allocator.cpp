#include "poolscope/pool/stream_pool_allocator.hpp"

#include <algorithm>
#include <mutex>
#include <shared_mutex>

#include "detail/cuda_seam.hpp"
#include "detail/log_fixed.hpp"
#include "detail/stream_pool_state.hpp"
#include "poolscope/error.hpp"
#include "poolscope/log.hpp"
#include "poolscope/pool/best_fit_allocator.hpp"
#include "poolscope/pool/bfc_allocator.hpp"
#include "poolscope/pool/factory.hpp"
#include "poolscope/pool/virtual_resource.hpp"

namespace poolscope::pool {
namespace {

// CUDA events, recycled per device: a pool records one per release_cached(stream) or
// cross-stream free, so creation cost matters little, but reuse keeps the driver's event table
// small. An event must belong to its stream's device, and a pool over pinned memory serves
// streams of every GPU: each event is created on the device of the stream it is recorded on, and
// synchronize_all waits for every device a stream was attached or recorded on (and the
// resource's own device).
class cuda_event_source final : public stream_event_source {
 public:
  explicit cuda_event_source(int device) {
    if (device >= 0) {
      devices_.push_back(device);
    }
  }
  ~cuda_event_source() override {
    for (slot* s : free_) {
      detail::cudart::event_destroy(s->event);
      delete s;
    }
  }

 private:
  struct slot {
    cudaEvent_t event = nullptr;
    int device = -1;
  };
  static slot& as_slot(handle e) noexcept { return *reinterpret_cast<slot*>(e); }

  void note_device(int device) {
    std::lock_guard lock(mutex_);
    if (std::find(devices_.begin(), devices_.end(), device) == devices_.end()) {
      devices_.push_back(device);
    }
  }
  void do_attach(stream_view stream) override {
    note_device(detail::cudart::stream_device(static_cast<cudaStream_t>(stream.value())));
  }
  handle do_record(stream_view stream) override {
    const auto cuda_stream = static_cast<cudaStream_t>(stream.value());
    const int device = detail::cudart::stream_device(cuda_stream);
    note_device(device);
    slot* s = nullptr;
    {
      std::lock_guard lock(mutex_);
      const auto it = std::find_if(free_.rbegin(), free_.rend(),
                                   [device](const slot* f) { return f->device == device; });
      if (it != free_.rend()) {
        s = *it;
        free_.erase(std::next(it).base());
      }
    }
    if (s == nullptr) {
      auto fresh = std::make_unique<slot>();
      fresh->device = device;
      detail::cudart::device_guard guard{device};
      fresh->event = detail::cudart::event_create();
      s = fresh.release();
    }
    try {
      detail::cudart::event_record(s->event, cuda_stream);
    } catch (...) {
      do_destroy(reinterpret_cast<handle>(s));
      throw;
    }
    return reinterpret_cast<handle>(s);
  }
  bool do_query(handle e) override { return detail::cudart::event_query(as_slot(e).event); }
  void do_synchronize(handle e) override { detail::cudart::event_synchronize(as_slot(e).event); }
  void do_synchronize_all() override {
    // By index, not a copy: devices are only added, and this may run out of host memory.
    for (std::size_t i = 0;; ++i) {
      int device = -1;
      {
        std::lock_guard lock(mutex_);
        if (i >= devices_.size()) {
          return;
        }
        device = devices_[i];
      }
      detail::cudart::device_synchronize(device);
    }
  }
  void do_destroy(handle e) noexcept override {
    // Re-recording an event that has not completed yet is allowed: it only moves the event.
    slot* s = &as_slot(e);
    try {
      std::lock_guard lock(mutex_);
      free_.push_back(s);
    } catch (...) {
      detail::cudart::event_destroy(s->event);
      delete s;
    }
  }

  std::mutex mutex_;
  std::vector<int> devices_;  // every device whose streams this source has seen
  std::vector<slot*> free_;
};

std::unique_ptr<stream_event_source> default_event_source(const resource& upstream) {
  if (upstream.kind() == memory_kind::host) {
    return std::make_unique<host_event_source>();
  }
  return std::make_unique<cuda_event_source>(upstream.device());
}

std::string checked_inner(std::string_view inner) {
  const auto names = allocator_names();
  if (inner == "stream_pool" || std::find(names.begin(), names.end(), inner) == names.end()) {
    std::string expected;
    for (const auto& n : names) {
      if (n != "stream_pool") {
        expected += expected.empty() ? n : "|" + n;
      }
    }
    throw invalid_argument("poolscope: stream_pool_allocator: inner strategy '" +
                           std::string(inner) + "' is not one of " + expected);
  }
  return std::string(inner);
}

// The thread's last (pool, stream) -> state lookup. States live as long as their pool, and a
// pool id is never reused, so a hit is always valid while the caller uses that pool.
struct last_state {
  std::uint32_t pool = 0;
  void* stream = nullptr;
  detail::stream_state* state = nullptr;
};
thread_local last_state t_last;

// Waste allowed when a cached whole block larger than asked serves a request (normal path).
std::size_t waste_cap(std::size_t bytes) noexcept {
  return bytes + bytes / 8;
}

}  // namespace

stream_event_source::handle host_event_source::do_record(stream_view /*stream*/) {
  return next_.fetch_add(1, std::memory_order_relaxed);
}

stream_pool_allocator::stream_pool_allocator(resource& upstream, std::string_view inner,
                                             std::unique_ptr<stream_event_source> events)
    : allocator(upstream, "stream_pool(" + std::string(inner) + ")/" + upstream.name()),
      inner_(checked_inner(inner)),
      maps_granules_(inner_ == "bfc" && dynamic_cast<virtual_resource*>(&upstream) != nullptr),
      events_(events != nullptr ? std::move(events) : default_event_source(upstream)),
      shared_(std::make_unique<detail::shared_cache>()) {
  // Its blocks are its inner pools': rounded to 512 B by best_fit and bfc, exact by naive.
  if (inner_ == "best_fit" || inner_ == "bfc") {
    static_assert(best_fit_allocator::round_bytes == bfc_allocator::round_bytes);
    set_size_granularity(bfc_allocator::round_bytes);
  }
}

stream_pool_allocator::~stream_pool_allocator() {
  // A barrier first: every block cached anywhere may then go back on the default stream
  // without touching (possibly destroyed) user streams.
  try {
    events_->synchronize_all();
  } catch (const std::exception& e) {
    detail::log_fixed(log_level::error,
                      "poolscope: %s: barrier failed while destroying the pool; freeing anyway: %s",
                      name().c_str(), e.what());
  }
  closing_ = true;
  for (detail::stream_state* st : order_) {
    std::lock_guard lock(st->mutex);
    for (const auto& p : st->pending) {
      if (p.event != 0) {
        events_->destroy(p.event);
      }
    }
    st->pending.clear();  // still live in the inner pool, which frees them below
    st->pending_bytes = 0;
    st->inner.reset();  // gives every block (cached or live) back to st->local
    release_local_locked(*st);
    st->upstream.reset();
  }
  (void)release_shared(true);
}

detail::stream_state* stream_pool_allocator::find_state(stream_view stream) const {
  if (t_last.pool == id() && t_last.stream == stream.value()) {
    return t_last.state;
  }
  std::shared_lock lock(states_mutex_);
  auto it = states_.find(stream.value());
  if (it == states_.end()) {
    return nullptr;
  }
  t_last = {id(), stream.value(), it->second.get()};
  return it->second.get();
}

detail::stream_state& stream_pool_allocator::state_for(stream_view stream) {
  if (detail::stream_state* st = find_state(stream)) {
    return *st;
  }
  std::unique_lock lock(states_mutex_);
  auto it = states_.find(stream.value());
  if (it == states_.end()) {
    events_->attach(stream);  // before anything can be recorded on it
    auto st = std::make_unique<detail::stream_state>(stream);
    // The inner pool is driven only through strategy_*: a thread cache would never be used.
    const allocator_options inner_options{.thread_cache = false};
    if (maps_granules_) {
      // Over a virtual resource, bfc maps granules of address ranges of its own (the class
      // comment): the resource itself is its upstream, and its maps are this pool's.
      st->inner = make_allocator(inner_, upstream(), inner_options);
      adopt(*st->inner, adopted_upstream::shared);
    } else {
      st->upstream = std::make_unique<detail::stream_upstream>(*this, *st, upstream());
      st->inner = make_allocator(inner_, *st->upstream, inner_options);
      adopt(*st->inner, adopted_upstream::internal);
    }
    order_.reserve(order_.size() + 1);
    it = states_.emplace(stream.value(), std::move(st)).first;
    order_.push_back(it->second.get());
  }
  t_last = {id(), stream.value(), it->second.get()};
  return *it->second;
}

std::vector<detail::stream_state*> stream_pool_allocator::states_snapshot() const {
  std::shared_lock lock(states_mutex_);
  return order_;
}

detail::stream_state* stream_pool_allocator::state_at(std::size_t i) const noexcept {
  std::shared_lock lock(states_mutex_);
  return i < order_.size() ? order_[i] : nullptr;
}

std::size_t stream_pool_allocator::stream_count() const {
  std::shared_lock lock(states_mutex_);
  return order_.size();
}

// ---- the user's requests ------------------------------------------------------------------

block stream_pool_allocator::do_allocate(stream_view stream, std::size_t bytes,
                                         std::size_t alignment) {
  detail::stream_state& st = state_for(stream);
  std::lock_guard lock(st.mutex);
  if (!st.pending.empty()) {
    drain_pending_locked(st, false);
  }
  const block b = strategy_allocate(*st.inner, stream, bytes, alignment);
  if (b.ptr == nullptr) {
    return {};
  }
  try {
    st.live.emplace(b.ptr, detail::live_block{bytes, b.rounded});
  } catch (...) {
    (void)strategy_deallocate(*st.inner, stream, b.ptr, bytes, alignment);
    throw;
  }
  return b;
}

free_outcome stream_pool_allocator::do_deallocate(stream_view stream, void* ptr, std::size_t bytes,
                                                  std::size_t alignment) noexcept {
  if (detail::stream_state* st = find_state(stream)) {
    std::lock_guard lock(st->mutex);
    auto it = st->live.find(ptr);
    if (it != st->live.end()) {
      st->live.erase(it);
      // Back into the stream's own pool: reusable at once on this stream, by no other.
      return strategy_deallocate(*st->inner, stream, ptr, bytes, alignment);
    }
  }
  return deallocate_elsewhere(stream, ptr, bytes, alignment);
}

free_outcome stream_pool_allocator::deallocate_elsewhere(stream_view stream, void* ptr,
                                                         std::size_t bytes,
                                                         std::size_t alignment) noexcept {
  // The states are walked by index, not copied: a free must work when the host is out of memory.
  // Allocated on another stream: it returns to that stream's pool once the work enqueued on
  // `stream` so far (the block's last use) has finished.
  for (std::size_t i = 0; detail::stream_state* owner = state_at(i); ++i) {
    if (owner->stream == stream) {
      continue;
    }
    std::lock_guard lock(owner->mutex);
    auto it = owner->live.find(ptr);
    if (it == owner->live.end()) {
      continue;
    }
    const detail::live_block b = it->second;
    stream_event_source::handle event = 0;
    try {
      event = events_->record(stream);
    } catch (const std::exception& e) {
      detail::log_fixed(log_level::warn,
                        "poolscope: %s: could not record an event for a cross-stream free; the "
                        "block waits for the next barrier: %s",
                        name().c_str(), e.what());
    }
    // Freed now (counted so by the caller): the block is reusable only once drained.
    try {
      owner->pending.push_back({.ptr = ptr,
                                .requested = b.requested,
                                .rounded = b.rounded,
                                .alignment = alignment,
                                .event = event});
      owner->pending_bytes += b.rounded;
      owner->live.erase(it);
    } catch (...) {
      // No host memory to queue it: wait here for the freeing stream's work (the event, or a
      // barrier without one), then give it straight back to its stream's pool.
      return_at_once_locked(*owner, ptr, alignment, event);
    }
    return {bytes == b.requested ? hooks::free_error::none : hooks::free_error::size_mismatch,
            b.rounded, b.requested};
  }
  for (std::size_t i = 0; detail::stream_state* owner = state_at(i); ++i) {
    std::lock_guard lock(owner->mutex);
    for (const auto& p : owner->pending) {
      if (p.ptr == ptr) {
        return {hooks::free_error::double_free, 0, 0};
      }
    }
  }
  // Not live anywhere: let the stream's inner pool say whether it is a double free or a
  // stranger (the pointer is not live in it, so this changes nothing).
  if (detail::stream_state* st = find_state(stream)) {
    std::lock_guard lock(st->mutex);
    const free_outcome out = strategy_deallocate(*st->inner, stream, ptr, bytes, alignment);
    if (out.error != hooks::free_error::none) {
      return {out.error, 0, 0};
    }
    return out;
  }
  return {hooks::free_error::unknown_pointer, 0, 0};
}

void stream_pool_allocator::return_at_once_locked(detail::stream_state& owner, void* ptr,
                                                  std::size_t alignment,
                                                  stream_event_source::handle event) noexcept {
  try {
    if (event != 0) {
      events_->synchronize(event);
    } else {
      events_->synchronize_all();
    }
  } catch (...) {
    // The freeing stream's work cannot be waited for: keep the block (live in its pool, counted
    // as freed) until the pool is destroyed rather than risk handing it out under that work.
    if (event != 0) {
      events_->destroy(event);
    }
    detail::log_fixed(log_level::error,
                      "poolscope: %s: out of host memory queueing a cross-stream free, and the "
                      "freeing stream could not be waited for; the block is held until the pool "
                      "is destroyed",
                      name().c_str());
    return;
  }
  if (event != 0) {
    events_->destroy(event);
  }
  const auto it = owner.live.find(ptr);
  const std::size_t requested = it->second.requested;
  owner.live.erase(it);
  (void)strategy_deallocate(*owner.inner, owner.stream, ptr, requested, alignment);
}

void stream_pool_allocator::drain_pending_locked(detail::stream_state& st, bool after_barrier) {
  for (std::size_t i = 0; i < st.pending.size();) {
    detail::pending_free& p = st.pending[i];
    const bool done = after_barrier || (p.event != 0 && events_->query(p.event));
    if (!done) {
      ++i;
      continue;
    }
    (void)strategy_deallocate(*st.inner, st.stream, p.ptr, p.requested, p.alignment);
    st.pending_bytes -= p.rounded;
    if (p.event != 0) {
      events_->destroy(p.event);
    }
    p = st.pending.back();
    st.pending.pop_back();
  }
}

// ---- whole blocks for the inner pools ------------------------------------------------------

void* stream_pool_allocator::acquire_block_locked(detail::stream_state& st, std::size_t bytes) {
  const std::size_t cap = waste_cap(bytes);
  if (void* p = take_local_locked(st, bytes, cap)) {
    return p;
  }
  if (void* p = take_shared_locked(st, bytes, cap, false)) {
    return p;
  }
  if (void* p = upstream_allocate(st.stream, bytes)) {
    return p;
  }
  // Running short: any cached block that fits, however large...
  if (void* p = take_local_locked(st, bytes, SIZE_MAX)) {
    return p;
  }
  if (void* p = take_shared_locked(st, bytes, SIZE_MAX, false)) {
    return p;
  }
  // ... waiting for its release event if need be ...
  if (void* p = take_shared_locked(st, bytes, SIZE_MAX, true)) {
    return p;
  }
  // ... then, after a barrier, the free blocks of the other streams' pools. Their mutexes are
  // only tried (one that is busy is left alone: the allocator's release-and-retry covers it),
  // and taken before the barrier, so nothing freed after it can be mistaken as covered by it.
  std::vector<detail::stream_state*> others;
  std::vector<std::unique_lock<std::mutex>> locks;
  for (detail::stream_state* other : states_snapshot()) {
    if (other == &st) {
      continue;
    }
    std::unique_lock lock(other->mutex, std::try_to_lock);
    if (lock.owns_lock()) {
      others.push_back(other);
      locks.push_back(std::move(lock));
    }
  }
  const auto covered = shared_events();
  events_->synchronize_all();
  mark_complete(covered);
  for (detail::stream_state* other : others) {
    drain_pending_locked(*other, true);
    (void)release_stream_locked(*other, false);
  }
  locks.clear();
  if (void* p = take_shared_locked(st, bytes, SIZE_MAX, false)) {
    return p;
  }
  // Nothing cached fits: give back what cannot serve this request (every block in st.local
  // was released before the barrier) and ask the resource again.
  release_local_locked(st);
  (void)release_shared(false);
  return upstream_allocate(st.stream, bytes);
}

void stream_pool_allocator::return_block_locked(detail::stream_state& st, void* ptr,
                                                std::size_t bytes) noexcept {
  std::size_t size = bytes;
  if (!st.oversize.empty()) {
    auto it = st.oversize.find(ptr);
    if (it != st.oversize.end()) {
      size = it->second.size;
      st.oversize_tail -= it->second.size - it->second.asked;
      st.oversize.erase(it);
    }
  }
  try {
    st.local.emplace(size, detail::cached_block{ptr, &st, nullptr});
    st.local_bytes += size;
  } catch (...) {
    // No host memory to cache it: return it to the resource, ordered on its stream.
    upstream_deallocate(closing_ ? stream_view{} : st.stream, ptr, size);
  }
}

void* stream_pool_allocator::take_local_locked(detail::stream_state& st, std::size_t bytes,
                                               std::size_t cap) {
  auto it = st.local.lower_bound(bytes);
  if (it == st.local.end() || it->first > cap) {
    return nullptr;
  }
  void* p = it->second.ptr;
  st.note_oversize(p, it->first, bytes);
  st.local_bytes -= it->first;
  st.local.erase(it);
  return p;
}

void* stream_pool_allocator::take_shared_locked(detail::stream_state& st, std::size_t bytes,
                                                std::size_t cap, bool wait) {
  for (;;) {
    std::shared_ptr<detail::release_event> to_wait;
    {
      std::lock_guard lock(shared_->mutex);
      for (auto it = shared_->blocks.lower_bound(bytes);
           it != shared_->blocks.end() && it->first <= cap; ++it) {
        detail::cached_block& b = it->second;
        // The releasing stream itself needs no event; others need it completed.
        bool usable = b.tag == &st || b.event->complete;
        if (!usable) {
          usable = b.event->complete = events_->query(b.event->handle);
        }
        if (!usable) {
          if (wait && to_wait == nullptr) {
            to_wait = b.event;
          }
          continue;
        }
        void* p = b.ptr;
        st.note_oversize(p, it->first, bytes);
        shared_->bytes -= it->first;
        shared_->blocks.erase(it);  // may destroy the batch's event
        return p;
      }
    }
    if (to_wait == nullptr) {
      return nullptr;
    }
    events_->synchronize(to_wait->handle);
    std::lock_guard lock(shared_->mutex);
    to_wait->complete = true;
  }
}

std::size_t stream_pool_allocator::release_stream_locked(detail::stream_state& st,
                                                         bool record_event) {
  const std::size_t by_inner =
      strategy_release_cached(*st.inner);  // wholly free blocks -> st.local
  if (maps_granules_) {
    return by_inner;  // unmapped and returned to the resource by the inner pool itself
  }
  if (st.local.empty()) {
    return 0;
  }
  // One event for the whole batch, recorded now on the releasing stream. If recording fails
  // the blocks simply stay in st.local.
  auto event = std::make_shared<detail::release_event>(record_event ? events_.get() : nullptr, 0,
                                                       !record_event);
  if (record_event) {
    event->handle = events_->record(st.stream);
  }
  std::size_t moved = 0;
  std::lock_guard lock(shared_->mutex);
  while (!st.local.empty()) {
    auto node = st.local.extract(st.local.begin());
    node.mapped().event = event;
    moved += node.key();
    shared_->blocks.insert(std::move(node));  // reuses the node: cannot fail
  }
  shared_->bytes += moved;
  st.local_bytes = 0;
  return moved;
}

std::vector<std::shared_ptr<detail::release_event>> stream_pool_allocator::shared_events() const {
  std::vector<std::shared_ptr<detail::release_event>> out;
  std::lock_guard lock(shared_->mutex);
  for (const auto& [size, b] : shared_->blocks) {
    if (!b.event->complete && (out.empty() || out.back() != b.event)) {
      out.push_back(b.event);
    }
  }
  return out;
}

void stream_pool_allocator::mark_complete(
    const std::vector<std::shared_ptr<detail::release_event>>& covered) {
  std::lock_guard lock(shared_->mutex);
  for (const auto& e : covered) {
    e->complete = true;
  }
}

void stream_pool_allocator::release_local_locked(detail::stream_state& st) noexcept {
  // Only after a barrier: the blocks go back on the default stream.
  for (auto& [size, b] : st.local) {
    upstream_deallocate(stream_view{}, b.ptr, size);
  }
  st.local.clear();
  st.local_bytes = 0;
}

std::size_t stream_pool_allocator::release_shared(bool all) noexcept {
  // Blocks whose release event has completed (all of them at destruction, after the barrier)
  // go back on the default stream: their last use is over.
  detail::block_map victims;
  {
    std::lock_guard lock(shared_->mutex);
    for (auto it = shared_->blocks.begin(); it != shared_->blocks.end();) {
      detail::release_event& e = *it->second.event;
      if (!all && !e.complete) {
        try {
          e.complete = events_->query(e.handle);
        } catch (const std::exception& ex) {
          detail::log_fixed(log_level::warn,
                            "poolscope: %s: event query failed; the block stays cached: %s",
                            name().c_str(), ex.what());
        }
      }
      if (!all && !e.complete) {
        ++it;
        continue;
      }
      shared_->bytes -= it->first;
      victims.insert(shared_->blocks.extract(it++));
    }
  }
  std::size_t released = 0;
  for (auto& [size, b] : victims) {
    upstream_deallocate(stream_view{}, b.ptr, size);
    released += size;
  }
  return released;
}

// ---- release and statistics ----------------------------------------------------------------

std::size_t stream_pool_allocator::release_cached(stream_view stream) {
  detail::stream_state* st = find_state(stream);
  if (st == nullptr) {
    return 0;
  }
  std::lock_guard lock(st->mutex);
  if (!st->pending.empty()) {
    drain_pending_locked(*st, false);
  }
  return release_stream_locked(*st, true);
}

std::size_t stream_pool_allocator::do_release_cached() {
  // Every stream's mutex (in first-use order, the only place two are held blocking) is taken
  // before the barrier, so no block freed after it is mistaken as covered by it.
  const auto states = states_snapshot();
  std::vector<std::unique_lock<std::mutex>> locks;
  locks.reserve(states.size());
  for (detail::stream_state* st : states) {
    locks.emplace_back(st->mutex);
  }
  const auto covered = shared_events();
  events_->synchronize_all();
  mark_complete(covered);
  std::size_t released = 0;
  for (detail::stream_state* st : states) {
    drain_pending_locked(*st, true);
    // Over a virtual resource the inner pool unmaps and returns to the resource itself; else
    // its wholly free blocks land in st->local, returned here.
    const std::size_t by_inner = strategy_release_cached(*st->inner);
    released += maps_granules_ ? by_inner : st->local_bytes;
    release_local_locked(*st);
  }
  locks.clear();
  return released + release_shared(false);
}

void stream_pool_allocator::do_cache_stats(allocator_stats& s) const {
  s.cached_blocks = 0;
  s.cached_bytes = 0;
  s.largest_free_block = 0;
  for (detail::stream_state* st : states_snapshot()) {
    std::lock_guard lock(st->mutex);
    allocator_stats inner;
    strategy_cache_stats(*st->inner, inner);
    // Held bytes that are not in use count as cached: blocks freed on another stream waiting
    // for its event (release_cached() reclaims them), and the tails of whole blocks larger than
    // the inner pool asked for (one cached block each; reusable once the block leaves the pool).
    s.cached_blocks +=
        inner.cached_blocks + st->local.size() + st->pending.size() + st->oversize.size();
    s.cached_bytes += inner.cached_bytes + st->local_bytes + st->pending_bytes + st->oversize_tail;
    s.largest_free_block = std::max(s.largest_free_block, inner.largest_free_block);
    s.virtual_bytes += inner.virtual_bytes;  // over a virtual resource (else all 0)
    s.mapped_free_bytes += inner.mapped_free_bytes;
    s.maps += inner.maps;
    s.unmaps += inner.unmaps;
    if (!st->local.empty()) {
      s.largest_free_block = std::max(s.largest_free_block, st->local.rbegin()->first);
    }
    for (const auto& p : st->pending) {
      s.largest_free_block = std::max(s.largest_free_block, p.rounded);
    }
  }
  std::lock_guard lock(shared_->mutex);
  s.cached_blocks += shared_->blocks.size();
  s.cached_bytes += shared_->bytes;
  if (!shared_->blocks.empty()) {
    s.largest_free_block = std::max(s.largest_free_block, shared_->blocks.rbegin()->first);
  }
}

std::vector<stream_cached_bytes> stream_pool_allocator::cached_bytes_by_stream() const {
  const auto states = states_snapshot();
  std::vector<stream_cached_bytes> out;
  out.reserve(states.size());
  for (detail::stream_state* st : states) {
    std::lock_guard lock(st->mutex);
    allocator_stats inner;
    strategy_cache_stats(*st->inner, inner);
    stream_cached_bytes c;
    c.stream = st->stream;
    c.pool_bytes = inner.cached_bytes + st->local_bytes;
    c.pending_bytes = st->pending_bytes;
    c.tail_bytes = st->oversize_tail;
    out.push_back(c);
  }
  {
    std::lock_guard lock(shared_->mutex);
    for (const auto& [size, b] : shared_->blocks) {
      for (std::size_t i = 0; i < states.size(); ++i) {
        if (states[i] == b.tag) {
          out[i].released_bytes += size;
          break;
        }
      }
    }
  }
  for (auto& c : out) {
    c.bytes = c.pool_bytes + c.released_bytes + c.pending_bytes + c.tail_bytes;
  }
  return out;
}

std::size_t stream_pool_allocator::do_cached_bytes_other_streams(stream_view stream) const {
  std::size_t total = 0;
  for (const auto& c : cached_bytes_by_stream()) {
    if (!(c.stream == stream)) {
      total += c.bytes;
    }
  }
  return total;
}

}  // namespace poolscope::pool
