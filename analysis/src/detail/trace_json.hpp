// How trace readers take a trace's fields: shared by `trace check` and `trace summary`, so that
// what one demands the other reads. Internal. Nothing here throws.
#pragma once

#include <climits>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>

namespace poolscope::analysis::detail {

/// A trace's device id (args "device", "src_device", "dst_device"), as `trace summary` reads it
/// and `trace check` demands it: an integer from -1 (the host) to INT_MAX; nullopt otherwise.
inline std::optional<int> trace_device_id(const nlohmann::json& v) noexcept {
  if (v.is_number_unsigned()) {
    const auto u = v.get<std::uint64_t>();
    return u <= static_cast<std::uint64_t>(INT_MAX) ? std::optional<int>(static_cast<int>(u))
                                                    : std::nullopt;
  }
  if (v.is_number_integer()) {
    const auto i = v.get<std::int64_t>();
    return i >= -1 && i <= INT_MAX ? std::optional<int>(static_cast<int>(i)) : std::nullopt;
  }
  return std::nullopt;
}

}  // namespace poolscope::analysis::detail
