// event_log: allocator event logs read back into records, for replay and analysis.
//
//   poolscope::analysis::event_log log = poolscope::analysis::read_event_log("run.jsonl");
//   for (const auto& r : log.records) {
//     if (r.kind == event_kind::pool_malloc) { ... r.ptr, r.size ... }
//   }
//
// Formats read (detected from the first non-empty line):
// - poolscope's recorder (profiler/recorder.hpp): JSON Lines, one event per line, fields seq,
// time_ns,
//   thread, device, stream, allocator, allocator_id, action, phase, ptr, size, rounded; an
//   optional first line {"format": "poolscope.events", ...} describes the file.
// - poolscope's debug hook (hooks::jsonl_hook): JSON Lines with kind, phase, allocator_name,
//   requested instead of action, allocator, size.
// - RMM's logging_resource_adaptor CSV: a header "Thread,Time,Action,Pointer,Size,Stream" then
//   lines such as `140213,14:02:31.123456,allocate,0x7f1a00000000,1024,0x0`; Action is
//   allocate, free or "allocate failure". Times are wall-clock HH:MM:SS.ffffff.
// Records come back in event order (sorted by seq when the log has one; lines from several
// threads can be a few events out of order in a file); a record whose seq and fields repeat an
// earlier one is read once. A recorder's line {"dropped":N} (events its ring had no room for)
// adds N to event_log::dropped_events.
//
// Errors: a corrupt line (not JSON, a missing or mistyped field, an unknown action) or a
// truncated last line throws parse_error naming the source and the 1-based line number.
// Thread safety: the functions are reentrant; records are plain values.
// Cost: linear in the log; one nlohmann parse per JSON line.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <string>
#include <string_view>
#include <vector>

#include "poolscope/error.hpp"
#include "poolscope/hooks/event.hpp"
#include "poolscope/profiler/recorder.hpp"  // action_name

namespace poolscope::analysis {

/// A log could not be parsed: the message names the source and the line.
class parse_error : public runtime_error {
 public:
  /// `source`: file name or "<stream>"; `line`: 1-based line number; `what`: what is wrong.
  parse_error(std::string source, std::size_t line, const std::string& what);
  /// The file name (or "<stream>") that was being read.
  [[nodiscard]] const std::string& source() const noexcept { return source_; }
  /// 1-based number of the offending line.
  [[nodiscard]] std::size_t line() const noexcept { return line_; }

 private:
  std::string source_;
  std::size_t line_;
};

/// Which format a log was in (memory_snapshot: a PyTorch memory snapshot's trace,
/// snapshot_trace.hpp).
enum class log_format : std::uint8_t { poolscope, jsonl_hook, rmm_csv, memory_snapshot };
/// "poolscope", "jsonl_hook", "rmm_csv", "memory_snapshot".
[[nodiscard]] std::string_view to_string(log_format f) noexcept;

/// One event of a log.
struct log_record {
  std::uint64_t seq = 0;      ///< event sequence (RMM: the line's index)
  std::uint64_t time_ns = 0;  ///< event time (RMM: ns since midnight, wall clock)
  std::uint64_t thread = 0;
  int device = -1;
  std::uint64_t stream = 0;        ///< the recorded stream handle, as a number
  std::uint32_t allocator = 0;     ///< index into event_log::allocators
  std::uint32_t allocator_id = 0;  ///< the recorded allocator id (0 if the log has none)
  hooks::event_kind kind = hooks::event_kind::pool_malloc;
  hooks::event_phase phase = hooks::event_phase::post;
  std::uint64_t ptr = 0;
  std::size_t size = 0;     ///< requested bytes (RMM: Size)
  std::size_t rounded = 0;  ///< bytes the allocator took (0 if unknown)
  std::size_t line = 0;     ///< 1-based line in the source
  friend bool operator==(const log_record&, const log_record&) = default;
};

/// A parsed log.
struct event_log {
  log_format format = log_format::poolscope;
  std::vector<std::string> allocators;  ///< allocator names, indexed by log_record::allocator
  std::vector<log_record> records;
  /// Events the recorder dropped (its ring was full: lines {"dropped":N}); not in `records`.
  std::uint64_t dropped_events = 0;
  /// Records read twice (a crash flush may write a record the writer thread also wrote): the
  /// second is left out.
  std::uint64_t repeated_records = 0;
};

/// The kind of an action name; throws invalid_argument naming `name` if unknown.
[[nodiscard]] hooks::event_kind parse_action(std::string_view name);

/// Parses a log from `in`; `source` names it in errors.
[[nodiscard]] event_log parse_event_log(std::istream& in, const std::string& source = "<stream>");
/// Parses the log in `text`.
[[nodiscard]] event_log parse_event_log_text(std::string_view text,
                                             const std::string& source = "<text>");
/// Reads and parses the log file at `path`. Throws runtime_error if it cannot be opened.
[[nodiscard]] event_log read_event_log(const std::string& path);

}  // namespace poolscope::analysis
