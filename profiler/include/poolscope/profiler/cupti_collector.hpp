// cupti_collector: device activity (kernels, copies, memsets, synchronization, CUDA API calls,
// NVTX markers, CUDA memory) from CUPTI's activity API, on poolscope's clock.
//
//   poolscope::profiler::cupti_collector c{[](const device_activity& a) { ... }};
//   if (!c.start()) {                       // no GPU, no driver, or another CUPTI client: the
//     std::cerr << c.status().reason;       // reason was logged once; host-side work goes on
//   }
//   run_gpu_work();
//   cudaDeviceSynchronize();                // records are complete once the work is
//   c.stop();                               // flushes every buffer to the sink, then stops
//
// Most programs use it through timeline (timeline.hpp), which turns records into trace events.
//
// Collection: the kinds enabled are CONCURRENT_KERNEL, MEMCPY, MEMCPY2 (peer copies), MEMSET,
// MEMORY2 (where available), SYNCHRONIZATION, RUNTIME and DRIVER (for correlation) and MARKER
// (NVTX ranges and marks as CUPTI sees them), each switchable in cupti_options. A kind CUPTI
// refuses is left out and listed in status().refused_kinds; the rest go on.
// Buffers: a fixed pool of buffer_count buffers of buffer_bytes is allocated by the constructor,
// before collection starts; CUPTI's buffer-requested callback takes one from the pool or, when
// none is free, refuses (CUPTI then drops records). Records dropped by CUPTI
// (cuptiActivityGetNumDroppedRecords, read after every buffer) and buffers refused are counted
// exactly in status().
// Clock: the collector registers cupti_timestamp() (hooks::now_ns, CLOCK_MONOTONIC) with
// cuptiActivityRegisterTimestampCallback, so CUPTI's timestamps are on poolscope's clock. If
// CUPTI refuses the callback, the offset between CUPTI's clock and now_ns is measured at start
// (estimate_clock_offset) and added to every timestamp; status().clock says which.
// Threads: API records and markers are reported with OS thread ids (hooks::current_thread_id).
// The collector asks CUPTI for them (cuptiSetThreadIdType(SYSTEM); status().system_thread_ids).
// Where CUPTI refuses, CUPTI names threads by the low 32 bits of pthread_self(): the collector
// then subscribes to CUPTI's runtime and driver API callbacks (a callback on every API call) and
// learns, once per thread, which OS thread that is; a thread it has not seen keeps CUPTI's id
// (status().unmapped_threads counts those records).
// NVTX: CUPTI sees NVTX calls only when it is the NVTX tool. With options.attach_nvtx, start()
// sets NVTX_INJECTION64_PATH to libcupti if it is unset (modules that have already initialised
// NVTX keep their tool); if another tool is named there, markers come from nowhere and the
// status says so.
// Unavailable: with no GPU or driver, when another CUPTI client holds CUPTI (cuptiSubscribe
// returns CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED: Nsight Systems, another profiler), or
// when CUPTI fails otherwise, start() logs the reason once (poolscope::log, warn), returns false
// and collects nothing; nothing else changes. Only one collector runs at a time in a process.
//
// Ownership: the collector owns its buffers and its CUPTI session; the sink is called on CUPTI's
// threads (and on the thread calling flush()/stop()) with records valid only during the call.
// Thread safety: start/flush/stop and status are thread-safe; the sink must be.
// Stream semantics: records name CUPTI's stream ids (stable per stream within a context).
// Cost: what CUPTI costs (a few hundred ns per API call and kernel with these kinds), plus an
// unordered_map lookup per record for the thread ids; memory is buffer_count * buffer_bytes.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace poolscope::profiler {

/// The kinds of record a device_activity can be.
enum class activity_kind : std::uint8_t {
  kernel,           ///< a kernel (CONCURRENT_KERNEL)
  memcpy,           ///< a copy (MEMCPY, or MEMCPY2 for peer copies: `peer` set)
  memset,           ///< a memset
  memory,           ///< a CUDA allocation or free (MEMORY2): `memory_free`, `address`, `bytes`
  synchronization,  ///< a stream/event/context synchronization (host side)
  runtime_api,      ///< a CUDA runtime API call (host side)
  driver_api,       ///< a CUDA driver API call (host side)
  marker,           ///< an NVTX mark or range start/end
};
/// "kernel", "memcpy", ...
[[nodiscard]] std::string_view to_string(activity_kind k) noexcept;

/// The direction of a copy (CUpti_ActivityMemcpyKind).
enum class copy_kind : std::uint8_t {
  unknown = 0,
  htod = 1,
  dtoh = 2,
  htoa = 3,
  atoh = 4,
  atoa = 5,
  atod = 6,
  dtoa = 7,
  dtod = 8,
  htoh = 9,
  ptop = 10,
};
/// "HtoD", "DtoH", "DtoD", "PtoP", ...
[[nodiscard]] std::string_view to_string(copy_kind k) noexcept;

/// Where copied memory lives (CUpti_ActivityMemoryKind).
enum class memory_kind : std::uint8_t {
  unknown = 0,
  pageable = 1,
  pinned = 2,
  device = 3,
  array = 4,
  managed = 5,
  device_static = 6,
  managed_static = 7,
};
/// "pageable", "pinned", "device", ...
[[nodiscard]] std::string_view to_string(memory_kind k) noexcept;

/// The phase of an NVTX marker record.
enum class marker_phase : std::uint8_t { instant, start, end };

/// The synchronization a record describes (CUpti_ActivitySynchronizationType).
enum class sync_kind : std::uint8_t {
  unknown = 0,
  event_synchronize = 1,
  stream_wait_event = 2,
  stream_synchronize = 3,
  context_synchronize = 4,
};
/// "cudaEventSynchronize", "cudaStreamWaitEvent", "cudaStreamSynchronize", ...
[[nodiscard]] std::string_view to_string(sync_kind k) noexcept;

/// CUPTI's "no stream" value (CUPTI_INVALID_STREAM_ID).
inline constexpr std::uint32_t no_stream = 0xFFFFFFFFU;

/// One activity record, converted from CUPTI's structs (by the seam) into plain fields. Views
/// (`name`, `domain`) are valid only during the sink call.
struct device_activity {
  activity_kind kind = activity_kind::kernel;
  std::uint64_t start_ns = 0;  ///< on poolscope's clock (markers, memory: the time of the event)
  std::uint64_t end_ns = 0;    ///< equal to start_ns for point events
  std::uint32_t device = 0;
  std::uint32_t context = 0;
  std::uint32_t stream = no_stream;
  std::uint32_t correlation = 0;  ///< ties an API call to the device work it launched
  std::uint64_t thread = 0;       ///< API calls and markers: OS thread id (see the file comment)
  std::uint32_t process = 0;      ///< API calls and markers: OS process id
  std::uint64_t bytes = 0;        ///< copies, memsets, memory records
  // Copies.
  copy_kind copy = copy_kind::unknown;
  memory_kind src_kind = memory_kind::unknown;
  memory_kind dst_kind = memory_kind::unknown;
  bool peer = false;  ///< a MEMCPY2 record (src_device and dst_device are set)
  std::uint32_t src_device = 0;
  std::uint32_t dst_device = 0;
  // Kernels.
  std::array<std::int32_t, 3> grid{0, 0, 0};
  std::array<std::int32_t, 3> block{0, 0, 0};
  std::int32_t static_shared_bytes = 0;
  std::int32_t dynamic_shared_bytes = 0;
  std::uint16_t registers = 0;
  // Memory records.
  bool memory_free = false;  ///< a release (else an allocation)
  std::uint64_t address = 0;
  // Synchronization.
  sync_kind sync = sync_kind::unknown;
  // API records.
  std::uint32_t callback_id = 0;
  std::uint32_t return_value = 0;
  // Markers.
  marker_phase marker = marker_phase::instant;
  std::uint32_t marker_id = 0;
  /// Kernel: the (mangled) name; API: the function ("cudaLaunchKernel", version suffix removed);
  /// marker: the message (empty for a range end).
  std::string_view name;
  std::string_view domain;  ///< marker: the NVTX domain (empty: the default domain)
};

/// Receives records; called on CUPTI's threads. Must be thread-safe and must not call CUDA.
using activity_sink = std::function<void(const device_activity&)>;

/// Settings of a cupti_collector.
struct cupti_options {
  std::size_t buffer_bytes = std::size_t{4} << 20;  ///< size of one activity buffer
  std::size_t buffer_count = 8;                     ///< buffers in the pool
  bool kernels = true;                              ///< CONCURRENT_KERNEL
  bool copies = true;                               ///< MEMCPY and MEMCPY2
  bool memsets = true;                              ///< MEMSET
  bool memory = true;                               ///< MEMORY2 (CUDA allocations and frees)
  bool synchronization = true;                      ///< SYNCHRONIZATION
  bool runtime_api = true;                          ///< RUNTIME
  bool driver_api = true;                           ///< DRIVER
  bool markers = true;                              ///< MARKER (NVTX)
  /// Put CUPTI's timestamps on now_ns with the timestamp callback (false: measure an offset).
  /// The callback costs nothing measurable (docs/perf.md, "CUPTI's timestamp callback").
  bool timestamp_callback = true;
  /// Make libcupti the NVTX tool when NVTX_INJECTION64_PATH is unset (see the file comment).
  bool attach_nvtx = true;
  /// How often CUPTI's worker hands over partly filled buffers (0: only when full or flushed).
  std::uint32_t flush_period_ms = 100;
};

/// `base` with only the activity kinds named in `list` on: a comma-separated list of kernels,
/// copies, memsets, memory, sync, runtime, driver and markers, or "all". `markers` also decides
/// attach_nvtx: without it libcupti is not made the NVTX tool, so NVTX calls stay as cheap as
/// with no tool (what a trace loses: CUPTI's copy of the NVTX ranges; the timeline's own scopes
/// remain). Order and repeats do not matter; spaces around names are ignored.
/// Throws invalid_argument naming the entry that is none of these, or for an empty list.
[[nodiscard]] cupti_options with_activity_kinds(std::string_view list, cupti_options base = {});
/// The kinds `o` enables, in with_activity_kinds' names ("all" when every one is on, "" when none).
[[nodiscard]] std::string activity_kinds_of(const cupti_options& o);

/// The state of a collector.
enum class cupti_state : std::uint8_t {
  off,          ///< not started, or stopped
  running,      ///< collecting
  unavailable,  ///< start() failed: see reason
};
/// "off", "running", "unavailable".
[[nodiscard]] std::string_view to_string(cupti_state s) noexcept;

/// How CUPTI's timestamps were put on poolscope's clock.
enum class clock_mode : std::uint8_t {
  callback,  ///< cuptiActivityRegisterTimestampCallback: CUPTI reads now_ns itself
  offset,    ///< a measured offset is added to every timestamp
};

/// A snapshot of a collector's counters.
struct cupti_status {
  cupti_state state = cupti_state::off;
  std::string reason;  ///< why unavailable (or a note, e.g. about NVTX)
  clock_mode clock = clock_mode::callback;
  std::int64_t offset_ns = 0;           ///< added to CUPTI timestamps (clock_mode::offset)
  std::uint64_t records = 0;            ///< records delivered to the sink
  std::uint64_t dropped_records = 0;    ///< cuptiActivityGetNumDroppedRecords, summed
  std::uint64_t buffers_refused = 0;    ///< buffer requests the pool could not serve
  std::uint64_t buffers_completed = 0;  ///< buffers CUPTI handed back
  std::uint64_t unmapped_threads = 0;   ///< records whose thread id stayed CUPTI's
  bool system_thread_ids = false;       ///< CUPTI reports OS thread ids (no API callbacks needed)
  std::uint64_t unknown_records = 0;    ///< records of kinds the collector does not convert
  std::vector<std::string> refused_kinds;  ///< activity kinds CUPTI would not enable
  bool nvtx_attached = false;              ///< CUPTI is the NVTX tool (as far as we know)
  std::string nvtx_note;                   ///< how NVTX markers were (or were not) arranged
  std::size_t buffer_bytes = 0;
  std::size_t buffer_count = 0;
};

/// A fixed pool of activity buffers, allocated up front, handed out and taken back by address.
/// Thread-safe (one mutex); acquire never allocates.
class activity_buffer_pool {
 public:
  /// Allocates `count` buffers of `bytes` (rounded up to a multiple of 8), 8-byte aligned as
  /// CUPTI requires. Throws invalid_argument for a zero count or size, std::bad_alloc.
  activity_buffer_pool(std::size_t count, std::size_t bytes);
  activity_buffer_pool(const activity_buffer_pool&) = delete;
  activity_buffer_pool& operator=(const activity_buffer_pool&) = delete;
  ~activity_buffer_pool();

  /// A free buffer, or nullptr (counted in refused()) when all are out.
  [[nodiscard]] std::uint8_t* acquire() noexcept;
  /// Returns a buffer from acquire(). Unknown pointers are ignored and counted (foreign()).
  void release(std::uint8_t* buffer) noexcept;
  [[nodiscard]] std::size_t buffer_bytes() const noexcept { return bytes_; }
  [[nodiscard]] std::size_t count() const noexcept { return count_; }
  [[nodiscard]] std::size_t available() const noexcept;
  [[nodiscard]] std::uint64_t refused() const noexcept;
  [[nodiscard]] std::uint64_t foreign() const noexcept;
  /// True if `p` is one of this pool's buffers.
  [[nodiscard]] bool owns(const std::uint8_t* p) const noexcept;

 private:
  std::size_t count_;
  std::size_t bytes_;
  std::uint8_t* storage_ = nullptr;
  mutable std::mutex mutex_;
  std::vector<std::uint8_t*> free_;
  std::uint64_t refused_ = 0;
  std::uint64_t foreign_ = 0;
};

/// The function registered as CUPTI's timestamp callback: hooks::now_ns().
[[nodiscard]] std::uint64_t cupti_timestamp() noexcept;

/// A clock returning nanoseconds.
using ns_clock = std::uint64_t (*)() noexcept;

/// Estimates `now() - other()` (the offset that puts `other`'s readings on `now`'s clock): over
/// `samples` readings of other() bracketed by two of now(), the tightest bracket's midpoint.
/// Error at most half the tightest bracket's width.
[[nodiscard]] std::int64_t estimate_clock_offset(ns_clock other, ns_clock now,
                                                 int samples = 32) noexcept;

/// Puts a CUPTI timestamp on poolscope's clock: `ts + offset_ns`, with 0 (CUPTI's "unknown")
/// kept as 0.
[[nodiscard]] constexpr std::uint64_t to_process_clock(std::uint64_t cupti_ts,
                                                       std::int64_t offset_ns) noexcept {
  return cupti_ts == 0 ? 0 : cupti_ts + static_cast<std::uint64_t>(offset_ns);
}

/// The collector. See the file comment.
class cupti_collector {
 public:
  /// Allocates the buffer pool; collects nothing until start().
  explicit cupti_collector(activity_sink sink, cupti_options options = {});
  cupti_collector(const cupti_collector&) = delete;
  cupti_collector& operator=(const cupti_collector&) = delete;
  /// Stops if running.
  ~cupti_collector();

  /// Starts collecting. Returns false (logged once, reason in status()) if CUPTI is unavailable
  /// or taken; throws logic_error if this collector already ran (a collector is used once).
  bool start();
  /// Hands every buffer CUPTI holds to the sink (forced flush): call after synchronizing the
  /// device to get all records of finished work. No-op unless running.
  void flush() noexcept;
  /// Flushes, disables the kinds, unsubscribes. Idempotent; never throws.
  void stop() noexcept;
  [[nodiscard]] bool running() const noexcept;
  [[nodiscard]] cupti_status status() const;
  [[nodiscard]] const cupti_options& options() const noexcept { return options_; }

  /// The path of the libcupti this process uses ("" if it cannot be told).
  [[nodiscard]] static std::string library_path();
  /// The names of the CUDA devices present, by ordinal (empty without a GPU or driver). Calls
  /// the CUDA runtime: not from a sink.
  [[nodiscard]] static std::vector<std::string> device_names();

  struct state;  ///< internal: what CUPTI's callbacks reach

 private:
  cupti_options options_;
  std::shared_ptr<state> state_;  // shared: kept alive if CUPTI still holds buffers at stop
};

}  // namespace poolscope::profiler
