#include "poolscope/analysis/event_log.hpp"

#include <algorithm>
#include <charconv>
#include <fstream>
#include <istream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

namespace poolscope::analysis {

using profiler::action_name;

parse_error::parse_error(std::string source, std::size_t line, const std::string& what)
    : runtime_error("poolscope: " + source + ":" + std::to_string(line) + ": " + what),
      source_(std::move(source)),
      line_(line) {}

std::string_view to_string(log_format f) noexcept {
  switch (f) {
    case log_format::poolscope:
      return "poolscope";
    case log_format::jsonl_hook:
      return "jsonl_hook";
    case log_format::rmm_csv:
      return "rmm_csv";
    case log_format::memory_snapshot:
      return "memory_snapshot";
  }
  return "unknown";
}

namespace {

constexpr hooks::event_kind all_kinds[] = {
    hooks::event_kind::pool_malloc,  hooks::event_kind::pool_free, hooks::event_kind::device_alloc,
    hooks::event_kind::device_free,  hooks::event_kind::split,     hooks::event_kind::merge,
    hooks::event_kind::release,      hooks::event_kind::oom,       hooks::event_kind::limit_hit,
    hooks::event_kind::invalid_free,
};

bool kind_from_action(std::string_view name, hooks::event_kind& out) noexcept {
  for (auto k : all_kinds) {
    if (action_name(k) == name) {
      out = k;
      return true;
    }
  }
  return false;
}

bool kind_from_event_name(std::string_view name, hooks::event_kind& out) noexcept {
  for (auto k : all_kinds) {
    if (hooks::to_string(k) == name) {
      out = k;
      return true;
    }
  }
  return false;
}

bool phase_from_name(std::string_view name, hooks::event_phase& out) noexcept {
  for (auto p : {hooks::event_phase::pre, hooks::event_phase::post, hooks::event_phase::instant}) {
    if (hooks::to_string(p) == name) {
      out = p;
      return true;
    }
  }
  return false;
}

/// The phase a one-line-per-operation log writes for `k` (used when a line has no phase).
hooks::event_phase default_phase(hooks::event_kind k) noexcept {
  switch (k) {
    case hooks::event_kind::pool_malloc:
    case hooks::event_kind::device_alloc:
    case hooks::event_kind::release:
      return hooks::event_phase::post;
    case hooks::event_kind::pool_free:
    case hooks::event_kind::device_free:
      return hooks::event_phase::pre;
    default:
      return hooks::event_phase::instant;
  }
}

std::string_view trim(std::string_view s) noexcept {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) {
    s.remove_prefix(1);
  }
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) {
    s.remove_suffix(1);
  }
  return s;
}

bool parse_dec(std::string_view s, std::uint64_t& out) noexcept {
  s = trim(s);
  if (s.empty()) {
    return false;
  }
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out, 10);
  return ec == std::errc{} && p == s.data() + s.size();
}

/// "0x7f..", "0X..", bare hex digits, "(nil)", "nullptr".
bool parse_pointer(std::string_view s, std::uint64_t& out) noexcept {
  s = trim(s);
  if (s == "(nil)" || s == "nullptr" || s == "NULL") {
    out = 0;
    return true;
  }
  if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
    s.remove_prefix(2);
  }
  if (s.empty()) {
    return false;
  }
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out, 16);
  return ec == std::errc{} && p == s.data() + s.size();
}

/// Reads lines, keeping the 1-based number and whether the line ended with a newline.
class line_reader {
 public:
  explicit line_reader(std::istream& in) : in_(in) {}
  bool next(std::string& line) {
    if (!std::getline(in_, line)) {
      return false;
    }
    ++number_;
    terminated_ = !in_.eof();
    return true;
  }
  [[nodiscard]] std::size_t number() const noexcept { return number_; }
  [[nodiscard]] bool terminated() const noexcept { return terminated_; }

 private:
  std::istream& in_;
  std::size_t number_ = 0;
  bool terminated_ = true;
};

class allocator_table {
 public:
  std::uint32_t index(const std::string& name, std::vector<std::string>& names) {
    auto it = by_name_.find(name);
    if (it != by_name_.end()) {
      return it->second;
    }
    const auto i = static_cast<std::uint32_t>(names.size());
    names.push_back(name);
    by_name_.emplace(name, i);
    return i;
  }

 private:
  std::unordered_map<std::string, std::uint32_t> by_name_;
};

// ---- JSON Lines ------------------------------------------------------------------------------

struct json_context {
  const std::string& source;
  std::size_t line;
  bool terminated;
  [[noreturn]] void fail(const std::string& what) const {
    if (!terminated) {
      throw parse_error(source, line, "truncated last line (no end of line): " + what);
    }
    throw parse_error(source, line, what);
  }
};

std::uint64_t json_u64(const nlohmann::json& j, const char* field, const json_context& c,
                       bool required, std::uint64_t fallback = 0) {
  auto it = j.find(field);
  if (it == j.end()) {
    if (required) {
      c.fail(std::string("missing field '") + field + "'");
    }
    return fallback;
  }
  if (it->is_number_unsigned()) {
    return it->get<std::uint64_t>();
  }
  if (it->is_number_integer() && it->get<std::int64_t>() >= 0) {
    return it->get<std::uint64_t>();
  }
  c.fail(std::string("field '") + field + "' is not a non-negative integer");
}

std::uint64_t json_pointer(const nlohmann::json& j, const char* field, const json_context& c,
                           bool required) {
  auto it = j.find(field);
  if (it == j.end()) {
    if (required) {
      c.fail(std::string("missing field '") + field + "'");
    }
    return 0;
  }
  if (it->is_number_unsigned()) {
    return it->get<std::uint64_t>();
  }
  std::uint64_t v = 0;
  if (!it->is_string() || !parse_pointer(it->get_ref<const std::string&>(), v)) {
    c.fail(std::string("field '") + field + "' is not a hex pointer");
  }
  return v;
}

std::string json_string(const nlohmann::json& j, const char* field, const json_context& c) {
  auto it = j.find(field);
  if (it == j.end()) {
    return {};
  }
  if (!it->is_string()) {
    c.fail(std::string("field '") + field + "' is not a string");
  }
  return it->get<std::string>();
}

void parse_json_lines(line_reader& reader, std::string first, const std::string& source,
                      event_log& log) {
  allocator_table allocators;
  bool format_known = false;
  bool have_line = true;
  std::string line = std::move(first);
  std::size_t number = reader.number();
  bool terminated = reader.terminated();
  while (have_line) {
    const std::string_view text = trim(line);
    if (!text.empty()) {
      const json_context c{source, number, terminated};
      nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded()) {
        c.fail("not valid JSON");
      }
      if (!j.is_object()) {
        c.fail("not a JSON object");
      }
      if (j.contains("dropped")) {
        log.dropped_events += json_u64(j, "dropped", c, true);
      } else if (j.contains("format")) {
        const std::string f = json_string(j, "format", c);
        if (f != "poolscope.events") {
          c.fail("unknown log format '" + f + "' (expected poolscope.events)");
        }
      } else {
        log_record r;
        r.line = number;
        const bool ours = j.contains("action");
        if (!format_known) {
          log.format = ours ? log_format::poolscope : log_format::jsonl_hook;
          format_known = true;
        }
        if (ours) {
          const std::string action = json_string(j, "action", c);
          if (!kind_from_action(action, r.kind)) {
            c.fail("unknown action '" + action + "'");
          }
          r.size = json_u64(j, "size", c, true);
          r.allocator = allocators.index(json_string(j, "allocator", c), log.allocators);
        } else if (j.contains("kind")) {
          const std::string kind = json_string(j, "kind", c);
          if (!kind_from_event_name(kind, r.kind)) {
            c.fail("unknown event kind '" + kind + "'");
          }
          r.size = json_u64(j, "requested", c, true);
          r.allocator = allocators.index(json_string(j, "allocator_name", c), log.allocators);
        } else {
          c.fail("neither 'action' nor 'kind' present");
        }
        const std::string phase = json_string(j, "phase", c);
        if (phase.empty()) {
          r.phase = default_phase(r.kind);
        } else if (!phase_from_name(phase, r.phase)) {
          c.fail("unknown phase '" + phase + "'");
        }
        r.seq = json_u64(j, "seq", c, false, log.records.size());
        r.time_ns = json_u64(j, "time_ns", c, false);
        r.thread = json_u64(j, "thread", c, false);
        if (auto d = j.find("device"); d != j.end()) {
          if (!d->is_number_integer()) {
            c.fail("field 'device' is not an integer");
          }
          // get<int>() would wrap 4294967296 to device 0: a device is -1 (host) or an int.
          const bool in_range = d->is_number_unsigned()
                                    ? d->get<std::uint64_t>() <= std::numeric_limits<int>::max()
                                    : d->get<std::int64_t>() >= -1 &&
                                          d->get<std::int64_t>() <= std::numeric_limits<int>::max();
          if (!in_range) {
            c.fail("field 'device' value " + d->dump() + " is out of range [-1, " +
                   std::to_string(std::numeric_limits<int>::max()) + "]");
          }
          r.device = static_cast<int>(d->get<std::int64_t>());
        }
        r.stream = json_pointer(j, "stream", c, false);
        const std::uint64_t allocator_id = json_u64(j, "allocator_id", c, false);
        if (allocator_id > std::numeric_limits<std::uint32_t>::max()) {
          c.fail("field 'allocator_id' value " + std::to_string(allocator_id) +
                 " is out of range [0, " +
                 std::to_string(std::numeric_limits<std::uint32_t>::max()) + "]");
        }
        r.allocator_id = static_cast<std::uint32_t>(allocator_id);
        r.ptr = json_pointer(j, "ptr", c, true);
        r.rounded = json_u64(j, "rounded", c, false);
        log.records.push_back(r);
      }
    }
    have_line = reader.next(line);
    number = reader.number();
    terminated = reader.terminated();
  }
  // Lines from several threads may be slightly out of order in the file: seq is the true order.
  std::stable_sort(log.records.begin(), log.records.end(),
                   [](const log_record& a, const log_record& b) { return a.seq < b.seq; });
  // A record written twice (by a crash flush and by the writer thread) is read once.
  const auto same_event = [](const log_record& a, const log_record& b) {
    log_record x = a;
    x.line = b.line;
    return a.seq != 0 && x == b;
  };
  const auto last = std::unique(log.records.begin(), log.records.end(), same_event);
  log.repeated_records = static_cast<std::uint64_t>(log.records.end() - last);
  log.records.erase(last, log.records.end());
}

// ---- RMM CSV ---------------------------------------------------------------------------------

/// "HH:MM:SS.ffffff" -> ns since midnight.
bool parse_wall_time(std::string_view s, std::uint64_t& ns) noexcept {
  s = trim(s);
  std::uint64_t parts[3] = {};
  for (int i = 0; i < 3; ++i) {
    const std::size_t stop = i < 2 ? s.find(':') : s.find('.');
    const std::string_view field = s.substr(0, stop);
    if (!parse_dec(field, parts[i])) {
      return false;
    }
    if (stop == std::string_view::npos) {
      s = {};
      if (i < 2) {
        return false;
      }
    } else {
      s.remove_prefix(stop + 1);
    }
  }
  std::uint64_t frac_ns = 0;
  if (!s.empty()) {
    std::uint64_t frac = 0;
    if (s.size() > 9 || !parse_dec(s, frac)) {
      return false;
    }
    frac_ns = frac;
    for (std::size_t d = s.size(); d < 9; ++d) {
      frac_ns *= 10;
    }
  }
  if (parts[0] > 23 || parts[1] > 59 || parts[2] > 60) {
    return false;
  }
  ns = ((parts[0] * 60 + parts[1]) * 60 + parts[2]) * 1'000'000'000ULL + frac_ns;
  return true;
}

void parse_rmm_csv(line_reader& reader, const std::string& source, event_log& log) {
  log.format = log_format::rmm_csv;
  log.allocators.push_back("rmm");
  std::string line;
  while (reader.next(line)) {
    const std::string_view text = trim(line);
    if (text.empty()) {
      continue;
    }
    const json_context c{source, reader.number(), reader.terminated()};
    std::string_view fields[6];
    std::size_t n = 0;
    std::string_view rest = text;
    while (n < 6) {
      const std::size_t comma = rest.find(',');
      fields[n++] = rest.substr(0, comma);
      if (comma == std::string_view::npos) {
        rest = {};
        break;
      }
      rest.remove_prefix(comma + 1);
    }
    if (n != 6 || !rest.empty()) {
      c.fail("expected 6 comma-separated fields (Thread,Time,Action,Pointer,Size,Stream), got " +
             std::string(n == 6 ? "more" : std::to_string(n)));
    }
    log_record r;
    r.line = reader.number();
    r.seq = log.records.size();
    if (!parse_dec(fields[0], r.thread)) {
      c.fail("Thread '" + std::string(fields[0]) + "' is not a number");
    }
    if (!parse_wall_time(fields[1], r.time_ns)) {
      c.fail("Time '" + std::string(fields[1]) + "' is not HH:MM:SS.ffffff");
    }
    const std::string_view action = trim(fields[2]);
    if (action == "allocate") {
      r.kind = hooks::event_kind::pool_malloc;
      r.phase = hooks::event_phase::post;
    } else if (action == "free") {
      r.kind = hooks::event_kind::pool_free;
      r.phase = hooks::event_phase::pre;
    } else if (action == "allocate failure") {
      r.kind = hooks::event_kind::oom;
      r.phase = hooks::event_phase::instant;
    } else {
      c.fail("unknown Action '" + std::string(action) +
             "' (expected allocate, free or allocate failure)");
    }
    if (!parse_pointer(fields[3], r.ptr)) {
      c.fail("Pointer '" + std::string(fields[3]) + "' is not a hex pointer");
    }
    std::uint64_t size = 0;
    if (!parse_dec(fields[4], size)) {
      c.fail("Size '" + std::string(fields[4]) + "' is not a number");
    }
    r.size = size;
    if (!parse_pointer(fields[5], r.stream) && !parse_dec(fields[5], r.stream)) {
      c.fail("Stream '" + std::string(fields[5]) + "' is not a number");
    }
    r.allocator = 0;
    log.records.push_back(r);
  }
}

}  // namespace

hooks::event_kind parse_action(std::string_view name) {
  hooks::event_kind k{};
  if (!kind_from_action(name, k)) {
    throw invalid_argument("poolscope: unknown event action '" + std::string(name) + "'");
  }
  return k;
}

event_log parse_event_log(std::istream& in, const std::string& source) {
  event_log log;
  line_reader reader(in);
  std::string line;
  while (reader.next(line)) {
    const std::string_view first = trim(line);
    if (first.empty()) {
      continue;
    }
    if (first.starts_with("Thread,Time,Action,Pointer,Size,Stream")) {
      parse_rmm_csv(reader, source, log);
    } else if (first.front() == '{') {
      parse_json_lines(reader, line, source, log);
    } else {
      throw parse_error(source, reader.number(),
                        "unknown log format (expected JSON Lines or RMM's CSV header "
                        "\"Thread,Time,Action,Pointer,Size,Stream\")");
    }
    break;
  }
  if (in.bad()) {
    throw runtime_error("poolscope: read error in " + source);
  }
  return log;
}

event_log parse_event_log_text(std::string_view text, const std::string& source) {
  std::istringstream in{std::string(text)};
  return parse_event_log(in, source);
}

event_log read_event_log(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw runtime_error("poolscope: cannot open event log '" + path + "'");
  }
  return parse_event_log(in, path);
}

}  // namespace poolscope::analysis
