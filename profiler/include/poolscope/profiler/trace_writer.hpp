// trace_writer: a streaming writer of Chrome Trace Event Format files (what Perfetto and
// chrome://tracing open), plain or gzip-compressed.
//
//   poolscope::profiler::trace_writer w{"run.json.gz", hooks::now_ns()};   // gzip by extension
//   w.process_name(1, "host");
//   w.thread_name(1, 4711, "main");
//   const poolscope::profiler::trace_arg args[] = {{"bytes", 4096}, {"stream", 7}};
//   w.write({.phase = trace_phase::complete, .name = "step", .cat = "user", .pid = 1,
//            .tid = 4711, .ts_ns = t0, .dur_ns = t1 - t0, .args = args});
//   w.close();                                     // "]" and otherData; the file is complete
//
// Format written (docs/trace.md): one JSON object
//   {"traceEvents":[ <event>,\n<event>,\n ... ],"displayTimeUnit":"ns","otherData":{...}}
// Every event has "ph", "name", "pid", "tid" and, except metadata, "ts": microseconds since
// `origin_ns` with exactly three decimals (nanosecond precision, no rounding: 1234567 ns is
// "1234.567"). Complete events carry "dur" the same way. Strings are escaped per RFC 8259 and made
// valid UTF-8 (an invalid byte becomes U+FFFD), so any name is safe.
//
// Streaming: events are formatted into a chunk of `chunk_bytes` and the chunk goes to the file
// (through zlib when compressing) whenever it fills, so memory stays bounded whatever the length
// of the trace. Events already formatted elsewhere with append_trace_event (the timeline formats
// on its producer threads and writes from one thread) go in with write_formatted.
//
// Ownership: the writer owns its file and closes it (close() or the destructor).
// Thread safety: none; one thread at a time (the timeline serialises access).
// Stream semantics: none. Errors: the constructor throws runtime_error naming the path if the
// file cannot be created, or if gzip is asked for in a build without zlib; write errors throw
// runtime_error naming the path. Cost: ~100-300 ns of formatting per event, plus the I/O (and
// compression, ~10 ms per MiB at level 6) once per chunk.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>

namespace poolscope::profiler {

/// One argument of an event ("args": {key: value}): an integer, a real, a string or a boolean.
/// Views its key and string value: they must outlive the write call.
class trace_arg {
 public:
  /// The kind of value held.
  enum class type : std::uint8_t { int64, uint64, real, string, boolean };

  template <std::signed_integral T>
  trace_arg(std::string_view key, T v) noexcept  // NOLINT(google-explicit-constructor)
      : key_(key), type_(type::int64), i_(static_cast<std::int64_t>(v)) {}
  template <std::unsigned_integral T>
  requires(!std::same_as<T, bool>) trace_arg(std::string_view key, T v)
  noexcept  // NOLINT(google-explicit-constructor)
      : key_(key), type_(type::uint64), u_(static_cast<std::uint64_t>(v)) {}
  trace_arg(std::string_view key, double v) noexcept : key_(key), type_(type::real), d_(v) {}
  trace_arg(std::string_view key, std::string_view v) noexcept
      : key_(key), type_(type::string), s_(v) {}
  trace_arg(std::string_view key, const char* v) noexcept
      : key_(key), type_(type::string), s_(v != nullptr ? v : "") {}
  trace_arg(std::string_view key, bool v) noexcept : key_(key), type_(type::boolean), b_(v) {}

  [[nodiscard]] std::string_view key() const noexcept { return key_; }
  [[nodiscard]] type kind() const noexcept { return type_; }
  [[nodiscard]] std::int64_t as_int() const noexcept { return i_; }
  [[nodiscard]] std::uint64_t as_uint() const noexcept { return u_; }
  [[nodiscard]] double as_real() const noexcept { return d_; }
  [[nodiscard]] std::string_view as_string() const noexcept { return s_; }
  [[nodiscard]] bool as_bool() const noexcept { return b_; }

 private:
  std::string_view key_;
  type type_;
  std::int64_t i_ = 0;
  std::uint64_t u_ = 0;
  double d_ = 0.0;
  std::string_view s_;
  bool b_ = false;
};

/// The event phases poolscope writes ("ph").
enum class trace_phase : char {
  complete = 'X',     ///< a slice with ts and dur
  instant = 'i',      ///< a point in time; scope "t" (thread), "p" (process) or "g" (global)
  counter = 'C',      ///< numeric args become counter tracks of the process
  flow_start = 's',   ///< start of an arrow (binds to the slice enclosing ts on its track)
  flow_end = 'f',     ///< end of an arrow; with bind_enclosing, to the slice enclosing ts
  async_begin = 'b',  ///< start of an async (non-nesting) slice, matched by cat + id
  async_end = 'e',    ///< end of an async slice
  metadata = 'M',     ///< process_name, thread_name, process_sort_index, thread_sort_index
};

/// One event to write. Views only: every string and the args must outlive the call.
struct trace_event {
  trace_phase phase = trace_phase::complete;
  std::string_view name{};
  std::string_view cat{};       ///< omitted when empty
  std::int64_t pid = 0;         ///< see docs/trace.md for poolscope's pid scheme
  std::int64_t tid = 0;         ///< a host thread id or a device stream id
  std::uint64_t ts_ns = 0;      ///< absolute, on the process clock (hooks::now_ns)
  std::uint64_t dur_ns = 0;     ///< complete events only
  std::uint64_t id = 0;         ///< flow and async events
  char instant_scope = 't';     ///< instant events: 't', 'p' or 'g'
  bool bind_enclosing = false;  ///< flow events: "bp":"e"
  std::span<const trace_arg> args{};
};

/// Appends `e` to `out` as ",\n{...}" (the separator first, so chunks concatenate), with ts in
/// microseconds since `origin_ns`. Metadata events take their value from args (see the metadata
/// helpers below). Never fails except for std::bad_alloc.
void append_trace_event(std::string& out, const trace_event& e, std::uint64_t origin_ns);
/// Appends `ns` nanoseconds as microseconds with exactly three decimals ("-0.005", "12.345").
void append_trace_us(std::string& out, std::int64_t ns);
/// Appends `s` as a JSON string literal (escaped, valid UTF-8).
void append_trace_string(std::string& out, std::string_view s);
/// Appends a process_name / thread_name metadata event (",\n" first, as append_trace_event).
void append_process_name(std::string& out, std::int64_t pid, std::string_view name);
void append_thread_name(std::string& out, std::int64_t pid, std::int64_t tid,
                        std::string_view name);
/// Appends a process_sort_index / thread_sort_index metadata event.
void append_process_sort_index(std::string& out, std::int64_t pid, std::int64_t index);
void append_thread_sort_index(std::string& out, std::int64_t pid, std::int64_t tid,
                              std::int64_t index);

/// Whether a trace is compressed.
enum class trace_compression : std::uint8_t {
  by_extension,  ///< gzip if the path ends in ".gz", plain otherwise
  none,
  gzip,
};

/// True if this build has zlib: gzip traces can be written and read.
[[nodiscard]] bool trace_gzip_supported() noexcept;

/// Settings of a trace_writer.
struct trace_writer_options {
  trace_compression compression = trace_compression::by_extension;
  std::size_t chunk_bytes = std::size_t{1} << 20;  ///< formatted bytes buffered before a write
  int gzip_level = 6;                              ///< 1 (fast) .. 9 (small)
};

/// The streaming writer. See the file comment.
class trace_writer {
 public:
  /// Creates (truncates) `path` and writes the opening of the JSON object. Timestamps are written
  /// relative to `origin_ns`. Throws runtime_error (cannot create, or gzip without zlib).
  trace_writer(const std::string& path, std::uint64_t origin_ns, trace_writer_options options = {});
  trace_writer(const trace_writer&) = delete;
  trace_writer& operator=(const trace_writer&) = delete;
  /// Closes the trace if close() was not called; errors are logged, never thrown.
  ~trace_writer();

  /// Formats and buffers one event.
  void write(const trace_event& e);
  /// Buffers `count` events already formatted by the append_* functions (each starting ",\n").
  void write_formatted(std::string_view events, std::uint64_t count);
  void process_name(std::int64_t pid, std::string_view name);
  void thread_name(std::int64_t pid, std::int64_t tid, std::string_view name);
  void process_sort_index(std::int64_t pid, std::int64_t index);
  void thread_sort_index(std::int64_t pid, std::int64_t tid, std::int64_t index);
  /// Writes buffered events to the file (and flushes the compressor's output).
  void flush();
  /// Ends the event array, writes "otherData" (an object; null writes {}) and closes the file.
  /// The writer accepts nothing afterwards. Throws runtime_error if a write fails.
  void close(const nlohmann::json& other_data = nullptr);
  /// close() with otherData given as JSON text (an object, written as is; the caller vouches for
  /// it), and `more_members`: further top-level members as JSON text (`"key":value` pairs joined
  /// by commas, "" for none; a rank's "distributedInfo"). Builds no string of its own: usable
  /// with the host out of memory.
  void close_text(std::string_view other_data_json, std::string_view more_members = {});

  [[nodiscard]] const std::string& path() const noexcept { return path_; }
  [[nodiscard]] bool compressed() const noexcept { return gzip_; }
  [[nodiscard]] bool closed() const noexcept { return sink_ == nullptr; }
  [[nodiscard]] std::uint64_t origin_ns() const noexcept { return origin_ns_; }
  /// Events written (buffered ones included).
  [[nodiscard]] std::uint64_t events() const noexcept { return events_; }
  /// Uncompressed bytes of JSON produced so far (buffered ones included).
  [[nodiscard]] std::uint64_t bytes() const noexcept { return bytes_; }

  /// Where the bytes go: a plain file or a gzip stream (internal).
  class sink;

 private:
  void append_raw(std::string_view s);
  void drain();

  std::string path_;
  std::uint64_t origin_ns_;
  trace_writer_options options_;
  bool gzip_ = false;
  std::unique_ptr<sink> sink_;
  std::string chunk_;
  bool first_ = true;  // the next event is the first: it gets no separator
  std::uint64_t events_ = 0;
  std::uint64_t bytes_ = 0;
};

}  // namespace poolscope::profiler
