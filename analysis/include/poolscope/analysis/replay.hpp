// replay: run a recorded allocation log against any allocator and measure what it would do.
//
//   auto log = poolscope::analysis::read_event_log("run.jsonl");     // or RMM's CSV log
//   poolscope::analysis::replay_options opt;
//   opt.progress = [](const replay_progress& p) { std::fprintf(stderr, "\r%zu/%zu", p.done,
//                                                             p.total); return true; };
//   auto r = poolscope::analysis::replay_on_host(log, "bfc", /*capacity=*/16ULL << 30, opt);
//   std::cout << r.to_text();    // peak requested/reserved, ratio, upstream calls, failures,
//                                // p50/p99 latency per operation
//
// Semantics: records are replayed in order, on the calling thread. A malloc record allocates
// its size (alignment 256); the recorded pointer is mapped to the new one. A free record frees
// the block its recorded pointer maps to, with the size it was allocated with. Frees of pointers
// that were never allocated in the replay are counted (unknown_frees), never passed on; a
// malloc record of a pointer still live means the log lost that block's free: the block is
// freed there, and counted (implied_frees);
// frees of blocks whose replayed allocation failed are counted apart. An allocation that throws
// out_of_memory is a failed allocation (the replay goes on). Other records (device_alloc,
// split, oom, ...) are consequences of the recorded allocator and are skipped; recorded
// failures (oom, RMM "allocate failure") are counted. Blocks still live at the end are freed
// (counted as live_at_end) unless free_remaining is false.
// Streams: recorded stream handles mean nothing in a new process. By default every operation
// runs on the default stream; map_stream can give each recorded stream a real (or, on host
// resources, a key) stream.
// Thread safety: replay() uses the allocator from the calling thread only; the allocator may be
// shared but then its stats include the other users. Cost: one allocator call per record plus
// two clock reads, and a hash-table update per malloc/free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <string_view>

#include "poolscope/analysis/event_log.hpp"
#include "poolscope/pool/allocator.hpp"
#include "poolscope/pool/allocator_stats.hpp"
#include "poolscope/stream_view.hpp"

namespace poolscope::analysis {

/// How far a replay is.
struct replay_progress {
  std::size_t done = 0;   ///< records processed
  std::size_t total = 0;  ///< records in the log
  std::uint64_t failed_allocations = 0;
};

/// Settings of a replay.
struct replay_options {
  /// Replay only records of the log's allocator with this name (event_log::allocators); empty:
  /// every record. Use it for logs of nested allocators, which record each request twice.
  std::string only_allocator;
  /// Called every progress_every records and once at the end; return false to stop early.
  std::function<bool(const replay_progress&)> progress{};
  std::size_t progress_every = std::size_t{1} << 16;
  /// The stream for a recorded stream handle; unset: the default stream for all.
  std::function<stream_view(std::uint64_t recorded_stream)> map_stream{};
  /// Free the blocks still live when the log ends (so the allocator's resource gets them back).
  bool free_remaining = true;
};

/// Latency summary of one operation, in nanoseconds.
struct latency_summary {
  std::uint64_t count = 0;
  double mean_ns = 0;
  double p50_ns = 0;
  double p99_ns = 0;
  double max_ns = 0;
};

/// What a replay measured.
struct replay_result {
  std::string allocator;                 ///< the allocator's name ("bfc/host")
  bool completed = true;                 ///< false if the progress callback stopped it
  std::size_t records = 0;               ///< records processed
  std::uint64_t mallocs = 0;             ///< malloc records replayed (successful or not)
  std::uint64_t frees = 0;               ///< frees passed to the allocator
  std::uint64_t failed_allocations = 0;  ///< allocations that threw out_of_memory
  std::uint64_t unknown_frees = 0;       ///< frees of pointers never allocated in the replay
  std::uint64_t implied_frees = 0;       ///< mallocs of a pointer still live (its free not logged)
  std::uint64_t frees_of_failed = 0;     ///< frees of blocks whose allocation failed here
  std::uint64_t recorded_failures = 0;   ///< oom records of the log (not replayed)
  std::uint64_t skipped_records = 0;     ///< other kinds, and other allocators' records
  std::uint64_t live_at_end = 0;         ///< blocks still allocated when the log ended
  std::uint64_t dropped_events = 0;      ///< events the recorder dropped (event_log's count)
  std::size_t peak_requested = 0;  ///< highest sum of live requested bytes (allocator's count)
  std::size_t peak_reserved = 0;   ///< highest bytes held from upstream
  std::size_t peak_in_use = 0;     ///< highest bytes handed out (allocator's rounding)
  /// peak_reserved / peak_requested (0 if nothing was requested).
  double ratio = 0;
  std::uint64_t upstream_allocs = 0;
  std::uint64_t upstream_frees = 0;
  latency_summary malloc_latency;
  latency_summary free_latency;
  pool::allocator_stats final_stats;  ///< the allocator's stats after the replay

  /// A few aligned lines for a terminal; the last line sums it up.
  [[nodiscard]] std::string to_text() const;
  /// One JSON object with every field.
  [[nodiscard]] std::string to_json() const;
};

/// Replays `log` against `alloc`. Peaks are the allocator's own (stats() after the replay), so
/// give it a fresh allocator to measure the log alone.
[[nodiscard]] replay_result replay(const event_log& log, pool::allocator& alloc,
                                   const replay_options& options = {});

/// Replays `log` against a new allocator of strategy `strategy` (pool::make_allocator) over a
/// new host_resource of `capacity` bytes. Throws invalid_argument for an unknown strategy.
[[nodiscard]] replay_result replay_on_host(
    const event_log& log, std::string_view strategy,
    std::size_t capacity = std::numeric_limits<std::size_t>::max(),
    const replay_options& options = {});

}  // namespace poolscope::analysis
