// overlap: how much of a device's data movement was hidden behind its compute.
//
//   poolscope::profiler::overlap_analyzer a;
//   a.add(0, activity_class::compute, 100, 400);     // a kernel on device 0, ns
//   a.add(0, activity_class::transfer, 300, 600);    // a copy
//   auto d = a.analyze().front();
//   // d.compute_ns 300, d.transfer_ns 300, d.both_ns 100, d.overlap_ratio 1/3,
//   // d.busy_ns 500, d.idle_ns = window - 500
//
// The timeline runs it live; trace_summary.hpp runs it over a written trace.
//
// Classes (docs/trace.md): compute = kernels (cat "kernel") and host slices of category
// "darray.compute"; transfer = copies of every kind, peer copies included (cat "memcpy"), NCCL
// kernels (cat "nccl": names starting "ncclDevKernel" or "ncclKernel") and host slices of
// category "darray.transfer" (a peer copy counts as transfer on both its source and destination
// device); other = memsets (cat "memset": the device is busy, nothing moves
// between memories). Per device, each class's intervals are merged (their union), so concurrent
// kernels on several streams count once:
// - compute_ns, transfer_ns: length of each union;
// - both_ns: length of (compute union) intersected with (transfer union);
// - overlap_ratio = both_ns / transfer_ns: the share of transfer time hidden behind compute
//   (0 when there is no transfer);
// - busy_ns: length of the union of all three classes; idle_ns = window - busy_ns, where the
//   window is the run's (the timeline's start..stop, or a trace's first..last timestamp).
//
// Ownership: plain values. Thread safety: overlap_analyzer is not thread-safe (the timeline
// guards its own); the functions are reentrant. Cost: add is amortised O(1); when a device's list
// reaches its compaction threshold it is sorted and merged in place (O(n log n)), so memory
// follows the number of gaps, not of operations; analyze is O(n log n).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace poolscope::profiler {

/// What a device activity does for the overlap analysis.
enum class activity_class : std::uint8_t { compute, transfer, other };
/// "compute", "transfer", "other".
[[nodiscard]] std::string_view to_string(activity_class c) noexcept;

/// The class of a trace category: "kernel" and "darray.compute" -> compute; "memcpy", "nccl"
/// and "darray.transfer" -> transfer; "memset" -> other; anything else -> nullopt (not counted).
[[nodiscard]] std::optional<activity_class> classify_category(std::string_view cat) noexcept;
/// True for NCCL's kernels: the (demangled) name starts with "ncclDevKernel" or "ncclKernel".
[[nodiscard]] bool is_nccl_kernel(std::string_view name) noexcept;

/// A half-open time interval [begin_ns, end_ns).
struct interval {
  std::int64_t begin_ns = 0;
  std::int64_t end_ns = 0;
  /// end_ns - begin_ns for end_ns >= begin_ns: exact in unsigned arithmetic even where the
  /// signed difference passes INT64_MAX (times either side of the origin).
  [[nodiscard]] std::uint64_t length() const noexcept {
    return static_cast<std::uint64_t>(end_ns) - static_cast<std::uint64_t>(begin_ns);
  }
  friend bool operator==(const interval&, const interval&) = default;
};

/// The union of `v`: sorted, disjoint, non-touching intervals (empty ones dropped).
[[nodiscard]] std::vector<interval> merge_intervals(std::vector<interval> v);
/// Total length of disjoint intervals.
[[nodiscard]] std::uint64_t total_length(std::span<const interval> merged) noexcept;
/// The intersection of two unions (each as merge_intervals returns).
[[nodiscard]] std::vector<interval> intersect_intervals(std::span<const interval> a,
                                                        std::span<const interval> b);

/// The analysis of one device (device -1: host-side work that named no device).
struct device_overlap {
  int device = 0;
  std::uint64_t window_ns = 0;    ///< the run's window
  std::int64_t first_ns = 0;      ///< start of the device's first activity
  std::int64_t last_ns = 0;       ///< end of its last activity
  std::uint64_t compute_ns = 0;   ///< union of compute intervals
  std::uint64_t transfer_ns = 0;  ///< union of transfer intervals
  std::uint64_t other_ns = 0;     ///< union of other intervals
  std::uint64_t both_ns = 0;      ///< compute and transfer both active
  std::uint64_t busy_ns = 0;      ///< union of everything
  std::uint64_t idle_ns = 0;      ///< window_ns - busy_ns (0 if the activity spills past it)
  std::uint64_t compute_ops = 0;  ///< intervals added per class
  std::uint64_t transfer_ops = 0;
  std::uint64_t other_ops = 0;
  double overlap_ratio = 0.0;  ///< both_ns / transfer_ns; 0 without transfers

  [[nodiscard]] nlohmann::json to_json() const;
  friend bool operator==(const device_overlap&, const device_overlap&) = default;
};

/// Collects intervals per device and class and computes device_overlap. See the file comment.
class overlap_analyzer {
 public:
  /// `max_intervals`: intervals kept in all (after merging); beyond it, added ones are counted
  /// in dropped() and left out. `compact_at`: a device's list is merged when it reaches this.
  explicit overlap_analyzer(std::size_t max_intervals = std::size_t{1} << 22,
                            std::size_t compact_at = std::size_t{1} << 16);

  /// Adds [begin_ns, end_ns) of class `c` on `device`. Empty or reversed intervals count as an
  /// operation but add no time.
  /// `ops`: the operations it stands for (0 for a further part of one already counted, as when a
  /// slice is cut into the parts that lie inside several windows).
  void add(int device, activity_class c, std::int64_t begin_ns, std::int64_t end_ns,
           std::uint64_t ops = 1);
  /// Sets the window idle time is measured in; without it, the window is the span from the
  /// earliest to the latest activity over all devices.
  void set_window(std::int64_t begin_ns, std::int64_t end_ns) noexcept;
  /// Sets several windows (their union; set_window's one is then unused): each device's window_ns
  /// is the union's length and only busy time inside it counts against it.
  void set_windows(std::vector<interval> windows);
  /// One entry per device that had activity, by device id.
  [[nodiscard]] std::vector<device_overlap> analyze() const;
  /// Intervals left out because max_intervals was reached.
  [[nodiscard]] std::uint64_t dropped() const noexcept { return dropped_; }
  /// Intervals held now (after compaction).
  [[nodiscard]] std::size_t held() const noexcept { return held_; }

 private:
  struct lists {
    std::vector<interval> of[3];
    std::uint64_t ops[3] = {0, 0, 0};
  };
  void compact(std::vector<interval>& v);

  std::size_t max_intervals_;
  std::size_t compact_at_;
  std::map<int, lists> devices_;
  std::size_t held_ = 0;
  std::uint64_t dropped_ = 0;
  std::optional<interval> window_;
  std::vector<interval> windows_;  // set_windows' union; empty: window_ or the activity's span
  std::int64_t min_ns_ = INT64_MAX;
  std::int64_t max_ns_ = INT64_MIN;
};

/// One kind of operation summed: a kernel name or a copy kind on a device.
struct op_summary {
  std::string name;      ///< kernel name, or "Memcpy HtoD", "Memset", ...
  std::string category;  ///< "kernel", "nccl", "memcpy", "memset"
  int device = 0;
  std::uint64_t count = 0;
  std::uint64_t total_ns = 0;
  std::uint64_t min_ns = 0;
  std::uint64_t max_ns = 0;
  std::uint64_t bytes = 0;  ///< copies and memsets: bytes moved or set

  /// Adds one operation.
  void add(std::uint64_t dur_ns, std::uint64_t op_bytes) noexcept;
  /// Mean duration.
  [[nodiscard]] double mean_ns() const noexcept;
  /// Bytes per ns over the summed time, which is GB/s (10^9 B/s); 0 without time.
  [[nodiscard]] double gbps() const noexcept;
  [[nodiscard]] nlohmann::json to_json() const;
};

}  // namespace poolscope::profiler
