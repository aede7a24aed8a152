#include "poolscope/profiler/snapshot_recorder.hpp"

#include <time.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <unordered_map>

#include "detail/device_memory_seam.hpp"
#include "detail/drain_thread.hpp"
#include "detail/event_ring.hpp"
#include "detail/stack_capture.hpp"
#include "poolscope/error.hpp"
#include "poolscope/spin_lock.hpp"

namespace poolscope::profiler {

namespace {

/// One event in the ring: 56 bytes, so that it and its slot's sequence number are one cache line
/// (event_ring).
struct ring_record {
  std::uint64_t stream = 0;
  std::uint64_t ptr = 0;  // oom (which has no block): the device's free bytes
  std::uint64_t requested = 0;
  std::uint64_t rounded = 0;
  std::uint64_t time_ns = 0;
  std::int32_t device = -1;
  std::uint32_t allocator = 0;
  std::uint32_t stack = 0;  // interned on the allocating thread (state::intern)
  hooks::event_kind kind = hooks::event_kind::pool_malloc;
  hooks::event_phase phase = hooks::event_phase::post;
};
static_assert(sizeof(ring_record) <= detail::event_ring::max_one_line_record);

constexpr std::size_t max_supported_depth = detail::stack_capturer::max_supported_depth;
constexpr std::size_t max_supported_python_depth = 256;
constexpr std::size_t named_allocators = 4096;  // ids below this are named without a lock

/// The stack a thread interned last, for which recorder, and its id: an allocation from a loop
/// has the stack of the one before it, which then costs a comparison with this copy, not a
/// lookup under the stack table's lock.
struct last_interned_stack {
  std::uint64_t recorder = 0;  // state::recorder_id; 0: none
  std::size_t depth = 0;
  std::uint32_t id = 0;
  std::uintptr_t frames[max_supported_depth + max_supported_python_depth];
};
thread_local last_interned_stack t_last_stack;

std::atomic<std::uint64_t> next_recorder_id{1};

/// Block and segment lifetimes, granules mapped and unmapped, failures.
constexpr hooks::event_filter recorded_events() noexcept {
  return hooks::event_filter::lifetimes()
      .add(hooks::event_kind::segment_map, hooks::event_phase::post)
      .add(hooks::event_kind::segment_unmap, hooks::event_phase::pre)
      .add(hooks::event_kind::oom, hooks::event_phase::instant);
}

std::uint64_t hash_frames(const std::uintptr_t* f, std::size_t depth) noexcept {
  std::uint64_t h = depth;
  for (std::size_t i = 0; i < depth; ++i) {
    h += (f[i] ^ (i * 0xD6E8FEB86659FD93ULL)) * 0x9E3779B97F4A7C15ULL;
  }
  return h ^ (h >> 31);
}

/// Wall-clock nanoseconds minus monotonic ones, now: turns hooks::now_ns() into Unix time.
std::int64_t realtime_offset_ns() noexcept {
  timespec real{};
  timespec mono{};
  clock_gettime(CLOCK_REALTIME, &real);
  clock_gettime(CLOCK_MONOTONIC, &mono);
  return (static_cast<std::int64_t>(real.tv_sec) - mono.tv_sec) * 1'000'000'000 +
         (static_cast<std::int64_t>(real.tv_nsec) - mono.tv_nsec);
}

detail::stack_capture_options capture_options(const snapshot_recorder_options& o) {
  detail::stack_capture_options c;
  c.backend = detail::backend_of(o.unwinder);
  c.max_depth = o.max_depth;
  c.skip_frames = o.skip_frames;
  c.skip_modules_of = o.skip_modules_of;
  c.max_python_depth = o.max_python_depth;
  c.native_with_python = o.native_with_python;
  return c;
}

void check(const snapshot_recorder_options& o) {
  auto bad = [](const std::string& what) {
    throw invalid_argument("poolscope: snapshot_recorder " + what);
  };
  if (o.max_entries == 0) {
    bad("max_entries 0: keep at least 1 entry");
  }
  if (o.max_depth == 0 || o.max_depth > max_supported_depth) {
    bad("max_depth " + std::to_string(o.max_depth) + " is outside 1.." +
        std::to_string(max_supported_depth));
  }
  if (o.max_python_depth > max_supported_python_depth) {
    bad("max_python_depth " + std::to_string(o.max_python_depth) + " is above " +
        std::to_string(max_supported_python_depth));
  }
  if (o.skip_modules_of.size() > detail::own_code_ranges::max_extra) {
    bad("skip_modules_of holds " + std::to_string(o.skip_modules_of.size()) +
        " addresses; at most " + std::to_string(detail::own_code_ranges::max_extra));
  }
  if (!unwinder_available(o.unwinder)) {
    bad("unwinder '" + std::string(to_string(o.unwinder)) + "' is not available in this build");
  }
  if (o.host_device < 0) {
    bad("host_device " + std::to_string(o.host_device) + " is negative");
  }
}

snapshot_frame frame_of(const detail::symbol& s, std::uintptr_t address) {
  snapshot_frame f;
  f.line = s.line;
  f.filename = !s.file.empty() ? s.file : s.module;
  if (!s.function.empty()) {
    f.name = s.function;
  } else {
    char buf[48];
    std::snprintf(buf, sizeof buf, "0x%llx",
                  static_cast<unsigned long long>(s.module.empty() ? address : s.offset));
    f.name =
        s.module.empty() ? std::string(buf) : s.module.substr(s.module.rfind('/') + 1) + "+" + buf;
  }
  return f;
}

}  // namespace

struct snapshot_recorder::state {
  explicit state(const snapshot_recorder_options& o)
      : capturer(capture_options(o)),
        frame_capacity(o.stacks ? capturer.max_frames() : 0),
        ring(o.ring_slots, sizeof(ring_record)),
        offset_ns(realtime_offset_ns()),
        builder({.max_entries = o.max_entries, .host_device = o.host_device}) {}

  // What the allocating threads use first, then what the writer thread changes for each event
  // on lines of its own (a line the writer changes would move to its core and back per event).
  detail::stack_capturer capturer;
  std::size_t frame_capacity;
  const std::uint64_t recorder_id = next_recorder_id.fetch_add(1, std::memory_order_relaxed);
  detail::event_ring ring;
  // The distinct stacks, interned by the allocating threads under stacks_lock. Stack hash ->
  // the ids of the stacks with that hash (a lookup allocates nothing).
  spin_lock stacks_lock;
  std::unordered_multimap<std::uint64_t, std::uint32_t> stack_ids;
  std::vector<std::vector<std::uintptr_t>> stacks{{}};  // [0]: the empty stack
  std::int64_t offset_ns;
  // Allocator names, copied the first time an id is seen (an allocator may be gone by the time
  // a snapshot is taken).
  std::array<std::atomic<bool>, named_allocators> named{};
  std::mutex names_mutex;
  std::map<std::uint32_t, std::string> names;
  // Applied by the writer thread (or by snapshot()) under the recorder's mutex:
  alignas(64) snapshot_builder builder;
  std::unordered_map<std::uintptr_t, snapshot_frame> frames;  // symbolized so far
  alignas(64) std::unique_ptr<detail::drain_thread> writer;   // last: stopped first

  // The id of a stack, with stacks_lock held. May throw std::bad_alloc.
  std::uint32_t intern_locked(const std::uintptr_t* f, std::size_t depth) {
    if (depth == 0) {
      return 0;
    }
    const std::uint64_t h = hash_frames(f, depth);
    auto [first, last] = stack_ids.equal_range(h);
    for (auto it = first; it != last; ++it) {
      const auto& known = stacks[it->second];
      if (known.size() == depth && std::equal(known.begin(), known.end(), f)) {
        return it->second;
      }
    }
    const auto id = static_cast<std::uint32_t>(stacks.size());
    stacks.emplace_back(f, f + depth);
    stack_ids.emplace(h, id);
    return id;
  }

  // On the allocating thread: the id of the stack just captured (0 if it cannot be stored).
  std::uint32_t intern(const std::uintptr_t* f, std::size_t depth) noexcept {
    last_interned_stack& last = t_last_stack;
    if (last.recorder == recorder_id && last.depth == depth &&
        std::memcmp(last.frames, f, depth * sizeof(std::uintptr_t)) == 0) {
      return last.id;
    }
    std::uint32_t id = 0;
    try {
      std::lock_guard lock(stacks_lock);
      id = intern_locked(f, depth);
    } catch (...) {
      return 0;  // no memory for the stack: the event goes without one
    }
    last.recorder = recorder_id;
    last.depth = depth;
    last.id = id;
    std::memcpy(last.frames, f, depth * sizeof(std::uintptr_t));
    return id;
  }

  void name(const hooks::event& e) noexcept {
    if (e.allocator_id < named_allocators &&
        named[e.allocator_id].load(std::memory_order_relaxed)) {
      return;
    }
    try {
      std::lock_guard lock(names_mutex);
      names.try_emplace(e.allocator_id, e.allocator_name != nullptr ? e.allocator_name : "");
      if (e.allocator_id < named_allocators) {
        named[e.allocator_id].store(true, std::memory_order_relaxed);
      }
    } catch (...) {
      // No memory for a name: the allocator goes unnamed in allocator_settings.
    }
  }
};

snapshot_recorder::snapshot_recorder(const snapshot_recorder_options& options) : options_(options) {
  check(options_);
  state_ = std::make_unique<state>(options_);
  if (options_.stacks) {
    detail::warm_up(state_->capturer.backend());
  }
  if (options_.writer_thread) {
    state_->writer = std::make_unique<detail::drain_thread>(
        [this] {
          std::lock_guard lock(mutex_);
          drain_locked();
        },
        std::chrono::milliseconds(5), "poolscope snap");
  }
}

snapshot_recorder::~snapshot_recorder() {
  if (state_->writer != nullptr) {
    state_->writer->stop();
  }
}

hooks::event_filter snapshot_recorder::interests() const noexcept {
  return recorded_events();
}

void snapshot_recorder::on_event(const hooks::event& e) noexcept {
  if (!recorded_events().contains(e.kind, e.phase) && e.kind != hooks::event_kind::oom) {
    return;
  }
  state& s = *state_;
  s.name(e);
  const bool with_stack =
      s.frame_capacity != 0 &&
      (e.kind == hooks::event_kind::pool_malloc || e.kind == hooks::event_kind::device_alloc ||
       e.kind == hooks::event_kind::segment_map || e.kind == hooks::event_kind::oom);
  std::uintptr_t frames[max_supported_depth + max_supported_python_depth];
  std::size_t depth = 0;
  if (with_stack) {
    bool truncated = false;
    depth = s.capturer.capture(frames, truncated, e.kind == hooks::event_kind::pool_malloc);
  }
  ring_record r;
  r.stream = reinterpret_cast<std::uintptr_t>(e.stream);
  r.ptr = reinterpret_cast<std::uintptr_t>(e.ptr);
  r.requested = e.requested;
  r.rounded = e.rounded;
  r.time_ns = e.time_ns;
  r.device = e.device;
  r.allocator = e.allocator_id;
  r.kind = e.kind;
  r.phase = e.phase;
  r.stack = depth != 0 ? s.intern(frames, depth) : 0;
  if (e.kind == hooks::event_kind::oom) {
    r.ptr = 0;
    (void)detail::device_memory::free_bytes(e.device, r.ptr);
  }
  const auto pushed = s.ring.try_push([&](void* slot) { std::memcpy(slot, &r, sizeof r); });
  if (pushed != detail::event_ring::push_result::stored && s.writer != nullptr) {
    s.writer->wake();
  }
}

void snapshot_recorder::drain_locked() const {
  state& s = *state_;
  s.ring.drain([&s](const void* slot) {
    ring_record r;
    std::memcpy(&r, slot, sizeof r);
    snapshot_event ev;
    ev.kind = r.kind;
    ev.phase = r.phase;
    ev.device = r.device;
    ev.stream = r.stream;
    const bool oom = r.kind == hooks::event_kind::oom;
    ev.ptr = oom ? 0 : r.ptr;
    ev.requested = r.requested;
    ev.rounded = r.rounded;
    ev.time_us =
        static_cast<std::uint64_t>(static_cast<std::int64_t>(r.time_ns) + s.offset_ns) / 1000;
    ev.device_free = oom ? r.ptr : 0;
    ev.allocator = r.allocator;
    ev.stack = r.stack;
    try {
      s.builder.add(ev);
    } catch (...) {
      // No memory to apply it: the snapshot lacks this event, as if the ring had dropped it.
    }
  });
}

memory_snapshot snapshot_recorder::snapshot() const {
  std::lock_guard lock(mutex_);
  drain_locked();
  state& s = *state_;
  // Only the stacks the snapshot refers to are symbolized, and renumbered 1..n in that order.
  const std::vector<std::uint32_t> used = s.builder.stacks_in_use();
  // The stacks used, copied under the table's lock (allocating threads add to it meanwhile) and
  // symbolized outside it.
  std::vector<std::vector<std::uintptr_t>> raw(used.size());
  std::size_t known = 0;
  {
    std::lock_guard stacks_lock(s.stacks_lock);
    known = s.stacks.size();
    for (std::size_t i = 0; i < used.size(); ++i) {
      raw[i] = s.stacks[used[i]];
    }
  }
  std::vector<std::uint32_t> renumber(known, 0);
  std::vector<std::vector<snapshot_frame>> symbolized{{}};
  std::unique_ptr<detail::symbolizer> sym;
  for (std::size_t i = 0; i < used.size(); ++i) {
    const std::uint32_t id = used[i];
    if (id == 0) {
      continue;
    }
    std::vector<snapshot_frame> stack;
    for (std::uintptr_t address : raw[i]) {
      auto it = s.frames.find(address);
      if (it == s.frames.end()) {
        if (sym == nullptr) {
          sym = std::make_unique<detail::symbolizer>();
        }
        it = s.frames.emplace(address, frame_of(detail::symbolize_frame(*sym, address), address))
                 .first;
      }
      stack.push_back(it->second);
    }
    renumber[id] = static_cast<std::uint32_t>(symbolized.size());
    symbolized.push_back(std::move(stack));
  }
  memory_snapshot out = s.builder.snapshot({});
  for (auto& seg : out.segments) {
    seg.stack = renumber[seg.stack];
    for (auto& b : seg.blocks) {
      b.stack = renumber[b.stack];
    }
  }
  for (auto& trace : out.device_traces) {
    for (auto& t : trace) {
      t.stack = renumber[t.stack];
    }
  }
  out.stacks = std::move(symbolized);
  out.allocator_settings.emplace_back("dropped_events",
                                      static_cast<std::int64_t>(s.ring.dropped()));
  std::string names;
  {
    std::lock_guard names_lock(s.names_mutex);
    for (const auto& [id, name] : s.names) {
      names += (names.empty() ? "" : ",") + name;
    }
  }
  out.allocator_settings.emplace_back("allocators", names);
  return out;
}

void snapshot_recorder::write(const std::string& path) const {
  const std::string bytes = snapshot().to_pickle();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) {
    throw runtime_error("poolscope: cannot create snapshot '" + path +
                        "': " + std::strerror(errno));
  }
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) {
    throw runtime_error("poolscope: cannot write snapshot '" + path + "'");
  }
}

snapshot_recorder_stats snapshot_recorder::stats() const {
  std::lock_guard lock(mutex_);
  drain_locked();
  snapshot_recorder_stats out;
  out.events = state_->ring.pushed();
  out.dropped_events = state_->ring.dropped();
  {
    std::lock_guard stacks_lock(state_->stacks_lock);
    out.stacks = state_->stacks.size() - 1;
  }
  out.builder = state_->builder.stats();
  return out;
}

}  // namespace poolscope::profiler
