// poolscope's diagnostic log: one line per message on stderr, prefixed "[poolscope <level>]".
//
//   poolscope::log(poolscope::log_level::warn, "double free of 0x7f..0 (bfc/host)");
//
// The threshold comes from POOLSCOPE_LOG=off|error|warn|info|debug (any case; default warn, and an
// unrecognised value is reported once on stderr) or set_log_level.
// A sink can replace stderr (tests capture messages that way).
// Thread safety: all functions are thread-safe; a message is written whole. Never throws.
#pragma once

#include <functional>
#include <string_view>

namespace poolscope {

enum class log_level : int { off = 0, error = 1, warn = 2, info = 3, debug = 4 };

/// Writes `message` if `level` is at or under the threshold. noexcept: a failing sink is ignored.
void log(log_level level, std::string_view message) noexcept;
/// True if a message at `level` would be written (check before building an expensive message).
[[nodiscard]] bool log_enabled(log_level level) noexcept;
void set_log_level(log_level level) noexcept;
[[nodiscard]] log_level get_log_level() noexcept;

/// Receives every written message instead of stderr; an empty function restores stderr.
using log_sink = std::function<void(log_level, std::string_view)>;
void set_log_sink(log_sink sink);

}  // namespace poolscope
