#include "poolscope/log.hpp"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <utility>

namespace poolscope {
namespace {

/// `v` equals `name` ignoring ASCII case ("ERROR" and "Error" mean "error").
bool equals_ignoring_case(const char* v, const char* name) noexcept {
  for (; *v != '\0' && *name != '\0'; ++v, ++name) {
    const char c = *v >= 'A' && *v <= 'Z' ? static_cast<char>(*v - 'A' + 'a') : *v;
    if (c != *name) {
      return false;
    }
  }
  return *v == '\0' && *name == '\0';
}

/// The threshold POOLSCOPE_LOG asks for. An unrecognised value keeps the default (warn) and
/// says so once on stderr, naming the value: a POOLSCOPE_LOG=none or =quiet meant to silence
/// poolscope must not be ignored without a word. Written directly (not through log()): this
/// runs while the threshold itself is being initialised.
log_level level_from_env() noexcept {
  const char* v = std::getenv("POOLSCOPE_LOG");
  if (v == nullptr || *v == '\0') {
    return log_level::warn;
  }
  static constexpr std::pair<const char*, log_level> names[] = {
      {"off", log_level::off},   {"error", log_level::error}, {"warn", log_level::warn},
      {"info", log_level::info}, {"debug", log_level::debug},
  };
  for (const auto& [name, level] : names) {
    if (equals_ignoring_case(v, name)) {
      return level;
    }
  }
  try {
    const std::string line = "[poolscope warn] POOLSCOPE_LOG='" + std::string(v) +
                             "' is not one of off|error|warn|info|debug; using warn\n";
    std::fwrite(line.data(), 1, line.size(), stderr);
  } catch (...) {
  }
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
