// Size rounding shared by the allocator base and the strategies.
#pragma once

#include <cstddef>

namespace poolscope::pool::detail {

/// `n` rounded up to a multiple of `m` (m > 0). No overflow for the sizes the pools see: requests
/// are at most max_request_bytes (allocator.hpp).
constexpr std::size_t round_up(std::size_t n, std::size_t m) noexcept {
  return (n + m - 1) / m * m;
}

}  // namespace poolscope::pool::detail
