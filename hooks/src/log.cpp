#include "poolscope/log.hpp"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

namespace poolscope {
namespace {

log_level level_from_env() noexcept {
  const char* v = std::getenv("POOLSCOPE_LOG");
  if (v == nullptr) {
    return log_level::warn;
  }
  if (std::strcmp(v, "off") == 0)
    return log_level::off;
  if (std::strcmp(v, "error") == 0)
    return log_level::error;
  if (std::strcmp(v, "info") == 0)
    return log_level::info;
  if (std::strcmp(v, "debug") == 0)
    return log_level::debug;
  return log_level::warn;
}

std::atomic<int>& threshold() {
  static std::atomic<int> t{static_cast<int>(level_from_env())};
  return t;
}

struct sink_state {
  std::mutex mutex;
  log_sink sink;
};
sink_state& sink() {
  static auto* s = new sink_state;  // leaked: logging may happen during static destruction
  return *s;
}

const char* name(log_level l) {
  switch (l) {
    case log_level::error:
      return "error";
    case log_level::warn:
      return "warn";
    case log_level::info:
      return "info";
    case log_level::debug:
      return "debug";
    case log_level::off:
      break;
  }
  return "off";
}

}  // namespace

bool log_enabled(log_level level) noexcept {
  return level != log_level::off &&
         static_cast<int>(level) <= threshold().load(std::memory_order_relaxed);
}

void log(log_level level, std::string_view message) noexcept {
  if (!log_enabled(level)) {
    return;
  }
  try {
    auto& s = sink();
    std::lock_guard lock(s.mutex);
    if (s.sink) {
      s.sink(level, message);
      return;
    }
    std::string line = "[poolscope ";
    line += name(level);
    line += "] ";
    line.append(message);
    line += '\n';
    std::fwrite(line.data(), 1, line.size(), stderr);
  } catch (...) {
    // A failing sink must not take the program down.
  }
}

void set_log_level(log_level level) noexcept {
  threshold().store(static_cast<int>(level), std::memory_order_relaxed);
}
log_level get_log_level() noexcept {
  return static_cast<log_level>(threshold().load(std::memory_order_relaxed));
}
void set_log_sink(log_sink s) {
  auto& st = sink();
  std::lock_guard lock(st.mutex);
  st.sink = std::move(s);
}

}  // namespace poolscope
