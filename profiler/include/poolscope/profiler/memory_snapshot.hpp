// memory_snapshot: PyTorch's memory snapshot (torch.cuda.memory._snapshot(), the file
// pytorch.org/memory_viz and `python -m torch.cuda._memory_viz` read) as a plain value, and its
// pickle.
//
//   poolscope::profiler::memory_snapshot s = recorder.snapshot();    // snapshot_recorder.hpp
//   write_file("snap.pickle", s.to_pickle());
//   // or read one PyTorch wrote: poolscope::analysis::read_memory_snapshot (analysis/)
//
// The file is a pickled dict:
// - "segments": a list of {device, address, total_size, allocated_size, active_size,
//   requested_size, stream, segment_type ("small" | "large"), segment_pool_id (a 2-tuple),
//   is_expandable, frames, blocks}; "blocks" tile the segment in address order (the viewer
//   recomputes each block's address as a running sum from the segment's), each {address, size,
//   requested_size, state ("active_allocated" | "active_pending_free" | "inactive"), frames}.
// - "device_traces": a list per device of {action, addr, size, stream, time_us, frames}, action
//   one of alloc, free_requested, free_completed, segment_alloc, segment_free, segment_map,
//   segment_unmap, oom (which carries "device_free" in place of "addr") and snapshot; oldest
//   first. In an alloc, size is the bytes asked for; in a segment event, the segment's bytes.
// - "allocator_settings": a dict (PyTorch's allocator configuration; poolscope writes the
//   allocator's name, max_entries and the entries dropped).
// Frames are {name, filename, line}, innermost first.
//
// Stacks are stored once each (`stacks`, index 0 the empty stack) and referred to by index; the
// pickle writes each distinct stack once and fetches it from the pickle memo after that.
//
// Ownership: a plain value. Thread safety: const methods from any thread. Cost: to_pickle is
// linear in the snapshot (a few bytes per repeated key or stack).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace poolscope::profiler {

/// One frame of a call stack.
struct snapshot_frame {
  std::string name;      ///< function
  std::string filename;  ///< source file ("" when unknown)
  std::int64_t line = 0;
  friend bool operator==(const snapshot_frame&, const snapshot_frame&) = default;
};

/// A block's state in its segment.
enum class block_state : std::uint8_t { active_allocated, active_pending_free, inactive };

/// One block of a segment.
struct snapshot_block {
  std::uint64_t address = 0;
  std::uint64_t size = 0;            ///< bytes the block spans (the allocator's rounding)
  std::uint64_t requested_size = 0;  ///< bytes asked for (inactive: those of its last use)
  block_state state = block_state::inactive;
  std::uint32_t stack = 0;  ///< index into memory_snapshot::stacks
  friend bool operator==(const snapshot_block&, const snapshot_block&) = default;
};

/// One segment: memory the allocator holds from upstream (a cudaMalloc, a mapped range).
struct snapshot_segment {
  std::int64_t device = 0;
  std::uint64_t address = 0;
  std::uint64_t total_size = 0;
  std::uint64_t allocated_size = 0;  ///< bytes of active_allocated blocks
  std::uint64_t active_size = 0;     ///< bytes of active_allocated and active_pending_free blocks
  std::uint64_t requested_size = 0;  ///< requested bytes of active_allocated blocks
  std::uint64_t stream = 0;
  bool large = true;  ///< segment_type "large" (else "small")
  std::int64_t pool_id_first = 0;
  std::int64_t pool_id_second = 0;
  bool is_expandable = false;
  std::uint32_t stack = 0;
  std::vector<snapshot_block> blocks;
  friend bool operator==(const snapshot_segment&, const snapshot_segment&) = default;
};

/// What a trace entry records.
enum class trace_action : std::uint8_t {
  alloc,
  free_requested,
  free_completed,
  segment_alloc,
  segment_free,
  segment_map,
  segment_unmap,
  oom,
  snapshot,
};
inline constexpr int trace_action_count = 9;
/// "alloc", "free_requested", ... as PyTorch spells them.
[[nodiscard]] std::string_view to_string(trace_action a) noexcept;
/// The action named `name`; false if it is none of them.
[[nodiscard]] bool parse_trace_action(std::string_view name, trace_action& out) noexcept;
/// "active_allocated", "active_pending_free", "inactive".
[[nodiscard]] std::string_view to_string(block_state s) noexcept;
/// The state named `name`; false if it is none of them.
[[nodiscard]] bool parse_block_state(std::string_view name, block_state& out) noexcept;

/// One entry of a device's trace.
struct trace_entry {
  trace_action action = trace_action::alloc;
  std::uint64_t addr = 0;  ///< the block or segment; for oom: the device's free bytes
  std::uint64_t size = 0;
  std::uint64_t stream = 0;
  std::uint64_t time_us = 0;  ///< microseconds since the Unix epoch
  std::uint32_t stack = 0;
  friend bool operator==(const trace_entry&, const trace_entry&) = default;
};

/// A value of allocator_settings.
using snapshot_setting = std::variant<bool, std::int64_t, double, std::string>;

/// A memory snapshot. See the file comment.
struct memory_snapshot {
  std::vector<snapshot_segment> segments;
  /// device_traces[d]: device d's entries, oldest first.
  std::vector<std::vector<trace_entry>> device_traces;
  /// Distinct stacks, innermost frame first; [0] is the empty stack.
  std::vector<std::vector<snapshot_frame>> stacks{{}};
  /// Scalar allocator settings, in order (nested ones are not kept when reading).
  std::vector<std::pair<std::string, snapshot_setting>> allocator_settings;

  /// The pickle PyTorch's tools read (protocol 4, the viewer's opcodes). Throws logic_error if a
  /// stack index is out of range.
  [[nodiscard]] std::string to_pickle() const;
  friend bool operator==(const memory_snapshot&, const memory_snapshot&) = default;
};

}  // namespace poolscope::profiler
