// snapshot_recorder: a PyTorch memory snapshot of any poolscope allocator, from its hook events —
// what `torch.cuda.memory._record_memory_history()` and `_dump_snapshot()` give for PyTorch's own
// allocator, for pools PyTorch cannot see (the plug-in, C++ programs).
//
//   poolscope::profiler::snapshot_recorder snap{{.max_entries = 100000}};
//   {
//     poolscope::hooks::scoped_hook on{snap};
//     run_workload();                           // any allocator, any resource, any thread
//   }
//   snap.write("snap.pickle");                  // open in pytorch.org/memory_viz, or
//                                               // python -m torch.cuda._memory_viz trace_plot
//
// What it holds: the segments each allocator holds from upstream, with the blocks that tile
// them, and each device's trace of the last max_entries entries (snapshot_builder.hpp has how
// events become segments, blocks and entries). Every allocation and segment carries the call
// stack that asked for it (stack_capture: native frames, and Python frames in a Python process),
// symbolized when a snapshot is taken. Timestamps are wall-clock microseconds (time_us),
// derived from the events' monotonic clock.
//
// Cost on the allocating thread: the stack capture (mallocs, segment acquisitions and maps, ooms; a
// free has none: it shows the stack of its allocation), the stack's interning (the same stack as
// the thread's previous one is a comparison with its copy; another is a lookup, or an insertion,
// in the stack table under its spin lock) and one 56-byte copy of the event into a bounded ring
// (event_ring: with its sequence number, one cache line); a writer thread applies the ring to the
// snapshot. When the ring is full an
// event is dropped and counted exactly (stats().dropped_events; in the file,
// allocator_settings["dropped_events"]): the snapshot then lacks it (a block may stay active
// that was freed). With `writer_thread` false there is no thread: the ring is applied when a
// snapshot is taken, and only ring_slots events fit between two snapshots.
//
// Ownership: owns its ring, its writer thread and the snapshot state; it must outlive its
// installation. Thread safety: on_event from any number of threads; snapshot(), write() and
// stats() from any thread (they drain the ring under the recorder's lock). Stream semantics:
// each entry and segment records the stream it was made on; nothing is synchronized. Errors:
// the constructor throws invalid_argument for bad options; write() throws runtime_error naming
// the path; on_event never throws (a failure to apply an event is counted as dropped).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "poolscope/hooks/hook.hpp"
#include "poolscope/profiler/line_profiler.hpp"
#include "poolscope/profiler/memory_snapshot.hpp"
#include "poolscope/profiler/snapshot_builder.hpp"

namespace poolscope::profiler {

/// Settings of a snapshot_recorder.
struct snapshot_recorder_options {
  /// Trace entries kept per device (the last ones), as PyTorch's max_entries; at least 1.
  std::size_t max_entries = 100000;
  /// Capture call stacks (else every frames list is empty).
  bool stacks = true;
  /// Native frames kept per stack, and how they are walked (line_profiler_options has these).
  std::size_t max_depth = 24;
  stack_unwinder unwinder = stack_unwinder::automatic;
  /// Python frames kept per stack in a Python process; 0: none. At most 256.
  std::size_t max_python_depth = 32;
  /// Where the allocating thread runs Python: true keeps the native frames above the
  /// interpreter's too (PyTorch's stacks="all"); false the Python frames alone (stacks="python"),
  /// which spares the native walk. Without Python, native frames either way.
  bool native_with_python = true;
  /// Frames dropped from the top after poolscope's own (an application's allocation wrapper).
  std::size_t skip_frames = 0;
  /// Code addresses whose shared objects count as poolscope's own (line_profiler_options).
  std::vector<const void*> skip_modules_of{};
  /// Events the ring holds for the writer (rounded up to a power of two, 2 to 2^30; 64 bytes
  /// each).
  std::size_t ring_slots = std::size_t{1} << 16;
  /// Apply the ring on a writer thread (else only when a snapshot is taken).
  bool writer_thread = true;
  /// The device index written for host memory.
  int host_device = 0;
};

/// What a snapshot_recorder has done.
struct snapshot_recorder_stats {
  std::uint64_t events = 0;          ///< events taken into the ring
  std::uint64_t dropped_events = 0;  ///< events dropped because the ring was full
  std::uint64_t stacks = 0;          ///< distinct stacks seen
  snapshot_builder_stats builder;    ///< entries dropped by max_entries, unknown segments, ...
};

/// Records allocator events as a memory snapshot. See the file comment.
class snapshot_recorder final : public hooks::hook {
 public:
  /// Throws invalid_argument for max_entries 0, max_depth outside 1..256, max_python_depth
  /// above 256, more than 8 skip_modules_of, or an unwinder missing from this build.
  explicit snapshot_recorder(const snapshot_recorder_options& options = {});
  /// Stops the writer thread.
  ~snapshot_recorder() override;

  void on_event(const hooks::event& e) noexcept override;
  /// pool_malloc, device_alloc and segment_map post; pool_free, device_free and segment_unmap
  /// pre; oom.
  [[nodiscard]] hooks::event_filter interests() const noexcept override;
  /// False: the ring keeps the order events reach it in, which for one pointer is the true one.
  [[nodiscard]] bool wants_sequence() const noexcept override { return false; }

  /// The snapshot as of now, symbolized. allocator_settings hold max_entries, the entries and
  /// events dropped and the allocators seen.
  [[nodiscard]] memory_snapshot snapshot() const;
  /// Writes snapshot() as a pickle to `path` (created or truncated). Throws runtime_error naming
  /// the path if it cannot be written.
  void write(const std::string& path) const;
  [[nodiscard]] snapshot_recorder_stats stats() const;

 private:
  struct state;
  void drain_locked() const;  // caller holds mutex_

  snapshot_recorder_options options_;
  std::unique_ptr<state> state_;
  alignas(64) mutable std::mutex mutex_;  // off the line of state_, which hooks read
};

}  // namespace poolscope::profiler
