#include "poolscope/profiler/nvtx.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <iterator>

#include "detail/nvtx_seam.hpp"
#include "poolscope/log.hpp"

namespace poolscope::profiler {

namespace detail {

nvtxDomainHandle_t nvtx_domain() noexcept {
  // Created once; NVTX initializes (and loads a tool) inside the first call.
  static const nvtxDomainHandle_t domain = [] {
    // The names are views of string literals, so data() is NUL-terminated.
    nvtxDomainHandle_t d = nvtx_seam::create_domain(nvtx_domain_name.data());
    if (d != nullptr) {
      for (category c :
           {category::pool, category::darray_transfer, category::darray_compute, category::user}) {
        nvtx_seam::name_category(d, c, to_string(c).data());
      }
      g_scope_flags.fetch_or(flag_nvtx, std::memory_order_relaxed);
    }
    return d;
  }();
  return domain;
}

}  // namespace detail

std::string_view to_string(category c) noexcept {
  switch (c) {
    case category::pool:
      return "pool";
    case category::darray_transfer:
      return "darray.transfer";
    case category::darray_compute:
      return "darray.compute";
    case category::user:
      return "user";
  }
  return "user";
}

bool nvtx_tool_attached() noexcept {
  return detail::nvtx_domain() != nullptr;
}

void nvtx_mark(std::string_view message, category c, std::uint64_t payload) noexcept {
  nvtxDomainHandle_t d = detail::nvtx_domain();
  if (d == nullptr) {
    return;
  }
  char buf[256];
  std::size_t n = std::min(message.size(), sizeof buf - 1);
  if (n < message.size()) {
    // Cut before a whole UTF-8 character: step back over continuation bytes (10xxxxxx) so that
    // the first byte left out starts a character, and no lead byte is left without its tail.
    while (n > 0 && (static_cast<unsigned char>(message[n]) & 0xC0U) == 0x80U) {
      --n;
    }
  }
  std::memcpy(buf, message.data(), n);
  buf[n] = '\0';
  detail::nvtx_seam::mark(d, c, buf, payload);
}

// ---- nvtx_marker_hook ------------------------------------------------------------------------

hooks::event_filter nvtx_marker_hook::interests() const noexcept {
  hooks::event_filter f = hooks::event_filter::all();
  if (!with_pre_events_) {
    for (int k = 0; k < hooks::event_kind_count; ++k) {
      f.remove(static_cast<hooks::event_kind>(k), hooks::event_phase::pre);
    }
  }
  return f;
}

void nvtx_marker_hook::on_event(const hooks::event& e) noexcept {
  if (e.phase == hooks::event_phase::pre && !with_pre_events_) {
    return;
  }
  nvtxDomainHandle_t d = detail::nvtx_domain();
  if (d == nullptr) {
    return;
  }
  const std::size_t bytes = e.rounded != 0 ? e.rounded : e.requested;
  const auto kind = hooks::to_string(e.kind);
  const auto phase = hooks::to_string(e.phase);
  char buf[256];
  std::snprintf(buf, sizeof buf, "%.*s/%.*s %zu B %s %p", static_cast<int>(kind.size()),
                kind.data(), static_cast<int>(phase.size()), phase.data(), bytes,
                e.allocator_name != nullptr ? e.allocator_name : "", e.ptr);
  detail::nvtx_seam::mark(d, category::pool, buf, bytes);
  marks_.fetch_add(1, std::memory_order_relaxed);
}

void set_nvtx_allocator_marks(bool on) {
  static std::mutex mutex;
  static auto* hook = new nvtx_marker_hook;  // leaked: may still be installed at exit
  static bool installed = false;
  std::lock_guard lock(mutex);
  if (on && !installed) {
    hooks::install(*hook);
    installed = true;
  } else if (!on && installed) {
    hooks::uninstall(*hook);
    installed = false;
  }
}

// ---- nvtx_memory_hook ------------------------------------------------------------------------

nvtx_memory_hook::~nvtx_memory_hook() {
  std::lock_guard lock(mutex_);
  while (!heaps_.empty()) {
    drop_heap(heaps_.begin());
  }
}

hooks::event_filter nvtx_memory_hook::interests() const noexcept {
  return hooks::event_filter::lifetimes();
}

void nvtx_memory_hook::on_event(const hooks::event& e) noexcept {
  using hooks::event_kind;
  using hooks::event_phase;
  if (e.ptr == nullptr || (device_memory_only_ && e.device < 0)) {
    return;
  }
  const bool segment = e.kind == event_kind::device_alloc || e.kind == event_kind::device_free;
  const bool block = e.kind == event_kind::pool_malloc || e.kind == event_kind::pool_free;
  if (!segment && !block) {
    return;
  }
  // Registration happens after the memory exists (post), unregistration before it is reused or
  // returned (pre): the same order rule the events themselves follow.
  const bool wanted = (e.phase == event_phase::post &&
                       (e.kind == event_kind::device_alloc || e.kind == event_kind::pool_malloc)) ||
                      (e.phase == event_phase::pre &&
                       (e.kind == event_kind::device_free || e.kind == event_kind::pool_free));
  if (!wanted) {
    return;
  }
  try {
    std::lock_guard lock(mutex_);
    if (segment) {
      on_segment(e);
    } else {
      on_block(e);
    }
  } catch (...) {
    // Out of host memory for the maps: this block or segment stays undescribed; the tool then
    // checks it against the enclosing allocation as it would without the hook.
  }
}

void nvtx_memory_hook::on_segment(const hooks::event& e) {
  nvtxDomainHandle_t d = detail::nvtx_domain();
  const auto start = reinterpret_cast<std::uintptr_t>(e.ptr);
  if (e.kind == hooks::event_kind::device_alloc) {
    const std::size_t bytes = e.rounded != 0 ? e.rounded : e.requested;
    if (bytes == 0) {
      return;  // nothing to describe
    }
    // Heaps overlapping the new segment are stale: their segments went upstream while the hook
    // did not see it (a thread-scoped installation, say). Drop them first.
    auto it = heaps_.upper_bound(start);
    if (it != heaps_.begin() && std::prev(it)->second.end > start) {
      --it;
    }
    while (it != heaps_.end() && it->first < start + bytes) {
      auto next = std::next(it);
      drop_heap(it);
      it = next;
    }
    // The map's node first: if it cannot be allocated (on_event catches bad_alloc), nothing has
    // been registered with the tool that the hook could no longer unregister.
    // (No heap starts at `start` now: one would have overlapped and been dropped above.)
    heap_entry& entry = heaps_.try_emplace(start, heap_entry{start + bytes, nullptr}).first->second;
    entry.handle = static_cast<void*>(detail::nvtx_seam::heap_register(d, e.ptr, bytes));
    ++counts_.heaps_registered;
    return;
  }
  auto it = heaps_.find(start);
  if (it != heaps_.end()) {
    drop_heap(it);
  }
}

void nvtx_memory_hook::drop_heap(std::map<std::uintptr_t, heap_entry>::iterator it) noexcept {
  // Regions still inside go with the heap (NVTX invalidates them with it); forget them here.
  regions_.erase(regions_.lower_bound(it->first), regions_.lower_bound(it->second.end));
  detail::nvtx_seam::heap_unregister(detail::nvtx_domain(),
                                     static_cast<nvtxMemHeapHandle_t>(it->second.handle));
  heaps_.erase(it);
  ++counts_.heaps_unregistered;
}

void nvtx_memory_hook::on_block(const hooks::event& e) {
  nvtxDomainHandle_t d = detail::nvtx_domain();
  const auto start = reinterpret_cast<std::uintptr_t>(e.ptr);
  if (e.kind == hooks::event_kind::pool_free) {
    auto it = regions_.find(start);
    if (it == regions_.end()) {
      return;  // never registered (no heap) or an invalid free: nothing to undo
    }
    regions_.erase(it);
    detail::nvtx_seam::region_unregister(d, e.ptr);
    ++counts_.regions_unregistered;
    return;
  }
  // The heap holding the block: the last heap starting at or before it, if it reaches past it.
  auto it = heaps_.upper_bound(start);
  const std::size_t bytes = e.requested;
  if (it == heaps_.begin() || std::prev(it)->second.end < start + bytes) {
    ++counts_.regions_without_heap;
    return;
  }
  --it;
  auto [pos, fresh] = regions_.try_emplace(start, it->first);
  if (!fresh) {
    // Still registered from a block whose free we did not see: replace it.
    detail::nvtx_seam::region_unregister(d, e.ptr);
    ++counts_.regions_unregistered;
    pos->second = it->first;
  }
  detail::nvtx_seam::region_register(d, static_cast<nvtxMemHeapHandle_t>(it->second.handle), e.ptr,
                                     bytes);
  ++counts_.regions_registered;
}

nvtx_memory_hook::counts nvtx_memory_hook::snapshot() const {
  std::lock_guard lock(mutex_);
  return counts_;
}

std::size_t nvtx_memory_hook::live_heaps() const {
  std::lock_guard lock(mutex_);
  return heaps_.size();
}

std::size_t nvtx_memory_hook::live_regions() const {
  std::lock_guard lock(mutex_);
  return regions_.size();
}

}  // namespace poolscope::profiler
