// JSON helpers shared by the profiler's loaders and trace tools. Internal.
// Nothing here throws beyond std::bad_alloc.
#pragma once

#include <climits>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace poolscope::profiler::detail {

/// `v` for a message: a scalar as its JSON text (invalid UTF-8 replaced), an array or an object by
/// its type — dump() recurses once per level, and a crafted value may be nested 100,000 deep.
inline std::string json_shown(const nlohmann::json& v) {
  return v.is_structured() ? std::string("an ") + v.type_name()
                           : v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

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

}  // namespace poolscope::profiler::detail
