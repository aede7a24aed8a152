// Logging from the pool's paths that may run while the host is out of memory (deallocation,
// destructors, exiting threads): the message is formatted into a stack buffer (at most 511
// characters kept), so logging allocates nothing here and never throws.
#pragma once

#include <cstdarg>
#include <cstdio>

#include "poolscope/log.hpp"

namespace poolscope::pool::detail {

/// printf-style; does nothing when `level` is not enabled.
[[gnu::format(printf, 2, 3)]] inline void log_fixed(log_level level, const char* format,
                                                    ...) noexcept {
  if (!log_enabled(level)) {
    return;
  }
  char text[512];
  va_list args;
  va_start(args, format);
  (void)std::vsnprintf(text, sizeof text, format, args);
  va_end(args);
  log(level, text);
}

}  // namespace poolscope::pool::detail
