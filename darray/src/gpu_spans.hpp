// gpu_spans: the slices of a CUDA backend's transfers with other ranks (NCCL's, and the copies
// through CUDA IPC), timed on the GPU. The host call that enqueues an ncclSend or ncclRecv (or an
// IPC receive) returns at once, and a rank often enqueues a receive before its peer has enqueued
// the send, so host-side slices of those calls could end before the piece left its sender and
// `trace merge` could not join them. Here each such transfer is bracketed by two timing events on
// its stream; once the GPU has passed the second, its span (when the transfer ran, waiting for the
// peer included) becomes the slice, on the host clock, on a track of the device's own (the
// transfers of a group share their stream's span).
//
// The clock: per GPU, anchor events recorded on an idle stream of their own, each one's host time
// the midpoint of its record and the moment it was seen complete (a few µs either way; the
// narrowest of up to 8 readings, as a thread taken off its core meanwhile widens one). A GPU's
// clock runs at a rate of its own, a few ppm off the host's: tens of µs over 10 s (docs/perf.md,
// "GPU clocks against the host's"), more than an anchor's error. So each GPU's anchors make a
// chain, and a GPU time is placed on the host clock linearly between the two anchors around it
// (clock_place): the drift cancels, and every span of a GPU is placed by one monotone map, so spans
// that follow each other on a stream stay in order. A span waits in flush() for an anchor recorded
// after it was seen complete, which flush() records when none is newer than anchor_interval_ns
// (or, settling, than min_anchor_gap_ns). Internal to darray; CUDA only (the GPU test of two ranks
// checks the flows of the merged trace: scripts/gpu-check.sh; the placement is tested on the CPU).
//
// Ownership: owns its events and anchor streams. Thread safety: every member may be called from
// several threads. Cost: only while a timeline is attached, two events per transfer and a query
// each time flush() looks at it, and an anchor (about 10 µs of the calling thread) per GPU with
// spans to place at most every anchor_interval_ns, or every min_anchor_gap_ns where flushes
// settle (at each synchronize).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "cuda_seam.hpp"
#include "transfer_slices.hpp"

namespace poolscope::profiler {
class timeline;
}  // namespace poolscope::profiler

namespace poolscope::darray::detail {

/// A time on the host clock, within +-error_ns.
struct host_reading {
  double ns = 0;
  double error_ns = 0;
};

/// Where a GPU event falls on the host clock, given two anchors of its GPU (events whose host
/// times `a` and `b` are known, `gpu_ab_ns` apart on the GPU's clock) and its GPU time from a
/// (`gpu_ax_ns`, negative when earlier): linear between the anchors, so a GPU clock running at a
/// steady rate other than the host's is placed exactly, up to the anchors' errors. The error is
/// |1 - w| a.error_ns + |w| b.error_ns with w = gpu_ax_ns / gpu_ab_ns: at most the larger anchor
/// error between the two, growing beyond them. With gpu_ab_ns <= 0 (no interval to measure a
/// rate on) the GPU clock counts at the host's rate from a. Pure (tested on the CPU).
[[nodiscard]] host_reading clock_map(host_reading a, host_reading b, double gpu_ab_ns,
                                     double gpu_ax_ns) noexcept;

/// An anchor of a GPU's chain: its GPU time (ns from the chain's first anchor) and host time.
struct clock_point {
  double gpu_ns = 0;
  host_reading host;
};

/// GPU time `gpu_ns` of a chain of anchors (by gpu_ns, increasing; not empty) on the host clock:
/// clock_map between the two anchors around it, or the first two (last two) before (after) the
/// chain; a chain of one counts at the host's rate. Pure (tested on the CPU).
[[nodiscard]] host_reading clock_place(const std::deque<clock_point>& chain,
                                       double gpu_ns) noexcept;

class gpu_spans {
 public:
  gpu_spans() = default;
  gpu_spans(const gpu_spans&) = delete;
  gpu_spans& operator=(const gpu_spans&) = delete;
  /// Destroys the events of spans not yet flushed (their slices are lost) and the anchors.
  ~gpu_spans();

  /// Records a timing event on `s` (a stream of CUDA device `ordinal`, current): where a span
  /// begins. Hand it to end() (which owns it from then on).
  [[nodiscard]] cudaEvent_t begin(int ordinal, cudaStream_t s);
  /// Ends the span begun by `begin` with a timing event on `s`, the stream of darray device
  /// `device`: a slice of it for each of `ends` goes to `tl` once the GPU has run it (flush()),
  /// on the device's track (track()).
  void end(int ordinal, cudaStream_t s, cudaEvent_t begin, std::vector<transfer_ends> ends,
           int device, profiler::timeline* tl);
  /// The track (a host thread id no thread has) of darray device `device`'s transfers with
  /// other ranks: its spans follow the stream, one after another or equal (a group's), so they
  /// nest there, where they would cross the issuing thread's own slices.
  [[nodiscard]] static constexpr std::uint64_t track(int device) noexcept {
    return (std::uint64_t{1} << 30) + static_cast<std::uint64_t>(device);
  }
  /// Destroys `begin` (a span whose transfer could not be enqueued).
  static void discard(cudaEvent_t begin) noexcept;
  /// Adds the slices of the spans the GPU has run to `current` when it is the timeline they were
  /// meant for (else drops them); spans still running wait for the next flush, and so do spans
  /// run with no anchor of their GPU after them unless one may be recorded now (the last is older
  /// than anchor_interval_ns) or `settle` (the caller has waited for every stream, so nothing is
  /// left for a later flush: a span after a last anchor younger than min_anchor_gap_ns is placed
  /// by the chain's last two, the error counted).
  void flush(profiler::timeline* current, bool settle);
  /// How often flush() records an anchor per GPU at most while spans complete.
  static constexpr std::uint64_t anchor_interval_ns = 20'000'000;
  /// The least time between two anchors of a chain, which their errors then barely tilt.
  static constexpr std::uint64_t min_anchor_gap_ns = 200'000;
  /// How long a chain keeps its anchors: spans older than this are placed from its oldest.
  static constexpr std::uint64_t chain_keep_ns = 60'000'000'000;

 private:
  // A GPU's clock anchor: its event and its place on the chain (host time within the window of
  // host time the event completed in). Destroys the event.
  struct anchor {
    anchor() = default;
    anchor(const anchor&) = delete;
    anchor& operator=(const anchor&) = delete;
    ~anchor();
    cudaEvent_t event = nullptr;
    std::uint64_t recorded_ns = 0;  // host time just before its record
    clock_point at;                 // on its GPU's chain
  };
  // A GPU's anchors: the chain (each anchor kept chain_keep_ns), the last one (its event measures
  // the next one's place) and the idle stream they are recorded on.
  struct gpu_clock {
    std::deque<clock_point> chain;
    std::shared_ptr<const anchor> last;
    cudaStream_t idle = nullptr;
  };
  struct span {
    std::shared_ptr<const anchor> clock;
    cudaEvent_t begin = nullptr;
    cudaEvent_t end = nullptr;
    std::vector<transfer_ends> ends;
    int device = 0;
    profiler::timeline* tl = nullptr;
    int ordinal = 0;
    std::uint64_t seen_ns = 0;  // when a flush saw it complete (0: not yet)
  };
  /// The slices of `x` (run) into `tl`, placed on its GPU's chain, after the device's last.
  void add_slices(const span& x, profiler::timeline& tl);
  /// The last anchor of `ordinal` (current), a new one when the last is older than `life_ns`.
  /// Caller holds mutex_.
  std::shared_ptr<const anchor> clock_locked(int ordinal, std::uint64_t life_ns);

  std::mutex mutex_;
  std::map<int, gpu_clock> clocks_;        // per ordinal
  std::map<int, std::uint64_t> last_end_;  // per darray device: where its last slice ended
  std::vector<span> spans_;                // in the order they ended
};

}  // namespace poolscope::darray::detail
