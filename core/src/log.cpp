#include "poolscope/log.hpp"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
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
  // set_log_sink called from inside the sink: applied once the sink returns (the running
  // std::function must not be destroyed under its own feet).
  std::optional<log_sink> replacement;
};
sink_state& sink() {
  static auto* s = new sink_state;  // leaked: logging may happen during static destruction
  return *s;
}

/// Both made when the library loads, not at the first log() call: a first call that reports
/// the host running out of memory could not make them (and its line would be lost).
[[maybe_unused]] const bool g_made_at_load = (threshold(), sink(), true);

/// True while this thread runs the sink (and so holds sink_state::mutex): a nested log() or
/// set_log_sink() must not take the mutex again.
thread_local bool t_in_sink = false;

const char* name(log_level l) noexcept {
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

/// One whole line on stderr. Allocates nothing: a collector that has to give up because the host
/// is out of memory says so through here, and that line must not be lost too. A line that fits
/// the stack buffer goes out in a single write; a longer one in pieces under stderr's lock, so
/// no other stdio output of this process lands inside it.
void write_stderr(log_level level, std::string_view message) noexcept {
  const std::string_view prefix = "[poolscope ";
  const std::string_view level_name = name(level);
  const std::string_view after = "] ";
  char line[1024];
  const std::size_t total = prefix.size() + level_name.size() + after.size() + message.size() + 1;
  if (total <= sizeof line) {
    char* out = line;
    for (const std::string_view part : {prefix, level_name, after, message}) {
      std::memcpy(out, part.data(), part.size());
      out += part.size();
    }
    *out++ = '\n';
    std::fwrite(line, 1, total, stderr);
    return;
  }
  ::flockfile(stderr);
  for (const std::string_view part : {prefix, level_name, after, message}) {
    ::fwrite_unlocked(part.data(), 1, part.size(), stderr);
  }
  ::fputc_unlocked('\n', stderr);
  ::funlockfile(stderr);
}

/// Sets t_in_sink for the duration of one sink call, exceptions included.
class in_sink_scope {
 public:
  in_sink_scope() noexcept { t_in_sink = true; }
  in_sink_scope(const in_sink_scope&) = delete;
  in_sink_scope& operator=(const in_sink_scope&) = delete;
  ~in_sink_scope() { t_in_sink = false; }
};

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
    if (t_in_sink) {
      // Logged from inside the sink (directly or through code it calls): this thread already
      // holds the mutex, and calling the sink again could recurse without end.
      write_stderr(level, message);
      return;
    }
    auto& s = sink();
    std::lock_guard lock(s.mutex);
    if (s.sink) {
      try {
        const in_sink_scope in_sink;
        s.sink(level, message);
      } catch (...) {
        // A failing sink (one that allocates, with the host out of memory) must neither take the
        // program down nor lose the line: it goes to stderr, which allocates nothing. A
        // replacement the sink asked for still holds.
        write_stderr(level, message);
      }
      if (s.replacement) {
        s.sink = std::move(*s.replacement);
        s.replacement.reset();
      }
      return;
    }
    write_stderr(level, message);
  } catch (...) {
    // No memory for the line: nothing more can be done.
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
  if (t_in_sink) {
    st.replacement = std::move(s);  // this thread holds the mutex; applied when the sink returns
    return;
  }
  std::lock_guard lock(st.mutex);
  st.sink = std::move(s);
}

}  // namespace poolscope
