// The slices of transfers between devices (transfer_slices.hpp).
#include "transfer_slices.hpp"

#include <cstdio>

#include "poolscope/profiler/timeline.hpp"

namespace poolscope::darray::detail {

std::string transfer_label(const transfer_ends& t) {
  char size[32];
  std::snprintf(size, sizeof size, "%.2f MiB", static_cast<double>(t.bytes) / (1024.0 * 1024.0));
  return t.src_device >= 0 ? std::string(t.name) + " " + std::to_string(t.src_device) + "->" +
                                 std::to_string(t.dst_device) + " " + size
                           : std::string(t.name) + " local " + size;
}

void add_transfer_slice(profiler::timeline& tl, const transfer_ends& t, int device,
                        std::string_view category, std::uint64_t begin_ns, std::uint64_t end_ns,
                        std::uint64_t thread, std::string_view track_name,
                        std::uint64_t clock_error_ns) noexcept {
  std::string label;
  try {
    label = transfer_label(t);
  } catch (...) {  // no memory for the label: the slice goes by the transfer's name
  }
  tl.add_host_slice({.name = label.empty() ? t.name : std::string_view(label),
                     .category = category,
                     .thread = thread,
                     .track_name = track_name,
                     .begin_ns = begin_ns,
                     .end_ns = end_ns,
                     .device = device,
                     .src_device = t.src_device,
                     .dst_device = t.dst_device,
                     .clock_error_ns = clock_error_ns});
}

}  // namespace poolscope::darray::detail
