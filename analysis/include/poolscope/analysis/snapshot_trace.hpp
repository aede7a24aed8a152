// snapshot_trace: a memory snapshot's allocation trace as an event log that replay() runs, and
// the figures the snapshot itself gives to set beside a replay's.
//
//   auto snap = poolscope::analysis::read_memory_snapshot("snap.pickle");
//   for (int d : poolscope::analysis::snapshot_devices(snap)) {
//     auto t = poolscope::analysis::snapshot_trace_of(snap, d);
//     auto r = poolscope::analysis::replay_on_host(t.log, "bfc");
//     // r.peak_reserved beside t.figures.source_peak_reserved
//   }
//
// The log of one device: an `alloc` entry is a malloc of its size (the bytes asked for), the
// user's free is the `free_requested` entry (or a `free_completed` with no request before it),
// an `oom` is a recorded failure; segment entries are what the recorded allocator did and are
// not replayed. What the trace cannot tell is said, not guessed: a trace that begins mid-run (a
// ring buffer that lost its start, or history recorded late) frees blocks it never allocated,
// and its final segments hold blocks it never allocated. Those blocks were live when the trace
// began; they open the log as mallocs, in address order (the order and placement of their
// allocations are not in the file), and `figures` counts them. Memory allocated and freed before
// the first event is not in the file at all: peaks before it are unknown.
//
// Figures: source_peak_reserved is the highest total of segment bytes the device held, from the
// segments at the end and the segment entries (segment_alloc/free, segment_map/unmap) walked
// back, so segments that existed before the first event count; source_peak_live the highest
// total of live requested bytes, blocks from before the first event included.
//
// Errors: invalid_argument for a device with no trace and no segments. Thread safety:
// reentrant. Cost: linear in the device's trace and segments.
#pragma once

#include <cstdint>
#include <vector>

#include "poolscope/analysis/event_log.hpp"
#include "poolscope/profiler/memory_snapshot.hpp"

namespace poolscope::analysis {

/// What a snapshot says about one device's memory.
struct snapshot_figures {
  int device = 0;
  std::uint64_t entries = 0;  ///< trace entries of the device
  std::uint64_t allocs = 0;
  std::uint64_t frees = 0;
  std::uint64_t ooms = 0;
  /// Highest segment bytes held, segments from before the first event counted.
  std::uint64_t source_peak_reserved = 0;
  /// Segment bytes held before the first event (derived from the end and the segment entries).
  std::uint64_t reserved_at_start = 0;
  /// Segment bytes held at the end (the segments' total_size).
  std::uint64_t reserved_at_end = 0;
  /// Highest live requested bytes, blocks from before the first event counted.
  std::uint64_t source_peak_live = 0;
  /// Blocks live before the first event (freed in the trace, or still active at the end,
  /// with no alloc entry), and their requested bytes.
  std::uint64_t blocks_before_trace = 0;
  std::uint64_t bytes_before_trace = 0;
  /// Frees of blocks that were not live (a second free of one address).
  std::uint64_t frees_not_live = 0;
  /// True if the segment entries take more bytes back than the end and the trace account for
  /// (segment entries lost): reserved_at_start is then 0 and the peak a lower bound.
  bool segments_inconsistent = false;
};

/// A device's trace as a log, with the snapshot's figures.
struct snapshot_trace {
  event_log log;
  snapshot_figures figures;
};

/// The devices of `s` with trace entries or segments, ascending.
[[nodiscard]] std::vector<int> snapshot_devices(const profiler::memory_snapshot& s);
/// Device `device`'s trace as a log (allocator name "device N"). Throws invalid_argument for a
/// device with no trace and no segments.
[[nodiscard]] snapshot_trace snapshot_trace_of(const profiler::memory_snapshot& s, int device);

}  // namespace poolscope::analysis
