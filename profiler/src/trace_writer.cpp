#include "poolscope/profiler/trace_writer.hpp"

#include "poolscope/hooks/json_string.hpp"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "poolscope/error.hpp"
#include "poolscope/log.hpp"

#ifdef POOLSCOPE_HAVE_ZLIB
#include <zlib.h>
#endif

namespace poolscope::profiler {
namespace {

void append_uint(std::string& out, std::uint64_t v) {
  char buf[24];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

void append_int(std::string& out, std::int64_t v) {
  char buf[24];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

void append_real(std::string& out, double v) {
  if (!std::isfinite(v)) {
    out += "null";  // JSON has no NaN or infinity
    return;
  }
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

void append_key(std::string& out, std::string_view key) {
  out += ',';
  append_trace_string(out, key);
  out += ':';
}

void append_metadata(std::string& out, std::string_view what, std::int64_t pid, std::int64_t tid,
                     std::string_view key, const trace_arg& value) {
  out += ",\n{\"ph\":\"M\",\"name\":";
  append_trace_string(out, what);
  out += ",\"pid\":";
  append_int(out, pid);
  out += ",\"tid\":";
  append_int(out, tid);
  out += ",\"args\":{";
  append_trace_string(out, key);
  out += ':';
  if (value.kind() == trace_arg::type::string) {
    append_trace_string(out, value.as_string());
  } else {
    append_int(out, value.as_int());
  }
  out += "}}";
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

std::string errno_text(int err) {
  return err != 0 ? std::string(": ") + std::strerror(err) : std::string();
}

}  // namespace

void append_trace_us(std::string& out, std::int64_t ns) {
  std::uint64_t mag = 0;
  if (ns < 0) {
    out += '-';
    mag = static_cast<std::uint64_t>(-(ns + 1)) + 1;  // no overflow at INT64_MIN
  } else {
    mag = static_cast<std::uint64_t>(ns);
  }
  append_uint(out, mag / 1000);
  const auto frac = static_cast<unsigned>(mag % 1000);
  out += '.';
  out += static_cast<char>('0' + frac / 100);
  out += static_cast<char>('0' + (frac / 10) % 10);
  out += static_cast<char>('0' + frac % 10);
}

void append_trace_string(std::string& out, std::string_view s) {
  hooks::append_json_string(out, s);
}

void append_trace_event(std::string& out, const trace_event& e, std::uint64_t origin_ns) {
  out += ",\n{\"ph\":\"";
  out += static_cast<char>(e.phase);
  out += "\",\"name\":";
  append_trace_string(out, e.name);
  if (!e.cat.empty()) {
    out += ",\"cat\":";
    append_trace_string(out, e.cat);
  }
  out += ",\"pid\":";
  append_int(out, e.pid);
  out += ",\"tid\":";
  append_int(out, e.tid);
  if (e.phase != trace_phase::metadata) {
    out += ",\"ts\":";
    // Two's complement difference: timestamps before the origin come out negative.
    append_trace_us(out, static_cast<std::int64_t>(e.ts_ns - origin_ns));
  }
  switch (e.phase) {
    case trace_phase::complete:
      out += ",\"dur\":";
      append_trace_us(out, static_cast<std::int64_t>(e.dur_ns));
      break;
    case trace_phase::instant:
      out += ",\"s\":\"";
      out += e.instant_scope == 'p' || e.instant_scope == 'g' ? e.instant_scope : 't';
      out += '"';
      break;
    case trace_phase::flow_start:
    case trace_phase::flow_end:
      out += ",\"id\":";
      append_uint(out, e.id);
      if (e.bind_enclosing) {
        out += ",\"bp\":\"e\"";
      }
      break;
    case trace_phase::async_begin:
    case trace_phase::async_end:
      out += ",\"id\":";
      append_uint(out, e.id);
      break;
    case trace_phase::counter:
    case trace_phase::metadata:
      break;
  }
  if (!e.args.empty()) {
    out += ",\"args\":{";
    bool first = true;
    for (const trace_arg& a : e.args) {
      if (first) {
        append_trace_string(out, a.key());
        out += ':';
        first = false;
      } else {
        append_key(out, a.key());
      }
      switch (a.kind()) {
        case trace_arg::type::int64:
          append_int(out, a.as_int());
          break;
        case trace_arg::type::uint64:
          append_uint(out, a.as_uint());
          break;
        case trace_arg::type::real:
          append_real(out, a.as_real());
          break;
        case trace_arg::type::string:
          append_trace_string(out, a.as_string());
          break;
        case trace_arg::type::boolean:
          out += a.as_bool() ? "true" : "false";
          break;
      }
    }
    out += '}';
  }
  out += '}';
}

void append_process_name(std::string& out, std::int64_t pid, std::string_view name) {
  append_metadata(out, "process_name", pid, 0, "name", trace_arg("name", name));
}

void append_thread_name(std::string& out, std::int64_t pid, std::int64_t tid,
                        std::string_view name) {
  append_metadata(out, "thread_name", pid, tid, "name", trace_arg("name", name));
}

void append_process_sort_index(std::string& out, std::int64_t pid, std::int64_t index) {
  append_metadata(out, "process_sort_index", pid, 0, "sort_index", trace_arg("sort_index", index));
}

void append_thread_sort_index(std::string& out, std::int64_t pid, std::int64_t tid,
                              std::int64_t index) {
  append_metadata(out, "thread_sort_index", pid, tid, "sort_index", trace_arg("sort_index", index));
}

bool trace_gzip_supported() noexcept {
#ifdef POOLSCOPE_HAVE_ZLIB
  return true;
#else
  return false;
#endif
}

// ---------------------------------------------------------------------------------------------
// Sinks

class trace_writer::sink {
 public:
  sink() = default;
  sink(const sink&) = delete;
  sink& operator=(const sink&) = delete;
  virtual ~sink() = default;
  /// Writes all of `data`; throws runtime_error on failure.
  virtual void write(std::string_view data) = 0;
  virtual void flush() = 0;
  /// Closes; throws runtime_error if the last writes failed. Called at most once.
  virtual void close() = 0;
};

namespace {

class file_sink final : public trace_writer::sink {
 public:
  explicit file_sink(const std::string& path) : path_(path) {
    file_ = std::fopen(path.c_str(), "wb");
    if (file_ == nullptr) {
      throw runtime_error("poolscope: cannot create trace file '" + path + "'" + errno_text(errno));
    }
  }
  ~file_sink() override {
    if (file_ != nullptr) {
      std::fclose(file_);
    }
  }
  void write(std::string_view data) override {
    if (!data.empty() && std::fwrite(data.data(), 1, data.size(), file_) != data.size()) {
      throw runtime_error("poolscope: writing trace file '" + path_ + "' failed" +
                          errno_text(errno));
    }
  }
  void flush() override {
    if (std::fflush(file_) != 0) {
      throw runtime_error("poolscope: writing trace file '" + path_ + "' failed" +
                          errno_text(errno));
    }
  }
  void close() override {
    std::FILE* f = file_;
    file_ = nullptr;
    if (std::fclose(f) != 0) {
      throw runtime_error("poolscope: closing trace file '" + path_ + "' failed" +
                          errno_text(errno));
    }
  }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

#ifdef POOLSCOPE_HAVE_ZLIB
class gzip_sink final : public trace_writer::sink {
 public:
  gzip_sink(const std::string& path, int level) : path_(path) {
    const int lvl = level < 1 ? 1 : (level > 9 ? 9 : level);
    const std::string mode = "wb" + std::to_string(lvl);
    file_ = gzopen(path.c_str(), mode.c_str());
    if (file_ == nullptr) {
      throw runtime_error("poolscope: cannot create trace file '" + path + "'" + errno_text(errno));
    }
    gzbuffer(file_, 256 * 1024);
  }
  ~gzip_sink() override {
    if (file_ != nullptr) {
      gzclose(file_);
    }
  }
  void write(std::string_view data) override {
    while (!data.empty()) {
      // gzwrite takes an unsigned length: write in pieces below 1 GiB.
      const auto n = static_cast<unsigned>(std::min<std::size_t>(data.size(), 1U << 30));
      if (gzwrite(file_, data.data(), n) != static_cast<int>(n)) {
        fail("writing");
      }
      data.remove_prefix(n);
    }
  }
  void flush() override {
    if (gzflush(file_, Z_SYNC_FLUSH) != Z_OK) {
      fail("writing");
    }
  }
  void close() override {
    gzFile f = file_;
    file_ = nullptr;
    const int rc = gzclose(f);
    if (rc != Z_OK) {
      throw runtime_error("poolscope: closing gzip trace file '" + path_ + "' failed (zlib error " +
                          std::to_string(rc) + ")");
    }
  }

 private:
  [[noreturn]] void fail(const char* what) {
    int err = 0;
    const char* msg = gzerror(file_, &err);
    throw runtime_error(std::string("poolscope: ") + what + " gzip trace file '" + path_ +
                        "' failed: " + (err == Z_ERRNO ? std::strerror(errno) : msg));
  }

  std::string path_;
  gzFile file_ = nullptr;
};
#endif

}  // namespace

// ---------------------------------------------------------------------------------------------
// trace_writer

trace_writer::trace_writer(const std::string& path, std::uint64_t origin_ns,
                           trace_writer_options options)
    : path_(path), origin_ns_(origin_ns), options_(options) {
  gzip_ = options_.compression == trace_compression::gzip ||
          (options_.compression == trace_compression::by_extension && ends_with(path, ".gz"));
  if (options_.chunk_bytes < 4096) {
    options_.chunk_bytes = 4096;
  }
  if (gzip_) {
#ifdef POOLSCOPE_HAVE_ZLIB
    sink_ = std::make_unique<gzip_sink>(path, options_.gzip_level);
#else
    throw runtime_error("poolscope: cannot write the gzip trace '" + path +
                        "': this build of poolscope has no zlib (install zlib1g-dev and "
                        "reconfigure), so write a plain .json trace instead");
#endif
  } else {
    sink_ = std::make_unique<file_sink>(path);
  }
  chunk_.reserve(options_.chunk_bytes + 4096);
  append_raw("{\"traceEvents\":[\n");
}

trace_writer::~trace_writer() {
  if (sink_ != nullptr) {
    try {
      close();
    } catch (const std::exception& e) {
      log(log_level::error, e.what());
    }
  }
}

void trace_writer::append_raw(std::string_view s) {
  // Never grows the chunk past what the constructor reserved (this runs when the timeline stops,
  // maybe with no memory to spare): what does not fit goes out first, and a piece larger than
  // the whole chunk goes straight to the sink.
  if (chunk_.size() + s.size() > chunk_.capacity()) {
    drain();
    if (s.size() > chunk_.capacity()) {
      sink_->write(s);
      bytes_ += s.size();
      return;
    }
  }
  chunk_.append(s);
  bytes_ += s.size();
  if (chunk_.size() >= options_.chunk_bytes) {
    drain();
  }
}

void trace_writer::drain() {
  if (!chunk_.empty()) {
    sink_->write(chunk_);
    chunk_.clear();
  }
}

void trace_writer::write_formatted(std::string_view events, std::uint64_t count) {
  if (sink_ == nullptr) {
    throw logic_error("poolscope: trace_writer for '" + path_ + "' is closed");
  }
  if (events.empty()) {
    return;
  }
  if (first_) {
    // The first event of the file takes no separator.
    if (events.starts_with(",\n")) {
      events.remove_prefix(2);
    } else if (events.starts_with(",")) {
      events.remove_prefix(1);
    }
    first_ = false;
  }
  events_ += count;
  append_raw(events);
}

void trace_writer::write(const trace_event& e) {
  std::string s;
  append_trace_event(s, e, origin_ns_);
  write_formatted(s, 1);
}

void trace_writer::process_name(std::int64_t pid, std::string_view name) {
  std::string s;
  append_process_name(s, pid, name);
  write_formatted(s, 1);
}

void trace_writer::thread_name(std::int64_t pid, std::int64_t tid, std::string_view name) {
  std::string s;
  append_thread_name(s, pid, tid, name);
  write_formatted(s, 1);
}

void trace_writer::process_sort_index(std::int64_t pid, std::int64_t index) {
  std::string s;
  append_process_sort_index(s, pid, index);
  write_formatted(s, 1);
}

void trace_writer::thread_sort_index(std::int64_t pid, std::int64_t tid, std::int64_t index) {
  std::string s;
  append_thread_sort_index(s, pid, tid, index);
  write_formatted(s, 1);
}

void trace_writer::flush() {
  if (sink_ == nullptr) {
    return;
  }
  drain();
  sink_->flush();
}

void trace_writer::close(const nlohmann::json& other_data) {
  if (sink_ == nullptr) {
    return;
  }
  // With the host out of memory the trace still ends well-formed, only otherData is then empty.
  std::string other = "{}";
  if (other_data.is_object()) {
    try {
      other = other_data.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    } catch (const std::bad_alloc&) {
      // "{}" fits the short-string buffer: `other` still holds it.
    }
  }
  close_text(other);
}

void trace_writer::close_text(std::string_view other_data_json, std::string_view more_members) {
  if (sink_ == nullptr) {
    return;
  }
  // The closing text is written in pieces (no string of it all is built).
  try {
    append_raw("\n],\"displayTimeUnit\":\"ns\",\"otherData\":");
    append_raw(other_data_json);
    if (!more_members.empty()) {
      append_raw(",");
      append_raw(more_members);
    }
    append_raw("}\n");
    drain();
  } catch (...) {
    sink_.reset();  // closed for good: the destructor does not try again
    throw;
  }
  std::unique_ptr<sink> s = std::move(sink_);
  chunk_.clear();
  chunk_.shrink_to_fit();
  s->close();
}

}  // namespace poolscope::profiler
