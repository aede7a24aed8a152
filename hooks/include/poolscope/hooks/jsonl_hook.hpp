// jsonl_hook: a debug hook that writes every allocator event as one JSON object per line
// (JSON Lines), to a file or to any std::ostream.
//
//   poolscope::hooks::jsonl_hook trace{"alloc.jsonl"};                 // every kind
//   poolscope::hooks::scoped_hook on{trace};
//   run_workload();
//   // alloc.jsonl, one line per event:
//   // {"seq":12,"time_ns":8812739,"thread":4711,"kind":"pool_malloc","phase":"post",
//   //  "error":"none","device":-1,"stream":"0x0","allocator_id":1,
//   //  "allocator_name":"bfc/host","ptr":"0x7f3a2c000000","requested":1000,"rounded":1024,
//   //  "aux_ptr":"0x0","aux_bytes":0,"in_use":1024,"reserved":2097152}
//
//   // Only failures, to a stream the caller owns:
//   poolscope::hooks::jsonl_hook errors{std::cerr, {event_kind::oom, event_kind::invalid_free}};
//
// Fields: seq, time_ns, thread, device, allocator_id, requested, rounded, aux_bytes, in_use and
// reserved are JSON integers; kind, phase and error are the names from to_string(); stream, ptr
// and aux_ptr are "0x..." hex strings (lower case; a null pointer is "0x0"); allocator_name is a
// JSON string, escaped (quotes, backslashes, control characters) and made valid UTF-8 (each
// byte of an invalid sequence becomes U+FFFD), so every line parses whatever the name holds.
//
// Ownership: opened from a path, the hook owns the file and closes it on destruction; given a
// std::ostream, it only borrows it (the stream must outlive the hook). Either way it flushes on
// destruction.
// Buffering: to a file it opened, the hook writes lines in batches of about 64 KiB (and on
// flush() and destruction); to a borrowed stream, it writes each line and flushes the stream at
// once, so a console or pipe shows events as they happen (give a path for large traces).
// Thread safety: thread-safe; one mutex serialises formatting and writing, so lines never
// interleave. Lines appear in the order hooks are called, which across threads may differ from
// `seq` order by a few events; sort by seq to get the true order.
// Errors: never throws from on_event. If a write fails (disk full, closed stream, no memory),
// the hook disables itself and says so once through poolscope::log (error level, naming the
// target and how many lines were written and lost); later events are ignored. lines() counts
// only lines that were written: a batch whose write failed is not counted (part of it may be
// in the file).
// Stream semantics: none; the event's stream is only printed.
// Cost: a debug tool, not for hot loops: a mutex, ~300 bytes of formatting and a buffered
// write per event (a write and flush of the stream per event when the stream is borrowed).
#pragma once

#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <iosfwd>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "poolscope/hooks/hook.hpp"

namespace poolscope::hooks {

/// A set of event kinds: the filter of jsonl_hook. Default-constructed it holds every kind;
/// from a list, exactly the kinds listed (`kind_set{}` is all kinds, `kind_set::none()` none).
/// Thread safety: a plain value. Cost: one 32-bit mask.
class kind_set {
 public:
  /// Every kind.
  constexpr kind_set() noexcept = default;
  /// Exactly `kinds`.
  constexpr kind_set(std::initializer_list<event_kind> kinds) noexcept : bits_(0) {
    for (event_kind k : kinds) {
      bits_ |= bit(k);
    }
  }
  /// The empty set.
  [[nodiscard]] static constexpr kind_set none() noexcept { return kind_set(std::uint32_t{0}); }
  /// True if `k` is in the set.
  [[nodiscard]] constexpr bool contains(event_kind k) const noexcept {
    return (bits_ & bit(k)) != 0;
  }

 private:
  explicit constexpr kind_set(std::uint32_t bits) noexcept : bits_(bits) {}
  static constexpr std::uint32_t bit(event_kind k) noexcept {
    return std::uint32_t{1} << static_cast<unsigned>(k);
  }
  std::uint32_t bits_ = (std::uint32_t{1} << event_kind_count) - 1;
};

/// Writes each event it receives (of the kinds in its filter) as one JSON line. See the file
/// comment for the format, ownership and thread safety.
class jsonl_hook final : public hook {
 public:
  /// Writes to the file at `path` (created or truncated). Throws poolscope::runtime_error
  /// naming the path and the reason if it cannot be opened.
  explicit jsonl_hook(const std::string& path, kind_set kinds = {});
  /// Writes to `out`, which the caller owns and must keep alive until the hook is destroyed.
  explicit jsonl_hook(std::ostream& out, kind_set kinds = {});
  /// Flushes (and closes the file it opened).
  ~jsonl_hook() override;

  /// Writes `e` as one line if its kind is in the filter. Never throws.
  void on_event(const event& e) noexcept override;
  /// The filter's kinds, every phase.
  [[nodiscard]] event_filter interests() const noexcept override;
  /// Writes buffered lines to the file, or flushes the stream. Never throws; a failure disables
  /// the hook.
  void flush() noexcept;

  /// False once a write failed (the hook then ignores events).
  [[nodiscard]] bool enabled() const noexcept { return !failed_.load(std::memory_order_relaxed); }
  /// Lines written so far: handed to the OS (file) or accepted and flushed by the stream. Lines
  /// still in the hook's batch are not counted until it is written (flush() writes it).
  [[nodiscard]] std::uint64_t lines() const noexcept {
    return lines_.load(std::memory_order_relaxed);
  }

 private:
  void fail(const char* what) noexcept;  // caller holds mutex_
  void write_batch() noexcept;           // caller holds mutex_
  // Writes `data` (`lines` whole lines) and flushes; counts them, or fails the hook and returns
  // false. Caller holds mutex_.
  bool write_out(std::string_view data, std::uint64_t lines) noexcept;

  std::unique_ptr<std::ostream> owned_;  // the file, when opened from a path
  std::ostream* out_;
  std::string target_;  // for the log line: the path or "a std::ostream"
  kind_set kinds_;
  std::mutex mutex_;
  std::string line_;               // reused formatting buffer, guarded by mutex_
  std::string batch_;              // lines not yet written to the owned file, guarded by mutex_
  std::uint64_t batch_lines_ = 0;  // lines in batch_, guarded by mutex_
  std::atomic<bool> failed_{false};
  std::atomic<std::uint64_t> lines_{0};
};

}  // namespace poolscope::hooks
