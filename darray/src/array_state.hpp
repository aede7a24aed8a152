// The state behind an array handle, and the helpers that the ops (distributed_array.cpp) and the
// reshard executor (reshard_executor.cpp) share. Internal to darray.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "poolscope/darray/distributed_array.hpp"

namespace poolscope::darray::detail {

struct array_state {
  std::shared_ptr<backend> be;
  dtype type = dtype::f32;
  shape_t shape;
  darray::index_map map;
  array_mode mode = array_mode::replica;
  std::vector<chunk> chunks;  // in map.chunks() order
  reshard_info info;
};

/// The reduction of a partial mode. Throws logic_error for replica.
[[nodiscard]] reduce_op op_of(array_mode m);
/// Each chunk as the planner sees it: its device, its index among that device's chunks, its box.
[[nodiscard]] std::vector<chunk_ref> refs_of(const std::vector<chunk>& chunks);
/// Empty chunks for every box of `map`, in map.chunks() order.
[[nodiscard]] std::vector<chunk> chunks_of(const darray::index_map& map);
/// The elements `region` of part `p` (inside its storage box).
[[nodiscard]] view view_of(const chunk_part& p, const box& region);
/// The bytes of `elements` of `t`, or nullopt when they exceed INT64_MAX (the planner and the
/// backends count bytes in int64, and a size_t product would wrap around to a small buffer).
[[nodiscard]] std::optional<std::int64_t> bytes_of(std::int64_t elements, dtype t) noexcept;
/// A buffer for `b` of `t` on `device`. `first_use`: the queue of `device` the buffer is first
/// written on (work enqueued after this call), which lets the backend hand over a buffer dropped
/// with its uses pending on that queue (backend::allocate); nullopt when it is not known.
[[nodiscard]] std::shared_ptr<buffer> dense_buffer(
    backend& be, int device, const box& b, dtype t,
    std::optional<queue_kind> first_use = std::nullopt);

}  // namespace poolscope::darray::detail
