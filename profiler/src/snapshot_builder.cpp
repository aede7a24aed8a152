#include "poolscope/profiler/snapshot_builder.hpp"

#include <algorithm>
#include <string>

#include "poolscope/error.hpp"

namespace poolscope::profiler {

namespace {
using hooks::event_kind;
using hooks::event_phase;
}  // namespace

snapshot_builder::snapshot_builder(const snapshot_builder_options& options) : options_(options) {
  if (options_.max_entries == 0) {
    throw invalid_argument("poolscope: snapshot_builder max_entries 0: keep at least 1 entry");
  }
  if (options_.host_device < 0) {
    throw invalid_argument("poolscope: snapshot_builder host_device " +
                           std::to_string(options_.host_device) + " is negative");
  }
}

snapshot_builder::device_state& snapshot_builder::state_of(int device) {
  const auto index = static_cast<std::size_t>(device < 0 ? options_.host_device : device);
  if (index >= devices_.size()) {
    devices_.resize(index + 1);
  }
  return devices_[index];
}

void snapshot_builder::add(const snapshot_event& e) {
  const bool post = e.phase == event_phase::post;
  const bool pre = e.phase == event_phase::pre;
  switch (e.kind) {
    case event_kind::pool_malloc:
      if (post && e.ptr != 0) {
        on_malloc(state_of(e.device), e);
      }
      return;
    case event_kind::pool_free:
      if (pre && e.ptr != 0) {
        on_free(state_of(e.device), e);
      }
      return;
    case event_kind::device_alloc:
      if (post && e.ptr != 0) {
        on_segment_alloc(state_of(e.device), e);
      }
      return;
    case event_kind::device_free:
      if (pre && e.ptr != 0) {
        on_segment_free(state_of(e.device), e);
      }
      return;
    case event_kind::segment_map:
      if (post && e.ptr != 0 && e.rounded != 0) {
        on_map(state_of(e.device), e);
      }
      return;
    case event_kind::segment_unmap:
      if (pre && e.ptr != 0 && e.rounded != 0) {
        on_unmap(state_of(e.device), e);
      }
      return;
    case event_kind::oom:
      ++stats_.events;
      record(state_of(e.device), trace_action::oom, e, e.device_free, e.requested, e.stack);
      return;
    default:
      return;
  }
}

void snapshot_builder::record(device_state& d, trace_action action, const snapshot_event& e,
                              std::uint64_t addr, std::uint64_t size, std::uint32_t stack) {
  const trace_entry t{action, addr, size, e.stream, e.time_us, stack};
  if (d.ring.size() < options_.max_entries) {
    d.ring.push_back(t);
    return;
  }
  d.ring[d.next] = t;
  d.next = (d.next + 1) % d.ring.size();
  ++d.dropped;
  ++stats_.dropped_entries;
}

std::map<std::uint64_t, snapshot_builder::segment>::iterator snapshot_builder::segment_of(
    device_state& d, std::uint64_t addr, std::uint64_t size) {
  auto it = d.segments.upper_bound(addr);
  if (it == d.segments.begin()) {
    return d.segments.end();
  }
  --it;
  const std::uint64_t offset = addr - it->first;
  const bool inside = offset < it->second.size && size <= it->second.size - offset;
  return inside ? it : d.segments.end();
}

bool snapshot_builder::overlaps_live(const device_state& d, std::uint64_t addr,
                                     std::uint64_t size) const {
  auto it = d.blocks.lower_bound(addr);
  if (it != d.blocks.end() && it->first < addr + size) {
    return true;
  }
  if (it != d.blocks.begin()) {
    --it;
    return it->first + it->second.size > addr;
  }
  return false;
}

void snapshot_builder::cover_unknown(device_state& d, std::uint64_t addr, std::uint64_t size,
                                     std::uint64_t stream) {
  std::uint64_t lo = addr;
  std::uint64_t hi = addr + size;
  // Every segment overlapping [lo, hi) is absorbed into one (only segments made for unknown
  // memory: the caller found no real one holding the range).
  auto it = d.segments.upper_bound(lo);
  if (it != d.segments.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second.size > lo) {
      it = prev;
    }
  }
  while (it != d.segments.end() && it->first < hi) {
    lo = std::min(lo, it->first);
    hi = std::max(hi, it->first + it->second.size);
    stream = it->second.stream;
    it = d.segments.erase(it);
  }
  segment s;
  s.size = hi - lo;
  s.stream = stream;
  s.unknown = true;
  d.segments.emplace(lo, s);
}

namespace {
/// True if [addr, addr + size) overlaps a segment that is not one made for unknown memory.
template <class Map>
bool overlaps_real_segment(const Map& segments, std::uint64_t addr, std::uint64_t size) {
  auto it = segments.lower_bound(addr);
  if (it != segments.begin()) {
    --it;
  }
  for (; it != segments.end() && it->first < addr + size; ++it) {
    if (!it->second.unknown && it->first + it->second.size > addr) {
      return true;
    }
  }
  return false;
}
}  // namespace

void snapshot_builder::on_malloc(device_state& d, const snapshot_event& e) {
  const std::uint64_t size = std::max(e.rounded != 0 ? e.rounded : e.requested, std::uint64_t{1});
  // Live blocks under the new one lost their frees (dropped events): they are gone.
  auto under = d.blocks.lower_bound(e.ptr);
  if (under != d.blocks.begin()) {
    if (auto prev = std::prev(under); prev->first + prev->second.size > e.ptr) {
      under = prev;
    }
  }
  while (under != d.blocks.end() && under->first < e.ptr + size) {
    under = d.blocks.erase(under);
    ++stats_.replaced_blocks;
  }
  auto seg = segment_of(d, e.ptr, size);
  if (seg == d.segments.end()) {
    if (overlaps_real_segment(d.segments, e.ptr, size)) {
      ++stats_.left_out_blocks;  // straddles a segment's end: events were lost
      return;
    }
    cover_unknown(d, e.ptr, size, e.stream);
    ++stats_.unknown_segments;
  }
  ++stats_.events;
  d.blocks[e.ptr] = block{size, e.requested, e.stack};
  record(d, trace_action::alloc, e, e.ptr, e.requested, e.stack);
}

void snapshot_builder::on_free(device_state& d, const snapshot_event& e) {
  if (auto it = d.blocks.find(e.ptr); it != d.blocks.end()) {
    const block b = it->second;
    d.blocks.erase(it);
    ++stats_.events;
    // A free carries the stack of the block's allocation (the viewer shows the block by it).
    const std::uint32_t stack = e.stack != 0 ? e.stack : b.stack;
    record(d, trace_action::free_requested, e, e.ptr, b.requested, stack);
    record(d, trace_action::free_completed, e, e.ptr, b.requested, stack);
    return;
  }
  // A block allocated before the first event: in the trace only where the viewer finds it a
  // segment for the whole trace (memory from before the first event) and no live block under it.
  const std::uint64_t size = std::max(e.requested, std::uint64_t{1});
  if (overlaps_real_segment(d.segments, e.ptr, size) || overlaps_live(d, e.ptr, size)) {
    ++stats_.untracked_frees;
    return;
  }
  if (segment_of(d, e.ptr, size) == d.segments.end()) {
    cover_unknown(d, e.ptr, size, e.stream);
    ++stats_.unknown_segments;
  }
  ++stats_.events;
  record(d, trace_action::free_requested, e, e.ptr, e.requested, e.stack);
  record(d, trace_action::free_completed, e, e.ptr, e.requested, e.stack);
}

void snapshot_builder::on_segment_alloc(device_state& d, const snapshot_event& e) {
  const std::uint64_t size = std::max(e.rounded != 0 ? e.rounded : e.requested, std::uint64_t{1});
  // Segments (and their blocks) still held under the new one lost their frees: gone.
  for (auto it = d.segments.lower_bound(e.ptr);
       it != d.segments.end() && it->first < e.ptr + size;) {
    ++stats_.left_out_blocks;
    it = d.segments.erase(it);
  }
  if (auto it = d.segments.lower_bound(e.ptr); it != d.segments.begin()) {
    if (auto prev = std::prev(it); prev->first + prev->second.size > e.ptr) {
      ++stats_.left_out_blocks;
      d.segments.erase(prev);
    }
  }
  for (auto it = d.blocks.lower_bound(e.ptr); it != d.blocks.end() && it->first < e.ptr + size;) {
    it = d.blocks.erase(it);
  }
  ++stats_.events;
  d.segments[e.ptr] = segment{size, e.stream, e.stack, false};
  record(d, trace_action::segment_alloc, e, e.ptr, size, e.stack);
}

void snapshot_builder::on_segment_free(device_state& d, const snapshot_event& e) {
  std::uint64_t size = std::max(e.rounded != 0 ? e.rounded : e.requested, std::uint64_t{1});
  std::uint32_t stack = e.stack;
  if (auto it = d.segments.find(e.ptr); it != d.segments.end() && !it->second.unknown) {
    size = it->second.size;
    stack = stack != 0 ? stack : it->second.stack;
  }
  // The segment (or the segments made for its unknown memory) and any block left in it go.
  auto it = d.segments.lower_bound(e.ptr);
  if (it != d.segments.begin()) {
    if (auto prev = std::prev(it); prev->first + prev->second.size > e.ptr) {
      it = prev;
    }
  }
  while (it != d.segments.end() && it->first < e.ptr + size) {
    it = d.segments.erase(it);
  }
  for (auto b = d.blocks.lower_bound(e.ptr); b != d.blocks.end() && b->first < e.ptr + size;) {
    b = d.blocks.erase(b);
  }
  ++stats_.events;
  record(d, trace_action::segment_free, e, e.ptr, size, stack);
}

std::uint64_t snapshot_builder::cut_mapped(device_state& d, std::uint64_t addr,
                                           std::uint64_t size) {
  const std::uint64_t end = addr + size;
  auto it = d.segments.upper_bound(addr);
  if (it != d.segments.begin() && std::prev(it)->first + std::prev(it)->second.size > addr) {
    --it;
  }
  std::uint64_t found = 0;
  while (it != d.segments.end() && it->first < end) {
    if (!it->second.mapped) {
      ++it;
      continue;
    }
    const std::uint64_t lo = it->first;
    const segment s = it->second;
    const std::uint64_t hi = lo + s.size;
    found += std::min(hi, end) - std::max(lo, addr);
    if (hi > end) {
      segment rest = s;
      rest.size = hi - end;
      d.segments.emplace_hint(std::next(it), end, rest);
    }
    if (lo < addr) {
      it->second.size = addr - lo;
      ++it;
    } else {
      it = d.segments.erase(it);
    }
  }
  return found;
}

void snapshot_builder::on_map(device_state& d, const snapshot_event& e) {
  const std::uint64_t stream = d.map_streams.try_emplace(e.allocator, e.stream).first->second;
  // What the range overlaps lost its unmap (dropped events), or was met as blocks from before
  // the first event: it is mapped from here on.
  (void)cut_mapped(d, e.ptr, e.rounded);
  for (auto it = d.segments.lower_bound(e.ptr);
       it != d.segments.end() && it->first < e.ptr + e.rounded;) {
    if (it->second.unknown) {
      it = d.segments.erase(it);
    } else {
      ++it;
    }
  }
  if (overlaps_real_segment(d.segments, e.ptr, e.rounded)) {
    ++stats_.left_out_blocks;  // inside a segment of another kind: events were lost
    return;
  }
  std::uint64_t lo = e.ptr;
  std::uint64_t hi = e.ptr + e.rounded;
  std::uint32_t stack = e.stack;
  // Joined with the allocator's mapped ranges it touches: one contiguous mapped range is one
  // segment.
  auto next = d.segments.lower_bound(hi);
  if (next != d.segments.end() && next->first == hi && next->second.mapped &&
      next->second.allocator == e.allocator) {
    hi += next->second.size;
    d.segments.erase(next);
  }
  auto prev = d.segments.lower_bound(lo);
  if (prev != d.segments.begin()) {
    --prev;
    if (prev->first + prev->second.size == lo && prev->second.mapped &&
        prev->second.allocator == e.allocator) {
      lo = prev->first;
      stack = prev->second.stack;
      d.segments.erase(prev);
    }
  }
  segment s;
  s.size = hi - lo;
  s.stream = stream;
  s.stack = stack;
  s.mapped = true;
  s.allocator = e.allocator;
  d.segments.emplace(lo, s);
  ++stats_.events;
  snapshot_event entry = e;
  entry.stream = stream;
  record(d, trace_action::segment_map, entry, e.ptr, e.rounded, e.stack);
}

void snapshot_builder::on_unmap(device_state& d, const snapshot_event& e) {
  const std::uint64_t stream = d.map_streams.try_emplace(e.allocator, e.stream).first->second;
  // Blocks still live there lost their frees (dropped events): they go with the memory.
  for (auto b = d.blocks.lower_bound(e.ptr); b != d.blocks.end() && b->first < e.ptr + e.rounded;) {
    b = d.blocks.erase(b);
  }
  if (cut_mapped(d, e.ptr, e.rounded) == 0 && overlaps_real_segment(d.segments, e.ptr, e.rounded)) {
    ++stats_.left_out_blocks;  // inside a segment of another kind: events were lost
    return;
  }
  // Memory mapped before the first event is unmapped too: for the viewer it was a segment from
  // the start.
  ++stats_.events;
  snapshot_event entry = e;
  entry.stream = stream;
  record(d, trace_action::segment_unmap, entry, e.ptr, e.rounded, e.stack);
}

std::vector<std::uint32_t> snapshot_builder::stacks_in_use() const {
  std::vector<std::uint32_t> used;
  for (const device_state& d : devices_) {
    for (const auto& [addr, s] : d.segments) {
      used.push_back(s.stack);
    }
    for (const auto& [addr, b] : d.blocks) {
      used.push_back(b.stack);
    }
    for (const trace_entry& t : d.ring) {
      used.push_back(t.stack);
    }
  }
  std::sort(used.begin(), used.end());
  used.erase(std::unique(used.begin(), used.end()), used.end());
  return used;
}

memory_snapshot snapshot_builder::snapshot(std::vector<std::vector<snapshot_frame>> stacks) const {
  memory_snapshot out;
  out.stacks = std::move(stacks);
  if (out.stacks.empty()) {
    out.stacks.emplace_back();
  }
  for (std::size_t dev = 0; dev < devices_.size(); ++dev) {
    const device_state& d = devices_[dev];
    for (const auto& [addr, s] : d.segments) {
      snapshot_segment seg;
      seg.device = static_cast<std::int64_t>(dev);
      seg.address = addr;
      seg.total_size = s.size;
      seg.stream = s.stream;
      seg.large = s.size > options_.small_segment_bytes;
      seg.stack = s.stack;
      seg.is_expandable = s.mapped;
      std::uint64_t at = addr;
      for (auto b = d.blocks.lower_bound(addr); b != d.blocks.end() && b->first < addr + s.size;
           ++b) {
        if (b->first > at) {
          seg.blocks.push_back({at, b->first - at, 0, block_state::inactive, 0});
        }
        seg.blocks.push_back({b->first, b->second.size, b->second.requested,
                              block_state::active_allocated, b->second.stack});
        seg.allocated_size += b->second.size;
        seg.requested_size += b->second.requested;
        at = b->first + b->second.size;
      }
      if (at < addr + s.size) {
        seg.blocks.push_back({at, addr + s.size - at, 0, block_state::inactive, 0});
      }
      seg.active_size = seg.allocated_size;
      out.segments.push_back(std::move(seg));
    }
    std::vector<trace_entry> trace;
    trace.reserve(d.ring.size());
    trace.insert(trace.end(), d.ring.begin() + static_cast<std::ptrdiff_t>(d.next), d.ring.end());
    trace.insert(trace.end(), d.ring.begin(), d.ring.begin() + static_cast<std::ptrdiff_t>(d.next));
    out.device_traces.push_back(std::move(trace));
  }
  out.allocator_settings.emplace_back("max_entries",
                                      static_cast<std::int64_t>(options_.max_entries));
  out.allocator_settings.emplace_back("dropped_entries",
                                      static_cast<std::int64_t>(stats_.dropped_entries));
  return out;
}

}  // namespace poolscope::profiler
