// trace_check: reads Chrome Trace Event Format files event by event (plain or gzip, without
// holding the whole file) and validates them: what `poolscope trace check FILE` runs, and what
// every test that writes a trace runs on it.
//
//   auto r = poolscope::analysis::check_trace("run.json.gz");
//   if (!r.ok()) std::cerr << r.to_text();       // one line per problem, naming the event
//
//   // Any consumer can stream the events the same way:
//   poolscope::analysis::read_trace("run.json", [](std::uint64_t i, const nlohmann::json& e) {
//     if (e.value("ph", "") == "X") ...;
//   });
//
// What check_trace verifies (docs/trace.md lists it with examples):
// - the file is JSON (plain or gzip) whose top level is {"traceEvents":[...], ...} or [...];
// - every event is an object with a known phase ("ph") and the fields that phase needs: name,
//   pid, tid (where the event sits on a thread), numeric ts; "dur" >= 0 for X (an X without dur is
//   an unclosed slice); ts and ts + dur within max_trace_time_us of the origin; on X events of a
//   device-activity category (profiler::classify_category), args "device" / "src_device" /
//   "dst_device" integers from -1 to INT_MAX; an id for flows (s/t/f) and async events (b/e/n);
//   counters (C) with a non-empty args object of numbers; metadata (M) with its args (name or
//   sort_index);
// - slices nest per track: on one (pid, tid) two slices (X, or B/E pairs) are either disjoint or
//   one contains the other; every B has its E;
// - flows pair up: every "s" has an "f" with the same cat and id and vice versa, the end is not
//   before the start, and each end point lies where a slice can take it (s and bp:"e" f: inside a
//   slice of its track; f without bp: a slice starts at or after it);
// - async events pair up: every "b" has an "e" with the same cat, id and name;
// - names: every pid used has a process_name and every thread track used (slices, thread
//   instants, flows) a thread_name.
// Problems name the event: its index in traceEvents, its name and its ts.
//
// Ownership: results are plain values. Thread safety: the functions are reentrant. Cost: one
// pass over the file; memory grows with the slices per track (24 bytes each) and the flows and
// async slices still unmatched, never with the whole file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace poolscope::analysis {

/// The largest |ts| and |ts + dur| (µs from the trace's origin; about 285 years) that
/// check_trace and summarize_trace (trace_summary.hpp) take as times: in ns they fit 64 bits.
/// Beyond it check_trace reports the event and summarize_trace leaves it out.
inline constexpr double max_trace_time_us = 9e15;

/// What read_trace saw besides the events.
struct trace_read_info {
  bool array_form = false;  ///< the top level is a bare array of events
  std::uint64_t events = 0;
  /// Top-level members other than traceEvents ("otherData", "displayTimeUnit", ...).
  nlohmann::json other = nlohmann::json::object();
};

/// Called once per element of the event array, in file order, with its index.
using trace_event_visitor = std::function<void(std::uint64_t index, const nlohmann::json& event)>;

/// Streams the events of the trace at `path` (gzip recognised by its magic bytes) to `visit`,
/// one at a time. Throws runtime_error if the file cannot be read, is not JSON (naming the byte
/// offset), has no event array, or is gzip in a build without zlib. Exceptions from `visit`
/// propagate.
trace_read_info read_trace(const std::string& path, const trace_event_visitor& visit);
/// The same over JSON text in memory (uncompressed).
trace_read_info read_trace_text(std::string_view json_text, const trace_event_visitor& visit);

/// One problem found in a trace.
struct trace_issue {
  std::int64_t index = -1;      ///< the event's index in the event array; -1: the file itself
  std::string name;             ///< the event's name ("" if it has none)
  std::optional<double> ts_us;  ///< the event's ts, if it has a numeric one
  std::string message;
  /// "event #12 \"step\" (ts 10.500 us): message", or "trace: message" for the file.
  [[nodiscard]] std::string to_string() const;
};

/// Settings of check_trace.
struct trace_check_options {
  std::size_t max_issues = 200;  ///< issues kept in the list (all are counted)
};

/// What check_trace found.
struct trace_check_result {
  std::uint64_t events = 0;
  std::map<std::string, std::uint64_t> phases;  ///< events per "ph"
  std::uint64_t slices = 0;                     ///< X events and B/E pairs
  std::uint64_t tracks = 0;                     ///< (pid, tid) pairs holding slices
  std::uint64_t flows = 0;                      ///< s/f pairs matched
  std::vector<trace_issue> issues;              ///< the first max_issues problems
  std::uint64_t issue_count = 0;                ///< all problems

  [[nodiscard]] bool ok() const noexcept { return issue_count == 0; }
  /// "OK: 1234 events ..." or one line per issue and a last line with the count.
  [[nodiscard]] std::string to_text() const;
};

/// Validates the trace at `path`. Never throws for problems with the file (an unreadable or
/// non-JSON file is an issue); throws only std::bad_alloc.
[[nodiscard]] trace_check_result check_trace(const std::string& path,
                                             trace_check_options options = {});
/// Validates JSON text in memory.
[[nodiscard]] trace_check_result check_trace_text(std::string_view json_text,
                                                  trace_check_options options = {});

}  // namespace poolscope::analysis
