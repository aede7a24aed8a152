// JSON helpers shared by the profiler's loaders and the trace tools. Internal.
// Nothing here throws beyond std::bad_alloc.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace poolscope::profiler::detail {

/// `v` for a message: a scalar as its JSON text (invalid UTF-8 replaced), an array or an object by
/// its type — dump() recurses once per level, and a crafted value may be nested 100,000 deep.
inline std::string json_shown(const nlohmann::json& v) {
  return v.is_structured() ? std::string("an ") + v.type_name()
                           : v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace poolscope::profiler::detail
