// trace_summary: the overlap analysis (profiler/overlap.hpp) and the busiest kernels, copies and
// CUDA API calls of a written trace, over the whole run or inside chosen windows: what `poolscope
// trace summary` prints.
//
//   auto s = poolscope::analysis::summarize_trace("run.json.gz");
//   std::cout << s.to_text();
//   auto runs = poolscope::analysis::find_trace_ranges("run.json.gz", "demo.fused");
//   auto each = poolscope::analysis::summarize_trace("run.json.gz", runs.found, /*each=*/true);
//
// What counts as compute, transfer and other, and how the figures are taken: profiler/overlap.hpp.
//
// Ownership: results are plain values. Thread safety: the functions are reentrant. Cost: one
// streamed pass over the file (trace_check.hpp's read_trace); memory grows with the intervals
// kept per device (merged as overlap_analyzer does) and the distinct kernel, copy and call names.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "poolscope/profiler/overlap.hpp"

namespace poolscope::analysis {

/// What `poolscope trace summary` prints: per device, busy time of compute and transfer, the
/// overlap, idle time, and the top kernels and copies; then the top CUDA API calls.
struct trace_summary {
  std::uint64_t events = 0;
  /// The windows the figures were taken in (their union, sorted and disjoint); empty when the
  /// whole trace counts.
  std::vector<profiler::interval> windows;
  /// One window's own analysis (summarize_trace with `each`).
  struct window_overlap {
    profiler::interval window;
    std::vector<profiler::device_overlap> devices;  ///< as `devices`, inside this window alone
    std::uint64_t upstream_allocs = 0;  ///< as `upstream_allocs`, inside this window alone
    std::uint64_t upstream_bytes = 0;
    std::uint64_t upstream_ns = 0;
  };
  /// Per window of `windows`, in time order, when asked for (`each`); else empty.
  std::vector<window_overlap> each;
  /// Events left out for fields that cannot be read: not an object, no "ph", a "ts" (or an X
  /// event's "dur") missing, not a finite number or out of range (max_trace_time_us, for the
  /// slice's end too), a negative "dur", a "name" that is not a string; and X events of a
  /// counted category whose args "device", "src_device" or "dst_device" is not an integer in
  /// [-1, INT_MAX]. `poolscope trace check` names them.
  std::uint64_t malformed = 0;
  /// Times a pool grew in the windows (the whole trace without): allocator events
  /// "device_alloc" (cat "allocator", not phase "pre"), and the bytes they took ("rounded").
  /// Host time in the upstream allocator (cudaMalloc: hundreds of µs per 256 MiB) that an op's
  /// first runs pay and later ones do not.
  std::uint64_t upstream_allocs = 0;
  std::uint64_t upstream_bytes = 0;
  /// Host time in those calls: the "upstream alloc" slices (cat "allocator") the timeline
  /// writes from each call's pre to its post event, their parts inside the windows (0 for a
  /// trace without them).
  std::uint64_t upstream_ns = 0;
  std::int64_t window_begin_ns = 0;  ///< ts of the earliest event (ns since the trace origin)
  std::int64_t window_end_ns = 0;    ///< end of the latest event
  /// Per device (a merged trace: per rank and device, by rank, each with its `rank`).
  std::vector<profiler::device_overlap> devices;
  /// A trace merged across ranks (trace_merge.hpp): each rank's share of transfer time with
  /// compute running on its devices (their sums); empty for the trace of one process.
  struct rank_overlap {
    int rank = 0;
    std::string name;  ///< its process's name in the merged trace
    std::size_t devices = 0;
    std::uint64_t compute_ns = 0;
    std::uint64_t transfer_ns = 0;
    std::uint64_t both_ns = 0;
    double overlap_ratio = 0.0;  ///< both_ns / transfer_ns; 0 without transfers
  };
  std::vector<rank_overlap> ranks;
  /// A merged trace's clock alignment, from its otherData.merged: the largest offset found
  /// between a rank's clock and the reference's, and the largest uncertainty left after
  /// aligning them.
  struct clock_skew {
    bool measured = false;                ///< every rank's clock was sampled
    std::int64_t max_skew_ns = 0;         ///< between ranks of different hosts (shifted)
    std::int64_t max_uncertainty_ns = 0;  ///< of those shifts
    /// Measured between ranks of one host, which share its clock (not shifted).
    std::int64_t max_same_host_offset_ns = 0;
  };
  std::optional<clock_skew> clock;
  /// A merged trace's flows from each reshard piece's send to its receive on another rank, and
  /// the sends and receives left without one (otherData.merged: flows, unmatched_transfers,
  /// reversed_transfers: of those, paired but the receive ends before its send began;
  /// pairs_within_clock_error: pairs so reversed by less than the errors of their times, GPU
  /// clock anchors and alignment between hosts, joined without a flow).
  struct piece_flows {
    std::uint64_t flows = 0;
    std::uint64_t unmatched_transfers = 0;
    std::uint64_t reversed_transfers = 0;
    std::uint64_t pairs_within_clock_error = 0;
  };
  std::optional<piece_flows> pieces;
  std::vector<profiler::op_summary>
      kernels;  ///< every (device, kernel name), by total time, descending
  std::vector<profiler::op_summary>
      copies;  ///< every (device, copy kind), by total time, descending
  /// Every CUDA API call name (cat "cuda_api", recorded with CUPTI's runtime or driver kinds),
  /// by total time, descending: host time spent in CUDA calls, the calls a loop of small ops
  /// costs. `category` is the args' "api" ("runtime", "driver"; "" if absent), `device` -1. A
  /// runtime call encloses the driver calls it makes, so the two are not summed together.
  std::vector<profiler::op_summary> api_calls;

  /// A table per device; `top` kernels and copies per device.
  [[nodiscard]] std::string to_text(std::size_t top = 10) const;
  [[nodiscard]] nlohmann::json to_json(std::size_t top = 10) const;
};

/// Reads the trace at `path` (plain or gzip, streamed) and summarises its device activity: X
/// events whose cat profiler::classify_category knows, on the device in their args "device" (events
/// without one are not counted; events with unreadable fields are counted in `malformed`). In a
/// trace merged across ranks (pids rank_pid(r), trace_merge.hpp) each rank's devices count apart,
/// and a copy with another rank counts as transfer time on this rank's end only. Throws
/// runtime_error if the file cannot be read or parsed. With a `window` (ns since the trace's
/// origin, as `ts` * 1000), only the parts of the slices inside it count and it is the window of
/// every device (an op's overlap, not the whole run's).
[[nodiscard]] trace_summary summarize_trace(
    const std::string& path, std::optional<profiler::interval> window = std::nullopt);
/// summarize_trace in several windows at once (their union; one op's runs, say): each slice
/// counts by its parts inside them, and every device's window is the union's length. With
/// `each`, trace_summary::each also holds every window's own analysis (windows that overlap or
/// touch are merged first, and count as one). Throws invalid_argument if `windows` holds no time
/// (a window that ends before it begins included).
[[nodiscard]] trace_summary summarize_trace(const std::string& path,
                                            std::vector<profiler::interval> windows,
                                            bool each = false);

/// Where the complete (X) slices of one name lie in a trace: a scope (POOLSCOPE_SCOPE), a
/// darray op, a demo step — the windows for summarize_trace, as `poolscope trace summary --range`
/// uses them.
struct trace_ranges {
  std::vector<profiler::interval>
      found;  ///< each slice named as asked, [ts, ts + dur) in ns, file order
  /// The names of the trace's host slices (X events without a "device" in args, CUDA API calls
  /// left out), most frequent first, at most `max_names`: what could have been asked for.
  std::vector<std::string> host_names;
};
/// Reads the trace at `path` (plain or gzip, streamed) for the slices named `name` (exactly).
/// Slices whose times cannot be read are skipped (`trace check` names them). Throws
/// runtime_error if the file cannot be read or parsed.
[[nodiscard]] trace_ranges find_trace_ranges(const std::string& path, std::string_view name,
                                             std::size_t max_names = 20);

}  // namespace poolscope::analysis
