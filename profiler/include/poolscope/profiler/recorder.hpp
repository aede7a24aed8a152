// recorder: the allocator event log, as JSON Lines, complete even when the program crashes.
//
//   poolscope::profiler::recorder rec{"run.jsonl"};
//   {
//     poolscope::hooks::scoped_hook on{rec};
//     run_workload();
//   }
//   rec.flush();                 // or let the destructor do it
//   // later: poolscope replay run.jsonl --allocator bfc   (event_log.hpp, replay.hpp)
//
// The file: a first line {"format":"poolscope.events","version":1,"pid":...}, then one line per
// event, in the order hooks were called:
//   {"seq":12,"time_ns":88127390,"thread":4711,"device":-1,"stream":"0x0",
//    "allocator":"best_fit/host","allocator_id":1,"action":"malloc","phase":"post",
//    "ptr":"0x7f3a2c000000","size":1000,"rounded":1024}
// action is one of malloc, free, device_alloc, device_free, split, merge, release, oom,
// limit_hit, invalid_free. By default one line per operation, at the point where it is in true
// order: malloc and device_alloc at their post event (size = requested, rounded = taken),
// free and device_free at their pre event (size = bytes the caller gave, rounded 0), release at
// post, the rest (instants) as they come. With all_phases, pre and post events of every kind are
// written. ptr and stream are "0x..." hex strings; the rest are JSON numbers and strings.
//
// Off the allocating thread: an event is copied into a bounded ring (ring_slots records, a
// compare-exchange and a 60-byte copy into one cache line: event_ring; an event whose thread id
// needs more than 32 bits or whose device more than 16 is formatted on its thread, under the
// recorder's lock); a writer thread formats the ring's records into one fixed buffer
// (buffer_bytes) and writes it to the file with write(2) when the next line does not fit, on
// flush(), and on destruction. When the ring is full (the writer fell behind) the event is dropped
// and counted exactly (dropped()); the writer then writes a line {"dropped":N} where it noticed,
// which read_event_log counts (event_log.hpp) and replay reports. After
// flush_and_write_through() (for the end of a program: frees made by static destructors and by
// exit handlers that run later must still reach the file, when the writer thread may be gone)
// every line is formatted and written on the recording thread as it comes.
// On SIGSEGV, SIGBUS, SIGILL, SIGFPE and SIGABRT the recorder's handler writes what is buffered
// and formats and writes what the ring still holds (write(2) and atomics only: async-signal-safe),
// and then hands the signal on to the handler that was installed before it (or, if that was the
// default action, restores it and re-raises), so the log is complete up to the crash. Handlers are
// installed once per process, by the first recorder that asks. A buffered line is written once
// even when the crash comes while another thread writes the buffer (that thread finishes its
// part; from then on recorders keep their buffers and drop lines that no longer fit); the records
// of the batch the writer thread was taking when the crash came (at most 64) may be written twice
// (read_event_log reads a repeated seq once).
//
// Ownership: owns the file descriptor, the ring, the buffer and the writer thread. Thread safety:
// thread-safe; on_event takes no lock (until flush_and_write_through: then one mutex per line).
// Lines from several threads can be a few events out of seq order; read_event_log sorts them.
// Stream semantics: the stream is only written down. Errors: the constructor throws
// runtime_error naming the path if the file cannot be created; on_event never throws: a failed
// write disables the recorder with one log line. Cost on the allocating thread: a compare-exchange
// and a 60-byte copy into one cache line per event, no line the writer thread writes per event
// (docs/perf.md, hook rows of `bench alloc`); the writer formats ~200 bytes per event and makes a
// write(2) per buffer.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "poolscope/hooks/hook.hpp"

namespace poolscope::profiler {

/// The action name of a recorded event: "malloc", "free", "device_alloc", "device_free",
/// "split", "merge", "release", "oom", "limit_hit", "invalid_free".
[[nodiscard]] std::string_view action_name(hooks::event_kind k) noexcept;

/// Settings of a recorder.
struct recorder_options {
  /// Size of the line buffer (4 KiB to 1 GiB; values outside are raised or lowered to it).
  std::size_t buffer_bytes = std::size_t{1} << 16;
  /// Write pre and post events of every kind, not one line per operation.
  bool all_phases = false;
  /// Install the fatal-signal handlers that flush the buffer.
  bool flush_on_fatal_signal = true;
  /// Events the ring holds for the writer thread (rounded up to a power of two, 2 to 2^30; 64
  /// bytes each).
  std::size_t ring_slots = std::size_t{1} << 17;
  /// Format and write on a writer thread (else only on flush(): between two flushes at most
  /// ring_slots events are kept, the rest dropped and counted).
  bool writer_thread = true;
};

namespace detail {
class event_ring;
class drain_thread;
struct recorder_names;
struct recorder_line;
}  // namespace detail

/// Writes allocator events as JSON Lines. See the file comment.
class recorder final : public hooks::hook {
 public:
  /// Creates (or truncates) `path` and writes the header line. Throws runtime_error naming the
  /// path and the OS error if it cannot.
  explicit recorder(const std::string& path, const recorder_options& options = {});
  /// Flushes and closes the file.
  ~recorder() override;

  /// Writes `e` as one line (see the file comment for which events). Never throws.
  void on_event(const hooks::event& e) noexcept override;
  /// The events it writes (every one with all_phases): allocators build no other for it.
  [[nodiscard]] hooks::event_filter interests() const noexcept override;
  /// Writes the buffered lines to the file. Returns false if the recorder is disabled.
  bool flush() noexcept;
  /// Flushes, and from then on writes each line to the file as it is recorded (a write(2) per
  /// line) instead of buffering it. For exit handlers: events that come after them (frees made
  /// by static destructors, by exit handlers that run later) are written, not left in the buffer
  /// with nobody to flush it. Returns false if the recorder is disabled.
  bool flush_and_write_through() noexcept;

  /// Event lines written or buffered so far (the header not counted); flush() first to count
  /// those still in the ring.
  [[nodiscard]] std::uint64_t lines() const noexcept {
    return lines_.load(std::memory_order_relaxed);
  }
  /// Events dropped because the ring was full (the writer fell behind). Exact.
  [[nodiscard]] std::uint64_t dropped() const noexcept;
  /// False once a write failed.
  [[nodiscard]] bool enabled() const noexcept { return !failed_.load(std::memory_order_relaxed); }
  /// The file's path.
  [[nodiscard]] const std::string& path() const noexcept { return path_; }

  /// What the fatal-signal handler reads: the descriptor, the buffer and how much of it is
  /// unwritten. Public only so the handler (a plain function) can reach it; not part of the API.
  ///
  /// The handler also formats what `ring` still holds (its allocator names from `names`).
  /// `state` holds two offsets in one word, so that the handler reads both at once and takes a
  /// range with one compare-exchange: the low 32 bits count the bytes of complete lines in the
  /// buffer, the high 32 bits the bytes already handed to a write (by the recorder, or by the
  /// handler). Whoever moves the high half up to the low one writes the range between them, so
  /// no byte is written twice. `writer` names the thread in the recorder's write (0: none), with
  /// the end of its range and how far it got: a handler running on that very thread (the write
  /// will never finish) writes the rest of it.
  struct crash_view {
    int fd = -1;
    const char* buffer = nullptr;
    const detail::event_ring* ring = nullptr;  // records not yet formatted
    const detail::recorder_names* names = nullptr;
    std::atomic<std::uint64_t> state{0};
    std::atomic<long> writer{0};
    std::atomic<std::size_t> writer_end{0};
    std::atomic<std::size_t> writer_done{0};
  };

 private:
  bool write_buffer_locked() noexcept;  // caller holds mutex_
  void drain_locked() noexcept;         // caller holds mutex_: the ring into the buffer
  // Caller holds mutex_: room for n bytes at the end of the buffer (written out first if it has
  // less), then the line written there is published.
  char* room_locked(std::size_t n) noexcept;
  void commit_locked(std::size_t n) noexcept;
  bool append_line_locked(const detail::recorder_line& f) noexcept;
  void write_line(const detail::recorder_line& f) noexcept;  // takes mutex_: the ring, then f
  void fail(const char* what, int err) noexcept;

  // What on_event reads, apart from what the writer thread writes for each record (the buffer's
  // state, the counts, the mutex): a line the writer changes would move to its core and back
  // for every event.
  std::string path_;
  recorder_options options_;
  std::unique_ptr<char[]> buffer_;
  std::size_t capacity_ = 0;
  std::unique_ptr<crash_view> view_;
  int slot_ = -1;  // index in the crash registry, -1 if not registered
  std::unique_ptr<detail::recorder_names> names_;
  std::unique_ptr<detail::event_ring> ring_;
  std::atomic<bool> write_through_{false};
  std::atomic<bool> failed_{false};
  alignas(64) std::mutex mutex_;
  std::uint64_t dropped_written_ = 0;  // guarded by mutex_: drops already said in the file
  std::atomic<std::uint64_t> lines_{0};
  alignas(64) std::unique_ptr<detail::drain_thread> writer_;  // last: stopped first
};

}  // namespace poolscope::profiler
