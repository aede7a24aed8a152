// The helpers of array_state.hpp.
#include "array_state.hpp"

#include <algorithm>
#include <map>
#include <string>

#include "poolscope/error.hpp"

namespace poolscope::darray::detail {

reduce_op op_of(array_mode m) {
  switch (m) {
    case array_mode::sum:
      return reduce_op::sum;
    case array_mode::prod:
      return reduce_op::prod;
    case array_mode::max:
      return reduce_op::max;
    case array_mode::min:
      return reduce_op::min;
    case array_mode::replica:
      break;
  }
  throw logic_error("darray: a replica array has no reduction");
}

std::vector<chunk_ref> refs_of(const std::vector<chunk>& chunks) {
  std::vector<chunk_ref> out;
  out.reserve(chunks.size());
  std::map<int, std::size_t> next;
  for (const auto& c : chunks) {
    out.push_back(chunk_ref{c.device, next[c.device]++, c.region});
  }
  return out;
}

std::vector<chunk> chunks_of(const darray::index_map& map) {
  std::vector<chunk> out;
  for (const auto& r : map.chunks()) {
    out.push_back(chunk{r.device, r.region, {}});
  }
  return out;
}

view view_of(const chunk_part& p, const box& region) {
  return view::of_box(p.storage->data(), p.storage_box, region);
}

std::optional<std::int64_t> bytes_of(std::int64_t elements, dtype t) noexcept {
  std::int64_t bytes = 0;
  if (__builtin_mul_overflow(elements, static_cast<std::int64_t>(size_of(t)), &bytes)) {
    return std::nullopt;
  }
  return bytes;
}

std::shared_ptr<buffer> dense_buffer(backend& be, int device, const box& b, dtype t,
                                     std::optional<queue_kind> first_use) {
  // box::size() saturates at INT64_MAX, which bytes_of rejects too.
  const std::optional<std::int64_t> bytes = bytes_of(b.size(), t);
  if (!bytes) {
    throw invalid_argument("darray: a chunk " + b.to_string() + " of " + std::string(to_string(t)) +
                           " holds more than INT64_MAX bytes");
  }
  const auto n = static_cast<std::size_t>(std::max<std::int64_t>(*bytes, 1));
  return first_use ? be.allocate(device, n, *first_use) : be.allocate(device, n);
}

}  // namespace poolscope::darray::detail
