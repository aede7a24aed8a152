// poolscope's diagnostic log: one line per message on stderr, prefixed "[poolscope <level>]".
//
//   poolscope::log(poolscope::log_level::warn, "double free of 0x7f..0 (bfc/host)");
//
// The threshold comes from POOLSCOPE_LOG=off|error|warn|info|debug (any case; default warn, and an
// unrecognised value is reported once on stderr) or set_log_level.
// A sink can replace stderr (tests capture messages that way).
// Thread safety: all functions are thread-safe; a message is written whole. Never throws.
// The sink is called under a lock, one message at a time, so it need not be thread-safe itself,
// and once set_log_sink (called outside a sink) returns, the previous sink is neither running nor
// called again. Re-entrancy: a sink may call log() and set_log_sink() (itself or through code it
// calls) without deadlocking: a message logged from inside the sink goes straight to stderr, and a
// sink set from inside the sink takes over once the running sink returns. A sink must not wait for
// another thread that logs (that thread waits for the sink).
#pragma once

#include <functional>
#include <string_view>

namespace poolscope {

enum class log_level : int { off = 0, error = 1, warn = 2, info = 3, debug = 4 };

/// Writes `message` if `level` is at or under the threshold. noexcept: a message the sink fails
/// on (throws) goes to stderr instead, written without allocating.
void log(log_level level, std::string_view message) noexcept;
/// True if a message at `level` would be written (check before building an expensive message).
[[nodiscard]] bool log_enabled(log_level level) noexcept;
void set_log_level(log_level level) noexcept;
[[nodiscard]] log_level get_log_level() noexcept;

/// Receives every written message instead of stderr.
using log_sink = std::function<void(log_level, std::string_view)>;
/// Installs `sink`; an empty function restores stderr. Called from inside the sink, it takes
/// effect when the running sink returns.
void set_log_sink(log_sink sink);

}  // namespace poolscope
