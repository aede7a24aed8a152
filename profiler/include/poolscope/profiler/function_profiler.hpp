// function_profiler: per named scope, calls, CPU time (inclusive and self), GPU time and pool
// memory. Chainer's TimerHook and CupyMemoryProfileHook for POOLSCOPE_SCOPE.
//
//   poolscope::profiler::function_profiler prof;        // active from here
//   for (int i = 0; i < steps; ++i) {
//     POOLSCOPE_SCOPE("step", stream);
//     { POOLSCOPE_SCOPE("forward", stream); forward(); }
//     { POOLSCOPE_SCOPE("backward", stream); backward(); }
//   }
//   prof.stop();
//   auto profile = prof.report();                        // resolves the GPU timings here
//   std::cout << profile.to_table();
//   // name      calls   cpu total    cpu self   gpu total     cpu avg    used   acquired
//   // step         10    812.3 ms      1.2 ms    809.9 ms     81.2 ms  2.0 GiB   512 MiB
//   // ...
//
// Sessions: start() (and the constructor) begins a session, stop() ends it, reset() ends it and
// begins the next at once. A scope is counted in a session iff the session was active both when
// the scope opened and when it closed on its thread: every scope that opened after start() (or
// reset()) returned and closed before stop() (or reset()) was called is counted; no scope open
// across start(), stop() or reset() is. A scope is counted whole (its call, times and bytes
// together) and, once stop() returned, is in report(). So every report, taken while the session
// is active or after stop(), holds:
// - nesting: the scopes nested in a counted scope on its thread are counted too, in the same
//   session (the converse does not hold: scopes inside one that is open across start() or stop()
//   may be counted while it is not);
// - per counted scope: its inclusive time is its self time plus the inclusive times of the
//   scopes directly nested in it, so their sum is at most its inclusive time;
// - per name: cpu_total_ns >= cpu_self_ns, used_bytes >= self_used_bytes and acquired_bytes >=
//   self_acquired_bytes.
//
// What it measures, per scope name, over the counted scopes:
// - calls: one per counted scope;
// - CPU inclusive time: wall time from open to close of the outermost counted scopes of the name
//   on their thread (a counted scope nested in a counted one of the same name adds nothing:
//   recursion is not double counted);
// - CPU self time: inclusive time minus the inclusive time of the scopes directly nested in it;
//   summed over all names it equals the time spent in the outermost counted scopes;
// - GPU time: for the outermost scope of the name in the session, the time between two
//   cudaEvents recorded on the scope's stream at open and close (events of the stream's device,
//   whichever device is current: a stream of another GPU is timed too). Events come from a pool;
//   the pairs are queued per thread and resolved with cudaEventQuery when the queue grows and in
//   report() (never a synchronize per scope). Absent without a GPU or with gpu_timing off;
// - used bytes: bytes (rounded) of pool_malloc post events raised while the scope was the
//   innermost open scope of the allocating thread or one of its ancestors (inclusive, for the
//   outermost counted scopes of the name, as CPU inclusive time; the self_ variants count only
//   the innermost scope). Acquired bytes: the same for device_alloc post events (memory the
//   pools took from upstream).
//
// Ownership: the profiler owns its results; the per-thread collection state is the library's.
// Only one function_profiler may be active at a time (start() throws logic_error otherwise).
// Thread safety: scopes may open and close on any number of threads while the profiler is active:
// each thread keeps its own stack and its own shard of results, guarded by a per-thread mutex
// that only report() and stop() contend for; shards of exited threads are merged when the thread
// exits. The profiler object's own methods are thread-safe.
// Stream semantics: see scope.hpp. Errors: CUDA failures while timing disable GPU timing for the
// rest of the session with a logged reason; they never throw from a scope.
// Cost, active: two clock reads, a thread-local stack push/pop and an uncontended lock per scope;
// with GPU timing, two cudaEventRecord calls.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "poolscope/profiler/scope.hpp"

namespace poolscope::profiler {

/// What the function profiler measured for one scope name.
struct scope_record {
  std::string name;                ///< the scope name
  category cat = category::user;   ///< the category of the name's first registration
  std::uint64_t calls = 0;         ///< counted scopes of this name (see the file comment)
  std::uint64_t cpu_total_ns = 0;  ///< inclusive, outermost counted scopes of the name only
  std::uint64_t cpu_self_ns = 0;   ///< exclusive of directly nested scopes
  /// GPU time of the outermost scopes of the name; absent when GPU timing was off.
  std::optional<std::uint64_t> gpu_total_ns;
  std::uint64_t gpu_samples = 0;          ///< event pairs resolved into gpu_total_ns
  std::uint64_t used_bytes = 0;           ///< pool_malloc bytes, inclusive of nested scopes
  std::uint64_t self_used_bytes = 0;      ///< pool_malloc bytes while innermost
  std::uint64_t acquired_bytes = 0;       ///< device_alloc bytes, inclusive of nested scopes
  std::uint64_t self_acquired_bytes = 0;  ///< device_alloc bytes while innermost

  /// Mean inclusive CPU time per call (0 without calls). With recursion the inclusive time is
  /// counted once per outermost scope but every call counts, so this is time per call.
  [[nodiscard]] double cpu_avg_ns() const noexcept {
    return calls == 0 ? 0.0 : static_cast<double>(cpu_total_ns) / static_cast<double>(calls);
  }
  friend bool operator==(const scope_record&, const scope_record&) = default;
};

/// A function profile: one record per scope name, sorted by inclusive CPU time (descending,
/// then by name). A plain value.
struct function_profile {
  std::vector<scope_record> scopes;
  bool gpu_timing = false;        ///< GPU timing was on (a GPU was present and it was asked for)
  std::uint64_t gpu_pending = 0;  ///< event pairs not complete when the report was made
  std::uint64_t gpu_dropped = 0;  ///< event pairs dropped (queue full or CUDA error)
  /// Scopes not counted because the host had no memory for their frame or their results (the
  /// profile is incomplete when this is not 0; logged once per session).
  std::uint64_t scopes_lost = 0;

  /// The record for `name`, or nullptr.
  [[nodiscard]] const scope_record* find(std::string_view name) const noexcept;
  /// A text table, one row per scope, sorted as `scopes`; the last line sums it up. Control
  /// characters in names are written escaped (\n, \t, \r, \xHH; a backslash as \\), so that
  /// each row stays one line.
  [[nodiscard]] std::string to_table() const;
  /// JSON: {"gpu_timing":..,"gpu_pending":..,"gpu_dropped":..,"scopes_lost":..,
  /// "scopes":[{"name":..,...}]}. gpu_total_ns is null where absent.
  [[nodiscard]] std::string to_json() const;
  /// Parses what to_json wrote. Throws invalid_argument naming the field and its value on
  /// malformed input (a count, time or byte figure that is not a non-negative integer included).
  /// scopes_lost may be absent (profiles written before it existed): 0.
  [[nodiscard]] static function_profile from_json(std::string_view json);
  /// The same, from a document already parsed (a run report's "profiles.function"). Same
  /// errors; a malformed value is named by its type, not printed, when it is an array or object.
  [[nodiscard]] static function_profile from_json_document(const nlohmann::json& doc);

  friend bool operator==(const function_profile&, const function_profile&) = default;
};

/// A clock returning nanoseconds; the default is hooks::now_ns (CLOCK_MONOTONIC).
using clock_function = std::uint64_t (*)() noexcept;

/// Settings of a function_profiler.
struct function_profiler_options {
  /// Time GPU work with cudaEvents on each scope's stream (ignored without a GPU).
  bool gpu_timing = true;
  /// Attribute pool memory to scopes (installs a process-wide hook while active).
  bool memory = true;
  /// The clock for CPU times (tests inject a synthetic one); null: hooks::now_ns.
  clock_function clock = nullptr;
  /// Per thread: completed event pairs are resolved with cudaEventQuery (their events reused by
  /// later scopes) when 64 pairs, or this many if fewer, are pending, and again each time the
  /// pending pairs reach twice what the last resolution left; at 16 times this many, new pairs
  /// are dropped (and counted).
  std::size_t gpu_pending_limit = 1024;
};

/// The function profiler. See the file comment.
class function_profiler {
 public:
  /// Creates the profiler and starts it. Throws logic_error if another one is active.
  explicit function_profiler(function_profiler_options options = {});
  function_profiler(const function_profiler&) = delete;
  function_profiler& operator=(const function_profiler&) = delete;
  /// Stops the profiler if active.
  ~function_profiler();

  /// Starts a new session: clears the results, activates the scopes (those opening from now on;
  /// see Sessions in the file comment). Throws logic_error if this or another profiler is active.
  void start();
  /// Ends the session; results are kept for report(). Scopes open now are not counted when they
  /// close; every scope counted before the call is in the results. No-op if not active.
  void stop() noexcept;
  /// True between start() and stop().
  [[nodiscard]] bool active() const noexcept;

  /// The results so far (while active, a snapshot). With `wait_for_gpu`, waits for the pending
  /// GPU event pairs to complete (cudaEventSynchronize) so every GPU time is in; without, only
  /// completed pairs are resolved and the rest counted in gpu_pending.
  [[nodiscard]] function_profile report(bool wait_for_gpu = true);
  /// Clears the results. While active, ends the session and begins the next at once: scopes
  /// open now are not counted when they close.
  void reset();

  /// The options the profiler was created with.
  [[nodiscard]] const function_profiler_options& options() const noexcept { return options_; }

 private:
  struct state;
  function_profiler_options options_;
  std::unique_ptr<state> state_;
};

}  // namespace poolscope::profiler
