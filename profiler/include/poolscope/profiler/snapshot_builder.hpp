// snapshot_builder: a memory snapshot (memory_snapshot.hpp) built from allocator events — the
// part of snapshot_recorder that knows no threads, and what `poolscope snapshot events.jsonl`
// runs over a recorded log.
//
//   poolscope::profiler::snapshot_builder b{{.max_entries = 100000}};
//   for (const auto& e : events) b.add(e);          // in the order they happened
//   poolscope::profiler::memory_snapshot s = b.snapshot();
//
// From each event: a device_alloc (post) is a segment and a `segment_alloc` entry, a
// device_free (pre) a `segment_free`; a pool_malloc (post) is an active block of `rounded`
// bytes at its pointer and an `alloc` entry of the bytes asked for; a pool_free (pre) is a
// `free_requested` and a `free_completed` entry (poolscope's allocators make a block reusable
// when it is freed; a stream pool's cross-stream wait is inside the pool), with the stack of the
// block's allocation when the event has none, and makes the block inactive; an oom is an `oom`
// entry carrying the device's free bytes. Other kinds and phases are ignored. A segment's blocks
// tile it: the active blocks, and inactive blocks for the gaps.
//
// Pools over virtual memory (bfc over vmm or host_vmm) map and unmap granules of address ranges
// they reserved: a segment_map (post) is a `segment_map` entry and a segment_unmap (pre) a
// `segment_unmap` entry, and the segments are the contiguous mapped ranges (`is_expandable`),
// tiled by blocks as any other, as PyTorch writes its expandable segments. An unmap may take part
// of a range (splitting it) or several maps at once. The viewer joins adjacent mapped ranges of
// one stream when it replays the trace backwards, so one allocator's map entries and ranges
// carry one stream, that of its first map (a range of bfc belongs to no stream; a stream pool's
// inner pools map on their own streams).
//
// Memory from before the first event: a block whose pointer lies in no known segment (its
// segment was acquired before recording began) gets a segment made for it, covering the blocks
// seen there and present from the start (no segment_alloc: for the viewer it existed before the
// trace); `stats().unknown_segments` counts them. A free of a block never seen allocated is
// written to the trace only when it lies in a known segment and overlaps no live block (else
// the viewer, which replays the trace backwards from the segments, would find a block outside
// any segment); `stats().untracked_frees` counts the others.
//
// Bounded: each device keeps its last max_entries trace entries (PyTorch's max_entries); older
// ones are dropped and counted per device, exactly (`stats().dropped_entries`). Segments and
// live blocks are always kept whole.
//
// Devices: an event's device indexes device_traces; host memory (device -1) is written as
// `host_device`.
// Ownership: a plain object. Thread safety: none (snapshot_recorder serialises it). Cost: a
// map update per event (O(log n) in segments and live blocks); snapshot() is linear in what is
// held.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "poolscope/hooks/event.hpp"
#include "poolscope/profiler/memory_snapshot.hpp"

namespace poolscope::profiler {

/// Settings of a snapshot_builder.
struct snapshot_builder_options {
  /// Trace entries kept per device (the last ones); at least 1.
  std::size_t max_entries = 100000;
  /// The device index written for host memory (event device -1).
  int host_device = 0;
  /// Segments of at most this many bytes are "small" (PyTorch's small pool has 2 MiB segments),
  /// larger ones "large".
  std::uint64_t small_segment_bytes = std::uint64_t{2} << 20;
};

/// One allocator event as the builder reads it (hooks::event without what it does not use).
struct snapshot_event {
  hooks::event_kind kind = hooks::event_kind::pool_malloc;
  hooks::event_phase phase = hooks::event_phase::post;
  int device = -1;
  std::uint64_t stream = 0;
  std::uint64_t ptr = 0;
  std::uint64_t requested = 0;
  std::uint64_t rounded = 0;
  std::uint64_t time_us = 0;      ///< since the Unix epoch
  std::uint32_t stack = 0;        ///< index into the stacks snapshot() is given
  std::uint64_t device_free = 0;  ///< oom: the device's free bytes
  std::uint32_t allocator = 0;    ///< the allocator's id (segment_map, segment_unmap)
};

/// What a builder saw that the snapshot cannot show whole.
struct snapshot_builder_stats {
  std::uint64_t events = 0;            ///< events that changed the snapshot
  std::uint64_t dropped_entries = 0;   ///< trace entries dropped by max_entries, all devices
  std::uint64_t unknown_segments = 0;  ///< segments made for blocks from before the first event
  std::uint64_t untracked_frees = 0;   ///< frees left out of the trace (see the file comment)
  std::uint64_t replaced_blocks = 0;   ///< live blocks under a new one (their frees were lost)
  std::uint64_t left_out_blocks = 0;   ///< blocks or segments contradicting the segments held
};

/// Builds a memory_snapshot from events. See the file comment.
class snapshot_builder {
 public:
  /// Throws invalid_argument if max_entries is 0 or host_device is negative.
  explicit snapshot_builder(const snapshot_builder_options& options = {});

  /// Applies one event (ignored unless it is one of the kinds and phases above).
  void add(const snapshot_event& e);
  /// The snapshot as of now: segments (address order) with their blocks, each device's trace,
  /// and `stacks` as given (entries' and blocks' stack fields index it; pass {{}} for none).
  /// allocator_settings holds max_entries and the entries dropped.
  [[nodiscard]] memory_snapshot snapshot(std::vector<std::vector<snapshot_frame>> stacks = {
                                             {}}) const;
  /// The stack indices snapshot() refers to, ascending (to symbolize only those).
  [[nodiscard]] std::vector<std::uint32_t> stacks_in_use() const;
  [[nodiscard]] const snapshot_builder_stats& stats() const noexcept { return stats_; }

 private:
  struct segment {
    std::uint64_t size = 0;
    std::uint64_t stream = 0;
    std::uint32_t stack = 0;
    bool unknown = false;         // made for blocks from before the first event
    bool mapped = false;          // mapped memory of a virtual range (segment_map)
    std::uint32_t allocator = 0;  // mapped: the allocator that mapped it
  };
  struct block {
    std::uint64_t size = 0;
    std::uint64_t requested = 0;
    std::uint32_t stack = 0;
  };
  struct device_state {
    std::map<std::uint64_t, segment> segments;  // by address
    std::map<std::uint64_t, block> blocks;      // live blocks, by address
    std::vector<trace_entry> ring;              // the last max_entries entries
    std::size_t next = 0;                       // ring slot of the next entry once full
    std::uint64_t dropped = 0;
    std::map<std::uint32_t, std::uint64_t> map_streams;  // allocator -> stream of its maps
  };

  device_state& state_of(int device);
  void record(device_state& d, trace_action action, const snapshot_event& e, std::uint64_t addr,
              std::uint64_t size, std::uint32_t stack);
  void on_malloc(device_state& d, const snapshot_event& e);
  void on_free(device_state& d, const snapshot_event& e);
  void on_segment_alloc(device_state& d, const snapshot_event& e);
  void on_segment_free(device_state& d, const snapshot_event& e);
  void on_map(device_state& d, const snapshot_event& e);
  void on_unmap(device_state& d, const snapshot_event& e);
  // Takes [addr, addr + size) out of the mapped segments; returns the bytes that were in them.
  std::uint64_t cut_mapped(device_state& d, std::uint64_t addr, std::uint64_t size);
  // The segment holding [addr, addr + size), or end().
  std::map<std::uint64_t, segment>::iterator segment_of(device_state& d, std::uint64_t addr,
                                                        std::uint64_t size);
  void cover_unknown(device_state& d, std::uint64_t addr, std::uint64_t size, std::uint64_t stream);
  [[nodiscard]] bool overlaps_live(const device_state& d, std::uint64_t addr,
                                   std::uint64_t size) const;

  snapshot_builder_options options_;
  std::vector<device_state> devices_;
  snapshot_builder_stats stats_;
};

}  // namespace poolscope::profiler
