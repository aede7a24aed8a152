// timeline: one Chrome trace of everything poolscope sees — host scopes, allocator events and
// memory counters, and CUPTI's device activity with launch->kernel flows — on one clock,
// written as it goes, plus the summaries the JSON report is made of.
//
//   poolscope::profiler::timeline tl{{.trace_path = "run.json.gz"}};
//   tl.start();                                    // CUPTI on (or logged off), hook installed
//   {
//     POOLSCOPE_SCOPE("step");                     // a host slice "step" (cat "user") at close
//     step(stream);                                // pool allocations, kernels, copies
//     cudaStreamSynchronize(stream);
//   }
//   const auto t0 = poolscope::hooks::now_ns();    // or any span, by hand
//   save(checkpoint);
//   tl.add_host_slice({.name = "save", .begin_ns = t0, .end_ns = poolscope::hooks::now_ns()});
//   tl.stop();                                     // flushes CUPTI, closes the file
//   auto report = poolscope::profiler::run_report::from(tl);   // report.hpp
//
// The trace (docs/trace.md has the full layout):
// - pid 1 is the host (process_name "host: <program> (pid N)"); each host thread is a track
//   (tid = OS thread id, thread_name "<comm> (tid N)"). On it: host slices (X, cat = their
//   category), CUDA runtime/driver API calls (X, cat "cuda_api"), allocator events (instants,
//   cat "allocator") and NVTX marks (instants, cat "nvtx"). NVTX ranges and CUDA
//   synchronizations are async slices (b/e, cat "nvtx" and "sync") of the host process: they
//   need not nest.
// - pid 100 + d is CUDA device d (process_name "GPU d: <name>", sorted after the host); each
//   stream is a track (tid = CUPTI stream id, "stream N"). On it: kernels (cat "kernel", or
//   "nccl" for NCCL's), copies (cat "memcpy", "Memcpy HtoD", peer copies "Memcpy PtoP"), memsets
//   (cat "memset"), each with args (device, stream, correlation, bytes, gbps, ...). CUDA
//   allocations and frees (MEMORY2) are instants on the track "CUDA memory" (tid 2147483647).
// - counters (C): "memory <allocator> #<id>" with in_use and reserved bytes, on the process of
//   the allocator's device (host allocators on pid 1), and "memory (all pools)" per process.
// - flows (s -> f, cat "launch", bp "e"): from each API call to every kernel, copy and memset it
//   launched, matched by CUPTI correlation id.
// - ts is microseconds since start() with three decimals (ns precision).
// Scopes: while the timeline runs (and options.scopes is on), every POOLSCOPE_SCOPE /
// profiler::scope that opens and then closes is a host slice on the closing thread's track, on
// every running timeline, whether a function_profiler is active or not (scope.hpp). A scope
// opened before start() is not on the trace; one still open at stop() is not either.
// Slices of one track never overlap without nesting: host slices and API calls nest by their
// clock; device operations on one stream are serial, and the rare partial overlap CUPTI reports
// between neighbours is clipped (counted in stats().device_clipped).
//
// Buffering: events are formatted on the producing thread into a chunk (chunk_bytes); full
// chunks go to a writer thread through a queue of at most max_pending_chunks. When the queue is
// full, host events (scopes, allocator events) are dropped and counted exactly
// (stats().events_dropped) rather than stall the program, and so are host events the host has
// no memory to record (a trace never holds part of an event); CUPTI records wait for room instead
// (CUPTI keeps its own buffers meanwhile and counts its own drops). Memory is bounded by
// (max_pending_chunks + 2) * chunk_bytes plus the correlation tables (max_pending_links each).
//
// Ownership: the timeline owns its file, writer thread, collector and hook. Single use: start()
// once, stop() once. Thread safety: add_* and summary() may be called from any thread; start and
// stop from one. Events outside start..stop are ignored (counted in stats().outside_session).
// Stream semantics: device records name CUPTI's stream ids; the timeline never synchronizes a
// stream: synchronize before stop() so the last kernels' records are complete.
// Errors: start() throws runtime_error if the trace file cannot be created; a write failure
// later stops the writing (logged once, stats().write_error) but never the program; CUPTI
// unavailable is logged once by the collector and the host side goes on.
// Cost: one mutex and ~200-400 ns of formatting per event on the producing thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "poolscope/hooks/hook.hpp"
#include "poolscope/profiler/cupti_collector.hpp"
#include "poolscope/profiler/distributed_info.hpp"
#include "poolscope/profiler/overlap.hpp"
#include "poolscope/profiler/trace_writer.hpp"

namespace poolscope::profiler {

class timeline;
namespace detail {
void lost_on_running_timelines() noexcept;  // detail/scope_timelines.hpp
}  // namespace detail

/// The pid of the host process in poolscope traces.
inline constexpr std::int64_t host_pid = 1;
/// The pid of CUDA device `device` in poolscope traces.
[[nodiscard]] constexpr std::int64_t device_pid(int device) noexcept {
  return 100 + static_cast<std::int64_t>(device);
}
/// The tid of the CUDA allocation/free track of a device process.
inline constexpr std::int64_t cuda_memory_tid = 2147483647;

/// A finished host-side span: what a closed scope (or anyone) hands the timeline.
struct host_slice {
  std::string_view name{};
  std::string_view category = "user";  ///< "user", "pool", "darray.transfer", "darray.compute"
  std::uint64_t thread = 0;            ///< OS thread id (hooks::current_thread_id); 0: caller's
  /// The track's name when `thread` is no thread of the process but a track of the caller's
  /// ("" : the thread's name, from /proc); the first slice of a track names it.
  std::string_view track_name{};
  std::uint64_t begin_ns = 0;  ///< hooks::now_ns clock
  std::uint64_t end_ns = 0;
  /// The device the work belongs to (-1: none). darray slices with a device count in that
  /// device's overlap analysis ("darray.transfer" as transfer, "darray.compute" as compute).
  int device = -1;
  /// A copy between two devices (both >= 0, one of them `device`): written as args src_device
  /// and dst_device, and counted on both devices in the overlap analysis, as CUPTI's peer
  /// copies are.
  int src_device = -1;
  int dst_device = -1;
  /// How far begin_ns and end_ns may be off this clock (0: read from it). A GPU's span carries
  /// its clock anchor's error: written as arg clock_error_ns when nonzero, so that `poolscope
  /// trace merge` joins a send to its receive when their order is within the two errors.
  std::uint64_t clock_error_ns = 0;
};

/// Settings of a timeline.
struct timeline_options {
  std::string trace_path;  ///< required; ".gz" compresses (see trace_writer)
  trace_writer_options writer{};
  bool cupti = true;               ///< collect device activity with CUPTI
  cupti_options cupti_settings{};  ///< used when `cupti`
  bool allocator_events = true;    ///< install a process-wide timeline_hook while running
  bool allocator_instants = true;  ///< an instant per allocator event (counters regardless)
  /// Every POOLSCOPE_SCOPE / profiler::scope opened and closed while running becomes a host
  /// slice: its name, its category's name, the thread, open and close on hooks::now_ns.
  bool scopes = true;
  std::size_t chunk_bytes = std::size_t{256} << 10;      ///< formatting chunk
  std::size_t max_pending_chunks = 16;                   ///< chunks queued for the writer thread
  std::size_t max_pending_links = std::size_t{1} << 16;  ///< API calls / device ops awaiting
                                                         ///< their other half, NVTX ranges open
  std::string process_name{};  ///< the host process's name ("": "host: <program> (pid N)")
  /// One rank of several (distributed_info.hpp): written as the trace's top-level
  /// "distributedInfo" {backend, rank, world_size, host, devices, clock_sync}, which
  /// `poolscope trace merge` and Holistic Trace Analysis read. Unset: no such member.
  std::optional<distributed_info> distributed{};
};

/// Calls, total and longest time of one host slice name and category.
struct scope_summary {
  std::string name;
  std::string category;
  std::uint64_t count = 0;
  std::uint64_t total_ns = 0;
  std::uint64_t max_ns = 0;
};

/// Peaks of one allocator, from its hook events.
struct memory_peak {
  int device = -1;
  std::string allocator;
  std::uint32_t allocator_id = 0;
  std::uint64_t events = 0;
  std::uint64_t peak_in_use = 0;
  std::uint64_t peak_reserved = 0;
  std::uint64_t final_in_use = 0;
  std::uint64_t final_reserved = 0;
};

/// Peaks of the sum over a device's allocators.
struct device_memory_peak {
  int device = -1;
  std::uint64_t peak_in_use = 0;
  std::uint64_t peak_reserved = 0;
};

/// Counters of a timeline.
struct timeline_stats {
  std::uint64_t events_written = 0;  ///< trace events handed to the writer (metadata included)
  /// Host events dropped: the writer queue was full, or the host had no memory to record them
  /// (that is logged once).
  std::uint64_t events_dropped = 0;
  std::uint64_t outside_session = 0;  ///< add_* calls before start() or after stop()
  std::uint64_t bytes_written = 0;    ///< uncompressed JSON bytes
  std::uint64_t host_slices = 0;
  std::uint64_t allocator_events = 0;
  std::uint64_t device_records = 0;       ///< CUPTI records received
  std::uint64_t incomplete_records = 0;   ///< records without timestamps (work not finished)
  std::uint64_t flows = 0;                ///< launch -> device flows written
  std::uint64_t unlinked_device_ops = 0;  ///< device ops whose launching call never showed up
  std::uint64_t device_clipped = 0;       ///< device slices clipped to keep their track nested
  std::uint64_t nvtx_unmatched = 0;       ///< NVTX range ends without a start, starts left open
  std::uint64_t overlap_intervals_dropped = 0;
  bool write_failed = false;
  std::string write_error;
};

/// Everything the report needs, as a snapshot.
struct timeline_summary {
  std::string trace_path;
  std::uint64_t start_ns = 0;             ///< hooks::now_ns at start() (the trace's origin)
  std::uint64_t stop_ns = 0;              ///< at stop() (0 while running)
  std::vector<std::string> device_names;  ///< by ordinal, when CUPTI ran
  std::vector<op_summary> kernels;        ///< by total time, descending
  std::vector<op_summary> copies;         ///< per (device, kind), by total time
  std::vector<scope_summary> scopes;      ///< by total time
  std::vector<memory_peak> memory;        ///< per allocator
  std::vector<device_memory_peak> device_memory;
  std::vector<device_overlap> overlap;
  timeline_stats stats;
  cupti_status cupti;
};

/// The timeline. See the file comment.
class timeline {
 public:
  /// Checks the options (invalid_argument for an empty trace_path); opens nothing yet.
  explicit timeline(timeline_options options);
  timeline(const timeline&) = delete;
  timeline& operator=(const timeline&) = delete;
  /// Stops if running.
  ~timeline();

  /// Opens the trace, starts the writer thread, the CUPTI collector (if asked for; its failure
  /// is logged and the run goes on) and the allocator hook. Throws runtime_error if the file
  /// cannot be created, logic_error if called twice.
  void start();
  /// Removes the hook, flushes and stops CUPTI, writes everything and closes the file. Never
  /// throws (write errors are in stats()). Idempotent.
  void stop() noexcept;
  [[nodiscard]] bool running() const noexcept;

  /// Adds a finished host span. Never throws.
  void add_host_slice(const host_slice& s) noexcept;
  /// Adds an allocator event (what timeline_hook forwards). Never throws.
  void add_allocator_event(const hooks::event& e) noexcept;
  /// Adds a device activity record (what the CUPTI collector delivers; tests feed synthetic
  /// ones). Timestamps on the hooks::now_ns clock. Never throws; may wait for the writer.
  void add_device_activity(const device_activity& a) noexcept;

  /// Adds clock samples taken around barriers (sample_barriers), under `label` ("start", "end"),
  /// to the trace's distributedInfo.clock_sync. Throws logic_error without options().distributed,
  /// or once stop() has begun; invalid_argument for an empty `label` or no rounds.
  void add_clock_sync(std::string_view label, std::span<const clock_sync_round> rounds);

  /// A snapshot of the summaries (final after stop()).
  [[nodiscard]] timeline_summary summary() const;
  [[nodiscard]] timeline_stats stats() const;
  /// The collector's status (state off with no reason when CUPTI was not asked for).
  [[nodiscard]] cupti_status cupti() const;
  /// hooks::now_ns at start() (0 before).
  [[nodiscard]] std::uint64_t origin_ns() const noexcept;
  [[nodiscard]] const timeline_options& options() const noexcept { return options_; }

 private:
  friend void detail::lost_on_running_timelines() noexcept;
  // Counts host events lost for lack of memory (and `host_slices` slices among them that were not
  // counted yet); logs the first loss.
  void lost_host_events(std::uint64_t host_slices) noexcept;

  struct impl;
  timeline_options options_;
  std::unique_ptr<impl> impl_;
};

/// Forwards allocator events to a timeline: the timeline installs one itself while running
/// (options.allocator_events); install your own with scoped_hook to feed a timeline that does
/// not. Ownership: refers to the timeline, which must outlive it. Thread safety: as the
/// timeline's add_allocator_event. Stream semantics: none. Cost: that of add_allocator_event.
class timeline_hook final : public hooks::hook {
 public:
  explicit timeline_hook(timeline& t) noexcept : timeline_(&t) {}
  void on_event(const hooks::event& e) noexcept override { timeline_->add_allocator_event(e); }

 private:
  timeline* timeline_;
};

}  // namespace poolscope::profiler
