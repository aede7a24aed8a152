// transfer_slices: how a transfer between devices appears in a trace, for both backends. A
// transfer's slice is named after it and its ends ("darray.copy 0->1 0.25 MiB", "darray.send 0->3
// 0.25 MiB", "darray.receive 0->3 0.25 MiB", "darray.copy local 0.25 MiB" within a device) and
// carries args device, src_device and dst_device (darray's device numbers over every rank).
// `poolscope trace merge` joins each "darray.send" slice to its "darray.receive" slice on the
// other rank by those names and ends (analysis/trace_merge.hpp), so every transfer with another
// rank — on host devices, by NCCL or by MPI staging on GPUs — is traced here, one way.
//
// Categories: on host devices a transfer's slice is the device's transfer time
// ("darray.transfer", counted in the overlap analysis). On GPUs the device's transfer time is
// CUPTI's (its copies and NCCL kernels, on CUDA's device ids), so a piece between ranks — by MPI
// staging the worker's MPI transfer, by NCCL its work's span on the GPU (gpu_spans.hpp) — takes
// rank_piece_category, which no overlap analysis counts.
//
// Ownership: plain functions. Thread safety: reentrant (the timeline is thread-safe). Cost: a
// label (one string) and the timeline's add_host_slice, only while a timeline is attached.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace poolscope::profiler {
class timeline;
}  // namespace poolscope::profiler

namespace poolscope::darray::detail {

/// The category of the host-side ends of a GPU's piece between ranks (not device time).
inline constexpr std::string_view rank_piece_category = "darray.piece";

/// A transfer as its slice names it.
struct transfer_ends {
  std::string_view name;  ///< "darray.copy", "darray.send", "darray.receive" (process lifetime)
  int src_device = -1;    ///< darray's numbers over every rank; both -1: within one device
  int dst_device = -1;
  std::uint64_t bytes = 0;
};

/// This rank's end of a transfer with another rank: a send from (or a receive to) device
/// `device`, with device `peer_device` of the other rank (darray's numbers over every rank).
[[nodiscard]] constexpr transfer_ends rank_transfer_ends(bool sending, int device, int peer_device,
                                                         std::uint64_t bytes) noexcept {
  return sending ? transfer_ends{"darray.send", device, peer_device, bytes}
                 : transfer_ends{"darray.receive", peer_device, device, bytes};
}

/// The device whose end `t` is on this rank (rank_transfer_ends's `device`).
[[nodiscard]] constexpr int this_end(const transfer_ends& t) noexcept {
  return t.name == "darray.send" ? t.src_device : t.dst_device;
}

/// "darray.send 0->3 0.25 MiB", or "darray.copy local 0.25 MiB" without ends.
[[nodiscard]] std::string transfer_label(const transfer_ends& t);

/// Adds to `tl` the slice of transfer `t` from `begin_ns` to `end_ns` (hooks::now_ns), made on
/// (or for) `device` in `category`, on the track of host thread `thread` (0: the calling
/// thread's), a track of the caller's named `track_name` where `thread` is no thread;
/// `clock_error_ns`: how far the times may be off the host clock (a GPU's span; host_slice).
/// Never throws: without memory for the label the slice goes by `t.name`.
void add_transfer_slice(profiler::timeline& tl, const transfer_ends& t, int device,
                        std::string_view category, std::uint64_t begin_ns, std::uint64_t end_ns,
                        std::uint64_t thread = 0, std::string_view track_name = {},
                        std::uint64_t clock_error_ns = 0) noexcept;

}  // namespace poolscope::darray::detail
