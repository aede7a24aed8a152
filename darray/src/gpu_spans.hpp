// gpu_spans: the slices of a CUDA backend's transfers with other ranks (NCCL's, and the copies
// through CUDA IPC), timed on the GPU. The host call that enqueues an ncclSend or ncclRecv (or an
// IPC receive) returns at once, and a rank often enqueues a receive before its peer has enqueued
// the send, so host-side slices of those calls could end before the piece left its sender and
// `trace merge` could not join them. Here each such transfer is bracketed by two timing events on
// its stream; once the GPU has passed the second, its span (when the transfer ran, waiting for the
// peer included) becomes the slice, on the host clock, on a track of the device's own (the
// transfers of a group share their stream's span).
//
// The clock: per GPU an anchor event recorded on an idle stream of its own, its host time the
// midpoint of the record and the moment it was seen complete (a few µs either way; the narrowest of
// up to 8 readings, as a thread taken off its core meanwhile widens one), renewed every
// 10 s so that cudaEventElapsedTime's float milliseconds keep microseconds. Internal to darray;
// CUDA only (the GPU test of two ranks checks the flows of the merged trace: scripts/gpu-check.sh).
//
// Ownership: owns its events and anchor streams. Thread safety: every member may be called from
// several threads. Cost: only while a timeline is attached, two events per transfer and a query
// each time flush() looks at it.
#pragma once

#include <cstdint>
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
  /// meant for (else drops them); spans still running wait for the next flush.
  void flush(profiler::timeline* current);

 private:
  // A GPU's clock anchor: its event's host time, within +-error_ns (half the window of host time
  // the event completed in). Destroys the event.
  struct anchor {
    anchor() = default;
    anchor(const anchor&) = delete;
    anchor& operator=(const anchor&) = delete;
    ~anchor();
    cudaEvent_t event = nullptr;
    std::uint64_t host_ns = 0;
    std::uint64_t error_ns = 0;
  };
  struct span {
    std::shared_ptr<const anchor> clock;
    cudaEvent_t begin = nullptr;
    cudaEvent_t end = nullptr;
    std::vector<transfer_ends> ends;
    int device = 0;
    profiler::timeline* tl = nullptr;
  };
  /// The anchor of `ordinal`, renewed when older than 10 s. Caller holds mutex_.
  std::shared_ptr<const anchor> clock_locked(int ordinal);

  std::mutex mutex_;
  std::map<int, cudaStream_t> idle_;                      // per ordinal: the anchors' stream
  std::map<int, std::shared_ptr<const anchor>> anchors_;  // per ordinal
  std::vector<span> spans_;                               // in the order they ended
};

}  // namespace poolscope::darray::detail
