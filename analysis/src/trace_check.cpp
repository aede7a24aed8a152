#include "poolscope/analysis/trace_check.hpp"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <istream>
#include <memory>
#include <set>
#include <sstream>
#include <streambuf>
#include <unordered_map>
#include <utility>

#include "detail/trace_json.hpp"
#include "poolscope/error.hpp"
#include "poolscope/profiler/detail/json_text.hpp"
#include "poolscope/profiler/overlap.hpp"

#ifdef POOLSCOPE_HAVE_ZLIB
#include <zlib.h>
#endif

namespace poolscope::analysis {
namespace {

using json = nlohmann::json;

// ---------------------------------------------------------------------------------------------
// Input: a streambuf over a file, read through zlib when compressed.

class file_streambuf final : public std::streambuf {
 public:
  explicit file_streambuf(const std::string& path) : path_(path), buf_(1 << 16) {
    std::FILE* f = std::fopen(path.c_str(), "rb");
    if (f == nullptr) {
      throw runtime_error("poolscope: cannot open trace '" + path + "': " + std::strerror(errno));
    }
    unsigned char magic[2] = {0, 0};
    const std::size_t n = std::fread(magic, 1, 2, f);
    std::fclose(f);
    const bool gz = n == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
#ifdef POOLSCOPE_HAVE_ZLIB
    // gzread reads plain files unchanged, so one path serves both.
    gz_ = gzopen(path.c_str(), "rb");
    if (gz_ == nullptr) {
      throw runtime_error("poolscope: cannot open trace '" + path + "': " + std::strerror(errno));
    }
    gzbuffer(gz_, 1 << 17);
#else
    if (gz) {
      throw runtime_error("poolscope: '" + path +
                          "' is gzip-compressed, and this build of poolscope has no zlib "
                          "(install zlib1g-dev and reconfigure, or gunzip the file first)");
    }
    plain_ = std::fopen(path.c_str(), "rb");
    if (plain_ == nullptr) {
      throw runtime_error("poolscope: cannot open trace '" + path + "': " + std::strerror(errno));
    }
#endif
    (void)gz;
  }
  file_streambuf(const file_streambuf&) = delete;
  file_streambuf& operator=(const file_streambuf&) = delete;
  ~file_streambuf() override {
#ifdef POOLSCOPE_HAVE_ZLIB
    if (gz_ != nullptr) {
      gzclose(gz_);
    }
#else
    if (plain_ != nullptr) {
      std::fclose(plain_);
    }
#endif
  }

 protected:
  int_type underflow() override {
    if (gptr() < egptr()) {
      return traits_type::to_int_type(*gptr());
    }
#ifdef POOLSCOPE_HAVE_ZLIB
    const int n = gzread(gz_, buf_.data(), static_cast<unsigned>(buf_.size()));
    if (n < 0) {
      int err = 0;
      const char* msg = gzerror(gz_, &err);
      throw runtime_error("poolscope: reading trace '" + path_ +
                          "' failed: " + (err == Z_ERRNO ? std::strerror(errno) : msg));
    }
    const auto got = static_cast<std::size_t>(n);
#else
    const std::size_t got = std::fread(buf_.data(), 1, buf_.size(), plain_);
    if (got == 0 && std::ferror(plain_) != 0) {
      throw runtime_error("poolscope: reading trace '" + path_ +
                          "' failed: " + std::strerror(errno));
    }
#endif
    if (got == 0) {
      return traits_type::eof();
    }
    setg(buf_.data(), buf_.data(), buf_.data() + got);
    return traits_type::to_int_type(*gptr());
  }

 private:
  std::string path_;
  std::vector<char> buf_;
#ifdef POOLSCOPE_HAVE_ZLIB
  gzFile gz_ = nullptr;
#else
  std::FILE* plain_ = nullptr;
#endif
};

// ---------------------------------------------------------------------------------------------
// SAX handler: hands each element of the event array to the visitor as a json value, and keeps
// the other top-level members; never builds the whole document.

class event_stream_sax {
 public:
  using number_integer_t = json::number_integer_t;
  using number_unsigned_t = json::number_unsigned_t;
  using number_float_t = json::number_float_t;
  using string_t = json::string_t;
  using binary_t = json::binary_t;

  event_stream_sax(const trace_event_visitor& visit, trace_read_info& info)
      : visit_(visit), info_(info) {}

  bool null() { return scalar(json(nullptr)); }
  bool boolean(bool v) { return scalar(json(v)); }
  bool number_integer(number_integer_t v) { return scalar(json(v)); }
  bool number_unsigned(number_unsigned_t v) { return scalar(json(v)); }
  bool number_float(number_float_t v, const string_t& /*text*/) { return scalar(json(v)); }
  bool string(string_t& v) { return scalar(json(std::move(v))); }
  bool binary(binary_t& v) { return scalar(json::binary(std::move(v))); }

  bool start_object(std::size_t /*n*/) {
    if (!capturing() && mode_ == mode::top) {
      mode_ = mode::top_object;
      return true;
    }
    return open(json::object());
  }
  bool start_array(std::size_t /*n*/) {
    if (!capturing()) {
      if (mode_ == mode::top) {
        info_.array_form = true;
        saw_events_ = true;
        mode_ = mode::events;
        return true;
      }
      if (mode_ == mode::top_object && top_key_ == "traceEvents") {
        saw_events_ = true;
        mode_ = mode::events;
        return true;
      }
    }
    return open(json::array());
  }
  bool key(string_t& k) {
    if (capturing()) {
      key_ = std::move(k);
    } else {
      top_key_ = std::move(k);
    }
    return true;
  }
  bool end_object() {
    if (capturing()) {
      return close();
    }
    mode_ = mode::done;  // the top-level object
    return true;
  }
  bool end_array() {
    if (capturing()) {
      return close();
    }
    mode_ = info_.array_form ? mode::done : mode::top_object;  // the event array
    return true;
  }
  bool parse_error(std::size_t position, const std::string& /*last_token*/,
                   const json::exception& ex) {
    error_ = "not valid JSON near byte " + std::to_string(position) + " (" + ex.what() + ")";
    return false;
  }

  [[nodiscard]] const std::string& error() const noexcept { return error_; }
  [[nodiscard]] bool saw_events() const noexcept { return saw_events_; }

 private:
  enum class mode : std::uint8_t { top, top_object, events, done };

  [[nodiscard]] bool capturing() const noexcept { return !stack_.empty(); }

  // A value starting where the structure above says what it is.
  bool begin_value() {
    if (mode_ == mode::top) {
      error_ = "the top level is neither an object nor an array";
      return false;
    }
    return true;
  }

  bool scalar(json&& v) {
    if (capturing()) {
      add(std::move(v));
      return true;
    }
    if (!begin_value()) {
      return false;
    }
    root_ = std::move(v);
    return complete();
  }

  bool open(json&& container) {
    if (capturing()) {
      stack_.push_back(add(std::move(container)));
      return true;
    }
    if (!begin_value()) {
      return false;
    }
    root_ = std::move(container);
    stack_.push_back(&root_);
    return true;
  }

  bool close() {
    stack_.pop_back();
    return capturing() ? true : complete();
  }

  json* add(json&& v) {
    json* cur = stack_.back();
    if (cur->is_object()) {
      json& slot = (*cur)[key_];
      slot = std::move(v);
      return &slot;
    }
    cur->push_back(std::move(v));
    return &cur->back();
  }

  // A whole value at the top structure level is ready in root_.
  bool complete() {
    if (mode_ == mode::events) {
      visit_(info_.events++, root_);
    } else if (mode_ == mode::top_object) {
      if (top_key_ == "traceEvents") {
        error_ = "\"traceEvents\" is not an array";
        return false;
      }
      info_.other[top_key_] = std::move(root_);
    }
    root_ = json();
    return true;
  }

  const trace_event_visitor& visit_;
  trace_read_info& info_;
  mode mode_ = mode::top;
  bool saw_events_ = false;
  std::string top_key_;
  std::string key_;
  json root_;
  std::vector<json*> stack_;
  std::string error_;
};

trace_read_info read_stream(std::istream& in, const std::string& what,
                            const trace_event_visitor& visit) {
  trace_read_info info;
  event_stream_sax sax(visit, info);
  const bool ok = json::sax_parse(in, &sax);
  if (!ok) {
    throw runtime_error("poolscope: trace " + what + ": " +
                        (sax.error().empty() ? std::string("not valid JSON") : sax.error()));
  }
  if (!sax.saw_events()) {
    throw runtime_error("poolscope: trace " + what +
                        ": no event array (expected {\"traceEvents\":[...]} or [...])");
  }
  return info;
}

// ---------------------------------------------------------------------------------------------
// Checker

constexpr std::string_view known_phases = "BEXiICbnestfPONDMVvRc()";

std::int64_t to_ns(double us) {
  return static_cast<std::int64_t>(std::llround(us * 1000.0));
}

std::string range_text() {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%g us", max_trace_time_us);
  return buf;
}

std::string ns_text(std::int64_t ns) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.3f us", static_cast<double>(ns) / 1000.0);
  return buf;
}

struct slice {
  std::int64_t begin = 0;
  std::int64_t end = 0;
  std::uint64_t index = 0;
  std::uint32_t name = 0;
};

struct stamp {
  std::int64_t ts = 0;
  std::uint64_t index = 0;
  std::uint32_t name = 0;
  bool begin = false;
};

struct flow_point {
  std::int64_t pid = 0;
  std::int64_t tid = 0;
  std::int64_t ts = 0;
  std::uint64_t index = 0;
  std::uint32_t name = 0;
  char phase = 's';
  bool enclosing = true;  // must lie inside a slice (else: a slice must start at or after it)
};

using track_key = std::pair<std::int64_t, std::int64_t>;

class checker {
 public:
  explicit checker(trace_check_options options) : options_(options) {}

  void visit(std::uint64_t index, const json& e) {
    ++result_.events;
    if (!e.is_object()) {
      issue(static_cast<std::int64_t>(index), "", std::nullopt, "event is not a JSON object");
      return;
    }
    event_view v{e, index};
    if (!read_common(v)) {
      return;
    }
    switch (v.ph) {
      case 'X':
        complete_slice(v);
        break;
      case 'B':
      case 'E':
        stamps_[{v.pid, *v.tid}].push_back({to_ns(*v.ts), index, v.name_id, v.ph == 'B'});
        break;
      case 'C':
        counter(v);
        break;
      case 's':
      case 't':
      case 'f':
        flow(v);
        break;
      case 'b':
      case 'e':
      case 'n':
        async(v);
        break;
      case 'M':
        metadata(v);
        break;
      default:
        break;
    }
  }

  void file_issue(const std::string& message) { issue(-1, "", std::nullopt, message); }

  trace_check_result finish() {
    check_tracks();
    check_flow_binding();
    for (const auto& [key, q] : flows_) {
      for (const pending& p : q.items) {
        issue(static_cast<std::int64_t>(p.index), names_[p.name], p.ts / 1000.0,
              q.starts ? "flow start (s) has no flow end (f) with the same cat and id"
                       : "flow end (f) has no flow start (s) with the same cat and id");
      }
    }
    for (const auto& [key, q] : async_) {
      for (const pending& p : q.items) {
        issue(static_cast<std::int64_t>(p.index), names_[p.name], p.ts / 1000.0,
              q.starts ? "async begin (b) has no async end (e) with the same cat, id and name"
                       : "async end (e) has no async begin (b) with the same cat, id and name");
      }
    }
    for (const auto& [pid, index] : used_pids_) {
      if (named_pids_.count(pid) == 0) {
        issue(static_cast<std::int64_t>(index), "", std::nullopt,
              "pid " + std::to_string(pid) + " has no process_name metadata");
      }
    }
    for (const auto& [track, index] : used_threads_) {
      if (named_threads_.count(track) == 0) {
        issue(static_cast<std::int64_t>(index), "", std::nullopt,
              "thread track pid " + std::to_string(track.first) + " tid " +
                  std::to_string(track.second) + " has no thread_name metadata");
      }
    }
    return std::move(result_);
  }

 private:
  // One event as visit reads it: the fields every phase has, read and checked once by
  // read_common before the phase's own checks.
  struct event_view {
    event_view(const json& event, std::uint64_t at) : e(event), index(at) {}
    const json& e;
    std::uint64_t index = 0;
    std::string name;          // "" when absent or not a string
    std::optional<double> ts;  // µs, when "ts" is a number
    char ph = 0;
    std::int64_t pid = 0;
    std::optional<std::int64_t> tid;
    const json* args = nullptr;  // "args" when present (an object or not)
    std::uint32_t name_id = 0;
  };

  // A problem of the event `v`, naming it.
  void fail(const event_view& v, const std::string& message) {
    issue(static_cast<std::int64_t>(v.index), v.name, v.ts, message);
  }

  // Reads and checks what every event needs: its phase, name, track and time. False (the
  // problem reported) when the event cannot be placed on a track and in time; problems that
  // leave it placeable are reported and reading goes on.
  bool read_common(event_view& v) {
    const json& e = v.e;
    const auto name_it = e.find("name");
    if (name_it != e.end() && name_it->is_string()) {
      v.name = name_it->get<std::string>();
    }
    if (const auto it = e.find("ts"); it != e.end() && it->is_number()) {
      v.ts = it->get<double>();
    }
    if (!read_phase(v)) {
      return false;
    }
    if (name_it == e.end() && v.ph != 'E') {
      fail(v, "missing field \"name\"");
    } else if (name_it != e.end() && !name_it->is_string()) {
      fail(v, "\"name\" is not a string");
    }
    if (!read_track(v)) {
      return false;
    }
    if (const auto it = e.find("args"); it != e.end()) {
      v.args = &*it;
      if (!it->is_object()) {
        fail(v, "\"args\" is not an object");
      }
    }
    if (v.ph != 'M' && !read_time(v)) {
      return false;
    }
    const bool on_thread = on_thread_track(v);
    if (on_thread && !v.tid) {
      fail(v, "missing field \"tid\"");
      return false;
    }
    if (v.ph != 'M') {
      used_pids_.emplace(v.pid, v.index);
      if (on_thread) {
        used_threads_.emplace(track_key{v.pid, *v.tid}, v.index);
      }
    }
    v.name_id = intern(v.name);
    return true;
  }

  // "ph": one known phase letter, counted.
  bool read_phase(event_view& v) {
    const auto it = v.e.find("ph");
    if (it == v.e.end()) {
      fail(v, "missing field \"ph\"");
      return false;
    }
    if (!it->is_string() || it->get_ref<const std::string&>().size() != 1 ||
        known_phases.find(it->get_ref<const std::string&>()[0]) == std::string_view::npos) {
      fail(v, "unknown phase " + it->dump());
      return false;
    }
    v.ph = it->get_ref<const std::string&>()[0];
    ++result_.phases[std::string(1, v.ph)];
    return true;
  }

  // "pid" (required) and "tid" (optional here; on_thread_track says where it is required):
  // integers.
  bool read_track(event_view& v) {
    const auto pid_it = v.e.find("pid");
    if (pid_it == v.e.end()) {
      fail(v, "missing field \"pid\"");
      return false;
    }
    if (!pid_it->is_number_integer()) {
      fail(v, "\"pid\" is not an integer");
      return false;
    }
    v.pid = pid_it->get<std::int64_t>();
    if (const auto tid_it = v.e.find("tid"); tid_it != v.e.end()) {
      if (!tid_it->is_number_integer()) {
        fail(v, "\"tid\" is not an integer");
        return false;
      }
      v.tid = tid_it->get<std::int64_t>();
    }
    return true;
  }

  // "ts": a number within max_trace_time_us of the origin.
  bool read_time(const event_view& v) {
    const auto it = v.e.find("ts");
    if (it == v.e.end()) {
      fail(v, "missing field \"ts\"");
      return false;
    }
    if (!v.ts) {
      fail(v, "\"ts\" is not a number");
      return false;
    }
    // Beyond it the time has no 64-bit ns value: to_ns and the sums below would wrap.
    if (!(std::fabs(*v.ts) <= max_trace_time_us)) {
      fail(v, "\"ts\" " + it->dump() + " is out of range (more than " + range_text() +
                  " from the origin)");
      return false;
    }
    return true;
  }

  // Whether the event sits on a thread's track (slices, flows, thread-scoped instants), which
  // needs a "tid". Checks an instant's scope "s" on the way.
  bool on_thread_track(const event_view& v) {
    if (v.ph == 'i' || v.ph == 'I') {
      const auto it = v.e.find("s");
      if (it == v.e.end()) {
        return true;
      }
      if (!it->is_string() || (*it != "t" && *it != "p" && *it != "g")) {
        fail(v, "instant scope \"s\" must be \"t\", \"p\" or \"g\", not " + it->dump());
        return true;
      }
      return *it == "t";
    }
    return v.ph == 'X' || v.ph == 'B' || v.ph == 'E' || v.ph == 's' || v.ph == 't' || v.ph == 'f';
  }

  // X: a duration that keeps the slice in range, device ids where `trace summary` reads them.
  void complete_slice(const event_view& v) {
    const auto dur_it = v.e.find("dur");
    if (dur_it == v.e.end()) {
      fail(v, "complete event (X) has no \"dur\": an unclosed slice");
      return;
    }
    if (!dur_it->is_number()) {
      fail(v, "\"dur\" is not a number");
      return;
    }
    const double dur = dur_it->get<double>();
    if (dur < 0) {
      fail(v, "\"dur\" is negative");
      return;
    }
    if (!(dur <= max_trace_time_us)) {
      fail(v, "\"dur\" " + dur_it->dump() + " is out of range (more than " + range_text() + ")");
      return;
    }
    if (!(*v.ts + dur <= max_trace_time_us)) {
      fail(v,
           "slice ends past the range (ts + dur more than " + range_text() + " from the origin)");
      return;
    }
    // Device ids where `trace summary` reads them (device activity: a category it counts): an
    // integer in [-1, INT_MAX]; it leaves other values out.
    if (const auto cat_it = v.e.find("cat");
        cat_it != v.e.end() && cat_it->is_string() &&
        profiler::classify_category(cat_it->get<std::string>()) && v.args != nullptr &&
        v.args->is_object()) {
      for (const char* key : {"device", "src_device", "dst_device"}) {
        const auto d = v.args->find(key);
        if (d != v.args->end() && !detail::trace_device_id(*d)) {
          fail(v, std::string("args \"") + key + "\" " + profiler::detail::json_shown(*d) +
                      " is not a device (an integer from -1 to 2147483647)");
          return;
        }
      }
    }
    const std::int64_t b = to_ns(*v.ts);
    slices_[{v.pid, *v.tid}].push_back({b, b + to_ns(dur), v.index, v.name_id});
  }

  // C: a non-empty args object of numbers.
  void counter(const event_view& v) {
    if (v.args == nullptr || !v.args->is_object() || v.args->empty()) {
      fail(v, "counter event (C) has no args: a counter needs at least one numeric value");
      return;
    }
    for (const auto& [k, value] : v.args->items()) {
      if (!value.is_number()) {
        fail(v, "counter arg \"" + k + "\" is not a number");
      }
    }
  }

  // s, t, f: an id; an f's binding point; the start and end paired by cat and id.
  void flow(const event_view& v) {
    const auto id = id_of(v.e);
    if (!id) {
      fail(v, "flow event (" + std::string(1, v.ph) + ") has no \"id\"");
      return;
    }
    bool enclosing = true;
    if (v.ph == 'f') {
      enclosing = false;
      if (const auto it = v.e.find("bp"); it != v.e.end()) {
        if (*it != "e") {
          fail(v, "flow binding point \"bp\" must be \"e\", not " + it->dump());
        } else {
          enclosing = true;
        }
      }
    }
    const std::int64_t ts = to_ns(*v.ts);
    flow_points_.push_back({v.pid, *v.tid, ts, v.index, v.name_id, v.ph, enclosing});
    if (v.ph != 't') {
      pair_flow(v.e.value("cat", "") + '\x1f' + *id, v.ph == 's', v.index, v.name_id, ts);
    }
  }

  // b, e, n: an id; begins and ends paired by cat, id and name.
  void async(const event_view& v) {
    const auto id = id_of(v.e);
    if (!id) {
      fail(v, "async event (" + std::string(1, v.ph) + ") has no \"id\"");
      return;
    }
    if (v.ph != 'n') {
      pair_async(v.e.value("cat", "") + '\x1f' + *id + '\x1f' + v.name, v.ph == 'b', v.index,
                 v.name_id, to_ns(*v.ts));
    }
  }

  struct pending {
    std::uint64_t index;
    std::uint32_t name;
    std::int64_t ts;
  };
  struct pending_queue {
    bool starts = true;  // what `items` holds: unmatched starts or unmatched ends
    std::vector<pending> items;
  };

  static std::optional<std::string> id_of(const json& e) {
    for (const char* k : {"id", "id2", "bind_id"}) {
      if (const auto it = e.find(k); it != e.end()) {
        return it->is_string() ? it->get<std::string>() : it->dump();
      }
    }
    return std::nullopt;
  }

  std::uint32_t intern(const std::string& name) {
    const auto [it, inserted] =
        name_ids_.try_emplace(name, static_cast<std::uint32_t>(names_.size()));
    if (inserted) {
      names_.push_back(name);
    }
    return it->second;
  }

  void issue(std::int64_t index, const std::string& name, std::optional<double> ts_us,
             std::string message) {
    ++result_.issue_count;
    if (result_.issues.size() < options_.max_issues) {
      result_.issues.push_back({index, name, ts_us, std::move(message)});
    }
  }

  // Matches a start with an end of the same key, in file order; checks the end is not earlier.
  void pair_generic(std::unordered_map<std::string, pending_queue>& map, const std::string& key,
                    bool is_start, std::uint64_t index, std::uint32_t name, std::int64_t ts,
                    bool is_flow) {
    auto it = map.find(key);
    if (it == map.end() || it->second.items.empty()) {
      auto& q = map[key];
      q.starts = is_start;
      q.items.push_back({index, name, ts});
      return;
    }
    pending_queue& q = it->second;
    if (q.starts == is_start) {
      q.items.push_back({index, name, ts});
      return;
    }
    const pending other = q.items.front();
    q.items.erase(q.items.begin());
    if (q.items.empty()) {
      map.erase(it);
    }
    const std::int64_t start_ts = is_start ? ts : other.ts;
    const std::int64_t end_ts = is_start ? other.ts : ts;
    const std::uint64_t end_index = is_start ? other.index : index;
    const std::uint32_t end_name = is_start ? other.name : name;
    if (is_flow) {
      ++result_.flows;
    }
    if (end_ts < start_ts) {
      issue(static_cast<std::int64_t>(end_index), names_[end_name], end_ts / 1000.0,
            std::string(is_flow ? "flow" : "async slice") + " ends (" + ns_text(end_ts) +
                ") before it starts (" + ns_text(start_ts) + ")");
    }
  }

  void pair_flow(const std::string& key, bool is_start, std::uint64_t index, std::uint32_t name,
                 std::int64_t ts) {
    pair_generic(flows_, key, is_start, index, name, ts, true);
  }
  void pair_async(const std::string& key, bool is_start, std::uint64_t index, std::uint32_t name,
                  std::int64_t ts) {
    pair_generic(async_, key, is_start, index, name, ts, false);
  }

  // M: process and thread names and sort indices, with the args their kind needs.
  void metadata(const event_view& v) {
    const std::int64_t idx = static_cast<std::int64_t>(v.index);
    const std::string& name = v.name;
    const std::optional<double> no_ts;
    const bool is_name = name == "process_name" || name == "thread_name";
    const bool is_sort = name == "process_sort_index" || name == "thread_sort_index";
    if (!is_name && !is_sort) {
      return;  // other metadata (process_labels, ...) carries no structure we rely on
    }
    const bool thread = name.starts_with("thread_");
    if (thread && !v.tid) {
      issue(idx, name, no_ts, "thread metadata has no \"tid\"");
      return;
    }
    const char* key = is_name ? "name" : "sort_index";
    if (v.args == nullptr || !v.args->is_object() || !v.args->contains(key)) {
      issue(idx, name, no_ts, std::string("metadata has no args.") + key);
      return;
    }
    const json& value = (*v.args)[key];
    if (is_name && !value.is_string()) {
      issue(idx, name, no_ts, "metadata args.name is not a string");
      return;
    }
    if (is_sort && !value.is_number_integer()) {
      issue(idx, name, no_ts, "metadata args.sort_index is not an integer");
      return;
    }
    if (name == "process_name") {
      named_pids_.insert(v.pid);
    } else if (name == "thread_name") {
      named_threads_.insert({v.pid, *v.tid});
    }
  }

  void check_tracks() {
    // B/E pairs become slices of their track first.
    for (auto& [track, stamps] : stamps_) {
      std::stable_sort(stamps.begin(), stamps.end(),
                       [](const stamp& a, const stamp& b) { return a.ts < b.ts; });
      std::vector<stamp> open;
      for (const stamp& s : stamps) {
        if (s.begin) {
          open.push_back(s);
        } else if (open.empty()) {
          issue(static_cast<std::int64_t>(s.index), names_[s.name], s.ts / 1000.0,
                "end (E) without a begin (B) on its track");
        } else {
          const stamp b = open.back();
          open.pop_back();
          slices_[track].push_back({b.ts, s.ts, b.index, b.name});
        }
      }
      for (const stamp& b : open) {
        issue(static_cast<std::int64_t>(b.index), names_[b.name], b.ts / 1000.0,
              "begin (B) without an end (E): an unclosed slice");
      }
    }
    stamps_.clear();
    result_.tracks = slices_.size();
    for (auto& [track, list] : slices_) {
      result_.slices += list.size();
      std::sort(list.begin(), list.end(), [](const slice& a, const slice& b) {
        if (a.begin != b.begin) {
          return a.begin < b.begin;
        }
        if (a.end != b.end) {
          return a.end > b.end;  // the enclosing one first
        }
        return a.index < b.index;
      });
      std::vector<const slice*> stack;
      for (const slice& s : list) {
        while (!stack.empty() && stack.back()->end <= s.begin) {
          stack.pop_back();
        }
        if (!stack.empty() && s.end > stack.back()->end) {
          const slice& p = *stack.back();
          issue(static_cast<std::int64_t>(s.index), names_[s.name], s.begin / 1000.0,
                "slice [" + ns_text(s.begin) + ", " + ns_text(s.end) + "] overlaps event #" +
                    std::to_string(p.index) + " \"" + names_[p.name] + "\" [" + ns_text(p.begin) +
                    ", " + ns_text(p.end) + "] on pid " + std::to_string(track.first) + " tid " +
                    std::to_string(track.second) + " without nesting");
          continue;  // keep the stack as it was: report each offender once
        }
        stack.push_back(&s);
      }
    }
  }

  void check_flow_binding() {
    // Union of each track's slices, for point queries.
    std::map<track_key, std::vector<std::pair<std::int64_t, std::int64_t>>> unions;
    for (const auto& [track, list] : slices_) {
      auto& u = unions[track];
      for (const slice& s : list) {  // sorted by begin
        if (!u.empty() && s.begin <= u.back().second) {
          u.back().second = std::max(u.back().second, s.end);
        } else {
          u.emplace_back(s.begin, s.end);
        }
      }
    }
    for (const flow_point& f : flow_points_) {
      const auto it = unions.find({f.pid, f.tid});
      bool bound = false;
      if (it != unions.end()) {
        const auto& u = it->second;
        // First interval whose end is >= ts.
        const auto pos = std::lower_bound(u.begin(), u.end(), f.ts,
                                          [](const std::pair<std::int64_t, std::int64_t>& iv,
                                             std::int64_t t) { return iv.second < t; });
        if (pos != u.end()) {
          bound = f.enclosing ? pos->first <= f.ts : true;
        }
      }
      if (!bound) {
        issue(static_cast<std::int64_t>(f.index), names_[f.name], f.ts / 1000.0,
              std::string("flow ") +
                  (f.phase == 's' ? "start" : (f.phase == 'f' ? "end" : "step")) +
                  (f.enclosing ? " is not inside any slice" : " has no slice at or after it") +
                  " on pid " + std::to_string(f.pid) + " tid " + std::to_string(f.tid));
      }
    }
    flow_points_.clear();
  }

  trace_check_options options_;
  trace_check_result result_;
  std::unordered_map<std::string, std::uint32_t> name_ids_;
  std::vector<std::string> names_;
  std::map<track_key, std::vector<slice>> slices_;
  std::map<track_key, std::vector<stamp>> stamps_;
  std::vector<flow_point> flow_points_;
  std::unordered_map<std::string, pending_queue> flows_;
  std::unordered_map<std::string, pending_queue> async_;
  std::map<std::int64_t, std::uint64_t> used_pids_;  // pid -> first event using it
  std::map<track_key, std::uint64_t> used_threads_;
  std::set<std::int64_t> named_pids_;
  std::set<track_key> named_threads_;
};

template <typename Read>
trace_check_result run_check(trace_check_options options, Read&& read) {
  checker c(options);
  try {
    read([&c](std::uint64_t index, const json& e) { c.visit(index, e); });
  } catch (const runtime_error& e) {
    c.file_issue(e.what());
  } catch (const json::exception& e) {
    c.file_issue(e.what());
  }
  return c.finish();
}

}  // namespace

trace_read_info read_trace(const std::string& path, const trace_event_visitor& visit) {
  file_streambuf buf(path);
  std::istream in(&buf);
  return read_stream(in, "'" + path + "'", visit);
}

trace_read_info read_trace_text(std::string_view json_text, const trace_event_visitor& visit) {
  std::istringstream in{std::string(json_text)};
  return read_stream(in, "text", visit);
}

std::string trace_issue::to_string() const {
  if (index < 0) {
    return "trace: " + message;
  }
  std::string s = "event #" + std::to_string(index);
  if (!name.empty()) {
    json n = name;
    s += ' ';
    s += n.dump(-1, ' ', false, json::error_handler_t::replace);
  }
  if (ts_us) {
    char buf[48];
    // Times out of range (1e300) as exponents: in %.3f they ran past the buffer, ")" and all.
    std::snprintf(buf, sizeof buf,
                  std::fabs(*ts_us) <= max_trace_time_us ? " (ts %.3f us)" : " (ts %g us)", *ts_us);
    s += buf;
  }
  return s + ": " + message;
}

std::string trace_check_result::to_text() const {
  std::string out;
  for (const trace_issue& i : issues) {
    out += i.to_string();
    out += '\n';
  }
  if (issue_count > issues.size()) {
    out += "... and " + std::to_string(issue_count - issues.size()) + " more\n";
  }
  if (ok()) {
    out += "OK: " + std::to_string(events) + " events, " + std::to_string(slices) + " slices on " +
           std::to_string(tracks) + " tracks, " + std::to_string(flows) + " flows\n";
  } else {
    out += "FAILED: " + std::to_string(issue_count) + " problem(s) in " + std::to_string(events) +
           " events\n";
  }
  return out;
}

trace_check_result check_trace(const std::string& path, trace_check_options options) {
  return run_check(options, [&](const trace_event_visitor& v) { (void)read_trace(path, v); });
}

trace_check_result check_trace_text(std::string_view json_text, trace_check_options options) {
  return run_check(options,
                   [&](const trace_event_visitor& v) { (void)read_trace_text(json_text, v); });
}

}  // namespace poolscope::analysis
